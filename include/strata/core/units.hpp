#pragma once
/// Byte sizes: literals (`64_MiB`), parsing of human-written sizes ("4GiB", "512MiB", "1.5GB") and
/// counts ("2e9", "500M"), and formatting for messages.
///
/// Units (case-insensitive): B; KiB MiB GiB TiB PiB EiB are powers of 1024; KB MB GB TB PB EB are
/// powers of 1000; a bare K M G T P E is binary, as in dd and numfmt --from=iec. Parsing is exact
/// (no floating point): "1.5GB" is 1500000000, "0.5KiB" is 512, and a size that is not a whole
/// number of bytes ("1.5B") or does not fit in 64 bits is a config_error that quotes the input.

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "strata/core/error.hpp"

namespace strata {

namespace literals {
namespace detail {
consteval std::uint64_t scaled(unsigned long long value, std::uint64_t unit) {
  if (value > std::numeric_limits<std::uint64_t>::max() / unit) throw "size literal overflows 64 bits";
  return value * unit;
}
consteval std::uint64_t scaled(long double value, std::uint64_t unit) {
  const long double bytes = value * static_cast<long double>(unit);
  if (bytes < 0 || bytes > static_cast<long double>(std::numeric_limits<std::uint64_t>::max()))
    throw "size literal out of range";
  const auto whole = static_cast<std::uint64_t>(bytes);
  if (static_cast<long double>(whole) != bytes) throw "size literal is not a whole number of bytes";
  return whole;
}
}  // namespace detail

// clang-format off
consteval std::uint64_t operator""_B(unsigned long long v) { return v; }
consteval std::uint64_t operator""_KiB(unsigned long long v) { return detail::scaled(v, 1ULL << 10); }
consteval std::uint64_t operator""_MiB(unsigned long long v) { return detail::scaled(v, 1ULL << 20); }
consteval std::uint64_t operator""_GiB(unsigned long long v) { return detail::scaled(v, 1ULL << 30); }
consteval std::uint64_t operator""_TiB(unsigned long long v) { return detail::scaled(v, 1ULL << 40); }
consteval std::uint64_t operator""_KB(unsigned long long v) { return detail::scaled(v, 1000ULL); }
consteval std::uint64_t operator""_MB(unsigned long long v) { return detail::scaled(v, 1000000ULL); }
consteval std::uint64_t operator""_GB(unsigned long long v) { return detail::scaled(v, 1000000000ULL); }
consteval std::uint64_t operator""_TB(unsigned long long v) { return detail::scaled(v, 1000000000000ULL); }
consteval std::uint64_t operator""_KiB(long double v) { return detail::scaled(v, 1ULL << 10); }
consteval std::uint64_t operator""_MiB(long double v) { return detail::scaled(v, 1ULL << 20); }
consteval std::uint64_t operator""_GiB(long double v) { return detail::scaled(v, 1ULL << 30); }
consteval std::uint64_t operator""_GB(long double v) { return detail::scaled(v, 1000000000ULL); }
// clang-format on
}  // namespace literals

namespace detail {

struct unit_entry {
  std::string_view name;  // lower case
  std::uint64_t factor;
};

inline constexpr std::array<unit_entry, 20> size_units{{
    {"", 1},
    {"b", 1},
    {"k", 1ULL << 10},
    {"kib", 1ULL << 10},
    {"kb", 1000ULL},
    {"m", 1ULL << 20},
    {"mib", 1ULL << 20},
    {"mb", 1000000ULL},
    {"g", 1ULL << 30},
    {"gib", 1ULL << 30},
    {"gb", 1000000000ULL},
    {"t", 1ULL << 40},
    {"tib", 1ULL << 40},
    {"tb", 1000000000000ULL},
    {"p", 1ULL << 50},
    {"pib", 1ULL << 50},
    {"pb", 1000000000000000ULL},
    {"e", 1ULL << 60},
    {"eib", 1ULL << 60},
    {"eb", 1000000000000000000ULL},
}};

inline constexpr std::array<unit_entry, 5> count_units{{
    {"", 1},
    {"k", 1000ULL},
    {"m", 1000000ULL},
    {"g", 1000000000ULL},
    {"t", 1000000000000ULL},
}};

inline bool is_space(char c) noexcept { return c == ' ' || c == '\t'; }
inline bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }
inline char to_lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

/// Parses "<digits>[.<digits>][e[+-]<digits>][ ]<unit>" exactly, with 128-bit intermediates.
template <std::size_t N>
std::uint64_t parse_scaled(std::string_view text, const std::array<unit_entry, N>& units,
                           std::string_view what, std::string_view unit_help) {
  __extension__ using u128 = unsigned __int128;  // exact intermediates; GCC and Clang have it
  const auto fail = [&](std::string_view why) -> config_error {
    return config_error(fmt::format("invalid {} \"{}\": {}", what, text, why));
  };
  std::size_t i = 0;
  while (i < text.size() && is_space(text[i])) ++i;
  if (i < text.size() && text[i] == '-') throw fail("must not be negative");
  if (i < text.size() && text[i] == '+') ++i;

  u128 mantissa = 0;
  int digits = 0;
  int fraction_digits = 0;
  bool any_digit = false;
  const auto take_digit = [&](char c) {
    any_digit = true;
    if (mantissa == 0 && c == '0') return;  // leading zeros never overflow
    if (++digits > 36) throw fail("too many digits");
    mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
  };
  for (; i < text.size() && is_digit(text[i]); ++i) take_digit(text[i]);
  if (i < text.size() && text[i] == '.') {
    ++i;
    for (; i < text.size() && is_digit(text[i]); ++i) {
      take_digit(text[i]);
      ++fraction_digits;
    }
  }
  if (!any_digit) throw fail("expected a number");

  int exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E') && i + 1 < text.size() &&
      (is_digit(text[i + 1]) || ((text[i + 1] == '+' || text[i + 1] == '-') && i + 2 < text.size() &&
                                 is_digit(text[i + 2])))) {
    ++i;
    bool negative = false;
    if (text[i] == '+' || text[i] == '-') negative = text[i++] == '-';
    int e = 0;
    for (; i < text.size() && is_digit(text[i]); ++i) {
      e = e * 10 + (text[i] - '0');
      if (e > 60) throw fail("exponent out of range");
    }
    exponent = negative ? -e : e;
  }
  while (i < text.size() && is_space(text[i])) ++i;

