// AdamW with 8-bit block-quantized moments (optim/adamw_8bit_rule.hpp, optim/quant8.hpp): the
// maps, the nearest-code search, the state's layout and its quantized reads and writes, and the
// kernel: the same bits on every instruction-set path, thread count and block-aligned split; the
// float64 AdamW reference within the quantization's own error; whole-block semantics for spans
// that cover part of a block (the scale counts the values outside the span); NaN kept visible.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <doctest/doctest.h>

#include "rule_test_support.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/optim/adamw_8bit_rule.hpp"
#include "strata/optim/quant8.hpp"
#include "strata/optim/update_rule.hpp"

namespace {

using strata::adamw_8bit_rule;
using strata::q8_block_elems;
using strata::state_element;
using strata_test::rule_state;

// The code a brute-force search finds: the nearest map value, the lower on a tie.
std::uint8_t nearest(const strata::q8_map& m, float x) {
  std::size_t best = 0;
  for (std::size_t c = 1; c < 256; ++c)
    if (std::fabs(static_cast<double>(x) - m.value[c]) < std::fabs(static_cast<double>(x) - m.value[best])) best = c;
  return static_cast<std::uint8_t>(best);
}

std::vector<float> read(const strata::state_view& v, const strata::state_format& f, std::size_t a) {
  std::vector<float> out(v.count);
  strata::read_state_array(v, f, a, out);
  return out;
}

}  // namespace

TEST_CASE("the 8-bit maps span [-1, 1] (signed) and [0, 1] (unsigned) with 0 and the ends exact, ascending") {
  for (const strata::q8_map* m : {&strata::q8_signed_map, &strata::q8_unsigned_map}) {
    for (std::size_t c = 0; c + 1 < 256; ++c) {
      REQUIRE(m->value[c] < m->value[c + 1]);
      REQUIRE(m->value[c] < m->threshold[c]);
      REQUIRE(m->threshold[c] < m->value[c + 1]);
    }
    CHECK(m->value[255] == 1.0f);
    CHECK(m->value[m->zero] == 0.0f);
    CHECK(std::isinf(m->threshold[255]));
  }
  CHECK(strata::q8_signed_map.value[0] == -1.0f);  // both signs of absmax are exact
  CHECK(strata::q8_signed_map.value[1] < -0.99f);
  CHECK(strata::q8_unsigned_map.zero == 0);
  CHECK(strata::q8_signed_map.zero == 127);
  // seven decades: the smallest non-zero magnitudes are 10^-6 times the first bin's midpoint
  CHECK(strata::q8_signed_map.value[128] == doctest::Approx(0.55e-6).epsilon(1e-6));
  CHECK(strata::q8_unsigned_map.value[1] == doctest::Approx(0.325e-6).epsilon(1e-6));
}

TEST_CASE("the 8-bit code of a value is the nearest map value's, and every map value is its own code") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> decade(-9, 0);
  for (const strata::q8_map* m : {&strata::q8_signed_map, &strata::q8_unsigned_map}) {
    const bool is_signed = m == &strata::q8_signed_map;
    for (std::size_t c = 0; c < 256; ++c) REQUIRE(strata::q8_encode(m->threshold, m->value[c]) == c);
    for (int i = 0; i < 20000; ++i) {
      float x = unit(rng) * std::pow(10.0f, static_cast<float>(decade(rng)));
      if (!is_signed) x = std::fabs(x);
      INFO("x=" << x);
      REQUIRE(strata::q8_encode(m->threshold, x) == nearest(*m, x));
    }
    CHECK(strata::q8_encode(m->threshold, std::numeric_limits<float>::quiet_NaN()) == 0);
  }
}

