// Needs a GPU (label `cuda`): the CUDA kernels of SGD, Lion and 8-bit AdamW (cuda_update<sgd_rule>,
// cuda_update<lion_rule>, cuda_update<adamw_8bit_rule>) are bit-identical to the host kernels (update_cpu) for every dtype
// pair, variant, size (vector body and tail), sub-span offset (alignment) and with or without a
// model copy.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_support.cuh"
#include "rule_test_support.hpp"
#include "strata/optim/adamw_8bit_cuda.cuh"
#include "strata/optim/lion_cuda.cuh"
#include "strata/optim/sgd_cuda.cuh"

template <class R, class G, class H>
void cpu_rule_update(const strata::state_view& v, std::size_t at, std::size_t n, const G* g, H* out,
                     const typename R::step_params& k);

namespace {

using strata_test::device_array;
using strata_test::get;
using strata_test::put;

/// Each (options, step) of rule R against the host kernel: the whole span, and the sub-span
/// [1, n) (state, gradients and model copy one element off their 16-byte boundary).
template <class R, class G, class H>
void check_rule(const std::vector<std::pair<typename R::options_type, std::int64_t>>& cases) {
  cudaStream_t s{};
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // (8-bit AdamW: also a span from a block's start, and partial first and last blocks)
  for (std::size_t n : {1UL, 3UL, 4UL, 5UL, 257UL, 1000UL, 100003UL})
    for (std::size_t ci = 0; ci < cases.size(); ++ci)
      for (std::size_t at : {0UL, 1UL, 256UL})
        for (bool write_model : {true, false}) {
          if (at >= n) continue;
          const auto& [o, step] = cases[ci];
          const auto f = R::format(o);
          const auto k = R::make_step_params(o, strata::rule_step{step, 1e-3, 0.01, 1.0 / 512, 0.9});
          strata_test::rule_state<G, H> want(n, f, static_cast<std::uint32_t>(n + ci), 512.0f);
          auto got = want;
          cpu_rule_update<R>(want.view(f), at, n - at, want.g.data() + at, write_model ? want.out.data() + at : nullptr,
                             k);
          device_array<float> slot(got.slot.size());
          device_array<G> g(n);
          device_array<H> out(n);
          put(slot.ptr, got.slot, s);
          put(g.ptr, got.g, s);
          put(out.ptr, got.out, s);
          const auto v = strata::state_view::of(reinterpret_cast<std::byte*>(slot.ptr), f, n);
          strata::cuda_update<R>::launch(v, at, n - at, g.ptr + at, write_model ? out.ptr + at : nullptr, k, s);
          get(got.slot, slot.ptr, s);
          get(got.out, out.ptr, s);
          STRATA_CUDA_TRY(cudaStreamSynchronize(s));
          INFO("rule=", std::string(R::tag), " n=", n, " case=", ci, " at=", at, " model=", write_model);
          REQUIRE(got == want);
        }
  STRATA_CUDA_TRY(cudaStreamDestroy(s));
}

std::vector<std::pair<strata::sgd_options, std::int64_t>> sgd_cases() {
  strata::sgd_options plain, mom, damp, nesterov;
  plain.weight_decay = 0;
  mom.momentum = 0.9;
  damp = mom;
  damp.dampening = 0.3;
  damp.maximize = true;
  nesterov = mom;
  nesterov.nesterov = true;
  // The L2 decay comes from rule_step (0.01): every case has it; `plain` shows it alone.
  return {{plain, 2}, {mom, 1}, {mom, 3}, {damp, 2}, {nesterov, 4}};
}

std::vector<std::pair<strata::lion_options, std::int64_t>> lion_cases() {
  strata::lion_options def, up;
  up.maximize = true;
  up.beta1 = 0.95;
  up.beta2 = 0.98;
  return {{def, 1}, {up, 7}};
}

std::vector<std::pair<strata::adamw_options, std::int64_t>> adamw_8bit_cases() {
  strata::adamw_options plain, ams, adam;
  ams.amsgrad = true;
  ams.maximize = true;
  adam.decoupled = false;
  return {{plain, 1}, {plain, 5}, {ams, 3}, {adam, 2}};
}

}  // namespace

TEST_CASE_TEMPLATE("the CUDA 8-bit AdamW kernel equals the host kernel bit for bit", pair,
                   std::pair<float, strata::bf16>, std::pair<float, float>, std::pair<strata::bf16, strata::bf16>,
                   std::pair<strata::fp16, strata::fp16>) {
  check_rule<strata::adamw_8bit_rule, typename pair::first_type, typename pair::second_type>(adamw_8bit_cases());
}

TEST_CASE("the CUDA 8-bit maps are the host's") {
  strata::q8_map got[2];
  STRATA_CUDA_TRY(cudaMemcpyFromSymbol(got, strata::cuda::detail::q8_device_maps, sizeof(got)));
  CHECK(std::memcmp(&got[0], &strata::q8_signed_map, sizeof(strata::q8_map)) == 0);
  CHECK(std::memcmp(&got[1], &strata::q8_unsigned_map, sizeof(strata::q8_map)) == 0);
}

TEST_CASE_TEMPLATE("the CUDA SGD kernel equals the host kernel bit for bit", pair, std::pair<float, strata::bf16>,
                   std::pair<float, strata::fp16>, std::pair<float, float>, std::pair<strata::bf16, strata::bf16>,
                   std::pair<strata::bf16, float>, std::pair<strata::fp16, strata::bf16>,
                   std::pair<strata::fp16, strata::fp16>, std::pair<strata::fp16, float>) {
  check_rule<strata::sgd_rule, typename pair::first_type, typename pair::second_type>(sgd_cases());
}

TEST_CASE_TEMPLATE("the CUDA Lion kernel equals the host kernel bit for bit", pair, std::pair<float, strata::bf16>,
                   std::pair<float, strata::fp16>, std::pair<float, float>, std::pair<strata::bf16, strata::bf16>,
                   std::pair<strata::bf16, float>, std::pair<strata::fp16, strata::bf16>,
                   std::pair<strata::fp16, strata::fp16>, std::pair<strata::fp16, float>) {
  check_rule<strata::lion_rule, typename pair::first_type, typename pair::second_type>(lion_cases());
}

TEST_CASE("a missing state array on the device is a config_error, not a launch") {
  strata::sgd_options mom;
  mom.momentum = 0.9;
  const auto k = strata::sgd_rule::make_step_params(mom, strata::rule_step{2, 1e-3, 0, 1, 1});
  device_array<float> p(4), g(4);
  strata::state_view v;
  v.master = p.ptr;
  CHECK_THROWS_AS(strata::cuda_update<strata::sgd_rule>::launch(v, 0, 4, g.ptr, static_cast<strata::bf16*>(nullptr),
                                                                k, cudaStream_t{}),
                  strata::config_error);
}
