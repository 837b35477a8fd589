// mru (examples/extending/mru.hpp), an eviction policy written outside the library, through the
// typed eviction-policy suite; then the hits it is for.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <strata/policy/belady.hpp>
#include <strata/policy/lru.hpp>

#include "../../examples/extending/mru.hpp"
#include "../policy/eviction_suite.hpp"

// doc-snippet: invoke
namespace strata_test::eviction_suite {
STRATA_EVICTION_SUITE(extending::mru);
}  // namespace strata_test::eviction_suite
// doc-snippet-end

namespace strata_test::eviction_suite {

TEST_CASE("with a sequential order larger than the cache mru hits as many as belady, lru none") {
  for (auto [n, k] : {std::pair<std::size_t, std::size_t>{10, 3}, {8, 3}, {10, 5}, {100, 25}}) {
    CAPTURE(n);
    CAPTURE(k);
    const auto mru = hits_per_step<extending::mru>(strata::sequential{}, n, k, 8);
    CHECK(mru == hits_per_step<strata::belady>(strata::sequential{}, n, k, 8));  // the optimum, knowing the orders
    CHECK(hits_per_step<strata::lru>(strata::sequential{}, n, k, 8) == std::vector<std::uint64_t>(8, 0));
    for (std::size_t s = 1; s < mru.size(); ++s) CHECK(mru[s] >= k - 1);
  }
}

}  // namespace strata_test::eviction_suite
