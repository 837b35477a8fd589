// offloaded_adamw: host memory budget, statistics and trace, typed errors at the call, tier
// failures mid-step with bit-identical retries, checkpoints (save/load into another layout,
// corruption and truncation refused).
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace offload_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;

strata::offload_options small_options(std::size_t subgroup, std::size_t cache_subgroups = 0) {
  strata::offload_options o;
  o.subgroup_elems = subgroup;
  o.host_cache_bytes = cache_subgroups * strata::host_budget::footprint(subgroup * 12);
  o.prefetch_depth = 2;
  o.write_behind_depth = 2;
  o.threads = 2;
  return o;
}

strata::host_tier_options host_opts(std::string name, double bw = 0) {
  return strata::host_tier_options{.name = std::move(name), .read_bandwidth = bw, .write_bandwidth = bw};
}

}  // namespace

TEST_CASE("host memory never exceeds the budget, and a budget too small is a config_error saying what is needed") {
  const std::size_t n = 10'000, sg = 1000;
  const auto init = random_params(n, 1);
  strata::adamw_options ao;
  auto off = small_options(sg, 3);
  const std::uint64_t pipeline_and_cache = strata::offloaded_adamw<strata::host_tier>::required_host_memory(n, ao, off);
  CHECK(pipeline_and_cache == (3 + 2 + 2 + 1) * strata::host_budget::footprint(sg * 12));

  SUBCASE("exactly enough: the peak is within the budget, including the 16-bit gradient store") {
    off.host_memory_budget = pipeline_and_cache + strata::host_budget::footprint(n * 2);
    strata::host_tier tier(host_opts("t"));
    strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating> opt(tier, init, ao, off);
    flat_reference ref(init, ao);
    for (int t = 0; t < 3; ++t) {
      const auto g = random_grads<strata::bf16>(n, t);
      for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
        opt.accept_gradients(s, std::span<const strata::bf16>(g).subspan(opt.begin(s), opt.length(s)));
      opt.step();
      ref.step(std::span<const strata::bf16>(g), ao.lr);
    }
    require_same_state(opt, ref);
    const auto st = opt.stats();
    CHECK(st.host_memory_peak == off.host_memory_budget);
    CHECK(st.host_memory_peak <= st.host_memory_budget);
    CHECK(st.cache_slots == 3);
    CHECK(st.pipeline_slots == 5);
  }
  SUBCASE("one page short for the pipeline: config_error with the amount needed") {
    off.host_memory_budget = pipeline_and_cache - 1;
    strata::host_tier tier(host_opts("t"));
    const auto msg = message_of([&] { strata::offloaded_adamw<strata::host_tier> opt(tier, init, ao, off); });
    CHECK(msg.find("host memory budget") != std::string::npos);
    CHECK(msg.find(strata::format_size(pipeline_and_cache)) != std::string::npos);
    CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>(tier, init, ao, off), strata::config_error);
  }
  SUBCASE("room for the pipeline but not for the gradient store: capacity_error at accept_gradients") {
    off.host_memory_budget = pipeline_and_cache;
    strata::host_tier tier(host_opts("t"));
    strata::offloaded_adamw<strata::host_tier> opt(tier, init, ao, off);
    const auto g = random_grads<strata::bf16>(n, 1);
    CHECK_THROWS_AS(opt.accept_gradients(0, std::span<const strata::bf16>(g).first(sg)), strata::capacity_error);
  }
}

