#pragma once
/// Moved to strata/tier/tier_paths.hpp; kept so that code including the old path still builds.
#include "strata/tier/tier_paths.hpp"
