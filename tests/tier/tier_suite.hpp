// The typed tier suite: what the tier contract promises, byte for byte, whatever the stack.
// Defined here, invoked over fixtures by each test that has
// tier stacks: tier_suite_test.cpp (local stacks), and the object-store tests. A fixture with a
// static `skip()` that returns true (no server to talk to) runs nothing. Invoke it inside the
// suite's namespace: `namespace strata_test::tier_suite { STRATA_TIER_SUITE(F1, F2, ...); }`.
#pragma once
#include <doctest/doctest.h>

#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <strata/core/completion.hpp>
#include <strata/tier/checksummed.hpp>
#include <strata/tier/faulty.hpp>

#include "tier_test_support.hpp"

namespace strata_test::tier_suite {

using strata::completion;
using namespace strata_test;

template <class F>
bool skip_fixture() {
  if constexpr (requires { F::skip(); }) {
    return F::skip();
  } else {
    return false;
  }
}

namespace {
template <class T>
void put(T& t, const std::string& object, std::uint64_t offset, const std::vector<std::byte>& bytes) {
  t.write(object, offset, bytes).get();
}
template <class T>
std::vector<std::byte> get(T& t, const std::string& object, std::uint64_t offset, std::size_t n) {
  std::vector<std::byte> out(n);
  t.read(object, offset, out).get();
  return out;
}
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a tier returns what was written, byte for byte, for every size", F, tier_suite_1) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx;
  auto& t = fx.tier();
  static_assert(strata::tier<typename F::tier_type>);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4097},
                        std::size_t{3 * test_chunk + 5}}) {
    CAPTURE(n);
    const auto obj = fmt::format("obj-{}", n);
    const auto data = random_bytes(n, n + 1);
    put(t, obj, 0, data);
    REQUIRE(t.size(obj) == n);
    CHECK(get(t, obj, 0, n) == data);
    if (n > 10) {  // a sub-range at an odd offset, into memory that is not aligned
      std::vector<std::byte> buf(n);
      auto sub = std::span(buf).subspan(1, n - 9);
      t.read(obj, 3, sub).get();
      CHECK(std::memcmp(sub.data(), data.data() + 3, sub.size()) == 0);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("writes from unaligned memory round-trip", F, tier_suite_2) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx;
  auto& t = fx.tier();
  const auto data = random_bytes(2 * test_chunk + 100, 7);
  std::vector<std::byte> shifted(data.size() + 3);
  std::memcpy(shifted.data() + 3, data.data(), data.size());
  t.write("unaligned", 0, std::span<const std::byte>(shifted).subspan(3)).get();
  CHECK(get(t, "unaligned", 0, data.size()) == data);
}

TEST_CASE_TEMPLATE_DEFINE("concurrent readers and writers on different objects do not interfere", F, tier_suite_3) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx;
  auto& t = fx.tier();
  constexpr int threads = 4, objects = 6;
  std::vector<std::future<bool>> results;
  for (int th = 0; th < threads; ++th)
    results.push_back(std::async(std::launch::async, [&t, th] {
      bool ok = true;
      for (int round = 0; round < 3; ++round) {
        std::vector<std::vector<std::byte>> data;
        std::vector<completion> writes;
        for (int o = 0; o < objects; ++o) data.push_back(random_bytes(10000 + 997 * o, th * 100 + o + round * 7));
        for (int o = 0; o < objects; ++o) {
          const auto name = fmt::format("t{}-o{}", th, o);
          if (round > 0) t.remove(name);
          writes.push_back(t.write(name, 0, data[o]));
        }
        strata::wait_all(writes);
        std::vector<std::vector<std::byte>> back(objects);
        std::vector<completion> reads;
        for (int o = 0; o < objects; ++o) {
          back[o].resize(data[o].size());
          reads.push_back(t.read(fmt::format("t{}-o{}", th, o), 0, back[o]));
        }
        strata::wait_all(reads);
        for (int o = 0; o < objects; ++o) ok = ok && back[o] == data[o];
      }
      return ok;
    }));
  for (auto& r : results) CHECK(r.get());
}

TEST_CASE_TEMPLATE_DEFINE("overwriting replaces bytes in place and never shrinks the object", F, tier_suite_4) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx;
  auto& t = fx.tier();
  auto data = random_bytes(3 * 4096 + 17, 1);
  put(t, "ow", 0, data);
  const auto patch = random_bytes(4096, 2);
  put(t, "ow", 4096, patch);  // a whole block in the middle
  std::memcpy(data.data() + 4096, patch.data(), patch.size());
  CHECK(get(t, "ow", 0, data.size()) == data);
  CHECK(t.size("ow") == data.size());
  const auto longer = random_bytes(5 * 4096, 3);  // same object, rewritten longer
  put(t, "ow", 0, longer);
  CHECK(t.size("ow") == longer.size());
  CHECK(get(t, "ow", 0, longer.size()) == longer);
}

TEST_CASE_TEMPLATE_DEFINE("remove deletes an object and reports one that is absent", F, tier_suite_5) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx;
  auto& t = fx.tier();
  put(t, "gone", 0, random_bytes(5000, 4));
  put(t, "kept", 0, random_bytes(3000, 5));
  CHECK(t.remove("gone"));
  CHECK_FALSE(t.size("gone").has_value());
  CHECK_FALSE(t.remove("gone"));
  std::vector<std::byte> out(10);
  CHECK_THROWS_AS(t.read("gone", 0, out).get(), strata::error);
  CHECK(get(t, "kept", 0, 3000) == random_bytes(3000, 5));
}

