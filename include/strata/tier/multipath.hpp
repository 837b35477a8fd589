#pragma once
/// multipath: spreads objects over several tiers ("paths": a node-local NVMe and a PFS, say) and
/// reads or writes each object on the path that holds it, so the paths' bandwidths add up.
/// A placement policy picks the path of each new object (tier/placement_policy.hpp; its models
/// are in policy/placement.hpp); an object found on a path (left by an earlier run) stays there.
/// Each path runs its own requests, so paths work concurrently.
///
/// - `multipath<Placement, Tiers...>`: a fixed set of paths, each constructed in place from one
///   argument (its options) or from a std::tuple of arguments (an adaptor's), or referred to
///   when the type is a reference (`file_tier&`).
/// - `dynamic_multipath<Placement>`: paths chosen at run time, as a vector of any_tier.

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/completion.hpp"
#include "strata/core/expects.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/placement_policy.hpp"
#include "strata/tier/throughput_meter.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Bytes one path of a multipath has read and written (completed requests).
struct path_io_totals {
  std::uint64_t read = 0;
  std::uint64_t written = 0;
};

namespace detail {

/// The logic both multipaths share; Derived provides path_count() and visit(i, f).
template <class Placement, class Derived>
class multipath_core {
 public:
  explicit multipath_core(Placement p, std::string name) : placement_(std::move(p)), name_(std::move(name)) {}

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    try {
      const std::size_t path = locate_or_place(object, offset + bytes.size());
      return metered(path, bytes.size(), true,
                     self().visit(path, [&](auto& t) { return t.write(object, offset, bytes); }));
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    try {
      const auto path = locate(object);
      if (!path) throw out_of_range_error(name_, object, offset, dst.size(), std::nullopt);
      return metered(*path, dst.size(), false,
                     self().visit(*path, [&](auto& t) { return t.read(object, offset, dst); }));
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  bool remove(std::string_view object) {
    const auto path = locate(object);
    if (!path) return false;
    const bool removed = self().visit(*path, [&](auto& t) { return t.remove(object); });
    std::lock_guard lock(mutex_);
    if (const auto it = where_.find(object); it != where_.end()) {
      placed_[it->second.path] -= it->second.bytes;
      where_.erase(it);
    }
    return removed;
  }

  void flush() {
    for (std::size_t i = 0; i < self().path_count(); ++i) self().visit(i, [](auto& t) { t.flush(); });
  }

  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const {
    const auto path = locate(object);
    if (!path) return std::nullopt;
    return self().visit(*path, [&](auto& t) { return t.size(object); });
  }
  [[nodiscard]] std::uint64_t capacity() const {
    std::uint64_t c = 0;
    for (std::size_t i = 0; i < self().path_count(); ++i) {
      const std::uint64_t ci = self().visit(i, [](auto& t) { return t.capacity(); });
      c = ci > unlimited_capacity - c ? unlimited_capacity : c + ci;
    }
    return c;
  }
  [[nodiscard]] std::uint64_t used() const {
    std::uint64_t u = 0;
    for (std::size_t i = 0; i < self().path_count(); ++i) u += self().visit(i, [](auto& t) { return t.used(); });
    return u;
  }
  [[nodiscard]] std::string_view name() const { return name_; }
  /// Concurrent paths: their bandwidths add up (0 if any path's is unknown).
  [[nodiscard]] tier_descriptor descriptor() const {
    tier_descriptor d{name_, tier_kind::composite, 0, 0, false};
    bool known_r = true, known_w = true;
    for (std::size_t i = 0; i < self().path_count(); ++i) {
      const auto pd = self().visit(i, [](auto& t) { return t.descriptor(); });
      known_r = known_r && pd.read_bandwidth > 0;
      known_w = known_w && pd.write_bandwidth > 0;
      d.read_bandwidth += pd.read_bandwidth;
      d.write_bandwidth += pd.write_bandwidth;
      d.measured = d.measured || pd.measured;
    }
    if (!known_r) d.read_bandwidth = 0;
    if (!known_w) d.write_bandwidth = 0;
    return d;
  }

  /// One descriptor per path, in path order.
  [[nodiscard]] std::vector<tier_descriptor> path_descriptors() const {
    std::vector<tier_descriptor> d;
    d.reserve(self().path_count());
    for (std::size_t i = 0; i < self().path_count(); ++i) d.push_back(self().visit(i, [](auto& t) { return t.descriptor(); }));
    return d;
  }
  /// The path that holds `object`, if any (looked up on the paths when this run has not seen it).
  [[nodiscard]] std::optional<std::size_t> path_of(std::string_view object) const { return locate(object); }
  /// Puts a new object on a chosen path (e.g. restoring a saved layout), bypassing the policy.
  void assign(std::string_view object, std::size_t path) {
    STRATA_EXPECTS(path < self().path_count(), config_error, "multipath '{}': no path {} (it has {})", name_, path,
                   self().path_count());
    std::lock_guard lock(mutex_);
    STRATA_EXPECTS(!where_.contains(object), config_error, "multipath '{}': object '{}' is already on path {}",
                   name_, object, where_.find(object)->second.path);
    where_.emplace(std::string(object), slot{path, 0});
  }
  /// Bytes this multipath has placed on each path (what placement balances).
  [[nodiscard]] std::vector<std::uint64_t> placed_bytes() const {
    std::lock_guard lock(mutex_);
    return placed_;
  }
  [[nodiscard]] Placement& placement() noexcept { return placement_; }

  /// Throughput observed on each path (bytes/s over the time it had requests in flight).
  [[nodiscard]] std::vector<double> observed_bandwidth() const {
    std::vector<double> bw;
    for (const auto& m : meters_) bw.push_back(m->bytes_per_second());
    return bw;
  }

  /// Bytes each path has moved by completed requests issued through this multipath since
  /// construction, per direction (rebalance()'s migrations are not counted). Safe to call while
  /// requests run (a sampler thread can chart throughput per path over time).
  [[nodiscard]] std::vector<path_io_totals> completed_bytes() const {
    std::vector<path_io_totals> v;
    v.reserve(meters_.size());
    for (const auto& m : meters_)
      v.push_back({m->read.load(std::memory_order_relaxed), m->written.load(std::memory_order_relaxed)});
    return v;
  }

  /// Between steps, for placements that re-plan (`adaptive`): feeds them what each path moved
  /// since the last call, then migrates objects (read, write elsewhere, remove) towards the new
  /// plan, at most the policy's byte bound. Call it only while no request is in flight (an
  /// optimizer's step returns with the next step's first reads started: flush() it first).
  /// Returns the bytes moved; 0 for placements that do not re-plan.
  std::uint64_t rebalance() {
    if constexpr (!requires(Placement& p, std::span<const path_view> v) { p.plan(v); }) {
      return 0;
    } else {
      std::vector<path_view> views = snapshot_views();
      for (std::size_t i = 0; i < meters_.size(); ++i) {
        const auto [bytes, busy] = meters_[i]->totals();
        placement_.observe(i, bytes - last_[i].first, busy - last_[i].second);
        last_[i] = {bytes, busy};
      }
      const std::vector<std::uint64_t> target = placement_.plan(views);
      std::uint64_t moved = 0;
      const std::uint64_t budget = placement_.max_move_bytes();
      for (;;) {
        std::vector<std::uint64_t> placed = placed_bytes();
        // The path furthest above its target gives, the one furthest below receives.
        std::size_t from = 0, to = 0;
        std::int64_t excess = 0, deficit = 0;
        for (std::size_t i = 0; i < placed.size(); ++i) {
          const auto d = static_cast<std::int64_t>(placed[i]) - static_cast<std::int64_t>(target[i]);
          if (d > excess) excess = d, from = i;
          if (-d > deficit) deficit = -d, to = i;
        }
        if (excess == 0 || deficit == 0) break;
        const auto pick = pick_object(from, std::min(excess, deficit));
        if (!pick || moved + pick->second > budget) break;
        migrate(pick->first, from, to, pick->second);
        moved += pick->second;
      }
      return moved;
    }
  }

 protected:
  void init_paths(std::size_t n) {
    placed_.assign(n, 0);
    last_.assign(n, {0, 0.0});
    for (std::size_t i = 0; i < n; ++i) meters_.push_back(std::make_unique<path_meter>());
  }

 private:
  struct slot {
    std::size_t path;
    std::uint64_t bytes;
  };

  // Busy-time throughput of one path, with totals that rebalance() differences per step, and
  // completed bytes per direction.
  class path_meter : public throughput_meter {
   public:
    [[nodiscard]] std::pair<std::uint64_t, double> totals() const { return {bytes(), busy_seconds()}; }
    std::atomic<std::uint64_t> read{0};
    std::atomic<std::uint64_t> written{0};
  };

  completion metered(std::size_t path, std::uint64_t bytes, bool write, completion inner) {
    auto& m = *meters_[path];
    m.begin();
    inner.on_complete([&m, bytes, write](std::exception_ptr e) {
      m.end(e ? 0 : bytes);
      if (!e) (write ? m.written : m.read).fetch_add(bytes, std::memory_order_relaxed);
    });
    return inner;
  }

  std::vector<path_view> snapshot_views() {
    std::vector<path_view> views;
    views.reserve(self().path_count());
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < self().path_count(); ++i)
      views.push_back(self().visit(i, [&](auto& t) {
        return path_view{t.descriptor(), t.capacity(), t.used(), placed_[i]};
      }));
    return views;
  }

  // The largest object on `path` no bigger than twice `gap` (so a move never overshoots by more
  // than half an object), as (name, bytes).
  std::optional<std::pair<std::string, std::uint64_t>> pick_object(std::size_t path, std::int64_t gap) const {
    std::lock_guard lock(mutex_);
    std::optional<std::pair<std::string, std::uint64_t>> best;
    for (const auto& [name, where] : where_)
      if (where.path == path && where.bytes > 0 && where.bytes <= 2 * static_cast<std::uint64_t>(gap) &&
          (!best || where.bytes > best->second))
        best = std::pair{name, where.bytes};
    return best;
  }

  void migrate(const std::string& object, std::size_t from, std::size_t to, std::uint64_t bytes) {
    std::vector<std::byte> buf(bytes);
    self().visit(from, [&](auto& t) { t.read(object, 0, buf).get(); });
    self().visit(to, [&](auto& t) { t.write(object, 0, buf).get(); });
    {
      std::lock_guard lock(mutex_);  // readers find it on the new path from here on
      where_.find(object)->second.path = to;
      placed_[from] -= bytes;
      placed_[to] += bytes;
    }
    self().visit(from, [&](auto& t) { t.remove(object); });
  }

  Derived& self() { return static_cast<Derived&>(*this); }
  const Derived& self() const { return static_cast<const Derived&>(*this); }

  std::optional<std::size_t> locate(std::string_view object) const {
    {
      std::lock_guard lock(mutex_);
      if (const auto it = where_.find(object); it != where_.end()) return it->second.path;
    }
    for (std::size_t i = 0; i < self().path_count(); ++i) {
      const auto sz = self().visit(i, [&](auto& t) { return t.size(object); });
      if (!sz) continue;
      std::lock_guard lock(mutex_);
      const auto [it, fresh] = where_.emplace(std::string(object), slot{i, *sz});
      if (fresh) placed_[i] += *sz;
      return it->second.path;
    }
    return std::nullopt;
  }

  std::size_t locate_or_place(std::string_view object, std::uint64_t end) {
    if (const auto p = locate(object)) {
      std::lock_guard lock(mutex_);
      auto& s = where_.find(object)->second;
      if (end > s.bytes) {
        placed_[s.path] += end - s.bytes;
        s.bytes = end;
      }
      return s.path;
    }
    const std::vector<path_view> views = snapshot_views();
    std::lock_guard lock(mutex_);  // the policy is stateful: one placement at a time
    if (const auto it = where_.find(object); it != where_.end()) return it->second.path;  // raced: placed meanwhile
    const std::size_t path = placement_.place(object, end, views);
    STRATA_EXPECTS(path < self().path_count(), config_error, "multipath '{}': placement chose path {} of {}", name_,
                   path, self().path_count());
    where_.emplace(std::string(object), slot{path, end});
    placed_[path] += end;
    return path;
  }

  Placement placement_;
  std::string name_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, slot, std::less<>> where_;
  mutable std::vector<std::uint64_t> placed_;
  std::vector<std::unique_ptr<path_meter>> meters_;
  std::vector<std::pair<std::uint64_t, double>> last_;  // meter totals at the last rebalance()
};

/// One path of a multipath: built from one argument, or piecewise from a std::tuple of
/// arguments (tiers are not movable, so they are constructed where they live).
template <class T>
struct path_holder {
  template <class A>
    requires std::constructible_from<T, A>
  explicit path_holder(A&& a) : value(std::forward<A>(a)) {}
  template <class... A>
    requires(!std::constructible_from<T, std::tuple<A...>>)
  explicit path_holder(std::tuple<A...>&& args) : path_holder(std::move(args), std::index_sequence_for<A...>{}) {}
  template <class Tuple, std::size_t... I>
  path_holder(Tuple&& args, std::index_sequence<I...>) : value(std::get<I>(std::move(args))...) {}
  T value;
};

}  // namespace detail

/// Objects spread over a fixed set of paths.
template <placement_policy Placement, class... Tiers>
  requires(sizeof...(Tiers) > 0 && (tier<std::remove_reference_t<Tiers>> && ...))
class multipath : public detail::multipath_core<Placement, multipath<Placement, Tiers...>> {
  using core = detail::multipath_core<Placement, multipath<Placement, Tiers...>>;
  friend core;

