// Our SigV4 signer against AWS's published vectors: every case of the SigV4 test suite
// (tests/data/sigv4, each stage compared: canonical request, string to sign, Authorization) and
// the four S3 single-chunk examples of the S3 API reference; then its pieces (SHA-256, the
// incremental hasher, URI encoding, the canonical query), session tokens, and that the secret
// access key never leaves it, in a header or in an exception.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/tier/detail/sigv4.hpp>

#include "../test_env.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace sigv4_test {

namespace fs = std::filesystem;
namespace sd = strata::detail;
using headers_t = std::vector<std::pair<std::string, std::string>>;

namespace {

// Every case of the suite that tests/data/sigv4 ships (its folder, relative to the suite's root).
const std::vector<std::string> suite_cases = {
    "get-header-key-duplicate",
    "get-header-value-multiline",
    "get-header-value-order",
    "get-header-value-trim",
    "get-unreserved",
    "get-utf8",
    "get-vanilla",
    "get-vanilla-empty-query-key",
    "get-vanilla-query",
    "get-vanilla-query-order-encoded",
    "get-vanilla-query-order-key",
    "get-vanilla-query-order-key-case",
    "get-vanilla-query-order-value",
    "get-vanilla-query-unreserved",
    "get-vanilla-utf8-query",
    "get-vanilla-with-session-token",
    "normalize-path/get-relative",
    "normalize-path/get-relative-relative",
    "normalize-path/get-slash",
    "normalize-path/get-slash-dot-slash",
    "normalize-path/get-slash-pointless-dot",
    "normalize-path/get-slashes",
    "normalize-path/get-space",
    "normalize-path/get-special-character",
    "post-header-key-case",
    "post-header-key-sort",
    "post-header-value-case",
    "post-sts-token/post-sts-header-after",
    "post-sts-token/post-sts-header-before",
    "post-vanilla",
    "post-vanilla-empty-query-value",
    "post-vanilla-query",
    "post-x-www-form-urlencoded",
    "post-x-www-form-urlencoded-parameters",
};

std::chrono::system_clock::time_point utc(int y, unsigned mo, unsigned d, int h, int mi, int s) {
  using namespace std::chrono;
  return sys_days{year{y} / month{mo} / day{d}} + hours{h} + minutes{mi} + seconds{s};
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot open " << p.string());
  std::string s(std::istreambuf_iterator<char>(f), {});
  std::erase(s, '\r');  // the suite's files are LF; a checkout that made them CRLF must not matter
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The suite writes one query (get-vanilla-query-order-encoded) percent-encoded; the signer takes
// it unencoded.
std::string percent_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct suite_case {
  sd::sigv4_request request;
  sd::aws_credentials credentials;
  std::string date;  // the request's X-Amz-Date
  std::string creq, sts, authz;
};

// Parses <case>.req: request line, headers (folded lines joined by a space), blank line, body.
suite_case load_case(const fs::path& root, const std::string& name) {
  const fs::path dir = root / name;
  const std::string base = fs::path(name).filename().string();
  suite_case c;
  c.creq = read_file(dir / (base + ".creq"));
  c.sts = read_file(dir / (base + ".sts"));
  c.authz = read_file(dir / (base + ".authz"));
  c.credentials = {"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};

  const std::string raw = read_file(dir / (base + ".req"));
  const std::size_t blank = raw.find("\n\n");
  const std::string head = raw.substr(0, blank);
  const std::string body = blank == std::string::npos ? std::string() : raw.substr(blank + 2);

  std::vector<std::string> lines;
  for (std::size_t pos = 0; pos <= head.size();) {
    const std::size_t end = std::min(head.find('\n', pos), head.size());
    lines.push_back(head.substr(pos, end - pos));
    pos = end + 1;
  }
  REQUIRE(!lines.empty());
  // "GET /example space/ HTTP/1.1": the target may hold spaces (get-space).
  const std::string& line = lines.front();
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = line.rfind(' ');
  REQUIRE((sp1 != std::string::npos && sp2 > sp1));
  sd::sigv4_request& r = c.request;
  r.method = line.substr(0, sp1);
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::size_t qmark = target.find('?');
  r.path = target.substr(0, qmark);
  if (qmark != std::string::npos) {
    const std::string q = target.substr(qmark + 1);
    for (std::size_t pos = 0; pos <= q.size();) {
      const std::size_t end = std::min(q.find('&', pos), q.size());
      const std::string param = q.substr(pos, end - pos);
      const std::size_t eq = param.find('=');
      if (!param.empty())
        r.query.emplace_back(percent_decode(param.substr(0, eq)),
                             eq == std::string::npos ? std::string() : percent_decode(param.substr(eq + 1)));
      pos = end + 1;
    }
  }

  headers_t headers;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (l.empty()) continue;  // the newline that ends some files
    if (l.front() == ' ' || l.front() == '\t') {  // a folded continuation line
      REQUIRE(!headers.empty());
      headers.back().second += ' ' + l;
      continue;
    }
    const std::size_t colon = l.find(':');
    REQUIRE_MESSAGE(colon != std::string::npos, name << ": bad header line '" << l << "'");
    headers.emplace_back(l.substr(0, colon), l.substr(colon + 1));
  }
  bool token_header = false;
  for (auto& [k, v] : headers) {
    std::string lower = k;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](char ch) { return static_cast<char>(std::tolower(ch)); });
    if (lower == "host") {
      r.host = v;
    } else if (lower == "x-amz-date") {
      c.date = v;
    } else {
      token_header = token_header || lower == "x-amz-security-token";
      r.headers.emplace_back(k, v);
    }
  }
  r.payload_sha256 = sd::sha256_hex(body);

