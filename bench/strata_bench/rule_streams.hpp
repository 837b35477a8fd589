#pragma once
// The memory bound of a rule's CPU update: the update with its arithmetic taken out.
//
// rule_streams_cpu moves the streams an update rule's host kernel moves (optim/update_rule.hpp):
// it loads the master weights, each state array of the rule's format (fp32; bf16 widened by the
// same load as the kernels; 8-bit codes as bytes, with one block scale per 256 of them) and the
// gradient (widened from bf16/fp16 likewise), and stores the weights and arrays back (narrowed by
// the same store) and the model copy (non-temporal, as the kernels), one vector at a time over
// tiles on a thread pool with an instruction-set path. The loaded values are hidden from the
// optimizer (an empty asm per vector) and stored back unchanged, so no load or store can be
// elided; nothing is computed, so an update can take no less time than the fastest way of moving
// these bytes.
//
// A bound that the update beats is no bound, so there is more than one way: with the kernels'
// software prefetches or without, with ordinary stores of state (as the kernels) or
// non-temporal ones, with the kernels' schedule of tiles or a static one, each stream loaded and
// stored in turn or every stream of a vector loaded before any is stored (the kernels' order).
// `strata-bench adamw` times every way in turn with the update and divides by the fastest: update
// time / that time is a real efficiency (<= 1 up to noise) as long as no other way of moving the
// same bytes is faster, which the benchmarks keep looking for (adamw_vs_deepspeed.sh holds
// DeepSpeed's CPU Adam to it too).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <strata/core/error.hpp>
#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/optim/adamw_cpu.hpp>
#include <strata/optim/cpu_dispatch.hpp>
#include <strata/optim/detail/simd_x86.hpp>
#include <strata/optim/quant8.hpp>
#include <strata/optim/update_rule.hpp>

namespace strata::bench {

/// One way of moving a rule's streams.
struct streams_way {
  bool prefetch = true;  ///< the kernels' software prefetches (simd::prefetch_ahead_elems() ahead per stream)
  bool stream_state = false;  ///< non-temporal stores of the master weights and arrays (the kernels: ordinary)
  /// Each thread one contiguous share of the span and nothing else (an OpenMP static schedule, as
  /// DeepSpeed's CPU Adam has), instead of the kernels' parallel_tiles (a share each, walked tile
  /// by tile, then the others' tiles taken as they come).
  bool contiguous = false;
  /// Per vector, every stream loaded before any is stored, as the kernels order them (the others
  /// load and store each stream in turn: the weights and gradients, then each state array).
  bool loads_first = false;
};

/// Every way rule_streams_cpu knows, the kernels' own first.
inline constexpr streams_way streams_ways[] = {
    {true, false, false, false}, {false, false, false, false}, {true, true, false, false},
    {false, true, false, false}, {true, false, true, false},   {false, false, true, false},
    {true, true, true, false},   {false, true, true, false},   {true, false, false, true},
    {false, false, false, true}, {true, true, false, true},    {false, true, false, true},
    {true, false, true, true},   {false, false, true, true},   {true, true, true, true},
    {false, true, true, true}};

/// "prefetch", "no-prefetch", "prefetch+nt-state", ..., with "+contiguous" for contiguous shares.
inline std::string to_string(streams_way w) {
  return std::string(w.prefetch ? "prefetch" : "no-prefetch") + (w.stream_state ? "+nt-state" : "") +
         (w.contiguous ? "+contiguous" : "") + (w.loads_first ? "+loads-first" : "");
}

namespace streams_detail {

// A value kept in a register (x86 SSE, AArch64 SIMD), or in memory elsewhere.
#if defined(__x86_64__) || defined(__i386__)
#define STRATA_BENCH_FLOAT_REG(x) "+x"(x)
#elif defined(__aarch64__)
#define STRATA_BENCH_FLOAT_REG(x) "+w"(x)
#else
#define STRATA_BENCH_FLOAT_REG(x) "+m"(x)
#endif

template <class T>
[[gnu::always_inline]] inline void pass_one(T* a, std::size_t i) {
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    std::uint8_t c = a[i];
    __asm__ volatile("" : "+r"(c));
    a[i] = c;
  } else {
    float x = strata::detail::widen(a[i]);
    __asm__ volatile("" : STRATA_BENCH_FLOAT_REG(x));
    a[i] = strata::detail::narrow<T>(x);
  }
}

template <class G, class H, class... A>
void streams_portable(float* p, const G* g, H* out, std::size_t n, A*... a) {
  for (std::size_t i = 0; i < n; ++i) {
    float pi = p[i], gi = strata::detail::widen(g[i]);
    __asm__ volatile("" : STRATA_BENCH_FLOAT_REG(pi), STRATA_BENCH_FLOAT_REG(gi));
    p[i] = pi;
    (pass_one(a, i), ...);
    if constexpr (!std::is_same_v<H, strata::detail::no_model_copy>) out[i] = strata::detail::narrow<H>(pi);
  }
}

#if STRATA_CPU_X86_PATHS
// Bytes of W codes: 8 (AVX2) or 16 (AVX-512) in an SSE register.
[[gnu::always_inline]] inline __m128i load_codes(const std::uint8_t* a, std::size_t w) {
  return w == 8 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a))
                : _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
}
[[gnu::always_inline]] inline void store_codes(std::uint8_t* a, __m128i c, std::size_t w, bool nt) {
  if (w == 8) {
    if (nt && (reinterpret_cast<std::uintptr_t>(a) & 7) == 0)
      _mm_stream_si64(reinterpret_cast<long long*>(a), _mm_cvtsi128_si64(c));
    else
      _mm_storel_epi64(reinterpret_cast<__m128i*>(a), c);
  } else if (nt && (reinterpret_cast<std::uintptr_t>(a) & 15) == 0) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(a), c);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a), c);
  }
}

