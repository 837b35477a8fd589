// offloaded_adamw equals AdamW on one flat in-memory array, bit for bit, over randomized
// configurations: parameter counts that subgroups do not divide, cache sizes from none to all,
// 1-3 paths (host and file tiers, both placements), thread counts, every eviction policy and
// update order, fp32/bf16/fp16 gradients given whole or through accept_gradients, gradients kept
// in host memory or on the tier, the next step's reads started as a step returns or not (and
// taken over in flight), 16-bit model copies, AdamW/Adam/amsgrad/maximize, lr schedules.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace bit_identity_test {

namespace {

using namespace strata_test;

struct config {
  std::uint64_t seed;
  std::size_t params;
  std::size_t subgroup;
  std::size_t cache_subgroups;
  std::size_t paths;
  std::vector<bool> file_path;
  std::size_t threads;
  std::size_t prefetch;
  std::size_t write_behind;
  int grad_type;   // 0 float, 1 bf16, 2 fp16
  int model_out;   // 0 none, 1 bf16, 2 fp16
  bool accept;     // accept_gradients + step() instead of step(grads)
  bool ranges;     // accept_gradients_at with ranges that cross subgroups
  bool grads_on_tier;
  bool prefetch_next;  // reads of the next step start as step() returns
  bool writes_after;   // step() returns before its last writes land (return_before_writes)
  bool check_each;     // compare the state after every step (waits for those reads), or only at the end
  int steps;
  strata::adamw_options opts;
  std::string describe() const {
    return fmt::format(
        "seed {} params {} subgroup {} cache {} paths {} threads {} prefetch {} wb {} grad {} out {} accept {} "
        "ranges {} tier-grads {} prefetch-next {} writes-after {} check-each {} steps {} amsgrad {} decoupled {} "
        "maximize {}",
        seed, params, subgroup, cache_subgroups, paths, threads, prefetch, write_behind, grad_type, model_out, accept,
        ranges, grads_on_tier, prefetch_next, writes_after, check_each, steps, opts.amsgrad, opts.decoupled, opts.maximize);
  }
};

config random_config(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
  };
  config c{};
  c.seed = seed;
  c.params = pick(1, 3000);
  c.subgroup = pick(1, 5) == 1 ? c.params + pick(0, 3) : pick(std::max<std::size_t>(1, c.params / 12), c.params);
  const std::size_t subgroups = (c.params + c.subgroup - 1) / c.subgroup;
  c.cache_subgroups = pick(0, 3) == 0 ? 0 : pick(0, subgroups + 1);
  c.paths = pick(1, 3);
  for (std::size_t i = 0; i < c.paths; ++i) c.file_path.push_back(pick(0, 2) == 0);
  c.threads = pick(1, 3);
  c.prefetch = pick(0, 3);
  c.write_behind = pick(1, 3);
  c.grad_type = static_cast<int>(pick(0, 2));
  c.model_out = static_cast<int>(pick(0, 2));
  c.accept = pick(0, 2) == 0;
  c.ranges = c.accept && pick(0, 1) == 0;
  c.grads_on_tier = pick(0, 4) == 0;
  c.steps = static_cast<int>(pick(1, 4));
  c.prefetch_next = pick(0, 3) != 0;
  c.check_each = pick(0, 1) == 0;
  c.opts.lr = 1e-3 * static_cast<double>(pick(1, 20));
  c.opts.weight_decay = pick(0, 2) == 0 ? 0.0 : 0.01 * static_cast<double>(pick(1, 10));
  c.opts.decoupled = pick(0, 3) != 0;
  c.opts.amsgrad = pick(0, 3) == 0;
  c.opts.maximize = pick(0, 5) == 0;
  c.opts.beta1 = pick(0, 1) == 0 ? 0.9 : 0.8;
  c.writes_after = pick(0, 3) != 0;  // (drawn last: the earlier draws of a seed stay as they were)
  return c;
}

