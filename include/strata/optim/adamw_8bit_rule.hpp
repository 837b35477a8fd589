#pragma once
/// AdamW with 8-bit block-quantized moments as an update_rule (optim/update_rule.hpp): the
/// master weights stay fp32; the first moment is kept as 8-bit codes of the signed dynamic map,
/// the second (and its running maximum with amsgrad) of the unsigned one, one fp32 scale per
/// block of 256 parameters (optim/quant8.hpp: the design of Dettmers et al. 2022, as
/// bitsandbytes and torchao use it). That is 6 bytes and 1/32 of state a parameter instead of
/// AdamW's 12: an offloaded step reads and writes about half the bytes.
///
/// One step of a block: its moments are dequantized (map value times scale), AdamW's element
/// formula (optim/adamw_math.hpp, the same operations as adamw_rule) runs on every parameter of
/// the block in fp32 and moves the weight with the new moments in fp32, as bitsandbytes' and
/// torchao's 8-bit Adam do; then each new moment array is requantized: its block's new scale is
/// its largest |value|, each value becomes the nearest code. The rounding is deterministic (no
/// stochastic rounding): every path (scalar, AVX2, the CUDA kernel, any threads) gives the same
/// bits. What it costs: a moment is kept to the map's resolution relative to its block's
/// absmax (about 0.7% of absmax near absmax; values more than about 10^7 below absmax read back
/// as 0), and since the second moment divides the step, a parameter whose v rounds to 0 while
/// its m does not takes a step of lr / eps scale, as in every 8-bit Adam; the loss this costs is
/// in BENCHMARKS.md ("Lower-precision moments: the loss").
///
/// A block is updated whole: an update of [at, at + n) rescales every block it touches, and
/// parameters of those blocks outside the span keep their values up to the new scale (exactly
/// when 0, as the padding between tensors is). So a step makes one call per block (the engine
/// refuses two parts of a step that share a block: tensors and ranges of rates must start at a
/// multiple of 256 parameters, which the PyTorch front arranges).
///
/// Host kernels: portable, AVX2, and AVX-512 with VBMI (its byte permutes look the map values up
/// from registers; AVX-512 CPUs without VBMI run the AVX2 kernel), over the strata thread pool in
/// tiles of whole blocks.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/cpu_dispatch.hpp"
#include "strata/optim/detail/simd_x86.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/quant8.hpp"
#include "strata/optim/update_rule.hpp"

namespace strata {

/// Blocks per tile of the host kernel: 64 blocks (16 Ki parameters), as adamw_default_tile_elems.
inline constexpr std::size_t adamw_8bit_tile_blocks = 64;

namespace detail {

// One block of an 8-bit AdamW state in fp32 while it is updated: each moment array's values.
struct q8_block_values {
  alignas(64) float m[q8_block_elems];
  alignas(64) float v[q8_block_elems];
  alignas(64) float vmax[q8_block_elems];
};

// The arrays of an 8-bit AdamW state: codes and scales of m, v (and max v with amsgrad).
struct q8_adamw_arrays {
  std::uint8_t* code[3];
  float* scale[3];
};

// Scalar parts of a block's update, element by element; the SIMD kernels run the same
// operations on 8 or 16 lanes at once and these on what is left.
STRATA_DETAIL_FORCE_INLINE void q8_dequantize(const q8_map& map, const std::uint8_t* code, float scale, float* out,
                                              std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    __asm__ volatile("");  // keeps the loop scalar (see adamw_loop)
    out[i] = fp::fmul(map.value[code[i]], scale);
  }
}
STRATA_DETAIL_FORCE_INLINE void q8_quantize(const q8_map& map, std::uint8_t* code, float scale, const float* in,
                                            std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    __asm__ volatile("");
    code[i] = q8_encode(map.threshold, fp::fdiv(in[i], scale));
  }
}
// Elements [i, n) of a part of a block: p, g and out point at the part's first element, the
// block's buffers hold it at `from`.
template <bool L2, bool Amsgrad, class G, class H>
STRATA_DETAIL_FORCE_INLINE void q8_adamw_elements(float* p, q8_block_values& b, std::size_t from, const G* g, H* out,
                                                  std::size_t i, std::size_t n, const adamw_step_params& k) {
  for (; i < n; ++i) {
    __asm__ volatile("");
    float pi = p[i];
    adamw_element<L2, Amsgrad>(pi, b.m[from + i], b.v[from + i], b.vmax[from + i], widen(g[i]), k);
    p[i] = pi;
    if constexpr (!std::is_same_v<H, no_model_copy>) out[i] = narrow<H>(pi);
  }
}
inline std::uint32_t q8_absmax_bits(const float* x, std::size_t n) {
  std::uint32_t bits = 0;
  for (std::size_t i = 0; i < n; ++i) bits = std::max(bits, q8_abs_bits(x[i]));
  return bits;
}

