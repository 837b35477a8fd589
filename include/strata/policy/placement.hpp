#pragma once
/// Placement policies: which path (tier) of a multipath receives a new object (the concept,
/// `placement_policy`, is in tier/placement_policy.hpp, where multipath takes it). A policy sees,
/// for each path, its descriptor (bandwidths), its capacity and use, and the bytes already placed
/// on it.
///
/// - fixed_ratio: MLP-Offload's k:1 round robin (weights {2, 1}: two objects on path 0, one on
///   path 1, and again), skipping a path that has no room.
/// - bandwidth_proportional: each object goes where it finishes soonest, counting the bytes
///   already placed on each path and its read+write cost per byte; the split of bytes across
///   paths converges to the ratio of their bandwidths, and a full path is skipped.
/// - adaptive: re-plans between steps from the throughput each path was observed to deliver
///   (an EWMA), and has the multipath migrate a bounded number of bytes per step towards it.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/units.hpp"
#include "strata/tier/placement_policy.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

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

/// Options of adaptive placement.
struct adaptive_options {
  double smoothing = 0.5;                     ///< EWMA weight of the newest observation, in (0, 1]
  std::uint64_t max_move_bytes = 1ULL << 30;  ///< what one rebalance may migrate
};

/// Placement that follows the throughput each path delivers, not what it declares: a multipath
/// feeds it, once per step (`multipath::rebalance()`), the bytes each path moved and the time it
/// was busy; it keeps an exponentially weighted average per path, plans a byte split in the
/// ratio of those averages, and the multipath migrates objects towards the plan, at most
/// `max_move_bytes` per step. New objects go where they finish soonest under the same estimates.
/// Until every path has been observed it plans from the descriptors, like bandwidth_proportional.
class adaptive {
 public:
  explicit adaptive(adaptive_options o = {}) : opts_(o) {
    STRATA_EXPECTS(o.smoothing > 0 && o.smoothing <= 1, config_error,
                   "adaptive: smoothing {} is not in (0, 1]", o.smoothing);
  }

  std::size_t place(std::string_view object, std::uint64_t bytes, std::span<const path_view> paths) {
    const auto r = rates(paths);
    std::size_t best = paths.size();
    double best_time = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < paths.size(); ++i) {
      if (!paths[i].fits(bytes)) continue;
      const double t = static_cast<double>(paths[i].placed_bytes + bytes) / r[i];
      if (t < best_time) {
        best_time = t;
        best = i;
      }
    }
    if (best == paths.size()) detail::no_room(object, bytes, paths);
    return best;
  }

  /// One step's observation of path `path`: `bytes` moved while busy for `busy_seconds`.
  void observe(std::size_t path, std::uint64_t bytes, double busy_seconds) {
    if (path >= estimate_.size()) estimate_.resize(path + 1, 0.0);
    if (bytes == 0 || busy_seconds <= 0) return;  // idle this step: keep what we knew
    const double sample = static_cast<double>(bytes) / busy_seconds;
    double& e = estimate_[path];
    e = e == 0 ? sample : opts_.smoothing * sample + (1 - opts_.smoothing) * e;
  }

  /// Target bytes per path: what is placed now, split in the ratio of the estimates, each capped
  /// by the room its path has.
  [[nodiscard]] std::vector<std::uint64_t> plan(std::span<const path_view> paths) const {
    const auto r = rates(paths);
    double total = 0, rate_sum = 0;
    for (std::size_t i = 0; i < paths.size(); ++i) {
      total += static_cast<double>(paths[i].placed_bytes);
      rate_sum += r[i];
    }
    std::vector<std::uint64_t> target(paths.size());
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const double room = paths[i].capacity > paths[i].used ? static_cast<double>(paths[i].capacity - paths[i].used) : 0;
      target[i] = static_cast<std::uint64_t>(
          std::min(total * r[i] / rate_sum, static_cast<double>(paths[i].placed_bytes) + room));
    }
    return target;
  }

  /// Bytes a rebalance may migrate.
  [[nodiscard]] std::uint64_t max_move_bytes() const noexcept { return opts_.max_move_bytes; }
  /// Current estimate per path, bytes/s (0 = not observed yet).
  [[nodiscard]] const std::vector<double>& estimates() const noexcept { return estimate_; }

 private:
  // Observed rates when every path has one; otherwise descriptor rates for all, so that the
  // two kinds of figure are never compared with each other.
  [[nodiscard]] std::vector<double> rates(std::span<const path_view> paths) const {
    std::vector<double> r(paths.size(), 1.0);
    bool observed = estimate_.size() >= paths.size();
    for (std::size_t i = 0; observed && i < paths.size(); ++i) observed = estimate_[i] > 0;
    if (observed) {
      for (std::size_t i = 0; i < paths.size(); ++i) r[i] = estimate_[i];
      return r;
    }
    bool declared = true;
    for (const auto& p : paths) declared = declared && bandwidth_proportional::seconds_per_byte(p.descriptor) > 0;
    if (declared)
      for (std::size_t i = 0; i < paths.size(); ++i)
        r[i] = 1.0 / bandwidth_proportional::seconds_per_byte(paths[i].descriptor);
    return r;
  }

  adaptive_options opts_;
  std::vector<double> estimate_;
};

static_assert(placement_policy<fixed_ratio>);
static_assert(placement_policy<bandwidth_proportional>);
static_assert(placement_policy<adaptive>);

}  // namespace strata
