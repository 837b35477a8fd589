#pragma once
/// throttled<Tier>: shapes a tier's bandwidth and adds latency, to emulate a slower device (a PFS
/// link, an object store) on one machine in tests and benchmarks.
///
/// All requests in one direction share one link: each reserves the next `bytes / bandwidth`
/// seconds of it when issued, so concurrent requests add up to the cap, not past it. A request
/// completes at the end of its slot plus `latency`, or when the inner tier finishes if that is
/// later. Bandwidths may be changed at run time (set_bandwidth); later requests see the new cap.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>

#include "strata/core/expects.hpp"
#include "strata/tier/adaptor_base.hpp"
#include "strata/tier/detail/inflight_counter.hpp"
#include "strata/tier/detail/timer_thread.hpp"
#include "strata/tier/io_future.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Caps of a throttled tier. A bandwidth of 0 leaves that direction unshaped.
struct throttle_options {
  double read_bandwidth = 0;   ///< bytes/s
  double write_bandwidth = 0;  ///< bytes/s
  std::chrono::microseconds latency{0};  ///< added to every request
};

template <class Inner>
class throttled : public detail::adaptor_base<Inner> {
  using base = detail::adaptor_base<Inner>;

 public:
  using clock = std::chrono::steady_clock;

  template <class... Args>
  explicit throttled(throttle_options o, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...), opts_(o), timer_("throttle") {
    validate(o);
  }
  throttled(const throttled&) = delete;
  throttled& operator=(const throttled&) = delete;
  /// Waits until every request issued through this adaptor has completed.
  ~throttled() { inflight_.wait_zero(); }

  io_future write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    const auto deadline = reserve(write_free_, opts_.write_bandwidth, bytes.size());
    return delay(this->inner_.write(object, offset, bytes), deadline);
  }
  io_future read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    const auto deadline = reserve(read_free_, opts_.read_bandwidth, dst.size());
    return delay(this->inner_.read(object, offset, dst), deadline);
  }

  /// Changes the caps for requests issued from now on (0 = unshaped).
  void set_bandwidth(double read_bytes_per_s, double write_bytes_per_s) {
    std::lock_guard lock(mutex_);
    throttle_options o = opts_;
    o.read_bandwidth = read_bytes_per_s;
    o.write_bandwidth = write_bytes_per_s;
    validate(o);
    opts_ = o;
  }
  [[nodiscard]] throttle_options options() const {
    std::lock_guard lock(mutex_);
    return opts_;
  }

  /// The inner tier's descriptor with the caps as declared bandwidths (where they are lower).
  [[nodiscard]] tier_descriptor descriptor() const {
    auto d = this->inner_.descriptor();
    const auto o = options();
    const auto cap = [](double inner, double limit) {
      if (limit <= 0) return inner;
      return inner > 0 ? std::min(inner, limit) : limit;
    };
    d.read_bandwidth = cap(d.read_bandwidth, o.read_bandwidth);
    d.write_bandwidth = cap(d.write_bandwidth, o.write_bandwidth);
    if (o.read_bandwidth > 0 || o.write_bandwidth > 0) d.measured = false;
    return d;
  }

 private:
  static void validate(const throttle_options& o) {
    STRATA_EXPECTS(o.read_bandwidth >= 0 && o.write_bandwidth >= 0 && o.latency.count() >= 0, config_error,
                   "throttled: bandwidths and latency must not be negative (read {}, write {}, latency {} us)",
                   o.read_bandwidth, o.write_bandwidth, o.latency.count());
  }

  clock::time_point reserve(clock::time_point& next_free, double bandwidth, std::uint64_t bytes) {
    std::lock_guard lock(mutex_);
    const auto now = clock::now();
    auto finish = now;
    if (bandwidth > 0) {
      const auto start = std::max(now, next_free);
      finish = start + std::chrono::duration_cast<clock::duration>(
                           std::chrono::duration<double>(static_cast<double>(bytes) / bandwidth));
      next_free = finish;
    }
    return finish + opts_.latency;
  }

  io_future delay(io_future inner, clock::time_point deadline) {
    io_promise p;
    auto out = p.get_future();
    inflight_.add();
    auto shared = std::make_shared<io_promise>(std::move(p));
    inner.on_complete([this, deadline, shared](std::exception_ptr e) {
      if (e || clock::now() >= deadline) {
        shared->complete(e);
        inflight_.done();
        return;
      }
      timer_.at(deadline, [this, shared] {
        shared->set_value();
        inflight_.done();
      });
    });
    return out;
  }

  mutable std::mutex mutex_;
  throttle_options opts_;
  clock::time_point read_free_{};
  clock::time_point write_free_{};
  detail::timer_thread timer_;
  detail::inflight_counter inflight_;  // destroyed first: its wait guards the members above
};

}  // namespace strata
