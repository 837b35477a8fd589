// Gradient clipping and dynamic loss scaling inside offloaded_adamw::step: bit-identical to
// adamw_step_cpu over the same subgroups with a GradScaler-like scaler, on host and device
// update sites, through every way gradients arrive; skipped steps leave everything as it was;
// retries reuse the first attempt's decision; the scale survives a checkpoint.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <strata/exec/host_executor.hpp>
#include <strata/exec/jittered.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace grad_control_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;

struct config {
  std::uint64_t seed;
  std::size_t params, subgroup, cache;
  bool tier_grads, accept, amsgrad, fp16, model_out, clip, scale;
  std::size_t k_host, k_device;
};

config random_config(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](std::size_t lo, std::size_t hi) { return std::uniform_int_distribution<std::size_t>(lo, hi)(rng); };
  config c{};
  c.seed = seed;
  c.params = pick(1, 9000);
  c.subgroup = pick(std::max<std::size_t>(1, c.params / 6), c.params);
  c.cache = pick(0, (c.params + c.subgroup - 1) / c.subgroup);
  c.tier_grads = pick(0, 2) == 0;
  c.accept = pick(0, 1) == 0;
  c.amsgrad = pick(0, 2) == 0;
  c.fp16 = pick(0, 1) == 0;
  c.model_out = pick(0, 1) == 0;
  const std::size_t mode = pick(0, 2);  // clip only, scale only, both
  c.clip = mode != 1;
  c.scale = mode != 0;
  static constexpr std::size_t splits[][2] = {{1, 0}, {0, 1}, {1, 1}, {2, 1}};
  const auto& sp = splits[pick(0, 3)];
  c.k_host = sp[0];
  c.k_device = sp[1];
  return c;
}

/// Gradients as backward makes them: raw values times the loss scale, rounded to G; with `bad`
/// one of them (at a seeded index) is inf or NaN.
template <class G>
std::vector<G> scaled_grads(std::size_t n, std::uint64_t seed, float scale, bool bad) {
  const auto raw = random_grads<float>(n, seed);
  std::vector<G> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = G(raw[i] * scale);
  if (bad) g[seed % n] = G((seed & 1) != 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN());
  return g;
}

