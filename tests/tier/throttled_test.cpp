// throttled<T>: a shared link takes at least bytes / bandwidth, latency is added to every
// request, a link's slots come in order with a switch cost, node-wide links are shared between
// tiers (and processes), chunked requests interleave.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <strata/core/node_dir.hpp>
#include <strata/sync/node_limiter.hpp>
#include <strata/tier/throttled.hpp>

#include "tier_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace throttled_test {

using namespace strata_test;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {
// Removes a node link's file that a test made under the default node directory.
struct node_link_file {
  std::string name = fmt::format("strata-test-link-{}", ::getpid());
  ~node_link_file() {
    std::error_code ec;
    fs::remove(strata::default_node_limiter_dir() / ("link-" + name), ec);
  }
};
}  // namespace


TEST_CASE("a throttled link is shared: concurrent requests take at least bytes / bandwidth together") {
  constexpr double bw = 8.0 * 1024 * 1024;  // 8 MiB/s
  strata::throttled<strata::host_tier> t(strata::throttle_options{bw, bw, 0us}, host("slow"));
  const auto data = random_bytes(256 * 1024, 1);
  const auto t0 = clk::now();
  std::vector<strata::completion> writes;
  for (int i = 0; i < 4; ++i) writes.push_back(t.write(fmt::format("o{}", i), 0, data));
  strata::wait_all(writes);
  const auto took = clk::now() - t0;
  CHECK(took >= 120ms);  // 1 MiB at 8 MiB/s is 125 ms: a lower bound, whatever the machine load
  CHECK(t.descriptor().write_bandwidth == bw);

  t.set_bandwidth(0, 0);  // unshaped from now on
  CHECK(t.descriptor().write_bandwidth == 0);
  CHECK_THROWS_AS(t.set_bandwidth(-1, 0), strata::config_error);
}

TEST_CASE("a throttled tier adds its latency to every request") {
  strata::throttled<strata::host_tier> t(strata::throttle_options{0, 0, 30ms}, host("far"));
  const auto t0 = clk::now();
  t.write("x", 0, random_bytes(10, 1)).get();
  CHECK(clk::now() - t0 >= 30ms);
}

TEST_CASE("a link's slots come in the order asked for; another request's slot first pays the switch cost") {
  temp_dir dir;
  const auto at = [](int ms) { return clk::time_point(std::chrono::milliseconds(1'000'000 + ms)); };
  auto check = [&](strata::detail::link_timeline& a, strata::detail::link_timeline& b) {
    const auto x = a.new_tag(), y = b.new_tag();
    CHECK(x != y);
    CHECK(x != 0);
    auto s = a.reserve(0, at(0), 10ms, x, 3ms);  // first slot of the link: nothing to switch from
    CHECK(s.start == at(0));
    CHECK(s.end == at(10));
    s = b.reserve(0, at(1), 10ms, x, 3ms);  // same request, through the other handle: back to back
    CHECK(s.start == at(10));
    s = a.reserve(0, at(2), 10ms, y, 3ms);  // another request: the link spends 3 ms switching
    CHECK(s.start == at(23));
    CHECK(s.end == at(33));
    s = b.reserve(1, at(2), 5ms, y, 3ms);  // the write direction has its own time line
    CHECK(s.start == at(2));
    s = b.reserve(0, at(40), 10ms, x, 3ms);  // idle for 7 ms: the switch happened meanwhile
    CHECK(s.start == at(40));
    s = a.reserve(0, at(51), 10ms, y, 3ms);  // idle for 1 ms: 2 ms of the switch remain
    CHECK(s.start == at(53));
  };
  SUBCASE("an adaptor's own link") {
    strata::detail::local_link l;
    check(l, l);
  }
  SUBCASE("a node link opened twice by name (as two processes would)") {
    strata::detail::node_link a("test-link", dir.path()), b("test-link", dir.path());
    CHECK(fs::exists(dir.path() / "link-test-link"));
    check(a, b);
    strata::detail::node_link c("test-link", dir.path());  // a later opener sees the same time line
    CHECK(c.reserve(0, at(0), 1ms, c.new_tag(), 0ms).start == at(63));
  }
  SUBCASE("a node link file that is not one (another version, a reboot's leftover) is set up again") {
    {
      std::ofstream junk(dir.path() / "link-junk", std::ios::binary);
      const std::string ones(4096, '\xff');
      junk << ones;
    }
    strata::detail::node_link l("junk", dir.path());
    CHECK(l.reserve(0, at(0), 1ms, l.new_tag(), 5ms).start == at(0));
    CHECK(l.new_tag() == 2);
  }
  CHECK_THROWS_WITH_AS(strata::detail::node_link("../x", dir.path()), doctest::Contains("invalid name"),
                       strata::config_error);
}

