#pragma once
/// File-descriptor ownership and whole-file writes that every syscall checks: the small POSIX
/// layer that traces, manifests and checkpoints share.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <utility>

#include <fmt/format.h>

#include "strata/core/error.hpp"

namespace strata {

/// Owns a file descriptor and closes it on destruction. Move-only.
class unique_fd {
 public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership without closing.
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the current descriptor (errors ignored: use close() where they matter) and owns `fd`.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  /// Closes and reports failure: on some filesystems (NFS, PFS) close() is where a write error
  /// first shows, so writers call this rather than rely on the destructor.
  void close(const std::filesystem::path& path) {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) throw io_error("close", path, errno);
  }

 private:
  int fd_ = -1;
};

/// open(2) that retries EINTR and throws io_error naming the path.
[[nodiscard]] inline unique_fd open_file(const std::filesystem::path& path, int flags, mode_t mode = 0644) {
  for (;;) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd >= 0) return unique_fd(fd);
    if (errno != EINTR) throw io_error("open", path, errno);
  }
}

namespace detail {

/// What a file of type `mode` is, for messages ("a symlink", "a FIFO", ...).
[[nodiscard]] inline std::string_view file_type_text(mode_t mode) noexcept {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symlink";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    default: return "a special file";
  }
}

/// Why a file with status `st` cannot be strata's own (empty when it can): strata's files are
/// regular files of this user with no other hard link.
[[nodiscard]] inline std::string not_own_reason(const struct stat& st) {
  if (!S_ISREG(st.st_mode)) return std::string(file_type_text(st.st_mode));
  if (st.st_uid != ::geteuid()) return fmt::format("a file of uid {}", static_cast<long>(st.st_uid));
  if (st.st_nlink > 1) return fmt::format("a file with {} hard links", static_cast<long>(st.st_nlink));
  return {};
}

[[noreturn]] inline void throw_not_own(const std::filesystem::path& path, std::string_view reason) {
  throw foreign_file_error(fmt::format("{} is {}, not a file strata made: strata neither follows, changes nor removes "
                                       "it (move it away to let strata use this name)",
                                       path.string(), reason),
                           path);
}

}  // namespace detail

/// Opens one of strata's own files (a lock, a journal, a manifest, a tier object), never
/// anything else: the last component is not followed (O_NOFOLLOW), opening never blocks (a FIFO),
/// and the file must be a regular file of this user with no other hard link, else
/// foreign_file_error naming it. O_CREAT | O_EXCL creates it new; O_TRUNC truncates only after the
/// checks. Other failures are io_errors.
[[nodiscard]] inline unique_fd open_own_file(const std::filesystem::path& path, int flags, mode_t mode = 0644) {
  const bool truncate = (flags & O_TRUNC) != 0;
  unique_fd fd;
  for (;;) {
    const int f = ::open(path.c_str(), (flags & ~O_TRUNC) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
    if (f >= 0) {
      fd.reset(f);
      break;
    }
    const int err = errno;
    if (err == EINTR) continue;
    struct stat st {};
    if ((err == ELOOP || err == ENXIO || err == EISDIR || err == EWOULDBLOCK || err == EEXIST) &&
        ::lstat(path.c_str(), &st) == 0) {
      if (const auto why = detail::not_own_reason(st); !why.empty()) detail::throw_not_own(path, why);
      if (err == EEXIST) detail::throw_not_own(path, "a file that existed before strata would have created it");
    }
    throw io_error("open", path, err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw io_error("fstat", path, errno);
  if (const auto why = detail::not_own_reason(st); !why.empty()) detail::throw_not_own(path, why);
  if (truncate && st.st_size != 0 && ::ftruncate(fd.get(), 0) != 0) throw io_error("ftruncate", path, errno);
  return fd;
}

namespace detail {
/// A full device or quota as capacity_error (what callers can act on), anything else as io_error.
[[noreturn]] inline void throw_write_error(std::string_view op, const std::filesystem::path& path,
                                           std::optional<std::uint64_t> offset, int err) {
  if (err == ENOSPC || err == EDQUOT)
    throw capacity_error(fmt::format("{} {}{}: {}", op, path.string(),
                                     offset ? fmt::format(" at offset {}", *offset) : std::string(), errno_text(err)));
  throw io_error(op, path, offset, err);
}
}  // namespace detail

/// Creates `path` as a new file that holds `contents` from the moment it has its name, never
/// replacing anything: returns an O_RDWR descriptor of it, or an empty one when the name is
/// taken (by a file of any kind, a dangling symlink included). The file is written unnamed
/// (O_TMPFILE) and then linked in, so a kill never leaves it empty or short, and a name strata
/// reserves (a lock, a journal) is only ever seen holding what strata wrote. `prepare(fd)` runs
/// on the file before it gets its name (a lock, say). Where the file system has no O_TMPFILE
/// (NFS), it is created (O_EXCL) and then prepared and written: a kill in between leaves it short.
/// A full device is a capacity_error (and nothing is left); other failures io_errors naming it.
template <class Prepare>
[[nodiscard]] unique_fd create_file_whole(const std::filesystem::path& path, std::string_view contents,
                                          Prepare&& prepare, mode_t mode = 0644) {
  const auto write_contents = [&](int fd) {
    for (std::size_t done = 0; done < contents.size();) {
      const ssize_t n = ::pwrite(fd, contents.data() + done, contents.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) detail::throw_write_error("pwrite", path, done, n < 0 ? errno : EIO);
      done += static_cast<std::size_t>(n);
    }
  };
  const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (const int t = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, mode); t >= 0) {
    unique_fd fd(t);
    write_contents(fd.get());
    prepare(fd.get());
    // (linkat with AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc name does not)
    const auto self = fmt::format("/proc/self/fd/{}", fd.get());
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) == 0) return fd;
    const int err = errno;
    if (err == EEXIST) return {};
    if (err != ENOENT && err != EPERM && err != EOPNOTSUPP && err != EXDEV) throw io_error("link", path, err);
  }
  unique_fd fd;
  for (;;) {
    const int f = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
    if (f >= 0) {
      fd.reset(f);
      break;
    }
    if (errno == EEXIST) return {};
    if (errno != EINTR) throw io_error("open", path, errno);
  }
  try {
    prepare(fd.get());
    write_contents(fd.get());
  } catch (...) {
    ::unlink(path.c_str());  // made just now (O_EXCL): ours to remove
    throw;
  }
  return fd;
}
/// create_file_whole with nothing to prepare.
[[nodiscard]] inline unique_fd create_file_whole(const std::filesystem::path& path, std::string_view contents,
                                                 mode_t mode = 0644) {
  return create_file_whole(path, contents, [](int) {}, mode);
}

