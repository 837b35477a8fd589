// Nothing of the user's is deleted or silently corrupted, a crash leaves nothing that stops the
// next run, and bad input is a typed error (the tools' side is in tests/CMakeLists.txt, label
// `reliability`, and kill_test.cpp).
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <strata/strata.hpp>

#include "../tier/tier_fixtures.hpp"
#include "../child_process.hpp"
#include "offload_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace reliability_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;
using host_opt = strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating>;

constexpr std::size_t n = 10'000, sg = 1'000;

strata::offload_options small_options() {
  strata::offload_options off;
  off.subgroup_elems = sg;
  off.threads = 1;
  return off;
}

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

}  // namespace

TEST_CASE("a learning rate of 0 is a step: the moments advance, the weights do not move") {
  const auto init = random_params(n, 1);
  for (const bool decoupled : {true, false}) {
    CAPTURE(decoupled);
    strata::adamw_options ao;
    ao.decoupled = decoupled;
    ao.weight_decay = 0.1;
    strata::host_tier tier(strata::host_tier_options{.name = "t"});
    host_opt opt(tier, init, ao, small_options());
    flat_reference ref(init, ao);
    const auto g = random_grads<strata::bf16>(n, 2);
    opt.step(std::span<const strata::bf16>(g), 0.0);
    ref.step(std::span<const strata::bf16>(g), 0.0);
    require_same_state(opt, ref);
    std::vector<float> w(n);
    opt.read_master(w);
    if (decoupled) CHECK(same_bits(w, init));  // Adam's L2 term still moves v, never p at lr 0
    CHECK_THROWS_AS(opt.step(std::span<const strata::bf16>(g), -1e-3), strata::config_error);
    CHECK_THROWS_AS(opt.step(std::span<const strata::bf16>(g), std::numeric_limits<double>::infinity()),
                    strata::config_error);
  }
}

TEST_CASE("a gradient range handed over twice is refused, and a gap never reaches step()") {
  const auto init = random_params(n, 3);
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, init, {}, small_options());
  const auto g = random_grads<strata::bf16>(n, 4);
  const std::span<const strata::bf16> all(g);
  opt.accept_gradients_at(0, all.subspan(0, 1500));
  // Overlaps [0, 1500): refused before anything is stored, whatever the count would say.
  CHECK_THROWS_WITH_AS(opt.accept_gradients_at(1200, all.subspan(1200, 300)), doctest::Contains("overlaps [1000, 1500)"),
                       strata::config_error);
  CHECK_THROWS_AS(opt.accept_gradients_at(0, all.subspan(0, 10)), strata::config_error);
  opt.accept_gradients_at(1500, all.subspan(1500, 500));
  // Subgroup 2 gets [2000, 2400) and [2600, 3000): 800 of 1000, with a gap; before, handing the
  // first range twice made the count whole and the step ran on stale gradients.
  opt.accept_gradients_at(2000, all.subspan(2000, 400));
  opt.accept_gradients_at(2600, all.subspan(2600, 400));
  CHECK_THROWS_AS(opt.accept_gradients_at(2100, all.subspan(2100, 200)), strata::config_error);
  opt.accept_gradients_at(3000, all.subspan(3000, n - 3000));
  CHECK_THROWS_WITH_AS(opt.step(1e-3), doctest::Contains("subgroup 2 has 800 of its 1000"), strata::config_error);
  opt.accept_gradients_at(2400, all.subspan(2400, 200));  // fills the gap exactly
  flat_reference ref(init, {});
  opt.step(1e-3);
  ref.step(all, 1e-3);
  require_same_state(opt, ref);
}

