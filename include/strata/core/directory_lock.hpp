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
/// The holder file is strata's only when it starts with `header` ("strata-lock 1"; the release
/// before wrote the same lines without it, and those are recognised too). It is created whole
/// (written unnamed, then linked in: core/fs.hpp create_file_whole) and rewritten in place, so a
/// killed holder's file always shows the header. Any other file at that name, an empty one
/// included (an earlier release killed as it started could leave one, but so can a user),
/// is someone else's: the lock is refused with a foreign_file_error naming it, and it is never
/// written, truncated or removed.
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
#include <vector>

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
  /// The first line of every holder file strata writes.
  static constexpr std::string_view header = "strata-lock 1\n";

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
      name_holder_of_locked_directory();
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
    try {
      const auto fd = open_own_file(path_, O_RDONLY);
      return parse_holder(read_text(fd.get()));
    } catch (const error&) {  // no holder file (deleted under its holder, or none yet): unknown
    }
    return {};
  }

  // The start of the file open at `fd` (a holder file is a few short lines).
  [[nodiscard]] std::string read_text(int fd) const {
    char buf[1024];
    for (;;) {
      const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
      if (n >= 0) return std::string(buf, static_cast<std::size_t>(n));
      if (errno != EINTR) throw io_error("pread", path_, 0, errno);
    }
  }

  // The lines of a holder file of strata's: `header` and then pid, owner, host, boot id, start
  // time; the release before wrote the same lines without the header.
  [[nodiscard]] static std::optional<std::vector<std::string>> holder_lines(std::string_view text) {
    const bool headed = text.starts_with(header);
    if (headed) text.remove_prefix(header.size());
    std::vector<std::string> lines;
    while (!text.empty()) {
      const auto nl = text.find('\n');
      if (nl == std::string_view::npos) return std::nullopt;
      lines.emplace_back(text.substr(0, nl));
      text.remove_prefix(nl + 1);
    }
    const auto digits = [](const std::string& l) {
      return !l.empty() && l.find_first_not_of("0123456789") == std::string::npos;
    };
    if (headed) {
      if (lines.size() < 5) lines.resize(5);  // (never short as written; tolerated when read)
      return lines;
    }
    // Without the header only the exact shape the release before wrote is taken as strata's.
    const bool legacy = lines.size() == 5 && digits(lines[0]) && !lines[1].empty() && digits(lines[4]) &&
                        lines[3].size() <= 36 && lines[3].find_first_not_of("0123456789abcdef-") == std::string::npos;
    if (!legacy) return std::nullopt;
    return lines;
  }

  [[nodiscard]] static holder_info parse_holder(std::string_view text) {
    holder_info h;
    const auto lines = holder_lines(text);
    if (!lines) return h;
    h.pid = std::strtol((*lines)[0].c_str(), nullptr, 10);
    h.owner = (*lines)[1];
    h.host = (*lines)[2];
    h.boot = (*lines)[3];
    h.start = std::strtoull((*lines)[4].c_str(), nullptr, 10);
    return h;
  }

  // A holder file that is not strata's (the text read from it): refused by name, left as it is.
  [[noreturn]] void refuse_foreign(std::string_view text) const {
    throw foreign_file_error(
        fmt::format("{} is {}, so not a lock file strata made: strata never writes, truncates or removes a file it did "
                    "not make, and will not use {} while it is there. Move it away{}",
                    path_.string(),
                    text.empty() ? std::string("empty")
                                 : fmt::format("a file that does not start with '{}'", header.substr(0, header.size() - 1)),
                    dir_.string(),
                    text.empty() ? " (an earlier strata release killed as it started could leave an empty one: "
                                   "remove it if so)"
                                 : ""),
        path_);
  }

  // This holder's lines (with the header: a file of them is always strata's).
  [[nodiscard]] std::string holder_text() const {
    return fmt::format("{}{}\n{}\n{}\n{}\n{}\n", header, static_cast<long>(::getpid()), owner_, detail::host_name(),
                       detail::boot_id(), detail::process_start_ticks(::getpid()).value_or(0));
  }

  // A new holder file, whole before it has its name, locked first when `lock_it` (unless the
  // file system has no flock: then `no_flock`, and the name alone, taken exclusively, is the
  // lock). Empty when the name is taken.
  [[nodiscard]] unique_fd create_holder(bool lock_it, bool& no_flock) {
    no_flock = false;
    return create_file_whole(path_, holder_text(), [&](int fd) {
      if (!lock_it) return;
      int rc;
      do rc = ::flock(fd, LOCK_EX | LOCK_NB);
      while (rc != 0 && errno == EINTR);
      if (rc == 0) return;
      const int err = errno;
      if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS && err != EINVAL) throw io_error("flock", path_, err);
      no_flock = true;
    });
  }

  // The holder file at the name, opened for rewriting: nullopt when there is none.
  [[nodiscard]] std::optional<unique_fd> open_existing_holder() const {
    try {
      return open_own_file(path_, O_RDWR);
    } catch (const io_error& e) {
      if (e.error_number() == ENOENT) return std::nullopt;
      throw;
    }
  }

  // Rewrites a holder file of strata's (checked by the caller) as this holder's, in place: the
  // header stays first throughout, so even a kill midway leaves it recognisably strata's.
  void take_holder(unique_fd fd) {
    const std::string text = holder_text();
    if (::pwrite(fd.get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
      detail::throw_write_error("pwrite", path_, 0, errno == 0 ? EIO : errno);
    if (::ftruncate(fd.get(), static_cast<off_t>(text.size())) != 0) throw io_error("ftruncate", path_, errno);
    file_fd_ = std::move(fd);
  }

  // The directory is locked (flock): a holder file at the name is a killed holder's (taken over)
  // or someone else's (refused). The file only informs contenders: a full disk costs them the
  // holder's name, never the lock.
  void name_holder_of_locked_directory() {
    for (int attempt = 0; attempt < 3; ++attempt) {
      try {
        bool no_flock = false;
        if (auto fd = create_holder(false, no_flock)) {
          file_fd_ = std::move(fd);
          return;
        }
        auto fd = open_existing_holder();
        if (!fd) continue;  // removed meanwhile
        const auto text = read_text(fd->get());
        if (!holder_lines(text)) refuse_foreign(text);
        take_holder(std::move(*fd));
        return;
      } catch (const capacity_error&) {
        return;
      }
    }
    throw io_error("lock (the holder file keeps changing)", path_, EAGAIN);
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

  // The directory cannot be flocked: lock the holder file, or, without flock, own it by its name.
  void lock_holder_file() {
    for (int attempt = 0;; ++attempt) {
      if (attempt > 100) throw io_error("lock (the holder file keeps changing)", path_, EAGAIN);
      bool no_flock = false;
      if (auto fd = create_holder(true, no_flock)) {  // new, and locked before it had its name
        file_fd_ = std::move(fd);
        return;
      }
      auto existing = open_existing_holder();
      if (!existing) continue;  // removed meanwhile
      unique_fd fd = std::move(*existing);
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
      const auto text = read_text(fd.get());
      if (!holder_lines(text)) refuse_foreign(text);
      // Keep it only if the path still names this file (the last holder may have removed it).
      struct stat held {}, named {};
      if (::fstat(fd.get(), &held) != 0) throw io_error("fstat", path_, errno);
      if (::lstat(path_.c_str(), &named) == 0 && named.st_ino == held.st_ino && named.st_dev == held.st_dev) {
        take_holder(std::move(fd));
        return;
      }
    }
  }

  void exclusive_holder_file() {
    for (int attempt = 0; attempt < 3; ++attempt) {
      bool no_flock = false;
      if (auto fd = create_holder(false, no_flock)) {
        file_fd_ = std::move(fd);
        return;
      }
      std::string text;
      try {
        text = read_text(open_own_file(path_, O_RDONLY).get());
      } catch (const io_error& e) {
        if (e.error_number() == ENOENT) continue;  // removed meanwhile
        throw;
      }
      if (!holder_lines(text)) refuse_foreign(text);
      const auto h = parse_holder(text);
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
