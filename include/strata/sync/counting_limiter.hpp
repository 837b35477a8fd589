#pragma once
/// `counting_limiter`: an in-process limiter with a hard cap.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/sync/limiter.hpp"

namespace strata {

/// At most `capacity` holders at once among the threads of one process. The count changes under
/// a mutex, so it never exceeds the cap, not even for an instant. Waiters are woken in no
/// particular order. Releasing more than was acquired is a bug and aborts.
class counting_limiter {
 public:
  explicit counting_limiter(std::size_t capacity) : capacity_(capacity), available_(capacity) {
    STRATA_EXPECTS(capacity > 0, config_error, "counting_limiter: capacity must be at least 1");
  }
  counting_limiter(const counting_limiter&) = delete;
  counting_limiter& operator=(const counting_limiter&) = delete;

  void acquire() {
    std::unique_lock lock(mutex_);
    freed_.wait(lock, [&] { return available_ > 0; });
    --available_;
  }

  [[nodiscard]] bool try_acquire() {
    std::lock_guard lock(mutex_);
    if (available_ == 0) return false;
    --available_;
    return true;
  }

  template <class Rep, class Period>
  [[nodiscard]] bool try_acquire_for(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock lock(mutex_);
    if (!freed_.wait_for(lock, timeout, [&] { return available_ > 0; })) return false;
    --available_;
    return true;
  }

  void release() noexcept {
    {
      std::lock_guard lock(mutex_);
      STRATA_ASSERT(available_ < capacity_);
      ++available_;
    }
    freed_.notify_one();
  }

  /// The cap given at construction.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// Units free right now (a snapshot: other threads may change it at once).
  [[nodiscard]] std::size_t available() const {
    std::lock_guard lock(mutex_);
    return available_;
  }

 private:
  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::size_t available_;
};

static_assert(limiter<counting_limiter>);

}  // namespace strata
