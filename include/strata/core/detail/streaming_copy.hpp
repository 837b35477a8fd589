#pragma once
/// strata::detail::streaming_copy: memcpy for bytes that go to memory nobody will read soon.
///
/// A copy into a large destination that is cold (a received object landing in the caller's
/// buffer) pays for every destination line twice with ordinary stores: the line is first read
/// into the cache (read-for-ownership), then written back. Non-temporal stores write whole lines
/// to memory without reading them, so the copy moves a third less memory traffic; on a machine
/// where the same cores also run the server and the network stack, that is CPU time returned.
///
/// The copy ends with a store fence: non-temporal stores are weakly ordered, and the caller may
/// publish the bytes to another thread (a completion) right after. Small copies, and targets
/// without SSE2, use memcpy.

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define STRATA_DETAIL_STREAMING_COPY 1
#else
#define STRATA_DETAIL_STREAMING_COPY 0
#endif

namespace strata::detail {

/// Below this, the setup (aligning the destination, the fence) costs more than the stores save.
inline constexpr std::size_t streaming_copy_min = 1024;

/// Copies `n` bytes from `src` to `dst` (which must not overlap) with non-temporal stores where
/// the target has them; the stores are complete and ordered before it returns.
inline void streaming_copy(void* dst, const void* src, std::size_t n) noexcept {
#if STRATA_DETAIL_STREAMING_COPY
  if (n >= streaming_copy_min) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    const std::size_t bulk = n & ~std::size_t{63};
    for (std::size_t i = 0; i < bulk; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + bulk, s + bulk, n - bulk);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace strata::detail
