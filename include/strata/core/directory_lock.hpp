#pragma once
/// directory_lock: exclusive ownership of a directory by one object of one process. A second
/// owner, in this process or another, is refused at once with a busy_error naming the directory
/// and the holder's pid; the lock goes away with its holder, also when the holder is killed, so a
/// crash never leaves a directory locked.
///
/// What is locked is the directory itself (flock on a descriptor of it), not a file inside: a
/// file can be deleted under its holder, after which a newcomer would lock a fresh one and two
/// owners would run at once; a directory cannot be deleted while it holds files, and every
/// process that opens its path meets the same lock. The file ".strata-lock" inside only tells
/// contenders who holds it (pid, owner, host); the holder removes it on release. Where the holder
/// file is missing, the holder's pid comes from /proc/locks.
///
/// A lock with a scope ("strata.r1") owns only that scope of the directory: several owners, each
/// of another scope (optimizers with their own object prefixes, ranks of one job), share it,
/// while a second owner of the same scope is refused as above. Its lock is the holder file
/// ".strata-lock.<scope>" (flock'ed, re-checked after locking as below), never the directory.
///
/// File systems that cannot flock a directory (NFS turns flock into fcntl locks, which need a
/// descriptor open for writing) lock the holder file instead, re-checked after locking so that
/// two owners never both hold it. Where no flock works at all (Lustre without -o flock), the
/// holder file is created with O_EXCL and a leftover one is taken over only when its holder is
/// proven gone (same host and boot, and no process with its pid and start time); otherwise the
/// directory is refused with a busy_error that names the file, since a live holder on another
/// node cannot be told from a dead one.

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/node_dir.hpp"

namespace strata {

namespace detail {

/// This host's name, or empty.
[[nodiscard]] inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
  return buf;
}

/// The start time of process `pid` (clock ticks since boot, field 22 of /proc/<pid>/stat), or
/// nullopt when no such process exists.
[[nodiscard]] inline std::optional<std::uint64_t> process_start_ticks(long pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const auto close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return std::nullopt;
}

/// The pid that holds an exclusive flock on the file with status `st`, from /proc/locks (0 when
/// it cannot be told: no such line, or a pid of another pid namespace).
[[nodiscard]] inline long flock_holder(const struct stat& st) {
  std::ifstream in("/proc/locks");
  std::string line;
  const std::string dev = fmt::format("{:02x}:{:02x}:{}", major(st.st_dev), minor(st.st_dev),
                                      static_cast<unsigned long long>(st.st_ino));
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, kind, mode, access, pid, where;
    if (!(f >> id >> kind >> mode >> access >> pid >> where)) continue;
    if (kind == "FLOCK" && access == "WRITE" && where == dev) return std::strtol(pid.c_str(), nullptr, 10);
  }
  return 0;
}

}  // namespace detail

/// See the file comment. Movable, not copyable.
class directory_lock {
 public:
  /// Name of the holder file inside the directory (hidden: never a tier object's name).
  static constexpr std::string_view file_name = ".strata-lock";

