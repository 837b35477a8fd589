// The stream contract over every host model: host_stream, and host_stream under each adaptor
// (paced, jittered, faulty with no rule firing); then what each adaptor adds.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/exec/faulty_stream.hpp>
#include <strata/exec/host_stream.hpp>
#include <strata/exec/jittered.hpp>
#include <strata/exec/paced.hpp>
#include <strata/exec/traced.hpp>

#include "stream_suite.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace stream_test {

namespace {

struct vec_buffer {
  explicit vec_buffer(std::size_t n) : v(n) {}
  std::byte* data() { return v.data(); }
  std::size_t size() const { return v.size(); }
  std::span<std::byte> span() { return v; }
  std::vector<std::byte> v;
};

struct host_fixture_base {
  vec_buffer host(std::size_t n) { return vec_buffer(n); }
  vec_buffer device(std::size_t n) { return vec_buffer(n); }
};

struct host_stream_fixture : host_fixture_base {
  using stream_type = strata::host_stream;
  std::unique_ptr<stream_type> make(std::string name) { return std::make_unique<stream_type>(std::move(name)); }
};
struct paced_fixture : host_fixture_base {
  using stream_type = strata::paced<strata::host_stream>;
  std::unique_ptr<stream_type> make(std::string name) {
    return std::make_unique<stream_type>(strata::pace_options{.h2d_bandwidth = 20e9, .d2h_bandwidth = 20e9,
                                                              .latency = std::chrono::microseconds(5)},
                                         std::move(name));
  }
};
struct jittered_fixture : host_fixture_base {
  using stream_type = strata::jittered<strata::host_stream>;
  unsigned seed = 1;
  std::unique_ptr<stream_type> make(std::string name) {
    return std::make_unique<stream_type>(strata::jitter_options{.seed = seed++, .max_delay = std::chrono::microseconds(300)},
                                         std::move(name));
  }
};
struct faulty_fixture : host_fixture_base {
  using stream_type = strata::faulty<strata::host_stream>;
  std::unique_ptr<stream_type> make(std::string name) { return std::make_unique<stream_type>(std::move(name)); }
};

struct traced_fixture : host_fixture_base {
  using stream_type = strata::traced<strata::jittered<strata::host_stream>>;
  strata::tracer trace;
  std::unique_ptr<stream_type> make(std::string name) {
    return std::make_unique<stream_type>(&trace, strata::jitter_options{.seed = 7, .max_delay = std::chrono::microseconds(200)},
                                         std::move(name));
  }
};

}  // namespace

STRATA_STREAM_SUITE_INVOKE(host_stream_fixture, paced_fixture, jittered_fixture, faulty_fixture, traced_fixture);

static_assert(strata::stream<strata::host_stream>);
static_assert(strata::stream<strata::paced<strata::jittered<strata::faulty<strata::host_stream>>>>);

TEST_CASE("paced copies take at least bytes / bandwidth + latency each, and a shared link serializes them") {
  std::vector<std::byte> a1(1 << 20), b1(1 << 20), c1(1 << 20), a2(1 << 20), b2(1 << 20);  // no two streams share one
  const auto link = std::make_shared<strata::pace_link>(
      strata::pace_options{.h2d_bandwidth = 100e6, .d2h_bandwidth = 50e6, .latency = std::chrono::microseconds(1000)});
  strata::paced<strata::host_stream> s1(link, "s1"), s2(link, "s2");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) {
    s1.copy_to_device(b1, a1);  // 10.5 ms each at 100 MB/s
    s2.copy_to_device(b2, a2);  // the same direction of the same link: after s1's
  }
  s1.copy_to_host(c1, b1);  // 21 ms at 50 MB/s, on the other direction's clock
  s1.sync();
  s2.sync();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Lower bounds only (sleeping never ends early): 4 H2D copies share one clock.
  CHECK(s >= 4 * (1 << 20) / 100e6);
  CHECK(s >= 2 * (1 << 20) / 100e6 + (1 << 20) / 50e6 + 0.002);  // s1 alone: 2 H2D then the D2H, latencies
}

