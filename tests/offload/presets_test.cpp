// Presets as named configurations of offloaded_adamw, built at run time by make_offloaded_adamw:
// each is bit-identical to AdamW on one flat array, and each moves the bytes its design says.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/presets.hpp>
#include <strata/strata.hpp>

#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace presets_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;

strata::offloaded_adamw_config base_config(const fs::path& dir, std::string preset, std::size_t paths) {
  strata::offloaded_adamw_config c;
  c.preset = std::move(preset);
  for (std::size_t i = 0; i < paths; ++i) {
    strata::offload_path_config p;
    p.directory = i == 0 ? dir / "nvme" : fs::path();  // a file path and a host path
    p.name = i == 0 ? "nvme" : "pfs";
    p.read_bandwidth = p.write_bandwidth = i == 0 ? 2e9 : 1e9;
    c.paths.push_back(p);
  }
  c.offload.subgroup_elems = 500;
  c.offload.threads = 2;
  c.node_limiter_dir = dir / "locks";
  return c;
}

void run_and_compare(strata::any_offloaded_adamw& opt, flat_reference& ref, int steps, std::uint64_t seed) {
  for (int t = 0; t < steps; ++t) {
    const auto g = random_grads<strata::bf16>(ref.p.size(), seed + t);
    opt.step(std::span<const strata::bf16>(g), 1e-3 * (1 + t));
    ref.step(std::span<const strata::bf16>(g), 1e-3 * (1 + t));
    std::vector<float> p(ref.p.size()), m(ref.p.size()), v(ref.p.size());
    opt.read_master(p);
    opt.read_moments(m, v);
    REQUIRE(same_bits(p, ref.p));
    REQUIRE(same_bits(m, ref.m));
    REQUIRE(same_bits(v, ref.v));
  }
}

}  // namespace

TEST_CASE("every preset is bit-identical to AdamW on one flat array") {
  const std::size_t n = 4321;
  const auto init = random_params(n, 30);
  for (const auto& [preset, paths] : {std::pair{"zero_infinity", 1ul}, std::pair{"mlp_offload", 2ul},
                                      std::pair{"strata", 2ul}, std::pair{"strata", 1ul}}) {
    CAPTURE(preset);
    temp_dir dir(fs::temp_directory_path(), "offload-preset");
    auto c = base_config(dir.path(), preset, paths);
    c.offload.host_memory_budget = 16 * strata::host_budget::footprint(500 * 16);
    auto opt = strata::make_offloaded_adamw(c, init);
    CHECK(opt.preset() == std::string_view(preset));
    flat_reference ref(init, c.adamw);
    run_and_compare(opt, ref, 3, 100);
    CHECK(opt.stats().host_memory_peak <= c.offload.host_memory_budget);
  }
}

TEST_CASE("gradients handed over in pieces step like whole ones, and path_totals counts each path's bytes") {
  const std::size_t n = 3000;
  const auto init = random_params(n, 40);
  for (const auto& [preset, paths] : {std::pair{"zero_infinity", 1ul}, std::pair{"mlp_offload", 2ul},
                                      std::pair{"strata", 2ul}}) {
    CAPTURE(preset);
    temp_dir dir(fs::temp_directory_path(), "offload-accept");
    auto c = base_config(dir.path(), preset, paths);
    // Bytes are compared at step boundaries: no write left in flight as a step returns (those
    // land later; path_totals count a write when it completes, the stats when it is issued).
    c.offload.return_before_writes = false;
    auto opt = strata::make_offloaded_adamw(c, init);
    flat_reference ref(init, strata::adamw_options{});
    const auto before = opt.path_totals();
    REQUIRE(before.size() == paths);
    CHECK(before[0].name == "nvme");
    CHECK(before[0].read_bandwidth == 2e9);
    for (int t = 0; t < 2; ++t) {
      const auto g = random_grads<strata::bf16>(n, 200 + t);
      const std::span<const strata::bf16> all(g);
      // Backward produces gradients in uneven pieces that straddle subgroups (500 parameters each).
      for (std::size_t first = 0; first < n; first += 700)
        opt.accept_gradients_at(first, all.subspan(first, std::min<std::size_t>(700, n - first)));
      const auto st = opt.step(1e-3);
      ref.step(all, 1e-3);
      CHECK(st.subgroups == 6);
    }
    const auto totals = opt.stats();
    // A waiter wakes after the continuations have run (completion), so the counts of writes are
    // exact now: a step returns when its last write landed.
    const auto written_by = opt.path_totals();
    // The reads the last step started for the next one (prefetch_next_step) may still be in
    // flight: flush waits for them (its writes of cached subgroups are not counted here).
    opt.flush();
    const auto read_by = opt.path_totals();
    std::uint64_t read = 0, written = 0;
    for (std::size_t i = 0; i < read_by.size(); ++i) {
      read += read_by[i].bytes_read - before[i].bytes_read;
      written += written_by[i].bytes_written - before[i].bytes_written;
    }
    // The step that uses those reads counts them.
    const auto g = random_grads<strata::bf16>(n, 202);
    const auto next = opt.step(std::span<const strata::bf16>(g), 1e-3);
    ref.step(std::span<const strata::bf16>(g), 1e-3);
    CHECK((std::string(preset) == "strata") == (next.prefetched > 0));
    // Every byte the steps read or wrote (zero_infinity: also the fp32 gradient objects) was
    // moved by a path.
    CHECK(read == totals.bytes_read + next.prefetched_bytes);
    CHECK(written == totals.bytes_written + totals.gradient_bytes_written);
    std::vector<float> p(n);
    opt.read_master(p);
    CHECK(same_bits(p, ref.p));
  }
}

