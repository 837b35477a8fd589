// offloaded_adamw over executors and update sites: host updates, device updates on a simulated
// device (host_executor: separate "device" buffers, copies on its streams), and mixes of both,
// with seeded jitter on every stream to shake out missing waits. Every combination must equal
// AdamW on one flat array bit for bit, and a step that a failing stream interrupted must, once
// retried, too.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/exec/faulty_stream.hpp>
#include <strata/exec/host_executor.hpp>
#include <strata/exec/jittered.hpp>
#include <strata/exec/paced.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace executor_bit_identity_test {

namespace {

using namespace strata_test;
using jittery = strata::jittered<strata::host_stream>;

struct config {
  std::uint64_t seed;
  std::size_t params, subgroup, cache;
  bool tier_grads, accept, amsgrad;
  int grad_type;  // 0 float, 1 bf16, 2 fp16; 3 bf16 with an fp32 model copy
  bool model_out;
  std::size_t device_depth;
};

config random_config(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](std::size_t lo, std::size_t hi) { return std::uniform_int_distribution<std::size_t>(lo, hi)(rng); };
  config c{};
  c.seed = seed;
  c.params = pick(1, 2500);
  c.subgroup = pick(std::max<std::size_t>(1, c.params / 10), c.params);
  const std::size_t subgroups = (c.params + c.subgroup - 1) / c.subgroup;
  c.cache = pick(0, subgroups);
  c.tier_grads = pick(0, 3) == 0;
  c.accept = pick(0, 1) == 0;
  c.amsgrad = pick(0, 2) == 0;
  c.grad_type = static_cast<int>(seed % 4);  // every kind among the seeds
  c.model_out = pick(0, 1) == 0 || c.grad_type == 3;  // kind 3 is about the copy
  c.device_depth = pick(1, 3);
  return c;
}

template <class Opt, class G, class H>
void run_steps(Opt& opt, flat_reference& ref, const config& c, std::size_t device_per_step) {
  for (int t = 0; t < 3; ++t) {
    const auto g = random_grads<G>(c.params, c.seed * 100 + static_cast<std::uint64_t>(t));
    const double lr = 1e-3 * (1 + t);
    std::vector<H> out(c.model_out ? c.params : 0), ref_out(out.size());
    strata::offload_step_stats st;
    if (c.accept) {
      for (std::size_t s = opt.subgroup_count(); s-- > 0;)
        opt.accept_gradients(s, std::span<const G>(g).subspan(opt.begin(s), opt.length(s)));
      st = opt.step(lr, std::span<H>(out));
    } else {
      st = opt.step(std::span<const G>(g), lr, std::span<H>(out));
    }
    CHECK(st.device_updates == device_per_step);  // the site policy is followed
    ref.step(std::span<const G>(g), lr, std::span<H>(ref_out));
    CHECK(out == ref_out);
    if constexpr (std::is_same_v<H, float>)
      if (c.model_out) CHECK(same_bits(out, ref.p));  // an fp32 model is the master, exactly
  }
  require_same_state(opt, ref);
}

template <class Exec, class Site>
void check(const config& c, Exec& exec, Site site) {
  const auto init = random_params(c.params, c.seed);
  strata::adamw_options ao;
  ao.amsgrad = c.amsgrad;
  ao.weight_decay = 0.01;
  strata::offload_options off;
  off.subgroup_elems = c.subgroup;
  off.threads = 2;
  off.device_depth = c.device_depth;
  off.gradients = c.tier_grads ? strata::gradient_residency::tier : strata::gradient_residency::host;
  off.host_cache_bytes = strata::offload_layout::of(c.params, ao, off).cache_bytes(c.cache);
  strata::multipath<strata::fixed_ratio, strata::host_tier, strata::host_tier> tier(
      strata::fixed_ratio({2, 1}), strata::host_tier_options{.name = "a"}, strata::host_tier_options{.name = "b"});
  strata::offloaded_adamw<decltype(tier), strata::sweep_aware, strata::alternating, Exec, Site> opt(
      tier, exec, init, ao, off, {}, {}, site);
  flat_reference ref(init, ao);
  std::size_t device = 0;
  for (std::size_t i = 0; i < opt.subgroup_count(); ++i) device += site.site(i, 0, 0) == strata::site_kind::device;
  switch (c.grad_type) {
    case 0: run_steps<decltype(opt), float, strata::bf16>(opt, ref, c, device); break;
    case 1: run_steps<decltype(opt), strata::bf16, strata::bf16>(opt, ref, c, device); break;
    case 2: run_steps<decltype(opt), strata::fp16, strata::fp16>(opt, ref, c, device); break;
    default: run_steps<decltype(opt), strata::bf16, float>(opt, ref, c, device); break;
  }
}

