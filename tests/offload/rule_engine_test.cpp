// The offload engine is generic over update rules: every rule (AdamW, SGD, Lion) goes through the
// same checks. Offloaded, each equals its own kernel over one flat in-memory array bit for bit
// (randomized layouts, caches, threads, gradient and model types, gradients handed over or on the
// tier, per-range rates, clipping and loss scaling with skipped steps), on the host and through
// an executor's device path, across a checkpoint and after a tier fault mid-step; a checkpoint
// records its rule and is refused, by name, by an optimizer of another rule. A rule joins the
// suite with one fixture and its name in `every_rule` (near the end).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>
#include <strata/strata.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace rule_engine_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;

// --- one fixture per rule: the rule and the option sets the suite runs it with ---------------

struct adamw_fixture {
  using rule = strata::adamw_rule;
  using other = strata::sgd_rule;  // a rule whose checkpoints it must refuse
  static std::vector<strata::adamw_options> variants() {
    strata::adamw_options plain, ams, adam;
    ams.amsgrad = true;
    ams.maximize = true;
    ams.weight_decay = 0.1;
    adam.decoupled = false;
    adam.weight_decay = 1e-2;
    return {plain, ams, adam};
  }
};
struct adamw_bf16_fixture {
  using rule = strata::adamw_bf16_rule;
  using other = strata::adamw_rule;  // the same options, another state format
  static std::vector<strata::adamw_options> variants() { return adamw_fixture::variants(); }
};
struct adamw_8bit_fixture {
  using rule = strata::adamw_8bit_rule;
  using other = strata::adamw_bf16_rule;
  static std::vector<strata::adamw_options> variants() { return adamw_fixture::variants(); }
};
struct sgd_fixture {
  using rule = strata::sgd_rule;
  using other = strata::lion_rule;
  static std::vector<strata::sgd_options> variants() {
    strata::sgd_options plain, damped, nesterov;
    plain.lr = 1e-2;
    damped.lr = 1e-2;
    damped.momentum = 0.9;
    damped.dampening = 0.1;
    damped.weight_decay = 1e-2;
    nesterov.lr = 1e-2;
    nesterov.momentum = 0.9;
    nesterov.nesterov = true;
    nesterov.maximize = true;
    return {plain, damped, nesterov};
  }
};
// doc-snippet: fixture
struct lion_fixture {
  using rule = strata::lion_rule;
  using other = strata::adamw_rule;
  static std::vector<strata::lion_options> variants() {
    strata::lion_options plain, decayed;
    decayed.weight_decay = 0.1;
    decayed.beta1 = 0.95;
    decayed.maximize = true;
    return {plain, decayed};
// doc-snippet-end
  }
};

// --- the reference: the rule's kernel over one flat array -------------------------------------

// Rule R over one flat state (laid out by the rule's format for every parameter, as one subgroup
// is), one kernel call per rates range and step, with the engine's step decision (the global
// norm summed per subgroup, clipping, loss scaling and its skipped steps) computed the way the
// optimizer must compute it. (A block-quantized state's blocks are the subgroups' blocks: the
// subgroup size is a multiple of the block.)
template <class R>
struct flat_rule_reference {
  typename R::options_type o;
  strata::state_format f;
  std::vector<float> p;
  std::vector<std::byte> rest;  // the state after the master weights (scales, then arrays)
  std::int64_t steps = 0;
  std::size_t subgroup;
  std::optional<double> max_norm;
  strata::dynamic_loss_scaler scaler;
  bool tracks;
  std::vector<std::byte> slot;  // (view() lays the state out here)

  flat_rule_reference(std::span<const float> init, typename R::options_type opts, const strata::offload_options& off)
      : o(opts),
        f(R::format(opts)),
        p(init.begin(), init.end()),
        subgroup(off.subgroup_elems),
        max_norm(off.max_grad_norm > 0 ? std::optional<double>(off.max_grad_norm) : std::nullopt),
        scaler(off.loss_scaling),
        tracks(off.max_grad_norm > 0 || off.loss_scaling.enabled),
        slot(f.state_bytes(init.size())) {
    std::memcpy(slot.data(), p.data(), p.size() * sizeof(float));
    const auto v = view();
    for (std::size_t a = 0; a < f.count; ++a) strata::write_state_array(v, f, a, {});
    sync();
  }