TEST_CASE("automatic gradient residency keeps the store in host memory when an fp32 store fits the budget, else on "
          "the tier, within the budget and bit-identical either way") {
  const std::size_t n = 10'000, sg = 1000;
  const auto init = random_params(n, 4);
  strata::adamw_options ao;
  auto off = small_options(sg, 2);
  off.gradients = strata::gradient_residency::automatic;
  auto host_off = off;
  host_off.gradients = strata::gradient_residency::host;
  const std::uint64_t pipeline = strata::offloaded_adamw<strata::host_tier>::required_host_memory(n, ao, host_off);
  const std::uint64_t fp32_store = strata::host_budget::footprint(n * 4);
  // Each budget and the residency it resolves to, decided at construction.
  const std::vector<std::pair<std::uint64_t, strata::gradient_residency>> cases{
      {strata::unlimited_capacity, strata::gradient_residency::host},
      {pipeline + fp32_store, strata::gradient_residency::host},
      {pipeline + fp32_store - 1, strata::gradient_residency::tier},
      {pipeline + strata::host_budget::footprint(n * 2), strata::gradient_residency::tier},
  };
  for (const auto& [budget, expected] : cases) {
    CAPTURE(budget);
    off.host_memory_budget = budget;
    strata::host_tier tier(host_opts("t"));
    strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating> opt(tier, init, ao, off);
    CHECK(opt.offload().gradients == expected);
    CHECK(strata::to_string(opt.offload().gradients) == strata::to_string(expected));
    flat_reference ref(init, ao);
    for (int t = 0; t < 2; ++t) {
      const auto g = random_grads<float>(n, 10 + t);
      for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
        opt.accept_gradients(s, std::span<const float>(g).subspan(opt.begin(s), opt.length(s)));
      opt.step();
      ref.step(std::span<const float>(g), ao.lr);
    }
    require_same_state(opt, ref);
    CHECK(opt.stats().host_memory_peak <= budget);
    // The gradient objects exist on the tier exactly when the gradients wait there.
    CHECK(tier.size(strata::offload_layout::gradient_name(off.object_prefix, 0)).has_value() ==
          (expected == strata::gradient_residency::tier));
  }
  SUBCASE("a budget with room for the host pipeline only keeps host residency (the caller's gradients still step)") {
    off.host_memory_budget = pipeline;
    strata::host_tier tier(host_opts("t"));
    strata::offloaded_adamw<strata::host_tier> opt(tier, init, ao, off);
    CHECK(opt.offload().gradients == strata::gradient_residency::host);
    const auto g = random_grads<float>(n, 3);
    opt.step(std::span<const float>(g));
    CHECK(opt.stats().host_memory_peak <= pipeline);
  }
}

TEST_CASE("stats count bytes per path, cache hits of the alternating order, and the full-duplex bound of the design") {
  const std::size_t n = 8000, sg = 1000;  // 8 subgroups
  const auto init = random_params(n, 2);
  strata::adamw_options ao;
  strata::multipath<strata::fixed_ratio, strata::host_tier, strata::host_tier> tier(
      strata::fixed_ratio({1, 1}), host_opts("fast", 2e9), host_opts("slow", 1e9));
  strata::offloaded_adamw<decltype(tier), strata::lru, strata::alternating> opt(tier, init, ao, small_options(sg, 3));
  const std::uint64_t sg_bytes = sg * 12;
  const auto g = random_grads<float>(n, 3);
  const auto s1 = opt.step(std::span<const float>(g));
  CHECK(s1.cache_misses == 8);
  CHECK(s1.cache_hits == 0);
  CHECK(s1.bytes_read == 8 * sg_bytes);
  CHECK(s1.bytes_written == 5 * sg_bytes);  // the last 3 stay cached, unwritten
  REQUIRE(s1.paths.size() == 2);
  CHECK(s1.paths[0].name == "fast");
  CHECK(s1.paths[0].bytes_read == 4 * sg_bytes);  // 1:1 placement
  CHECK(s1.paths[1].bytes_read == 4 * sg_bytes);
  CHECK(s1.paths[0].bytes_written + s1.paths[1].bytes_written == s1.bytes_written);
  const auto s2 = opt.step(std::span<const float>(g));
  CHECK(s2.cache_hits == 3);  // reverse order: the last three of step 1 come first
  CHECK(s2.cache_misses == 5);
  CHECK(s2.bytes_read == 5 * sg_bytes);
  CHECK(s2.bytes_written == 5 * sg_bytes);
  // Step 1 returned with reads of step 2's first uncached subgroups running between the steps
  // (prefetch_next_step), as far as free slots allow: in step 2's bytes, not in its bound (they
  // may have moved before it).
  CHECK(s1.prefetched == 0);
  CHECK(s2.prefetched <= 5);
  CHECK(s2.prefetched_bytes == s2.prefetched * sg_bytes);
  const double read = double(s2.bytes_read - s2.prefetched_bytes) / 3e9, write = double(s2.bytes_written) / 3e9;
  CHECK(s2.bound_s == doctest::Approx(std::max({read, write, s2.kernel_s})));
  CHECK(s2.serial_bound_s == doctest::Approx(std::max(read + write, s2.kernel_s)));
  CHECK(s2.kernel_s > 0);
  CHECK(s2.efficiency == doctest::Approx(s2.bound_s / s2.total_s));
  CHECK(s2.read_wait_s + s2.compute_s + s2.write_wait_s <= s2.total_s);  // the parts never overlap
  const auto st = opt.stats();
  CHECK(st.steps == 2);
  CHECK(st.cache_hits == 3);
  CHECK(st.bytes_read == 13 * sg_bytes);
  CHECK(s2.to_string().find("efficiency") != std::string::npos);
}