TEST_CASE("save() removes only data files its own manifests named, never a user's file") {
  temp_dir dir(fs::temp_directory_path(), "ckpt");
  const auto ck = dir.path() / "ckpt";
  fs::create_directories(ck);
  write_file(ck / "state-of-the-art.txt", "mine");
  write_file(ck / "state-7-0123456789abcdef.bin", "mine too, though it looks like a data file");
  const auto init = random_params(n, 5);
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, init, {}, small_options());
  const auto g = random_grads<strata::bf16>(n, 6);
  opt.save(ck);
  const auto first = strata::read_checkpoint_manifest(ck).data_file;
  opt.step(std::span<const strata::bf16>(g), 1e-3);
  // A save killed after it created its data file: named in the journal, so the next save may go.
  write_file(ck / "state-1-00000000deadbeef.bin", "left by a killed save");
  std::ofstream(strata::detail::checkpoint_journal_path(ck), std::ios::app)
      << "+ state-1-00000000deadbeef.bin\n+ ../escape\n";
  opt.save(ck);
  const auto second = strata::read_checkpoint_manifest(ck).data_file;
  CHECK(second != first);
  CHECK_FALSE(fs::exists(ck / first));                          // replaced by the new checkpoint
  CHECK_FALSE(fs::exists(ck / "state-1-00000000deadbeef.bin"));  // the killed save's leftover
  CHECK(listing(ck) == std::set<std::string>{".strata-objects.checkpoint", "manifest", second, "state-of-the-art.txt",
                                             "state-7-0123456789abcdef.bin"});
  CHECK(fs::exists(ck / second));
  CHECK(read_file(ck / "state-of-the-art.txt") == "mine");
  CHECK(fs::exists(ck / "state-7-0123456789abcdef.bin"));
  strata::host_tier tier2(strata::host_tier_options{.name = "t2"});
  auto back = host_opt::load(ck, tier2, small_options());
  CHECK(back.step_count() == 1);
}

TEST_CASE("a user's manifest where a save goes is refused by name and left as it was") {
  temp_dir dir(fs::temp_directory_path(), "ckpt-user-manifest");
  const auto ck = dir.path() / "ckpt";
  fs::create_directories(ck);
  write_file(ck / "manifest", "my shopping list\n");
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, random_params(n, 5), {}, small_options());
  CHECK_THROWS_WITH_AS(opt.save(ck), doctest::Contains((ck / "manifest").c_str()), strata::foreign_file_error);
  CHECK(read_file(ck / "manifest") == "my shopping list\n");
  CHECK(listing(ck) == std::set<std::string>{"manifest"});  // the refused save left nothing
  // Loading it is refused too (it is no checkpoint), and it is still the user's afterwards.
  strata::host_tier tier2(strata::host_tier_options{.name = "t2"});
  CHECK_THROWS_AS((void)host_opt::load(ck, tier2, small_options()), strata::integrity_error);
  CHECK_FALSE(strata::remove_checkpoint(ck));
  CHECK(listing(ck) == std::set<std::string>{"manifest"});
}

TEST_CASE("a user's manifest.pending naming a user's file: saves leave both as they were") {
  temp_dir dir(fs::temp_directory_path(), "ckpt-user-pending");
  const auto ck = dir.path() / "ckpt";
  fs::create_directories(ck);
  write_file(ck / "manifest.pending", "state-1-00000000deadbeef.bin\n");
  write_file(ck / "state-1-00000000deadbeef.bin", "my data, named like strata's");
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, random_params(n, 5), {}, small_options());
  const auto g = random_grads<strata::bf16>(n, 6);
  for (int save = 0; save < 3; ++save) {
    opt.save(ck);
    opt.step(std::span<const strata::bf16>(g), 1e-3);
  }
  CHECK(read_file(ck / "manifest.pending") == "state-1-00000000deadbeef.bin\n");
  CHECK(read_file(ck / "state-1-00000000deadbeef.bin") == "my data, named like strata's");
  CHECK(listing(ck).size() == 5);  // theirs, the journal, the manifest and one data file
  CHECK(strata::remove_checkpoint(ck));
  CHECK(listing(ck) == std::set<std::string>{"manifest.pending", "state-1-00000000deadbeef.bin"});
}

