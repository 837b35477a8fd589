// SGD as an update rule (optim/sgd_rule.hpp): the kernels give the scalar formula's bits on every
// path, thread count, tile, split and dtype; they follow the float64 reference over many steps;
// each option does what torch.optim.SGD does; a hand-computed case has torch's bits.
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
#include "strata/optim/sgd_rule.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace sgd_rule_test {

namespace {

using strata::sgd_options;
using strata::sgd_rule;
using strata::sgd_step_params;
using strata_test::rule_state;

struct variant {
  const char* name;
  sgd_options o;
  std::int64_t step;
};

std::vector<variant> variants() {
  std::vector<variant> v;
  v.push_back({"plain", {}, 3});
  sgd_options mom;
  mom.momentum = 0.9;
  v.push_back({"momentum_first_step", mom, 1});
  v.push_back({"momentum", mom, 3});
  sgd_options damp = mom;
  damp.dampening = 0.5;
  v.push_back({"dampening", damp, 3});
  sgd_options nesterov = mom;
  nesterov.nesterov = true;
  v.push_back({"nesterov", nesterov, 2});
  sgd_options wd;
  wd.weight_decay = 0.01;
  v.push_back({"weight_decay", wd, 5});
  sgd_options maximize;
  maximize.maximize = true;
  v.push_back({"maximize", maximize, 1});
  sgd_options all = nesterov;
  all.weight_decay = 0.01;
  all.maximize = true;
  v.push_back({"nesterov_decay_maximize", all, 4});
  return v;
}

sgd_step_params params(const variant& v) {
  return sgd_rule::make_step_params(v.o, strata::rule_step{v.step, 0.05, v.o.decay(), 1.0 / 128, 0.75});
}

/// The scalar formula element by element: no SIMD, no threads, no tiles.
template <class G, class H>
void element_loop(rule_state<G, H>& s, const sgd_step_params& k, bool write_model) {
  for (std::size_t i = 0; i < s.n; ++i) {
    float p = s.slot[i];
    float b = s.arrays > 0 ? s.slot[s.n + i] : 0.0f;
    strata::sgd_element(p, b, static_cast<float>(s.g[i]), k);
    s.slot[i] = p;
    if (s.arrays > 0) s.slot[s.n + i] = b;
    if (write_model) s.out[i] = H(p);
  }
}

template <class G, class H>
void check_pair() {
  strata::thread_pool pool3(3, "sgd-3");
  strata::thread_pool pool2(2, "sgd-2");
  const auto vs = variants();
  for (std::size_t n : {0UL, 1UL, 7UL, 15UL, 16UL, 17UL, 33UL, 1000UL, 4099UL})
    for (std::size_t vi = 0; vi < vs.size(); ++vi) {
      const auto k = params(vs[vi]);
      const std::size_t arrays = sgd_rule::format(vs[vi].o).count;
      for (bool write_model : {true, false}) {
        rule_state<G, H> want(n, arrays, static_cast<std::uint32_t>(n * 31 + vi), 128.0f);
        const rule_state<G, H> init = want;
        element_loop(want, k, write_model);
        for (auto isa : strata_test::cpu_paths())
          for (std::size_t threads : {1UL, 2UL, 3UL})
            for (std::size_t tile : {1UL, 5UL, 16UL, 1000UL, strata::sgd_default_tile_elems}) {
              if (n > 1000 && tile < 16) continue;  // many tiny tiles add time, not coverage
              rule_state<G, H> got = init;
              strata::thread_pool* use = threads == 1 ? nullptr : threads == 2 ? &pool2 : &pool3;
              strata::sgd_update_cpu(got.master(), got.array(0), std::span<const G>(got.g),
                                     write_model ? std::span<H>(got.out) : std::span<H>(), k, use, tile, isa);
              INFO("n=", n, " variant=", vs[vi].name, " isa=", std::string(strata::to_string(isa)),
                   " threads=", threads, " tile=", tile, " model=", write_model);
              REQUIRE(got == want);
            }
      }
    }
}

/// Runs one element through sgd_update_cpu.
struct one {
  float p, buf, g;
  void step(const sgd_options& o, std::int64_t step, double lr, double grad_scale = 1, double clip = 1) {
    const auto k = sgd_rule::make_step_params(o, strata::rule_step{step, lr, o.decay(), grad_scale, clip});
    strata::sgd_update_cpu(std::span<float>(&p, 1), std::span<float>(&buf, 1), std::span<const float>(&g, 1),
                           std::span<float>(), k);
  }
};

bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

}  // namespace

