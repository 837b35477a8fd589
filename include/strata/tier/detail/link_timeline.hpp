#pragma once
// The time line of the link that throttled<> requests reserve slots on: one per adaptor (process
// memory), or one per node and name (a small file in the node directory that every process uses),
// which emulates the one link the ranks of a node share to a parallel file system.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "strata/core/checksum.hpp"
#include "strata/core/error.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/node_dir.hpp"
#include "strata/core/notice.hpp"

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
/// unless given), shared by every process that opens it. The file stays after the last user (96
/// bytes, on tmpfs by default).
///
/// The file is never mapped: every use locks it (flock), reads its one record with pread, checks
/// it, and writes it back, all in a few microseconds. A file can be truncated, overwritten or
/// replaced by anyone with access at any time, and on a mapping each of those becomes a SIGBUS or
/// a lock word that hangs everyone; with pread it is a short read or a bad checksum. So, on every
/// use:
/// - a record that is short (truncated), fails its checksum (garbage, a torn write), is of
///   another layout version, or was written in an earlier boot (its clock readings mean nothing
///   now) is set up again: a fresh time line, with a notice() naming the file (none for a file
///   that is new or left by an earlier boot);
/// - a time line more than max_ahead beyond now cannot come from real requests, and is cut back
///   to now, with a notice;
/// - when the path no longer names the file this object has open (removed, or replaced by
///   rename), it opens the path again, so that users never drift apart onto different files;
/// - a lock held longer than lock_patience (a holder stopped in its critical section) is not
///   waited for: a fresh file is built under a temporary name and renamed over the path, which
///   every user then follows (see above), with a notice.
/// Something at the path that is not a regular file of this user (a symbolic link, a FIFO) is
/// refused with a foreign_file_error naming it, and so is a node directory that is a symbolic
/// link or another user's (node_dir.hpp). Only a file truncated between the read and the write
/// of one use loses that use's update: the next use sets it up again. Every process of a node
/// must run the same layout version: one of another version sets the file up again each time.
class node_link final : public link_timeline {
 public:
  /// A reservation never reaches this far beyond now: a backlog is the link time of requests
  /// already issued (seconds to minutes, even for an emulated slow link); anything beyond is
  /// garbage, or a clock that is not this boot's.
  static constexpr std::chrono::hours max_ahead{24};
  /// The longest wait for another process's lock before the file is replaced; critical sections
  /// take microseconds.
  static constexpr std::chrono::seconds lock_patience{5};

  /// The file's one record (public for the tests that damage it).
  struct record {
    std::uint64_t magic;
    std::array<char, 40> boot;
    std::array<std::int64_t, 2> next_free;
    std::array<std::uint64_t, 2> last_tag;
    std::uint64_t tags;
    std::uint64_t checksum;  // of the bytes before it
  };
  static constexpr std::uint64_t magic = 0x5354524c4e4b0003ULL;  // layout version 3 (XXH3 seal)
  /// The checksum a record of these contents carries.
  [[nodiscard]] static std::uint64_t seal(const record& r) noexcept {
    return checksum64(std::as_bytes(std::span(reinterpret_cast<const std::byte*>(&r), offsetof(record, checksum))));
  }

  explicit node_link(const std::string& name, const std::filesystem::path& directory = {}) {
    check_node_name("throttled link", name);
    dir_ = directory.empty() ? default_node_limiter_dir() : directory;
    name_ = name;
    path_ = dir_ / ("link-" + name);
    boot_ = boot_record();
    make_node_directory(dir_);
    file_ = open_node_file(path_);
    std::lock_guard self(mutex_);
    use([](record&) {});  // refuses a bad file now, not at the first request
  }
  node_link(const node_link&) = delete;
  node_link& operator=(const node_link&) = delete;
  ~node_link() override = default;

