#pragma once
/// Presets: named configurations of the one offloaded_adamw template (not separate code). Each
/// preset names its eviction policy, update order and placement, and turns a base
/// offload_options into its own (cache, pipeline depth, where gradients wait):
///
///   using P = strata::presets::mlp_offload;
///   strata::file_tier nvme(nvme_opts);
///   auto locks = strata::make_node_rw_limiter("pfs", 1, strata::rw_sharing::separate);
///   strata::limited<strata::file_tier, strata::node_limiter> pfs(locks, pfs_opts);
///   P::paths<strata::file_tier, strata::file_tier> tier(P::placement(), nvme, pfs);
///   P::optimizer<decltype(tier)> opt(tier, params, adamw, P::options(params.size(), adamw, base));
///
/// What each one emulates, and how faithfully, is in docs/design.md section 4.
/// - zero_infinity: ZeRO-Infinity's way (DeepSpeed's pipelined optimizer swapper), the baseline.
///   One path; fp32 gradients written to the tier during backward and read back at the update;
///   sequential order; prefetch the next subgroup, write the previous one behind, nothing read
///   before step() is called. No state kept across steps unless the base gives a host cache (an
///   equal-resources comparison): then belady keeps the subgroups that serve a sequential order
///   best.
/// - mlp_offload: MLP-Offload (SC'25). Two paths placed 2:1 (NVMe:PFS) round robin, one read-ahead
///   and one write-behind per path (one swapper per path with one async swap-in and one async
///   swap-out), the PFS path behind node-wide locks taken per request (its swap calls), one for
///   reads and one for writes; alternating order with the last K subgroups kept in host memory
///   (lru: with an alternating order it keeps exactly those); 16-bit gradients kept in host memory;
///   nothing read before step() is called.
/// - strata_preset ("strata"): placement proportional to each path's measured or declared
///   bandwidth, a sweep_aware cache as large as the budget leaves after a deeper pipeline,
///   gradients where the base says: 16-bit in host memory by default, or automatic (host memory
///   when an fp32 store fits the budget, else the tier).

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "strata/offload/offload_layout.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/offloaded_adamw.hpp"
#include "strata/offload/offloaded_optimizer.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/update_rule.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/policy/belady.hpp"
#include "strata/policy/lru.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/sync/node_limiter.hpp"
#include "strata/tier/checksummed.hpp"
#include "strata/tier/limited.hpp"
#include "strata/tier/multipath.hpp"

namespace strata::presets {

namespace detail {
/// Bytes of host memory one subgroup slot takes under `o`.
[[nodiscard]] inline std::uint64_t slot_footprint(std::size_t params, const state_format& f, const offload_options& o) {
  return offload_layout::of_format(params, f, o).slot_footprint();
}
}  // namespace detail

/// ZeRO-Infinity: see the file comment.
struct zero_infinity {
  static constexpr std::string_view name = "zero_infinity";
  using eviction = belady;  // consulted only when the base gives a cache
  using order = sequential;
  template <tier Tier>
  using optimizer = offloaded_adamw<Tier, eviction, order>;
  /// The same with updates on `Exec` where `Site` says (gradients and the model may live there).
  template <tier Tier, executor Exec, update_site Site>
  using device_optimizer = offloaded_adamw<Tier, eviction, order, Exec, Site>;
  /// The same with another update rule.
  template <update_rule Rule, tier Tier, executor Exec = host_executor<>, update_site Site = always_host>
  using rule_optimizer = offloaded_optimizer<Rule, Tier, eviction, order, Exec, Site>;
  /// One path: the tier itself.
  template <tier Tier>
  using paths = Tier;

  /// The base's host cache is kept (none by default, as ZeRO-Infinity keeps none).
  [[nodiscard]] static offload_options options(std::size_t params, const adamw_options& a, offload_options base = {},
                                               bool device = false) {
    return options(params, adamw_rule::format(a), std::move(base), device);
  }
  /// As above for a rule's state format.
  [[nodiscard]] static offload_options options(std::size_t /*params*/, const state_format& /*format*/,
                                               offload_options base, bool /*device*/ = false) {
    base.prefetch_depth = 1;
    base.write_behind_depth = 1;
    base.prefetch_next_step = false;  // DeepSpeed's swapper reads a step's state within the step
    base.return_before_writes = false;  // and its step returns when the last swap-out is done
    base.update_as_gradients_land = false;  // and runs after backward
    base.gradients = gradient_residency::tier;
    return base;
  }
};

/// MLP-Offload: see the file comment.
struct mlp_offload {
  static constexpr std::string_view name = "mlp_offload";
  using eviction = lru;
  using order = alternating;
  template <tier Tier>
  using optimizer = offloaded_adamw<Tier, eviction, order>;
  /// The same with updates on `Exec` where `Site` says (gradients and the model may live there).
  template <tier Tier, executor Exec, update_site Site>
  using device_optimizer = offloaded_adamw<Tier, eviction, order, Exec, Site>;
  /// The same with another update rule.
  template <update_rule Rule, tier Tier, executor Exec = host_executor<>, update_site Site = always_host>
  using rule_optimizer = offloaded_optimizer<Rule, Tier, eviction, order, Exec, Site>;
  /// NVMe and PFS paths, the PFS one behind node-wide limiters (build it from a separate
  /// rw_limiter, as above, for MLP-Offload's read and write locks); both owned by the caller.
  template <tier Nvme, tier Pfs>
  using paths = multipath<fixed_ratio, Nvme&, limited<Pfs, node_limiter>&>;
  /// 2:1 round robin.
  [[nodiscard]] static fixed_ratio placement() { return fixed_ratio({2, 1}); }
  /// Subgroups kept across steps (MLP-Offload keeps a few; 2 unless the base gives a cache).
  static constexpr std::size_t default_kept = 2;

