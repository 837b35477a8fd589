// Compiled with -mavx2 -mfma -ffp-contract=fast (see CMakeLists.txt): the scalar formula in a
// translation unit where the compiler may fuse any product into an add.
#include <cstddef>

#include "strata/optim/adamw_math.hpp"

void contracted_reference(float* p, float* m, float* v, float* vmax, const float* g, std::size_t n,
                          const strata::adamw_step_params& k) {
  for (std::size_t i = 0; i < n; ++i) {
    // Locals, as a real loop would use: they let the compiler keep values in registers, which
    // is where it fuses products into FMAs.
    float pi = p[i], mi = m[i], vi = v[i], xi = vmax[i];
    strata::adamw_element(pi, mi, vi, xi, g[i], k);
    p[i] = pi, m[i] = mi, v[i] = vi, vmax[i] = xi;
  }
}

float contracted_mul_add(float a, float b, float c) {
  using namespace strata::detail::fp;
  return fadd(fmul(a, b), c);  // without the barrier GCC emits one vfmadd here
}
