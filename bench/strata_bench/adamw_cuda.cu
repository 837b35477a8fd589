// strata-bench adamw --device cuda: the CUDA kernel and the same-run device-to-device copy bound.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include <strata/core/cuda.hpp>
#include <strata/optim/adamw_cuda.cuh>

#include "adamw_bench.hpp"

namespace strata::bench {
namespace {

template <class G>
__global__ void fill_kernel(float* p, float* m, float* v, G* g, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<float>(i % 1000) * 1e-3f;
    m[i] = 0;
    v[i] = 0;
    g[i] = G(static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-4f);
  }
}

template <class G>
cuda_adamw_result run(std::uint64_t n, bool model_copy, int reps) {
  const auto avail = cuda_devices();
  if (avail.devices == 0) throw error("adamw --device cuda: " + avail.reason);
  cuda_adamw_result r;
  cudaDeviceProp prop{};
  STRATA_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  r.device_name = prop.name;
  float *p = nullptr, *m = nullptr, *v = nullptr;
  G* g = nullptr;
  bf16* out = nullptr;
  STRATA_CUDA_TRY(cudaMalloc(&p, n * 4));
  STRATA_CUDA_TRY(cudaMalloc(&m, n * 4));
  STRATA_CUDA_TRY(cudaMalloc(&v, n * 4));
  STRATA_CUDA_TRY(cudaMalloc(&g, n * sizeof(G)));
  STRATA_CUDA_TRY(cudaMalloc(&out, n * 2));
  cudaStream_t s{};
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  fill_kernel<<<1024, 256, 0, s>>>(p, m, v, g, n);
  STRATA_CUDA_TRY(cudaGetLastError());
  cudaEvent_t e0{}, e1{};
  STRATA_CUDA_TRY(cudaEventCreate(&e0));
  STRATA_CUDA_TRY(cudaEventCreate(&e1));
  const adamw_options o;
  double best = 1e30;
  for (int i = 0; i <= reps; ++i) {
    const auto k = make_adamw_step_params(o, i + 1, 1e-3);
    STRATA_CUDA_TRY(cudaEventRecord(e0, s));
    cuda::adamw_update(p, m, v, static_cast<float*>(nullptr), g, model_copy ? out : nullptr, n, k, s);
    STRATA_CUDA_TRY(cudaEventRecord(e1, s));
    STRATA_CUDA_TRY(cudaEventSynchronize(e1));
    float ms = 0;
    STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0) best = std::min(best, ms * 1e-3);
  }
  r.seconds = best;
  // The bound: a device-to-device copy as large as the kernel's traffic (read + write).
  const std::uint64_t copy_bytes = std::min<std::uint64_t>(n * 4, n * (24 + sizeof(G) + (model_copy ? 2 : 0)) / 2);
  double best_copy = 1e30;
  for (int i = 0; i <= reps; ++i) {
    STRATA_CUDA_TRY(cudaEventRecord(e0, s));
    STRATA_CUDA_TRY(cudaMemcpyAsync(m, p, copy_bytes, cudaMemcpyDeviceToDevice, s));
    STRATA_CUDA_TRY(cudaEventRecord(e1, s));
    STRATA_CUDA_TRY(cudaEventSynchronize(e1));
    float ms = 0;
    STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0) best_copy = std::min(best_copy, ms * 1e-3);
  }
  r.d2d_copy_GBps = 2.0 * static_cast<double>(copy_bytes) / best_copy / 1e9;
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  (void)cudaStreamDestroy(s);
  for (void* ptr : {static_cast<void*>(p), static_cast<void*>(m), static_cast<void*>(v), static_cast<void*>(g),
                    static_cast<void*>(out)})
    (void)cudaFree(ptr);
  return r;
}

}  // namespace

cuda_adamw_result cuda_adamw_bench(std::uint64_t n, const std::string& grad, bool model_copy, int reps) {
  if (grad == "fp32") return run<float>(n, model_copy, reps);
  if (grad == "bf16") return run<bf16>(n, model_copy, reps);
  return run<fp16>(n, model_copy, reps);
}

}  // namespace strata::bench