TEST_CASE("a checkpoint directory that is a symlink to a user's folder: the user's files there stay") {
  temp_dir dir(fs::temp_directory_path(), "ckpt-link");
  const auto folder = dir.path() / "my-folder";
  const auto link = dir.path() / "ckpt";
  fs::create_directories(folder);
  fs::create_directory_symlink(folder, link);
  write_file(folder / "notes.txt", "notes");
  write_file(folder / "manifest", "my manifest");
  write_file(folder / "manifest.pending", "state-2-00000000cafef00d.bin\n");
  write_file(folder / "state-2-00000000cafef00d.bin", "my data");
  const auto theirs = listing(folder);
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, random_params(n, 5), {}, small_options());
  CHECK_THROWS_WITH_AS(opt.save(link), doctest::Contains((link / "manifest").c_str()), strata::foreign_file_error);
  CHECK(listing(folder) == theirs);
  CHECK(read_file(folder / "manifest") == "my manifest");
  // With their manifest moved aside the folder takes checkpoints, and their files stay.
  fs::rename(folder / "manifest", folder / "manifest.mine");
  const auto g = random_grads<strata::bf16>(n, 6);
  opt.save(link);
  opt.step(std::span<const strata::bf16>(g), 1e-3);
  opt.save(link);
  CHECK(fs::is_symlink(link));
  CHECK(read_file(folder / "notes.txt") == "notes");
  CHECK(read_file(folder / "manifest.mine") == "my manifest");
  CHECK(read_file(folder / "manifest.pending") == "state-2-00000000cafef00d.bin\n");
  CHECK(read_file(folder / "state-2-00000000cafef00d.bin") == "my data");
  strata::host_tier tier2(strata::host_tier_options{.name = "t2"});
  CHECK(host_opt::load(link, tier2, small_options()).step_count() == 1);
}

TEST_CASE("a checkpoint without a journal (an earlier release's) loads; it is replaced and pruned as far as it "
          "proves itself strata's") {
  temp_dir dir(fs::temp_directory_path(), "ckpt-legacy");
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, random_params(n, 5), {}, small_options());
  const auto g = random_grads<strata::bf16>(n, 6);
  opt.step(std::span<const strata::bf16>(g), 1e-3);
  // What an earlier release left: a manifest and its data file, no journal (and, from a save it
  // was killed in, a manifest.pending naming a data file, which no manifest proves strata's).
  const auto legacy = [&](const fs::path& ck) {
    opt.save(ck);
    fs::remove(strata::detail::checkpoint_journal_path(ck));
    write_file(ck / "manifest.pending", "state-1-0000000000000001.bin\n");
    write_file(ck / "state-1-0000000000000001.bin", "unproven");
    return strata::read_checkpoint_manifest(ck).data_file;
  };
  SUBCASE("it loads, and a save replaces it") {
    const auto ck = dir.path() / "a";
    const auto old_data = legacy(ck);
    strata::host_tier tier2(strata::host_tier_options{.name = "t2"});
    CHECK(host_opt::load(ck, tier2, small_options()).step_count() == 1);
    opt.step(std::span<const strata::bf16>(g), 1e-3);
    opt.save(ck);
    const auto data = strata::read_checkpoint_manifest(ck).data_file;
    CHECK(strata::read_checkpoint_manifest(ck).step == 2);
    CHECK(listing(ck) == std::set<std::string>{".strata-objects.checkpoint", "manifest", data, "manifest.pending",
                                               "state-1-0000000000000001.bin"});
    CHECK(old_data != data);
  }
  SUBCASE("retention removes it") {
    const auto ck = dir.path() / "b";
    (void)legacy(ck);
    CHECK(strata::remove_checkpoint(ck));
    CHECK(listing(ck) == std::set<std::string>{"manifest.pending", "state-1-0000000000000001.bin"});
  }
  SUBCASE("a damaged data file is not proven strata's: only the manifest goes") {
    const auto ck = dir.path() / "c";
    const auto data = legacy(ck);
    {
      std::fstream f(ck / data, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put('\x7f');
    }
    CHECK(strata::remove_checkpoint(ck));
    CHECK(listing(ck) == std::set<std::string>{"manifest.pending", "state-1-0000000000000001.bin", data});
  }
}

TEST_CASE("a failed save removes the directories it created and leaves the ones that were there") {
  temp_dir dir(fs::temp_directory_path(), "ckpt-failed");
  strata::checkpoint_manifest m;
  m.step = 3;
  const auto failing = [](auto&&) { throw strata::io_error("pwrite", "somewhere", 0, EIO); };
  CHECK_THROWS_AS(strata::write_checkpoint(dir.path() / "run" / "step-3", m, 1, failing), strata::io_error);
  CHECK(listing(dir.path()).empty());
  fs::create_directories(dir.path() / "run");
  CHECK_THROWS_AS(strata::write_checkpoint(dir.path() / "run" / "step-3", m, 1, failing), strata::io_error);
  CHECK(listing(dir.path()) == std::set<std::string>{"run"});
  CHECK(listing(dir.path() / "run").empty());
}

