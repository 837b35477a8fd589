#pragma once
/// paced<S>: makes every copy of a stream take at least `bytes / bandwidth + latency`, to
/// emulate a PCIe link (or any slower one) with host streams: the pipeline then sees copies that
/// take time, overlap with work on other streams and queue behind each other, as on a GPU.
///
/// Each direction has one clock (a `pace_link`): a copy reserves the next `bytes / bandwidth`
/// seconds of its direction when the stream reaches it, and the stream goes on at the end of that
/// reservation plus the latency (or when the copy itself ends, if later). Streams built on one
/// shared link share its bandwidth, as copies of one direction share a PCIe link; streams with
/// their own links do not. Host tasks are not paced.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/exec/detail/stream_adaptor_base.hpp"
#include "strata/exec/stream.hpp"

namespace strata {

/// The speed of an emulated link. A bandwidth of 0 leaves that direction unpaced.
struct pace_options {
  double h2d_bandwidth = 0;              ///< bytes/s of copy_to_device
  double d2h_bandwidth = 0;              ///< bytes/s of copy_to_host
  std::chrono::microseconds latency{0};  ///< added to every copy
};

/// One clock per direction, shared by the paced streams built on it. Thread-safe.
class pace_link {
 public:
  using clock = std::chrono::steady_clock;

  explicit pace_link(pace_options o) : opts_(o) { validate(o); }

  /// Reserves the link for `bytes` in the direction of `op` from now (or from when the previous
  /// reservation ends); returns when the copy may be reported done.
  clock::time_point reserve(stream_op op, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    const auto now = clock::now();
    const double bw = op == stream_op::copy_to_device ? opts_.h2d_bandwidth : opts_.d2h_bandwidth;
    auto& next_free = op == stream_op::copy_to_device ? h2d_free_ : d2h_free_;
    auto end = now;
    if (bw > 0) {
      end = std::max(now, next_free) + std::chrono::duration_cast<clock::duration>(
                                           std::chrono::duration<double>(static_cast<double>(bytes) / bw));
      next_free = end;
    }
    return end + opts_.latency;
  }

  /// Changes the speeds for copies reserved from now on.
  void set_options(pace_options o) {
    validate(o);
    std::lock_guard lock(mutex_);
    opts_ = o;
  }
  [[nodiscard]] pace_options options() const {
    std::lock_guard lock(mutex_);
    return opts_;
  }

 private:
  static void validate(const pace_options& o) {
    STRATA_EXPECTS(o.h2d_bandwidth >= 0 && o.d2h_bandwidth >= 0 && o.latency.count() >= 0, config_error,
                   "pace_options: bandwidths and latency must not be negative (h2d {}, d2h {}, latency {} us)",
                   o.h2d_bandwidth, o.d2h_bandwidth, o.latency.count());
  }

  mutable std::mutex mutex_;
  pace_options opts_;
  clock::time_point h2d_free_{};
  clock::time_point d2h_free_{};
};

template <class Inner>
class paced : public detail::stream_adaptor_base<Inner> {
  using base = detail::stream_adaptor_base<Inner>;

 public:
  /// A stream with its own link of speed `o`.
  template <class... Args>
  explicit paced(pace_options o, Args&&... inner_args)
      : paced(std::make_shared<pace_link>(o), std::forward<Args>(inner_args)...) {}
  /// A stream sharing `link` with other paced streams.
  template <class... Args>
  explicit paced(std::shared_ptr<pace_link> link, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...), link_(std::move(link)) {
    STRATA_EXPECTS(link_ != nullptr, config_error, "paced: no link given");
  }
  paced(const paced&) = delete;
  paced& operator=(const paced&) = delete;

  void copy_to_device(std::span<std::byte> dst, std::span<const std::byte> src) {
    pace(stream_op::copy_to_device, src.size(), [&] { this->inner_.copy_to_device(dst, src); });
  }
  void copy_to_host(std::span<std::byte> dst, std::span<const std::byte> src) {
    pace(stream_op::copy_to_host, src.size(), [&] { this->inner_.copy_to_host(dst, src); });
  }

  /// The link whose clocks this stream's copies reserve.
  [[nodiscard]] pace_link& link() noexcept { return *link_; }

 private:
  template <class Copy>
  void pace(stream_op op, std::size_t bytes, Copy&& copy) {
    auto end = std::make_shared<pace_link::clock::time_point>();
    // The reservation is taken when the stream reaches the copy, not when it is enqueued.
    this->inner_.enqueue_host([link = link_, end, op, bytes] { *end = link->reserve(op, bytes); });
    copy();
    this->inner_.enqueue_host([end] { std::this_thread::sleep_until(*end); });
  }

  std::shared_ptr<pace_link> link_;
};

}  // namespace strata