// The update of the blocks [first, last) of state `s` (master weights p, `count` parameters) for
// the span [lo, hi) of parameters, whose gradients and model copy g and out hold from lo. Parts:
// the per-element loops of one instruction set.
template <bool L2, bool Amsgrad, class G, class H, class Parts>
STRATA_DETAIL_FORCE_INLINE void q8_adamw_blocks(const q8_adamw_arrays& s, float* p, const G* g, H* out,
                                                std::size_t count, std::size_t lo, std::size_t hi, std::size_t first,
                                                std::size_t last, const adamw_step_params& k, const Parts& parts) {
  q8_block_values buf;
  constexpr std::size_t arrays = Amsgrad ? 3 : 2;
  const q8_map* maps[3] = {&q8_signed_map, &q8_unsigned_map, &q8_unsigned_map};
  float* values[3] = {buf.m, buf.v, buf.vmax};
  for (std::size_t blk = first; blk < last; ++blk) {
    const std::size_t b0 = blk * q8_block_elems;
    const std::size_t len = std::min<std::size_t>(q8_block_elems, count - b0);
    for (std::size_t a = 0; a < arrays; ++a)
      parts.dequantize(*maps[a], s.code[a] + b0, s.scale[a][blk], values[a], len);
    // the span's part of the block, [from, to) from b0 (gradients and copy indexed from lo)
    const std::size_t from = std::max(lo, b0) - b0, to = std::min(hi, b0 + len) - b0;
    const std::size_t skip = b0 + from - lo;  // the part's first gradient
    parts.template update<L2, Amsgrad>(p + b0 + from, buf, from, g + skip, out == nullptr ? nullptr : out + skip,
                                       to - from, k);
    for (std::size_t a = 0; a < arrays; ++a) {
      const std::uint32_t bits = parts.absmax_bits(values[a], len);
      const float scale = std::bit_cast<float>(bits);
      s.scale[a][blk] = scale;
      if (bits == 0)
        std::memset(s.code[a] + b0, maps[a]->zero, len);
      else
        parts.quantize(*maps[a], s.code[a] + b0, scale, values[a], len);
    }
  }
}

struct q8_parts_portable {
  void dequantize(const q8_map& map, const std::uint8_t* code, float scale, float* out, std::size_t n) const {
    q8_dequantize(map, code, scale, out, 0, n);
  }
  template <bool L2, bool Amsgrad, class G, class H>
  void update(float* p, q8_block_values& b, std::size_t from, const G* g, H* out, std::size_t n,
              const adamw_step_params& k) const {
    q8_adamw_elements<L2, Amsgrad>(p, b, from, g, out, 0, n, k);
  }
  std::uint32_t absmax_bits(const float* x, std::size_t n) const { return q8_absmax_bits(x, n); }
  void quantize(const q8_map& map, std::uint8_t* code, float scale, const float* in, std::size_t n) const {
    q8_quantize(map, code, scale, in, 0, n);
  }
};

