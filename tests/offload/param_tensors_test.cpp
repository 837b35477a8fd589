// offloaded_adamw's step over framework tensors as they are (param_tensor): tensors without a
// gradient are left as torch.optim.AdamW leaves a tensor whose .grad is None (state, weights and
// step count), each tensor keeps its own step count (param_steps, saved in checkpoints),
// untouched subgroups cost no I/O, the tensors' weights may be the truth the master weights
// follow, and several optimizers (or processes) of one model can share one clip/skip decision.
#include <doctest/doctest.h>

#include <cstdint>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <strata/offload/checkpoint_manifest.hpp>
#include <strata/offload/param_tensors.hpp>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/optim/param_steps.hpp>

#include "offload_test_support.hpp"

namespace param_tensors_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;
using opt_t = strata::offloaded_adamw<strata::host_tier>;

/// torch.optim.AdamW's semantics over named tensors: each tensor its own arrays and step count,
/// updated with strata's kernel only in steps where it has a gradient.
struct tensor_reference {
  std::vector<std::size_t> bounds;  // tensor t is [bounds[t], bounds[t + 1])
  std::vector<float> p, m, v;
  std::vector<std::int64_t> steps;
  strata::adamw_options o;

  tensor_reference(std::vector<std::size_t> b, std::span<const float> init, strata::adamw_options opts)
      : bounds(std::move(b)), p(init.begin(), init.end()), m(init.size(), 0.0f), v(init.size(), 0.0f),
        steps(bounds.size() - 1, 0), o(opts) {}

  [[nodiscard]] std::size_t tensors() const { return steps.size(); }
  [[nodiscard]] std::size_t begin(std::size_t t) const { return bounds[t]; }
  [[nodiscard]] std::size_t size(std::size_t t) const { return bounds[t + 1] - bounds[t]; }

  template <class G, class H>
  void step(const std::set<std::size_t>& with_grad, std::span<const G> g, double lr, std::span<H> model) {
    for (const std::size_t t : with_grad) {
      const auto k = strata::make_adamw_step_params(o, ++steps[t], lr);
      const std::size_t b = begin(t), n = size(t);
      strata::adamw_update_cpu<G, H>(std::span<float>(p).subspan(b, n), std::span<float>(m).subspan(b, n),
                                     std::span<float>(v).subspan(b, n), {}, g.subspan(b, n),
                                     model.empty() ? model : model.subspan(b, n), k);
    }
  }
};

/// Every tensor of `ref` over `model`, with its gradients from `g` when it is in `with_grad`.
template <class G>
std::vector<strata::param_tensor<G, G>> tensors_of(const tensor_reference& ref, const std::set<std::size_t>& with_grad,
                                                   std::span<const G> g, std::span<G> model) {
  std::vector<strata::param_tensor<G, G>> r;
  for (std::size_t t = 0; t < ref.tensors(); ++t)
    r.push_back({ref.begin(t), ref.size(t), with_grad.contains(t) ? g.subspan(ref.begin(t), ref.size(t)) : std::span<const G>(),
                 model.subspan(ref.begin(t), ref.size(t))});
  return r;
}
template <class G>
std::span<const strata::param_tensor<G, G>> span_of(const std::vector<strata::param_tensor<G, G>>& v) {
  return v;
}

strata::offload_options options(std::size_t sg, std::size_t cache, std::size_t n, const strata::adamw_options& ao) {
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.threads = 2;
  off.host_cache_bytes = strata::offload_layout::of(n, ao, off).cache_bytes(cache);
  return off;
}

template <class Opt>
void require_state(Opt& opt, const tensor_reference& ref) {
  require_same_arrays(opt, ref.p, ref.m, ref.v);
  for (std::size_t t = 0; t < ref.tensors(); ++t)
    for (std::size_t i = ref.begin(t); i < ref.begin(t) + ref.size(t); i += 37)
      REQUIRE(opt.param_step_counts().at(i) == static_cast<std::uint64_t>(ref.steps[t]));
}

// Tensors that cross subgroups of 200, one of a single parameter, and which have gradients when.
const std::vector<std::size_t> bounds = {0, 130, 430, 431, 700, 1000};
const std::vector<std::set<std::size_t>> schedule = {{0, 1, 2, 3, 4}, {0, 2, 4}, {1}, {0, 1, 2, 3, 4}, {3, 4}, {2}};

}  // namespace

