// Updates as gradients land: after begin_step, each subgroup whose gradients are all in is read
// and updated while the caller goes on handing gradients over, and the step trains bit-identically
// to step() after backward: every gradient and model type, caches, landing orders, per-range
// rates, clipping and loss scaling (updated speculatively on copies as they land, adopted by
// step() when it neither clips nor skips), skipped steps, tier
// faults during backward, calls that end the early updates part-way, destruction mid-backward;
// the update order follows the landing order and the cache still saves its reads.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace early_update_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;
using tier_t = strata::faulty<strata::host_tier>;
using opt_t = strata::offloaded_adamw<tier_t, strata::sweep_aware, strata::alternating>;

strata::offload_options options_of(std::size_t subgroup, std::size_t cache_subgroups, bool early) {
  strata::offload_options o;
  o.subgroup_elems = subgroup;
  o.host_cache_bytes = cache_subgroups * strata::host_budget::footprint(subgroup * 12);
  o.prefetch_depth = 2;
  o.write_behind_depth = 2;
  o.threads = 2;
  o.update_as_gradients_land = early;
  return o;
}

strata::host_tier_options host_opts(std::string name) {
  return strata::host_tier_options{.name = std::move(name), .read_bandwidth = 0, .write_bandwidth = 0};
}

/// Slow reads and writes, so that the early updates are still running when the hand-over goes on.
void slow_down(tier_t& t, int ms) {
  for (const auto op : {strata::fault_op::read, strata::fault_op::write})
    t.inject({.kind = strata::fault_kind::delay, .op = op, .object = {}, .after = 0, .times = 0, .probability = 1.0,
              .delay = std::chrono::milliseconds(ms)});
}

/// Counts (as the tier's fired()) the next write of `object`: issued only once its update committed.
void write_seen(tier_t& t, const std::string& object) {
  t.inject({.kind = strata::fault_kind::delay, .op = strata::fault_op::write, .object = object, .after = 0, .times = 1,
            .probability = 1.0, .delay = std::chrono::milliseconds(1)});
}
/// Waits for that write (a deadline for liveness only: on any machine it comes well before).
bool wait_for_write(const tier_t& t) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (t.fired() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return t.fired() > 0;
}

template <class Opt>
bool same_state(Opt& a, Opt& b, std::size_t n) {
  std::vector<float> pa(n), pb(n), ma(n), mb(n), va(n), vb(n);
  a.read_master(pa);
  b.read_master(pb);
  a.read_moments(ma, va);
  b.read_moments(mb, vb);
  INFO("first master difference at " << first_difference(pa, pb));
  return same_bits(pa, pb) && same_bits(ma, mb) && same_bits(va, vb) && a.step_count() == b.step_count();
}

/// The pieces backward hands over, in landing order: whole subgroups in `order`, or ranges
/// that cut across subgroups (a framework's tensors), in reverse.
std::vector<std::pair<std::size_t, std::size_t>> landing_pieces(std::size_t n, std::size_t sg, std::mt19937_64& rng,
                                                                int how) {
  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  if (how == 2) {  // tensors of seeded sizes, last first
    std::size_t at = 0;
    while (at < n) {
      const std::size_t len = std::min(n - at, std::uniform_int_distribution<std::size_t>(1, sg * 2)(rng));
      pieces.emplace_back(at, len);
      at += len;
    }
    std::reverse(pieces.begin(), pieces.end());
    return pieces;
  }
  const std::size_t subgroups = (n + sg - 1) / sg;
  std::vector<std::size_t> order(subgroups);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (how == 0)
    std::reverse(order.begin(), order.end());  // as backward: the last layers first
  else
    std::shuffle(order.begin(), order.end(), rng);
  for (const std::size_t s : order) pieces.emplace_back(s * sg, std::min(sg, n - s * sg));
  return pieces;
}

}  // namespace

