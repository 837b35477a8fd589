#pragma once
/// host_executor<S>: the executor model without a GPU. Its "device" memory is separate host
/// memory, its three streams are `S` (host_stream, or host_stream under paced/jittered/faulty),
/// and its kernels (launch) are CPU code run on the compute stream, optionally paced to a
/// device's rate. A pipeline driven through it does everything it does on a GPU (copies in,
/// kernel, copies out, events between streams), so CI proves the ordering and the bit-identity;
/// with paced streams and a kernel rate it emulates a node's PCIe and GPU (strata-bench).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "strata/core/budget.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/host_memory.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/units.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_stream.hpp"

namespace strata {

/// Settings of a host_executor.
struct host_executor_options {
  std::string name = "host";
  std::uint64_t device_memory = unlimited_capacity;  ///< bytes of "device" memory it may hand out
  double kernel_rate = 0;          ///< parameters/s of the emulated device kernel (0: as fast as the CPU runs it)
  std::size_t kernel_threads = 1;  ///< CPU threads that run the kernel
  host_memory_request staging{};   ///< host memory its copies want (pageable: nothing to gain from pinning)
};

/// "Device" memory of a host_executor: host memory charged to the executor's device budget.
using host_device_buffer = charged<host_allocation>;

static_assert(device_buffer<host_device_buffer>);

template <class S = host_stream>
class host_executor {
 public:
  using stream_type = S;
  using device_buffer = host_device_buffer;
  /// Makes the stream of a role (for adaptors that need options: paced, jittered, faulty).
  using stream_factory = std::function<std::unique_ptr<S>(stream_role role, const std::string& name)>;

  /// Streams constructed from their names ("<name>.h2d", "<name>.compute", "<name>.d2h").
  explicit host_executor(host_executor_options o = {})
    requires std::constructible_from<S, std::string>
      : host_executor(std::move(o), [](stream_role, const std::string& n) { return std::make_unique<S>(n); }) {}

  /// Streams made by `make`.
  host_executor(host_executor_options o, const stream_factory& make)
      : opts_(std::move(o)), device_budget_(opts_.device_memory, fmt::format("host_executor '{}'", opts_.name)) {
    STRATA_EXPECTS(opts_.kernel_rate >= 0 && opts_.kernel_threads >= 1 && opts_.kernel_threads <= 1024, config_error,
                   "host_executor '{}': kernel_rate {} must not be negative and kernel_threads {} must be 1..1024",
                   opts_.name, opts_.kernel_rate, opts_.kernel_threads);
    for (const auto r : {stream_role::h2d, stream_role::compute, stream_role::d2h}) {
      streams_[static_cast<std::size_t>(r)] = make(r, fmt::format("{}.{}", opts_.name, to_string(r)));
      STRATA_EXPECTS(streams_[static_cast<std::size_t>(r)] != nullptr, config_error,
                     "host_executor '{}': the stream factory returned no {} stream", opts_.name, to_string(r));
    }
    if (opts_.kernel_threads > 1) pool_ = std::make_unique<thread_pool>(opts_.kernel_threads, opts_.name + "-kernel");
  }
  host_executor(const host_executor&) = delete;
  host_executor& operator=(const host_executor&) = delete;

  [[nodiscard]] S& h2d() noexcept { return *streams_[0]; }
  [[nodiscard]] S& compute() noexcept { return *streams_[1]; }
  [[nodiscard]] S& d2h() noexcept { return *streams_[2]; }
  [[nodiscard]] host_memory_request staging() const noexcept { return opts_.staging; }
  [[nodiscard]] std::uint64_t device_budget() const noexcept { return opts_.device_memory; }
  [[nodiscard]] std::uint64_t device_used() const noexcept { return device_budget_.used(); }
  [[nodiscard]] std::string_view name() const noexcept { return opts_.name; }
  [[nodiscard]] const host_executor_options& options() const noexcept { return opts_; }

  /// `bytes` of "device" memory (zeroed, charged in whole pages); capacity_error past the
  /// device budget. The executor must outlive its buffers.
  [[nodiscard]] host_device_buffer allocate_device(std::size_t bytes) {
    return allocate_host(device_budget_, bytes, host_memory_kind::pageable, "device memory");
  }

  /// Enqueues `kernel(pool)` on the compute stream as the executor's "device" kernel over `items`
  /// elements: it runs on the CPU (on `pool`, the executor's kernel threads, or null for the
  /// stream's own thread) and, with a kernel rate, the stream then waits until items / rate
  /// seconds have passed since it began, as a device of that rate would take.
  template <class Kernel>
  void launch(std::uint64_t items, Kernel kernel) {
    compute().enqueue_host([kernel = std::move(kernel), items, pool = pool_.get(), rate = opts_.kernel_rate]() mutable {
      const auto t0 = std::chrono::steady_clock::now();
      kernel(pool);
      if (rate > 0)
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(static_cast<double>(items) / rate)));
    });
  }

 private:
  host_executor_options opts_;
  budget device_budget_;
  std::unique_ptr<thread_pool> pool_;           // outlives the streams that use it
  std::unique_ptr<S> streams_[3];              // last: finish their work before the pool goes
};

static_assert(executor<host_executor<>>);

}  // namespace strata
