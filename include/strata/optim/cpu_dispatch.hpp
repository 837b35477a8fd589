#pragma once
/// Building blocks of strata's CPU kernels: the instruction-set paths and their run-time
/// selection, and a tiled parallel loop over the strata thread pool.
///
/// Each kernel exists three times, from the same formula (optim/adamw_math.hpp): a portable
/// scalar path, an AVX2 path (AVX2+FMA+F16C, 8 lanes) and an AVX-512 path (AVX-512F/BW/VL/DQ,
/// 16 lanes), using GCC/Clang `target` attributes, and the best one this CPU runs is picked at
/// run time; the library never needs -march flags. All three compute bit-identical results:
/// every operation is the same IEEE operation, fmas are explicit and products sit behind an
/// association barrier so no compiler flag can fuse them.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/thread_pool.hpp"

namespace strata {

/// An instruction-set path of the CPU kernels.
enum class cpu_isa : unsigned char {
  automatic,  ///< the best path this CPU supports
  portable,   ///< plain C++ (whatever the compiler's baseline target vectorizes)
  avx2,       ///< x86-64 AVX2 + FMA + F16C, 256-bit vectors
  avx512,     ///< x86-64 AVX-512 F/BW/VL/DQ, 512-bit vectors
};

/// The name of a path ("automatic", "portable", "avx2", "avx512").
[[nodiscard]] constexpr std::string_view to_string(cpu_isa isa) noexcept {
  switch (isa) {
    case cpu_isa::automatic: return "automatic";
    case cpu_isa::portable: return "portable";
    case cpu_isa::avx2: return "avx2";
    case cpu_isa::avx512: return "avx512";
  }
  return "unknown";
}

// nvcc's device pass (__CUDA_ARCH__) must not see the SIMD paths: the one AdamW formula is a
// __host__ __device__ template, and its SIMD instantiations hold vector types device code cannot
// have. They are host code only, so the host pass of a .cu file keeps them.
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && !defined(__CUDA_ARCH__)
#define STRATA_CPU_X86_PATHS 1
#else
#define STRATA_CPU_X86_PATHS 0
#endif

/// Whether this CPU (and this build) can run `isa`. `automatic` and `portable` always can.
[[nodiscard]] inline bool cpu_supports(cpu_isa isa) noexcept {
#if STRATA_CPU_X86_PATHS
  switch (isa) {
    case cpu_isa::automatic:
    case cpu_isa::portable: return true;
    case cpu_isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case cpu_isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             cpu_supports(cpu_isa::avx2);
  }
  return false;
#else
  return isa == cpu_isa::automatic || isa == cpu_isa::portable;
#endif
}

namespace detail {
/// Whether this CPU has AVX-512 VBMI (byte permutes across a whole register): the avx512 path of
/// the 8-bit rule needs it and runs the avx2 kernel on AVX-512 CPUs without it (Skylake-X).
[[nodiscard]] inline bool cpu_has_avx512_vbmi() noexcept {
#if STRATA_CPU_X86_PATHS
  return cpu_supports(cpu_isa::avx512) && __builtin_cpu_supports("avx512vbmi");
#else
  return false;
#endif
}
/// Whether the avx512 path rounds to bf16 with AVX512_BF16's instruction (one instruction for
/// the six of the integer rounding; on Zen 4 the bf16-moment rule's update from caches ran 1.32x
/// faster with it at 1 thread, BENCHMARKS.md "AdamW with bf16 moments"):
/// where the CPU has it, unless STRATA_CPU_BF16=0 (the bits are the same; the switch lets tests
/// and benchmarks run both forms on one CPU). Read once per process; config_error from the first
/// call when the variable is malformed.
[[nodiscard]] inline bool cpu_uses_avx512_bf16() {
#if STRATA_CPU_X86_PATHS
  static const bool use = cpu_supports(cpu_isa::avx512) && __builtin_cpu_supports("avx512bf16") &&
                          env_bool("STRATA_CPU_BF16", true);
  return use;
#else
  return false;
#endif
}
}  // namespace detail

/// The path `automatic` resolves to: avx512 where supported, else avx2, else portable.
[[nodiscard]] inline cpu_isa best_cpu_isa() noexcept {
  static const cpu_isa best = cpu_supports(cpu_isa::avx512) ? cpu_isa::avx512
                              : cpu_supports(cpu_isa::avx2) ? cpu_isa::avx2
                                                            : cpu_isa::portable;
  return best;
}

/// Resolves `automatic`; throws config_error when `isa` was forced and this CPU lacks it.
[[nodiscard]] inline cpu_isa resolve_cpu_isa(cpu_isa isa) {
  if (isa == cpu_isa::automatic) return best_cpu_isa();
  STRATA_EXPECTS(cpu_supports(isa), config_error, "cpu_isa '{}' is not supported by this CPU or build", to_string(isa));
  return isa;
}

namespace detail {

/// Runs f(begin, end) over [0, n) in tiles of `tile` elements: on the calling thread, helped by
/// up to pool->size() - 1 of the pool's workers (so at most pool->size() threads work).
/// The tiles are cut into one contiguous share per thread; each thread walks its own share tile
/// by tile, then helps with the others' (claiming their next tiles), so a thread's memory streams
/// stay sequential across tiles (hardware prefetchers keep their streams: measured faster than
/// claiming every tile from one counter, where a thread's next tile is wherever the counter is)
/// and a late or slow thread's tiles are still taken by the others. The call returns when every
/// tile is done. A helper that starts after the last tile was claimed does nothing, so calling
/// this from a worker of the same pool cannot deadlock. The first exception thrown by f is
/// rethrown here (tiles not yet claimed are then skipped).
template <class F>
void parallel_tiles(std::size_t n, std::size_t tile, thread_pool* pool, F&& f) {
  STRATA_EXPECTS(tile > 0, config_error, "tile size must be positive");
  if (n == 0) return;
  const std::size_t tiles = (n + tile - 1) / tile;
  const std::size_t helpers = pool == nullptr ? 0 : std::min(pool->size(), tiles) - 1;
  if (helpers == 0) {
    for (std::size_t b = 0; b < n; b += tile) f(b, std::min(n, b + tile));
    return;
  }
  const std::size_t shares = helpers + 1;
  struct alignas(64) share_counter {  // one cache line each: the threads claim from different shares
    std::atomic<std::size_t> next{0};
  };
  struct shared {
    explicit shared(std::size_t k) : next(k) {}
    std::atomic<std::size_t> joined{0};
    std::vector<share_counter> next;  // tiles claimed from each share
    std::atomic<std::size_t> done{0};
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    std::exception_ptr error;
  };
  auto s = std::make_shared<shared>(shares);
  // Claims and runs tiles until none is left: its own share first, then the next ones in turn.
  // f is dereferenced only after a successful claim, which happens before the caller can see
  // done == tiles and return.
  auto work = [s, n, tile, tiles, shares, fp = &f]() noexcept {
    const std::size_t me = s->joined.fetch_add(1, std::memory_order_relaxed) % shares;
    for (std::size_t k = 0; k < shares; ++k) {
      const std::size_t c = (me + k) % shares;
      const std::size_t first = c * tiles / shares, end = (c + 1) * tiles / shares;
      for (;;) {
        const std::size_t t = first + s->next[c].next.fetch_add(1, std::memory_order_relaxed);
        if (t >= end) break;
        try {
          if (!s->failed.load(std::memory_order_relaxed)) (*fp)(t * tile, std::min(n, (t + 1) * tile));
        } catch (...) {
          std::lock_guard lock(s->error_mutex);
          if (!s->error) s->error = std::current_exception();
          s->failed.store(true, std::memory_order_relaxed);
        }
        if (s->done.fetch_add(1, std::memory_order_acq_rel) + 1 == tiles) s->done.notify_all();
      }
    }
  };
  for (std::size_t h = 0; h < helpers; ++h) (void)pool->submit(work);
  work();
  for (std::size_t d = s->done.load(std::memory_order_acquire); d != tiles; d = s->done.load(std::memory_order_acquire))
    s->done.wait(d, std::memory_order_acquire);
  std::lock_guard lock(s->error_mutex);
  if (s->error) std::rethrow_exception(s->error);
}

}  // namespace detail
}  // namespace strata

// Attributes of the kernels. No `optimize` attribute: GCC refuses to inline functions without it
// into functions with it. Contraction is prevented by the association barriers in the
// operations instead, and sqrt is an intrinsic on the SIMD paths. `flatten` inlines the whole
// call tree (adamw_element and the SIMD operations) into the kernel, where the target matches.
#define STRATA_DETAIL_KERNEL_PORTABLE __attribute__((noinline))
#if STRATA_CPU_X86_PATHS
#define STRATA_DETAIL_KERNEL_AVX2 __attribute__((target("avx2,fma,f16c,bmi,bmi2"), noinline, flatten))
#define STRATA_DETAIL_KERNEL_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2"), noinline, flatten))
#define STRATA_DETAIL_KERNEL_AVX512BF16                                                                          \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,bmi,bmi2"), noinline, flatten))
#define STRATA_DETAIL_KERNEL_AVX512VBMI                                                                      \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c,bmi,bmi2"), noinline, \
                 flatten))
#endif