  // get-vanilla-with-session-token: the token is the signer's to add (it is in the canonical
  // request, not in the request); post-sts-header-before carries it as a header of its own.
  const std::string token_line = "\nx-amz-security-token:";
  if (const std::size_t at = c.creq.find(token_line); at != std::string::npos && !token_header) {
    const std::size_t from = at + token_line.size();
    c.credentials.session_token = c.creq.substr(from, c.creq.find('\n', from) - from);
  }
  return c;
}

std::string header(const headers_t& hs, std::string_view name) {
  for (const auto& [k, v] : hs)
    if (k == name) return v;
  return {};
}

std::vector<std::string> header_names(const headers_t& hs) {
  std::vector<std::string> names;
  for (const auto& h : hs) names.push_back(h.first);
  return names;
}

// The S3 API reference's examples: "Signature Calculations for the Authorization Header:
// Transferring Payload in a Single Chunk (AWS Signature Version 4)".
const sd::aws_credentials s3_doc_credentials{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
const sd::sigv4_scope s3_doc_scope{"us-east-1", "s3"};
constexpr std::string_view empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

struct s3_example {
  const char* name;
  sd::sigv4_request request;
  std::string creq;
  std::string sts;
  std::string signed_headers;
  std::string signature;
};

std::vector<s3_example> s3_examples() {
  const std::string host = "examplebucket.s3.amazonaws.com";
  const std::string e(empty_sha256);
  return {
      {"GET Object (Range: bytes=0-9)",
       {"GET", host, "/test.txt", {}, {{"Range", "bytes=0-9"}}, e},
       "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:" + e +
           "\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n" + e,
       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
       "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
       "host;range;x-amz-content-sha256;x-amz-date",
       "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"},
      {"PUT Object test$file.text",
       {"PUT",
        host,
        "/test$file.text",
        {},
        {{"Date", "Fri, 24 May 2013 00:00:00 GMT"}, {"x-amz-storage-class", "REDUCED_REDUNDANCY"}},
        sd::sha256_hex("Welcome to Amazon S3.")},
       "PUT\n/test%24file.text\n\ndate:Fri, 24 May 2013 00:00:00 GMT\nhost:examplebucket.s3.amazonaws.com\n"
       "x-amz-content-sha256:44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072\n"
       "x-amz-date:20130524T000000Z\nx-amz-storage-class:REDUCED_REDUNDANCY\n\n"
       "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"
       "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072",
       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
       "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d",
       "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
       "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"},
      {"GET Bucket lifecycle (?lifecycle)",
       {"GET", host, "/", {{"lifecycle", ""}}, {}, e},
       "GET\n/\nlifecycle=\nhost:examplebucket.s3.amazonaws.com\nx-amz-content-sha256:" + e +
           "\nx-amz-date:20130524T000000Z\n\nhost;x-amz-content-sha256;x-amz-date\n" + e,
       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
       "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca",
       "host;x-amz-content-sha256;x-amz-date",
       "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"},
      {"GET Bucket, list objects (?max-keys=2&prefix=J, given out of order)",
       {"GET", host, "/", {{"prefix", "J"}, {"max-keys", "2"}}, {}, e},
       "GET\n/\nmax-keys=2&prefix=J\nhost:examplebucket.s3.amazonaws.com\nx-amz-content-sha256:" + e +
           "\nx-amz-date:20130524T000000Z\n\nhost;x-amz-content-sha256;x-amz-date\n" + e,
       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
       "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7",
       "host;x-amz-content-sha256;x-amz-date",
       "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"},
  };
}

// The canonical request the signer makes for `r` as sigv4_sign would (service s3, no token).
std::string s3_canonical(const sd::sigv4_request& r, const std::string& date) {
  return sd::sigv4_canonical_request(r, date, {{"x-amz-date", date}, {"x-amz-content-sha256", r.payload_sha256}},
                                     sd::sigv4_path_style::s3);
}

}  // namespace

