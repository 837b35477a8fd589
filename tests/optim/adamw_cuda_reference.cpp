// The CPU side of the CUDA tests, compiled by the host compiler (the CPU kernels use x86 target
// attributes that belong in host-compiled code).
#include <cstddef>
#include <span>

#include "strata/optim/adamw_cpu.hpp"

template <class G, class H>
void cpu_adamw(float* p, float* m, float* v, float* vmax, const G* g, H* out, std::size_t n,
               const strata::adamw_step_params& k) {
  strata::adamw_update_cpu(std::span<float>(p, n), std::span<float>(m, n), std::span<float>(v, n),
                           std::span<float>(vmax, k.amsgrad ? n : 0), std::span<const G>(g, n),
                           out == nullptr ? std::span<H>() : std::span<H>(out, n), k);
}

template <class G>
double cpu_sum_squares(const G* g, std::size_t n, float scale) {
  return strata::grad_stats_cpu(std::span<const G>(g, n), scale).sum_squares;
}

#define STRATA_TEST_INSTANTIATE(G, H) \
  template void cpu_adamw<G, H>(float*, float*, float*, float*, const G*, H*, std::size_t, const strata::adamw_step_params&);
STRATA_TEST_INSTANTIATE(float, strata::bf16)
STRATA_TEST_INSTANTIATE(float, strata::fp16)
STRATA_TEST_INSTANTIATE(strata::bf16, strata::bf16)
STRATA_TEST_INSTANTIATE(strata::bf16, strata::fp16)
STRATA_TEST_INSTANTIATE(strata::fp16, strata::bf16)
STRATA_TEST_INSTANTIATE(strata::fp16, strata::fp16)
STRATA_TEST_INSTANTIATE(float, float)
STRATA_TEST_INSTANTIATE(strata::bf16, float)
template double cpu_sum_squares<float>(const float*, std::size_t, float);
template double cpu_sum_squares<strata::bf16>(const strata::bf16*, std::size_t, float);
template double cpu_sum_squares<strata::fp16>(const strata::fp16*, std::size_t, float);