TEST_CASE_TEMPLATE("updates as gradients land train bit-identically to the step after backward: caches, landing "
                   "orders, per-range rates, model copies, clipping, loss scaling, skipped steps and speculative "
                   "updates adopted or dropped",
                   G, float, strata::bf16, strata::fp16) {
  const std::size_t n = 5000, sg = 400;  // 13 subgroups
  const auto init = random_params(n, 71);
  std::size_t speculative_total = 0, speculable_steps = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed * 977);
    const std::size_t cache = std::uniform_int_distribution<std::size_t>(0, 13)(rng);
    const bool model_out = (seed & 1) != 0;
    const bool ranges = (seed & 2) != 0;
    // none, clipping that triggers, loss scaling (one step skipped), clipping that never triggers
    const int tracking = static_cast<int>((seed - 1) / 3);
    CAPTURE(cache);
    CAPTURE(model_out);
    CAPTURE(ranges);
    CAPTURE(tracking);
    strata::adamw_options ao;
    ao.weight_decay = 0.01;
    ao.amsgrad = seed == 5;
    auto oa = options_of(sg, cache, true), ob = options_of(sg, cache, false);
    for (auto* o : {&oa, &ob}) {
      if (tracking == 1) o->max_grad_norm = 0.05;
      if (tracking == 3) o->max_grad_norm = 1e30;
      if (tracking == 2) {
        o->loss_scaling.enabled = true;
        o->loss_scaling.init_scale = 512;
        o->loss_scaling.growth_interval = 2;
      }
    }
    tier_t ta(host_opts("a")), tb(host_opts("b"));
    slow_down(ta, 1);
    opt_t a(ta, init, ao, oa), b(tb, init, ao, ob);
    std::vector<strata::bf16> ma(model_out ? n : 0), mb(model_out ? n : 0);
    std::size_t early = 0;
    for (int t = 0; t < 5; ++t) {
      CAPTURE(t);
      REQUIRE(a.loss_scale() == b.loss_scale());
      auto raw = random_grads<float>(n, seed * 100 + static_cast<std::uint64_t>(t));
      if (tracking == 2 && t == 2) raw[1234] = std::numeric_limits<float>::infinity();  // skipped
      std::vector<G> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = G(raw[i] * a.loss_scale());
      const strata::step_rates rates =
          ranges ? strata::step_rates({{0, 2100, 1e-3 * (t + 1), 0.0}, {2100, n - 2100, 2e-3, 0.02}})
                 : strata::step_rates(1e-3 * (t + 1));
      a.begin_step(rates, std::span<strata::bf16>(ma));
      for (const auto& [first, len] : landing_pieces(n, sg, rng, t % 3)) {
        a.accept_gradients_at(first, std::span<const G>(g).subspan(first, len));
        b.accept_gradients_at(first, std::span<const G>(g).subspan(first, len));
      }
      const auto sa = a.step(rates, std::span<strata::bf16>(ma));
      const auto sb = b.step(rates, std::span<strata::bf16>(mb));
      CHECK(sa.skipped == sb.skipped);
      CHECK(sa.subgroups == sb.subgroups);
      CHECK(sa.early_updates <= sa.subgroups);
      if (tracking != 0) CHECK(sa.early_updates == 0);  // (the update needs the norm of every gradient)
      // Speculative updates (made on copies during backward) are adopted only when the step
      // neither clips nor skips; then they are the step's, bit for bit (checked below).
      CHECK(sa.speculative_updates <= sa.subgroups);
      if (tracking == 0 || tracking == 1 || sa.skipped) CHECK(sa.speculative_updates == 0);
      if (tracking == 2 && t == 3) CHECK(sa.speculative_updates == 0);  // (none after a skipped step)
      if (tracking >= 2 && !sa.skipped) {
        ++speculable_steps;
        speculative_total += sa.speculative_updates;
      }
      CHECK(sb.speculative_updates == 0);
      // Every subgroup landed before step(): the early pass updated each (after the reads that
      // the last step left running between the steps ended).
      if (tracking == 0) CHECK(sa.early_updates == sa.subgroups);
      CHECK(sb.early_updates == 0);
      early += sa.early_updates;
      REQUIRE(same_state(a, b, n));
      if (model_out) CHECK(std::memcmp(ma.data(), mb.data(), n * sizeof(strata::bf16)) == 0);
    }
    a.flush();
    b.flush();
    REQUIRE(same_state(a, b, n));
    if (tracking == 0) CHECK(early == 5 * 13);
  }
  // (how many depends on the free slots: a speculative result holds one until step())
  CHECK(speculable_steps == 5 * 3 + 4 * 3);
  CHECK(speculative_total > 0);
}

