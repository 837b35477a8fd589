#pragma once
// Shared helpers of the update-rule tests (sgd_rule_test.cpp, lion_rule_test.cpp and the CUDA
// test): one subgroup's state laid out as the engine lays it out (master weights, then each array
// of the rule's format), random gradients and a model copy, and the instruction-set paths.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "strata/core/half.hpp"
#include "strata/optim/cpu_dispatch.hpp"
#include "strata/optim/update_rule.hpp"
#include "test_support.hpp"

namespace strata_test {

/// The instruction-set paths this CPU runs (portable always).
inline std::vector<strata::cpu_isa> cpu_paths() {
  std::vector<strata::cpu_isa> p{strata::cpu_isa::portable};
  for (auto isa : {strata::cpu_isa::avx2, strata::cpu_isa::avx512})
    if (strata::cpu_supports(isa)) p.push_back(isa);
  return p;
}

/// n parameters of a rule with `arrays` fp32 state arrays (0 or 1 here), in one slot as the
/// engine keeps it, with gradients and a model copy: random values of realistic and awkward
/// magnitudes (gradients over eleven decades, with zeros and negative zeros).
template <class G, class H>
struct rule_state {
  std::size_t n = 0;
  std::size_t arrays = 0;
  std::vector<float> slot;  // master weights, then each array, n floats each
  std::vector<G> g;
  std::vector<H> out;

  rule_state(std::size_t count, std::size_t state_arrays, std::uint32_t seed, float grad_magnitude = 1.0f)
      : n(count), arrays(state_arrays), slot(count * (1 + state_arrays)), g(count), out(count) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> decade(-8, 2);
    for (std::size_t i = 0; i < n; ++i) {
      slot[i] = normal(rng);
      for (std::size_t a = 0; a < arrays; ++a) slot[(a + 1) * n + i] = normal(rng) * 1e-2f;
      g[i] = G(awkward_grad(rng, normal, decade, i, grad_magnitude));
      out[i] = unwritten<H>();
    }
  }

  /// n parameters of a state of format `f` as the engine lays it out (quantized arrays quantized
  /// from random values, as write_state_array stores them; non-negative arrays squared).
  rule_state(std::size_t count, const strata::state_format& f, std::uint32_t seed, float grad_magnitude = 1.0f)
      : n(count), arrays(0), slot((f.state_bytes(count) + sizeof(float) - 1) / sizeof(float)), g(count), out(count) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> decade(-8, 2);
    for (std::size_t i = 0; i < n; ++i) {
      slot[i] = normal(rng);
      g[i] = G(awkward_grad(rng, normal, decade, i, grad_magnitude));
      out[i] = unwritten<H>();
    }
    const auto v = view(f);
    std::vector<float> values(n);
    for (std::size_t a = 0; a < f.count; ++a) {
      for (auto& x : values) {
        x = normal(rng) * 1e-2f;
        if (f.arrays[a].non_negative) x *= x;
      }
      strata::write_state_array(v, f, a, values);
    }
  }

  std::span<float> master() { return {slot.data(), n}; }
  /// Array a (0-based among the rule's arrays); empty when the rule keeps fewer.
  std::span<float> array(std::size_t a) {
    return a < arrays ? std::span<float>(slot.data() + (a + 1) * n, n) : std::span<float>();
  }
  /// The engine's view of the slot.
  strata::state_view view(const strata::state_format& f) {
    return strata::state_view::of(reinterpret_cast<std::byte*>(slot.data()), f, n);
  }

  friend bool operator==(const rule_state& a, const rule_state& b) {
    auto same = [](const auto& x, const auto& y) {
      return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
    };
    return same(a.slot, b.slot) && same(a.g, b.g) && same(a.out, b.out);
  }
};

}  // namespace strata_test
