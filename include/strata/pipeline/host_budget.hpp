#pragma once
/// host_budget: the accounting allocator of a subgroup pipeline and offloaded_adamw. Every host
/// buffer they own comes from here, so "host memory never exceeds the budget" is checked at each allocation and
/// provable from used()/peak() in tests.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/units.hpp"
#include "strata/tier/host_memory.hpp"

namespace strata {

class host_budget;

/// A host allocation charged to a host_budget; gives its bytes back when destroyed.
class budgeted_allocation {
 public:
  budgeted_allocation() noexcept = default;
  budgeted_allocation(budgeted_allocation&& o) noexcept
      : memory_(std::move(o.memory_)), budget_(std::exchange(o.budget_, nullptr)) {}
  budgeted_allocation& operator=(budgeted_allocation&& o) noexcept {
    if (this != &o) {
      release();
      memory_ = std::move(o.memory_);
      budget_ = std::exchange(o.budget_, nullptr);
    }
    return *this;
  }
  budgeted_allocation(const budgeted_allocation&) = delete;
  budgeted_allocation& operator=(const budgeted_allocation&) = delete;
  ~budgeted_allocation() { release(); }

  [[nodiscard]] std::byte* data() noexcept { return memory_.data(); }
  [[nodiscard]] const std::byte* data() const noexcept { return memory_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return memory_.size(); }
  /// Bytes charged to the budget (whole pages).
  [[nodiscard]] std::size_t footprint() const noexcept { return memory_.footprint(); }

 private:
  friend class host_budget;
  budgeted_allocation(host_allocation m, host_budget* b) noexcept : memory_(std::move(m)), budget_(b) {}
  inline void release() noexcept;
  host_allocation memory_;
  host_budget* budget_ = nullptr;
};

/// Host memory charged against a limit. Not thread-safe (its owner serializes allocations).
/// Must outlive its allocations (the budget's owner declares it before them).
class host_budget {
 public:
  explicit host_budget(std::uint64_t limit, host_memory_request request = {}) noexcept
      : limit_(limit), kind_(resolve_host_memory(request)) {}
  host_budget(const host_budget&) = delete;
  host_budget& operator=(const host_budget&) = delete;

  /// Page-rounded size that `bytes` costs.
  [[nodiscard]] static std::uint64_t footprint(std::uint64_t bytes) noexcept {
    return (bytes + host_allocation::page - 1) / host_allocation::page * host_allocation::page;
  }

  /// Allocates `bytes` (zeroed) for `what`; capacity_error naming `what` when the budget cannot hold it.
  [[nodiscard]] budgeted_allocation allocate(std::uint64_t bytes, std::string_view what) {
    const std::uint64_t fp = footprint(bytes);
    if (fp > limit_ || used_ > limit_ - fp)
      throw capacity_error(fmt::format("host memory budget: {} for {} does not fit ({} of {} in use)",
                                       format_size(fp), what, format_size(used_), format_size(limit_)),
                           fp, limit_ > used_ ? limit_ - used_ : 0);
    host_allocation m(static_cast<std::size_t>(bytes), kind_);
    used_ += m.footprint();
    peak_ = std::max(peak_, used_);
    return budgeted_allocation(std::move(m), this);
  }

  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::uint64_t used() const noexcept { return used_; }
  [[nodiscard]] std::uint64_t peak() const noexcept { return peak_; }

 private:
  friend class budgeted_allocation;
  std::uint64_t limit_;
  host_memory_kind kind_;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
};

inline void budgeted_allocation::release() noexcept {
  if (budget_ != nullptr) budget_->used_ -= memory_.footprint();
  budget_ = nullptr;
  memory_ = host_allocation();
}

}  // namespace strata
