#pragma once
/// directory_lock: exclusive ownership of a directory by one object of one process, through an
/// advisory lock (flock) on a lock file inside it. A second owner, in this process or another, is
/// refused at once with a busy_error naming the directory and the holder's pid; the lock goes
/// away with its holder, also when the holder is killed (the kernel drops flock locks with the
/// last descriptor), so a crash never leaves a directory locked.
///
/// The lock file (".strata-lock", holding the owner's pid and name) is removed by the holder on
/// release. A contender that opened it just before it was removed finds, after locking, that the
/// path no longer names the file it locked, and starts over: two owners can never both hold the
/// lock.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/notice.hpp"

namespace strata {

/// See the file comment. Movable, not copyable.
class directory_lock {
 public:
  /// Name of the lock file inside the directory (hidden: never a tier object's name).
  static constexpr std::string_view file_name = ".strata-lock";

  directory_lock() = default;
  /// Locks `dir` (which must exist) for `owner` (a name shown to contenders).
  directory_lock(const std::filesystem::path& dir, std::string_view owner) : path_(dir / file_name) {
    for (int attempt = 0;; ++attempt) {
      unique_fd fd = open_file(path_, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err == ENOSYS || err == ENOLCK || err == EOPNOTSUPP) {
          // Some parallel file systems (Lustre without -o flock) have no flock: say so, go on unowned.
          notice(fmt::format("directory {}: the file system does not support flock ({}); its ownership is not "
                             "enforced", dir.string(), detail::errno_text(err)));
          return;
        }
        if (err != EWOULDBLOCK) throw io_error("flock", path_, err);
        const auto [pid, who] = holder(fd.get());
        throw busy_error(fmt::format("directory {} is in use by {} (pid {}; lock file {}): each tier directory belongs "
                                     "to one tier of one process at a time",
                                     dir.string(), who.empty() ? std::string("another owner") : who,
                                     pid > 0 ? std::to_string(pid) : std::string("unknown"), path_.string()),
                         pid);
      }
      // Locked: keep it only if the path still names this file (the last holder may have removed it).
      struct stat held {}, named {};
      if (::fstat(fd.get(), &held) != 0) throw io_error("fstat", path_, errno);
      if (::stat(path_.c_str(), &named) == 0 && named.st_ino == held.st_ino && named.st_dev == held.st_dev) {
        const std::string text = fmt::format("{}\n{}\n", static_cast<long>(::getpid()), owner);
        if (::ftruncate(fd.get(), 0) != 0) throw io_error("ftruncate", path_, errno);
        write_all(fd.get(), std::as_bytes(std::span(text.data(), text.size())), path_);
        fd_ = std::move(fd);
        return;
      }
      if (attempt > 100) throw io_error("lock (the lock file keeps changing)", path_, EAGAIN);
    }
  }
  directory_lock(directory_lock&& o) noexcept : path_(std::move(o.path_)), fd_(std::move(o.fd_)) { o.path_.clear(); }
  directory_lock& operator=(directory_lock&& o) noexcept {
    if (this != &o) {
      release();
      path_ = std::move(o.path_);
      fd_ = std::move(o.fd_);
      o.path_.clear();
    }
    return *this;
  }
  directory_lock(const directory_lock&) = delete;
  directory_lock& operator=(const directory_lock&) = delete;
  ~directory_lock() { release(); }

  /// Whether this object holds a lock.
  [[nodiscard]] bool held() const noexcept { return fd_.get() >= 0; }

 private:
  /// The pid and owner name the holder wrote (0 and empty while it is still writing them).
  static std::pair<long, std::string> holder(int fd) {
    char buf[512] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return {0, {}};
    const std::string_view text(buf, static_cast<std::size_t>(n));
    const auto nl = text.find('\n');
    const long pid = std::strtol(std::string(text.substr(0, nl)).c_str(), nullptr, 10);
    std::string who;
    if (nl != std::string_view::npos) who = std::string(text.substr(nl + 1, text.find('\n', nl + 1) - nl - 1));
    return {pid, who};
  }
  void release() noexcept {
    if (!held()) return;
    ::unlink(path_.c_str());  // while still locked: a contender that opened it re-checks the path
    fd_.reset();
  }

  std::filesystem::path path_;
  unique_fd fd_;
};

}  // namespace strata
