#pragma once
// The I/O engines under file_tier: one raw positioned read or write at a time, completed in
// full (short transfers are continued, EINTR/EAGAIN retried) and reported once through a
// callback. Two engines share the interface: a POSIX thread pool (pread/pwrite, always present)
// and io_uring (liburing), which keeps up to `queue_depth` operations in flight from one
// submitting and one reaping thread.

#include <fcntl.h>
#include <sys/uio.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <algorithm>
#include <functional>
#include <span>
#include <vector>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/core/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/thread_pool.hpp"

#if STRATA_HAS_URING
#include <liburing.h>
#endif

namespace strata {

namespace detail {
inline int sys_open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
}  // namespace detail

/// Syscalls a file_tier issues: the POSIX engine's transfers, the open that probes whether the
/// filesystem takes O_DIRECT, and the fallocate that reserves space for growing writes. Tests replace them to inject short transfers, EINTR, EAGAIN,
/// ENOSPC or a refused O_DIRECT; everyone else leaves the defaults.
struct file_syscalls {
  ssize_t (*pread)(int, void*, std::size_t, off_t) = ::pread;
  ssize_t (*pwrite)(int, const void*, std::size_t, off_t) = ::pwrite;
  int (*open)(const char*, int, mode_t) = detail::sys_open;
  int (*fallocate)(int, int, off_t, off_t) = ::fallocate;
};

namespace detail {

/// One positioned transfer. `done(bytes, err)` runs exactly once: err == 0 and bytes == len on
/// success; for reads with `allow_eof`, fewer bytes when the file ends first; else err is the
/// errno of the failure and bytes what was transferred before it.
struct raw_io {
  int fd = -1;
  bool write = false;
  std::byte* buf = nullptr;
  std::size_t len = 0;
  std::uint64_t offset = 0;
  bool allow_eof = false;
  /// The transfer is a CPU copy in the kernel (buffered I/O through the page cache, or any I/O on
  /// a memory filesystem, whose O_DIRECT copies too). io_uring runs such a copy inline, in the
  /// thread that submits it (a pipeline's driver, blocked ~10 ms per 100 MB), unless the operation
  /// goes to the kernel's async workers.
  bool cpu_copy = false;
  std::size_t done_bytes = 0;  // progress, owned by the engine
  std::shared_ptr<void> keep_alive;  // what must outlive the transfer (fd, buffers)
  std::function<void(std::size_t, int)> done;
};

class file_io_engine {
 public:
  virtual ~file_io_engine() = default;
  /// Starts `op`; its callback may run on this thread or on an engine thread.
  virtual void submit(std::unique_ptr<raw_io> op) = 0;
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// Registers buffers that later operations reuse; false when the engine has no such notion.
  virtual bool register_buffers(std::span<const std::span<std::byte>> /*buffers*/) { return false; }
  /// Operations that used a registered buffer.
  [[nodiscard]] virtual std::uint64_t fixed_operations() const noexcept { return 0; }

 protected:
  /// Applies one result (bytes or -errno) to `op`. Returns true when `op` is finished (its
  /// callback has run), false when the remainder must be submitted again.
  static bool advance(raw_io& op, long long result) {
    if (result < 0) {
      const int err = static_cast<int>(-result);
      if (err == EINTR || err == EAGAIN) return false;
      op.done(op.done_bytes, err);
      return true;
    }
    if (result == 0) {
      if (!op.write && op.allow_eof) {
        op.done(op.done_bytes, 0);
        return true;
      }
      op.done(op.done_bytes, op.write ? EIO : ENODATA);  // no progress: never loop forever
      return true;
    }
    op.done_bytes += static_cast<std::size_t>(result);
    if (op.done_bytes < op.len) return false;  // short transfer: continue with the rest
    op.done(op.done_bytes, 0);
    return true;
  }
};

/// pread/pwrite on a fixed thread pool: one task per operation, which loops until done.
class posix_engine final : public file_io_engine {
 public:
  posix_engine(std::size_t threads, file_syscalls calls, const std::string& name)
      : calls_(calls), pool_(threads, name.substr(0, 8) + "-io") {}

