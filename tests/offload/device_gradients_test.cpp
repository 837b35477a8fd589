// Gradients handed over from an executor's device memory (accept_gradients with a device_span
// and an event): the call returns before backward's event has completed, the copies land on the
// d2h stream and are summed for the norm as they arrive, and the step equals one over the same
// gradients from host memory bit for bit; a failed copy fails the step before any state
// changes. Runs on host_executor (its "device" memory is separate host memory).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <strata/exec/device_span.hpp>
#include <strata/exec/faulty_stream.hpp>
#include <strata/exec/host_executor.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/tier/device_tier.hpp>
#include <strata/tier/multipath.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace device_gradients_test {

namespace {

using namespace strata_test;
using S = strata::faulty<strata::host_stream>;
using exec_t = strata::host_executor<S>;
using opt_t = strata::offloaded_adamw<strata::host_tier, strata::sweep_aware, strata::alternating, exec_t,
                                      strata::alternating_site>;

constexpr std::size_t n = 3000, sg = 400;  // 8 subgroups

/// Backward on the "device": a stream held shut by a gate, then writing the gradients into
/// device memory; its event is what the optimizer must wait for.
struct fake_backward {
  S stream{"backward"};
  std::promise<void> gate;

  strata::host_event write(std::span<const strata::bf16> host, strata::device_span<strata::bf16> device) {
    stream.enqueue_host([f = gate.get_future().share()] { f.wait(); });
    stream.copy_to_device(device.bytes(), std::as_bytes(host));
    return stream.record();
  }
};

strata::offload_options options(bool norm) {
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.threads = 2;
  off.host_cache_bytes = strata::offload_layout::of(n, {}, off).cache_bytes(2);
  if (norm) {
    off.max_grad_norm = 0.1;
    off.loss_scaling.enabled = true;
    off.loss_scaling.init_scale = 1024;
  }
  return off;
}

/// One optimizer on the faulty-stream executor, its reference, and n bf16 gradients of device memory.
struct device_run {
  exec_t exec{{}, [](strata::stream_role, const std::string& name) { return std::make_unique<S>(name); }};
  strata::host_tier tier{strata::host_tier_options{.name = "t"}};
  opt_t opt;
  scaled_reference ref;
  exec_t::device_buffer device;
  strata::device_span<strata::bf16> dgrads;

  device_run(const std::vector<float>& init, const strata::offload_options& off)
      : opt(tier, exec, init, {}, off, {}, {}, strata::alternating_site{1, 1}),
        ref(init, {}, sg, off),
        device(exec.allocate_device(n * sizeof(strata::bf16))),
        dgrads(reinterpret_cast<strata::bf16*>(device.data()), n) {}

  /// Step t's gradients, scaled by the optimizer's loss scale.
  std::vector<strata::bf16> grads(std::uint64_t seed) {
    std::vector<strata::bf16> g(n);
    const auto raw = random_grads<float>(n, seed);
    for (std::size_t i = 0; i < n; ++i) g[i] = strata::bf16(raw[i] * opt.loss_scale());
    return g;
  }
};

}  // namespace

TEST_CASE("gradients in device memory are handed over without waiting and step as host gradients do") {
  for (const bool norm : {false, true}) {
    CAPTURE(norm);
    device_run r(random_params(n, 3), options(norm));
    auto& opt = r.opt;
    for (int t = 0; t < 3; ++t) {
      const auto g = r.grads(40 + static_cast<std::uint64_t>(t));
      fake_backward backward;
      const auto ready = backward.write(g, r.dgrads);
      for (std::size_t s = opt.subgroup_count(); s-- > 0;)
        opt.accept_gradients(s, strata::device_span<const strata::bf16>(r.dgrads).subspan(opt.begin(s), opt.length(s)),
                             ready);
      CHECK_FALSE(ready.ready());  // every call returned while backward had not even written them
      backward.gate.set_value();
      std::vector<strata::bf16> out(n), ref_out(n);
      const auto st = opt.step(1e-3, std::span<strata::bf16>(out));
      const auto rr = r.ref.step(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(ref_out));
      CHECK(out == ref_out);
      CHECK(st.grad_norm.has_value() == norm);
      if (norm) {
        CHECK(*st.grad_norm == rr.grad_norm);
        CHECK(st.clip == rr.clip);
        CHECK(st.clip < 1.0f);
      }
      require_same(opt, r.ref);
    }
  }
}