  // Array a widened to fp32 (dequantized).
  std::vector<float> array(std::size_t a) {
    std::vector<float> out(p.size());
    strata::read_state_array(view(), f, a, out);
    return out;
  }

  strata::state_view view() { return strata::state_view::of(slot.data(), f, p.size()); }
  // p from the slot's master weights.
  void sync() { std::memcpy(p.data(), slot.data(), p.size() * sizeof(float)); }

  // Returns whether the step was taken (false: skipped for inf/NaN gradients).
  template <class G, class H>
  bool step(std::span<const G> g, const strata::step_rates& rates, std::span<H> out) {
    strata::step_decision d{};
    if (tracks) {
      strata::grad_norm_accumulator acc;
      for (std::size_t b = 0, s = 0; b < p.size(); b += subgroup, ++s)
        acc.add(s, strata::grad_stats_cpu(g.subspan(b, std::min(subgroup, p.size() - b)), scaler.inv_scale()));
      d = strata::decide_step(acc, max_norm);
    }
    if (d.skip) {
      scaler.update(true);
      return false;
    }
    strata::rule_constants<R> k(o, rates, steps + 1, scaler.inv_scale(), d.clip);
    const strata::state_view v = view();
    k.for_each_piece(0, p.size(), [&](std::size_t off, std::size_t len, const typename R::step_params& kk) {
      R::template update_cpu<G, H>(v, off, len, g.data() + off, out.empty() ? nullptr : out.data() + off, kk, nullptr);
    });
    sync();
    ++steps;
    if (tracks) scaler.update(false);
    return true;
  }
};

// Asserts the optimizer's master weights and every state array equal the reference's.
template <class Opt, class R>
void require_same(Opt& opt, flat_rule_reference<R>& ref) {
  const std::size_t n = ref.p.size();
  std::vector<float> got(n);
  opt.read_master(got);
  INFO("first master difference at " << first_difference(got, ref.p));
  REQUIRE(same_bits(got, ref.p));
  for (std::size_t a = 0; a < ref.f.count; ++a) {
    opt.read_state(ref.f.arrays[a].name, got);
    const auto want = ref.array(a);
    INFO("array " << ref.f.arrays[a].name << ": first difference at " << first_difference(got, want));
    REQUIRE(same_bits(got, want));
  }
  REQUIRE(opt.step_count() == static_cast<std::uint64_t>(ref.steps));
}

// A subgroup size near `wanted` that rule R's state takes (a multiple of its quantization block).
template <class R>
std::size_t subgroup_for(const typename R::options_type& opts, std::size_t wanted) {
  const std::size_t block = R::format(opts).block();
  return block == 0 ? wanted : (wanted + block - 1) / block * block;
}

strata::host_tier_options host_opts(std::string name) { return strata::host_tier_options{.name = std::move(name)}; }

strata::offload_options small_options(std::size_t subgroup, std::size_t cache_subgroups, const strata::state_format& f) {
  strata::offload_options o;
  o.subgroup_elems = subgroup;
  o.host_cache_bytes = cache_subgroups * strata::host_budget::footprint(f.state_bytes(subgroup) + 4 * subgroup);
  o.prefetch_depth = 2;
  o.write_behind_depth = 2;
  o.threads = 2;
  return o;
}

// Gradients with a lone inf at `inf_at` (none when past the end).
template <class G>
std::vector<G> grads_with_inf(std::size_t n, std::uint64_t seed, std::size_t inf_at) {
  auto g = random_grads<G>(n, seed);
  if (inf_at < n) g[inf_at] = G(std::numeric_limits<float>::infinity());
  return g;
}

template <class T>
std::string name_of() {
  if constexpr (std::is_same_v<T, float>) return "float";
  if constexpr (std::is_same_v<T, strata::bf16>) return "bf16";
  return "fp16";
}

