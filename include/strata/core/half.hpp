#pragma once
/// strata's 16-bit floating-point storage types, `strata::bf16` and `strata::fp16`.
///
/// They store bits and convert to and from float; they do no arithmetic of their own (widen to
/// float, compute, narrow back). Both are trivially copyable, 2 bytes, usable without CUDA and in
/// CUDA device code, and their layout is the IEEE/bfloat16 bit pattern, so a span of them can
/// alias torch's bfloat16/float16 storage or CUDA's __nv_bfloat16/__half.
///
/// Conversions are exact and deterministic, independent of the FPU mode (no FTZ/DAZ effects):
///  - widening (to float) is exact for every number, subnormals included; NaN keeps its sign and
///    payload: bf16 -> float is the 16-bit shift (a signaling NaN stays signaling, as in PyTorch),
///    fp16 -> float sets the quiet bit (as x86 F16C and IEEE conversions do);
///  - narrowing (from float) rounds to nearest, ties to even; values beyond the largest finite
///    value round to infinity as IEEE says (fp16: |x| >= 65520; bf16: the carry into the
///    exponent); results below the smallest normal become subnormals or zero, correctly rounded;
///    NaN stays NaN with its sign and the top payload bits, quieted (quiet bit set).
/// The same functions run on host and device, so CPU and GPU kernels round identically.

#include <cstdint>
#include <type_traits>

#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

#include "strata/core/config.hpp"

namespace strata {

namespace detail {

STRATA_HOST_DEVICE constexpr std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}

STRATA_HOST_DEVICE constexpr float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

// The conversions below are branch-free on purpose: the CPU kernels call them inside loops that
// the compiler vectorizes, and the CUDA kernels run them without divergence.

/// float -> bfloat16 bits, round to nearest even; NaN quieted.
STRATA_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t rounded = (u + 0x7fffU + ((u >> 16) & 1U)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x40U;
  const bool is_nan = (u & 0x7fffffffU) > 0x7f800000U;
  return static_cast<std::uint16_t>(is_nan ? nan : rounded);
}

/// bfloat16 bits -> float, exact.
STRATA_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t h) noexcept {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}

/// float -> IEEE binary16 bits, round to nearest even; overflow to infinity; NaN quieted.
STRATA_HOST_DEVICE constexpr std::uint16_t float_to_fp16_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000U;
  const std::uint32_t a = u & 0x7fffffffU;
  // Normal half (|x| >= 2^-14): rebias the exponent (127 -> 15), round the 13 dropped bits.
  const std::uint32_t rebased = a - 0x38000000U;
  const std::uint32_t normal = (rebased + 0xfffU + ((rebased >> 13) & 1U)) >> 13;
  // Subnormal half (|x| < 2^-14): the value is m * 2^(e-150); in units of 2^-24 that is
  // m >> (126 - e), rounded to nearest even. A shift of 25 or more leaves 0 (m < 2^24).
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x7fffffU) | (e != 0 ? 0x800000U : 0U);
  // Only 101 <= e <= 112 (shift 14..25) is selected below; other exponents get a harmless shift.
  const std::uint32_t shift = e > 112U ? 14U : (e >= 101U ? 126U - e : 25U);
  const std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1U << shift) - 1U);
  const std::uint32_t halfway = 1U << (shift - 1U);
  const std::uint32_t subnormal = q + ((rem > halfway || (rem == halfway && (q & 1U) != 0)) ? 1U : 0U);
  const std::uint32_t nan = 0x7e00U | ((a >> 13) & 0x3ffU);
  std::uint32_t r = a >= 0x38800000U ? normal : subnormal;
  r = a >= 0x477ff000U ? 0x7c00U : r;  // 65520 and above round to infinity (so does infinity)
  r = a > 0x7f800000U ? nan : r;
  return static_cast<std::uint16_t>(sign | r);
}

