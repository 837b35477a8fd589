#pragma once
/// The CUDA Lion kernel (optim/lion_rule.hpp) and lion_rule's cuda_update, launched on a
/// caller-given stream. Include from .cu files (compiled by nvcc). Results are bit-identical to
/// the host kernels (lion_update_cpu): the same formula (strata::lion_element, with
/// __fmul_rn/__fmaf_rn, so nvcc's FMA contraction and fast-math flags change nothing) and the
/// same 16-bit conversions.
///
/// Stream contract: every function only enqueues work on `stream` (no device synchronization);
/// pointers are device (or managed) memory that stays valid until the stream reaches the work.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "strata/core/cuda.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/optim/adamw_cuda.cuh"
#include "strata/optim/element_types.hpp"
#include "strata/optim/lion_rule.hpp"
#include "strata/optim/update_rule.hpp"

namespace strata::cuda {

namespace detail {

// Four consecutive elements per thread (16-byte loads and stores of the fp32 arrays), as
// adamw_vec4_kernel, whose load4/store4/grid_blocks this reuses.
template <class G, class H>
__global__ void __launch_bounds__(adamw_block_threads)
    lion_vec4_kernel(float* p, float* m, const G* g, H* out, std::size_t n, const lion_step_params k) {
  const std::size_t n4 = n / 4;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t i = first; i < n4; i += stride) {
    float4 P = reinterpret_cast<float4*>(p)[i];
    float4 M = reinterpret_cast<float4*>(m)[i];
    float gg[4];
    load4(g, i, gg);
    lion_element(P.x, M.x, gg[0], k);
    lion_element(P.y, M.y, gg[1], k);
    lion_element(P.z, M.z, gg[2], k);
    lion_element(P.w, M.w, gg[3], k);
    reinterpret_cast<float4*>(p)[i] = P;
    reinterpret_cast<float4*>(m)[i] = M;
    if constexpr (!std::is_same_v<H, no_model_copy>) store4(out, i, P);
  }
  // The last n % 4 elements, one per thread of the first threads.
  if (first < n - n4 * 4) {
    const std::size_t j = n4 * 4 + first;
    lion_element(p[j], m[j], widen(g[j]), k);
    if constexpr (!std::is_same_v<H, no_model_copy>) out[j] = narrow<H>(p[j]);
  }
}

// Any alignment: one element per thread.
template <class G, class H>
__global__ void __launch_bounds__(adamw_block_threads)
    lion_scalar_kernel(float* p, float* m, const G* g, H* out, std::size_t n, const lion_step_params k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    lion_element(p[j], m[j], widen(g[j]), k);
    if constexpr (!std::is_same_v<H, no_model_copy>) out[j] = narrow<H>(p[j]);
  }
}

template <class G, class H>
void launch_lion(float* p, float* m, const G* g, H* out, std::size_t n, const lion_step_params& k,
                 cudaStream_t stream) {
  constexpr std::size_t half_align = std::is_same_v<G, float> ? 16 : 8;
  const bool vec = aligned(p, 16) && aligned(m, 16) && aligned(g, half_align) &&
                   (std::is_same_v<H, no_model_copy> || aligned(out, sizeof(H) * 4));
  if (vec) {
    const unsigned blocks = grid_blocks(std::max<std::size_t>(n / 4, 4));
    lion_vec4_kernel<<<blocks, adamw_block_threads, 0, stream>>>(p, m, g, out, n, k);
  } else {
    lion_scalar_kernel<<<grid_blocks(n), adamw_block_threads, 0, stream>>>(p, m, g, out, n, k);
  }
  STRATA_CUDA_TRY(cudaGetLastError());
}

}  // namespace detail

/// The CUDA twin of strata::lion_update_cpu: updates n parameters in device memory on `stream`.
/// model_out may be null (no model copy). Arrays that start 16-byte aligned (16-bit arrays:
/// 8-byte) take the vectorized kernel, others a scalar one with the same results. Launch errors
/// throw strata::cuda_error.
template <gradient_type G, class H = bf16>
  requires model_copy_type<H>
void lion_update(float* master, float* exp_avg, const G* grad, H* model_out, std::size_t n,
                 const lion_step_params& k, cudaStream_t stream) {
  if (n == 0) return;
  STRATA_EXPECTS(master != nullptr && exp_avg != nullptr && grad != nullptr, config_error,
                 "cuda::lion_update: missing master weights, exp_avg or gradients");
  if (model_out == nullptr)
    detail::launch_lion<G, detail::no_model_copy>(master, exp_avg, grad, nullptr, n, k, stream);
  else
    detail::launch_lion<G, H>(master, exp_avg, grad, model_out, n, k, stream);
}

}  // namespace strata::cuda

namespace strata {

// doc-snippet: cuda
/// lion_rule on CUDA: the update of parameters [at, at + n) of a state in device memory.
template <>
struct cuda_update<lion_rule> {
  template <class G, class H>
  static void launch(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                     const lion_step_params& k, cudaStream_t stream) {
    cuda::lion_update<G, H>(v.master == nullptr ? nullptr : v.master + at,
                            v.arrays[0] == nullptr ? nullptr : v.array<float>(0, at), grads, model_out, n, k, stream);
  }
};
// doc-snippet-end

}  // namespace strata