TEST_CASE("an early update commits before step() is called: the model copy of a landed subgroup changes while "
          "backward goes on") {
  const std::size_t n = 3000, sg = 500;  // 6 subgroups, none cached
  const auto init = random_params(n, 72);
  tier_t tier(host_opts("t"));
  opt_t opt(tier, init, {}, options_of(sg, 0, true));
  std::vector<float> model(init);
  const auto g = random_grads<float>(n, 73);
  opt.begin_step(1e-3, std::span<float>(model));
  const std::size_t last = opt.subgroup_count() - 1;
  // The write of the last subgroup's state is issued only after its update committed (and wrote
  // its weights into the model copy): the tier's count of it, an atomic, says when.
  write_seen(tier, opt.object_name(last));
  opt.accept_gradients(last, std::span<const float>(g).subspan(opt.begin(last), opt.length(last)));
  // Nothing else is handed over: only the early pass can have updated the last subgroup.
  REQUIRE(wait_for_write(tier));
  CHECK(std::memcmp(model.data() + opt.begin(last), init.data() + opt.begin(last), opt.length(last) * 4) != 0);
  CHECK(std::memcmp(model.data(), init.data(), opt.begin(last) * 4) == 0);  // the others wait for their gradients
  for (std::size_t s = last; s-- > 0;) opt.accept_gradients(s, std::span<const float>(g).subspan(opt.begin(s), opt.length(s)));
  const auto st = opt.step(1e-3, std::span<float>(model));
  CHECK(st.early_updates >= 1);
  CHECK(st.subgroups == opt.subgroup_count());
  flat_reference ref(init, {});
  ref.step(std::span<const float>(g), 1e-3);
  require_same_state(opt, ref);
  std::vector<float> master(n);
  opt.read_master(master);
  CHECK(same_bits(master, model));
}

TEST_CASE("a tier fault during the early updates is raised, typed, by step(); the updates before it stay and the "
          "retry is bit-identical") {
  const std::size_t n = 4000, sg = 500;  // 8 subgroups
  const auto init = random_params(n, 74);
  std::size_t failed = 0;
  for (const auto op : {strata::fault_op::read, strata::fault_op::write})
    for (const std::uint64_t after : {0, 2, 5}) {
      CAPTURE(static_cast<int>(op));
      CAPTURE(after);
      tier_t ta(host_opts("a")), tb(host_opts("b"));
      // No reads between the steps: the faults hit the early pass's own I/O (the reads between
      // steps forget a failed read; offload_test covers them).
      auto oa = options_of(sg, 2, true), ob = options_of(sg, 2, false);
      oa.prefetch_next_step = ob.prefetch_next_step = false;
      opt_t a(ta, init, {}, oa), b(tb, init, {}, ob);
      const auto g0 = random_grads<float>(n, 75), g1 = random_grads<float>(n, 76);
      a.step(std::span<const float>(g0));
      b.step(std::span<const float>(g0));
      ta.inject({.kind = strata::fault_kind::eio, .op = op, .object = {}, .after = after, .times = 1});
      a.begin_step(2e-3);
      for (std::size_t s = a.subgroup_count(); s-- > 0;) {
        a.accept_gradients(s, std::span<const float>(g1).subspan(a.begin(s), a.length(s)));
        b.accept_gradients(s, std::span<const float>(g1).subspan(b.begin(s), b.length(s)));
      }
      bool threw = false;
      try {
        a.step(2e-3);
      } catch (const strata::io_error& e) {
        threw = true;
        CHECK(std::string(e.what()).find("injected") != std::string::npos);
      }
      if (!threw) {
        try {
          a.flush();  // a write the step left in flight
        } catch (const strata::io_error&) {
          threw = true;
        }
      }
      // Every fault on the step's own I/O fails it (or, for a write it left in flight, the next
      // call); a read the step started for the next one as it returned is forgotten.
      if (op == strata::fault_op::write)
        CHECK(threw == (ta.fired() > 0));
      else
        CHECK((!threw || ta.fired() > 0));
      if (threw) ++failed;
      if (a.step_count() == 1) {  // the step failed part-way: other rates are refused, the same finish it
        CHECK_THROWS_AS(a.step(3e-3), strata::config_error);
        a.step(2e-3);
      }
      b.step(2e-3);
      REQUIRE(same_state(a, b, n));
      a.flush();
      REQUIRE(same_state(a, b, n));
    }
  CHECK(failed >= 4);
}

