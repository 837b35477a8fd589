#pragma once
// Shared helpers of the optim tests: random optimizer state and the scalar reference loop.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "strata/core/half.hpp"
#include "strata/optim/adamw_math.hpp"

namespace strata_test {

/// Gradient i of a random test state: normal values scaled by `magnitude` and spread over eleven
/// decades, with a zero and a negative zero now and then.
inline float awkward_grad(std::mt19937& rng, std::normal_distribution<float>& normal,
                          std::uniform_int_distribution<int>& decade, std::size_t i, float magnitude) {
  float g = normal(rng) * magnitude * std::pow(10.0f, static_cast<float>(decade(rng)));
  if (i % 97 == 5) g = 0;
  if (i % 89 == 7) g = -0.0f;
  return g;
}

/// A model-copy value no update writes (0xdead for the 16-bit types).
template <class H>
H unwritten() {
  if constexpr (std::is_same_v<H, float>)
    return -12345.0f;
  else
    return H::from_bits(0xdead);
}

/// fp32 master weights and moments plus gradients and a model copy, filled with random values
/// of realistic and awkward magnitudes (including subnormals and zeros in the gradients).
template <class G, class H>
struct state {
  std::vector<float> p, m, v, vmax;
  std::vector<G> g;
  std::vector<H> out;

  state(std::size_t n, std::uint32_t seed, float grad_magnitude = 1.0f) : p(n), m(n), v(n), vmax(n), g(n), out(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> decade(-8, 2);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      m[i] = normal(rng) * 1e-2f;
      v[i] = std::fabs(normal(rng)) * 1e-4f;
      vmax[i] = v[i] * 1.5f * static_cast<float>(i % 2);  // half below v, half above
      g[i] = G(awkward_grad(rng, normal, decade, i, grad_magnitude));
      out[i] = unwritten<H>();
    }
  }

  /// The reference: strata::adamw_element element by element, no SIMD, no threads.
  void reference_step(const strata::adamw_step_params& k, bool write_model) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      strata::adamw_element(p[i], m[i], v[i], vmax[i], static_cast<float>(g[i]), k);
      if (write_model) out[i] = H(p[i]);
    }
  }

  friend bool operator==(const state& a, const state& b) {
    auto same = [](const auto& x, const auto& y) {
      return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
    };
    return same(a.p, b.p) && same(a.m, b.m) && same(a.v, b.v) && same(a.vmax, b.vmax) && same(a.out, b.out);
  }
};

}  // namespace strata_test
