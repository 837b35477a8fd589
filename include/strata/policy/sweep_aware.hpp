#pragma once
/// `sweep_aware`: eviction for alternating update orders (forward, then reverse, ...).

#include <cstddef>
#include <optional>
#include <span>

#include "strata/policy/detail/lookahead.hpp"
#include "strata/policy/eviction_policy.hpp"

namespace strata {

/// Knows that the next step walks this step's order backwards, so the subgroups updated last are
/// the first needed again: it evicts subgroups already updated this step, earliest-updated first,
/// and keeps the ones this step has still to update (a prefetched subgroup is never dropped
/// before its update while an updated one remains). Ranks by the subgroup's place in the order,
/// not by access time, so an access outside the walk (a checkpoint read) changes nothing.
/// A next order given to on_step_begin is used instead of that assumption (an offloaded
/// optimizer gives it: its update order's next step, the reverse under alternating, or the
/// landing order of backward when updates follow it); it then ranks as belady. Before the first
/// step it behaves as lru.
class sweep_aware : public detail::lookahead {
 public:
  sweep_aware() noexcept : lookahead("sweep_aware", /*reverse_next=*/true) {}
};

static_assert(eviction_policy<sweep_aware>);

}  // namespace strata