TEST_CASE("verify_checkpoint reads a whole checkpoint back and names the first damaged subgroup") {
  temp_dir dir(fs::temp_directory_path(), "ckpt");
  const auto ck = dir.path() / "ckpt";
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, random_params(n, 5), {}, small_options());
  const auto g = random_grads<strata::bf16>(n, 6);
  opt.step(std::span<const strata::bf16>(g), 1e-3);
  opt.save(ck);
  CHECK(strata::verify_checkpoint(ck).step == 1);
  const auto data = ck / strata::read_checkpoint_manifest(ck).data_file;
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(3 * (fs::file_size(data) / 10) + 5);  // inside subgroup 3
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(at);
    f.write(&c, 1);
  }
  try {
    (void)strata::verify_checkpoint(ck);
    FAIL("a damaged checkpoint passed verification");
  } catch (const strata::integrity_error& e) {
    CHECK(std::string(e.what()).find("subgroup 3") != std::string::npos);
  }
  CHECK_THROWS_AS((void)strata::verify_checkpoint(dir.path() / "missing"), strata::io_error);
}

TEST_CASE("Adam without a weight_decay gets PyTorch's default for its mode") {
  strata::adamw_options adamw;
  CHECK(adamw.decay() == 1e-2);
  strata::adamw_options adam;
  adam.decoupled = false;
  CHECK(adam.decay() == 0.0);
  CHECK_FALSE(strata::make_adamw_step_params(adam, 1, 1e-3).l2);  // no L2 term nobody asked for
  adam.weight_decay = 0.05;
  CHECK(strata::make_adamw_step_params(adam, 1, 1e-3).l2);
  adamw.weight_decay = 0.0;
  CHECK(strata::make_adamw_step_params(adamw, 1, 1e-3).decay_factor == 1.0f);
}

TEST_CASE("cache_subgroups keeps exactly K subgroups where a byte count would lose one to rounding") {
  const auto init = random_params(n, 7);
  auto off = small_options();
  const auto layout = strata::offload_layout::of(n, {}, off);
  off.host_cache_bytes = 3 * layout.slot_bytes();  // 3 slots' bytes, but slots are page-rounded
  {
    strata::host_tier tier(strata::host_tier_options{.name = "t"});
    host_opt opt(tier, init, {}, off);
    CHECK(opt.stats().cache_slots == 2);  // the trap
  }
  off.cache_subgroups = 3;
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, init, {}, off);
  CHECK(opt.stats().cache_slots == 3);
  off.cache_subgroups = 1000;  // more than there are: all of them
  strata::host_tier tier2(strata::host_tier_options{.name = "t2"});
  CHECK(host_opt(tier2, init, {}, off).stats().cache_slots == n / sg);
}

TEST_CASE("remove_state removes exactly the optimizer's objects; the optimizer is then refused") {
  const auto init = random_params(n, 8);
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  const std::vector<std::byte> user(100, std::byte{42});
  tier.write("users-own-object", 0, user).get();
  auto off = small_options();
  off.object_prefix = "mine";
  host_opt opt(tier, init, {}, off);
  CHECK(opt.remove_state() == n / sg);
  for (std::size_t s = 0; s < n / sg; ++s) CHECK_FALSE(tier.size(opt.object_name(s)).has_value());
  CHECK(tier.size("users-own-object") == 100);
  const auto g = random_grads<strata::bf16>(n, 9);
  CHECK_THROWS_WITH_AS(opt.step(std::span<const strata::bf16>(g), 1e-3), doctest::Contains("remove_state"),
                       strata::config_error);
  CHECK_THROWS_AS(opt.flush(), strata::config_error);
  CHECK_THROWS_AS(opt.remove_state(), strata::config_error);
}

namespace {

/// A host tier whose removals fail (a path that is down), as io_error naming the object's path.
class unremovable : public strata::detail::adaptor_base<strata::host_tier> {
 public:
  explicit unremovable(strata::host_tier_options o) : adaptor_base(std::in_place, std::move(o)) {}
  strata::completion write(std::string_view o, std::uint64_t off, std::span<const std::byte> b) {
    return inner_.write(o, off, b);
  }
  strata::completion read(std::string_view o, std::uint64_t off, std::span<std::byte> d) { return inner_.read(o, off, d); }
  bool remove(std::string_view o) { throw strata::io_error("remove", fs::path("/mnt/down") / std::string(o), EIO); }
};
static_assert(strata::tier<unremovable>);

}  // namespace

