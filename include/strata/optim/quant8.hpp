#pragma once
/// 8-bit block quantization of optimizer state, after the dynamic (tree) quantization of
/// Dettmers, Lewis, Shleifer and Zettlemoyer, "8-bit Optimizers via Block-wise Quantization"
/// (ICLR 2022), as bitsandbytes and torchao use it for 8-bit Adam.
///
/// An array of n values is cut into blocks of q8_block_elems (256) consecutive values; a block
/// keeps one fp32 scale, the largest |value| in it (absmax), and one byte per value: the code of
/// the map value nearest to value / absmax. A value reads back as map[code] * absmax.
///
/// The maps (256 values each, ascending, in [-1, 1]) spend their codes where optimizer states
/// live, over seven decades: for each decade 10^-6, ..., 10^0 the interval [0.1, 1] of that
/// decade is cut into equal bins, twice as many per decade up (1, 2, ..., 64), and the bins'
/// midpoints are the values. The signed map (first moments) has them with both signs, 0 and 1;
/// the unsigned map (second moments, never negative) has twice the bins (2, 4,
/// ..., 128: 254 values), 0 and 1. The signed map has -1 too, in place of its smallest negative
/// bin: a block's absmax value is then exact whatever its sign, so quantizing values that were
/// read back gives the same scale and codes again (a state exported as fp32 and imported is the
/// same state). So a value near absmax is kept to about 0.7% (signed) or 0.35% (unsigned) of
/// absmax, one a thousand times smaller to about 7% of itself, and values below about 5e-8 of
/// absmax become 0. 0 and +-absmax are exact.
///
/// Rounding is to the nearest map value (ties to the lower), by comparing value / absmax with the
/// midpoints between neighbouring map values: an exact search, so the host's scalar and SIMD
/// code and the CUDA kernel give the same codes. A block that is all zeros keeps scale 0 and the
/// code of 0; a NaN in a block makes its scale NaN, and every value of the block reads back NaN.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "strata/core/config.hpp"

namespace strata {

/// Values per quantization block (one fp32 scale each).
inline constexpr std::uint32_t q8_block_elems = 256;

/// A quantization map: 256 values ascending, the midpoints between neighbours and the code of 0.
struct q8_map {
  float value[256];
  float threshold[256];  ///< threshold[k]: midpoint of value[k] and value[k + 1]; threshold[255] = +inf
  std::uint8_t zero;     ///< the code of 0
};

namespace detail {

constexpr double pow10(int e) noexcept {
  double r = 1;
  for (int i = 0; i < e; ++i) r *= 10;
  for (int i = 0; i > e; --i) r /= 10;
  return r;
}

constexpr q8_map make_q8_map(bool is_signed) noexcept {
  double v[256] = {};
  std::size_t count = 0;
  for (int decade = 0; decade < 7; ++decade) {
    const int bins = (is_signed ? 1 : 2) << decade;
    const double unit = pow10(decade - 6);
    for (int j = 0; j < bins; ++j) {
      const double x = unit * (0.1 + (j + 0.5) * (0.9 / bins));
      v[count++] = x;
      if (is_signed && decade > 0) v[count++] = -x;  // (-1 takes the smallest negative bin's code)
    }
  }
  v[count++] = 0;
  v[count++] = 1;
  if (is_signed) v[count++] = -1;
  for (std::size_t i = 1; i < count; ++i)  // insertion sort: 256 values, once, at compile time
    for (std::size_t j = i; j > 0 && v[j - 1] > v[j]; --j) {
      const double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  q8_map m{};
  for (std::size_t i = 0; i < 256; ++i) {
    m.value[i] = static_cast<float>(v[i]);
    if (v[i] == 0) m.zero = static_cast<std::uint8_t>(i);
  }
  for (std::size_t i = 0; i + 1 < 256; ++i)
    m.threshold[i] = static_cast<float>((static_cast<double>(m.value[i]) + static_cast<double>(m.value[i + 1])) / 2);
  m.threshold[255] = __builtin_huge_valf();
  return m;
}

}  // namespace detail

/// The map of first moments (signed) and of second moments (unsigned).
inline constexpr q8_map q8_signed_map = detail::make_q8_map(true);
inline constexpr q8_map q8_unsigned_map = detail::make_q8_map(false);

/// The code of x (a value divided by its block's absmax): the number of thresholds below x,
/// i.e. the nearest map value's code (ties to the lower; NaN gives 0).
STRATA_HOST_DEVICE constexpr std::uint8_t q8_encode(const float* threshold, float x) noexcept {
  unsigned c = 0;
  for (unsigned s = 128; s >= 1; s >>= 1)
    if (x > threshold[c + s - 1]) c += s;
  return static_cast<std::uint8_t>(c);
}

/// |x|'s bits: for every float, unsigned comparison of these orders |x| with NaN above +inf,
/// so the largest of them over a block is its absmax (NaN when any value is NaN), exactly and in
/// any order.
STRATA_HOST_DEVICE constexpr std::uint32_t q8_abs_bits(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x) & 0x7fffffffu;
#else
  return std::bit_cast<std::uint32_t>(x) & 0x7fffffffu;
#endif
}

/// Number of blocks of n values.
[[nodiscard]] constexpr std::size_t q8_blocks(std::size_t n) noexcept {
  return (n + q8_block_elems - 1) / q8_block_elems;
}

}  // namespace strata
