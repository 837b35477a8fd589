#pragma once
/// strata::offloaded_adamw: AdamW (or Adam, amsgrad, maximize) whose fp32 state (master weights,
/// first and second moments, and the running maximum of the second moment with amsgrad) lives on
/// a tier stack: offloaded_optimizer (offload/offloaded_optimizer.hpp, whose file comment gives
/// the contract of every member) with adamw_rule. Besides the members every rule has, it starts
/// from existing AdamW state (from_state with an adamw_state_view, e.g. torch.optim.AdamW's) and
/// reads its moments back (read_moments, read_max_exp_avg_sq).

#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/offloaded_optimizer.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Offloaded AdamW: see the file comment.
template <tier Tier = dynamic_multipath<bandwidth_proportional>, eviction_policy Evict = sweep_aware,
          update_order Order = alternating, executor Exec = host_executor<>, update_site Site = always_host>
using offloaded_adamw = offloaded_optimizer<adamw_rule, Tier, Evict, Order, Exec, Site>;

}  // namespace strata
