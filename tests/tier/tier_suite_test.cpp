// The typed tier suite (tier_suite.hpp) over every local tier and adaptor stack.
#include <doctest/doctest.h>

#include "tier_fixtures.hpp"
#include "tier_suite.hpp"

namespace strata_test::tier_suite {
STRATA_TIER_SUITE(strata_test::host_fixture, strata_test::file_fixture<strata::io_backend::posix>,
                  strata_test::file_fixture<strata::io_backend::uring>, strata_test::file_shm_fixture,
                  strata_test::throttled_fixture, strata_test::limited_fixture, strata_test::checksummed_fixture,
                  strata_test::multipath_fixture, strata_test::any_tier_fixture, strata_test::tier_ref_fixture,
                  strata_test::striped_fixture,
                  strata_test::device_fixture);
}  // namespace strata_test::tier_suite
