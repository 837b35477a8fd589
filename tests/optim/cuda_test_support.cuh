#pragma once
// Shared helpers of the optim CUDA tests (adamw_cuda_test.cu, rules_cuda_test.cu): device arrays
// with room past their end (for sub-span offsets) and copies in and out on a stream.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "strata/core/cuda.hpp"

namespace strata_test {

template <class T>
struct device_array {
  T* ptr = nullptr;
  explicit device_array(std::size_t n) { STRATA_CUDA_TRY(cudaMalloc(&ptr, (n + 8) * sizeof(T))); }
  ~device_array() { (void)cudaFree(ptr); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
};

template <class T>
void put(T* dst, const std::vector<T>& src, cudaStream_t s) {
  STRATA_CUDA_TRY(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, s));
}
template <class T>
void get(std::vector<T>& dst, const T* src, cudaStream_t s) {
  STRATA_CUDA_TRY(cudaMemcpyAsync(dst.data(), src, dst.size() * sizeof(T), cudaMemcpyDeviceToHost, s));
}

}  // namespace strata_test
