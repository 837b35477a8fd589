#pragma once
/// Where node-wide coordination files live (node limiters, shared links): one directory per user
/// on a node-local file system, so every process of the node that names the same thing finds it.
///
/// Those directories and files are shared with every process of the node, so strata trusts
/// nothing it finds there: the directory must be a real directory (not a symbolic link) owned by
/// this user, and every file of ours is opened as open_own_file does (fs.hpp): never through a
/// link (O_NOFOLLOW), never blocking (a FIFO), and used only when it is a regular file of this
/// user. Anything else is refused with a foreign_file_error naming the path, so that a link
/// planted at one of our names can never make strata write to a file of the user's (or create one
/// outside), and a FIFO never blocks it. Only the last component of a directory is checked: in
/// the default places (/dev/shm, /tmp: sticky) no other user can rename or remove one of ours.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "strata/core/checksum.hpp"
#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/fs.hpp"

namespace strata {

/// Where node limiters keep their files when no directory is given: $STRATA_NODE_LIMITER_DIR
/// (an absolute path), else /dev/shm/strata-<uid> (tmpfs: nothing touches a disk), else
/// /tmp/strata-<uid>. Per user, so that two users' jobs on one node never trip over each other's
/// file permissions.
[[nodiscard]] inline std::filesystem::path default_node_limiter_dir() {
  if (auto v = env_raw("STRATA_NODE_LIMITER_DIR")) {
    if (!std::filesystem::path(*v).is_absolute())
      detail::bad_env("STRATA_NODE_LIMITER_DIR", *v, "must be an absolute path (every process must see the same one)");
    return *v;
  }
  const auto user = fmt::format("strata-{}", ::getuid());
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec)) return std::filesystem::path("/dev/shm") / user;
  return std::filesystem::path("/tmp") / user;
}

namespace detail {

/// A node-wide object's name must be a plain file name: config_error naming `kind` otherwise.
inline void check_node_name(std::string_view kind, const std::string& name) {
  const bool ok = !name.empty() && name.size() <= 200 && name.front() != '.' &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                           c == '_' || c == '-';
                  });
  STRATA_EXPECTS(ok, config_error,
                 "{}: invalid name \"{}\": use 1 to 200 letters, digits, '.', '_' or '-', not starting with '.'",
                 kind, name);
}

/// This boot's id (/proc/sys/kernel/random/boot_id: the steady clock and pids restart with it),
/// or empty where the kernel does not say.
[[nodiscard]] inline std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string s;
  in >> s;
  return s;
}

/// A node-wide file opened for reading and writing, with the identity it had when opened.
struct node_file {
  unique_fd fd;
  dev_t device = 0;
  ino_t inode = 0;
};

/// Opens the node-wide file `path`, creating it (mode 0600) when missing, as open_own_file does:
/// never through a symbolic link, never blocking on a FIFO, only a regular file of this user
/// (foreign_file_error naming it otherwise).
[[nodiscard]] inline node_file open_node_file(const std::filesystem::path& path) {
  node_file f;
  f.fd = open_own_file(path, O_RDWR | O_CREAT, 0600);
  struct stat st{};
  if (::fstat(f.fd.get(), &st) != 0) throw io_error("fstat", path, errno);
  f.device = st.st_dev;
  f.inode = st.st_ino;
  return f;
}

/// Whether `path` still names the file `f` (it may have been removed or replaced meanwhile).
[[nodiscard]] inline bool names_file(const std::filesystem::path& path, const node_file& f) noexcept {
  struct stat st{};
  return ::lstat(path.c_str(), &st) == 0 && st.st_dev == f.device && st.st_ino == f.inode;
}

/// Creates the node directory `directory` and its missing parents (new ones with mode 0700),
/// then checks that it is a real directory of this user: a symbolic link or another user's
/// directory is a foreign_file_error naming it (strata would otherwise put its files wherever the
/// link points, or where another user can swap them), anything else an io_error.
inline void make_node_directory(const std::filesystem::path& directory) {
  auto dir = directory.lexically_normal();
  if (!dir.has_filename() && dir.has_parent_path()) dir = dir.parent_path();  // "a/b/" would follow a link at b
  std::filesystem::path prefix;
  for (const auto& part : dir) {
    prefix /= part;
    if (part.empty() || part == prefix.root_path() || part == "." || part == "..") continue;
    while (::mkdir(prefix.c_str(), 0700) != 0) {
      if (errno == EEXIST) break;
      if (errno != EINTR) throw io_error("mkdir", prefix, errno);
    }
  }
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) throw io_error("mkdir", dir, errno);
  if (S_ISDIR(st.st_mode) && st.st_uid == ::geteuid()) return;
  if (!S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode)) throw io_error("mkdir", dir, ENOTDIR);
  throw foreign_file_error(
      fmt::format("node directory {} is {}, not a directory of this user (uid {}): strata keeps its node-wide files "
                  "only in a real directory of its own (remove it, or name another one with "
                  "STRATA_NODE_LIMITER_DIR)",
                  dir.string(),
                  S_ISLNK(st.st_mode) ? std::string("a symlink") : fmt::format("a directory of uid {}", st.st_uid),
                  ::geteuid()),
      dir);
}

}  // namespace detail
}  // namespace strata
