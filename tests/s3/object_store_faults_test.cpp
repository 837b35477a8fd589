// object_store_tier's fault paths, against the loopback stub (s3_stub.py) told to misbehave:
// throttling and 5xx retried with backoff, transport failures retried, bad answers refused,
// failed uploads aborted, refusals typed and the secret never shown.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/core/notice.hpp>
#include <strata/tier/object_store_tier.hpp>

#include "s3_stub.hpp"
#include "tier_test_support.hpp"

namespace object_store_faults_test {

using namespace strata_test;

namespace {
constexpr const char* secret = "StubSecret/7f3b9e1c2d4a6b8c0e1f3a5b7c9d1e3f";

// `direct`: GETs received straight into the buffer (the default for large ones over http), or
// every request through curl.
strata::object_store_options stub_options(const s3_stub& stub, bool direct = true) {
  strata::object_store_options o;
  o.direct_receive_min = direct ? 1 : UINT64_MAX;
  o.endpoint = stub.endpoint();
  o.bucket = "strata";
  o.prefix = "faults";
  o.region = "us-east-1";
  o.access_key_id = "STUBKEY";
  o.secret_access_key = secret;
  o.part_size = 5ULL << 20;
  o.retry_base = std::chrono::milliseconds(1);
  o.retry_cap = std::chrono::milliseconds(20);
  o.max_retries = 4;
  o.verify_etag = true;  // the ETag tests need it; the rest do not mind
  return o;
}

// Runs the calling test case once per receive path (its subcases): through curl, then received
// straight into the buffer.
bool each_receive_path() {
  bool direct = false;
  SUBCASE("through curl") { direct = false; }
  SUBCASE("received directly into the buffer") { direct = true; }
  return direct;
}

nlohmann::json stats(const s3_stub& stub) { return nlohmann::json::parse(stub.stats_json()); }

std::vector<std::byte> read_all(strata::object_store_tier& t, const std::string& object) {
  std::vector<std::byte> out(t.size(object).value());
  t.read(object, 0, out).get();
  return out;
}

template <class F>
strata::remote_error expect_remote_error(F&& f) {
  try {
    f();
  } catch (const strata::remote_error& e) {
    MESSAGE(std::string(e.what()));
    return e;
  }
  FAIL("no remote_error");
  throw std::logic_error("unreachable");
}
}  // namespace

TEST_CASE("SlowDown and 5xx answers are retried with backoff until the request succeeds") {
  s3_stub stub({"put:status=503,SlowDown:3", "get:status=500,InternalError:2"});
  strata::object_store_tier t(stub_options(stub));
  const auto data = random_bytes(10000, 1);
  t.write("a", 0, data).get();
  CHECK(read_all(t, "a") == data);
  CHECK(t.stats().retries == 5);
  CHECK(stats(stub)["ops"]["put"] == 4);
}

TEST_CASE("429 and Retry-After: the retry waits at least as long as the store asked") {
  s3_stub stub({"put:status=429:1", "get:status=503,SlowDown:1:retry_after=1"});
  strata::object_store_tier t(stub_options(stub));
  const auto data = random_bytes(1000, 2);
  t.write("a", 0, data).get();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(read_all(t, "a") == data);
  // A lower bound the tier must respect, not a speed claim: it may not retry before 1 s.
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(950));
  CHECK(t.stats().retries == 2);
}

TEST_CASE("retries that run out are a remote_error with the status, S3 code, request id and attempts") {
  s3_stub stub({"put:status=503,SlowDown:100"});
  strata::object_store_tier t(stub_options(stub));
  const auto e = expect_remote_error([&] { t.write("a", 0, random_bytes(100, 3)).get(); });
  CHECK(e.http_status() == 503);
  CHECK(e.code() == "SlowDown");
  CHECK(e.request_id().starts_with("stub-"));
  CHECK(e.attempts() == 5);  // the first and max_retries = 4 more
  CHECK(e.operation() == "PUT");
  CHECK(e.key() == "s3://strata/" + t.key_of("a"));
  CHECK_FALSE(t.size("a").has_value());  // a failed first write leaves no object behind
  CHECK(t.used() == 0);
}

