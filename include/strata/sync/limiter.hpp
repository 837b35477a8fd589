#pragma once
/// The `limiter` concept (how many transfers may run at once on a shared resource) and `permit`,
/// the RAII holder of one unit of a limiter.
///
/// Naming, for every limiter in strata: `acquire()` blocks, `try_acquire()` never blocks,
/// `try_acquire_for(timeout)` blocks at most `timeout` (the names of std::counting_semaphore and
/// std::timed_mutex); the `try_` ones return whether a unit was taken. `release()` gives one back
/// and never throws. Thread-safety: every model may be shared by threads without a lock.

#include <chrono>
#include <concepts>
#include <mutex>
#include <utility>

namespace strata {

/// A limiter caps how many holders a shared resource has at once (PFS link, NVMe queue, ...).
template <class L>
concept limiter = requires(L& l, std::chrono::milliseconds t) {
  { l.acquire() } -> std::same_as<void>;
  { l.try_acquire() } -> std::same_as<bool>;
  { l.try_acquire_for(t) } -> std::same_as<bool>;
  { l.release() } noexcept -> std::same_as<void>;
};

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