TEST_CASE("with no bandwidth known the bound is reported as unknown (0), not invented") {
  const auto init = random_params(100, 2);
  strata::host_tier tier(host_opts("t"));
  strata::offloaded_adamw<strata::host_tier> opt(tier, init, {}, small_options(30));
  const auto g = random_grads<float>(100, 1);
  const auto s = opt.step(std::span<const float>(g));
  CHECK(s.bound_s == 0);
  CHECK(s.efficiency == 0);
}

TEST_CASE("a tracer records the step, its waits and one compute span per subgroup") {
  strata::tracer tr(strata::trace_mode::full);
  const auto init = random_params(100, 2);
  strata::host_tier tier(host_opts("t"));
  strata::offloaded_adamw<strata::host_tier> opt(tier, init, {}, small_options(30), {}, {}, &tr);
  const auto g = random_grads<float>(100, 1);
  opt.step(std::span<const float>(g));
  const auto snap = tr.summary().snapshot();
  REQUIRE(snap.duration("offload.step") != nullptr);
  CHECK(snap.duration("offload.step")->count == 1);
  REQUIRE(snap.duration("offload.compute") != nullptr);
  CHECK(snap.duration("offload.compute")->count == 4);
  CHECK(tr.chrome_trace_json().find("offload.compute") != std::string::npos);
}

TEST_CASE("bad input gets a typed error naming the value, and leaves the state as it was") {
  const std::size_t n = 100;
  const auto init = random_params(n, 4);
  strata::adamw_options ao;
  strata::host_tier tier(host_opts("t"));
  strata::offloaded_adamw<strata::host_tier> opt(tier, init, ao, small_options(30, 1));
  flat_reference ref(init, ao);
  const auto g = random_grads<float>(n, 1);
  const std::vector<float> short_g(n - 1, 0.0f);
  CHECK(message_of([&] { opt.step(std::span<const float>(short_g)); }).find("got 99 gradients for 100") !=
        std::string::npos);
  CHECK_THROWS_AS(opt.step(std::span<const float>(short_g)), strata::config_error);
  for (const double lr : {-1e-3, std::nan(""), std::numeric_limits<double>::infinity()}) {  // (0 is a step)
    CAPTURE(lr);
    CHECK_THROWS_AS(opt.step(std::span<const float>(g), lr), strata::config_error);
  }
  CHECK(message_of([&] { opt.step(std::span<const float>(g), -0.5); }).find("-0.5") != std::string::npos);
  std::vector<strata::bf16> out(n - 1);
  CHECK_THROWS_AS(opt.step(std::span<const float>(g), 1e-3, std::span<strata::bf16>(out)), strata::config_error);
  // step() without (all) gradients names the subgroup that lacks them.
  opt.accept_gradients(0, std::span<const float>(g).first(30));
  CHECK(message_of([&] { opt.step(); }).find("subgroup 1 has 0 of its 30") != std::string::npos);
  CHECK_THROWS_AS(opt.accept_gradients(0, std::span<const float>(g).first(30)), strata::config_error);  // twice
  CHECK_THROWS_AS(opt.accept_gradients(3, std::span<const float>(g).first(30)), strata::config_error);  // last is 10
  CHECK_THROWS_AS(opt.accept_gradients(4, std::span<const float>(g).first(10)), strata::config_error);  // no subgroup 4
  const std::vector<strata::bf16> g16(30);
  CHECK(message_of([&] { opt.accept_gradients(1, std::span<const strata::bf16>(g16)); }).find("as float, now as bf16") !=
        std::string::npos);
  CHECK(opt.step_count() == 0);
  require_same_state(opt, ref);

  // Hyper-parameters and options are checked at construction.
  strata::host_tier t2(host_opts("t2"));
  auto bad = ao;
  bad.beta1 = 1.0;
  CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>(t2, init, bad, small_options(30)), strata::config_error);
  bad = ao;
  bad.eps = std::nan("");
  CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>(t2, init, bad, small_options(30)), strata::config_error);
  auto off = small_options(30);
  off.write_behind_depth = 0;
  CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>(t2, init, ao, off), strata::config_error);
  off = small_options(0);
  CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>(t2, init, ao, off), strata::config_error);
  off = small_options(30);
  off.object_prefix = "../x";
  CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>(t2, init, ao, off), strata::config_error);
  CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>(t2, std::span<const float>(), ao, small_options(30)),
                  strata::config_error);
}