TEST_CASE("zero_infinity writes fp32 gradients to the tier and reads them back with the state") {
  const std::size_t n = 2000;
  temp_dir dir(fs::temp_directory_path(), "offload-zi");
  auto opt = strata::make_offloaded_adamw(base_config(dir.path(), "zero_infinity", 1), random_params(n, 31));
  const auto g = random_grads<strata::bf16>(n, 1);
  const auto s = opt.step(std::span<const strata::bf16>(g), 1e-3);
  CHECK(s.cache_hits == 0);
  CHECK(s.bytes_read == n * 16);  // 12 B of state + 4 B of fp32 gradient per parameter
  CHECK(s.bytes_written == n * 12);
  CHECK(opt.stats().gradient_bytes_written == n * 4);
  CHECK(opt.offload().prefetch_depth == 1);
  CHECK(opt.offload().write_behind_depth == 1);
  CHECK(opt.offload().gradients == strata::gradient_residency::tier);
  CHECK_FALSE(opt.offload().prefetch_next_step);  // DeepSpeed reads nothing before the step
  CHECK_FALSE(opt.offload().return_before_writes);  // nor writes after it
  CHECK(opt.step(std::span<const strata::bf16>(g), 1e-3).prefetched == 0);
}

TEST_CASE("mlp_offload places subgroups 2:1 and keeps the last ones of each step in host memory") {
  const std::size_t n = 6000;  // 12 subgroups of 500
  temp_dir dir(fs::temp_directory_path(), "offload-mlp");
  auto opt = strata::make_offloaded_adamw(base_config(dir.path(), "mlp_offload", 2), random_params(n, 32));
  const auto g = random_grads<strata::bf16>(n, 1);
  const auto s1 = opt.step(std::span<const strata::bf16>(g), 1e-3);
  REQUIRE(s1.paths.size() == 2);
  CHECK(s1.paths[0].bytes_read == 8 * 500 * 12);
  CHECK(s1.paths[1].bytes_read == 4 * 500 * 12);
  const auto s2 = opt.step(std::span<const strata::bf16>(g), 1e-3);
  CHECK(s2.cache_hits == strata::presets::mlp_offload::default_kept);
  CHECK(s2.bytes_read == (12 - strata::presets::mlp_offload::default_kept) * 500 * 12);
}

TEST_CASE("the strata preset sizes its cache from the budget; a cache of every subgroup reads nothing after step 1") {
  const std::size_t n = 5000;  // 10 subgroups
  temp_dir dir(fs::temp_directory_path(), "offload-strata");
  auto c = base_config(dir.path(), "strata", 2);
  const auto slot = strata::host_budget::footprint(500 * 12);
  c.offload.host_memory_budget = (10 + 9) * slot + strata::host_budget::footprint(n * 2);
  {  // its paths and prefix are the next one's: one owner at a time
    auto opt = strata::make_offloaded_adamw(c, random_params(n, 33));
    CHECK(opt.stats().cache_slots == 10);
    const auto g = random_grads<strata::bf16>(n, 1);
    opt.step(std::span<const strata::bf16>(g), 1e-3);
    const auto s2 = opt.step(std::span<const strata::bf16>(g), 1e-3);
    CHECK(s2.cache_hits == 10);
    CHECK(s2.bytes_read == 0);
    CHECK(s2.bytes_written == 0);
  }
  c.offload.host_memory_budget = (5 + 9) * slot + strata::host_budget::footprint(n * 2);
  auto half = strata::make_offloaded_adamw(c, random_params(n, 33));
  CHECK(half.stats().cache_slots == 5);
}

