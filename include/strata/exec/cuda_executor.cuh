#pragma once
/// cuda_executor: the executor model on a GPU (exec/executor.hpp). Three cuda_streams (h2d,
/// compute, d2h), device memory from cudaMalloc under a byte budget, pinned host staging, and the
/// CUDA AdamW kernel (optim/adamw_cuda.cuh) on the compute stream. Include from .cu files
/// (compiled by nvcc): the kernel is device code.
///
/// basic_cuda_executor<S> takes its streams' type: cuda_stream, or cuda_stream under adaptors
/// (traced<cuda_stream> to see each stream's busy time). The kernel is launched on the native
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

#include "strata/core/cuda.hpp"
#include "strata/core/error.hpp"
#include "strata/core/units.hpp"
#include "strata/exec/cuda_stream.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/traced.hpp"
#include "strata/optim/adamw_cuda.cuh"
#include "strata/tier/tier.hpp"

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
  class device_buffer {
   public:
    device_buffer() = default;
    device_buffer(std::size_t bytes, std::shared_ptr<std::atomic<std::uint64_t>> used)
        : memory_(bytes), used_(std::move(used)) {}
    device_buffer(device_buffer&&) noexcept = default;
    device_buffer& operator=(device_buffer&& o) noexcept {
      if (this != &o) {
        release();
        memory_ = std::move(o.memory_);
        used_ = std::move(o.used_);
      }
      return *this;
    }
    ~device_buffer() { release(); }
    [[nodiscard]] std::byte* data() noexcept { return memory_.data(); }
    [[nodiscard]] std::size_t size() const noexcept { return memory_.size(); }

   private:
    void release() noexcept {
      if (used_) used_->fetch_sub(memory_.size());
      used_.reset();
      memory_ = cuda_device_buffer();
    }
    cuda_device_buffer memory_;
    std::shared_ptr<std::atomic<std::uint64_t>> used_;
  };

  /// Streams constructed from their names ("<name>.h2d", ...) and the device.
  explicit basic_cuda_executor(cuda_executor_options o = {})
    requires std::constructible_from<S, std::string, int>
      : basic_cuda_executor(std::move(o), [](stream_role, const std::string& n, int d) { return std::make_unique<S>(n, d); }) {}
  /// Streams made by `make`.
  basic_cuda_executor(cuda_executor_options o, const stream_factory& make)
      : opts_(std::move(o)), used_(std::make_shared<std::atomic<std::uint64_t>>(0)) {
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
  [[nodiscard]] std::uint64_t device_used() const noexcept { return used_->load(); }
  [[nodiscard]] std::string_view name() const noexcept { return opts_.name; }

  /// `bytes` of device memory; capacity_error past the budget, cuda_error when cudaMalloc fails.
  [[nodiscard]] device_buffer allocate_device(std::size_t bytes) {
    std::uint64_t used = used_->load();
    do {
      if (bytes > opts_.device_memory || used > opts_.device_memory - bytes)
        throw capacity_error(fmt::format("cuda_executor '{}': {} of device memory does not fit ({} of {} in use)",
                                         opts_.name, format_size(bytes), format_size(used),
                                         format_size(opts_.device_memory)),
                             bytes, opts_.device_memory > used ? opts_.device_memory - used : 0);
    } while (!used_->compare_exchange_weak(used, used + bytes));
    try {
      STRATA_CUDA_TRY(cudaSetDevice(opts_.device));
      return device_buffer(bytes, used_);
    } catch (...) {
      used_->fetch_sub(bytes);
      throw;
    }
  }

  /// Enqueues the CUDA AdamW kernel over `g` (device memory) on the compute stream.
  template <gradient_type G, class H>
  void enqueue_update(const adamw_group<G, H>& g, const adamw_step_params& k) {
    const std::size_t n = g.master.size();
    STRATA_EXPECTS(g.exp_avg.size() == n && g.exp_avg_sq.size() == n && g.grad.size() == n &&
                       (!k.amsgrad || g.max_exp_avg_sq.size() == n) && (g.model_out.empty() || g.model_out.size() == n),
                   config_error, "cuda_executor::enqueue_update: arrays of different lengths for {} parameters", n);
    STRATA_CUDA_TRY(cudaSetDevice(opts_.device));  // the kernel launches on the current device
    detail::launch_native(compute(), [&](cudaStream_t native) {
      cuda::adamw_update<G, H>(g.master.data(), g.exp_avg.data(), g.exp_avg_sq.data(),
                               k.amsgrad ? g.max_exp_avg_sq.data() : nullptr, g.grad.data(),
                               g.model_out.empty() ? nullptr : g.model_out.data(), n, k, native);
    });
  }

 private:
  cuda_executor_options opts_;
  std::shared_ptr<std::atomic<std::uint64_t>> used_;
  std::unique_ptr<S> streams_[3];
};

/// The executor on plain CUDA streams.
using cuda_executor = basic_cuda_executor<>;

static_assert(executor<cuda_executor>);
static_assert(executor<basic_cuda_executor<traced<cuda_stream>>>);

}  // namespace strata

#endif  // STRATA_HAS_CUDA