  [[nodiscard]] static offload_options options(std::size_t params, const adamw_options& a, offload_options base = {},
                                               bool device = false) {
    return options(params, adamw_rule::format(a), std::move(base), device);
  }
  /// As above for a rule's state format.
  [[nodiscard]] static offload_options options(std::size_t params, const state_format& a, offload_options base,
                                               bool /*device*/ = false) {
    if (base.gradients != gradient_residency::caller) base.gradients = gradient_residency::host;
    base.prefetch_depth = 1;  // per path: its swapper's one async swap-in and one async swap-out
    base.write_behind_depth = 1;
    base.prefetch_next_step = false;  // as DeepSpeed's: nothing read before the step
    base.return_before_writes = false;  // nor written after it
    base.update_as_gradients_land = false;  // nor updated before it
    if (base.host_cache_bytes == 0 && !base.cache_subgroups) base.host_cache_bytes = default_kept * detail::slot_footprint(params, a, base);
    return base;
  }
};

/// strata's own choices: see the file comment.
struct strata_preset {
  static constexpr std::string_view name = "strata";
  using eviction = sweep_aware;
  using order = alternating;
  template <tier Tier>
  using optimizer = offloaded_adamw<Tier, eviction, order>;
  /// The same with updates on `Exec` where `Site` says (gradients and the model may live there).
  template <tier Tier, executor Exec, update_site Site>
  using device_optimizer = offloaded_adamw<Tier, eviction, order, Exec, Site>;
  /// The same with another update rule.
  template <update_rule Rule, tier Tier, executor Exec = host_executor<>, update_site Site = always_host>
  using rule_optimizer = offloaded_optimizer<Rule, Tier, eviction, order, Exec, Site>;
  /// Each path under checksummed<> (1 MiB blocks, checksums in memory): a damaged byte on a path
  /// is an integrity_error, never a wrong weight. Built from one argument per path as before.
  template <tier... Paths>
  using paths = multipath<bandwidth_proportional, checksummed<Paths>...>;
  [[nodiscard]] static bandwidth_proportional placement() { return {}; }

  /// Prefetch and write-behind 4 deep; gradients where the base says (host by default, with room
  /// left for a 16-bit store; automatic: an fp32 store in host memory when the budget holds it
  /// beside the pipeline, else on the tier); the cache takes what the budget leaves (none with an
  /// unlimited budget: give host_cache_bytes or a budget). `device`: the update site may choose
  /// the device, whose landing slots the budget holds too.
  [[nodiscard]] static offload_options options(std::size_t params, const adamw_options& a, offload_options base = {},
                                               bool device = false) {
    return options(params, adamw_rule::format(a), std::move(base), device);
  }
  /// As above for a rule's state format.
  [[nodiscard]] static offload_options options(std::size_t params, const state_format& a, offload_options base,
                                               bool device = false) {
    base.prefetch_depth = 4;
    base.write_behind_depth = 4;
    const std::uint64_t budget = base.host_memory_budget;
    const std::uint64_t n = params;
    // Gives `o` the cache the budget leaves beside its pipeline and a gradient store of `store`
    // bytes (none when the store does not fit: false); o untouched when the pipeline does not.
    const auto fill = [&](offload_options& o, std::uint64_t store) {
      offload_options bare = o;
      bare.host_cache_bytes = 0;
      bare.cache_subgroups.reset();
      const auto layout = offload_layout::of_format(params, a, bare);
      const std::uint64_t pipeline = layout.required_host_memory(bare, device);
      if (budget == unlimited_capacity || budget < pipeline) return false;
      const std::uint64_t left = budget - pipeline, slot = layout.slot_footprint();
      o.host_cache_bytes = left >= store ? (left - store) / slot * slot : 0;
      return left >= store;
    };
    if (base.gradients == gradient_residency::automatic) {
      offload_options host = base, tier = base;
      host.gradients = gradient_residency::host;
      tier.gradients = gradient_residency::tier;
      if (budget == unlimited_capacity || fill(host, host_budget::footprint(n * 4))) return host;
      if (fill(tier, 0)) return tier;
      return host;  // room for the host pipeline at most: a step over the caller's gradients
    }
    fill(base, base.gradients == gradient_residency::host ? host_budget::footprint(n * 2) : 0);
    return base;
  }
};

}  // namespace strata::presets
