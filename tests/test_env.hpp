// Paths the test runner hands to a test through its environment (ctest's ENVIRONMENT property),
// so that no build or source path is compiled into a test and a compiler cache serves any clone.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

namespace strata_test {

/// The value of `name`, which ctest sets for the test; a clear failure when it is run otherwise.
inline std::string runner_path(const char* name) {
  const char* value = std::getenv(name);
  REQUIRE_MESSAGE((value != nullptr && *value != '\0'),
                  name << " is not set: run this test through ctest, which sets it");
  return value;
}

}  // namespace strata_test
