#pragma once
/// SIMD value types for the x86 paths of the CPU kernels: 16 floats (AVX-512) and 8 floats
/// (AVX2 + FMA + F16C), with the operations adamw_element needs (found by ADL) and the loads and
/// stores that widen gradients and narrow the model copy. Each operation is the IEEE operation
/// of the scalar formula, lane by lane: explicit fma only where the formula has one, products
/// behind an association barrier so the compiler cannot fuse them, sqrt and division correctly
/// rounded. The 16-bit conversions are the bit-exact vector forms of core/half.hpp's.
/// Internal: used only inside kernels compiled for the matching target.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "strata/core/env.hpp"
#include "strata/core/half.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/cpu_dispatch.hpp"
#include "strata/optim/element_types.hpp"

#if STRATA_CPU_X86_PATHS
#include <cpuid.h>
#include <immintrin.h>

#if defined(__has_builtin) && !defined(__CUDACC__)  // nvcc's front end claims it but lacks it
#if __has_builtin(__builtin_assoc_barrier)
#define STRATA_DETAIL_VBARRIER(x) __builtin_assoc_barrier(x)
#endif
#endif
#ifndef STRATA_DETAIL_VBARRIER
#define STRATA_DETAIL_VBARRIER(x) (x)
#endif

// Not always_inline: adamw_element (no target attribute) calls them, and GCC refuses to force a
// target function into a function without that target. The kernels are `flatten`, which inlines
// the whole call tree into the kernel, where the target matches.
#define STRATA_DETAIL_AVX2_FN __attribute__((target("avx2,fma,f16c,bmi,bmi2"))) inline
#define STRATA_DETAIL_AVX512_FN \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2"))) inline
// AVX-512 with VBMI's byte permutes (Ice Lake and later, Zen 4): the 8-bit rule's table look-ups.
#define STRATA_DETAIL_AVX512VBMI_FN \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c,bmi,bmi2"))) inline
// AVX-512 with BF16's conversion instruction (Cooper Lake, Sapphire Rapids, Zen 4): bf16 stores.
#define STRATA_DETAIL_AVX512BF16_FN \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,bmi,bmi2"))) inline

namespace strata::detail::simd {

/// How far ahead of the element being updated the kernels prefetch each stream they read, in
/// elements, chosen per CPU at run time. The hardware prefetchers stop at every 4 KiB page, and
/// with four streams one core then waits on memory between its divisions.
///  - 512 elements: measured on a 2-vCPU Xeon (2026-12-03, 32M parameters, fp32 gradients):
///    35.4 -> 31.7 ms per step at 1 thread, 18.1 -> 16.4 ms at 2; 256 and 1024 did no better; kept
///    on AMD Zen 3 (strata ahead of DeepSpeed's CPU Adam with it, 2026-12-05).
///  - 128 elements on AMD Zen 4 (family 0x19 with AVX-512): measured, not explained; at 512 fp32
///    AdamW ran at 0.92 of DeepSpeed's CPU Adam at 1 thread, at 128 at 1.05 (2026-12-06, 32M
///    parameters; BENCHMARKS.md, "Against DeepSpeed's CPU Adam"). Zen 5 (family 0x1a) is faster
///    at 512 again: 1.08-1.16x for every rule at 1 thread (2026-12-07), so only Zen 4 takes 128.
/// STRATA_PREFETCH_ELEMS (0 to 65536; 0 prefetches the line being read, i.e. no look-ahead)
/// overrides the choice, for tuning on another CPU; read once per process.
inline constexpr std::size_t prefetch_ahead_elems_default = 512;
inline constexpr std::size_t prefetch_ahead_elems_zen4 = 128;

/// The x86 family number as AMD and Intel define it (base family, plus the extended family when
/// the base is 0xf): 0x19 for AMD Zen 3 and 4, 0x1a for Zen 5, 6 for most Intel cores.
[[nodiscard]] inline unsigned x86_family() noexcept {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return 0;
  const unsigned base = (eax >> 8) & 0xfu;
  return base == 0xfu ? base + ((eax >> 20) & 0xffu) : base;
}
/// An AMD Zen 4 core: AMD, family 0x19, with AVX-512 (Zen 3 has the family, not AVX-512).
[[nodiscard]] inline bool cpu_is_zen4() noexcept {
  return __builtin_cpu_is("amd") && x86_family() == 0x19 && cpu_supports(cpu_isa::avx512);
}

/// The distance this process uses (see prefetch_ahead_elems_default); config_error naming the
/// variable when STRATA_PREFETCH_ELEMS is malformed.
[[nodiscard]] inline std::size_t prefetch_ahead_elems() {
  static const std::size_t elems = [] {
    const bool zen4 = cpu_is_zen4();
    return env_integer<std::size_t>("STRATA_PREFETCH_ELEMS",
                                    zen4 ? prefetch_ahead_elems_zen4 : prefetch_ahead_elems_default, 0, 65536);
  }();
  return elems;
}

/// Prefetches the line `ahead` elements past `p` into L1. A prefetch never faults, so the
/// address may lie past the end of the array; it is formed as an integer, not by pointer
/// arithmetic past the end.
template <class T>
[[gnu::always_inline]] inline void prefetch_ahead(const T* p, std::size_t ahead) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p) + ahead * sizeof(T);
  _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
}

