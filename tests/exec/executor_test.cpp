// host_executor: its kernel gives the CPU kernel's bits, its device memory stays within its
// budget, a kernel rate paces it; and the stream/executor concepts accept their models and
// reject near misses.
#include <doctest/doctest.h>

#include <chrono>
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
#include <strata/optim/adamw_cpu.hpp>

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
struct no_kernel_executor {  // streams and memory, but no update kernel
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
static_assert(!strata::executor<no_kernel_executor>);
static_assert(!strata::executor<strata::host_stream>);

template <class G, class H>
void check_update_matches_cpu(std::size_t threads) {
  const std::size_t n = 10'007;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> p(n), m(n), v(n), vmax(n);
  std::vector<G> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = d(rng);
    m[i] = d(rng) * 1e-2f;
    v[i] = std::abs(d(rng)) * 1e-3f;
    vmax[i] = v[i];
    g[i] = G(d(rng) * 1e-2f);
  }
  strata::adamw_options o;
  o.amsgrad = true;
  const auto k = strata::make_adamw_step_params(o, 3, 1e-3);
  auto rp = p, rm = m, rv = v, rx = vmax;
  std::vector<H> rout(n), out(n);
  strata::adamw_update_cpu<G, H>(rp, rm, rv, rx, g, rout, k);

  strata::host_executor<> ex({.kernel_threads = threads});
  auto dev = ex.allocate_device(n * (4 * 4 + sizeof(G) + sizeof(H)));
  auto* f = reinterpret_cast<float*>(dev.data());
  std::memcpy(f, p.data(), n * 4);
  std::memcpy(f + n, m.data(), n * 4);
  std::memcpy(f + 2 * n, v.data(), n * 4);
  std::memcpy(f + 3 * n, vmax.data(), n * 4);
  auto* dg = reinterpret_cast<G*>(f + 4 * n);
  std::memcpy(dg, g.data(), n * sizeof(G));
  auto* dout = reinterpret_cast<H*>(reinterpret_cast<std::byte*>(dg) + n * sizeof(G));
  ex.enqueue_update(strata::adamw_group<G, H>{{f, n}, {f + n, n}, {f + 2 * n, n}, {f + 3 * n, n}, {dg, n}, {dout, n}}, k);
  ex.compute().sync();
  CHECK(std::memcmp(f, rp.data(), n * 4) == 0);
  CHECK(std::memcmp(f + n, rm.data(), n * 4) == 0);
  CHECK(std::memcmp(f + 2 * n, rv.data(), n * 4) == 0);
  CHECK(std::memcmp(f + 3 * n, rx.data(), n * 4) == 0);
  CHECK(std::memcmp(dout, rout.data(), n * sizeof(H)) == 0);
}

}  // namespace

TEST_CASE("the host executor's kernel gives adamw_update_cpu's bits for every gradient and model type") {
  for (const std::size_t threads : {1, 3}) {
    CAPTURE(threads);
    check_update_matches_cpu<float, strata::bf16>(threads);
    check_update_matches_cpu<strata::bf16, strata::bf16>(threads);
    check_update_matches_cpu<strata::fp16, strata::fp16>(threads);
  }
}

TEST_CASE("device memory stays within the executor's budget and is given back when freed") {
  strata::host_executor<> ex({.name = "sim", .device_memory = 3 * 4096});
  auto a = ex.allocate_device(4096);
  auto b = ex.allocate_device(100);  // a page
  CHECK(ex.device_used() == 2 * 4096);
  CHECK_THROWS_WITH_AS((void)ex.allocate_device(8192), doctest::Contains("host_executor 'sim'"), strata::capacity_error);
  {
    auto c = ex.allocate_device(4096);
    CHECK(ex.device_used() == 3 * 4096);
  }
  CHECK(ex.device_used() == 2 * 4096);
  a = strata::host_device_buffer();
  CHECK(ex.device_used() == 4096);
}

TEST_CASE("a kernel rate makes the emulated device kernel take at least n / rate") {
  const std::size_t n = 100'000;
  strata::host_executor<> ex({.kernel_rate = 10e6});  // 10 ms for n
  auto dev = ex.allocate_device(n * 4 * 4);
  auto* f = reinterpret_cast<float*>(dev.data());
  const auto k = strata::make_adamw_step_params({}, 1, 1e-3);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i)
    ex.enqueue_update(strata::adamw_group<float, strata::bf16>{{f, n}, {f + n, n}, {f + 2 * n, n}, {}, {f + 3 * n, n}, {}},
                      k);
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