  directory_lock() = default;
  /// Locks `dir` (which must exist) for `owner` (a name shown to contenders); with a `scope`
  /// (1-100 of [A-Za-z0-9._-]), only that scope of it (see the file comment).
  directory_lock(const std::filesystem::path& dir, std::string_view owner, std::string_view scope = {})
      : dir_(dir), path_(dir / file_name), owner_(owner), scope_(scope) {
    if (!scope.empty()) {
      STRATA_EXPECTS(valid_scope(scope), config_error, "directory_lock {}: scope '{}' (use 1-100 of [A-Za-z0-9._-])",
                     dir.string(), scope);
      path_ = dir / fmt::format("{}.{}", file_name, scope);
      lock_holder_file();
      return;
    }
    dir_fd_ = open_file(dir, O_RDONLY | O_DIRECTORY);
    int rc;
    do rc = ::flock(dir_fd_.get(), LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    if (rc == 0) {
      // The holder file only informs contenders: a full disk costs them the holder's name, never
      // the lock, and leaves no empty file behind.
      unique_fd fd = open_own_file(path_, O_RDWR | O_CREAT, 0644);
      try {
        write_holder_file(std::move(fd));
      } catch (const capacity_error&) {
        ::unlink(path_.c_str());
      }
      return;
    }
    const int err = errno;
    if (err == EWOULDBLOCK) refuse(dir_fd_.get());
    dir_fd_.reset();
    if (err != EBADF && err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS && err != EINVAL)
      throw io_error("flock", dir, err);
    lock_holder_file();
  }
  directory_lock(directory_lock&& o) noexcept { *this = std::move(o); }
  directory_lock& operator=(directory_lock&& o) noexcept {
    if (this != &o) {
      release();
      dir_ = std::move(o.dir_);
      path_ = std::move(o.path_);
      owner_ = std::move(o.owner_);
      scope_ = std::move(o.scope_);
      dir_fd_ = std::move(o.dir_fd_);
      file_fd_ = std::move(o.file_fd_);
      o.path_.clear();
    }
    return *this;
  }
  directory_lock(const directory_lock&) = delete;
  directory_lock& operator=(const directory_lock&) = delete;
  ~directory_lock() { release(); }

  /// Whether this object holds a lock.
  [[nodiscard]] bool held() const noexcept { return dir_fd_.get() >= 0 || file_fd_.get() >= 0; }
  /// The directory locked.
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

  /// Whether `scope` may name a scope: 1-100 of [A-Za-z0-9._-].
  [[nodiscard]] static bool valid_scope(std::string_view scope) noexcept {
    bool ok = !scope.empty() && scope.size() <= 100;
    for (char c : scope)
      ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                  c == '-');
    return ok;
  }

 private:
  struct holder_info {
    long pid = 0;
    std::string owner, host, boot;
    std::uint64_t start = 0;
  };

  // What the holder file says (empty when missing, unreadable or not one of ours).
  [[nodiscard]] holder_info read_holder() const {
    holder_info h;
    try {
      const auto fd = open_own_file(path_, O_RDONLY);
      char buf[1024] = {};
      const ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
      if (n <= 0) return h;
      std::istringstream in(std::string(buf, static_cast<std::size_t>(n)));
      std::string pid, start;
      std::getline(in, pid);
      std::getline(in, h.owner);
      std::getline(in, h.host);
      std::getline(in, h.boot);
      std::getline(in, start);
      h.pid = std::strtol(pid.c_str(), nullptr, 10);
      h.start = std::strtoull(start.c_str(), nullptr, 10);
    } catch (const error&) {  // no holder file (deleted under its holder, or none yet): unknown
    }
    return h;
  }

  [[noreturn]] void refuse(int locked_fd) const {
    auto h = read_holder();
    struct stat st {};
    if (::fstat(locked_fd, &st) == 0)
      if (const long p = detail::flock_holder(st); p > 0 && p != h.pid) h = holder_info{p, {}, {}, {}, 0};
    const bool same = h.pid == static_cast<long>(::getpid());
    if (!scope_.empty())
      throw busy_error(fmt::format("scope '{}' of directory {} is in use by {} (pid {}{}): each scope (object prefix) of "
                                   "a directory belongs to one owner of one process at a time",
                                   scope_, dir_.string(), h.owner.empty() ? std::string("another owner") : h.owner,
                                   h.pid > 0 ? std::to_string(h.pid) : std::string("unknown"), same ? ", this process" : ""),
                       h.pid);
    throw busy_error(fmt::format("directory {} is in use by {} (pid {}{}): each tier or checkpoint directory belongs "
                                 "to one owner of one process at a time",
                                 dir_.string(), h.owner.empty() ? std::string("another owner") : h.owner,
                                 h.pid > 0 ? std::to_string(h.pid) : std::string("unknown"),
                                 same ? ", this process" : ""),
                     h.pid);
  }

