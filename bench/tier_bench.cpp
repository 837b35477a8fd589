// Microbenchmarks of the tier layer: the cost of an completion round trip, host_tier copies,
// XXH3 checksumming (against a plain memcpy of the same bytes, in the same run), and file_tier
// reads per engine on the build machine's disk.
#include <benchmark/benchmark.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <strata/strata.hpp>

namespace {

void completion_ready_round_trip(benchmark::State& state) {
  for (auto _ : state) {
    auto f = strata::make_ready_completion();
    f.get();
  }
}
BENCHMARK(completion_ready_round_trip);

void completion_continuation(benchmark::State& state) {
  for (auto _ : state) {
    strata::completion_promise p;
    auto f = p.get_future();
    int hit = 0;
    f.on_complete([&](std::exception_ptr) { ++hit; });
    p.set_value();
    benchmark::DoNotOptimize(hit);
  }
}
BENCHMARK(completion_continuation);

void host_tier_write_read(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  strata::host_tier t;
  strata::aligned_buffer buf(n, 4096, strata::buffer_init::zeroed);
  t.write("x", 0, buf.bytes()).get();
  for (auto _ : state) {
    t.write("x", 0, buf.bytes()).get();
    t.read("x", 0, buf.bytes()).get();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * n));
}
BENCHMARK(host_tier_write_read)->Arg(4096)->Arg(1 << 20)->Arg(64 << 20);

void xxh3_checksum(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  strata::aligned_buffer buf(n, 4096, strata::buffer_init::zeroed);
  for (std::size_t i = 0; i < n; ++i) buf.data()[i] = static_cast<std::byte>(i * 7);
  for (auto _ : state) benchmark::DoNotOptimize(strata::checksum64(buf.bytes()));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}
BENCHMARK(xxh3_checksum)->Arg(1 << 20)->Arg(64 << 20);

void memcpy_same_size(benchmark::State& state) {  // the bound checksumming is compared with
  const auto n = static_cast<std::size_t>(state.range(0));
  strata::aligned_buffer a(n, 4096, strata::buffer_init::zeroed), b(n, 4096, strata::buffer_init::zeroed);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
}
BENCHMARK(memcpy_same_size)->Arg(1 << 20)->Arg(64 << 20);

void file_tier_read(benchmark::State& state) {
  const auto backend = state.range(0) == 0 ? strata::io_backend::posix : strata::io_backend::uring;
  const auto n = static_cast<std::size_t>(state.range(1));
  const auto dir = std::filesystem::temp_directory_path() / ("strata-tier-bench-" + std::to_string(state.range(0)));
  strata::file_tier_options o;
  o.directory = dir;
  o.backend = backend;
  {
    strata::file_tier t(o);
    strata::direct_io_buffer buf(n, strata::buffer_init::zeroed);
    t.write("x", 0, buf.bytes()).get();
    for (auto _ : state) t.read("x", 0, buf.bytes()).get();
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n));
    state.SetLabel(std::string(t.engine()) + (t.direct_io() ? " O_DIRECT" : " buffered"));
    t.remove("x");
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(file_tier_read)->Args({0, 8 << 20})->Args({1, 8 << 20})->Args({0, 64 << 20})->Args({1, 64 << 20})->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
