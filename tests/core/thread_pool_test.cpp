#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/thread_pool.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace thread_pool_test {

using namespace std::chrono_literals;

namespace {
// A gate that tasks wait on, so a test controls exactly when they may finish.
class gate {
 public:
  void open() { promise_.set_value(); }
  void wait() const { future_.wait(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
};
}  // namespace

TEST_CASE("submit returns futures with the tasks' results") {
  strata::thread_pool pool(4);
  std::vector<std::future<int>> futures;
  for (int i = 0; i < 100; ++i) futures.push_back(pool.submit([](int x) { return x * x; }, i));
  int sum = 0;
  for (auto& f : futures) sum += f.get();
  CHECK(sum == 328350);  // sum of squares 0..99
  auto v = pool.submit([] {});
  v.get();
  auto s = pool.submit([](std::string a, const std::string& b) { return a + b; }, std::string("ab"), "cd");
  CHECK(s.get() == "abcd");
}

TEST_CASE("move-only callables and arguments are accepted") {
  strata::thread_pool pool(2);
  auto p = std::make_unique<int>(41);
  auto f = pool.submit([q = std::move(p)](std::unique_ptr<int> r) { return *q + *r; }, std::make_unique<int>(1));
  CHECK(f.get() == 42);
}

TEST_CASE("an exception thrown by a task is rethrown by its future and the pool keeps working") {
  strata::thread_pool pool(2);
  auto bad = pool.submit([]() -> int { throw std::runtime_error("task failed: subgroup 7"); });
  CHECK_THROWS_WITH_AS(bad.get(), "task failed: subgroup 7", std::runtime_error);
  auto typed = pool.submit([] { throw strata::io_error("pread", "/x", 4096, 5); });
  CHECK_THROWS_AS(typed.get(), strata::io_error);
  CHECK(pool.submit([] { return 1; }).get() == 1);
}

TEST_CASE("tasks run concurrently on all workers, each knowing its index") {
  constexpr std::size_t n = 4;
  strata::thread_pool pool(n, "idx");
  CHECK(pool.size() == n);
  CHECK(strata::thread_pool::current_worker_index() == -1);
  CHECK_FALSE(pool.is_worker());
  // All n tasks must be running at once to pass the barrier: proves n real workers.
  std::atomic<std::size_t> arrived{0};
  std::vector<std::future<int>> fs;
  for (std::size_t i = 0; i < n; ++i)
    fs.push_back(pool.submit([&] {
      arrived.fetch_add(1);
      while (arrived.load() < n) std::this_thread::yield();
      return strata::thread_pool::current_worker_index();
    }));
  std::set<int> indices;
  for (auto& f : fs) indices.insert(f.get());
  CHECK(indices == std::set<int>{0, 1, 2, 3});
  CHECK(pool.submit([&] { return pool.is_worker(); }).get());
}

TEST_CASE("destruction runs every pending task before joining") {
  std::atomic<int> ran{0};
  gate g;
  std::vector<std::future<void>> fs;
  {
    strata::thread_pool pool(2);
    for (int i = 0; i < 50; ++i)
      fs.push_back(pool.submit([&] {
        g.wait();
        ran.fetch_add(1);
      }));
    CHECK(pool.pending() >= 48);  // two may have started, the rest wait in the queue
    g.open();
  }  // ~thread_pool drains the queue
  CHECK(ran.load() == 50);
  for (auto& f : fs) CHECK_NOTHROW(f.get());
}

TEST_CASE("cancel_pending drops queued tasks, whose futures report a broken promise") {
  strata::thread_pool pool(1);
  gate g;
  std::atomic<int> ran{0};
  auto running = pool.submit([&] {
    g.wait();
    ran.fetch_add(1);
  });
  while (pool.pending() != 0) std::this_thread::yield();  // the first task has started
  std::vector<std::future<void>> queued;
  for (int i = 0; i < 10; ++i) queued.push_back(pool.submit([&] { ran.fetch_add(1); }));
  CHECK(pool.cancel_pending() == 10);
  g.open();
  running.get();
  for (auto& f : queued) {
    try {
      f.get();
      FAIL("a cancelled task ran");
    } catch (const std::future_error& e) {
      CHECK(e.code() == std::future_errc::broken_promise);
    }
  }
  CHECK(ran.load() == 1);
}

TEST_CASE("wait_idle returns once nothing is queued or running") {
  strata::thread_pool pool(3);
  std::atomic<int> done{0};
  for (int i = 0; i < 200; ++i)
    (void)pool.submit([&] {
      std::this_thread::sleep_for(50us);
      done.fetch_add(1);
    });
  pool.wait_idle();
  CHECK(done.load() == 200);
  CHECK(pool.pending() == 0);
  auto f = pool.submit([&] { pool.wait_idle(); });
  CHECK_THROWS_WITH_AS(f.get(), doctest::Contains("wait_idle() called from its own worker"), strata::config_error);
}

TEST_CASE("submit after shutdown is an error, and shutdown is idempotent") {
  strata::thread_pool pool(2, "late");
  pool.shutdown();
  pool.shutdown();
  CHECK_THROWS_WITH_AS((void)pool.submit([] {}), "thread_pool 'late': submit() after shutdown", strata::error);
}

TEST_CASE("many threads can submit at once without losing tasks") {
  strata::thread_pool pool(3);
  std::atomic<long> sum{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < 4; ++t)
    producers.emplace_back([&, t] {
      std::vector<std::future<void>> fs;
      for (int i = 0; i < 1000; ++i) fs.push_back(pool.submit([&sum, v = t * 1000 + i] { sum.fetch_add(v); }));
      for (auto& f : fs) f.get();
    });
  for (auto& p : producers) p.join();
  CHECK(sum.load() == 3999L * 4000L / 2);
}

TEST_CASE("a pool needs at least one thread") {
  CHECK_THROWS_AS(strata::thread_pool(0), strata::config_error);
}

}  // namespace thread_pool_test
