#pragma once
// Tier stacks over the test S3 server (the fixture's `weed mini`): each gets a prefix of its own
// and removes its objects afterwards. `skip()` is true when there is no server and none is
// required, so the typed suite runs nothing rather than fails.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include <strata/policy/placement.hpp>
#include <strata/tier/checksummed.hpp>
#include <strata/tier/limited.hpp>
#include <strata/tier/multipath.hpp>
#include <strata/tier/object_store_tier.hpp>
#include <strata/tier/throttled.hpp>

#include "s3_server_env.hpp"
#include "tier_test_support.hpp"

namespace strata_test {

/// A prefix no other test (in this run or an earlier one) uses.
inline std::string unique_prefix(std::string_view what) {
  static std::atomic<unsigned> n{0};
  return fmt::format("test/{}-{}-{:08x}-{}/", what, ::getpid(), std::random_device{}(), n++);
}

/// Options for a tier on the test server; a throwing config_error when there is none.
inline strata::object_store_options server_options(std::string_view what, std::uint64_t cap = strata::unlimited_capacity) {
  const auto env = s3_server();
  if (!env) throw strata::config_error("no S3 test server (STRATA_S3_TEST_ENV names no server)");
  strata::object_store_options o;
  o.endpoint = env->endpoint;
  o.bucket = env->bucket;
  o.region = env->region;
  o.access_key_id = env->access_key_id;
  o.secret_access_key = env->secret_access_key;
  o.prefix = unique_prefix(what);
  o.part_size = 5ULL << 20;
  o.capacity = cap;
  o.max_connections = 8;
  return o;
}

/// Removes every object of a tier (a test's prefix) when it goes; never throws.
inline void remove_all(strata::object_store_tier& t) noexcept {
  try {
    for (const auto& o : t.objects()) t.remove(o);
  } catch (...) {  // a test that broke the server already failed
  }
}

struct s3_fixture {
  static constexpr const char* name = "object_store_tier";
  using tier_type = strata::object_store_tier;
  static bool skip() {
    const auto found = detail::find_s3_server();
    if (found.env || found.broken || s3_required()) return false;  // the fixture then fails loudly
    std::printf("strata-s3-skip: no S3 server (%s)\n", found.why_not.c_str());
    return true;
  }
  explicit s3_fixture(std::uint64_t cap = strata::unlimited_capacity) : t(server_options("suite", cap)) {}
  ~s3_fixture() { remove_all(t); }
  tier_type& tier() { return t; }
  tier_type t;
};

struct s3_checksummed_fixture {
  static constexpr const char* name = "checksummed<object_store_tier>";
  using tier_type = strata::checksummed<strata::object_store_tier&>;
  static bool skip() { return s3_fixture::skip(); }
  explicit s3_checksummed_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : inner(cap), t(strata::checksum_options{.block_bytes = 4096}, inner.t) {}
  tier_type& tier() { return t; }
  s3_fixture inner;
  tier_type t;
};

struct s3_limited_throttled_fixture {
  static constexpr const char* name = "limited<throttled<object_store_tier>>";
  using tier_type = strata::limited<strata::throttled<strata::object_store_tier&>, test_limiter>;
  static bool skip() { return s3_fixture::skip(); }
  explicit s3_limited_throttled_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : inner(cap), t(limiter, strata::throttle_options{2e9, 1e9, std::chrono::microseconds(20)}, inner.t) {}
  tier_type& tier() { return t; }
  s3_fixture inner;
  test_limiter limiter{2};
  tier_type t;
};

/// A third path: a directory and the object store under a placement policy (bandwidth-
/// proportional, or adaptive: from the throughput each path delivered).
template <class Placement>
struct s3_multipath_fixture {
  static constexpr const char* name = std::is_same_v<Placement, strata::adaptive>
                                          ? "multipath<adaptive, file_tier, object_store_tier>"
                                          : "multipath<bandwidth_proportional, file_tier, object_store_tier>";
  using tier_type = strata::multipath<Placement, strata::file_tier, strata::object_store_tier>;
  static bool skip() { return s3_fixture::skip(); }
  explicit s3_multipath_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : t(Placement{}, with_bw(file_opts(dir.path(), strata::io_backend::automatic, half(cap), "nvme")),
          with_bw(server_options("multipath", half(cap)))) {}
  ~s3_multipath_fixture() { remove_all(t.template path<1>()); }
  static std::uint64_t half(std::uint64_t c) { return c == strata::unlimited_capacity ? c : c / 2; }
  template <class O>
  static O with_bw(O o) {
    o.read_bandwidth = 1e9;
    o.write_bandwidth = 1e9;
    return o;
  }
  tier_type& tier() { return t; }
  temp_dir dir;
  tier_type t;
};

}  // namespace strata_test