  void submit(std::unique_ptr<raw_io> op) override {
    (void)pool_.submit([this, o = std::shared_ptr<raw_io>(std::move(op))] {
      for (;;) {
        const std::size_t rest = o->len - o->done_bytes;
        const auto off = static_cast<off_t>(o->offset + o->done_bytes);
        const ssize_t n = o->write ? calls_.pwrite(o->fd, o->buf + o->done_bytes, rest, off)
                                   : calls_.pread(o->fd, o->buf + o->done_bytes, rest, off);
        if (advance(*o, n < 0 ? -static_cast<long long>(errno) : static_cast<long long>(n))) return;
      }
    });
  }
  [[nodiscard]] std::string_view name() const noexcept override { return "posix"; }

 private:
  file_syscalls calls_;
  thread_pool pool_;  // last: drained and joined before anything else goes
};

#if STRATA_HAS_URING
/// io_uring: submissions under a mutex, completions on one reaper thread, at most `depth`
/// operations in flight (the rest wait in a queue, so the completion ring never overflows).
class uring_engine final : public file_io_engine {
 public:
  uring_engine(unsigned depth, const std::string& name) : depth_(depth), name_(name) {
    if (const int rc = io_uring_queue_init(depth, &ring_, 0); rc < 0)
      throw io_error("io_uring_queue_init", name, -rc);
    reaper_ = std::thread([this, tn = name.substr(0, 8) + "-uring"] {
      ::pthread_setname_np(::pthread_self(), tn.c_str());
      reap();
    });
  }
  uring_engine(const uring_engine&) = delete;
  uring_engine& operator=(const uring_engine&) = delete;

  ~uring_engine() override {
    {
      std::unique_lock lock(mutex_);
      idle_.wait(lock, [&] { return inflight_ == 0 && waiting_.empty(); });  // drain
      stopping_ = true;
      io_uring_sqe* sqe = get_sqe_locked();
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);  // null user data wakes the reaper to stop
      io_uring_submit(&ring_);
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  void submit(std::unique_ptr<raw_io> op) override {
    raw_io* failed = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (inflight_ >= depth_) {
        waiting_.push_back(std::move(op));
        return;
      }
      failed = start_locked(op.release());
    }
    fail(failed);
  }
  [[nodiscard]] std::string_view name() const noexcept override { return "io_uring"; }

