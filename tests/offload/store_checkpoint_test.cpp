// Checkpoints in a tier (offload/tier_checkpoint.hpp) rather than a directory: round trip, the
// previous checkpoint kept through a failed save, damage refused, and nothing left behind.
// The store here is host memory; tests/s3 runs the same save and load against an object store.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <strata/offload/offloaded_adamw.hpp>
#include <strata/offload/tier_checkpoint.hpp>
#include <strata/tier/any_tier.hpp>
#include <strata/tier/faulty.hpp>
#include <strata/tier/host_tier.hpp>

#include "offload_test_support.hpp"

namespace store_checkpoint_test {

using namespace strata_test;

namespace {
strata::offload_options opts(std::size_t subgroup) {
  strata::offload_options o;
  o.subgroup_elems = subgroup;
  o.threads = 2;
  return o;
}

using opt_t = strata::offloaded_adamw<strata::host_tier>;

void run_steps(opt_t& opt, std::size_t n, int steps, std::uint64_t seed) {
  for (int i = 0; i < steps; ++i) opt.step(std::span<const strata::bf16>(random_grads<strata::bf16>(n, seed + i)));
}

std::vector<float> master_of(opt_t& opt, std::size_t n) {
  std::vector<float> m(n);
  opt.read_master(m);
  return m;
}

std::vector<std::string> objects_of(strata::host_tier& t, std::initializer_list<std::string_view> candidates) {
  std::vector<std::string> found;
  for (auto c : candidates)
    if (t.size(c)) found.emplace_back(c);
  return found;
}
}  // namespace

TEST_CASE("a checkpoint saved into a store loads back bit for bit, and a second save replaces the first's objects") {
  const std::size_t n = 5000;
  strata::host_tier tier(strata::host_tier_options{.name = "state"});
  strata::host_tier store_tier(strata::host_tier_options{.name = "store"});
  auto store = strata::any_tier::ref(store_tier);
  opt_t opt(tier, random_params(n, 1), {}, opts(1200));
  run_steps(opt, n, 3, 10);
  opt.save(store);
  const auto first = strata::read_checkpoint_manifest(store);
  CHECK(first.step == 3);
  CHECK(first.subgroup_bytes.size() == 5);
  for (std::size_t s = 0; s < 5; ++s) CHECK(store_tier.size(fmt::format("{}.{}", first.data_file, s)).has_value());
  run_steps(opt, n, 2, 20);
  opt.save(store);
  const auto second = strata::verify_checkpoint(store);
  CHECK(second.step == 5);
  // The first save's parts and manifest went once the pointer named the second.
  for (std::size_t s = 0; s < 5; ++s) CHECK_FALSE(store_tier.size(fmt::format("{}.{}", first.data_file, s)).has_value());
  CHECK_FALSE(store_tier.size("manifest-" + first.data_file.substr(6)).has_value());

  strata::host_tier tier2(strata::host_tier_options{.name = "state2"});
  auto back = opt_t::load(store, tier2, opts(999));  // the checkpoint's subgroup size wins
  CHECK(back.step_count() == 5);
  CHECK(same_bits(master_of(back, n), master_of(opt, n)));
  run_steps(back, n, 1, 30);
  run_steps(opt, n, 1, 30);
  CHECK(same_bits(master_of(back, n), master_of(opt, n)));
}

TEST_CASE("remove_checkpoint removes the checkpoint's parts, manifest and pointer, and nothing else") {
  const std::size_t n = 3000;
  strata::host_tier tier(strata::host_tier_options{.name = "state"});
  strata::host_tier store_tier(strata::host_tier_options{.name = "store"});
  auto store = strata::any_tier::ref(store_tier);
  const std::vector<std::byte> mine(100, std::byte{7});
  store_tier.write("notes", 0, mine).get();  // an object of another form beside the checkpoint
  opt_t opt(tier, random_params(n, 2), {}, opts(1000));
  run_steps(opt, n, 2, 40);
  opt.save(store);
  const auto m = strata::verify_checkpoint(store);
  CHECK(strata::remove_checkpoint(store));
  for (std::size_t s = 0; s < 3; ++s) CHECK_FALSE(store_tier.size(fmt::format("{}.{}", m.data_file, s)).has_value());
  CHECK_FALSE(store_tier.size("manifest-" + m.data_file.substr(6)).has_value());
  CHECK_FALSE(store_tier.size("checkpoint").has_value());
  CHECK(store_tier.size("notes") == mine.size());
  CHECK_FALSE(strata::remove_checkpoint(store));
  CHECK_THROWS_AS((void)strata::verify_checkpoint(store), strata::error);
}

TEST_CASE("a save that fails part-way leaves the previous checkpoint loadable and nothing of itself") {
  const std::size_t n = 4000;
  strata::host_tier tier(strata::host_tier_options{.name = "state"});
  strata::faulty<strata::host_tier> store_tier(strata::host_tier_options{.name = "store"});
  auto store = strata::any_tier::ref(store_tier);
  opt_t opt(tier, random_params(n, 2), {}, opts(1000));
  run_steps(opt, n, 2, 40);
  opt.save(store);
  const auto kept = strata::read_checkpoint_manifest(store);
  run_steps(opt, n, 1, 50);
  // The pointer, then two parts pass; the third part fails.
  store_tier.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = {}, .after = 3});
  CHECK_THROWS_AS(opt.save(store), strata::io_error);
  const auto now = strata::verify_checkpoint(store);
  CHECK(now.step == kept.step);
  CHECK(now.data_file == kept.data_file);
  strata::host_tier tier2(strata::host_tier_options{.name = "state2"});
  CHECK(opt_t::load(store, tier2, opts(1000)).step_count() == 2);
  // A later save succeeds and then holds one checkpoint only: pointer, manifest and 4 parts.
  opt.save(store);
  const auto last = strata::verify_checkpoint(store);
  CHECK(last.step == 3);
  CHECK(store_tier.inner().used() < 2 * (4 * 1000 * 12));
}

