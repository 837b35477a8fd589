#pragma once
// The CUDA half of `strata-bench adamw` (adamw_cuda.cu, compiled only when CUDA is; then
// STRATA_BENCH_CUDA is 1).
#include <cstdint>
#include <string>

#ifndef STRATA_BENCH_CUDA
#define STRATA_BENCH_CUDA 0
#endif

namespace strata::bench {

/// One GPU measurement: best seconds per AdamW step and the device-to-device copy bandwidth
/// (read + write) measured in the same run, on the same device.
struct cuda_adamw_result {
  double seconds = 0;
  double d2d_copy_GBps = 0;
  std::string device_name;
};

/// Runs the CUDA AdamW kernel over n parameters (fp32 state, `grad` gradients, optional bf16
/// model copy), best of `reps`. Throws strata::cuda_error when no device is usable.
cuda_adamw_result cuda_adamw_bench(std::uint64_t n, const std::string& grad, bool model_copy, int reps);

}  // namespace strata::bench
