#pragma once
/// Measures the aggregate throughput of a device from the requests it serves: bytes completed
/// divided by the time during which at least one request was in flight. Unlike bytes/duration
/// per request it does not undercount when many requests overlap.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "strata/tier/tier.hpp"

namespace strata {

class throughput_meter {
 public:
  using clock = std::chrono::steady_clock;

  /// A request starts.
  void begin() {
    std::lock_guard lock(mutex_);
    if (inflight_++ == 0) busy_since_ = clock::now();
  }
  /// A request that moved `bytes` ends (failed requests pass 0).
  void end(std::uint64_t bytes) {
    std::lock_guard lock(mutex_);
    bytes_ += bytes;
    if (--inflight_ == 0) busy_ += clock::now() - busy_since_;
  }
  /// Bytes per second over all busy time so far; 0 before any byte completed.
  [[nodiscard]] double bytes_per_second() const {
    std::lock_guard lock(mutex_);
    auto busy = busy_;
    if (inflight_ > 0) busy += clock::now() - busy_since_;
    const double s = std::chrono::duration<double>(busy).count();
    return (bytes_ == 0 || s <= 0) ? 0.0 : static_cast<double>(bytes_) / s;
  }
  /// Total bytes completed.
  [[nodiscard]] std::uint64_t bytes() const {
    std::lock_guard lock(mutex_);
    return bytes_;
  }
  /// Total seconds with at least one request in flight.
  [[nodiscard]] double busy_seconds() const {
    std::lock_guard lock(mutex_);
    auto busy = busy_;
    if (inflight_ > 0) busy += clock::now() - busy_since_;
    return std::chrono::duration<double>(busy).count();
  }

 private:
  mutable std::mutex mutex_;
  std::uint64_t inflight_ = 0;
  std::uint64_t bytes_ = 0;
  clock::time_point busy_since_{};
  clock::duration busy_{};
};

/// A tier's descriptor: its declared bandwidths where given (> 0), else those its meters measured.
[[nodiscard]] inline tier_descriptor declared_or_measured(std::string name, tier_kind kind, double declared_read,
                                                          double declared_write, const throughput_meter& reads,
                                                          const throughput_meter& writes) {
  const double r = declared_read > 0 ? declared_read : reads.bytes_per_second();
  const double w = declared_write > 0 ? declared_write : writes.bytes_per_second();
  const bool measured = (declared_read <= 0 && r > 0) || (declared_write <= 0 && w > 0);
  return {std::move(name), kind, r, w, measured};
}

}  // namespace strata
