#pragma once
/// File-descriptor ownership and whole-file writes that every syscall checks: the small POSIX
/// layer that traces, manifests and checkpoints share.

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <utility>

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

/// Writes all of `bytes` at the current position, completing short writes and retrying EINTR.
inline void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw io_error("write", path, done, errno);
    }
    done += static_cast<std::size_t>(n);
  }
}

/// Durability requested of write_file_atomic.
enum class durability : std::uint8_t { none, fsync };

/// Replaces `path` with `contents` atomically: readers see the old file or the new one, never a
/// mix. Writes "<path>.tmp" and renames it; with durability::fsync the data and the directory
/// entry are synced first, so the new file also survives a crash.
inline void write_file_atomic(const std::filesystem::path& path, std::string_view contents,
                              durability mode = durability::none) {
  auto tmp = path;
  tmp += ".tmp";
  try {
    auto fd = open_file(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    write_all(fd.get(), std::as_bytes(std::span(contents.data(), contents.size())), tmp);
    if (mode == durability::fsync && ::fsync(fd.get()) != 0) throw io_error("fsync", tmp, errno);
    fd.close(tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw io_error("rename to " + path.string(), tmp, errno);
  } catch (...) {
    ::unlink(tmp.c_str());  // leave no half-written temporary behind
    throw;
  }
  if (mode == durability::fsync) {
    auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
    auto dfd = open_file(dir, O_RDONLY | O_DIRECTORY);
    if (::fsync(dfd.get()) != 0) throw io_error("fsync", dir, errno);
  }
}

/// Directories a tool created, so that it can remove exactly those afterwards: create(dir)
/// makes `dir` and its missing parents and remembers which of them did not exist before;
/// remove_empty() removes them, deepest first, each only if it is empty by then (never a file,
/// never a directory that was already there). Not thread-safe.
class created_directories {
 public:
  /// Creates `dir` (and missing parents); io_error naming it on failure.
  void create(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> missing;
    std::error_code ec;
    for (auto p = std::filesystem::absolute(dir, ec).lexically_normal(); !p.empty() && !std::filesystem::exists(p, ec);
         p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.parent_path()) break;
    }
    std::filesystem::create_directories(dir, ec);
    if (ec) throw io_error("mkdir", dir, ec.value());
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) created_.push_back(*it);
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