TEST_CASE("a 4xx other than throttling is not retried") {
  s3_stub stub({"put:status=403,AccessDenied:1"});
  strata::object_store_tier t(stub_options(stub));
  const auto e = expect_remote_error([&] { t.write("a", 0, random_bytes(100, 4)).get(); });
  CHECK(e.http_status() == 403);
  CHECK(e.code() == "AccessDenied");
  CHECK(e.attempts() == 1);
  CHECK(t.stats().retries == 0);
}

TEST_CASE("a connection reset mid-body and a truncated body are retried and the bytes come whole") {
  const bool direct = each_receive_path();
  s3_stub stub;
  strata::object_store_tier t(stub_options(stub, direct));
  const auto data = random_bytes(3 << 20, 5);
  t.write("a", 0, data).get();
  stub.add_fault("get:reset:1");
  CHECK(read_all(t, "a") == data);
  stub.add_fault("get:truncate:2");
  CHECK(read_all(t, "a") == data);
  CHECK(t.stats().retries == 3);
  stub.add_fault("put:reset:1");  // the PUT is dropped unanswered: sent again (curl itself may)
  t.write("b", 0, data).get();
  CHECK(read_all(t, "b") == data);
  CHECK(stats(stub)["ops"]["put"] == 3);
  CHECK((t.stats().direct_gets > 0) == direct);
}

TEST_CASE("an ETag that is not the MD5 of the bytes sent is retried, and refused when it persists") {
  s3_stub stub({"put:bad_etag:1"});
  strata::object_store_tier t(stub_options(stub));
  const auto data = random_bytes(5000, 6);
  t.write("a", 0, data).get();
  CHECK(t.stats().retries == 1);
  stub.add_fault("put:bad_etag:100");
  const auto e = expect_remote_error([&] { t.write("a", 0, random_bytes(5000, 7)).get(); });
  CHECK(std::string(e.what()).find("ETag") != std::string::npos);
  CHECK(t.size("a") == data.size());  // the index keeps the object the store kept
}

TEST_CASE("a ranged GET answered with the wrong Content-Range or with 200 is refused") {
  const bool direct = each_receive_path();
  s3_stub stub;
  strata::object_store_tier t(stub_options(stub, direct));
  const auto data = random_bytes(20000, 8);
  t.write("a", 0, data).get();
  std::vector<std::byte> out(1000);
  stub.add_fault("get:bad_range:5");  // every attempt: the first and max_retries = 4 more
  auto e = expect_remote_error([&] { t.read("a", 100, out).get(); });
  CHECK(std::string(e.what()).find("Content-Range") != std::string::npos);
  stub.add_fault("get:status200:5");
  e = expect_remote_error([&] { t.read("a", 100, out).get(); });
  CHECK(std::string(e.what()).find("not 206") != std::string::npos);
  stub.add_fault("get:bad_range:2");  // a passing glitch is retried away
  t.read("a", 100, out).get();
  CHECK(std::memcmp(out.data(), data.data() + 100, out.size()) == 0);
  CHECK((t.stats().direct_gets > 0) == direct);
}

