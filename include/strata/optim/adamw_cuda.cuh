#pragma once
/// The CUDA AdamW kernel and gradient norm, launched on a caller-given stream. Include from .cu
/// files (compiled by nvcc). Results are bit-identical to the CPU kernels (optim/adamw_cpu.hpp,
/// optim/grad_norm.hpp): the same formula (strata::adamw_element, with __fmul_rn/__fadd_rn/
/// __fmaf_rn/__fdiv_rn/__fsqrt_rn, so nvcc's FMA contraction and fast-math flags change nothing),
/// the same 16-bit conversions, and for the norm the same fixed reduction order.
///
/// Stream contract: every function only enqueues work on `stream` (no device synchronization);
/// pointers are device (or managed) memory that stays valid until the stream reaches the work.
/// The synchronous grad_stats_cuda is the exception: it waits for its stream.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "strata/core/cuda.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/adamw_bf16_rule.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/element_types.hpp"

namespace strata::cuda {

namespace detail {

using strata::detail::narrow;
using strata::detail::no_model_copy;
using strata::detail::widen;

inline constexpr unsigned adamw_block_threads = 256;

// Four consecutive elements per thread: 16-byte loads and stores of the fp32 arrays, 8-byte
// ones of the 16-bit arrays.
template <class G>
__device__ inline void load4(const G* g, std::size_t i, float (&out)[4]) {
  if constexpr (std::is_same_v<G, float>) {
    const float4 x = reinterpret_cast<const float4*>(g)[i];
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  } else {
    const uint2 x = reinterpret_cast<const uint2*>(g)[i];
    out[0] = widen(G::from_bits(static_cast<std::uint16_t>(x.x & 0xffffU)));
    out[1] = widen(G::from_bits(static_cast<std::uint16_t>(x.x >> 16)));
    out[2] = widen(G::from_bits(static_cast<std::uint16_t>(x.y & 0xffffU)));
    out[3] = widen(G::from_bits(static_cast<std::uint16_t>(x.y >> 16)));
  }
}

template <class H>
__device__ inline void store4(H* out, std::size_t i, const float4& p) {
  if constexpr (std::is_same_v<H, float>) {
    reinterpret_cast<float4*>(out)[i] = p;
  } else {
    const auto b = [](float f) { return static_cast<std::uint32_t>(narrow<H>(f).bits); };
    reinterpret_cast<uint2*>(out)[i] = make_uint2(b(p.x) | (b(p.y) << 16), b(p.z) | (b(p.w) << 16));
  }
}

// One element j: the moments (of type M: float, or bf16 widened exactly and rounded back to
// nearest even) around adamw_element.
template <bool L2, bool Amsgrad, class G, class H, class M>
__device__ inline void adamw_one(float* p, M* m, M* v, M* vmax, const G* g, H* out, std::size_t j,
                                 const adamw_step_params& k) {
  float mj = widen(m[j]), vj = widen(v[j]), x = 0;
  if constexpr (Amsgrad) x = widen(vmax[j]);
  adamw_element<L2, Amsgrad>(p[j], mj, vj, x, widen(g[j]), k);
  m[j] = narrow<M>(mj);
  v[j] = narrow<M>(vj);
  if constexpr (Amsgrad) vmax[j] = narrow<M>(x);
  if constexpr (!std::is_same_v<H, no_model_copy>) out[j] = narrow<H>(p[j]);
}

template <bool L2, bool Amsgrad, class G, class H, class M>
__global__ void __launch_bounds__(adamw_block_threads)
    adamw_vec4_kernel(float* p, M* m, M* v, M* vmax, const G* g, H* out, std::size_t n, const adamw_step_params k) {
  const std::size_t n4 = n / 4;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t i = first; i < n4; i += stride) {
    float4 P = reinterpret_cast<float4*>(p)[i];
    float mm[4], vv[4], xx[4] = {}, gg[4];
    load4(m, i, mm);
    load4(v, i, vv);
    if constexpr (Amsgrad) load4(vmax, i, xx);
    load4(g, i, gg);
    adamw_element<L2, Amsgrad>(P.x, mm[0], vv[0], xx[0], gg[0], k);
    adamw_element<L2, Amsgrad>(P.y, mm[1], vv[1], xx[1], gg[1], k);
    adamw_element<L2, Amsgrad>(P.z, mm[2], vv[2], xx[2], gg[2], k);
    adamw_element<L2, Amsgrad>(P.w, mm[3], vv[3], xx[3], gg[3], k);
    reinterpret_cast<float4*>(p)[i] = P;
    store4(m, i, make_float4(mm[0], mm[1], mm[2], mm[3]));
    store4(v, i, make_float4(vv[0], vv[1], vv[2], vv[3]));
    if constexpr (Amsgrad) store4(vmax, i, make_float4(xx[0], xx[1], xx[2], xx[3]));
    if constexpr (!std::is_same_v<H, no_model_copy>) store4(out, i, P);
  }
  // The last n % 4 elements, one per thread of the first threads.
  if (first < n - n4 * 4) adamw_one<L2, Amsgrad>(p, m, v, vmax, g, out, n4 * 4 + first, k);
}

// Any alignment (a sub-span that does not start on a 16-byte boundary): one element per thread.
template <bool L2, bool Amsgrad, class G, class H, class M>
__global__ void __launch_bounds__(adamw_block_threads)
    adamw_scalar_kernel(float* p, M* m, M* v, M* vmax, const G* g, H* out, std::size_t n, const adamw_step_params k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride)
    adamw_one<L2, Amsgrad>(p, m, v, vmax, g, out, j, k);
}

