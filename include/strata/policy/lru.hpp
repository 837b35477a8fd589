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
class lru : public detail::ranked_policy {
 public:
  lru() noexcept : ranked_policy("lru") {}
  void on_step_begin(std::span<const std::size_t> /*order*/, std::span<const std::size_t> /*next*/) noexcept {}
  void on_insert(std::size_t id) { entries_.insert(id, {0, ++clock_}); }
  void on_access(std::size_t id) { entries_.rerank(id, {0, ++clock_}); }
};

static_assert(eviction_policy<lru>);

}  // namespace strata