TEST_CASE("a tier that fills up at construction gives a capacity_error naming the tier") {
  const auto init = random_params(1000, 4);
  strata::host_tier tier(strata::host_tier_options{.name = "tiny", .capacity = 3 * 4096});
  const auto msg = message_of([&] { strata::offloaded_adamw<strata::host_tier> opt(tier, init, {}, small_options(300)); });
  CHECK(msg.find("tiny") != std::string::npos);
  CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>(tier, init, {}, small_options(300)),
                  strata::capacity_error);
}

TEST_CASE("a tier failing mid-step raises its typed error; retrying the step is bit-identical") {
  const std::size_t n = 2000, sg = 300;  // 7 subgroups
  const auto init = random_params(n, 5);
  strata::adamw_options ao;
  struct fault_case {
    strata::fault_kind kind;
    strata::fault_op op;
    std::uint64_t after;
    std::size_t cache;
    bool overlap;  // prefetch_next_step and return_before_writes
  };
  std::vector<fault_case> cases;
  for (const auto kind : {strata::fault_kind::eio, strata::fault_kind::short_transfer, strata::fault_kind::enospc})
    for (const auto op : {strata::fault_op::read, strata::fault_op::write})
      for (const std::uint64_t after : {0, 3, 6})
        for (const std::size_t cache : {0, 2})
          for (const bool overlap : {false, true}) cases.push_back({kind, op, after, cache, overlap});
  std::size_t failed_steps = 0;
  for (const auto& fc : cases) {
    CAPTURE(static_cast<int>(fc.kind));
    CAPTURE(static_cast<int>(fc.op));
    CAPTURE(fc.after);
    CAPTURE(fc.cache);
    CAPTURE(fc.overlap);
    auto off = small_options(sg, fc.cache);
    off.prefetch_next_step = off.return_before_writes = fc.overlap;
    strata::faulty<strata::host_tier> tier(host_opts("flaky"));
    strata::offloaded_adamw<strata::faulty<strata::host_tier>, strata::sweep_aware, strata::alternating> opt(
        tier, init, ao, off);
    flat_reference ref(init, ao);
    const auto g0 = random_grads<strata::fp16>(n, 10);
    opt.step(std::span<const strata::fp16>(g0));
    ref.step(std::span<const strata::fp16>(g0), ao.lr);
    const auto g1 = random_grads<strata::fp16>(n, 11);
    tier.inject({.kind = fc.kind, .op = fc.op, .object = {}, .after = fc.after, .times = 2});
    bool failed = false;
    try {
      opt.step(std::span<const strata::fp16>(g1), 2e-3);
    } catch (const strata::io_error& e) {
      failed = true;
      CHECK(std::string(e.what()).find("injected") != std::string::npos);
    } catch (const strata::capacity_error&) {
      failed = true;
    }
    // With overlap, a write the step left in flight as it returned fails at the next call: here.
    bool failed_late = false;
    if (!failed && fc.overlap) {
      try {
        opt.flush();
      } catch (const strata::io_error&) {
        failed_late = true;
      } catch (const strata::capacity_error&) {
        failed_late = true;
      }
    }
    const bool fired = tier.fired() > 0;
    // Every fault on the step's own I/O fails it or, for a write it left in flight, the next
    // call. With overlap the step's last act is to start the next step's first reads: a fault
    // there is forgotten (that step reads again).
    if (failed_late) ++failed_steps;
    if (!fc.overlap)
      CHECK(failed == fired);
    else if (fc.op == strata::fault_op::write)
      CHECK((failed || failed_late) == fired);
    else
      CHECK((!failed || fired));
    for (int tries = 0; tries < 4 && failed_late; ++tries) {  // the second firing may hit a retry
      try {
        opt.flush();
        failed_late = false;
      } catch (const strata::error&) {
      }
    }
    REQUIRE_FALSE(failed_late);
    if (failed) {
      ++failed_steps;
      CHECK(opt.step_count() == 1);
      CHECK_THROWS_AS(opt.step(std::span<const strata::fp16>(g1), 3e-3), strata::config_error);  // other lr
      CHECK_THROWS_AS(opt.save(fs::temp_directory_path() / "never"), strata::config_error);
      // The second firing may hit the retry: retry until the step goes through.
      for (int tries = 0; tries < 4 && opt.step_count() == 1; ++tries) {
        try {
          opt.step(std::span<const strata::fp16>(g1), 2e-3);
        } catch (const strata::error&) {
        }
      }
    }
    tier.clear();
    ref.step(std::span<const strata::fp16>(g1), 2e-3);
    REQUIRE(opt.step_count() == 2);
    require_same_state(opt, ref);
    const auto g2 = random_grads<strata::fp16>(n, 12);
    opt.step(std::span<const strata::fp16>(g2));
    ref.step(std::span<const strata::fp16>(g2), ao.lr);
    require_same_state(opt, ref);
  }
  // Most cases must really have failed mid-step or at the next call (only late faults on a
  // cached run miss).
  CHECK(failed_steps >= cases.size() * 3 / 4);
}

