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
#include "strata/core/half.hpp"
#include "strata/core/metrics.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/trace.hpp"
#include "strata/core/units.hpp"

#include "strata/optim/adamw_cpu.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/grad_norm.hpp"