TEST_CASE_TEMPLATE("the SGD kernel gives the scalar formula's bits on every path, thread count, tile and dtype", pair,
                   std::pair<float, strata::bf16>, std::pair<float, strata::fp16>, std::pair<float, float>,
                   std::pair<strata::bf16, strata::bf16>, std::pair<strata::bf16, strata::fp16>,
                   std::pair<strata::bf16, float>, std::pair<strata::fp16, strata::bf16>,
                   std::pair<strata::fp16, strata::fp16>, std::pair<strata::fp16, float>) {
  check_pair<typename pair::first_type, typename pair::second_type>();
}

TEST_CASE("an SGD update split at any point gives the bits of the whole span") {
  strata::thread_pool pool(3, "sgd-split");
  for (const auto& var : variants()) {
    const auto k = params(var);
    const auto f = sgd_rule::format(var.o);
    for (std::size_t n : {2UL, 33UL, 4099UL}) {
      rule_state<strata::bf16, strata::bf16> whole(n, f.count, static_cast<std::uint32_t>(n), 128.0f);
      const auto init = whole;
      sgd_rule::update_cpu(whole.view(f), 0, n, whole.g.data(), whole.out.data(), k, nullptr);
      for (std::size_t cut : {1UL, 3UL, 17UL, n / 2 + 1, n - 1}) {
        if (cut >= n) continue;
        auto parts = init;
        const auto v = parts.view(f);
        sgd_rule::update_cpu(v, 0, cut, parts.g.data(), parts.out.data(), k, &pool);
        sgd_rule::update_cpu(v, cut, n - cut, parts.g.data() + cut, parts.out.data() + cut, k, &pool);
        INFO("variant=", var.name, " n=", n, " cut=", cut);
        CHECK(parts == whole);
      }
      // Three pieces, the middle one without a model copy (which keeps its old bits there).
      auto three = init;
      auto want = whole;
      const std::size_t a = n / 3, b = n - n / 4;
      std::memcpy(want.out.data() + a, init.out.data() + a, (b - a) * sizeof(strata::bf16));
      const auto v = three.view(f);
      sgd_rule::update_cpu(v, 0, a, three.g.data(), three.out.data(), k, &pool);
      sgd_rule::update_cpu<strata::bf16, strata::bf16>(v, a, b - a, three.g.data() + a, nullptr, k, &pool);
      sgd_rule::update_cpu(v, b, n - b, three.g.data() + b, three.out.data() + b, k, &pool);
      CHECK(three == want);
    }
  }
}