TEST_CASE("a step over tensors leaves those without a gradient as they are and gives each tensor its own step count, "
          "bit for bit as torch's per-tensor AdamW") {
  const std::size_t n = 1000;
  strata::adamw_options ao;
  ao.weight_decay = 0.05;
  for (const std::size_t cache : {0, 2}) {
    CAPTURE(cache);
    const auto init = random_params(n, 3);
    tensor_reference ref(bounds, init, ao);
    strata::host_tier tier(strata::host_tier_options{.name = "tensors"});
    opt_t opt(tier, init, ao, options(200, cache, n, ao));
    std::vector<strata::bf16> model(n), ref_model(n);
    for (std::size_t i = 0; i < n; ++i) model[i] = ref_model[i] = strata::bf16(init[i]);
    for (std::size_t s = 0; s < schedule.size(); ++s) {
      CAPTURE(s);
      const auto g = random_grads<strata::bf16>(n, 40 + s);
      const auto before = model;
      const auto tensors = tensors_of<strata::bf16>(ref, schedule[s], g, model);
      const auto st = opt.step(span_of(tensors), 1e-2);
      ref.step<strata::bf16, strata::bf16>(schedule[s], g, 1e-2, ref_model);
      CHECK(st.step == s + 1);
      require_state(opt, ref);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(same_bits(model[i], ref_model[i]));
      // Tensors without a gradient keep their weights as they were.
      for (std::size_t t = 0; t < ref.tensors(); ++t)
        if (!schedule[s].contains(t))
          for (std::size_t i = ref.begin(t); i < ref.begin(t) + ref.size(t); ++i) REQUIRE(same_bits(model[i], before[i]));
    }
    CHECK(opt.step_count() == schedule.size());
    CHECK_FALSE(opt.param_step_counts().uniform());
  }
}

TEST_CASE("per-range rates and per-tensor step counts cut the update into pieces that each get their own constants") {
  const std::size_t n = 1000;
  strata::adamw_options ao;
  const auto init = random_params(n, 4);
  strata::host_tier tier(strata::host_tier_options{.name = "rates"});
  opt_t opt(tier, init, ao, options(256, 1, n, ao));
  // Two param groups whose boundary (431) is not a subgroup's.
  const strata::step_rates rates(std::vector<strata::param_range>{{0, 431, 1e-2, 0.1}, {431, 569, 5e-3, 0.0}});
  auto with_decay = [&](double wd) {
    auto o = ao;
    o.weight_decay = wd;
    return o;
  };
  tensor_reference lo({0, 130, 430, 431}, std::span<const float>(init).first(431), with_decay(0.1));
  tensor_reference hi({0, 269, 569}, std::span<const float>(init).subspan(431), with_decay(0.0));
  const tensor_reference whole(bounds, init, ao);  // (the tensors of both groups, for tensors_of)
  std::vector<float> model(init), ref_model(init);
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    const auto g = random_grads<float>(n, 50 + s);
    std::set<std::size_t> lo_t, hi_t;
    for (const std::size_t t : schedule[s]) (t < 3 ? lo_t : hi_t).insert(t < 3 ? t : t - 3);
    const auto tensors = tensors_of<float>(whole, schedule[s], g, model);
    opt.step(span_of(tensors), rates);
    lo.step<float, float>(lo_t, std::span<const float>(g).first(431), 1e-2, std::span<float>(ref_model).first(431));
    hi.step<float, float>(hi_t, std::span<const float>(g).subspan(431), 5e-3, std::span<float>(ref_model).subspan(431));
  }
  std::vector<float> want(lo.p);
  want.insert(want.end(), hi.p.begin(), hi.p.end());
  std::vector<float> p(n);
  opt.read_master(p);
  CHECK(same_bits(p, want));
  CHECK(same_bits(model, ref_model));
}

