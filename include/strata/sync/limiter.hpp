#pragma once
/// The `limiter` concept (how many transfers may run at once on a shared resource) and `permit`,
/// the RAII holder of one unit of a limiter.
///
/// Naming, for every limiter in strata: `acquire()` blocks, `try_acquire()` never blocks,
/// `try_acquire_for(timeout)` blocks at most `timeout` (the names of std::counting_semaphore and
/// std::timed_mutex); the `try_` ones return whether a unit was taken. `acquire_async()` never
/// blocks: it returns a completion that completes once a unit is held by the caller (at once
/// when one is free), so no thread waits for a permit; a failed completion (an I/O error, the
/// limiter destroyed) holds nothing. Its continuation may run on the thread of whoever released
/// the unit, or on a limiter's own thread. `release()` gives one back and never throws.
/// Thread-safety: every model may be shared by threads without a lock.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include "strata/core/completion.hpp"

namespace strata {

/// A limiter caps how many holders a shared resource has at once (PFS link, NVMe queue, ...).
template <class L>
concept limiter = requires(L& l, std::chrono::milliseconds t) {
  { l.acquire() } -> std::same_as<void>;
  { l.try_acquire() } -> std::same_as<bool>;
  { l.try_acquire_for(t) } -> std::same_as<bool>;
  { l.acquire_async() } -> std::same_as<completion>;
  { l.release() } noexcept -> std::same_as<void>;
};

namespace detail {

/// Grants a unit to a waiter by completing its promise. A continuation of that promise often
/// issues a request that completes at once and releases its unit, which grants the next waiter:
/// on one thread that would nest one stack frame per queued waiter. Grants made while this
/// thread is already granting are queued and run by the outermost call instead, in order.
inline void grant_unit(completion_promise p) noexcept {
  thread_local std::vector<completion_promise>* pending = nullptr;
  if (pending != nullptr) {
    pending->push_back(std::move(p));
    return;
  }
  std::vector<completion_promise> queue;
  pending = &queue;
  p.set_value();
  for (std::size_t i = 0; i < queue.size(); ++i) {
    completion_promise next = std::move(queue[i]);
    next.set_value();
  }
  pending = nullptr;
}

}  // namespace detail

/// Holds one unit of a limiter for its lifetime. Movable, not copyable; a moved-from or failed
/// permit holds nothing (test with `owns()` or `explicit operator bool`).
template <limiter L>
class permit {
 public:
  /// Blocks until a unit is available.
  explicit permit(L& l) : limiter_(&l) { l.acquire(); }
  /// Takes a unit only if one is free now.
  permit(L& l, std::try_to_lock_t) : limiter_(l.try_acquire() ? &l : nullptr) {}
  /// Waits at most `timeout` for a unit.
  template <class Rep, class Period>
  permit(L& l, std::chrono::duration<Rep, Period> timeout)
      : limiter_(l.try_acquire_for(timeout) ? &l : nullptr) {}

  permit(permit&& o) noexcept : limiter_(std::exchange(o.limiter_, nullptr)) {}
  permit& operator=(permit&& o) noexcept {
    if (this != &o) {
      release();
      limiter_ = std::exchange(o.limiter_, nullptr);
    }
    return *this;
  }
  permit(const permit&) = delete;
  permit& operator=(const permit&) = delete;
  ~permit() { release(); }

  /// Gives the unit back early; afterwards the permit holds nothing.
  void release() noexcept {
    if (limiter_ != nullptr) std::exchange(limiter_, nullptr)->release();
  }
  [[nodiscard]] bool owns() const noexcept { return limiter_ != nullptr; }
  explicit operator bool() const noexcept { return owns(); }

 private:
  L* limiter_;
};

}  // namespace strata