// ------------------------------------------------------------------------------------------
// AVX-512: 16 floats per vector. The zero-masked forms with all lanes selected compute the same
// as the plain intrinsics; GCC 12's plain forms start from _mm512_undefined_*(), which makes it
// warn "may be used uninitialized" in every caller compiled with -Wall (GCC PR 105593).
inline constexpr __mmask16 all16 = 0xffff;
inline constexpr __mmask8 all8 = 0xff;
struct f32x16 {
  static constexpr std::size_t width = 16;
  __m512 x;
  f32x16() = default;
  STRATA_DETAIL_AVX512_FN explicit f32x16(float a) : x(_mm512_set1_ps(a)) {}
  STRATA_DETAIL_AVX512_FN explicit f32x16(__m512 a) : x(a) {}
};
// The embedded-rounding forms (round to nearest even, as the default) are builtins the compiler
// never fuses; GCC lowers an association barrier on a 512-bit vector lane by lane, so none here.
STRATA_DETAIL_AVX512_FN f32x16 fmul(f32x16 a, f32x16 b) {
  return f32x16(_mm512_maskz_mul_round_ps(all16, a.x, b.x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
STRATA_DETAIL_AVX512_FN f32x16 fadd(f32x16 a, f32x16 b) { return f32x16(_mm512_add_ps(a.x, b.x)); }
STRATA_DETAIL_AVX512_FN f32x16 fsub(f32x16 a, f32x16 b) { return f32x16(_mm512_sub_ps(a.x, b.x)); }
STRATA_DETAIL_AVX512_FN f32x16 fdiv(f32x16 a, f32x16 b) {
  return f32x16(_mm512_maskz_div_round_ps(all16, a.x, b.x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
STRATA_DETAIL_AVX512_FN f32x16 fsqrt(f32x16 a) { return f32x16(_mm512_maskz_sqrt_ps(all16, a.x)); }
STRATA_DETAIL_AVX512_FN f32x16 ffma(f32x16 a, f32x16 b, f32x16 c) { return f32x16(_mm512_fmadd_ps(a.x, b.x, c.x)); }
/// (a > b || a is NaN) ? a : b, as the scalar fmax_nan.
STRATA_DETAIL_AVX512_FN f32x16 fmax_nan(f32x16 a, f32x16 b) {
  const __mmask16 pick_a = _mm512_cmp_ps_mask(a.x, b.x, _CMP_GT_OQ) | _mm512_cmp_ps_mask(a.x, a.x, _CMP_UNORD_Q);
  return f32x16(_mm512_mask_blend_ps(pick_a, b.x, a.x));
}
/// sign(a): 1 where a > 0, -1 where a < 0, +0 where a is +-0, a itself where a is NaN, as the
/// scalar fsign_nan (optim/lion_rule.hpp).
STRATA_DETAIL_AVX512_FN f32x16 fsign_nan(f32x16 a) {
  const __m512 zero = _mm512_setzero_ps();
  const __mmask16 pos = _mm512_cmp_ps_mask(a.x, zero, _CMP_GT_OQ);
  const __mmask16 neg = _mm512_cmp_ps_mask(a.x, zero, _CMP_LT_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(a.x, a.x, _CMP_UNORD_Q);
  const __m512 r = _mm512_maskz_mov_ps(nan, a.x);
  return f32x16(_mm512_mask_blend_ps(neg, _mm512_mask_blend_ps(pos, r, _mm512_set1_ps(1.0f)), _mm512_set1_ps(-1.0f)));
}

STRATA_DETAIL_AVX512_FN f32x16 load16(const float* p) { return f32x16(_mm512_loadu_ps(p)); }
STRATA_DETAIL_AVX512_FN void store16(float* p, f32x16 a) { _mm512_storeu_ps(p, a.x); }
STRATA_DETAIL_AVX512_FN f32x16 load16(const bf16* p) {
  const __m512i w = _mm512_maskz_cvtepu16_epi32(all16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return f32x16(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(all16, w, 16)));
}
STRATA_DETAIL_AVX512_FN f32x16 load16(const fp16* p) {
  return f32x16(_mm512_maskz_cvtph_ps(all16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
/// The 16-bit model copy's bits of 16 floats, rounded as core/half.hpp rounds.
STRATA_DETAIL_AVX512_FN __m256i bits16(const bf16*, f32x16 a) {
  const __m512i u = _mm512_castps_si512(a.x);
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(all16, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_maskz_srli_epi32(all16, _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i nan = _mm512_or_si512(_mm512_maskz_srli_epi32(all16, u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(a.x, a.x, _CMP_UNORD_Q);
  const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, nan);
  return _mm512_maskz_cvtepi32_epi16(all16, r);
}
STRATA_DETAIL_AVX512_FN __m256i bits16(const fp16*, f32x16 a) {
  return _mm512_maskz_cvtps_ph(all16, a.x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
STRATA_DETAIL_AVX512_FN void store16(bf16* p, f32x16 a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits16(p, a));
}
STRATA_DETAIL_AVX512_FN void store16(fp16* p, f32x16 a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits16(p, a));
}
/// The model copy's store: non-temporal where the destination is aligned for it, an ordinary
/// store elsewhere; the same bits either way. The loops fence after the last one.
STRATA_DETAIL_AVX512_FN void stream16(float* p, f32x16 a) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 63) == 0)
    _mm512_stream_ps(p, a.x);
  else
    _mm512_storeu_ps(p, a.x);
}
// 16 16-bit values non-temporal where p is 32-byte aligned, else stored as usual.
STRATA_DETAIL_AVX512_FN void stream_bits16(void* p, __m256i b) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 31) == 0)
    _mm256_stream_si256(static_cast<__m256i*>(p), b);
  else
    _mm256_storeu_si256(static_cast<__m256i*>(p), b);
}
template <class H>
STRATA_DETAIL_AVX512_FN void stream16(H* p, f32x16 a) {
  stream_bits16(p, bits16(p, a));
}

// With AVX512_BF16: bf16 bits by one instruction (vcvtneps2bf16). It rounds to nearest even and
// quiets a NaN as bits16 does, but flushes subnormal inputs to signed zero, which bits16 (and
// torch) round as any other value: a vector holding one takes bits16 instead, so the bits are
// bits16's for every input. Other element types are stored as by store16/stream16.
STRATA_DETAIL_AVX512BF16_FN __m256i bits16_ne(f32x16 a) {
  if (_mm512_fpclass_ps_mask(a.x, 0x20 /* subnormal */) != 0) [[unlikely]]
    return bits16(static_cast<const bf16*>(nullptr), a);
  return (__m256i)_mm512_cvtneps_pbh(a.x);
}
template <class T>
STRATA_DETAIL_AVX512BF16_FN void store16_ne(T* p, f32x16 a) {
  if constexpr (std::is_same_v<T, bf16>)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits16_ne(a));
  else
    store16(p, a);
}
template <class T>
STRATA_DETAIL_AVX512BF16_FN void stream16_ne(T* p, f32x16 a) {
  if constexpr (std::is_same_v<T, bf16>)
    stream_bits16(p, bits16_ne(a));
  else
    stream16(p, a);
}

// ------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C: 8 floats per vector.
struct f32x8 {
  static constexpr std::size_t width = 8;
  __m256 x;
  f32x8() = default;
  STRATA_DETAIL_AVX2_FN explicit f32x8(float a) : x(_mm256_set1_ps(a)) {}
  STRATA_DETAIL_AVX2_FN explicit f32x8(__m256 a) : x(a) {}
};
STRATA_DETAIL_AVX2_FN f32x8 fmul(f32x8 a, f32x8 b) { return f32x8(STRATA_DETAIL_VBARRIER(_mm256_mul_ps(a.x, b.x))); }
STRATA_DETAIL_AVX2_FN f32x8 fadd(f32x8 a, f32x8 b) { return f32x8(_mm256_add_ps(a.x, b.x)); }
STRATA_DETAIL_AVX2_FN f32x8 fsub(f32x8 a, f32x8 b) { return f32x8(_mm256_sub_ps(a.x, b.x)); }
STRATA_DETAIL_AVX2_FN f32x8 fdiv(f32x8 a, f32x8 b) { return f32x8(STRATA_DETAIL_VBARRIER(_mm256_div_ps(a.x, b.x))); }
STRATA_DETAIL_AVX2_FN f32x8 fsqrt(f32x8 a) { return f32x8(_mm256_sqrt_ps(a.x)); }
STRATA_DETAIL_AVX2_FN f32x8 ffma(f32x8 a, f32x8 b, f32x8 c) { return f32x8(_mm256_fmadd_ps(a.x, b.x, c.x)); }
STRATA_DETAIL_AVX2_FN f32x8 fmax_nan(f32x8 a, f32x8 b) {
  const __m256 pick_a = _mm256_or_ps(_mm256_cmp_ps(a.x, b.x, _CMP_GT_OQ), _mm256_cmp_ps(a.x, a.x, _CMP_UNORD_Q));
  return f32x8(_mm256_blendv_ps(b.x, a.x, pick_a));
}
/// sign(a), as the AVX-512 fsign_nan.
STRATA_DETAIL_AVX2_FN f32x8 fsign_nan(f32x8 a) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 pos = _mm256_cmp_ps(a.x, zero, _CMP_GT_OQ);
  const __m256 neg = _mm256_cmp_ps(a.x, zero, _CMP_LT_OQ);
  const __m256 r = _mm256_and_ps(_mm256_cmp_ps(a.x, a.x, _CMP_UNORD_Q), a.x);
  return f32x8(_mm256_blendv_ps(_mm256_blendv_ps(r, _mm256_set1_ps(1.0f), pos), _mm256_set1_ps(-1.0f), neg));
}

STRATA_DETAIL_AVX2_FN f32x8 load8(const float* p) { return f32x8(_mm256_loadu_ps(p)); }
STRATA_DETAIL_AVX2_FN void store8(float* p, f32x8 a) { _mm256_storeu_ps(p, a.x); }
STRATA_DETAIL_AVX2_FN f32x8 load8(const bf16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return f32x8(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
}
STRATA_DETAIL_AVX2_FN f32x8 load8(const fp16* p) {
  return f32x8(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
/// The 16-bit model copy's bits of 8 floats, rounded as core/half.hpp rounds.
STRATA_DETAIL_AVX2_FN __m128i bits8(const bf16*, f32x8 a) {
  const __m256i u = _mm256_castps_si256(a.x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(a.x, a.x, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
  // Every lane is <= 0xffff, so unsigned saturation keeps it; packus works per 128-bit half.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
STRATA_DETAIL_AVX2_FN __m128i bits8(const fp16*, f32x8 a) {
  return _mm256_cvtps_ph(a.x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
STRATA_DETAIL_AVX2_FN void store8(bf16* p, f32x8 a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bits8(p, a)); }
STRATA_DETAIL_AVX2_FN void store8(fp16* p, f32x8 a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bits8(p, a)); }
STRATA_DETAIL_AVX2_FN void stream8(float* p, f32x8 a) {
  if ((reinterpret_cast<std::uintptr_t>(p) & 31) == 0)
    _mm256_stream_ps(p, a.x);
  else
    _mm256_storeu_ps(p, a.x);
}
template <class H>
STRATA_DETAIL_AVX2_FN void stream8(H* p, f32x8 a) {
  const __m128i b = bits8(p, a);
  if ((reinterpret_cast<std::uintptr_t>(p) & 15) == 0)
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), b);
  else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b);
}

// ------------------------------------------------------------------------------------------
// The loops, defined once per instruction set (the target attribute must be on each function
// that calls the target's intrinsics, so a macro stamps them out). The tail (n % width
// elements) runs through the same vector code on a zero-padded copy, so every element sees the
// same instructions whatever the tile boundaries.
#define STRATA_DETAIL_DEFINE_SIMD_ADAMW_LOOP(SUFFIX, FN, V, LOAD, STORE, STREAM)                                             \
  template <bool L2, bool Amsgrad, class G, class H, class M>                                                   \
  FN void adamw_vector_##SUFFIX(float* p, M* m, M* v, M* vmax, const G* g, H* out, const adamw_step_params& k) { \
    V pv = LOAD(p), mv = LOAD(m), vv = LOAD(v), xv{};                                                           \
    if constexpr (Amsgrad) xv = LOAD(vmax);                                                                     \
    adamw_element<L2, Amsgrad, V>(pv, mv, vv, xv, LOAD(g), k);                                                  \
    STORE(p, pv);                                                                                               \
    STORE(m, mv);                                                                                               \
    STORE(v, vv);                                                                                               \
    if constexpr (Amsgrad) STORE(vmax, xv);                                                                     \
    if constexpr (!std::is_same_v<H, no_model_copy>) STREAM(out, pv);                                           \
  }                                                                                                             \
  template <bool L2, bool Amsgrad, class G, class H, class M>                                                   \
  FN void adamw_loop_##SUFFIX(float* __restrict p, M* __restrict m, M* __restrict v, M* __restrict vmax,        \
                              const G* __restrict g, H* __restrict out, std::size_t n,                          \
                              const adamw_step_params& k) {                                                     \
    constexpr std::size_t W = V::width;                                                                         \
    constexpr bool write_model = !std::is_same_v<H, no_model_copy>;                                             \
    const std::size_t ahead = prefetch_ahead_elems();                                                           \
    std::size_t i = 0;                                                                                          \
    for (; i + W <= n; i += W) {                                                                                \
      prefetch_ahead(p + i, ahead);                                                                             \
      prefetch_ahead(m + i, ahead);                                                                             \
      prefetch_ahead(v + i, ahead);                                                                             \
      if constexpr (Amsgrad) prefetch_ahead(vmax + i, ahead);                                                   \
      prefetch_ahead(g + i, ahead);                                                                             \
      adamw_vector_##SUFFIX<L2, Amsgrad>(p + i, m + i, v + i, Amsgrad ? vmax + i : nullptr, g + i,              \
                                         write_model ? out + i : nullptr, k);                                   \
    }                                                                                                           \
    if constexpr (write_model) _mm_sfence(); /* the streamed copy is ordered before the caller publishes it */   \
    if (i == n) return;                                                                                         \
    const std::size_t r = n - i;                                                                                \
    float tp[W] = {};                                                                                           \
    M tm[W] = {}, tv[W] = {}, tx[W] = {};                                                                       \
    G tg[W] = {};                                                                                               \
    H to[W] = {};                                                                                               \
    std::memcpy(tp, p + i, r * sizeof(float));                                                                  \
    std::memcpy(tm, m + i, r * sizeof(M));                                                                      \
    std::memcpy(tv, v + i, r * sizeof(M));                                                                      \
    if constexpr (Amsgrad) std::memcpy(tx, vmax + i, r * sizeof(M));                                            \
    std::memcpy(tg, g + i, r * sizeof(G));                                                                      \
    adamw_vector_##SUFFIX<L2, Amsgrad>(tp, tm, tv, tx, tg, to, k);                                              \
    std::memcpy(p + i, tp, r * sizeof(float));                                                                  \
    std::memcpy(m + i, tm, r * sizeof(M));                                                                      \
    std::memcpy(v + i, tv, r * sizeof(M));                                                                      \
    if constexpr (Amsgrad) std::memcpy(vmax + i, tx, r * sizeof(M));                                            \
    if constexpr (write_model) std::memcpy(out + i, to, r * sizeof(H));                                         \
  }

// The block sums of grad_norm.hpp's fixed order: 8 double lanes, lane j <- elements j, j+8, ...
// Both paths load 8 gradients at a time (AVX2 loads are valid on AVX-512 CPUs).
#define STRATA_DETAIL_DEFINE_SIMD_NORM_LOOP(SUFFIX, FN)                                                      \
  template <class G>                                                                                            \
  FN void grad_block_sums_##SUFFIX(const G* g, std::size_t n, float scale, double* out) {                       \
    const f32x8 s(scale);                                                                                              \
    for (std::size_t b = 0; b * grad_norm_block < n; ++b) {                                                     \
      const std::size_t off = b * grad_norm_block;                                                              \
      const std::size_t len = n - off < grad_norm_block ? n - off : grad_norm_block;                            \
      double lane[grad_norm_lanes];                                                                             \
      std::size_t i = 0;                                                                                        \
      {                                                                                                         \
        auto acc = lanes_zero_##SUFFIX();                                                                       \
        for (; i + 8 <= len; i += 8) acc = lanes_add_squares(acc, fmul(load8(g + off + i), s));                        \
        lanes_store(lane, acc);                                                                                 \
      }                                                                                                         \
      for (std::size_t j = 0; i + j < len; ++j) {                                                               \
        const double u = static_cast<float>(widen(g[off + i + j]) * scale);                                     \
        lane[(i + j) % grad_norm_lanes] += STRATA_DETAIL_VBARRIER(u * u);                                                               \
      }                                                                                                         \
      out[b] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));       \
    }                                                                                                           \
  }

/// Eight double lanes (one zmm) for the AVX-512 norm.
struct lanes512 {
  __m512d x;
};
STRATA_DETAIL_AVX512_FN lanes512 lanes_zero_avx512() { return {_mm512_setzero_pd()}; }
STRATA_DETAIL_AVX512_FN lanes512 lanes_add_squares(lanes512 acc, f32x8 u) {
  const __m512d d = _mm512_maskz_cvtps_pd(all8, u.x);
  acc.x = _mm512_add_pd(acc.x, _mm512_maskz_mul_round_pd(all8, d, d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return acc;
}
STRATA_DETAIL_AVX512_FN void lanes_store(double* out, lanes512 acc) { _mm512_storeu_pd(out, acc.x); }

/// Eight double lanes (two ymm) for the AVX2 norm.
struct lanes256 {
  __m256d lo, hi;
};
STRATA_DETAIL_AVX2_FN lanes256 lanes_zero_avx2() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
STRATA_DETAIL_AVX2_FN lanes256 lanes_add_squares(lanes256 acc, f32x8 u) {
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(u.x));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(u.x, 1));
  acc.lo = _mm256_add_pd(acc.lo, STRATA_DETAIL_VBARRIER(_mm256_mul_pd(lo, lo)));
  acc.hi = _mm256_add_pd(acc.hi, STRATA_DETAIL_VBARRIER(_mm256_mul_pd(hi, hi)));
  return acc;
}
STRATA_DETAIL_AVX2_FN void lanes_store(double* out, lanes256 acc) {
  _mm256_storeu_pd(out, acc.lo);
  _mm256_storeu_pd(out + 4, acc.hi);
}

}  // namespace strata::detail::simd

#endif  // STRATA_CPU_X86_PATHS