TEST_CASE("the SIMD 8-bit quantizer gives the search's code at every threshold, its neighbours and bucket edges") {
  if (!strata::cpu_supports(strata::cpu_isa::avx2)) return;
#if STRATA_CPU_X86_PATHS
  for (const strata::q8_map* m : {&strata::q8_signed_map, &strata::q8_unsigned_map}) {
    std::vector<float> y;
    const auto around = [&](float x) {
      for (const float v : {x, std::nextafter(x, 2.0f), std::nextafter(x, -2.0f)})
        if (std::fabs(v) <= 1.0f) {
          y.push_back(v);
          y.push_back(-v);
        }
    };
    for (std::size_t c = 0; c < 256; ++c) {
      around(m->value[c]);
      if (c < 255) around(m->threshold[c]);
    }
    for (std::uint32_t b = 0; b < strata::detail::q8_buckets::count; b += 3)  // bucket edges
      around(std::bit_cast<float>((strata::detail::q8_buckets::first + b) << strata::detail::q8_buckets::shift));
    for (const float v : {0.0f, 1e-30f, 1e-9f, 1e-7f, 1.0f}) around(v);
    y.push_back(std::numeric_limits<float>::quiet_NaN());
    std::vector<std::uint8_t> got(y.size());
    strata::detail::simd::q8_quantize_avx2(*m, got.data(), 1.0f, y.data(), y.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      INFO("y=" << y[i]);
      REQUIRE(got[i] == strata::q8_encode(m->threshold, y[i]));
    }
    if (!strata::cpu_supports(strata::cpu_isa::avx512)) continue;
    std::vector<std::uint8_t> wide(y.size());
    strata::detail::simd::q8_quantize_avx512(*m, wide.data(), 1.0f, y.data(), y.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      INFO("avx512 y=" << y[i]);
      REQUIRE(wide[i] == strata::q8_encode(m->threshold, y[i]));
    }
  }
#endif
}

TEST_CASE("the SIMD 8-bit dequantizers read every code of both maps as the map value times the scale") {
#if STRATA_CPU_X86_PATHS
  for (const strata::q8_map* m : {&strata::q8_signed_map, &strata::q8_unsigned_map}) {
    // every code at every position of a 64-code group, then a tail shorter than a vector
    std::vector<std::uint8_t> code;
    for (std::size_t r = 0; r < 64; ++r)
      for (std::size_t c = 0; c < 256; ++c) code.push_back(static_cast<std::uint8_t>((c * 7 + r) % 256));
    for (std::size_t c = 0; c < 13; ++c) code.push_back(static_cast<std::uint8_t>(255 - c));
    for (const float scale : {1.0f, 0.37f, 3.0e-30f}) {
      std::vector<float> want(code.size());
      for (std::size_t i = 0; i < code.size(); ++i) want[i] = m->value[code[i]] * scale;
      const auto check = [&](const std::vector<float>& got, const char* path) {
        for (std::size_t i = 0; i < code.size(); ++i) {
          INFO(path << " code=" << int(code[i]) << " at " << i << " scale=" << scale);
          REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i]));
        }
      };
      std::vector<float> got(code.size());
      if (strata::cpu_supports(strata::cpu_isa::avx2)) {
        strata::detail::simd::q8_dequantize_avx2(*m, code.data(), scale, got.data(), code.size());
        check(got, "avx2");
      }
      if (strata::detail::cpu_has_avx512_vbmi()) {
        std::fill(got.begin(), got.end(), -7.0f);
        strata::detail::simd::q8_dequantize_avx512(*m, code.data(), scale, got.data(), code.size());
        check(got, "avx512");
      }
    }
  }
#endif
}

TEST_CASE("a quantized state lays out the master weights, the block scales, then the codes") {
  const auto f = adamw_8bit_rule::format(strata::adamw_options{});
  REQUIRE(f.count == 2);
  CHECK(f.arrays[0].element == state_element::q8);
  CHECK(f.arrays[1].element == state_element::uq8);
  CHECK(f.arrays[1].non_negative);
  CHECK(strata::describe(f) == "exp_avg:q8,exp_avg_sq:uq8");
  CHECK(f.block() == q8_block_elems);
  CHECK(f.bytes_per_param() == 6);
  CHECK(f.mean_bytes_per_param() == 6.03125);
  CHECK(f.aligned());
  for (std::size_t n : {1UL, 255UL, 256UL, 257UL, 1000UL}) {
    const std::size_t blocks = (n + 255) / 256;
    CHECK(f.scale_offset(0, n) == 4 * n);
    CHECK(f.scale_offset(1, n) == 4 * n + 4 * blocks);
    CHECK(f.offset(0, n) == 4 * n + 8 * blocks);
    CHECK(f.offset(1, n) == 5 * n + 8 * blocks);
    CHECK(f.state_bytes(n) == 6 * n + 8 * blocks);
  }
  strata::adamw_options ams;
  ams.amsgrad = true;
  CHECK(adamw_8bit_rule::format(ams).state_bytes(512) == 7 * 512 + 3 * 4 * 2);
  // formats without quantized arrays keep their layout
  const auto adamw = strata::adamw_rule::format(strata::adamw_options{});
  CHECK(adamw.block() == 0);
  CHECK(adamw.state_bytes(10) == 120);
  CHECK(adamw.offset(1, 10) == 80);
}