TEST_CASE("throttled tiers naming one node link share its bandwidth") {
  constexpr double bw = 8.0 * 1024 * 1024;
  node_link_file file;
  const strata::throttle_options o{.read_bandwidth = bw, .write_bandwidth = bw, .latency = 0us, .link = file.name};
  strata::throttled<strata::host_tier> a(o, host("a")), b(o, host("b"));
  const auto data = random_bytes(512 * 1024, 2);
  const auto t0 = clk::now();
  std::vector<strata::completion> writes{a.write("x", 0, data), b.write("x", 0, data)};
  strata::wait_all(writes);
  CHECK(clk::now() - t0 >= 120ms);  // 1 MiB at 8 MiB/s together, though each tier alone would take half
  CHECK_THROWS_WITH_AS(strata::throttled<strata::host_tier>(strata::throttle_options{.link = "a/b"}, host("c")),
                       doctest::Contains("invalid name \"a/b\""), strata::config_error);
}

TEST_CASE("chunked requests on one link interleave piece by piece and pay the switch cost at each turn") {
  constexpr double bw = 8.0 * 1024 * 1024;
  constexpr std::uint64_t piece = 128 * 1024;  // 15.6 ms at 8 MiB/s
  constexpr int pieces = 8;
  const auto piece_time = std::chrono::duration<double>(static_cast<double>(piece) / bw);
  const auto data = random_bytes(piece * pieces, 3);
  const auto blocker = random_bytes(1600 * 1024, 4);  // 195 ms in one piece
  const auto blocker_time = std::chrono::duration<double>(static_cast<double>(blocker.size()) / bw);
  for (const auto cost : {0ms, 10ms}) {
    CAPTURE(cost.count());
    node_link_file file;
    // The link is busy with another tier's request while both chunked requests are issued, so
    // both first pieces are queued before either can reserve its second, however slowly this
    // thread issues them.
    strata::throttled<strata::host_tier> other(
        strata::throttle_options{.read_bandwidth = bw, .write_bandwidth = bw, .link = file.name}, host("other"));
    strata::throttled<strata::host_tier> t(strata::throttle_options{.read_bandwidth = bw,
                                                                    .write_bandwidth = bw,
                                                                    .link = file.name,
                                                                    .chunk_bytes = piece,
                                                                    .switch_cost = cost},
                                           host("pfs"));
    const auto t0 = clk::now();
    auto busy = other.write("blocker", 0, blocker);
    std::promise<clk::time_point> first_end;
    auto first = t.write("a", 0, data);
    first.on_complete([&](std::exception_ptr) { first_end.set_value(clk::now()); });
    auto second = t.write("b", 0, data);
    second.get();
    const auto all_done = clk::now();
    const auto first_done = first_end.get_future().get();
    busy.get();
    // Pieces alternate a, b, a, b, ... after the blocker: the first request ends one piece before
    // the second, and every turn but the first costs the switch. Lower bounds, whatever the load;
    // one after the other (no chunks) the first would be done `pieces` pieces after the blocker.
    CHECK(first_done - t0 >= blocker_time + (2 * pieces - 1) * piece_time + (2 * pieces - 2) * cost - 1ms);
    CHECK(all_done - t0 >= blocker_time + 2 * pieces * piece_time + (2 * pieces - 1) * cost - 1ms);
  }
}

}  // namespace throttled_test
