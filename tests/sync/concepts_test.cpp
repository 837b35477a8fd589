// The limiter concepts accept their models and reject near misses (each lacks one thing).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>

#include "strata/sync/counting_limiter.hpp"
#include "strata/sync/limiter.hpp"
#include "strata/sync/node_limiter.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace concepts_test {

namespace {

struct good_limiter {
  void acquire() {}
  bool try_acquire() { return true; }
  bool try_acquire_for(std::chrono::milliseconds) { return true; }
  strata::completion acquire_async() { return strata::make_ready_completion(); }
  void release() noexcept {}
};
struct blocking_only {  // no way to wait for a unit without blocking a thread
  void acquire() {}
  bool try_acquire() { return true; }
  bool try_acquire_for(std::chrono::milliseconds) { return true; }
  void release() noexcept {}
};
struct no_release {  // acquires, never gives back
  void acquire() {}
  bool try_acquire() { return true; }
  bool try_acquire_for(std::chrono::milliseconds) { return true; }
};
struct throwing_release {  // release runs in destructors: it must be noexcept
  void acquire() {}
  bool try_acquire() { return true; }
  bool try_acquire_for(std::chrono::milliseconds) { return true; }
  void release() {}
};
struct untimed {  // no bounded wait
  void acquire() {}
  bool try_acquire() { return true; }
  void release() noexcept {}
};
struct try_returns_void {  // the caller must learn whether it got a unit
  void acquire() {}
  void try_acquire() {}
  bool try_acquire_for(std::chrono::milliseconds) { return true; }
  void release() noexcept {}
};

static_assert(strata::limiter<good_limiter>);
static_assert(strata::limiter<strata::counting_limiter>);
static_assert(strata::limiter<strata::node_limiter>);
static_assert(!strata::limiter<no_release>);
static_assert(!strata::limiter<blocking_only>);
static_assert(!strata::limiter<throwing_release>);
static_assert(!strata::limiter<untimed>);
static_assert(!strata::limiter<try_returns_void>);

}  // namespace

TEST_CASE("the limiter concepts are checked at compile time (this file compiling is the test)") {
  CHECK(strata::limiter<strata::node_limiter>);
  CHECK_FALSE(strata::limiter<no_release>);
}

}  // namespace concepts_test
