#pragma once
// Fixtures for the typed tier suite: each builds one tier stack in a fresh temporary directory
// and removes it afterwards. `Fixture(capacity)` bounds the stack's capacity where it has one.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <strata/core/notice.hpp>
#include <strata/exec/host_executor.hpp>
#include <strata/exec/jittered.hpp>
#include <strata/policy/placement.hpp>
#include <strata/tier/any_tier.hpp>
#include <strata/tier/checksummed.hpp>
#include <strata/tier/device_tier.hpp>
#include <strata/tier/limited.hpp>
#include <strata/tier/multipath.hpp>
#include <strata/tier/striped.hpp>
#include <strata/tier/throttled.hpp>

#include "tier_test_support.hpp"

namespace strata_test {

struct host_fixture {
  static constexpr const char* name = "host_tier";
  using tier_type = strata::host_tier;
  explicit host_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : t(strata::host_tier_options{.name = "host", .capacity = cap}) {}
  tier_type& tier() { return t; }
  tier_type t;
};

template <strata::io_backend B>
struct file_fixture {
  static constexpr const char* name = B == strata::io_backend::uring ? "file_tier(uring)" : "file_tier(posix)";
  using tier_type = strata::file_tier;
  explicit file_fixture(std::uint64_t cap = strata::unlimited_capacity) : t(file_opts(dir.path(), B, cap)) {}
  tier_type& tier() { return t; }
  temp_dir dir;
  tier_type t;
};

/// tmpfs refuses O_DIRECT: the tier falls back to buffered I/O.
struct file_shm_fixture {
  static constexpr const char* name = "file_tier(/dev/shm)";
  using tier_type = strata::file_tier;
  explicit file_shm_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : dir("/dev/shm", "shm"), t(quiet(file_opts(dir.path(), strata::io_backend::automatic, cap))) {}
  static strata::file_tier_options quiet(strata::file_tier_options o) {
    auto old = strata::set_notice_handler([](std::string_view) {});  // the fallback notice is expected here
    (void)old;
    return o;
  }
  ~file_shm_fixture() { strata::set_notice_handler({}); }
  tier_type& tier() { return t; }
  temp_dir dir;
  tier_type t;
};

struct throttled_fixture {
  static constexpr const char* name = "throttled<host_tier>";
  using tier_type = strata::throttled<strata::host_tier>;
  explicit throttled_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : t(strata::throttle_options{2e9, 1e9, std::chrono::microseconds(20)},
          strata::host_tier_options{.name = "throttled-host", .capacity = cap}) {}
  tier_type& tier() { return t; }
  tier_type t;
};

struct limited_fixture {
  static constexpr const char* name = "limited<file_tier>";
  using tier_type = strata::limited<strata::file_tier, test_limiter>;
  explicit limited_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : t(limiter, file_opts(dir.path(), strata::io_backend::automatic, cap, "limited")) {}
  tier_type& tier() { return t; }
  test_limiter limiter{2};
  temp_dir dir;
  tier_type t;
};

struct checksummed_fixture {
  static constexpr const char* name = "checksummed<file_tier>";
  using tier_type = strata::checksummed<strata::file_tier>;
  explicit checksummed_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : t(strata::checksum_options{.block_bytes = 4096}, file_opts(dir.path(), strata::io_backend::automatic, cap)) {}
  tier_type& tier() { return t; }
  temp_dir dir;
  tier_type t;
};

struct multipath_fixture {
  static constexpr const char* name = "multipath<fixed_ratio, file_tier, host_tier>";
  using tier_type = strata::multipath<strata::fixed_ratio, strata::file_tier, strata::host_tier>;
  explicit multipath_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : t(strata::fixed_ratio({2, 1}), file_opts(dir.path(), strata::io_backend::automatic, half(cap), "nvme"),
          strata::host_tier_options{.name = "pfs", .capacity = half(cap)}) {}
  static std::uint64_t half(std::uint64_t c) { return c == strata::unlimited_capacity ? c : c / 2; }
  tier_type& tier() { return t; }
  temp_dir dir;
  tier_type t;
};

/// Run-time configured: a dynamic multipath of type-erased tiers.
struct any_tier_fixture {
  static constexpr const char* name = "dynamic_multipath<bandwidth_proportional, any_tier...>";
  using tier_type = strata::dynamic_multipath<strata::bandwidth_proportional>;
  explicit any_tier_fixture(std::uint64_t cap = strata::unlimited_capacity) : t(make(dir.path(), cap)) {}
  static tier_type make(const fs::path& d, std::uint64_t cap) {
    const auto half = cap == strata::unlimited_capacity ? cap : cap / 2;
    std::vector<strata::any_tier> paths;
    paths.push_back(strata::any_tier::make<strata::file_tier>(
        file_opts(d / "a", strata::io_backend::uring, half, "path-a")));
    paths.push_back(strata::any_tier::make<strata::file_tier>(
        file_opts(d / "b", strata::io_backend::posix, half, "path-b")));
    return tier_type(strata::bandwidth_proportional{}, std::move(paths));
  }
  tier_type& tier() { return t; }
  temp_dir dir;
  tier_type t;
};

/// A non-owning reference to a file tier the fixture keeps (tier_ref: the erasure pair's ref).
struct tier_ref_fixture {
  static constexpr const char* name = "tier_ref to file_tier";
  using tier_type = strata::tier_ref;
  explicit tier_ref_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : held(file_opts(dir.path(), strata::io_backend::automatic, cap, "referred")), t(held) {}
  tier_type& tier() { return t; }
  temp_dir dir;
  strata::file_tier held;
  tier_type t;
};

/// RAID0 over a file path and a host path, with a small stripe unit so every object spans both.
struct striped_fixture {
  static constexpr const char* name = "striped(file_tier, host_tier)";
  using tier_type = strata::striped;
  explicit striped_fixture(std::uint64_t cap = strata::unlimited_capacity) : t(make(dir.path(), cap)) {}
  static std::vector<strata::any_tier> members(const fs::path& d, std::uint64_t cap) {
    const auto half = cap == strata::unlimited_capacity ? cap : cap / 2;
    std::vector<strata::any_tier> m;
    m.push_back(strata::any_tier::make<strata::file_tier>(file_opts(d / "a", strata::io_backend::automatic, half, "a")));
    m.push_back(strata::any_tier::make<strata::host_tier>(strata::host_tier_options{.name = "b", .capacity = half}));
    return m;
  }
  static tier_type make(const fs::path& d, std::uint64_t cap) {
    return tier_type(members(d, cap), strata::striped_options{.name = "raid0", .stripe_bytes = 4096});
  }
  tier_type& tier() { return t; }
  temp_dir dir;
  tier_type t;
};

/// GPU memory as a tier, on the executor model without a GPU: jittered streams, so copies finish
/// out of step with each other as on a device.
struct device_fixture {
  static constexpr const char* name = "device_tier<host_executor<jittered<host_stream>>>";
  using stream_type = strata::jittered<strata::host_stream>;
  using tier_type = strata::device_tier<strata::host_executor<stream_type>>;
  explicit device_fixture(std::uint64_t cap = strata::unlimited_capacity)
      : t(strata::device_tier_options{.name = "device", .capacity = cap}, strata::host_executor_options{.name = "dev"},
          [](strata::stream_role r, const std::string& n) {
            return std::make_unique<stream_type>(
                strata::jitter_options{.seed = static_cast<std::uint64_t>(r) + 1, .max_delay = std::chrono::microseconds(200)},
                n);
          }) {}
  tier_type& tier() { return t; }
  tier_type t;
};

}  // namespace strata_test
