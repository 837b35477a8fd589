#pragma once
/// strata::device_span<T>: a pointer and a length into an executor's device memory (a
/// cudaMalloc'ed buffer, or a host_executor's "device" buffer). A distinct type from std::span so
/// that device memory is never passed where host memory is read: only streams touch it, through
/// bytes().

#include <cstddef>
#include <span>
#include <type_traits>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata {

/// See the file comment.
template <class T>
class device_span {
 public:
  constexpr device_span() noexcept = default;
  constexpr device_span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  /// A device_span<T> converts to device_span<const T>.
  template <class U>
    requires std::is_same_v<const U, T>
  constexpr device_span(device_span<U> o) noexcept : data_(o.data()), size_(o.size()) {}

  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  /// Elements [offset, offset + count); config_error past the end.
  [[nodiscard]] device_span subspan(std::size_t offset, std::size_t count) const {
    STRATA_EXPECTS(offset <= size_ && count <= size_ - offset, config_error,
                   "device_span: [{}, {}) is past its {} elements", offset, offset + count, size_);
    return {data_ + offset, count};
  }
  /// The bytes, for a stream's copy (never to be read on the host).
  [[nodiscard]] auto bytes() const noexcept {
    if constexpr (std::is_const_v<T>)
      return std::span<const std::byte>(reinterpret_cast<const std::byte*>(data_), size_bytes());
    else
      return std::span<std::byte>(reinterpret_cast<std::byte*>(data_), size_bytes());
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace strata
