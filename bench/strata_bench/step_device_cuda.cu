// strata-bench step --device cuda (see step_device.hpp): cuda_executor on traced CUDA streams.
#include <memory>
#include <string>

#include <fmt/format.h>
#include <strata/exec/cuda_executor.cuh>
#include <strata/exec/traced.hpp>

#include "step_device.hpp"

namespace strata::bench {

int run_device_cuda(const device_step_config& c, std::uint64_t device_memory) {
  using stream_type = traced<cuda_stream>;
  int count = 0;
  if (const cudaError_t rc = cudaGetDeviceCount(&count); rc != cudaSuccess || count == 0)
    throw usage_error(fmt::format("step --device cuda: no usable CUDA device (cudaGetDeviceCount: {})",
                                  rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices"));
  basic_cuda_executor<stream_type> exec({.name = "cuda", .device_memory = device_memory},
                                        [&](stream_role, const std::string& name, int device) {
                                          return std::make_unique<stream_type>(c.trace, name, device);
                                        });
  // The bound takes the PCIe and kernel rates measured before the runs (no exact floors on a GPU).
  return run_device_steps(c, exec, "cuda", device_bound_rates{});
}

}  // namespace strata::bench
