// Placement policies: fixed_ratio's k:1 round robin, bandwidth_proportional's split by
// bandwidth, adaptive's EWMA and its convergence under a multipath; and one typed suite that
// every policy passes (paths in range, never a full path, a capacity_error naming the object).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <tuple>
#include <vector>

#include <strata/policy/placement.hpp>
#include <strata/tier/multipath.hpp>
#include <strata/tier/throttled.hpp>

#include "../tier/tier_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace placement_test {

using namespace strata_test;
using namespace std::chrono_literals;

TEST_CASE("fixed_ratio places objects k:1 round robin and skips a full path") {
  strata::multipath<strata::fixed_ratio, strata::host_tier, strata::host_tier> m(
      strata::fixed_ratio({2, 1}), host("nvme"), host("pfs", 0, 0, 5 * 4096));
  const auto data = random_bytes(4096, 1);
  for (int i = 0; i < 9; ++i) m.write(fmt::format("sg-{}", i), 0, data).get();
  std::array<int, 2> count{};
  for (int i = 0; i < 9; ++i) ++count.at(m.path_of(fmt::format("sg-{}", i)).value());
  CHECK(count == std::array<int, 2>{6, 3});
  CHECK(m.placed_bytes() == std::vector<std::uint64_t>{6 * 4096, 3 * 4096});
  for (int i = 9; i < 15; ++i) m.write(fmt::format("sg-{}", i), 0, data).get();  // pfs fills up at 5
  CHECK(m.path<1>().used() == 5 * 4096);
  CHECK(m.path<0>().used() == 10 * 4096);
}

TEST_CASE("bandwidth_proportional splits bytes in the ratio of the paths' bandwidths") {
  strata::multipath<strata::bandwidth_proportional, strata::host_tier, strata::host_tier> m(
      strata::bandwidth_proportional{}, host("fast", 3e9, 3e9), host("slow", 1e9, 1e9));
  const auto data = random_bytes(4096, 1);
  for (int i = 0; i < 40; ++i) m.write(fmt::format("sg-{}", i), 0, data).get();
  const auto placed = m.placed_bytes();
  CHECK(placed[0] == 30 * 4096);
  CHECK(placed[1] == 10 * 4096);
  const auto d = m.descriptor();
  CHECK(d.read_bandwidth == 4e9);  // concurrent paths add up
  CHECK(d.kind == strata::tier_kind::composite);
}

TEST_CASE("adaptive placement converges to a path's new bandwidth, moving a bounded number of bytes per step") {
  using slow_host = strata::throttled<strata::host_tier>;
  constexpr std::uint64_t object = 64 * 1024, objects = 40, bound = 4 * object;
  strata::multipath<strata::adaptive, slow_host, slow_host> m(
      strata::adaptive({.smoothing = 0.7, .max_move_bytes = bound}),
      std::tuple{strata::throttle_options{20e6, 20e6, 0us}, host("a")},
      std::tuple{strata::throttle_options{20e6, 20e6, 0us}, host("b")});
  const auto data = random_bytes(object, 1);
  std::vector<std::vector<std::byte>> back(objects, std::vector<std::byte>(object));
  const auto step = [&] {  // what an optimizer step does to every subgroup: read it, write it back
    std::vector<strata::completion> io;
    for (std::uint64_t i = 0; i < objects; ++i) io.push_back(m.read(fmt::format("sg-{}", i), 0, back[i]));
    strata::wait_all(io);
    io.clear();
    for (std::uint64_t i = 0; i < objects; ++i) io.push_back(m.write(fmt::format("sg-{}", i), 0, back[i]));
    strata::wait_all(io);
  };
  for (std::uint64_t i = 0; i < objects; ++i) m.write(fmt::format("sg-{}", i), 0, data).get();
  const auto even = m.placed_bytes();
  CHECK(even[0] == even[1]);  // equal declared links: placed evenly before anything was observed
  step();
  CHECK(m.rebalance() <= bound);

  m.path<1>().set_bandwidth(60e6, 60e6);  // path b becomes 3x faster mid-run
  std::vector<std::uint64_t> moved;
  for (int s = 0; s < 12; ++s) {
    step();
    moved.push_back(m.rebalance());
  }
  for (const auto b : moved) CHECK(b <= bound);
  const auto placed = m.placed_bytes();
  const double share_b = static_cast<double>(placed[1]) / static_cast<double>(placed[0] + placed[1]);
  // 3:1 is a share of 0.75; the band allows for throughput measured on a loaded 2-core machine.
  CHECK(share_b > 0.65);
  CHECK(share_b < 0.85);
  for (std::uint64_t i = 0; i < objects; ++i) {            // every object intact after migrating
    std::vector<std::byte> out(object);
    m.read(fmt::format("sg-{}", i), 0, out).get();
    REQUIRE(out == data);
  }
  CHECK(m.path<0>().used() + m.path<1>().used() == objects * object);  // moved, not copied
}