// One randomized configuration through the engine, against the flat reference.
template <class R, class G, class H>
void run_random_config(std::uint64_t seed, const typename R::options_type& opts) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
  };
  // (a block-quantized state: subgroups and range cuts at multiples of its block)
  const std::size_t unit = std::max<std::size_t>(1, R::format(opts).block());
  const std::size_t n = pick(1, 4000);
  const std::size_t sg = unit * pick(1, std::max<std::size_t>(1, n / unit / pick(1, 6)));
  const std::size_t subgroups = (n + sg - 1) / sg;
  const std::size_t cache = pick(0, subgroups);
  const bool accept = pick(0, 1) == 1;
  const bool on_tier = accept && pick(0, 2) == 0;
  const bool ranges = pick(0, 1) == 1 && n > unit;
  const bool clip = pick(0, 1) == 1;
  const bool scaling = pick(0, 2) == 0;
  const bool want_copy = !std::is_same_v<H, float> || pick(0, 1) == 1;
  auto off = small_options(sg, cache, R::format(opts));
  off.threads = pick(1, 2);
  if (on_tier) off.gradients = strata::gradient_residency::tier;
  if (clip) off.max_grad_norm = 0.05;
  if (scaling) {
    off.loss_scaling.enabled = true;
    off.loss_scaling.init_scale = 1024;
    off.loss_scaling.growth_interval = 2;
  }
  CAPTURE(seed);
  CAPTURE(n);
  CAPTURE(sg);
  CAPTURE(cache);
  CAPTURE(accept);
  CAPTURE(on_tier);
  CAPTURE(ranges);
  CAPTURE(clip);
  CAPTURE(scaling);
  CAPTURE(name_of<G>());
  CAPTURE(name_of<H>());
  CAPTURE(want_copy);

  const auto init = random_params(n, seed);
  std::vector<strata::any_tier> paths;
  for (std::size_t i = 0; i < pick(1, 2); ++i)
    paths.push_back(strata::any_tier::make<strata::host_tier>(strata::host_tier_options{
        .name = fmt::format("host{}", i), .read_bandwidth = 1e9 * double(i + 1), .write_bandwidth = 1e9}));
  strata::dynamic_multipath<strata::bandwidth_proportional> tier(strata::bandwidth_proportional{}, std::move(paths));
  strata::offloaded_optimizer<R, decltype(tier), strata::sweep_aware, strata::alternating> opt(tier, init, opts, off);
  flat_rule_reference<R> ref(init, opts, off);
  std::vector<H> got_copy(want_copy ? n : 0), want(want_copy ? n : 0);
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    // step 2 of a scaled run carries an inf: the step is skipped and the scale backs off
    const auto g = grads_with_inf<G>(n, seed * 10 + step, scaling && step == 2 ? pick(0, n - 1) : n);
    strata::step_rates rates(1e-3 * (step + 1));
    if (ranges) {
      const std::size_t cut = unit * pick(1, (n - 1) / unit);
      rates = strata::step_rates({{0, cut, 2e-3, 0.0}, {cut, n - cut, 5e-4 * (step + 1), 0.05}});
    }
    ref.template step<G, H>(std::span<const G>(g), rates, std::span<H>(want));
    if (accept) {
      // in two ranges that cross a subgroup boundary
      // (with gradients on the tier and the norm tracked, pieces cover whole blocks: cut at a subgroup)
      const std::size_t mid = on_tier && (clip || scaling) ? std::min(n, pick(0, subgroups) * sg) : pick(0, n);
      if (mid > 0) opt.accept_gradients_at(0, std::span<const G>(g).first(mid));
      if (mid < n) opt.accept_gradients_at(mid, std::span<const G>(g).subspan(mid));
      opt.step(rates, std::span<H>(got_copy));
    } else {
      opt.step(std::span<const G>(g), rates, std::span<H>(got_copy));
    }
    require_same(opt, ref);
    if (want_copy) {
      INFO("first model copy difference");
      REQUIRE(std::memcmp(got_copy.data(), want.data(), n * sizeof(H)) == 0);
    }
    CHECK(opt.loss_scale() == ref.scaler.scale());
  }
}

