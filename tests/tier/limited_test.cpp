// limited<T, L>: never more requests in flight than the limiter allows, separate read and write
// limiters, the node-wide limiter, permits awaited as completions (never blocking the caller),
// and long queues over a tier that completes at once.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <strata/sync/counting_limiter.hpp>
#include <strata/sync/node_limiter.hpp>
#include <strata/sync/rw_limiter.hpp>
#include <strata/tier/limited.hpp>
#include <strata/tier/throttled.hpp>

#include "tier_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace limited_test {

using namespace strata_test;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

TEST_CASE("limited never has more requests in flight than the limiter allows") {
  test_limiter limiter(2);
  strata::limited<strata::throttled<strata::host_tier>, test_limiter> t(
      limiter, strata::throttle_options{0, 0, 2ms}, host("pfs"));
  std::vector<std::future<void>> writers;
  for (int th = 0; th < 6; ++th)
    writers.push_back(std::async(std::launch::async, [&t, th] {
      const auto data = random_bytes(1000, th);
      for (int i = 0; i < 5; ++i) t.write(fmt::format("w{}-{}", th, i), 0, data).get();
    }));
  for (auto& w : writers) w.get();
  CHECK(limiter.high_water() <= 2);
  CHECK(limiter.high_water() >= 1);
  // Every permit came back: the next two acquisitions do not block.
  limiter.acquire();
  limiter.acquire();
  limiter.release();
  limiter.release();
}

TEST_CASE("limited with separate read and write limiters: a held read lock stops reads, never writes") {
  // MLP-Offload's PFS locks: one for swap-ins, one for swap-outs, so a rank's write-behind never
  // waits for another rank's read.
  auto reads = std::make_shared<strata::counting_limiter>(1);
  auto writes = std::make_shared<strata::counting_limiter>(1);
  const strata::rw_limiter<strata::counting_limiter> rw(reads, writes);
  strata::limited<strata::host_tier, strata::counting_limiter> t(rw, host("pfs"));
  CHECK(&t.limiter(strata::io_direction::read) == reads.get());
  CHECK(&t.limiter(strata::io_direction::write) == writes.get());
  const auto data = random_bytes(4096, 1);
  t.write("a", 0, data).get();
  reads->acquire();  // another rank is reading
  std::vector<std::byte> out(data.size());
  auto r = t.read("a", 0, out);
  t.write("b", 0, data).get();  // writes go on
  CHECK_FALSE(r.ready());
  reads->release();
  r.get();
  CHECK(out == data);
  // Shared: the same limiter for both directions, as limited(limiter, ...) is.
  const strata::rw_limiter<strata::counting_limiter> one(reads);
  strata::limited<strata::host_tier, strata::counting_limiter> s(one, host("pfs2"));
  CHECK(&s.limiter(strata::io_direction::write) == reads.get());
  reads->acquire();
  auto w = s.write("c", 0, data);
  CHECK_FALSE(w.ready());
  reads->release();
  w.get();
}

TEST_CASE("limited works with the node-wide limiter: a second process-level user waits for the permit") {
  temp_dir dir;
  strata::node_limiter node(fmt::format("tier-test-{}", ::getpid()), 1, dir.path());
  strata::limited<strata::host_tier, strata::node_limiter> t(node, host("pfs"));
  t.write("x", 0, random_bytes(100, 1)).get();  // took and returned the node's only permit
  CHECK(node.try_acquire());                    // so it is free again
  auto blocked = std::async(std::launch::async, [&] { t.write("y", 0, random_bytes(100, 2)).get(); });
  CHECK(blocked.wait_for(50ms) == std::future_status::timeout);  // waits while we hold it
  node.release();
  blocked.get();
  CHECK(t.size("y") == 100u);
}

TEST_CASE("limited never blocks the caller: a request waits for its permit as a completion, first come first served") {
  for (const bool node_wide : {false, true}) {
    CAPTURE(node_wide);
    temp_dir dir;
    strata::counting_limiter counting(1);
    strata::node_limiter node(fmt::format("async-{}", ::getpid()), 1, dir.path());
    auto run = [&](auto& limiter) {
      strata::limited<strata::host_tier, std::remove_reference_t<decltype(limiter)>> t(limiter, host("pfs"));
      const auto a = random_bytes(100, 1), b = random_bytes(100, 2);
      limiter.acquire();  // someone else holds the only permit
      std::vector<int> done;
      std::mutex m;
      auto w1 = t.write("a", 0, a);  // returns at once: this thread never waits for the permit
      auto w2 = t.write("b", 0, b);
      w1.on_complete([&](std::exception_ptr) { std::lock_guard l(m); done.push_back(1); });
      w2.on_complete([&](std::exception_ptr) { std::lock_guard l(m); done.push_back(2); });
      CHECK_FALSE(w1.wait_for(20ms));
      CHECK_FALSE(t.size("a").has_value());  // nothing reached the tier yet
      limiter.release();
      w1.get();
      w2.get();
      std::lock_guard l(m);
      CHECK(done == std::vector<int>{1, 2});
      CHECK(t.size("b") == 100u);
      CHECK(limiter.try_acquire());  // both permits came back
      limiter.release();
    };
    if (node_wide)
      run(node);
    else
      run(counting);
  }
}

TEST_CASE("limited over a tier that completes at once serves a long queue without deep recursion") {
  strata::counting_limiter limiter(1);
  strata::limited<strata::host_tier, strata::counting_limiter> t(limiter, host("fast"));
  const auto data = random_bytes(8, 1);
  limiter.acquire();
  std::vector<strata::completion> writes;
  for (int i = 0; i < 20000; ++i) writes.push_back(t.write(fmt::format("o{}", i), 0, data));
  limiter.release();  // grants cascade: each one issues a request that completes and grants the next
  strata::wait_all(writes);
  CHECK(limiter.available() == 1);
}

}  // namespace limited_test
