// One typed suite over every limiter (in-process threads), then what only counting_limiter or
// node_limiter promise. Threads here are the point: these run under ThreadSanitizer too.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/env.hpp"
#include "strata/sync/counting_limiter.hpp"
#include "strata/sync/limiter.hpp"
#include "strata/sync/node_limiter.hpp"
#include "strata/sync/rw_limiter.hpp"
#include "temp_dir.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace limiter_test {

using namespace std::chrono_literals;

namespace {

constexpr auto hang_guard = 120s;  // only guards against hangs

struct counting_fixture {
  explicit counting_fixture(std::size_t cap) : limiter(cap) {}
  strata::counting_limiter limiter;
};

struct node_fixture {
  explicit node_fixture(std::size_t cap) : limiter("io", cap, dir.path()) {}
  strata_test::temp_dir dir;
  strata::node_limiter limiter;
};

// Threads hammer the limiter; each records how many hold a permit while it holds one.
template <class L>
std::size_t high_water(L& limiter, std::size_t threads, int rounds) {
  std::atomic<std::size_t> holding{0};
  std::atomic<std::size_t> most{0};
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        strata::permit p(limiter);
        const auto now = holding.fetch_add(1) + 1;
        auto seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::yield();
        holding.fetch_sub(1);
      }
    });
  for (auto& t : pool) t.join();
  return most.load();
}

}  // namespace

#define STRATA_LIMITER_FIXTURES counting_fixture, node_fixture

TEST_CASE_TEMPLATE("many threads never hold more permits than the cap, not even briefly", F, STRATA_LIMITER_FIXTURES) {
  for (std::size_t cap : {1, 3}) {
    CAPTURE(cap);
    F fx(cap);
    CHECK(high_water(fx.limiter, 8, 200) <= cap);
  }
}

TEST_CASE_TEMPLATE("cap holders can hold at once, and one more is refused until one releases", F,
                   STRATA_LIMITER_FIXTURES) {
  F fx(3);
  std::vector<strata::permit<decltype(fx.limiter)>> held;
  for (int i = 0; i < 3; ++i) {
    held.emplace_back(fx.limiter, std::try_to_lock);
    CHECK(held.back().owns());
  }
  strata::permit<decltype(fx.limiter)> extra(fx.limiter, std::try_to_lock);
  CHECK_FALSE(extra.owns());
  CHECK_FALSE(fx.limiter.try_acquire_for(1ms));
  strata::permit<decltype(fx.limiter)> timed(fx.limiter, 1ms);
  CHECK_FALSE(timed);
  held.pop_back();  // the RAII permit gives its unit back
  CHECK(fx.limiter.try_acquire());
  fx.limiter.release();
}

TEST_CASE_TEMPLATE("a permit moves its unit and releases it exactly once", F, STRATA_LIMITER_FIXTURES) {
  F fx(1);
  {
    strata::permit a(fx.limiter);
    strata::permit b(std::move(a));
    CHECK_FALSE(a.owns());  // NOLINT(bugprone-use-after-move): that is the point
    CHECK(b.owns());
    CHECK_FALSE(fx.limiter.try_acquire());
    strata::permit<decltype(fx.limiter)> c(fx.limiter, std::try_to_lock);
    CHECK_FALSE(c);
    c = std::move(b);
    CHECK(c.owns());
    c.release();
    CHECK_FALSE(c.owns());
    CHECK(fx.limiter.try_acquire());
    fx.limiter.release();
  }
  CHECK(fx.limiter.try_acquire());  // nothing released twice, nothing leaked
  CHECK_FALSE(fx.limiter.try_acquire());
  fx.limiter.release();
}

TEST_CASE_TEMPLATE("a blocked acquire proceeds when another thread releases", F, STRATA_LIMITER_FIXTURES) {
  F fx(1);
  fx.limiter.acquire();
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    got = fx.limiter.try_acquire_for(hang_guard);
    if (got) fx.limiter.release();
  });
  fx.limiter.release();
  waiter.join();
  CHECK(got);
}

