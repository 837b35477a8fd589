// probe_write_read: one write and one read rate per round, the bytes read back are the bytes
// written, and no object is left behind, also when a pass fails half-way.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include <strata/tier/faulty.hpp>
#include <strata/tier/tier_probe.hpp>

#include "tier_test_support.hpp"

namespace tier_probe_test {

using namespace strata_test;

TEST_CASE("a probe reports a rate per round and pass, reads back what it wrote and leaves no object") {
  strata::host_tier t(host("probe"));
  auto data = random_bytes(10000, 3);
  const auto original = data;
  const auto r = strata::probe_write_read(t, std::span<std::byte>(data), 4096, 3);
  CHECK(r.write.size() == 3);
  CHECK(r.read.size() == 3);
  for (const double v : r.write) CHECK(v > 0);
  for (const double v : r.read) CHECK(v > 0);
  CHECK(std::memcmp(data.data(), original.data(), data.size()) == 0);  // the read passes refill the buffer
  for (int i = 0; i < 3; ++i) CHECK_FALSE(t.size(strata::probe_object_name(i)).has_value());
  CHECK(t.used() == 0);
}

TEST_CASE("a probe whose pass fails reports the error and still removes the objects it wrote") {
  strata::faulty<strata::host_tier> t(host("probe"));
  t.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::read, .object = {}, .after = 1, .times = 1});
  auto data = random_bytes(10000, 4);
  CHECK_THROWS_AS(strata::probe_write_read(t, std::span<std::byte>(data), 4096, 2), strata::io_error);
  for (int i = 0; i < 3; ++i) CHECK_FALSE(t.size(strata::probe_object_name(i)).has_value());
  CHECK(t.used() == 0);
}

}  // namespace tier_probe_test