TEST_CASE("device gradient ranges that cross subgroups, mixed with host ranges, step as whole host gradients do") {
  // Ranges of a framework's parameter tensors: [0, 250) [250, 1111) on the device, [1111, 1500)
  // from the host while device copies are in flight, [1500, 3000) on the device again.
  for (const bool norm : {false, true}) {
    CAPTURE(norm);
    device_run r(random_params(n, 5), options(norm));
    auto& opt = r.opt;
    const strata::device_span<const strata::bf16> d(r.dgrads);
    for (int t = 0; t < 2; ++t) {
      const auto g = r.grads(60 + static_cast<std::uint64_t>(t));
      fake_backward backward;
      const auto ready = backward.write(g, r.dgrads);
      opt.accept_gradients_at(0, d.subspan(0, 250), ready);
      opt.accept_gradients_at(250, d.subspan(250, 861), ready);
      opt.accept_gradients_at(1111, std::span<const strata::bf16>(g).subspan(1111, 389));
      opt.accept_gradients_at(1500, d.subspan(1500, 1500), ready);
      CHECK_FALSE(ready.ready());
      backward.gate.set_value();
      std::vector<strata::bf16> out(n), ref_out(n);
      const auto st = opt.step(1e-3, std::span<strata::bf16>(out));
      const auto rr = r.ref.step(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(ref_out));
      CHECK(out == ref_out);
      if (norm) {
        REQUIRE(st.grad_norm.has_value());
        CHECK(*st.grad_norm == rr.grad_norm);
        CHECK(st.clip == rr.clip);
      }
      require_same(opt, r.ref);
    }
  }
}

TEST_CASE("a failed device-to-host copy of gradients fails the step before any state changes") {
  const auto init = random_params(n, 4);
  strata::adamw_options ao;
  const auto off = options(true);
  S* d2h = nullptr;
  exec_t exec({}, [&](strata::stream_role r, const std::string& name) {
    auto s = std::make_unique<S>(name);
    if (r == strata::stream_role::d2h) d2h = s.get();
    return s;
  });
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  opt_t opt(tier, exec, init, ao, off, {}, {}, strata::alternating_site{1, 0});
  scaled_reference ref(init, ao, sg, off);
  auto device = exec.allocate_device(n * sizeof(strata::bf16));
  const strata::device_span<strata::bf16> dgrads(reinterpret_cast<strata::bf16*>(device.data()), n);
  std::vector<strata::bf16> g(n);
  const auto raw = random_grads<float>(n, 50);
  for (std::size_t i = 0; i < n; ++i) g[i] = strata::bf16(raw[i] * opt.loss_scale());
  const auto hand_over = [&] {
    fake_backward backward;
    backward.gate.set_value();
    const auto ready = backward.write(g, dgrads);
    for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
      opt.accept_gradients(s, strata::device_span<const strata::bf16>(dgrads).subspan(opt.begin(s), opt.length(s)),
                           ready);
  };
  d2h->inject({.after = 3});
  hand_over();
  CHECK_THROWS_AS(opt.step(), strata::stream_error);
  CHECK(opt.step_count() == 0);
  require_same(opt, ref);  // nothing changed, the loss scale neither
  // The gradients were dropped: a step now says they are missing.
  CHECK_THROWS_AS(opt.step(), strata::config_error);
  hand_over();
  opt.step();
  std::vector<strata::bf16> none;
  ref.step(std::span<const strata::bf16>(g), ao.lr, std::span<strata::bf16>(none));
  require_same(opt, ref);
  // Device gradients need host residency.
  auto tier_off = off;
  tier_off.gradients = strata::gradient_residency::tier;
  strata::host_tier tier2(strata::host_tier_options{.name = "t2"});
  opt_t opt2(tier2, exec, init, ao, tier_off, {}, {}, strata::alternating_site{1, 0});
  fake_backward backward;
  backward.gate.set_value();
  const auto ready = backward.write(g, dgrads);
  CHECK_THROWS_AS(opt2.accept_gradients(0, strata::device_span<const strata::bf16>(dgrads).subspan(0, sg), ready),
                  strata::config_error);
}