// Tolerance against the float64 reference, per element after T steps:
//   2^-24 * sum over steps of (|p| + 8 * lr * A / (1 - momentum)),  A = |g*s*c| + wd*|p| + |buf|.
// Why: each step rounds the weight once (half an ulp, at most 2^-24 |p|); the update lr * d is built
// from the terms in A with at most about eight roundings (scale, clip, decay, the buffer's two,
// Nesterov's, and lr, wd, momentum, 1 - dampening themselves rounded to float), and a rounding in
// the buffer decays by `momentum` each step, which sums to 1 / (1 - momentum). Errors add at
// worst linearly over steps. The buffer must agree within 8 * 2^-24 * max A / (1 - momentum).
TEST_CASE("SGD follows the float64 reference over 200 steps within its rounding bound") {
  constexpr int steps = 200;
  constexpr std::size_t n = 513;
  constexpr double u = 0x1p-24;
  strata::thread_pool pool(2, "sgd-ref");
  for (const auto& var : variants()) {
    const auto f = sgd_rule::format(var.o);
    const double mu = var.o.momentum;
    rule_state<float, strata::bf16> s(n, f.count, 7, 512.0f);
    std::vector<double> p(n), buf(n), bound(n, 0.0), max_a(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = s.slot[i];
      buf[i] = f.count > 0 ? s.slot[n + i] : 0.0;
    }
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    for (int t = 1; t <= steps; ++t) {
      const double lr = 0.01 * (1.0 + 0.5 * std::sin(t));  // a scheduler's lr
      const strata::rule_step rs{t, lr, var.o.decay(), 1.0 / 512, t % 3 == 0 ? 0.8 : 1.0};
      for (auto& g : s.g) g = normal(rng) * 512.0f;
      sgd_rule::update_cpu(s.view(f), 0, n, s.g.data(), s.out.data(), sgd_rule::make_step_params(var.o, rs), &pool);
      for (std::size_t i = 0; i < n; ++i) {
        const double a = std::fabs(double{s.g[i]} * rs.grad_scale * rs.clip) + rs.weight_decay * std::fabs(p[i]) +
                         std::fabs(buf[i]);
        std::vector<double> st;
        if (f.count > 0) st.push_back(buf[i]);
        sgd_rule::reference(p[i], st, s.g[i], var.o, rs);
        if (f.count > 0) buf[i] = st[0];
        max_a[i] = std::max(max_a[i], a + std::fabs(buf[i]));
        bound[i] += u * (std::fabs(p[i]) + 8 * lr * (a + std::fabs(buf[i])) / (1 - mu));
      }
    }
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
      INFO("variant=", var.name, " i=", i, " got=", s.slot[i], " want=", p[i], " bound=", bound[i]);
      REQUIRE(std::fabs(s.slot[i] - p[i]) <= bound[i]);
      worst = std::max(worst, std::fabs(s.slot[i] - p[i]) / bound[i]);
      if (f.count > 0) REQUIRE(std::fabs(s.slot[n + i] - buf[i]) <= 8 * u * max_a[i] / (1 - mu));
    }
    MESSAGE(std::string(var.name), ": largest error ", worst, " of the bound");
  }
}

TEST_CASE("the first momentum step sets the buffer to the gradient, undamped, without reading it") {
  sgd_options o;
  o.momentum = 0.9;
  o.dampening = 0.5;
  o.weight_decay = 0.01;
  one x{1.25f, std::numeric_limits<float>::quiet_NaN(), 0.3f};  // torch has no buffer yet
  x.step(o, 1, 0.1, 0.5, 0.75);
  const float d1 = std::fma(1.25f, 0.01f, (0.3f * 0.5f) * 0.75f);  // grad.add(param, alpha=wd)
  CHECK(same_bits(x.buf, d1));                                     // torch.clone(grad): no dampening
  const float p1 = std::fma(d1, -0.1f, 1.25f);
  CHECK(same_bits(x.p, p1));
  // Step 2: buf.mul_(momentum).add_(grad, alpha=1 - dampening).
  x.g = -0.2f;
  x.step(o, 2, 0.1, 0.5, 0.75);
  const float d2 = std::fma(p1, 0.01f, (-0.2f * 0.5f) * 0.75f);
  const float b2 = std::fma(d2, 0.5f, d1 * 0.9f);
  CHECK(same_bits(x.buf, b2));
  CHECK(same_bits(x.p, std::fma(b2, -0.1f, p1)));
}

TEST_CASE("Nesterov momentum steps along the gradient plus momentum times the buffer") {
  sgd_options o;
  o.momentum = 0.9;
  o.nesterov = true;
  one x{0.5f, 0.25f, 0.125f};
  x.step(o, 2, 0.1);
  const float b = std::fma(0.125f, 1.0f, 0.25f * 0.9f);
  CHECK(same_bits(x.buf, b));
  CHECK(same_bits(x.p, std::fma(std::fma(b, 0.9f, 0.125f), -0.1f, 0.5f)));  // grad.add(buf, alpha=momentum)
  sgd_options plain = o;
  plain.nesterov = false;
  one y{0.5f, 0.25f, 0.125f};
  y.step(plain, 2, 0.1);
  CHECK(same_bits(y.buf, b));
  CHECK(same_bits(y.p, std::fma(b, -0.1f, 0.5f)));  // the buffer itself
}