TEST_CASE("a quantized array reads back each value to the map's resolution of its block's absmax") {
  const auto f = adamw_8bit_rule::format(strata::adamw_options{});
  const std::size_t n = 1000;
  std::vector<std::byte> slot(f.state_bytes(n));
  const auto v = strata::state_view::of(slot.data(), f, n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> m(n), s(n);
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = normal(rng) * 1e-3f;
    s[i] = m[i] * m[i];
  }
  m[300] = 0;  // exact
  strata::write_state_array(v, f, 0, m);
  strata::write_state_array(v, f, 1, s);
  const auto m2 = read(v, f, 0), s2 = read(v, f, 1);
  for (std::size_t b = 0; b * 256 < n; ++b) {
    const std::size_t lo = b * 256, hi = std::min(n, lo + 256);
    float am = 0, as = 0;
    for (std::size_t i = lo; i < hi; ++i) {
      am = std::max(am, std::fabs(m[i]));
      as = std::max(as, s[i]);
    }
    CHECK(v.scales[0][b] == am);
    CHECK(v.scales[1][b] == as);
    for (std::size_t i = lo; i < hi; ++i) {
      INFO("i=" << i);
      // the nearest code of the value over its scale
      REQUIRE(v.array<std::uint8_t>(0)[i] == nearest(strata::q8_signed_map, m[i] / am));
      REQUIRE(v.array<std::uint8_t>(1)[i] == nearest(strata::q8_unsigned_map, s[i] / as));
      // within 0.72% (signed) and 0.36% (unsigned) of absmax: half the widest bin
      REQUIRE(std::fabs(m2[i] - m[i]) <= 0.0072f * am);
      REQUIRE(std::fabs(s2[i] - s[i]) <= 0.0036f * as);
    }
  }
  CHECK(std::bit_cast<std::uint32_t>(m2[300]) == 0);
  // what was read back quantizes to the same scales and codes: an exported state imports exactly
  const std::vector<std::byte> stored = slot;
  strata::write_state_array(v, f, 0, m2);
  strata::write_state_array(v, f, 1, s2);
  CHECK(slot == stored);
  // zeros: scale 0, the code of 0, read back as +0
  strata::write_state_array(v, f, 0, {});
  for (std::size_t b = 0; b * 256 < n; ++b) CHECK(v.scales[0][b] == 0.0f);
  for (float x : read(v, f, 0)) REQUIRE(std::bit_cast<std::uint32_t>(x) == 0);
}

TEST_CASE("the 8-bit AdamW kernel gives the same bits on every path, thread count and block-aligned split") {
  strata::thread_pool pool(3);
  strata::adamw_options plain, ams, adam;
  ams.amsgrad = true;
  ams.maximize = true;
  adam.decoupled = false;
  adam.weight_decay = 0.01;
  for (const auto& o : {plain, ams, adam})
    for (std::size_t n : {1UL, 7UL, 256UL, 300UL, 5000UL, 70001UL}) {
      const auto f = adamw_8bit_rule::format(o);
      const auto k = adamw_8bit_rule::make_step_params(o, strata::rule_step{3, 1e-3, o.decay(), 1.0 / 64, 0.7});
      const rule_state<float, strata::bf16> init(n, f, static_cast<std::uint32_t>(n), 64.0f);
      auto want = init;
      adamw_8bit_rule::update_cpu<float, strata::bf16>(want.view(f), 0, n, want.g.data(), want.out.data(), k, nullptr,
                                                       strata::cpu_isa::portable);
      for (const auto isa : strata_test::cpu_paths())
        for (strata::thread_pool* p : {static_cast<strata::thread_pool*>(nullptr), &pool}) {
          auto got = init;
          adamw_8bit_rule::update_cpu<float, strata::bf16>(got.view(f), 0, n, got.g.data(), got.out.data(), k, p, isa);
          INFO("n=" << n << " isa=" << static_cast<int>(isa) << " pool=" << (p != nullptr) << " amsgrad=" << o.amsgrad);
          REQUIRE(got == want);
          if (n > 512) {  // in two calls split at a block boundary
            auto split = init;
            const std::size_t cut = 512;
            adamw_8bit_rule::update_cpu<float, strata::bf16>(split.view(f), 0, cut, split.g.data(), split.out.data(), k,
                                                             p, isa);
            adamw_8bit_rule::update_cpu<float, strata::bf16>(split.view(f), cut, n - cut, split.g.data() + cut,
                                                             split.out.data() + cut, k, p, isa);
            REQUIRE(split == want);
          }
        }
    }
}

