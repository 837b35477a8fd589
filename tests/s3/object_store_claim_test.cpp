// object_store_claim against the S3 test server: a live owner is refused, a dead one's claim and
// objects are taken over, another host is judged by its lease, a damaged claim is refused by
// name, and of runs claiming at the same instant exactly one wins.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <strata/tier/object_store_claim.hpp>

#include "s3_fixtures.hpp"

namespace object_store_claim_test {

namespace {

using namespace std::chrono_literals;
using claim = strata::object_store_claim<strata::object_store_tier>;
const std::string claim_key = claim::claim_name("strata");

/// A tier on a fresh prefix that leaves nothing behind: its objects and control objects go.
struct prefix_fixture {
  explicit prefix_fixture(std::string_view what) : opts(strata_test::server_options(what)) {}
  std::unique_ptr<strata::object_store_tier> open() { return std::make_unique<strata::object_store_tier>(opts); }
  ~prefix_fixture() {
    try {
      strata::object_store_tier t(opts);
      strata_test::remove_all(t);
      for (const char* name : {".strata-claim.strata", ".strata-claim.other", "user-notes.txt"})
        if (const auto o = t.read_control(name)) (void)t.remove_control(name, o->etag);
    } catch (...) {  // a test that broke the server already failed
    }
  }
  strata::object_store_options opts;
};

/// A claim as a run with these fields writes it (what a killed run leaves behind).
std::string claim_text(const std::string& host, const std::string& boot, long pid, std::uint64_t start,
                       long long lease_ms, const std::string& state = "held") {
  return fmt::format(
      "strata-claim 1\nstate {}\nowner test-owner\nhost {}\nboot {}\npid {}\nstart {}\nrun 0123456789abcdef\n"
      "lease_ms {}\nclaimed_ms 0\nrenewed_ms 0\n",
      state, host, boot, pid, start, lease_ms);
}

void put(strata::object_store_tier& t, const std::string& object) {
  const std::vector<std::byte> bytes(1000, std::byte{7});
  t.write(object, 0, bytes).get();
}

/// A pid that has exited (its child, reaped).
long exited_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return static_cast<long>(child);
}

}  // namespace

TEST_CASE("a claim held by a live process on this host is refused with a busy_error naming the prefix and the owner") {
  STRATA_S3_SERVER_OR_SKIP(env);
  (void)env;
  prefix_fixture fx("claim-live");
  auto t = fx.open();
  std::optional<claim> held;
  held.emplace(*t, strata::object_store_claim_options{.owner = "first-run"});
  CHECK_FALSE(held->taken_over());
  put(*t, "strata.sg-0");
  auto t2 = fx.open();
  try {
    claim second(*t2, {});
    FAIL("a second claim on a live owner's scope was granted");
  } catch (const strata::busy_error& e) {
    const std::string what = e.what();
    CHECK(what.find("scope 'strata' of s3://") != std::string::npos);
    CHECK(what.find(fx.opts.prefix) != std::string::npos);
    CHECK(what.find("first-run") != std::string::npos);
    CHECK(what.find(fmt::format("pid {} on this host, this process", ::getpid())) != std::string::npos);
  }
  CHECK(t2->size("strata.sg-0") == 1000);  // the live owner's object is untouched
  // Another scope of the same prefix is another claim.
  auto t3 = fx.open();
  { claim other(*t3, {.scope = "other"}); }
  t->remove("strata.sg-0");
  held.reset();  // a clean end: no object of the scope is left, so the claim goes
  CHECK_FALSE(t->read_control(claim_key).has_value());
}

