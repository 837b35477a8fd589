// offloaded_adamw with a learning rate and weight decay per range of parameters (PyTorch's param
// groups): bit-identical to AdamW run on each range alone with its own rates, when subgroups cross
// the ranges, on the host and on a simulated device; bad ranges are config_errors naming the
// range; a retried step must repeat its rates.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <strata/exec/host_executor.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/optim/step_rates.hpp>
#include <strata/tier/faulty.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace step_rates_test {

namespace {

using namespace strata_test;

// Each range's own AdamW over its slice: what the optimizer must equal.
struct ranged_reference {
  std::vector<flat_reference> parts;
  std::vector<std::size_t> first;

  ranged_reference(std::span<const float> init, const strata::adamw_options& o, std::span<const std::size_t> bounds) {
    for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
      first.push_back(bounds[i]);
      parts.emplace_back(init.subspan(bounds[i], bounds[i + 1] - bounds[i]), o);
    }
  }

  template <class G, class H>
  void step(std::span<const G> g, const std::vector<strata::param_range>& rates, std::span<H> out) {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const auto& r = rates[i];
      parts[i].o.weight_decay = r.weight_decay;
      parts[i].step(g.subspan(r.first, r.count), r.lr, out.empty() ? out : out.subspan(r.first, r.count));
    }
  }

  [[nodiscard]] std::vector<float> joined(std::vector<float> flat_reference::* member) const {
    std::vector<float> all;
    for (const auto& p : parts) all.insert(all.end(), (p.*member).begin(), (p.*member).end());
    return all;
  }
};

template <class Opt>
void require_same_as(Opt& opt, const ranged_reference& ref) {
  const std::size_t n = opt.size();
  std::vector<float> p(n), m(n), v(n);
  opt.read_master(p);
  opt.read_moments(m, v);
  const auto rp = ref.joined(&flat_reference::p), rm = ref.joined(&flat_reference::m),
             rv = ref.joined(&flat_reference::v);
  INFO("first master difference at " << first_difference(p, rp));
  REQUIRE(same_bits(p, rp));
  INFO("first m difference at " << first_difference(m, rm));
  REQUIRE(same_bits(m, rm));
  INFO("first v difference at " << first_difference(v, rv));
  REQUIRE(same_bits(v, rv));
}

// 1 to 4 ranges with random bounds over n parameters.
std::vector<std::size_t> random_bounds(std::size_t n, std::mt19937_64& rng) {
  const std::size_t ranges = std::min<std::size_t>(n, std::uniform_int_distribution<std::size_t>(1, 4)(rng));
  std::vector<std::size_t> cuts;
  while (cuts.size() + 1 < ranges) {
    const std::size_t c = std::uniform_int_distribution<std::size_t>(1, n - 1)(rng);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::size_t> bounds{0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(n);
  return bounds;
}

std::vector<strata::param_range> rates_for(std::span<const std::size_t> bounds, int step, std::mt19937_64& rng) {
  std::vector<strata::param_range> r;
  for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
    const double lr = 1e-3 * std::uniform_real_distribution<double>(0.1, 3.0)(rng) * (1 + step);
    const double wd = i % 2 == 0 ? 0.0 : std::uniform_real_distribution<double>(0.0, 0.1)(rng);
    r.push_back({bounds[i], bounds[i + 1] - bounds[i], lr, wd});
  }
  return r;
}

template <class G, class Site>
void check_ranges(std::uint64_t seed, Site site, bool decoupled) {
  std::mt19937_64 rng(seed);
  const std::size_t n = std::uniform_int_distribution<std::size_t>(2, 2500)(rng);
  const std::size_t sg = std::uniform_int_distribution<std::size_t>(std::max<std::size_t>(1, n / 9), n)(rng);
  const auto bounds = random_bounds(n, rng);
  const bool accept = rng() % 2 == 0;
  CAPTURE(n);
  CAPTURE(sg);
  CAPTURE(bounds.size() - 1);
  CAPTURE(accept);
  const auto init = random_params(n, seed);
  strata::adamw_options ao;
  ao.decoupled = decoupled;
  ao.amsgrad = seed % 3 == 0;
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.threads = 2;
  off.host_cache_bytes = strata::offload_layout::of(n, ao, off).cache_bytes(1);
  strata::host_executor<> exec({.kernel_threads = 2});
  strata::host_tier tier(strata::host_tier_options{.name = "ranges"});
  strata::offloaded_adamw<strata::host_tier, strata::sweep_aware, strata::alternating, strata::host_executor<>, Site>
      opt(tier, exec, init, ao, off, {}, {}, site);
  ranged_reference ref(init, ao, bounds);
  for (int t = 0; t < 3; ++t) {
    const auto rates = rates_for(bounds, t, rng);
    const auto g = random_grads<G>(n, seed * 10 + static_cast<std::uint64_t>(t));
    std::vector<strata::bf16> out(n), ref_out(n);
    if (accept) {
      for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
        opt.accept_gradients(s, std::span<const G>(g).subspan(opt.begin(s), opt.length(s)));
      opt.step(strata::step_rates(rates), std::span<strata::bf16>(out));
    } else {
      opt.step(std::span<const G>(g), strata::step_rates(rates), std::span<strata::bf16>(out));
    }
    ref.step(std::span<const G>(g), rates, std::span<strata::bf16>(ref_out));
    CHECK(out == ref_out);
  }
  require_same_as(opt, ref);
}

strata::offload_options small_options(std::size_t sg) {
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.threads = 2;
  return off;
}

}  // namespace

