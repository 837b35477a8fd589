// Update orders: one typed suite that every model passes (each step a permutation, the same step
// the same order), what each model walks, and custom_order's validation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/policy/update_order.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace update_order_test {

using ids = std::vector<std::size_t>;

namespace {
struct sequential_fixture {
  static strata::sequential make() { return {}; }
};
struct alternating_fixture {
  static strata::alternating make() { return {}; }
};
// A seeded shuffle per step and size: a generator, as a user's own order would be.
struct shuffled_fixture {
  static strata::custom_order make() {
    return strata::custom_order([](std::uint64_t step, std::size_t n) {
      ids v(n);
      std::iota(v.begin(), v.end(), std::size_t{0});
      std::mt19937_64 rng(step * 7919 + n);
      std::shuffle(v.begin(), v.end(), rng);
      return v;
    });
  }
};
// The erasure pair (core/erased.hpp): an owned order, and a reference to one that outlives it.
struct any_update_order_fixture {
  static strata::any_update_order make() { return strata::alternating{}; }
};
struct update_order_ref_fixture {
  static strata::update_order_ref make() {
    static const strata::custom_order shuffled = shuffled_fixture::make();
    return shuffled;
  }
};
}  // namespace

TEST_CASE("the erased order answers as the order it holds or refers to, which target() recovers") {
  const strata::any_update_order owned = strata::alternating{};
  const strata::update_order_ref ref = owned;
  CHECK(owned.target<strata::alternating>() != nullptr);
  CHECK(owned.target<strata::sequential>() == nullptr);
  CHECK(ref.target<strata::alternating>() == owned.target<strata::alternating>());
  for (std::uint64_t step = 0; step < 3; ++step)
    CHECK(strata::order_of(ref, step, 9) == strata::order_of(strata::alternating{}, step, 9));
  strata::any_update_order moved = strata::sequential{};
  const auto taken = std::move(moved);
  CHECK_THROWS_AS(strata::order_of(moved, 0, 3), strata::config_error);  // NOLINT(bugprone-use-after-move)
  CHECK(strata::order_of(taken, 0, 3) == ids{0, 1, 2});
}

TEST_CASE_TEMPLATE("every step's order is a permutation of the subgroups, the same for the same step", F,
                   sequential_fixture, alternating_fixture, shuffled_fixture, any_update_order_fixture,
                   update_order_ref_fixture) {
  const auto o = F::make();
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{64}}) {
    for (std::uint64_t step = 0; step < 6; ++step) {
      CAPTURE(n);
      CAPTURE(step);
      const auto v = strata::order_of(o, step, n);
      CHECK_NOTHROW(strata::check_permutation(v, n, step, "test"));
      CHECK(strata::order_of(o, step, n) == v);       // deterministic
      CHECK(strata::order_of(F::make(), step, n) == v);  // and the same for a fresh copy
    }
  }
}

TEST_CASE("sequential walks 0..n-1 every step") {
  for (std::uint64_t s : {0U, 1U, 2U, 1001U}) CHECK(strata::order_of(strata::sequential{}, s, 4) == ids{0, 1, 2, 3});
  CHECK(strata::order_of(strata::sequential{}, 0, 0).empty());
}

TEST_CASE("alternating walks forward on even steps and backward on odd ones") {
  const strata::alternating a;
  CHECK(strata::order_of(a, 0, 4) == ids{0, 1, 2, 3});
  CHECK(strata::order_of(a, 1, 4) == ids{3, 2, 1, 0});
  CHECK(strata::order_of(a, 2, 4) == ids{0, 1, 2, 3});
  CHECK(strata::order_of(a, 7, 3) == ids{2, 1, 0});
  CHECK(strata::order_of(a, 1, 1) == ids{0});
}

TEST_CASE("custom_order uses its permutations in turn") {
  const strata::custom_order c({{2, 0, 1}, {1, 2, 0}});
  CHECK(strata::order_of(c, 0, 3) == ids{2, 0, 1});
  CHECK(strata::order_of(c, 1, 3) == ids{1, 2, 0});
  CHECK(strata::order_of(c, 2, 3) == ids{2, 0, 1});
  CHECK(strata::order_of(c, 5, 3) == ids{1, 2, 0});
}

TEST_CASE("custom_order rejects a list that is not made of permutations, naming step and subgroup") {
  CHECK_THROWS_WITH_AS(strata::custom_order({{0, 1, 2}, {0, 2, 2}}),
                       "custom_order: the order of step 1 names subgroup 2 twice (again at position 2)",
                       strata::config_error);
  CHECK_THROWS_WITH_AS(strata::custom_order({{0, 3, 1}}),
                       "custom_order: the order of step 0 names subgroup 3 at position 1, but there are 3",
                       strata::config_error);
  CHECK_THROWS_WITH_AS(strata::custom_order({{0, 1, 2}, {0, 1}}),
                       "custom_order: the order of step 1 has 2 entries for 3 subgroups", strata::config_error);
  CHECK_THROWS_AS(strata::custom_order(std::vector<ids>{}), strata::config_error);
}

TEST_CASE("custom_order rejects a step over a different number of subgroups") {
  const strata::custom_order c({{1, 0}});
  CHECK_THROWS_WITH_AS((void)strata::order_of(c, 4, 3),
                       "custom_order: the order of step 4 has 2 entries for 3 subgroups", strata::config_error);
}

TEST_CASE("custom_order checks what its generator returns at every step") {
  const strata::custom_order c([](std::uint64_t step, std::size_t n) {
    ids v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = (i + step) % n;
    if (step == 3) v[0] = v[1];  // a broken step
    return v;
  });
  CHECK(strata::order_of(c, 1, 4) == ids{1, 2, 3, 0});
  CHECK_THROWS_WITH_AS((void)strata::order_of(c, 3, 4),
                       "custom_order: the order of step 3 names subgroup 0 twice (again at position 1)",
                       strata::config_error);
  CHECK_THROWS_AS(strata::custom_order(strata::custom_order::generator{}), strata::config_error);
}

}  // namespace update_order_test
