#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>

#include "strata/core/aligned_buffer.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace aligned_buffer_test {

using strata::aligned_buffer;
using strata::buffer_init;
using strata::direct_io_buffer;

namespace {
bool aligned_to(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }
}  // namespace

static_assert(!std::is_copy_constructible_v<aligned_buffer>);
static_assert(!std::is_copy_assignable_v<direct_io_buffer>);
static_assert(std::is_nothrow_move_constructible_v<aligned_buffer>);
static_assert(std::is_nothrow_move_assignable_v<direct_io_buffer>);

TEST_CASE("a direct_io_buffer is 4096-aligned and padded to a multiple of 4096") {
  for (std::size_t n : {1UL, 511UL, 4095UL, 4096UL, 4097UL, 3UL * (8UL << 20) + 5UL}) {
    CAPTURE(n);
    direct_io_buffer b(n);
    CHECK(b.size() == n);
    CHECK(b.alignment() == 4096);
    CHECK(aligned_to(b.data(), 4096));
    CHECK(b.padded_size() % 4096 == 0);
    CHECK(b.padded_size() >= n);
    CHECK(b.padded_size() < n + 4096);
    std::memset(b.data(), 0xab, n);  // ASan flags any write past the allocation
  }
}

TEST_CASE("the padding after size() is zeroed so no stale heap bytes reach a file") {
  direct_io_buffer b(100);
  const auto padded = b.padded_bytes();
  for (std::size_t i = 100; i < padded.size(); ++i) REQUIRE(padded[i] == std::byte{0});
}

TEST_CASE("run-time alignment is honoured for every power of two") {
  for (std::size_t a = 1; a <= (1U << 21); a <<= 1) {
    CAPTURE(a);
    aligned_buffer b(a + 3, a);
    CHECK(aligned_to(b.data(), a));
    CHECK(b.alignment() == a);
    CHECK(b.padded_size() % a == 0);
  }
}

TEST_CASE("a bad alignment or an impossible size is a typed error") {
  CHECK_THROWS_WITH_AS(aligned_buffer(10, 3), doctest::Contains("alignment 3 is not a power of two"),
                       strata::config_error);
  CHECK_THROWS_WITH_AS(aligned_buffer(10, 0), doctest::Contains("not a power of two"), strata::config_error);
  CHECK_THROWS_AS(aligned_buffer(SIZE_MAX - 10, 4096), strata::capacity_error);
  // Far beyond any address space: posix_memalign fails, and that is a capacity_error, not a crash.
  CHECK_THROWS_WITH_AS(direct_io_buffer(std::size_t{1} << 62), doctest::Contains("cannot allocate"),
                       strata::capacity_error);
}

TEST_CASE("zeroed buffers start zeroed") {
  aligned_buffer b(10000, 64, buffer_init::zeroed);
  for (auto x : b.bytes()) REQUIRE(x == std::byte{0});
}

TEST_CASE("an empty buffer owns nothing") {
  direct_io_buffer a;
  CHECK(a.empty());
  CHECK(a.data() == nullptr);
  direct_io_buffer z(0);
  CHECK(z.empty());
  CHECK(z.data() == nullptr);
  CHECK(z.padded_size() == 0);
}

TEST_CASE("moving transfers ownership and leaves the source empty") {
  direct_io_buffer a(8192);
  std::memset(a.data(), 7, a.size());
  std::byte* p = a.data();

  direct_io_buffer b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.size() == 8192);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): the contract under test
  CHECK(a.size() == 0);

  direct_io_buffer c(4096);
  c = std::move(b);  // c's old allocation is freed (ASan's leak check proves it)
  CHECK(c.data() == p);
  CHECK(std::to_integer<int>(c.data()[8191]) == 7);

  auto& alias = c;
  c = std::move(alias);  // self-move keeps the buffer
  CHECK(c.data() == p);

  direct_io_buffer d(100);
  swap(c, d);
  CHECK(d.data() == p);
  CHECK(c.size() == 100);
}

TEST_CASE("as<T>() views the bytes as elements and checks size and alignment") {
  aligned_buffer b(16 * sizeof(float), 64);
  auto f = b.as<float>();
  CHECK(f.size() == 16);
  std::iota(f.begin(), f.end(), 0.0f);
  CHECK(b.as<float>()[15] == 15.0f);
  CHECK_THROWS_AS((void)aligned_buffer(10, 64).as<float>(), strata::config_error);
  CHECK_THROWS_AS((void)aligned_buffer(16, 2).as<double>(), strata::config_error);
}

}  // namespace aligned_buffer_test
