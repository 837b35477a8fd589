// strata-bench's AdamW bound (bench/strata_bench/adamw_streams.hpp) moves the update's streams
// and changes nothing: state and gradients stay as they were, the model copy is the weights
// narrowed as the update narrows them, on every instruction-set path and gradient type.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../../bench/strata_bench/adamw_streams.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/optim/cpu_dispatch.hpp"

namespace adamw_streams_test {
namespace {

template <class G>
void check(strata::cpu_isa isa, std::size_t n, bool copy) {
  std::vector<float> p(n), m(n), v(n);
  std::vector<G> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(i) * 1.000123f - 7.5f;
    m[i] = static_cast<float>(i % 97) * -0.01f;
    v[i] = static_cast<float>(i % 13) * 0.003f;
    g[i] = G(static_cast<float>(i % 31) * 0.25f);
  }
  const auto p0 = p, m0 = m, v0 = v;
  const auto g0 = g;
  std::vector<strata::bf16> out(n, strata::bf16(0.0f));
  strata::thread_pool pool(2, "streams-test");
  strata::bench::adamw_streams_cpu(std::span<float>(p), std::span<float>(m), std::span<float>(v),
                                   std::span<const G>(g), copy ? std::span<strata::bf16>(out) : std::span<strata::bf16>(),
                                   &pool, 1000, isa);
  CHECK(std::memcmp(p.data(), p0.data(), n * 4) == 0);
  CHECK(std::memcmp(m.data(), m0.data(), n * 4) == 0);
  CHECK(std::memcmp(v.data(), v0.data(), n * 4) == 0);
  CHECK(std::memcmp(g.data(), g0.data(), n * sizeof(G)) == 0);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto want = copy ? strata::bf16(p0[i]) : strata::bf16(0.0f);
    wrong += std::memcmp(&out[i], &want, 2) != 0;
  }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("the AdamW streams bound leaves state and gradients unchanged and writes the narrowed model copy") {
  for (const auto isa : {strata::cpu_isa::portable, strata::cpu_isa::avx2, strata::cpu_isa::avx512}) {
    if (!strata::cpu_supports(isa)) continue;
    CAPTURE(strata::to_string(isa));
    for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{4099}, std::size_t{20011}}) {
      CAPTURE(n);
      for (const bool copy : {true, false}) {
        check<float>(isa, n, copy);
        check<strata::bf16>(isa, n, copy);
        check<strata::fp16>(isa, n, copy);
      }
    }
  }
}

}  // namespace adamw_streams_test