TEST_CASE_TEMPLATE("acquire_async completes at once when a unit is free, else when one is released, oldest first", F,
                   STRATA_LIMITER_FIXTURES) {
  F fx(1);
  auto first = fx.limiter.acquire_async();
  CHECK(first.wait_for(hang_guard));
  first.get();
  std::mutex m;
  std::vector<int> order;
  auto second = fx.limiter.acquire_async();
  auto third = fx.limiter.acquire_async();
  second.on_complete([&](std::exception_ptr) { std::lock_guard l(m); order.push_back(2); });
  third.on_complete([&](std::exception_ptr) { std::lock_guard l(m); order.push_back(3); });
  CHECK_FALSE(second.wait_for(20ms));
  CHECK_FALSE(fx.limiter.try_acquire());  // queued waiters come before a newcomer
  fx.limiter.release();
  REQUIRE(second.wait_for(hang_guard));
  CHECK_FALSE(third.wait_for(20ms));
  fx.limiter.release();
  REQUIRE(third.wait_for(hang_guard));
  fx.limiter.release();
  std::lock_guard l(m);
  CHECK(order == std::vector<int>{2, 3});
}

TEST_CASE_TEMPLATE("a limiter destroyed while acquire_async waits fails the completion instead of leaving it hanging", F,
                   STRATA_LIMITER_FIXTURES) {
  strata::completion waiting;
  {
    F fx(1);
    fx.limiter.acquire();
    waiting = fx.limiter.acquire_async();
    CHECK_FALSE(waiting.ready());
    fx.limiter.release();  // granted to the waiter, which never gives it back: destruction cleans up
    REQUIRE(waiting.wait_for(hang_guard));
    waiting = fx.limiter.acquire_async();  // and this one waits when the limiter goes
  }
  REQUIRE(waiting.wait_for(hang_guard));
  CHECK_THROWS_AS(waiting.get(), strata::error);
}

TEST_CASE("counting_limiter: a try_acquire_for that times out takes its place out of the queue") {
  strata::counting_limiter l(1);
  l.acquire();
  CHECK_FALSE(l.try_acquire_for(5ms));
  CHECK(l.waiting() == 0);
  l.release();
  CHECK(l.available() == 1);  // the unit did not go to the waiter that left
}

TEST_CASE("counting_limiter rejects a zero cap and reports what is available") {
  CHECK_THROWS_WITH_AS(strata::counting_limiter(0), "counting_limiter: capacity must be at least 1",
                       strata::config_error);
  strata::counting_limiter l(2);
  CHECK(l.capacity() == 2);
  l.acquire();
  CHECK(l.available() == 1);
  l.release();
  CHECK(l.available() == 2);
}

TEST_CASE("threads using separate node_limiter objects of one name exclude each other") {
  strata_test::temp_dir dir;
  std::vector<std::unique_ptr<strata::node_limiter>> objects;
  for (int i = 0; i < 4; ++i) objects.push_back(std::make_unique<strata::node_limiter>("io", 2, dir.path()));
  std::atomic<std::size_t> holding{0};
  std::atomic<std::size_t> most{0};
  std::vector<std::thread> pool;
  for (auto& o : objects)
    pool.emplace_back([&, l = o.get()] {
      for (int i = 0; i < 100; ++i) {
        strata::permit p(*l);
        const auto now = holding.fetch_add(1) + 1;
        auto seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::yield();
        holding.fetch_sub(1);
      }
    });
  for (auto& t : pool) t.join();
  CHECK(most.load() <= 2);
}

TEST_CASE("a permit held by one thread blocks another thread of the same process using the same node_limiter") {
  strata_test::temp_dir dir;
  strata::node_limiter l("io", 1, dir.path());
  l.acquire();
  bool other = true;
  std::thread t([&] { other = l.try_acquire(); });  // same object, same process, another thread
  t.join();
  CHECK_FALSE(other);
  l.release();
  CHECK(l.held() == 0);
}

