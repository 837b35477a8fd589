#pragma once
/// SGD (with optional momentum, dampening, Nesterov momentum, L2 weight decay and maximize) as an
/// update_rule (optim/update_rule.hpp): the options, the per-step constants, the element formula
/// shared by the host kernels (portable, AVX2, AVX-512, chosen at run time, multithreaded in
/// tiles) and the CUDA kernel (optim/sgd_cuda.cuh), and a float64 reference.
///
/// The order of operations is PyTorch's `_single_tensor_sgd` (torch/optim/sgd.py, 2.x; 1.13 is
/// the same) as its vectorized CPU kernels evaluate it. With g the raw gradient, s the gradient
/// scale (inverse loss scale), c the clip coefficient and t the step (1-based):
///
///   d   = (g * s) * c                 GradScaler.unscale_, then clip_grad_norm_'s mul_
///   d   = -d                          maximize
///   d   = fma(p, wd, d)               grad.add(param, alpha=wd)          (wd != 0; ATen: fmadd)
///   buf = d                           t == 1: torch.clone(grad)           (momentum != 0)
///   buf = fma(d, 1 - damp, buf * mu)  t > 1: buf.mul_(mu).add_(grad, alpha=1-damp)
///   d   = fma(buf, mu, d)             nesterov: grad.add(buf, alpha=mu)
///   d   = buf                         otherwise (momentum != 0)
///   p   = fma(d, -lr, p)              param.add_(grad, alpha=-lr)
///
/// Scale fold: maximize negates the gradient scale instead of the gradient, since
/// (g * -s) * c == -((g * s) * c) exactly (negation is exact and rounding is symmetric), so it
/// costs no operation. The scalars (wd, mu, 1 - damp, -lr) are computed in double and rounded to
/// float once, as PyTorch converts a Python float for a float32 kernel. Every operation is one
/// IEEE float operation rounded to nearest even, fma exactly where written and nowhere else (see
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

/// Hyperparameters of SGD, named and defaulted as in torch.optim.SGD.
struct sgd_options {
  double lr = 1e-3;                   ///< base learning rate (a step may use another: see rule_step)
  double momentum = 0;                ///< momentum factor; 0 keeps no momentum buffer
  double dampening = 0;               ///< dampening of the gradient's share in the buffer (not on step 1)
  std::optional<double> weight_decay{};  ///< L2 coefficient added to the gradient; unset: 0
  bool nesterov = false;              ///< Nesterov momentum (needs momentum > 0 and dampening 0)
  bool maximize = false;              ///< ascend instead of descend (the gradient is negated)

  /// The decay coefficient in effect (weight_decay, or 0).
  [[nodiscard]] constexpr double decay() const noexcept { return weight_decay ? *weight_decay : 0.0; }

  /// Throws config_error naming the first value torch.optim.SGD would also reject (and values
  /// that are not finite, which it lets through to poison the weights).
  void validate() const {
    STRATA_EXPECTS(std::isfinite(lr) && lr >= 0, config_error, "sgd_options: invalid lr {}", lr);
    STRATA_EXPECTS(std::isfinite(momentum) && momentum >= 0, config_error, "sgd_options: invalid momentum {}",
                   momentum);
    STRATA_EXPECTS(std::isfinite(dampening), config_error, "sgd_options: invalid dampening {}", dampening);
    STRATA_EXPECTS(std::isfinite(decay()) && decay() >= 0, config_error, "sgd_options: invalid weight_decay {}",
                   decay());
    STRATA_EXPECTS(!nesterov || (momentum > 0 && dampening == 0), config_error,
                   "sgd_options: nesterov momentum requires a momentum and zero dampening (momentum {}, dampening {})",
                   momentum, dampening);
  }
};

/// The per-step constants of the SGD update, in float as PyTorch rounds them. Trivially copyable:
/// a CUDA kernel's argument.
struct sgd_step_params {
  float grad_scale = 1;           ///< multiplies the raw gradient: inverse loss scale, negated for maximize
  float clip = 1;                 ///< clip-by-global-norm coefficient (1: no clipping)
  float weight_decay = 0;         ///< float(wd), used when l2
  float momentum = 0;             ///< float(momentum), used when has_momentum
  float one_minus_dampening = 1;  ///< float(1 - dampening), computed in double
  float neg_lr = -1e-3f;          ///< float(-lr)
  bool first = true;              ///< step 1: the buffer becomes the gradient (torch clones it)
  bool has_momentum = false;      ///< momentum != 0: the state has a momentum buffer
  bool nesterov = false;          ///< see sgd_options::nesterov
  bool l2 = false;                ///< weight decay != 0
};

