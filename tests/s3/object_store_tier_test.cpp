// object_store_tier against a real S3 server (the fixture's SeaweedFS): the typed tier suite
// over the tier and the stacks it goes into, and what it adds beyond the contract.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <cstdlib>

#include <strata/core/notice.hpp>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/tier/any_tier.hpp>
#include <strata/tier/host_tier.hpp>
#include <strata/tier/object_store_tier.hpp>

#include "../offload/offload_test_support.hpp"
#include "s3_fixtures.hpp"
#include "tier_suite.hpp"

namespace strata_test::tier_suite {
STRATA_TIER_SUITE(strata_test::s3_fixture, strata_test::s3_checksummed_fixture,
                  strata_test::s3_limited_throttled_fixture,
                  strata_test::s3_multipath_fixture<strata::bandwidth_proportional>,
                  strata_test::s3_multipath_fixture<strata::adaptive>);
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

TEST_CASE("unsigned payloads with the ETag checked, and signed ones without, both round-trip on a real server") {
  STRATA_S3_SERVER_OR_SKIP(env);
  for (const bool sign : {false, true}) {
    CAPTURE(sign);
    auto o = options_for(env, "payload");
    o.sign_payload = sign;
    o.verify_etag = !sign;
    strata::object_store_tier t(o);
    const auto small = random_bytes(100000, 70);
    const auto big = random_bytes((11ULL << 20) + 1, 71);  // multipart: the ETag of parts is checked too
    t.write("s", 0, small).get();
    t.write("b", 0, big).get();
    CHECK(read_all(t, "s") == small);
    CHECK(read_all(t, "b") == big);
    CHECK(t.stats().retries == 0);
    remove_all(t);
  }
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

TEST_CASE("offloaded_adamw saves into an object store prefix and loads back bit for bit; a damaged part is refused") {
  STRATA_S3_SERVER_OR_SKIP(env);
  const std::size_t n = 300'000;
  strata::offload_options off;
  off.subgroup_elems = 100'000;  // 1.2 MB of state per subgroup: one PUT each
  off.threads = 2;
  strata::host_tier state(strata::host_tier_options{.name = "state"});
  strata::object_store_tier store_tier(options_for(env, "ckpt"));
  auto store = strata::any_tier::ref(store_tier);
  strata::offloaded_adamw<strata::host_tier> opt(state, random_params(n, 1), {}, off);
  for (int i = 0; i < 2; ++i) opt.step(std::span<const strata::bf16>(random_grads<strata::bf16>(n, 10 + i)));
  opt.save(store);
  opt.step(std::span<const strata::bf16>(random_grads<strata::bf16>(n, 20)));
  opt.save(store);  // replaces the first: its objects go
  CHECK(store_tier.objects().size() == 1 + 1 + 3);  // pointer, manifest, three parts
  {
    auto o = options_for(env, "ckpt");
    o.prefix = store_tier.prefix();
    strata::object_store_tier reopened(o);
    auto again = strata::any_tier::ref(reopened);  // a new process would see the same: found by listing
    strata::host_tier state2(strata::host_tier_options{.name = "state2"});
    auto back = strata::offloaded_adamw<strata::host_tier>::load(again, state2, off);
    CHECK(back.step_count() == 3);
    std::vector<float> a(n), b(n);
    opt.read_master(a);
    back.read_master(b);
    CHECK(same_bits(a, b));
    // Damage one part on the store: the load refuses it.
    const auto m = strata::read_checkpoint_manifest(again);
    std::vector<std::byte> part(static_cast<std::size_t>(*reopened.size(m.data_file + ".2")));
    reopened.read(m.data_file + ".2", 0, part).get();
    part[12345] ^= std::byte{4};
    reopened.write(m.data_file + ".2", 0, part).get();
    strata::host_tier state3(strata::host_tier_options{.name = "state3"});
    CHECK_THROWS_WITH_AS((void)strata::offloaded_adamw<strata::host_tier>::load(again, state3, off),
                         doctest::Contains("subgroup 2"), strata::integrity_error);
    reopened.remove(m.data_file + ".2");
    CHECK_THROWS_WITH_AS((void)strata::verify_checkpoint(again), doctest::Contains("missing"), strata::integrity_error);
  }
  remove_all(store_tier);
}

TEST_CASE("a run-time optimizer over a directory and an s3:// path steps bit for bit like one over a directory") {
  STRATA_S3_SERVER_OR_SKIP(env);
  // The path config names only the URL: the rest comes from the AWS_* variables, as for users.
  ::setenv("AWS_ENDPOINT_URL", env.endpoint.c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", env.access_key_id.c_str(), 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", env.secret_access_key.c_str(), 1);
  ::setenv("AWS_REGION", env.region.c_str(), 1);
  const std::size_t n = 200'000;
  const auto init = random_params(n, 5);
  temp_dir a("/tmp", "s3mp-a"), b("/tmp", "s3mp-b");
  const std::string url = fmt::format("s3://{}/{}", env.bucket, unique_prefix("runtime"));
  auto run = [&](std::vector<strata::offload_path_config> paths, std::vector<float>& master) {
    strata::offloaded_adamw_config c;
    c.paths = std::move(paths);
    c.offload.subgroup_elems = 50'000;
    c.offload.threads = 2;
    auto opt = strata::make_offloaded_adamw(c, init);
    for (int i = 0; i < 3; ++i) opt.step(std::span<const strata::bf16>(random_grads<strata::bf16>(n, 30 + i)), 1e-3f);
    master.resize(n);
    opt.read_master(master);
    const auto traffic = opt.path_totals();
    opt.remove_state();
    return traffic;
  };
  std::vector<float> two, one;
  strata::offload_path_config dir, s3, only;
  dir.directory = a.path();
  dir.read_bandwidth = dir.write_bandwidth = 1e9;
  s3.url = url;
  s3.read_bandwidth = s3.write_bandwidth = 1e9;
  only.directory = b.path();
  const auto traffic = run({dir, s3}, two);
  run({only}, one);
  CHECK(same_bits(two, one));
  REQUIRE(traffic.size() == 2);
  CHECK(traffic[1].name.find("s3://") == 0);
  CHECK(traffic[1].bytes_written > 0);  // the object store held part of the state
  CHECK(traffic[0].bytes_written > 0);
  // Nothing of the run is left under its prefix.
  auto o = server_options("check");
  o.prefix = url.substr(url.find('/', 5) + 1);
  strata::object_store_tier left(o);
  CHECK(left.objects().empty());
}

}  // namespace object_store_tier_test
