#pragma once
/// host_tier: objects in host memory under a byte budget. The fastest tier and the model of the
/// optimizer's host cache; pinned through CUDA when asked and a device is usable.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "strata/core/budget.hpp"
#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/host_memory.hpp"
#include "strata/core/units.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Options of a host_tier.
struct host_tier_options {
  std::string name = "host";
  /// Budget in bytes (whole pages per object count); exceeding it is a capacity_error.
  std::uint64_t capacity = unlimited_capacity;
  /// Declared bandwidths for placement (bytes/s); 0 = unknown.
  double read_bandwidth = 0;
  double write_bandwidth = 0;
  host_memory_request memory{};
};

/// Objects in host memory. Requests complete synchronously (the returned future is ready), so
/// it adds no thread hops. Growing an object reallocates it: write objects whole when possible.
class host_tier {
 public:
  explicit host_tier(host_tier_options o = {})
      : opts_(std::move(o)),
        kind_(resolve_host_memory(opts_.memory)),
        budget_(opts_.capacity, fmt::format("tier '{}'", opts_.name)) {}

  host_tier(const host_tier&) = delete;
  host_tier& operator=(const host_tier&) = delete;

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    return run_as_completion([&] {
      const std::uint64_t end = validate_write(opts_.name, object, offset, bytes.size());
      std::unique_lock lock(mutex_);
      auto it = objects_.find(object);
      const std::uint64_t old_size = it == objects_.end() ? 0 : it->second.size;
      if (it == objects_.end() || end > it->second.memory.size()) {
        // The old buffer goes right after the copy: the budget needs room for the new one only.
        const std::uint64_t old_cost = it == objects_.end() ? 0 : it->second.memory.cost();
        host_buffer grown = allocate_host(budget_, static_cast<std::size_t>(end), kind_,
                                          fmt::format("writing {} at offset {} of object '{}'",
                                                      format_size(bytes.size()), offset, object),
                                          old_cost);
        if (it != objects_.end()) {
          std::memcpy(grown.data(), it->second.memory.data(), old_size);
          it->second.memory = std::move(grown);
        } else {
          it = objects_.emplace(std::string(object), entry{std::move(grown), 0}).first;
        }
      }
      entry& e = it->second;
      e.size = std::max(old_size, end);
      lock.unlock();  // the copy needs no lock: requests on one object never overlap
      if (!bytes.empty()) std::memcpy(e.memory.data() + offset, bytes.data(), bytes.size());
    });
  }

  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    return run_as_completion([&] {
      std::shared_lock lock(mutex_);
      const auto it = objects_.find(object);
      const std::optional<std::uint64_t> size =
          it == objects_.end() ? std::nullopt : std::optional<std::uint64_t>(it->second.size);
      if (!size || offset > *size || dst.size() > *size - offset)
        throw out_of_range_error(opts_.name, object, offset, dst.size(), size);
      const std::byte* src = it->second.memory.data();
      lock.unlock();
      if (!dst.empty()) std::memcpy(dst.data(), src + offset, dst.size());
    });
  }

  bool remove(std::string_view object) {
    std::unique_lock lock(mutex_);
    const auto it = objects_.find(object);
    if (it == objects_.end()) return false;
    auto victim = std::move(it->second.memory);
    objects_.erase(it);
    lock.unlock();
    return true;  // victim's memory is freed here, outside the lock
  }

  /// Host memory needs no flushing.
  void flush() {}

  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const {
    std::shared_lock lock(mutex_);
    const auto it = objects_.find(object);
    if (it == objects_.end()) return std::nullopt;
    return it->second.size;
  }
  [[nodiscard]] std::uint64_t capacity() const { return opts_.capacity; }
  [[nodiscard]] std::uint64_t used() const { return budget_.used(); }
  [[nodiscard]] std::string_view name() const { return opts_.name; }
  [[nodiscard]] tier_descriptor descriptor() const {
    return {opts_.name, tier_kind::host, opts_.read_bandwidth, opts_.write_bandwidth, false};
  }
  /// What backs the objects on this machine (pinned only with a usable GPU).
  [[nodiscard]] host_memory_kind memory_kind() const noexcept { return kind_; }

 private:
  struct entry {
    host_buffer memory;
    std::uint64_t size;
  };
  host_tier_options opts_;
  host_memory_kind kind_;
  budget budget_;  // before the objects charged to it
  mutable std::shared_mutex mutex_;
  std::map<std::string, entry, std::less<>> objects_;
};

static_assert(tier<host_tier>);

}  // namespace strata
