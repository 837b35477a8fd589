#pragma once
/// The `eviction_policy` concept: how a bounded host cache of subgroup state chooses what to drop.
///
/// The owner of the cache (the optimizer, or `cache_index`) keeps the entries; the policy only
/// ranks them. The owner tells the policy everything that happens to an entry and asks it for a
/// victim when it needs a slot:
///
///   on_step_begin(order, next_order)  a step begins; it walks the subgroups in `order`, and the
///                                     step after it in `next_order` (empty when unknown)
///   on_insert(id)                     `id` became resident (a miss, or a prefetch ahead of use)
///   on_access(id)                     the step's walk uses resident `id` (hit, or right after a miss)
///   on_erase(id)                      `id` left the cache (usually the victim just returned)
///   pin(id) / unpin(id)               a transfer uses `id`; pins nest; pinned entries are never
///                                     returned by victim()
///   victim()                          the unpinned entry to drop, or nullopt when none is unpinned
///
/// Contract: ids are subgroup ids; `order` lists distinct ids; on_insert of a resident id, and
/// on_access, pin or on_erase of a non-resident one, are caller errors (config_error); unpin of an
/// unpinned id is a bug (aborts). victim() is O(1) or O(log n) and on_erase/unpin do not throw.
/// A policy is not thread-safe: its owner serializes calls.
///
/// Optional (eviction_policy_with_plan): keeps_for_next_step(id, capacity) says whether the
/// policy, from the orders it was told, expects to still hold `id` (resident, used this step)
/// when this step's walk ends in a cache of `capacity` entries. A cache owner asks it before writing an updated entry early
/// (pipeline_options::eager_writes); a policy without it is taken to keep only the entries the
/// walk reaches last (a sweep pushes the others out, as it does out of an lru cache).

#include <concepts>
#include <cstddef>
#include <optional>
#include <span>

namespace strata {

/// Ranks the resident entries of a subgroup cache and names the one to evict. See the file comment
/// for the protocol.
template <class P>
concept eviction_policy =
    requires(P& p, const P& cp, std::size_t id, std::span<const std::size_t> order) {
      { p.on_step_begin(order, order) } -> std::same_as<void>;
      { p.on_insert(id) } -> std::same_as<void>;
      { p.on_access(id) } -> std::same_as<void>;
      { p.on_erase(id) } noexcept -> std::same_as<void>;
      { p.pin(id) } -> std::same_as<void>;
      { p.unpin(id) } noexcept -> std::same_as<void>;
      { cp.victim() } -> std::same_as<std::optional<std::size_t>>;
      { cp.contains(id) } -> std::same_as<bool>;
      { cp.size() } -> std::same_as<std::size_t>;
    };

/// An eviction policy that can tell which entries it keeps for the next step (see the file
/// comment).
template <class P>
concept eviction_policy_with_plan =
    eviction_policy<P> && requires(const P& cp, std::size_t id) {
      { cp.keeps_for_next_step(id, id) } -> std::same_as<bool>;
    };

}  // namespace strata
