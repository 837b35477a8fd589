#pragma once
/// `counting_limiter`: an in-process limiter with a hard cap.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/sync/limiter.hpp"

namespace strata {

/// At most `capacity` holders at once among the threads of one process. The count changes under
/// a mutex, so it never exceeds the cap, not even for an instant. Waiters, blocking or not, are
/// served first come, first served: a released unit goes to the oldest waiter. Releasing more
/// than was acquired is a bug and aborts. Destroying the limiter fails the completions of
/// acquire_async calls still waiting.
class counting_limiter {
 public:
  explicit counting_limiter(std::size_t capacity) : capacity_(capacity), available_(capacity) {
    STRATA_EXPECTS(capacity > 0, config_error, "counting_limiter: capacity must be at least 1");
  }
  counting_limiter(const counting_limiter&) = delete;
  counting_limiter& operator=(const counting_limiter&) = delete;
  ~counting_limiter() {
    std::deque<std::shared_ptr<waiter>> left;
    {
      std::lock_guard lock(mutex_);
      left.swap(waiters_);
    }
    for (auto& w : left)
      w->promise.set_exception(std::make_exception_ptr(
          error(fmt::format("counting_limiter destroyed while {} acquire(s) were waiting", left.size()))));
  }

  void acquire() {
    if (auto w = enqueue()) w->future.get();
  }

  [[nodiscard]] bool try_acquire() {
    std::lock_guard lock(mutex_);
    if (available_ == 0 || !waiters_.empty()) return false;
    --available_;
    return true;
  }

  template <class Rep, class Period>
  [[nodiscard]] bool try_acquire_for(std::chrono::duration<Rep, Period> timeout) {
    auto w = enqueue();
    if (!w) return true;
    if (w->future.wait_for(timeout)) {
      w->future.get();
      return true;
    }
    std::lock_guard lock(mutex_);
    if (w->granted) return true;  // granted while the wait timed out: the unit is ours
    waiters_.erase(std::find(waiters_.begin(), waiters_.end(), w));
    return false;
  }

  /// Completes once a unit is held (at once when one is free and nobody waits).
  [[nodiscard]] completion acquire_async() {
    auto w = enqueue();
    return w ? w->future : make_ready_completion();
  }

  void release() noexcept {
    std::shared_ptr<waiter> next;
    {
      std::lock_guard lock(mutex_);
      if (!waiters_.empty()) {
        next = std::move(waiters_.front());
        waiters_.pop_front();
        next->granted = true;  // the unit passes to it without ever being free
      } else {
        STRATA_ASSERT(available_ < capacity_);
        ++available_;
      }
    }
    if (next) detail::grant_unit(std::move(next->promise));
  }

  /// The cap given at construction.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// Units free right now (a snapshot: other threads may change it at once).
  [[nodiscard]] std::size_t available() const {
    std::lock_guard lock(mutex_);
    return available_;
  }
  /// Acquires waiting right now (a snapshot).
  [[nodiscard]] std::size_t waiting() const {
    std::lock_guard lock(mutex_);
    return waiters_.size();
  }

 private:
  struct waiter {
    completion_promise promise;
    completion future = promise.get_future();
    bool granted = false;  // under mutex_
  };

  // Takes a free unit (null) or queues a waiter.
  std::shared_ptr<waiter> enqueue() {
    std::lock_guard lock(mutex_);
    if (available_ > 0 && waiters_.empty()) {
      --available_;
      return nullptr;
    }
    waiters_.push_back(std::make_shared<waiter>());
    return waiters_.back();
  }

  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::size_t available_;
  std::deque<std::shared_ptr<waiter>> waiters_;
};

static_assert(limiter<counting_limiter>);

}  // namespace strata