TEST_CASE("node_limiter validates its name and its cap, and names the directory on errors") {
  strata_test::temp_dir dir;
  CHECK_THROWS_WITH_AS(strata::node_limiter("../etc", 1, dir.path()), doctest::Contains("invalid name \"../etc\""),
                       strata::config_error);
  CHECK_THROWS_AS(strata::node_limiter("", 1, dir.path()), strata::config_error);
  CHECK_THROWS_AS(strata::node_limiter("a/b", 1, dir.path()), strata::config_error);
  CHECK_THROWS_WITH_AS(strata::node_limiter("io", 0, dir.path()), doctest::Contains("permits must be in [1,"),
                       strata::config_error);
  const auto file = dir.path() / "plain-file";
  { std::ofstream(file) << "x"; }
  const std::string where = file.string();
  CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1, file), doctest::Contains(where.c_str()), strata::io_error);
}

TEST_CASE("node_limiter refuses another cap while the limiter is in use, and takes it once idle") {
  strata_test::temp_dir dir;
  {
    strata::node_limiter one("io", 1, dir.path());
    one.acquire();
    CHECK_THROWS_WITH_AS(strata::node_limiter("io", 2, dir.path()),
                         doctest::Contains("asks for 2 permits but the processes using"), strata::config_error);
    one.release();
  }
  strata::node_limiter two("io", 2, dir.path());
  CHECK(two.try_acquire());
  CHECK(two.try_acquire());
  two.release();
  two.release();
}

TEST_CASE("node_limiter files live in STRATA_NODE_LIMITER_DIR, which must be absolute") {
  strata_test::temp_dir dir;
  ::setenv("STRATA_NODE_LIMITER_DIR", dir.path().c_str(), 1);
  CHECK(strata::default_node_limiter_dir() == dir.path());
  {
    strata::node_limiter l("io", 1);
    CHECK(l.directory() == dir.path() / "io");
    CHECK(std::filesystem::exists(dir.path() / "io" / "queue.lock"));
  }
  ::setenv("STRATA_NODE_LIMITER_DIR", "relative/dir", 1);
  CHECK_THROWS_WITH_AS((void)strata::default_node_limiter_dir(), doctest::Contains("must be an absolute path"),
                       strata::config_error);
  ::unsetenv("STRATA_NODE_LIMITER_DIR");
  const auto d = strata::default_node_limiter_dir().string();
  CHECK(d.find("strata-" + std::to_string(::getuid())) != std::string::npos);
  CHECK(strata::unknown_env_variables().empty());  // the variable is registered
}

TEST_CASE("read and write permits are shared or separate as configured") {
  strata_test::temp_dir dir;
  {
    auto rw = strata::make_node_rw_limiter("pfs", 1, strata::rw_sharing::shared, dir.path());
    CHECK(rw.sharing() == strata::rw_sharing::shared);
    strata::permit r(rw.get(strata::io_direction::read));
    CHECK_FALSE(rw.writes().try_acquire());  // a read holds the only permit for both
  }
  {
    auto rw = strata::make_node_rw_limiter("pfs", 1, strata::rw_sharing::separate, dir.path());
    CHECK(rw.sharing() == strata::rw_sharing::separate);
    strata::permit r(rw.reads());
    CHECK_FALSE(rw.reads().try_acquire());
    CHECK(rw.writes().try_acquire());  // writes have their own
    rw.writes().release();
  }
  auto counted = strata::rw_limiter<strata::counting_limiter>(std::make_shared<strata::counting_limiter>(1));
  counted.reads().acquire();
  CHECK_FALSE(counted.writes().try_acquire());
  counted.reads().release();
}

}  // namespace limiter_test