TEST_CASE("GETs over http are received straight into the buffer; an answer that is not plain HTTP/1.1 with a "
          "Content-Length goes through curl, and after three in a row every GET does") {
  s3_stub stub;
  auto o = stub_options(stub);
  o.direct_receive_min = 1ULL << 20;  // the default: a 5 MiB part and a 2 MiB tail qualify, 1000 bytes do not
  strata::object_store_tier t(o);
  const auto data = random_bytes(12 << 20, 9);
  t.write("a", 0, data).get();
  CHECK(read_all(t, "a") == data);  // parts of 5 + 5 + 2 MiB
  CHECK(t.stats().direct_gets == 3);
  std::vector<std::byte> small(1000);
  t.read("a", 7, small).get();
  CHECK(std::memcmp(small.data(), data.data() + 7, small.size()) == 0);
  CHECK(t.stats().direct_gets == 3);

  stub.add_fault("get:chunked:1");  // one answer in chunks: that GET goes again through curl
  const auto requests = t.stats().requests;
  CHECK(read_all(t, "a") == data);
  CHECK(t.stats().direct_gets == 6);
  CHECK(t.stats().requests == requests + 4);
  CHECK(t.stats().retries == 0);
  // A plain answer ends the run of answers handed to curl (the chunked GET above, one of three in
  // flight, may have finished last and left it at 1).
  std::vector<std::byte> part(2 << 20);
  t.read("a", 0, part).get();
  CHECK(t.stats().direct_gets == 7);

  // Three in a row (one GET each, its direct attempt and curl's both chunked): the store is taken
  // to answer that way, and the next GET goes to curl at once.
  const std::vector<std::byte> b(data.begin(), data.begin() + (2 << 20));
  t.write("b", 0, b).get();
  stub.add_fault("get:chunked:6");
  for (int k = 0; k < 3; ++k) CHECK(read_all(t, "b") == b);
  CHECK(t.stats().direct_gets == 10);
  CHECK(read_all(t, "b") == b);
  CHECK(t.stats().direct_gets == 10);
  CHECK(t.stats().retries == 0);
  CHECK(stats(stub)["faults"].empty());
}

TEST_CASE("a multipart upload whose part keeps failing is aborted and leaves the old object") {
  s3_stub stub;
  strata::object_store_tier t(stub_options(stub));
  const auto old = random_bytes(1000, 9);
  t.write("a", 0, old).get();
  stub.add_fault("upload_part:status=500,InternalError:100");
  const auto e = expect_remote_error([&] { t.write("a", 0, random_bytes((11ULL << 20), 10)).get(); });
  CHECK(e.operation().starts_with("UPLOAD PART"));
  // The abort is awaited by the tier before it goes; the stub then holds no open upload.
  CHECK(t.size("a") == old.size());
  CHECK(read_all(t, "a") == old);
  // (The stub counts the abort before its answer reaches the tier: both are waited for.)
  for (int i = 0; i < 100 && (stats(stub)["open_uploads"] != 0 || t.stats().aborted_uploads == 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(stats(stub)["open_uploads"] == 0);
  CHECK(stats(stub)["ops"]["abort"] == 1);
  CHECK(t.stats().aborted_uploads == 1);
}

TEST_CASE("the secret is in no error message, name or notice, refused or retried") {
  s3_stub stub({"put:status=403,AccessDenied:1", "get:status=503,SlowDown:100"});
  std::vector<std::string> notices;
  auto old = strata::set_notice_handler([&](std::string_view s) { notices.emplace_back(s); });
  std::vector<std::string> messages;
  {
    strata::object_store_tier t(stub_options(stub));
    try {
      t.write("a", 0, random_bytes(100, 11)).get();
    } catch (const std::exception& e) {
      messages.emplace_back(e.what());
    }
    t.write("a", 0, random_bytes(100, 12)).get();
    std::vector<std::byte> out(100);
    try {
      t.read("a", 0, out).get();
    } catch (const std::exception& e) {
      messages.emplace_back(e.what());
    }
    const auto d = t.descriptor();
    messages.push_back(d.name);
    messages.emplace_back(t.name());
  }
  strata::set_notice_handler(std::move(old));
  CHECK(messages.size() == 4);
  for (const auto& m : messages) CHECK(m.find(secret) == std::string::npos);
  for (const auto& n : notices) CHECK(n.find(secret) == std::string::npos);
}

}  // namespace object_store_faults_test
