// checksummed<T>: writes that cut checksum blocks are completed with the verified bytes around
// them; checksums export and restore, so a reopened tier verifies what an earlier run wrote.
#include <doctest/doctest.h>

#include <fstream>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <strata/tier/detail/adaptor_base.hpp>
#include <strata/tier/host_tier.hpp>

#include <strata/tier/checksummed.hpp>
#include <strata/tier/faulty.hpp>

#include "tier_test_support.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace checksummed_test {

using namespace strata_test;

// Writes reach the host tier at once but complete only when the test lets them (or fails them).
class held_writes : public strata::detail::adaptor_base<strata::host_tier> {
 public:
  held_writes() : adaptor_base(std::in_place, strata::host_tier_options{.name = "held"}) {}
  strata::completion write(std::string_view o, std::uint64_t off, std::span<const std::byte> src) {
    inner_.write(o, off, src).get();
    strata::completion_promise p;
    auto f = p.get_future();
    std::lock_guard l(m_);
    held_.push_back(std::move(p));
    return f;
  }
  strata::completion read(std::string_view o, std::uint64_t off, std::span<std::byte> dst) {
    return inner_.read(o, off, dst);
  }
  std::size_t held() {
    std::lock_guard l(m_);
    return held_.size();
  }
  void release(std::exception_ptr e = nullptr) {
    std::vector<strata::completion_promise> list;
    {
      std::lock_guard l(m_);
      list.swap(held_);
    }
    for (auto& p : list) p.complete(e);
  }

 private:
  std::mutex m_;
  std::vector<strata::completion_promise> held_;
};
static_assert(strata::tier<held_writes>);

TEST_CASE("a checksummed write reaches the inner tier at once and completes, checksums recorded, only with it") {
  strata::checksummed<held_writes> t(strata::checksum_options{.block_bytes = 4096});
  const auto data = random_bytes(5 * 4096 + 100, 11);  // whole blocks and a short last one
  auto w = t.write("o", 0, data);
  CHECK(t.inner().held() == 1);  // issued before the bytes are hashed (that runs beside the write)
  CHECK_FALSE(w.ready());
  CHECK_FALSE(t.checksums("o").has_value());
  t.inner().release();
  w.get();
  const auto sums = t.checksums("o");
  REQUIRE(sums.has_value());
  CHECK(sums->size == data.size());
  CHECK(sums->blocks.size() == 6);
  std::vector<std::byte> back(data.size());
  t.read("o", 0, back).get();
  CHECK(back == data);

  // A failed inner write records nothing: the checksums stay as they were.
  const auto data2 = random_bytes(4096, 12);  // kept until the write completes (the tier contract)
  auto w2 = t.write("o", 0, data2);
  t.inner().release(std::make_exception_ptr(std::runtime_error("device gone")));
  CHECK_THROWS_WITH(w2.get(), doctest::Contains("device gone"));
  CHECK(t.checksums("o") == sums);
}

TEST_CASE("checksummed tiers complete writes that cut checksum blocks with the verified bytes around them") {
  temp_dir dir;
  strata::checksummed<strata::faulty<strata::file_tier>> t(
      strata::checksum_options{.block_bytes = 4096},
      file_opts(dir.path(), strata::io_backend::automatic, strata::unlimited_capacity));
  auto expect = random_bytes(3 * 4096, 1);
  t.write("o", 0, expect).get();
  const auto put = [&](std::uint64_t off, std::vector<std::byte> piece) {
    t.write("o", off, piece).get();
    if (expect.size() < off + piece.size()) expect.resize(off + piece.size(), std::byte{0});
    std::copy(piece.begin(), piece.end(), expect.begin() + static_cast<std::ptrdiff_t>(off));
    std::vector<std::byte> back(expect.size());
    t.read("o", 0, back).get();  // verified against the checksums of the completed blocks
    CHECK(back == expect);
  };
  put(100, random_bytes(10, 2));          // inside block 0
  put(4000, random_bytes(300, 3));        // across blocks 0 and 1
  put(8192, random_bytes(100, 4));        // the start of block 2
  put(3 * 4096 + 50, random_bytes(5000, 5));  // past the end: a zero gap, then new blocks
  put(7, random_bytes(3 * 4096, 6));      // many blocks, unaligned at both ends
  // The bytes around a cut write are verified before they are merged: a damaged neighbour is
  // an integrity_error, and nothing is written.
  t.inner().inject({.kind = strata::fault_kind::bit_flip, .op = strata::fault_op::read, .object = "o"});
  CHECK_THROWS_AS(t.write("o", 4196, random_bytes(10, 7)).get(), strata::integrity_error);
  std::vector<std::byte> back(expect.size());
  t.read("o", 0, back).get();
  CHECK(back == expect);
}

TEST_CASE("checksums export and restore, so a reopened tier verifies what an earlier run wrote") {
  temp_dir dir;
  const auto data = random_bytes(10000, 9);
  strata::object_checksums saved;
  const auto opts = file_opts(dir.path(), strata::io_backend::automatic, strata::unlimited_capacity, "nvme");
  {
    strata::checksummed<strata::file_tier> a(strata::checksum_options{.block_bytes = 4096}, opts);
    a.write("sg-7", 0, data).get();
    saved = a.checksums("sg-7").value();
    CHECK(saved.size == 10000);
    CHECK(saved.blocks.size() == 3);
  }
  strata::checksummed<strata::file_tier> b(strata::checksum_options{.block_bytes = 4096}, opts);
  std::vector<std::byte> out(data.size());
  CHECK_THROWS_WITH_AS(b.read("sg-7", 0, out).get(), doctest::Contains("no checksums are recorded"),
                       strata::integrity_error);
  b.set_checksums("sg-7", saved);
  b.read("sg-7", 0, out).get();
  CHECK(out == data);
  auto corrupt = data;
  corrupt[5000] ^= std::byte{0x10};
  b.inner().write("sg-7", 4096, std::span<const std::byte>(corrupt).subspan(4096, 4096)).get();  // behind its back
  try {
    b.read("sg-7", 0, out).get();
    FAIL("corruption went unnoticed");
  } catch (const strata::integrity_error& e) {
    CHECK(e.tier() == "nvme");
    CHECK(e.object() == "sg-7");
    CHECK(e.offset() == 4096);
  }
  CHECK_THROWS_AS(b.set_checksums("x", {10, 8192, {1, 2}}), strata::config_error);  // wrong block size

  auto shared = opts;
  shared.lock_directory = false;  // reads what `b` wrote, in b's directory, while b lives: on purpose
  strata::checksummed<strata::file_tier> lax(strata::checksum_options{.block_bytes = 4096, .require_checksums = false},
                                             shared);
  lax.read("sg-7", 0, out).get();  // unverified by request
}

}  // namespace checksummed_test