TEST_CASE("a read of the next step that fails after a step returned is forgotten: that step reads the subgroup "
          "again and trains bit-identically") {
  const std::size_t n = 2000, sg = 300;  // 7 subgroups, none cached: step 0 reads each once
  const auto init = random_params(n, 57);
  strata::adamw_options ao;
  strata::faulty<strata::host_tier> tier(host_opts("flaky"));
  // The same order every step: step 1 starts with subgroups whose slots the writes step 0 left
  // give back, so the reads between the steps read at least subgroup 0.
  strata::offloaded_adamw<strata::faulty<strata::host_tier>, strata::sweep_aware, strata::sequential> opt(
      tier, init, ao, small_options(sg, 0));
  flat_reference ref(init, ao);
  // Step 0's own reads pass; the first read after them, one step 1 needs, fails.
  tier.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::read, .object = {}, .after = 7, .times = 1});
  const auto g0 = random_grads<strata::fp16>(n, 58);
  const auto s0 = opt.step(std::span<const strata::fp16>(g0));
  ref.step(std::span<const strata::fp16>(g0), ao.lr);
  CHECK(s0.cache_misses == 7);
  // It fails between the steps (a deadline for liveness only), and step 0 went through.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (tier.fired() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(tier.fired() == 1);
  const auto g1 = random_grads<strata::fp16>(n, 59);
  const auto s1 = opt.step(std::span<const strata::fp16>(g1));
  ref.step(std::span<const strata::fp16>(g1), ao.lr);
  CHECK(s1.prefetched >= 1);
  CHECK(s1.cache_misses == 7);
  CHECK(tier.fired() == 1);
  require_same_state(opt, ref);
  const auto g2 = random_grads<strata::fp16>(n, 60);
  opt.step(std::span<const strata::fp16>(g2));
  ref.step(std::span<const strata::fp16>(g2), ao.lr);
  require_same_state(opt, ref);
}

TEST_CASE("a write a step left in flight that fails is raised, typed, by the next step; its retry is bit-identical") {
  const std::size_t n = 2000, sg = 300;  // 7 subgroups, none cached
  const auto init = random_params(n, 61);
  strata::adamw_options ao;
  strata::faulty<strata::host_tier> tier(host_opts("flaky"));
  strata::offloaded_adamw<strata::faulty<strata::host_tier>, strata::sweep_aware, strata::alternating> opt(
      tier, init, ao, small_options(sg, 0));
  REQUIRE(opt.offload().return_before_writes);
  flat_reference ref(init, ao);
  // Step 0 updates subgroup 6 last: its write is issued as the step returns, and fails then.
  tier.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = opt.object_name(6)});
  const auto g0 = random_grads<strata::fp16>(n, 62);
  const auto s0 = opt.step(std::span<const strata::fp16>(g0));
  ref.step(std::span<const strata::fp16>(g0), ao.lr);
  CHECK(s0.writes_left >= 1);
  CHECK(tier.fired() == 1);
  CHECK(opt.step_count() == 1);
  const auto g1 = random_grads<strata::fp16>(n, 63);
  CHECK_THROWS_AS(opt.step(std::span<const strata::fp16>(g1)), strata::io_error);
  CHECK(opt.step_count() == 1);
  opt.step(std::span<const strata::fp16>(g1));  // the retry writes subgroup 6's state first
  ref.step(std::span<const strata::fp16>(g1), ao.lr);
  require_same_state(opt, ref);
  opt.flush();
  for (std::size_t s = 0; s < opt.subgroup_count(); ++s) CHECK_FALSE(opt.pipeline().state(s).dirty);
}

