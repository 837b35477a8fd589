#pragma once
/// The CUDA kernel of AdamW with 8-bit moments (optim/adamw_8bit_rule.hpp) and
/// adamw_8bit_rule's cuda_update, launched on a caller-given stream. Include from .cu files
/// (compiled by nvcc). One thread block per quantization block (256 threads, a parameter each):
/// dequantize, AdamW's element formula (strata::adamw_element with __fmul_rn/__fmaf_rn, as the
/// host), the block's absmax as the largest |value| bit pattern (a warp shuffle reduction: exact
/// in any order), and the nearest code by the same search as the host's, over the maps copied
/// into shared memory. Bit-identical to the host kernels.
///
/// Stream contract: every function only enqueues work on `stream` (no device synchronization);
/// pointers are device (or managed) memory that stays valid until the stream reaches the work.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "strata/core/cuda.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/optim/adamw_8bit_rule.hpp"
#include "strata/optim/adamw_cuda.cuh"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/quant8.hpp"
#include "strata/optim/update_rule.hpp"

namespace strata::cuda {

namespace detail {

// The signed and unsigned maps (one copy per translation unit, as every kernel here).
static __constant__ q8_map q8_device_maps[2] = {strata::detail::make_q8_map(true), strata::detail::make_q8_map(false)};

// The codes and scales of m, v (and max v with amsgrad), and which map each uses.
struct q8_device_arrays {
  std::uint8_t* code[3];
  float* scale[3];
};

constexpr unsigned q8_warps = q8_block_elems / 32;

// Blocks first + blockIdx.x of a state of `count` parameters, for the span [lo, hi) (gradients
// and model copy indexed from lo).
template <bool L2, bool Amsgrad, class G, class H>
__global__ void __launch_bounds__(q8_block_elems)
    adamw_8bit_kernel(q8_device_arrays s, float* p, const G* g, H* out, std::size_t count, std::size_t lo,
                      std::size_t hi, std::size_t first, const adamw_step_params k) {
  constexpr unsigned arrays = Amsgrad ? 3 : 2;
  __shared__ float value[2][q8_block_elems];
  __shared__ float threshold[2][q8_block_elems];
  __shared__ std::uint32_t warp_max[3][q8_warps];
  const unsigned t = threadIdx.x;
  for (unsigned m = 0; m < 2; ++m) {
    value[m][t] = q8_device_maps[m].value[t];
    threshold[m][t] = q8_device_maps[m].threshold[t];
  }
  __syncthreads();
  const std::size_t blk = first + blockIdx.x;
  const std::size_t i = blk * q8_block_elems + t;
  const bool here = i < count;
  float x[3] = {0, 0, 0};
  if (here)
    for (unsigned a = 0; a < arrays; ++a)
      x[a] = strata::detail::fp::fmul(value[a == 0 ? 0 : 1][s.code[a][i]], s.scale[a][blk]);
  if (here && i >= lo && i < hi) {
    float pi = p[i];
    adamw_element<L2, Amsgrad>(pi, x[0], x[1], x[2], widen(g[i - lo]), k);
    p[i] = pi;
    if constexpr (!std::is_same_v<H, no_model_copy>) out[i - lo] = narrow<H>(pi);
  }
  std::uint32_t bits[3] = {0, 0, 0};
  for (unsigned a = 0; a < arrays; ++a) {
    std::uint32_t b = here ? q8_abs_bits(x[a]) : 0u;
    for (unsigned off = 16; off >= 1; off >>= 1) b = max(b, __shfl_xor_sync(0xffffffffu, b, off));
    if (t % 32 == 0) warp_max[a][t / 32] = b;
  }
  __syncthreads();  // (every thread has read its old scale above)
  for (unsigned a = 0; a < arrays; ++a) {
    std::uint32_t b = 0;
    for (unsigned w = 0; w < q8_warps; ++w) b = max(b, warp_max[a][w]);
    bits[a] = b;
  }
  for (unsigned a = 0; a < arrays; ++a) {
    const float scale = __uint_as_float(bits[a]);
    const unsigned m = a == 0 ? 0 : 1;
    if (here)
      s.code[a][i] = bits[a] == 0 ? q8_device_maps[m].zero
                                  : q8_encode(threshold[m], strata::detail::fp::fdiv(x[a], scale));
    if (t == 0) s.scale[a][blk] = scale;
  }
}

template <bool L2, bool Amsgrad, class G, class H>
void launch_adamw_8bit(const q8_device_arrays& s, float* p, const G* g, H* out, std::size_t count, std::size_t at,
                       std::size_t n, const adamw_step_params& k, cudaStream_t stream) {
  const std::size_t first = at / q8_block_elems, last = (at + n - 1) / q8_block_elems + 1;
  adamw_8bit_kernel<L2, Amsgrad, G, H><<<static_cast<unsigned>(last - first), q8_block_elems, 0, stream>>>(
      s, p, g, out, count, at, at + n, first, k);
  STRATA_CUDA_TRY(cudaGetLastError());
}

template <class G, class H>
void launch_adamw_8bit(const q8_device_arrays& s, float* p, const G* g, H* out, std::size_t count, std::size_t at,
                       std::size_t n, const adamw_step_params& k, cudaStream_t stream) {
  if (k.l2) {
    if (k.amsgrad)
      launch_adamw_8bit<true, true>(s, p, g, out, count, at, n, k, stream);
    else
      launch_adamw_8bit<true, false>(s, p, g, out, count, at, n, k, stream);
  } else {
    if (k.amsgrad)
      launch_adamw_8bit<false, true>(s, p, g, out, count, at, n, k, stream);
    else
      launch_adamw_8bit<false, false>(s, p, g, out, count, at, n, k, stream);
  }
}

}  // namespace detail

}  // namespace strata::cuda

namespace strata {

/// adamw_8bit_rule on CUDA: the update of parameters [at, at + n) of a state in device memory
/// (every quantization block the span touches is requantized, as on the host).
template <>
struct cuda_update<adamw_8bit_rule> {
  template <class G, class H>
  static void launch(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                     const adamw_step_params& k, cudaStream_t stream) {
    if (n == 0) return;
    STRATA_EXPECTS(v.master != nullptr && v.scales[0] != nullptr && v.scales[1] != nullptr && grads != nullptr &&
                       (!k.amsgrad || v.scales[2] != nullptr),
                   config_error, "cuda_update<adamw_8bit_rule>: missing master weights, moments, scales or gradients");
    STRATA_EXPECTS(at <= v.count && n <= v.count - at, config_error,
                   "cuda_update<adamw_8bit_rule>: parameters [{}, {}) pass the state's {}", at, at + n, v.count);
    const cuda::detail::q8_device_arrays s{
        {v.array<std::uint8_t>(0), v.array<std::uint8_t>(1), k.amsgrad ? v.array<std::uint8_t>(2) : nullptr},
        {v.scales[0], v.scales[1], k.amsgrad ? v.scales[2] : nullptr}};
    if (model_out == nullptr)
      cuda::detail::launch_adamw_8bit<G, detail::no_model_copy>(s, v.master, grads, nullptr, v.count, at, n, k, stream);
    else
      cuda::detail::launch_adamw_8bit<G, H>(s, v.master, grads, model_out, v.count, at, n, k, stream);
  }
};

}  // namespace strata