TEST_CASE("a learning rate and weight decay per parameter range equal AdamW run on each range alone, bit for bit") {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    CAPTURE(seed);
    {
      INFO("host updates, AdamW, fp32 gradients");
      check_ranges<float>(seed, strata::alternating_site{1, 0}, true);
    }
    {
      INFO("device updates on a simulated device, Adam (L2), bf16 gradients");
      check_ranges<strata::bf16>(seed, strata::alternating_site{0, 1}, false);
    }
    {
      INFO("host and device updates mixed, AdamW, fp16 gradients");
      check_ranges<strata::fp16>(seed, strata::alternating_site{1, 1}, true);
    }
  }
}

TEST_CASE("one range over every parameter is the same step as a single learning rate") {
  const std::size_t n = 1000;
  const auto init = random_params(n, 3);
  strata::adamw_options ao;
  ao.weight_decay = 0.05;
  strata::host_tier a(strata::host_tier_options{.name = "a"}), b(strata::host_tier_options{.name = "b"});
  strata::offloaded_adamw<strata::host_tier> by_lr(a, init, ao, small_options(300));
  strata::offloaded_adamw<strata::host_tier> by_range(b, init, ao, small_options(300));
  for (int t = 0; t < 2; ++t) {
    const auto g = random_grads<float>(n, 30 + static_cast<std::uint64_t>(t));
    by_lr.step(std::span<const float>(g), 2e-3);
    by_range.step(std::span<const float>(g), strata::step_rates({{0, n, 2e-3, 0.05}}));
  }
  std::vector<float> p1(n), p2(n);
  by_lr.read_master(p1);
  by_range.read_master(p2);
  CHECK(same_bits(p1, p2));
}

TEST_CASE("ranges that do not cover every parameter once, or bad rates, are config_errors naming the range") {
  const std::size_t n = 100;
  const auto init = random_params(n, 4);
  strata::adamw_options ao;
  strata::host_tier tier(strata::host_tier_options{.name = "bad"});
  strata::offloaded_adamw<strata::host_tier> opt(tier, init, ao, small_options(30));
  const auto g = random_grads<float>(n, 40);
  const auto refused = [&](std::vector<strata::param_range> r, const std::string& says) {
    CAPTURE(says);
    try {
      opt.step(std::span<const float>(g), strata::step_rates(std::move(r)));
      FAIL("accepted");
    } catch (const strata::config_error& e) {
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
  };
  refused({{0, 50, 1e-3, 0}, {60, 40, 1e-3, 0}}, "range 1 starts at 60, but the ranges before it end at 50");
  refused({{0, 50, 1e-3, 0}, {40, 60, 1e-3, 0}}, "range 1 starts at 40");
  refused({{0, 50, 1e-3, 0}}, "cover 50 of the 100 parameters");
  refused({{0, 50, 1e-3, 0}, {50, 0, 1e-3, 0}, {50, 50, 1e-3, 0}}, "range 1 (from parameter 50) is empty");
  refused({{0, 120, 1e-3, 0}}, "range 0 [0, 120) ends past the last of the 100 parameters");
  refused({{0, 50, 1e-3, 0}, {50, 50, -1e-3, 0}}, "range 1 [50, 100): learning rate -0.001");
  refused({{0, 50, 1e-3, std::numeric_limits<double>::quiet_NaN()}, {50, 50, 1e-3, 0}},
          "range 0 [0, 50): weight decay nan");
  refused({}, "cover 0 of the 100 parameters");
  // Nothing changed: the next step is the first.
  CHECK(opt.step_count() == 0);
  flat_reference ref(init, ao);
  opt.step(std::span<const float>(g), 1e-3);
  ref.step(std::span<const float>(g), 1e-3);
  require_same_state(opt, ref);
}

TEST_CASE("a step interrupted by a failing tier is retried with the same ranges; other rates are refused") {
  const std::size_t n = 2000, sg = 300;
  const auto init = random_params(n, 6);
  strata::adamw_options ao;
  strata::faulty<strata::host_tier> tier(strata::host_tier_options{.name = "flaky"});
  strata::offloaded_adamw<strata::faulty<strata::host_tier>> opt(tier, init, ao, small_options(sg));
  const std::vector<std::size_t> bounds{0, 700, 2000};
  ranged_reference ref(init, ao, bounds);
  const std::vector<strata::param_range> rates{{0, 700, 1e-3, 0.0}, {700, 1300, 4e-3, 0.1}};
  auto other = rates;
  other[1].weight_decay = 0.2;
  const auto g = random_grads<float>(n, 60);
  tier.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = {}, .after = 3, .times = 1});
  CHECK_THROWS_AS(opt.step(std::span<const float>(g), strata::step_rates(rates)), strata::io_error);
  REQUIRE(opt.step_count() == 0);
  try {
    opt.step(std::span<const float>(g), strata::step_rates(other));
    FAIL("a retry with other rates was accepted");
  } catch (const strata::config_error& e) {
    CHECK(std::string(e.what()).find("retrying step 1 with other rates") != std::string::npos);
  }
  CHECK_THROWS_AS(opt.step(std::span<const float>(g), 1e-3), strata::config_error);
  tier.clear();
  opt.step(std::span<const float>(g), strata::step_rates(rates));
  std::vector<strata::bf16> none;
  ref.step(std::span<const float>(g), rates, std::span<strata::bf16>(none));
  REQUIRE(opt.step_count() == 1);
  require_same_as(opt, ref);
}

}  // namespace step_rates_test
