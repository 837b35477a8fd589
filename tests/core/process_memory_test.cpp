// strata::read_process_memory and reset_peak_resident: the peak follows memory the process
// touches, and a reset starts it again from what is resident.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "strata/core/process_memory.hpp"

TEST_CASE("the resident peak grows by what the process touches, and a reset brings it back to the resident set") {
  constexpr std::uint64_t mib = 1 << 20;
  const auto before = strata::read_process_memory();
  CHECK(before.resident > 0);
  CHECK(before.peak >= before.resident);
  {
    constexpr std::size_t size = 64 * mib;
    auto block = std::make_unique<unsigned char[]>(size);
    std::memset(block.get(), 1, size);  // touched: resident now
    const auto touched = strata::read_process_memory();
    CHECK(touched.resident >= before.resident + 60 * mib);
    CHECK(touched.peak >= touched.resident);
    CHECK(block[size - 1] == 1);
  }
  if (strata::reset_peak_resident()) {
    const auto after = strata::read_process_memory();
    CHECK(after.peak >= after.resident);
    CHECK(after.peak - after.resident < 16 * mib);
  }
}