TEST_CASE("dampening scales the gradient's share of the buffer from the second step on") {
  sgd_options o;
  o.momentum = 0.5;
  o.dampening = 0.75;
  one x{0.0f, 0.0f, 1.0f};
  x.step(o, 1, 1.0);
  CHECK(x.buf == 1.0f);  // step 1: the whole gradient
  x.step(o, 2, 1.0);
  CHECK(x.buf == 0.5f * 1.0f + 0.25f * 1.0f);  // 0.75, exact
  CHECK(x.p == -1.75f);
}

TEST_CASE("SGD weight decay adds wd times the weight to the gradient") {
  sgd_options o;
  o.weight_decay = 0.1;
  one x{2.0f, 0.0f, 0.0f};
  x.step(o, 1, 0.5);
  CHECK(same_bits(x.p, std::fma(std::fma(2.0f, 0.1f, 0.0f), -0.5f, 2.0f)));  // L2 through the gradient
  CHECK(x.p == doctest::Approx(2.0 * (1 - 0.05)).epsilon(1e-7));
  // A range's weight decay replaces the options'.
  const auto k = sgd_rule::make_step_params(o, strata::rule_step{1, 0.5, 0.0, 1, 1});
  CHECK_FALSE(k.l2);
}

TEST_CASE("SGD with maximize ascends: the update has the opposite sign") {
  sgd_options o;
  o.momentum = 0.9;
  sgd_options up = o;
  up.maximize = true;
  one a{0.0f, 0.0f, 0.3f}, b{0.0f, 0.0f, 0.3f};
  for (std::int64_t t = 1; t <= 3; ++t) {
    a.step(o, t, 0.1, 0.25, 0.5);
    b.step(up, t, 0.1, 0.25, 0.5);
  }
  CHECK(a.p < 0);
  CHECK(same_bits(b.p, -a.p));
  CHECK(same_bits(b.buf, -a.buf));
}

TEST_CASE("SGD without momentum keeps no state array") {
  const sgd_options plain;
  CHECK(sgd_rule::format(plain).count == 0);
  CHECK(sgd_rule::format(plain).bytes_per_param() == 4);
  sgd_options mom;
  mom.momentum = 0.9;
  CHECK(sgd_rule::format(mom) == strata::state_format{{"momentum_buffer", strata::state_element::f32}});
  CHECK(sgd_rule::tag == "sgd");
  // The state is the master weights alone: the view has no array, and none is touched.
  rule_state<float, strata::bf16> s(100, 0, 5), want = s;
  const auto k = sgd_rule::make_step_params(plain, strata::rule_step{3, 0.1, 0, 1, 1});
  CHECK_FALSE(k.has_momentum);
  const auto v = s.view(sgd_rule::format(plain));
  CHECK(v.arrays[0] == nullptr);
  sgd_rule::update_cpu(v, 0, 100, s.g.data(), s.out.data(), k, nullptr);
  element_loop(want, k, true);
  CHECK(s == want);
  std::vector<double> none;
  double p = 1;
  sgd_rule::reference(p, none, 2.0, plain, strata::rule_step{1, 0.25, 0, 1, 1});
  CHECK(p == 0.5);
}

