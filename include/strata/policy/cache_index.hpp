#pragma once
/// `cache_index<Policy>`: the bookkeeping of a bounded cache of subgroup slots driven by an
/// eviction policy: which subgroups are resident, which are pinned, hits and misses. It holds no
/// data; its owner keeps the buffers and moves bytes when it reports a miss or an eviction.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/policy/eviction_policy.hpp"

namespace strata {

/// What cache_index::access or admit did.
struct cache_lookup {
  bool hit = false;                      ///< the subgroup was resident already
  std::optional<std::size_t> evicted{};  ///< the subgroup dropped to make room, if any
};

/// A cache of `capacity` subgroup slots whose victims `Policy` chooses. Not thread-safe.
template <eviction_policy Policy>
class cache_index {
 public:
  explicit cache_index(std::size_t capacity, Policy policy = Policy{})
      : capacity_(capacity), policy_(std::move(policy)) {
    STRATA_EXPECTS(capacity > 0, config_error, "cache_index: capacity must be at least one subgroup");
  }

  /// A step begins: it walks `order`; the step after walks `next` (empty when unknown).
  void begin_step(std::span<const std::size_t> order, std::span<const std::size_t> next = {}) {
    policy_.on_step_begin(order, next);
  }

  /// Makes `id` resident without using it (a prefetch). Evicts first when the cache is full;
  /// throws capacity_error when every resident subgroup is pinned.
  cache_lookup admit(std::size_t id) {
    if (policy_.contains(id)) return {true, std::nullopt};
    cache_lookup r;
    if (policy_.size() == capacity_) {
      r.evicted = policy_.victim();
      STRATA_EXPECTS(r.evicted.has_value(), capacity_error,
                     "cache_index: no slot for subgroup {}: all {} cached subgroups are pinned", id, capacity_);
      policy_.on_erase(*r.evicted);
    }
    policy_.on_insert(id);
    return r;
  }

  /// The walk uses `id`: admits it when absent, tells the policy, counts a hit or a miss.
  cache_lookup access(std::size_t id) {
    auto r = admit(id);
    policy_.on_access(id);
    ++(r.hit ? hits_ : misses_);
    return r;
  }

  /// The walk uses `id` and would keep it: admits it when absent, unless the policy ranks it below
  /// every other entry it may evict (a lookahead policy knows it is used after all of them:
  /// keeping it would cost a hit, Belady's bypass); then `evicted` is `id` itself and nothing
  /// changes. Counts a hit or a miss.
  cache_lookup access_or_bypass(std::size_t id) {
    if (policy_.contains(id)) return access(id);
    cache_lookup r;
    policy_.on_insert(id);
    policy_.on_access(id);
    ++misses_;
    if (policy_.size() > capacity_) {
      r.evicted = policy_.victim();  // (`id` is not pinned: there is one)
      STRATA_ASSERT(r.evicted.has_value());
      policy_.on_erase(*r.evicted);
    }
    return r;
  }

  /// Drops `id` (for example after its state was written back); a no-op when not resident. The
  /// owner decides: a pinned subgroup is dropped too, with its pins.
  void erase(std::size_t id) {
    if (!policy_.contains(id)) return;
    policy_.on_erase(id);
  }

  void pin(std::size_t id) { policy_.pin(id); }
  void unpin(std::size_t id) noexcept { policy_.unpin(id); }

  [[nodiscard]] bool contains(std::size_t id) const { return policy_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept { return policy_.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint64_t hits() const noexcept { return hits_; }
  [[nodiscard]] std::uint64_t misses() const noexcept { return misses_; }
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }

 private:
  std::size_t capacity_;
  Policy policy_;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
};

}  // namespace strata
