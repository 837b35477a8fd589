// faulty<T>: fault rules fire after n requests, k times, or at a seeded random rate.
#include <doctest/doctest.h>

#include <vector>

#include <strata/tier/faulty.hpp>

#include "tier_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace faulty_test {

using namespace strata_test;

TEST_CASE("fault rules fire after n requests, k times, or at a seeded random rate") {
  strata::faulty<strata::host_tier> t(host("f"));
  const auto data = random_bytes(100, 1);
  t.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = {}, .after = 2, .times = 2});
  std::vector<bool> failed;
  for (int i = 0; i < 6; ++i) {
    try {
      t.write("x", 0, data).get();
      failed.push_back(false);
    } catch (const strata::io_error&) {
      failed.push_back(true);
    }
  }
  CHECK(failed == std::vector<bool>{false, false, true, true, false, false});
  t.clear();

  const auto run = [&](std::uint64_t seed) {
    t.clear();
    t.seed(seed);
    t.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::read, .object = {}, .after = 0, .times = 0, .probability = 0.5});
    std::vector<bool> pattern;
    std::vector<std::byte> out(100);
    for (int i = 0; i < 64; ++i) {
      try {
        t.read("x", 0, out).get();
        pattern.push_back(false);
      } catch (const strata::io_error&) {
        pattern.push_back(true);
      }
    }
    return pattern;
  };
  const auto p1 = run(7);
  CHECK(p1 == run(7));  // reproducible from the seed
  const auto fired = std::count(p1.begin(), p1.end(), true);
  CHECK(fired > 0);
  CHECK(fired < 64);
}

}  // namespace faulty_test