TEST_CASE("save then load into another tier layout continues bit-identically") {
  const std::size_t n = 3001, sg = 400;
  const auto init = random_params(n, 6);
  strata::adamw_options ao;
  ao.amsgrad = true;
  ao.weight_decay = 0.05;
  temp_dir dir(fs::temp_directory_path(), "offload-ckpt");
  flat_reference ref(init, ao);
  {
    strata::host_tier tier(host_opts("one"));
    strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating> opt(tier, init, ao,
                                                                                     small_options(sg, 3));
    for (int t = 0; t < 3; ++t) {
      const auto g = random_grads<strata::bf16>(n, 20 + t);
      opt.step(std::span<const strata::bf16>(g), 1e-3 * (t + 1));
      ref.step(std::span<const strata::bf16>(g), 1e-3 * (t + 1));
    }
    opt.save(dir.path());
    // A later save replaces the earlier one and leaves one data file.
    opt.save(dir.path());
    std::size_t data_files = 0;
    for (const auto& e : fs::directory_iterator(dir.path()))
      data_files += e.path().filename().string().rfind("state-", 0) == 0;
    CHECK(data_files == 1);
  }
  // Two paths (a file tier and a host tier), another cache size and thread count.
  temp_dir tdir(fs::temp_directory_path(), "offload-tier");
  strata::multipath<strata::bandwidth_proportional, strata::file_tier, strata::host_tier> tier2(
      strata::bandwidth_proportional{}, file_opts(tdir.path(), strata::io_backend::automatic, strata::unlimited_capacity),
      host_opts("h"));
  auto off = small_options(1);  // overridden by the checkpoint's subgroup size
  off.threads = 3;
  auto opt = strata::offloaded_adamw<decltype(tier2), strata::sweep_aware, strata::alternating>::load(dir.path(), tier2,
                                                                                                      off);
  CHECK(opt.step_count() == 3);
  CHECK(opt.offload().subgroup_elems == sg);
  CHECK(opt.options().amsgrad);
  require_same_state(opt, ref);
  for (int t = 3; t < 5; ++t) {
    const auto g = random_grads<strata::bf16>(n, 20 + t);
    opt.step(std::span<const strata::bf16>(g), 1e-3 * (t + 1));
    ref.step(std::span<const strata::bf16>(g), 1e-3 * (t + 1));
  }
  require_same_state(opt, ref);
}

TEST_CASE("a corrupted, truncated or missing checkpoint is refused with a typed error") {
  const std::size_t n = 1000;
  const auto init = random_params(n, 7);
  temp_dir dir(fs::temp_directory_path(), "offload-bad");
  strata::host_tier tier(host_opts("t"));
  {
    strata::offloaded_adamw<strata::host_tier> opt(tier, init, {}, small_options(300));
    const auto g = random_grads<float>(n, 1);
    opt.step(std::span<const float>(g));
    opt.save(dir.path());
  }
  fs::path data;
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().filename().string().rfind("state-", 0) == 0) data = e.path();
  REQUIRE(!data.empty());
  const auto read_all = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const auto write_all = [](const fs::path& p, const std::string& s) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << s;
  };
  const std::string good_data = read_all(data);
  const std::string good_manifest = read_all(dir.path() / "manifest");
  strata::host_tier other(host_opts("other"));
  const auto load = [&] { return strata::offloaded_adamw<strata::host_tier>::load(dir.path(), other, small_options(1)); };
  SUBCASE("intact: loads") { CHECK(load().step_count() == 1); }
  SUBCASE("one flipped bit in the data") {
    auto d = good_data;
    d[d.size() / 2] = static_cast<char>(d[d.size() / 2] ^ 0x10);
    write_all(data, d);
    CHECK(message_of(load).find("subgroup 1") != std::string::npos);
    CHECK_THROWS_AS(load(), strata::integrity_error);
  }
  SUBCASE("truncated data") {
    write_all(data, good_data.substr(0, good_data.size() - 5));
    CHECK_THROWS_AS(load(), strata::integrity_error);
  }
  SUBCASE("truncated manifest") {
    write_all(dir.path() / "manifest", good_manifest.substr(0, good_manifest.size() / 2));
    CHECK_THROWS_AS(load(), strata::integrity_error);
  }
  SUBCASE("edited manifest (step count changed)") {
    auto m = good_manifest;
    m.replace(m.find("step 1"), 6, "step 7");
    write_all(dir.path() / "manifest", m);
    CHECK_THROWS_AS(load(), strata::integrity_error);
  }
  SUBCASE("missing data file") {
    fs::remove(data);
    CHECK_THROWS_AS(load(), strata::io_error);
  }
  SUBCASE("missing directory") {
    CHECK_THROWS_AS(strata::offloaded_adamw<strata::host_tier>::load(dir.path() / "nope", other), strata::io_error);
  }
}