/// Writes all of `bytes` at the current position, completing short writes and retrying EINTR.
/// A full device (ENOSPC, EDQUOT) is a capacity_error; other failures io_errors.
inline void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      detail::throw_write_error("write", path, done, errno);
    }
    done += static_cast<std::size_t>(n);
  }
}

/// fsync(2) or fdatasync(2) (`data_only`) that names the file; ENOSPC/EDQUOT (delayed
/// allocation, NFS) are capacity_errors.
inline void sync_file(int fd, const std::filesystem::path& path, bool data_only = false) {
  while ((data_only ? ::fdatasync(fd) : ::fsync(fd)) != 0) {
    if (errno == EINTR) continue;
    detail::throw_write_error(data_only ? "fdatasync" : "fsync", path, std::nullopt, errno);
  }
}

/// Durability requested of write_file_atomic.
enum class durability : std::uint8_t { none, fsync };

/// Replaces `path` with `contents` atomically: readers see the old file or the new one, never a
/// mix. Writes "<path>.tmp" (a file of strata's own: open_own_file) and renames it over `path`,
/// which must not be a symlink, FIFO or directory (foreign_file_error: it is left alone); with
/// durability::fsync the data and the directory entry are synced first, so the new file also
/// survives a crash. A full device is a capacity_error; nothing of the attempt is left behind.
inline void write_file_atomic(const std::filesystem::path& path, std::string_view contents,
                              durability mode = durability::none) {
  struct stat target {};
  if (::lstat(path.c_str(), &target) == 0 && !S_ISREG(target.st_mode)) detail::throw_not_own(path, detail::file_type_text(target.st_mode));
  auto tmp = path;
  tmp += ".tmp";
  auto fd = open_own_file(tmp, O_WRONLY | O_CREAT | O_TRUNC);  // (throws before anything is ours to remove)
  try {
    write_all(fd.get(), std::as_bytes(std::span(contents.data(), contents.size())), tmp);
    if (mode == durability::fsync) sync_file(fd.get(), tmp);
    fd.close(tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw io_error("rename to " + path.string(), tmp, errno);
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());  // ours (checked at open): leave no half-written temporary behind
    throw;
  }
  if (mode == durability::fsync) {
    auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    auto dfd = open_file(dir, O_RDONLY | O_DIRECTORY);
    sync_file(dfd.get(), dir);
  }
}

/// Directories a tool created, so that it can remove exactly those afterwards: create(dir)
/// makes `dir` and its missing parents and remembers which of them did not exist before;
/// remove_empty() removes them, deepest first, each only if it is empty by then (never a file,
/// never a directory that was already there). Not thread-safe.
class created_directories {
 public:
  /// Creates `dir` (and missing parents); io_error naming it on failure, after which the
  /// directories this call made are removed again.
  void create(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> missing;
    std::error_code ec;
    auto start = std::filesystem::absolute(dir, ec).lexically_normal();
    if (ec) throw io_error("mkdir", dir, ec.value());
    if (!start.has_filename() && start.has_relative_path()) start = start.parent_path();  // "a/b/": "a/b", once
    for (auto p = start; !p.empty() && !std::filesystem::exists(p, ec); p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.parent_path()) break;
    }
    std::vector<std::filesystem::path> made;
    const auto undo = [&] {
      for (auto it = made.rbegin(); it != made.rend(); ++it) ::rmdir(it->c_str());
    };
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (::mkdir(it->c_str(), 0777) == 0) {
        made.push_back(*it);
      } else if (const int err = errno; err != EEXIST) {  // (EEXIST: made meanwhile by someone else)
        undo();
        throw io_error("mkdir", *it, err);
      }
    }
    struct stat st {};
    const int rc = ::stat(start.c_str(), &st);
    if (rc != 0 || !S_ISDIR(st.st_mode)) {
      const int err = rc != 0 ? errno : ENOTDIR;
      undo();
      throw io_error("mkdir", dir, err);
    }
    created_.insert(created_.end(), made.begin(), made.end());
  }
  /// Removes the created directories that are empty now, deepest first; returns how many.
  std::size_t remove_empty() noexcept {
    std::size_t n = 0;
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
      std::error_code ec;
      n += std::filesystem::remove(*it, ec) ? 1 : 0;  // fails (and keeps it) when not empty
    }
    created_.clear();
    return n;
  }
  /// The directories created, parents first.
  [[nodiscard]] const std::vector<std::filesystem::path>& paths() const noexcept { return created_; }

 private:
  std::vector<std::filesystem::path> created_;
};

}  // namespace strata