TEST_CASE("remove_state goes on past a path that fails: the healthy path is emptied, then the first failure is raised") {
  const auto init = random_params(n, 10);
  std::vector<strata::any_tier> paths;
  paths.push_back(strata::any_tier::make<strata::host_tier>(strata::host_tier_options{.name = "healthy"}));
  paths.push_back(strata::any_tier::make<unremovable>(strata::host_tier_options{.name = "down"}));
  strata::dynamic_multipath<strata::fixed_ratio> tier(strata::fixed_ratio({1, 1}), std::move(paths));
  auto& healthy = *tier.path(0).target<strata::host_tier>();
  auto& down = *tier.path(1).target<unremovable>();
  strata::offloaded_adamw<strata::dynamic_multipath<strata::fixed_ratio>, strata::lru, strata::alternating> opt(
      tier, init, {}, small_options());
  std::size_t on_healthy = 0, on_down = 0;
  for (std::size_t s = 0; s < n / sg; ++s) {
    on_healthy += healthy.size(opt.object_name(s)).has_value() ? 1 : 0;
    on_down += down.size(opt.object_name(s)).has_value() ? 1 : 0;
  }
  REQUIRE(on_healthy > 0);
  REQUIRE(on_down > 0);
  // The path that fails holds subgroup 1, which comes before most of the healthy path's.
  REQUIRE(down.size(opt.object_name(1)).has_value());
  const std::string named = "/mnt/down/" + opt.object_name(1);
  CHECK_THROWS_WITH_AS(opt.remove_state(), doctest::Contains(named.c_str()), strata::io_error);
  for (std::size_t s = 0; s < n / sg; ++s) CHECK_FALSE(healthy.size(opt.object_name(s)).has_value());
  std::size_t left = 0;
  for (std::size_t s = 0; s < n / sg; ++s) left += down.size(opt.object_name(s)).has_value() ? 1 : 0;
  CHECK(left == on_down);
}

TEST_CASE("a tier directory has one owner: a second file_tier on it is a busy_error naming the holder") {
  temp_dir dir(fs::temp_directory_path(), "owned");
  strata::file_tier_options fo;
  fo.directory = dir.path() / "tier";
  fo.name = "first";
  {
    strata::file_tier first(fo);
    fo.name = "second";
    try {
      strata::file_tier second(fo);
      FAIL("two file tiers share a directory");
    } catch (const strata::busy_error& e) {
      CHECK(e.holder_pid() == ::getpid());
      CHECK(std::string(e.what()).find("file_tier 'first'") != std::string::npos);
      CHECK(std::string(e.what()).find(fo.directory.string()) != std::string::npos);
    }
  }
  CHECK_NOTHROW(strata::file_tier{fo});  // free again once the owner is gone
  CHECK_FALSE(fs::exists(fo.directory / std::string(strata::directory_lock::file_name)));
}

TEST_CASE("two optimizers of one process never share a prefix of one tier") {
  const auto init = random_params(n, 10);
  strata::host_tier tier(strata::host_tier_options{.name = "shared"});
  auto off = small_options();
  host_opt a(tier, init, {}, off);
  CHECK_THROWS_WITH_AS(host_opt(tier, init, {}, off), doctest::Contains("prefix 'strata' is in use"), strata::busy_error);
  off.object_prefix = "other";
  host_opt b(tier, init, {}, off);  // its own prefix: fine
  host_opt moved(std::move(a));     // the claim moves with the optimizer
  off.object_prefix = "strata";
  CHECK_THROWS_AS(host_opt(tier, init, {}, off), strata::busy_error);
}

TEST_CASE("too many parameters is a config_error computed before anything is allocated") {
  CHECK_THROWS_AS((void)strata::offload_layout::of(std::size_t{1} << 62, {}, small_options()), strata::config_error);
  CHECK_THROWS_AS((void)host_opt::required_host_memory(std::size_t{1} << 62, {}, small_options()), strata::config_error);
}

