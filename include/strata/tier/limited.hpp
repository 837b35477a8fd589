#pragma once
/// limited<Tier, Limiter>: every request holds one permit of a strata::limiter (counting_limiter
/// in-process, node_limiter across the node's processes) from issue to completion, so a shared
/// link (a PFS mount that all ranks of a node use) sees at most the limiter's cap of requests.
/// The limiter is shared, so it is held by reference.
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

#include "strata/sync/limiter.hpp"
#include "strata/tier/adaptor_base.hpp"
#include "strata/tier/detail/inflight_counter.hpp"
#include "strata/tier/io_future.hpp"

namespace strata {

template <class Inner, limiter Limiter>
class limited : public detail::adaptor_base<Inner> {
  using base = detail::adaptor_base<Inner>;

 public:
  template <class... Args>
  explicit limited(Limiter& limiter, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...), limiter_(limiter) {}
  limited(const limited&) = delete;
  limited& operator=(const limited&) = delete;
  /// Waits until every request issued through this adaptor (waiting for a permit or running)
  /// has completed.
  ~limited() { inflight_.wait_zero(); }

  io_future write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    return hold([this, name = std::string(object), offset, bytes] { return this->inner_.write(name, offset, bytes); });
  }
  io_future read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    return hold([this, name = std::string(object), offset, dst] { return this->inner_.read(name, offset, dst); });
  }

  /// The shared limiter.
  [[nodiscard]] Limiter& limiter() noexcept { return limiter_; }

 private:
  template <class Issue>
  io_future hold(Issue issue) {
    io_promise done;
    auto result = done.get_future();
    inflight_.add();
    completion permit;
    try {
      permit = limiter_.acquire_async();
    } catch (...) {
      inflight_.done();
      throw;
    }
    permit.on_complete(
        [this, issue = std::move(issue), done = std::move(done)](std::exception_ptr granted) mutable {
          if (granted) {  // no permit: nothing to release
            finish(done, granted);
            return;
          }
          io_future inner;
          try {
            inner = issue();
          } catch (...) {
            limiter_.release();
            finish(done, std::current_exception());
            return;
          }
          inner.on_complete([this, done = std::move(done)](std::exception_ptr e) mutable {
            limiter_.release();  // before the caller sees completion, so it can count on the permit
            finish(done, e);
          });
        });
    return result;
  }

  void finish(io_promise& done, std::exception_ptr e) noexcept {
    done.complete(std::move(e));
    inflight_.done();
  }

  Limiter& limiter_;
  detail::inflight_counter inflight_;  // destroyed first
};

}  // namespace strata
