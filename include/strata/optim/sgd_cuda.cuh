#pragma once
/// The CUDA SGD kernel (optim/sgd_rule.hpp) and sgd_rule's cuda_update, launched on a caller-given
/// stream. Include from .cu files (compiled by nvcc). Results are bit-identical to the host
/// kernels (sgd_update_cpu): the same formula (strata::sgd_element, with __fmul_rn/__fmaf_rn, so
/// nvcc's FMA contraction and fast-math flags change nothing) and the same 16-bit conversions.
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
#include "strata/optim/sgd_rule.hpp"
#include "strata/optim/update_rule.hpp"

namespace strata::cuda {

namespace detail {

// Four consecutive elements per thread (16-byte loads and stores of the fp32 arrays), as
// adamw_vec4_kernel, whose load4/store4/grid_blocks this reuses.
template <bool L2, bool Momentum, class G, class H>
__global__ void __launch_bounds__(adamw_block_threads)
    sgd_vec4_kernel(float* p, float* b, const G* g, H* out, std::size_t n, const sgd_step_params k) {
  const std::size_t n4 = n / 4;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t i = first; i < n4; i += stride) {
    float4 P = reinterpret_cast<float4*>(p)[i];
    float4 B{};
    if constexpr (Momentum) {
      if (!k.first) B = reinterpret_cast<float4*>(b)[i];
    }
    float gg[4];
    load4(g, i, gg);
    sgd_element<L2, Momentum>(P.x, B.x, gg[0], k);
    sgd_element<L2, Momentum>(P.y, B.y, gg[1], k);
    sgd_element<L2, Momentum>(P.z, B.z, gg[2], k);
    sgd_element<L2, Momentum>(P.w, B.w, gg[3], k);
    reinterpret_cast<float4*>(p)[i] = P;
    if constexpr (Momentum) reinterpret_cast<float4*>(b)[i] = B;
    if constexpr (!std::is_same_v<H, no_model_copy>) store4(out, i, P);
  }
  // The last n % 4 elements, one per thread of the first threads.
  if (first < n - n4 * 4) {
    const std::size_t j = n4 * 4 + first;
    float x = 0;
    if constexpr (Momentum) {
      if (!k.first) x = b[j];
    }
    sgd_element<L2, Momentum>(p[j], x, widen(g[j]), k);
    if constexpr (Momentum) b[j] = x;
    if constexpr (!std::is_same_v<H, no_model_copy>) out[j] = narrow<H>(p[j]);
  }
}

// Any alignment: one element per thread.
template <bool L2, bool Momentum, class G, class H>
__global__ void __launch_bounds__(adamw_block_threads)
    sgd_scalar_kernel(float* p, float* b, const G* g, H* out, std::size_t n, const sgd_step_params k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    float x = 0;
    if constexpr (Momentum) {
      if (!k.first) x = b[j];
    }
    sgd_element<L2, Momentum>(p[j], x, widen(g[j]), k);
    if constexpr (Momentum) b[j] = x;
    if constexpr (!std::is_same_v<H, no_model_copy>) out[j] = narrow<H>(p[j]);
  }
}

template <bool L2, bool Momentum, class G, class H>
void launch_sgd(float* p, float* b, const G* g, H* out, std::size_t n, const sgd_step_params& k,
                cudaStream_t stream) {
  constexpr std::size_t half_align = std::is_same_v<G, float> ? 16 : 8;
  const bool vec = aligned(p, 16) && (!Momentum || aligned(b, 16)) && aligned(g, half_align) &&
                   (std::is_same_v<H, no_model_copy> || aligned(out, sizeof(H) * 4));
  if (vec) {
    const unsigned blocks = grid_blocks(std::max<std::size_t>(n / 4, 4));
    sgd_vec4_kernel<L2, Momentum><<<blocks, adamw_block_threads, 0, stream>>>(p, b, g, out, n, k);
  } else {
    sgd_scalar_kernel<L2, Momentum><<<grid_blocks(n), adamw_block_threads, 0, stream>>>(p, b, g, out, n, k);
  }
  STRATA_CUDA_TRY(cudaGetLastError());
}

template <class G, class H>
void dispatch_sgd(float* p, float* b, const G* g, H* out, std::size_t n, const sgd_step_params& k,
                  cudaStream_t stream) {
  if (k.l2) {
    if (k.has_momentum)
      launch_sgd<true, true>(p, b, g, out, n, k, stream);
    else
      launch_sgd<true, false>(p, b, g, out, n, k, stream);
  } else {
    if (k.has_momentum)
      launch_sgd<false, true>(p, b, g, out, n, k, stream);
    else
      launch_sgd<false, false>(p, b, g, out, n, k, stream);
  }
}

}  // namespace detail

/// The CUDA twin of strata::sgd_update_cpu: updates n parameters in device memory on `stream`.
/// momentum_buffer is used only when k.has_momentum (and not read on the first step); model_out
/// may be null (no model copy). Arrays that start 16-byte aligned (16-bit arrays: 8-byte) take
/// the vectorized kernel, others a scalar one with the same results. Launch errors throw
/// strata::cuda_error.
template <gradient_type G, class H = bf16>
  requires model_copy_type<H>
void sgd_update(float* master, float* momentum_buffer, const G* grad, H* model_out, std::size_t n,
                const sgd_step_params& k, cudaStream_t stream) {
  if (n == 0) return;
  STRATA_EXPECTS(master != nullptr && grad != nullptr && (!k.has_momentum || momentum_buffer != nullptr),
                 config_error, "cuda::sgd_update: missing master weights, gradients or momentum buffer");
  if (model_out == nullptr)
    detail::dispatch_sgd<G, detail::no_model_copy>(master, momentum_buffer, grad, nullptr, n, k, stream);
  else
    detail::dispatch_sgd<G, H>(master, momentum_buffer, grad, model_out, n, k, stream);
}

}  // namespace strata::cuda

namespace strata {

/// sgd_rule on CUDA: the update of parameters [at, at + n) of a state in device memory.
template <>
struct cuda_update<sgd_rule> {
  template <class G, class H>
  static void launch(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                     const sgd_step_params& k, cudaStream_t stream) {
    cuda::sgd_update<G, H>(v.master == nullptr ? nullptr : v.master + at,
                           k.has_momentum && v.arrays[0] != nullptr ? v.array<float>(0, at) : nullptr, grads,
                           model_out, n, k, stream);
  }
};

}  // namespace strata