// q8_encode without its chain of dependent loads, for the SIMD kernel: the codes of a map by
// bucket of |y|'s float bits (its exponent and 8 mantissa bits, 2^-8 of a binade wide). Map
// values are at least 0.7% apart and a bucket is at most 0.39% wide, so a bucket holds at most
// one threshold: a value's code is its bucket's code, moved by one (up for y >= 0, down for
// y < 0) when |y|'s bits pass the bucket's limit. One 32-bit entry a bucket (code | limit's
// offset in the bucket << 8): one gather a value. Built from q8_encode itself, bucket by bucket,
// so every value gets q8_encode's code (tests/optim/adamw_8bit_rule_test.cpp checks thresholds
// and their neighbours). Magnitudes below 2^-23 share the first bucket (their code is 0's).
struct q8_buckets {
  static constexpr std::uint32_t shift = 15;                       // keeps exponent and 8 mantissa bits
  static constexpr std::uint32_t first = (127u - 23u) << 8;        // 2^-23
  static constexpr std::uint32_t count = (127u << 8) - first + 1;  // up to 1.0
  static constexpr std::int32_t never = 0x7fffff;                  // no threshold in the bucket
  std::vector<std::int32_t> entry;                                 // [sign * count + bucket]

  explicit q8_buckets(const q8_map& m) : entry(2 * count) {
    for (std::uint32_t sign = 0; sign < 2; ++sign)
      for (std::uint32_t i = 0; i < count; ++i) {
        const std::uint32_t lo = (first + i) << shift;
        const std::uint32_t hi = i + 1 == count ? lo : lo + (1u << shift) - 1;
        const float sgn = sign == 0 ? 1.0f : -1.0f;
        const int c_lo = q8_encode(m.threshold, sgn * std::bit_cast<float>(lo));
        const int c_hi = q8_encode(m.threshold, sgn * std::bit_cast<float>(hi));
        STRATA_ASSERT(c_hi - c_lo >= -1 && c_hi - c_lo <= 1);
        std::int32_t offset = never;  // |y|'s bits past lo + offset: the next code
        if (c_hi > c_lo)              // y > t
          offset = static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(m.threshold[c_lo]) - lo);
        else if (c_hi < c_lo)  // y <= t < 0: |y| >= |t|
          offset = static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(-m.threshold[c_lo - 1]) - 1 - lo);
        entry[sign * count + i] = c_lo | (offset << 8);
      }
  }
};

inline const q8_buckets& q8_buckets_of(const q8_map& m) {
  static const q8_buckets is_signed(q8_signed_map), is_unsigned(q8_unsigned_map);
  return &m == &q8_signed_map ? is_signed : is_unsigned;
}

#if STRATA_CPU_X86_PATHS
namespace simd {
STRATA_DETAIL_AVX2_FN void q8_dequantize_avx2(const q8_map& map, const std::uint8_t* code, float scale, float* out,
                                              std::size_t n) {
  const f32x8 s(scale);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(code + i)));
    store8(out + i, fmul(f32x8(_mm256_i32gather_ps(map.value, idx, 4)), s));
  }
  q8_dequantize(map, code, scale, out, i, n);
}

STRATA_DETAIL_AVX2_FN void q8_quantize_avx2(const q8_map& map, std::uint8_t* code, float scale, const float* in,
                                            std::size_t n) {
  const q8_buckets& t = q8_buckets_of(map);
  const f32x8 s(scale);
  const __m256i pick_low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                                  0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), one = _mm256_set1_epi32(1), low = _mm256_set1_epi32(0xff);
  const __m256i first = _mm256_set1_epi32(static_cast<int>(q8_buckets::first));
  const __m256i last = _mm256_set1_epi32(static_cast<int>(q8_buckets::first + q8_buckets::count - 1));
  const __m256i per_sign = _mm256_set1_epi32(static_cast<int>(q8_buckets::count));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 y = fdiv(load8(in + i), s).x;
    const __m256i bits = _mm256_castps_si256(y);
    const __m256i mag = _mm256_and_si256(bits, magnitude);
    const __m256i negative = _mm256_srai_epi32(bits, 31);  // all ones for y < 0
    const __m256i bucket = _mm256_min_epu32(_mm256_max_epu32(_mm256_srli_epi32(mag, q8_buckets::shift), first), last);
    const __m256i at = _mm256_add_epi32(_mm256_sub_epi32(bucket, first), _mm256_and_si256(negative, per_sign));
    const __m256i e = _mm256_i32gather_epi32(t.entry.data(), at, 4);
    const __m256i past = _mm256_sub_epi32(mag, _mm256_slli_epi32(bucket, q8_buckets::shift));
    const __m256i above = _mm256_cmpgt_epi32(past, _mm256_srai_epi32(e, 8));
    // +1 for y >= 0, -1 for y < 0, where above
    const __m256i step = _mm256_and_si256(above, _mm256_or_si256(negative, one));
    __m256i c = _mm256_add_epi32(_mm256_and_si256(e, low), step);
    c = _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q)), c);  // NaN: code 0
    const __m256i bytes = _mm256_shuffle_epi8(c, pick_low_bytes);
    const std::uint64_t eight = static_cast<std::uint32_t>(_mm256_extract_epi32(bytes, 0)) |
                                (static_cast<std::uint64_t>(static_cast<std::uint32_t>(_mm256_extract_epi32(bytes, 4))) << 32);
    std::memcpy(code + i, &eight, 8);
  }
  q8_quantize(map, code, scale, in, i, n);
}

