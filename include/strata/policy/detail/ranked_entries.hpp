#pragma once
/// The engine every eviction policy shares: resident entries with a rank, pin counts, and the
/// unpinned ones kept ordered so that the victim (the smallest rank) is found in O(1) and every
/// update costs O(log n). A policy only decides what an entry's rank is.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata::detail {

/// An entry's rank: the smallest is evicted first. `primary` is what the policy ranks by;
/// `tiebreak` (a recency tick) orders entries of equal primary rank, least recent first.
struct rank {
  std::uint64_t primary = 0;
  std::uint64_t tiebreak = 0;
  // Spelled out, not defaulted: nvcc's front end mistranslates a defaulted <=> (.cu files include this).
  friend constexpr bool operator==(const rank& a, const rank& b) noexcept {
    return a.primary == b.primary && a.tiebreak == b.tiebreak;
  }
  friend constexpr bool operator<(const rank& a, const rank& b) noexcept {
    return a.primary != b.primary ? a.primary < b.primary : a.tiebreak < b.tiebreak;
  }
};

class ranked_entries {
  using ordered = std::set<std::pair<rank, std::size_t>>;

 public:
  /// `policy` names the owner in error messages.
  explicit ranked_entries(const char* policy) noexcept : policy_(policy) {}

  [[nodiscard]] bool contains(std::size_t id) const { return entries_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
  [[nodiscard]] const char* policy() const noexcept { return policy_; }

  void insert(std::size_t id, rank r) {
    STRATA_EXPECTS(!entries_.contains(id), config_error, "{}: subgroup {} is already cached", policy_, id);
    auto [it, inserted] = unpinned_.emplace(r, id);
    STRATA_ASSERT(inserted);
    try {
      entries_.emplace(id, entry{r, 0, {}});
    } catch (...) {
      unpinned_.erase(it);
      throw;
    }
  }

  void erase(std::size_t id) noexcept {
    const auto it = entries_.find(id);
    if (it == entries_.end()) return;
    if (it->second.pins == 0) unpinned_.erase({it->second.r, id});
    entries_.erase(it);
  }

  [[nodiscard]] rank rank_of(std::size_t id) const { return find(id, "rank")->second.r; }

  /// Changes the rank of a resident entry; reuses its tree node, so it never allocates.
  void rerank(std::size_t id, rank r) {
    auto it = find(id, "access");
    set_rank(id, it->second, r);
  }

  void pin(std::size_t id) {
    entry& e = find(id, "pin")->second;
    if (e.pins++ == 0) e.parked = unpinned_.extract({e.r, id});  // out of the victim order
  }

  /// Puts the entry's own node back, so the release path cannot fail on allocation.
  void unpin(std::size_t id) noexcept {
    const auto it = entries_.find(id);
    STRATA_ASSERT(it != entries_.end() && it->second.pins > 0);
    entry& e = it->second;
    if (--e.pins == 0) unpinned_.insert(std::move(e.parked));
  }

  [[nodiscard]] bool pinned(std::size_t id) const { return find(id, "pinned")->second.pins > 0; }

  /// The unpinned entry with the smallest rank.
  [[nodiscard]] std::optional<std::size_t> smallest() const noexcept {
    if (unpinned_.empty()) return std::nullopt;
    return unpinned_.begin()->second;
  }

  /// Replaces every entry's rank by f(id, old rank): O(n log n), once per step at most.
  template <class F>
  void rerank_all(F&& f) {
    for (auto& [id, e] : entries_) {
      set_rank(id, e, f(id, e.r));
    }
  }

 private:
  struct entry {
    rank r;
    unsigned pins;
    ordered::node_type parked;  // the entry's tree node while it is pinned
  };

  // Moves an entry to rank r, re-using its tree node (no allocation); a pinned entry keeps the
  // rank in its parked node until it is unpinned.
  void set_rank(std::size_t id, entry& e, rank r) {
    if (e.r == r) return;
    if (e.pins == 0) {
      auto node = unpinned_.extract({e.r, id});
      node.value().first = r;
      unpinned_.insert(std::move(node));
    } else {
      e.parked.value().first = r;
    }
    e.r = r;
  }

  std::unordered_map<std::size_t, entry>::iterator find(std::size_t id, const char* what) {
    auto it = entries_.find(id);
    STRATA_EXPECTS(it != entries_.end(), config_error, "{}: {} of subgroup {}, which is not cached", policy_,
                   what, id);
    return it;
  }
  std::unordered_map<std::size_t, entry>::const_iterator find(std::size_t id, const char* what) const {
    auto it = entries_.find(id);
    STRATA_EXPECTS(it != entries_.end(), config_error, "{}: {} of subgroup {}, which is not cached", policy_,
                   what, id);
    return it;
  }

  const char* policy_;
  std::unordered_map<std::size_t, entry> entries_;
  ordered unpinned_;
};

/// The members every ranked policy shares: erase, pins, the victim (the lowest rank) and lookups.
/// A policy derives from it and defines how inserts and accesses rank an entry.
class ranked_policy {
 public:
  void on_erase(std::size_t id) noexcept { entries_.erase(id); }
  void pin(std::size_t id) { entries_.pin(id); }
  void unpin(std::size_t id) noexcept { entries_.unpin(id); }
  [[nodiscard]] std::optional<std::size_t> victim() const noexcept { return entries_.smallest(); }
  [[nodiscard]] bool contains(std::size_t id) const { return entries_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

 protected:
  explicit ranked_policy(const char* policy) noexcept : entries_(policy) {}
  ranked_entries entries_;
  std::uint64_t clock_ = 0;  ///< a logical time for tie-breaks
};

}  // namespace strata::detail
