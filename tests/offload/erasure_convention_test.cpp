// One erasure convention for every concept (core/erased.hpp): for each, a `*_ref` that is
// copyable, never empty and non-owning, and an `any_*` that owns, moves, never copies, converts to
// the ref and refuses use once moved from (config_error); both give the object back by type.
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <strata/core/error.hpp>
#include <strata/exec/host_executor.hpp>
#include <strata/offload/any_offloaded_optimizer.hpp>
#include <strata/pipeline/kernel.hpp>
#include <strata/policy/any_eviction_policy.hpp>
#include <strata/policy/lru.hpp>
#include <strata/policy/update_order.hpp>
#include <strata/policy/update_site.hpp>
#include <strata/tier/any_tier.hpp>
#include <strata/tier/host_tier.hpp>

namespace erasure_convention_test {

namespace {

using exec = strata::host_executor<>;

struct counting_kernel {
  int* calls;
  void host(std::size_t, std::span<std::byte>) { ++*calls; }
  void committed(std::size_t) {}
};
// One that can also take over a speculative update (adopting_kernel).
struct adopting_counting_kernel : counting_kernel {
  int* adoptions;
  void adopted(std::size_t, std::span<std::byte>) { ++*adoptions; }
};
static_assert(strata::adopting_kernel<adopting_counting_kernel> && !strata::adopting_kernel<counting_kernel>);

// What every pair promises, checked on each at compile time.
template <class Ref, class Any>
constexpr bool follows_convention =
    std::is_copy_constructible_v<Ref> && std::is_copy_assignable_v<Ref> && !std::is_default_constructible_v<Ref> &&
    !std::is_copy_constructible_v<Any> && !std::is_copy_assignable_v<Any> &&
    std::is_nothrow_move_constructible_v<Any> && std::is_nothrow_move_assignable_v<Any> &&
    std::is_convertible_v<const Any&, Ref>;

static_assert(follows_convention<strata::tier_ref, strata::any_tier>);
static_assert(follows_convention<strata::eviction_policy_ref, strata::any_eviction_policy>);
static_assert(follows_convention<strata::update_order_ref, strata::any_update_order>);
static_assert(follows_convention<strata::update_site_ref, strata::any_update_site>);
static_assert(follows_convention<strata::offloaded_optimizer_ref, strata::any_offloaded_optimizer>);
// The kernel's ref is explicit (a pipeline pass takes a kernel_ref, never a temporary's).
static_assert(std::is_copy_constructible_v<strata::kernel_ref<exec>> &&
              !std::is_copy_constructible_v<strata::any_kernel<exec>> &&
              std::is_nothrow_move_constructible_v<strata::any_kernel<exec>>);

// Negative cases: a ref is made only from a model of its concept.
static_assert(!std::is_constructible_v<strata::tier_ref, int&>);
static_assert(!std::is_constructible_v<strata::eviction_policy_ref, strata::host_tier&>);
static_assert(!std::is_constructible_v<strata::update_order_ref, const strata::lru&>);
static_assert(!std::is_constructible_v<strata::update_site_ref, const strata::alternating&>);
static_assert(!std::is_constructible_v<strata::kernel_ref<exec>, strata::lru&>);
static_assert(!std::is_constructible_v<strata::offloaded_optimizer_ref, strata::host_tier&>);
// An any_* is made from a model, not from nothing (the two that have a natural default excepted:
// no eviction policy for a cache without entries, and always_host).
static_assert(!std::is_default_constructible_v<strata::any_tier>);
static_assert(!std::is_default_constructible_v<strata::any_update_order>);
static_assert(std::is_default_constructible_v<strata::any_eviction_policy>);
static_assert(std::is_default_constructible_v<strata::any_update_site>);

}  // namespace

TEST_CASE("each owning erasure refuses use once moved from, and its ref reaches the same object") {
  auto tier = strata::any_tier::make<strata::host_tier>();
  const strata::tier_ref tier_view = tier;
  CHECK(tier_view.name() == tier.name());
  auto tier2 = std::move(tier);
  CHECK_THROWS_AS((void)tier.name(), strata::config_error);  // NOLINT(bugprone-use-after-move)
  CHECK(tier2.target<strata::host_tier>() != nullptr);

  strata::any_eviction_policy policy = strata::lru{};
  strata::eviction_policy_ref policy_view = policy;
  policy_view.on_insert(4);
  CHECK(policy.contains(4));
  auto policy2 = std::move(policy);
  CHECK_THROWS_AS((void)policy.size(), strata::config_error);  // NOLINT(bugprone-use-after-move)
  CHECK(policy2.target<strata::lru>() != nullptr);

  strata::any_update_site site = strata::alternating_site{1, 1};
  const strata::update_site_ref site_view = site;
  CHECK(site_view.site(1, 1, 0) == strata::site_kind::device);
  auto site2 = std::move(site);
  CHECK_THROWS_AS((void)site.uses_device(), strata::config_error);  // NOLINT(bugprone-use-after-move)
  CHECK(site2.target<strata::alternating_site>() != nullptr);

  int calls = 0;
  strata::any_kernel<exec> kernel(counting_kernel{&calls});
  const auto kernel_view = kernel.ref();
  std::vector<std::byte> slot(8);
  kernel_view.host(0, slot);
  kernel.host(1, slot);
  CHECK(calls == 2);
  CHECK_FALSE(kernel.has_device());
  CHECK_FALSE(kernel.can_adopt());
  int adoptions = 0;
  strata::any_kernel<exec> adopting(adopting_counting_kernel{{&calls}, &adoptions});
  REQUIRE(adopting.can_adopt());
  adopting.ref().adopted(0, slot);
  CHECK(adoptions == 1);
  auto kernel2 = std::move(kernel);
  CHECK_THROWS_AS(kernel.host(0, slot), strata::config_error);  // NOLINT(bugprone-use-after-move)
  CHECK(kernel2.target<counting_kernel>() != nullptr);
}

TEST_CASE("an any_tier made by ref() reaches the tier it refers to through target()") {
  strata::host_tier held;
  auto by_ref = strata::any_tier::ref(held);
  CHECK(by_ref.target<strata::host_tier>() == &held);
  CHECK(by_ref.target<strata::tier_ref>() != nullptr);
  const std::vector<std::byte> data(100, std::byte{7});
  by_ref.write("x", 0, data).get();
  CHECK(held.size("x") == std::optional<std::uint64_t>(100));
}

}  // namespace erasure_convention_test