  void write_holder_file(unique_fd fd) {
    const std::string text = fmt::format("{}\n{}\n{}\n{}\n{}\n", static_cast<long>(::getpid()), owner_,
                                         detail::host_name(), detail::boot_id(),
                                         detail::process_start_ticks(::getpid()).value_or(0));
    if (::ftruncate(fd.get(), 0) != 0) throw io_error("ftruncate", path_, errno);
    if (::pwrite(fd.get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
      detail::throw_write_error("pwrite", path_, 0, errno == 0 ? EIO : errno);
    file_fd_ = std::move(fd);
  }

  // The directory cannot be flocked: lock the holder file, or, without flock, own it by O_EXCL.
  void lock_holder_file() {
    for (int attempt = 0;; ++attempt) {
      if (attempt > 100) throw io_error("lock (the holder file keeps changing)", path_, EAGAIN);
      unique_fd fd = open_own_file(path_, O_RDWR | O_CREAT, 0644);
      int rc;
      do rc = ::flock(fd.get(), LOCK_EX | LOCK_NB);
      while (rc != 0 && errno == EINTR);
      if (rc != 0) {
        const int err = errno;
        if (err == EWOULDBLOCK) refuse(fd.get());
        if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS && err != EINVAL) throw io_error("flock", path_, err);
        fd.reset();
        exclusive_holder_file();
        return;
      }
      // Keep it only if the path still names this file (the last holder may have removed it).
      struct stat held {}, named {};
      if (::fstat(fd.get(), &held) != 0) throw io_error("fstat", path_, errno);
      if (::lstat(path_.c_str(), &named) == 0 && named.st_ino == held.st_ino && named.st_dev == held.st_dev) {
        write_holder_file(std::move(fd));
        return;
      }
    }
  }

  void exclusive_holder_file() {
    for (int attempt = 0; attempt < 3; ++attempt) {
      try {
        write_holder_file(open_own_file(path_, O_RDWR | O_CREAT | O_EXCL, 0644));
        return;
      } catch (const foreign_file_error&) {
        struct stat st {};
        if (::lstat(path_.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) throw;
      }
      const auto h = read_holder();
      const bool here = !h.host.empty() && h.host == detail::host_name() && !h.boot.empty() && h.boot == detail::boot_id();
      const auto start = h.pid > 0 ? detail::process_start_ticks(h.pid) : std::nullopt;
      const bool gone = here && h.pid > 0 && (!start || *start != h.start);
      if (!gone)
        throw busy_error(fmt::format("directory {} may be in use by {} (pid {} on host {}): its file system has no "
                                     "flock, and strata cannot prove that holder gone; remove {} if you know it is",
                                     dir_.string(), h.owner.empty() ? std::string("another owner") : h.owner, h.pid,
                                     h.host.empty() ? std::string("unknown") : h.host, path_.string()),
                         here ? h.pid : 0);
      ::unlink(path_.c_str());  // a holder that is provably dead: its file is ours to replace
    }
    throw io_error("lock (the holder file keeps changing)", path_, EAGAIN);
  }

  void release() noexcept {
    if (!held()) return;
    // Remove the holder file while still locked, and only if the path still names it.
    struct stat mine {}, named {};
    if (file_fd_.get() >= 0 && ::fstat(file_fd_.get(), &mine) == 0 && ::lstat(path_.c_str(), &named) == 0 &&
        mine.st_ino == named.st_ino && mine.st_dev == named.st_dev)
      ::unlink(path_.c_str());
    file_fd_.reset();
    dir_fd_.reset();
  }

  std::filesystem::path dir_;
  std::filesystem::path path_;
  std::string owner_;
  std::string scope_;
  unique_fd dir_fd_;   // flock'ed: the lock (when the file system can lock a directory)
  unique_fd file_fd_;  // the holder file (flock'ed where the directory cannot be)
};

}  // namespace strata