STRATA_DETAIL_AVX2_FN std::uint32_t q8_absmax_bits_avx2(const float* x, std::size_t n) {
  __m256i m = _mm256_setzero_si256();
  const __m256i abs = _mm256_set1_epi32(0x7fffffff);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs));
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
  std::uint32_t bits = q8_absmax_bits(x + i, n - i);
  for (const std::uint32_t l : lanes) bits = std::max(bits, l);
  return bits;
}

// AVX-512 with VBMI. A map's 256 values, byte k of each in its own 256-byte plane: four planes of
// four registers, so 64 codes are looked up with byte permutes (two across 128 entries and a
// blend on the code's top bit per plane) instead of gathers from memory.
struct q8_planes {
  alignas(64) std::uint8_t byte[4][256];
  explicit q8_planes(const q8_map& m) noexcept {
    for (std::size_t i = 0; i < 256; ++i) {
      const auto u = std::bit_cast<std::uint32_t>(m.value[i]);
      for (std::size_t k = 0; k < 4; ++k) byte[k][i] = static_cast<std::uint8_t>(u >> (8 * k));
    }
  }
};
inline const q8_planes& q8_planes_of(const q8_map& m) {
  static const q8_planes is_signed(q8_signed_map), is_unsigned(q8_unsigned_map);
  return &m == &q8_signed_map ? is_signed : is_unsigned;
}

STRATA_DETAIL_AVX512VBMI_FN void q8_dequantize_avx512(const q8_map& map, const std::uint8_t* code, float scale,
                                                      float* out, std::size_t n) {
  const q8_planes& t = q8_planes_of(map);
  __m512i plane[4][4];
  for (std::size_t k = 0; k < 4; ++k)
    for (std::size_t j = 0; j < 4; ++j) plane[k][j] = _mm512_load_si512(t.byte[k] + 64 * j);
  // The unpacks below interleave within 128-bit lanes: register r of the result holds, in lane
  // L, the bytes that sat at 16 L + 4 r + [0, 4). Codes are moved there first so the four
  // results are the values in order.
  alignas(64) static constexpr std::uint8_t order[64] = {
      0,  1,  2,  3,  16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51, 4,  5,  6,  7,  20, 21,
      22, 23, 36, 37, 38, 39, 52, 53, 54, 55, 8,  9,  10, 11, 24, 25, 26, 27, 40, 41, 42, 43,
      56, 57, 58, 59, 12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63};
  const __m512i to_lanes = _mm512_load_si512(order);
  const f32x16 s(scale);
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i c = _mm512_maskz_permutexvar_epi8(~__mmask64{0}, to_lanes, _mm512_loadu_si512(code + i));
    const __mmask64 upper = _mm512_movepi8_mask(c);  // codes 128..255
    __m512i b[4];
    for (std::size_t k = 0; k < 4; ++k)
      b[k] = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(plane[k][0], c, plane[k][1]),
                                    _mm512_permutex2var_epi8(plane[k][2], c, plane[k][3]));
    const __m512i lo01 = _mm512_unpacklo_epi8(b[0], b[1]), hi01 = _mm512_unpackhi_epi8(b[0], b[1]);
    const __m512i lo23 = _mm512_unpacklo_epi8(b[2], b[3]), hi23 = _mm512_unpackhi_epi8(b[2], b[3]);
    const __m512i v[4] = {_mm512_unpacklo_epi16(lo01, lo23), _mm512_unpackhi_epi16(lo01, lo23),
                          _mm512_unpacklo_epi16(hi01, hi23), _mm512_unpackhi_epi16(hi01, hi23)};
    for (std::size_t r = 0; r < 4; ++r) store16(out + i + 16 * r, fmul(f32x16(_mm512_castsi512_ps(v[r])), s));
  }
  q8_dequantize(map, code, scale, out, i, n);
}

