// AdamW with bf16 moments (optim/adamw_bf16_rule.hpp): a step is AdamW's fp32 step from the
// widened moments, with the new moments rounded to bf16 to nearest even, bit for bit, on every
// instruction-set path, thread count, tile, split and dtype; it follows the float64 reference
// within its rounding bound; NaN moments stay NaN.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/optim/adamw_bf16_rule.hpp"
#include "strata/optim/detail/simd_x86.hpp"
#include "rule_test_support.hpp"
#include "test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace adamw_bf16_rule_test {

namespace {

using strata::adamw_bf16_rule;
using strata::adamw_options;
using strata::bf16;

struct variant {
  const char* name;
  adamw_options o;
};

std::vector<variant> variants() {
  std::vector<variant> v;
  v.push_back({"adamw", {}});
  adamw_options ams;
  ams.amsgrad = true;
  ams.maximize = true;
  ams.weight_decay = 0.1;
  v.push_back({"amsgrad_maximize", ams});
  adamw_options adam;
  adam.decoupled = false;
  adam.weight_decay = 1e-2;
  v.push_back({"adam_l2", adam});
  return v;
}

// One parameter span with bf16 moments and the same span with those moments widened to fp32.
template <class G, class H>
struct both {
  std::size_t n;
  std::vector<float> p, p32;
  std::vector<bf16> m, v, x;
  std::vector<float> m32, v32, x32;
  std::vector<G> g;
  std::vector<H> out, out32;

  both(std::size_t count, std::uint32_t seed) : n(count), p(n), m(n), v(n), x(n), g(n), out(n), out32(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> decade(-8, 2);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      m[i] = bf16(normal(rng) * 1e-2f);
      v[i] = bf16(std::fabs(normal(rng)) * 1e-4f);
      x[i] = bf16(static_cast<float>(v[i]) * 1.5f * static_cast<float>(i % 2));
      g[i] = G(strata_test::awkward_grad(rng, normal, decade, i, 1.0f));
      out[i] = out32[i] = strata_test::unwritten<H>();
    }
    p32 = p;
    for (std::size_t i = 0; i < n; ++i) {
      m32.push_back(static_cast<float>(m[i]));
      v32.push_back(static_cast<float>(v[i]));
      x32.push_back(static_cast<float>(x[i]));
    }
  }
};

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class G, class H>
void check_against_fp32(std::size_t n, const adamw_options& o, strata::cpu_isa isa, strata::thread_pool* pool,
                        std::size_t tile, bool copy) {
  both<G, H> s(n, static_cast<std::uint32_t>(n * 31 + tile));
  const auto k = strata::make_adamw_step_params(o, 3, 1e-3, 1.0 / 64, 0.75);
  strata::adamw_update_cpu<G, H, bf16>(s.p, s.m, s.v, o.amsgrad ? std::span<bf16>(s.x) : std::span<bf16>(),
                                      s.g, copy ? std::span<H>(s.out) : std::span<H>(), k, pool, tile, isa);
  // AdamW's fp32 kernel from the widened moments, on the portable path, one thread
  strata::adamw_update_cpu<G, H>(s.p32, s.m32, s.v32, o.amsgrad ? std::span<float>(s.x32) : std::span<float>(), s.g,
                                 copy ? std::span<H>(s.out32) : std::span<H>(), k, nullptr, n + 1,
                                 strata::cpu_isa::portable);
  REQUIRE(same(s.p, s.p32));
  for (std::size_t i = 0; i < n; ++i) {
    INFO("i=", i, " m=", static_cast<float>(s.m[i]), " fp32 m=", s.m32[i]);
    REQUIRE(s.m[i].bits == bf16(s.m32[i]).bits);
    REQUIRE(s.v[i].bits == bf16(s.v32[i]).bits);
    if (o.amsgrad) REQUIRE(s.x[i].bits == bf16(s.x32[i]).bits);
  }
  if (copy) REQUIRE(same(s.out, s.out32));
}

