#pragma once
/// Measuring a tier on its own: write then read a buffer through it as objects "probe-<i>", all
/// requests in flight at once, and time each pass. `strata-bench io` reports these passes, and
/// `offload_demo --probe` and `strata-bench step --probe` take the medium's bandwidths from them
/// in the same run as the step, so a step's efficiency is judged against the medium measured
/// independently of the pipeline. Through a file_tier the passes use the tier's own I/O path
/// (O_DIRECT through io_uring by default), as the optimizer does.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// The name of the i-th object of a probe pass.
[[nodiscard]] inline std::string probe_object_name(std::uint64_t i) { return fmt::format("probe-{}", i); }

/// Writes (or reads) `data` as objects of `object_bytes` (probe_object_name(i)) through `t`, all
/// requests in flight at once; returns the seconds the pass took.
template <tier T>
double probe_pass(T& t, bool write, std::span<std::byte> data, std::uint64_t object_bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<completion> fs;
  for (std::uint64_t off = 0, i = 0; off < data.size(); off += object_bytes, ++i) {
    const auto n = std::min<std::uint64_t>(object_bytes, data.size() - off);
    const auto name = probe_object_name(i);
    fs.push_back(write ? t.write(name, 0, data.subspan(off, n)) : t.read(name, 0, data.subspan(off, n)));
  }
  wait_all(fs);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Removes the objects a probe_pass over `bytes` in pieces of `object_bytes` wrote when it goes
/// out of scope, also when a pass failed (a full disk): a probe never leaves objects behind.
template <tier T>
struct probe_objects_guard {
  T& t;
  std::uint64_t bytes, object_bytes;
  ~probe_objects_guard() {
    for (std::uint64_t off = 0, i = 0; off < bytes; off += object_bytes, ++i) {
      try {
        t.remove(probe_object_name(i));
      } catch (...) {  // the pass's own error is the one reported
      }
    }
  }
};

/// GB/s (1e9 bytes per second) of each round's write pass and read pass.
struct probe_rates {
  std::vector<double> write, read;
};

/// `rounds` rounds of a write pass then a read pass of `data` through `t`; removes the objects
/// after.
template <tier T>
probe_rates probe_write_read(T& t, std::span<std::byte> data, std::uint64_t object_bytes, std::uint64_t rounds) {
  probe_rates r;
  const auto gb = static_cast<double>(data.size()) / 1e9;
  const probe_objects_guard<T> cleanup{t, data.size(), object_bytes};
  for (std::uint64_t k = 0; k < rounds; ++k) {
    r.write.push_back(gb / probe_pass(t, true, data, object_bytes));
    r.read.push_back(gb / probe_pass(t, false, data, object_bytes));
  }
  return r;
}

}  // namespace strata
