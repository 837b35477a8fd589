// Eviction policies: the typed suite (eviction_suite.hpp) over every model, then the hit counts each one is for.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "strata/policy/any_eviction_policy.hpp"
#include "strata/policy/belady.hpp"
#include "strata/policy/cache_index.hpp"
#include "strata/policy/fifo.hpp"
#include "strata/policy/lru.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"

#include "eviction_suite.hpp"

namespace strata_test::eviction_suite {
// The erasure pair (core/erased.hpp) over lru: the owning value and a reference, each through the
// table, default-constructible as the suite makes its policies.
struct any_lru : strata::any_eviction_policy {
  any_lru() : strata::any_eviction_policy(strata::lru{}) {}
};
struct lru_holder {
  std::unique_ptr<strata::lru> held = std::make_unique<strata::lru>();  // moves keep its address
};
struct lru_ref : private lru_holder, public strata::eviction_policy_ref {
  lru_ref() : lru_holder{}, strata::eviction_policy_ref(*held) {}
};

// The typed suite over the library's policies and their erasures.
STRATA_EVICTION_SUITE(strata::lru, strata::fifo, strata::sweep_aware, strata::belady, any_lru, lru_ref);
}  // namespace strata_test::eviction_suite

// The folder's tests compile together: this file's names stay in its own namespace.
namespace eviction_test {

using strata_test::eviction_suite::hits_per_step;

namespace {

using ids = std::vector<std::size_t>;

// The most hits any demand-paging cache of k slots can get on `seq` (exhaustive search).
std::uint64_t optimal_hits(const ids& seq, std::size_t k) {
  std::map<std::set<std::size_t>, std::uint64_t> states{{{}, 0}};  // cache contents -> best hits so far
  for (auto id : seq) {
    std::map<std::set<std::size_t>, std::uint64_t> next;
    auto keep = [&](const std::set<std::size_t>& c, std::uint64_t h) {
      auto& best = next[c];
      best = std::max(best, h);
    };
    for (const auto& [c, h] : states) {
      if (c.contains(id)) {
        keep(c, h + 1);
      } else if (c.size() < k) {
        auto d = c;
        d.insert(id);
        keep(d, h);
      } else {
        for (auto out : c) {
          auto d = c;
          d.erase(out);
          d.insert(id);
          keep(d, h);
        }
      }
    }
    states = std::move(next);
  }
  std::uint64_t best = 0;
  for (const auto& [c, h] : states) best = std::max(best, h);
  return best;
}

}  // namespace

TEST_CASE_TEMPLATE("with an alternating order the cache hits exactly K subgroups per step after the first", P,
                   strata::lru, strata::sweep_aware, strata::belady) {
  for (auto [n, k] : {std::pair<std::size_t, std::size_t>{10, 3}, {16, 1}, {100, 25}, {7, 6}}) {
    CAPTURE(n);
    CAPTURE(k);
    const auto hits = hits_per_step<P>(strata::alternating{}, n, k, 6);
    CHECK(hits[0] == 0);
    for (std::size_t s = 1; s < hits.size(); ++s) CHECK(hits[s] == k);
  }
}

TEST_CASE("with an alternating order fifo hits K per step only while K is at most half the subgroups") {
  // fifo keeps the last K inserted, whatever was hit since: once K > N/2, a reverse step's few
  // misses leave the hit subgroups first in line, and the forward step after it loses them.
  CHECK(hits_per_step<strata::fifo>(strata::alternating{}, 10, 5, 4) == std::vector<std::uint64_t>{0, 5, 5, 5});
  CHECK(hits_per_step<strata::fifo>(strata::alternating{}, 7, 6, 4) == std::vector<std::uint64_t>{0, 6, 1, 6});
  CHECK(hits_per_step<strata::lru>(strata::alternating{}, 7, 6, 4) == std::vector<std::uint64_t>{0, 6, 6, 6});
}

TEST_CASE("with a sequential order larger than the cache lru and fifo get no hits at all") {
  CHECK(hits_per_step<strata::lru>(strata::sequential{}, 10, 3, 5) == std::vector<std::uint64_t>(5, 0));
  CHECK(hits_per_step<strata::fifo>(strata::sequential{}, 10, 3, 5) == std::vector<std::uint64_t>(5, 0));
  // The future-aware policies keep something even here.
  const auto b = hits_per_step<strata::belady>(strata::sequential{}, 10, 3, 5);
  for (std::size_t s = 1; s < b.size(); ++s) CHECK(b[s] >= 2);
}

TEST_CASE("belady gets the optimum that exhaustive search finds, and never less than another policy") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t n = 3 + rng() % 4;  // 3..6 subgroups
    const std::size_t k = 1 + rng() % (n - 1);
    std::vector<ids> perms;
    for (int s = 0; s < 4; ++s) {
      ids p(n);
      std::iota(p.begin(), p.end(), std::size_t{0});
      std::shuffle(p.begin(), p.end(), rng);
      perms.push_back(p);
    }
    const strata::custom_order order(perms);
    ids seq;
    for (std::uint64_t s = 0; s < 3; ++s)
      for (auto id : strata::order_of(order, s, n)) seq.push_back(id);
    auto total = [](const std::vector<std::uint64_t>& h) { return std::accumulate(h.begin(), h.end(), std::uint64_t{0}); };
    const auto best = optimal_hits(seq, k);
    CAPTURE(trial);
    CHECK(total(hits_per_step<strata::belady>(order, n, k, 3)) == best);
    CHECK(total(hits_per_step<strata::lru>(order, n, k, 3)) <= best);
    CHECK(total(hits_per_step<strata::fifo>(order, n, k, 3)) <= best);
    CHECK(total(hits_per_step<strata::sweep_aware>(order, n, k, 3)) <= best);
  }
}