/// One element's SGD update (see the file comment). `L2` and `Momentum` must equal k.l2 and
/// k.has_momentum (template parameters so the kernels' inner loops have no branches on them;
/// k.first and k.nesterov are uniform over a call). `buf` is read only when Momentum and not
/// k.first, written only when Momentum. F is float, or a SIMD vector of floats in the CPU kernels.
template <bool L2, bool Momentum, class F = float>
STRATA_DETAIL_FORCE_INLINE STRATA_HOST_DEVICE constexpr void sgd_element(F& p, F& buf, const F& grad,
                                                                         const sgd_step_params& k) {
  using namespace detail::fp;
  F d = fmul(fmul(grad, splat<F>(k.grad_scale)), splat<F>(k.clip));
  if constexpr (L2) d = ffma(p, splat<F>(k.weight_decay), d);
  if constexpr (Momentum) {
    if (k.first)
      buf = d;
    else
      buf = ffma(d, splat<F>(k.one_minus_dampening), fmul(buf, splat<F>(k.momentum)));
    if (k.nesterov)
      d = ffma(buf, splat<F>(k.momentum), d);
    else
      d = buf;
  }
  p = ffma(d, splat<F>(k.neg_lr), p);
}

/// sgd_element with the variant chosen at run time from k (for reference loops and tests).
STRATA_HOST_DEVICE constexpr void sgd_element(float& p, float& buf, float grad, const sgd_step_params& k) {
  if (k.l2) {
    if (k.has_momentum)
      sgd_element<true, true>(p, buf, grad, k);
    else
      sgd_element<true, false>(p, buf, grad, k);
  } else {
    if (k.has_momentum)
      sgd_element<false, true>(p, buf, grad, k);
    else
      sgd_element<false, false>(p, buf, grad, k);
  }
}

/// Elements per tile of the host kernel: 16 Ki elements (at most 192 KiB of state, gradients and
/// model copy) stay in a core's L2 while updated, as adamw_default_tile_elems.
inline constexpr std::size_t sgd_default_tile_elems = 16384;

