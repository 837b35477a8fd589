#pragma once
/// host_executor<S>: the executor model without a GPU. Its "device" memory is separate host
/// memory, its three streams are `S` (host_stream, or host_stream under paced/jittered/faulty),
/// and its kernel is the CPU AdamW kernel run on the compute stream, optionally paced to a
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

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/units.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_stream.hpp"
#include "strata/optim/adamw_cpu.hpp"
#include "strata/tier/host_memory.hpp"
#include "strata/tier/tier.hpp"

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
class host_device_buffer {
 public:
  host_device_buffer() = default;
  host_device_buffer(std::size_t bytes, std::shared_ptr<std::atomic<std::uint64_t>> used)
      : memory_(bytes, host_memory_kind::pageable), used_(std::move(used)) {}
  host_device_buffer(host_device_buffer&&) noexcept = default;
  host_device_buffer& operator=(host_device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      memory_ = std::move(o.memory_);
      used_ = std::move(o.used_);
    }
    return *this;
  }
  ~host_device_buffer() { release(); }

  [[nodiscard]] std::byte* data() noexcept { return memory_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return memory_.size(); }

 private:
  void release() noexcept {
    if (used_) used_->fetch_sub(memory_.footprint());
    used_.reset();
    memory_ = host_allocation();
  }
  host_allocation memory_;
  std::shared_ptr<std::atomic<std::uint64_t>> used_;
};

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
      : opts_(std::move(o)), used_(std::make_shared<std::atomic<std::uint64_t>>(0)) {
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
  [[nodiscard]] std::uint64_t device_used() const noexcept { return used_->load(); }
  [[nodiscard]] std::string_view name() const noexcept { return opts_.name; }
  [[nodiscard]] const host_executor_options& options() const noexcept { return opts_; }

  /// `bytes` of "device" memory (zeroed); capacity_error past the device budget.
  [[nodiscard]] host_device_buffer allocate_device(std::size_t bytes) {
    const std::uint64_t fp = (bytes + host_allocation::page - 1) / host_allocation::page * host_allocation::page;
    std::uint64_t used = used_->load();
    do {
      if (fp > opts_.device_memory || used > opts_.device_memory - fp)
        throw capacity_error(fmt::format("host_executor '{}': {} of device memory does not fit ({} of {} in use)",
                                         opts_.name, format_size(fp), format_size(used),
                                         format_size(opts_.device_memory)),
                             fp, opts_.device_memory > used ? opts_.device_memory - used : 0);
    } while (!used_->compare_exchange_weak(used, used + fp));
    try {
      return host_device_buffer(bytes, used_);
    } catch (...) {
      used_->fetch_sub(fp);
      throw;
    }
  }

  /// Enqueues the CPU kernel over `g` on the compute stream; with a kernel rate, the stream then
  /// waits until n / rate seconds have passed since the kernel began.
  template <gradient_type G, class H>
  void enqueue_update(const adamw_group<G, H>& g, const adamw_step_params& k) {
    compute().enqueue_host([g, k, pool = pool_.get(), rate = opts_.kernel_rate] {
      const auto t0 = std::chrono::steady_clock::now();
      adamw_update_cpu<G, H>(g.master, g.exp_avg, g.exp_avg_sq, g.max_exp_avg_sq, g.grad, g.model_out, k, pool);
      if (rate > 0)
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(static_cast<double>(g.master.size()) / rate)));
    });
  }

 private:
  host_executor_options opts_;
  std::shared_ptr<std::atomic<std::uint64_t>> used_;
  std::unique_ptr<thread_pool> pool_;           // outlives the streams that use it
  std::unique_ptr<S> streams_[3];              // last: finish their work before the pool goes
};

static_assert(executor<host_executor<>>);

}  // namespace strata
