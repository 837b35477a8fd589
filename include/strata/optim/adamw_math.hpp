#pragma once
/// The AdamW update of one element, shared by the CPU kernels (scalar and SIMD) and the CUDA
/// kernel, so every path computes the same formula and rounds the same way.
///
/// The order of operations is PyTorch's `_single_tensor_adam` (torch/optim/adam.py, 2.x; AdamW is
/// Adam with decoupled_weight_decay=True) as its vectorized CPU kernels evaluate it. With
/// g the raw gradient, s the gradient scale (inverse loss scale) and c the clip coefficient:
///
///   g  = (g * s) * c                 GradScaler.unscale_, then clip_grad_norm_'s mul_
///   g  = -g                          maximize (folded into s: (-g)*s == -(g*s) exactly)
///   Adam:  g = fma(p, wd, g)         grad.add(param, alpha=wd)   (ATen vectorized: fmadd)
///   AdamW: p = p * (1 - lr*wd)       param.mul_(1 - lr*wd)       (1 - lr*wd in double)
///   m  = fma(w', g - m, base)        exp_avg.lerp_(grad, w = 1-beta1): w < 0.5 ? (w, m) : (w-1, g)
///   v  = fma((1-b2) * g, g, v * b2)  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1-beta2)
///   vmax = max(vmax, v); v' = vmax   amsgrad (torch.maximum: NaN propagates); else v' = v
///   d  = sqrt(v') / sqrt(bc2) + eps  (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
///   p  = p + (-lr/bc1 * m) / d       param.addcdiv_(exp_avg, denom, value=-step_size)
///
/// where bc1 = 1 - beta1^t and bc2 = 1 - beta2^t, and the scalars are computed in double and
/// rounded to float once, as PyTorch does (see make_adamw_step_params). Every operation is one
/// IEEE float operation rounded to nearest even; `fma` is a fused multiply-add (one rounding)
/// exactly where ATen's vectorized kernels use one, and nowhere else: on the host every product
/// sits behind an association barrier (AVX-512: an embedded-rounding builtin) that no
/// -ffp-contract setting can fuse, the device code uses __fmul_rn/__fadd_rn/__fmaf_rn. sqrt
/// and division are correctly rounded everywhere. Agreement with PyTorch is within a few ULP:
/// PyTorch's own CPU sqrt (2.15, AVX-512 build) is off by one ULP for about 16% of inputs.

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>

#include "strata/core/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"

namespace strata {

/// Hyperparameters of Adam/AdamW, named and defaulted as in torch.optim.AdamW.
struct adamw_options {
  double lr = 1e-3;            ///< base learning rate (a step may use another: see make_adamw_step_params)
  double beta1 = 0.9;          ///< first-moment decay
  double beta2 = 0.999;        ///< second-moment decay
  double eps = 1e-8;           ///< added to the denominator
  /// Decay coefficient; 0 disables decay. Unset: PyTorch's default for the mode, 1e-2 for AdamW
  /// (torch.optim.AdamW) and 0 for Adam (torch.optim.Adam), so turning `decoupled` off never
  /// brings in an L2 term nobody asked for.
  std::optional<double> weight_decay{};
  bool decoupled = true;       ///< true: AdamW (p *= 1 - lr*wd); false: Adam (L2, g += wd*p)
  bool amsgrad = false;        ///< keep the running maximum of v and normalize by it
  bool maximize = false;       ///< ascend instead of descend (the gradient is negated)

  /// The decay coefficient in effect (weight_decay, or the mode's default).
  [[nodiscard]] constexpr double decay() const noexcept { return weight_decay ? *weight_decay : decoupled ? 1e-2 : 0.0; }

