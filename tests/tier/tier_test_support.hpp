#pragma once
// What the tier tests share: a temporary directory, a limiter that records its high-water mark,
// file_tier options with small chunks, host_tier options, and deterministic random bytes.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <strata/core/completion.hpp>
#include <strata/core/units.hpp>
#include <strata/sync/counting_limiter.hpp>
#include <strata/tier/file_tier.hpp>
#include <strata/tier/host_tier.hpp>

namespace strata_test {

namespace fs = std::filesystem;

/// A small file's whole contents, as the ownership tests write and compare a user's files.
inline void write_text(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }
inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A directory that exists for the fixture's lifetime.
class temp_dir {
 public:
  explicit temp_dir(const fs::path& base = fs::temp_directory_path(), std::string tag = "tier") {
    static std::atomic<int> counter{0};
    path_ = base / fmt::format("strata-{}-{}-{}", tag, ::getpid(), counter.fetch_add(1));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] const fs::path& path() const { return path_; }
  [[nodiscard]] fs::path operator/(const std::string& sub) const { return path_ / sub; }

 private:
  fs::path path_;
};

/// A strata::limiter for limited<>: a counting_limiter of `cap` holders that records the highest
/// number of holders seen.
class test_limiter {
 public:
  explicit test_limiter(int cap) : inner_(static_cast<std::size_t>(cap)), cap_(cap) {}
  void acquire() {
    inner_.acquire();
    note();
  }
  bool try_acquire() {
    if (!inner_.try_acquire()) return false;
    note();
    return true;
  }
  template <class Rep, class Period>
  bool try_acquire_for(std::chrono::duration<Rep, Period> t) {
    if (!inner_.try_acquire_for(t)) return false;
    note();
    return true;
  }
  strata::completion acquire_async() {
    auto c = inner_.acquire_async();
    c.on_complete([this](std::exception_ptr e) {  // registered first: runs before the caller's
      if (!e) note();
    });
    return c;
  }
  void release() noexcept {
    holders_.fetch_sub(1);
    inner_.release();
  }
  [[nodiscard]] int high_water() const { return high_.load(); }
  [[nodiscard]] int cap() const { return cap_; }

 private:
  void note() {
    const int now = holders_.fetch_add(1) + 1;
    int seen = high_.load();
    while (now > seen && !high_.compare_exchange_weak(seen, now)) {
    }
  }
  strata::counting_limiter inner_;
  int cap_;
  std::atomic<int> holders_{0};
  std::atomic<int> high_{0};
};

inline constexpr std::uint64_t test_chunk = 64 * 1024;  // small chunks: multi-chunk objects stay small

inline strata::file_tier_options file_opts(const fs::path& dir, strata::io_backend b, std::uint64_t capacity,
                                           std::string name = "file") {
  strata::file_tier_options o;
  o.directory = dir;
  o.name = std::move(name);
  o.backend = b;
  o.chunk_bytes = test_chunk;
  o.capacity = capacity;
  o.threads = 3;
  o.queue_depth = 8;
  return o;
}

/// host_tier options with a name, declared bandwidths and a capacity.
inline strata::host_tier_options host(std::string name, double read_bw = 0, double write_bw = 0,
                                      std::uint64_t cap = strata::unlimited_capacity) {
  return {.name = std::move(name), .capacity = cap, .read_bandwidth = read_bw, .write_bandwidth = write_bw};
}

/// Deterministic random bytes.
inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(g());
  return v;
}

}  // namespace strata_test
