#pragma once
/// throttled<Tier>: shapes a tier's bandwidth and adds latency, to emulate a slower device (a PFS
/// link, an object store) on one machine in tests and benchmarks.
///
/// All requests in one direction share one link: each reserves `bytes / bandwidth` seconds of it,
/// in the order they are issued, so concurrent requests add up to the cap, not past it. A request
/// completes at the end of its last slot plus `latency`, or when the inner tier finishes if that is
/// later. Bandwidths may be changed at run time (set_bandwidth); later requests see the new cap.
///
/// The link is the adaptor's own unless `link` names one: then every throttled tier on the node
/// that names it, in any process, shares its time (each with its own caps, which should agree),
/// as the ranks of a node share their link to a PFS. With `chunk_bytes`, a request crosses the link
/// in pieces, each reserved while the one before is half done, so concurrent requests interleave
/// piece by piece as on a real link; `switch_cost` is what the link loses each time it passes from
/// one request to another (seeks, lock and stream hand-over), the interference that node-wide
/// concurrency control (node_limiter) exists to avoid.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "strata/core/completion.hpp"
#include "strata/core/expects.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/detail/adaptor_base.hpp"
#include "strata/tier/detail/inflight_counter.hpp"
#include "strata/tier/detail/link_timeline.hpp"
#include "strata/tier/detail/timer_thread.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Caps of a throttled tier. A bandwidth of 0 leaves that direction unshaped.
struct throttle_options {
  double read_bandwidth = 0;   ///< bytes/s
  double write_bandwidth = 0;  ///< bytes/s
  std::chrono::microseconds latency{0};  ///< added to every request
  /// Empty: the adaptor's own link. A name (letters, digits, '.', '_', '-'): the node-wide link of
  /// that name, shared with every throttled tier of every process on the node that names it (its
  /// file: default_node_limiter_dir()/link-<name>).
  std::string link{};
  /// Requests cross the link in pieces of this many bytes (0: each in one piece).
  std::uint64_t chunk_bytes = 0;
  /// Link time lost whenever consecutive pieces belong to different requests.
  std::chrono::microseconds switch_cost{0};
};

template <class Inner>
class throttled : public detail::adaptor_base<Inner> {
  using base = detail::adaptor_base<Inner>;

 public:
  using clock = std::chrono::steady_clock;

  template <class... Args>
  explicit throttled(throttle_options o, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...),
        opts_(o),
        link_(o.link.empty() ? std::unique_ptr<detail::link_timeline>(std::make_unique<detail::local_link>())
                             : std::make_unique<detail::node_link>(o.link)),
        timer_("throttle") {
    validate(o);
  }
  throttled(const throttled&) = delete;
  throttled& operator=(const throttled&) = delete;
  /// Waits until every request issued through this adaptor has completed.
  ~throttled() { inflight_.wait_zero(); }

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    return shape(1, bytes.size(), this->inner_.write(object, offset, bytes));
  }
  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    return shape(0, dst.size(), this->inner_.read(object, offset, dst));
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
    STRATA_EXPECTS(o.read_bandwidth >= 0 && o.write_bandwidth >= 0 && o.latency.count() >= 0 &&
                       o.switch_cost.count() >= 0,
                   config_error,
                   "throttled: bandwidths, latency and switch cost must not be negative (read {}, write {}, latency {} "
                   "us, switch cost {} us)",
                   o.read_bandwidth, o.write_bandwidth, o.latency.count(), o.switch_cost.count());
  }

  // One request on its way over the link. Done when both the inner tier has finished and the
  // link has carried the last piece (plus latency); an inner failure completes it at once.
  struct transfer {
    completion_promise promise;
    std::mutex mutex;
    int dir = 0;
    std::uint64_t tag = 0;
    std::uint64_t left = 0;  // bytes not yet reserved
    double bandwidth = 0;
    std::uint64_t chunk = 0;
    clock::duration switch_cost{};
    clock::duration latency{};
    int arrived = 0;  // of the two events above
    bool failed = false;
  };

  completion shape(int dir, std::uint64_t bytes, completion inner) {
    auto t = std::make_shared<transfer>();
    {
      std::lock_guard lock(mutex_);
      t->bandwidth = dir == 0 ? opts_.read_bandwidth : opts_.write_bandwidth;
      t->chunk = opts_.chunk_bytes;
      t->switch_cost = opts_.switch_cost;
      t->latency = opts_.latency;
    }
    t->dir = dir;
    t->left = t->bandwidth > 0 ? bytes : 0;
    auto out = t->promise.get_future();
    inflight_.add();
    try {
      if (t->left > 0) t->tag = link_->new_tag();
    } catch (...) {  // the node link's file failed: the request fails, and still counts as done
      fail(t, std::current_exception());
    }
    next_piece(t);  // reserves the first piece now, in issue order
    inner.on_complete([this, t](std::exception_ptr e) {
      if (e) fail(t, e);  // at once; the link's part only stops
      arrive(t);
    });
    return out;
  }

  static void fail(const std::shared_ptr<transfer>& t, std::exception_ptr e) noexcept {
    {
      std::lock_guard lock(t->mutex);
      t->failed = true;
    }
    t->promise.set_exception(std::move(e));  // a promise completes once: a second failure is dropped
  }

  // Reserves the next piece; the one after it is reserved when this one is half carried, so that
  // other requests' pieces can come in between. After the last, waits for its end. Runs on the
  // caller's thread first, then on the timer's: a failure (of a node link's lock, say) fails the
  // request instead of escaping.
  void next_piece(const std::shared_ptr<transfer>& t) noexcept {
    try {
      carry(t);
    } catch (...) {
      fail(t, std::current_exception());
      arrive(t);
    }
  }

  void carry(const std::shared_ptr<transfer>& t) {
    const auto now = clock::now();
    bool failed;
    {
      std::lock_guard lock(t->mutex);
      failed = t->failed;
    }
    if (failed || t->left == 0) {  // an unshaped direction, or a request that failed
      if (failed || t->latency == clock::duration::zero()) arrive(t);
      else timer_.at(now + t->latency, [this, t] { arrive(t); });
      return;
    }
    const std::uint64_t piece = t->chunk > 0 ? std::min(t->chunk, t->left) : t->left;
    t->left -= piece;
    const auto length = std::chrono::duration_cast<clock::duration>(
        std::chrono::duration<double>(static_cast<double>(piece) / t->bandwidth));
    const auto slot = link_->reserve(t->dir, now, length, t->tag, t->switch_cost);
    if (t->left == 0) {
      timer_.at(slot.end + t->latency, [this, t] { arrive(t); });
      return;
    }
    timer_.at(slot.start + (slot.end - slot.start) / 2, [this, t] { next_piece(t); });
  }

  void arrive(const std::shared_ptr<transfer>& t) noexcept {
    bool ok;
    {
      std::lock_guard lock(t->mutex);
      if (++t->arrived < 2) return;
      ok = !t->failed;
    }
    if (ok) t->promise.set_value();
    inflight_.done();
  }

  mutable std::mutex mutex_;
  throttle_options opts_;
  std::unique_ptr<detail::link_timeline> link_;
  detail::timer_thread timer_;
  detail::inflight_counter inflight_;  // destroyed first: its wait guards the members above
};

static_assert(tier<throttled<any_tier>>);
static_assert(tier<throttled<any_tier&>>);

}  // namespace strata