TEST_CASE("a write the last step left that fails while the next one's reads run between the steps is raised, "
          "typed, by the next step(), also when that step's subgroups update as they land; nothing is lost") {
  const std::size_t n = 4000, sg = 500;  // 8 subgroups, none cached: every one is written
  const auto init = random_params(n, 77);
  for (const bool declared : {false, true}) {
    CAPTURE(declared);
    tier_t ta(host_opts("a")), tb(host_opts("b"));
    opt_t a(ta, init, {}, options_of(sg, 0, true)), b(tb, init, {}, options_of(sg, 0, false));
    REQUIRE(a.offload().return_before_writes);
    REQUIRE(a.offload().prefetch_next_step);
    // Subgroup 7, updated last, is written as step 0 returns: that write fails.
    ta.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = a.object_name(7)});
    const auto g0 = random_grads<float>(n, 78), g1 = random_grads<float>(n, 79);
    a.step(std::span<const float>(g0));
    b.step(std::span<const float>(g0));
    if (declared) a.begin_step(2e-3);
    for (std::size_t s = a.subgroup_count(); s-- > 0;) {
      a.accept_gradients(s, std::span<const float>(g1).subspan(a.begin(s), a.length(s)));
      b.accept_gradients(s, std::span<const float>(g1).subspan(b.begin(s), b.length(s)));
    }
    CHECK_THROWS_AS(a.step(2e-3), strata::io_error);
    CHECK(ta.fired() == 1);
    a.step(2e-3);  // the retry writes subgroup 7's state first, then finishes the step
    b.step(2e-3);
    a.flush();
    b.flush();
    REQUIRE(same_state(a, b, n));
  }
}

TEST_CASE("a call during backward ends the early updates part-way: flush keeps them, save and discard_gradients "
          "refuse, and step() with the declared rates finishes the step bit-identically") {
  const std::size_t n = 4000, sg = 500;
  const auto init = random_params(n, 77);
  tier_t ta(host_opts("a")), tb(host_opts("b"));
  opt_t a(ta, init, {}, options_of(sg, 0, true)), b(tb, init, {}, options_of(sg, 0, false));
  std::vector<float> model_a(init), model_b(init);
  const auto g = random_grads<float>(n, 78);
  a.begin_step(1e-3, std::span<float>(model_a));
  write_seen(ta, a.object_name(7));
  for (std::size_t s = 7; s >= 4; --s) {
    a.accept_gradients(s, std::span<const float>(g).subspan(a.begin(s), a.length(s)));
    b.accept_gradients(s, std::span<const float>(g).subspan(b.begin(s), b.length(s)));
  }
  REQUIRE(wait_for_write(ta));  // subgroup 7's update has committed
  a.flush();  // ends the early pass: what it updated stays, the step is part-way
  CHECK(a.step_count() == 0);
  temp_dir dir(fs::temp_directory_path(), "early-save");
  CHECK_THROWS_AS(a.save(dir.path() / "ck"), strata::config_error);
  CHECK_THROWS_AS(a.discard_gradients(), strata::config_error);
  for (std::size_t s = 4; s-- > 0;) {
    a.accept_gradients(s, std::span<const float>(g).subspan(a.begin(s), a.length(s)));
    b.accept_gradients(s, std::span<const float>(g).subspan(b.begin(s), b.length(s)));
  }
  CHECK_THROWS_AS(a.step(2e-3, std::span<float>(model_a)), strata::config_error);  // not the declared rates
  a.step(1e-3, std::span<float>(model_a));
  b.step(1e-3, std::span<float>(model_b));
  REQUIRE(same_state(a, b, n));
  CHECK(same_bits(model_a, model_b));
  a.save(dir.path() / "ck");
}

