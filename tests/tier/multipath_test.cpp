// multipath: objects an earlier run left are found on their paths, assign bypasses placement,
// and the path queries (count, descriptors, which path holds an object) answer through any_tier.
#include <doctest/doctest.h>

#include <vector>

#include <strata/policy/placement.hpp>
#include <strata/tier/any_tier.hpp>
#include <strata/tier/multipath.hpp>

#include "tier_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace multipath_test {

using namespace strata_test;

TEST_CASE("a multipath finds objects an earlier run left on its paths, and assign bypasses placement") {
  temp_dir a, b;
  const auto data = random_bytes(5000, 2);
  {
    strata::file_tier pb(file_opts(b.path(), strata::io_backend::automatic, strata::unlimited_capacity, "b"));
    pb.write("old", 0, data).get();
  }
  strata::multipath<strata::fixed_ratio, strata::file_tier, strata::file_tier> m(
      strata::fixed_ratio({1, 1}), file_opts(a.path(), strata::io_backend::automatic, strata::unlimited_capacity, "a"),
      file_opts(b.path(), strata::io_backend::automatic, strata::unlimited_capacity, "b"));
  CHECK(m.path_of("old") == 1u);
  std::vector<std::byte> out(data.size());
  m.read("old", 0, out).get();
  CHECK(out == data);
  m.assign("pinned", 1);
  m.write("pinned", 0, data).get();
  CHECK(m.path<1>().size("pinned") == data.size());
  CHECK_THROWS_AS(m.assign("pinned", 0), strata::config_error);
  CHECK_THROWS_AS(m.assign("x", 5), strata::config_error);
  CHECK(m.remove("old"));
  CHECK_FALSE(m.path_of("old").has_value());
}

}  // namespace multipath_test