TEST_CASE("the strata preset leaves the device landing slots out of its cache when the update may run on the device") {
  const std::size_t n = 5000, sg = 500;  // 10 subgroups
  const strata::adamw_options ao;
  strata::offload_options base;
  base.subgroup_elems = sg;
  base.threads = 2;
  const auto slot = strata::host_budget::footprint(sg * 12);
  // 9 pipeline slots + 2 device landing slots (device_depth) + 3 cache slots + the 16-bit store.
  base.host_memory_budget = (9 + 2 + 3) * slot + strata::host_budget::footprint(n * 2);
  using P = strata::presets::strata_preset;
  CHECK(P::options(n, ao, base).host_cache_bytes == 5 * slot);  // a host-only site has no landing slots
  const auto off = P::options(n, ao, base, true);
  CHECK(off.host_cache_bytes == 3 * slot);
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  strata::host_executor<strata::host_stream> exec;
  const auto init = random_params(n, 5);
  P::device_optimizer<strata::host_tier, strata::host_executor<strata::host_stream>, strata::always_device> opt(
      tier, exec, init, ao, off);
  CHECK(opt.stats().cache_slots == 3);
  const auto g = random_grads<strata::bf16>(n, 2);
  for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
    opt.accept_gradients(s, std::span<const strata::bf16>(g).subspan(opt.begin(s), opt.length(s)));
  opt.step();
  CHECK(opt.stats().host_memory_peak <= base.host_memory_budget);
}

TEST_CASE("a checkpoint saved under one preset loads under another and continues bit-identically") {
  const std::size_t n = 3000;
  const auto init = random_params(n, 34);
  temp_dir dir(fs::temp_directory_path(), "offload-xpreset");
  flat_reference ref(init, {});
  {
    auto opt = strata::make_offloaded_adamw(base_config(dir.path() / "a", "mlp_offload", 2), init);
    run_and_compare(opt, ref, 2, 200);
    opt.save(dir.path() / "ckpt");
  }
  auto opt = strata::load_offloaded_adamw(base_config(dir.path() / "b", "strata", 1), dir.path() / "ckpt");
  CHECK(opt.step_count() == 2);
  run_and_compare(opt, ref, 2, 202);
}

TEST_CASE("make_offloaded_adamw rejects unknown presets and path counts a preset cannot use") {
  temp_dir dir(fs::temp_directory_path(), "offload-badcfg");
  const auto init = random_params(100, 1);
  CHECK_THROWS_AS(strata::make_offloaded_adamw(base_config(dir.path(), "deepspeed", 1), init), strata::config_error);
  CHECK_THROWS_AS(strata::make_offloaded_adamw(base_config(dir.path(), "zero_infinity", 2), init), strata::config_error);
  CHECK_THROWS_AS(strata::make_offloaded_adamw(base_config(dir.path(), "mlp_offload", 1), init), strata::config_error);
  CHECK_THROWS_AS(strata::make_offloaded_adamw(base_config(dir.path(), "strata", 0), init), strata::config_error);
}

TEST_CASE("presets compose at compile time from the same template") {
  temp_dir dir(fs::temp_directory_path(), "offload-static");
  using P = strata::presets::mlp_offload;
  strata::node_limiter lock("pfs", 1, dir.path() / "locks");
  strata::file_tier nvme(file_opts(dir.path() / "nvme", strata::io_backend::automatic, strata::unlimited_capacity));
  strata::limited<strata::host_tier, strata::node_limiter> pfs(lock, strata::host_tier_options{.name = "pfs"});
  P::paths<strata::file_tier, strata::host_tier> tier(P::placement(), nvme, pfs);
  const auto init = random_params(2500, 35);
  strata::adamw_options ao;
  P::optimizer<decltype(tier)> opt(tier, init, ao, P::options(init.size(), ao, [] {
                                     strata::offload_options o;
                                     o.subgroup_elems = 500;
                                     return o;
                                   }()));
  static_assert(std::is_same_v<decltype(opt), strata::offloaded_adamw<decltype(tier), strata::lru, strata::alternating>>);
  flat_reference ref(init, ao);
  const auto g = random_grads<float>(init.size(), 1);
  opt.step(std::span<const float>(g));
  ref.step(std::span<const float>(g), ao.lr);
  require_same_state(opt, ref);
  CHECK(opt.stats().cache_slots == P::default_kept);
}

