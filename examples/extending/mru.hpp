#pragma once
// mru: an eviction policy written outside the library (docs/extending.md). Most recently used:
// the victim is the unpinned subgroup used last. It is lru's mirror and, like lru, blind to the
// update order. Where every step walks the subgroups in the same order (strata::sequential)
// through a cache smaller than the walk, lru evicts each subgroup just before the next step
// needs it and never hits; mru keeps the first subgroups of the walk and, without being told the
// order, hits as many as belady, which reads it (tests/extending/mru_test.cpp).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>

#include <strata/core/error.hpp>
#include <strata/core/expects.hpp>
#include <strata/policy/eviction_policy.hpp>

namespace extending {

class mru {
 public:
  // doc-snippet: events
  /// Order-blind: a step's order changes nothing.
  void on_step_begin(std::span<const std::size_t> /*order*/, std::span<const std::size_t> /*next*/) noexcept {}

  void on_insert(std::size_t id) {
    STRATA_EXPECTS(!entries_.contains(id), strata::config_error, "mru: subgroup {} is already cached", id);
    auto node = unpinned_.emplace(++clock_, id).first;  // allocates first: a failure changes nothing
    try {
      entries_.emplace(id, entry{clock_, 0, {}});
    } catch (...) {
      unpinned_.erase(node);
      throw;
    }
  }

  void on_access(std::size_t id) {
    entry& e = find(id, "access");
    if (e.pins > 0) {  // its node is parked while pinned: move the tick there
      e.parked.value().first = e.tick = ++clock_;
      return;
    }
    auto node = unpinned_.extract({e.tick, id});  // re-keys its own node: no allocation
    node.value().first = e.tick = ++clock_;
    unpinned_.insert(std::move(node));
  }

  void on_erase(std::size_t id) noexcept {
    const auto it = entries_.find(id);
    if (it == entries_.end()) return;  // not cached: nothing to do
    if (it->second.pins == 0) unpinned_.erase({it->second.tick, id});
    entries_.erase(it);
  }
  // doc-snippet-end

  // doc-snippet: pins
  /// A transfer uses `id`: it leaves the victim order (pins nest) and keeps its node aside, so
  /// that unpin, which must not throw, puts it back without allocating.
  void pin(std::size_t id) {
    entry& e = find(id, "pin");
    if (e.pins++ == 0) e.parked = unpinned_.extract({e.tick, id});
  }

  void unpin(std::size_t id) noexcept {
    const auto it = entries_.find(id);
    STRATA_ASSERT(it != entries_.end() && it->second.pins > 0);  // an unpaired unpin is a bug
    if (--it->second.pins == 0) unpinned_.insert(std::move(it->second.parked));
  }

  /// The unpinned subgroup used last: the largest tick, in O(1).
  [[nodiscard]] std::optional<std::size_t> victim() const noexcept {
    if (unpinned_.empty()) return std::nullopt;
    return unpinned_.rbegin()->second;
  }
  // doc-snippet-end

  [[nodiscard]] bool contains(std::size_t id) const { return entries_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

 private:
  using ticks = std::set<std::pair<std::uint64_t, std::size_t>>;  // (last use, subgroup), unpinned only
  struct entry {
    std::uint64_t tick;
    unsigned pins;
    ticks::node_type parked;  // the entry's node while it is pinned
  };

  entry& find(std::size_t id, const char* what) {
    const auto it = entries_.find(id);
    STRATA_EXPECTS(it != entries_.end(), strata::config_error, "mru: {} of subgroup {}, which is not cached", what, id);
    return it->second;
  }

  std::unordered_map<std::size_t, entry> entries_;
  ticks unpinned_;
  std::uint64_t clock_ = 0;
};

// doc-snippet: concept
static_assert(strata::eviction_policy<mru>);
// doc-snippet-end

}  // namespace extending
