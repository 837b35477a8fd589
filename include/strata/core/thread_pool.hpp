#pragma once
/// A small fixed-size thread pool whose tasks return futures.
///
/// Contract: `submit` is thread-safe and returns a std::future; an exception thrown by a task is
/// stored in its future and rethrown by get(). Destruction (or `shutdown()`) stops accepting work,
/// runs everything already queued, then joins: no queued task is silently lost. `cancel_pending()`
/// drops queued tasks instead; their futures then throw std::future_error (broken_promise).
/// A task must not block on a future of a task queued behind it in the same pool when every
/// worker may be doing the same: that deadlocks, as in any fixed pool.

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata {

/// CPUs this process may run on (its affinity mask, so containers and taskset are respected).
[[nodiscard]] inline std::size_t online_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<std::size_t>(n);
  }
  return std::max(1U, std::thread::hardware_concurrency());
}

/// Threads for a pool when the caller gives none: STRATA_NUM_THREADS, else online_cpus().
[[nodiscard]] inline std::size_t default_thread_count() {
  return env_integer<std::size_t>("STRATA_NUM_THREADS", online_cpus(), 1, 1024);
}

class thread_pool {
 public:
  /// Starts `threads` workers named "<name>-<i>" (visible in debuggers, top -H and traces).
  explicit thread_pool(std::size_t threads = default_thread_count(), std::string name = "strata")
      : name_(std::move(name)) {
    STRATA_EXPECTS(threads > 0, config_error, "thread_pool '{}': needs at least one thread", name_);
    workers_.reserve(threads);
    try {
      for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
    } catch (const std::system_error& e) {
      const auto started = workers_.size();
      shutdown();
      throw error(fmt::format("thread_pool '{}': cannot start thread {} of {}: {}", name_, started, threads,
                              e.what()));
    }
  }

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  /// Runs what is queued, then joins every worker.
  ~thread_pool() { shutdown(); }

  /// Queues `f(args...)`; the future holds its result or its exception.
  /// Throws strata::error after shutdown() began.
  template <class F, class... Args>
  [[nodiscard]] auto submit(F&& f, Args&&... args)
      -> std::future<std::invoke_result_t<std::decay_t<F>, std::decay_t<Args>...>> {
    using result = std::invoke_result_t<std::decay_t<F>, std::decay_t<Args>...>;
    std::packaged_task<result()> job(
        [fn = std::forward<F>(f), ... as = std::forward<Args>(args)]() mutable -> result {
          return std::invoke(std::move(fn), std::move(as)...);
        });
    auto fut = job.get_future();
    {
      std::lock_guard lock(mutex_);
      STRATA_EXPECTS(!stopping_, error, "thread_pool '{}': submit() after shutdown", name_);
      queue_.push_back(std::make_unique<task<result>>(std::move(job)));
    }
    work_ready_.notify_one();
    return fut;
  }

  /// Number of worker threads.
  [[nodiscard]] std::size_t size() const noexcept { return workers_.size(); }
  /// The name given at construction.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// Tasks queued and not yet started.
  [[nodiscard]] std::size_t pending() const {
    std::lock_guard lock(mutex_);
    return queue_.size();
  }

  /// Blocks until no task is queued or running. Calling it from one of this pool's own workers
  /// would wait for itself, so that is a config_error.
  void wait_idle() {
    STRATA_EXPECTS(!is_worker(), config_error, "thread_pool '{}': wait_idle() called from its own worker", name_);
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return queue_.empty() && active_ == 0; });
  }

  /// Drops every queued task that has not started; returns how many. Their futures report
  /// std::future_errc::broken_promise. Running tasks finish normally.
  std::size_t cancel_pending() noexcept {
    std::deque<std::unique_ptr<task_base>> dropped;
    {
      std::lock_guard lock(mutex_);
      dropped.swap(queue_);
      if (active_ == 0) idle_.notify_all();
    }
    return dropped.size();  // destroyed here, outside the lock
  }

  /// Stops accepting work, runs everything queued, joins. Idempotent; called by the destructor.
  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    for (auto& w : workers_)
      if (w.joinable() && w.get_id() != std::this_thread::get_id()) w.join();
  }

  /// Whether the calling thread is one of this pool's workers.
  [[nodiscard]] bool is_worker() const noexcept { return current_pool() == this; }

  /// The calling thread's index in its pool, or -1 when it is no pool's worker.
  [[nodiscard]] static int current_worker_index() noexcept { return current_index(); }

 private:
  struct task_base {
    virtual ~task_base() = default;
    virtual void run() noexcept = 0;
  };
  template <class R>
  struct task final : task_base {
    explicit task(std::packaged_task<R()> j) : job(std::move(j)) {}
    void run() noexcept override { job(); }  // packaged_task stores exceptions in the future
    std::packaged_task<R()> job;
  };

  static const thread_pool*& current_pool() noexcept {
    thread_local const thread_pool* pool = nullptr;
    return pool;
  }
  static int& current_index() noexcept {
    thread_local int index = -1;
    return index;
  }

  void work(std::size_t index) {
    current_pool() = this;
    current_index() = static_cast<int>(index);
    const std::string thread_name = fmt::format("{}-{}", name_, index).substr(0, 15);  // kernel limit
    ::pthread_setname_np(::pthread_self(), thread_name.c_str());
    for (;;) {
      std::unique_ptr<task_base> t;
      {
        std::unique_lock lock(mutex_);
        work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything queued has run
        t = std::move(queue_.front());
        queue_.pop_front();
        ++active_;
      }
      t->run();
      t.reset();  // captured state dies before the pool reports idle
      {
        std::lock_guard lock(mutex_);
        --active_;
        if (active_ == 0 && queue_.empty()) idle_.notify_all();
      }
    }
  }

  std::string name_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable idle_;
  std::deque<std::unique_ptr<task_base>> queue_;
  std::size_t active_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace strata