TEST_CASE("save into a directory that cannot be created is an io_error naming it") {
  // A path under a regular file cannot be a directory, even for root.
  temp_dir dir(fs::temp_directory_path(), "offload-unwritable");
  const auto file = dir.path() / "a-file";
  { std::ofstream(file) << "x"; }
  const auto init = random_params(100, 8);
  strata::host_tier tier(host_opts("t"));
  strata::offloaded_adamw<strata::host_tier> opt(tier, init, {}, small_options(30));
  const auto msg = message_of([&] { opt.save(file / "ckpt"); });
  CHECK(msg.find("a-file") != std::string::npos);
  CHECK_THROWS_AS(opt.save(file / "ckpt"), strata::io_error);
}

TEST_CASE("flush writes the cached subgroups, so the tier then holds the whole current state") {
  const std::size_t n = 1000, sg = 300;  // 4 subgroups, all cached after a step
  const auto init = random_params(n, 9);
  strata::host_tier tier(host_opts("t"));
  strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating> opt(tier, init, {},
                                                                                   small_options(sg, 4));
  const auto g = random_grads<float>(n, 1);
  opt.step(std::span<const float>(g));
  std::vector<float> master(n);
  opt.read_master(master);
  const auto tier_master = [&] {
    std::vector<float> out(n);
    for (std::size_t s = 0; s < opt.subgroup_count(); ++s) {
      std::vector<float> state(opt.length(s) * 3);
      tier.read(opt.object_name(s), 0, std::as_writable_bytes(std::span(state))).get();
      std::copy(state.begin(), state.begin() + static_cast<std::ptrdiff_t>(opt.length(s)),
                out.begin() + static_cast<std::ptrdiff_t>(opt.begin(s)));
    }
    return out;
  };
  CHECK(opt.cached(0));
  CHECK(same_bits(tier_master(), init));  // updated state lives in the cache only
  opt.flush();
  CHECK(same_bits(tier_master(), master));
  CHECK(opt.cached(0));  // still cached (clean now): the next step reads nothing
  const auto s2 = opt.step(std::span<const float>(g));
  CHECK(s2.bytes_read == 0);
  CHECK(s2.cache_hits == 4);
}