TEST_CASE("every case of AWS's SigV4 test suite: canonical request, string to sign and Authorization") {
  const fs::path root = strata_test::runner_path("STRATA_SIGV4_DATA");
  const sd::sigv4_scope scope{"us-east-1", "service"};
  const auto now = utc(2015, 8, 30, 12, 36, 0);

  // The data folder holds exactly the listed cases: none is skipped without saying so.
  std::set<std::string> on_disk;
  for (const auto& entry : fs::recursive_directory_iterator(root))
    if (entry.path().extension() == ".req") on_disk.insert(fs::relative(entry.path().parent_path(), root).generic_string());
  CHECK(on_disk == std::set<std::string>(suite_cases.begin(), suite_cases.end()));
  CHECK(suite_cases.size() == 34);

  int passed = 0;
  for (const std::string& name : suite_cases) {
    INFO("case " << name);
    const suite_case c = load_case(root, name);
    REQUIRE(c.date == "20150830T123600Z");
    REQUIRE(sd::amz_date(now) == c.date);

    headers_t extra{{"x-amz-date", c.date}};
    if (!c.credentials.session_token.empty()) extra.emplace_back("x-amz-security-token", c.credentials.session_token);
    const std::string creq = sd::sigv4_canonical_request(c.request, c.date, extra, sd::sigv4_path_style::generic);
    CHECK(creq == c.creq);
    const std::string sts = sd::sigv4_string_to_sign(creq, c.date, scope);
    CHECK(sts == c.sts);

    const headers_t added = sd::sigv4_sign(c.request, c.credentials, scope, now, sd::sigv4_path_style::generic);
    CHECK(header(added, "authorization") == c.authz);
    CHECK(header(added, "x-amz-date") == c.date);
    std::vector<std::string> expected_names{"x-amz-date"};  // service "service": no x-amz-content-sha256
    if (!c.credentials.session_token.empty()) expected_names.emplace_back("x-amz-security-token");
    expected_names.emplace_back("authorization");
    CHECK(header_names(added) == expected_names);
    if (creq == c.creq && sts == c.sts && header(added, "authorization") == c.authz) ++passed;
  }
  MESSAGE(passed << " of " << suite_cases.size() << " SigV4 test suite cases match in every stage");
  CHECK(passed == static_cast<int>(suite_cases.size()));
}

