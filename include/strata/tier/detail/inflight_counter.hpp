#pragma once
// Counts requests an adaptor has issued and not yet completed, so that its destructor can wait
// for them: a completion must never run against a destroyed adaptor.

#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace strata::detail {

class inflight_counter {
 public:
  void add() {
    std::lock_guard lock(mutex_);
    ++count_;
  }
  void done() noexcept {
    std::lock_guard lock(mutex_);
    if (--count_ == 0) cv_.notify_all();
  }
  void wait_zero() noexcept {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return count_ == 0; });
  }
  ~inflight_counter() { wait_zero(); }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t count_ = 0;
};

}  // namespace strata::detail