TEST_CASE("subgroups without any gradient are neither read nor written") {
  const std::size_t n = 1000, sg = 200;  // 5 subgroups
  strata::adamw_options ao;
  const auto init = random_params(n, 5);
  strata::host_tier tier(strata::host_tier_options{.name = "io"});
  opt_t opt(tier, init, ao, options(sg, 0, n, ao));
  const auto g = random_grads<float>(n, 6);
  std::vector<float> model(init);
  const std::span<const float> gs(g);
  const std::span<float> ms(model);
  // Gradients in subgroups 1 and 3 only; a tensor without a gradient spans subgroups 0-1.
  const std::vector<strata::param_tensor<float, float>> tensors = {{0, 250, {}, ms.first(250)},
                                                                   {250, 20, gs.subspan(250, 20), ms.subspan(250, 20)},
                                                                   {700, 50, gs.subspan(700, 50), ms.subspan(700, 50)}};
  const auto st = opt.step(span_of(tensors), 1e-3);
  CHECK(st.subgroups == 2);
  CHECK(st.bytes_read == 2 * opt.layout().state_bytes(0));
  CHECK(st.bytes_written == 2 * opt.layout().state_bytes(0));
  // A step with no gradient at all touches nothing and still counts.
  const auto none = opt.step(std::span<const strata::param_tensor<float, float>>(), 1e-3);
  CHECK(none.subgroups == 0);
  // Nothing read by the step itself; the first step, as it returned, started reading the
  // subgroups it had updated (prefetch_next_step), at most those two, for a step that then
  // touched none of them.
  CHECK(none.bytes_read == none.prefetched_bytes);
  CHECK(none.prefetched <= 2);
  CHECK(none.bytes_written == 0);
  CHECK(opt.step_count() == 2);
  CHECK(opt.param_step_counts().at(0) == 0);
  CHECK(opt.param_step_counts().at(260) == 1);
  CHECK(opt.param_step_counts().at(270) == 0);
}

TEST_CASE("with clipping and loss scaling, a step over tensors that leave subgroups without gradients checks only "
          "the gradients given, bit for bit as the same step without either") {
  const std::size_t n = 1000, sg = 200, cut = 430;  // subgroups 3 and 4 get no gradient at step 0, 0-1 none at 1
  strata::adamw_options ao;
  const auto init = random_params(n, 12);
  strata::host_tier ta(strata::host_tier_options{.name = "a"}), tb(strata::host_tier_options{.name = "b"});
  auto oa = options(sg, 0, n, ao);
  const auto ob = oa;
  oa.max_grad_norm = 1e9;  // never clips: the norm is summed and checked, nothing else
  oa.loss_scaling.enabled = true;
  oa.loss_scaling.init_scale = 1024;  // a power of two: unscaling is exact
  opt_t a(ta, init, ao, oa), b(tb, init, ao, ob);
  std::vector<float> ma(init), mb(init);
  for (int t = 0; t < 2; ++t) {
    CAPTURE(t);
    const auto g = random_grads<float>(n, 20 + static_cast<std::uint64_t>(t));
    std::vector<float> scaled(g);
    for (auto& x : scaled) x *= a.loss_scale();
    const auto tensors = [&](std::span<const float> gs, std::span<float> m) {
      return std::vector<strata::param_tensor<float, float>>{
          {0, cut, t == 0 ? gs.first(cut) : std::span<const float>(), m.first(cut)},
          {cut, n - cut, t == 1 ? gs.subspan(cut) : std::span<const float>(), m.subspan(cut)}};
    };
    const auto tsa = tensors(scaled, ma), tsb = tensors(g, mb);
    const auto sa = a.step(span_of(tsa), 1e-3);
    b.step(span_of(tsb), 1e-3);
    REQUIRE(sa.grad_norm.has_value());
    CHECK(std::isfinite(*sa.grad_norm));
    CHECK(*sa.grad_norm > 0);
    CHECK_FALSE(sa.skipped);
    CHECK(sa.clip == 1.0f);
    std::vector<float> pa(n), pb(n);
    a.read_master(pa);
    b.read_master(pb);
    REQUIRE(same_bits(pa, pb));
    CHECK(same_bits(ma, mb));
  }
}