TEST_CASE_TEMPLATE("a bf16-moment AdamW step is the fp32 step with its moments rounded to nearest, on every path",
                   pair, std::pair<float, bf16>, std::pair<bf16, bf16>, std::pair<strata::fp16, float>,
                   std::pair<float, float>, std::pair<strata::fp16, strata::fp16>) {
  using G = typename pair::first_type;
  using H = typename pair::second_type;
  strata::thread_pool pool(3, "bf16-moments");
  for (const auto& var : variants()) {
    for (const auto isa : strata_test::cpu_paths()) {
      for (const std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{1000},
                                   std::size_t{4099}}) {
        CAPTURE(var.name);
        CAPTURE(static_cast<int>(isa));
        CAPTURE(n);
        check_against_fp32<G, H>(n, var.o, isa, nullptr, strata::adamw_default_tile_elems, true);
        check_against_fp32<G, H>(n, var.o, isa, &pool, 64, false);
      }
    }
  }
}

TEST_CASE("the bf16-moment rule updated in pieces gives the bits of the whole span") {
  const std::size_t n = 1001;
  const adamw_options o;
  const auto f = adamw_bf16_rule::format(o);
  REQUIRE(f.bytes_per_param() == 8);
  const auto k = adamw_bf16_rule::make_step_params(o, strata::rule_step{2, 1e-3, o.decay(), 1, 1});
  const auto run = [&](std::vector<std::size_t> cuts) {
    both<float, bf16> s(n, 5);
    std::vector<std::byte> slot(n * f.bytes_per_param());
    std::memcpy(slot.data(), s.p.data(), n * 4);
    std::memcpy(slot.data() + f.offset(0, n), s.m.data(), n * 2);
    std::memcpy(slot.data() + f.offset(1, n), s.v.data(), n * 2);
    const auto view = strata::state_view::of(slot.data(), f, n);
    cuts.push_back(n);
    std::size_t at = 0;
    for (const std::size_t c : cuts) {
      adamw_bf16_rule::update_cpu<float, bf16>(view, at, c - at, s.g.data() + at, s.out.data() + at, k, nullptr);
      at = c;
    }
    return slot;
  };
  const auto whole = run({});
  CHECK(run({1}) == whole);
  CHECK(run({17, 500, 999}) == whole);
}

TEST_CASE("the bf16-moment rule follows its float64 reference within its rounding bound") {
  constexpr double u = 0x1p-24;
  for (const auto& var : variants()) {
    const adamw_options& o = var.o;
    both<float, bf16> s(2048, 11);
    const strata::rule_step rs{5, 2e-3, o.decay(), 1.0, 1.0};
    const auto k = adamw_bf16_rule::make_step_params(o, rs);
    const auto before = s;
    strata::adamw_update_cpu<float, bf16, bf16>(s.p, s.m, s.v, o.amsgrad ? std::span<bf16>(s.x) : std::span<bf16>(),
                                               s.g, {}, k);
    for (std::size_t i = 0; i < s.n; ++i) {
      double p = before.p[i];
      std::vector<double> st{before.m32[i], before.v32[i]};
      if (o.amsgrad) st.push_back(before.x32[i]);
      adamw_bf16_rule::reference(p, st, before.g[i], o, rs);
      const double update = std::fabs(p - before.p[i]);
      INFO(var.name, " i=", i, " got=", s.p[i], " want=", p);
      // fp32 arithmetic: a few roundings of the weight and of the update
      REQUIRE(std::fabs(s.p[i] - p) <= 8 * u * std::fabs(p) + 64 * u * update + 1e-30);
      // each moment: its fp32 value rounded to bf16, within one bf16 unit (2^-7 relative) of
      // the float64 value rounded to bf16 (the two can fall either side of a rounding boundary)
      REQUIRE(std::fabs(static_cast<float>(s.m[i]) - st[0]) <= 0x1p-7 * std::fabs(st[0]) + 1e-37);
      REQUIRE(std::fabs(static_cast<float>(s.v[i]) - st[1]) <= 0x1p-7 * std::fabs(st[1]) + 1e-37);
    }
  }
}

