// offloaded_adamw started from existing AdamW state (moments and steps taken, as
// torch.optim.AdamW's state_dict holds them): it continues that run bit for bit, through the
// typed optimizer and the run-time one (make_offloaded_adamw); bad state is refused before
// anything is written.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <strata/exec/device_span.hpp>
#include <strata/exec/host_executor.hpp>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/optim/adamw_state.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace from_state_test {

namespace {

using namespace strata_test;

strata::offload_options small_options(std::size_t sg, std::size_t cache_slots, const strata::adamw_options& ao,
                                      std::size_t n) {
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.threads = 2;
  off.host_cache_bytes = strata::offload_layout::of(n, ao, off).cache_bytes(cache_slots);
  return off;
}

/// A run-time config over `paths` paths in host memory (named a, b, ...), `sg` per subgroup.
strata::offloaded_adamw_config host_config(std::size_t paths, std::size_t sg) {
  strata::offloaded_adamw_config c;
  c.paths.resize(paths);  // in host memory (no directory)
  for (std::size_t i = 0; i < paths; ++i) c.paths[i].name = std::string(1, static_cast<char>('a' + i));
  c.offload.subgroup_elems = sg;
  c.offload.threads = 2;
  return c;
}

strata::adamw_state_view state_of(const flat_reference& ref) {
  return {ref.m, ref.v, ref.vmax, static_cast<std::uint64_t>(ref.steps)};
}

}  // namespace

TEST_CASE("an optimizer started from another run's moments and step count continues it bit for bit") {
  for (const bool amsgrad : {false, true}) {
    for (const std::size_t cache : {0, 2}) {
      CAPTURE(amsgrad);
      CAPTURE(cache);
      const std::size_t n = 1234, sg = 200;
      strata::adamw_options ao;
      ao.amsgrad = amsgrad;
      ao.weight_decay = 0.02;
      flat_reference ref(random_params(n, 7), ao);
      for (int t = 0; t < 3; ++t) {
        const auto g = random_grads<float>(n, 70 + static_cast<std::uint64_t>(t));
        ref.step(std::span<const float>(g), 1e-3);
      }
      strata::host_tier tier(strata::host_tier_options{.name = "moved"});
      auto opt = strata::offloaded_adamw<strata::host_tier>::from_state(tier, ref.p, state_of(ref), ao,
                                                                       small_options(sg, cache, ao, n));
      CHECK(opt.step_count() == 3);
      require_same_state(opt, ref);
      for (int t = 3; t < 6; ++t) {
        const auto g = random_grads<strata::bf16>(n, 70 + static_cast<std::uint64_t>(t));
        std::vector<strata::bf16> out(n), ref_out(n);
        opt.step(std::span<const strata::bf16>(g), 2e-3, std::span<strata::bf16>(out));
        ref.step(std::span<const strata::bf16>(g), 2e-3, std::span<strata::bf16>(ref_out));
        CHECK(out == ref_out);
      }
      require_same_state(opt, ref);
    }
  }
}

TEST_CASE("the run-time optimizer starts from existing state too, and reads back its running maximum") {
  const std::size_t n = 900;
  strata::adamw_options ao;
  ao.amsgrad = true;
  flat_reference ref(random_params(n, 8), ao);
  for (int t = 0; t < 2; ++t) {
    const auto g = random_grads<float>(n, 80 + static_cast<std::uint64_t>(t));
    ref.step(std::span<const float>(g), 1e-3);
  }
  auto c = host_config(2, 250);
  c.adamw = ao;
  auto opt = strata::make_offloaded_adamw(c, ref.p, state_of(ref));
  REQUIRE(opt.step_count() == 2);
  const auto g = random_grads<float>(n, 82);
  opt.step(std::span<const float>(g), 1e-3);
  ref.step(std::span<const float>(g), 1e-3);
  std::vector<float> p(n), m(n), v(n), vmax(n);
  opt.read_master(p);
  opt.read_moments(m, v);
  opt.read_max_exp_avg_sq(vmax);
  CHECK(same_bits(p, ref.p));
  CHECK(same_bits(m, ref.m));
  CHECK(same_bits(v, ref.v));
  CHECK(same_bits(vmax, ref.vmax));
}

TEST_CASE("the run-time optimizer writes the updated weights into an fp32, bf16 or fp16 model copy in the step") {
  const std::size_t n = 700;
  auto c = host_config(1, 256);
  const auto params = random_params(n, 11);
  auto opt = strata::make_offloaded_adamw(c, params);
  std::vector<float> f32(n, -1.0f);
  std::vector<strata::bf16> b16(n);
  std::vector<strata::fp16> h16(n);
  std::vector<float> master(n);
  for (int t = 0; t < 3; ++t) {
    const auto g = random_grads<strata::bf16>(n, 90 + static_cast<std::uint64_t>(t));
    if (t == 0) opt.step(std::span<const strata::bf16>(g), 1e-3, strata::host_model_span{std::span<float>(f32)});
    if (t == 1) {
      opt.accept_gradients_at(0, std::span<const strata::bf16>(g).first(300));
      opt.accept_gradients_at(300, std::span<const strata::bf16>(g).subspan(300));
      opt.step(1e-3, strata::host_model_span{std::span<strata::bf16>(b16)});
    }
    if (t == 2) opt.step(std::span<const strata::bf16>(g), 1e-3, strata::host_model_span{std::span<strata::fp16>(h16)});
    opt.read_master(master);
    for (std::size_t i = 0; i < n; ++i) {
      if (t == 0) REQUIRE(same_bits(std::span<const float>(&f32[i], 1), std::span<const float>(&master[i], 1)));
      if (t == 1) REQUIRE(b16[i].bits == strata::bf16(master[i]).bits);
      if (t == 2) REQUIRE(h16[i].bits == strata::fp16(master[i]).bits);
    }
  }
  std::vector<float> wrong(n - 1);
  CHECK_THROWS_AS(opt.step(std::span<const float>(std::vector<float>(n)), 1e-3,
                            strata::host_model_span{std::span<float>(wrong)}),
                  strata::config_error);
}