 public:
  /// Each path is constructed from one argument or a std::tuple of arguments, or (for reference
  /// types) bound to one.
  template <class... Args>
    requires(sizeof...(Args) == sizeof...(Tiers))
  explicit multipath(Placement placement, Args&&... paths)
      : core(std::move(placement), "multipath"), paths_(std::forward<Args>(paths)...) {
    this->init_paths(sizeof...(Tiers));
  }

  /// Path i.
  template <std::size_t I>
  [[nodiscard]] auto& path() noexcept {
    return std::get<I>(paths_).value;
  }
  [[nodiscard]] static constexpr std::size_t path_count() noexcept { return sizeof...(Tiers); }

 private:
  template <class F>
  decltype(auto) visit(std::size_t i, F&& f) {
    return visit_impl(i, std::forward<F>(f), std::index_sequence_for<Tiers...>{});
  }
  template <class F>
  decltype(auto) visit(std::size_t i, F&& f) const {
    return const_cast<multipath*>(this)->visit(i, std::forward<F>(f));
  }
  template <class F, std::size_t First, std::size_t... Rest>
  decltype(auto) visit_impl(std::size_t i, F&& f, std::index_sequence<First, Rest...>) {
    if constexpr (sizeof...(Rest) == 0) {
      return f(std::get<First>(paths_).value);
    } else {
      if (i == First) return f(std::get<First>(paths_).value);
      return visit_impl(i, std::forward<F>(f), std::index_sequence<Rest...>{});
    }
  }

