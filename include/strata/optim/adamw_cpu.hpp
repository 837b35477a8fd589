#pragma once
/// The CPU AdamW kernel: vectorized (portable, AVX2, AVX-512 paths chosen at run time) and
/// multithreaded over the strata thread pool in cache-sized tiles. One call updates one span of
/// parameters (a whole model or one subgroup) and, in the same pass, writes the updated weights
/// rounded to bf16/fp16 into the model's copy. Results are bit-identical for any thread count,
/// tile size and instruction-set path, and to the CUDA kernel (optim/adamw_cuda.cuh): every
/// path evaluates strata::adamw_element (optim/adamw_math.hpp).
///
/// Thread safety: a call writes only the spans it is given; calls on disjoint spans may run
/// concurrently.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include "strata/core/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/cpu_dispatch.hpp"
#include "strata/optim/detail/simd_x86.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/grad_norm.hpp"

namespace strata {

/// Elements per tile: 16 Ki elements touch 256-320 KiB of state and gradients, which stays in a
/// core's L2 while it is updated, and makes a tile long enough (tens of microseconds) that
/// claiming it costs nothing.
inline constexpr std::size_t adamw_default_tile_elems = 16384;

namespace detail {

// M is the moments' element: float, or bf16 (widened exactly before the update, rounded to
// nearest even after it, as narrow() rounds a model copy).
template <bool L2, bool Amsgrad, class G, class H, class M>
[[gnu::always_inline]] inline void adamw_loop(float* __restrict p, M* __restrict m, M* __restrict v,
                                              M* __restrict vmax, const G* __restrict g, H* __restrict out,
                                              std::size_t n, const adamw_step_params k) {
  for (std::size_t i = 0; i < n; ++i) {
    // Keeps the loop scalar: vectorizers drop association barriers, and with FMA in the
    // baseline ISA (aarch64, -march=native) a vectorized loop could fuse products.
    __asm__ volatile("");
    float pi = p[i];
    float mi = widen(m[i]);
    float vi = widen(v[i]);
    float vm = 0;
    if constexpr (Amsgrad) vm = widen(vmax[i]);
    adamw_element<L2, Amsgrad>(pi, mi, vi, vm, widen(g[i]), k);
    p[i] = pi;
    m[i] = narrow<M>(mi);
    v[i] = narrow<M>(vi);
    if constexpr (Amsgrad) vmax[i] = narrow<M>(vm);
    if constexpr (!std::is_same_v<H, no_model_copy>) out[i] = narrow<H>(pi);
  }
}

template <bool L2, bool Amsgrad, class G, class H, class M>
STRATA_DETAIL_KERNEL_PORTABLE void adamw_kernel_portable(float* p, M* m, M* v, M* vmax, const G* g, H* out,
                                                         std::size_t n, const adamw_step_params k) {
  adamw_loop<L2, Amsgrad>(p, m, v, vmax, g, out, n, k);
}
#if STRATA_CPU_X86_PATHS
namespace simd {
STRATA_DETAIL_DEFINE_SIMD_ADAMW_LOOP(avx512, STRATA_DETAIL_AVX512_FN, f32x16, load16, store16, stream16)
STRATA_DETAIL_DEFINE_SIMD_ADAMW_LOOP(avx512bf16, STRATA_DETAIL_AVX512BF16_FN, f32x16, load16, store16_ne, stream16_ne)
STRATA_DETAIL_DEFINE_SIMD_ADAMW_LOOP(avx2, STRATA_DETAIL_AVX2_FN, f32x8, load8, store8, stream8)
}  // namespace simd
template <bool L2, bool Amsgrad, class G, class H, class M>
STRATA_DETAIL_KERNEL_AVX2 void adamw_kernel_avx2(float* p, M* m, M* v, M* vmax, const G* g, H* out, std::size_t n,
                                                 const adamw_step_params k) {
  simd::adamw_loop_avx2<L2, Amsgrad>(p, m, v, vmax, g, out, n, k);
}
template <bool L2, bool Amsgrad, class G, class H, class M>
STRATA_DETAIL_KERNEL_AVX512 void adamw_kernel_avx512(float* p, M* m, M* v, M* vmax, const G* g, H* out,
                                                     std::size_t n, const adamw_step_params k) {
  simd::adamw_loop_avx512<L2, Amsgrad>(p, m, v, vmax, g, out, n, k);
}
template <bool L2, bool Amsgrad, class G, class H, class M>
STRATA_DETAIL_KERNEL_AVX512BF16 void adamw_kernel_avx512bf16(float* p, M* m, M* v, M* vmax, const G* g, H* out,
                                                             std::size_t n, const adamw_step_params k) {
  simd::adamw_loop_avx512bf16<L2, Amsgrad>(p, m, v, vmax, g, out, n, k);
}
#endif

template <class G, class H, class M = float>
using adamw_kernel_fn = void (*)(float*, M*, M*, M*, const G*, H*, std::size_t, adamw_step_params);

template <bool L2, bool Amsgrad, class G, class H, class M = float>
adamw_kernel_fn<G, H, M> pick_adamw_kernel(cpu_isa isa) {
#if STRATA_CPU_X86_PATHS
  if constexpr (std::is_same_v<H, bf16> || std::is_same_v<M, bf16>)  // bf16 stores: rounded by the instruction
    if (isa == cpu_isa::avx512 && cpu_uses_avx512_bf16()) return &adamw_kernel_avx512bf16<L2, Amsgrad, G, H, M>;
  if (isa == cpu_isa::avx512) return &adamw_kernel_avx512<L2, Amsgrad, G, H, M>;
  if (isa == cpu_isa::avx2) return &adamw_kernel_avx2<L2, Amsgrad, G, H, M>;
#endif
  (void)isa;
  return &adamw_kernel_portable<L2, Amsgrad, G, H, M>;
}

template <class G, class H, class M = float>
adamw_kernel_fn<G, H, M> pick_adamw_kernel(cpu_isa isa, bool l2, bool amsgrad) {
  if (l2)
    return amsgrad ? pick_adamw_kernel<true, true, G, H, M>(isa) : pick_adamw_kernel<true, false, G, H, M>(isa);
  return amsgrad ? pick_adamw_kernel<false, true, G, H, M>(isa) : pick_adamw_kernel<false, false, G, H, M>(isa);
}

template <class G, class H, class M = float>
void run_adamw_cpu(float* p, M* m, M* v, M* vmax, const G* g, H* out, std::size_t n, const adamw_step_params& k,
                   thread_pool* pool, std::size_t tile, cpu_isa isa) {
  const auto kernel = pick_adamw_kernel<G, H, M>(resolve_cpu_isa(isa), k.l2, k.amsgrad);
  parallel_tiles(n, tile, pool, [&](std::size_t b, std::size_t e) {
    kernel(p + b, m + b, v + b, k.amsgrad ? vmax + b : nullptr, g + b, out == nullptr ? nullptr : out + b, e - b, k);
  });
}

}  // namespace detail

/// Updates n = master.size() parameters in place with the constants `k` (make_adamw_step_params).
///  - master: fp32 weights, n;
///  - exp_avg, exp_avg_sq: the moments, n each, of type M (given, never deduced: fp32 by default,
///    or bf16, widened exactly for the update and rounded back to nearest even:
///    optim/adamw_bf16_rule.hpp);
///  - max_exp_avg_sq: n elements when k.amsgrad, else ignored (may be empty);
///  - grad: n gradients in float, bf16 or fp16 (as produced, still multiplied by the loss scale:
///    k.grad_scale unscales them in the same pass);
///  - model_out: n bf16/fp16 elements receiving the updated weights rounded to nearest even, n
///    floats receiving them exactly (an fp32 model), or empty to write none.
/// Runs on the calling thread plus up to pool->size() - 1 workers of `pool` (nullptr: the
/// calling thread only), in tiles of `tile_elems`. `isa` forces an instruction-set path
/// (config_error if this CPU lacks it). Mismatched sizes are a config_error naming the span.
template <gradient_type G, class H = bf16, class M = float>
  requires model_copy_type<H> && (std::is_same_v<M, float> || std::is_same_v<M, bf16>)
void adamw_update_cpu(std::span<float> master, std::span<std::type_identity_t<M>> exp_avg,
                      std::span<std::type_identity_t<M>> exp_avg_sq, std::span<std::type_identity_t<M>> max_exp_avg_sq,
                      std::span<const G> grad, std::span<H> model_out,
                      const adamw_step_params& k, thread_pool* pool = nullptr,
                      std::size_t tile_elems = adamw_default_tile_elems, cpu_isa isa = cpu_isa::automatic) {
  const std::size_t n = master.size();
  STRATA_EXPECTS(exp_avg.size() == n, config_error, "adamw_update_cpu: exp_avg has {} elements for {} parameters",
                 exp_avg.size(), n);
  STRATA_EXPECTS(exp_avg_sq.size() == n, config_error,
                 "adamw_update_cpu: exp_avg_sq has {} elements for {} parameters", exp_avg_sq.size(), n);
  STRATA_EXPECTS(!k.amsgrad || max_exp_avg_sq.size() == n, config_error,
                 "adamw_update_cpu: amsgrad needs max_exp_avg_sq of {} elements, got {}", n, max_exp_avg_sq.size());
  STRATA_EXPECTS(grad.size() == n, config_error, "adamw_update_cpu: got {} gradients for {} parameters", grad.size(), n);
  STRATA_EXPECTS(model_out.empty() || model_out.size() == n, config_error,
                 "adamw_update_cpu: model copy has {} elements for {} parameters (give n or none)", model_out.size(), n);
  STRATA_EXPECTS(tile_elems > 0, config_error, "adamw_update_cpu: tile_elems must be positive");
  if (model_out.empty())
    detail::run_adamw_cpu<G, detail::no_model_copy, M>(master.data(), exp_avg.data(), exp_avg_sq.data(),
                                                       max_exp_avg_sq.data(), grad.data(), nullptr, n, k, pool,
                                                       tile_elems, isa);
  else
    detail::run_adamw_cpu<G, H, M>(master.data(), exp_avg.data(), exp_avg_sq.data(), max_exp_avg_sq.data(),
                                   grad.data(), model_out.data(), n, k, pool, tile_elems, isa);
}

/// What adamw_step_cpu did.
struct adamw_step_report {
  bool skipped = false;  ///< inf/NaN gradients: nothing was updated and the step count is unchanged
  double grad_norm = 0;  ///< global norm of the unscaled gradients
  float clip = 1;        ///< clip coefficient applied (1: none)
  std::vector<std::size_t> nonfinite_groups;  ///< groups holding inf/NaN gradients (when skipped)
};

/// One optimizer step over a whole model split into groups, with loss-scaler semantics: the
/// global gradient norm is accumulated over every group first; if any gradient is inf/NaN the
/// step is skipped for the whole model (no state, no model copy and not `step` change) and the
/// report says so; otherwise `step` is incremented and every group is updated with gradients
/// unscaled by `grad_scale` and clipped to `max_grad_norm` (if given).
template <gradient_type G, class H>
adamw_step_report adamw_step_cpu(std::span<const adamw_group<G, H>> groups, const adamw_options& options,
                                 std::int64_t& step, double lr, double grad_scale = 1.0,
                                 std::optional<double> max_grad_norm = std::nullopt, thread_pool* pool = nullptr) {
  grad_norm_accumulator acc;
  for (std::size_t i = 0; i < groups.size(); ++i)
    acc.add(i, grad_stats_cpu(groups[i].grad, static_cast<float>(grad_scale), pool));
  const step_decision d = decide_step(acc, max_grad_norm);
  adamw_step_report report{d.skip, d.grad_norm, d.clip, {}};
  if (d.skip) {
    report.nonfinite_groups = acc.nonfinite_subgroups();
    return report;
  }
  const adamw_step_params k = make_adamw_step_params(options, step + 1, lr, grad_scale, d.clip);
  for (const auto& g : groups)
    adamw_update_cpu(g.master, g.exp_avg, g.exp_avg_sq, g.max_exp_avg_sq, g.grad, g.model_out, k, pool);
  ++step;
  return report;
}

/// The gradient and model-copy types strata's steps use, as X(G, H) for each pair.
#define STRATA_ADAMW_TYPE_PAIRS(X) \
  X(float, bf16) X(bf16, bf16) X(fp16, fp16) X(float, fp16) X(bf16, fp16) X(fp16, bf16) \
  X(float, float) X(bf16, float) X(fp16, float)
/// The same with two leading arguments, as X(A, B, G, H).
#define STRATA_ADAMW_TYPE_PAIRS_WITH(X, A, B) \
  X(A, B, float, bf16) X(A, B, bf16, bf16) X(A, B, fp16, fp16) X(A, B, float, fp16) X(A, B, bf16, fp16) \
  X(A, B, fp16, bf16) X(A, B, float, float) X(A, B, bf16, float) X(A, B, fp16, float)

#if STRATA_EXTERN_TEMPLATES
// Compiled once, in cmake/strata_instances.cpp (see STRATA_EXTERN_TEMPLATES in core/config.hpp).
#define STRATA_ADAMW_UPDATE_CPU(G, H)                                                                         \
  extern template void adamw_update_cpu<G, H>(std::span<float>, std::span<float>, std::span<float>,           \
                                              std::span<float>, std::span<const G>, std::span<H>,             \
                                              const adamw_step_params&, thread_pool*, std::size_t, cpu_isa);
STRATA_ADAMW_TYPE_PAIRS(STRATA_ADAMW_UPDATE_CPU)
#undef STRATA_ADAMW_UPDATE_CPU
#endif

}  // namespace strata
