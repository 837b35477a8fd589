// strata::detail::streaming_copy against memcpy: every byte lands, none outside the range, for
// every alignment of source and destination and lengths around its thresholds.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/core/detail/streaming_copy.hpp"

namespace {

std::vector<unsigned char> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<unsigned char> v(n);
  std::uint32_t x = seed;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<unsigned char>(x >> 24);
  }
  return v;
}

}  // namespace

TEST_CASE("streaming_copy copies exactly the bytes asked for, at every alignment and length") {
  constexpr std::size_t guard = 64;
  const std::size_t m = strata::detail::streaming_copy_min;
  const std::size_t lengths[] = {0, 1, 15, 63, 64, m - 1, m, m + 1, m + 15, m + 63, m + 64, 3 * m + 17, 1 << 16,
                                 (1 << 16) + 5};
  for (const std::size_t n : lengths) {
    for (std::size_t src_off = 0; src_off < 16; src_off += 3) {
      for (std::size_t dst_off = 0; dst_off < 32; ++dst_off) {
        const auto src = pattern(n + 16, static_cast<std::uint32_t>(n + src_off));
        auto dst = pattern(n + dst_off + 2 * guard, 7);
        const auto before = dst;
        strata::detail::streaming_copy(dst.data() + guard + dst_off, src.data() + src_off, n);
        bool same = true;
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= guard + dst_off && i < guard + dst_off + n;
          const unsigned char want = inside ? src[src_off + i - guard - dst_off] : before[i];
          same = same && dst[i] == want;
        }
        CAPTURE(n);
        CAPTURE(src_off);
        CAPTURE(dst_off);
        REQUIRE(same);
      }
    }
  }
}