TEST_CASE("the 8-bit AdamW kernel follows the float64 reference within the quantization of the new moments") {
  strata::adamw_options o;
  o.weight_decay = 0.05;
  const auto f = adamw_8bit_rule::format(o);
  const std::size_t n = 3000;
  for (std::int64_t step : {1, 2, 10}) {
    const strata::rule_step s{step, 1e-3, o.decay(), 1.0 / 8, 1.0};
    const auto k = adamw_8bit_rule::make_step_params(o, s);
    rule_state<float, float> st(n, f, static_cast<std::uint32_t>(step), 8.0f);
    const auto v = st.view(f);
    const auto m0 = read(v, f, 0), v0 = read(v, f, 1);
    const std::vector<float> p0(st.slot.begin(), st.slot.begin() + static_cast<std::ptrdiff_t>(n));
    adamw_8bit_rule::update_cpu<float, float>(v, 0, n, st.g.data(), st.out.data(), k, nullptr);
    const auto m1 = read(v, f, 0), v1 = read(v, f, 1);
    for (std::size_t b = 0; b * 256 < n; ++b) {
      const std::size_t lo = b * 256, hi = std::min(n, lo + 256);
      std::vector<double> want_m(hi - lo), want_v(hi - lo);
      double am = 0, as = 0;
      for (std::size_t i = lo; i < hi; ++i) {
        double p = p0[i];
        double state[2] = {m0[i], v0[i]};
        adamw_8bit_rule::reference(p, state, st.g[i], o, s);
        INFO("step=" << step << " i=" << i);
        // the weight: from the unquantized new moments, as the reference
        REQUIRE(std::fabs(st.slot[i] - p) <= 1e-6 * std::fabs(p) + 1e-9);
        REQUIRE(st.out[i] == st.slot[i]);
        want_m[i - lo] = state[0];
        want_v[i - lo] = state[1];
        am = std::max(am, std::fabs(state[0]));
        as = std::max(as, state[1]);
      }
      // the new scales are the blocks' absmax, the codes the nearest (to float rounding)
      CHECK(v.scales[0][b] == doctest::Approx(am).epsilon(1e-6));
      CHECK(v.scales[1][b] == doctest::Approx(as).epsilon(1e-6));
      for (std::size_t i = lo; i < hi; ++i) {
        INFO("step=" << step << " i=" << i);
        REQUIRE(std::fabs(m1[i] - want_m[i - lo]) <= 0.0072 * am * (1 + 1e-5));
        REQUIRE(std::fabs(v1[i] - want_v[i - lo]) <= 0.0036 * as * (1 + 1e-5));
      }
    }
  }
}

TEST_CASE("an 8-bit update of part of a block requantizes the block and keeps zero state outside the span exact") {
  const auto f = adamw_8bit_rule::format(strata::adamw_options{});
  const auto k = adamw_8bit_rule::make_step_params(strata::adamw_options{}, strata::rule_step{1, 1e-3, 0.01, 1, 1});
  const std::size_t n = 1024;
  rule_state<float, strata::bf16> st(n, f, 5);
  const auto v = st.view(f);
  // parameters [100, 256) and [600, 1024) hold no state (padding between tensors)
  auto m = read(v, f, 0), s = read(v, f, 1);
  std::fill(m.begin() + 100, m.begin() + 256, 0.0f);
  std::fill(s.begin() + 100, s.begin() + 256, 0.0f);
  std::fill(m.begin() + 600, m.end(), 0.0f);
  std::fill(s.begin() + 600, s.end(), 0.0f);
  strata::write_state_array(v, f, 0, m);
  strata::write_state_array(v, f, 1, s);
  const auto before = st;
  // the tensors [0, 100) and [256, 600)
  adamw_8bit_rule::update_cpu<float, strata::bf16>(v, 0, 100, st.g.data(), st.out.data(), k, nullptr);
  adamw_8bit_rule::update_cpu<float, strata::bf16>(v, 256, 344, st.g.data() + 256, st.out.data() + 256, k, nullptr);
  const auto m1 = read(v, f, 0), s1 = read(v, f, 1);
  for (std::size_t i : {100UL, 200UL, 255UL, 600UL, 700UL, 1023UL}) {
    INFO("i=" << i);
    CHECK(std::bit_cast<std::uint32_t>(m1[i]) == 0);
    CHECK(std::bit_cast<std::uint32_t>(s1[i]) == 0);
    CHECK(st.slot[i] == before.slot[i]);              // weights untouched
    CHECK(st.out[i].bits == before.out[i].bits);      // and not written
  }
  CHECK(st.slot[50] != before.slot[50]);
  CHECK(st.slot[300] != before.slot[300]);
  // the untouched last block [768, 1024) keeps its bytes
  CHECK(v.scales[0][3] == 0.0f);
}

