#pragma once
// One thread that runs callbacks at deadlines, in deadline order. Adaptors use it to complete
// requests later (bandwidth shaping, injected delays) without a sleeping thread per request.

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

namespace strata::detail {

class timer_thread {
 public:
  using clock = std::chrono::steady_clock;

  explicit timer_thread(std::string name = "strata-timer") {
    thread_ = std::thread([this, n = name.substr(0, 15)] {
      ::pthread_setname_np(::pthread_self(), n.c_str());
      run();
    });
  }
  timer_thread(const timer_thread&) = delete;
  timer_thread& operator=(const timer_thread&) = delete;
  /// Runs every pending callback (at its deadline), then stops.
  ~timer_thread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  /// Runs `f` on the timer thread at `deadline` (at once if it has passed).
  void at(clock::time_point deadline, std::function<void()> f) {
    {
      std::lock_guard lock(mutex_);
      queue_.push(item{deadline, seq_++, std::move(f)});
    }
    cv_.notify_all();
  }

 private:
  struct item {
    clock::time_point deadline;
    std::uint64_t seq;  // FIFO among equal deadlines
    std::function<void()> fn;
    bool operator>(const item& o) const { return deadline != o.deadline ? deadline > o.deadline : seq > o.seq; }
  };

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (queue_.empty()) {
        if (stopping_) return;
        cv_.wait(lock);
        continue;
      }
      const auto deadline = queue_.top().deadline;
      if (clock::now() < deadline) {
        cv_.wait_until(lock, deadline);
        continue;
      }
      auto fn = std::move(const_cast<item&>(queue_.top()).fn);  // top() is const; the item is popped next
      queue_.pop();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::priority_queue<item, std::vector<item>, std::greater<>> queue_;
  std::uint64_t seq_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace strata::detail
