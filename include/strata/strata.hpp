#pragma once
/// Umbrella header: includes every strata component.

#include "strata/version.hpp"

#include "strata/core/aligned_buffer.hpp"
#include "strata/core/config.hpp"
#include "strata/core/cuda.hpp"
#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/metrics.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/trace.hpp"
#include "strata/core/units.hpp"

#include "strata/policy/belady.hpp"
#include "strata/policy/cache_index.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/fifo.hpp"
#include "strata/policy/lru.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"

#include "strata/sync/counting_limiter.hpp"
#include "strata/sync/limiter.hpp"
#include "strata/sync/node_limiter.hpp"
#include "strata/sync/rate_limiter.hpp"
#include "strata/sync/rw_limiter.hpp"
#include "strata/sync/token_bucket.hpp"
