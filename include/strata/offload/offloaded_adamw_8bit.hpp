#pragma once
/// strata::offloaded_adamw_8bit: AdamW whose moments are stored as 8-bit block-quantized codes
/// (6 bytes and 1/32 of state a parameter instead of 12, so about half the bytes moved a step;
/// the update is computed in fp32, optim/adamw_8bit_rule.hpp says how it quantizes):
/// offloaded_optimizer (offload/offloaded_optimizer.hpp, whose file comment gives the contract of
/// every member) with adamw_8bit_rule. Its options are adamw_options. Tensors and ranges of
/// rates start at multiples of 256 parameters (q8_block_elems), and so do subgroups.

#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/offloaded_optimizer.hpp"
#include "strata/optim/adamw_8bit_rule.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Offloaded AdamW with 8-bit moments: see the file comment.
template <tier Tier = dynamic_multipath<bandwidth_proportional>, eviction_policy Evict = sweep_aware,
          update_order Order = alternating, executor Exec = host_executor<>, update_site Site = always_host>
using offloaded_adamw_8bit = offloaded_optimizer<adamw_8bit_rule, Tier, Evict, Order, Exec, Site>;

}  // namespace strata
