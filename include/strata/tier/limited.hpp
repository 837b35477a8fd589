#pragma once
/// limited<Tier, Limiter>: every request holds one permit of a strata::limiter (counting_limiter
/// in-process, node_limiter across the node's processes) from issue to completion, so a shared
/// link (a PFS mount that all ranks of a node use) sees at most the limiter's cap of requests.
/// The limiter is shared, so it is held by reference.
///
/// Reads and writes may draw on separate limiters (a rw_limiter with rw_sharing::separate): a
/// node-wide read lock and a write lock, as MLP-Offload holds around its swap-in and swap-out
/// calls, so one read and one write may run at once on a full-duplex link.
///
/// `read`/`write` never block: they ask for a permit with acquire_async() and return at once; the
/// request reaches the inner tier when the permit is granted (on the thread that granted it: the
/// one that completed an earlier request, or the limiter's own), and the permit is released on
/// the completing thread. Requests waiting for a permit are served first come, first served.

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "strata/core/completion.hpp"
#include "strata/sync/counting_limiter.hpp"
#include "strata/sync/limiter.hpp"
#include "strata/sync/rw_limiter.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/detail/adaptor_base.hpp"
#include "strata/tier/detail/inflight_counter.hpp"

namespace strata {

template <class Inner, limiter Limiter>
class limited : public detail::adaptor_base<Inner> {
  using base = detail::adaptor_base<Inner>;

 public:
  /// Reads and writes hold permits of `limiter`.
  template <class... Args>
  explicit limited(Limiter& limiter, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...), reads_(limiter), writes_(limiter) {}
  /// Reads hold permits of `rw.reads()`, writes of `rw.writes()` (the same limiter when shared).
  /// The limiters are held by reference: `rw` may go, its limiters must outlive this adaptor.
  template <class... Args>
  explicit limited(const rw_limiter<Limiter>& rw, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...), reads_(rw.reads()), writes_(rw.writes()) {}
  limited(const limited&) = delete;
  limited& operator=(const limited&) = delete;
  /// Waits until every request issued through this adaptor (waiting for a permit or running)
  /// has completed.
  ~limited() { inflight_.wait_zero(); }

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    return hold(writes_,
                [this, name = std::string(object), offset, bytes] { return this->inner_.write(name, offset, bytes); });
  }
  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    return hold(reads_, [this, name = std::string(object), offset, dst] { return this->inner_.read(name, offset, dst); });
  }

  /// The limiter of `d`'s requests (the same for both unless built from a separate rw_limiter).
  [[nodiscard]] Limiter& limiter(io_direction d = io_direction::read) noexcept {
    return d == io_direction::read ? reads_ : writes_;
  }

 private:
  template <class Issue>
  completion hold(Limiter& lim, Issue issue) {
    completion_promise done;
    auto result = done.get_future();
    inflight_.add();
    completion permit;
    try {
      permit = lim.acquire_async();
    } catch (...) {
      inflight_.done();
      throw;
    }
    permit.on_complete(
        [this, &lim, issue = std::move(issue), done = std::move(done)](std::exception_ptr granted) mutable {
          if (granted) {  // no permit: nothing to release
            finish(done, granted);
            return;
          }
          completion inner;
          try {
            inner = issue();
          } catch (...) {
            lim.release();
            finish(done, std::current_exception());
            return;
          }
          inner.on_complete([this, &lim, done = std::move(done)](std::exception_ptr e) mutable {
            lim.release();  // before the caller sees completion, so it can count on the permit
            finish(done, e);
          });
        });
    return result;
  }

  void finish(completion_promise& done, std::exception_ptr e) noexcept {
    done.complete(std::move(e));
    inflight_.done();
  }

  Limiter& reads_;
  Limiter& writes_;
  detail::inflight_counter inflight_;  // destroyed first
};

static_assert(tier<limited<any_tier, counting_limiter>>);
static_assert(tier<limited<any_tier&, counting_limiter>>);

}  // namespace strata