  const std::size_t unit_begin = i;
  std::string unit;
  for (; i < text.size() && !is_space(text[i]); ++i) unit.push_back(to_lower(text[i]));
  const std::string_view unit_text = text.substr(unit_begin, i - unit_begin);
  while (i < text.size() && is_space(text[i])) ++i;
  if (i != text.size()) throw fail("unexpected text after the unit");

  std::uint64_t factor = 0;
  for (const auto& u : units)
    if (u.name == unit) factor = u.factor;
  if (factor == 0) throw fail(fmt::format("unknown unit \"{}\" (expected {})", unit_text, unit_help));

  // value = mantissa * factor * 10^(exponent - fraction_digits), exactly.
  const u128 limit = std::numeric_limits<std::uint64_t>::max();
  const auto overflow = [&] { return fail("does not fit in 64 bits"); };
  u128 value = 0;
  if (__builtin_mul_overflow(mantissa, static_cast<u128>(factor), &value)) throw overflow();
  int scale = exponent - fraction_digits;
  for (; scale > 0; --scale) {
    if (value > limit) throw overflow();  // keeps the multiply below far from 128-bit overflow
    value *= 10;
  }
  for (; scale < 0; ++scale) {
    if (value % 10 != 0) throw fail(fmt::format("is not a whole number of {}", what == "size" ? "bytes" : "units"));
    value /= 10;
  }
  if (value > limit) throw overflow();
  return static_cast<std::uint64_t>(value);
}

}  // namespace detail

/// Parses a byte size such as "4GiB", "512 MiB", "1.5GB", "4096" or "8k". Throws config_error
/// naming the input on an empty string, a negative value, an unknown unit, a fractional number of
/// bytes or a value above 2^64-1.
[[nodiscard]] inline std::uint64_t parse_size(std::string_view text) {
  return detail::parse_scaled(text, detail::size_units, "size",
                              "B, KiB, MiB, GiB, TiB, PiB, EiB, KB, MB, GB, TB, PB, EB or K, M, G, T, P, E");
}

/// Parses a count such as "2e9", "500M", "1.5G" or "123456" (K M G T are powers of 1000 here).
[[nodiscard]] inline std::uint64_t parse_count(std::string_view text) {
  return detail::parse_scaled(text, detail::count_units, "count", "K, M, G or T (powers of 1000)");
}

/// `n` rounded up to a whole number of `unit`s (unit > 0): what a buffer of n bytes costs when
/// memory is handed out in pages or blocks.
[[nodiscard]] constexpr std::uint64_t round_up(std::uint64_t n, std::uint64_t unit) noexcept {
  return (n + unit - 1) / unit * unit;
}

/// A capacity or budget meaning "no limit beyond what the medium has".
inline constexpr std::uint64_t unlimited_capacity = std::numeric_limits<std::uint64_t>::max();

/// Formats bytes for humans: "100 B", "8 MiB", "1.50 GiB" (exact multiples print without decimals).
[[nodiscard]] inline std::string format_size(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 7> names{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t k = 0;
  while (k + 1 < names.size() && bytes >= (1ULL << (10 * (k + 1)))) ++k;
  if (k == 0) return fmt::format("{} B", bytes);
  const std::uint64_t unit = 1ULL << (10 * k);
  if (bytes % unit == 0) return fmt::format("{} {}", bytes / unit, names[k]);
  return fmt::format("{:.2f} {}", static_cast<double>(bytes) / static_cast<double>(unit), names[k]);
}

}  // namespace strata
