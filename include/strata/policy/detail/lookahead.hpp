#pragma once
/// Belady's rule over a two-step horizon, shared by `sweep_aware` and `belady`: rank each resident
/// entry by when it is used next (later in this step's walk, else at its place in the next step's
/// order, else never) and evict the one used furthest ahead. Entries never used again tie and go
/// least recently used first. Update orders are permutations, so every subgroup appears in each
/// step and a two-step horizon already sees every entry's next use.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>

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

  /// Whether `id` is among the `capacity` subgroups the next step uses first: the entries this
  /// ranking holds once the step's walk is over (every other one is used later, or never).
  [[nodiscard]] bool keeps_for_next_step(std::size_t id, std::size_t capacity) const {
    if (reversed_) {
      const auto c = current_.find(id);
      return c != current_.end() && steps_length_ - 1 - c->second < capacity;
    }
    const auto n = next_.find(id);
    return n != next_.end() && n->second < capacity;
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

  /// Index of the next use of `id` in the two-step horizon, or `never`.
  [[nodiscard]] std::uint64_t next_use(std::size_t id) const {
    const auto c = current_.find(id);
    if (c != current_.end() && !visited_.contains(id)) return c->second;
    if (reversed_) {
      if (c == current_.end()) return never;
      return steps_length_ + (steps_length_ - 1 - c->second);
    }
    const auto n = next_.find(id);
    return n == next_.end() ? never : steps_length_ + n->second;
  }

  /// Ranks sort ascending and the smallest goes first, so the furthest use gets the smallest rank.
  [[nodiscard]] std::uint64_t urgency(std::size_t id) const { return never - next_use(id); }

  bool reverse_next_;
  bool reversed_ = false;  // this step's next order is assumed to be its reverse
  std::unordered_map<std::size_t, std::size_t> current_;
  std::unordered_map<std::size_t, std::size_t> next_;
  std::unordered_set<std::size_t> visited_;
  std::size_t steps_length_ = 0;
};

}  // namespace strata::detail