// As q8_quantize_avx2, 16 values at a time.
STRATA_DETAIL_AVX512_FN void q8_quantize_avx512(const q8_map& map, std::uint8_t* code, float scale, const float* in,
                                                std::size_t n) {
  const q8_buckets& t = q8_buckets_of(map);
  const f32x16 s(scale);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1), low = _mm512_set1_epi32(0xff);
  const __m512i first = _mm512_set1_epi32(static_cast<int>(q8_buckets::first));
  const __m512i last = _mm512_set1_epi32(static_cast<int>(q8_buckets::first + q8_buckets::count - 1));
  const __m512i per_sign = _mm512_set1_epi32(static_cast<int>(q8_buckets::count));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 y = fdiv(load16(in + i), s).x;
    const __m512i bits = _mm512_castps_si512(y);
    const __m512i mag = _mm512_and_si512(bits, magnitude);
    const __mmask16 negative = _mm512_movepi32_mask(bits);
    const __m512i bucket = _mm512_maskz_min_epu32(
        all16, _mm512_maskz_max_epu32(all16, _mm512_maskz_srli_epi32(all16, mag, q8_buckets::shift), first), last);
    const __m512i from_first = _mm512_sub_epi32(bucket, first);
    const __m512i at = _mm512_mask_add_epi32(from_first, negative, from_first, per_sign);
    const __m512i e = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), all16, at, t.entry.data(), 4);
    const __m512i past = _mm512_sub_epi32(mag, _mm512_maskz_slli_epi32(all16, bucket, q8_buckets::shift));
    const __mmask16 above = _mm512_cmpgt_epi32_mask(past, _mm512_maskz_srai_epi32(all16, e, 8));
    __m512i c = _mm512_and_si512(e, low);
    c = _mm512_mask_add_epi32(c, above & static_cast<__mmask16>(~negative), c, one);
    c = _mm512_mask_sub_epi32(c, above & negative, c, one);
    c = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~_mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q)), c);  // NaN: 0
    _mm_storeu_si128(reinterpret_cast<__m128i*>(code + i), _mm512_maskz_cvtepi32_epi8(all16, c));
  }
  q8_quantize(map, code, scale, in, i, n);
}

STRATA_DETAIL_AVX512_FN std::uint32_t q8_absmax_bits_avx512(const float* x, std::size_t n) {
  __m512i m = _mm512_setzero_si512();
  const __m512i abs = _mm512_set1_epi32(0x7fffffff);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    m = _mm512_maskz_max_epu32(all16, m, _mm512_and_si512(_mm512_loadu_si512(x + i), abs));
  alignas(64) std::uint32_t lanes[16];
  _mm512_store_si512(lanes, m);
  std::uint32_t bits = q8_absmax_bits(x + i, n - i);
  for (const std::uint32_t l : lanes) bits = std::max(bits, l);
  return bits;
}

