// The real S3 server that the tests of the S3 tier talk to: SeaweedFS's `weed mini`, started by
// tools/s3-server.sh through the CTest fixture in tests/s3/CMakeLists.txt, which hands each test
// the path of its env file (KEY=VALUE lines) in STRATA_S3_TEST_ENV. Without a server a test
// prints "strata-s3-skip: ..." (ctest reports it Skipped); with STRATA_REQUIRE_S3 set it fails.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include <doctest/doctest.h>
#include <fmt/format.h>

namespace strata_test {

/// Where the test server listens and how to sign for it; every field is non-empty.
struct s3_server_env {
  std::string endpoint;           ///< AWS_ENDPOINT_URL, e.g. "http://127.0.0.1:20970" (path-style)
  std::string access_key_id;      ///< AWS_ACCESS_KEY_ID
  std::string secret_access_key;  ///< AWS_SECRET_ACCESS_KEY (never print it)
  std::string region;             ///< AWS_REGION ("us-east-1")
  std::string bucket;             ///< S3_TEST_BUCKET (exists when the server is up)
};

/// Whether a missing server is a failure rather than a skip (STRATA_REQUIRE_S3 set, non-empty).
inline bool s3_required() {
  const char* v = std::getenv("STRATA_REQUIRE_S3");
  return v != nullptr && *v != '\0';
}

namespace detail {

/// What looking for the server found: the server, or why there is none.
struct s3_server_lookup {
  std::optional<s3_server_env> env;
  std::string why_not;  ///< when !env: the reason, for the skip or failure message
  bool broken = false;  ///< the env file exists but is incomplete: a fixture bug, never a skip
};

inline s3_server_lookup find_s3_server() {
  const char* path = std::getenv("STRATA_S3_TEST_ENV");
  if (path == nullptr || *path == '\0') {
    return {std::nullopt, "STRATA_S3_TEST_ENV is not set: run this test through ctest", false};
  }
  std::ifstream in(path);
  if (!in) {
    return {std::nullopt,
            fmt::format("{} does not exist: tools/s3-server.sh found no weed binary (install it with "
                        "tools/install-deps.sh) or did not run",
                        path),
            false};
  }
  s3_server_env e;
  const struct {
    const char* key;
    std::string s3_server_env::*field;
  } fields[] = {{"AWS_ENDPOINT_URL", &s3_server_env::endpoint},
                {"AWS_ACCESS_KEY_ID", &s3_server_env::access_key_id},
                {"AWS_SECRET_ACCESS_KEY", &s3_server_env::secret_access_key},
                {"AWS_REGION", &s3_server_env::region},
                {"S3_TEST_BUCKET", &s3_server_env::bucket}};
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    for (const auto& f : fields) {
      if (line.compare(0, eq, f.key) == 0 && eq == std::char_traits<char>::length(f.key)) {
        e.*f.field = line.substr(eq + 1);
      }
    }
  }
  for (const auto& f : fields) {
    if ((e.*f.field).empty()) {
      return {std::nullopt, fmt::format("{} has no {}", path, f.key), true};
    }
  }
  return {std::move(e), {}, false};
}

}  // namespace detail

/// The fixture's server, or nullopt when STRATA_S3_TEST_ENV is unset, its file is missing or
/// incomplete.
inline std::optional<s3_server_env> s3_server() { return detail::find_s3_server().env; }

}  // namespace strata_test

/// At the top of a TEST_CASE: declares `const strata_test::s3_server_env& var`, or, when there is
/// no server, returns from the test case after printing "strata-s3-skip: no S3 server (<reason>)"
/// (ctest's SKIP_REGULAR_EXPRESSION) or, when STRATA_REQUIRE_S3 is set or the env file is broken,
/// after failing the test.
#define STRATA_S3_SERVER_OR_SKIP(var)                                                           \
  const auto var##_s3_lookup_ = ::strata_test::detail::find_s3_server();                        \
  if (!var##_s3_lookup_.env) {                                                                  \
    if (var##_s3_lookup_.broken) {                                                              \
      FAIL_CHECK("the S3 test server's env file is broken: " << var##_s3_lookup_.why_not);     \
    } else if (::strata_test::s3_required()) {                                                  \
      FAIL_CHECK("STRATA_REQUIRE_S3 is set but there is no S3 server: "                         \
                 << var##_s3_lookup_.why_not);                                                  \
    } else {                                                                                    \
      std::printf("strata-s3-skip: no S3 server (%s)\n", var##_s3_lookup_.why_not.c_str());     \
      std::fflush(stdout);                                                                      \
    }                                                                                           \
    return;                                                                                     \
  }                                                                                             \
  const ::strata_test::s3_server_env& var = *var##_s3_lookup_.env
