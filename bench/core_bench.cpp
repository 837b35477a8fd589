// Costs of the core facilities that later components put on hot paths: a thread-pool round
// trip, a trace span in each mode, a metrics record, and size parsing.
#include <benchmark/benchmark.h>

#include <future>
#include <vector>

#include <strata/strata.hpp>

namespace {

void thread_pool_round_trip(benchmark::State& state) {
  strata::thread_pool pool(static_cast<std::size_t>(state.range(0)), "bench");
  for (auto _ : state) benchmark::DoNotOptimize(pool.submit([] { return 1; }).get());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(thread_pool_round_trip)->Arg(1)->Arg(2)->UseRealTime();

void thread_pool_batch_of_64(benchmark::State& state) {
  strata::thread_pool pool(2, "bench");
  std::vector<std::future<int>> fs;
  fs.reserve(64);
  for (auto _ : state) {
    fs.clear();
    for (int i = 0; i < 64; ++i) fs.push_back(pool.submit([i] { return i; }));
    int sum = 0;
    for (auto& f : fs) sum += f.get();
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * 64);
}
BENCHMARK(thread_pool_batch_of_64)->UseRealTime();

void trace_span_cost(benchmark::State& state) {
  const auto mode = static_cast<strata::trace_mode>(state.range(0));
  strata::tracer t(mode, 1U << 30);
  for (auto _ : state) {
    strata::trace_span s(&t, "chunk");
    benchmark::ClobberMemory();
  }
  state.SetLabel(mode == strata::trace_mode::off ? "off" : mode == strata::trace_mode::summary ? "summary" : "full");
}
BENCHMARK(trace_span_cost)->Arg(0)->Arg(1)->Arg(2);

void trace_span_null_tracer(benchmark::State& state) {
  for (auto _ : state) {
    strata::trace_span s(nullptr, "chunk");
    benchmark::ClobberMemory();
  }
}
BENCHMARK(trace_span_null_tracer);

void metrics_record(benchmark::State& state) {
  strata::metrics m;
  for (auto _ : state) m.record("read", std::chrono::nanoseconds(100));
}
BENCHMARK(metrics_record);

void parse_size_cost(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(strata::parse_size("1.5GiB"));
}
BENCHMARK(parse_size_cost);

}  // namespace

BENCHMARK_MAIN();