// AdamW on a block's values and the parts object of one instruction set: the same vector loop
// and the same four calls for AVX2 (8 lanes) and AVX-512 (16), stamped out per target.
#define STRATA_DETAIL_DEFINE_Q8_PARTS(SUFFIX, FN, DEQUANT_FN, V, LOAD, STORE)                                    \
  template <bool L2, bool Amsgrad, class G, class H>                                                             \
  FN void q8_adamw_elements_##SUFFIX(float* p, q8_block_values& b, std::size_t from, const G* g, H* out,          \
                                     std::size_t n, const adamw_step_params& k) {                                \
    float* m = b.m + from;                                                                                       \
    float* v = b.v + from;                                                                                       \
    float* x = b.vmax + from;                                                                                    \
    std::size_t i = 0;                                                                                           \
    for (; i + V::width <= n; i += V::width) {                                                                   \
      V pv = LOAD(p + i), mv = LOAD(m + i), vv = LOAD(v + i), xv = Amsgrad ? LOAD(x + i) : V(0.0f);              \
      adamw_element<L2, Amsgrad, V>(pv, mv, vv, xv, LOAD(g + i), k);                                             \
      STORE(p + i, pv);                                                                                          \
      STORE(m + i, mv);                                                                                          \
      STORE(v + i, vv);                                                                                          \
      if constexpr (Amsgrad) STORE(x + i, xv);                                                                   \
      if constexpr (!std::is_same_v<H, no_model_copy>) STORE(out + i, pv);                                       \
    }                                                                                                            \
    q8_adamw_elements<L2, Amsgrad>(p, b, from, g, out, i, n, k);                                                 \
  }                                                                                                              \
  struct q8_parts_##SUFFIX {                                                                                     \
    DEQUANT_FN void dequantize(const q8_map& map, const std::uint8_t* code, float scale, float* out,             \
                               std::size_t n) const {                                                            \
      q8_dequantize_##SUFFIX(map, code, scale, out, n);                                                          \
    }                                                                                                            \
    template <bool L2, bool Amsgrad, class G, class H>                                                           \
    FN void update(float* p, q8_block_values& b, std::size_t from, const G* g, H* out, std::size_t n,            \
                   const adamw_step_params& k) const {                                                           \
      q8_adamw_elements_##SUFFIX<L2, Amsgrad>(p, b, from, g, out, n, k);                                         \
    }                                                                                                            \
    FN std::uint32_t absmax_bits(const float* x, std::size_t n) const { return q8_absmax_bits_##SUFFIX(x, n); }   \
    FN void quantize(const q8_map& map, std::uint8_t* code, float scale, const float* in, std::size_t n) const { \
      q8_quantize_##SUFFIX(map, code, scale, in, n);                                                             \
    }                                                                                                            \
  };
STRATA_DETAIL_DEFINE_Q8_PARTS(avx2, STRATA_DETAIL_AVX2_FN, STRATA_DETAIL_AVX2_FN, f32x8, load8, store8)
STRATA_DETAIL_DEFINE_Q8_PARTS(avx512, STRATA_DETAIL_AVX512_FN, STRATA_DETAIL_AVX512VBMI_FN, f32x16, load16, store16)
#undef STRATA_DETAIL_DEFINE_Q8_PARTS
}  // namespace simd
#endif

template <bool L2, bool Amsgrad, class G, class H>
STRATA_DETAIL_KERNEL_PORTABLE void adamw_8bit_kernel_portable(const q8_adamw_arrays s, float* p, const G* g, H* out,
                                                              std::size_t count, std::size_t lo, std::size_t hi,
                                                              std::size_t first, std::size_t last,
                                                              const adamw_step_params k) {
  q8_adamw_blocks<L2, Amsgrad>(s, p, g, out, count, lo, hi, first, last, k, q8_parts_portable{});
}
#if STRATA_CPU_X86_PATHS
template <bool L2, bool Amsgrad, class G, class H>
STRATA_DETAIL_KERNEL_AVX2 void adamw_8bit_kernel_avx2(const q8_adamw_arrays s, float* p, const G* g, H* out,
                                                      std::size_t count, std::size_t lo, std::size_t hi,
                                                      std::size_t first, std::size_t last, const adamw_step_params k) {
  q8_adamw_blocks<L2, Amsgrad>(s, p, g, out, count, lo, hi, first, last, k, simd::q8_parts_avx2{});
}
template <bool L2, bool Amsgrad, class G, class H>
STRATA_DETAIL_KERNEL_AVX512VBMI void adamw_8bit_kernel_avx512(const q8_adamw_arrays s, float* p, const G* g, H* out,
                                                              std::size_t count, std::size_t lo, std::size_t hi,
                                                              std::size_t first, std::size_t last,
                                                              const adamw_step_params k) {
  q8_adamw_blocks<L2, Amsgrad>(s, p, g, out, count, lo, hi, first, last, k, simd::q8_parts_avx512{});
}
#endif

template <class G, class H>
using adamw_8bit_kernel_fn = void (*)(q8_adamw_arrays, float*, const G*, H*, std::size_t, std::size_t, std::size_t,
                                      std::size_t, std::size_t, adamw_step_params);