/// Hands over `g` in seeded pieces: any size with host residency, block-aligned with tier
/// residency (the norm is summed per 2048-element block as the pieces go to the tier).
template <class Opt, class G>
void accept_in_pieces(Opt& opt, std::span<const G> g, bool tier, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  if (tier) {
    for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
      for (std::size_t lo = 0; lo < opt.length(s);) {
        const std::size_t hi = std::min(opt.length(s), lo + 2048 * std::uniform_int_distribution<std::size_t>(1, 2)(rng));
        pieces.emplace_back(opt.begin(s) + lo, hi - lo);
        lo = hi;
      }
  } else {
    for (std::size_t lo = 0; lo < g.size();) {
      const std::size_t len = std::min(g.size() - lo, std::uniform_int_distribution<std::size_t>(1, 3000)(rng));
      pieces.emplace_back(lo, len);
      lo += len;
    }
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  for (const auto& [first, len] : pieces) opt.accept_gradients_at(first, g.subspan(first, len));
}

using jittery = strata::jittered<strata::host_stream>;
using exec_type = strata::host_executor<jittery>;
using tier_type = strata::multipath<strata::fixed_ratio, strata::host_tier, strata::host_tier>;
using opt_type = strata::offloaded_adamw<tier_type, strata::sweep_aware, strata::alternating, exec_type,
                                         strata::alternating_site>;

exec_type make_exec(std::uint64_t seed) {
  strata::host_executor_options eo;
  eo.name = "sim";
  return exec_type(eo, [seed](strata::stream_role r, const std::string& name) {
    return std::make_unique<jittery>(strata::jitter_options{.seed = seed * 3 + static_cast<std::uint64_t>(r), .max_delay = std::chrono::microseconds(200)}, name);
  });
}

template <class G>
void run(const config& c) {
  const auto init = random_params(c.params, c.seed);
  strata::adamw_options ao;
  ao.amsgrad = c.amsgrad;
  strata::offload_options off;
  off.subgroup_elems = c.subgroup;
  off.threads = 2;
  off.gradients = c.tier_grads ? strata::gradient_residency::tier : strata::gradient_residency::host;
  off.host_cache_bytes = strata::offload_layout::of(c.params, ao, off).cache_bytes(c.cache);
  // About a third of the raw gradients' norm (0.01 * sqrt(n)): clipping really clips.
  off.max_grad_norm = c.clip ? 0.0035 * std::sqrt(static_cast<double>(c.params)) : 0.0;
  off.loss_scaling.enabled = c.scale;
  off.loss_scaling.init_scale = 4096;
  off.loss_scaling.growth_interval = 2;
  auto exec = make_exec(c.seed);
  tier_type tier(strata::fixed_ratio({2, 1}), strata::host_tier_options{.name = "a"},
                 strata::host_tier_options{.name = "b"});
  opt_type opt(tier, exec, init, ao, off, {}, {}, strata::alternating_site{c.k_host, c.k_device});
  scaled_reference ref(init, ao, c.subgroup, off);
  std::size_t device = 0, skipped = 0;
  for (std::size_t i = 0; i < opt.subgroup_count(); ++i)
    device += strata::alternating_site{c.k_host, c.k_device}.site(i, i, 0) == strata::site_kind::device;
  for (int t = 0; t < 5; ++t) {
    CAPTURE(t);
    const bool bad = t == 2 || t == 3;  // two bad steps in a row: the scale backs off twice
    const auto g = scaled_grads<G>(c.params, c.seed * 10 + static_cast<std::uint64_t>(t), opt.loss_scale(), bad);
    const double lr = 1e-3 * (1 + t);
    std::vector<strata::bf16> out(c.model_out ? c.params : 0, strata::bf16(7.0f)), ref_out(out);
    std::vector<float> before(c.params);
    opt.read_master(before);
    strata::offload_step_stats st;
    if (c.accept) {
      accept_in_pieces(opt, std::span<const G>(g), c.tier_grads, c.seed + static_cast<std::uint64_t>(t));
      st = opt.step(lr, std::span<strata::bf16>(out));
    } else {
      st = opt.step(std::span<const G>(g), lr, std::span<strata::bf16>(out));
    }
    const float scale_used = ref.scaler.scale();
    const auto r = ref.step(std::span<const G>(g), lr, std::span<strata::bf16>(ref_out));
    CHECK(st.skipped == bad);
    CHECK(r.skipped == bad);
    CHECK(st.loss_scale == scale_used);
    REQUIRE(st.grad_norm.has_value());
    CHECK(std::memcmp(&*st.grad_norm, &r.grad_norm, sizeof(double)) == 0);
    CHECK(st.clip == r.clip);
    if (bad) {
      ++skipped;
      CHECK(st.nonfinite_subgroups == std::vector<std::size_t>{(c.seed * 10 + static_cast<std::uint64_t>(t)) % c.params / c.subgroup});
      CHECK(st.subgroups == 0);
      std::vector<float> after(c.params);
      opt.read_master(after);
      CHECK(same_bits(after, before));
      CHECK(out == std::vector<strata::bf16>(out.size(), strata::bf16(7.0f)));  // the model copy is untouched
    } else {
      if (c.clip && t == 0) CHECK(st.clip < 1.0f);
      CHECK(st.device_updates == device);  // the site policy is followed
    }
    CHECK(out == ref_out);
    require_same(opt, ref);
  }
  CHECK(opt.stats().skipped_steps == skipped);
  CHECK(opt.step_count() == 3);
}

}  // namespace

TEST_CASE("clipping and loss scaling are bit-identical to adamw_step_cpu on every site and intake, skips included") {
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    const config c = random_config(seed);
    CAPTURE(seed);
    CAPTURE(c.params);
    CAPTURE(c.subgroup);
    CAPTURE(c.cache);
    CAPTURE(c.tier_grads);
    CAPTURE(c.accept);
    CAPTURE(c.clip);
    CAPTURE(c.scale);
    CAPTURE(c.k_host);
    CAPTURE(c.k_device);
    if (c.fp16)
      run<strata::fp16>(c);
    else
      run<strata::bf16>(c);
  }
}

