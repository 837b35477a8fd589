#pragma once
/// `fifo`: evicts the unpinned subgroup that became resident first.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/policy/detail/ranked_entries.hpp"
#include "strata/policy/eviction_policy.hpp"

namespace strata {

/// First in, first out: an entry's rank is the time it was inserted; accesses do not change it.
/// The cheapest policy to reason about, and the baseline the others are measured against.
class fifo : public detail::ranked_policy {
 public:
  fifo() noexcept : ranked_policy("fifo") {}
  void on_step_begin(std::span<const std::size_t> /*order*/, std::span<const std::size_t> /*next*/) noexcept {}
  void on_insert(std::size_t id) { entries_.insert(id, {0, ++clock_}); }
  void on_access(std::size_t id) {
    STRATA_EXPECTS(entries_.contains(id), config_error, "fifo: access of subgroup {}, which is not cached", id);
  }
};

static_assert(eviction_policy<fifo>);

}  // namespace strata
