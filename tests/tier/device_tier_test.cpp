// device_tier beyond the shared tier contract (tier_suite_test runs that): the executor's device
// budget, growth through host memory, failed copies that stay with their own request, and memory
// that returns to the budget once the copies using it have run.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include <strata/exec/faulty_stream.hpp>
#include <strata/tier/faulty.hpp>

#include "tier_fixtures.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace device_tier_test {

using namespace strata_test;

namespace {
using faulty_stream = strata::faulty<strata::host_stream>;
using faulty_exec = strata::host_executor<faulty_stream>;

static_assert(strata::tier<strata::device_tier<strata::host_executor<>>>);
static_assert(strata::tier<strata::device_tier<faulty_exec>>);
// Only executors: a device_tier of something else is not a type.
template <class E>
concept device_tier_of = requires { typename strata::device_tier<E>; };
static_assert(!device_tier_of<int>);
static_assert(!device_tier_of<strata::host_stream>);

std::vector<std::byte> read_all(auto& t, const std::string& object) {
  std::vector<std::byte> out(*t.size(object));
  t.read(object, 0, out).get();
  return out;
}
}  // namespace

TEST_CASE("the executor's device budget bounds a device_tier as its own capacity does") {
  strata::device_tier<strata::host_executor<>> t(strata::device_tier_options{.name = "gpu0"},
                                                  strata::host_executor_options{.device_memory = 64 * 1024});
  CHECK(t.capacity() == 64 * 1024);
  CHECK(t.descriptor().kind == strata::tier_kind::device);
  const auto a = random_bytes(24 * 1024, 1), b = random_bytes(24 * 1024, 2);
  t.write("a", 0, a).get();
  t.write("b", 0, b).get();
  CHECK(t.used() == 48 * 1024);
  CHECK_THROWS_AS(t.write("c", 0, a).get(), strata::capacity_error);
  CHECK(read_all(t, "a") == a);
  CHECK(read_all(t, "b") == b);
  // A removed object's memory is free again once the copies that used it have run.
  CHECK(t.remove("a"));
  CHECK_FALSE(t.remove("a"));
  t.write("c", 0, b).get();
  CHECK(read_all(t, "c") == b);
  t.flush();
  CHECK(t.executor().device_used() == 48 * 1024);
}

TEST_CASE("growing an object on the device keeps its bytes, whatever the streams' timing") {
  device_fixture fx;
  auto& t = fx.tier();
  std::vector<std::byte> expect;
  for (int i = 0; i < 12; ++i) {
    const auto piece = random_bytes(3000 + 977 * static_cast<std::size_t>(i), 100 + static_cast<std::uint64_t>(i));
    // Every other write leaves a hole, which reads back as what was there: zeros for new memory
    // is not promised, so the test writes contiguously and overwrites a middle range too.
    t.write("grown", expect.size(), piece).get();
    expect.insert(expect.end(), piece.begin(), piece.end());
    if (i % 3 == 2) {
      const auto mid = random_bytes(1234, 500 + static_cast<std::uint64_t>(i));
      t.write("grown", expect.size() / 3, mid).get();
      std::copy(mid.begin(), mid.end(), expect.begin() + static_cast<std::ptrdiff_t>(expect.size() / 3));
    }
    REQUIRE(t.size("grown") == expect.size());
    CHECK(read_all(t, "grown") == expect);
  }
  CHECK(t.used() == (expect.size() + 4095) / 4096 * 4096);
}

TEST_CASE("a failed device copy fails only its own request; the tier serves the next one") {
  strata::device_tier<faulty_exec> t(strata::device_tier_options{.name = "gpu0"},
                                      strata::host_executor_options{.name = "dev"});
  const auto data = random_bytes(50'000, 7);
  t.write("x", 0, data).get();
  auto& exec = const_cast<faulty_exec&>(t.executor());  // the test reaches the streams to inject faults
  exec.d2h().inject({.op = strata::stream_op::copy_to_host});
  std::vector<std::byte> out(data.size());
  CHECK_THROWS_AS(t.read("x", 0, out).get(), strata::stream_error);
  CHECK(read_all(t, "x") == data);
  exec.h2d().inject({.op = strata::stream_op::copy_to_device});
  const auto other = random_bytes(50'000, 8);
  CHECK_THROWS_AS(t.write("x", 0, other).get(), strata::stream_error);
  t.write("x", 0, other).get();  // the retry lands
  CHECK(read_all(t, "x") == other);
  // A failure while an object grows (its old bytes on their way through host memory) is the
  // write's error too, and a retried write restores a whole object.
  exec.d2h().inject({.op = strata::stream_op::copy_to_host});
  const auto longer = random_bytes(90'000, 9);
  CHECK_THROWS_AS(t.write("x", 50'000, std::span(longer).subspan(50'000)).get(), strata::stream_error);
  t.write("x", 0, longer).get();
  CHECK(read_all(t, "x") == longer);
}

TEST_CASE("device_tier works as the top path of a multipath, above host memory") {
  using dev = strata::device_tier<strata::host_executor<>>;
  strata::multipath<strata::bandwidth_proportional, dev, strata::host_tier> t(
      strata::bandwidth_proportional{}, std::tuple{strata::device_tier_options{.name = "gpu", .capacity = 256 * 1024,
                                                                                .read_bandwidth = 50e9,
                                                                                .write_bandwidth = 50e9},
                                                   strata::host_executor_options{}},
      strata::host_tier_options{.name = "host", .read_bandwidth = 20e9, .write_bandwidth = 20e9});
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < 10; ++i) {
    data.push_back(random_bytes(40'000, 40 + static_cast<std::uint64_t>(i)));
    t.write(fmt::format("sg-{}", i), 0, data.back()).get();
  }
  for (int i = 0; i < 10; ++i) CHECK(read_all(t, fmt::format("sg-{}", i)) == data[static_cast<std::size_t>(i)]);
  CHECK(t.path<0>().used() > 0);
  CHECK(t.path<0>().used() <= 256 * 1024);
  CHECK(t.path<1>().used() > 0);
}

}  // namespace device_tier_test