  // The kernel pins registered buffers once, instead of on every operation. Replacing the table
  // waits for the ring to go idle, so no operation in flight refers to a stale index.
  bool register_buffers(std::span<const std::span<std::byte>> buffers) override {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return inflight_ == 0 && waiting_.empty(); });
    if (!registered_.empty()) {
      io_uring_unregister_buffers(&ring_);
      registered_.clear();
    }
    if (buffers.empty()) return true;
    std::vector<iovec> iov;
    iov.reserve(buffers.size());
    for (const auto& b : buffers) iov.push_back({b.data(), b.size()});
    if (const int rc = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size())); rc < 0)
      throw io_error("io_uring_register_buffers", name_, -rc);
    for (unsigned i = 0; i < buffers.size(); ++i)
      registered_.push_back({buffers[i].data(), buffers[i].data() + buffers[i].size(), i});
    std::sort(registered_.begin(), registered_.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    return true;
  }
  [[nodiscard]] std::uint64_t fixed_operations() const noexcept override { return fixed_ops_.load(); }

 private:
  struct registered_buffer {
    std::byte* begin;
    std::byte* end;
    unsigned index;
  };

  // Index of the registered buffer holding [p, p + n), or -1.
  [[nodiscard]] int registered_index(const std::byte* p, std::size_t n) const noexcept {
    auto it = std::upper_bound(registered_.begin(), registered_.end(), p,
                               [](const std::byte* x, const registered_buffer& r) { return x < r.begin; });
    if (it == registered_.begin()) return -1;
    --it;
    return (p >= it->begin && p + n <= it->end) ? static_cast<int>(it->index) : -1;
  }

  io_uring_sqe* get_sqe_locked() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    while (sqe == nullptr) {  // submission queue full: hand it to the kernel and retry
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  // Queues `op` in the ring; returns it when the kernel refused the submission, so that the
  // caller fails it after releasing the lock (its callback may submit more work).
  [[nodiscard]] raw_io* start_locked(raw_io* op) {
    ++inflight_;
    prep_locked(op);
    if (const int rc = io_uring_submit(&ring_); rc < 0) {
      --inflight_;
      op->done_bytes = static_cast<std::size_t>(-rc);  // carries the errno to fail()
      return op;
    }
    return nullptr;
  }

  static void fail(raw_io* op) noexcept {
    if (op == nullptr) return;
    const int err = static_cast<int>(op->done_bytes);
    op->done_bytes = 0;
    op->done(0, err);
    delete op;
  }

  void prep_locked(raw_io* op) {
    io_uring_sqe* sqe = get_sqe_locked();
    const std::size_t rest = op->len - op->done_bytes;
    const auto off = op->offset + op->done_bytes;
    std::byte* p = op->buf + op->done_bytes;
    const auto n = static_cast<unsigned>(rest);
    if (const int idx = registered_.empty() ? -1 : registered_index(p, rest); idx >= 0) {
      fixed_ops_.fetch_add(1, std::memory_order_relaxed);
      if (op->write)
        io_uring_prep_write_fixed(sqe, op->fd, p, n, off, idx);
      else
        io_uring_prep_read_fixed(sqe, op->fd, p, n, off, idx);
    } else if (op->write) {
      io_uring_prep_write(sqe, op->fd, p, n, off);
    } else {
      io_uring_prep_read(sqe, op->fd, p, n, off);
    }
    if (op->cpu_copy) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);  // copy on a kernel worker, not here
    io_uring_sqe_set_data(sqe, op);
  }

  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) continue;  // transient (e.g. -EAGAIN); the ring stays usable
      raw_io* op = nullptr;
      int res = 0;
      {
        // Submissions happen under this lock; taking it here makes the kernel's ordering of
        // submission before completion visible to the C++ memory model (and ThreadSanitizer).
        std::lock_guard lock(mutex_);
        op = static_cast<raw_io*>(io_uring_cqe_get_data(cqe));
        res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        if (op == nullptr) {
          if (stopping_) return;
          continue;
        }
      }
      // The callback runs outside the lock: it may submit the next step of its request.
      const bool finished = advance(*op, res);
      if (finished) delete op;
      std::vector<raw_io*> failed;
      {
        std::lock_guard lock(mutex_);
        if (!finished) {  // resubmit the remainder (short transfer, EINTR, EAGAIN)
          prep_locked(op);
          if (const int src = io_uring_submit(&ring_); src < 0) {
            --inflight_;
            op->done_bytes = static_cast<std::size_t>(-src);
            failed.push_back(op);
          }
        } else {
          --inflight_;
        }
        while (inflight_ < depth_ && !waiting_.empty()) {
          raw_io* next = waiting_.front().release();
          waiting_.pop_front();
          if (raw_io* f = start_locked(next)) failed.push_back(f);
        }
        if (inflight_ == 0 && waiting_.empty() && failed.empty()) idle_.notify_all();
      }
      for (raw_io* f : failed) fail(f);
      if (!failed.empty()) {
        std::lock_guard lock(mutex_);
        if (inflight_ == 0 && waiting_.empty()) idle_.notify_all();
      }
    }
  }

  unsigned depth_;
  std::string name_;
  io_uring ring_{};
  std::vector<registered_buffer> registered_;
  std::atomic<std::uint64_t> fixed_ops_{0};
  std::mutex mutex_;
  std::condition_variable idle_;
  unsigned inflight_ = 0;
  bool stopping_ = false;
  std::deque<std::unique_ptr<raw_io>> waiting_;
  std::thread reaper_;
};
#endif

}  // namespace detail
}  // namespace strata
