// mmap_tier (examples/extending/mmap_tier.hpp), a tier written outside the library, through the
// typed tier suite, with its copies on a pool and on the calling thread; then what it adds.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "../../examples/extending/mmap_tier.hpp"
#include "../tier/tier_suite.hpp"
#include "../tier/tier_test_support.hpp"

namespace strata_test {

// doc-snippet: fixture
// What the suite asks of a fixture: a name, the tier type, a constructor taking a capacity
// (unlimited by default) and tier(). This one gives each test a fresh directory.
template <std::size_t Threads>
struct mmap_fixture {
  static constexpr const char* name = Threads == 0 ? "mmap_tier(copies inline)" : "mmap_tier(copy pool)";
  using tier_type = extending::mmap_tier;
  explicit mmap_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : t({.directory = dir.path(), .capacity = cap, .threads = Threads}) {}
  tier_type& tier() { return t; }
  temp_dir dir{fs::temp_directory_path(), "mmap"};
  tier_type t;
};
// doc-snippet-end

}  // namespace strata_test

// doc-snippet: invoke
namespace strata_test::tier_suite {
STRATA_TIER_SUITE(strata_test::mmap_fixture<0>, strata_test::mmap_fixture<2>);
}  // namespace strata_test::tier_suite
// doc-snippet-end

namespace strata_test {

TEST_CASE("a reopened mmap_tier finds the objects the last one flushed, byte for byte") {
  temp_dir dir(fs::temp_directory_path(), "mmap");
  const auto a = random_bytes(100000, 1), b = random_bytes(3, 2);
  {
    extending::mmap_tier t({.directory = dir.path()});
    t.write("sg-0", 0, a).get();
    t.write("sg-1", 0, b).get();
    t.write("gone", 0, b).get();
    CHECK(t.remove("gone"));
    t.flush();
  }
  write_text(dir / "not an object", "left alone");  // a name no object can have
  extending::mmap_tier t({.directory = dir.path()});
  CHECK(t.used() == a.size() + b.size());
  REQUIRE(t.size("sg-0") == a.size());
  CHECK_FALSE(t.size("gone").has_value());
  std::vector<std::byte> back(a.size());
  t.read("sg-0", 0, back).get();
  CHECK(back == a);
  CHECK(read_text(dir / "not an object") == "left alone");
}

TEST_CASE("a refused write leaves no file and no object behind") {
  temp_dir dir(fs::temp_directory_path(), "mmap");
  extending::mmap_tier t({.directory = dir.path(), .capacity = 1000});
  CHECK_THROWS_AS(t.write("big", 0, random_bytes(1001, 3)).get(), strata::capacity_error);
  CHECK_FALSE(t.size("big").has_value());
  CHECK_FALSE(fs::exists(dir / "big"));
  CHECK(t.used() == 0);
  CHECK_THROWS_WITH_AS(extending::mmap_tier({.directory = ""}), doctest::Contains("no directory"),
                       strata::config_error);
}

}  // namespace strata_test
