#pragma once
/// Aggregate statistics by name: durations (count, total, min, max) and monotonic counters
/// (bytes, operations). Thread-safe; cheap enough for per-chunk use (one mutex per record).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace strata {

/// Aggregate of the durations recorded under one name.
struct duration_stat {
  std::string name;
  std::uint64_t count = 0;
  std::chrono::nanoseconds total{0};
  std::chrono::nanoseconds min{0};
  std::chrono::nanoseconds max{0};
  /// Mean duration; zero when nothing was recorded.
  [[nodiscard]] std::chrono::nanoseconds mean() const noexcept {
    return count == 0 ? std::chrono::nanoseconds{0} : total / static_cast<std::int64_t>(count);
  }
};

/// Value of one counter.
struct counter_stat {
  std::string name;
  std::uint64_t value = 0;
};

namespace detail {
inline std::string format_duration(std::chrono::nanoseconds d) {
  const auto ns = static_cast<double>(d.count());
  if (ns < 1e3) return fmt::format("{:.0f} ns", ns);
  if (ns < 1e6) return fmt::format("{:.2f} us", ns / 1e3);
  if (ns < 1e9) return fmt::format("{:.2f} ms", ns / 1e6);
  return fmt::format("{:.3f} s", ns / 1e9);
}
}  // namespace detail

/// A consistent copy of a metrics object, sorted by name.
struct metrics_snapshot {
  std::vector<duration_stat> durations;
  std::vector<counter_stat> counters;

  /// The duration aggregate called `name`, or null.
  [[nodiscard]] const duration_stat* duration(std::string_view name) const noexcept {
    for (const auto& d : durations)
      if (d.name == name) return &d;
    return nullptr;
  }
  /// The counter called `name`, or 0 when it was never added to.
  [[nodiscard]] std::uint64_t counter(std::string_view name) const noexcept {
    for (const auto& c : counters)
      if (c.name == name) return c.value;
    return 0;
  }
  /// A plain-text table, one row per name.
  [[nodiscard]] std::string to_string() const {
    std::size_t width = 4;
    for (const auto& d : durations) width = std::max(width, d.name.size());
    for (const auto& c : counters) width = std::max(width, c.name.size());
    std::string out;
    if (!durations.empty()) {
      out += fmt::format("{:<{}}  {:>8}  {:>11}  {:>11}  {:>11}  {:>11}\n", "span", width, "count", "total", "mean",
                         "min", "max");
      for (const auto& d : durations)
        out += fmt::format("{:<{}}  {:>8}  {:>11}  {:>11}  {:>11}  {:>11}\n", d.name, width, d.count,
                           detail::format_duration(d.total), detail::format_duration(d.mean()),
                           detail::format_duration(d.min), detail::format_duration(d.max));
    }
    if (!counters.empty()) {
      out += fmt::format("{:<{}}  {:>20}\n", "counter", width, "value");
      for (const auto& c : counters) out += fmt::format("{:<{}}  {:>20}\n", c.name, width, c.value);
    }
    return out;
  }
};

/// Named durations and counters, recorded from any thread.
class metrics {
 public:
  /// Adds one duration under `name`.
  void record(std::string_view name, std::chrono::nanoseconds d) {
    std::lock_guard lock(mutex_);
    auto it = durations_.find(name);
    if (it == durations_.end()) it = durations_.emplace(std::string(name), agg{}).first;
    auto& a = it->second;
    a.count += 1;
    a.total += d;
    a.min = std::min(a.min, d);
    a.max = std::max(a.max, d);
  }

  /// Adds `amount` to the counter `name`.
  void add(std::string_view name, std::uint64_t amount = 1) {
    std::lock_guard lock(mutex_);
    auto it = counters_.find(name);
    if (it == counters_.end()) it = counters_.emplace(std::string(name), 0).first;
    it->second += amount;
  }

  /// A consistent copy of everything recorded so far.
  [[nodiscard]] metrics_snapshot snapshot() const {
    std::lock_guard lock(mutex_);
    metrics_snapshot s;
    s.durations.reserve(durations_.size());
    for (const auto& [name, a] : durations_) s.durations.push_back({name, a.count, a.total, a.min, a.max});
    s.counters.reserve(counters_.size());
    for (const auto& [name, v] : counters_) s.counters.push_back({name, v});
    return s;
  }

  /// Forgets everything.
  void reset() {
    std::lock_guard lock(mutex_);
    durations_.clear();
    counters_.clear();
  }

 private:
  struct agg {
    std::uint64_t count = 0;
    std::chrono::nanoseconds total{0};
    std::chrono::nanoseconds min{std::numeric_limits<std::chrono::nanoseconds::rep>::max()};
    std::chrono::nanoseconds max{0};
  };
  mutable std::mutex mutex_;
  std::map<std::string, agg, std::less<>> durations_;
  std::map<std::string, std::uint64_t, std::less<>> counters_;
};

}  // namespace strata