TEST_CASE("the run-time optimizer on an executor takes device gradient ranges and writes a device model copy") {
  const std::size_t n = 900;
  auto c = host_config(2, 200);
  const auto params = random_params(n, 21);
  strata::host_executor<> exec;
  auto dev = strata::make_offloaded_adamw(c, exec, strata::alternating_site{1, 1}, params);
  auto host = strata::make_offloaded_adamw(c, params);
  CHECK(&dev.executor() == &exec);
  auto grads_mem = exec.allocate_device(n * sizeof(strata::bf16));
  auto model_mem = exec.allocate_device(n * sizeof(strata::bf16));
  const strata::device_span<strata::bf16> dg(reinterpret_cast<strata::bf16*>(grads_mem.data()), n);
  const strata::device_span<strata::bf16> dm(reinterpret_cast<strata::bf16*>(model_mem.data()), n);
  for (int t = 0; t < 3; ++t) {
    const auto g = random_grads<strata::bf16>(n, 30 + static_cast<std::uint64_t>(t));
    exec.h2d().copy_to_device(dg.bytes(), std::as_bytes(std::span<const strata::bf16>(g)));
    const auto ready = exec.h2d().record();
    // Three tensors' ranges, across subgroup boundaries.
    const strata::device_span<const strata::bf16> d(dg);
    dev.accept_gradients_at(0, d.subspan(0, 333), ready);
    dev.accept_gradients_at(333, d.subspan(333, 444), ready);
    dev.accept_gradients_at(777, d.subspan(777, 123), ready);
    dev.step(1e-3, strata::device_model_span{dm});
    std::vector<strata::bf16> host_model(n);
    host.step(std::span<const strata::bf16>(g), 1e-3, strata::host_model_span{std::span<strata::bf16>(host_model)});
    std::vector<strata::bf16> device_model(n);
    exec.d2h().copy_to_host(std::as_writable_bytes(std::span<strata::bf16>(device_model)), dm.bytes());
    exec.d2h().sync();
    for (std::size_t i = 0; i < n; ++i) REQUIRE(device_model[i].bits == host_model[i].bits);
  }
  std::vector<float> a(n), b(n);
  dev.read_master(a);
  host.read_master(b);
  CHECK(same_bits(a, b));
}

TEST_CASE("discarded gradients may be handed over again, and the step uses only the new ones") {
  const std::size_t n = 500;
  auto c = host_config(1, 128);
  const auto params = random_params(n, 12);
  auto opt = strata::make_offloaded_adamw(c, params);
  auto twin = strata::make_offloaded_adamw(c, params);
  const auto stale = random_grads<float>(n, 7);
  const auto g = random_grads<float>(n, 8);
  opt.accept_gradients_at(100, std::span<const float>(stale).subspan(100, 250));
  CHECK_THROWS_AS(opt.accept_gradients_at(0, std::span<const float>(g)), strata::config_error);  // overlaps
  opt.discard_gradients();
  CHECK_THROWS_AS(opt.step(1e-3), strata::config_error);  // nothing handed over now
  opt.accept_gradients_at(0, std::span<const float>(g));
  opt.step(1e-3);
  twin.step(std::span<const float>(g), 1e-3);
  std::vector<float> a(n), b(n);
  opt.read_master(a);
  twin.read_master(b);
  CHECK(same_bits(a, b));
}

TEST_CASE("existing state that does not fit is a config_error naming the array and index, and nothing is written") {
  const std::size_t n = 100;
  const auto p = random_params(n, 9);
  std::vector<float> m(n, 0.01f), v(n, 0.02f), short_v(n - 1, 0.0f), neg_v = v, nan_m = m;
  neg_v[42] = -1.0f;
  nan_m[7] = std::numeric_limits<float>::quiet_NaN();
  strata::adamw_options ao;  // no amsgrad
  const auto refused = [&](const strata::adamw_state_view& s, const std::string& says) {
    CAPTURE(says);
    strata::host_tier tier(strata::host_tier_options{.name = "empty"});
    try {
      (void)strata::offloaded_adamw<strata::host_tier>::from_state(tier, p, s, ao, small_options(30, 0, ao, n));
      FAIL("accepted");
    } catch (const strata::config_error& e) {
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
    CHECK(tier.used() == 0);  // refused before any object was written
  };
  refused({m, short_v, {}, 1}, "exp_avg_sq has 99 values for 100 parameters");
  refused({m, neg_v, {}, 1}, "exp_avg_sq[42] is -1");
  refused({nan_m, v, {}, 1}, "exp_avg[7] is nan, which is not finite");
  refused({m, v, v, 1}, "max_exp_avg_sq given, but amsgrad is off");
}

}  // namespace from_state_test