inline bool aligned(const void* ptr, std::size_t a) { return reinterpret_cast<std::uintptr_t>(ptr) % a == 0; }

/// Blocks for a grid-stride loop over `work` items: enough to fill the device, no more.
inline unsigned grid_blocks(std::size_t work) {
  int device = 0;
  int sms = 0;
  STRATA_CUDA_TRY(cudaGetDevice(&device));
  STRATA_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::size_t needed = (work + adamw_block_threads - 1) / adamw_block_threads;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min<std::size_t>(needed, static_cast<std::size_t>(sms) * 8)));
}

template <bool L2, bool Amsgrad, class G, class H, class M>
void launch_adamw(float* p, M* m, M* v, M* vmax, const G* g, H* out, std::size_t n, const adamw_step_params& k,
                  cudaStream_t stream) {
  constexpr std::size_t half_align = std::is_same_v<G, float> ? 16 : 8;
  constexpr std::size_t moment_align = sizeof(M) * 4;
  const bool vec = aligned(p, 16) && aligned(m, moment_align) && aligned(v, moment_align) &&
                   (!Amsgrad || aligned(vmax, moment_align)) &&
                   aligned(g, half_align) && (std::is_same_v<H, no_model_copy> || aligned(out, sizeof(H) * 4));
  if (vec) {
    const unsigned blocks = grid_blocks(std::max<std::size_t>(n / 4, 4));
    adamw_vec4_kernel<L2, Amsgrad><<<blocks, adamw_block_threads, 0, stream>>>(p, m, v, vmax, g, out, n, k);
  } else {
    adamw_scalar_kernel<L2, Amsgrad><<<grid_blocks(n), adamw_block_threads, 0, stream>>>(p, m, v, vmax, g, out, n, k);
  }
  STRATA_CUDA_TRY(cudaGetLastError());
}

template <class G, class H, class M = float>
void dispatch_adamw(float* p, M* m, M* v, M* vmax, const G* g, H* out, std::size_t n, const adamw_step_params& k,
                    cudaStream_t stream) {
  if (k.l2) {
    if (k.amsgrad)
      launch_adamw<true, true>(p, m, v, vmax, g, out, n, k, stream);
    else
      launch_adamw<true, false>(p, m, v, vmax, g, out, n, k, stream);
  } else {
    if (k.amsgrad)
      launch_adamw<false, true>(p, m, v, vmax, g, out, n, k, stream);
    else
      launch_adamw<false, false>(p, m, v, vmax, g, out, n, k, stream);
  }
}

// Norm, pass 1: one thread per lane of a 2048-element block, lanes combined with the fixed tree
// by warp shuffles (8 lanes of a block are 8 consecutive threads of one warp).
template <class G>
__global__ void grad_block_sums_kernel(const G* g, std::size_t n, float scale, double* partial,
                                       std::size_t blocks) {
  const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t b = t / grad_norm_lanes;
  const std::size_t lane = t % grad_norm_lanes;
  double acc = 0;
  if (b < blocks) {
    const std::size_t off = b * grad_norm_block;
    const std::size_t len = n - off < grad_norm_block ? n - off : grad_norm_block;
    for (std::size_t i = lane; i < len; i += grad_norm_lanes) {
      const double u = __fmul_rn(widen(g[off + i]), scale);
      acc = __dadd_rn(acc, __dmul_rn(u, u));
    }
  }
  for (unsigned d = 1; d < grad_norm_lanes; d *= 2) {
    const double other = __shfl_down_sync(0xffffffffU, acc, d, grad_norm_lanes);
    acc = __dadd_rn(acc, other);
  }
  if (b < blocks && lane == 0) partial[b] = acc;
}

// Norm, pass 2: the block sums added in block order (the order is the definition).
template <class = void>
__global__ void grad_sum_blocks_kernel(const double* partial, std::size_t blocks, double* sum) {
  double s = 0;
  for (std::size_t b = 0; b < blocks; ++b) s = __dadd_rn(s, partial[b]);
  *sum = s;
}

}  // namespace detail

