#pragma once
/// Budgets: a byte limit that allocations are charged against, and `charged<Buffer>`, a buffer
/// whose cost is charged for its lifetime. Every budgeted allocation of strata goes through these
/// two (host slots and the gradient store under an optimizer's host budget, an executor's device
/// memory, a host or device tier's objects), so "never more than the budget" is checked in one
/// place, before the memory is taken, and provable from used() and peak().
///
/// `host_budget` is a budget over host memory of one kind (pinned when the executor's copies want
/// it): its allocate() returns a charged<host_allocation>.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/host_memory.hpp"
#include "strata/core/units.hpp"

namespace strata {

/// A byte limit with what is charged against it now and at most. Thread-safe. A budget must
/// outlive what is charged to it.
class budget {
 public:
  /// `name` starts every message of a charge that does not fit ("host memory budget").
  explicit budget(std::uint64_t limit = unlimited_capacity, std::string name = "budget")
      : limit_(limit), name_(std::move(name)) {}
  budget(const budget&) = delete;
  budget& operator=(const budget&) = delete;

  /// Charges `bytes` for `what`; capacity_error naming both when they do not fit. `releasing`
  /// bytes that the caller gives back right after (the old buffer of one that grows) count as
  /// free for the check, so replacing a buffer never needs room for both.
  void charge(std::uint64_t bytes, std::string_view what, std::uint64_t releasing = 0) {
    std::uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      const std::uint64_t rest = used - std::min(used, releasing);
      if (bytes > limit_ || rest > limit_ - bytes)
        throw capacity_error(fmt::format("{}: {} for {} does not fit ({} of {} in use)", name_, format_size(bytes),
                                         what, format_size(used), format_size(limit_)),
                             bytes, limit_ > rest ? limit_ - rest : 0);
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    std::uint64_t peak = peak_.load(std::memory_order_relaxed);
    while (used + bytes > peak && !peak_.compare_exchange_weak(peak, used + bytes, std::memory_order_relaxed)) {
    }
  }
  /// Gives back bytes that charge() took.
  void refund(std::uint64_t bytes) noexcept { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::uint64_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t available() const noexcept {
    const std::uint64_t u = used();
    return limit_ > u ? limit_ - u : 0;
  }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  std::uint64_t limit_;
  std::string name_;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint64_t> peak_{0};
};

/// What a charged buffer costs: `cost` bytes for `what`, with `releasing` bytes that the caller
/// gives back right after counted as free (see budget::charge).
struct charge_request {
  std::uint64_t cost = 0;
  std::string_view what = "a buffer";
  std::uint64_t releasing = 0;
};

/// A Buffer (anything with data() and size()) whose cost is charged to a budget from before it
/// is made until it is destroyed. Move-only; empty when default-constructed or moved from.
template <class Buffer>
class charged {
 public:
  charged() noexcept = default;
  /// Charges `c` to `b`, then constructs the buffer from `args`; when that throws, the charge is
  /// refunded.
  template <class... Args>
  charged(budget& b, charge_request c, Args&&... args) {
    b.charge(c.cost, c.what, c.releasing);
    try {
      buffer_ = Buffer(std::forward<Args>(args)...);
    } catch (...) {
      b.refund(c.cost);
      throw;
    }
    budget_ = &b;
    cost_ = c.cost;
  }
  charged(charged&& o) noexcept
      : buffer_(std::move(o.buffer_)), budget_(std::exchange(o.budget_, nullptr)), cost_(std::exchange(o.cost_, 0)) {}
  charged& operator=(charged&& o) noexcept {
    if (this != &o) {
      release();
      buffer_ = std::move(o.buffer_);
      budget_ = std::exchange(o.budget_, nullptr);
      cost_ = std::exchange(o.cost_, 0);
    }
    return *this;
  }
  charged(const charged&) = delete;
  charged& operator=(const charged&) = delete;
  ~charged() { release(); }

  [[nodiscard]] std::byte* data() noexcept { return buffer_.data(); }
  [[nodiscard]] const std::byte* data() const noexcept { return buffer_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return buffer_.size(); }
  /// Bytes charged to the budget.
  [[nodiscard]] std::uint64_t cost() const noexcept { return cost_; }
  [[nodiscard]] Buffer& buffer() noexcept { return buffer_; }
  [[nodiscard]] const Buffer& buffer() const noexcept { return buffer_; }

 private:
  void release() noexcept {
    buffer_ = Buffer();  // the memory goes before the budget says it is free
    if (budget_ != nullptr) budget_->refund(cost_);
    budget_ = nullptr;
    cost_ = 0;
  }
  Buffer buffer_{};
  budget* budget_ = nullptr;
  std::uint64_t cost_ = 0;
};

/// Host memory charged to a budget (whole pages).
using host_buffer = charged<host_allocation>;

/// `bytes` (zeroed) of host memory of `kind`, charged to `b` in whole pages for `what`.
[[nodiscard]] inline host_buffer allocate_host(budget& b, std::size_t bytes, host_memory_kind kind,
                                               std::string_view what, std::uint64_t releasing = 0) {
  return host_buffer(b, {round_up(bytes, host_allocation::page), what, releasing}, bytes, kind);
}

/// A budget over host memory of one kind: what an optimizer's pipeline slots, gradient store and
/// staging come from (pinned when the executor's copies want it). Thread-safe.
class host_budget : public budget {
 public:
  explicit host_budget(std::uint64_t limit, host_memory_request request = {})
      : budget(limit, "host memory budget"), kind_(resolve_host_memory(request)) {}

  /// Page-rounded size that `bytes` cost.
  [[nodiscard]] static std::uint64_t footprint(std::uint64_t bytes) noexcept {
    return round_up(bytes, host_allocation::page);
  }
  /// Allocates `bytes` (zeroed) for `what`; capacity_error naming `what` when they do not fit.
  [[nodiscard]] host_buffer allocate(std::uint64_t bytes, std::string_view what) {
    return allocate_host(*this, static_cast<std::size_t>(bytes), kind_, what);
  }
  [[nodiscard]] host_memory_kind kind() const noexcept { return kind_; }

 private:
  host_memory_kind kind_;
};

}  // namespace strata
