#pragma once
/// The `placement_policy` concept: how a multipath chooses the path (tier) of a new object from
/// what it sees of each path (path_view). Its models are policies (policy/placement.hpp:
/// fixed_ratio, bandwidth_proportional, adaptive); a policy that also has
/// `observe(path, bytes, busy_seconds)`, `plan(paths)` and `max_move_bytes()` re-plans between
/// steps (multipath::rebalance).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/units.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// What a placement policy sees of one path.
struct path_view {
  tier_descriptor descriptor;
  std::uint64_t capacity = unlimited_capacity;
  std::uint64_t used = 0;
  std::uint64_t placed_bytes = 0;  ///< bytes of the objects this multipath placed there

  /// Whether `bytes` more fit.
  [[nodiscard]] bool fits(std::uint64_t bytes) const noexcept { return used <= capacity && capacity - used >= bytes; }
};

/// Chooses the path index for a new object of `bytes` bytes; throws capacity_error when none fits.
template <class P>
concept placement_policy = requires(P& p, std::string_view object, std::uint64_t bytes, std::span<const path_view> paths) {
  { p.place(object, bytes, paths) } -> std::same_as<std::size_t>;
};

namespace detail {
/// The least a placement policy may be (every object on the first path that fits): what tier/
/// checks its multipaths against, below the folder of the real policies.
struct placement_archetype {
  std::size_t place(std::string_view object, std::uint64_t bytes, std::span<const path_view> paths) {
    for (std::size_t i = 0; i < paths.size(); ++i)
      if (paths[i].fits(bytes)) return i;
    throw capacity_error(fmt::format("no path has room for object '{}' ({} bytes)", object, bytes), bytes, 0);
  }
};
}  // namespace detail

static_assert(placement_policy<detail::placement_archetype>);

}  // namespace strata