#define STRATA_BENCH_DEFINE_STREAMS(SUFFIX, FN, V, LOAD, STORE, STREAM)                                         \
  template <class T>                                                                                   \
  [[gnu::always_inline]] FN auto load_##SUFFIX(T* a) {                                                 \
    using namespace strata::detail::simd;                                                              \
    if constexpr (std::is_same_v<T, std::uint8_t>) {                                                   \
      __m128i c = load_codes(a, V::width);                                                             \
      __asm__ volatile("" : "+x"(c));                                                                  \
      return c;                                                                                        \
    } else {                                                                                           \
      V x = LOAD(a);                                                                                   \
      __asm__ volatile("" : "+v"(x.x));                                                                \
      return x;                                                                                        \
    }                                                                                                  \
  }                                                                                                    \
  template <bool Nt, class T, class X>                                                                 \
  [[gnu::always_inline]] FN void store_##SUFFIX(T* a, X x) {                                           \
    using namespace strata::detail::simd;                                                              \
    if constexpr (std::is_same_v<T, std::uint8_t>)                                                     \
      store_codes(a, x, V::width, Nt);                                                                 \
    else if constexpr (Nt)                                                                             \
      STREAM(a, x);                                                                                    \
    else                                                                                               \
      STORE(a, x);                                                                                     \
  }                                                                                                    \
  template <bool Nt, std::size_t... I, class Held, class... A>                                         \
  [[gnu::always_inline]] FN void store_held_##SUFFIX(std::index_sequence<I...>, const Held& held, A*... a) { \
    (store_##SUFFIX<Nt>(a, std::get<I>(held)), ...);                                                   \
  }                                                                                                    \
  template <bool Prefetch, bool Nt, bool LoadsFirst, class G, class H, class... A>                     \
  FN void streams_##SUFFIX(float* p, const G* g, H* out, std::size_t n, A*... a) {                     \
    using namespace strata::detail::simd;                                                              \
    constexpr std::size_t W = V::width;                                                                \
    const std::size_t ahead = prefetch_ahead_elems();                                                  \
    std::size_t i = 0;                                                                                 \
    for (; i + W <= n; i += W) {                                                                       \
      if constexpr (Prefetch) {                                                                        \
        prefetch_ahead(p + i, ahead);                                                                  \
        (prefetch_ahead(a + i, ahead), ...);                                                           \
        prefetch_ahead(g + i, ahead);                                                                  \
      }                                                                                                \
      V pv = LOAD(p + i), gv = LOAD(g + i);                                                            \
      __asm__ volatile("" : "+v"(pv.x), "+v"(gv.x));                                                   \
      if constexpr (LoadsFirst) {                                                                      \
        /* the kernels' order: p, the arrays, g loaded; then p and the arrays stored */                \
        const std::tuple held{load_##SUFFIX(a + i)...};                                                \
        store_##SUFFIX<Nt>(p + i, pv);                                                                 \
        store_held_##SUFFIX<Nt>(std::index_sequence_for<A...>{}, held, (a + i)...);                    \
      } else {                                                                                         \
        store_##SUFFIX<Nt>(p + i, pv);                                                                 \
        (store_##SUFFIX<Nt>(a + i, load_##SUFFIX(a + i)), ...);                                        \
      }                                                                                                \
      if constexpr (!std::is_same_v<H, strata::detail::no_model_copy>) STREAM(out + i, pv);            \
    }                                                                                                  \
    _mm_sfence();                                                                                      \
    streams_portable(p + i, g + i, out == nullptr ? nullptr : out + i, n - i, (a + i)...);             \
  }
STRATA_BENCH_DEFINE_STREAMS(avx512, STRATA_DETAIL_AVX512_FN, f32x16, load16, store16, stream16)
STRATA_BENCH_DEFINE_STREAMS(avx512bf16, STRATA_DETAIL_AVX512BF16_FN, f32x16, load16, store16_ne, stream16_ne)
STRATA_BENCH_DEFINE_STREAMS(avx2, STRATA_DETAIL_AVX2_FN, f32x8, load8, store8, stream8)
#undef STRATA_BENCH_DEFINE_STREAMS
#endif

template <class G, class H, class... A>
using streams_fn = void (*)(float*, const G*, H*, std::size_t, A*...);

template <bool Prefetch, bool Nt, bool LoadsFirst, class G, class H, class... A>
streams_fn<G, H, A...> pick(cpu_isa isa) {
#if STRATA_CPU_X86_PATHS
  if (isa == cpu_isa::avx512)  // bf16 narrowed as the kernels narrow it on this CPU
    return strata::detail::cpu_uses_avx512_bf16() ? &streams_avx512bf16<Prefetch, Nt, LoadsFirst, G, H, A...>
                                                  : &streams_avx512<Prefetch, Nt, LoadsFirst, G, H, A...>;
  if (isa == cpu_isa::avx2) return &streams_avx2<Prefetch, Nt, LoadsFirst, G, H, A...>;
#endif
  (void)isa;
  return &streams_portable<G, H, A...>;
}

template <bool Prefetch, bool Nt, class G, class H, class... A>
streams_fn<G, H, A...> pick(cpu_isa isa, bool loads_first) {
  return loads_first ? pick<Prefetch, Nt, true, G, H, A...>(isa) : pick<Prefetch, Nt, false, G, H, A...>(isa);
}

template <class G, class H, class... A>
streams_fn<G, H, A...> pick(cpu_isa isa, streams_way w) {
  const bool f = w.loads_first;
  if (w.prefetch) return w.stream_state ? pick<true, true, G, H, A...>(isa, f) : pick<true, false, G, H, A...>(isa, f);
  return w.stream_state ? pick<false, true, G, H, A...>(isa, f) : pick<false, false, G, H, A...>(isa, f);
}

// Each array as elements of its type: float, bf16 or codes.
template <class... A, std::size_t... I>
void run_tiles(const state_view& v, const state_format& f, std::size_t n, const auto* g, auto* out,
               thread_pool* pool, std::size_t tile, cpu_isa isa, streams_way w, std::index_sequence<I...>) {
  using G = std::remove_cv_t<std::remove_pointer_t<decltype(g)>>;
  using H = std::remove_pointer_t<decltype(out)>;
  const auto fn = pick<G, H, A...>(resolve_cpu_isa(isa), w);
  const bool quantized = f.quantized();
  // A block's scale belongs to one tile: tiles are whole blocks for quantized formats.
  if (quantized) tile = (tile + q8_block_elems - 1) / q8_block_elems * q8_block_elems;
  // Contiguous: one share a thread (whole tiles), each walked tile by tile.
  const std::size_t threads = pool == nullptr ? 1 : std::max<std::size_t>(pool->size(), 1);
  const std::size_t share = w.contiguous ? ((n + threads - 1) / threads + tile - 1) / tile * tile : tile;
  strata::detail::parallel_tiles(n, share, pool, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t b = lo; b < hi; b += tile) {
      const std::size_t e = std::min(hi, b + tile);
      fn(v.master + b, g + b, out == nullptr ? nullptr : out + b, e - b, (v.array<A>(I) + b)...);
      if (!quantized) continue;
      for (std::size_t k = 0; k < f.count; ++k) {
        if (v.scales[k] == nullptr) continue;
        for (std::size_t blk = b / q8_block_elems; blk < (e + q8_block_elems - 1) / q8_block_elems; ++blk) {
          float s = v.scales[k][blk];
          __asm__ volatile("" : STRATA_BENCH_FLOAT_REG(s));
          v.scales[k][blk] = s;
        }
      }
    }
  });
}

