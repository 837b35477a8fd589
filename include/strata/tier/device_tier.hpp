#pragma once
/// device_tier<Exec>: objects in an executor's device memory (GPU memory with cuda_executor,
/// separate "device" buffers with host_executor), under a byte budget: the top tier of a
/// hierarchy, above pinned host memory. Writes are host-to-device copies on the executor's h2d
/// stream, reads device-to-host copies on its d2h stream; a request completes when its stream
/// has run the copy, so no thread waits for it.
///
/// The tier owns its executor (its own streams and its own device budget), so its traffic never
/// queues behind a pipeline's updates and the device memory it holds is accounted separately:
/// give the pipeline's executor and the tier budgets that together fit the device.
///
/// Growing an object reallocates it and moves the old bytes through host memory (device-to-host
/// then host-to-device, in stream order): write objects whole when possible. Freed buffers are
/// released once the copies that use them have run. For full-speed, truly asynchronous copies
/// on a GPU, the caller's host buffers should be pinned (cudaHostAlloc, or host_tier's pinned
/// memory); pageable buffers work but the driver stages them.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/budget.hpp"
#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/host_memory.hpp"
#include "strata/core/units.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Options of a device_tier.
struct device_tier_options {
  std::string name = "device";
  /// Budget in bytes (objects are charged in whole 4 KiB units); the executor's own device budget
  /// also applies. Exceeding either is a capacity_error.
  std::uint64_t capacity = unlimited_capacity;
  /// Declared bandwidths for placement (bytes/s; 0 = unknown): the PCIe link's, typically.
  double read_bandwidth = 0;
  double write_bandwidth = 0;
};

/// See the file comment. Thread-safe: requests may come from any threads (the executor's streams
/// are driven under one lock).
template <executor Exec>
class device_tier {
 public:
  using executor_type = Exec;
  /// Unit of the budget: objects are charged in whole units.
  static constexpr std::uint64_t unit = 4096;

  /// A tier over an executor constructed in place from `exec_args`.
  template <class... ExecArgs>
  explicit device_tier(device_tier_options o, ExecArgs&&... exec_args)
      : opts_(std::move(o)),
        exec_(std::forward<ExecArgs>(exec_args)...),
        budget_(opts_.capacity, fmt::format("tier '{}'", opts_.name)) {}

  device_tier(const device_tier&) = delete;
  device_tier& operator=(const device_tier&) = delete;

