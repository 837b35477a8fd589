// budget and charged<Buffer>: a charge that does not fit is refused before anything is made and
// names what it was for; a buffer gives its charge back when it goes (or when making it threw);
// `releasing` lets a buffer be replaced in a full budget; peak() and used() stay exact under
// threads.
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include <strata/core/budget.hpp>
#include <strata/core/error.hpp>

// The folder's tests compile together: this file's names stay in its own namespace.
namespace budget_test {

namespace {
// A buffer whose construction can be made to fail, counting how many exist.
struct probe_buffer {
  static inline int alive = 0;
  probe_buffer() = default;
  explicit probe_buffer(std::size_t n, bool fail = false) : n_(n) {
    if (fail) throw std::runtime_error("no memory today");
    ++alive;
    live_ = true;
  }
  probe_buffer(probe_buffer&& o) noexcept : n_(o.n_), live_(std::exchange(o.live_, false)) {}
  probe_buffer& operator=(probe_buffer&& o) noexcept {
    if (live_) --alive;
    n_ = o.n_;
    live_ = std::exchange(o.live_, false);
    return *this;
  }
  ~probe_buffer() {
    if (live_) --alive;
  }
  std::byte* data() noexcept { return nullptr; }
  std::size_t size() const noexcept { return n_; }
  std::size_t n_ = 0;
  bool live_ = false;
};
}  // namespace

TEST_CASE("a charge that does not fit is refused with a capacity_error naming the budget and the thing") {
  strata::budget b(10'000, "test budget");
  b.charge(6000, "a");
  CHECK_THROWS_WITH_AS(b.charge(5000, "the second slot"),
                       doctest::Contains("test budget: 4.88 KiB for the second slot does not fit"),
                       strata::capacity_error);
  CHECK(b.used() == 6000);
  b.refund(6000);
  CHECK(b.used() == 0);
  CHECK(b.peak() == 6000);
  CHECK_THROWS_AS(b.charge(10'001, "too big"), strata::capacity_error);
}

TEST_CASE("charged<> holds its charge for its lifetime and gives it back when the buffer cannot be made") {
  strata::budget b(4096, "b");
  {
    strata::charged<probe_buffer> x(b, {1000, "x"}, 1000);
    CHECK(b.used() == 1000);
    CHECK(probe_buffer::alive == 1);
    strata::charged<probe_buffer> y = std::move(x);  // the charge moves with the buffer
    CHECK(b.used() == 1000);
    CHECK(x.cost() == 0);
    CHECK_THROWS_WITH_AS(strata::charged<probe_buffer>(b, {2000, "z"}, 2000, true), "no memory today",
                         std::runtime_error);
    CHECK(b.used() == 1000);  // refunded
    CHECK_THROWS_AS(strata::charged<probe_buffer>(b, {4000, "w"}, 4000), strata::capacity_error);
    CHECK(probe_buffer::alive == 1);  // nothing made for a refused charge
  }
  CHECK(b.used() == 0);
  CHECK(probe_buffer::alive == 0);
}

TEST_CASE("a buffer can be replaced by a larger one in a full budget when the old one is released") {
  strata::budget b(8192, "b");
  auto old = strata::allocate_host(b, 4096, strata::host_memory_kind::pageable, "old");
  auto other = strata::allocate_host(b, 4096, strata::host_memory_kind::pageable, "other");
  CHECK_THROWS_AS((void)strata::allocate_host(b, 4096, strata::host_memory_kind::pageable, "grown"),
                  strata::capacity_error);
  other = {};
  auto grown = strata::allocate_host(b, 8192, strata::host_memory_kind::pageable, "grown", old.cost());
  old = std::move(grown);  // the old buffer goes: what is charged is the new one's cost
  CHECK(b.used() == 8192);
}

TEST_CASE("host_budget charges whole pages and allocates zeroed host memory of its kind") {
  strata::host_budget b(3 * 4096);
  auto a = b.allocate(1, "one byte");
  CHECK(a.size() == 1);
  CHECK(a.cost() == 4096);
  CHECK(a.data()[0] == std::byte{0});
  CHECK(b.kind() == strata::host_memory_kind::pageable);
  CHECK(strata::host_budget::footprint(4097) == 8192);
  CHECK_THROWS_WITH_AS((void)b.allocate(3 * 4096, "three pages"), doctest::Contains("host memory budget"),
                       strata::capacity_error);
}

TEST_CASE("charges from many threads never pass the limit and add up exactly") {
  strata::budget b(64 * 1000, "shared");
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        try {
          b.charge(1000, "a piece");
          CHECK(b.used() <= b.limit());
          b.refund(1000);
        } catch (const strata::capacity_error&) {
          refused.fetch_add(1);
        }
      }
    });
  for (auto& t : threads) t.join();
  CHECK(b.used() == 0);
  CHECK(b.peak() <= b.limit());
  CHECK(refused.load() == 0);  // 4 x 1000 never passes 64000
}

}  // namespace budget_test
