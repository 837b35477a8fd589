#pragma once
/// cuda_executor: the executor model on a GPU (exec/executor.hpp). Three cuda_streams (h2d,
/// compute, d2h), device memory from cudaMalloc under a byte budget, pinned host staging, and
/// launch(), which enqueues a caller's kernel launch on the compute stream. Include from .cu
/// files (compiled by nvcc).
///
/// basic_cuda_executor<S> takes its streams' type: cuda_stream, or cuda_stream under adaptors
/// (traced<cuda_stream> to see each stream's busy time). Kernels are launched on the native
/// stream beneath the adaptors, through an adaptor's bracket() where it has one.

#include "strata/core/config.hpp"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <functional>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "strata/core/budget.hpp"
#include "strata/core/cuda.hpp"
#include "strata/core/error.hpp"
#include "strata/core/units.hpp"
#include "strata/exec/cuda_stream.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/traced.hpp"

namespace strata {

/// Settings of a cuda_executor.
struct cuda_executor_options {
  std::string name = "cuda";
  int device = 0;
  /// Device bytes the executor may hand out; unlimited_capacity: what cudaMalloc gives.
  std::uint64_t device_memory = unlimited_capacity;
};

namespace detail {

/// The CUDA stream beneath any stack of adaptors.
template <class S>
cudaStream_t native_stream(S& s) {
  if constexpr (requires { { s.native() } -> std::same_as<cudaStream_t>; })
    return s.native();
  else
    return native_stream(s.inner());
}

struct no_work {
  void operator()() const noexcept {}
};

/// Enqueues `launch(native stream)` on `s`, measured by the adaptor when it can bracket work.
template <class S, class F>
void launch_native(S& s, F&& launch) {
  if constexpr (requires { s.bracket(stream_op::task, std::size_t{0}, no_work{}); })
    s.bracket(stream_op::task, 0, [&] { launch(native_stream(s.inner())); });
  else
    launch(native_stream(s));
}

}  // namespace detail

template <class S = cuda_stream>
class basic_cuda_executor {
 public:
  using stream_type = S;
  /// Makes the stream of a role on a device (for adaptors that need arguments, e.g. traced's tracer).
  using stream_factory = std::function<std::unique_ptr<S>(stream_role role, const std::string& name, int device)>;

  /// Device memory charged to this executor's budget.
  using device_buffer = charged<cuda_device_buffer>;

  /// Streams constructed from their names ("<name>.h2d", ...) and the device.
  explicit basic_cuda_executor(cuda_executor_options o = {})
    requires std::constructible_from<S, std::string, int>
      : basic_cuda_executor(std::move(o), [](stream_role, const std::string& n, int d) { return std::make_unique<S>(n, d); }) {}
  /// Streams made by `make`.
  basic_cuda_executor(cuda_executor_options o, const stream_factory& make)
      : opts_(std::move(o)), device_budget_(opts_.device_memory, fmt::format("cuda_executor '{}'", opts_.name)) {
    for (const auto r : {stream_role::h2d, stream_role::compute, stream_role::d2h}) {
      streams_[static_cast<std::size_t>(r)] = make(r, fmt::format("{}.{}", opts_.name, to_string(r)), opts_.device);
      STRATA_EXPECTS(streams_[static_cast<std::size_t>(r)] != nullptr, config_error,
                     "cuda_executor '{}': the stream factory returned no {} stream", opts_.name, to_string(r));
    }
  }
  basic_cuda_executor(const basic_cuda_executor&) = delete;
  basic_cuda_executor& operator=(const basic_cuda_executor&) = delete;

  [[nodiscard]] S& h2d() noexcept { return *streams_[0]; }
  [[nodiscard]] S& compute() noexcept { return *streams_[1]; }
  [[nodiscard]] S& d2h() noexcept { return *streams_[2]; }
  [[nodiscard]] int device() const noexcept { return opts_.device; }
  /// Copies between the GPU and pageable memory are staged by the driver; pinned ones run at
  /// full PCIe speed and truly asynchronously.
  [[nodiscard]] host_memory_request staging() const noexcept { return {.pinned_if_available = true}; }
  [[nodiscard]] std::uint64_t device_budget() const noexcept { return opts_.device_memory; }
  [[nodiscard]] std::uint64_t device_used() const noexcept { return device_budget_.used(); }
  [[nodiscard]] std::string_view name() const noexcept { return opts_.name; }

  /// `bytes` of device memory; capacity_error past the budget, cuda_error when cudaMalloc fails.
  /// The executor must outlive its buffers.
  [[nodiscard]] device_buffer allocate_device(std::size_t bytes) {
    STRATA_CUDA_TRY(cudaSetDevice(opts_.device));
    return device_buffer(device_budget_, {bytes, "device memory"}, bytes);
  }

  /// Enqueues `launch(cudaStream_t)` (a kernel launch on the given native stream) on the compute
  /// stream, on this executor's device; a launch error is a cuda_error naming the launch.
  template <class Launch>
  void launch(Launch&& launch) {
    STRATA_CUDA_TRY(cudaSetDevice(opts_.device));  // kernels launch on the current device
    detail::launch_native(compute(), std::forward<Launch>(launch));
  }

 private:
  cuda_executor_options opts_;
  budget device_budget_;
  std::unique_ptr<S> streams_[3];
};

/// The executor on plain CUDA streams.
using cuda_executor = basic_cuda_executor<>;

static_assert(executor<cuda_executor>);
static_assert(executor<basic_cuda_executor<traced<cuda_stream>>>);

}  // namespace strata

#endif  // STRATA_HAS_CUDA
