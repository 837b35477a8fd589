#pragma once
/// Placement: which path (tier) of a multipath receives a new object. A policy sees, for each
/// path, its descriptor (bandwidths), its capacity and use, and the bytes already placed on it.
///
/// - fixed_ratio: MLP-Offload's k:1 round robin (weights {2, 1}: two objects on path 0, one on
///   path 1, and again), skipping a path that has no room.
/// - bandwidth_proportional: each object goes where it finishes soonest, counting the bytes
///   already placed on each path and its read+write cost per byte; the split of bytes across
///   paths converges to the ratio of their bandwidths, and a full path is skipped.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
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
[[noreturn]] inline void no_room(std::string_view object, std::uint64_t bytes, std::span<const path_view> paths) {
  std::string where;
  for (const auto& p : paths)
    where += fmt::format("{}'{}' {} free", where.empty() ? "" : ", ", p.descriptor.name,
                         format_size(p.capacity > p.used ? p.capacity - p.used : 0));
  throw capacity_error(fmt::format("no path has room for object '{}' ({}): {}", object, format_size(bytes), where),
                       bytes, 0);
}
}  // namespace detail

/// k:1 (or any weights) round robin over the paths, as MLP-Offload places subgroups.
class fixed_ratio {
 public:
  /// weights[i] objects go to path i in each round; the default is MLP-Offload's 2:1.
  explicit fixed_ratio(std::vector<unsigned> weights = {2, 1}) : weights_(std::move(weights)) {
    STRATA_EXPECTS(!weights_.empty() && std::accumulate(weights_.begin(), weights_.end(), 0ULL) > 0, config_error,
                   "fixed_ratio: needs at least one positive weight");
    for (std::size_t i = 0; i < weights_.size(); ++i) pattern_.insert(pattern_.end(), weights_[i], i);
  }

  std::size_t place(std::string_view object, std::uint64_t bytes, std::span<const path_view> paths) {
    STRATA_EXPECTS(weights_.size() == paths.size(), config_error,
                   "fixed_ratio: {} weights for {} paths", weights_.size(), paths.size());
    for (std::size_t tries = 0; tries < pattern_.size(); ++tries) {
      const std::size_t path = pattern_[next_++ % pattern_.size()];
      if (paths[path].fits(bytes)) return path;
    }
    detail::no_room(object, bytes, paths);
  }

  [[nodiscard]] const std::vector<unsigned>& weights() const noexcept { return weights_; }

 private:
  std::vector<unsigned> weights_;
  std::vector<std::size_t> pattern_;
  std::size_t next_ = 0;
};

/// Places each object where it would finish soonest given the bytes already there, from each
/// path's read and write bandwidth (declared or measured). While any path's bandwidth is unknown,
/// all paths count as equally fast (bytes are spread evenly).
class bandwidth_proportional {
 public:
  std::size_t place(std::string_view object, std::uint64_t bytes, std::span<const path_view> paths) {
    bool all_known = true;
    for (const auto& p : paths) all_known = all_known && seconds_per_byte(p.descriptor) > 0;
    std::size_t best = paths.size();
    double best_time = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < paths.size(); ++i) {
      if (!paths[i].fits(bytes)) continue;
      const double cost = all_known ? seconds_per_byte(paths[i].descriptor) : 1.0;
      const double t = static_cast<double>(paths[i].placed_bytes + bytes) * cost;
      if (t < best_time) {
        best_time = t;
        best = i;
      }
    }
    if (best == paths.size()) detail::no_room(object, bytes, paths);
    return best;
  }

  /// Seconds to read and write one byte on a path (every object is read and written each
  /// step); 0 when a bandwidth is unknown.
  [[nodiscard]] static double seconds_per_byte(const tier_descriptor& d) noexcept {
    if (d.read_bandwidth <= 0 || d.write_bandwidth <= 0) return 0;
    return 1.0 / d.read_bandwidth + 1.0 / d.write_bandwidth;
  }
};

static_assert(placement_policy<fixed_ratio>);
static_assert(placement_policy<bandwidth_proportional>);

}  // namespace strata