// --- the suite --------------------------------------------------------------------------------

TEST_CASE_TEMPLATE_DEFINE("an offloaded rule equals its kernel over one flat array, bit for bit", F, rule_flat_identity) {
  using R = typename F::rule;
  std::uint64_t seed = 1;
  for (const auto& opts : F::variants()) {
    for (int i = 0; i < 4; ++i, ++seed) {
      run_random_config<R, float, strata::bf16>(seed * 7919, opts);
      run_random_config<R, strata::bf16, strata::bf16>(seed * 7919 + 1, opts);
      run_random_config<R, strata::fp16, float>(seed * 7919 + 2, opts);
      run_random_config<R, float, float>(seed * 7919 + 3, opts);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("an offloaded rule's device path on the host executor gives the host path's bits", F,
                          rule_device_identity) {
  using R = typename F::rule;
  const std::size_t n = 3001;
  for (const auto& opts : F::variants()) {
    const std::size_t sg = subgroup_for<R>(opts, 400);
    const auto init = random_params(n, 21);
    auto off = small_options(sg, 2, R::format(opts));
    off.device_depth = 2;
    strata::host_tier tier(host_opts("d"));
    strata::host_executor<> exec;
    strata::offloaded_optimizer<R, strata::host_tier, strata::lru, strata::alternating, strata::host_executor<>,
                                strata::alternating_site>
        opt(tier, exec, init, opts, off);
    flat_rule_reference<R> ref(init, opts, off);
    std::vector<strata::bf16> got(n), want(n);
    std::uint64_t device_updates = 0;
    for (int step = 0; step < 3; ++step) {
      const auto g = random_grads<strata::bf16>(n, 30 + step);
      ref.template step<strata::bf16, strata::bf16>(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(want));
      device_updates += opt.step(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(got)).device_updates;
      require_same(opt, ref);
      REQUIRE(std::memcmp(got.data(), want.data(), n * sizeof(strata::bf16)) == 0);
    }
    CHECK(device_updates > 0);  // the device path really ran
  }
}

TEST_CASE_TEMPLATE_DEFINE("an offloaded rule resumes from its checkpoint bit-identically; another rule refuses it", F,
                          rule_checkpoint) {
  using R = typename F::rule;
  using Other = typename F::other;
  const auto opts = F::variants().back();
  const std::size_t n = 2500, sg = subgroup_for<R>(opts, 300);
  const auto init = random_params(n, 41);
  const auto off = small_options(sg, 2, R::format(opts));
  temp_dir dir(fs::temp_directory_path(), "rule-ckpt");
  flat_rule_reference<R> ref(init, opts, off);
  {
    strata::host_tier tier(host_opts("before"));
    strata::offloaded_optimizer<R, strata::host_tier> opt(tier, init, opts, off);
    for (int step = 0; step < 2; ++step) {
      const auto g = random_grads<float>(n, 50 + step);
      opt.step(std::span<const float>(g), 1e-3);
      ref.template step<float, strata::bf16>(std::span<const float>(g), 1e-3, {});
    }
    opt.save(dir.path() / "ck");
  }
  const auto m = strata::read_checkpoint_manifest(dir.path() / "ck");
  CHECK(m.rule == R::tag);
  CHECK(m.state == strata::describe(R::format(opts)));
  CHECK(m.step == 2);

  // into another layout: one path, another subgroup cache, other threads
  auto off2 = small_options(sg, 0, R::format(opts));
  off2.threads = 1;
  strata::host_tier tier2(host_opts("after"));
  auto opt = strata::offloaded_optimizer<R, strata::host_tier>::load(dir.path() / "ck", tier2, off2);
  CHECK(strata::describe(R::format(opt.options())) == m.state);
  require_same(opt, ref);
  const auto g = random_grads<float>(n, 60);
  opt.step(std::span<const float>(g), 1e-3);
  ref.template step<float, strata::bf16>(std::span<const float>(g), 1e-3, {});
  require_same(opt, ref);

  strata::host_tier tier3(host_opts("other"));
  std::string message;
  try {
    (void)strata::offloaded_optimizer<Other, strata::host_tier>::load(dir.path() / "ck", tier3);
  } catch (const strata::config_error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(std::string(R::tag)) != std::string::npos);
  CHECK(message.find(std::string(Other::tag)) != std::string::npos);
  CHECK(tier3.used() == 0);  // refused before anything was written
}

TEST_CASE_TEMPLATE_DEFINE("an offloaded rule's step that a tier fault stops is retried bit-identically", F,
                          rule_fault_retry) {
  using R = typename F::rule;
  const auto opts = F::variants().back();
  const std::size_t n = 2000, sg = subgroup_for<R>(opts, 300);  // 7 subgroups (8-bit: 4)
  const auto init = random_params(n, 71);
  std::size_t failed_steps[2] = {0, 0};  // without, with prefetch_next_step
  for (const auto op : {strata::fault_op::read, strata::fault_op::write})
    for (const std::uint64_t after : {0, 3})
      for (const std::size_t cache : {0, 2})
        for (const bool overlap : {false, true}) {  // prefetch_next_step and return_before_writes
          CAPTURE(static_cast<int>(op));
          CAPTURE(after);
          CAPTURE(cache);
          CAPTURE(overlap);
          auto off = small_options(sg, cache, R::format(opts));
          off.prefetch_next_step = off.return_before_writes = overlap;
          strata::faulty<strata::host_tier> tier(host_opts("flaky"));
          strata::offloaded_optimizer<R, strata::faulty<strata::host_tier>, strata::sweep_aware, strata::alternating> opt(
              tier, init, opts, off);
          flat_rule_reference<R> ref(init, opts, off);
          const auto g0 = random_grads<strata::fp16>(n, 80);
          opt.step(std::span<const strata::fp16>(g0), 1e-3);
          ref.template step<strata::fp16, strata::bf16>(std::span<const strata::fp16>(g0), 1e-3, {});
          const auto g1 = random_grads<strata::fp16>(n, 81);
          tier.inject({.kind = strata::fault_kind::eio, .op = op, .object = {}, .after = after, .times = 1});
          bool failed = false;
          try {
            opt.step(std::span<const strata::fp16>(g1), 2e-3);
          } catch (const strata::io_error& e) {
            failed = true;
            CHECK(std::string(e.what()).find("injected") != std::string::npos);
            CHECK(opt.step_count() == 1);
            opt.step(std::span<const strata::fp16>(g1), 2e-3);  // the retry
          }
          // A write left in flight as the step returned fails at the next call: here, retried.
          if (!failed && overlap) {
            try {
              opt.flush();
            } catch (const strata::io_error&) {
              failed = true;
              opt.flush();
            }
          }
          // A fault on a read started for the next step as this one returned is forgotten.
          if (overlap && op == strata::fault_op::read)
            CHECK((!failed || tier.fired() > 0));
          else
            CHECK(failed == (tier.fired() > 0));
          failed_steps[overlap ? 1 : 0] += failed ? 1 : 0;
          tier.clear();
          ref.template step<strata::fp16, strata::bf16>(std::span<const strata::fp16>(g1), 2e-3, {});
          require_same(opt, ref);
        }
  // Most cases really fail mid-step or at the next call (of 8 each; with overlap the first reads
  // of the step were started before the fault was armed, so a few read faults land after the
  // step's own reads).
  CHECK(failed_steps[0] >= 4);
  CHECK(failed_steps[1] >= 3);
}

TEST_CASE_TEMPLATE_DEFINE("an offloaded rule reads back each array of its state format by name", F, rule_read_state) {
  using R = typename F::rule;
  const std::size_t n = 700;
  for (const auto& opts : F::variants()) {
    const auto init = random_params(n, 91);
    const auto off = small_options(256, 1, R::format(opts));
    strata::host_tier tier(host_opts("r"));
    strata::offloaded_optimizer<R, strata::host_tier> opt(tier, init, opts, off);
    CHECK(opt.layout().state_bytes_per_param() == R::format(opts).mean_bytes_per_param());
    CHECK(opt.layout().state_bytes(0) == R::format(opts).state_bytes(256));
    CHECK(opt.layout().total_state_bytes() == R::format(opts).state_bytes(256) * 2 + R::format(opts).state_bytes(188));
    std::vector<float> out(n, 1.0f);
    const strata::state_format f = R::format(opts);
    for (const auto& a : f.items()) {
      opt.read_state(a.name, out);
      CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));  // zeros before any step
    }
    CHECK_THROWS_AS(opt.read_state("no_such_array", out), strata::config_error);
  }
}

TEST_CASE_TEMPLATE_DEFINE("an offloaded rule started from existing state continues that run bit for bit", F,
                          rule_from_state) {
  using R = typename F::rule;
  const std::size_t n = 1500, sg = 256;
  for (const auto& opts : F::variants()) {
    const auto init = random_params(n, 101);
    const auto off = small_options(sg, 1, R::format(opts));
    flat_rule_reference<R> ref(init, opts, off);
    for (int step = 0; step < 2; ++step) {
      const auto g = random_grads<float>(n, 110 + step);
      ref.template step<float, strata::bf16>(std::span<const float>(g), 1e-3, {});
    }
    // the reference's state as another run would hand it over: each array by name, as fp32
    std::vector<std::vector<float>> values;
    std::vector<strata::named_array> arrays;
    for (std::size_t a = 0; a < ref.f.count; ++a) values.push_back(ref.array(a));
    for (std::size_t a = 0; a < ref.f.count; ++a) arrays.push_back({ref.f.arrays[a].name, values[a]});
    const strata::rule_state_view state{arrays, 2};
    strata::host_tier tier(host_opts("from-state"));
    auto opt = strata::offloaded_optimizer<R, strata::host_tier>::from_state(tier, ref.p, state, opts, off);
    require_same(opt, ref);
    for (int step = 2; step < 4; ++step) {
      const auto g = random_grads<float>(n, 110 + step);
      opt.step(std::span<const float>(g), 1e-3);
      ref.template step<float, strata::bf16>(std::span<const float>(g), 1e-3, {});
      require_same(opt, ref);
    }

    // bad state is refused, naming the array, before anything is written
    strata::host_tier empty(host_opts("refused"));
    const strata::named_array unknown[] = {{"no_such_array", values.empty() ? init : values[0]}};
    using opt_t = strata::offloaded_optimizer<R, strata::host_tier>;
    const auto from_unknown = [&] { (void)opt_t::from_state(empty, init, strata::rule_state_view{unknown, 1}, opts, off); };
    CHECK_THROWS_AS(from_unknown(), strata::config_error);
    for (std::size_t a = 0; a < ref.f.count; ++a) {
      if (!ref.f.arrays[a].non_negative) continue;
      std::vector<float> negative = values[a];
      negative[7] = -1.0f;
      const strata::named_array bad[] = {{ref.f.arrays[a].name, negative}};
      std::string message;
      try {
        (void)opt_t::from_state(empty, init, strata::rule_state_view{bad, 1}, opts, off);
      } catch (const strata::config_error& e) {
        message = e.what();
      }
      CHECK(message.find(std::string(ref.f.arrays[a].name) + "[7]") != std::string::npos);
    }
    CHECK(empty.used() == 0);
  }
}

// doc-snippet: invoke
using every_rule = std::tuple<adamw_fixture, adamw_bf16_fixture, adamw_8bit_fixture, sgd_fixture, lion_fixture>;
// doc-snippet-end
TEST_CASE_TEMPLATE_APPLY(rule_flat_identity, every_rule);
TEST_CASE_TEMPLATE_APPLY(rule_device_identity, every_rule);
TEST_CASE_TEMPLATE_APPLY(rule_checkpoint, every_rule);
TEST_CASE_TEMPLATE_APPLY(rule_fault_retry, every_rule);
TEST_CASE_TEMPLATE_APPLY(rule_read_state, every_rule);
TEST_CASE_TEMPLATE_APPLY(rule_from_state, every_rule);

TEST_CASE("a version 3 AdamW manifest (before rules were recorded) is read as AdamW's") {
  strata::checkpoint_manifest m;
  m.step = 3;
  m.params = 10;
  m.subgroup_elems = 4;
  m.data_file = "state-3-0.bin";
  m.data_bytes = 10 * 12;
  m.subgroup_bytes = {48, 48, 24};
  m.checksums = {1, 2, 3};
  // A version 3 manifest as the engine wrote it before it was generic over rules.
  std::string body = "strata-offloaded-adamw-checkpoint 3\nstep 3\nparams 10\nsubgroup_elems 4\nsections 3\n";
  body += "lr 0x1.0624dd2f1a9fcp-10\nbeta1 0x1.ccccccccccccdp-1\nbeta2 0x1.ff7ced916872bp-1\neps 0x1.5798ee2308c3ap-27\n";
  body += "weight_decay 0x1.47ae147ae147bp-7\ndecoupled 1\namsgrad 0\nmaximize 0\n";
  body += "loss_scaling 0\nloss_scale 0x1p+0\ngrowth_tracker 0\nstep_runs 1\nrun 0 3\n";
  body += "data state-3-0.bin\ndata_bytes 120\nsg 0 48 0x1\nsg 1 48 0x2\nsg 2 24 0x3\n";
  body += fmt::format("checksum {:#018x}\n", strata::checksum64(std::as_bytes(std::span(body.data(), body.size()))));
  const auto parsed = strata::checkpoint_manifest::parse(body, "v3");
  CHECK(parsed.rule == "adamw");
  CHECK(parsed.state == "exp_avg:f32,exp_avg_sq:f32");
  const auto o = strata::adamw_rule::load_options(parsed.options);
  CHECK(o.lr == 1e-3);
  CHECK(o.decay() == 1e-2);
  // written again, it is a version 4 manifest that reads back the same
  const auto again = strata::checkpoint_manifest::parse(parsed.to_text(), "v4");
  CHECK(again.rule == parsed.rule);
  CHECK(again.state == parsed.state);
  CHECK(again.options == parsed.options);
  CHECK(again.step_runs.size() == 1);
}

TEST_CASE("a manifest whose state format does not add up, or names an unknown element, is refused") {
  strata::checkpoint_manifest m;
  m.rule = "sgd";
  m.state = "momentum_buffer:f32";
  m.options = strata::sgd_rule::save_options(strata::sgd_options{.momentum = 0.9});
  m.step = 1;
  m.params = 4;
  m.subgroup_elems = 4;
  m.data_file = "state-1-0.bin";
  m.data_bytes = 4 * 8;
  m.subgroup_bytes = {32};
  m.checksums = {7};
  const auto ok = strata::checkpoint_manifest::parse(m.to_text(), "ok");
  CHECK(ok.bytes_per_param() == 8);
  auto bad = m;
  bad.state = "momentum_buffer:f64";
  CHECK_THROWS_AS((void)strata::checkpoint_manifest::parse(bad.to_text(), "bad"), strata::integrity_error);
  bad.state = "momentum_buffer:f32,exp_avg:f32";  // 12 bytes a parameter: the data size no longer adds up
  CHECK_THROWS_AS((void)strata::checkpoint_manifest::parse(bad.to_text(), "bad"), strata::integrity_error);
  bad = m;
  bad.state.clear();  // no arrays: written as "-", read back as none
  bad.data_bytes = 16;
  bad.subgroup_bytes = {16};
  CHECK(strata::checkpoint_manifest::parse(bad.to_text(), "none").state.empty());
}

}  // namespace

}  // namespace rule_engine_test

