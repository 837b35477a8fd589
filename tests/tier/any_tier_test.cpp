// any_tier: owned and referenced tiers are erased and the concrete type can be recovered.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include <strata/tier/any_tier.hpp>

#include "tier_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace any_tier_test {

using namespace strata_test;

TEST_CASE("any_tier erases owned and referenced tiers and can recover the concrete type") {
  strata::host_tier outside(host("outside"));
  auto r = strata::any_tier::ref(outside);
  r.write("x", 0, random_bytes(10, 1)).get();
  CHECK(outside.size("x") == 10u);
  CHECK(r.target<strata::host_tier>() == &outside);
  CHECK(r.target<strata::file_tier>() == nullptr);
  auto owned = strata::any_tier::make<strata::host_tier>(host("owned"));
  CHECK(owned.name() == "owned");
  auto moved = std::move(owned);
  moved.write("y", 0, random_bytes(5, 2)).get();
  CHECK(moved.size("y") == 5u);
  auto held = strata::any_tier(std::make_unique<strata::host_tier>(host("held")));
  CHECK(held.descriptor().name == "held");
}

}  // namespace any_tier_test