template <class G, class Opt>
void give_gradients(Opt& opt, const config& c, std::span<const G> g, std::mt19937_64& rng) {
  if (!c.ranges) {
    for (std::size_t s = opt.subgroup_count(); s-- > 0;)  // backward produces the last subgroups first
      opt.accept_gradients(s, g.subspan(opt.begin(s), opt.length(s)));
    return;
  }
  std::size_t pos = 0;
  while (pos < g.size()) {
    const std::size_t len = std::uniform_int_distribution<std::size_t>(1, c.subgroup * 2)(rng);
    const std::size_t n = std::min(len, g.size() - pos);
    opt.accept_gradients_at(pos, g.subspan(pos, n));
    pos += n;
  }
}

template <class G, class H, class Opt>
void run_steps(Opt& opt, flat_reference& ref, const config& c) {
  std::mt19937_64 rng(c.seed * 7 + 1);
  for (int t = 0; t < c.steps; ++t) {
    const auto g = random_grads<G>(c.params, c.seed * 1000 + static_cast<std::uint64_t>(t));
    const double lr = c.opts.lr * (1.0 + 0.25 * t);  // a schedule: each step its own lr
    std::vector<H> out(std::is_same_v<H, float> ? 0 : c.params), ref_out(out.size());
    if constexpr (std::is_same_v<H, float>) {
      if (c.accept) {
        give_gradients<G>(opt, c, g, rng);
        opt.step(lr);
      } else {
        opt.step(std::span<const G>(g), lr);
      }
      ref.step(std::span<const G>(g), lr);
    } else {
      if (c.accept) {
        give_gradients<G>(opt, c, g, rng);
        opt.step(lr, std::span<H>(out));
      } else {
        opt.step(std::span<const G>(g), lr, std::span<H>(out));
      }
      ref.step(std::span<const G>(g), lr, std::span<H>(ref_out));
      REQUIRE(std::memcmp(out.data(), ref_out.data(), out.size() * sizeof(H)) == 0);
    }
    if (c.check_each || t + 1 == c.steps) require_same_state(opt, ref);
  }
}

// Gradient and model-copy types by index (0 float, 1 bf16, 2 fp16).
template <int K>
using type_of = std::conditional_t<K == 0, float, std::conditional_t<K == 1, strata::bf16, strata::fp16>>;

// Each (placement, policy, order) combination `Combo` runs one (gradient, model copy) type pair,
// Combo % 9, so that the 24 combinations cover the 9 pairs (2-3 times each) with 24 instantiations
// of the step rather than 216: the test's compile time stays a minute, not five.
template <class Placement, class Evict, int Combo, class Order>
void run_config(const config& in, Order order) {
  constexpr int gh = Combo % 9;
  config c = in;
  c.grad_type = gh / 3;
  c.model_out = gh % 3;
  INFO(c.describe());
  temp_dir dir(std::filesystem::temp_directory_path(), "offload");
  std::vector<strata::any_tier> paths;
  for (std::size_t i = 0; i < c.paths; ++i) {
    if (c.file_path[i]) {
      paths.push_back(strata::any_tier::make<strata::file_tier>(
          file_opts(dir / fmt::format("p{}", i), strata::io_backend::automatic, strata::unlimited_capacity,
                    fmt::format("file{}", i))));
    } else {
      paths.push_back(strata::any_tier::make<strata::host_tier>(strata::host_tier_options{
          .name = fmt::format("host{}", i), .read_bandwidth = 1e9 * double(i + 1), .write_bandwidth = 1e9}));
    }
  }
  Placement placement = [&] {
    if constexpr (std::is_same_v<Placement, strata::fixed_ratio>) {
      std::vector<unsigned> w(c.paths, 1);
      w[0] = 2;
      return strata::fixed_ratio(w);
    } else {
      return Placement{};
    }
  }();
  strata::dynamic_multipath<Placement> tier(std::move(placement), std::move(paths));
  const auto init = random_params(c.params, c.seed);
  strata::offload_options off;
  off.subgroup_elems = c.subgroup;
  off.prefetch_depth = c.prefetch;
  off.write_behind_depth = c.write_behind;
  off.threads = c.threads;
  off.prefetch_next_step = c.prefetch_next;
  off.return_before_writes = c.writes_after;
  off.gradients = c.grads_on_tier ? strata::gradient_residency::tier : strata::gradient_residency::host;
  const std::size_t slot = strata::host_budget::footprint(
      std::min(c.params, c.subgroup) * sizeof(float) * ((c.opts.amsgrad ? 4 : 3) + (c.grads_on_tier ? 1 : 0)));
  off.host_cache_bytes = c.cache_subgroups * slot + (c.cache_subgroups > 0 ? slot / 2 : 0);
  strata::offloaded_adamw<strata::dynamic_multipath<Placement>, Evict, Order> opt(tier, init, c.opts, off,
                                                                                  std::move(order));
  flat_reference ref(init, c.opts);
  require_same_state(opt, ref);
  run_steps<type_of<gh / 3>, type_of<gh % 3>>(opt, ref, c);
  const auto st = opt.stats();
  REQUIRE(st.host_memory_peak <= st.host_memory_budget);
}