// Every split as an alternating_site ({1, 0}: all on the host, {0, 1}: all on the device), so
// that one site type (one pipeline instantiation per executor) covers them all.
template <class Exec>
void check_every_site(const config& c, Exec& exec) {
  for (const auto& [h, d] : {std::pair{1, 0}, std::pair{0, 1}, std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 3}}) {
    CAPTURE(h);
    CAPTURE(d);
    check(c, exec, strata::alternating_site{static_cast<std::size_t>(h), static_cast<std::size_t>(d)});
  }
}

}  // namespace

TEST_CASE("every executor and update site is bit-identical to AdamW on one flat array, under seeded jitter") {
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    const auto c = random_config(seed);
    CAPTURE(seed);
    CAPTURE(c.params);
    CAPTURE(c.subgroup);
    CAPTURE(c.cache);
    CAPTURE(c.tier_grads);
    CAPTURE(c.grad_type);
    CAPTURE(c.model_out);
    {
      INFO("simulated device, no jitter");
      strata::host_executor<> exec({.kernel_threads = 2});
      check_every_site(c, exec);
    }
    {
      INFO("simulated device, jitter on every stream");
      strata::host_executor<jittery> exec({.name = "jit"}, [&](strata::stream_role r, const std::string& name) {
        return std::make_unique<jittery>(
            strata::jitter_options{.seed = seed * 10 + static_cast<std::uint64_t>(r),
                                   .max_delay = std::chrono::microseconds(400)},
            name);
      });
      check_every_site(c, exec);
    }
  }
}

TEST_CASE("a step that a failing stream interrupts is rethrown typed; its retry is bit-identical") {
  const std::size_t n = 3000, sg = 400;  // 8 subgroups
  const auto init = random_params(n, 9);
  strata::adamw_options ao;
  using S = strata::faulty<strata::host_stream>;
  for (const auto role : {strata::stream_role::h2d, strata::stream_role::compute, strata::stream_role::d2h})
    for (const std::uint64_t after : {0, 3}) {
      CAPTURE(strata::to_string(role));
      CAPTURE(after);
      S* target = nullptr;
      strata::host_executor<S> exec({}, [&](strata::stream_role r, const std::string& name) {
        auto s = std::make_unique<S>(name);
        if (r == role) target = s.get();
        return s;
      });
      strata::host_tier tier(strata::host_tier_options{.name = "t"});
      strata::offload_options off;
      off.subgroup_elems = sg;
      off.host_cache_bytes = strata::offload_layout::of(n, ao, off).cache_bytes(2);
      strata::offloaded_adamw<strata::host_tier, strata::sweep_aware, strata::alternating, strata::host_executor<S>,
                              strata::alternating_site>
          opt(tier, exec, init, ao, off, {}, {}, strata::alternating_site{1, 1});
      flat_reference ref(init, ao);
      const auto g0 = random_grads<strata::bf16>(n, 1);
      opt.step(std::span<const strata::bf16>(g0));
      ref.step(std::span<const strata::bf16>(g0), ao.lr);
      target->inject({.after = after});
      const auto g1 = random_grads<strata::bf16>(n, 2);
      CHECK_THROWS_AS(opt.step(std::span<const strata::bf16>(g1), 2e-3), strata::stream_error);
      CHECK(opt.step_count() == 1);
      opt.step(std::span<const strata::bf16>(g1), 2e-3);  // the rule fired its one time
      ref.step(std::span<const strata::bf16>(g1), 2e-3);
      require_same_state(opt, ref);
    }
}

}  // namespace executor_bit_identity_test
