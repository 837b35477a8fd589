// strata-bench step --device sim (see step_device.hpp), and --device cuda's stand-in when
// strata-bench was built without CUDA.
#include <memory>
#include <string>

#include <strata/exec/host_executor.hpp>
#include <strata/exec/host_stream.hpp>
#include <strata/exec/paced.hpp>
#include <strata/exec/traced.hpp>

#include "step_device.hpp"

namespace strata::bench {

int run_device_sim(const device_step_config& c, double h2d, double d2h, double device_rate, std::uint64_t device_memory) {
  using stream_type = traced<paced<host_stream>>;
  // One link for the executor's three streams: copies of one direction share its bandwidth, as on PCIe.
  const auto link = std::make_shared<pace_link>(pace_options{.h2d_bandwidth = h2d, .d2h_bandwidth = d2h});
  host_executor<stream_type> exec({.name = "sim", .device_memory = device_memory, .kernel_rate = device_rate},
                                  [&](stream_role, const std::string& name) {
                                    return std::make_unique<stream_type>(c.trace, link, name);
                                  });
  return run_device_steps(c, exec, "sim", device_bound_rates{h2d, d2h, device_rate, true});
}

#if !STRATA_BENCH_CUDA
int run_device_cuda(const device_step_config&, std::uint64_t) {
  throw usage_error("step: --device cuda: this strata-bench was built without CUDA (no nvcc at configure time)");
}
#endif

}  // namespace strata::bench