namespace rule_engine_test {

TEST_CASE("an 8-bit AdamW step whose parts share a quantization block is refused before it changes anything") {
  using R = strata::adamw_8bit_rule;
  using tensor = strata::param_tensor<float, float>;
  const std::size_t n = 1024;
  const strata::adamw_options o;
  const auto init = random_params(n, 5);
  strata::host_tier tier(host_opts("q8"));
  strata::offloaded_optimizer<R, strata::host_tier> opt(tier, init, o, small_options(512, 0, R::format(o)));
  const auto g = random_grads<float>(n, 6);
  std::vector<float> model(init);
  const std::span<const float> gs(g);
  const std::span<float> ms(model);
  const auto unchanged = [&] {
    std::vector<float> master(n);
    opt.read_master(master);
    CHECK(same_bits(master, init));
    CHECK(opt.step_count() == 0);
  };

  // two tensors in block 0, with or without gradients on the first
  for (const bool first_has_grads : {true, false}) {
    const std::vector<tensor> shared = {{0, 100, first_has_grads ? gs.first(100) : std::span<const float>(), ms.first(100)},
                                        {100, 500, gs.subspan(100, 500), ms.subspan(100, 500)}};
    const auto message = message_of<strata::config_error>([&] { opt.step(std::span<const tensor>(shared), 1e-3); });
    INFO(message);
    CHECK(message.find("share a quantization block") != std::string::npos);
    CHECK(message.find("[0, 100) and [100, 512)") != std::string::npos);
    unchanged();
  }
  // ranges of rates that cut a block
  const auto cut = message_of<strata::config_error>(
      [&] { opt.step(gs, strata::step_rates({{0, 300, 1e-3, 0.0}, {300, n - 300, 1e-3, 0.1}})); });
  CHECK(cut.find("share a quantization block") != std::string::npos);
  unchanged();

  // tensors from multiples of 256 with padding (no tensor) between them: each block updated once,
  // as one flat kernel call per tensor does it; the padding's state stays zero
  const std::vector<tensor> aligned = {{0, 100, gs.first(100), ms.first(100)},
                                       {256, 300, gs.subspan(256, 300), ms.subspan(256, 300)},
                                       {768, 256, {}, ms.subspan(768, 256)}};
  opt.step(std::span<const tensor>(aligned), 1e-3);
  const auto f = R::format(o);
  std::vector<std::byte> slot(f.state_bytes(n));
  const auto v = strata::state_view::of(slot.data(), f, n);
  std::memcpy(v.master, init.data(), n * sizeof(float));
  for (std::size_t a = 0; a < f.count; ++a) strata::write_state_array(v, f, a, {});
  const auto k = R::make_step_params(o, strata::rule_step{1, 1e-3, o.decay(), 1, 1});
  std::vector<float> want_model(init);
  R::update_cpu<float, float>(v, 0, 100, g.data(), want_model.data(), k, nullptr);
  R::update_cpu<float, float>(v, 256, 300, g.data() + 256, want_model.data() + 256, k, nullptr);
  std::vector<float> got(n), want(n);
  opt.read_master(got);
  CHECK(same_bits(got, std::vector<float>(v.master, v.master + n)));
  CHECK(same_bits(model, want_model));
  for (std::size_t a = 0; a < f.count; ++a) {
    opt.read_state(f.arrays[a].name, got);
    strata::read_state_array(v, f, a, want);
    CHECK(same_bits(got, want));
    for (std::size_t i = 100; i < 256; ++i) REQUIRE(got[i] == 0.0f);
  }
}

TEST_CASE("an 8-bit AdamW state needs subgroups of whole quantization blocks") {
  const strata::adamw_options o;
  const auto f = strata::adamw_8bit_rule::format(o);
  const auto message = message_of<strata::config_error>([&] { (void)strata::offload_layout::of_format(1000, f, small_options(300, 0, f)); });
  CHECK(message.find("subgroup_elems 300 is not a multiple of the 256") != std::string::npos);
  CHECK_NOTHROW((void)strata::offload_layout::of_format(1000, f, small_options(512, 0, f)));
}

}  // namespace rule_engine_test