namespace detail {

template <bool L2, bool Momentum, class G, class H>
[[gnu::always_inline]] inline void sgd_loop(float* __restrict p, float* __restrict buf, const G* __restrict g,
                                            H* __restrict out, std::size_t n, const sgd_step_params k) {
  for (std::size_t i = 0; i < n; ++i) {
    __asm__ volatile("");  // keeps the loop scalar (see adamw_loop)
    float pi = p[i];
    float bi = 0;
    if constexpr (Momentum) {
      if (!k.first) bi = buf[i];
    }
    sgd_element<L2, Momentum>(pi, bi, widen(g[i]), k);
    p[i] = pi;
    if constexpr (Momentum) buf[i] = bi;
    if constexpr (!std::is_same_v<H, no_model_copy>) out[i] = narrow<H>(pi);
  }
}

template <bool L2, bool Momentum, class G, class H>
STRATA_DETAIL_KERNEL_PORTABLE void sgd_kernel_portable(float* p, float* buf, const G* g, H* out, std::size_t n,
                                                       const sgd_step_params k) {
  sgd_loop<L2, Momentum>(p, buf, g, out, n, k);
}

#if STRATA_CPU_X86_PATHS
namespace simd {
// As STRATA_DETAIL_DEFINE_SIMD_ADAMW_LOOP: the tail runs through the same vector code on a
// zero-padded copy, so every element sees the same instructions whatever the tile boundaries.
#define STRATA_DETAIL_DEFINE_SIMD_SGD_LOOP(SUFFIX, FN, V, LOAD, STORE, STREAM)                                     \
  template <bool L2, bool Momentum, class G, class H>                                                             \
  FN void sgd_vector_##SUFFIX(float* p, float* b, const G* g, H* out, const sgd_step_params& k) {                 \
    V pv = LOAD(p), bv{};                                                                                         \
    if constexpr (Momentum) {                                                                                     \
      if (!k.first) bv = LOAD(b);                                                                                 \
    }                                                                                                             \
    sgd_element<L2, Momentum, V>(pv, bv, LOAD(g), k);                                                             \
    STORE(p, pv);                                                                                                 \
    if constexpr (Momentum) STORE(b, bv);                                                                         \
    if constexpr (!std::is_same_v<H, no_model_copy>) STREAM(out, pv);                                             \
  }                                                                                                               \
  template <bool L2, bool Momentum, class G, class H>                                                             \
  FN void sgd_loop_##SUFFIX(float* __restrict p, float* __restrict b, const G* __restrict g, H* __restrict out,    \
                            std::size_t n, const sgd_step_params& k) {                                            \
    constexpr std::size_t W = V::width;                                                                           \
    constexpr bool write_model = !std::is_same_v<H, no_model_copy>;                                               \
    const std::size_t ahead = prefetch_ahead_elems();                                                             \
    std::size_t i = 0;                                                                                            \
    for (; i + W <= n; i += W) {                                                                                  \
      prefetch_ahead(p + i, ahead);                                                                               \
      if constexpr (Momentum) prefetch_ahead(b + i, ahead);                                                       \
      prefetch_ahead(g + i, ahead);                                                                               \
      sgd_vector_##SUFFIX<L2, Momentum>(p + i, Momentum ? b + i : nullptr, g + i, write_model ? out + i : nullptr, \
                                        k);                                                                       \
    }                                                                                                             \
    if constexpr (write_model) _mm_sfence(); /* the streamed copy is ordered before the caller publishes it */     \
    if (i == n) return;                                                                                           \
    const std::size_t r = n - i;                                                                                  \
    float tp[W] = {}, tb[W] = {};                                                                                 \
    G tg[W] = {};                                                                                                 \
    H to[W] = {};                                                                                                 \
    std::memcpy(tp, p + i, r * sizeof(float));                                                                    \
    if constexpr (Momentum) {                                                                                     \
      if (!k.first) std::memcpy(tb, b + i, r * sizeof(float));                                                   \
    }                                                                                                             \
    std::memcpy(tg, g + i, r * sizeof(G));                                                                        \
    sgd_vector_##SUFFIX<L2, Momentum>(tp, tb, tg, to, k);                                                         \
    std::memcpy(p + i, tp, r * sizeof(float));                                                                    \
    if constexpr (Momentum) std::memcpy(b + i, tb, r * sizeof(float));                                            \
    if constexpr (write_model) std::memcpy(out + i, to, r * sizeof(H));                                           \
  }
STRATA_DETAIL_DEFINE_SIMD_SGD_LOOP(avx512, STRATA_DETAIL_AVX512_FN, f32x16, load16, store16, stream16)
STRATA_DETAIL_DEFINE_SIMD_SGD_LOOP(avx512bf16, STRATA_DETAIL_AVX512BF16_FN, f32x16, load16, store16_ne, stream16_ne)
STRATA_DETAIL_DEFINE_SIMD_SGD_LOOP(avx2, STRATA_DETAIL_AVX2_FN, f32x8, load8, store8, stream8)
#undef STRATA_DETAIL_DEFINE_SIMD_SGD_LOOP
}  // namespace simd
template <bool L2, bool Momentum, class G, class H>
STRATA_DETAIL_KERNEL_AVX2 void sgd_kernel_avx2(float* p, float* buf, const G* g, H* out, std::size_t n,
                                               const sgd_step_params k) {
  simd::sgd_loop_avx2<L2, Momentum>(p, buf, g, out, n, k);
}
template <bool L2, bool Momentum, class G, class H>
STRATA_DETAIL_KERNEL_AVX512 void sgd_kernel_avx512(float* p, float* buf, const G* g, H* out, std::size_t n,
                                                   const sgd_step_params k) {
  simd::sgd_loop_avx512<L2, Momentum>(p, buf, g, out, n, k);
}
template <bool L2, bool Momentum, class G, class H>
STRATA_DETAIL_KERNEL_AVX512BF16 void sgd_kernel_avx512bf16(float* p, float* buf, const G* g, H* out, std::size_t n,
                                                           const sgd_step_params k) {
  simd::sgd_loop_avx512bf16<L2, Momentum>(p, buf, g, out, n, k);
}
#endif

template <class G, class H>
using sgd_kernel_fn = void (*)(float*, float*, const G*, H*, std::size_t, sgd_step_params);