TEST_CASE("a tier too small for the state is refused up front; a construction that fails removes what it wrote") {
  const auto init = random_params(n, 11);
  {
    strata::host_tier tier(strata::host_tier_options{.name = "small", .capacity = 64 * 1024});
    CHECK_THROWS_WITH_AS(host_opt(tier, init, {}, small_options()), doctest::Contains("on tier 'small', which has 64 KiB free"),
                         strata::capacity_error);
    CHECK(tier.used() == 0);  // refused before the first write
  }
  strata::faulty<strata::host_tier> tier(strata::host_tier_options{.name = "disk"});
  const std::vector<std::byte> old(16, std::byte{1});
  tier.write("strata.sg-9", 0, old).get();  // an earlier optimizer's object: replaced, not patched
  tier.write("users-object", 0, old).get();
  tier.inject({.kind = strata::fault_kind::enospc, .op = strata::fault_op::write, .object = {}, .after = 4});
  using faulty_opt = strata::offloaded_adamw<strata::faulty<strata::host_tier>, strata::lru, strata::alternating>;
  CHECK_THROWS_AS(faulty_opt(tier, init, {}, small_options()), strata::capacity_error);
  for (std::size_t s = 0; s < 10; ++s) CHECK_FALSE(tier.size(fmt::format("strata.sg-{}", s)).has_value());
  CHECK(tier.size("users-object") == 16);
}

TEST_CASE("a damaged state file always ends in integrity_error, never in a wrong weight") {
  temp_dir dir(fs::temp_directory_path(), "fuzz");
  strata::offloaded_adamw_config c;
  c.preset = "strata";
  c.offload = small_options();
  c.offload.host_cache_bytes = 0;  // every read goes to the files
  c.integrity_block_bytes = 4096;
  strata::offload_path_config p;
  p.directory = dir.path() / "nvme";
  p.name = "nvme";
  c.paths.push_back(p);
  const auto init = random_params(n, 12);
  auto opt = strata::make_offloaded_adamw(c, init);
  opt.flush();
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(p.directory))
    if (e.is_regular_file() && e.path().filename().string().front() != '.') files.push_back(e.path());
  REQUIRE(files.size() == n / sg);
  std::mt19937_64 rng(13);
  std::vector<float> w(n);
  for (int round = 0; round < 40; ++round) {
    const auto& f = files[rng() % files.size()];
    const auto size = fs::file_size(f);
    const auto at = static_cast<std::streamoff>(rng() % size);
    char byte = 0;
    {
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(at);
      io.read(&byte, 1);
      const char flipped = static_cast<char>(byte ^ static_cast<char>(1 + rng() % 255));
      io.seekp(at);
      io.write(&flipped, 1);
    }
    CAPTURE(f);
    CAPTURE(at);
    CHECK_THROWS_AS(opt.read_master(w), strata::integrity_error);
    {
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(at);
      io.write(&byte, 1);
    }
    opt.read_master(w);
    CHECK(same_bits(w, init));
  }
  CHECK(opt.remove_state() == n / sg);
}

TEST_CASE("thousands of requests in flight on a file_tier queue for descriptors instead of failing") {
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  struct rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, rlim_t{256});
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  temp_dir dir(fs::temp_directory_path(), "fds");
  {
    strata::file_tier_options fo;
    fo.directory = dir.path() / "t";
    fo.name = "fds";
    fo.threads = 4;
    strata::file_tier t(fo);  // takes at most half of the 256 for requests
    const std::vector<std::byte> data(4096, std::byte{7});
    std::vector<strata::completion> fs;
    for (int i = 0; i < 2000; ++i) fs.push_back(t.write(fmt::format("o-{}", i), 0, data));
    CHECK_NOTHROW(strata::wait_all(fs));
    for (int i = 0; i < 2000; ++i) CHECK(t.remove(fmt::format("o-{}", i)));
  }
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);
}

namespace {

// The state files of `dir` padded to whole 4 KiB blocks, as a kill between file_tier's padded
// O_DIRECT write and its ftruncate leaves them.
std::size_t pad_objects(const fs::path& dir) {
  std::size_t padded = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (!name.starts_with("strata.sg-")) continue;
    const auto size = fs::file_size(e.path());
    if (size % 4096 == 0) continue;
    fs::resize_file(e.path(), (size / 4096 + 1) * 4096);
    ++padded;
  }
  return padded;
}

}  // namespace