// The walk prefetches `depth` subgroups ahead (admit without use); returns the loads (misses of
// admit or access) of step 1 of an alternating order, after a first step that filled the cache.
template <class P>
std::uint64_t loads_with_prefetch(std::size_t n, std::size_t k, std::size_t depth) {
  strata::cache_index<P> cache(k);
  std::uint64_t loads = 0;
  for (std::uint64_t s = 0; s < 2; ++s) {
    const auto cur = strata::order_of(strata::alternating{}, s, n);
    cache.begin_step(cur, strata::order_of(strata::alternating{}, s + 1, n));
    loads = 0;
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = i + 1; j <= i + depth && j < n; ++j)
        if (!cache.admit(cur[j]).hit) ++loads;
      if (!cache.access(cur[i]).hit) ++loads;
    }
  }
  return loads;
}

TEST_CASE("sweep_aware never drops a prefetched subgroup before its update; lru does and reads it twice") {
  // 12 subgroups, 4 slots, prefetch 2 ahead: step 1 can keep 4 from step 0, so 8 loads at best.
  CHECK(loads_with_prefetch<strata::sweep_aware>(12, 4, 2) == 8);
  CHECK(loads_with_prefetch<strata::belady>(12, 4, 2) == 8);
  CHECK(loads_with_prefetch<strata::lru>(12, 4, 2) > 8);
}

TEST_CASE("an access outside the walk does not make sweep_aware keep what the next step needs last") {
  // Step 0 walks 0..9 with 4 slots and ends holding 6..9. A checkpoint then re-reads 6 and
  // reads 0: lru keeps 6 (recently read) and drops 7, which step 1 (9..0) needs third, then
  // drops 0 and 6 before their turn. sweep_aware drops 6 (updated first among 6..9) and keeps 0
  // through step 1, whose last subgroup it is: 9, 8, 7 and 0 hit, as many as belady gets.
  auto run = [](auto cache) {
    const auto o0 = strata::order_of(strata::alternating{}, 0, 10);
    const auto o1 = strata::order_of(strata::alternating{}, 1, 10);
    cache.begin_step(o0, o1);
    for (auto id : o0) cache.access(id);
    cache.access(6);
    cache.access(0);
    cache.begin_step(o1, strata::order_of(strata::alternating{}, 2, 10));
    const auto before = cache.hits();
    for (auto id : o1) cache.access(id);
    return cache.hits() - before;
  };
  CHECK(run(strata::cache_index<strata::sweep_aware>(4)) == 4);
  CHECK(run(strata::cache_index<strata::belady>(4)) == 4);
  CHECK(run(strata::cache_index<strata::lru>(4)) == 2);
}

TEST_CASE_TEMPLATE("sweep_aware's and belady's plan names what a walk with bypass still holds at its end", P,
                   strata::sweep_aware, strata::belady) {
  // Steps walked as an optimizer's pipeline admits (access_or_bypass); right after each access
  // that leaves its subgroup cached, the plan for it; at the step's end it must be cached iff
  // the plan said so. Step sequences, as (order, next order told): alternating (next given, and
  // for sweep_aware also assumed), one order repeated after a step that expected the reverse
  // (updates that switch to following backward's landing order: the cache then starts each
  // step holding what the walk reaches last, and the walk bypasses every miss), and shuffles.
  const std::size_t n = 12;
  using ids = std::vector<std::size_t>;
  for (const std::size_t k : {1, 3, 5}) {
    for (const std::string_view family : {"alternating", "assumed", "repeated", "shuffled"}) {
      if (family == "assumed" && !std::is_same_v<P, strata::sweep_aware>) continue;
      CAPTURE(k);
      CAPTURE(family);
      std::mt19937 rng(11);
      const ids forward = strata::order_of(strata::alternating{}, 0, n);
      const ids backward = strata::order_of(strata::alternating{}, 1, n);
      std::vector<std::pair<ids, ids>> steps;
      ids shuffled = forward;
      std::shuffle(shuffled.begin(), shuffled.end(), rng);
      for (std::uint64_t step = 0; step < 6; ++step) {
        const bool even = step % 2 == 0;
        if (family == "alternating") steps.emplace_back(even ? forward : backward, even ? backward : forward);
        if (family == "assumed") steps.emplace_back(even ? forward : backward, ids{});
        if (family == "repeated") steps.emplace_back(forward, step == 0 ? backward : forward);
        if (family == "shuffled") {
          ids next = shuffled;
          std::shuffle(next.begin(), next.end(), rng);
          steps.emplace_back(shuffled, next);
          shuffled = next;
        }
      }
      strata::cache_index<P> cache(k);
      for (std::size_t step = 0; step < steps.size(); ++step) {
        CAPTURE(step);
        const auto& [order, next] = steps[step];
        cache.begin_step(order, next);
        std::map<std::size_t, bool> plan;
        for (const auto id : order) {
          (void)cache.access_or_bypass(id);
          if (cache.contains(id)) plan[id] = cache.policy().keeps_for_next_step(id, k);
        }
        for (const auto& [id, kept] : plan) {
          CAPTURE(id);
          CHECK(kept == cache.contains(id));
        }
      }
    }
  }
}

TEST_CASE("before any step sweep_aware and belady evict the least recently used") {
  strata::sweep_aware s;
  strata::belady b;
  for (std::size_t id : {5, 6, 7}) {
    s.on_insert(id);
    b.on_insert(id);
  }
  s.on_access(5);
  b.on_access(5);
  CHECK(s.victim() == std::optional<std::size_t>(6));
  CHECK(b.victim() == std::optional<std::size_t>(6));
}

}  // namespace eviction_test
