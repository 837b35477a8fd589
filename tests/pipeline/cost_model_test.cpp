// The update cost model and the sites that follow it: the model's device count is the best of
// its formula, fraction_site spreads a share evenly, cost_model_site can be forced and learns
// the host rate, measure_update_rates never reports a simulated device faster than it is paced,
// and an offloaded_adamw on a cost_model_site stays bit-identical to AdamW on one flat array.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <strata/exec/host_executor.hpp>
#include <strata/exec/paced.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/offload/adamw_device.hpp>
#include <strata/pipeline/update_cost_model.hpp>

#include "../offload/offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace cost_model_test {

namespace {

strata::update_cost_model model(double host, double dev, double h2d, double d2h) {
  return strata::update_cost_model{{host, dev, h2d, d2h}, {14, 14}};
}

}  // namespace

TEST_CASE("device_position picks exactly k of every n positions, evenly, the first one first") {
  for (std::uint64_t n = 1; n <= 40; ++n)
    for (std::uint64_t k = 0; k <= n; ++k) {
      std::uint64_t on = 0, last = 0;
      for (std::uint64_t p = 0; p < n; ++p)
        if (strata::device_position(p, k, n)) {
          CHECK((on == 0 ? p == 0 : p - last <= (n + k - 1) / k));  // no gap longer than ceil(n / k)
          last = p;
          ++on;
        }
      CHECK(on == k);
      CHECK(strata::device_position(n + 1, k, n) == strata::device_position(1, k, n));  // positions wrap
    }
}

TEST_CASE("the predicted step: host work alone, a three-stage device pipeline alone, and their overlap") {
  auto m = model(1e9, 1e9, 14e9, 28e9);  // per 1e6 params: host 1 ms; in 1 ms, kernel 1 ms, out 0.5 ms
  m.device_depth = 8;
  CHECK(m.seconds(10, 1e6, 0) == doctest::Approx(10e-3));
  CHECK(m.seconds(1, 1e6, 1) == doctest::Approx(2.5e-3));                   // one round trip
  CHECK(m.seconds(5, 1e6, 5) == doctest::Approx(2.5e-3 + 4 * 1e-3));       // then one per slowest stage
  m.device_depth = 1;                                                       // nothing overlaps
  CHECK(m.seconds(5, 1e6, 5) == doctest::Approx(5 * 2.5e-3));
  m.device_depth = 2;
  // 4 subgroups, 2 on the device (positions 0 and 2): the host does 1 and 3 (2 ms) while the
  // device does both round trips: 0 at [0, 2.5], 2 issued at 1 ms: in [1, 2], kernel [2, 3], out [3, 3.5].
  CHECK(m.seconds(4, 1e6, 2) == doctest::Approx(3.5e-3));
  CHECK(m.best_device_count(4, 1e6) == 1);  // 0 on the device: 3 ms of host work, 2.5 ms of device
  // A round trip longer than the host's whole step is never worth it.
  CHECK(model(1e9, 1e8, 14e9, 14e9).best_device_count(4, 1e6) == 0);
  // Without a device rate, a copy rate or a slot nothing goes there; without a host rate everything does.
  CHECK(model(1e9, 0, 14e9, 14e9).best_device_count(10, 1e6) == 0);
  CHECK_FALSE(model(1e9, 1e9, 0, 14e9).device_usable());
  m.device_depth = 0;
  CHECK(m.best_device_count(10, 1e6) == 0);
  CHECK(model(0, 1e9, 14e9, 14e9).best_device_count(10, 1e6) == 10);
  // Free device memory caps the depth: room for 1 slot of 3 means no overlap, none means no device.
  CHECK(strata::update_cost_model::fitting_depth(3, 100, 64) == 1);
  CHECK(strata::update_cost_model::fitting_depth(3, 1000, 64) == 3);
  CHECK(strata::update_cost_model::fitting_depth(3, 63, 64) == 0);
}

TEST_CASE("the model's device count is the best of its predictions, for any rates") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> decade(7, 11);  // 1e7 .. 1e11 per second
  std::uniform_int_distribution<std::size_t> count(1, 48), depth(1, 4);
  for (int i = 0; i < 200; ++i) {
    auto m = model(std::pow(10, decade(rng)), std::pow(10, decade(rng)), std::pow(10, decade(rng)),
                   std::pow(10, decade(rng)));
    m.device_depth = depth(rng);
    const std::size_t subgroups = count(rng);
    const double n = std::pow(10, decade(rng) - 3);
    const std::size_t k = m.best_device_count(subgroups, n);
    REQUIRE(k <= subgroups);
    for (std::size_t j = 0; j <= subgroups; ++j) CHECK(m.seconds(subgroups, n, k) <= m.seconds(subgroups, n, j));
    // Never worse than the host alone, and never above the sum of both sides' work.
    CHECK(m.seconds(subgroups, n, k) <= m.seconds(subgroups, n, 0));
  }
}

TEST_CASE("fraction_site puts floor(n * share) of the first n positions on the device, evenly") {
  for (const double share : {0.0, 0.1, 0.25, 1.0 / 3, 0.5, 0.9, 1.0}) {
    CAPTURE(share);
    const strata::fraction_site site{share};
    CHECK(site.uses_device() == (share > 0));
    std::size_t on = 0;
    for (std::size_t p = 0; p < 600; ++p) {
      on += site.site(p, p, 0) == strata::site_kind::device;
      CHECK(on == static_cast<std::size_t>(std::floor((static_cast<double>(p) + 1) * share)));
    }
  }
  CHECK(strata::fraction_site{0.25}.site(3, 0, 0) == strata::site_kind::device);
  CHECK(strata::fraction_site{0.25}.site(2, 0, 0) == strata::site_kind::host);
  CHECK_THROWS_AS((void)strata::fraction_site{1.5}.site(0, 0, 0), strata::config_error);
}

