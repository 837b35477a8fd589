// The instantiations that strata's headers declare `extern template` when STRATA_EXTERN_TEMPLATES
// is 1 (core/config.hpp), defined once. strata's own tests, examples and benchmarks link this file
// (strata_instances in cmake/StrataTargetOptions.cmake) so that each of their translation units
// does not compile the AdamW CPU kernels and the host optimizer's step again. Consumers of the
// header-only library need none of it.
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/optim/adamw_cpu.hpp>

namespace strata {
#define STRATA_ADAMW_UPDATE_CPU(G, H)                                                                    \
  template void adamw_update_cpu<G, H>(std::span<float>, std::span<float>, std::span<float>, std::span<float>, \
                                       std::span<const G>, std::span<H>, const adamw_step_params&, thread_pool*, \
                                       std::size_t, cpu_isa);
STRATA_ADAMW_TYPE_PAIRS(STRATA_ADAMW_UPDATE_CPU)
#undef STRATA_ADAMW_UPDATE_CPU
}  // namespace strata

namespace strata::detail {
#define STRATA_OFFLOAD_RUN_STEP(G, H)                                                          \
  template offload_step_stats offload_core<host_executor<>>::run_step<G, H>(                   \
      double, model_copy<H>, offload_core<host_executor<>>::gradient_source<G>, const grad_norm_accumulator&);
STRATA_ADAMW_TYPE_PAIRS(STRATA_OFFLOAD_RUN_STEP)
#undef STRATA_OFFLOAD_RUN_STEP
}  // namespace strata::detail