TEST_CASE("per-parameter step counts survive a checkpoint, and the resumed run continues bit for bit") {
  const std::size_t n = 1000;
  strata::adamw_options ao;
  const auto init = random_params(n, 7);
  tensor_reference ref(bounds, init, ao);
  strata::host_tier tier(strata::host_tier_options{.name = "ck"});
  opt_t opt(tier, init, ao, options(200, 1, n, ao));
  std::vector<float> model(init), ref_model(init);
  const auto run = [&](auto& o, std::size_t s) {
    const auto g = random_grads<float>(n, 60 + s);
    const auto tensors = tensors_of<float>(ref, schedule[s], g, model);
    o.step(span_of(tensors), 1e-2);
    ref.step<float, float>(schedule[s], g, 1e-2, ref_model);
  };
  for (std::size_t s = 0; s < 3; ++s) run(opt, s);
  const fs::path dir = fs::temp_directory_path() / ("strata-tensors-ck-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  opt.save(dir);
  const auto manifest = opt_t::load_manifest(dir);
  CHECK(manifest.step_runs.size() > 1);
  strata::host_tier tier2(strata::host_tier_options{.name = "ck2"});
  auto resumed = opt_t::load(dir, tier2, options(200, 0, n, ao));
  CHECK(resumed.param_step_counts() == opt.param_step_counts());
  for (std::size_t s = 3; s < schedule.size(); ++s) run(resumed, s);
  require_state(resumed, ref);
  CHECK(same_bits(model, ref_model));
  fs::remove_all(dir);
}

TEST_CASE("a manifest whose step runs are out of order, past the parameters or past the step is refused") {
  strata::checkpoint_manifest m;
  m.step = 5;
  m.params = 100;
  m.subgroup_elems = 100;
  m.data_file = "state-5-00000000.bin";
  m.data_bytes = 100 * 3 * 4;
  m.subgroup_bytes = {m.data_bytes};
  m.checksums = {0};
  m.step_runs = {{0, 5}, {40, 3}};
  const auto ok = strata::checkpoint_manifest::parse(m.to_text(), "ok");
  CHECK(ok.step_runs == m.step_runs);
  for (const auto& bad : std::vector<std::vector<strata::param_step_run>>{
           {{10, 5}}, {{0, 5}, {40, 3}, {30, 1}}, {{0, 5}, {100, 1}}, {{0, 6}}}) {
    m.step_runs = bad;
    CHECK_THROWS_AS(strata::checkpoint_manifest::parse(m.to_text(), "bad"), strata::integrity_error);
  }
}

TEST_CASE("with adopt_model the master weights follow tensors written between steps, fp32 exactly, 16-bit as the "
          "written value") {
  const std::size_t n = 1000;
  strata::adamw_options ao;
  const auto init = random_params(n, 8);
  strata::step_options adopt;
  adopt.adopt_model = true;
  SUBCASE("fp32") {
    tensor_reference ref(bounds, init, ao);
    strata::host_tier tier(strata::host_tier_options{.name = "f32"});
    opt_t opt(tier, init, ao, options(200, 1, n, ao));
    std::vector<float> model(init), ref_model(init);
    const std::set<std::size_t> every = {0, 1, 2, 3, 4};
    auto g = random_grads<float>(n, 80);
    opt.step(span_of(tensors_of<float>(ref, every, g, model)), 1e-2);
    ref.step<float, float>(every, g, 1e-2, ref_model);
    // Someone writes into the model (a load, a clamp), including a tensor that gets no gradient next.
    for (const std::size_t i : {std::size_t{5}, std::size_t{140}, std::size_t{430}, std::size_t{999}}) {
      model[i] = static_cast<float>(i) * 0.25f;
      ref.p[i] = ref_model[i] = model[i];
    }
    const std::set<std::size_t> some = {0, 1, 4};
    g = random_grads<float>(n, 81);
    opt.step(span_of(tensors_of<float>(ref, some, g, model)), 1e-2, adopt);
    ref.step<float, float>(some, g, 1e-2, ref_model);
    require_state(opt, ref);  // (parameter 430, without a gradient, took the written value too)
    CHECK(same_bits(model, ref_model));
  }
  SUBCASE("bf16") {
    const tensor_reference one_tensor({0, n}, init, ao);
    strata::host_tier tier(strata::host_tier_options{.name = "b16"});
    opt_t opt(tier, init, ao, options(200, 0, n, ao));
    std::vector<strata::bf16> model(n);
    const auto g = random_grads<strata::bf16>(n, 82);
    opt.step(span_of(tensors_of<strata::bf16>(one_tensor, {0}, g, model)), 1e-2);
    std::vector<float> master(n);
    opt.read_master(master);
    model[10] = strata::bf16(2.5f);
    // A master whose rounding the weight still holds keeps its extra bits.
    REQUIRE(master[11] != static_cast<float>(model[11]));
    // One gradient in subgroup 0: parameters 10 and 11 have none but their subgroup is updated.
    const std::span<const strata::bf16> gs(g);
    const std::span<strata::bf16> ms(model);
    const std::vector<strata::param_tensor<strata::bf16, strata::bf16>> tensors = {
        {0, 50, {}, ms.first(50)}, {50, 1, gs.subspan(50, 1), ms.subspan(50, 1)}, {51, n - 51, {}, ms.subspan(51)}};
    opt.step(span_of(tensors), 1e-2, adopt);
    std::vector<float> after(n);
    opt.read_master(after);
    CHECK(after[10] == 2.5f);
    CHECK(after[11] == master[11]);
  }
}

TEST_CASE("a save with the tensors holds the weights written into them; the running state is unchanged") {
  const std::size_t n = 600;
  strata::adamw_options ao;
  const auto init = random_params(n, 9);
  strata::host_tier tier(strata::host_tier_options{.name = "save"});
  opt_t opt(tier, init, ao, options(200, 1, n, ao));
  std::vector<float> model(init);
  const auto g = random_grads<float>(n, 90);
  opt.step(std::span<const float>(g), 1e-3, std::span<float>(model));
  std::vector<float> before(n);
  opt.read_master(before);
  model[3] = 7.0f;
  model[450] = -7.0f;
  const fs::path dir = fs::temp_directory_path() / ("strata-tensors-save-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::vector<strata::param_tensor<float, float>> tensors = {{0, 400, {}, std::span<float>(model).first(400)},
                                                                   {400, 200, {}, std::span<float>(model).subspan(400)}};
  opt.save(dir, span_of(tensors));
  std::vector<float> running(n);
  opt.read_master(running);
  CHECK(same_bits(running, before));
  strata::host_tier tier2(strata::host_tier_options{.name = "save2"});
  auto loaded = opt_t::load(dir, tier2, options(200, 0, n, ao));
  std::vector<float> saved(n);
  loaded.read_master(saved);
  CHECK(same_bits(saved, model));
  fs::remove_all(dir);
}

TEST_CASE("optimizers over parts of one model share one clip decision from their gradient stats and step as one") {
  const std::size_t n = 1000, half = 430;
  strata::adamw_options ao;
  const auto init = random_params(n, 10);
  strata::offload_options clip = options(200, 0, n, ao);
  clip.max_grad_norm = 0.05;
  strata::host_tier whole_tier(strata::host_tier_options{.name = "whole"});
  opt_t whole(whole_tier, init, ao, clip);
  strata::host_tier a_tier(strata::host_tier_options{.name = "a"}), b_tier(strata::host_tier_options{.name = "b"});
  opt_t a(a_tier, std::span<const float>(init).first(half), ao, options(200, 0, half, ao));
  opt_t b(b_tier, std::span<const float>(init).subspan(half), ao, options(200, 0, n - half, ao));
  std::vector<float> wm(init), model(init);
  const std::span<float> ms(model);
  for (int s = 0; s < 3; ++s) {
    const auto g = random_grads<float>(n, 100 + static_cast<std::uint64_t>(s));
    const std::span<const float> gs(g);
    const std::vector<strata::param_tensor<float, float>> ta = {{0, half, gs.first(half), ms.first(half)}};
    const std::vector<strata::param_tensor<float, float>> tb = {{0, n - half, gs.subspan(half), ms.subspan(half)}};
    const auto sa = a.gradient_stats(span_of(ta));
    const auto sb = b.gradient_stats(span_of(tb));
    CHECK(sa.count + sb.count == n);
    const auto ws = whole.step(gs, 1e-2, std::span<float>(wm));
    REQUIRE(ws.grad_norm.has_value());
    CHECK(*ws.grad_norm == doctest::Approx(std::sqrt(sa.sum_squares + sb.sum_squares)).epsilon(1e-12));
    const auto d = strata::decide_step(sa.sum_squares + sb.sum_squares, 0.05);
    CHECK(d.clip < 1.0f);
    strata::step_options opts;
    opts.decision = strata::step_decision{false, *ws.grad_norm, ws.clip};
    a.step(span_of(ta), 1e-2, opts);
    b.step(span_of(tb), 1e-2, opts);
  }
  std::vector<float> w(n), pa(half), pb(n - half);
  whole.read_master(w);
  a.read_master(pa);
  b.read_master(pb);
  CHECK(same_bits(std::span<const float>(w).first(half), pa));
  CHECK(same_bits(std::span<const float>(w).subspan(half), pb));
  CHECK(same_bits(model, wm));
  // A decision to skip changes nothing and does not count.
  const auto g = random_grads<float>(n, 200);
  const std::vector<strata::param_tensor<float, float>> ta = {{0, half, std::span<const float>(g).first(half), ms.first(half)}};
  strata::step_options skip;
  skip.decision = strata::step_decision{true, std::numeric_limits<double>::infinity(), 1.0f};
  const auto st = a.step(span_of(ta), 1e-2, skip);
  CHECK(st.skipped);
  CHECK(a.step_count() == 3);
  std::vector<float> after(half);
  a.read_master(after);
  CHECK(same_bits(after, pa));
}

TEST_CASE("tensors out of order, overlapping, empty, past the parameters or of the wrong size are config errors "
          "naming the tensor") {
  const std::size_t n = 300;
  strata::adamw_options ao;
  const auto init = random_params(n, 11);
  strata::host_tier tier(strata::host_tier_options{.name = "bad"});
  opt_t opt(tier, init, ao, options(100, 0, n, ao));
  const auto g = random_grads<float>(n, 12);
  const std::span<const float> gs(g);
  std::vector<float> model(init);
  const auto fails = [&](std::vector<strata::param_tensor<float, float>> t, const char* text) {
    try {
      opt.step(span_of(t), 1e-3);
      FAIL("no error");
    } catch (const strata::config_error& e) {
      CHECK(std::string(e.what()).find(text) != std::string::npos);
    }
  };
  fails({{100, 10, gs.subspan(100, 10), {}}, {0, 10, gs.first(10), {}}}, "tensor 1 [0, 10)");
  fails({{0, 20, gs.first(20), {}}, {10, 5, gs.subspan(10, 5), {}}}, "not overlap");
  fails({{0, 0, {}, {}}}, "is empty");
  fails({{290, 20, gs.subspan(0, 20), {}}}, "passes the 300 parameters");
  fails({{0, 20, gs.first(19), {}}}, "has 19 gradients for 20 parameters");
  fails({{0, 20, gs.first(20), std::span<float>(model).first(21)}}, "has 21 weights for 20 parameters");
  CHECK(opt.step_count() == 0);
}

TEST_CASE("a failed step over tensors retries bit for bit, and only with gradients for the same parameters") {
  const std::size_t n = 1000;
  strata::adamw_options ao;
  const auto init = random_params(n, 13);
  tensor_reference ref(bounds, init, ao);
  strata::faulty<strata::host_tier> tier(strata::host_tier_options{.name = "flaky"});
  strata::offloaded_adamw<strata::faulty<strata::host_tier>> opt(tier, init, ao, options(200, 0, n, ao));
  std::vector<float> model(init), ref_model(init);
  const auto g = random_grads<float>(n, 14);
  const auto tensors = tensors_of<float>(ref, schedule[1], g, model);
  tier.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = {}, .after = 1, .times = 1});
  CHECK_THROWS_AS(opt.step(span_of(tensors), 1e-2), strata::io_error);
  CHECK_THROWS_AS(opt.step(span_of(tensors_of<float>(ref, schedule[2], g, model)), 1e-2), strata::config_error);
  CHECK_THROWS_AS(opt.step(std::span<const float>(g), 1e-2), strata::config_error);
  tier.clear();
  opt.step(span_of(tensors), 1e-2);
  ref.step<float, float>(schedule[1], g, 1e-2, ref_model);
  require_state(opt, ref);
  CHECK(same_bits(model, ref_model));
  CHECK(opt.step_count() == 1);
}