// torch.optim.SGD's bits, three steps of two configurations on four weights. The expected values
// are what torch 1.13.0 printed on this machine (CPU, AVX2 kernels, foreach off: its
// `_single_tensor_sgd` is op for op that of torch 2.x) for a 32-element tensor, these four values
// repeated so that every element goes through ATen's vectorized kernels, where `add(x, alpha=a)`
// is one fmadd. `torch_ops` below derives the same bits from the float operations those torch
// calls are, one by one; a chain that rounds the products apart instead of fusing them gives
// different bits for two of these weights (0x1.e37dfp-6 after step 1 of A, 0x1.10c01p-3 after
// step 3 of B), so the case tells the two apart.
TEST_CASE("a hand-computed SGD run has torch's bits") {
  struct config {
    sgd_options o;
    double lr;
    float p[3][4], buf[3][4];  // after steps 1, 2, 3
  };
  sgd_options a;  // SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
  a.momentum = 0.9;
  a.weight_decay = 0.01;
  a.nesterov = true;
  sgd_options b;  // SGD(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.02, maximize=True)
  b.momentum = 0.8;
  b.dampening = 0.3;
  b.weight_decay = 0.02;
  b.maximize = true;
  const config configs[] = {
      {a,
       0.1,
       {{0x1.e37deep-6f, -0x1.aff0eep+0f, 0x1.42786cp+1f, 0x1.05a55cp-10f},
        {0x1.41f83cp-5f, -0x1.ae5d0cp+0f, 0x1.0cdfeap+1f, -0x1.0e586ep-3f},
        {0x1.423f82p-6f, -0x1.9d9f82p+0f, 0x1.1e9808p+1f, -0x1.81fed4p-3f}},
       {{0x1.7be76cp-2f, -0x1.126e98p-4f, 0x1.43d70ap+1f, 0x1.4f8b5ap-17f},
        {0x1.fcb3fcp-4f, -0x1.06d9f4p-4f, 0x1.b37b1p+1f, 0x1.6668e2p-1f},
        {0x1.4c1f0cp-3f, -0x1.7f8e5ep-2f, 0x1.c415ep-1f, 0x1.41f1aep-1f}}},
      {b,
       0.05,
       {{0x1.e4f766p-4f, -0x1.b367a2p+0f, 0x1.8f9db2p+1f, 0x1.05e1c2p-10f},
        {0x1.01684p-3f, -0x1.b325bcp+0f, 0x1.a0c1dp+1f, 0x1.a1c044p-6f},
        {0x1.10c012p-3f, -0x1.b5532ap+0f, 0x1.a4527cp+1f, 0x1.714fb4p-5f}},
       {{-0x1.78d4fep-2f, 0x1.0624dep-6f, -0x1.3851ecp+1f, 0x1.4f8b5ap-16f},
        {-0x1.2a7bp-3f, -0x1.49807cp-6f, -0x1.56d246p+1f, -0x1.f5bab2p-2f},
        {-0x1.32dc56p-3f, 0x1.5c64bp-3f, -0x1.1d35c4p-1f, -0x1.9116eep-2f}}},
  };
  const float p0[4] = {0.1f, -1.7f, 3.0f, 1e-3f};
  const float grads[3][4] = {{0.37f, -0.05f, 2.5f, 0.0f}, {-0.21f, 0.013f, 1.1f, 0.7f}, {0.05f, -0.3f, -2.2f, 1e-4f}};
  for (const config& c : configs) {
    const auto f = [](double x) { return static_cast<float>(x); };  // a Python float as the kernel's alpha
    // The torch calls of _single_tensor_sgd as float operations, one rounding each.
    const auto torch_ops = [&](float& p, float& buf, float grad, bool first) {
      float d = c.o.maximize ? -grad : grad;                          // -d_p_list[i]
      d = std::fma(p, f(c.o.decay()), d);                             // d_p.add(param, alpha=weight_decay)
      buf = first ? d : std::fma(d, f(1 - c.o.dampening), buf * f(c.o.momentum));  // clone / mul_.add_
      d = c.o.nesterov ? std::fma(buf, f(c.o.momentum), d) : buf;     // d_p.add(buf, alpha=momentum)
      p = std::fma(d, f(-c.lr), p);                                   // param.add_(d_p, alpha=-lr)
    };
    for (auto isa : strata_test::cpu_paths()) {
      std::vector<float> p(p0, p0 + 4), buf(4);
      float q[4] = {p0[0], p0[1], p0[2], p0[3]}, qb[4] = {};
      for (int t = 0; t < 3; ++t) {
        const auto k = sgd_rule::make_step_params(c.o, strata::rule_step{t + 1, c.lr, c.o.decay(), 1, 1});
        strata::sgd_update_cpu(std::span<float>(p), std::span<float>(buf), std::span<const float>(grads[t], 4),
                               std::span<float>(), k, nullptr, strata::sgd_default_tile_elems, isa);
        for (int i = 0; i < 4; ++i) {
          torch_ops(q[i], qb[i], grads[t][i], t == 0);
          INFO("lr=", c.lr, " isa=", std::string(strata::to_string(isa)), " step=", t + 1, " i=", i);
          CHECK(same_bits(q[i], c.p[t][i]));
          CHECK(same_bits(qb[i], c.buf[t][i]));
          CHECK(same_bits(p[i], c.p[t][i]));
          CHECK(same_bits(buf[i], c.buf[t][i]));
        }
      }
    }
  }
}