TEST_CASE("the S3 API reference's single-chunk examples sign to their published signatures") {
  const auto now = utc(2013, 5, 24, 0, 0, 0);
  for (const s3_example& ex : s3_examples()) {
    INFO("example " << ex.name);
    const std::string date = sd::amz_date(now);
    REQUIRE(date == "20130524T000000Z");
    const std::string creq = s3_canonical(ex.request, date);
    CHECK(creq == ex.creq);
    CHECK(sd::sigv4_string_to_sign(creq, date, s3_doc_scope) == ex.sts);

    const headers_t added = sd::sigv4_sign(ex.request, s3_doc_credentials, s3_doc_scope, now);
    CHECK(header_names(added) == std::vector<std::string>{"x-amz-date", "x-amz-content-sha256", "authorization"});
    CHECK(header(added, "x-amz-date") == date);
    CHECK(header(added, "x-amz-content-sha256") == ex.request.payload_sha256);
    CHECK(header(added, "authorization") ==
          "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=" +
              ex.signed_headers + ", Signature=" + ex.signature);
  }
  // The PUT example's x-amz-content-sha256 is the hash of its body.
  CHECK(sd::sha256_hex("Welcome to Amazon S3.") == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
}

TEST_CASE("sha256_hex and the incremental hasher agree with FIPS 180-2's digests and with each other") {
  CHECK(sd::sha256_hex("") == empty_sha256);
  CHECK(sd::sha256_hex(std::span<const std::byte>()) == empty_sha256);
  CHECK(sd::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sd::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

  // 1 MiB + 7 of patterned bytes, one-shot against pieces cut at odd places (and empty pieces).
  std::vector<std::byte> data((1 << 20) + 7);
  std::uint32_t x = 12345;
  for (auto& b : data) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  const std::string whole = sd::sha256_hex(data);
  for (const std::size_t piece : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65}, std::size_t{4096},
                                  std::size_t{100003}, data.size()}) {
    INFO("pieces of " << piece << " bytes");
    sd::sha256_hasher h;
    const std::span<const std::byte> all(data);
    for (std::size_t off = 0; off < all.size(); off += piece) {
      h.update(all.subspan(off, std::min(piece, all.size() - off)));
      h.update(std::span<const std::byte>());
    }
    CHECK(h.hex_final() == whole);
    // hex_final starts afresh: the hasher is reusable.
    h.update("ab");
    h.update("c");
    CHECK(h.hex_final() == sd::sha256_hex("abc"));
    CHECK(h.hex_final() == empty_sha256);
  }
  sd::sha256_hasher a;
  a.update("a");
  sd::sha256_hasher b = std::move(a);  // movable, mid-digest
  b.update("bc");
  CHECK(b.hex_final() == sd::sha256_hex("abc"));
}

TEST_CASE("uri_encode keeps RFC 3986 unreserved characters and writes every other byte as %XX, uppercase") {
  const std::string unreserved = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~";
  CHECK(sd::uri_encode(unreserved, true) == unreserved);
  CHECK(sd::uri_encode("!#$&'()*+,/:;=?@[]", true) == "%21%23%24%26%27%28%29%2A%2B%2C%2F%3A%3B%3D%3F%40%5B%5D");
  CHECK(sd::uri_encode(" %\"<>\\^`{|}", true) == "%20%25%22%3C%3E%5C%5E%60%7B%7C%7D");
  CHECK(sd::uri_encode("a/b c+d", false) == "a/b%20c%2Bd");  // a space is %20, never '+'
  CHECK(sd::uri_encode("a/b", true) == "a%2Fb");
  CHECK(sd::uri_encode("\xE1\x88\xB4", true) == "%E1%88%B4");  // U+1234 in UTF-8
  CHECK(sd::uri_encode("caf\xC3\xA9", true) == "caf%C3%A9");
  CHECK(sd::uri_encode(std::string_view("\x00\x7F\xFF", 3), true) == "%00%7F%FF");
  CHECK(sd::uri_encode("", true).empty());
}

TEST_CASE("the canonical query sorts by encoded name then value, and keeps empty values as 'name='") {
  const auto date = std::string("20130524T000000Z");
  sd::sigv4_request r{"POST", "127.0.0.1:8333", "/bucket/key", {{"uploads", ""}}, {}, std::string(empty_sha256)};
  CHECK(s3_canonical(r, date).starts_with("POST\n/bucket/key\nuploads=\nhost:127.0.0.1:8333\n"));

  r.method = "GET";
  r.query = {{"prefix", "dir/a b"}, {"list-type", "2"}, {"continuation-token", "x+y/z="}, {"delimiter", "/"},
             {"Zeta", ""}, {"a", "2"}, {"a", "10"}};
  CHECK(s3_canonical(r, date).starts_with(
      "GET\n/bucket/key\n"
      "Zeta=&a=10&a=2&continuation-token=x%2By%2Fz%3D&delimiter=%2F&list-type=2&prefix=dir%2Fa%20b\n"));

  // The order in which the query is given does not change the signature.
  const auto now = utc(2013, 5, 24, 0, 0, 0);
  const auto sig = header(sd::sigv4_sign(r, s3_doc_credentials, s3_doc_scope, now), "authorization");
  std::reverse(r.query.begin(), r.query.end());
  CHECK(header(sd::sigv4_sign(r, s3_doc_credentials, s3_doc_scope, now), "authorization") == sig);
}