  std::tuple<detail::path_holder<Tiers>...> paths_;
};

/// Objects spread over paths chosen at run time.
template <placement_policy Placement>
class dynamic_multipath : public detail::multipath_core<Placement, dynamic_multipath<Placement>> {
  using core = detail::multipath_core<Placement, dynamic_multipath<Placement>>;
  friend core;

 public:
  dynamic_multipath(Placement placement, std::vector<any_tier> paths, std::string name = "multipath")
      : core(std::move(placement), std::move(name)), paths_(std::move(paths)) {
    STRATA_EXPECTS(!paths_.empty(), config_error, "dynamic_multipath: needs at least one path");
    this->init_paths(paths_.size());
  }
  [[nodiscard]] std::size_t path_count() const noexcept { return paths_.size(); }
  [[nodiscard]] any_tier& path(std::size_t i) { return paths_.at(i); }
  [[nodiscard]] const any_tier& path(std::size_t i) const { return paths_.at(i); }

 private:
  template <class F>
  decltype(auto) visit(std::size_t i, F&& f) {
    return f(paths_[i]);
  }
  template <class F>
  decltype(auto) visit(std::size_t i, F&& f) const {
    return f(const_cast<any_tier&>(paths_[i]));
  }
  std::vector<any_tier> paths_;
};

static_assert(multi_path_tier<dynamic_multipath<detail::placement_archetype>>);
static_assert(multi_path_tier<multipath<detail::placement_archetype, any_tier, any_tier&>>);

static_assert(tier<multipath<detail::placement_archetype, any_tier>>);

}  // namespace strata