TEST_CASE("a step returns with the next step's first reads started and its last writes in flight, and training so "
          "is bit-identical to training without: partial steps, a skipped step, gradients on the tier, reads and "
          "saves between steps") {
  const std::size_t n = 6000, sg = 500;  // 12 subgroups, 3 of them cached
  const auto init = random_params(n, 31);
  strata::adamw_options ao;
  ao.weight_decay = 0.01;
  temp_dir dir(fs::temp_directory_path(), "offload-prefetch");
  for (const bool tier_grads : {false, true}) {
    CAPTURE(tier_grads);
    using tier_t = strata::faulty<strata::host_tier>;
    using opt_t = strata::offloaded_adamw<tier_t, strata::lru, strata::alternating>;
    tier_t ta(host_opts("a")), tb(host_opts("b"));
    // Slow reads and writes: the next call finds the reads started and the writes left as the
    // last step returned still in flight.
    for (auto* t : {&ta, &tb})
      for (const auto op : {strata::fault_op::read, strata::fault_op::write})
        t->inject({.kind = strata::fault_kind::delay, .op = op, .object = {}, .after = 0, .times = 0,
                   .probability = 1.0, .delay = std::chrono::milliseconds(3)});
    auto oa = small_options(sg, 3);
    oa.gradients = tier_grads ? strata::gradient_residency::tier : strata::gradient_residency::host;
    oa.loss_scaling.enabled = true;
    oa.loss_scaling.init_scale = 1024;
    oa.loss_scaling.growth_interval = 2;
    auto ob = oa;
    ob.prefetch_next_step = false;
    ob.return_before_writes = false;
    opt_t a(ta, init, ao, oa), b(tb, init, ao, ob);
    std::vector<float> model_a(init), model_b(init);
    std::uint64_t prefetched_a = 0, prefetched_b = 0, left_a = 0, left_b = 0;
    const auto same = [&] {
      std::vector<float> pa(n), pb(n), ma(n), mb(n), va(n), vb(n);
      a.read_master(pa);
      b.read_master(pb);
      a.read_state("exp_avg", ma);
      b.read_state("exp_avg", mb);
      a.read_state("exp_avg_sq", va);
      b.read_state("exp_avg_sq", vb);
      return same_bits(pa, pb) && same_bits(ma, mb) && same_bits(va, vb);
    };
    for (int t = 0; t < 9; ++t) {
      CAPTURE(t);
      REQUIRE(a.loss_scale() == b.loss_scale());
      auto g = random_grads<float>(n, 40 + static_cast<std::uint64_t>(t));
      for (auto& x : g) x *= a.loss_scale();
      if (t == 3) g[4321] = std::numeric_limits<float>::infinity();  // skipped; the scale halves
      const double lr = 1e-3 * (1 + t);
      strata::offload_step_stats sa, sb;
      if (t == 5 || t == 6) {  // gradients for the first tensor only, then for the second only
        const std::size_t cut = 2750;
        const std::span<const float> gs(g);
        const auto tensors = [&](std::span<float> m) {
          return std::vector<strata::param_tensor<float, float>>{
              {0, cut, t == 5 ? gs.first(cut) : std::span<const float>(), m.first(cut)},
              {cut, n - cut, t == 6 ? gs.subspan(cut) : std::span<const float>(), m.subspan(cut)}};
        };
        const auto ta_ = tensors(model_a), tb_ = tensors(model_b);
        sa = a.step(std::span<const strata::param_tensor<float, float>>(ta_), lr);
        sb = b.step(std::span<const strata::param_tensor<float, float>>(tb_), lr);
      } else {
        for (std::size_t s = a.subgroup_count(); s-- > 0;) {  // as backward hands them over
          a.accept_gradients(s, std::span<const float>(g).subspan(a.begin(s), a.length(s)));
          b.accept_gradients(s, std::span<const float>(g).subspan(b.begin(s), b.length(s)));
        }
        sa = a.step(lr);
        sb = b.step(lr);
      }
      CHECK(sa.skipped == (t == 3));
      CHECK(sa.subgroups == sb.subgroups);
      CHECK(sb.prefetched == 0);
      CHECK(sa.prefetched_bytes == sa.prefetched * a.layout().state_bytes(0));
      CHECK(sa.bytes_read - sa.prefetched_bytes <= sb.bytes_read);  // the step itself reads no more
      prefetched_a += sa.prefetched;
      prefetched_b += sb.prefetched;
      left_a += sa.writes_left;
      left_b += sb.writes_left;
      CHECK(sa.bytes_written == sb.bytes_written);
      if (t == 2 || t == 7) REQUIRE(same());  // reads of the state between steps
      if (t == 4) {
        a.save(dir.path() / fmt::format("a{}", tier_grads));
        b.save(dir.path() / fmt::format("b{}", tier_grads));
      }
    }
    CHECK(prefetched_a > 0);
    CHECK(prefetched_b == 0);
    CHECK(left_a > 0);
    CHECK(left_b == 0);
    CHECK(same());
    CHECK(same_bits(model_a, model_b));
    // The checkpoint taken with reads in flight is the state of its step.
    tier_t tc(host_opts("c")), td(host_opts("d"));
    auto ac = opt_t::load(dir.path() / fmt::format("a{}", tier_grads), tc, oa);
    auto bc = opt_t::load(dir.path() / fmt::format("b{}", tier_grads), td, ob);
    std::vector<float> pa(n), pb(n);
    ac.read_master(pa);
    bc.read_master(pb);
    CHECK(same_bits(pa, pb));
  }
}

}  // namespace offload_test
