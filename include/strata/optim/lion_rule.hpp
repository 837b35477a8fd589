#pragma once
/// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") as an update_rule
/// (optim/update_rule.hpp): the options, the per-step constants, the element formula shared by
/// the host kernels (portable, AVX2, AVX-512, chosen at run time, multithreaded in tiles) and the
/// CUDA kernel (optim/lion_cuda.cuh), and a float64 reference.
///
/// The order of operations is the widely used lion-pytorch reference (lucidrains/lion-pytorch,
/// `update_fn`) as PyTorch's vectorized CPU kernels evaluate it. With g the raw gradient, s the
/// gradient scale (inverse loss scale), c the clip coefficient and m the one state array:
///
///   g = (g * s) * c                  GradScaler.unscale_, then clip_grad_norm_'s mul_
///   g = -g                           maximize (folded into s: (-g)*s == -(g*s) exactly)
///   p = p * (1 - lr*wd)              p.data.mul_(1 - lr * wd)           (1 - lr*wd in double)
///   u = sign(fma(g, 1-b1, m * b1))   exp_avg.clone().mul_(b1).add(grad, alpha=1-b1).sign_()
///   p = fma(u, -lr, p)               p.add_(update, alpha=-lr)
///   m = fma(g, 1-b2, m * b2)         exp_avg.mul_(b2).add_(grad, alpha=1-b2)
///
/// The scalars (1 - lr*wd, b1, 1 - b1, b2, 1 - b2, -lr) are computed in double and rounded to
/// float once. sign(x) is 1 or -1, +0 for +-0 (as torch.sign), and NaN for NaN. torch.sign gives
/// 0 for NaN (pytorch/pytorch#41245), which would leave a weight whose momentum has turned NaN
/// frozen and silently wrong for ever; here the NaN reaches the weight instead, where it shows.
/// With wd == 0 the decay multiplies by exactly 1, which changes no value. Every operation is
/// one IEEE float operation rounded to nearest even, fma exactly where written (see
/// optim/adamw_math.hpp on association barriers), so every path gives the same bits.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
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
#include "strata/optim/update_rule.hpp"

namespace strata {

/// Hyperparameters of Lion, named and defaulted as in lion-pytorch.
struct lion_options {
  double lr = 1e-4;                      ///< base learning rate (a step may use another: see rule_step)
  double beta1 = 0.9;                    ///< interpolation weight of the update direction
  double beta2 = 0.99;                   ///< decay of the momentum
  std::optional<double> weight_decay{};  ///< decoupled decay (p *= 1 - lr*wd); unset: 0
  bool maximize = false;                 ///< ascend instead of descend (the gradient is negated)

  /// The decay coefficient in effect (weight_decay, or 0).
  [[nodiscard]] constexpr double decay() const noexcept { return weight_decay ? *weight_decay : 0.0; }

