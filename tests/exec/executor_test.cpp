// host_executor: the executor suite over its models, a kernel rate paces its kernels, its streams
// come from a factory; and the stream/executor concepts accept their models and reject near
// misses.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <type_traits>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include <strata/core/half.hpp>
#include <strata/exec/executor.hpp>
#include <strata/exec/faulty_stream.hpp>
#include <strata/exec/host_executor.hpp>
#include <strata/exec/jittered.hpp>
#include <strata/exec/paced.hpp>

#include "executor_suite.hpp"
#include <strata/offload/adamw_device.hpp>

// The folder's tests compile together: this file's names stay in its own namespace.
namespace executor_test {

namespace {

struct no_record {  // an event-less queue is not a stream
  using event_type = strata::host_event;
  void copy_to_device(std::span<std::byte>, std::span<const std::byte>) {}
  void copy_to_host(std::span<std::byte>, std::span<const std::byte>) {}
  void enqueue_host(strata::host_task) {}
  void wait(const strata::host_event&) {}
  void sync() {}
  std::string_view name() const { return "x"; }
};
struct bad_event {  // an event the host cannot wait on
  bool ready() const { return true; }
};
struct stream_of_bad_events {
  using event_type = bad_event;
  void copy_to_device(std::span<std::byte>, std::span<const std::byte>) {}
  void copy_to_host(std::span<std::byte>, std::span<const std::byte>) {}
  void enqueue_host(strata::host_task) {}
  bad_event record() { return {}; }
  void wait(const bad_event&) {}
  void sync() {}
  std::string_view name() const { return "x"; }
};
struct no_kernel_executor {  // streams and memory: an executor, but enqueue_adamw has no overload for it
  using stream_type = strata::host_stream;
  using device_buffer = strata::host_device_buffer;
  strata::host_stream& h2d();
  strata::host_stream& compute();
  strata::host_stream& d2h();
  strata::host_memory_request staging() const;
  std::uint64_t device_budget() const;
  std::uint64_t device_used() const;
  strata::host_device_buffer allocate_device(std::size_t);
  std::string_view name() const;
};

static_assert(strata::stream<strata::host_stream>);
static_assert(!strata::stream<no_record>);
static_assert(!strata::stream<stream_of_bad_events>);
static_assert(!strata::stream<int>);
static_assert(strata::stream_event<strata::host_event>);
static_assert(!strata::stream_event<bad_event>);
static_assert(strata::executor<strata::host_executor<>>);
static_assert(strata::executor<strata::host_executor<strata::paced<strata::jittered<strata::host_stream>>>>);
static_assert(strata::executor<no_kernel_executor>);
static_assert(!strata::adamw_executor<no_kernel_executor>);
static_assert(strata::adamw_executor<strata::host_executor<strata::paced<strata::host_stream>>>);
static_assert(!strata::executor<strata::host_stream>);

// The host models of the executor suite: plain, with several kernel threads, and under paced
// and jittered streams.
template <class S = strata::host_stream, std::size_t Threads = 1>
struct host_executor_fixture {
  using executor_type = strata::host_executor<S>;
  std::unique_ptr<executor_type> make(std::string name, std::uint64_t device_memory) {
    strata::host_executor_options o{.name = std::move(name), .device_memory = device_memory, .kernel_threads = Threads};
    if constexpr (std::is_same_v<S, strata::host_stream>) {
      return std::make_unique<executor_type>(o);
    } else {
      return std::make_unique<executor_type>(o, [](strata::stream_role, const std::string& n) {
        if constexpr (std::is_same_v<S, strata::paced<strata::host_stream>>)
          return std::make_unique<S>(strata::pace_options{.h2d_bandwidth = 20e9, .d2h_bandwidth = 20e9}, n);
        else
          return std::make_unique<S>(strata::jitter_options{.seed = 3, .max_delay = std::chrono::microseconds(200)}, n);
      });
    }
  }
  void add_one(executor_type& ex, std::span<std::byte> dev) {
    ex.launch(dev.size(), [dev](strata::thread_pool*) {
      for (auto& b : dev) b = static_cast<std::byte>(static_cast<unsigned>(b) + 1u);
    });
  }
};

}  // namespace

STRATA_EXECUTOR_SUITE_INVOKE(host_executor_fixture<>, host_executor_fixture<strata::host_stream, 3>,
                             host_executor_fixture<strata::paced<strata::host_stream>>,
                             host_executor_fixture<strata::jittered<strata::host_stream>>);

TEST_CASE("a kernel rate makes the emulated device kernel take at least n / rate") {
  const std::size_t n = 100'000;
  strata::host_executor<> ex({.kernel_rate = 10e6});  // 10 ms for n
  auto dev = ex.allocate_device(n * 4 * 4);
  auto* f = reinterpret_cast<float*>(dev.data());
  const auto k = strata::make_adamw_step_params({}, 1, 1e-3);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i)
    strata::enqueue_adamw(
        ex, strata::adamw_group<float, strata::bf16>{{f, n}, {f + n, n}, {f + 2 * n, n}, {}, {f + 3 * n, n}, {}}, k);
  ex.compute().sync();
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= 3 * 0.01);
}

TEST_CASE("a host executor's streams come from a factory, so each role can get its own adaptor settings") {
  using S = strata::faulty<strata::host_stream>;
  std::vector<std::string> names;
  strata::host_executor<S> ex({.name = "x"}, [&](strata::stream_role r, const std::string& name) {
    names.push_back(std::string(strata::to_string(r)) + "=" + name);
    return std::make_unique<S>(name);
  });
  CHECK(names == std::vector<std::string>{"h2d=x.h2d", "compute=x.compute", "d2h=x.d2h"});
  CHECK(ex.d2h().name() == "x.d2h");
  CHECK_THROWS_AS(strata::host_executor<S>({}, [](strata::stream_role, const std::string&) { return nullptr; }),
                  strata::config_error);
}

}  // namespace executor_test
