#pragma once
/// Moved to strata/pipeline/host_budget.hpp (the pipeline's slots are its main users); kept so
/// that code including the old path still builds.
#include "strata/pipeline/host_budget.hpp"
