#pragma once
/// Where node-wide coordination files live (node limiters, shared links): one directory per user
/// on a node-local file system, so every process of the node that names the same thing finds it.

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

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

/// mkdir -p that throws io_error naming the directory.
inline void make_directories(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw io_error("mkdir", dir, ec.value());
  if (!std::filesystem::is_directory(dir, ec)) throw io_error("mkdir", dir, ENOTDIR);
}

}  // namespace detail
}  // namespace strata
