// completion: continuations run once and in order with waiters, when_all carries the first
// error, a dropped promise fails its waiters.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <strata/core/completion.hpp>
#include <strata/core/error.hpp>

// The folder's tests compile together: this file's names stay in its own namespace.
namespace completion_test {


TEST_CASE("completion: continuations run once, when_all carries the first error, a dropped promise fails") {
  strata::completion_promise p;
  auto f = p.get_future();
  int runs = 0;
  f.on_complete([&](std::exception_ptr e) { runs += e ? 100 : 1; });
  CHECK_FALSE(f.ready());
  p.set_value();
  p.set_value();  // ignored
  CHECK(runs == 1);
  f.on_complete([&](std::exception_ptr) { ++runs; });  // already complete: runs at once
  CHECK(runs == 2);

  strata::completion_promise a, b;
  auto all = strata::when_all({a.get_future(), b.get_future()});
  b.set_exception(std::make_exception_ptr(strata::config_error("second")));
  CHECK_FALSE(all.ready());
  a.set_value();
  CHECK_THROWS_WITH_AS(all.get(), "second", strata::config_error);

  strata::completion orphan;
  { strata::completion_promise dropped; orphan = dropped.get_future(); }
  CHECK_THROWS_WITH_AS(orphan.get(), doctest::Contains("destroyed before the request completed"), strata::error);
}

TEST_CASE("completion: a waiter wakes only after the continuations registered before completion ran") {
  for (int round = 0; round < 50; ++round) {
    strata::completion_promise p;
    auto f = p.get_future();
    std::atomic<int> counted{0};
    f.on_complete([&](std::exception_ptr) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow bookkeeping step
      counted.store(1, std::memory_order_relaxed);
    });
    std::thread completer([&] { p.set_value(); });
    f.get();
    CHECK(counted.load(std::memory_order_relaxed) == 1);  // what the continuation recorded is visible
    CHECK(f.ready());
    completer.join();
  }
}

TEST_CASE("completion: a join made while the request completes waits for the earlier continuations") {
  strata::completion_promise p;
  auto f = p.get_future();
  std::promise<void> first_running, join_made;
  auto join_made_f = join_made.get_future();
  std::atomic<int> first_done{0};
  f.on_complete([&](std::exception_ptr) {
    first_running.set_value();
    join_made_f.wait();  // the join below is registered while this continuation runs
    first_done.store(1, std::memory_order_relaxed);
  });
  std::thread completer([&] { p.set_value(); });
  first_running.get_future().wait();
  auto all = strata::when_all({f});
  join_made.set_value();
  all.get();
  CHECK(first_done.load(std::memory_order_relaxed) == 1);  // seen through the join, too
  completer.join();
}

}  // namespace completion_test