/// The CUDA twin of strata::adamw_update_cpu: updates n parameters in device memory on `stream`,
/// the moments of type M (fp32, or bf16 as adamw_bf16_rule keeps them). max_exp_avg_sq is used
/// only when k.amsgrad; model_out may be null (no model copy). Arrays that start 16-byte aligned
/// (16-bit arrays: 8-byte) take the vectorized kernel; others a scalar one with the same results.
/// Launch errors throw strata::cuda_error.
template <gradient_type G, class H = bf16, class M = float>
  requires model_copy_type<H>
void adamw_update(float* master, M* exp_avg, M* exp_avg_sq, M* max_exp_avg_sq, const G* grad, H* model_out,
                  std::size_t n, const adamw_step_params& k, cudaStream_t stream) {
  STRATA_EXPECTS(!k.amsgrad || max_exp_avg_sq != nullptr || n == 0, config_error,
                 "cuda::adamw_update: amsgrad needs max_exp_avg_sq");
  if (n == 0) return;
  if (model_out == nullptr)
    detail::dispatch_adamw<G, detail::no_model_copy, M>(master, exp_avg, exp_avg_sq, max_exp_avg_sq, grad, nullptr,
                                                        n, k, stream);
  else
    detail::dispatch_adamw<G, H, M>(master, exp_avg, exp_avg_sq, max_exp_avg_sq, grad, model_out, n, k, stream);
}

/// Device doubles grad_sum_squares_async needs as workspace for n gradients.
[[nodiscard]] constexpr std::size_t grad_norm_workspace_elems(std::size_t n) noexcept {
  return (n + grad_norm_block - 1) / grad_norm_block;
}

/// Enqueues the squared norm of grad * scale (n device gradients) into *sum (device memory), in
/// the fixed order of optim/grad_norm.hpp: bit-identical to strata::grad_stats_cpu.
/// `workspace` holds grad_norm_workspace_elems(n) doubles.
template <gradient_type G>
void grad_sum_squares_async(const G* grad, std::size_t n, float scale, double* workspace, double* sum,
                            cudaStream_t stream) {
  const std::size_t blocks = grad_norm_workspace_elems(n);
  if (blocks > 0) {
    const std::size_t threads = blocks * grad_norm_lanes;
    const auto grid = static_cast<unsigned>((threads + detail::adamw_block_threads - 1) / detail::adamw_block_threads);
    detail::grad_block_sums_kernel<<<grid, detail::adamw_block_threads, 0, stream>>>(grad, n, scale, workspace, blocks);
    STRATA_CUDA_TRY(cudaGetLastError());
  }
  detail::grad_sum_blocks_kernel<><<<1, 1, 0, stream>>>(workspace, blocks, sum);
  STRATA_CUDA_TRY(cudaGetLastError());
}

/// grad_sum_squares_async with its own workspace, waiting for the result (synchronizes `stream`).
template <gradient_type G>
[[nodiscard]] grad_stats grad_stats_cuda(const G* grad, std::size_t n, float scale, cudaStream_t stream) {
  double* work = nullptr;
  const std::size_t elems = grad_norm_workspace_elems(n) + 1;
  STRATA_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&work), elems * sizeof(double), stream));
  grad_stats s{0, n};
  try {
    grad_sum_squares_async(grad, n, scale, work + 1, work, stream);
    STRATA_CUDA_TRY(cudaMemcpyAsync(&s.sum_squares, work, sizeof(double), cudaMemcpyDeviceToHost, stream));
    STRATA_CUDA_TRY(cudaFreeAsync(work, stream));
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  } catch (...) {
    (void)cudaFreeAsync(work, stream);
    throw;
  }
  return s;
}

}  // namespace strata::cuda

namespace strata {

/// adamw_rule on CUDA: the update of parameters [at, at + n) of a state in device memory.
template <>
struct cuda_update<adamw_rule> {
  template <class G, class H>
  static void launch(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                     const adamw_step_params& k, cudaStream_t stream) {
    cuda::adamw_update<G, H>(v.master + at, v.array<float>(0, at), v.array<float>(1, at),
                             k.amsgrad ? v.array<float>(2, at) : nullptr, grads, model_out, n, k, stream);
  }
};

/// adamw_bf16_rule on CUDA.
template <>
struct cuda_update<adamw_bf16_rule> {
  template <class G, class H>
  static void launch(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                     const adamw_step_params& k, cudaStream_t stream) {
    cuda::adamw_update<G, H, bf16>(v.master + at, v.array<bf16>(0, at), v.array<bf16>(1, at),
                                   k.amsgrad ? v.array<bf16>(2, at) : nullptr, grads, model_out, n, k, stream);
  }
};

}  // namespace strata
