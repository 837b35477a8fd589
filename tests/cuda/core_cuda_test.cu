// Needs a GPU (label `cuda`): strata's core types work with device memory and streams.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "strata/core/aligned_buffer.hpp"
#include "strata/core/cuda.hpp"

namespace {
__global__ void iota_kernel(std::uint32_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t{blockDim.x} * gridDim.x)
    out[i] = static_cast<std::uint32_t>(i * 3U);
}
}  // namespace

TEST_CASE("a kernel's output copied into an aligned host buffer on a stream arrives intact") {
  constexpr std::size_t n = (1U << 20) + 17;
  std::uint32_t* d = nullptr;
  STRATA_CUDA_TRY(cudaMalloc(&d, n * sizeof(std::uint32_t)));
  cudaStream_t s{};
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  iota_kernel<<<256, 256, 0, s>>>(d, n);
  STRATA_CUDA_TRY(cudaGetLastError());
  strata::direct_io_buffer host(n * sizeof(std::uint32_t));
  STRATA_CUDA_TRY(cudaMemcpyAsync(host.data(), d, host.size(), cudaMemcpyDeviceToHost, s));
  STRATA_CUDA_TRY(cudaStreamSynchronize(s));
  const auto v = host.as<std::uint32_t>();
  bool all = true;
  for (std::size_t i = 0; i < n; ++i) all = all && v[i] == static_cast<std::uint32_t>(i * 3U);
  CHECK(all);
  STRATA_CUDA_TRY(cudaStreamDestroy(s));
  STRATA_CUDA_TRY(cudaFree(d));
}

TEST_CASE("an impossible allocation is a cuda_error, and the device stays usable") {
  void* p = nullptr;
  CHECK_THROWS_AS(STRATA_CUDA_TRY(cudaMalloc(&p, std::size_t{1} << 60)), strata::cuda_error);
  STRATA_CUDA_TRY(cudaMalloc(&p, 1024));
  STRATA_CUDA_TRY(cudaFree(p));
}
