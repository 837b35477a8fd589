#pragma once
/// Checked CUDA runtime calls and device discovery. Compiles without CUDA (STRATA_HAS_CUDA=0):
/// then no device is ever found, and code paths that need one are skipped at run time.

#include <string>

#include "strata/core/config.hpp"
#include "strata/core/error.hpp"

#if STRATA_HAS_CUDA
#include <cuda_runtime_api.h>

namespace strata::detail {
inline void throw_cuda_error(cudaError_t rc, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // reset the non-sticky error state so later calls start clean
  throw cuda_error(static_cast<int>(rc), cudaGetErrorName(rc), cudaGetErrorString(rc), expr, file, line);
}
}  // namespace strata::detail

/// Evaluates a CUDA runtime call and throws strata::cuda_error naming the call when it fails.
#define STRATA_CUDA_TRY(...)                                                            \
  do {                                                                                  \
    const cudaError_t strata_cuda_rc_ = (__VA_ARGS__);                                  \
    if (strata_cuda_rc_ != cudaSuccess) [[unlikely]]                                    \
      ::strata::detail::throw_cuda_error(strata_cuda_rc_, #__VA_ARGS__, __FILE__, __LINE__); \
  } while (false)
#endif

namespace strata {

/// Whether CUDA devices can be used here, and if not, why.
struct cuda_availability {
  int devices = 0;     ///< usable devices (0 when none)
  std::string reason;  ///< why none is usable; empty when devices > 0
};

/// Asks the CUDA runtime for devices. Never throws: no driver or no device is a normal answer.
[[nodiscard]] inline cuda_availability cuda_devices() noexcept {
#if STRATA_HAS_CUDA
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    try {
      return {0, std::string("cudaGetDeviceCount: ") + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")"};
    } catch (...) {
      return {0, {}};
    }
  }
  if (n == 0) return {0, "cudaGetDeviceCount found no device"};
  return {n, {}};
#else
  try {
    return {0, "strata was built without CUDA (STRATA_HAS_CUDA=0)"};
  } catch (...) {
    return {0, {}};
  }
#endif
}

}  // namespace strata
