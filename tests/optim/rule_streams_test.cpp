// strata-bench's bound of a rule's update (bench/strata_bench/rule_streams.hpp) moves the update's
// streams and changes nothing: the state (master weights, arrays, block scales) and the gradients
// stay as they were, the model copy is the weights narrowed as the kernels narrow them, for every
// rule's format, way, instruction-set path and gradient type.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../../bench/strata_bench/rule_streams.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/optim/adamw_8bit_rule.hpp"
#include "strata/optim/adamw_bf16_rule.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/cpu_dispatch.hpp"
#include "strata/optim/lion_rule.hpp"
#include "strata/optim/sgd_rule.hpp"

namespace rule_streams_test {
namespace {

template <class G>
void check(const strata::state_format& f, strata::cpu_isa isa, strata::bench::streams_way w, std::size_t n,
           bool copy) {
  std::vector<std::byte> state(f.state_bytes(n));
  // Bytes below 0x61: no bf16 is NaN (a NaN need not keep its bits through a widening).
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<std::byte>((i * 131 + 7) % 97);
  const auto v = strata::state_view::of(state.data(), f, n);
  for (std::size_t i = 0; i < n; ++i) v.master[i] = static_cast<float>(i) * 1.000123f - 7.5f;
  std::vector<G> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = G(static_cast<float>(i % 31) * 0.25f);
  const auto state0 = state;
  const auto g0 = g;
  std::vector<strata::bf16> out(n, strata::bf16(0.0f));
  strata::thread_pool pool(2, "streams-test");
  strata::bench::rule_streams_cpu<G, strata::bf16>(v, f, std::span<const G>(g),
                                                   copy ? std::span<strata::bf16>(out) : std::span<strata::bf16>(),
                                                   &pool, 1000, isa, w);
  CHECK(std::memcmp(state.data(), state0.data(), state.size()) == 0);
  CHECK(std::memcmp(g.data(), g0.data(), n * sizeof(G)) == 0);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto want = copy ? strata::bf16(v.master[i]) : strata::bf16(0.0f);
    wrong += std::memcmp(&out[i], &want, 2) != 0;
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("the streams bound of every rule leaves state and gradients unchanged and writes the narrowed model copy") {
  strata::adamw_options ams;
  ams.amsgrad = true;
  strata::sgd_options momentum;
  momentum.momentum = 0.9;
  const strata::state_format formats[] = {
      strata::adamw_rule::format({}),      strata::adamw_rule::format(ams),
      strata::adamw_bf16_rule::format({}), strata::adamw_8bit_rule::format({}),
      strata::adamw_8bit_rule::format(ams), strata::sgd_rule::format(momentum),
      strata::sgd_rule::format({}),        strata::lion_rule::format({})};
  for (const auto& f : formats) {
    CAPTURE(strata::describe(f));
    for (const auto isa : {strata::cpu_isa::portable, strata::cpu_isa::avx2, strata::cpu_isa::avx512}) {
      if (!strata::cpu_supports(isa)) continue;
      CAPTURE(strata::to_string(isa));
      for (const auto w : strata::bench::streams_ways) {
        CAPTURE(strata::bench::to_string(w));
        for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{4099}, std::size_t{20011}}) {
          CAPTURE(n);
          for (const bool copy : {true, false}) {
            check<float>(f, isa, w, n, copy);
            check<strata::bf16>(f, isa, w, n, copy);
            check<strata::fp16>(f, isa, w, n, copy);
          }
        }
      }
    }
  }
}

TEST_CASE("the streams bound refuses a state format whose arrays mix element types") {
  const strata::state_format mixed{{"a", strata::state_element::f32}, {"b", strata::state_element::bf16}};
  std::vector<std::byte> state(mixed.state_bytes(16));
  std::vector<float> g(16);
  const auto v = strata::state_view::of(state.data(), mixed, 16);
  const auto run = [&] {
    strata::bench::rule_streams_cpu<float, strata::bf16>(v, mixed, std::span<const float>(g),
                                                         std::span<strata::bf16>(), nullptr, 1000,
                                                         strata::cpu_isa::automatic);
  };
  CHECK_THROWS_AS(run(), strata::config_error);
}

}  // namespace rule_streams_test
