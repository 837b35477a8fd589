// token_bucket: the booking arithmetic on explicit time points (exact, no sleeping), then real
// waits checked only from below (a loaded machine makes them longer, never shorter), then threads.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "strata/sync/token_bucket.hpp"

using namespace std::chrono_literals;

namespace {
using clock_type = std::chrono::steady_clock;
using tp = clock_type::time_point;
const tp t0{};  // an arbitrary origin: reserve() never reads the clock
constexpr tp never = tp::max();
}  // namespace

TEST_CASE("a full bucket lets the burst through at once, then paces requests at the rate, in order") {
  strata::token_bucket b(1000.0, 100, t0);  // 1000 B/s, burst 100 B
  CHECK(b.reserve(100, t0, never) == t0);
  CHECK(b.reserve(50, t0, never) == t0 + 50ms);
  CHECK(b.reserve(50, t0, never) == t0 + 100ms);  // queued behind the previous one
  CHECK(b.reserve(10, t0 + 200ms, never) == t0 + 200ms);  // paid off by then: 0 + 200 - 100 = 100 B left
}

TEST_CASE("a request larger than the burst goes once the bucket is full, and later ones wait out the debt") {
  strata::token_bucket b(1000.0, 100, t0);
  CHECK(b.reserve(60, t0, never) == t0);
  CHECK(b.reserve(1000, t0, never) == t0 + 60ms);  // waits for a full bucket (100 B), not for 1000 B
  CHECK(b.tokens(t0 + 60ms) == doctest::Approx(-900.0));
  CHECK(b.reserve(10, t0 + 60ms, never) == t0 + 970ms);  // 900 B of debt plus its own 10 B
}

TEST_CASE("a request that cannot go by its deadline books nothing") {
  strata::token_bucket b(1000.0, 100, t0);
  CHECK(b.reserve(100, t0, t0) == t0);
  CHECK_FALSE(b.reserve(10, t0, t0).has_value());
  CHECK_FALSE(b.reserve(10, t0, t0 + 9ms).has_value());
  CHECK(b.tokens(t0) == doctest::Approx(0.0));  // the refusals took nothing
  CHECK(b.reserve(10, t0, t0 + 10ms) == t0 + 10ms);
  CHECK(b.reserve(0, t0, t0) == t0);  // nothing to send never waits, even in debt
}

TEST_CASE("tokens refill up to the burst and no further") {
  strata::token_bucket b(1000.0, 100, t0);
  CHECK(b.reserve(100, t0, never) == t0);
  CHECK(b.tokens(t0 + 30ms) == doctest::Approx(30.0));
  CHECK(b.tokens(t0 + 10s) == doctest::Approx(100.0));
  CHECK(b.reserve(100, t0 + 10s, never) == t0 + 10s);
  CHECK(b.reserve(1, t0 + 10s, never) == t0 + 10s + 1ms);  // no credit saved beyond the burst
}

TEST_CASE("a bad rate or burst is a config_error") {
  CHECK_THROWS_WITH_AS(strata::token_bucket(0.0, 1), doctest::Contains("rate must be a positive number"),
                       strata::config_error);
  CHECK_THROWS_AS(strata::token_bucket(-5.0, 1), strata::config_error);
  CHECK_THROWS_AS(strata::token_bucket(std::numeric_limits<double>::infinity(), 1), strata::config_error);
  CHECK_THROWS_WITH_AS(strata::token_bucket(1.0, 0), "token_bucket: burst must be at least 1 byte",
                       strata::config_error);
}

TEST_CASE("acquire really waits: 11 kB at 100 kB/s with a 1 kB burst take at least 100 ms") {
  strata::token_bucket b(100'000.0, 1000);
  const auto start = clock_type::now();
  b.acquire(1000);   // the burst: immediate
  b.acquire(10000);  // waits for a full bucket: 10 ms, leaves 9000 B of debt
  b.acquire(1);      // waits out the debt: 90 ms more
  CHECK(clock_type::now() - start >= 100ms);
}

TEST_CASE("try_acquire and try_acquire_for give up when the tokens are far away") {
  strata::token_bucket b(1.0, 10);  // 1 B/s: the next 10 B are 10 s away
  CHECK(b.try_acquire(10));
  CHECK_FALSE(b.try_acquire(10));
  CHECK_FALSE(b.try_acquire_for(10, 1ms));
  CHECK(b.try_acquire(0));
}

TEST_CASE("threads sharing a bucket never get more than burst + rate x elapsed bytes through") {
  constexpr double rate = 200'000.0;  // B/s
  constexpr std::uint64_t burst = 4096;
  constexpr std::uint64_t chunk = 1000;
  const auto start = clock_type::now();
  strata::token_bucket b(rate, burst, start);
  std::mutex m;
  std::vector<std::pair<tp, std::uint64_t>> granted;
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        b.acquire(chunk);
        const auto now = clock_type::now();  // no earlier than the booked start
        std::lock_guard lock(m);
        granted.emplace_back(now, chunk);
      }
    });
  for (auto& t : pool) t.join();
  std::sort(granted.begin(), granted.end());
  std::uint64_t sum = 0;
  for (auto [when, bytes] : granted) {
    sum += bytes;
    const double allowed = static_cast<double>(burst) + rate * std::chrono::duration<double>(when - start).count();
    CHECK(static_cast<double>(sum) <= allowed + 1.0);  // 1 B of rounding
  }
  CHECK(sum == 100 * chunk);
}
