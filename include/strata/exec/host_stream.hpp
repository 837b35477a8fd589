#pragma once
/// host_stream: the host model of a stream. One worker thread runs the stream's work in order;
/// "device" memory is host memory, so copies are memcpy. Used where there is no GPU (CI, tests)
/// and under the adaptors (paced, jittered, faulty) to emulate one: the ordering a pipeline gets
/// right on host_stream it gets right on cuda_stream, whose contract is the same (exec/stream.hpp).
///
/// After work fails, later work of the stream is skipped (not run) until sync() clears the
/// error; events recorded meanwhile complete with the error. The worker starts on first use, so
/// an executor whose streams are never used costs no thread.

#include <pthread.h>

#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/unique_function.hpp"
#include "strata/exec/stream.hpp"

namespace strata {

/// An event of a host_stream (default-constructed: already complete).
class host_event {
 public:
  host_event() : done_(make_ready_completion()) {}
  explicit host_event(strata::completion c) noexcept : done_(std::move(c)) {}
  [[nodiscard]] bool ready() const { return done_.ready(); }
  [[nodiscard]] strata::completion completion() const { return done_; }

 private:
  strata::completion done_;
};

static_assert(stream_event<host_event>);

class host_stream {
 public:
  using event_type = host_event;

  explicit host_stream(std::string name = "host") : name_(std::move(name)) {}
  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;
  /// Runs the work still queued, then stops the worker.
  ~host_stream() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  void copy_to_device(std::span<std::byte> dst, std::span<const std::byte> src) { copy("copy_to_device", dst, src); }
  void copy_to_host(std::span<std::byte> dst, std::span<const std::byte> src) { copy("copy_to_host", dst, src); }

  void enqueue_host(host_task task) {
    push([task = std::move(task)](std::exception_ptr& failed) mutable {
      if (failed) return;
      try {
        task();
      } catch (...) {
        failed = std::current_exception();
      }
    });
  }

  [[nodiscard]] host_event record() {
    completion_promise p;
    host_event e(p.get_future());
    push([p = std::move(p)](std::exception_ptr& failed) mutable { p.complete(failed); });
    return e;
  }

  void wait(const host_event& e) {
    push([c = e.completion()](std::exception_ptr& failed) {
      if (failed) return;
      c.wait();  // the worker waits, as a GPU stream would; the caller does not
      if (auto err = c.exception()) failed = err;
    });
  }

  void sync() {
    completion_promise p;
    auto done = p.get_future();
    push([p = std::move(p)](std::exception_ptr& failed) mutable { p.complete(std::exchange(failed, nullptr)); });
    done.get();
  }

  [[nodiscard]] std::string_view name() const noexcept { return name_; }

 private:
  using op = unique_function<void(std::exception_ptr&)>;

  void copy(std::string_view what, std::span<std::byte> dst, std::span<const std::byte> src) {
    STRATA_EXPECTS(dst.size() == src.size(), config_error, "stream '{}': {} of {} bytes into {} bytes", name_, what,
                   src.size(), dst.size());
    push([dst, src](std::exception_ptr& failed) {
      if (!failed && !src.empty()) std::memcpy(dst.data(), src.data(), src.size());
    });
  }

  void push(op o) {
    {
      std::lock_guard lock(mutex_);
      // The worker first: work queued with nobody to run it would never complete.
      if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
      queue_.push_back(std::move(o));
    }
    cv_.notify_one();
  }

  void run() {
    const std::string thread_name = ("s-" + name_).substr(0, 15);
    ::pthread_setname_np(::pthread_self(), thread_name.c_str());
    std::exception_ptr failed;  // only this thread touches it
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything ran
      {
        op o = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        o(failed);
      }  // destroyed unlocked: what it captured may enqueue work
      lock.lock();
    }
  }

  std::string name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<op> queue_;
  bool stopping_ = false;
  std::thread worker_;  // last: started after every member above exists
};

static_assert(stream<host_stream>);

}  // namespace strata
