#pragma once
/// `lru`: evicts the least recently used unpinned subgroup.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "strata/policy/detail/ranked_entries.hpp"
#include "strata/policy/eviction_policy.hpp"

namespace strata {

/// Least recently used: an entry's rank is the time of its last insertion or access. Blind to the
/// update order, so a sequential order larger than the cache gets no hits at all; with an
/// alternating order it keeps exactly the subgroups the next step starts with.
class lru {
 public:
  void on_step_begin(std::span<const std::size_t> /*order*/, std::span<const std::size_t> /*next*/) noexcept {}
  void on_insert(std::size_t id) { entries_.insert(id, {0, ++clock_}); }
  void on_access(std::size_t id) { entries_.rerank(id, {0, ++clock_}); }
  void on_erase(std::size_t id) noexcept { entries_.erase(id); }
  void pin(std::size_t id) { entries_.pin(id); }
  void unpin(std::size_t id) noexcept { entries_.unpin(id); }
  [[nodiscard]] std::optional<std::size_t> victim() const noexcept { return entries_.smallest(); }
  [[nodiscard]] bool contains(std::size_t id) const { return entries_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

 private:
  detail::ranked_entries entries_{"lru"};
  std::uint64_t clock_ = 0;
};

static_assert(eviction_policy<lru>);

}  // namespace strata