template <class T>
constexpr bool is(state_element e) {
  if constexpr (std::is_same_v<T, float>) return e == state_element::f32;
  if constexpr (std::is_same_v<T, bf16>) return e == state_element::bf16;
  return quantized(e);
}

// The format's arrays, all of one element type T (every rule's are), as a pack of `count` T's.
template <class T, class G, class H>
bool run_uniform(const state_view& v, const state_format& f, std::size_t n, const G* g, H* out, thread_pool* pool,
                 std::size_t tile, cpu_isa isa, streams_way w) {
  for (std::size_t k = 0; k < f.count; ++k)
    if (!is<T>(f.arrays[k].element)) return false;
  switch (f.count) {
    case 1: run_tiles<T>(v, f, n, g, out, pool, tile, isa, w, std::make_index_sequence<1>{}); return true;
    case 2: run_tiles<T, T>(v, f, n, g, out, pool, tile, isa, w, std::make_index_sequence<2>{}); return true;
    case 3: run_tiles<T, T, T>(v, f, n, g, out, pool, tile, isa, w, std::make_index_sequence<3>{}); return true;
    case 4: run_tiles<T, T, T, T>(v, f, n, g, out, pool, tile, isa, w, std::make_index_sequence<4>{}); return true;
    default: return false;
  }
}

