#pragma once
// The time line of the link that throttled<> requests reserve slots on: one per adaptor (process
// memory), or one per node and name (a small file in the node directory that every process maps),
// which emulates the one link the ranks of a node share to a parallel file system.

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/node_dir.hpp"

namespace strata::detail {

/// A stretch of one direction of a link, reserved by one request.
struct link_slot {
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point end;
};

/// Slots of a link's two directions (0: reads, 1: writes), handed out in the order asked for.
class link_timeline {
 public:
  using clock = std::chrono::steady_clock;
  virtual ~link_timeline() = default;

  /// Reserves `length` of direction `dir` for request `tag`, starting no earlier than `now`. When
  /// the slot before it belongs to another request the link first spends `switch_cost` (the
  /// interference of interleaved streams: a seek, a lock or stream hand-over); that time may
  /// overlap a stretch the link was idle.
  virtual link_slot reserve(int dir, clock::time_point now, clock::duration length, std::uint64_t tag,
                            clock::duration switch_cost) = 0;
  /// A tag that no other request on this link has had (never 0).
  virtual std::uint64_t new_tag() = 0;

 protected:
  // The one rule of both kinds, on nanoseconds of the steady clock (CLOCK_MONOTONIC: one clock
  // for every process of a node).
  static link_slot take(std::int64_t& next_free, std::uint64_t& last_tag, clock::time_point now,
                        clock::duration length, std::uint64_t tag, clock::duration switch_cost) {
    const auto ns = [](clock::duration d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); };
    std::int64_t ready = next_free;
    if (last_tag != 0 && last_tag != tag) ready += ns(switch_cost);
    const std::int64_t start = std::max(ns(now.time_since_epoch()), ready);
    next_free = start + ns(length);
    last_tag = tag;
    const auto at = [](std::int64_t t) { return clock::time_point(std::chrono::nanoseconds(t)); };
    return {at(start), at(next_free)};
  }
};

/// A link of one adaptor.
class local_link final : public link_timeline {
 public:
  link_slot reserve(int dir, clock::time_point now, clock::duration length, std::uint64_t tag,
                    clock::duration switch_cost) override {
    std::lock_guard lock(mutex_);
    return take(next_free_[dir], last_tag_[dir], now, length, tag, switch_cost);
  }
  std::uint64_t new_tag() override {
    std::lock_guard lock(mutex_);
    return ++tags_;
  }

 private:
  std::mutex mutex_;
  std::array<std::int64_t, 2> next_free_{};
  std::array<std::uint64_t, 2> last_tag_{};
  std::uint64_t tags_ = 0;
};

/// The link named `name` of this node: the file <dir>/link-<name> (dir: default_node_limiter_dir()
/// unless given), mapped shared by every process that opens it and guarded by a robust
/// process-shared mutex, so a process killed while holding it never blocks the others. The file
/// stays after the last user (a few hundred bytes, on tmpfs by default); one left by an earlier
/// boot, whose clock readings mean nothing now, is reset on open.
class node_link final : public link_timeline {
 public:
  explicit node_link(const std::string& name, const std::filesystem::path& directory = {}) {
    check_node_name("throttled link", name);
    const auto dir = directory.empty() ? default_node_limiter_dir() : directory;
    make_directories(dir);
    path_ = dir / ("link-" + name);
    unique_fd fd = open_file(path_, O_RDWR | O_CREAT, 0600);
    file_lock whole(fd.get(), path_);  // one opener at a time sets the file up
    struct stat st{};
    if (::fstat(fd.get(), &st) != 0) throw io_error("fstat", path_, errno);
    if (static_cast<std::size_t>(st.st_size) < sizeof(shared) && ::ftruncate(fd.get(), sizeof(shared)) != 0)
      throw io_error("ftruncate", path_, errno);
    void* p = ::mmap(nullptr, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) throw io_error("mmap", path_, errno);
    s_ = static_cast<shared*>(p);
    const auto boot = boot_id();
    if (s_->magic != magic || std::memcmp(s_->boot.data(), boot.data(), boot.size()) != 0) {
      try {
        init(boot);
      } catch (...) {
        ::munmap(s_, sizeof(shared));
        throw;
      }
    }
  }
  node_link(const node_link&) = delete;
  node_link& operator=(const node_link&) = delete;
  ~node_link() override { ::munmap(s_, sizeof(shared)); }

  link_slot reserve(int dir, clock::time_point now, clock::duration length, std::uint64_t tag,
                    clock::duration switch_cost) override {
    held h(*this);
    return take(s_->next_free[dir], s_->last_tag[dir], now, length, tag, switch_cost);
  }
  std::uint64_t new_tag() override {
    held h(*this);
    return ++s_->tags;
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  static constexpr std::uint64_t magic = 0x5354524c4e4b0001ULL;  // layout version 1
  struct shared {
    std::uint64_t magic;
    std::array<char, 40> boot;
    pthread_mutex_t mutex;
    std::array<std::int64_t, 2> next_free;
    std::array<std::uint64_t, 2> last_tag;
    std::uint64_t tags;
  };

  class file_lock {
   public:
    file_lock(int fd, const std::filesystem::path& path) : fd_(fd) {
      while (::flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) throw io_error("flock", path, errno);
    }
    ~file_lock() { (void)::flock(fd_, LOCK_UN); }
    file_lock(const file_lock&) = delete;
    file_lock& operator=(const file_lock&) = delete;

   private:
    int fd_;
  };

  class held {
   public:
    explicit held(node_link& l) : m_(&l.s_->mutex) {
      const int rc = ::pthread_mutex_lock(m_);
      if (rc == EOWNERDEAD) {
        (void)::pthread_mutex_consistent(m_);  // a holder died: the two numbers it guards are always whole
      } else if (rc != 0) {
        throw io_error("pthread_mutex_lock", l.path_, rc);
      }
    }
    ~held() { (void)::pthread_mutex_unlock(m_); }
    held(const held&) = delete;
    held& operator=(const held&) = delete;

   private:
    pthread_mutex_t* m_;
  };

  // This boot's id (the steady clock restarts with it); empty where the kernel does not say.
  static std::array<char, 40> boot_id() {
    std::array<char, 40> id{};
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string s;
    if (in >> s) std::memcpy(id.data(), s.data(), std::min(s.size(), id.size() - 1));
    return id;
  }

  void init(const std::array<char, 40>& boot) {
    std::memset(static_cast<void*>(s_), 0, sizeof(shared));
    pthread_mutexattr_t a;
    int rc = ::pthread_mutexattr_init(&a);
    if (rc == 0) rc = ::pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (rc == 0) rc = ::pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (rc == 0) rc = ::pthread_mutex_init(&s_->mutex, &a);
    (void)::pthread_mutexattr_destroy(&a);
    if (rc != 0) throw io_error("pthread_mutex_init", path_, rc);
    s_->boot = boot;
    s_->magic = magic;  // last: a file without it is set up again by the next opener
  }

  std::filesystem::path path_;
  shared* s_ = nullptr;
};

}  // namespace strata::detail