  /// Throws config_error naming the first invalid value: lr and weight_decay must be finite and
  /// non-negative (lion-pytorch asserts lr > 0; 0 is allowed here, as a scheduler's warm-up may
  /// start there), betas in [0, 1] as lion-pytorch asserts.
  void validate() const {
    STRATA_EXPECTS(std::isfinite(lr) && lr >= 0, config_error, "lion_options: invalid lr {}", lr);
    STRATA_EXPECTS(beta1 >= 0 && beta1 <= 1, config_error, "lion_options: invalid beta1 {} (need 0 <= beta1 <= 1)",
                   beta1);
    STRATA_EXPECTS(beta2 >= 0 && beta2 <= 1, config_error, "lion_options: invalid beta2 {} (need 0 <= beta2 <= 1)",
                   beta2);
    STRATA_EXPECTS(std::isfinite(decay()) && decay() >= 0, config_error, "lion_options: invalid weight_decay {}",
                   decay());
  }
};

/// The per-step constants of the Lion update, in float. Trivially copyable: a CUDA kernel's
/// argument.
struct lion_step_params {
  float grad_scale = 1;          ///< multiplies the raw gradient: inverse loss scale, negated for maximize
  float clip = 1;                ///< clip-by-global-norm coefficient (1: no clipping)
  float decay_factor = 1;        ///< float(1 - lr*wd)
  float beta1 = 0.9f;            ///< float(beta1)
  float one_minus_beta1 = 0.1f;  ///< float(1 - beta1), computed in double
  float beta2 = 0.99f;           ///< float(beta2)
  float one_minus_beta2 = 0.01f; ///< float(1 - beta2), computed in double
  float neg_lr = -1e-4f;         ///< float(-lr)
};

namespace detail::fp {
/// sign(a): 1 where a > 0, -1 where a < 0, +0 for +-0, a itself (NaN) for NaN. No rounding, so
/// host and device agree; the SIMD forms are in optim/detail/simd_x86.hpp.
STRATA_HOST_DEVICE constexpr float fsign_nan(float a) { return a > 0 ? 1.0f : a < 0 ? -1.0f : a == a ? 0.0f : a; }
}  // namespace detail::fp

// doc-snippet: element
/// One element's Lion update (see the file comment): p and m in place. F is float, or a SIMD
/// vector of floats in the CPU kernels (the same formula, lane by lane).
template <class F = float>
STRATA_DETAIL_FORCE_INLINE STRATA_HOST_DEVICE constexpr void lion_element(F& p, F& m, const F& grad,
                                                                          const lion_step_params& k) {
  using namespace detail::fp;
  const F g = fmul(fmul(grad, splat<F>(k.grad_scale)), splat<F>(k.clip));
  p = fmul(p, splat<F>(k.decay_factor));
  const F u = fsign_nan(ffma(g, splat<F>(k.one_minus_beta1), fmul(m, splat<F>(k.beta1))));
  p = ffma(u, splat<F>(k.neg_lr), p);
  m = ffma(g, splat<F>(k.one_minus_beta2), fmul(m, splat<F>(k.beta2)));
}
// doc-snippet-end

/// Elements per tile of the host kernel: 16 Ki elements (at most 192 KiB of state, gradients and
/// model copy) stay in a core's L2 while updated, as adamw_default_tile_elems.
inline constexpr std::size_t lion_default_tile_elems = 16384;

namespace detail {

template <class G, class H>
[[gnu::always_inline]] inline void lion_loop(float* __restrict p, float* __restrict m, const G* __restrict g,
                                             H* __restrict out, std::size_t n, const lion_step_params k) {
  for (std::size_t i = 0; i < n; ++i) {
    __asm__ volatile("");  // keeps the loop scalar (see adamw_loop)
    float pi = p[i];
    float mi = m[i];
    lion_element(pi, mi, widen(g[i]), k);
    p[i] = pi;
    m[i] = mi;
    if constexpr (!std::is_same_v<H, no_model_copy>) out[i] = narrow<H>(pi);
  }
}

template <class G, class H>
STRATA_DETAIL_KERNEL_PORTABLE void lion_kernel_portable(float* p, float* m, const G* g, H* out, std::size_t n,
                                                        const lion_step_params k) {
  lion_loop(p, m, g, out, n, k);
}

#if STRATA_CPU_X86_PATHS
namespace simd {
// As STRATA_DETAIL_DEFINE_SIMD_ADAMW_LOOP: the tail runs through the same vector code on a
// zero-padded copy, so every element sees the same instructions whatever the tile boundaries.
#define STRATA_DETAIL_DEFINE_SIMD_LION_LOOP(SUFFIX, FN, V, LOAD, STORE, STREAM)                                    \
  template <class G, class H>                                                                                     \
  FN void lion_vector_##SUFFIX(float* p, float* m, const G* g, H* out, const lion_step_params& k) {               \
    V pv = LOAD(p), mv = LOAD(m);                                                                                 \
    lion_element<V>(pv, mv, LOAD(g), k);                                                                          \
    STORE(p, pv);                                                                                                 \
    STORE(m, mv);                                                                                                 \
    if constexpr (!std::is_same_v<H, no_model_copy>) STREAM(out, pv);                                             \
  }                                                                                                               \
  template <class G, class H>                                                                                     \
  FN void lion_loop_##SUFFIX(float* __restrict p, float* __restrict m, const G* __restrict g, H* __restrict out,   \
                             std::size_t n, const lion_step_params& k) {                                          \
    constexpr std::size_t W = V::width;                                                                           \
    constexpr bool write_model = !std::is_same_v<H, no_model_copy>;                                               \
    const std::size_t ahead = prefetch_ahead_elems();                                                             \
    std::size_t i = 0;                                                                                            \
    for (; i + W <= n; i += W) {                                                                                  \
      prefetch_ahead(p + i, ahead);                                                                               \
      prefetch_ahead(m + i, ahead);                                                                               \
      prefetch_ahead(g + i, ahead);                                                                               \
      lion_vector_##SUFFIX(p + i, m + i, g + i, write_model ? out + i : nullptr, k);                              \
    }                                                                                                             \
    if constexpr (write_model) _mm_sfence(); /* the streamed copy is ordered before the caller publishes it */     \
    if (i == n) return;                                                                                           \
    const std::size_t r = n - i;                                                                                  \
    float tp[W] = {}, tm[W] = {};                                                                                 \
    G tg[W] = {};                                                                                                 \
    H to[W] = {};                                                                                                 \
    std::memcpy(tp, p + i, r * sizeof(float));                                                                    \
    std::memcpy(tm, m + i, r * sizeof(float));                                                                    \
    std::memcpy(tg, g + i, r * sizeof(G));                                                                        \
    lion_vector_##SUFFIX(tp, tm, tg, to, k);                                                                      \
    std::memcpy(p + i, tp, r * sizeof(float));                                                                    \
    std::memcpy(m + i, tm, r * sizeof(float));                                                                    \
    if constexpr (write_model) std::memcpy(out + i, to, r * sizeof(H));                                           \
  }
STRATA_DETAIL_DEFINE_SIMD_LION_LOOP(avx512, STRATA_DETAIL_AVX512_FN, f32x16, load16, store16, stream16)
STRATA_DETAIL_DEFINE_SIMD_LION_LOOP(avx512bf16, STRATA_DETAIL_AVX512BF16_FN, f32x16, load16, store16_ne, stream16_ne)
STRATA_DETAIL_DEFINE_SIMD_LION_LOOP(avx2, STRATA_DETAIL_AVX2_FN, f32x8, load8, store8, stream8)
#undef STRATA_DETAIL_DEFINE_SIMD_LION_LOOP
}  // namespace simd
template <class G, class H>
STRATA_DETAIL_KERNEL_AVX2 void lion_kernel_avx2(float* p, float* m, const G* g, H* out, std::size_t n,
                                                const lion_step_params k) {
  simd::lion_loop_avx2(p, m, g, out, n, k);
}
template <class G, class H>
STRATA_DETAIL_KERNEL_AVX512 void lion_kernel_avx512(float* p, float* m, const G* g, H* out, std::size_t n,
                                                    const lion_step_params k) {
  simd::lion_loop_avx512(p, m, g, out, n, k);
}
template <class G, class H>
STRATA_DETAIL_KERNEL_AVX512BF16 void lion_kernel_avx512bf16(float* p, float* m, const G* g, H* out, std::size_t n,
                                                            const lion_step_params k) {
  simd::lion_loop_avx512bf16(p, m, g, out, n, k);
}
#endif