  link_slot reserve(int dir, clock::time_point now, clock::duration length, std::uint64_t tag,
                    clock::duration switch_cost) override {
    std::lock_guard self(mutex_);
    link_slot slot{};
    use([&](record& r) {
      const auto ns = [](clock::time_point t) {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
      };
      const std::int64_t real_now = ns(clock::now());
      const std::int64_t limit = std::max(ns(now), real_now) + std::chrono::nanoseconds(max_ahead).count();
      for (int d = 0; d < 2; ++d) {
        if (r.next_free[d] <= limit) continue;
        notice(fmt::format("node link file {}: its time line was {} s ahead of now, which no request makes; "
                           "starting it again from now",
                           path_.string(), (r.next_free[d] - real_now) / 1'000'000'000));
        r.next_free[d] = real_now;
      }
      slot = take(r.next_free[dir], r.last_tag[dir], now, length, tag, switch_cost);
    });
    return slot;
  }
  std::uint64_t new_tag() override {
    std::lock_guard self(mutex_);
    std::uint64_t tag = 0;
    use([&](record& r) {
      if (++r.tags == 0) ++r.tags;  // never 0, which means "no request" in last_tag
      tag = r.tags;
    });
    return tag;
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  enum class lock_state { held, moved, stuck };

  // flock(file_) for one critical section, polling, so that a holder that never lets go is
  // noticed (stuck), and so is a path that names another file meanwhile (moved; with `follow`).
  lock_state lock_file(bool follow) {
    const auto deadline = clock::now() + lock_patience;
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      if (::flock(file_.fd.get(), LOCK_EX | LOCK_NB) == 0) return lock_state::held;
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) throw io_error("flock", path_, errno);
      if (follow && !names_file(path_, file_)) return lock_state::moved;
      if (clock::now() >= deadline) return lock_state::stuck;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  struct unlock_at_exit {
    int fd;
    ~unlock_at_exit() { (void)::flock(fd, LOCK_UN); }
  };

  // Under mutex_: runs `change` on the checked record under the file's lock and writes it back.
  template <class F>
  void use(F&& change) {
    for (int round = 0;; ++round) {
      const bool follow = round < 8;  // past that, somebody keeps replacing it: stay on this file
      const auto state = lock_file(follow);
      if (state == lock_state::stuck) {
        if (round >= 3)
          throw busy_error(fmt::format("node link file {} stays locked by other processes for over {} s, also "
                                       "after replacing it",
                                       path_.string(), lock_patience.count()));
        replace_stuck_file();
        continue;
      }
      if (state == lock_state::held) {
        unlock_at_exit unlock{file_.fd.get()};
        if (!follow || names_file(path_, file_)) {
          record r{};
          check(r);
          change(r);
          r.checksum = seal(r);
          write_record(file_.fd.get(), path_, r);
          return;
        }
      }
      reopen();  // removed or replaced: follow the path, so that every user shares one file
    }
  }

  // Under the file's lock: reads the record into `r`, setting it up again when it is not a sound
  // one of this boot.
  void check(record& r) {
    ssize_t n;
    do n = ::pread(file_.fd.get(), &r, sizeof r, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) throw io_error("pread", path_, 0, errno);
    std::string damage;
    if (static_cast<std::size_t>(n) < sizeof r) {
      if (n > 0 || seen_) damage = fmt::format("truncated to {} bytes", n);
    } else if (r.magic != magic || r.checksum != seal(r)) {
      damage = r.magic == magic ? "its checksum does not match" : "not a link file of this version";
    } else if (r.boot == boot_) {
      seen_ = true;
      return;
    }  // else left by an earlier boot: set up again without a notice
    if (!damage.empty())
      notice(fmt::format("node link file {} was damaged ({}); its time line starts again", path_.string(), damage));
    r = fresh();
    seen_ = true;
  }

  [[nodiscard]] record fresh() const noexcept {
    record r{};
    r.magic = magic;
    r.boot = boot_;
    return r;
  }

  static void write_record(int fd, const std::filesystem::path& path, const record& r) {
    ssize_t n;
    do n = ::pwrite(fd, &r, sizeof r, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) throw io_error("pwrite", path, 0, errno);
    if (static_cast<std::size_t>(n) != sizeof r) throw io_error("pwrite", path, 0, EIO);
  }

  // The path names another file now, or none: open (or create) it.
  void reopen() {
    make_node_directory(dir_);  // in case the whole directory went
    file_ = open_node_file(path_);
    seen_ = false;
  }

  // Another process has held the lock past lock_patience (stopped, or hung, inside its few
  // instructions). Its lock cannot be broken, so the path gets a fresh file: made under a name no
  // link can have (a leading '.'), set up, and renamed over the path. The holder, once it runs
  // again, writes to the old file and then follows the path like everyone else.
  void replace_stuck_file() {
    if (!names_file(path_, file_)) {  // another waiter replaced it first
      reopen();
      return;
    }
    const auto tmp = dir_ / fmt::format(".link-{}.{}-{}.tmp", name_, ::getpid(), ++replacements_);
    unique_fd fd = open_file(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    try {
      record r = fresh();
      r.checksum = seal(r);
      write_record(fd.get(), tmp, r);
      if (::rename(tmp.c_str(), path_.c_str()) != 0) throw io_error("rename to " + path_.string(), tmp, errno);
    } catch (...) {
      (void)::unlink(tmp.c_str());
      throw;
    }
    notice(fmt::format("node link file {} was locked for over {} s (a process stopped while reserving?); "
                       "replaced it with a fresh one",
                       path_.string(), lock_patience.count()));
    reopen();
  }

  // This boot's id as the record keeps it (the steady clock restarts with it).
  static std::array<char, 40> boot_record() {
    std::array<char, 40> id{};
    const std::string s = detail::boot_id();
    std::memcpy(id.data(), s.data(), std::min(s.size(), id.size() - 1));
    return id;
  }

  std::filesystem::path dir_;
  std::string name_;
  std::filesystem::path path_;
  std::array<char, 40> boot_{};
  std::mutex mutex_;  // one thread of this object at a time: the flock belongs to the descriptor
  node_file file_;
  bool seen_ = false;  // a sound record was read from file_: an empty one now was truncated
  std::uint64_t replacements_ = 0;
};

}  // namespace strata::detail