TEST_CASE("without clipping or loss scaling the gradients are not summed and nothing is skipped") {
  const std::size_t n = 700;
  const auto init = random_params(n, 3);
  strata::adamw_options ao;
  strata::offload_options off;
  off.subgroup_elems = 100;
  strata::host_tier tier(strata::host_tier_options{.name = "h"});
  strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating> opt(tier, init, ao, off);
  auto g = random_grads<strata::bf16>(n, 4);
  const auto st = opt.step(std::span<const strata::bf16>(g));
  CHECK_FALSE(st.grad_norm.has_value());
  CHECK(st.loss_scale == 1.0f);
  CHECK(opt.loss_scale() == 1.0f);
  CHECK(st.clip == 1.0f);
}

TEST_CASE("with gradients on the tier, a piece that cuts a norm block is refused before anything is written") {
  const std::size_t n = 5000;
  const auto init = random_params(n, 8);
  strata::adamw_options ao;
  strata::offload_options off;
  off.subgroup_elems = 5000;
  off.gradients = strata::gradient_residency::tier;
  off.max_grad_norm = 1.0;
  strata::host_tier tier(strata::host_tier_options{.name = "h"});
  strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating> opt(tier, init, ao, off);
  const auto g = random_grads<strata::bf16>(n, 9);
  const auto written = opt.stats().gradient_bytes_written;
  try {
    opt.accept_gradients_at(0, std::span<const strata::bf16>(g).first(1000));
    FAIL("no error");
  } catch (const strata::config_error& e) {
    CHECK(std::string(e.what()).find("2048-element blocks") != std::string::npos);
    CHECK(std::string(e.what()).find("[0, 1000)") != std::string::npos);
  }
  CHECK(opt.stats().gradient_bytes_written == written);
  // Aligned pieces (the last one short) go through, and the step runs on them.
  opt.accept_gradients_at(0, std::span<const strata::bf16>(g).first(4096));
  opt.accept_gradients_at(4096, std::span<const strata::bf16>(g).subspan(4096));
  const auto st = opt.step();
  REQUIRE(st.grad_norm.has_value());
  strata::grad_norm_accumulator acc;
  acc.add(0, strata::grad_stats_cpu(std::span<const strata::bf16>(g)));
  CHECK(*st.grad_norm == acc.norm());
}

TEST_CASE("a step that fails part-way keeps its clip decision and loss scale; the retry is bit-identical") {
  const std::size_t n = 2000, sg = 300;
  const auto init = random_params(n, 5);
  strata::adamw_options ao;
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.threads = 2;
  off.max_grad_norm = 0.1;
  off.loss_scaling.enabled = true;
  off.loss_scaling.init_scale = 256;
  off.loss_scaling.growth_interval = 1;  // every clean step grows: a double update would show
  strata::faulty<strata::host_tier> tier(strata::host_tier_options{.name = "flaky"});
  strata::offloaded_adamw<strata::faulty<strata::host_tier>, strata::lru, strata::alternating> opt(tier, init, ao, off);
  scaled_reference ref(init, ao, sg, off);
  std::vector<strata::bf16> none;
  const auto g0 = scaled_grads<strata::bf16>(n, 50, opt.loss_scale(), false);
  opt.step(std::span<const strata::bf16>(g0));
  ref.step(std::span<const strata::bf16>(g0), ao.lr, std::span<strata::bf16>(none));
  CHECK(opt.loss_scale() == 512.0f);
  const auto g1 = scaled_grads<strata::bf16>(n, 51, opt.loss_scale(), false);
  // Subgroup 0 comes last in this step's (alternating) order: neither the cache, nor the reads
  // started as step 0 returned, nor a write step 0 left in flight holds it; its read fails.
  REQUIRE_FALSE(opt.cached(0));
  tier.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::read, .object = opt.object_name(0), .after = 0,
               .times = 1});
  CHECK_THROWS_AS(opt.step(std::span<const strata::bf16>(g1)), strata::io_error);
  CHECK(tier.fired() == 1);
  CHECK(opt.loss_scale() == 512.0f);  // not updated by a step that did not finish
  tier.clear();
  const auto st = opt.step(std::span<const strata::bf16>(g1));
  CHECK(st.loss_scale == 512.0f);
  const auto r = ref.step(std::span<const strata::bf16>(g1), ao.lr, std::span<strata::bf16>(none));
  CHECK(st.clip == r.clip);
  CHECK(st.clip < 1.0f);
  require_same(opt, ref);
}

