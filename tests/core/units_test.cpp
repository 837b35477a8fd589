#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "strata/core/units.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace units_test {

using namespace strata::literals;
using strata::config_error;
using strata::parse_count;
using strata::parse_size;

namespace {
// The message of the config_error that parsing `text` throws ("" if it does not throw).
std::string parse_error(const char* text) {
  try {
    (void)parse_size(text);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("size literals are exact powers of 1024 or 1000") {
  static_assert(1_KiB == 1024);
  static_assert(4_GiB == 4ULL << 30);
  static_assert(3_TiB == 3ULL << 40);
  static_assert(1_GB == 1000000000ULL);
  static_assert(1.5_GiB == 3ULL << 29);
  static_assert(0.5_KiB == 512);
  CHECK(8_MiB == 8388608);
}

TEST_CASE("parse_size reads binary, decimal and bare units in any case") {
  CHECK(parse_size("4GiB") == 4_GiB);
  CHECK(parse_size("512MiB") == 512_MiB);
  CHECK(parse_size("1.5GB") == 1500000000ULL);
  CHECK(parse_size("4096") == 4096);
  CHECK(parse_size("4096B") == 4096);
  CHECK(parse_size("8k") == 8_KiB);
  CHECK(parse_size("8K") == 8_KiB);
  CHECK(parse_size("2 mib") == 2_MiB);
  CHECK(parse_size("  3 TiB ") == 3_TiB);
  CHECK(parse_size("1kb") == 1000);
  CHECK(parse_size("0") == 0);
  CHECK(parse_size("+7") == 7);
  CHECK(parse_size("0.5KiB") == 512);
  CHECK(parse_size("1.25MiB") == 1310720);
  CHECK(parse_size("0.001GB") == 1000000);
  CHECK(parse_size("1e3") == 1000);
  CHECK(parse_size("1.5e3KB") == 1500000);
  CHECK(parse_size("1E") == 1ULL << 60);       // a bare E is exbibytes, not an exponent
  CHECK(parse_size("1EiB") == 1ULL << 60);
  CHECK(parse_size("000000000000000000000000000000000000000000012") == 12);  // leading zeros
}

TEST_CASE("parse_size accepts the largest 64-bit value and rejects one more") {
  CHECK(parse_size("18446744073709551615") == std::numeric_limits<std::uint64_t>::max());
  CHECK(parse_error("18446744073709551616").find("does not fit in 64 bits") != std::string::npos);
  CHECK(parse_size("15EiB") == 15ULL << 60);
  CHECK(parse_error("16EiB").find("does not fit in 64 bits") != std::string::npos);
  CHECK(parse_error("20EB").find("does not fit in 64 bits") != std::string::npos);
  CHECK(parse_error("1e60").find("does not fit in 64 bits") != std::string::npos);
  CHECK(parse_error("99999999999999999999999999999999999999EiB").find("too many digits") != std::string::npos);
}

TEST_CASE("parse_size rejects malformed input with a message that quotes it") {
  const auto msg = parse_error("12XB");
  CHECK(msg.find("\"12XB\"") != std::string::npos);
  CHECK(msg.find("unknown unit \"XB\"") != std::string::npos);
  CHECK(msg.find("GiB") != std::string::npos);  // lists what is accepted

  CHECK(parse_error("").find("expected a number") != std::string::npos);
  CHECK(parse_error("   ").find("expected a number") != std::string::npos);
  CHECK(parse_error("GiB").find("expected a number") != std::string::npos);
  CHECK(parse_error(".").find("expected a number") != std::string::npos);
  CHECK(parse_error("-1GiB").find("must not be negative") != std::string::npos);
  CHECK(parse_error("1.5B").find("not a whole number of bytes") != std::string::npos);
  CHECK(parse_error("0.1KiB").find("not a whole number of bytes") != std::string::npos);
  CHECK(parse_error("1 GiB extra").find("unexpected text") != std::string::npos);
  CHECK(parse_error("1..5GiB").find("unknown unit") != std::string::npos);
  CHECK(parse_error("0x10").find("unknown unit") != std::string::npos);
  CHECK(parse_size("1e") == 1ULL << 60);
}

TEST_CASE("parse_count uses powers of 1000 and exponents") {
  CHECK(parse_count("2e9") == 2000000000ULL);
  CHECK(parse_count("500M") == 500000000ULL);
  CHECK(parse_count("1.5G") == 1500000000ULL);
  CHECK(parse_count("123456") == 123456);
  CHECK(parse_count("7k") == 7000);
  CHECK_THROWS_AS((void)parse_count("1.5"), config_error);
  CHECK_THROWS_AS((void)parse_count("5MiB"), config_error);
  CHECK_THROWS_WITH_AS((void)parse_count("2e30"), doctest::Contains("does not fit in 64 bits"), config_error);
}

TEST_CASE("format_size prints exact multiples plainly and others with two decimals") {
  CHECK(strata::format_size(0) == "0 B");
  CHECK(strata::format_size(1023) == "1023 B");
  CHECK(strata::format_size(1024) == "1 KiB");
  CHECK(strata::format_size(1536) == "1.50 KiB");
  CHECK(strata::format_size(8_MiB) == "8 MiB");
  CHECK(strata::format_size(std::numeric_limits<std::uint64_t>::max()) == "16.00 EiB");
}

TEST_CASE("format_size output parses back to the same value when exact") {
  for (std::uint64_t v : {1ULL, 4096ULL, 3ULL << 20, 5ULL << 30, 7ULL << 40})
    CHECK(parse_size(strata::format_size(v)) == v);
}

}  // namespace units_test
