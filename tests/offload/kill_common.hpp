#pragma once
// What the kill helper and the kill test share: the model, its gradients and learning rates per
// step, so the test can replay any prefix of the helper's run in memory.
#include <cstdint>
#include <vector>

#include <strata/strata.hpp>

#include "offload_test_support.hpp"

namespace strata_kill {

inline constexpr std::size_t params = 50'000;
inline constexpr std::size_t subgroup = 4'000;  // 13 subgroups, the last shorter

inline strata::adamw_options options() {
  strata::adamw_options o;
  o.weight_decay = 0.02;
  return o;
}
inline std::vector<float> initial() { return strata_test::random_params(params, 77); }
inline std::vector<strata::bf16> grads(std::uint64_t step) {
  return strata_test::random_grads<strata::bf16>(params, 1000 + step);
}
inline double lr(std::uint64_t step) { return 1e-3 / (1.0 + 0.1 * static_cast<double>(step)); }

}  // namespace strata_kill
