#pragma once
/// limited<Tier, Limiter>: every request holds one permit of a strata::limiter (counting_limiter
/// in-process, node_limiter across the node's processes) from issue to completion, so a shared
/// link (a PFS mount that all ranks of a node use) sees at most the limiter's cap of requests. The limiter is shared, so it is held by reference.
/// `read`/`write` block the caller while no permit is free; the permit is released on the
/// completing thread.

#include <cstdint>
#include <span>
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
  ~limited() { inflight_.wait_zero(); }

  io_future write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    return hold([&] { return this->inner_.write(object, offset, bytes); });
  }
  io_future read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    return hold([&] { return this->inner_.read(object, offset, dst); });
  }

  /// The shared limiter.
  [[nodiscard]] Limiter& limiter() noexcept { return limiter_; }

 private:
  template <class Issue>
  io_future hold(Issue&& issue) {
    limiter_.acquire();
    io_future inner;
    try {
      inner = std::forward<Issue>(issue)();
    } catch (...) {
      limiter_.release();
      throw;
    }
    inflight_.add();
    inner.on_complete([this](std::exception_ptr) {
      limiter_.release();
      inflight_.done();
    });
    return inner;
  }

  Limiter& limiter_;
  detail::inflight_counter inflight_;  // destroyed first
};

}  // namespace strata