  /// Throws config_error naming the first value PyTorch would also reject.
  void validate() const {
    STRATA_EXPECTS(std::isfinite(lr) && lr >= 0, config_error, "adamw_options: invalid lr {}", lr);
    STRATA_EXPECTS(beta1 >= 0 && beta1 < 1, config_error, "adamw_options: invalid beta1 {} (need 0 <= beta1 < 1)", beta1);
    STRATA_EXPECTS(beta2 >= 0 && beta2 < 1, config_error, "adamw_options: invalid beta2 {} (need 0 <= beta2 < 1)", beta2);
    STRATA_EXPECTS(std::isfinite(eps) && eps >= 0, config_error, "adamw_options: invalid eps {}", eps);
    STRATA_EXPECTS(std::isfinite(decay()) && decay() >= 0, config_error, "adamw_options: invalid weight_decay {}",
                   decay());
  }
};

/// The per-step constants of the update, precomputed once per step (not per element or per
/// subgroup), in float, exactly as PyTorch rounds them. Trivially copyable: pass it by value to
/// a CUDA kernel.
struct adamw_step_params {
  float grad_scale = 1;      ///< multiplies the raw gradient: inverse loss scale, negated for maximize
  float clip = 1;            ///< clip-by-global-norm coefficient (1: no clipping)
  float weight_decay = 0;    ///< L2 coefficient (Adam only; used when l2)
  float decay_factor = 1;    ///< float(1 - lr*wd) for AdamW, 1 otherwise (p * 1 == p exactly)
  float lerp_coeff = 0.1f;   ///< w if lerp_from_m else w - 1, with w = float(1 - beta1)
  float beta2 = 0.999f;      ///< float(beta2)
  float one_minus_beta2 = 0.001f;  ///< float(1 - beta2), computed in double
  float bias_correction2_sqrt = 1;  ///< float((1 - beta2^t) ** 0.5)
  float eps = 1e-8f;         ///< float(eps)
  float neg_step_size = -1e-3f;  ///< float(-(lr / (1 - beta1^t)))
  bool lerp_from_m = true;   ///< |w| < 0.5: lerp as m + w*(g-m), else as g + (w-1)*(g-m) (torch.lerp)
  bool l2 = false;           ///< Adam with weight_decay != 0
  bool amsgrad = false;      ///< see adamw_options::amsgrad
};

/// Constants for step `step` (1-based, like PyTorch's state['step'] after its increment) with
/// learning rate `lr` (a scheduler's value for this step), gradient scale `grad_scale` (1 /
/// loss scale) and clip coefficient `clip` (see clip_coefficient). Throws config_error on a
/// step below 1 or invalid options.
[[nodiscard]] inline adamw_step_params make_adamw_step_params(const adamw_options& o, std::int64_t step, double lr,
                                                              double grad_scale = 1.0, double clip = 1.0) {
  adamw_options with_lr = o;
  with_lr.lr = lr;
  with_lr.validate();
  STRATA_EXPECTS(step >= 1, config_error, "make_adamw_step_params: step {} (steps count from 1)", step);
  STRATA_EXPECTS(std::isfinite(grad_scale) && grad_scale > 0, config_error,
                 "make_adamw_step_params: gradient scale {} must be positive and finite", grad_scale);
  STRATA_EXPECTS(clip >= 0 && clip <= 1, config_error,
                 "make_adamw_step_params: clip coefficient {} must be in [0, 1]", clip);
  // PyTorch keeps the step count in a float32 tensor and raises betas to step.item().
  const double t = static_cast<double>(static_cast<float>(step));
  const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
  const double step_size = lr / bias_correction1;
  adamw_step_params k;
  k.grad_scale = static_cast<float>(o.maximize ? -grad_scale : grad_scale);
  k.clip = static_cast<float>(clip);
  const double wd = o.decay();
  k.l2 = !o.decoupled && wd != 0;
  k.weight_decay = static_cast<float>(wd);
  k.decay_factor = o.decoupled && wd != 0 ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  const float w = static_cast<float>(1.0 - o.beta1);
  k.lerp_from_m = std::fabs(w) < 0.5f;
  k.lerp_coeff = k.lerp_from_m ? w : w - 1.0f;
  k.beta2 = static_cast<float>(o.beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  k.bias_correction2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));  // Python's `** 0.5`
  k.eps = static_cast<float>(o.eps);
  k.neg_step_size = static_cast<float>(-step_size);
  k.amsgrad = o.amsgrad;
  return k;
}

// Forced inlining of the formula into each kernel: its SIMD instantiations must never exist as
// separate functions, whose vector arguments would cross a target-attribute ABI boundary (GCC
// does not inline at -O0 otherwise).
#if defined(__CUDACC__)
#define STRATA_DETAIL_FORCE_INLINE __forceinline__
#else
#define STRATA_DETAIL_FORCE_INLINE [[gnu::always_inline]] inline
#endif

