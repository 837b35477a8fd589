// strata::bf16 / strata::fp16: exhaustive widening and round trips over all 65536 bit patterns,
// and narrowing checked against an independent round-to-nearest-even reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "strata/core/half.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace half_test {

namespace {

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// The value of an fp16 bit pattern from its definition (not from the library's bit tricks).
double fp16_value(std::uint16_t h) {
  const int sign = (h & 0x8000) != 0 ? -1 : 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0x1f) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// Round to nearest even among the finite fp16 values, infinity from 65520 up (IEEE overflow).
std::uint16_t fp16_reference(float f) {
  static const std::vector<std::pair<double, std::uint16_t>> positives = [] {
    std::vector<std::pair<double, std::uint16_t>> v;
    for (std::uint32_t h = 0; h < 0x7c00; ++h) v.emplace_back(fp16_value(static_cast<std::uint16_t>(h)), h);
    return v;  // increasing with the bit pattern
  }();
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  auto it = std::lower_bound(positives.begin(), positives.end(), std::make_pair(a, std::uint16_t{0}),
                             [](const auto& x, const auto& y) { return x.first < y.first; });
  if (it == positives.end()) it = positives.end() - 1;  // above 65504: 65504 or, from 65520, infinity
  if (it->first == a || it->first < a) return sign | it->second;
  const auto hi = *it;
  const auto lo = *(it - 1);
  const double dlo = a - lo.first;
  const double dhi = hi.first - a;
  if (dlo < dhi) return sign | lo.second;
  if (dhi < dlo) return sign | hi.second;
  return sign | ((lo.second & 1) == 0 ? lo.second : hi.second);
}

// Round to nearest even between the two bf16 neighbours of a finite float.
std::uint16_t bf16_reference(float f) {
  const std::uint32_t u = bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  const std::uint32_t lo = (u & 0x7fffffff) >> 16;
  const std::uint32_t hi = lo + 1;
  const double a = std::fabs(static_cast<double>(f));
  const double vlo = from_bits(lo << 16);
  const double vhi = hi == 0x7f80 ? std::ldexp(1.0, 128) : static_cast<double>(from_bits(hi << 16));
  if (a == vlo) return sign | static_cast<std::uint16_t>(lo);
  const double dlo = a - vlo;
  const double dhi = vhi - a;
  const std::uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) == 0 ? lo : hi);
  return sign | static_cast<std::uint16_t>(r);
}

// Floats that stress rounding: every fp16/bf16 value, its midpoints with the neighbours and one
// float ulp either side, plus random bit patterns over the whole float range.
std::vector<float> rounding_probes() {
  std::vector<float> v;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    for (const float base : {static_cast<float>(strata::fp16::from_bits(static_cast<std::uint16_t>(h))),
                             static_cast<float>(strata::bf16::from_bits(static_cast<std::uint16_t>(h)))}) {
      if (!std::isfinite(base)) continue;
      for (const float x : {base, std::nextafter(base, INFINITY), std::nextafter(base, -INFINITY)}) v.push_back(x);
    }
    if (h < 0x7bff || (h >= 0x8000 && h < 0xfbff)) {  // fp16 midpoints (exact in float)
      const float mid = static_cast<float>((fp16_value(static_cast<std::uint16_t>(h)) + fp16_value(static_cast<std::uint16_t>(h + 1))) / 2);
      for (const float x : {mid, std::nextafter(mid, INFINITY), std::nextafter(mid, -INFINITY)}) v.push_back(x);
    }
    const std::uint32_t mid_bits = (h << 16) | 0x8000;  // bf16 midpoints
    for (const std::uint32_t b : {mid_bits, mid_bits - 1, mid_bits + 1}) v.push_back(from_bits(b));
  }
  for (const float x : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1p-26f,
                        std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), 0.0f, -0.0f})
    v.push_back(x);
  std::mt19937 rng(7);
  for (int i = 0; i < 1'000'000; ++i) v.push_back(from_bits(static_cast<std::uint32_t>(rng())));
  return v;
}

}  // namespace