TEST_CASE("the run-time optimizer steps over tensors, starts from 16-bit weights and from per-parameter step counts") {
  const std::size_t n = 1000;
  strata::adamw_options ao;
  const auto init32 = random_params(n, 15);
  std::vector<strata::bf16> model(n), ref_model(n);
  std::vector<float> init(n);
  for (std::size_t i = 0; i < n; ++i) {
    model[i] = ref_model[i] = strata::bf16(init32[i]);
    init[i] = static_cast<float>(model[i]);
  }
  tensor_reference ref(bounds, init, ao);
  strata::offloaded_adamw_config c;
  c.paths.resize(2);
  c.paths[0].name = "a";
  c.paths[1].name = "b";
  c.offload.subgroup_elems = 200;
  c.offload.threads = 2;
  auto opt = strata::make_offloaded_adamw(c, strata::host_weights(std::span<const strata::bf16>(model)));
  for (std::size_t s = 0; s < 3; ++s) {
    const auto g = random_grads<strata::bf16>(n, 110 + s);
    opt.step(span_of(tensors_of<strata::bf16>(ref, schedule[s], g, model)), 1e-2, strata::step_options{});
    ref.step<strata::bf16, strata::bf16>(schedule[s], g, 1e-2, ref_model);
  }
  require_state(opt, ref);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(same_bits(model[i], ref_model[i]));
  // The same state handed to a new optimizer with its step runs continues identically.
  const auto runs = opt.param_step_counts().runs();
  const std::vector<strata::param_step_run> copy(runs.begin(), runs.end());
  strata::adamw_state_view st{ref.m, ref.v, {}, opt.step_count(), copy};
  auto again = strata::make_offloaded_adamw(c, ref.p, st);
  CHECK(again.param_step_counts() == opt.param_step_counts());
  const std::vector<strata::param_step_run> too_many = {{0, 9}};
  st.step_runs = too_many;
  CHECK_THROWS_AS(strata::make_offloaded_adamw(c, ref.p, st), strata::config_error);
  // Started from the tensors' own weights: the same master weights, no flat copy needed.
  const auto tensors = tensors_of<strata::bf16>(ref, {}, {}, model);
  auto from_tensors = strata::make_offloaded_adamw(c, strata::host_weights(span_of(tensors)));
  std::vector<float> master(n);
  from_tensors.read_master(master);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(master[i] == static_cast<float>(model[i]));
  const std::vector<strata::param_tensor<strata::bf16, strata::bf16>> with_a_gap = {
      {0, 100, {}, std::span<strata::bf16>(model).first(100)}, {200, n - 200, {}, std::span<strata::bf16>(model).subspan(200)}};
  c.offload.object_prefix = "other";
  CHECK_THROWS_AS(strata::make_offloaded_adamw(c, strata::host_weights(span_of(with_a_gap)), {}), strata::config_error);
}

