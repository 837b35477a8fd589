// The instantiations that strata's headers declare `extern template` when STRATA_EXTERN_TEMPLATES
// is 1 (core/config.hpp), defined once. strata's own tests, examples and benchmarks link this file
// (strata_instances in cmake/StrataTargetOptions.cmake) so that each of their translation units
// does not compile them again: the AdamW CPU kernels, the pipeline and the optimizer on
// host_executor<>, the default tier stacks and the run-time optimizers of the presets and rules. Consumers
// of the header-only library need none of it.
#include <strata/offload/make_offloaded_optimizer.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/optim/adamw_cpu.hpp>
#include <strata/pipeline/subgroup_pipeline.hpp>

namespace strata {
#define STRATA_ADAMW_UPDATE_CPU(G, H)                                                                    \
  template void adamw_update_cpu<G, H>(std::span<float>, std::span<float>, std::span<float>, std::span<float>, \
                                       std::span<const G>, std::span<H>, const adamw_step_params&, thread_pool*, \
                                       std::size_t, cpu_isa);
STRATA_ADAMW_TYPE_PAIRS(STRATA_ADAMW_UPDATE_CPU)
#undef STRATA_ADAMW_UPDATE_CPU

template class detail::pipeline_state<host_executor<>>;
template class detail::pipeline_core<host_executor<>>;
template class subgroup_pipeline<host_executor<>>;

template class detail::multipath_core<bandwidth_proportional, dynamic_multipath<bandwidth_proportional>>;
template class dynamic_multipath<bandwidth_proportional>;
template class detail::multipath_core<fixed_ratio, dynamic_multipath<fixed_ratio>>;
template class dynamic_multipath<fixed_ratio>;
template class throttled<any_tier>;
template class limited<any_tier, node_limiter>;
template class checksummed<any_tier>;
#define STRATA_RUNTIME(P, Pl, R) template class detail::runtime_offloaded_optimizer<P, Pl, R>;
STRATA_RUNTIME_OPTIMIZERS(STRATA_RUNTIME)
#undef STRATA_RUNTIME
}  // namespace strata

namespace strata::detail {
STRATA_OFFLOAD_INSTANCES()
}  // namespace strata::detail
