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
/// The next order given to on_step_begin is ignored. Before the first step it behaves as lru.
class sweep_aware {
 public:
  void on_step_begin(std::span<const std::size_t> order, std::span<const std::size_t> next) {
    impl_.on_step_begin(order, next);
  }
  void on_insert(std::size_t id) { impl_.on_insert(id); }
  void on_access(std::size_t id) { impl_.on_access(id); }
  void on_erase(std::size_t id) noexcept { impl_.on_erase(id); }
  void pin(std::size_t id) { impl_.pin(id); }
  void unpin(std::size_t id) noexcept { impl_.unpin(id); }
  [[nodiscard]] std::optional<std::size_t> victim() const noexcept { return impl_.victim(); }
  [[nodiscard]] bool contains(std::size_t id) const { return impl_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept { return impl_.size(); }

 private:
  detail::lookahead impl_{"sweep_aware", /*reverse_next=*/true};
};

static_assert(eviction_policy<sweep_aware>);

}  // namespace strata