TEST_CASE("objects a crash left longer than their state stop neither a resume nor a fresh run under checksums") {
  temp_dir dir(fs::temp_directory_path(), "padded");
  strata::offloaded_adamw_config c;
  c.preset = "strata";
  c.offload = small_options();
  c.integrity_block_bytes = 64 * 1024;  // the default: one block per subgroup, cut by the padding
  strata::offload_path_config p;
  p.directory = dir.path() / "nvme";
  p.name = "nvme";
  c.paths.push_back(p);
  const auto ck = dir.path() / "ckpt";
  const auto init = random_params(n, 21);
  const auto g = random_grads<strata::bf16>(n, 22);
  flat_reference ref(init, {});
  std::vector<float> w(n);
  {
    auto opt = strata::make_offloaded_adamw(c, init);
    opt.save(ck);
    opt.step(std::span<const strata::bf16>(g), 1e-3);
    opt.flush();
  }  // as after a kill: the objects stay, recorded in the directory's journal
  REQUIRE(pad_objects(p.directory) == n / sg);
  {
    auto opt = strata::load_offloaded_adamw(c, ck);  // resumes from step 0, whatever the tier holds
    opt.read_master(w);
    CHECK(same_bits(w, init));
    opt.step(std::span<const strata::bf16>(g), 1e-3);
    ref.step(std::span<const strata::bf16>(g), 1e-3);
    opt.read_master(w);
    CHECK(same_bits(w, ref.p));
    opt.flush();
  }
  REQUIRE(pad_objects(p.directory) == n / sg);
  auto opt = strata::make_offloaded_adamw(c, init);  // a fresh run reclaims the killed run's objects
  opt.read_master(w);
  CHECK(same_bits(w, init));
  CHECK(opt.remove_state() == n / sg);
}

TEST_CASE("a fresh run refuses another job's objects by name and leaves them; asked to, it replaces them") {
  temp_dir dir(fs::temp_directory_path(), "foreign");
  strata::offloaded_adamw_config c;
  c.offload = small_options();
  strata::offload_path_config p;
  p.directory = dir.path() / "nvme";
  c.paths.push_back(p);
  fs::create_directories(p.directory);
  write_file(p.directory / "strata.sg-4", "another job's subgroup");
  const auto init = random_params(n, 23);
  CHECK_THROWS_WITH_AS(strata::make_offloaded_adamw(c, init), doctest::Contains("strata.sg-4"),
                       strata::foreign_file_error);
  CHECK(read_file(p.directory / "strata.sg-4") == "another job's subgroup");
  c.paths[0].adopt_existing = true;
  auto opt = strata::make_offloaded_adamw(c, init);
  std::vector<float> w(n);
  opt.read_master(w);
  CHECK(same_bits(w, init));
  CHECK(opt.remove_state() == n / sg);
  CHECK_FALSE(fs::exists(p.directory / "strata.sg-4"));
}

