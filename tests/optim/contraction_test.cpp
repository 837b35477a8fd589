// The scalar formula keeps its roundings even where the compiler contracts products into FMAs
// (the reference is compiled with -mfma -ffp-contract=fast): it equals the kernel bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <span>

#include "strata/optim/adamw_cpu.hpp"
#include "test_support.hpp"

// Defined in contraction_reference.cpp, compiled apart with contraction forced on.
void contracted_reference(float* p, float* m, float* v, float* vmax, const float* g, std::size_t n,
                          const strata::adamw_step_params& k);
float contracted_mul_add(float a, float b, float c);

// The folder's tests compile together: this file's names stay in its own namespace.
namespace contraction_test {

TEST_CASE("a product of the formula's operations is rounded before it is added, even under -ffp-contract=fast") {
  if (!strata::cpu_supports(strata::cpu_isa::avx2)) {
    MESSAGE("this CPU has no AVX2+FMA: the contracted reference cannot run here");
    return;
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  int fused_would_differ = 0;
  for (int i = 0; i < 10000; ++i) {
    const float a = normal(rng), b = normal(rng), c = normal(rng);
    volatile float product = a * b;  // this file has no FMA: rounded, then added
    const float unfused = product + c;
    fused_would_differ += unfused != std::fma(a, b, c);
    REQUIRE(contracted_mul_add(a, b, c) == unfused);
  }
  CHECK(fused_would_differ > 100);  // the inputs do tell a fused result from an unfused one
}

TEST_CASE("the formula compiled with FMA contraction on still equals the kernels bit for bit") {
  if (!strata::cpu_supports(strata::cpu_isa::avx2)) {
    MESSAGE("this CPU has no AVX2+FMA: the contracted reference cannot run here");
    return;
  }
  for (bool amsgrad : {false, true})
    for (bool decoupled : {true, false}) {
      strata::adamw_options o;
      o.amsgrad = amsgrad;
      o.decoupled = decoupled;
      const auto k = strata::make_adamw_step_params(o, 5, 1e-3, 1.0 / 256, 0.5);
      strata_test::state<float, strata::bf16> want(5000, 11), got(5000, 11);
      contracted_reference(want.p.data(), want.m.data(), want.v.data(), want.vmax.data(), want.g.data(), 5000, k);
      strata::adamw_update_cpu(std::span<float>(got.p), std::span<float>(got.m), std::span<float>(got.v),
                               std::span<float>(got.vmax), std::span<const float>(got.g), std::span<strata::bf16>(), k);
      CHECK(got == want);
    }
}

}  // namespace contraction_test