  /// Waits for every copy in flight, then frees the device memory.
  ~device_tier() {
    std::lock_guard lock(mutex_);
    drain_locked();
    objects_.clear();
  }

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    try {
      const std::uint64_t end = validate_write(opts_.name, object, offset, bytes.size());
      std::lock_guard lock(mutex_);
      clear_faults_locked();
      release_locked(false);
      auto it = objects_.find(object);
      if (it == objects_.end() || end > it->second.allocated) it = grow_locked(object, it, end);
      entry& e = it->second;
      e.size = std::max(e.size, end);
      if (!bytes.empty())
        exec_.h2d().copy_to_device(std::span<std::byte>(e.memory->data() + offset, bytes.size()), bytes);
      return watched(exec_.h2d().record().completion(), h2d_faulted_);
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    try {
      std::lock_guard lock(mutex_);
      const auto it = objects_.find(object);
      const std::optional<std::uint64_t> size =
          it == objects_.end() ? std::nullopt : std::optional<std::uint64_t>(it->second.size);
      if (!size || offset > *size || dst.size() > *size - offset)
        throw out_of_range_error(opts_.name, object, offset, dst.size(), size);
      if (dst.empty()) return make_ready_completion();
      clear_faults_locked();
      exec_.d2h().copy_to_host(dst, std::span<const std::byte>(it->second.memory->data() + offset, dst.size()));
      return watched(exec_.d2h().record().completion(), d2h_faulted_);
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  /// Deletes an object; its memory is released once copies already enqueued on it have run.
  bool remove(std::string_view object) {
    std::lock_guard lock(mutex_);
    const auto it = objects_.find(object);
    if (it == objects_.end()) return false;
    budget_.refund(it->second.allocated);
    retire_locked(std::move(it->second.memory), nullptr);
    objects_.erase(it);
    return true;
  }

  /// Waits until every write issued before it has landed in device memory (device memory is as
  /// durable as this tier gets). Failed writes were reported through their own futures.
  void flush() {
    completion h2d, d2h;
    {
      std::lock_guard lock(mutex_);
      h2d = exec_.h2d().record().completion();
      d2h = exec_.d2h().record().completion();
    }
    h2d.wait();
    d2h.wait();
    std::lock_guard lock(mutex_);
    clear_faults_locked();
    release_locked(false);
  }

  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const {
    std::lock_guard lock(mutex_);
    const auto it = objects_.find(object);
    if (it == objects_.end()) return std::nullopt;
    return it->second.size;
  }
  [[nodiscard]] std::uint64_t capacity() const { return std::min(opts_.capacity, exec_.device_budget()); }
  [[nodiscard]] std::uint64_t used() const { return budget_.used(); }
  [[nodiscard]] std::string_view name() const { return opts_.name; }
  [[nodiscard]] tier_descriptor descriptor() const {
    return {opts_.name, tier_kind::device, opts_.read_bandwidth, opts_.write_bandwidth, false};
  }
  /// The executor whose memory and streams the tier uses.
  [[nodiscard]] const Exec& executor() const noexcept { return exec_; }

 private:
  using buffer = typename Exec::device_buffer;
  struct entry {
    std::unique_ptr<buffer> memory;  // null while the object is empty
    std::uint64_t size = 0;
    std::uint64_t allocated = 0;  // bytes charged to the budget (whole units)
  };
  /// Memory that copies in flight may still use, freed once `done` completed.
  struct retired {
    completion done;
    std::unique_ptr<buffer> memory;
    std::unique_ptr<host_allocation> bounce;
  };

  /// Replaces the object's memory by one of at least `end` bytes holding its old bytes.
  auto grow_locked(std::string_view object, typename std::map<std::string, entry, std::less<>>::iterator it,
                   std::uint64_t end) {
    const std::uint64_t old_charge = it == objects_.end() ? 0 : it->second.allocated;
    const std::uint64_t new_charge = round_up(end, unit);
    // The old memory is retired right after: the tier's budget needs room for the new one only.
    budget_.charge(new_charge, fmt::format("writing up to byte {} of object '{}'", end, object), old_charge);
    struct refund_unless_kept {
      budget& b;
      std::uint64_t bytes;
      bool kept = false;
      ~refund_unless_kept() {
        if (!kept) b.refund(bytes);
      }
    } charge{budget_, new_charge};
    auto grown = std::make_unique<buffer>(allocate_locked(new_charge));
    if (it == objects_.end()) it = objects_.emplace(std::string(object), entry{}).first;
    entry& e = it->second;
    if (e.memory && e.size > 0) {
      // The streams have no device-to-device copy: the old bytes go through host memory, in
      // stream order (h2d waits for the d2h copy), without blocking the caller.
      auto bounce = std::make_unique<host_allocation>(e.size, resolve_host_memory(exec_.staging()));
      const std::span<std::byte> via(bounce->data(), e.size);
      exec_.d2h().copy_to_host(via, std::span<const std::byte>(e.memory->data(), e.size));
      const auto landed = exec_.d2h().record();
      (void)watched(landed.completion(), d2h_faulted_);  // a failure here must be cleared too
      exec_.h2d().wait(landed);
      exec_.h2d().copy_to_device(std::span<std::byte>(grown->data(), e.size), via);
      retire_locked(std::move(e.memory), std::move(bounce));
    } else if (e.memory) {
      retire_locked(std::move(e.memory), nullptr);
    }
    e.memory = std::move(grown);
    e.allocated = new_charge;
    charge.kept = true;
    budget_.refund(old_charge);
    return it;
  }

  /// Device memory from the executor; when its budget is taken by memory waiting to be freed,
  /// waits for that memory and tries once more.
  buffer allocate_locked(std::uint64_t bytes) {
    try {
      return exec_.allocate_device(static_cast<std::size_t>(bytes));
    } catch (const capacity_error&) {
      if (retired_.empty()) throw;
    }
    release_locked(true);
    return exec_.allocate_device(static_cast<std::size_t>(bytes));
  }

  /// Frees `memory` (and the bounce buffer) once both streams have run what was enqueued so far.
  void retire_locked(std::unique_ptr<buffer> memory, std::unique_ptr<host_allocation> bounce) {
    if (!memory && !bounce) return;
    auto done = when_all(std::vector<completion>{exec_.h2d().record().completion(), exec_.d2h().record().completion()});
    retired_.push_back(retired{std::move(done), std::move(memory), std::move(bounce)});
  }

  /// Frees retired memory whose copies have run (all of it, waiting, with `wait`).
  void release_locked(bool wait) noexcept {
    std::erase_if(retired_, [wait](const retired& r) {
      if (wait) r.done.wait();
      return r.done.ready();
    });
  }

  /// Waits for both streams and frees every retired buffer (the destructor's path).
  void drain_locked() noexcept {
    for (auto* s : {&exec_.h2d(), &exec_.d2h()}) {
      try {
        s->sync();
      } catch (...) {  // reported by the failed request's own future
      }
    }
    release_locked(true);
  }

  /// After a failed copy a stream fails everything recorded later until sync(); the failure was
  /// delivered to its request, so the next request clears it (after the work before it ran).
  void clear_faults_locked() noexcept {
    for (auto [flag, s] : {std::pair{h2d_faulted_.get(), &exec_.h2d()}, std::pair{d2h_faulted_.get(), &exec_.d2h()}}) {
      if (!flag->exchange(false)) continue;
      try {
        s->sync();
      } catch (...) {
      }
    }
  }

  static completion watched(completion c, const std::shared_ptr<std::atomic<bool>>& flag) {
    c.on_complete([flag](std::exception_ptr e) {
      if (e) flag->store(true);
    });
    return c;
  }

  device_tier_options opts_;
  Exec exec_;
  budget budget_;  // the tier's own capacity (the executor's device budget applies too)
  mutable std::mutex mutex_;
  std::map<std::string, entry, std::less<>> objects_;
  std::vector<retired> retired_;
  std::shared_ptr<std::atomic<bool>> h2d_faulted_ = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<bool>> d2h_faulted_ = std::make_shared<std::atomic<bool>>(false);
};

static_assert(tier<device_tier<host_executor<>>>);

}  // namespace strata