TEST_CASE_TEMPLATE_DEFINE("reads past the end and bad object names are typed errors", F, tier_suite_6) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx;
  auto& t = fx.tier();
  put(t, "short", 0, random_bytes(100, 6));
  std::vector<std::byte> out(50);
  CHECK_THROWS_AS(t.read("short", 60, out).get(), strata::config_error);
  CHECK_THROWS_AS(t.read("never-written", 0, out).get(), strata::config_error);
  CHECK_THROWS_AS(t.write("../escape", 0, out).get(), strata::config_error);
  CHECK_THROWS_AS(t.write("a/b", 0, out).get(), strata::config_error);
}

TEST_CASE_TEMPLATE_DEFINE("a full tier refuses a write with capacity_error and keeps what it holds", F, tier_suite_7) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx(64 * 1024);
  auto& t = fx.tier();
  std::vector<std::vector<std::byte>> kept;
  bool refused = false;
  for (int i = 0; i < 6 && !refused; ++i) {
    auto data = random_bytes(24 * 1024, 10 + i);
    try {
      put(t, fmt::format("c{}", i), 0, data);
      kept.push_back(std::move(data));
    } catch (const strata::capacity_error& e) {
      refused = true;
      MESSAGE(std::string(e.what()));
    }
  }
  CHECK(refused);
  CHECK(kept.size() >= 2);
  for (std::size_t i = 0; i < kept.size(); ++i) CHECK(get(t, fmt::format("c{}", i), 0, kept[i].size()) == kept[i]);
}

TEST_CASE_TEMPLATE_DEFINE("every injected fault is a typed error and leaves other objects intact", F, tier_suite_8) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx;
  strata::faulty<typename F::tier_type&> t(fx.tier());
  const auto other = random_bytes(20000, 20);
  put(t, "other", 0, other);
  const auto victim = random_bytes(20000, 21);
  put(t, "victim", 0, victim);

  t.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = "victim"});
  CHECK_THROWS_AS(t.write("victim", 0, victim).get(), strata::io_error);
  t.inject({.kind = strata::fault_kind::enospc, .op = strata::fault_op::write, .object = "victim"});
  CHECK_THROWS_AS(t.write("victim", 0, victim).get(), strata::capacity_error);
  t.inject({.kind = strata::fault_kind::short_transfer, .op = strata::fault_op::write, .object = "victim"});
  CHECK_THROWS_WITH_AS(t.write("victim", 0, victim).get(), doctest::Contains("short write"), strata::io_error);
  std::vector<std::byte> out(victim.size());
  t.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::read, .object = "victim"});
  CHECK_THROWS_AS(t.read("victim", 0, out).get(), strata::io_error);
  t.inject({.kind = strata::fault_kind::short_transfer, .op = strata::fault_op::read, .object = "victim"});
  CHECK_THROWS_WITH_AS(t.read("victim", 0, out).get(), doctest::Contains("short read"), strata::io_error);
  t.inject({.kind = strata::fault_kind::delay, .object = "victim", .delay = std::chrono::milliseconds(2)});
  CHECK_NOTHROW(t.read("victim", 0, out).get());
  CHECK(out == victim);  // the failed writes wrote at most a prefix of the same bytes
  CHECK(t.fired() == 6);
  CHECK(get(t, "other", 0, other.size()) == other);
}

TEST_CASE_TEMPLATE_DEFINE("a flipped bit is detected by checksums, on read and on write", F, tier_suite_9) {
  if (skip_fixture<F>()) return;
  const std::string stack = F::name;
  CAPTURE(stack);
  F fx;
  strata::faulty<typename F::tier_type&> faults(fx.tier());
  strata::checksummed<strata::faulty<typename F::tier_type&>&> t(strata::checksum_options{.block_bytes = 4096}, faults);
  const auto data = random_bytes(3 * 4096 + 5, 30);
  put(t, "sg-1", 0, data);
  faults.inject({.kind = strata::fault_kind::bit_flip, .op = strata::fault_op::read, .object = "sg-1"});
  std::vector<std::byte> out(data.size());
  try {
    t.read("sg-1", 0, out).get();
    FAIL("a flipped bit went unnoticed");
  } catch (const strata::integrity_error& e) {
    CHECK(e.object() == "sg-1");
    CHECK(e.offset() % 4096 == 0);
  }
  CHECK(get(t, "sg-1", 0, data.size()) == data);  // the stored bytes were never damaged
  faults.inject({.kind = strata::fault_kind::bit_flip, .op = strata::fault_op::write, .object = "sg-2"});
  put(t, "sg-2", 0, data);  // stored with one bit flipped
  CHECK_THROWS_AS(t.read("sg-2", 0, out).get(), strata::integrity_error);
}


}  // namespace strata_test::tier_suite

#define STRATA_TIER_SUITE(...) \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_1, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_2, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_3, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_4, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_5, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_6, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_7, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_8, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(tier_suite_9, __VA_ARGS__)