TEST_CASE("invalid SGD options, steps and sizes are config_errors naming the value") {
  const auto bad = [](auto&& edit) {
    sgd_options o;
    edit(o);
    return o;
  };
  CHECK_THROWS_WITH_AS(bad([](sgd_options& o) { o.lr = -0.1; }).validate(), "sgd_options: invalid lr -0.1",
                       strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](sgd_options& o) { o.lr = std::numeric_limits<double>::infinity(); }).validate(),
                       "sgd_options: invalid lr inf", strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](sgd_options& o) { o.momentum = -0.5; }).validate(),
                       "sgd_options: invalid momentum -0.5", strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](sgd_options& o) { o.weight_decay = -1e-4; }).validate(),
                       "sgd_options: invalid weight_decay -0.0001", strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](sgd_options& o) { o.nesterov = true; }).validate(),
                       doctest::Contains("nesterov momentum requires a momentum and zero dampening (momentum 0"),
                       strata::config_error);
  CHECK_THROWS_WITH_AS(bad([](sgd_options& o) {
                         o.nesterov = true;
                         o.momentum = 0.9;
                         o.dampening = 0.1;
                       }).validate(),
                       doctest::Contains("dampening 0.1"), strata::config_error);
  CHECK_NOTHROW(bad([](sgd_options& o) {
                  o.nesterov = true;
                  o.momentum = 0.9;
                  o.lr = 0;
                }).validate());
  const sgd_options ok;
  // The step's lr and weight decay are what make_step_params validates.
  CHECK_THROWS_WITH_AS((void)sgd_rule::make_step_params(ok, strata::rule_step{1, -1.0, 0, 1, 1}),
                       "sgd_options: invalid lr -1", strata::config_error);
  CHECK_THROWS_WITH_AS((void)sgd_rule::make_step_params(ok, strata::rule_step{1, 0.1, -2.0, 1, 1}),
                       "sgd_options: invalid weight_decay -2", strata::config_error);
  CHECK_THROWS_WITH_AS((void)sgd_rule::make_step_params(ok, strata::rule_step{0, 0.1, 0, 1, 1}),
                       doctest::Contains("step 0"), strata::config_error);
  CHECK_THROWS_WITH_AS((void)sgd_rule::make_step_params(ok, strata::rule_step{1, 0.1, 0, 0.0, 1}),
                       doctest::Contains("gradient scale 0"), strata::config_error);
  CHECK_THROWS_WITH_AS((void)sgd_rule::make_step_params(ok, strata::rule_step{1, 0.1, 0, 1, 1.5}),
                       doctest::Contains("clip coefficient 1.5"), strata::config_error);
  sgd_options mom;
  mom.momentum = 0.9;
  const auto k = sgd_rule::make_step_params(mom, strata::rule_step{2, 0.1, 0, 1, 1});
  std::vector<float> p(10), buf(9), g(10);
  std::vector<strata::bf16> out(3);
  CHECK_THROWS_WITH_AS(strata::sgd_update_cpu(std::span<float>(p), std::span<float>(buf), std::span<const float>(g),
                                              std::span<strata::bf16>(), k),
                       "sgd_update_cpu: momentum needs momentum_buffer of 10 elements, got 9", strata::config_error);
  buf.resize(10);
  CHECK_THROWS_WITH_AS(strata::sgd_update_cpu(std::span<float>(p), std::span<float>(buf), std::span<const float>(g),
                                              std::span<strata::bf16>(out), k),
                       doctest::Contains("model copy has 3 elements for 10 parameters"), strata::config_error);
  CHECK_THROWS_WITH_AS(strata::sgd_update_cpu(std::span<float>(p), std::span<float>(buf),
                                              std::span<const float>(g.data(), 4), std::span<strata::bf16>(), k),
                       "sgd_update_cpu: got 4 gradients for 10 parameters", strata::config_error);
  std::vector<double> wrong(0);
  double x = 0;
  CHECK_THROWS_AS(sgd_rule::reference(x, wrong, 1.0, mom, strata::rule_step{}), strata::config_error);
}

}  // namespace sgd_rule_test
