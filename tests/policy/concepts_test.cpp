// The policy concepts accept their models and reject near misses (each bad type lacks one thing).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "strata/policy/belady.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/fifo.hpp"
#include "strata/policy/lru.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace concepts_test {

namespace {

// A complete policy; the near misses below each change one member.
struct good_policy {
  void on_step_begin(std::span<const std::size_t>, std::span<const std::size_t>) {}
  void on_insert(std::size_t) {}
  void on_access(std::size_t) {}
  void on_erase(std::size_t) noexcept {}
  void pin(std::size_t) {}
  void unpin(std::size_t) noexcept {}
  [[nodiscard]] std::optional<std::size_t> victim() const { return std::nullopt; }
  [[nodiscard]] bool contains(std::size_t) const { return false; }
  [[nodiscard]] std::size_t size() const { return 0; }
};

struct no_victim : good_policy {
  void victim() = delete;
};
struct victim_returns_id : good_policy {  // must say "none" when everything is pinned
  [[nodiscard]] std::size_t victim() const { return 0; }
};
struct throwing_erase : good_policy {  // erase runs on release paths: must be noexcept
  void on_erase(std::size_t) {}
};
struct throwing_unpin : good_policy {
  void unpin(std::size_t) {}
};
struct no_lookahead : good_policy {  // on_step_begin takes this step's and the next step's order
  void on_step_begin(std::span<const std::size_t>) {}
};
struct mutating_victim {  // victim() only looks: it must be callable on a const policy
  void on_step_begin(std::span<const std::size_t>, std::span<const std::size_t>) {}
  void on_insert(std::size_t) {}
  void on_access(std::size_t) {}
  void on_erase(std::size_t) noexcept {}
  void pin(std::size_t) {}
  void unpin(std::size_t) noexcept {}
  [[nodiscard]] std::optional<std::size_t> victim() { return std::nullopt; }
  [[nodiscard]] bool contains(std::size_t) const { return false; }
  [[nodiscard]] std::size_t size() const { return 0; }
};

static_assert(strata::eviction_policy<good_policy>);
static_assert(strata::eviction_policy<strata::lru>);
static_assert(strata::eviction_policy<strata::fifo>);
static_assert(strata::eviction_policy<strata::sweep_aware>);
static_assert(strata::eviction_policy<strata::belady>);
static_assert(!strata::eviction_policy<no_victim>);
static_assert(!strata::eviction_policy<victim_returns_id>);
static_assert(!strata::eviction_policy<throwing_erase>);
static_assert(!strata::eviction_policy<throwing_unpin>);
static_assert(!strata::eviction_policy<no_lookahead>);
static_assert(!strata::eviction_policy<mutating_victim>);
static_assert(!strata::eviction_policy<int>);

struct good_order {
  void order(std::uint64_t, std::span<std::size_t>) const {}
};
struct order_returns_vector {  // fills the caller's span instead, so a step allocates nothing
  [[nodiscard]] int order(std::uint64_t, std::size_t) const { return 0; }
};
struct non_const_order {  // an order is a pure function of the step
  void order(std::uint64_t, std::span<std::size_t>) {}
};

static_assert(strata::update_order<good_order>);
static_assert(strata::update_order<strata::sequential>);
static_assert(strata::update_order<strata::alternating>);
static_assert(strata::update_order<strata::custom_order>);
static_assert(!strata::update_order<order_returns_vector>);
static_assert(!strata::update_order<non_const_order>);
static_assert(!strata::update_order<strata::lru>);

}  // namespace

TEST_CASE("the policy concepts are checked at compile time (this file compiling is the test)") {
  CHECK(strata::eviction_policy<strata::lru>);
  CHECK_FALSE(strata::eviction_policy<no_victim>);
  CHECK_FALSE(strata::update_order<non_const_order>);
}

}  // namespace concepts_test