TEST_CASE("an 8-bit update of part of a block keeps the largest moment outside the span as the block's scale") {
  // The update loop finds the new absmax of the values it writes; the rest of the block must
  // still count: a moment outside the span larger than every new one stays the scale, exactly.
  strata::thread_pool pool(3);
  strata::adamw_options plain, ams;
  ams.amsgrad = true;
  for (const auto& o : {plain, ams}) {
    const auto f = adamw_8bit_rule::format(o);
    const auto k = adamw_8bit_rule::make_step_params(o, strata::rule_step{2, 1e-3, o.decay(), 1, 1});
    const std::size_t n = 1100, at = 100, count = 900;  // [100, 1000): starts and ends inside a block
    rule_state<float, strata::bf16> init(n, f, 11);
    const auto iv = init.view(f);
    // the largest |value| of blocks 0 and 3 (the partly updated ones) sits outside the span
    const std::size_t outside[] = {40, 1050};
    for (std::size_t a = 0; a < f.count; ++a) {
      auto x = read(iv, f, a);
      for (const std::size_t i : outside) x[i] = a == 0 ? -1000.0f : 1.0e6f;
      strata::write_state_array(iv, f, a, x);
    }
    auto want = init;
    adamw_8bit_rule::update_cpu<float, strata::bf16>(want.view(f), at, count, want.g.data() + at,
                                                     want.out.data() + at, k, nullptr, strata::cpu_isa::portable);
    const auto wv = want.view(f);
    for (std::size_t a = 0; a < f.count; ++a) {
      const auto x = read(wv, f, a);
      for (const std::size_t i : outside) {
        INFO("array=" << a << " i=" << i);
        CHECK(x[i] == (a == 0 ? -1000.0f : 1.0e6f));
        CHECK(wv.scales[a][i / q8_block_elems] == (a == 0 ? 1000.0f : 1.0e6f));
      }
    }
    for (const auto isa : strata_test::cpu_paths())
      for (strata::thread_pool* p : {static_cast<strata::thread_pool*>(nullptr), &pool}) {
        auto got = init;
        adamw_8bit_rule::update_cpu<float, strata::bf16>(got.view(f), at, count, got.g.data() + at,
                                                         got.out.data() + at, k, p, isa);
        INFO("isa=" << static_cast<int>(isa) << " pool=" << (p != nullptr) << " amsgrad=" << o.amsgrad);
        REQUIRE(got == want);
      }
  }
}

TEST_CASE("a NaN gradient makes its block's 8-bit moments NaN, visibly, and leaves other blocks alone") {
  const auto f = adamw_8bit_rule::format(strata::adamw_options{});
  const auto k = adamw_8bit_rule::make_step_params(strata::adamw_options{}, strata::rule_step{1, 1e-3, 0.01, 1, 1});
  const std::size_t n = 512;
  rule_state<float, strata::bf16> st(n, f, 9);
  st.g[10] = std::numeric_limits<float>::quiet_NaN();
  const auto v = st.view(f);
  adamw_8bit_rule::update_cpu<float, strata::bf16>(v, 0, n, st.g.data(), st.out.data(), k, nullptr);
  CHECK(std::isnan(v.scales[0][0]));
  CHECK(std::isnan(v.scales[1][0]));
  const auto m1 = read(v, f, 0);
  CHECK(std::isnan(m1[0]));
  CHECK(std::isnan(m1[255]));
  CHECK(std::isfinite(m1[256]));
  CHECK(std::isfinite(v.scales[0][1]));
}

TEST_CASE("the 8-bit AdamW kernel refuses a span past its state and missing scales") {
  const auto f = adamw_8bit_rule::format(strata::adamw_options{});
  const auto k = adamw_8bit_rule::make_step_params(strata::adamw_options{}, strata::rule_step{1, 1e-3, 0, 1, 1});
  rule_state<float, strata::bf16> st(300, f, 1);
  auto v = st.view(f);
  const auto update = [&](std::size_t at, std::size_t n) {
    adamw_8bit_rule::update_cpu<float, strata::bf16>(v, at, n, st.g.data(), nullptr, k, nullptr);
  };
  CHECK_THROWS_AS(update(200, 101), strata::config_error);
  v.scales[1] = nullptr;
  CHECK_THROWS_AS(update(0, 300), strata::config_error);
}
