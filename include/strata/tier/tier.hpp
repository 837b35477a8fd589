#pragma once
/// The `tier` concept: a place where the bytes of named objects (a subgroup's optimizer state)
/// live between updates, read and written asynchronously by byte range.
///
/// Contract, for every model:
/// - `write(object, offset, bytes)` stores `bytes` at `offset` of `object`, creating it or growing
///   it (like pwrite: it never shrinks an object; `remove` first to replace it by a shorter one).
///   The caller keeps `bytes` alive and unchanged until the returned future completes.
/// - `read(object, offset, dst)` fills `dst` from `offset`; the range must lie inside the object.
///   The caller keeps `dst` alive until the future completes.
/// - Errors are delivered through the future as typed exceptions (io_error, capacity_error,
///   integrity_error, config_error), never as partial silent results.
/// - Requests on different objects may run concurrently from any threads. Requests on one object
///   must not overlap in time unless all of them are reads.
/// - Writes are durable after `flush()` returns, not necessarily before.
/// - `remove` deletes an object (true) or reports it absent (false); `size` gives its length.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/units.hpp"

namespace strata {

/// What kind of storage a tier is (shown in reports; placement may use it).
enum class tier_kind : std::uint8_t { host, file, device, remote, composite };

[[nodiscard]] constexpr std::string_view to_string(tier_kind k) noexcept {
  switch (k) {
    case tier_kind::host: return "host";
    case tier_kind::file: return "file";
    case tier_kind::device: return "device";
    case tier_kind::remote: return "remote";
    case tier_kind::composite: return "composite";
  }
  return "unknown";
}

/// A tier's identity and speed. Bandwidths are bytes per second; 0 means unknown.
struct tier_descriptor {
  std::string name;
  tier_kind kind = tier_kind::host;
  double read_bandwidth = 0;   ///< bytes/s
  double write_bandwidth = 0;  ///< bytes/s
  bool measured = false;       ///< bandwidths were measured (true) or declared/unknown (false)
};

/// A storage tier; see the contract in this header's comment.
template <class T>
concept tier = requires(T& t, const T& ct, std::string_view object, std::uint64_t offset,
                        std::span<std::byte> dst, std::span<const std::byte> src) {
  { t.write(object, offset, src) } -> std::same_as<completion>;
  { t.read(object, offset, dst) } -> std::same_as<completion>;
  { t.remove(object) } -> std::same_as<bool>;
  { t.flush() } -> std::same_as<void>;
  { ct.size(object) } -> std::same_as<std::optional<std::uint64_t>>;
  { ct.capacity() } -> std::same_as<std::uint64_t>;
  { ct.used() } -> std::same_as<std::uint64_t>;
  { ct.name() } -> std::convertible_to<std::string_view>;
  { ct.descriptor() } -> std::same_as<tier_descriptor>;
};

/// Object names map to file names, so they are restricted to [A-Za-z0-9._-], 1..200 characters,
/// and may not start with '.' (no hidden files, no "..", no path separators).
[[nodiscard]] inline bool is_object_name(std::string_view object) noexcept {
  const auto ok = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  };
  bool valid = !object.empty() && object.size() <= 200 && object.front() != '.';
  for (char c : object) valid = valid && ok(c);
  return valid;
}

/// config_error naming the tier when `object` is not a valid object name (see is_object_name).
inline void validate_object_name(std::string_view tier_name, std::string_view object) {
  STRATA_EXPECTS(is_object_name(object), config_error,
                 "tier '{}': invalid object name '{}' (use 1-200 of [A-Za-z0-9._-], not starting with '.')",
                 tier_name, object);
}

/// Checks a write request before it is issued: a valid object name and an end that does not
/// overflow; returns that end (offset + bytes).
inline std::uint64_t validate_write(std::string_view tier_name, std::string_view object, std::uint64_t offset,
                                    std::size_t bytes) {
  validate_object_name(tier_name, object);
  STRATA_EXPECTS(offset <= std::numeric_limits<std::uint64_t>::max() - bytes, config_error,
                 "tier '{}': write to object '{}' at offset {} overflows", tier_name, object, offset);
  return offset + bytes;
}

/// The error for a read past the end of an object or of a missing object.
[[nodiscard]] inline config_error out_of_range_error(std::string_view tier_name, std::string_view object,
                                                     std::uint64_t offset, std::uint64_t length,
                                                     std::optional<std::uint64_t> size) {
  if (!size) return config_error(fmt::format("tier '{}': read of object '{}', which does not exist", tier_name, object));
  return config_error(fmt::format("tier '{}': read of {} bytes at offset {} of object '{}' passes its end ({} bytes)",
                                  tier_name, length, offset, object, *size));
}

/// Checks that a read of [offset, offset + length) lies inside an object of `size` bytes
/// (nullopt: absent); out_of_range_error otherwise.
inline void check_read_range(std::string_view tier_name, std::string_view object, std::uint64_t offset,
                             std::uint64_t length, std::optional<std::uint64_t> size) {
  if (!size || offset > *size || length > *size - offset)
    throw out_of_range_error(tier_name, object, offset, length, size);
}

/// The capacity_error for a write that would take a tier's bytes to `would_use`, past `budget`.
[[nodiscard]] inline capacity_error over_budget_error(std::string_view tier_name, std::string_view object,
                                                      std::uint64_t offset, std::uint64_t bytes,
                                                      std::uint64_t would_use, std::uint64_t budget) {
  return capacity_error(fmt::format("tier '{}': writing {} at offset {} of object '{}' would use {} of a {} budget",
                                    tier_name, format_size(bytes), offset, object, format_size(would_use),
                                    format_size(budget)),
                        would_use, budget);
}

}  // namespace strata
