// Needs a GPU (label `cuda`): the CUDA AdamW kernel and gradient norm are bit-identical to the
// CPU kernels for every dtype pair, variant, size (vector body and tail) and alignment.
#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "strata/optim/adamw_cuda.cuh"
#include "cuda_test_support.cuh"
#include "test_support.hpp"

template <class G, class H>
void cpu_adamw(float* p, float* m, float* v, float* vmax, const G* g, H* out, std::size_t n,
               const strata::adamw_step_params& k);
template <class G>
double cpu_sum_squares(const G* g, std::size_t n, float scale);

namespace {

using strata_test::device_array;
using strata_test::get;
using strata_test::put;

template <class G, class H>
void check_pair() {
  cudaStream_t s{};
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (std::size_t n : {1UL, 3UL, 4UL, 5UL, 1000UL, 100003UL})
    for (std::size_t offset : {0UL, 1UL})  // 1: a sub-span off the 16-byte boundary
      for (int variant = 0; variant < 4; ++variant) {
        strata::adamw_options o;
        o.decoupled = variant % 2 == 0;
        o.amsgrad = variant >= 2;
        o.maximize = variant == 3;
        const auto k = strata::make_adamw_step_params(o, 4, 1e-3, 1.0 / 512, 0.9);
        strata_test::state<G, H> want(n, static_cast<std::uint32_t>(n + variant), 512.0f);
        auto got = want;
        cpu_adamw(want.p.data(), want.m.data(), want.v.data(), want.vmax.data(), want.g.data(), want.out.data(), n, k);
        device_array<float> p(n), m(n), v(n), x(n);
        device_array<G> g(n);
        device_array<H> out(n);
        put(p.ptr + offset, got.p, s);
        put(m.ptr + offset, got.m, s);
        put(v.ptr + offset, got.v, s);
        put(x.ptr + offset, got.vmax, s);
        put(g.ptr + offset, got.g, s);
        strata::cuda::adamw_update(p.ptr + offset, m.ptr + offset, v.ptr + offset, x.ptr + offset, g.ptr + offset,
                                   out.ptr + offset, n, k, s);
        get(got.p, p.ptr + offset, s);
        get(got.m, m.ptr + offset, s);
        get(got.v, v.ptr + offset, s);
        get(got.vmax, x.ptr + offset, s);
        get(got.out, out.ptr + offset, s);
        STRATA_CUDA_TRY(cudaStreamSynchronize(s));
        INFO("n=", n, " offset=", offset, " variant=", variant);
        REQUIRE(got == want);
      }
  STRATA_CUDA_TRY(cudaStreamDestroy(s));
}

}  // namespace

TEST_CASE_TEMPLATE("the CUDA kernel equals the CPU kernel bit for bit", pair, std::pair<float, strata::bf16>,
                   std::pair<float, strata::fp16>, std::pair<strata::bf16, strata::bf16>,
                   std::pair<strata::bf16, strata::fp16>, std::pair<strata::fp16, strata::bf16>,
                   std::pair<strata::fp16, strata::fp16>, std::pair<float, float>, std::pair<strata::bf16, float>) {
  check_pair<typename pair::first_type, typename pair::second_type>();
}

TEST_CASE_TEMPLATE("the CUDA gradient norm equals the CPU one bit for bit, inf/NaN included", G, float, strata::bf16,
                   strata::fp16) {
  cudaStream_t s{};
  STRATA_CUDA_TRY(cudaStreamCreate(&s));
  for (std::size_t n : {0UL, 1UL, 9UL, 2048UL, 2049UL, 1000003UL}) {
    strata_test::state<G, strata::bf16> st(n, static_cast<std::uint32_t>(n), 64.0f);
    device_array<G> g(n);
    put(g.ptr, st.g, s);
    const auto gpu = strata::cuda::grad_stats_cuda(g.ptr, n, 1.0f / 64, s);
    CHECK(gpu.count == n);
    CHECK(gpu.sum_squares == cpu_sum_squares(st.g.data(), n, 1.0f / 64));
    if (n > 5) {
      st.g[n / 2] = G(std::numeric_limits<float>::infinity());
      put(g.ptr, st.g, s);
      CHECK_FALSE(strata::cuda::grad_stats_cuda(g.ptr, n, 1.0f, s).finite());
    }
  }
  STRATA_CUDA_TRY(cudaStreamDestroy(s));
}