static_assert(static_cast<float>(strata::bf16(1.0f)) == 1.0f);
static_assert(strata::bf16(1.0f).bits == 0x3f80 && strata::fp16(1.0f).bits == 0x3c00);
static_assert(strata::fp16(65520.0f).bits == 0x7c00 && strata::fp16(65519.0f).bits == 0x7bff);
static_assert(static_cast<float>(strata::fp16::from_bits(0x0001)) == 0x1p-24f);

TEST_CASE("every fp16 bit pattern widens to its exact value and narrows back to itself") {
  int checked = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto x = strata::fp16::from_bits(static_cast<std::uint16_t>(h));
    const float f = x;
    const double want = fp16_value(static_cast<std::uint16_t>(h));
    const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff) != 0;
    if (nan) {
      REQUIRE(std::isnan(f));
      CHECK(std::signbit(f) == ((h & 0x8000) != 0));
      CHECK((bits(f) & 0x400000) != 0);  // widening quiets, as F16C does
      CHECK(strata::fp16(f).bits == (h | 0x200));  // payload kept, quiet bit set
    } else {
      REQUIRE(static_cast<double>(f) == want);
      REQUIRE(std::signbit(f) == ((h & 0x8000) != 0));  // -0 stays -0
      REQUIRE(strata::fp16(f).bits == h);
    }
    ++checked;
  }
  CHECK(checked == 65536);
}

TEST_CASE("every bf16 bit pattern widens to the top half of a float and narrows back to itself") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto x = strata::bf16::from_bits(static_cast<std::uint16_t>(h));
    const float f = x;
    REQUIRE(bits(f) == h << 16);  // exact, NaN payload and signaling bit included
    const bool nan = (h & 0x7fff) > 0x7f80;
    REQUIRE(strata::bf16(f).bits == (nan ? (h | 0x40) : h));
  }
}

TEST_CASE("narrowing rounds to nearest even, overflows to infinity and keeps NaN and signed zero") {
  const auto probes = rounding_probes();
  std::size_t fp16_bad = 0, bf16_bad = 0;
  for (const float f : probes) {
    if (std::isnan(f)) {
      const auto h = strata::fp16(f);
      const auto b = strata::bf16(f);
      fp16_bad += (h.bits & 0x7e00) != 0x7e00 || ((h.bits & 0x8000) != 0) != std::signbit(f);
      bf16_bad += (b.bits & 0x7fc0) != 0x7fc0 || b.bits != static_cast<std::uint16_t>((bits(f) >> 16) | 0x40);
      continue;
    }
    if (strata::fp16(f).bits != fp16_reference(f)) {
      if (fp16_bad++ < 5) MESSAGE("fp16(", f, ") = ", strata::fp16(f).bits, ", want ", fp16_reference(f));
    }
    if (std::isinf(f)) {
      bf16_bad += strata::bf16(f).bits != static_cast<std::uint16_t>(bits(f) >> 16);
    } else if (strata::bf16(f).bits != bf16_reference(f)) {
      if (bf16_bad++ < 5) MESSAGE("bf16(", f, ") = ", strata::bf16(f).bits, ", want ", bf16_reference(f));
    }
  }
  CHECK(probes.size() > 1'000'000);
  CHECK(fp16_bad == 0);
  CHECK(bf16_bad == 0);
  // Spot checks a reader can verify by hand.
  CHECK(strata::fp16(1.0f + 0x1p-11f).bits == 0x3c00);  // tie: to even (down)
  CHECK(strata::fp16(1.0f + 3 * 0x1p-11f).bits == 0x3c02);  // tie: to even (up)
  CHECK(strata::fp16(0x1p-25f).bits == 0x0000);  // half of the smallest subnormal: tie to 0
  CHECK(strata::fp16(0x1.8p-25f).bits == 0x0001);
  CHECK(strata::fp16(-65520.0f).bits == 0xfc00);
  CHECK(strata::bf16(0x1.01p0f).bits == 0x3f80);  // tie: to even
  CHECK(strata::bf16(0x1.03p0f).bits == 0x3f82);
  CHECK(strata::bf16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds up into infinity
  CHECK(strata::bf16(-0.0f).bits == 0x8000);
}

}  // namespace half_test