template <class G, class H>
using lion_kernel_fn = void (*)(float*, float*, const G*, H*, std::size_t, lion_step_params);

template <class G, class H>
lion_kernel_fn<G, H> pick_lion_kernel(cpu_isa isa) {
#if STRATA_CPU_X86_PATHS
  if constexpr (std::is_same_v<H, bf16>)  // a bf16 model copy: rounded by the instruction where it can be
    if (isa == cpu_isa::avx512 && cpu_uses_avx512_bf16()) return &lion_kernel_avx512bf16<G, H>;
  if (isa == cpu_isa::avx512) return &lion_kernel_avx512<G, H>;
  if (isa == cpu_isa::avx2) return &lion_kernel_avx2<G, H>;
#endif
  (void)isa;
  return &lion_kernel_portable<G, H>;
}

template <class G, class H>
void run_lion_cpu(float* p, float* m, const G* g, H* out, std::size_t n, const lion_step_params& k,
                  thread_pool* pool, std::size_t tile, cpu_isa isa) {
  const auto kernel = pick_lion_kernel<G, H>(resolve_cpu_isa(isa));
  parallel_tiles(n, tile, pool, [&](std::size_t b, std::size_t e) {
    kernel(p + b, m + b, g + b, out == nullptr ? nullptr : out + b, e - b, k);
  });
}

}  // namespace detail

/// Updates n = master.size() parameters in place with the constants `k` (lion_rule::make_step_params).
///  - master, exp_avg: fp32 weights and momentum, n each;
///  - grad: n gradients in float, bf16 or fp16 (still multiplied by the loss scale);
///  - model_out: n bf16/fp16 elements receiving the updated weights rounded to nearest even, n
///    floats receiving them exactly, or empty to write none.
/// Runs on the calling thread plus up to pool->size() - 1 workers of `pool` (nullptr: the calling
/// thread only), in tiles of `tile_elems`; `isa` forces an instruction-set path (config_error if
/// this CPU lacks it). The same bits for any of these. Mismatched sizes are a config_error.
template <gradient_type G, class H = bf16>
  requires model_copy_type<H>
void lion_update_cpu(std::span<float> master, std::span<float> exp_avg, std::span<const G> grad,
                     std::span<H> model_out, const lion_step_params& k, thread_pool* pool = nullptr,
                     std::size_t tile_elems = lion_default_tile_elems, cpu_isa isa = cpu_isa::automatic) {
  const std::size_t n = master.size();
  STRATA_EXPECTS(exp_avg.size() == n, config_error, "lion_update_cpu: exp_avg has {} elements for {} parameters",
                 exp_avg.size(), n);
  STRATA_EXPECTS(grad.size() == n, config_error, "lion_update_cpu: got {} gradients for {} parameters", grad.size(),
                 n);
  STRATA_EXPECTS(model_out.empty() || model_out.size() == n, config_error,
                 "lion_update_cpu: model copy has {} elements for {} parameters (give n or none)", model_out.size(), n);
  STRATA_EXPECTS(tile_elems > 0, config_error, "lion_update_cpu: tile_elems must be positive");
  if (model_out.empty())
    detail::run_lion_cpu<G, detail::no_model_copy>(master.data(), exp_avg.data(), grad.data(), nullptr, n, k, pool,
                                                   tile_elems, isa);
  else
    detail::run_lion_cpu<G, H>(master.data(), exp_avg.data(), grad.data(), model_out.data(), n, k, pool, tile_elems,
                               isa);
}