TEST_CASE("two saves into one checkpoint directory at once: the second is a busy_error naming the first") {
  temp_dir dir(fs::temp_directory_path(), "ckpt-busy");
  const auto ck = dir.path() / "ckpt";
  fs::create_directories(ck);
  const auto init = random_params(n, 24);
  strata::host_tier tier(strata::host_tier_options{.name = "t"});
  host_opt opt(tier, init, {}, small_options());
  {
    const strata::directory_lock saving(ck, "a checkpoint save of step 7");  // another optimizer, mid-save
    CHECK_THROWS_WITH_AS(opt.save(ck), doctest::Contains("a checkpoint save of step 7"), strata::busy_error);
  }
  int locked[2], tried[2];  // child -> parent: "holding"; parent -> child: "done, let go"
  REQUIRE(::pipe(locked) == 0);
  REQUIRE(::pipe(tried) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // another process saving: holds the directory until the parent has tried
    ::close(locked[0]);
    ::close(tried[1]);
    try {
      const strata::directory_lock saving(ck, "a checkpoint save of step 9");
      char c = 'x';
      (void)!::write(locked[1], &c, 1);
      (void)!::read(tried[0], &c, 1);
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  ::close(locked[1]);
  ::close(tried[0]);
  char c = 0;
  REQUIRE(::read(locked[0], &c, 1) == 1);
  try {
    opt.save(ck);
    FAIL("two saves ran at once");
  } catch (const strata::busy_error& e) {
    CHECK(e.holder_pid() == child);
    CHECK(std::string(e.what()).find("step 9") != std::string::npos);
  }
  (void)!::write(tried[1], &c, 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  ::close(locked[0]);
  ::close(tried[1]);
  CHECK(fs::is_empty(ck));  // the refused saves left nothing
  opt.save(ck);             // and the directory is free again
  CHECK(strata::read_checkpoint_manifest(ck).step == 0);
}

namespace {

// Runs `body` in a child process with a tmpfs of `bytes` mounted at `dir` (a user and mount
// namespace of its own: no privilege needed, nothing outside sees it). Returns the child's exit
// code: 0 when `body` returned true, 77 when this kernel gives no such namespace.
template <class Body>
int on_small_tmpfs(const fs::path& dir, std::uint64_t bytes, Body&& body) {
  const auto uid = ::geteuid();
  const auto gid = ::getegid();
  const auto end = in_child([&]() -> int {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return 77;
    const auto put = [](const char* file, const std::string& text) {
      const int fd = ::open(file, O_WRONLY);
      const bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      if (fd >= 0) ::close(fd);
      return ok;
    };
    if (!put("/proc/self/setgroups", "deny") || !put("/proc/self/uid_map", fmt::format("0 {} 1", uid)) ||
        !put("/proc/self/gid_map", fmt::format("0 {} 1", gid)))
      return 77;
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, fmt::format("size={}", bytes).c_str()) != 0) return 77;
    return body() ? 0 : 1;
  });
  INFO(describe(end));
  REQUIRE_FALSE(end.hung);
  REQUIRE(end.signal == 0);
  return end.code;
}

}  // namespace

TEST_CASE("a full disk at any point of a save is a capacity_error that leaves nothing behind") {
  temp_dir dir(fs::temp_directory_path(), "ckpt-full");
  const auto mnt = dir.path() / "small";
  fs::create_directories(mnt);
  constexpr std::uint64_t disk = 512 * 1024;  // the checkpoint is 120 KB: about a quarter of it
  const int rc = on_small_tmpfs(mnt, disk, [&] {
    const auto init = random_params(n, 25);
    strata::host_tier tier(strata::host_tier_options{.name = "t"});
    host_opt opt(tier, init, {}, small_options());
    const auto ck = mnt / "ckpt";
    fs::create_directories(ck);
    const auto filler = mnt / "filler";
    bool ok = true;
    // Each save is tried with 0, 4, 8, ... KiB free until it fits: the disk fills in the
    // journal, the data file, its fsync or the manifest.
    for (int save = 0; save < 2 && ok; ++save) {
      const auto before = listing(ck);
      int failures = 0;
      for (std::uint64_t free = 0;; free += 4096) {
        fs::remove(filler);
        {
          const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
          const std::vector<char> page(4096, 'f');
          while (::write(fd, page.data(), page.size()) == static_cast<ssize_t>(page.size())) {
          }
          ::close(fd);
        }
        fs::resize_file(filler, fs::file_size(filler) > free ? fs::file_size(filler) - free : 0);
        try {
          opt.save(ck);
          break;
        } catch (const strata::capacity_error&) {
          ++failures;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "save %d with %llu bytes free: not a capacity_error: %s\n", save,
                       static_cast<unsigned long long>(free), e.what());
          return false;
        }
        if (const auto after = listing(ck); after != before) {
          std::string extra;
          for (const auto& f : after) extra += " " + f;
          std::fprintf(stderr, "save %d with %llu bytes free left files behind; now:%s\n", save,
                       static_cast<unsigned long long>(free), extra.c_str());
          return false;
        }
        if (free > disk) return false;
      }
      ok = failures > 3;  // the sweep met the disk filling up several times
      if (!ok) std::fprintf(stderr, "save %d failed only %d times\n", save, failures);
      strata::host_tier back_tier(strata::host_tier_options{.name = "back"});
      ok = ok && host_opt::load(ck, back_tier, small_options()).step_count() == opt.step_count();
      const auto g = random_grads<strata::bf16>(n, 26);
      opt.step(std::span<const strata::bf16>(g), 1e-3);
    }
    return ok;
  });
  if (rc == 77) {
    MESSAGE("skipped: no user and mount namespace here (a small tmpfs is needed to fill a disk)");
    return;
  }
  CHECK(rc == 0);
}

}  // namespace reliability_test
