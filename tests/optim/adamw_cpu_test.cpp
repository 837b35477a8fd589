// The CPU AdamW kernel against the scalar reference loop: bit-identical for every size, thread
// count, tile size, instruction-set path, gradient/model dtype pair and optimizer variant.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "strata/optim/adamw_cpu.hpp"
#include "test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace adamw_cpu_test {

namespace {

using strata_test::state;

struct variant {
  const char* name;
  strata::adamw_options options;
};

std::vector<variant> variants() {
  std::vector<variant> v;
  v.push_back({"adamw", {}});
  strata::adamw_options adam;
  adam.decoupled = false;
  v.push_back({"adam_l2", adam});
  strata::adamw_options none;
  none.weight_decay = 0;
  v.push_back({"no_decay", none});
  strata::adamw_options ams;
  ams.amsgrad = true;
  v.push_back({"adamw_amsgrad", ams});
  strata::adamw_options adam_ams = adam;
  adam_ams.amsgrad = true;
  v.push_back({"adam_amsgrad", adam_ams});
  strata::adamw_options maximize;
  maximize.maximize = true;
  v.push_back({"maximize", maximize});
  strata::adamw_options low_beta1;
  low_beta1.beta1 = 0.3;  // lerp weight 0.7: torch.lerp's second formula
  v.push_back({"beta1_0.3", low_beta1});
  return v;
}

std::vector<strata::cpu_isa> paths() {
  std::vector<strata::cpu_isa> p{strata::cpu_isa::portable};
  for (auto isa : {strata::cpu_isa::avx2, strata::cpu_isa::avx512})
    if (strata::cpu_supports(isa)) p.push_back(isa);
  return p;
}

template <class G, class H>
void check_dtype_pair() {
  strata::thread_pool pool3(3, "adamw-3");
  strata::thread_pool pool2(2, "adamw-2");
  const auto vs = variants();
  for (std::size_t n : {0UL, 1UL, 7UL, 15UL, 16UL, 17UL, 33UL, 1000UL, 4099UL}) {
    for (std::size_t vi = 0; vi < vs.size(); ++vi) {
      const auto& var = vs[vi];
      const auto k = strata::make_adamw_step_params(var.options, 3, 2e-3, 1.0 / 128, 0.75);
      for (bool write_model : {true, false}) {
        state<G, H> want(n, static_cast<std::uint32_t>(n * 31 + vi), 128.0f);
        state<G, H> init = want;
        want.reference_step(k, write_model);
        for (auto isa : paths())
          for (std::size_t threads : {1UL, 2UL, 3UL})
            for (std::size_t tile : {1UL, 5UL, 16UL, 1000UL, strata::adamw_default_tile_elems}) {
              if (n > 1000 && tile < 16) continue;  // many tiny tiles add time, not coverage
              state<G, H> got = init;
              strata::thread_pool* use = threads == 1 ? nullptr : threads == 2 ? &pool2 : &pool3;
              strata::adamw_update_cpu(std::span<float>(got.p), std::span<float>(got.m), std::span<float>(got.v),
                                       std::span<float>(got.vmax), std::span<const G>(got.g),
                                       write_model ? std::span<H>(got.out) : std::span<H>(), k, use, tile, isa);
              INFO("n=", n, " variant=", var.name, " isa=", std::string(strata::to_string(isa)), " threads=", threads,
                   " tile=", tile, " model=", write_model);
              REQUIRE(got == want);
            }
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("the CPU kernel equals the scalar reference bit for bit on every path, thread count and tile",
                   pair, std::pair<float, strata::bf16>, std::pair<float, strata::fp16>,
                   std::pair<strata::bf16, strata::bf16>, std::pair<strata::bf16, strata::fp16>,
                   std::pair<strata::fp16, strata::bf16>, std::pair<strata::fp16, strata::fp16>) {
  check_dtype_pair<typename pair::first_type, typename pair::second_type>();
}

TEST_CASE("the reference formula takes the documented first step") {
  // Step 1 with m = v = 0: m = (1-b1) g, v = (1-b2) g^2, so the update is lr * g/|g| (up to eps).
  strata::adamw_options o;
  o.weight_decay = 0;
  const auto k = strata::make_adamw_step_params(o, 1, 1e-3);
  float p = 1.0f, m = 0, v = 0, vmax = 0;
  strata::adamw_element(p, m, v, vmax, 0.5f, k);
  CHECK(m == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(v == doctest::Approx(0.00025).epsilon(1e-6));
  CHECK(p == doctest::Approx(1.0 - 1e-3).epsilon(1e-6));
  // Constant-evaluated too: the same formula is a constexpr function.
  constexpr float stepped = [] {
    strata::adamw_step_params kk;
    kk.neg_step_size = -0.01f;
    kk.bias_correction2_sqrt = 1;
    kk.eps = 0;
    float pp = 2, mm = 0, vv = 0, xx = 0;
    strata::adamw_element<false, false>(pp, mm, vv, xx, 1.0f, kk);
    return pp;
  }();
  CHECK(stepped < 2.0f);
}

TEST_CASE("Adam adds the decay to the gradient, AdamW decays the weight, and both match with no decay") {
  strata::adamw_options adamw;
  adamw.weight_decay = 0.1;
  strata::adamw_options adam = adamw;
  adam.decoupled = false;
  const auto kw = strata::make_adamw_step_params(adamw, 1, 1e-2);
  const auto ka = strata::make_adamw_step_params(adam, 1, 1e-2);
  CHECK(kw.decay_factor == static_cast<float>(1 - 1e-2 * 0.1));
  CHECK_FALSE(kw.l2);
  CHECK(ka.l2);
  CHECK(ka.decay_factor == 1.0f);
  // Gradient 0: AdamW still shrinks the weight by lr*wd; Adam moves it by the decay "gradient"
  // wd*p normalized by Adam, i.e. by about lr.
  float pw = 2, mw = 0, vw = 0, xw = 0, pa = 2, ma = 0, va = 0, xa = 0;
  strata::adamw_element(pw, mw, vw, xw, 0.0f, kw);
  strata::adamw_element(pa, ma, va, xa, 0.0f, ka);
  CHECK(pw == doctest::Approx(2 * (1 - 1e-3)).epsilon(1e-7));
  CHECK(pa == doctest::Approx(2 - 1e-2).epsilon(1e-6));
  adamw.weight_decay = adam.weight_decay = 0;
  state<float, strata::bf16> a(100, 1), b(100, 1);
  a.reference_step(strata::make_adamw_step_params(adamw, 4, 1e-3), true);
  b.reference_step(strata::make_adamw_step_params(adam, 4, 1e-3), true);
  CHECK(a == b);
}

TEST_CASE("amsgrad normalizes by the running maximum of v") {
  strata::adamw_options o;
  o.amsgrad = true;
  const auto k = strata::make_adamw_step_params(o, 2, 1e-3);
  float p = 0, m = 0, v = 1e-4f, vmax = 1.0f;  // vmax far above v: the step is tiny
  strata::adamw_element(p, m, v, vmax, 1e-3f, k);
  CHECK(vmax == 1.0f);
  CHECK(std::fabs(p) < 1e-6f);
  float vmax2 = 0;
  float p2 = 0, m2 = 0, v2 = 1e-4f;
  strata::adamw_element(p2, m2, v2, vmax2, 1e-3f, k);
  CHECK(vmax2 == v2);  // the maximum follows v when v is larger
}

TEST_CASE("maximize ascends: the update has the opposite sign") {
  strata::adamw_options o;
  o.weight_decay = 0;
  strata::adamw_options up = o;
  up.maximize = true;
  float p1 = 0, m1 = 0, v1 = 0, x1 = 0, p2 = 0, m2 = 0, v2 = 0, x2 = 0;
  strata::adamw_element(p1, m1, v1, x1, 0.3f, strata::make_adamw_step_params(o, 1, 1e-3));
  strata::adamw_element(p2, m2, v2, x2, 0.3f, strata::make_adamw_step_params(up, 1, 1e-3));
  CHECK(p1 < 0);
  CHECK(p2 == -p1);
}

TEST_CASE("bad sizes, steps and options are config_errors naming the value") {
  state<float, strata::bf16> s(10, 3);
  const auto k = strata::make_adamw_step_params({}, 1, 1e-3);
  std::vector<float> short_m(9);
  CHECK_THROWS_WITH_AS(strata::adamw_update_cpu(std::span<float>(s.p), std::span<float>(short_m), std::span<float>(s.v),
                                                std::span<float>(), std::span<const float>(s.g),
                                                std::span<strata::bf16>(), k),
                       "adamw_update_cpu: exp_avg has 9 elements for 10 parameters", strata::config_error);
  std::vector<strata::bf16> short_out(3);
  CHECK_THROWS_WITH_AS(strata::adamw_update_cpu(std::span<float>(s.p), std::span<float>(s.m), std::span<float>(s.v),
                                                std::span<float>(), std::span<const float>(s.g),
                                                std::span<strata::bf16>(short_out), k),
                       doctest::Contains("model copy has 3 elements for 10 parameters"), strata::config_error);
  strata::adamw_options ams;
  ams.amsgrad = true;
  CHECK_THROWS_WITH_AS(strata::adamw_update_cpu(std::span<float>(s.p), std::span<float>(s.m), std::span<float>(s.v),
                                                std::span<float>(), std::span<const float>(s.g),
                                                std::span<strata::bf16>(), strata::make_adamw_step_params(ams, 1, 1e-3)),
                       doctest::Contains("amsgrad needs max_exp_avg_sq of 10 elements, got 0"), strata::config_error);
  CHECK_THROWS_WITH_AS((void)strata::make_adamw_step_params({}, 0, 1e-3), doctest::Contains("step 0"),
                       strata::config_error);
  strata::adamw_options bad;
  bad.beta2 = 1.0;
  CHECK_THROWS_WITH_AS((void)strata::make_adamw_step_params(bad, 1, 1e-3), doctest::Contains("invalid beta2 1"),
                       strata::config_error);
  CHECK_THROWS_AS((void)strata::make_adamw_step_params({}, 1, 1e-3, 0.0), strata::config_error);
}

TEST_CASE("a forced instruction-set path this CPU lacks is a config_error; automatic picks the best") {
  CHECK(strata::resolve_cpu_isa(strata::cpu_isa::automatic) == strata::best_cpu_isa());
  CHECK(strata::cpu_supports(strata::best_cpu_isa()));
  CHECK(strata::resolve_cpu_isa(strata::cpu_isa::portable) == strata::cpu_isa::portable);
  if (!strata::cpu_supports(strata::cpu_isa::avx512))
    CHECK_THROWS_WITH_AS((void)strata::resolve_cpu_isa(strata::cpu_isa::avx512), doctest::Contains("'avx512'"),
                         strata::config_error);
  MESSAGE("best CPU path here: ", std::string(strata::to_string(strata::best_cpu_isa())));
}

TEST_CASE("a step with an inf or NaN gradient anywhere is skipped for the whole model and reported") {
  using G = strata::fp16;
  using H = strata::bf16;
  std::vector<state<G, H>> groups;
  for (std::uint32_t i = 0; i < 3; ++i) groups.emplace_back(1000 + i, 40 + i);
  for (float poison : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    auto work = groups;
    work[2].g[517] = G(poison);  // only the last group, so earlier groups must not be touched either
    const auto before = work;
    std::vector<strata::adamw_group<G, H>> views;
    for (auto& s : work) views.push_back({s.p, s.m, s.v, {}, s.g, s.out});
    std::int64_t step = 7;
    strata::thread_pool pool(2);
    const auto report = strata::adamw_step_cpu<G, H>(views, {}, step, 1e-3, 1.0 / 1024, 1.0, &pool);
    CHECK(report.skipped);
    CHECK(step == 7);
    CHECK(report.nonfinite_groups == std::vector<std::size_t>{2});
    CHECK_FALSE(std::isfinite(report.grad_norm));
    for (std::size_t i = 0; i < work.size(); ++i) CHECK(work[i] == before[i]);
  }
}

TEST_CASE("a finite step clips by the global norm over every group and equals the per-group update") {
  using G = strata::bf16;
  using H = strata::fp16;
  std::vector<state<G, H>> groups;
  for (std::uint32_t i = 0; i < 4; ++i) groups.emplace_back(3000 + 17 * i, 90 + i, 1024.0f);
  const double inv_scale = 1.0 / 1024;
  // The global norm from first principles, in long double.
  long double sum = 0;
  for (const auto& s : groups)
    for (const auto g : s.g) {
      const long double u = static_cast<float>(static_cast<float>(g) * static_cast<float>(inv_scale));
      sum += u * u;
    }
  const double norm = std::sqrt(static_cast<double>(sum));
  const double max_norm = norm / 4;  // forces clipping
  auto expect = groups;
  const float clip = strata::clip_coefficient(norm, max_norm);
  CHECK(clip == doctest::Approx(0.25).epsilon(1e-5));
  const auto k = strata::make_adamw_step_params({}, 1, 1e-3, inv_scale, clip);
  for (auto& s : expect) s.reference_step(k, true);

  std::vector<strata::adamw_group<G, H>> views;
  for (auto& s : groups) views.push_back({s.p, s.m, s.v, {}, s.g, s.out});
  std::int64_t step = 0;
  const auto report = strata::adamw_step_cpu<G, H>(views, {}, step, 1e-3, inv_scale, max_norm);
  CHECK_FALSE(report.skipped);
  CHECK(step == 1);
  CHECK(report.grad_norm == doctest::Approx(norm).epsilon(1e-12));
  CHECK(report.clip == clip);
  for (std::size_t i = 0; i < groups.size(); ++i) CHECK(groups[i] == expect[i]);
  // Below the threshold nothing is clipped.
  CHECK(strata::clip_coefficient(norm, norm * 2) == 1.0f);
}

}  // namespace adamw_cpu_test

#if STRATA_CPU_X86_PATHS
TEST_CASE("the kernels' prefetch distance is 128 elements on AMD Zen 4, else 512, unless the environment says") {
  const std::size_t d = strata::detail::simd::prefetch_ahead_elems();
  CHECK(d <= 65536);
  // The family from /proc/cpuinfo, apart from the cpuid the header reads (Linux; else skipped).
  unsigned family = 0;
  if (std::FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[256];
    while (family == 0 && std::fgets(line, sizeof line, f) != nullptr)
      if (std::sscanf(line, "cpu family : %u", &family) != 1) family = 0;
    std::fclose(f);
  }
  if (family != 0) CHECK(strata::detail::simd::x86_family() == family);
  if (std::getenv("STRATA_PREFETCH_ELEMS") == nullptr) {
    const bool zen4 = __builtin_cpu_is("amd") && strata::detail::simd::x86_family() == 0x19 &&
                      strata::cpu_supports(strata::cpu_isa::avx512);
    CHECK(d == (zen4 ? strata::detail::simd::prefetch_ahead_elems_zen4 : strata::detail::simd::prefetch_ahead_elems_default));
  }
  CHECK(strata::detail::simd::prefetch_ahead_elems() == d);  // read once
}
#endif

#if STRATA_CPU_X86_PATHS
TEST_CASE("the kernels round to bf16 with AVX512_BF16's instruction where the CPU has it, unless the environment says no") {
  const bool has = strata::cpu_supports(strata::cpu_isa::avx512) && __builtin_cpu_supports("avx512bf16");
  const char* env = std::getenv("STRATA_CPU_BF16");
  const bool off = env != nullptr && std::string_view(env) == "0";
  CHECK(strata::detail::cpu_uses_avx512_bf16() == (has && !off));
  if (!has) MESSAGE("this CPU has no AVX512_BF16: the AVX-512 path rounds in integer arithmetic");
}
#endif