// doc-snippet: rule
/// Lion as an update_rule: state = fp32 master weights and one fp32 momentum ("exp_avg", as
/// lion-pytorch names it).
struct lion_rule {
  using options_type = lion_options;
  using step_params = lion_step_params;
  static constexpr std::string_view tag = "lion";

  /// The momentum.
  [[nodiscard]] static constexpr state_format format(const lion_options&) noexcept {
    return {{"exp_avg", state_element::f32}};
  }

  /// The constants of a step with s.lr and s.weight_decay (a range's, replacing o's). Throws
  /// config_error on a step below 1, a gradient scale that is not positive and finite, a clip
  /// coefficient outside [0, 1] or options (with s's lr and weight decay) that validate() rejects.
  [[nodiscard]] static lion_step_params make_step_params(const lion_options& o, const rule_step& s) {
    lion_options with = o;
    with.lr = s.lr;
    with.weight_decay = s.weight_decay;
    with.validate();
    STRATA_EXPECTS(s.step >= 1, config_error, "lion_rule::make_step_params: step {} (steps count from 1)", s.step);
    STRATA_EXPECTS(std::isfinite(s.grad_scale) && s.grad_scale > 0, config_error,
                   "lion_rule::make_step_params: gradient scale {} must be positive and finite", s.grad_scale);
    STRATA_EXPECTS(s.clip >= 0 && s.clip <= 1, config_error,
                   "lion_rule::make_step_params: clip coefficient {} must be in [0, 1]", s.clip);
    lion_step_params k;
    k.grad_scale = static_cast<float>(o.maximize ? -s.grad_scale : s.grad_scale);
    k.clip = static_cast<float>(s.clip);
    k.decay_factor = static_cast<float>(1.0 - s.lr * s.weight_decay);
    k.beta1 = static_cast<float>(o.beta1);
    k.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
    k.beta2 = static_cast<float>(o.beta2);
    k.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
    k.neg_lr = static_cast<float>(-s.lr);
    return k;
  }

  /// Updates parameters [at, at + n) of `v` (see update_rule).
  template <gradient_type G, model_copy_type H>
  static void update_cpu(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                         const lion_step_params& k, thread_pool* pool) {
    if (n == 0) return;
    STRATA_EXPECTS(v.master != nullptr && v.arrays[0] != nullptr && grads != nullptr, config_error,
                   "lion_rule::update_cpu: missing master weights, exp_avg or gradients");
    lion_update_cpu<G, H>(std::span<float>(v.master + at, n), std::span<float>(v.array<float>(0, at), n),
                          std::span<const G>(grads, n),
                          model_out == nullptr ? std::span<H>() : std::span<H>(model_out, n), k, pool);
  }

  /// The hyper-parameters by name (checkpoints).
  [[nodiscard]] static rule_option_values save_options(const lion_options& o) {
    return {{"lr", o.lr}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"weight_decay", o.decay()},
            {"maximize", o.maximize ? 1.0 : 0.0}};
  }
  [[nodiscard]] static lion_options load_options(const rule_option_values& v) {
    const auto at = [&](std::string_view name) { return detail::option_value(v, name, "lion_rule"); };
    lion_options o;
    o.lr = at("lr");
    o.beta1 = at("beta1");
    o.beta2 = at("beta2");
    o.weight_decay = at("weight_decay");
    o.maximize = at("maximize") != 0;
    return o;
  }

  /// The update of one parameter in float64 (state: the momentum).
  static void reference(double& p, std::span<double> state, double g, const lion_options& o, const rule_step& s) {
    STRATA_EXPECTS(state.size() == 1, config_error, "lion_rule::reference: {} state values for 1 array",
                   state.size());
    double& m = state[0];
    g = g * s.grad_scale * s.clip;
    if (o.maximize) g = -g;
    p *= 1.0 - s.lr * s.weight_decay;
    const double c = o.beta1 * m + (1.0 - o.beta1) * g;
    const double u = c > 0 ? 1.0 : c < 0 ? -1.0 : c == c ? 0.0 : c;
    p -= s.lr * u;
    m = o.beta2 * m + (1.0 - o.beta2) * g;
  }
};

static_assert(update_rule<lion_rule>);
// doc-snippet-end

}  // namespace strata
