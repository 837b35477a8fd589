// object_store_tier against a real S3 server (the fixture's SeaweedFS): the typed tier suite
// over the tier and the stacks it goes into, and what it adds beyond the contract.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <strata/core/notice.hpp>
#include <strata/tier/object_store_tier.hpp>

#include "s3_fixtures.hpp"
#include "tier_suite.hpp"

namespace strata_test::tier_suite {
STRATA_TIER_SUITE(strata_test::s3_fixture, strata_test::s3_checksummed_fixture,
                  strata_test::s3_limited_throttled_fixture, strata_test::s3_multipath_fixture);
}  // namespace strata_test::tier_suite

namespace object_store_tier_test {

using namespace strata_test;

namespace {
std::vector<std::byte> read_all(strata::object_store_tier& t, const std::string& object) {
  std::vector<std::byte> out(t.size(object).value());
  t.read(object, 0, out).get();
  return out;
}

strata::object_store_options options_for(const s3_server_env& env, std::string_view what) {
  (void)env;
  return server_options(what);
}
}  // namespace

TEST_CASE("a write larger than a part is a multipart upload whose parts read back across their boundaries") {
  STRATA_S3_SERVER_OR_SKIP(env);
  strata::object_store_tier t(options_for(env, "multipart"));
  const auto data = random_bytes((12ULL << 20) + 3, 41);  // three parts of 5 MiB, the last short
  t.write("big", 0, data).get();
  auto s = t.stats();
  CHECK(s.multipart_uploads == 1);
  CHECK(s.parts == 3);
  CHECK(s.puts == 0);
  CHECK(t.size("big") == data.size());
  CHECK(read_all(t, "big") == data);
  CHECK(t.stats().gets - s.gets == 3);  // one ranged GET per part
  // A range across the first part boundary, at odd offsets.
  std::vector<std::byte> mid(1 << 20);
  const std::uint64_t from = (5ULL << 20) - 1000;
  t.read("big", from, mid).get();
  CHECK(std::memcmp(mid.data(), data.data() + from, mid.size()) == 0);
  remove_all(t);
}

TEST_CASE("a write that cuts an object reads what it keeps, patches and re-uploads, and is counted") {
  STRATA_S3_SERVER_OR_SKIP(env);
  strata::object_store_tier t(options_for(env, "patch"));
  auto data = random_bytes(100000, 42);
  t.write("obj", 0, data).get();
  const auto piece = random_bytes(1000, 43);
  t.write("obj", 50000, piece).get();  // inside: keeps both ends
  std::memcpy(data.data() + 50000, piece.data(), piece.size());
  CHECK(read_all(t, "obj") == data);
  auto s = t.stats();
  CHECK(s.patches == 1);
  CHECK(s.patch_bytes_read == data.size() - piece.size());
  t.write("obj", 100000, piece).get();  // past the end: grows it, keeps the rest
  data.insert(data.end(), piece.begin(), piece.end());
  CHECK(t.size("obj") == data.size());
  CHECK(read_all(t, "obj") == data);
  CHECK(t.stats().patches == 2);
  t.write("fresh", 10, piece).get();  // a new object written from an offset: zeros before it
  auto fresh = read_all(t, "fresh");
  CHECK(fresh.size() == 1010);
  CHECK(std::all_of(fresh.begin(), fresh.begin() + 10, [](std::byte b) { return b == std::byte{0}; }));
  remove_all(t);
}

TEST_CASE("a tier opened on a prefix finds the objects an earlier one left, over listing pages, and only those") {
  STRATA_S3_SERVER_OR_SKIP(env);
  auto o = options_for(env, "reopen");
  {
    strata::object_store_tier t(o);
    for (int i = 0; i < 5; ++i) t.write(fmt::format("sg-{}", i), 0, random_bytes(1000 + i, 50 + i)).get();
    // Keys under the prefix that are not the tier's layout: another tier one level down.
    auto nested = o;
    nested.prefix = o.prefix + "zz/";
    strata::object_store_tier other(nested);
    other.write("stranger", 0, random_bytes(10, 1)).get();
  }
  o.list_page_size = 2;  // five objects and a stranger: four pages
  strata::object_store_tier again(o);
  CHECK(again.stats().lists >= 3);
  CHECK(again.objects() == std::vector<std::string>{"sg-0", "sg-1", "sg-2", "sg-3", "sg-4"});
  CHECK(again.used() == 1000 + 1001 + 1002 + 1003 + 1004);
  CHECK(read_all(again, "sg-3") == random_bytes(1003, 53));
  remove_all(again);
  auto nested = o;
  nested.prefix = o.prefix + "zz/";
  strata::object_store_tier other(nested);
  CHECK(other.objects() == std::vector<std::string>{"stranger"});
  remove_all(other);
}

TEST_CASE("keys spread over hashed sub-prefixes of the tier's prefix") {
  STRATA_S3_SERVER_OR_SKIP(env);
  strata::object_store_tier t(options_for(env, "keys"));
  std::set<std::string> subs;
  for (int i = 0; i < 64; ++i) {
    const auto key = t.key_of(fmt::format("sg-{}.m", i));
    REQUIRE(key.starts_with(t.prefix()));
    subs.insert(key.substr(t.prefix().size(), 3));
  }
  CHECK(subs.size() > 32);  // 64 names over 256 sub-prefixes: collisions are few
  CHECK(t.part_size_for(1ULL << 30) == 5ULL << 20);  // the part size the options give
  CHECK(t.part_size_for(100ULL << 30) >= (100ULL << 30) / strata::object_store_tier::max_parts);
}

TEST_CASE("a wrong secret is a remote_error naming status, code and request id, and the secret is in no message") {
  STRATA_S3_SERVER_OR_SKIP(env);
  auto o = options_for(env, "badkey");
  const std::string wrong = "NotTheSecret" + env.secret_access_key.substr(0, 4) + "xyzzy";
  o.secret_access_key = wrong;
  std::vector<std::string> notices;
  auto old = strata::set_notice_handler([&](std::string_view s) { notices.emplace_back(s); });
  try {
    strata::object_store_tier t(o);
    FAIL("a tier with a wrong secret opened");
  } catch (const strata::remote_error& e) {
    const std::string what = e.what();
    MESSAGE(what);
    CHECK(e.http_status() == 403);
    CHECK(e.code() == "SignatureDoesNotMatch");
    CHECK(e.attempts() == 1);  // a 403 is not retried
    CHECK(e.operation() == "LIST");
    CHECK(what.find(wrong) == std::string::npos);
    CHECK(what.find(env.secret_access_key) == std::string::npos);
  }
  strata::set_notice_handler(std::move(old));
  for (const auto& n : notices) CHECK(n.find(wrong) == std::string::npos);
}

TEST_CASE("a key deleted behind the tier's back is a remote_error 404 at read, not retried") {
  STRATA_S3_SERVER_OR_SKIP(env);
  auto o = options_for(env, "gone");
  strata::object_store_tier t(o);
  t.write("x", 0, random_bytes(5000, 60)).get();
  {
    strata::object_store_tier other(o);  // finds x by listing, and deletes it
    CHECK(other.remove("x"));
  }
  std::vector<std::byte> out(5000);
  try {
    t.read("x", 0, out).get();
    FAIL("a read of a deleted key succeeded");
  } catch (const strata::remote_error& e) {
    CHECK(e.http_status() == 404);
    CHECK(e.code() == "NoSuchKey");
    CHECK(e.attempts() == 1);
    CHECK(std::string(e.what()).find(t.key_of("x")) != std::string::npos);
  }
}

TEST_CASE("options and environment: bad part size, missing credentials and bad URLs are config errors") {
  strata::object_store_options o;
  o.bucket = "b";
  o.endpoint = "http://127.0.0.1:1";
  o.access_key_id = "k";
  o.secret_access_key = "s";
  o.part_size = 1 << 20;
  CHECK_THROWS_AS(strata::object_store_tier{o}, strata::config_error);
  o.part_size = 8 << 20;
  o.endpoint = "ftp://127.0.0.1:1";
  CHECK_THROWS_AS(strata::object_store_tier{o}, strata::config_error);
  CHECK(strata::parse_s3_url("s3://strata/demo/run").bucket == "strata");
  CHECK(strata::parse_s3_url("s3://strata/demo/run").prefix == "demo/run");
  CHECK(strata::parse_s3_url("s3://strata").prefix.empty());
  CHECK_THROWS_AS((void)strata::parse_s3_url("s3://A_b/x"), strata::config_error);
  CHECK_THROWS_AS((void)strata::parse_s3_url("/tmp/x"), strata::config_error);
}

}  // namespace object_store_tier_test
