// The typed eviction-policy suite: what the eviction_policy contract promises
// (strata/policy/eviction_policy.hpp), whatever the model. Defined here, invoked over the library's
// policies by eviction_test.cpp and over a policy written outside the library by
// tests/extending/mru_test.cpp. Invoke it inside the suite's namespace:
// `namespace strata_test::eviction_suite { STRATA_EVICTION_SUITE(P1, P2, ...); }`.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <type_traits>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/policy/belady.hpp"
#include "strata/policy/cache_index.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"

namespace strata_test::eviction_suite {

using ids = std::vector<std::size_t>;

// Runs `steps` steps of `order` over n subgroups through a cache of k slots; hits per step.
template <class P, class O>
std::vector<std::uint64_t> hits_per_step(const O& order, std::size_t n, std::size_t k, std::uint64_t steps) {
  strata::cache_index<P> cache(k);
  std::vector<std::uint64_t> hits;
  for (std::uint64_t s = 0; s < steps; ++s) {
    const auto cur = strata::order_of(order, s, n);
    const auto next = strata::order_of(order, s + 1, n);
    cache.begin_step(cur, next);
    const auto before = cache.hits();
    for (auto id : cur) {
      cache.access(id);
      CHECK(cache.size() <= k);
    }
    hits.push_back(cache.hits() - before);
  }
  return hits;
}

TEST_CASE_TEMPLATE_DEFINE("no victim while nothing is cached or everything cached is pinned", P, eviction_suite_1) {
  P p;
  CHECK_FALSE(p.victim().has_value());
  for (std::size_t id : {3, 1, 2}) p.on_insert(id);
  CHECK(p.size() == 3);
  for (std::size_t id : {3, 1, 2}) p.pin(id);
  CHECK_FALSE(p.victim().has_value());
  p.unpin(1);
  CHECK(p.victim() == std::optional<std::size_t>(1));
}

TEST_CASE_TEMPLATE_DEFINE("a pinned subgroup is never the victim, and is eligible again once unpinned", P,
                          eviction_suite_2) {
  P p;
  for (std::size_t id = 0; id < 4; ++id) p.on_insert(id);
  const auto first = p.victim();
  REQUIRE(first.has_value());
  p.pin(*first);
  p.pin(*first);  // pins nest: two transfers use it
  const auto second = p.victim();
  REQUIRE(second.has_value());
  CHECK(*second != *first);
  p.unpin(*first);
  CHECK(p.victim() != first);  // still pinned once
  p.unpin(*first);
  CHECK(p.victim() == first);  // its rank survived the pin
}

TEST_CASE_TEMPLATE_DEFINE("the victim is always a cached, unpinned subgroup (random operations)", P,
                          eviction_suite_3) {
  std::mt19937_64 rng(42);
  P p;
  std::set<std::size_t> cached;
  std::map<std::size_t, int> pins;
  ids order(64);
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (int op = 0; op < 20000; ++op) {
    const std::size_t id = rng() % 64;
    switch (rng() % 7) {
      case 0:
        if (!cached.contains(id)) {
          p.on_insert(id);
          cached.insert(id);
        }
        break;
      case 1:
        if (cached.contains(id)) p.on_access(id);
        break;
      case 2:
        if (cached.contains(id)) {
          p.pin(id);
          ++pins[id];
        }
        break;
      case 3:
        if (pins[id] > 0) {
          p.unpin(id);
          --pins[id];
        }
        break;
      case 4:
        if (cached.contains(id) && pins[id] == 0) {
          p.on_erase(id);
          cached.erase(id);
        }
        break;
      case 5:
        if (auto v = p.victim()) {
          p.on_erase(*v);
          cached.erase(*v);
        }
        break;
      default:
        if (rng() % 50 == 0) {
          std::shuffle(order.begin(), order.end(), rng);
          auto next = order;
          std::shuffle(next.begin(), next.end(), rng);
          p.on_step_begin(order, next);
        }
        break;
    }
    REQUIRE(p.size() == cached.size());
    const auto v = p.victim();
    const bool any_unpinned = std::any_of(cached.begin(), cached.end(), [&](auto c) { return pins[c] == 0; });
    REQUIRE(v.has_value() == any_unpinned);
    if (v) {
      REQUIRE(cached.contains(*v));
      REQUIRE(pins[*v] == 0);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("misuse is a config_error that names the subgroup", P, eviction_suite_4) {
  P p;
  p.on_insert(7);
  CHECK_THROWS_AS(p.on_insert(7), strata::config_error);
  CHECK_THROWS_WITH(p.on_insert(7), doctest::Contains("subgroup 7 is already cached"));
  CHECK_THROWS_WITH_AS(p.on_access(8), doctest::Contains("subgroup 8"), strata::config_error);
  CHECK_THROWS_WITH_AS(p.pin(9), doctest::Contains("subgroup 9"), strata::config_error);
  const ids twice{1, 2, 1};
  // (only the policies that read the order check it)
  if constexpr (std::is_same_v<P, strata::sweep_aware> || std::is_same_v<P, strata::belady>)
    CHECK_THROWS_WITH_AS(p.on_step_begin(twice, {}), doctest::Contains("subgroup 1 appears twice"),
                         strata::config_error);
  CHECK(p.contains(7));  // a rejected call changed nothing
  CHECK(p.size() == 1);
}

TEST_CASE_TEMPLATE_DEFINE("an erased subgroup is forgotten, pinned or not", P, eviction_suite_5) {
  P p;
  p.on_insert(1);
  p.on_insert(2);
  p.pin(2);
  p.on_erase(2);
  p.on_erase(1);
  p.on_erase(5);  // not cached: nothing happens
  CHECK(p.size() == 0);
  CHECK_FALSE(p.contains(2));
  CHECK_FALSE(p.victim().has_value());
  p.on_insert(2);  // may come back
  CHECK(p.victim() == std::optional<std::size_t>(2));
}

TEST_CASE_TEMPLATE_DEFINE("a cache as large as the step hits everything after the first step", P,
                          eviction_suite_6) {
  const auto hits = hits_per_step<P>(strata::sequential{}, 8, 8, 3);
  CHECK(hits == std::vector<std::uint64_t>{0, 8, 8});
}

TEST_CASE_TEMPLATE_DEFINE("cache_index refuses a miss when every cached subgroup is pinned", P,
                          eviction_suite_7) {
  strata::cache_index<P> cache(2);
  cache.access(0);
  cache.access(1);
  cache.pin(0);
  cache.pin(1);
  CHECK_THROWS_WITH_AS(cache.access(2), doctest::Contains("no slot for subgroup 2"), strata::capacity_error);
  CHECK(cache.contains(0));
  CHECK(cache.contains(1));
  cache.unpin(1);
  const auto r = cache.access(2);
  CHECK_FALSE(r.hit);
  CHECK(r.evicted == std::optional<std::size_t>(1));
  CHECK(cache.hits() == 0);
  CHECK(cache.misses() == 3);
}

}  // namespace strata_test::eviction_suite

#define STRATA_EVICTION_SUITE(...) \
  TEST_CASE_TEMPLATE_INVOKE(eviction_suite_1, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(eviction_suite_2, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(eviction_suite_3, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(eviction_suite_4, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(eviction_suite_5, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(eviction_suite_6, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(eviction_suite_7, __VA_ARGS__)
