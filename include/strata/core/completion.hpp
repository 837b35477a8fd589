#pragma once
/// Completion of asynchronous work: `completion_promise` is fulfilled by whoever finishes the work
/// (an I/O thread, the io_uring reaper, a stream worker, a timer, a limiter granting a permit),
/// `completion` is what the caller waits on. Unlike std::future it takes continuations
/// (`on_complete`), which is what lets tier adaptors, limiters, streams and the pipeline compose
/// without a thread per request. Tiers return them from every request.
///
/// Contract: a continuation runs exactly once, on the thread that completes the work (also when
/// registered while that thread is completing it), or on the registering thread when the work
/// had already completed. It must be short and must not block on other work of the same
/// component; heavy work belongs on a pool. Waiters wake after every continuation has run, so what
/// they record (bytes counted, a permit released) is visible to whoever sees the work complete,
/// also through when_all. Hence a continuation must never wait on its own completion (or on one
/// that completes only after it): that would deadlock.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/unique_function.hpp"

namespace strata {

namespace detail {

using completion_callback = unique_function<void(std::exception_ptr)>;

struct completion_state {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;     // completed (a second completion is ignored)
  bool settled = false;  // and every continuation has run: waiters go on, new ones run at once
  std::exception_ptr error;
  std::vector<completion_callback> callbacks;

  void complete(std::exception_ptr e) noexcept {
    {
      std::lock_guard lock(mutex);
      if (done) return;  // a request completes once; later completions are ignored
      done = true;
      error = e;
    }
    // Continuations registered while these run (by another thread, or by a continuation) are
    // queued and run here too, so that every one of them has run before a waiter goes on.
    for (;;) {
      std::vector<completion_callback> cbs;
      {
        std::lock_guard lock(mutex);
        if (callbacks.empty()) {
          settled = true;
          break;
        }
        cbs.swap(callbacks);
      }
      for (auto& cb : cbs) cb(e);
    }
    cv.notify_all();
  }
};

}  // namespace detail

/// The waiting side of asynchronous work (a tier request, a stream event, a permit). Copies share the request (like
/// std::shared_future): any of them may wait, get or add continuations. An invalid
/// (default-constructed or moved-from) future must not be waited on.
class completion {
 public:
  completion() = default;
  explicit completion(std::shared_ptr<detail::completion_state> s) noexcept : state_(std::move(s)) {}

  /// Whether this future refers to a request.
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }

  /// Whether the request has completed (successfully or not).
  [[nodiscard]] bool ready() const {
    std::lock_guard lock(state_->mutex);
    return state_->settled;
  }

  /// Blocks until the request completes.
  void wait() const {
    std::unique_lock lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->settled; });
  }

  /// Blocks up to `timeout`; true if the request completed.
  template <class Rep, class Period>
  [[nodiscard]] bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock lock(state_->mutex);
    return state_->cv.wait_for(lock, timeout, [&] { return state_->settled; });
  }

  /// The error of completed work (null on success, and while it has not completed).
  [[nodiscard]] std::exception_ptr exception() const {
    std::lock_guard lock(state_->mutex);
    return state_->settled ? state_->error : nullptr;
  }

  /// Waits, then rethrows the request's exception if it failed.
  void get() const {
    wait();
    if (state_->error) std::rethrow_exception(state_->error);
  }

  /// Runs `f(std::exception_ptr)` once the request completes (null pointer on success).
  /// See the file comment for where it runs.
  template <class F>
  void on_complete(F&& f) const {
    std::unique_lock lock(state_->mutex);
    if (!state_->settled) {  // also while completing: the completing thread runs it
      state_->callbacks.emplace_back(std::forward<F>(f));
      return;
    }
    auto e = state_->error;
    lock.unlock();
    std::forward<F>(f)(std::move(e));
  }

 private:
  std::shared_ptr<detail::completion_state> state_;
};

/// The completing side of a request. Completing twice is harmless (the second is ignored); a
/// promise destroyed without completing fails its future, so no waiter hangs forever.
class completion_promise {
 public:
  completion_promise() : state_(std::make_shared<detail::completion_state>()) {}
  completion_promise(completion_promise&&) noexcept = default;
  completion_promise& operator=(completion_promise&& o) noexcept {
    if (this != &o) {
      abandon();
      state_ = std::move(o.state_);
    }
    return *this;
  }
  completion_promise(const completion_promise&) = delete;
  completion_promise& operator=(const completion_promise&) = delete;
  ~completion_promise() { abandon(); }

  /// The future that this promise completes. Call it before completing the promise.
  [[nodiscard]] completion get_future() const { return completion(state_); }
  /// Completes the request successfully.
  void set_value() noexcept { complete(nullptr); }
  /// Completes the request with an error.
  void set_exception(std::exception_ptr e) noexcept { complete(std::move(e)); }
  /// Completes with `e` if non-null, else successfully.
  void complete(std::exception_ptr e) noexcept {
    if (state_) std::exchange(state_, nullptr)->complete(std::move(e));
  }

 private:
  void abandon() noexcept {
    if (state_)
      std::exchange(state_, nullptr)
          ->complete(std::make_exception_ptr(error("completion_promise destroyed before the request completed")));
  }
  std::shared_ptr<detail::completion_state> state_;
};

/// A future that is already complete (successfully, or with `e`).
[[nodiscard]] inline completion make_ready_completion(std::exception_ptr e = nullptr) {
  completion_promise p;
  auto f = p.get_future();
  p.complete(std::move(e));
  return f;
}

/// Runs `f()` now and returns a completed future that carries its exception, if any: the bridge
/// from synchronous code (a memcpy, a validation) to the asynchronous interface.
template <class F>
[[nodiscard]] completion run_as_completion(F&& f) {
  try {
    std::forward<F>(f)();
    return make_ready_completion();
  } catch (...) {
    return make_ready_completion(std::current_exception());
  }
}

/// Completes when every future in `parts` has; carries the first error (in completion order).
[[nodiscard]] inline completion when_all(std::vector<completion> parts) {
  if (parts.empty()) return make_ready_completion();
  if (parts.size() == 1) return std::move(parts.front());
  struct join {
    completion_promise promise;
    std::mutex mutex;
    std::size_t remaining;
    std::exception_ptr first;
    explicit join(std::size_t n) : remaining(n) {}
  };
  auto j = std::make_shared<join>(parts.size());
  auto result = j->promise.get_future();
  for (auto& p : parts)
    p.on_complete([j](std::exception_ptr e) {
      std::unique_lock lock(j->mutex);
      if (e && !j->first) j->first = e;
      if (--j->remaining != 0) return;
      auto first = j->first;
      lock.unlock();
      j->promise.complete(first);
    });
  return result;
}

/// Waits for every future and rethrows the first error among them (in argument order), so that
/// no request is left running when the caller unwinds.
inline void wait_all(std::span<completion> parts) {
  std::exception_ptr first;
  for (auto& p : parts) {
    try {
      p.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace strata
