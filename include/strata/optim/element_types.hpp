#pragma once
/// What the CPU and CUDA kernels share besides the formula: the gradient and model-copy element
/// types with their float conversions, and the fixed reduction order of gradient norms.
/// Host/device code with no CPU-only dependency, so .cu files include it as well.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "strata/core/config.hpp"
#include "strata/core/half.hpp"

namespace strata {

/// Elements per block of the fixed norm reduction order (see optim/grad_norm.hpp).
inline constexpr std::size_t grad_norm_block = 2048;
/// Lanes per block of the fixed norm reduction order.
inline constexpr std::size_t grad_norm_lanes = 8;

/// Squared L2 norm of one subgroup's (unscaled) gradients.
struct grad_stats {
  double sum_squares = 0;   ///< sum of (g * scale)^2; non-finite when some gradient is inf/NaN
  std::uint64_t count = 0;  ///< number of gradients
  /// Whether every gradient was finite.
  [[nodiscard]] bool finite() const noexcept { return std::isfinite(sum_squares); }
};

namespace detail {

/// H of the kernels when no model copy is written.
struct no_model_copy {};

/// A gradient element as float (exact).
template <class G>
STRATA_HOST_DEVICE constexpr float widen(G g) noexcept {
  if constexpr (std::is_same_v<G, float>)
    return g;
  else if constexpr (std::is_same_v<G, bf16>)
    return bf16_bits_to_float(g.bits);
  else
    return fp16_bits_to_float(g.bits);
}

/// An updated weight rounded to the model copy's type (nearest even; a float copy is exact).
template <class H>
STRATA_HOST_DEVICE constexpr H narrow(float f) noexcept {
  if constexpr (std::is_same_v<H, float>)
    return f;
  else if constexpr (std::is_same_v<H, bf16>)
    return bf16::from_bits(float_to_bf16_bits(f));
  else
    return fp16::from_bits(float_to_fp16_bits(f));
}

}  // namespace detail
}  // namespace strata