template <bool L2, bool Amsgrad, class G, class H>
adamw_8bit_kernel_fn<G, H> pick_adamw_8bit_kernel(cpu_isa isa) {
#if STRATA_CPU_X86_PATHS
  if (isa == cpu_isa::avx512 && cpu_has_avx512_vbmi()) return &adamw_8bit_kernel_avx512<L2, Amsgrad, G, H>;
  if (isa == cpu_isa::avx2 || isa == cpu_isa::avx512) return &adamw_8bit_kernel_avx2<L2, Amsgrad, G, H>;
#endif
  (void)isa;
  return &adamw_8bit_kernel_portable<L2, Amsgrad, G, H>;
}

template <class G, class H>
void run_adamw_8bit_cpu(const state_view& v, std::size_t at, std::size_t n, const G* g, H* out,
                        const adamw_step_params& k, thread_pool* pool, cpu_isa isa) {
  const cpu_isa resolved = resolve_cpu_isa(isa);
  const auto kernel = k.l2 ? (k.amsgrad ? pick_adamw_8bit_kernel<true, true, G, H>(resolved)
                                        : pick_adamw_8bit_kernel<true, false, G, H>(resolved))
                           : (k.amsgrad ? pick_adamw_8bit_kernel<false, true, G, H>(resolved)
                                        : pick_adamw_8bit_kernel<false, false, G, H>(resolved));
  const q8_adamw_arrays s{{v.array<std::uint8_t>(0), v.array<std::uint8_t>(1),
                           k.amsgrad ? v.array<std::uint8_t>(2) : nullptr},
                          {v.scales[0], v.scales[1], k.amsgrad ? v.scales[2] : nullptr}};
  const std::size_t first = at / q8_block_elems, last = (at + n - 1) / q8_block_elems + 1;
  parallel_tiles(last - first, adamw_8bit_tile_blocks, pool, [&](std::size_t b, std::size_t e) {
    kernel(s, v.master, g, out, v.count, at, at + n, first + b, first + e, k);
  });
}

}  // namespace detail

/// AdamW with 8-bit moments (see the file comment): adamw_rule's options, constants and options
/// by name, with its own tag, state format, kernels; its reference is adamw_rule's (float64,
/// from the dequantized moments, the new moments unquantized: the tests bound the quantization
/// apart, as it depends on the block).
struct adamw_8bit_rule : adamw_rule {
  static constexpr std::string_view tag = "adamw-8bit";

  /// m (signed map), v (unsigned) and, with amsgrad, the running maximum of v (unsigned).
  [[nodiscard]] static constexpr state_format format(const adamw_options& o) noexcept {
    if (o.amsgrad)
      return {{"exp_avg", state_element::q8}, {"exp_avg_sq", state_element::uq8, true},
              {"max_exp_avg_sq", state_element::uq8, true}};
    return {{"exp_avg", state_element::q8}, {"exp_avg_sq", state_element::uq8, true}};
  }

  /// Updates parameters [at, at + n) of `v` (see update_rule: every block it touches is
  /// requantized). `isa` forces an instruction-set path (tests).
  template <gradient_type G, model_copy_type H>
  static void update_cpu(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                         const adamw_step_params& k, thread_pool* pool, cpu_isa isa = cpu_isa::automatic) {
    if (n == 0) return;
    STRATA_EXPECTS(v.master != nullptr && v.arrays[0] != nullptr && v.arrays[1] != nullptr && v.scales[0] != nullptr &&
                       v.scales[1] != nullptr && grads != nullptr &&
                       (!k.amsgrad || (v.arrays[2] != nullptr && v.scales[2] != nullptr)),
                   config_error, "adamw_8bit_rule::update_cpu: missing master weights, moments, scales or gradients");
    STRATA_EXPECTS(at <= v.count && n <= v.count - at, config_error,
                   "adamw_8bit_rule::update_cpu: parameters [{}, {}) pass the state's {}", at, at + n, v.count);
    if (model_out == nullptr)
      detail::run_adamw_8bit_cpu<G, detail::no_model_copy>(v, at, n, grads, nullptr, k, pool, isa);
    else
      detail::run_adamw_8bit_cpu<G, H>(v, at, n, grads, model_out, k, pool, isa);
  }
};

static_assert(update_rule<adamw_8bit_rule>);

}  // namespace strata
