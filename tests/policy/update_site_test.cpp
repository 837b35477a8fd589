// Update sites: one typed suite that every model passes. A site that says it never uses the
// device never chooses it; one that does chooses it somewhere in a long step; and the answer for
// a position, subgroup and step never changes (a retried step runs where it ran before).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>

#include <strata/pipeline/update_cost_model.hpp>
#include <strata/policy/update_site.hpp>

// The folder's tests compile together: this file's names stay in its own namespace.
namespace update_site_test {

namespace {
struct always_host_fixture {
  static strata::always_host make() { return {}; }
};
struct always_device_fixture {
  static strata::always_device make() { return {}; }
};
struct alternating_site_fixture {
  static strata::alternating_site make() { return {2, 3}; }
};
struct host_only_alternating_fixture {  // k_device = 0: never the device
  static strata::alternating_site make() { return {1, 0}; }
};
struct fraction_site_fixture {
  static strata::fraction_site make() { return {0.25}; }
};
struct no_share_fixture {
  static strata::fraction_site make() { return {0.0}; }
};
// A cost model whose device is fast: it sends a share of each step there.
struct cost_model_site_fixture {
  static strata::cost_model_site make() {
    strata::update_cost_model m;
    m.rates = {.host_params_per_s = 1e8, .device_params_per_s = 1e10, .h2d_bytes_per_s = 1e11, .d2h_bytes_per_s = 1e11};
    return strata::cost_model_site(m, 100, 1'000'000);
  }
};
// One without a usable device (no measured rates): host only.
struct cost_model_no_device_fixture {
  static strata::cost_model_site make() {
    strata::update_cost_model m;
    m.rates.host_params_per_s = 1e8;
    return strata::cost_model_site(m, 100, 1'000'000);
  }
};
// Any site, erased: what the pipeline holds.
struct any_update_site_fixture {
  static strata::any_update_site make() { return strata::alternating_site{1, 2}; }
};
struct default_any_update_site_fixture {  // none given: always_host
  static strata::any_update_site make() { return {}; }
};
// A reference to a site that outlives it.
struct update_site_ref_fixture {
  static strata::update_site_ref make() {
    static const strata::fraction_site quarter{0.25};
    return quarter;
  }
};
}  // namespace

#define STRATA_UPDATE_SITES                                                                                   \
  always_host_fixture, always_device_fixture, alternating_site_fixture, host_only_alternating_fixture,      \
      fraction_site_fixture, no_share_fixture, cost_model_site_fixture, cost_model_no_device_fixture,              \
      any_update_site_fixture, default_any_update_site_fixture, update_site_ref_fixture

TEST_CASE_TEMPLATE("a site that never uses the device never chooses it; one that does, does in a long step", F,
                   STRATA_UPDATE_SITES) {
  const auto site = F::make();
  std::size_t device = 0;
  for (std::uint64_t step = 0; step < 4; ++step)
    for (std::size_t p = 0; p < 100; ++p) device += site.site(p, (p * 37) % 100, step) == strata::site_kind::device;
  if (site.uses_device())
    CHECK(device > 0);
  else
    CHECK(device == 0);
}

TEST_CASE_TEMPLATE("a site gives the same answer for the same position, subgroup and step", F, STRATA_UPDATE_SITES) {
  const auto a = F::make();
  const auto b = F::make();
  for (std::uint64_t step = 0; step < 3; ++step)
    for (std::size_t p = 0; p < 100; ++p) {
      const auto first = a.site(p, p, step);
      CHECK(a.site(p, p, step) == first);  // asked again (a retried step)
      CHECK(b.site(p, p, step) == first);  // a copy made the same way
    }
}

static_assert(strata::update_site<strata::always_host> && strata::update_site<strata::always_device> &&
              strata::update_site<strata::alternating_site> && strata::update_site<strata::fraction_site> &&
              strata::update_site<strata::cost_model_site> && strata::update_site<strata::any_update_site>);

TEST_CASE("an any_update_site answers as the site it holds, which target() recovers") {
  const strata::any_update_site site = strata::alternating_site{1, 2};
  REQUIRE(site.target<strata::alternating_site>() != nullptr);
  CHECK(site.target<strata::alternating_site>()->k_device == 2);
  CHECK(site.target<strata::always_host>() == nullptr);
  CHECK(site.site(0, 0, 0) == strata::site_kind::host);
  CHECK(site.site(1, 1, 0) == strata::site_kind::device);
  CHECK(site.uses_device());
  CHECK_FALSE(strata::any_update_site{}.uses_device());
}

}  // namespace update_site_test
