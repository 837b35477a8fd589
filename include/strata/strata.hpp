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
#include "strata/core/notice.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/trace.hpp"
#include "strata/core/units.hpp"

#include "strata/policy/placement.hpp"

#include "strata/tier/adaptor_base.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/checksummed.hpp"
#include "strata/tier/faulty.hpp"
#include "strata/tier/file_tier.hpp"
#include "strata/tier/host_memory.hpp"
#include "strata/tier/host_tier.hpp"
#include "strata/tier/io_future.hpp"
#include "strata/tier/limited.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/throttled.hpp"
#include "strata/tier/throughput_meter.hpp"
#include "strata/tier/tier.hpp"
