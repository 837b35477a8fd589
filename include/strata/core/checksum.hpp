#pragma once
/// checksum64: XXH3-64 of a byte range (libxxhash), the one checksum strata stores: per block of a
/// checksummed tier, per subgroup of a checkpoint, over a manifest, over a node-wide file's record.

#include <cstddef>
#include <cstdint>
#include <span>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace strata {

/// XXH3-64 of `bytes`.
[[nodiscard]] inline std::uint64_t checksum64(std::span<const std::byte> bytes) noexcept {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace strata