template <class G, class H>
void run(const state_view& v, const state_format& f, std::size_t n, const G* g, H* out, thread_pool* pool,
         std::size_t tile, cpu_isa isa, streams_way w) {
  if (f.count == 0) {
    run_tiles<>(v, f, n, g, out, pool, tile, isa, w, std::index_sequence<>{});
    return;
  }
  if (run_uniform<float>(v, f, n, g, out, pool, tile, isa, w) || run_uniform<bf16>(v, f, n, g, out, pool, tile, isa, w) ||
      run_uniform<std::uint8_t>(v, f, n, g, out, pool, tile, isa, w))
    return;
  throw config_error("rule_streams_cpu: no streams for the state format '" + describe(f) +
                     "' (arrays of one element type only)");
}

}  // namespace streams_detail

/// Moves the streams of an update of the n parameters of state `v` (laid out by `f`) with
/// gradients `g`, writing the model copy into `out` (n elements; empty: none), in `w`'s way (see
/// the file comment), in tiles of `tile` parameters (rounded up to whole blocks for quantized
/// formats) on `pool` with instruction set `isa`. Changes no value of the state or gradients;
/// the copy receives the master weights narrowed to H.
template <class G, class H>
void rule_streams_cpu(const state_view& v, const state_format& f, std::span<const G> g, std::span<H> out,
                      thread_pool* pool, std::size_t tile, cpu_isa isa, streams_way w = {}) {
  const std::size_t n = v.count;
  if (out.empty())
    streams_detail::run<G, strata::detail::no_model_copy>(v, f, n, g.data(), nullptr, pool, tile, isa, w);
  else
    streams_detail::run<G, H>(v, f, n, g.data(), out.data(), pool, tile, isa, w);
}

}  // namespace strata::bench
