#pragma once
/// strata::offloaded_sgd: SGD (momentum, dampening, Nesterov, weight decay, maximize:
/// torch.optim.SGD) whose state (fp32 master weights and, with momentum, the momentum buffer) lives
/// on a tier stack: offloaded_optimizer (offload/offloaded_optimizer.hpp, whose file comment gives
/// the contract of every member) with sgd_rule (optim/sgd_rule.hpp).

#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/offloaded_optimizer.hpp"
#include "strata/optim/sgd_rule.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Offloaded SGD: see the file comment.
template <tier Tier = dynamic_multipath<bandwidth_proportional>, eviction_policy Evict = sweep_aware,
          update_order Order = alternating, executor Exec = host_executor<>, update_site Site = always_host>
using offloaded_sgd = offloaded_optimizer<sgd_rule, Tier, Evict, Order, Exec, Site>;

}  // namespace strata