template <class Placement, class Evict, int Base>
void run_with_order(const config& c, int order_kind) {
  switch (order_kind) {
    case 0: run_config<Placement, Evict, Base + 0>(c, strata::sequential{}); break;
    case 1: run_config<Placement, Evict, Base + 1>(c, strata::alternating{}); break;
    default: {
      const std::uint64_t seed = c.seed;
      run_config<Placement, Evict, Base + 2>(c, strata::custom_order([seed](std::uint64_t step, std::size_t n) {
        std::vector<std::size_t> v(n);
        std::iota(v.begin(), v.end(), std::size_t{0});
        std::shuffle(v.begin(), v.end(), std::mt19937_64(seed + step));
        return v;
      }));
    }
  }
}

template <class Placement>
void run_with_policy(const config& c, int policy, int order_kind) {
  constexpr int base = std::is_same_v<Placement, strata::fixed_ratio> ? 12 : 0;
  switch (policy) {
    case 0: run_with_order<Placement, strata::lru, base + 0>(c, order_kind); break;
    case 1: run_with_order<Placement, strata::fifo, base + 3>(c, order_kind); break;
    case 2: run_with_order<Placement, strata::sweep_aware, base + 6>(c, order_kind); break;
    default: run_with_order<Placement, strata::belady, base + 9>(c, order_kind); break;
  }
}

}  // namespace

TEST_CASE("offloaded_adamw is bit-identical to AdamW on one flat array in randomized configurations") {
  // Every (policy, order, placement) combination appears, each with several random configurations.
  std::uint64_t seed = 1;
  for (int policy = 0; policy < 4; ++policy)
    for (int order_kind = 0; order_kind < 3; ++order_kind)
      for (int placement = 0; placement < 2; ++placement)
        for (int rep = 0; rep < 5; ++rep) {
          const auto c = random_config(seed++);
          CAPTURE(policy);
          CAPTURE(order_kind);
          CAPTURE(placement);
          if (placement == 0)
            run_with_policy<strata::bandwidth_proportional>(c, policy, order_kind);
          else
            run_with_policy<strata::fixed_ratio>(c, policy, order_kind);
        }
}

TEST_CASE("offloaded_adamw is bit-identical at the edges: one parameter, one subgroup, one parameter per subgroup") {
  for (const auto& [params, subgroup, cache] :
       {std::tuple{1ul, 1ul, 0ul}, std::tuple{1ul, 7ul, 1ul}, std::tuple{9ul, 1ul, 0ul}, std::tuple{9ul, 1ul, 4ul},
        std::tuple{9ul, 1ul, 9ul}, std::tuple{100ul, 100ul, 1ul}, std::tuple{101ul, 100ul, 0ul}}) {
    auto c = random_config(1000 + params * 31 + subgroup * 7 + cache);
    c.params = params;
    c.subgroup = subgroup;
    c.cache_subgroups = cache;
    c.steps = 3;
    run_with_policy<strata::bandwidth_proportional>(c, 2, 1);
  }
}

}  // namespace bit_identity_test
