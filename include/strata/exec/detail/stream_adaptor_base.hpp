#pragma once
// The part every stream adaptor shares: it owns (or, with a reference type, refers to) the
// stream it wraps, constructed in place from trailing arguments (streams own threads and are not
// movable), and forwards what it does not change.

#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/exec/stream.hpp"

namespace strata::detail {

template <class Inner>
class stream_adaptor_base {
 public:
  using inner_type = std::remove_reference_t<Inner>;
  static_assert(stream<inner_type>, "a stream adaptor wraps a strata::stream");
  using event_type = typename inner_type::event_type;

  template <class... Args>
  explicit stream_adaptor_base(std::in_place_t, Args&&... args) : inner_(std::forward<Args>(args)...) {}

  /// The wrapped stream.
  [[nodiscard]] inner_type& inner() noexcept { return inner_; }
  [[nodiscard]] const inner_type& inner() const noexcept { return inner_; }

  void copy_to_device(std::span<std::byte> dst, std::span<const std::byte> src) { inner_.copy_to_device(dst, src); }
  void copy_to_host(std::span<std::byte> dst, std::span<const std::byte> src) { inner_.copy_to_host(dst, src); }
  void enqueue_host(host_task task) { inner_.enqueue_host(std::move(task)); }
  [[nodiscard]] event_type record() { return inner_.record(); }
  void wait(const event_type& e) { inner_.wait(e); }
  void sync() { inner_.sync(); }
  [[nodiscard]] std::string_view name() const { return inner_.name(); }

 protected:
  Inner inner_;
};

}  // namespace strata::detail
