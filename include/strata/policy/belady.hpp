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
class belady {
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
  detail::lookahead impl_{"belady", /*reverse_next=*/false};
};

static_assert(eviction_policy<belady>);

}  // namespace strata
