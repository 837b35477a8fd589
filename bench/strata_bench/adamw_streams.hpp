#pragma once
// The memory bound of the CPU AdamW update: the update with its arithmetic taken out.
//
// adamw_streams_cpu moves exactly the streams adamw_update_cpu moves, in the same way: it loads
// p, m, v and the gradient (widened from bf16/fp16 by the same load; bf16 moments likewise) and
// stores p, m, v and the model copy (narrowed by the same store), one vector at a time, over the same tiles, on the same
// thread pool, with the same instruction set, the same software prefetches and the same kinds
// of stores (ordinary ones for p, m and v; non-temporal ones for the model copy, as the update). Only adamw_element is missing: the loaded values are
// hidden from the optimizer (an empty asm per vector) and stored back unchanged, so no load or
// store can be elided. An update can therefore take no less time than this on the same buffers,
// which makes update time / this time a real efficiency (<= 1 up to measurement noise).
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>

#include <strata/core/thread_pool.hpp>
#include <strata/optim/adamw_cpu.hpp>
#include <strata/optim/cpu_dispatch.hpp>
#include <strata/optim/detail/simd_x86.hpp>

namespace strata::bench {
namespace streams_detail {

// A float kept in a register (x86 SSE, AArch64 SIMD), or in memory elsewhere.
#if defined(__x86_64__) || defined(__i386__)
#define STRATA_BENCH_FLOAT_REG(x) "+x"(x)
#elif defined(__aarch64__)
#define STRATA_BENCH_FLOAT_REG(x) "+w"(x)
#else
#define STRATA_BENCH_FLOAT_REG(x) "+m"(x)
#endif

template <class G, class H, class M>
void streams_portable(float* p, M* m, M* v, const G* g, H* out, std::size_t n) {
  using strata::detail::narrow;
  using strata::detail::widen;
  for (std::size_t i = 0; i < n; ++i) {
    float pi = p[i], mi = widen(m[i]), vi = widen(v[i]), gi = widen(g[i]);
    __asm__ volatile("" : STRATA_BENCH_FLOAT_REG(pi), STRATA_BENCH_FLOAT_REG(mi), STRATA_BENCH_FLOAT_REG(vi),
                     STRATA_BENCH_FLOAT_REG(gi));
    p[i] = pi;
    m[i] = narrow<M>(mi);
    v[i] = narrow<M>(vi);
    if constexpr (!std::is_same_v<H, strata::detail::no_model_copy>) out[i] = strata::detail::narrow<H>(pi);
  }
}

#if STRATA_CPU_X86_PATHS
#define STRATA_BENCH_DEFINE_STREAMS(SUFFIX, FN, V, LOAD, STORE, STREAM)                                             \
  template <class G, class H, class M>                                                                       \
  FN void streams_##SUFFIX(float* p, M* m, M* v, const G* g, H* out, std::size_t n) {                        \
    using namespace strata::detail::simd;                                                                    \
    constexpr std::size_t W = V::width;                                                                      \
    std::size_t i = 0;                                                                                       \
    for (; i + W <= n; i += W) {                                                                             \
      prefetch_ahead(p + i);                                                                                 \
      prefetch_ahead(m + i);                                                                                 \
      prefetch_ahead(v + i);                                                                                 \
      prefetch_ahead(g + i);                                                                                 \
      V pv = LOAD(p + i), mv = LOAD(m + i), vv = LOAD(v + i), gv = LOAD(g + i);                              \
      __asm__ volatile("" : "+v"(pv.x), "+v"(mv.x), "+v"(vv.x), "+v"(gv.x));                                 \
      STORE(p + i, pv);                                                                                      \
      STORE(m + i, mv);                                                                                      \
      STORE(v + i, vv);                                                                                      \
      if constexpr (!std::is_same_v<H, strata::detail::no_model_copy>) STREAM(out + i, pv);                  \
    }                                                                                                        \
    if constexpr (!std::is_same_v<H, strata::detail::no_model_copy>) _mm_sfence();                           \
    streams_portable(p + i, m + i, v + i, g + i, out == nullptr ? nullptr : out + i, n - i);                 \
  }
STRATA_BENCH_DEFINE_STREAMS(avx512, STRATA_DETAIL_AVX512_FN, f32x16, load16, store16, stream16)
STRATA_BENCH_DEFINE_STREAMS(avx2, STRATA_DETAIL_AVX2_FN, f32x8, load8, store8, stream8)
#undef STRATA_BENCH_DEFINE_STREAMS
#endif

template <class G, class H, class M>
using streams_fn = void (*)(float*, M*, M*, const G*, H*, std::size_t);

template <class G, class H, class M>
streams_fn<G, H, M> pick_streams(cpu_isa isa) {
#if STRATA_CPU_X86_PATHS
  if (isa == cpu_isa::avx512) return &streams_avx512<G, H, M>;
  if (isa == cpu_isa::avx2) return &streams_avx2<G, H, M>;
#endif
  (void)isa;
  return &streams_portable<G, H, M>;
}

template <class G, class H, class M>
void run_streams(float* p, M* m, M* v, const G* g, H* out, std::size_t n, thread_pool* pool, std::size_t tile,
                 cpu_isa isa) {
  const auto fn = pick_streams<G, H, M>(resolve_cpu_isa(isa));
  strata::detail::parallel_tiles(n, tile, pool, [&](std::size_t b, std::size_t e) {
    fn(p + b, m + b, v + b, g + b, out == nullptr ? nullptr : out + b, e - b);
  });
}

}  // namespace streams_detail

/// Moves the streams of adamw_update_cpu<G, H, M>(p, m, v, {}, g, out, {}, pool, tile, isa)
/// without its arithmetic (see the file comment); `out` empty: no model copy, as in the update.
template <class G, class H, class M = float>
void adamw_streams_cpu(std::span<float> p, std::span<M> m, std::span<M> v, std::span<const G> g, std::span<H> out,
                       thread_pool* pool, std::size_t tile, cpu_isa isa) {
  if (out.empty())
    streams_detail::run_streams<G, strata::detail::no_model_copy, M>(p.data(), m.data(), v.data(), g.data(), nullptr,
                                                                     p.size(), pool, tile, isa);
  else
    streams_detail::run_streams<G, H, M>(p.data(), m.data(), v.data(), g.data(), out.data(), p.size(), pool, tile,
                                         isa);
}

}  // namespace strata::bench
