#pragma once
// The rule book behind strata::faulty (tiers and streams): rules in the order added, each firing
// after `after` matching operations, `times` times (0: always), with a seeded `probability`.
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata::detail {

/// Rule is a struct with `after`, `times` and `probability` members (and whatever the owner
/// matches on).
template <class Rule>
class fault_rules {
 public:
  void inject(Rule r) {
    std::lock_guard lock(mutex_);
    rules_.push_back({std::move(r), 0, 0});
  }
  void clear() {
    std::lock_guard lock(mutex_);
    rules_.clear();
  }
  void seed(std::uint64_t s) {
    std::lock_guard lock(mutex_);
    rng_.seed(s);
  }
  [[nodiscard]] std::uint64_t fired() const noexcept { return fired_.load(); }

  /// The first rule that `matches` and is due fires: returns `fire(rule, rng)` (under the lock,
  /// so it may draw from the generator); nullopt when none fires.
  template <class Matches, class Fire>
  auto match(Matches&& matches, Fire&& fire) -> std::optional<std::invoke_result_t<Fire&, const Rule&, std::mt19937_64&>> {
    std::lock_guard lock(mutex_);
    for (auto& e : rules_) {
      const Rule& r = e.rule;
      if (!matches(r)) continue;
      if (e.seen++ < r.after) continue;
      if (r.times != 0 && e.fired >= r.times) continue;
      if (r.probability < 1.0 && std::uniform_real_distribution<double>(0, 1)(rng_) >= r.probability) continue;
      ++e.fired;
      fired_.fetch_add(1);
      return fire(r, rng_);
    }
    return std::nullopt;
  }

 private:
  struct entry {
    Rule rule;
    std::uint64_t seen;
    std::uint64_t fired;
  };
  std::mutex mutex_;
  std::vector<entry> rules_;
  std::mt19937_64 rng_{0x5eed};
  std::atomic<std::uint64_t> fired_{0};
};

}  // namespace strata::detail