TEST_CASE("on paths capped by throttled<> the full-duplex bound is a lower bound: 0 < efficiency <= 1 for every preset") {
  // The caps are the paths' ceilings and throttled<> never lets a request beat its slot, so no
  // step can be faster than max(read time, write time, kernel time): a bound that adds read and
  // write times (the serial form) would be beaten here, since each capped path reads and writes
  // at once.
  const std::size_t n = 400'000;  // 8 subgroups of 50K: 4.8 MB of state
  const auto init = random_params(n, 36);
  bool serial_beaten = false;
  for (const auto& [preset, paths] : {std::pair{"zero_infinity", 1ul}, std::pair{"mlp_offload", 2ul},
                                      std::pair{"strata", 2ul}}) {
    CAPTURE(preset);
    temp_dir dir(fs::temp_directory_path(), "offload-bound");
    auto c = base_config(dir.path(), preset, paths);
    c.offload.subgroup_elems = 50'000;
    c.offload.host_cache_bytes = 0;
    for (auto& p : c.paths) {
      p.directory.clear();  // host memory behind the caps: only the caps limit
      // Slow enough that link time dwarfs the CPU's share of a step, also under a sanitizer on
      // a loaded machine, so a step that overlaps its reads and writes beats the serial form.
      p.read_cap = p.read_bandwidth = 20e6;
      p.write_cap = p.write_bandwidth = 16e6;
    }
    auto opt = strata::make_offloaded_adamw(c, init);
    const auto g = random_grads<strata::bf16>(n, 2);
    for (int t = 0; t < 3; ++t) {
      const auto s = opt.step(std::span<const strata::bf16>(g), 1e-3);
      CAPTURE(s.to_string());
      CHECK(s.bound_s > 0);
      CHECK(s.efficiency > 0);
      CHECK(s.efficiency <= 1.0);
      CHECK(s.serial_bound_s >= s.bound_s);
      serial_beaten = serial_beaten || s.serial_bound_s > s.total_s;
    }
  }
  CHECK(serial_beaten);  // the serial form is not a lower bound on these links
}

TEST_CASE("mlp_offload's PFS path takes separate node-wide read and write locks, one shared lock, or none") {
  const std::size_t n = 6000;
  const auto init = random_params(n, 37);
  for (const auto& [sharing, locked] : {std::pair{strata::rw_sharing::separate, true},
                                        std::pair{strata::rw_sharing::shared, true},
                                        std::pair{strata::rw_sharing::separate, false}}) {
    CAPTURE(static_cast<int>(sharing));
    CAPTURE(locked);
    temp_dir dir(fs::temp_directory_path(), "offload-mlp-lock");
    auto c = base_config(dir.path(), "mlp_offload", 2);
    c.node_limiter_sharing = sharing;
    c.mlp_offload_lock = locked;
    c.node_limiter_name = "pfs";
    auto opt = strata::make_offloaded_adamw(c, init);
    CHECK(opt.offload().prefetch_depth == 1);  // one swap-in and one swap-out ahead per path
    CHECK(opt.offload().write_behind_depth == 1);
    CHECK_FALSE(opt.offload().prefetch_next_step);
    CHECK_FALSE(opt.offload().return_before_writes);
    flat_reference ref(init, c.adamw);
    run_and_compare(opt, ref, 2, 300);
    const bool separate_files = fs::exists(dir.path() / "locks" / "pfs.read") && fs::exists(dir.path() / "locks" / "pfs.write");
    const bool shared_file = fs::exists(dir.path() / "locks" / "pfs");
    CHECK(separate_files == (locked && sharing == strata::rw_sharing::separate));
    CHECK(shared_file == (locked && sharing == strata::rw_sharing::shared));
  }
}

TEST_CASE("zero_infinity striped over every path (RAID0) with a cache stays bit-identical and spreads bytes evenly") {
  const std::size_t n = 6000;  // 12 subgroups of 500: 6000 B of state each
  const auto init = random_params(n, 38);
  temp_dir dir(fs::temp_directory_path(), "offload-raid0");
  auto c = base_config(dir.path(), "zero_infinity", 2);
  c.stripe_paths = true;
  c.stripe_bytes = 4096;
  c.offload.cache_subgroups = 3;
  auto opt = strata::make_offloaded_adamw(c, init);
  flat_reference ref(init, c.adamw);
  run_and_compare(opt, ref, 3, 400);
  const auto totals = opt.path_totals();
  REQUIRE(totals.size() == 2);  // the members, not the one striped path
  CHECK(totals[0].name == "nvme");
  CHECK(totals[1].name == "pfs");
  CHECK(totals[0].bytes_read > 0);
  CHECK(totals[1].bytes_read > 0);
  // belady keeps a fixed set of the sequential order's subgroups across steps (an LRU cache of
  // the same size gets no hit at all under that order); some steps lose one of the 3 to a slot
  // the read-ahead took.
  const auto g = random_grads<strata::bf16>(n, 9);
  const auto s = opt.step(std::span<const strata::bf16>(g), 1e-3);
  CHECK(s.cache_hits >= 2);
  CHECK(s.cache_hits <= 3);
  CHECK(s.cache_hits + s.cache_misses == 12);
  auto one = base_config(dir.path() / "x", "zero_infinity", 2);
  CHECK_THROWS_AS(strata::make_offloaded_adamw(one, init), strata::config_error);  // two paths, not striped
}

}  // namespace presets_test