namespace detail::fp {
// One IEEE operation each, round to nearest even. The formula calls them unqualified, so the
// SIMD value types of the CPU kernels (optim/detail/simd_x86.hpp) supply their own by ADL. On the
// device the _rn intrinsics are never contracted into FMAs; on the host the association barrier
// keeps a product from fusing with the add that consumes it, even under -ffp-contract=fast
// (tests/optim/contraction_test.cpp). nvcc's front end lacks the builtin, so host code compiled
// through nvcc gets no barrier: run CPU references from .cpp files (as the CUDA tests do).
#if defined(__CUDA_ARCH__)
__device__ inline float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ inline float fsub(float a, float b) { return __fsub_rn(a, b); }
__device__ inline float fdiv(float a, float b) { return __fdiv_rn(a, b); }
__device__ inline float fsqrt(float a) { return __fsqrt_rn(a); }
__device__ inline float ffma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
#if defined(__has_builtin) && !defined(__CUDACC__)  // nvcc's front end claims it but lacks it
#if __has_builtin(__builtin_assoc_barrier)
#define STRATA_DETAIL_BARRIER(x) __builtin_assoc_barrier(x)
#endif
#endif
#ifndef STRATA_DETAIL_BARRIER
#define STRATA_DETAIL_BARRIER(x) (x)
#endif
constexpr float fmul(float a, float b) { return STRATA_DETAIL_BARRIER(a * b); }
constexpr float fadd(float a, float b) { return a + b; }
constexpr float fsub(float a, float b) { return a - b; }
constexpr float fdiv(float a, float b) { return STRATA_DETAIL_BARRIER(a / b); }
constexpr float fsqrt(float a) { return __builtin_sqrtf(a); }
constexpr float ffma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#endif
/// torch.maximum: the larger value, NaN if either is NaN.
STRATA_HOST_DEVICE constexpr float fmax_nan(float a, float b) { return (a > b || a != a) ? a : b; }
/// A scalar constant as a value of the formula's type (SIMD types broadcast it).
template <class F>
STRATA_DETAIL_FORCE_INLINE STRATA_HOST_DEVICE constexpr F splat(float a) {
  return F(a);
}
}  // namespace detail::fp

/// One element's AdamW update (see the file comment for the formula). `L2` and `Amsgrad` must
/// equal k.l2 and k.amsgrad: they are template parameters so that the kernels' inner loops have
/// no branches. `vmax` is read and written only when Amsgrad. p, m, v (and vmax) are updated in
/// place; narrow p for the model copy afterwards. F is float, or a SIMD vector of floats in the
/// CPU kernels (the same formula, lane by lane).
template <bool L2, bool Amsgrad, class F = float>
STRATA_DETAIL_FORCE_INLINE STRATA_HOST_DEVICE constexpr void adamw_element(F& p, F& m, F& v, F& vmax, const F& grad,
                                                const adamw_step_params& k) {
  using namespace detail::fp;
  F g = fmul(fmul(grad, splat<F>(k.grad_scale)), splat<F>(k.clip));
  if constexpr (L2) {
    g = ffma(p, splat<F>(k.weight_decay), g);
  } else {
    p = fmul(p, splat<F>(k.decay_factor));
  }
  m = ffma(splat<F>(k.lerp_coeff), fsub(g, m), k.lerp_from_m ? m : g);
  v = ffma(fmul(splat<F>(k.one_minus_beta2), g), g, fmul(v, splat<F>(k.beta2)));
  F second = v;
  if constexpr (Amsgrad) {
    vmax = fmax_nan(vmax, v);
    second = vmax;
  }
  const F denom = fadd(fdiv(fsqrt(second), splat<F>(k.bias_correction2_sqrt)), splat<F>(k.eps));
  p = fadd(p, fdiv(fmul(splat<F>(k.neg_step_size), m), denom));
}

/// adamw_element with the variant chosen at run time from k (for reference loops and tests).
STRATA_HOST_DEVICE constexpr void adamw_element(float& p, float& m, float& v, float& vmax, float grad,
                                                const adamw_step_params& k) {
  if (k.l2) {
    if (k.amsgrad)
      adamw_element<true, true>(p, m, v, vmax, grad, k);
    else
      adamw_element<true, false>(p, m, v, vmax, grad, k);
  } else {
    if (k.amsgrad)
      adamw_element<false, true>(p, m, v, vmax, grad, k);
    else
      adamw_element<false, false>(p, m, v, vmax, grad, k);
  }
}

/// One subgroup's buffers, for adamw_step_cpu and enqueue_adamw on an executor (see
/// adamw_update_cpu for each span's meaning).
template <gradient_type G, class H = bf16>
  requires model_copy_type<H>
struct adamw_group {
  std::span<float> master;
  std::span<float> exp_avg;
  std::span<float> exp_avg_sq;
  std::span<float> max_exp_avg_sq;  ///< empty unless amsgrad
  std::span<const G> grad;
  std::span<H> model_out;           ///< empty: no model copy
};

}  // namespace strata
