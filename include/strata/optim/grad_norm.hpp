#pragma once
/// Gradient utilities on the CPU: the squared L2 norm of a subgroup's gradients (with inf/NaN
/// detection), a thread-safe accumulator that combines subgroups into the global norm as their
/// gradients arrive, the clip-by-global-norm coefficient, and the loss-scaler decision to skip a
/// step. The CUDA versions are in optim/adamw_cuda.cuh and give bit-identical sums.
///
/// The reduction order is fixed by definition, not by threads or tiles, so a subgroup's sum is
/// the same whatever the thread count, tile size, instruction set or device:
///  - u_i = float(g_i) * scale (one float rounding), squared in double (exact);
///  - blocks of grad_norm_block (2048) elements; in a block, lane j (0..7) adds the squares of
///    elements j, j+8, j+16, ... in order, and the block's sum is
///    ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7));
///  - the subgroup's sum adds the block sums in block order.
/// A non-finite u makes the sum non-finite; finite squares cannot overflow a double, so the sum
/// is finite exactly when every gradient is.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/optim/cpu_dispatch.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/detail/simd_x86.hpp"

namespace strata {

namespace detail {

/// u * u for a float u: exact in double, so fusing it with the following add would not change
/// the sum; the barrier only keeps the generated code the same on every path.
inline double square_unfused(double u) {
#if defined(__has_builtin) && !defined(__CUDACC__)  // nvcc's front end claims it but lacks it
#if __has_builtin(__builtin_assoc_barrier)
  return __builtin_assoc_barrier(u * u);
#endif
#endif
  return u * u;
}

/// One block's sum in the fixed lane order; n <= grad_norm_block.
template <class G>
[[gnu::always_inline]] inline double grad_block_sum(const G* __restrict g, std::size_t n, float scale) {
  double lane[grad_norm_lanes] = {};
  std::size_t i = 0;
  for (; i + grad_norm_lanes <= n; i += grad_norm_lanes)
    for (std::size_t j = 0; j < grad_norm_lanes; ++j) {
      const double u = widen(g[i + j]) * scale;
      lane[j] += detail::square_unfused(u);
    }
  for (std::size_t j = 0; i + j < n; ++j) {
    const double u = widen(g[i + j]) * scale;
    lane[j] += detail::square_unfused(u);
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

template <class G>
[[gnu::always_inline]] inline void grad_block_sums(const G* g, std::size_t n, float scale, double* out) {
  for (std::size_t b = 0; b * grad_norm_block < n; ++b) {
    const std::size_t off = b * grad_norm_block;
    out[b] = grad_block_sum(g + off, n - off < grad_norm_block ? n - off : grad_norm_block, scale);
  }
}

template <class G>
STRATA_DETAIL_KERNEL_PORTABLE void grad_block_sums_portable(const G* g, std::size_t n, float scale, double* out) {
  grad_block_sums(g, n, scale, out);
}
#if STRATA_CPU_X86_PATHS
namespace simd {
STRATA_DETAIL_DEFINE_SIMD_NORM_LOOP(avx512, STRATA_DETAIL_AVX512_FN)
STRATA_DETAIL_DEFINE_SIMD_NORM_LOOP(avx2, STRATA_DETAIL_AVX2_FN)
}  // namespace simd
template <class G>
STRATA_DETAIL_KERNEL_AVX2 void grad_block_sums_avx2(const G* g, std::size_t n, float scale, double* out) {
  simd::grad_block_sums_avx2(g, n, scale, out);
}
template <class G>
STRATA_DETAIL_KERNEL_AVX512 void grad_block_sums_avx512(const G* g, std::size_t n, float scale, double* out) {
  simd::grad_block_sums_avx512(g, n, scale, out);
}
#endif

}  // namespace detail

/// The fixed-order sums of `grad * grad_scale`'s squares per block of grad_norm_block elements
/// into `out` (one per block, the last may be short): the pieces grad_stats_cpu adds in block
/// order. Lets gradients that arrive in block-aligned pieces be summed as they come and still
/// give the same total (grad_stats_of_blocks).
template <gradient_type G>
void grad_block_sums_cpu(std::span<const G> grad, float grad_scale, std::span<double> out, thread_pool* pool = nullptr,
                         std::size_t tile_elems = 1 << 16, cpu_isa isa = cpu_isa::automatic) {
  const cpu_isa path = resolve_cpu_isa(isa);
  const std::size_t n = grad.size();
  STRATA_EXPECTS(out.size() == (n + grad_norm_block - 1) / grad_norm_block, config_error,
                 "grad_block_sums_cpu: {} gradients make {} blocks, got room for {}", n,
                 (n + grad_norm_block - 1) / grad_norm_block, out.size());
  const std::size_t tile_blocks = tile_elems / grad_norm_block + (tile_elems % grad_norm_block != 0 ? 1 : 0);
  const G* g = grad.data();
  double* o = out.data();
  detail::parallel_tiles(out.size(), tile_blocks == 0 ? 1 : tile_blocks, pool, [&](std::size_t b0, std::size_t b1) {
    const std::size_t e0 = b0 * grad_norm_block;
    const std::size_t e1 = std::min(n, b1 * grad_norm_block);
    switch (path) {
#if STRATA_CPU_X86_PATHS
      case cpu_isa::avx512: detail::grad_block_sums_avx512(g + e0, e1 - e0, grad_scale, o + b0); break;
      case cpu_isa::avx2: detail::grad_block_sums_avx2(g + e0, e1 - e0, grad_scale, o + b0); break;
#endif
      default: detail::grad_block_sums_portable(g + e0, e1 - e0, grad_scale, o + b0); break;
    }
  });
}

/// The stats of `n` gradients from their block sums (grad_block_sums_cpu), added in block order.
[[nodiscard]] inline grad_stats grad_stats_of_blocks(std::span<const double> blocks, std::size_t n) {
  double sum = 0;
  for (const double p : blocks) sum += p;
  return {sum, n};
}

/// Squared norm of `grad * grad_scale` in the fixed order (bit-identical for any pool, tile and
/// instruction set, and to the CUDA version). Pass the inverse loss scale as `grad_scale` so the
/// norm is that of the unscaled gradients. `tile_elems` is rounded up to whole blocks.
template <gradient_type G>
[[nodiscard]] grad_stats grad_stats_cpu(std::span<const G> grad, float grad_scale = 1.0f, thread_pool* pool = nullptr,
                                        std::size_t tile_elems = 1 << 16, cpu_isa isa = cpu_isa::automatic) {
  std::vector<double> partial((grad.size() + grad_norm_block - 1) / grad_norm_block);
  grad_block_sums_cpu(grad, grad_scale, std::span<double>(partial), pool, tile_elems, isa);
  return grad_stats_of_blocks(partial, grad.size());
}

/// Combines the subgroups' grad_stats into the global norm as their gradients arrive, in any
/// order and from any thread. The total adds subgroups in index order, so it does not depend on
/// arrival order. One accumulator per step: reset() (or a new one) before the next.
class grad_norm_accumulator {
 public:
  /// Records subgroup `subgroup`'s stats. Thread-safe. Adding a subgroup twice in one step is a
  /// config_error naming it (its gradients would count twice).
  void add(std::size_t subgroup, const grad_stats& s) {
    std::lock_guard lock(mutex_);
    const auto [it, inserted] = parts_.emplace(subgroup, s);
    STRATA_EXPECTS(inserted, config_error, "grad_norm_accumulator: subgroup {} added twice in one step", subgroup);
  }
  /// Sum of squares over every subgroup added (non-finite if any gradient was inf/NaN).
  [[nodiscard]] double sum_squares() const {
    std::lock_guard lock(mutex_);
    double sum = 0;
    for (const auto& [index, s] : parts_) sum += s.sum_squares;
    return sum;
  }
  /// The global L2 norm.
  [[nodiscard]] double norm() const { return std::sqrt(sum_squares()); }
  /// Whether some gradient of some subgroup was inf or NaN: the step must be skipped.
  [[nodiscard]] bool found_nonfinite() const { return !std::isfinite(sum_squares()); }
  /// The subgroups whose gradients were not all finite, in index order (for the report).
  [[nodiscard]] std::vector<std::size_t> nonfinite_subgroups() const {
    std::lock_guard lock(mutex_);
    std::vector<std::size_t> bad;
    for (const auto& [index, s] : parts_)
      if (!s.finite()) bad.push_back(index);
    return bad;
  }
  /// Whether subgroup `subgroup` was added.
  [[nodiscard]] bool contains(std::size_t subgroup) const {
    std::lock_guard lock(mutex_);
    return parts_.contains(subgroup);
  }
  /// Subgroups added so far.
  [[nodiscard]] std::size_t subgroups() const {
    std::lock_guard lock(mutex_);
    return parts_.size();
  }
  /// Forgets every subgroup (start of the next step).
  void reset() {
    std::lock_guard lock(mutex_);
    parts_.clear();
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::size_t, grad_stats> parts_;
};

/// torch.nn.utils.clip_grad_norm_'s coefficient, in float as PyTorch computes it:
/// min(1, max_norm / (total_norm + 1e-6)).
[[nodiscard]] inline float clip_coefficient(double total_norm, double max_norm) {
  STRATA_EXPECTS(max_norm > 0 && std::isfinite(max_norm), config_error, "clip_coefficient: max_norm {} must be positive",
                 max_norm);
  const float coeff = static_cast<float>(max_norm) / (static_cast<float>(total_norm) + 1e-6f);
  return coeff < 1.0f ? coeff : 1.0f;
}

/// What a step does, decided once from every subgroup's gradients before any state changes.
struct step_decision {
  bool skip = false;     ///< some gradient was inf/NaN: no subgroup may be updated (loss-scaler semantics)
  double grad_norm = 0;  ///< global norm of the unscaled gradients (inf/NaN when skip)
  float clip = 1;        ///< clip coefficient for make_adamw_step_params (1 when not clipping)
};

/// Decides the step from the accumulated norm: skip on inf/NaN, else clip to `max_grad_norm`
/// when given.
[[nodiscard]] inline step_decision decide_step(const grad_norm_accumulator& acc,
                                               std::optional<double> max_grad_norm = std::nullopt) {
  step_decision d;
  d.grad_norm = acc.norm();
  d.skip = !std::isfinite(d.grad_norm);
  if (!d.skip && max_grad_norm) d.clip = clip_coefficient(d.grad_norm, *max_grad_norm);
  return d;
}

/// Decides the step from the sum of squares of every unscaled gradient (added up by the caller
/// over several optimizers or processes: offloaded_adamw::gradient_stats), as decide_step does
/// from an accumulator.
[[nodiscard]] inline step_decision decide_step(double sum_squares, std::optional<double> max_grad_norm = std::nullopt) {
  step_decision d;
  d.grad_norm = std::sqrt(sum_squares);
  d.skip = !std::isfinite(d.grad_norm);
  if (!d.skip && max_grad_norm) d.clip = clip_coefficient(d.grad_norm, *max_grad_norm);
  return d;
}

}  // namespace strata