TEST_CASE("the s3 path style encodes each segment once and normalises nothing; generic normalises") {
  const auto date = std::string("20130524T000000Z");
  sd::sigv4_request r{"GET", "h", "/bucket/a//b/./c/../d e+f~", {}, {}, "UNSIGNED-PAYLOAD"};
  CHECK(s3_canonical(r, date).starts_with("GET\n/bucket/a//b/./c/../d%20e%2Bf~\n\n"));
  const headers_t extra{{"x-amz-date", date}};
  CHECK(sd::sigv4_canonical_request(r, date, extra, sd::sigv4_path_style::generic)
            .starts_with("GET\n/bucket/a/b/d%20e%2Bf~\n\n"));
  CHECK(s3_canonical(r, date).ends_with("\nUNSIGNED-PAYLOAD"));
  r.path.clear();
  CHECK(s3_canonical(r, date).starts_with("GET\n/\n\n"));
  r.path = "/bucket/a/";  // a trailing slash is kept
  CHECK(s3_canonical(r, date).starts_with("GET\n/bucket/a/\n\n"));
}

TEST_CASE("a session token adds a signed x-amz-security-token header") {
  const auto now = utc(2013, 5, 24, 0, 0, 0);
  const sd::sigv4_request r{"GET", "examplebucket.s3.amazonaws.com", "/test.txt", {}, {{"Range", "bytes=0-9"}},
                            std::string(empty_sha256)};
  sd::aws_credentials with_token = s3_doc_credentials;
  with_token.session_token = "FwoGZXIvYXdzEXAMPLE/token+with=odd/chars";
  const headers_t plain = sd::sigv4_sign(r, s3_doc_credentials, s3_doc_scope, now);
  const headers_t tokened = sd::sigv4_sign(r, with_token, s3_doc_scope, now);

  CHECK(header_names(tokened) ==
        std::vector<std::string>{"x-amz-date", "x-amz-content-sha256", "x-amz-security-token", "authorization"});
  CHECK(header(tokened, "x-amz-security-token") == with_token.session_token);
  const std::string authz = header(tokened, "authorization");
  CHECK(authz.find("SignedHeaders=host;range;x-amz-content-sha256;x-amz-date;x-amz-security-token,") !=
        std::string::npos);
  CHECK(authz != header(plain, "authorization"));

  // The token is in the canonical request the signature covers: the signature is that of the
  // canonical request with the token header, recomputed here by hand.
  const std::string date = sd::amz_date(now);
  const std::string creq = sd::sigv4_canonical_request(
      r, date,
      {{"x-amz-date", date}, {"x-amz-content-sha256", r.payload_sha256}, {"x-amz-security-token", with_token.session_token}},
      sd::sigv4_path_style::s3);
  CHECK(creq.find("\nx-amz-security-token:" + with_token.session_token + "\n") != std::string::npos);

  // A request may not carry its own token header as well as credentials with one.
  sd::sigv4_request twice = r;
  twice.headers.emplace_back("X-Amz-Security-Token", "other");
  CHECK_THROWS_AS((void)sd::sigv4_sign(twice, with_token, s3_doc_scope, now), strata::config_error);
}

TEST_CASE("amz_date is the UTC time to the second, rounded down") {
  CHECK(sd::amz_date(utc(2015, 8, 30, 12, 36, 0)) == "20150830T123600Z");
  CHECK(sd::amz_date(utc(2015, 8, 30, 12, 36, 0) + std::chrono::milliseconds(999)) == "20150830T123600Z");
  CHECK(sd::amz_date(std::chrono::system_clock::time_point{}) == "19700101T000000Z");
  CHECK(sd::amz_date(utc(1970, 1, 1, 0, 0, 0) - std::chrono::milliseconds(1)) == "19691231T235959Z");
  CHECK(sd::amz_date(utc(2024, 2, 29, 23, 59, 59)) == "20240229T235959Z");
}

