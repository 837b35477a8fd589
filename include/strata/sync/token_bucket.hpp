#pragma once
/// `token_bucket`: a bytes-per-second limiter with a burst, for one process (one per tier, or one
/// per node shared by that node's threads).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/sync/rate_limiter.hpp"

namespace strata {

/// Tokens (bytes) refill at `bytes_per_second` up to `burst_bytes`; the bucket starts full.
/// A request waits until the bucket holds min(bytes, burst) tokens and then takes all `bytes`,
/// so a request larger than the burst still goes (once the bucket is full) and leaves the bucket
/// in debt that later requests wait out: the long-run rate holds whatever the sizes. Requests are
/// served in the order they reserve (no thundering herd, no starvation): each one books its start
/// time under a mutex and sleeps outside it.
/// `Clock` is a parameter so that the arithmetic (`reserve`) can be tested on a fake clock.
template <class Clock = std::chrono::steady_clock>
class basic_token_bucket {
 public:
  using clock = Clock;
  using time_point = typename Clock::time_point;

  basic_token_bucket(double bytes_per_second, std::uint64_t burst_bytes, time_point start = Clock::now())
      : rate_(bytes_per_second), burst_(static_cast<double>(burst_bytes)), tokens_(burst_), last_(start) {
    STRATA_EXPECTS(std::isfinite(bytes_per_second) && bytes_per_second > 0, config_error,
                   "token_bucket: rate must be a positive number of bytes per second, got {}", bytes_per_second);
    STRATA_EXPECTS(burst_bytes > 0, config_error, "token_bucket: burst must be at least 1 byte");
  }
  basic_token_bucket(const basic_token_bucket&) = delete;
  basic_token_bucket& operator=(const basic_token_bucket&) = delete;

  /// Blocks until `bytes` may go.
  void acquire(std::uint64_t bytes) {
    const auto start = reserve(bytes, Clock::now(), time_point::max());
    std::this_thread::sleep_until(*start);
  }

  /// Takes `bytes` only if they may go now.
  [[nodiscard]] bool try_acquire(std::uint64_t bytes) {
    const auto now = Clock::now();
    return reserve(bytes, now, now).has_value();
  }

  /// Waits at most `timeout`; books nothing when `bytes` could not go within it.
  template <class Rep, class Period>
  [[nodiscard]] bool try_acquire_for(std::uint64_t bytes, std::chrono::duration<Rep, Period> timeout) {
    const auto now = Clock::now();
    const auto start = reserve(bytes, now, deadline(now, timeout));
    if (!start) return false;
    std::this_thread::sleep_until(*start);
    return true;
  }

  /// The core, without sleeping: when may `bytes` requested at `now` go? Books them and returns
  /// the start time if it is no later than `latest`; otherwise books nothing and returns nullopt.
  [[nodiscard]] std::optional<time_point> reserve(std::uint64_t bytes, time_point now, time_point latest) {
    if (bytes == 0) return now;  // nothing to send waits for nobody
    std::lock_guard lock(mutex_);
    refill(now);
    now = std::max(now, last_);  // a caller that read the clock before another one booked
    const double want = static_cast<double>(bytes);
    const double need = std::min(want, burst_);
    time_point start = now;
    if (tokens_ < need) {
      const std::chrono::duration<double> wait((need - tokens_) / rate_);
      start = now + std::chrono::ceil<typename Clock::duration>(wait);
    }
    if (start > latest) return std::nullopt;
    tokens_ -= want;
    return start;
  }

  /// Tokens in the bucket at `now` (negative while in debt); for tests and reports.
  [[nodiscard]] double tokens(time_point now) {
    std::lock_guard lock(mutex_);
    refill(now);
    return tokens_;
  }

  [[nodiscard]] double rate() const noexcept { return rate_; }
  [[nodiscard]] std::uint64_t burst() const noexcept { return static_cast<std::uint64_t>(burst_); }

 private:
  void refill(time_point now) {
    if (now <= last_) return;
    const std::chrono::duration<double> elapsed = now - last_;
    tokens_ = std::min(burst_, tokens_ + elapsed.count() * rate_);
    last_ = now;
  }

  template <class Rep, class Period>
  static time_point deadline(time_point now, std::chrono::duration<Rep, Period> timeout) {
    if (timeout <= timeout.zero()) return now;
    const auto room = time_point::max() - now;
    if (std::chrono::duration_cast<std::chrono::duration<double>>(timeout) >=
        std::chrono::duration_cast<std::chrono::duration<double>>(room))
      return time_point::max();
    return now + std::chrono::ceil<typename Clock::duration>(timeout);
  }

  const double rate_;
  const double burst_;
  std::mutex mutex_;
  double tokens_;
  time_point last_;
};

/// The token bucket on the steady clock.
using token_bucket = basic_token_bucket<>;

static_assert(rate_limiter<token_bucket>);

}  // namespace strata