TEST_CASE("begin_step refuses what it cannot honour: a second declaration, other rates or model copy at step(), a "
          "step with gradients given, a model copy of the wrong size") {
  const std::size_t n = 2000, sg = 500;
  const auto init = random_params(n, 79);
  tier_t tier(host_opts("t"));
  opt_t opt(tier, init, {}, options_of(sg, 1, true));
  std::vector<strata::bf16> model(n), other(n), small(n - 1);
  const auto g = random_grads<float>(n, 80);
  CHECK_THROWS_AS(opt.begin_step(1e-3, std::span<strata::bf16>(small)), strata::config_error);
  opt.begin_step(1e-3, std::span<strata::bf16>(model));
  CHECK_THROWS_AS(opt.begin_step(1e-3, std::span<strata::bf16>(model)), strata::config_error);
  CHECK_THROWS_AS(opt.step(std::span<const float>(g), 1e-3), strata::config_error);
  CHECK_THROWS_AS(opt.restore_loss_scale(2.0f, 0), strata::config_error);
  for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
    opt.accept_gradients(s, std::span<const float>(g).subspan(opt.begin(s), opt.length(s)));
  CHECK(message_of<strata::config_error>([&] { opt.step(2e-3, std::span<strata::bf16>(model)); })
            .find("declared") != std::string::npos);
  CHECK_THROWS_AS(opt.step(1e-3, std::span<strata::bf16>(other)), strata::config_error);
  CHECK(opt.step_count() == 0);
  opt.step(1e-3, std::span<strata::bf16>(model));
  CHECK(opt.step_count() == 1);
  // Gradients handed over before begin_step land with it.
  opt.accept_gradients(0, std::span<const float>(g).subspan(0, opt.length(0)));
  opt.begin_step(1e-3);
  for (std::size_t s = 1; s < opt.subgroup_count(); ++s)
    opt.accept_gradients(s, std::span<const float>(g).subspan(opt.begin(s), opt.length(s)));
  CHECK(opt.step(1e-3).subgroups == opt.subgroup_count());
}

TEST_CASE("an optimizer destroyed during backward, with early updates in flight, stops them and returns") {
  const std::size_t n = 4000, sg = 500;
  const auto init = random_params(n, 81);
  tier_t tier(host_opts("t"));
  slow_down(tier, 2);
  const auto g = random_grads<float>(n, 82);
  {
    opt_t opt(tier, init, {}, options_of(sg, 0, true));
    opt.begin_step(1e-3);
    for (std::size_t s = opt.subgroup_count(); s-- > 4;)
      opt.accept_gradients(s, std::span<const float>(g).subspan(opt.begin(s), opt.length(s)));
  }
  // A later optimizer of the same objects starts over from its own weights.
  opt_t again(tier, init, {}, options_of(sg, 0, true));
  CHECK(again.step_count() == 0);
}

TEST_CASE("the update order follows the landing order, and the cache still saves its reads: with gradients "
          "landing in reverse every step, each step after the first finds the cached subgroups") {
  const std::size_t n = 5000, sg = 500, cache = 3;  // 10 subgroups, 3 cached
  const auto init = random_params(n, 83);
  tier_t tier(host_opts("t"));
  opt_t opt(tier, init, {}, options_of(sg, cache, true));
  const std::uint64_t state_bytes = sg * 12;
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    const auto g = random_grads<float>(n, 84 + static_cast<std::uint64_t>(t));
    opt.begin_step(1e-3);
    for (std::size_t s = opt.subgroup_count(); s-- > 0;)
      opt.accept_gradients(s, std::span<const float>(g).subspan(opt.begin(s), opt.length(s)));
    const auto st = opt.step(1e-3);
    CHECK(st.subgroups == 10);
    if (t == 0) continue;  // the first step's cache is empty
    // A cache of 3 saves 3 reads a step (the most any policy can under one repeating order):
    // every step reads only the others, each once.
    CHECK(st.cache_hits == cache);
    CHECK(st.cache_misses == 10 - cache);
    CHECK(st.bytes_read == (10 - cache) * state_bytes);
  }
}

}  // namespace early_update_test