TEST_CASE("the secret access key appears in no header the signer returns and in no exception it throws") {
  const std::string secret = "sEcReT/KeY+0123456789abcdefghijKLMNOPQRSTUV";
  const sd::aws_credentials creds{"AKIDSECRETTEST", secret, "session-token-value"};
  const sd::sigv4_scope scope{"eu-central-1", "s3"};
  const auto now = utc(2026, 12, 1, 8, 30, 0);
  const auto leaks = [&](std::string_view text) {
    return text.find(secret) != std::string_view::npos || text.find("AWS4" + secret) != std::string_view::npos ||
           text.find(sd::uri_encode(secret, true)) != std::string_view::npos;
  };

  const sd::sigv4_request good{"PUT", "127.0.0.1:8333", "/bucket/obj", {{"partNumber", "3"}, {"uploadId", "u1"}},
                               {{"Content-Type", "application/octet-stream"}, {"Content-MD5", "1B2M2Y8AsgTpgAmY7PhCfg=="}},
                               sd::sha256_hex("payload")};
  int scanned = 0;
  for (const auto style : {sd::sigv4_path_style::s3, sd::sigv4_path_style::generic}) {
    for (const auto& [name, value] : sd::sigv4_sign(good, creds, scope, now, style)) {
      CHECK_FALSE(leaks(name));
      CHECK_FALSE(leaks(value));
      ++scanned;
    }
  }
  CHECK(scanned == 8);

  // Each bad input is refused with a config_error whose text names what is wrong, never the secret.
  struct bad_input {
    const char* what;
    sd::sigv4_request request;
    sd::aws_credentials credentials;
    sd::sigv4_scope scope;
    std::string expect_in_message;
  };
  const auto with = [&](auto change) {
    bad_input b{"", good, creds, scope, ""};
    change(b);
    return b;
  };
  const std::vector<bad_input> bad = {
      with([](bad_input& b) { b.what = "method"; b.request.method = "GE T"; b.expect_in_message = "HTTP method"; }),
      with([](bad_input& b) { b.what = "host"; b.request.host = "a b"; b.expect_in_message = "host"; }),
      with([](bad_input& b) { b.what = "path"; b.request.path = "bucket/obj"; b.expect_in_message = "path"; }),
      with([](bad_input& b) { b.what = "payload"; b.request.payload_sha256 = "ABC"; b.expect_in_message = "payload hash"; }),
      with([](bad_input& b) {
        b.what = "header value";
        b.request.headers.emplace_back("X-Injected", "a\r\nb");
        b.expect_in_message = "X-Injected";
      }),
      with([](bad_input& b) { b.what = "header name"; b.request.headers.emplace_back("Bad Name", "v"); b.expect_in_message = "Bad Name"; }),
      with([](bad_input& b) { b.what = "host header"; b.request.headers.emplace_back("Host", "h"); b.expect_in_message = "Host"; }),
      with([](bad_input& b) { b.what = "date header"; b.request.headers.emplace_back("X-Amz-Date", "x"); b.expect_in_message = "X-Amz-Date"; }),
      with([](bad_input& b) {
        b.what = "content-sha256 header";
        b.request.headers.emplace_back("x-amz-content-sha256", "x");
        b.expect_in_message = "x-amz-content-sha256";
      }),
      with([](bad_input& b) {
        b.what = "authorization header";
        b.request.headers.emplace_back("Authorization", "x");
        b.expect_in_message = "Authorization";
      }),
      with([](bad_input& b) { b.what = "query name"; b.request.query.emplace_back("", "v"); b.expect_in_message = "query"; }),
      with([](bad_input& b) { b.what = "region"; b.scope.region = "eu/1"; b.expect_in_message = "region"; }),
      with([](bad_input& b) { b.what = "service"; b.scope.service = ""; b.expect_in_message = "service"; }),
      with([](bad_input& b) { b.what = "key id"; b.credentials.access_key_id = "AKID EXAMPLE"; b.expect_in_message = "access key id"; }),
      with([](bad_input& b) {
        b.what = "token with a line break";
        b.credentials.session_token = "tok\nen";
        b.expect_in_message = "x-amz-security-token";
      }),
  };
  for (const bad_input& b : bad) {
    INFO("bad " << b.what);
    bool threw = false;
    try {
      (void)sd::sigv4_sign(b.request, b.credentials, b.scope, now);
    } catch (const strata::config_error& e) {
      threw = true;
      const std::string text = e.what();
      CHECK_FALSE(leaks(text));
      CHECK_MESSAGE(text.find(b.expect_in_message) != std::string::npos, text);
    }
    CHECK(threw);
  }

  sd::aws_credentials no_secret = creds;
  no_secret.secret_access_key.clear();
  CHECK_THROWS_WITH_AS((void)sd::sigv4_sign(good, no_secret, scope, now), "sigv4: the secret access key is empty",
                       strata::config_error);
}

}  // namespace sigv4_test