TEST_CASE("a claim whose owner process has exited is taken over, and its strata objects are the new run's") {
  STRATA_S3_SERVER_OR_SKIP(env);
  (void)env;
  prefix_fixture fx("claim-dead");
  auto t = fx.open();
  const auto me = strata::claim_identity::of_this_process();
  const long gone = exited_pid();
  REQUIRE(t->create_control(claim_key, claim_text(me.host, me.boot, gone, me.start, 60'000)).has_value());
  put(*t, "strata.sg-0");
  put(*t, "strata.gr-3");
  REQUIRE(t->create_control("user-notes.txt", "mine").has_value());
  auto t2 = fx.open();
  {
    claim c(*t2, {});
    CHECK(c.taken_over());
    CHECK(c.reclaimed() == 2);
    CHECK(t2->objects().empty());
    const auto now = t2->read_control(claim_key);
    REQUIRE(now.has_value());
    CHECK(now->body.find(fmt::format("pid {}\n", ::getpid())) != std::string::npos);
    put(*t2, "strata.sg-0");
  }
  // Objects left (as --keep leaves them): the claim stays, released, naming them strata's; the
  // next run takes it at once.
  const auto kept = t2->read_control(claim_key);
  REQUIRE(kept.has_value());
  CHECK(kept->body.find("state released\n") != std::string::npos);
  auto t3 = fx.open();
  {
    claim c(*t3, {});
    CHECK(c.taken_over());
    CHECK(c.reclaimed() == 1);
  }
  CHECK_FALSE(t3->read_control(claim_key).has_value());
  const auto notes = t3->read_control("user-notes.txt");
  REQUIRE(notes.has_value());
  CHECK(notes->body == "mine");
}

TEST_CASE("another host's claim is refused while its lease runs, kept fresh by renewal, and taken over once it ran out") {
  STRATA_S3_SERVER_OR_SKIP(env);
  (void)env;
  prefix_fixture fx("claim-lease");
  auto t = fx.open();
  const strata::claim_identity elsewhere{"another-host", "another-boot", 1, 1};
  {
    // A live owner on another host renews its claim: it is never judged gone.
    std::optional<claim> remote;
    remote.emplace(*t, strata::object_store_claim_options{.owner = "remote-run", .lease = 3s, .renew_every = 500ms,
                                                          .identity = elsewhere});
    put(*t, "strata.sg-0");
    auto t2 = fx.open();
    for (int i = 0; i < 2; ++i) {
      std::this_thread::sleep_for(2500ms);  // together longer than its lease
      CHECK_THROWS_WITH_AS(claim(*t2, {}), doctest::Contains("host another-host"), strata::busy_error);
    }
    t->remove("strata.sg-0");
  }
  // A killed one's claim: refused until its lease ran out (by the store's clock), then taken.
  REQUIRE(t->create_control(claim_key, claim_text("another-host", "another-boot", 1, 1, 3000)).has_value());
  put(*t, "strata.sg-1");
  auto t2 = fx.open();
  CHECK_THROWS_WITH_AS(claim(*t2, {}), doctest::Contains("lease 3 s"), strata::busy_error);
  CHECK(t2->size("strata.sg-1") == 1000);
  const auto deadline = std::chrono::steady_clock::now() + 30s;  // generous: the lease is 3 s
  while (std::chrono::steady_clock::now() < deadline) {
    const auto o = t2->read_control(claim_key);
    REQUIRE(o.has_value());
    if (o->age > 3s) break;
    std::this_thread::sleep_for(250ms);
  }
  claim c(*t2, {});
  CHECK(c.taken_over());
  CHECK(c.reclaimed() == 1);
}

TEST_CASE("a damaged claim is refused with a message naming it, and left as it is") {
  STRATA_S3_SERVER_OR_SKIP(env);
  (void)env;
  prefix_fixture fx("claim-damaged");
  auto t = fx.open();
  REQUIRE(t->create_control(claim_key, "\x01garbage, not a claim\n").has_value());
  put(*t, "strata.sg-0");
  CHECK_THROWS_WITH_AS(claim(*t, {}), doctest::Contains(".strata-claim.strata is not one strata can read"),
                       strata::busy_error);
  // A claim of another version, or cut short, is no better.
  const auto o = t->read_control(claim_key);
  REQUIRE(o.has_value());
  CHECK(o->body == "\x01garbage, not a claim\n");
  CHECK(t->size("strata.sg-0") == 1000);
  REQUIRE(t->replace_control(claim_key, "strata-claim 2\nstate held\n", o->etag).has_value());
  CHECK_THROWS_AS(claim(*t, {}), strata::busy_error);
  CHECK(t->size("strata.sg-0") == 1000);
}

TEST_CASE("objects that no claim covers are refused unless adopting, and adopting takes only strata's names") {
  STRATA_S3_SERVER_OR_SKIP(env);
  (void)env;
  prefix_fixture fx("claim-unclaimed");
  auto t = fx.open();
  put(*t, "strata.sg-0");
  put(*t, "strata.sg-1");
  CHECK_THROWS_WITH_AS(claim(*t, {}),
                       doctest::Contains("already holds 2 objects that no strata claim covers (strata.sg-0, ...)"),
                       strata::busy_error);
  CHECK_FALSE(t->read_control(claim_key).has_value());  // refused before anything was written
  // Another scope's objects under a claim of their own are not ours to judge.
  auto t2 = fx.open();
  std::optional<claim> other;
  other.emplace(*t2, strata::object_store_claim_options{.scope = "other", .adopt_existing = true});
  put(*t2, "other.sg-0");
  auto t3 = fx.open();
  {
    claim c(*t3, {.adopt_existing = true});
    CHECK(c.reclaimed() == 2);
    CHECK(t3->size("other.sg-0") == 1000);
  }
  t2->remove("other.sg-0");
  other.reset();
  auto t4 = fx.open();
  CHECK(t4->objects().empty());
  CHECK_FALSE(t4->read_control(claim_key).has_value());
  CHECK_FALSE(t4->read_control(claim::claim_name("other")).has_value());
}

TEST_CASE("of runs claiming one prefix at the same instant exactly one wins") {
  STRATA_S3_SERVER_OR_SKIP(env);
  (void)env;
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    prefix_fixture fx("claim-race");
    constexpr int runs = 8;
    std::vector<std::unique_ptr<strata::object_store_tier>> tiers;
    for (int i = 0; i < runs; ++i) tiers.push_back(fx.open());
    std::vector<std::optional<claim>> claims(runs);
    std::atomic<int> won{0}, busy{0}, other{0};
    std::latch start(runs);
    std::vector<std::thread> threads;
    for (int i = 0; i < runs; ++i)
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        try {
          claims[static_cast<std::size_t>(i)].emplace(*tiers[static_cast<std::size_t>(i)],
                                                      strata::object_store_claim_options{});
          ++won;
        } catch (const strata::busy_error&) {
          ++busy;
        } catch (...) {
          ++other;
        }
      });
    for (auto& th : threads) th.join();
    CHECK(won == 1);
    CHECK(busy == runs - 1);
    CHECK(other == 0);
    claims.clear();
  }
}

}  // namespace object_store_claim_test
