#pragma once
/// `belady`: the optimal offline policy, for a known future.

#include <cstddef>
#include <optional>
#include <span>

#include "strata/policy/detail/lookahead.hpp"
#include "strata/policy/eviction_policy.hpp"

namespace strata {

/// Belady's MIN: evicts the subgroup whose next use is furthest ahead, reading the future from
/// the orders given to on_step_begin (this step's and the next one's). With permutation orders
/// that horizon holds every subgroup's next use, so it gets the most hits any policy can get; use
/// it as the bound other policies are judged against, or when the orders are known in advance.
/// Without a next order it treats entries updated this step as never used again (least recently
/// used first among them).
class belady : public detail::lookahead {
 public:
  belady() noexcept : lookahead("belady", /*reverse_next=*/false) {}
};

static_assert(eviction_policy<belady>);

}  // namespace strata