template <bool L2, bool Momentum, class G, class H>
sgd_kernel_fn<G, H> pick_sgd_kernel(cpu_isa isa) {
#if STRATA_CPU_X86_PATHS
  if constexpr (std::is_same_v<H, bf16>)  // a bf16 model copy: rounded by the instruction where it can be
    if (isa == cpu_isa::avx512 && cpu_uses_avx512_bf16()) return &sgd_kernel_avx512bf16<L2, Momentum, G, H>;
  if (isa == cpu_isa::avx512) return &sgd_kernel_avx512<L2, Momentum, G, H>;
  if (isa == cpu_isa::avx2) return &sgd_kernel_avx2<L2, Momentum, G, H>;
#endif
  (void)isa;
  return &sgd_kernel_portable<L2, Momentum, G, H>;
}

template <class G, class H>
void run_sgd_cpu(float* p, float* buf, const G* g, H* out, std::size_t n, const sgd_step_params& k,
                 thread_pool* pool, std::size_t tile, cpu_isa isa) {
  const cpu_isa path = resolve_cpu_isa(isa);
  const auto kernel = k.l2 ? (k.has_momentum ? pick_sgd_kernel<true, true, G, H>(path)
                                             : pick_sgd_kernel<true, false, G, H>(path))
                           : (k.has_momentum ? pick_sgd_kernel<false, true, G, H>(path)
                                             : pick_sgd_kernel<false, false, G, H>(path));
  parallel_tiles(n, tile, pool, [&](std::size_t b, std::size_t e) {
    kernel(p + b, k.has_momentum ? buf + b : nullptr, g + b, out == nullptr ? nullptr : out + b, e - b, k);
  });
}

}  // namespace detail

/// Updates n = master.size() parameters in place with the constants `k` (sgd_rule::make_step_params).
///  - master: fp32 weights;
///  - momentum_buffer: n elements when k.has_momentum (not read on the first step), else ignored;
///  - grad: n gradients in float, bf16 or fp16 (still multiplied by the loss scale);
///  - model_out: n bf16/fp16 elements receiving the updated weights rounded to nearest even, n
///    floats receiving them exactly, or empty to write none.
/// Runs on the calling thread plus up to pool->size() - 1 workers of `pool` (nullptr: the calling
/// thread only), in tiles of `tile_elems`; `isa` forces an instruction-set path (config_error if
/// this CPU lacks it). The same bits for any of these. Mismatched sizes are a config_error.
template <gradient_type G, class H = bf16>
  requires model_copy_type<H>
void sgd_update_cpu(std::span<float> master, std::span<float> momentum_buffer, std::span<const G> grad,
                    std::span<H> model_out, const sgd_step_params& k, thread_pool* pool = nullptr,
                    std::size_t tile_elems = sgd_default_tile_elems, cpu_isa isa = cpu_isa::automatic) {
  const std::size_t n = master.size();
  STRATA_EXPECTS(!k.has_momentum || momentum_buffer.size() == n, config_error,
                 "sgd_update_cpu: momentum needs momentum_buffer of {} elements, got {}", n, momentum_buffer.size());
  STRATA_EXPECTS(grad.size() == n, config_error, "sgd_update_cpu: got {} gradients for {} parameters", grad.size(), n);
  STRATA_EXPECTS(model_out.empty() || model_out.size() == n, config_error,
                 "sgd_update_cpu: model copy has {} elements for {} parameters (give n or none)", model_out.size(), n);
  STRATA_EXPECTS(tile_elems > 0, config_error, "sgd_update_cpu: tile_elems must be positive");
  if (model_out.empty())
    detail::run_sgd_cpu<G, detail::no_model_copy>(master.data(), momentum_buffer.data(), grad.data(), nullptr, n, k,
                                                  pool, tile_elems, isa);
  else
    detail::run_sgd_cpu<G, H>(master.data(), momentum_buffer.data(), grad.data(), model_out.data(), n, k, pool,
                              tile_elems, isa);
}

/// SGD as an update_rule: state = fp32 master weights, plus one fp32 momentum buffer
/// ("momentum_buffer", as torch names it) when momentum != 0.
struct sgd_rule {
  using options_type = sgd_options;
  using step_params = sgd_step_params;
  static constexpr std::string_view tag = "sgd";