TEST_CASE("adaptive keeps an EWMA per path and plans bytes in its ratio, within each path's room") {
  strata::adaptive a({.smoothing = 0.5, .max_move_bytes = 100});
  std::vector<strata::path_view> paths{
      {strata::tier_descriptor{"a", strata::tier_kind::file, 1e9, 1e9, false}, 10000, 400, 400},
      {strata::tier_descriptor{"b", strata::tier_kind::file, 1e9, 1e9, false}, 10000, 400, 400}};
  CHECK(a.plan(paths) == std::vector<std::uint64_t>{400, 400});  // nothing observed: the descriptors
  a.observe(0, 100, 1.0);
  CHECK(a.plan(paths) == std::vector<std::uint64_t>{400, 400});  // one path observed is not enough
  a.observe(1, 300, 1.0);
  CHECK(a.plan(paths) == std::vector<std::uint64_t>{200, 600});
  a.observe(1, 100, 1.0);  // EWMA: 0.5 * 100 + 0.5 * 300 = 200
  CHECK(a.estimates()[1] == 200.0);
  CHECK(a.plan(paths) == std::vector<std::uint64_t>{266, 533});
  a.observe(0, 0, 0.0);  // an idle path keeps its estimate
  CHECK(a.estimates()[0] == 100.0);
  paths[1].capacity = 500;  // b has room for 100 more bytes only
  CHECK(a.plan(paths)[1] == 500);
  CHECK(a.max_move_bytes() == 100);
  CHECK_THROWS_AS(strata::adaptive({.smoothing = 0.0}), strata::config_error);
}

// --- the suite every placement policy passes -------------------------------------------------------

namespace {

struct fixed_ratio_fixture {
  static constexpr const char* name = "fixed_ratio";
  static strata::fixed_ratio make(std::size_t paths) {
    std::vector<unsigned> w(paths, 1);
    w[0] = 2;
    return strata::fixed_ratio(w);
  }
};
struct bandwidth_proportional_fixture {
  static constexpr const char* name = "bandwidth_proportional";
  static strata::bandwidth_proportional make(std::size_t) { return {}; }
};
struct adaptive_fixture {
  static constexpr const char* name = "adaptive";
  static strata::adaptive make(std::size_t paths) {
    strata::adaptive a({.smoothing = 0.5, .max_move_bytes = 1 << 20});
    for (std::size_t i = 0; i < paths; ++i) a.observe(i, (i + 1) * 1000, 1.0);  // observed rates 1:2:3...
    return a;
  }
};
#define STRATA_PLACEMENTS fixed_ratio_fixture, bandwidth_proportional_fixture, adaptive_fixture

std::vector<strata::path_view> views(std::size_t n, std::uint64_t capacity) {
  std::vector<strata::path_view> v;
  for (std::size_t i = 0; i < n; ++i)
    v.push_back({strata::tier_descriptor{fmt::format("p{}", i), strata::tier_kind::file, 1e9 * static_cast<double>(i + 1),
                                         5e8 * static_cast<double>(i + 1), false},
                 capacity, 0, 0});
  return v;
}

// Places `count` objects of `bytes`, updating the views as a multipath does; returns the paths.
template <class P>
std::vector<std::size_t> place_all(P& p, std::vector<strata::path_view>& v, int count, std::uint64_t bytes) {
  std::vector<std::size_t> chosen;
  for (int i = 0; i < count; ++i) {
    const std::size_t path = p.place(fmt::format("sg-{}", i), bytes, v);
    REQUIRE(path < v.size());
    REQUIRE(v[path].fits(bytes));
    v[path].used += bytes;
    v[path].placed_bytes += bytes;
    chosen.push_back(path);
  }
  return chosen;
}

}  // namespace

TEST_CASE_TEMPLATE("a placement policy chooses a path that exists and has room, and reaches every path", F,
                   STRATA_PLACEMENTS) {
  CAPTURE(F::name);
  for (const std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
    CAPTURE(n);
    auto p = F::make(n);
    auto v = views(n, strata::unlimited_capacity);
    const auto chosen = place_all(p, v, 60, 4096);
    for (std::size_t i = 0; i < n; ++i) CHECK(std::count(chosen.begin(), chosen.end(), i) > 0);
  }
}

TEST_CASE_TEMPLATE("a placement policy skips a full path while another has room", F, STRATA_PLACEMENTS) {
  CAPTURE(F::name);
  auto p = F::make(3);
  auto v = views(3, 64 * 4096);
  v[1].used = v[1].capacity;  // full from the start
  const auto chosen = place_all(p, v, 100, 4096);
  CHECK(std::count(chosen.begin(), chosen.end(), std::size_t{1}) == 0);
}

TEST_CASE_TEMPLATE("a placement policy with no room anywhere throws a capacity_error naming the object", F,
                   STRATA_PLACEMENTS) {
  CAPTURE(F::name);
  auto p = F::make(2);
  auto v = views(2, 8192);
  place_all(p, v, 4, 4096);  // both paths full now
  CHECK_THROWS_WITH_AS((void)p.place("the-object", 4096, v), doctest::Contains("the-object"), strata::capacity_error);
}

TEST_CASE_TEMPLATE("a placement policy is deterministic: the same requests get the same paths", F, STRATA_PLACEMENTS) {
  CAPTURE(F::name);
  auto a = F::make(3);
  auto b = F::make(3);
  auto va = views(3, strata::unlimited_capacity), vb = va;
  CHECK(place_all(a, va, 50, 12345) == place_all(b, vb, 50, 12345));
}

}  // namespace placement_test