TEST_CASE("a checkpoint keeps the loss scale and its growth tracker; a version 1 manifest still loads") {
  const std::size_t n = 1500, sg = 400;
  const auto init = random_params(n, 12);
  strata::adamw_options ao;
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.loss_scaling.enabled = true;
  off.loss_scaling.init_scale = 1024;
  off.loss_scaling.growth_interval = 4;
  temp_dir dir(fs::temp_directory_path(), "scaler-ckpt");
  scaled_reference ref(init, ao, sg, off);
  std::vector<strata::bf16> none;
  using opt_t = strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating>;
  {
    strata::host_tier tier(strata::host_tier_options{.name = "a"});
    opt_t opt(tier, init, ao, off);
    for (int t = 0; t < 4; ++t) {  // bad, clean, clean, clean: scale 512, tracker 3
      const auto g = scaled_grads<strata::bf16>(n, 60 + static_cast<std::uint64_t>(t), opt.loss_scale(), t == 0);
      opt.step(std::span<const strata::bf16>(g));
      ref.step(std::span<const strata::bf16>(g), ao.lr, std::span<strata::bf16>(none));
    }
    CHECK(opt.loss_scale() == 512.0f);
    CHECK(opt.loss_scaler().growth_tracker() == 3);
    opt.save(dir.path());
  }
  strata::host_tier tier2(strata::host_tier_options{.name = "b"});
  auto opt = opt_t::load(dir.path(), tier2, off);
  require_same(opt, ref);
  const auto g = scaled_grads<strata::bf16>(n, 70, opt.loss_scale(), false);
  opt.step(std::span<const strata::bf16>(g));
  ref.step(std::span<const strata::bf16>(g), ao.lr, std::span<strata::bf16>(none));
  CHECK(opt.loss_scale() == 1024.0f);  // the fourth clean step in a row grew it
  require_same(opt, ref);

  // Loading without loss scaling ignores the saved scale.
  strata::host_tier tier3(strata::host_tier_options{.name = "c"});
  auto plain_off = off;
  plain_off.loss_scaling.enabled = false;
  CHECK(opt_t::load(dir.path(), tier3, plain_off).loss_scale() == 1.0f);

  // A version 1 manifest (before loss scaling was saved, and before rules were recorded) parses,
  // with scaling off: its head as version 1 wrote it, then this checkpoint's data lines.
  strata::checkpoint_manifest m = opt_t::load_manifest(dir.path());
  std::string text = m.to_text();
  text = text.substr(0, text.rfind("checksum "));
  const strata::adamw_options saved = strata::adamw_rule::load_options(m.options);
  std::string head = fmt::format("{}\nstep {}\nparams {}\nsubgroup_elems {}\nsections {}\n",
                                 strata::checkpoint_manifest::magic_v1, m.step, m.params, m.subgroup_elems,
                                 saved.amsgrad ? 4 : 3);
  head += fmt::format("lr {:a}\nbeta1 {:a}\nbeta2 {:a}\neps {:a}\nweight_decay {:a}\n", saved.lr, saved.beta1,
                      saved.beta2, saved.eps, saved.decay());
  head += fmt::format("decoupled {}\namsgrad {}\nmaximize {}\n", int(saved.decoupled), int(saved.amsgrad),
                      int(saved.maximize));
  text = head + text.substr(text.find("data "));
  text += fmt::format("checksum {:#018x}\n", strata::checksum64(std::as_bytes(std::span(text.data(), text.size()))));
  const auto v1 = strata::checkpoint_manifest::parse(text, "v1");
  CHECK_FALSE(v1.loss_scaling);
  CHECK(v1.loss_scale == 1.0f);
  CHECK(v1.step == m.step);
  // And a version 2 manifest with a bad scale is refused.
  std::string bad = m.to_text();
  bad = bad.substr(0, bad.rfind("checksum "));
  bad.replace(bad.find("loss_scale 0x"), 13, "loss_scale -0x");
  bad += fmt::format("checksum {:#018x}\n", strata::checksum64(std::as_bytes(std::span(bad.data(), bad.size()))));
  CHECK_THROWS_AS(strata::checkpoint_manifest::parse(bad, "bad"), strata::integrity_error);
}

}  // namespace grad_control_test
