#pragma once
/// strata::offloaded_adamw_bf16: AdamW whose moments are stored in bf16 (8 bytes of state a
/// parameter instead of 12, so a third fewer bytes moved a step; the update is computed in fp32,
/// optim/adamw_bf16_rule.hpp says how it rounds): offloaded_optimizer
/// (offload/offloaded_optimizer.hpp, whose file comment gives the contract of every member) with
/// adamw_bf16_rule. Its options are adamw_options.

#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/offloaded_optimizer.hpp"
#include "strata/optim/adamw_bf16_rule.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Offloaded AdamW with bf16 moments: see the file comment.
template <tier Tier = dynamic_multipath<bandwidth_proportional>, eviction_policy Evict = sweep_aware,
          update_order Order = alternating, executor Exec = host_executor<>, update_site Site = always_host>
using offloaded_adamw_bf16 = offloaded_optimizer<adamw_bf16_rule, Tier, Evict, Order, Exec, Site>;

}  // namespace strata