TEST_CASE("a missing or damaged part, manifest or pointer in a store is an integrity_error") {
  const std::size_t n = 3000;
  strata::host_tier tier(strata::host_tier_options{.name = "state"});
  strata::host_tier store_tier(strata::host_tier_options{.name = "store"});
  auto store = strata::any_tier::ref(store_tier);
  strata::host_tier tier2(strata::host_tier_options{.name = "state2"});
  CHECK_THROWS_WITH_AS((void)opt_t::load(store, tier2, opts(1000)), doctest::Contains("no checkpoint was saved"),
                       strata::integrity_error);
  opt_t opt(tier, random_params(n, 3), {}, opts(1000));
  run_steps(opt, n, 1, 60);
  opt.save(store);
  const auto m = strata::read_checkpoint_manifest(store);
  const std::string part = m.data_file + ".1";
  std::vector<std::byte> bytes(static_cast<std::size_t>(*store_tier.size(part)));
  store_tier.read(part, 0, bytes).get();

  auto flipped = bytes;
  flipped[100] ^= std::byte{0x10};
  store_tier.write(part, 0, flipped).get();
  CHECK_THROWS_WITH_AS((void)opt_t::load(store, tier2, opts(1000)), doctest::Contains("subgroup 1"), strata::integrity_error);
  CHECK_THROWS_AS((void)strata::verify_checkpoint(store), strata::integrity_error);

  store_tier.remove(part);
  CHECK_THROWS_WITH_AS((void)opt_t::load(store, tier2, opts(1000)), doctest::Contains("missing"), strata::integrity_error);
  store_tier.write(part, 0, bytes).get();
  CHECK(strata::verify_checkpoint(store).step == 1);  // whole again

  const std::string manifest = "manifest-" + m.data_file.substr(6);
  std::vector<std::byte> text(static_cast<std::size_t>(*store_tier.size(manifest)));
  store_tier.read(manifest, 0, text).get();
  auto edited = text;
  edited[30] = std::byte{'9'};
  store_tier.write(manifest, 0, edited).get();
  CHECK_THROWS_AS((void)strata::read_checkpoint_manifest(store), strata::integrity_error);
  store_tier.write(manifest, 0, text).get();

  std::vector<std::byte> pointer(512);
  store_tier.read("checkpoint", 0, pointer).get();
  auto bad_pointer = pointer;
  bad_pointer[40] ^= std::byte{1};
  store_tier.write("checkpoint", 0, bad_pointer).get();
  CHECK_THROWS_WITH_AS((void)strata::read_checkpoint_manifest(store), doctest::Contains("checksum"), strata::integrity_error);
  store_tier.write("checkpoint", 0, pointer).get();
  CHECK(strata::verify_checkpoint(store).step == 1);
  CHECK(objects_of(store_tier, {"checkpoint"}).size() == 1);
}

}  // namespace store_checkpoint_test
