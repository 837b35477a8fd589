#pragma once
/// AdamW on an executor's device: `enqueue_adamw(exec, group, k)` enqueues the update of one
/// group of device-memory arrays on the executor's compute stream, bit-identical to
/// adamw_update_cpu on the same inputs, and `measure_update_rates` measures the speeds that the
/// CPU/GPU cost model (pipeline/update_cost_model.hpp) splits a step by. Executors know no
/// optimizer; this header is where AdamW meets each of them:
/// - host_executor<S>: the CPU kernel as the executor's "device" kernel (launch), paced to its
///   kernel rate;
/// - basic_cuda_executor<S> (in .cu files, compiled by nvcc): the CUDA kernel of
///   optim/adamw_cuda.cuh on the native compute stream.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <limits>
#include <span>

#include "strata/core/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/host_memory.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/optim/adamw_cpu.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/pipeline/update_cost_model.hpp"

#if STRATA_HAS_CUDA && defined(__CUDACC__)
#include "strata/exec/cuda_executor.cuh"
#include "strata/optim/adamw_cuda.cuh"
#endif

namespace strata {

/// The CPU kernel over `g`, run on the executor's compute stream.
template <class S, gradient_type G, class H>
void enqueue_adamw(host_executor<S>& exec, const adamw_group<G, H>& g, const adamw_step_params& k) {
  exec.launch(g.master.size(), [g, k](thread_pool* pool) {
    adamw_update_cpu<G, H>(g.master, g.exp_avg, g.exp_avg_sq, g.max_exp_avg_sq, g.grad, g.model_out, k, pool);
  });
}

#if STRATA_HAS_CUDA && defined(__CUDACC__)
/// The CUDA kernel over `g` (device memory of `exec`), launched on its compute stream.
template <class S, gradient_type G, class H>
void enqueue_adamw(basic_cuda_executor<S>& exec, const adamw_group<G, H>& g, const adamw_step_params& k) {
  const std::size_t n = g.master.size();
  STRATA_EXPECTS(g.exp_avg.size() == n && g.exp_avg_sq.size() == n && g.grad.size() == n &&
                     (!k.amsgrad || g.max_exp_avg_sq.size() == n) && (g.model_out.empty() || g.model_out.size() == n),
                 config_error, "enqueue_adamw: arrays of different lengths for {} parameters", n);
  exec.launch([&](cudaStream_t native) {
    cuda::adamw_update<G, H>(g.master.data(), g.exp_avg.data(), g.exp_avg_sq.data(),
                             k.amsgrad ? g.max_exp_avg_sq.data() : nullptr, g.grad.data(),
                             g.model_out.empty() ? nullptr : g.model_out.data(), n, k, native);
  });
}
#endif

/// An executor that can run AdamW updates: enqueue_adamw has an overload for it (for every
/// gradient type with a 16-bit model copy).
template <class E>
concept adamw_executor =
    executor<E> && requires(E& e, const adamw_step_params& k, const adamw_group<float, bf16>& g32,
                            const adamw_group<bf16, bf16>& gb, const adamw_group<fp16, fp16>& gh) {
      enqueue_adamw(e, g32, k);
      enqueue_adamw(e, gb, k);
      enqueue_adamw(e, gh, k);
    };

static_assert(adamw_executor<host_executor<>>);

/// Measures update_rates on `exec` and the CPU with a probe of `params` parameters (fp32 state,
/// bf16 gradients and model copy): each figure is the best of `reps` timed runs after one warm-up,
/// so that a one-off stall does not bias the split. Needs 16 bytes per parameter on each side
/// (state, gradients, model copy); capacity_error when the device budget is smaller.
template <adamw_executor Exec>
[[nodiscard]] update_rates measure_update_rates(Exec& exec, std::size_t params, thread_pool* pool = nullptr,
                                                int reps = 3) {
  STRATA_EXPECTS(params > 0 && reps > 0, config_error, "measure_update_rates: params {} and reps {} must be positive",
                 params, reps);
  using clock = std::chrono::steady_clock;
  const std::size_t state = params * 3 * sizeof(float), grads = params * sizeof(bf16);
  host_allocation host(state + 2 * grads, resolve_host_memory(exec.staging()));
  auto device = exec.allocate_device(state + 2 * grads);
  std::span<std::byte> h(host.data(), host.size()), d(device.data(), state + 2 * grads);
  std::fill(h.begin(), h.end(), std::byte{0});
  const auto groups = [&](std::span<std::byte> mem) {
    auto* f = reinterpret_cast<float*>(mem.data());
    auto* g = reinterpret_cast<bf16*>(mem.data() + state);
    return adamw_group<bf16, bf16>{std::span<float>(f, params), std::span<float>(f + params, params),
                                   std::span<float>(f + 2 * params, params), std::span<float>(),
                                   std::span<const bf16>(g, params), std::span<bf16>(g + params, params)};
  };
  const adamw_step_params k = make_adamw_step_params(adamw_options{}, 1, 1e-3);
  const auto best_of = [&](auto&& run) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r <= reps; ++r) {  // r == 0 warms up
      const auto t0 = clock::now();
      run();
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (r > 0) best = std::min(best, s);
    }
    return best;
  };
  update_rates out;
  const auto hg = groups(h);
  out.host_params_per_s = static_cast<double>(params) / best_of([&] {
    adamw_update_cpu<bf16, bf16>(hg.master, hg.exp_avg, hg.exp_avg_sq, hg.max_exp_avg_sq, hg.grad, hg.model_out, k,
                                 pool);
  });
  out.h2d_bytes_per_s = static_cast<double>(h.size()) / best_of([&] {
    exec.h2d().copy_to_device(d, h);
    exec.h2d().sync();
  });
  out.d2h_bytes_per_s = static_cast<double>(h.size()) / best_of([&] {
    exec.d2h().copy_to_host(h, d);
    exec.d2h().sync();
  });
  const auto dg = groups(d);
  out.device_params_per_s = static_cast<double>(params) / best_of([&] {
    enqueue_adamw(exec, dg, k);
    exec.compute().sync();
  });
  return out;
}

}  // namespace strata