TEST_CASE("a NaN gradient leaves NaN bf16 moments, not finite ones") {
  both<float, bf16> s(33, 3);
  s.g[7] = std::numeric_limits<float>::quiet_NaN();
  strata::adamw_update_cpu<float, bf16, bf16>(s.p, s.m, s.v, {}, s.g, {}, strata::make_adamw_step_params({}, 1, 1e-3));
  CHECK(std::isnan(static_cast<float>(s.m[7])));
  CHECK(std::isnan(static_cast<float>(s.v[7])));
  CHECK(std::isnan(s.p[7]));
  CHECK(std::isfinite(static_cast<float>(s.m[8])));
}

TEST_CASE("the bf16-moment rule keeps 8 bytes a parameter under torch's names and records its own tag") {
  const auto f = adamw_bf16_rule::format({});
  CHECK(strata::describe(f) == "exp_avg:bf16,exp_avg_sq:bf16");
  CHECK(f.aligned());
  adamw_options ams;
  ams.amsgrad = true;
  CHECK(adamw_bf16_rule::format(ams).bytes_per_param() == 10);
  CHECK(adamw_bf16_rule::tag == "adamw-bf16");
  CHECK(adamw_bf16_rule::load_options(adamw_bf16_rule::save_options(ams)).amsgrad);
  both<float, bf16> s(4, 1);
  std::vector<bf16> short_m(3);
  const auto short_moments = [&] {
    strata::adamw_update_cpu<float, bf16, bf16>(s.p, short_m, s.v, {}, s.g, {}, strata::make_adamw_step_params({}, 1, 1e-3));
  };
  CHECK_THROWS_AS(short_moments(), strata::config_error);
}

#if STRATA_CPU_X86_PATHS
// 16 floats to bf16 bits by AVX512_BF16's instruction, as the kernels' bf16 stores do.
STRATA_DETAIL_AVX512BF16_FN void bits_by_instruction(const float* in, std::uint16_t* out) {
  namespace simd = strata::detail::simd;
  simd::store16_ne(reinterpret_cast<bf16*>(out), simd::f32x16(_mm512_loadu_ps(in)));
}
#endif

TEST_CASE("rounding to bf16 by AVX512_BF16's instruction gives the portable bits for every class of float") {
#if STRATA_CPU_X86_PATHS
  if (!strata::cpu_supports(strata::cpu_isa::avx512) || !__builtin_cpu_supports("avx512bf16")) {
    MESSAGE("skipped: this CPU has no AVX512_BF16");
    return;
  }
  // Every sign, exponent and upper mantissa (the high 16 bits: zeros, subnormals, normals,
  // infinities, NaNs), each with low halves at and around the rounding tie and its ends; a
  // subnormal is mixed into some vectors of normals and alone in others.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc000};
  std::vector<float> in;
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi)
    for (const std::uint32_t lo : lows) in.push_back(std::bit_cast<float>(hi << 16 | lo));
  std::vector<std::uint16_t> got(in.size());
  for (std::size_t i = 0; i < in.size(); i += 16) bits_by_instruction(in.data() + i, got.data() + i);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < in.size(); ++i)
    if (got[i] != strata::detail::float_to_bf16_bits(in[i]) && ++wrong <= 5)
      FAIL_CHECK("input bits ", std::bit_cast<std::uint32_t>(in[i]), ": ", got[i], " against ",
                 strata::detail::float_to_bf16_bits(in[i]));
  CHECK(wrong == 0);
#else
  MESSAGE("skipped: not an x86 build");
#endif
}

}  // namespace

}  // namespace adamw_bf16_rule_test