TEST_CASE("faulty fails the n-th operation of a kind with a stream_error naming the stream, the operation and its number") {
  strata::faulty<strata::host_stream> s("d2h");
  s.inject({.op = strata::stream_op::copy_to_host, .after = 2});
  std::vector<std::byte> a(64, std::byte{7}), b(64);
  s.copy_to_host(b, a);
  s.copy_to_device(b, a);  // another kind: not counted
  s.copy_to_host(b, a);
  const auto ok = s.record();
  ok.completion().get();
  std::fill(b.begin(), b.end(), std::byte{0});
  s.copy_to_host(b, a);  // the third copy_to_host: fails, does not run
  std::atomic<bool> later{false};
  s.enqueue_host([&] { later = true; });  // skipped: the stream failed
  const auto bad = s.record();
  CHECK_THROWS_WITH_AS(bad.completion().get(), "stream 'd2h': copy_to_host #3 of 64 bytes: injected fault",
                       strata::stream_error);
  CHECK_THROWS_AS(s.sync(), strata::stream_error);
  CHECK(b[0] == std::byte{0});
  CHECK_FALSE(later.load());
  CHECK(s.fired() == 1);
  s.copy_to_host(b, a);  // the rule fired its one time
  s.sync();
  CHECK(b[0] == std::byte{7});
}

TEST_CASE("faulty with a probability fires for a seeded, reproducible share of operations") {
  auto run = [](std::uint64_t seed) {
    strata::faulty<strata::host_stream> s("h");
    s.seed(seed);
    s.inject({.op = strata::stream_op::task, .times = 0, .probability = 0.3});
    std::vector<int> failed;
    for (int i = 0; i < 200; ++i) {
      s.enqueue_host([] {});
      try {
        s.sync();
      } catch (const strata::stream_error&) {
        failed.push_back(i);
      }
    }
    return failed;
  };
  const auto a = run(42), b = run(42), c = run(43);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a.size() > 20);
  CHECK(a.size() < 110);
}

TEST_CASE("jitter_options out of range are a config_error") {
  CHECK_THROWS_AS(strata::jittered<strata::host_stream>(strata::jitter_options{.probability = 1.5}, "j"),
                  strata::config_error);
  CHECK_THROWS_AS(strata::paced<strata::host_stream>(strata::pace_options{.h2d_bandwidth = -1}, "p"),
                  strata::config_error);
}

TEST_CASE("traced counts each stream's busy time, operations and bytes, and traces one track per stream") {
  strata::tracer trace;
  const auto link = std::make_shared<strata::pace_link>(strata::pace_options{.h2d_bandwidth = 200e6, .d2h_bandwidth = 100e6});
  strata::traced<strata::paced<strata::host_stream>> in(&trace, link, "sim.h2d"), out(&trace, link, "sim.d2h");
  std::vector<std::byte> a(1 << 20), b(1 << 20), c(1 << 20);
  const auto t0 = std::chrono::steady_clock::now();
  in.copy_to_device(b, a);          // >= 5.2 ms at 200 MB/s
  out.wait(in.record());
  out.copy_to_host(c, b);           // >= 10.5 ms at 100 MB/s, only after the copy in
  out.enqueue_host([] {});
  out.sync();
  in.sync();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto ai = in.activity(), ao = out.activity();
  CHECK(ai.operations == 1);
  CHECK(ai.bytes == (1u << 20));
  CHECK(ao.operations == 2);
  CHECK(ao.bytes == (1u << 20));
  // Each stream was busy at least for its paced copy; the wait for the other one is not counted,
  // so both together fit in the wall time.
  CHECK(ai.busy_s >= (1 << 20) / 200e6);
  CHECK(ao.busy_s >= (1 << 20) / 100e6);
  CHECK(ai.busy_s + ao.busy_s <= wall);
  const auto json = trace.chrome_trace_json();
  CHECK(json.find("sim.h2d") != std::string::npos);
  CHECK(json.find("sim.d2h") != std::string::npos);
  CHECK(json.find("copy_to_device") != std::string::npos);
  CHECK(json.find("copy_to_host") != std::string::npos);
  in.reset();
  CHECK(in.activity().operations == 0);
}

}  // namespace stream_test