/// IEEE binary16 bits -> float, exact (subnormals included; NaN keeps its payload, quieted).
STRATA_HOST_DEVICE constexpr float fp16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000U) << 16;
  const std::uint32_t e = (static_cast<std::uint32_t>(h) >> 10) & 0x1fU;
  const std::uint32_t m = static_cast<std::uint32_t>(h) & 0x3ffU;
  const std::uint32_t normal = ((e + 112U) << 23) | (m << 13);
  // Infinity, or NaN quieted (quiet bit set, payload kept) as x86 F16C and IEEE do.
  const std::uint32_t special = 0x7f800000U | (m << 13) | (m != 0 ? 0x400000U : 0U);
  // A subnormal half is m * 2^-24: float(m) is exact and normal, so lowering its exponent by
  // 24 is exact too (and 0 stays 0).
  const std::uint32_t sub = m == 0 ? 0U : float_bits(static_cast<float>(m)) - (24U << 23);
  std::uint32_t r = e == 0 ? sub : normal;
  r = e == 0x1fU ? special : r;
  return bits_float(sign | r);
}

}  // namespace detail

/// bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of a float). Storage only:
/// widen to float to compute. Construction from float rounds to nearest even.
struct bf16 {
  std::uint16_t bits;  ///< the raw bit pattern

  bf16() = default;  // trivial, like float: uninitialized unless value-initialized
  /// Rounds `f` to nearest even (NaN stays NaN, quieted).
  STRATA_HOST_DEVICE constexpr explicit bf16(float f) noexcept : bits(detail::float_to_bf16_bits(f)) {}
  /// The value with exactly this bit pattern.
  [[nodiscard]] STRATA_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 h{};
    h.bits = b;
    return h;
  }
  /// Exact widening.
  STRATA_HOST_DEVICE constexpr operator float() const noexcept { return detail::bf16_bits_to_float(bits); }
  /// Bitwise equality (so +0 != -0 and NaN == the same NaN), which is what storage tests want.
  friend STRATA_HOST_DEVICE constexpr bool same_bits(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }
};

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits. Storage only: widen to float to
/// compute. Construction from float rounds to nearest even; |x| >= 65520 becomes infinity.
struct fp16 {
  std::uint16_t bits;  ///< the raw bit pattern

  fp16() = default;  // trivial, like float: uninitialized unless value-initialized
  /// Rounds `f` to nearest even (overflow to infinity, NaN stays NaN, quieted).
  STRATA_HOST_DEVICE constexpr explicit fp16(float f) noexcept : bits(detail::float_to_fp16_bits(f)) {}
  /// The value with exactly this bit pattern.
  [[nodiscard]] STRATA_HOST_DEVICE static constexpr fp16 from_bits(std::uint16_t b) noexcept {
    fp16 h{};
    h.bits = b;
    return h;
  }
  /// Exact widening.
  STRATA_HOST_DEVICE constexpr operator float() const noexcept { return detail::fp16_bits_to_float(bits); }
  /// Bitwise equality (so +0 != -0 and NaN == the same NaN), which is what storage tests want.
  friend STRATA_HOST_DEVICE constexpr bool same_bits(fp16 a, fp16 b) noexcept { return a.bits == b.bits; }
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2 && std::is_trivially_copyable_v<bf16> &&
              std::is_trivially_default_constructible_v<bf16> && std::is_standard_layout_v<bf16>);
static_assert(sizeof(fp16) == 2 && alignof(fp16) == 2 && std::is_trivially_copyable_v<fp16> &&
              std::is_trivially_default_constructible_v<fp16> && std::is_standard_layout_v<fp16>);

/// Whether T is one of strata's 16-bit storage types.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// A type the kernels accept as gradient storage: float or a 16-bit type.
template <class T>
concept gradient_type = std::is_same_v<T, float> || is_half_v<T>;

/// A type of the model copy an update writes: a 16-bit type (rounded from the fp32 master), or
/// float (an fp32 model kept equal to the master weights, with no read-back from the tiers).
template <class T>
concept model_copy_type = std::is_same_v<T, float> || is_half_v<T>;

}  // namespace strata
