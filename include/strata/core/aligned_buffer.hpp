#pragma once
/// Owning, aligned, move-only byte buffers. O_DIRECT needs buffers (and lengths) aligned to the
/// logical block size, so the allocation is padded up to a multiple of the alignment: a file
/// backend may transfer `padded_size()` bytes while the caller sees `size()`.

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata {

/// Alignment chosen at run time (the buffer's constructor takes it).
inline constexpr std::size_t dynamic_alignment = 0;
/// Alignment that O_DIRECT accepts on every Linux filesystem and block size in use today.
inline constexpr std::size_t direct_io_alignment = 4096;

/// Whether the buffer's bytes are zeroed on allocation.
enum class buffer_init : std::uint8_t { uninitialized, zeroed };

/// An owning buffer of `size()` bytes whose start is aligned to `alignment()` and whose
/// allocation is padded to `padded_size()`, a multiple of the alignment (the padding is zeroed).
/// Alignment is a template parameter, or `dynamic_alignment` to give it at run time.
/// Move-only; a moved-from buffer is empty. Not thread-safe: share the bytes, not the object.
template <std::size_t Alignment = dynamic_alignment>
class basic_aligned_buffer {
  static_assert(Alignment == dynamic_alignment || std::has_single_bit(Alignment),
                "alignment must be a power of two");

 public:
  /// An empty buffer: data() is null, size() is 0.
  basic_aligned_buffer() noexcept = default;

  /// Allocates `size` bytes aligned to `Alignment`.
  explicit basic_aligned_buffer(std::size_t size, buffer_init init = buffer_init::uninitialized)
    requires(Alignment != dynamic_alignment)
      : alignment_(Alignment) {
    allocate(size, init);
  }

  /// Allocates `size` bytes aligned to `alignment` (a power of two).
  basic_aligned_buffer(std::size_t size, std::size_t alignment,
                       buffer_init init = buffer_init::uninitialized)
    requires(Alignment == dynamic_alignment)
      : alignment_(alignment) {
    STRATA_EXPECTS(std::has_single_bit(alignment), config_error,
                   "aligned_buffer: alignment {} is not a power of two", alignment);
    allocate(size, init);
  }

  basic_aligned_buffer(const basic_aligned_buffer&) = delete;
  basic_aligned_buffer& operator=(const basic_aligned_buffer&) = delete;

  basic_aligned_buffer(basic_aligned_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        padded_(std::exchange(other.padded_, 0)),
        alignment_(other.alignment_) {}

  basic_aligned_buffer& operator=(basic_aligned_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      padded_ = std::exchange(other.padded_, 0);
      alignment_ = other.alignment_;
    }
    return *this;
  }

  ~basic_aligned_buffer() { release(); }

  /// First byte, aligned to alignment(); null when empty.
  [[nodiscard]] std::byte* data() noexcept { return data_; }
  [[nodiscard]] const std::byte* data() const noexcept { return data_; }
  /// Bytes requested by the owner.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Bytes allocated: size() rounded up to a multiple of alignment().
  [[nodiscard]] std::size_t padded_size() const noexcept { return padded_; }
  /// Alignment of data(), in bytes.
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// The first size() bytes.
  [[nodiscard]] std::span<std::byte> bytes() noexcept { return {data_, size_}; }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// All padded_size() bytes, for transfers that must cover whole aligned blocks.
  [[nodiscard]] std::span<std::byte> padded_bytes() noexcept { return {data_, padded_}; }

  /// The bytes viewed as `size() / sizeof(T)` elements of a trivially copyable T.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  [[nodiscard]] std::span<T> as() {
    STRATA_EXPECTS(size_ % sizeof(T) == 0, config_error,
                   "aligned_buffer: {} bytes is not a whole number of {}-byte elements", size_, sizeof(T));
    STRATA_EXPECTS(alignment_ >= alignof(T), config_error,
                   "aligned_buffer: alignment {} is too small for a {}-aligned type", alignment_, alignof(T));
    return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
  }

  friend void swap(basic_aligned_buffer& a, basic_aligned_buffer& b) noexcept {
    std::swap(a.data_, b.data_);
    std::swap(a.size_, b.size_);
    std::swap(a.padded_, b.padded_);
    std::swap(a.alignment_, b.alignment_);
  }

 private:
  void allocate(std::size_t size, buffer_init init) {
    if (size == 0) return;
    STRATA_EXPECTS(size <= std::numeric_limits<std::size_t>::max() - (alignment_ - 1), capacity_error,
                   "aligned_buffer: {} bytes cannot be padded to alignment {}", size, alignment_);
    const std::size_t padded = (size + alignment_ - 1) & ~(alignment_ - 1);
    // posix_memalign wants at least pointer alignment; any larger power of two is fine.
    const std::size_t align = alignment_ < sizeof(void*) ? sizeof(void*) : alignment_;
    void* p = nullptr;
    if (const int rc = ::posix_memalign(&p, align, padded); rc != 0) {
      throw capacity_error(fmt::format("aligned_buffer: cannot allocate {} bytes aligned to {}: {}", padded,
                                       alignment_, detail::errno_text(rc)),
                           padded, 0);
    }
    data_ = static_cast<std::byte*>(p);
    size_ = size;
    padded_ = padded;
    if (init == buffer_init::zeroed)
      std::memset(data_, 0, padded_);
    else if (padded_ > size_)
      std::memset(data_ + size_, 0, padded_ - size_);  // never write stale heap bytes to a file
  }

  void release() noexcept {
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
    padded_ = 0;
  }

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t padded_ = 0;
  std::size_t alignment_ = Alignment == dynamic_alignment ? alignof(std::max_align_t) : Alignment;
};

/// A buffer whose alignment is given at run time.
using aligned_buffer = basic_aligned_buffer<dynamic_alignment>;
/// A buffer aligned (and padded) for O_DIRECT transfers.
using direct_io_buffer = basic_aligned_buffer<direct_io_alignment>;

}  // namespace strata
