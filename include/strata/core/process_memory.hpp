#pragma once
/// This process's resident memory (Linux /proc/self/status): what a host-memory budget is
/// ultimately judged by. `read_process_memory()` gives the resident set now and its peak;
/// `reset_peak_resident()` starts a new peak, so a program can measure one phase of its run
/// (set-up, then steps) and split it into what it allocated itself and what strata holds.

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "strata/core/error.hpp"

namespace strata {

/// Bytes resident now and the most resident since the process started or the last
/// reset_peak_resident().
struct process_memory {
  std::uint64_t resident = 0;  ///< VmRSS
  std::uint64_t peak = 0;      ///< VmHWM
};

namespace detail {
/// The number of "    123456 kB" (what follows a field's name) in bytes; 0 when unreadable.
inline std::uint64_t status_kib(const char* rest) noexcept {
  unsigned long long kib = 0;
  return std::sscanf(rest, " %llu", &kib) == 1 ? static_cast<std::uint64_t>(kib) * 1024 : 0;
}
}  // namespace detail

/// Reads VmRSS and VmHWM from /proc/self/status; an io_error naming the file when it cannot be
/// read or lacks them (not Linux, or /proc not mounted).
[[nodiscard]] inline process_memory read_process_memory() {
  const char* path = "/proc/self/status";
  std::FILE* f = std::fopen(path, "re");
  if (f == nullptr) throw io_error("open", path, errno);
  process_memory m;
  bool rss = false, hwm = false;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) {
      m.resident = detail::status_kib(line + 6);
      rss = true;
    } else if (std::strncmp(line, "VmHWM:", 6) == 0) {
      m.peak = detail::status_kib(line + 6);
      hwm = true;
    }
  }
  std::fclose(f);
  if (!rss || !hwm) throw io_error("read VmRSS and VmHWM from", path, ENODATA);
  return m;
}

/// Starts a new peak: VmHWM becomes the resident set now (writes "5" to /proc/self/clear_refs,
/// Linux 4.0+). False when the kernel refuses; the peak then still counts from the start.
inline bool reset_peak_resident() noexcept {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "we");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace strata
