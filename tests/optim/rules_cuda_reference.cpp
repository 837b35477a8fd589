// The CPU side of the update-rule CUDA tests, compiled by the host compiler: the host kernels use
// x86 target attributes and association barriers that belong in host-compiled code (nvcc's front
// end lacks the barrier builtin).
#include <cstddef>

#include "strata/optim/adamw_8bit_rule.hpp"
#include "strata/optim/lion_rule.hpp"
#include "strata/optim/sgd_rule.hpp"

template <class R, class G, class H>
void cpu_rule_update(const strata::state_view& v, std::size_t at, std::size_t n, const G* g, H* out,
                     const typename R::step_params& k) {
  R::template update_cpu<G, H>(v, at, n, g, out, k, nullptr);
}

#define STRATA_TEST_INSTANTIATE(R, G, H)                                                                        \
  template void cpu_rule_update<R, G, H>(const strata::state_view&, std::size_t, std::size_t, const G*, H*, \
                                         const typename R::step_params&);
#define STRATA_TEST_PAIRS(R)                          \
  STRATA_TEST_INSTANTIATE(R, float, strata::bf16)     \
  STRATA_TEST_INSTANTIATE(R, float, strata::fp16)     \
  STRATA_TEST_INSTANTIATE(R, float, float)            \
  STRATA_TEST_INSTANTIATE(R, strata::bf16, strata::bf16) \
  STRATA_TEST_INSTANTIATE(R, strata::bf16, float)     \
  STRATA_TEST_INSTANTIATE(R, strata::fp16, strata::bf16) \
  STRATA_TEST_INSTANTIATE(R, strata::fp16, strata::fp16) \
  STRATA_TEST_INSTANTIATE(R, strata::fp16, float)
STRATA_TEST_PAIRS(strata::sgd_rule)
STRATA_TEST_PAIRS(strata::lion_rule)
STRATA_TEST_PAIRS(strata::adamw_8bit_rule)
