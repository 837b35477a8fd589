// Lion as an update rule (optim/lion_rule.hpp): the kernels give the scalar formula's bits on
// every path, thread count, tile, split and dtype; they follow the float64 reference over many
// steps; sign(0) = 0, the weight decay is decoupled, and a NaN gradient gives NaN.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "rule_test_support.hpp"
#include "strata/optim/lion_rule.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace lion_rule_test {

namespace {

using strata::lion_options;
using strata::lion_rule;
using strata::lion_step_params;
using strata_test::rule_state;

struct variant {
  const char* name;
  lion_options o;
};

std::vector<variant> variants() {
  std::vector<variant> v;
  v.push_back({"default", {}});
  lion_options wd;
  wd.weight_decay = 0.1;
  v.push_back({"weight_decay", wd});
  lion_options maximize = wd;
  maximize.maximize = true;
  v.push_back({"maximize", maximize});
  lion_options betas;
  betas.beta1 = 0.95;
  betas.beta2 = 0.98;
  v.push_back({"betas_0.95_0.98", betas});
  lion_options sign_sgd;
  sign_sgd.beta1 = 0;  // the update is the gradient's sign
  v.push_back({"beta1_0", sign_sgd});
  return v;
}

lion_step_params params(const lion_options& o, double lr = 1e-3) {
  return lion_rule::make_step_params(o, strata::rule_step{3, lr, o.decay(), 1.0 / 128, 0.75});
}

/// The scalar formula element by element: no SIMD, no threads, no tiles.
template <class G, class H>
void element_loop(rule_state<G, H>& s, const lion_step_params& k, bool write_model) {
  for (std::size_t i = 0; i < s.n; ++i) {
    strata::lion_element(s.slot[i], s.slot[s.n + i], static_cast<float>(s.g[i]), k);
    if (write_model) s.out[i] = H(s.slot[i]);
  }
}

template <class G, class H>
void check_pair() {
  strata::thread_pool pool3(3, "lion-3");
  strata::thread_pool pool2(2, "lion-2");
  const auto vs = variants();
  for (std::size_t n : {0UL, 1UL, 7UL, 15UL, 16UL, 17UL, 33UL, 1000UL, 4099UL})
    for (std::size_t vi = 0; vi < vs.size(); ++vi) {
      const auto k = params(vs[vi].o);
      for (bool write_model : {true, false}) {
        rule_state<G, H> want(n, 1, static_cast<std::uint32_t>(n * 37 + vi), 128.0f);
        const rule_state<G, H> init = want;
        element_loop(want, k, write_model);
        for (auto isa : strata_test::cpu_paths())
          for (std::size_t threads : {1UL, 2UL, 3UL})
            for (std::size_t tile : {1UL, 5UL, 16UL, 1000UL, strata::lion_default_tile_elems}) {
              if (n > 1000 && tile < 16) continue;  // many tiny tiles add time, not coverage
              rule_state<G, H> got = init;
              strata::thread_pool* use = threads == 1 ? nullptr : threads == 2 ? &pool2 : &pool3;
              strata::lion_update_cpu(got.master(), got.array(0), std::span<const G>(got.g),
                                      write_model ? std::span<H>(got.out) : std::span<H>(), k, use, tile, isa);
              INFO("n=", n, " variant=", vs[vi].name, " isa=", std::string(strata::to_string(isa)),
                   " threads=", threads, " tile=", tile, " model=", write_model);
              REQUIRE(got == want);
            }
      }
    }
}

bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

/// Runs 19 elements (a full AVX2 vector, a partial one and the tail of AVX-512) through each path.
template <class F>
void on_every_path(std::vector<float> p, std::vector<float> m, std::vector<float> g, const lion_step_params& k,
                   F&& check) {
  for (auto isa : strata_test::cpu_paths()) {
    auto pp = p, mm = m;
    strata::lion_update_cpu(std::span<float>(pp), std::span<float>(mm), std::span<const float>(g),
                            std::span<float>(), k, nullptr, strata::lion_default_tile_elems, isa);
    INFO("isa=", std::string(strata::to_string(isa)));
    check(pp, mm);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("the Lion kernel gives the scalar formula's bits on every path, thread count, tile and dtype", pair,
                   std::pair<float, strata::bf16>, std::pair<float, strata::fp16>, std::pair<float, float>,
                   std::pair<strata::bf16, strata::bf16>, std::pair<strata::bf16, strata::fp16>,
                   std::pair<strata::bf16, float>, std::pair<strata::fp16, strata::bf16>,
                   std::pair<strata::fp16, strata::fp16>, std::pair<strata::fp16, float>) {
  check_pair<typename pair::first_type, typename pair::second_type>();
}

TEST_CASE("a Lion update split at any point gives the bits of the whole span") {
  strata::thread_pool pool(3, "lion-split");
  const auto f = lion_rule::format(lion_options{});
  for (const auto& var : variants()) {
    const auto k = params(var.o);
    for (std::size_t n : {2UL, 33UL, 4099UL}) {
      rule_state<strata::fp16, float> whole(n, 1, static_cast<std::uint32_t>(n), 128.0f);
      const auto init = whole;
      lion_rule::update_cpu(whole.view(f), 0, n, whole.g.data(), whole.out.data(), k, nullptr);
      for (std::size_t cut : {1UL, 3UL, 17UL, n / 2 + 1, n - 1}) {
        if (cut >= n) continue;
        auto parts = init;
        const auto v = parts.view(f);
        lion_rule::update_cpu(v, 0, cut, parts.g.data(), parts.out.data(), k, &pool);
        lion_rule::update_cpu(v, cut, n - cut, parts.g.data() + cut, parts.out.data() + cut, k, &pool);
        INFO("variant=", var.name, " n=", n, " cut=", cut);
        CHECK(parts == whole);
      }
      // Three pieces, the middle one without a model copy (which keeps its old values there).
      auto three = init;
      auto want = whole;
      const std::size_t a = n / 3, b = n - n / 4;
      std::memcpy(want.out.data() + a, init.out.data() + a, (b - a) * sizeof(float));
      const auto v = three.view(f);
      lion_rule::update_cpu(v, 0, a, three.g.data(), three.out.data(), k, &pool);
      lion_rule::update_cpu<strata::fp16, float>(v, a, b - a, three.g.data() + a, nullptr, k, &pool);
      lion_rule::update_cpu(v, b, n - b, three.g.data() + b, three.out.data() + b, k, &pool);
      CHECK(three == want);
    }
  }
}

// Tolerance against the float64 reference, per element after T steps:
//   2^-24 * sum over steps of (4 |p| + 2 lr)  +  2 lr * (steps whose direction is ambiguous).
// Why: the update is +-lr exactly, so a step adds three roundings relative to the weight (the
// decay product, the fma, and 1 - lr*wd rounded to float) and one of lr itself. The direction is
// sign(c), which float and float64 can only disagree on where c is within the momentum's rounding
// error of zero: the momentum takes at most about 5 roundings of the largest |g| or |m| (M) per
// step (g's scale and clip, beta2 and 1 - beta2 rounded, the product and the fma), each decaying
// by beta2, so it stays within 8 * 2^-24 * M / (1 - beta2) of the reference; a step with |c|
// below twice that counts as ambiguous and may move the weight 2 lr the other way. The momentum
// must agree within 8 * 2^-24 * M / (1 - beta2).
TEST_CASE("Lion follows the float64 reference over 200 steps within its rounding bound") {
  constexpr int steps = 200;
  constexpr std::size_t n = 513;
  constexpr double u = 0x1p-24;
  strata::thread_pool pool(2, "lion-ref");
  const auto f = lion_rule::format(lion_options{});
  for (const auto& var : variants()) {
    const lion_options& o = var.o;
    rule_state<float, strata::bf16> s(n, 1, 7, 512.0f);
    std::vector<double> p(n), m(n), bound(n, 0.0), big(n, 0.0);
    std::vector<int> ambiguous(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = s.slot[i];
      m[i] = s.slot[n + i];
      big[i] = std::fabs(m[i]);
    }
    std::mt19937 rng(13);
    std::normal_distribution<float> normal;
    for (int t = 1; t <= steps; ++t) {
      const double lr = 1e-3 * (1.0 + 0.5 * std::sin(t));  // a scheduler's lr
      const strata::rule_step rs{t, lr, o.decay(), 1.0 / 512, t % 3 == 0 ? 0.8 : 1.0};
      for (auto& g : s.g) g = normal(rng) * 512.0f;
      lion_rule::update_cpu(s.view(f), 0, n, s.g.data(), s.out.data(), lion_rule::make_step_params(o, rs), &pool);
      for (std::size_t i = 0; i < n; ++i) {
        const double g = double{s.g[i]} * rs.grad_scale * rs.clip;
        big[i] = std::max(big[i], std::fabs(g));
        const double c = o.beta1 * m[i] + (1 - o.beta1) * (o.maximize ? -g : g);
        if (std::fabs(c) <= 16 * u * big[i] / (1 - o.beta2)) ++ambiguous[i];
        std::vector<double> st{m[i]};
        lion_rule::reference(p[i], st, s.g[i], o, rs);
        m[i] = st[0];
        bound[i] += u * (4 * std::fabs(p[i]) + 2 * lr);
      }
    }
    int flips = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double allowed = bound[i] + 3e-3 * ambiguous[i];  // 2 lr, lr <= 1.5e-3
      INFO("variant=", var.name, " i=", i, " got=", s.slot[i], " want=", p[i], " bound=", allowed);
      REQUIRE(std::fabs(s.slot[i] - p[i]) <= allowed);
      REQUIRE(std::fabs(s.slot[n + i] - m[i]) <= 8 * u * big[i] / (1 - o.beta2));
      flips += std::fabs(s.slot[i] - p[i]) > bound[i] ? 1 : 0;
    }
    MESSAGE(std::string(var.name), ": ", flips, " of ", n, " weights took an ambiguous step the other way");
    CHECK(flips <= 2);  // rare: almost every step has a clear direction
  }
}

TEST_CASE("Lion's sign of zero is zero: a zero direction leaves the weight to the decay") {
  lion_options o;
  o.weight_decay = 0.5;
  const auto k = params(o, 0.1);  // decay factor float(1 - 0.05)
  // c = fma(g, 1-b1, m*b1): +0 or -0 for each of these; the weights include -0.
  std::vector<float> p(19, 3.0f), m(19, 0.0f), g(19, 0.0f);
  for (std::size_t i = 0; i < 19; i += 2) g[i] = -0.0f;
  for (std::size_t i = 0; i < 19; i += 3) m[i] = -0.0f;
  p[4] = -0.0f;
  p[17] = -0.0f;
  on_every_path(p, m, g, k, [&](const std::vector<float>& pp, const std::vector<float>& mm) {
    for (std::size_t i = 0; i < 19; ++i) {
      INFO("i=", i);
      CHECK(same_bits(pp[i], p[i] * k.decay_factor));  // p + 0 * -lr: the decayed weight, sign of zero kept
      CHECK(mm[i] == 0.0f);
    }
  });
  CHECK(strata::detail::fp::fsign_nan(0.0f) == 0.0f);
  CHECK_FALSE(std::signbit(strata::detail::fp::fsign_nan(-0.0f)));
  CHECK(strata::detail::fp::fsign_nan(-1e-45f) == -1.0f);  // the smallest subnormal still has a sign
  CHECK(strata::detail::fp::fsign_nan(std::numeric_limits<float>::infinity()) == 1.0f);
}

TEST_CASE("Lion's weight decay is decoupled: the weight shrinks by lr*wd whatever the gradient") {
  lion_options o;
  o.weight_decay = 0.1;
  lion_options none;
  const double lr = 0.01;
  const auto k = params(o, lr), k0 = params(none, lr);
  CHECK(k.decay_factor == static_cast<float>(1 - lr * 0.1));
  CHECK(k0.decay_factor == 1.0f);
  // Gradients of very different sizes, same sign: the same step, -lr, after the same decay.
  std::vector<float> p(19, 2.0f), m(19, 0.0f), g(19);
  for (std::size_t i = 0; i < 19; ++i) g[i] = std::ldexp(1.0f, static_cast<int>(i) - 9);
  on_every_path(p, m, g, k, [&](const std::vector<float>& pp, const std::vector<float>& mm) {
    for (std::size_t i = 0; i < 19; ++i) {
      INFO("i=", i);
      CHECK(same_bits(pp[i], std::fma(1.0f, k.neg_lr, 2.0f * k.decay_factor)));
      // The decay never enters the momentum: m = (1-b2) * g * s * c, as without decay.
      CHECK(same_bits(mm[i], std::fma((g[i] * k.grad_scale) * k.clip, k.one_minus_beta2, 0.0f)));
    }
  });
  on_every_path(p, m, g, k0, [&](const std::vector<float>& pp, const std::vector<float>&) {
    for (std::size_t i = 0; i < 19; ++i) CHECK(same_bits(pp[i], std::fma(1.0f, k0.neg_lr, 2.0f)));
  });
}

TEST_CASE("a NaN gradient makes Lion's weight and momentum NaN on every path") {
  const auto k = params(lion_options{});
  std::vector<float> p(19, 1.0f), m(19, 0.5f), g(19, 0.25f);
  g[3] = std::numeric_limits<float>::quiet_NaN();
  g[18] = -std::numeric_limits<float>::quiet_NaN();  // in the tail of each vector path
  on_every_path(p, m, g, k, [&](const std::vector<float>& pp, const std::vector<float>& mm) {
    for (std::size_t i = 0; i < 19; ++i) {
      INFO("i=", i);
      const bool nan = i == 3 || i == 18;
      CHECK(std::isnan(pp[i]) == nan);
      CHECK(std::isnan(mm[i]) == nan);
    }
  });
  CHECK(std::isnan(strata::detail::fp::fsign_nan(std::numeric_limits<float>::quiet_NaN())));
  double pd = 1, g_nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> md{0.5};
  lion_rule::reference(pd, md, g_nan, lion_options{}, strata::rule_step{});
  CHECK(std::isnan(pd));
  CHECK(std::isnan(md[0]));
}

TEST_CASE("Lion with maximize ascends: the update has the opposite sign") {
  lion_options up;
  up.maximize = true;
  std::vector<float> p(19, 0.0f), m(19, 0.0f), g(19, 0.3f);
  const auto k = params(lion_options{}), ku = params(up);
  on_every_path(p, m, g, k, [&](const std::vector<float>& down, const std::vector<float>& md) {
    on_every_path(p, m, g, ku, [&](const std::vector<float>& pu, const std::vector<float>& mu) {
      for (std::size_t i = 0; i < 19; ++i) {
        CHECK(down[i] == -1e-3f);
        CHECK(same_bits(pu[i], -down[i]));
        CHECK(same_bits(mu[i], -md[i]));
      }
    });
  });
}

TEST_CASE("Lion keeps one fp32 momentum named as lion-pytorch names it") {
  CHECK(lion_rule::format(lion_options{}) == strata::state_format{{"exp_avg", strata::state_element::f32}});
  CHECK(lion_rule::format(lion_options{}).bytes_per_param() == 8);
  CHECK(lion_rule::tag == "lion");
  const lion_options o;
  CHECK(o.lr == 1e-4);
  CHECK(o.beta1 == 0.9);
  CHECK(o.beta2 == 0.99);
  CHECK(o.decay() == 0);
}

TEST_CASE("invalid Lion options, steps and sizes are config_errors naming the value") {
  const auto bad = [](auto&& edit) {
    lion_options o;
    edit(o);
    return o;
  };
  CHECK_THROWS_WITH_AS(bad([](lion_options& o) { o.lr = -1e-4; }).validate(), "lion_options: invalid lr -0.0001",
                       strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](lion_options& o) { o.lr = std::numeric_limits<double>::quiet_NaN(); }).validate(),
                       "lion_options: invalid lr nan", strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](lion_options& o) { o.beta1 = 1.5; }).validate(),
                       "lion_options: invalid beta1 1.5 (need 0 <= beta1 <= 1)", strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](lion_options& o) { o.beta2 = -0.1; }).validate(),
                       "lion_options: invalid beta2 -0.1 (need 0 <= beta2 <= 1)", strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](lion_options& o) { o.weight_decay = -1; }).validate(),
                       "lion_options: invalid weight_decay -1", strata::config_error);
  const lion_options ok;
  CHECK_THROWS_WITH_AS((void)lion_rule::make_step_params(ok, strata::rule_step{1, -1.0, 0, 1, 1}),
                       "lion_options: invalid lr -1", strata::config_error);
  CHECK_THROWS_WITH_AS((void)lion_rule::make_step_params(ok, strata::rule_step{1, 1e-4, -3.0, 1, 1}),
                       "lion_options: invalid weight_decay -3", strata::config_error);
  CHECK_THROWS_WITH_AS((void)lion_rule::make_step_params(ok, strata::rule_step{0, 1e-4, 0, 1, 1}),
                       doctest::Contains("step 0"), strata::config_error);
  CHECK_THROWS_WITH_AS((void)lion_rule::make_step_params(ok, strata::rule_step{1, 1e-4, 0, -2.0, 1}),
                       doctest::Contains("gradient scale -2"), strata::config_error);
  CHECK_THROWS_WITH_AS((void)lion_rule::make_step_params(ok, strata::rule_step{1, 1e-4, 0, 1, -0.5}),
                       doctest::Contains("clip coefficient -0.5"), strata::config_error);
  const auto k = params(ok);
  std::vector<float> p(10), m(8), g(10);
  std::vector<strata::bf16> out(3);
  CHECK_THROWS_WITH_AS(strata::lion_update_cpu(std::span<float>(p), std::span<float>(m), std::span<const float>(g),
                                               std::span<strata::bf16>(), k),
                       "lion_update_cpu: exp_avg has 8 elements for 10 parameters", strata::config_error);
  m.resize(10);
  CHECK_THROWS_WITH_AS(strata::lion_update_cpu(std::span<float>(p), std::span<float>(m), std::span<const float>(g),
                                               std::span<strata::bf16>(out), k),
                       doctest::Contains("model copy has 3 elements for 10 parameters"), strata::config_error);
  CHECK_THROWS_WITH_AS(strata::lion_update_cpu(std::span<float>(p), std::span<float>(m),
                                               std::span<const float>(g.data(), 9), std::span<strata::bf16>(), k),
                       "lion_update_cpu: got 9 gradients for 10 parameters", strata::config_error);
  std::vector<double> two(2);
  double x = 0;
  CHECK_THROWS_AS(lion_rule::reference(x, two, 1.0, ok, strata::rule_step{}), strata::config_error);
}

}  // namespace lion_rule_test
