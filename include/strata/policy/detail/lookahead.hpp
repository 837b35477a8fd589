#pragma once
/// Belady's rule over a two-step horizon, shared by `sweep_aware` and `belady`: rank each resident
/// entry by when it is used next (later in this step's walk, else at its place in the next step's
/// order, else never) and evict the one used furthest ahead. Entries never used again tie and go
/// least recently used first. Update orders are permutations, so every subgroup appears in each
/// step and a two-step horizon already sees every entry's next use.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/policy/detail/ranked_entries.hpp"

namespace strata::detail {

class lookahead : public ranked_policy {
 public:
  /// `reverse_next`: when no `next` order is given, assume the next step walks this step's order
  /// backwards (sweep_aware) instead of knowing nothing of it (belady).
  lookahead(const char* policy, bool reverse_next) noexcept : ranked_policy(policy), reverse_next_(reverse_next) {}

  void on_step_begin(std::span<const std::size_t> order, std::span<const std::size_t> next) {
    std::unordered_map<std::size_t, std::size_t> cur;
    std::unordered_map<std::size_t, std::size_t> nxt;
    index(order, cur, "the step's order");
    index(next, nxt, "the next step's order");
    reversed_ = reverse_next_ && next.empty();
    current_ = std::move(cur);
    next_ = std::move(nxt);
    steps_length_ = order.size();
    later_min_.assign(order.size() + 1, never);  // the earliest next-step use from each place of the walk on
    for (std::size_t i = order.size(); i-- > 0;)
      later_min_[i] = std::min(later_min_[i + 1], next_rank(order[i], current_.find(order[i])));
    visited_.clear();
    entries_.rerank_all([&](std::size_t id, rank old) { return rank{urgency(id), old.tiebreak}; });
  }

  void on_insert(std::size_t id) { entries_.insert(id, {urgency(id), ++clock_}); }

  void on_access(std::size_t id) {
    STRATA_EXPECTS(entries_.contains(id), config_error, "{}: access of subgroup {}, which is not cached",
                   entries_.policy(), id);
    visited_.insert(id);
    entries_.rerank(id, {urgency(id), ++clock_});
  }

  /// Whether `id`, resident and used this step, is still held when the step's walk ends in a
  /// cache of `capacity` entries: it is among the `capacity` subgroups the next step uses first,
  /// or nothing the walk still reaches is used before it next step (only an admission evicts,
  /// and only for an entry used sooner). False for a subgroup the next step does not use.
  [[nodiscard]] bool keeps_for_next_step(std::size_t id, std::size_t capacity) const {
    const auto c = current_.find(id);
    const std::uint64_t mine = next_rank(id, c);
    if (mine == never) return false;
    if (mine < capacity) return true;
    const std::size_t after = c == current_.end() ? 0 : c->second + 1;
    return after >= later_min_.size() || later_min_[after] > mine;
  }

 private:
  static constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();

  void index(std::span<const std::size_t> order, std::unordered_map<std::size_t, std::size_t>& pos,
             const char* what) const {
    pos.reserve(order.size());
    for (std::size_t i = 0; i < order.size(); ++i)
      STRATA_EXPECTS(pos.emplace(order[i], i).second, config_error, "{}: subgroup {} appears twice in {}",
                     entries_.policy(), order[i], what);
  }

  using position_map = std::unordered_map<std::size_t, std::size_t>;

  /// Index of the next use of `id` in the two-step horizon, or `never`.
  [[nodiscard]] std::uint64_t next_use(std::size_t id) const {
    const auto c = current_.find(id);
    if (c != current_.end() && !visited_.contains(id)) return c->second;
    const std::uint64_t r = next_rank(id, c);
    return r == never ? never : steps_length_ + r;
  }
  /// Place of `id` in the next step's order (`c`: its entry in current_), or `never`.
  [[nodiscard]] std::uint64_t next_rank(std::size_t id, position_map::const_iterator c) const {
    if (reversed_) return c == current_.end() ? never : steps_length_ - 1 - c->second;
    const auto n = next_.find(id);
    return n == next_.end() ? never : n->second;
  }

  /// Ranks sort ascending and the smallest goes first, so the furthest use gets the smallest rank.
  [[nodiscard]] std::uint64_t urgency(std::size_t id) const { return never - next_use(id); }

  bool reverse_next_;
  bool reversed_ = false;  // this step's next order is assumed to be its reverse
  position_map current_;
  position_map next_;
  std::vector<std::uint64_t> later_min_;
  std::unordered_set<std::size_t> visited_;
  std::size_t steps_length_ = 0;
};

}  // namespace strata::detail
