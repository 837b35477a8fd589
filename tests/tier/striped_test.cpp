// striped: stripe units round robin over the members, holes refused, sizes found again.
#include <doctest/doctest.h>

#include <vector>

#include <strata/tier/any_tier.hpp>
#include <strata/tier/striped.hpp>

#include "tier_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace striped_test {

using namespace strata_test;

TEST_CASE("striped lays stripe units round robin over its members, refuses holes and finds sizes again") {
  temp_dir dir;
  const auto members = [&] {
    std::vector<strata::any_tier> m;
    for (const char* n : {"m0", "m1", "m2"})
      m.push_back(strata::any_tier::make<strata::file_tier>(file_opts(dir.path() / n, strata::io_backend::automatic,
                                                                      strata::unlimited_capacity, n)));
    return m;
  };
  const auto data = random_bytes(10 * 4096 + 100, 7);  // 10 whole units and a piece of the 11th
  {
    strata::striped t(members(), strata::striped_options{.name = "raid0", .stripe_bytes = 4096});
    t.write("obj", 0, data).get();
    // Units 0, 3, 6, 9 on m0; 1, 4, 7, 10 (100 bytes) on m1; 2, 5, 8 on m2.
    CHECK(t.member(0).size("obj") == 4 * 4096);
    CHECK(t.member(1).size("obj") == 3 * 4096 + 100);
    CHECK(t.member(2).size("obj") == 3 * 4096);
    const auto done = t.completed_bytes();
    CHECK(done[0].written == 4 * 4096);
    CHECK(done[1].written == 3 * 4096 + 100);
    std::vector<std::byte> mid(5000);
    t.read("obj", 4000, mid).get();  // across units 0, 1 and 2
    CHECK(std::equal(mid.begin(), mid.end(), data.begin() + 4000));
    CHECK_THROWS_AS(t.write("obj", data.size() + 1, mid).get(), strata::config_error);  // a hole
    CHECK_THROWS_AS(t.write("new", 4096, mid).get(), strata::config_error);
    t.write("obj", data.size(), mid).get();  // appending is fine
    CHECK(t.size("obj") == data.size() + mid.size());
    CHECK(t.descriptor().kind == strata::tier_kind::composite);
    t.flush();
  }
  strata::striped again(members(), strata::striped_options{.name = "raid0", .stripe_bytes = 4096});
  CHECK(again.size("obj") == data.size() + 5000);  // from the members' sizes
  std::vector<std::byte> back(data.size());
  again.read("obj", 0, back).get();
  CHECK(back == data);
  CHECK(again.remove("obj"));
  CHECK_FALSE(again.size("obj").has_value());
  CHECK_FALSE(again.remove("obj"));
}

}  // namespace striped_test
