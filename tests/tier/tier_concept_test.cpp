// Compile-time checks of the tier and placement concepts, including what must NOT model them.
#include <doctest/doctest.h>

#include <strata/strata.hpp>

// The folder's tests compile together: this file's names stay in its own namespace.
namespace tier_concept_test {

namespace {
struct good_tier {
  strata::completion write(std::string_view, std::uint64_t, std::span<const std::byte>);
  strata::completion read(std::string_view, std::uint64_t, std::span<std::byte>);
  bool remove(std::string_view);
  void flush();
  std::optional<std::uint64_t> size(std::string_view) const;
  std::uint64_t capacity() const;
  std::uint64_t used() const;
  std::string_view name() const;
  strata::tier_descriptor descriptor() const;
};
struct no_remove {
  strata::completion write(std::string_view, std::uint64_t, std::span<const std::byte>);
  strata::completion read(std::string_view, std::uint64_t, std::span<std::byte>);
  void flush();
  std::optional<std::uint64_t> size(std::string_view) const;
  std::uint64_t capacity() const;
  std::uint64_t used() const;
  std::string_view name() const;
  strata::tier_descriptor descriptor() const;
};
struct sync_read : good_tier {  // read() blocks and returns nothing: not a tier
  void read(std::string_view, std::uint64_t, std::span<std::byte>);
};
struct mutable_size : good_tier {  // size() must be callable on a const tier
  std::optional<std::uint64_t> size(std::string_view);
};
struct std_future_write : good_tier {  // a std::future is not an completion (no continuations)
  std::future<void> write(std::string_view, std::uint64_t, std::span<const std::byte>);
};
struct good_placement {
  std::size_t place(std::string_view, std::uint64_t, std::span<const strata::path_view>);
};
struct bad_placement {
  int place(std::string_view);
};
}  // namespace

static_assert(strata::tier<good_tier>);
static_assert(!strata::tier<no_remove>);
static_assert(!strata::tier<sync_read>);
static_assert(!strata::tier<mutable_size>);
static_assert(!strata::tier<std_future_write>);
static_assert(!strata::tier<int>);
static_assert(strata::tier<strata::host_tier>);
static_assert(strata::tier<strata::file_tier>);
static_assert(strata::tier<strata::any_tier>);
static_assert(strata::tier<strata::throttled<strata::file_tier>>);
static_assert(strata::tier<strata::faulty<strata::host_tier&>>);
static_assert(strata::tier<strata::checksummed<strata::throttled<strata::file_tier>>>);
static_assert(strata::tier<strata::multipath<strata::fixed_ratio, strata::file_tier, strata::host_tier>>);
static_assert(strata::tier<strata::dynamic_multipath<strata::bandwidth_proportional>>);
static_assert(strata::tier<strata::limited<strata::file_tier, strata::counting_limiter>>);
static_assert(strata::tier<strata::limited<strata::throttled<strata::file_tier>, strata::node_limiter>>);
static_assert(strata::placement_policy<good_placement>);
static_assert(!strata::placement_policy<bad_placement>);
static_assert(strata::placement_policy<strata::fixed_ratio>);
static_assert(strata::placement_policy<strata::bandwidth_proportional>);

TEST_CASE("the tier and placement concepts accept the models and reject the negative cases") {
  CHECK(strata::tier<good_tier>);  // the real checks are the static_asserts above
}

}  // namespace tier_concept_test