TEST_CASE("gradients kept by the caller need no store: the strata preset gives that room to the cache, and "
          "accept_gradients is refused") {
  const std::size_t n = 100000;
  strata::adamw_options ao;
  strata::offload_options base;
  base.subgroup_elems = 4096;
  base.host_memory_budget = 8 << 20;
  const auto host = strata::presets::strata_preset::options(n, ao, base);
  base.gradients = strata::gradient_residency::caller;
  const auto caller = strata::presets::strata_preset::options(n, ao, base);
  CHECK(caller.host_cache_bytes > host.host_cache_bytes);
  CHECK(strata::presets::mlp_offload::options(n, ao, base).gradients == strata::gradient_residency::caller);
  const auto init = random_params(1000, 20);
  strata::host_tier tier(strata::host_tier_options{.name = "caller"});
  auto off = options(200, 0, 1000, ao);
  off.gradients = strata::gradient_residency::caller;
  opt_t opt(tier, init, ao, off);
  const auto g = random_grads<float>(1000, 21);
  CHECK_THROWS_AS(opt.accept_gradients_at(0, std::span<const float>(g)), strata::config_error);
  opt.step(std::span<const float>(g), 1e-3);
  CHECK(opt.step_count() == 1);
}

TEST_CASE("param_steps advances ranges and merges equal runs; bad runs are refused") {
  strata::param_steps p(100, 2);
  p.advance(10, 20);
  p.advance(30, 10);
  CHECK(p.runs().size() == 3);  // [0,10)=2 [10,40)=3 [40,100)=2
  CHECK(p.at(9) == 2);
  CHECK(p.at(10) == 3);
  CHECK(p.at(39) == 3);
  CHECK(p.at(40) == 2);
  p.advance(0, 10);
  p.advance(40, 60);
  CHECK(p.uniform());
  CHECK(p.at(99) == 3);
  const std::vector<strata::param_step_run> bad = {{5, 1}};
  CHECK_THROWS_AS(strata::param_steps::from_runs(100, bad, "t"), strata::config_error);
  const std::vector<strata::param_step_run> unordered = {{0, 1}, {50, 2}, {50, 3}};
  CHECK_THROWS_AS(strata::param_steps::from_runs(100, unordered, "t"), strata::config_error);
}

}  // namespace param_tensors_test