TEST_CASE("a cost_model_site puts exactly k of every step's subgroups on the device, can be forced, and learns the host rate") {
  strata::cost_model_site site(model(1e9, 1e9, 14e9, 14e9), 20, 1'000'000);
  const strata::cost_model_site copy = site;  // as the pipeline would hold it
  const std::size_t k = copy.device_count();
  CHECK(k > 0);
  CHECK(k < 20);
  for (std::size_t j = 0; j <= 20; ++j) CHECK(copy.predicted_seconds(k) <= copy.predicted_seconds(j));
  CHECK(copy.uses_device());
  const auto on_device = [&] {
    std::size_t on = 0;
    for (std::size_t p = 0; p < 20; ++p) on += copy.site(p, 19 - p, 4) == strata::site_kind::device;
    return on;
  };
  CHECK(on_device() == k);
  site.force(0.25);
  CHECK(copy.device_count() == 5);
  CHECK(on_device() == 5);
  CHECK(copy.site(0, 0, 9) == strata::site_kind::device);
  CHECK(copy.site(1, 0, 9) == strata::site_kind::host);
  CHECK_THROWS_AS(site.force(-0.1), strata::config_error);
  site.force(std::nullopt);
  CHECK(copy.device_count() == k);
  // The host turned out 3x slower than measured: more goes to the device.
  site.observe(1'000'000, 3e-3);
  CHECK(copy.model().rates.host_params_per_s == doctest::Approx(1e9 / 3));
  const std::size_t slower = copy.device_count();
  CHECK(slower > k);
  site.observe(0, 1.0);  // nothing on the host: nothing learnt
  CHECK(copy.device_count() == slower);
  // Beside device updates the host ran 2x slower still (shared memory bandwidth): the split
  // model charges its host subgroups that, and a CPU-only step keeps the alone rate.
  site.observe(1'000'000, 6e-3, 3);
  CHECK(copy.model().rates.host_params_per_s == doctest::Approx(1e9 / 3));
  CHECK(copy.model().host_slowdown == doctest::Approx(2.0));
  CHECK(copy.predicted_seconds(0) == doctest::Approx(20 * 1e6 * 3e-9));
  CHECK(copy.device_count() >= slower);
  site.observe(4'000'000, 1e-3, 5);  // (sums) now faster beside the device than alone: no slowdown below 1
  CHECK(copy.model().host_slowdown == doctest::Approx(1.0));
  CHECK_FALSE(strata::cost_model_site(model(1e9, 0, 0, 0), 4, 100).uses_device());
  CHECK_THROWS_AS(strata::cost_model_site(model(1e9, 1e9, 1e9, 1e9), 0, 100), strata::config_error);
}

TEST_CASE("measured rates of a paced simulated device never exceed its pacing") {
  const double link = 400e6, kernel = 20e6;
  strata::host_executor<strata::paced<strata::host_stream>> exec(
      {.name = "sim", .kernel_rate = kernel},
      [&](strata::stream_role, const std::string& name) {
        return std::make_unique<strata::paced<strata::host_stream>>(
            strata::pace_options{.h2d_bandwidth = link, .d2h_bandwidth = link}, name);
      });
  const auto r = strata::measure_update_rates(exec, 1 << 16, nullptr, 2);
  CHECK(r.h2d_bytes_per_s > 0);
  CHECK(r.h2d_bytes_per_s <= link);
  CHECK(r.d2h_bytes_per_s <= link);
  CHECK(r.device_params_per_s > 0);
  CHECK(r.device_params_per_s <= kernel);
  CHECK(r.host_params_per_s > 0);
  // A device budget too small for the probe is a capacity_error.
  strata::host_executor<> tiny({.device_memory = 4096});
  CHECK_THROWS_AS((void)strata::measure_update_rates(tiny, 1 << 16), strata::capacity_error);
}

TEST_CASE("an offloaded_adamw on a cost_model_site updates the model's share on the device, bit-identically") {
  using namespace strata_test;
  const std::size_t n = 5000, sg = 250;  // 20 subgroups
  const auto init = random_params(n, 21);
  strata::adamw_options ao;
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.threads = 2;
  strata::host_executor<> exec({.kernel_threads = 1});
  strata::cost_model_site site(model(1e9, 0.5e9, 42e9, 42e9), 20, sg);  // the device's kernel twice as slow
  strata::host_tier tier(strata::host_tier_options{.name = "h"});
  strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating, strata::host_executor<>,
                          strata::cost_model_site>
      opt(tier, exec, init, ao, off, {}, {}, site);
  flat_reference ref(init, ao);
  const std::size_t chosen = site.device_count();
  CHECK(chosen > 0);
  CHECK(chosen < 10);
  for (int t = 0; t < 4; ++t) {
    if (t == 2) site.force(0.75);  // a forced split takes effect at the next step
    const auto g = random_grads<strata::bf16>(n, 30 + static_cast<std::uint64_t>(t));
    const auto st = opt.step(std::span<const strata::bf16>(g));
    ref.step(std::span<const strata::bf16>(g), ao.lr);
    CHECK(st.device_updates == (t < 2 ? chosen : 15));
  }
  require_same_state(opt, ref);
}

}  // namespace cost_model_test
