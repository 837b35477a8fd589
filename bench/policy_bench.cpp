// What an eviction decision costs at 10^3 and 10^6 cached subgroups, per policy:
//   victim/<n>  victim() alone (the decision)
//   walk/<n>    one subgroup access of an alternating walk over 2n subgroups with n slots, after
//               a first (untimed) step: half
//               the accesses hit, half evict (victim + erase + insert), plus each step's
//               re-ranking (O(n log n) once per 2n accesses for sweep_aware and belady), amortized
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <strata/strata.hpp>

namespace {

template <class P>
void victim(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  P p;
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  p.on_step_begin(order, {});
  for (std::size_t i = 0; i < n; ++i) {
    p.on_insert(i);
    p.on_access(i);
  }
  for (auto _ : state) benchmark::DoNotOptimize(p.victim());
}

template <class P>
void walk(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  strata::cache_index<P> cache(n);
  const strata::alternating alt;
  std::uint64_t step = 0;
  auto cur = strata::order_of(alt, step, 2 * n);
  cache.begin_step(cur, strata::order_of(alt, step + 1, 2 * n));
  for (auto id : cur) cache.access(id);  // step 0, untimed: the measured walk starts warm
  const auto warm_hits = cache.hits();
  const auto warm_misses = cache.misses();
  std::size_t pos = cur.size();
  for (auto _ : state) {
    if (pos == cur.size()) {
      ++step;
      cur = strata::order_of(alt, step, 2 * n);
      cache.begin_step(cur, strata::order_of(alt, step + 1, 2 * n));
      pos = 0;
    }
    benchmark::DoNotOptimize(cache.access(cur[pos++]));
  }
  const auto hits = static_cast<double>(cache.hits() - warm_hits);
  state.counters["hit_ratio"] = hits / (hits + static_cast<double>(cache.misses() - warm_misses));
}

#define STRATA_POLICY_BENCH(P)                                         \
  BENCHMARK_TEMPLATE(victim, P)->Arg(1000)->Arg(1000000);              \
  BENCHMARK_TEMPLATE(walk, P)->Arg(1000)->Arg(1000000)

STRATA_POLICY_BENCH(strata::lru);
STRATA_POLICY_BENCH(strata::fifo);
STRATA_POLICY_BENCH(strata::sweep_aware);
STRATA_POLICY_BENCH(strata::belady);

}  // namespace

BENCHMARK_MAIN();
