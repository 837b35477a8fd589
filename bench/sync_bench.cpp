// What a limiter costs per acquire/release pair: alone (1 thread) and with 2 threads contending
// for one permit (the pair then includes handing the permit over).
#include <benchmark/benchmark.h>

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>

#include <strata/strata.hpp>

namespace {

strata::counting_limiter& shared_counting() {
  static strata::counting_limiter l(1);
  return l;
}

// One node_limiter in a fresh directory on tmpfs (/dev/shm, as by default; else /tmp), removed
// at exit.
struct node_bench {
  static std::filesystem::path make_dir() {
    std::error_code ec;
    std::string tmpl = std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm/strata-bench-XXXXXX"
                                                                      : "/tmp/strata-bench-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    return tmpl;
  }
  ~node_bench() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::filesystem::path dir = make_dir();
  strata::node_limiter limiter{"bench", 1, dir};
};

strata::node_limiter& shared_node() {
  static node_bench b;
  return b.limiter;
}

template <class L>
void acquire_release(benchmark::State& state, L& l) {
  for (auto _ : state) {
    l.acquire();
    l.release();
  }
  state.SetItemsProcessed(state.iterations());
}

void counting_limiter_acquire_release(benchmark::State& state) { acquire_release(state, shared_counting()); }
BENCHMARK(counting_limiter_acquire_release)->Threads(1)->Threads(2)->UseRealTime();

void counting_limiter_try_acquire_release(benchmark::State& state) {
  auto& l = shared_counting();
  for (auto _ : state)
    if (l.try_acquire()) l.release();
}
BENCHMARK(counting_limiter_try_acquire_release)->Threads(1)->UseRealTime();

void node_limiter_acquire_release(benchmark::State& state) { acquire_release(state, shared_node()); }
BENCHMARK(node_limiter_acquire_release)->Threads(1)->Threads(2)->UseRealTime();

void node_limiter_try_acquire_release(benchmark::State& state) {
  auto& l = shared_node();
  for (auto _ : state)
    if (l.try_acquire()) l.release();
}
BENCHMARK(node_limiter_try_acquire_release)->Threads(1)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
