#pragma once
/// Defaults from `STRATA_*` environment variables. Values are validated: a variable that is set
/// but malformed or out of range is a config_error naming the variable and its value, never a
/// silent fallback. A variable that is set but empty is refused too: `STRATA_IO_THREADS=` is more
/// likely a script whose value went missing than a wish for the default. `env_variables` lists
/// every variable strata reads, so a misspelt one can be reported by `unknown_env_variables()`.

#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "strata/core/error.hpp"
#include "strata/core/units.hpp"

extern char** environ;  // POSIX; declared here because <unistd.h> only does so with _GNU_SOURCE

namespace strata {

/// A variable strata reads, with what it does and its default.
struct env_variable {
  std::string_view name;
  std::string_view meaning;
  std::string_view default_value;
};

/// Every STRATA_* variable strata reads. Keep docs/environment.md's table in step with this list
/// (a test holds the page to it).
inline constexpr std::array<env_variable, 13> env_variables{{
    {"STRATA_NUM_THREADS", "threads of the pools strata creates when none is given (1..1024)",
     "the number of online CPUs"},
    {"STRATA_IO_BACKEND", "file_tier engine: auto, uring or posix", "auto (io_uring when available)"},
    {"STRATA_DIRECT_IO", "file_tier uses O_DIRECT (1/0, on/off)", "on"},
    {"STRATA_CHUNK_BYTES", "file_tier request split size, a multiple of 4096 (e.g. 8MiB)", "8MiB"},
    {"STRATA_QUEUE_DEPTH", "file_tier io_uring operations in flight (1..4096)", "32"},
    {"STRATA_IO_THREADS", "file_tier POSIX engine threads (1..256)", "4"},
    {"STRATA_NODE_LIMITER_DIR", "directory of node_limiter files (absolute; node-local, with flock)",
     "/dev/shm/strata-<uid>, else /tmp/strata-<uid>"},
    {"STRATA_S3_CONNECT_TIMEOUT", "object_store_tier: seconds a connection may take to open (e.g. 10, 2.5)", "10"},
    {"STRATA_S3_FIRST_BYTE_TIMEOUT",
     "object_store_tier: seconds a request sent whole may wait for the answer's first byte before the attempt is "
     "abandoned and retried; 0: no limit",
     "10"},
    {"STRATA_S3_REQUEST_DEADLINE",
     "object_store_tier: seconds a request may take with all its retries, from its first attempt going out; 0: no "
     "limit",
     "120"},
    {"STRATA_PREFETCH_ELEMS",
     "CPU update kernels: elements ahead of the one being updated that each stream is prefetched (0..65536; 0: "
     "the line being read)",
     "128 on AMD Zen 4, else 512"},
    {"STRATA_CPU_BF16",
     "CPU update kernels: round to bf16 (moments, model copy) with AVX512_BF16's instruction where the CPU has it "
     "(1/0; the same bits either way)",
     "1"},
    {"STRATA_REQUIRE_S3", "strata's own tests: a missing S3 test server fails them instead of skipping (.ci/run sets it)",
     "unset (they skip)"},
}};

namespace detail {
[[noreturn]] inline void bad_env(const char* name, std::string_view value, std::string_view why) {
  throw config_error(fmt::format("environment variable {}=\"{}\": {}", name, value, why));
}
}  // namespace detail

/// The raw value of a variable, or nullopt when unset; config_error naming it when set but empty.
/// Every env_* reader goes through here, so all of them treat an empty value alike.
[[nodiscard]] inline std::optional<std::string> env_raw(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read-only use
  if (v == nullptr) return std::nullopt;
  if (*v == '\0')
    throw config_error(fmt::format("environment variable {} is set but empty: unset it or give a value", name));
  return std::string(v);
}

/// An integer in [min, max], or `fallback` when unset.
template <std::integral T>
[[nodiscard]] T env_integer(const char* name, T fallback, T min = std::numeric_limits<T>::min(),
                            T max = std::numeric_limits<T>::max()) {
  const auto raw = env_raw(name);
  if (!raw) return fallback;
  T value{};
  const char* first = raw->data();
  const char* last = raw->data() + raw->size();
  const auto [ptr, ec] = std::from_chars(first, last, value);
  if (ec == std::errc::result_out_of_range) detail::bad_env(name, *raw, "out of range");
  if (ec != std::errc{} || ptr != last) detail::bad_env(name, *raw, "not an integer");
  if (value < min || value > max) detail::bad_env(name, *raw, fmt::format("must be in [{}, {}]", min, max));
  return value;
}

/// A byte size ("8MiB", "1.5GB", see parse_size) in [min, max], or `fallback` when unset.
[[nodiscard]] inline std::uint64_t env_size(const char* name, std::uint64_t fallback, std::uint64_t min = 0,
                                            std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
  const auto raw = env_raw(name);
  if (!raw) return fallback;
  std::uint64_t value = 0;
  try {
    value = parse_size(*raw);
  } catch (const config_error& e) {
    detail::bad_env(name, *raw, e.what());
  }
  if (value < min || value > max)
    detail::bad_env(name, *raw, fmt::format("must be between {} and {}", format_size(min), format_size(max)));
  return value;
}

/// A duration in seconds ("10", "2.5"; at most millisecond precision) in [min, max], or
/// `fallback` when unset.
[[nodiscard]] inline std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds fallback,
                                                           std::chrono::milliseconds min = std::chrono::milliseconds(0),
                                                           std::chrono::milliseconds max = std::chrono::hours(24)) {
  const auto raw = env_raw(name);
  if (!raw) return fallback;
  double seconds = 0;
  const char* first = raw->data();
  const char* last = raw->data() + raw->size();
  const auto [ptr, ec] = std::from_chars(first, last, seconds, std::chars_format::fixed);
  if (ec != std::errc{} || ptr != last || !std::isfinite(seconds))
    detail::bad_env(name, *raw, "not a number of seconds (e.g. 10 or 2.5)");
  const double ms = std::round(seconds * 1000.0);
  if (ms < static_cast<double>(min.count()) || ms > static_cast<double>(max.count()))
    detail::bad_env(name, *raw,
                    fmt::format("must be between {} and {} seconds", static_cast<double>(min.count()) / 1000.0,
                                static_cast<double>(max.count()) / 1000.0));
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

/// A boolean: 1/0, true/false, yes/no, on/off (any case); `fallback` when unset.
[[nodiscard]] inline bool env_bool(const char* name, bool fallback) {
  const auto raw = env_raw(name);
  if (!raw) return fallback;
  std::string v;
  for (char c : *raw) v.push_back(detail::to_lower(c));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  detail::bad_env(name, *raw, "expected 1/0, true/false, yes/no or on/off");
}

/// One of `choices` (exact match), or `fallback` when unset.
[[nodiscard]] inline std::string env_choice(const char* name, std::initializer_list<std::string_view> choices,
                                            std::string_view fallback) {
  const auto raw = env_raw(name);
  if (!raw) return std::string(fallback);
  for (auto c : choices)
    if (c == *raw) return *raw;
  detail::bad_env(name, *raw, fmt::format("expected one of: {}", fmt::join(choices, ", ")));
}

/// config_error naming the first STRATA_* variable strata reads that is set but empty. A reader
/// refuses an empty value only when its component is built, so a run that never builds one (no
/// node limiter, no file tier) would take `STRATA_NODE_LIMITER_DIR=` silently; tools and the
/// run-time optimizer call this first, so that an empty setting is refused whatever the run uses.
inline void check_env_variables() {
  for (const auto& v : env_variables) (void)env_raw(std::string(v.name).c_str());
}

/// STRATA_* variables set in this process that strata does not read (likely misspelt).
[[nodiscard]] inline std::vector<std::string> unknown_env_variables() {
  std::vector<std::string> unknown;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!entry.starts_with("STRATA_")) continue;
    const auto name = entry.substr(0, entry.find('='));
    bool known = false;
    for (const auto& v : env_variables) known = known || v.name == name;
    if (!known) unknown.emplace_back(name);
  }
  return unknown;
}

}  // namespace strata