  /// No arrays without momentum, else the momentum buffer.
  [[nodiscard]] static constexpr state_format format(const sgd_options& o) noexcept {
    if (o.momentum == 0) return {};
    return {{"momentum_buffer", state_element::f32}};
  }

  /// The constants of step s.step with s.lr and s.weight_decay (a range's, replacing o's).
  /// Throws config_error on a step below 1, a gradient scale that is not positive and finite, a
  /// clip coefficient outside [0, 1] or options (with s's lr and weight decay) that validate()
  /// rejects.
  [[nodiscard]] static sgd_step_params make_step_params(const sgd_options& o, const rule_step& s) {
    sgd_options with = o;
    with.lr = s.lr;
    with.weight_decay = s.weight_decay;
    with.validate();
    STRATA_EXPECTS(s.step >= 1, config_error, "sgd_rule::make_step_params: step {} (steps count from 1)", s.step);
    STRATA_EXPECTS(std::isfinite(s.grad_scale) && s.grad_scale > 0, config_error,
                   "sgd_rule::make_step_params: gradient scale {} must be positive and finite", s.grad_scale);
    STRATA_EXPECTS(s.clip >= 0 && s.clip <= 1, config_error,
                   "sgd_rule::make_step_params: clip coefficient {} must be in [0, 1]", s.clip);
    sgd_step_params k;
    k.grad_scale = static_cast<float>(o.maximize ? -s.grad_scale : s.grad_scale);
    k.clip = static_cast<float>(s.clip);
    k.l2 = s.weight_decay != 0;
    k.weight_decay = static_cast<float>(s.weight_decay);
    k.has_momentum = o.momentum != 0;
    k.momentum = static_cast<float>(o.momentum);
    k.one_minus_dampening = static_cast<float>(1.0 - o.dampening);
    k.neg_lr = static_cast<float>(-s.lr);
    k.first = s.step == 1;
    k.nesterov = o.nesterov;
    return k;
  }

  /// Updates parameters [at, at + n) of `v` (see update_rule).
  template <gradient_type G, model_copy_type H>
  static void update_cpu(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                         const sgd_step_params& k, thread_pool* pool) {
    if (n == 0) return;
    STRATA_EXPECTS(v.master != nullptr && grads != nullptr && (!k.has_momentum || v.arrays[0] != nullptr),
                   config_error, "sgd_rule::update_cpu: missing master weights, gradients or momentum buffer");
    sgd_update_cpu<G, H>(std::span<float>(v.master + at, n),
                         k.has_momentum ? std::span<float>(v.array<float>(0, at), n) : std::span<float>(),
                         std::span<const G>(grads, n),
                         model_out == nullptr ? std::span<H>() : std::span<H>(model_out, n), k, pool);
  }

  /// The hyper-parameters by name (checkpoints).
  [[nodiscard]] static rule_option_values save_options(const sgd_options& o) {
    return {{"lr", o.lr},           {"momentum", o.momentum},
            {"dampening", o.dampening}, {"weight_decay", o.decay()},
            {"nesterov", o.nesterov ? 1.0 : 0.0}, {"maximize", o.maximize ? 1.0 : 0.0}};
  }
  [[nodiscard]] static sgd_options load_options(const rule_option_values& v) {
    const auto at = [&](std::string_view name) { return detail::option_value(v, name, "sgd_rule"); };
    sgd_options o;
    o.lr = at("lr");
    o.momentum = at("momentum");
    o.dampening = at("dampening");
    o.weight_decay = at("weight_decay");
    o.nesterov = at("nesterov") != 0;
    o.maximize = at("maximize") != 0;
    return o;
  }

  /// The update of one parameter in float64 (state: the momentum buffer when momentum != 0).
  static void reference(double& p, std::span<double> state, double g, const sgd_options& o, const rule_step& s) {
    STRATA_EXPECTS(state.size() == format(o).count, config_error,
                   "sgd_rule::reference: {} state values for {} arrays", state.size(), format(o).count);
    double d = g * s.grad_scale * s.clip;
    if (o.maximize) d = -d;
    d += s.weight_decay * p;
    if (o.momentum != 0) {
      double& buf = state[0];
      buf = s.step == 1 ? d : o.momentum * buf + (1.0 - o.dampening) * d;
      d = o.nesterov ? d + o.momentum * buf : buf;
    }
    p -= s.lr * d;
  }
};

static_assert(update_rule<sgd_rule>);

}  // namespace strata