TEST_CASE("a model copy in device memory, bf16 or fp32, is written in place by device updates and copied in after host ones") {
  const auto init = random_params(n, 5);
  strata::adamw_options ao;
  const auto off = options(false);
  exec_t exec({}, [](strata::stream_role, const std::string& name) { return std::make_unique<S>(name); });
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  const auto check_model = [&]<class H>() {
    for (const std::size_t k_device : {0, 1, 2}) {  // all on the host, every other one, two of three on the device
      CAPTURE(k_device);
      opt_t opt(tier, exec, init, ao, off, {}, {}, strata::alternating_site{1, k_device});
      flat_reference ref(init, ao);
      auto model = exec.allocate_device(n * sizeof(H));
      const strata::device_span<H> dmodel(reinterpret_cast<H*>(model.data()), n);
      for (int t = 0; t < 2; ++t) {
        const auto g = random_grads<strata::bf16>(n, 60 + static_cast<std::uint64_t>(t));
        for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
          opt.accept_gradients(s, std::span<const strata::bf16>(g).subspan(opt.begin(s), opt.length(s)));
        const auto st = opt.step(1e-3, dmodel);
        std::vector<H> ref_out(n);
        ref.step(std::span<const strata::bf16>(g), 1e-3, std::span<H>(ref_out));
        CHECK((st.device_updates > 0) == (k_device > 0));
        // A host_executor's "device" memory is host memory: the test may look.
        CHECK(std::memcmp(model.data(), ref_out.data(), n * sizeof(H)) == 0);
      }
      require_same_state(opt, ref);
    }
  };
  SUBCASE("bf16") { check_model.template operator()<strata::bf16>(); }
  SUBCASE("fp32: the model is the master weights") { check_model.template operator()<float>(); }
}

TEST_CASE("optimizer state kept in device memory (device_tier above host memory) steps bit-identically") {
  using dev_tier = strata::device_tier<exec_t>;
  using tier_t = strata::multipath<strata::bandwidth_proportional, dev_tier, strata::host_tier>;
  const auto init = random_params(n, 5);
  strata::adamw_options ao;
  auto off = options(false);
  off.host_cache_bytes = 0;  // every subgroup comes from its path in every step
  const auto make_streams = [](strata::stream_role, const std::string& name) { return std::make_unique<S>(name); };
  // The device path holds about half of the state (its budget), the host path the rest.
  const std::uint64_t state_bytes = n * 12;
  tier_t tier(strata::bandwidth_proportional{},
              std::tuple{strata::device_tier_options{.name = "gpu", .capacity = state_bytes / 2 + 8192,
                                                     .read_bandwidth = 50e9, .write_bandwidth = 50e9},
                         strata::host_executor_options{.name = "gpu"}, make_streams},
              strata::host_tier_options{.name = "host", .read_bandwidth = 25e9, .write_bandwidth = 25e9});
  exec_t exec({}, make_streams);
  strata::offloaded_adamw<tier_t, strata::sweep_aware, strata::alternating, exec_t, strata::alternating_site> opt(
      tier, exec, init, ao, off, {}, {}, strata::alternating_site{1, 1});
  CHECK(tier.path<0>().used() > 0);
  CHECK(tier.path<1>().used() > 0);
  scaled_reference ref(init, ao, sg, off);
  for (int t = 0; t < 3; ++t) {
    const auto g = random_grads<strata::bf16>(n, 60 + static_cast<std::uint64_t>(t));
    std::vector<strata::bf16> out(n), ref_out(n);
    opt.step(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(out));
    ref.step(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(ref_out));
    CHECK(out == ref_out);
    require_same(opt, ref);
  }
}

}  // namespace device_gradients_test
