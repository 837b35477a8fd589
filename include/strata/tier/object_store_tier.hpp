#pragma once
/// object_store_tier: objects in an S3 bucket (AWS S3 or any server that speaks its API), a tier
/// like a directory of files, so it can sit in a `multipath` beside NVMe and a PFS, hold a
/// checkpoint, or be measured by the same tools.
///
/// - Transport: libcurl's multi interface on one I/O thread (tier/detail/http_client.hpp), kept-
///   alive connections (`max_connections`), requests signed with our own SigV4 signer
///   (tier/detail/sigv4.hpp). Over http the payload's SHA-256 is signed too (S3 refuses a body
///   that changed on the way); over https TLS protects it and the payload goes unsigned unless
///   `sign_payload` says otherwise. `verify_etag` adds an MD5 check of each answer's ETag.
///   Payloads are hashed on a small pool, not on the I/O thread.
/// - Writes: a whole-object write up to `part_size` is one PUT; a larger one is a multipart
///   upload whose parts are in flight together (parts grown so an object never needs more than
///   10,000); a failed upload is aborted. A write completes only after the store confirmed the
///   object, so completed writes are durable and flush() has nothing to do. A write that does
///   not cover the object from offset 0 to its end (a piece of a striped object, a write past
///   the end) reads what it keeps, patches and uploads the whole object again: correct, costly,
///   and counted (`stats().patches`).
/// - Reads: split into part-aligned ranged GETs run in parallel, each checked for 206, its
///   Content-Range (range and total size) and its length. Over http, GETs of at least
///   `direct_receive_min` bytes are received straight into the caller's buffer (the client's own
///   HTTP/1.1 connections, no copy through curl's buffer); an answer that is not plain HTTP/1.1
///   with a Content-Length goes through curl instead.
/// - Retries: 5xx, 429, SlowDown and transport errors (reset, truncated body, timeout), and an
///   answer that fails a check (ETag, Content-Range), are retried with exponential backoff and
///   full jitter (Retry-After honoured) up to `max_retries` times; other 4xx and exhausted
///   retries are a remote_error naming the operation, key, endpoint, HTTP status, S3 error code
///   and request id.
/// - Timeouts: an attempt ends when its connection does not open within `connect_timeout`, its
///   answer does not begin within `first_byte_timeout` of the request being sent, or it moves
///   under 1 KiB/s for `stall_timeout`; a request with all its retries ends at
///   `request_deadline`. So a store that takes connections and never answers fails each request
///   within a bounded time, as a remote_error that says which limit ran out.
/// - Names: the bucket and the prefix are checked when the tier is made: a prefix with '.',
///   '..' or empty segments (a leading '/', '//'), control characters or backslashes is a
///   config_error, as clients, proxies and servers rewrite such paths and the request signed
///   would not be the one served.
/// - Keys: `<prefix><hh>/<object>`, `hh` two hex digits of the object name's hash, so requests
///   spread over 256 partitions of the prefix (S3 limits request rates per partition). Sizes
///   come from an index filled by the tier's writes and by one listing of the prefix when the
///   tier opens; only keys of that form are the tier's objects.
/// - Credentials: the options, else AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
///   AWS_SESSION_TOKEN; region from AWS_REGION (AWS_DEFAULT_REGION, us-east-1); endpoint from
///   AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (else AWS's regional endpoint). The secret is used
///   only to derive signing keys: it is in no message, log line or trace.
/// - Control objects: small objects at "<prefix><name>" (outside the key form above, so never
///   among objects()), read with their ETag and age and written or deleted conditionally
///   (If-None-Match / If-Match). The prefix itself is not locked: object_store_claim, written
///   there before the first state object, tells one owner from another.
/// Built when strata found libcurl and libcrypto (STRATA_HAS_S3); otherwise this header is empty.
#include "strata/core/config.hpp"

#if STRATA_HAS_S3

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/checksum.hpp"
#include "strata/core/completion.hpp"
#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/notice.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/units.hpp"
#include "strata/tier/detail/http_client.hpp"
#include "strata/tier/detail/inflight_counter.hpp"
#include "strata/tier/detail/sigv4.hpp"
#include "strata/tier/throughput_meter.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Options of an object_store_tier. Empty strings take the AWS_* variables (see the header).
struct object_store_options {
  std::string bucket{};
  std::string prefix{};    ///< key prefix, e.g. "runs/7/" (a '/' is added when missing)
  std::string endpoint{};  ///< "http://127.0.0.1:8333", "https://s3.eu-west-1.amazonaws.com"
  std::string region{};
  /// Path-style addressing (https://host/bucket/key) instead of virtual-hosted
  /// (https://bucket.host/key). Default: path style for an explicit endpoint, else virtual-hosted.
  std::optional<bool> path_style{};
  std::uint64_t part_size = 8ULL << 20;  ///< upload part and ranged-GET size (>= 5 MiB)
  unsigned max_connections = 16;
  unsigned max_retries = 6;  ///< retries after the first attempt
  std::chrono::milliseconds retry_base{50};
  std::chrono::milliseconds retry_cap{5000};
  std::uint64_t capacity = unlimited_capacity;  ///< a budget on the bytes the tier holds
  double read_bandwidth = 0;                    ///< declared, bytes/s; 0 = use the measured value
  double write_bandwidth = 0;
  std::string ca_file{};     ///< CA bundle for https; empty: the system's
  bool verify_tls = true;  ///< off only for a test server with a self-signed certificate
  /// Sign each payload's SHA-256 (S3 then refuses a body that changed on the way). Default: yes
  /// over http, no over https, where TLS protects the body and the hashing would cost CPU.
  std::optional<bool> sign_payload{};
  /// Also check that each PUT's ETag is the MD5 of what was sent (an MD5 per byte uploaded, off
  /// by default: a signed payload or TLS covers the transfer, checksummed<> the whole way).
  bool verify_etag = false;
  std::string access_key_id{};
  std::string secret_access_key{};
  std::string session_token{};
  std::string name{};  ///< default "s3://<bucket>/<prefix>"
  std::size_t hash_threads = 0;  ///< threads hashing payloads; 0: min(4, CPUs)
  /// A transfer that moves under 1 KiB/s for this long is abandoned and retried.
  std::chrono::seconds stall_timeout{60};
  /// A connection that has not opened this long after it was begun is abandoned (an attempt
  /// that failed, retried). Default: STRATA_S3_CONNECT_TIMEOUT, else 10 s.
  std::chrono::milliseconds connect_timeout = env_seconds("STRATA_S3_CONNECT_TIMEOUT", std::chrono::seconds(10),
                                                          std::chrono::milliseconds(1));
  /// An attempt whose answer has not begun this long after its request was sent whole (for a
  /// PUT: after the store took the body's last byte) is abandoned and retried. S3 answers even an
  /// 8 MiB PUT within a second or two of its last byte, and a GET's answer starts before its body
  /// streams, so 10 s is several times what a healthy store needs, while an endpoint that takes
  /// connections and never answers costs 10 s an attempt instead of stall_timeout's 60 s (about
  /// 70 s in all with the default retries). An attempt cut off too soon is only sent again.
  /// Default: STRATA_S3_FIRST_BYTE_TIMEOUT, else 10 s; 0: no limit.
  std::chrono::milliseconds first_byte_timeout = env_seconds("STRATA_S3_FIRST_BYTE_TIMEOUT", std::chrono::seconds(10));
  /// A request ends within this long of its first attempt going out on a connection, its
  /// retries and their backoff included (time queued behind the tier's other requests does not
  /// count): past it the attempt in flight is cut off, no other starts, and the request is a
  /// remote_error naming it. It bounds how long a store that fails every attempt (a silent
  /// one, a 503 storm) holds a write or a read, so it must also cover the slowest legitimate
  /// request, one part: 120 s moves an 8 MiB part at 70 KB/s, far below any link worth
  /// offloading to. Default: STRATA_S3_REQUEST_DEADLINE, else 120 s; 0: no deadline.
  std::chrono::milliseconds request_deadline = env_seconds("STRATA_S3_REQUEST_DEADLINE", std::chrono::seconds(120));
  /// Ranged GETs of at least this many bytes over http:// are received straight into the
  /// caller's buffer on keep-alive connections of the tier's own (up to max_connections more
  /// beside curl's), saving curl's copy of every byte read; UINT64_MAX: every request through
  /// curl. https and a proxy in the environment always go through curl.
  std::uint64_t direct_receive_min = 1ULL << 20;
  unsigned list_page_size = 1000;  ///< keys per listing page (S3's maximum)
};

/// A control object of an object_store_tier (see object_store_tier::read_control).
struct control_object {
  std::string body;
  std::string etag;                  ///< the store's entity tag, for a conditional replace or delete
  std::chrono::milliseconds age{0};  ///< since it was last written, by the store's clock (0: unknown)
};

/// Counts of what an object_store_tier did; `stats()` returns a snapshot.
struct object_store_stats {
  std::uint64_t requests = 0;           ///< HTTP requests made, retries included
  std::uint64_t retries = 0;            ///< requests that were repeats of a failed one
  std::uint64_t puts = 0;               ///< whole-object PUTs
  std::uint64_t multipart_uploads = 0;  ///< completed multipart uploads
  std::uint64_t parts = 0;              ///< parts uploaded
  std::uint64_t aborted_uploads = 0;    ///< multipart uploads aborted after a failure
  std::uint64_t gets = 0;               ///< ranged GETs
  /// GET requests sent on the direct receive path (straight into the caller's buffer); one it
  /// handed to curl (an answer it does not take, no connection) counts here and again in requests
  std::uint64_t direct_gets = 0;
  std::uint64_t patches = 0;            ///< writes that read, patched and re-uploaded an object
  std::uint64_t patch_bytes_read = 0;   ///< bytes read back by those patches
  std::uint64_t bytes_written = 0;      ///< object bytes uploaded (parts and PUTs)
  std::uint64_t bytes_read = 0;         ///< object bytes downloaded
  std::uint64_t lists = 0;              ///< listing pages read
};

/// Where `s3://bucket/prefix` points.
struct s3_location {
  std::string bucket;
  std::string prefix;

  /// The prefix of `name` under this one ("run/7" + "state": "run/7/state"; "" or "run/7/" too),
  /// so that a program joining prefixes never makes an empty segment, which S3 tiers refuse.
  [[nodiscard]] std::string under(std::string_view name) const {
    if (prefix.empty()) return std::string(name);
    return prefix.ends_with('/') ? prefix + std::string(name) : prefix + "/" + std::string(name);
  }
};

namespace detail {
/// `text` with control characters and backslashes shown as \xNN, for messages.
inline std::string printable(std::string_view text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
  }
  return out;
}
}  // namespace detail

/// config_error unless `prefix` is a key prefix whose keys are the ones requested: segments
/// between '/' that are neither empty nor "." nor "..", and no control character or backslash
/// (a client, proxy or server normalizes those, so the request signed is not the one served, or
/// the keys land elsewhere). One trailing '/' is allowed. `where` (a URL, a tier) starts the message.
inline void validate_s3_prefix(std::string_view where, std::string_view prefix) {
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    const auto c = static_cast<unsigned char>(prefix[i]);
    STRATA_EXPECTS(c >= 0x20 && c != 0x7f, config_error,
                   "{}: key prefix '{}' holds a control character (\\x{:02x}) at position {}", where,
                   detail::printable(prefix), c, i);
    STRATA_EXPECTS(c != '\\', config_error,
                   "{}: key prefix '{}' holds a backslash at position {} (some servers take it for '/')", where,
                   detail::printable(prefix), i);
  }
  if (prefix.empty()) return;
  std::string_view rest = prefix;
  if (rest.ends_with('/')) rest.remove_suffix(1);
  for (std::size_t from = 0;;) {
    const auto slash = rest.find('/', from);
    const std::string_view seg = rest.substr(from, slash == std::string_view::npos ? std::string_view::npos : slash - from);
    STRATA_EXPECTS(!seg.empty(), config_error,
                   "{}: key prefix '{}' has an empty segment (a leading '/' or '//'; keys would not be where they "
                   "seem)",
                   where, prefix);
    STRATA_EXPECTS(seg != "." && seg != "..", config_error,
                   "{}: key prefix '{}' has a '{}' segment (servers and proxies resolve it, so the keys would not be "
                   "where they seem)",
                   where, prefix, seg);
    if (slash == std::string_view::npos) break;
    from = slash + 1;
  }
}

/// Parses "s3://bucket[/prefix]"; config_error naming the text otherwise (a bucket name S3 does
/// not allow, a prefix validate_s3_prefix refuses).
[[nodiscard]] inline s3_location parse_s3_url(std::string_view url) {
  STRATA_EXPECTS(url.starts_with("s3://"), config_error, "'{}' is not an s3:// URL", detail::printable(url));
  const std::string_view rest = url.substr(5);
  const auto slash = rest.find('/');
  s3_location l{std::string(rest.substr(0, slash)), slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1))};
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  STRATA_EXPECTS(l.bucket.size() >= 3 && l.bucket.size() <= 63 &&
                     std::all_of(l.bucket.begin(), l.bucket.end(), [&](char c) { return alnum(c) || c == '-' || c == '.'; }) &&
                     alnum(l.bucket.front()) && alnum(l.bucket.back()) && l.bucket.find("..") == std::string::npos,
                 config_error,
                 "'{}': bucket name '{}' is not valid (3-63 of [a-z0-9.-], starting and ending with a letter or digit, "
                 "no '..')",
                 detail::printable(url), detail::printable(l.bucket));
  validate_s3_prefix(fmt::format("'{}'", detail::printable(url)), l.prefix);
  return l;
}

/// A command-line path to an object store: "s3://bucket/prefix[:read_bw[:write_bw]]", bandwidths
/// as sizes per second ("2GB"; one given: both), as `strata-bench` and `offload_demo` take it.
struct s3_path_arg {
  std::string url;  ///< "s3://bucket/prefix"
  s3_location where;
  double read_bandwidth = 0;  ///< bytes/s; 0: not given
  double write_bandwidth = 0;
};

[[nodiscard]] inline s3_path_arg parse_s3_path_arg(std::string_view text) {
  s3_path_arg a;
  const auto colon = text.find(':', 5);  // past "s3://"
  a.url = std::string(text.substr(0, colon));
  a.where = parse_s3_url(a.url);
  if (colon != std::string_view::npos) {
    const std::string_view rest = text.substr(colon + 1);
    const auto c2 = rest.find(':');
    a.read_bandwidth = static_cast<double>(parse_size(rest.substr(0, c2)));
    a.write_bandwidth = c2 == std::string_view::npos ? a.read_bandwidth : static_cast<double>(parse_size(rest.substr(c2 + 1)));
    STRATA_EXPECTS(a.read_bandwidth > 0 && a.write_bandwidth > 0, config_error,
                   "'{}': bandwidths must be positive (s3://bucket/prefix[:READ[:WRITE]])", text);
  }
  return a;
}

namespace detail {

/// SHA-256 (hex, for the signature; "UNSIGNED-PAYLOAD" when not signed) and MD5 (raw, for the ETag), in one pass.
struct payload_digests {
  std::string sha256_hex;
  std::vector<unsigned char> md5;
};

inline payload_digests digest_payload(std::span<const std::byte> data, bool with_sha256, bool with_md5) {
  std::optional<sha256_hasher> sha;
  if (with_sha256) sha.emplace();
  std::optional<evp_hasher> md5;
  if (with_md5) md5.emplace(::EVP_md5());
  constexpr std::size_t piece = 256 << 10;  // both digests read each piece while it is in cache
  for (std::size_t pos = 0; pos < data.size(); pos += piece) {
    const auto p = data.subspan(pos, std::min(piece, data.size() - pos));
    if (sha) sha->update(p);
    if (md5) md5->update(p);
  }
  return {sha ? sha->hex_final() : std::string("UNSIGNED-PAYLOAD"), md5 ? md5->final_bytes() : std::vector<unsigned char>{}};
}

/// The text of the first <tag>...</tag> in `xml` at or after `from`, entities decoded.
inline std::optional<std::string> xml_text(std::string_view xml, std::string_view tag, std::size_t from = 0) {
  const std::string open = fmt::format("<{}>", tag);
  const std::string close = fmt::format("</{}>", tag);
  const auto a = xml.find(open, from);
  if (a == std::string_view::npos) return std::nullopt;
  const auto b = xml.find(close, a + open.size());
  if (b == std::string_view::npos) return std::nullopt;
  const std::string_view raw = xml.substr(a + open.size(), b - a - open.size());
  std::string out;
  out.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    static constexpr std::pair<std::string_view, char> entities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool done = false;
    for (const auto& [e, c] : entities)
      if (raw.substr(i, e.size()) == e) {
        out += c;
        i += e.size() - 1;
        done = true;
        break;
      }
    if (!done && raw.substr(i, 2) == "&#") {  // a character reference: &#34; or &#x22;
      const auto semi = raw.find(';', i);
      const bool hex = raw.substr(i + 2, 1) == "x";
      const std::string digits(raw.substr(i + (hex ? 3 : 2), semi == std::string_view::npos ? 0 : semi - i - (hex ? 3 : 2)));
      char* end = nullptr;
      const unsigned long code = std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
      if (!digits.empty() && end == digits.c_str() + digits.size() && code > 0 && code < 0x80) {
        out += static_cast<char>(code);
        i = semi;
        done = true;
      }
    }
    if (!done) out += '&';
  }
  return out;
}

/// The time an HTTP-date ("Thu, 03 Dec 2026 17:45:23 GMT") names; nullopt when it is not one.
inline std::optional<std::chrono::system_clock::time_point> parse_http_date(const std::string& text) {
  std::tm tm{};
  const char* end = ::strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  const std::time_t t = ::timegm(&tm);
  if (t == static_cast<std::time_t>(-1)) return std::nullopt;
  return std::chrono::system_clock::from_time_t(t);
}

inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// `value` when given, else the first of the variables that is set, else `fallback`. Any of the
// variables that is set but empty is a config_error naming it, as a STRATA_* one is (env_raw),
// even behind one that is set: an empty AWS_REGION or AWS_ENDPOINT_URL is more likely a script
// whose value went missing than a wish for the default, and the default (AWS's us-east-1
// endpoint) would send the requests elsewhere.
inline std::string env_or(std::string value, std::initializer_list<const char*> names, std::string fallback = {}) {
  if (!value.empty()) return value;
  std::optional<std::string> found;
  for (const char* n : names) {
    auto v = env_raw(n);
    if (!found) found = std::move(v);
  }
  return found ? std::move(*found) : fallback;
}

}  // namespace detail

class object_store_tier {
 public:
  /// S3's limits on a multipart upload.
  static constexpr std::uint64_t min_part_size = 5ULL << 20;
  static constexpr std::uint64_t max_parts = 10000;

  explicit object_store_tier(object_store_options o) : opts_(std::move(o)) {
    STRATA_EXPECTS(!opts_.bucket.empty(), config_error, "object_store_tier: no bucket given");
    // The bucket is a path segment (path style) or part of the host name (virtual-hosted): S3's
    // characters, and legacy buckets' capitals and '_', but nothing that moves the request.
    STRATA_EXPECTS(opts_.bucket.size() <= 255 && opts_.bucket != "." && opts_.bucket != ".." &&
                       std::all_of(opts_.bucket.begin(), opts_.bucket.end(),
                                   [](char c) {
                                     return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                                            c == '-' || c == '.' || c == '_';
                                   }),
                   config_error, "object_store_tier: bucket name '{}' is not valid (up to 255 of [A-Za-z0-9._-], not '.' or '..')",
                   opts_.bucket);
    validate_s3_prefix(fmt::format("object_store_tier 's3://{}/{}'", opts_.bucket, detail::printable(opts_.prefix)),
                       opts_.prefix);
    if (!opts_.prefix.empty() && opts_.prefix.back() != '/') opts_.prefix += '/';
    if (opts_.name.empty()) opts_.name = fmt::format("s3://{}/{}", opts_.bucket, opts_.prefix);
    STRATA_EXPECTS(opts_.connect_timeout.count() > 0 && opts_.first_byte_timeout.count() >= 0 &&
                       opts_.request_deadline.count() >= 0 && opts_.stall_timeout.count() > 0,
                   config_error,
                   "object_store_tier '{}': connect_timeout and stall_timeout must be positive, first_byte_timeout and "
                   "request_deadline not negative (0: no limit)",
                   opts_.name);
    STRATA_EXPECTS(opts_.part_size >= min_part_size, config_error,
                   "object_store_tier '{}': part_size {} is below S3's minimum part of {}", opts_.name,
                   format_size(opts_.part_size), format_size(min_part_size));
    opts_.region = detail::env_or(opts_.region, {"AWS_REGION", "AWS_DEFAULT_REGION"}, "us-east-1");
    const bool explicit_endpoint = !detail::env_or(opts_.endpoint, {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}).empty();
    opts_.endpoint = detail::env_or(opts_.endpoint, {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"},
                                    fmt::format("https://s3.{}.amazonaws.com", opts_.region));
    path_style_ = opts_.path_style.value_or(explicit_endpoint);
    parse_endpoint();
    sign_payload_ = opts_.sign_payload.value_or(scheme_ == "http");
    creds_.access_key_id = detail::env_or(opts_.access_key_id, {"AWS_ACCESS_KEY_ID"});
    creds_.secret_access_key = detail::env_or(opts_.secret_access_key, {"AWS_SECRET_ACCESS_KEY"});
    creds_.session_token = detail::env_or(opts_.session_token, {"AWS_SESSION_TOKEN"});
    opts_.secret_access_key.clear();  // one copy, in creds_
    STRATA_EXPECTS(!creds_.access_key_id.empty() && !creds_.secret_access_key.empty(), config_error,
                   "object_store_tier '{}': no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the "
                   "options)",
                   opts_.name);
    scope_.region = opts_.region;
    scope_.service = "s3";
    const std::size_t threads = opts_.hash_threads > 0 ? opts_.hash_threads : std::min<std::size_t>(4, online_cpus());
    hashers_ = std::make_unique<thread_pool>(threads, "strata-s3hash");
    client_ = std::make_unique<detail::http_client>(detail::http_client_options{
        .name = opts_.name, .max_connections = opts_.max_connections, .ca_file = opts_.ca_file,
        .verify_tls = opts_.verify_tls, .connect_timeout = opts_.connect_timeout,
        .stall_timeout = opts_.stall_timeout, .first_byte_timeout = opts_.first_byte_timeout, .direct_receive_min = opts_.direct_receive_min});
    list_existing();
  }

  object_store_tier(const object_store_tier&) = delete;
  object_store_tier& operator=(const object_store_tier&) = delete;

  /// Waits for every request in flight (aborts of failed uploads included), then closes.
  ~object_store_tier() {
    inflight_.wait_zero();
    hashers_.reset();
    client_.reset();
  }

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    try {
      const std::uint64_t end = validate_write(opts_.name, object, offset, bytes.size());
      auto op = std::make_shared<write_op>();
      op->object = std::string(object);
      {
        std::lock_guard lock(mutex_);
        const auto it = index_.find(object);
        op->existed = it != index_.end();
        op->old_size = op->existed ? it->second : 0;
        op->new_size = std::max(op->old_size, end);
        const std::uint64_t growth = op->new_size - op->old_size;
        if (growth > 0 && (used_ + growth > opts_.capacity || used_ + growth < used_))
          throw over_budget_error(opts_.name, object, offset, bytes.size(), used_ + growth, opts_.capacity);
        index_[op->object] = op->new_size;
        used_ += growth;
      }
      auto fut = op->promise.get_future();
      inflight_.add();
      write_meter_.begin();
      if (offset == 0 && end >= op->old_size) {
        upload(op, bytes);
      } else {
        patch(op, offset, bytes);
      }
      return fut;
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    try {
      validate_object_name(opts_.name, object);
      const auto size = this->size(object);
      check_read_range(opts_.name, object, offset, dst.size(), size);
      if (dst.empty()) return make_ready_completion();
      completion_promise promise;
      auto fut = promise.get_future();
      inflight_.add();
      read_meter_.begin();
      read_ranges(key_of(object), offset, dst, *size,
                  [this, p = std::move(promise), n = dst.size()](std::exception_ptr e) mutable {
                    read_meter_.end(e ? 0 : n);
                    p.complete(e);
                    inflight_.done();
                  });
      return fut;
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  /// Deletes an object of this tier (true), or reports it absent (false). Waits for the store.
  bool remove(std::string_view object) {
    validate_object_name(opts_.name, object);
    {
      std::lock_guard lock(mutex_);
      if (!index_.contains(object)) return false;
    }
    completion_promise promise;
    auto fut = promise.get_future();
    auto c = make_call("DELETE", "DELETE", key_of(object));
    c->done = [p = std::move(promise)](std::exception_ptr e, detail::http_response&&) mutable { p.complete(e); };
    issue(c);
    fut.get();
    std::lock_guard lock(mutex_);
    if (const auto it = index_.find(object); it != index_.end()) {
      used_ -= it->second;
      index_.erase(it);
    }
    return true;
  }

  /// Nothing to do: a write completes only once the store has confirmed it.
  void flush() {}

  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const {
    std::lock_guard lock(mutex_);
    if (const auto it = index_.find(object); it != index_.end()) return it->second;
    return std::nullopt;
  }
  [[nodiscard]] std::uint64_t capacity() const { return opts_.capacity; }
  [[nodiscard]] std::uint64_t used() const {
    std::lock_guard lock(mutex_);
    return used_;
  }
  [[nodiscard]] std::string_view name() const { return opts_.name; }
  /// Declared bandwidths where given, else those measured from the requests served so far.
  [[nodiscard]] tier_descriptor descriptor() const {
    return declared_or_measured(opts_.name, tier_kind::remote, opts_.read_bandwidth, opts_.write_bandwidth, read_meter_,
                                write_meter_);
  }

  /// The objects the tier holds (its writes, and what the listing at open found), sorted.
  [[nodiscard]] std::vector<std::string> objects() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> names;
    names.reserve(index_.size());
    for (const auto& [name, size] : index_) names.push_back(name);
    return names;
  }

  [[nodiscard]] object_store_stats stats() const {
    object_store_stats s;
    s.requests = client_->started();
    s.retries = retries_.load();
    s.puts = puts_.load();
    s.multipart_uploads = multipart_.load();
    s.parts = parts_.load();
    s.aborted_uploads = aborted_.load();
    s.gets = gets_.load();
    s.direct_gets = client_->direct_started();
    s.patches = patches_.load();
    s.patch_bytes_read = patch_bytes_read_.load();
    s.bytes_written = bytes_written_.load();
    s.bytes_read = bytes_read_.load();
    s.lists = lists_.load();
    return s;
  }

  /// The key that holds `object`: "<prefix><hh>/<object>".
  [[nodiscard]] std::string key_of(std::string_view object) const {
    const auto h = checksum64(std::as_bytes(std::span(object.data(), object.size())));
    return fmt::format("{}{:02x}/{}", opts_.prefix, h & 0xff, object);
  }
  /// The part size a whole-object upload of `bytes` uses: part_size, grown (in MiB steps) so
  /// that no object needs more than 10,000 parts.
  [[nodiscard]] std::uint64_t part_size_for(std::uint64_t bytes) const noexcept {
    const std::uint64_t need = (bytes + max_parts - 1) / max_parts;
    const std::uint64_t mib = 1ULL << 20;
    return std::max(opts_.part_size, (need + mib - 1) / mib * mib);
  }
  [[nodiscard]] const std::string& bucket() const noexcept { return opts_.bucket; }
  [[nodiscard]] const std::string& prefix() const noexcept { return opts_.prefix; }
  [[nodiscard]] const std::string& endpoint() const noexcept { return opts_.endpoint; }

  // ---- control objects: small objects at "<prefix><name>", beside the tier's objects and never
  // among them (no "<hh>/" in the key), written conditionally. strata's claim on the prefix
  // (tier/object_store_claim.hpp) is one. Each call waits for the store.

  /// Reads the control object `name` (nullopt: there is none), with its ETag and age (the
  /// store's Date minus its Last-Modified, so no clock of ours is compared with the store's).
  [[nodiscard]] std::optional<control_object> read_control(std::string_view name) {
    control_object o;
    const auto r = control_call("GET", name, {}, {});
    if (!r) return std::nullopt;
    o.body = r->body;
    if (const auto* e = r->header("etag")) o.etag = *e;
    const auto* date = r->header("date");
    const auto* modified = r->header("last-modified");
    const auto now = date != nullptr ? detail::parse_http_date(*date) : std::nullopt;
    const auto then = modified != nullptr ? detail::parse_http_date(*modified) : std::nullopt;
    if (now && then)
      o.age = std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(*now - *then));
    return o;
  }
  /// Creates the control object `name` only if there is none (If-None-Match: *): its ETag, or
  /// nullopt when one exists (412; 409 when another conditional write to it was in progress).
  [[nodiscard]] std::optional<std::string> create_control(std::string_view name, std::string_view body) {
    return conditional_put(name, body, {"if-none-match", "*"});
  }
  /// Replaces the control object `name` only if its ETag is still `etag` (If-Match): the new
  /// ETag, or nullopt when it changed or is gone.
  [[nodiscard]] std::optional<std::string> replace_control(std::string_view name, std::string_view body,
                                                           std::string_view etag) {
    return conditional_put(name, body, {"if-match", std::string(etag)});
  }
  /// Deletes the control object `name` if its ETag is still `etag` (true); false when the store
  /// refused (it changed, or is gone).
  bool remove_control(std::string_view name, std::string_view etag) {
    return control_call("DELETE", name, {}, {{"if-match", std::string(etag)}}).has_value();
  }

 private:
  using headers_t = std::vector<std::pair<std::string, std::string>>;

  // One S3 request with its retries.
  struct call {
    std::string operation;  // for messages: "PUT", "UPLOAD PART 3", ...
    std::string method;
    std::string key;  // empty: the bucket
    headers_t query;
    headers_t headers;
    std::span<const std::byte> body;
    std::string payload_sha256;
    std::span<std::byte> receive;
    std::function<std::string(const detail::http_response&)> check;  // a problem ("" if fine): retried
    unique_function<void(std::exception_ptr, detail::http_response&&)> done;
    unsigned attempts = 0;
    std::string shown;  // what messages name, when not the key (a listing names its prefix)
    // request_deadline from when the first attempt went out; max() until then (or with none)
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
    std::string earlier_failure;  // why the attempt before the last failed, for a deadline's message
  };

  struct write_op {
    std::string object;
    bool existed = false;
    std::uint64_t old_size = 0;
    std::uint64_t new_size = 0;
    std::vector<std::byte> buffer;  // a patched object's bytes
    completion_promise promise;
  };

  struct multipart {
    std::shared_ptr<write_op> op;
    std::span<const std::byte> data;
    std::string key;
    std::uint64_t part = 0;
    std::size_t count = 0;
    std::string upload_id;
    std::mutex mutex;
    std::vector<std::string> etags;
    std::vector<std::vector<unsigned char>> md5s;
    std::size_t remaining = 0;
    std::exception_ptr first_error;
    std::string complete_xml;
  };

  // A request on a control object: the answer, or nullopt for 404 and 412 (409: a concurrent
  // conditional write).
  std::optional<detail::http_response> control_call(const char* method, std::string_view name, std::string_view body,
                                                    headers_t headers) {
    STRATA_EXPECTS(is_object_name(name.starts_with('.') ? name.substr(1) : name), config_error,
                   "tier '{}': invalid control object name '{}'", opts_.name, name);
    completion_promise promise;
    auto fut = promise.get_future();
    detail::http_response answer;
    auto c = make_call(fmt::format("{} (control object)", method), method, opts_.prefix + std::string(name));
    c->body = std::as_bytes(std::span(body.data(), body.size()));
    if (!body.empty()) c->payload_sha256 = detail::sha256_hex(c->body);
    c->headers = std::move(headers);
    c->done = [&answer, p = std::move(promise)](std::exception_ptr e, detail::http_response&& r) mutable {
      if (!e) answer = std::move(r);
      p.complete(e);
    };
    issue(c);
    try {
      fut.get();
    } catch (const remote_error& e) {
      if (e.http_status() == 404 || e.http_status() == 412 || e.http_status() == 409) return std::nullopt;
      throw;
    }
    return answer;
  }

  std::optional<std::string> conditional_put(std::string_view name, std::string_view body,
                                             std::pair<std::string, std::string> condition) {
    const auto r = control_call("PUT", name, body, {std::move(condition)});
    if (!r) return std::nullopt;
    if (const auto* e = r->header("etag"); e != nullptr && !e->empty()) return *e;
    // A single PUT's ETag is the MD5 of its body (a store that does not say it).
    detail::evp_hasher md5(::EVP_md5());
    md5.update(std::as_bytes(std::span(body.data(), body.size())));
    return fmt::format("\"{}\"", detail::sigv4_detail::to_hex(md5.final_bytes()));
  }

  static constexpr std::string_view empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

  void parse_endpoint() {
    const std::string& e = opts_.endpoint;
    const auto sep = e.find("://");
    STRATA_EXPECTS(sep != std::string::npos, config_error, "object_store_tier '{}': endpoint '{}' has no scheme",
                   opts_.name, e);
    scheme_ = e.substr(0, sep);
    STRATA_EXPECTS(scheme_ == "http" || scheme_ == "https", config_error,
                   "object_store_tier '{}': endpoint '{}' is not http:// or https://", opts_.name, e);
    std::string authority = e.substr(sep + 3);
    if (const auto slash = authority.find('/'); slash != std::string::npos) {
      STRATA_EXPECTS(authority.find_first_not_of('/', slash) == std::string::npos, config_error,
                     "object_store_tier '{}': endpoint '{}' has a path; give the bucket and prefix as options",
                     opts_.name, e);
      authority.resize(slash);
    }
    // curl leaves a default port out of the Host header; so must the signature.
    if (scheme_ == "http" && authority.ends_with(":80")) authority.resize(authority.size() - 3);
    if (scheme_ == "https" && authority.ends_with(":443")) authority.resize(authority.size() - 4);
    STRATA_EXPECTS(!authority.empty(), config_error, "object_store_tier '{}': endpoint '{}' has no host", opts_.name, e);
    host_ = path_style_ ? authority : fmt::format("{}.{}", opts_.bucket, authority);
  }

  // The endpoint as messages name it: scheme and authority, no trailing '/'.
  [[nodiscard]] std::string shown_endpoint() const {
    std::string_view e = opts_.endpoint;
    while (e.ends_with('/')) e.remove_suffix(1);
    return std::string(e);
  }

  [[nodiscard]] std::string display_key(std::string_view key) const {
    return fmt::format("s3://{}/{}", opts_.bucket, key);
  }

  std::shared_ptr<call> make_call(std::string operation, std::string method, std::string key) {
    auto c = std::make_shared<call>();
    c->operation = std::move(operation);
    c->method = std::move(method);
    c->key = std::move(key);
    c->payload_sha256 = std::string(empty_sha256);
    return c;
  }

  // Signs (again, for a retry: the date moves) and sends.
  void issue(const std::shared_ptr<call>& c, std::chrono::steady_clock::time_point not_before = {}) {
    detail::http_request req;
    try {
      detail::sigv4_request s;
      s.method = c->method;
      s.host = host_;
      s.path = path_style_ ? fmt::format("/{}/{}", opts_.bucket, c->key) : fmt::format("/{}", c->key);
      if (path_style_ && c->key.empty()) s.path = fmt::format("/{}", opts_.bucket);
      s.query = c->query;
      s.headers = c->headers;
      s.payload_sha256 = c->payload_sha256;
      auto signed_headers = detail::sigv4_sign(s, creds_, scope_, std::chrono::system_clock::now());
      req.method = c->method;
      req.url = fmt::format("{}://{}{}", scheme_, host_, detail::uri_encode(s.path, false));
      if (!c->query.empty()) req.url += "?" + detail::sigv4_canonical_query(c->query);
      req.headers = c->headers;
      req.headers.emplace_back("host", host_);
      for (auto& h : signed_headers) req.headers.push_back(std::move(h));
      req.body = c->body;
      req.receive = c->receive;
      req.not_before = not_before;
      req.deadline = c->deadline;
      if (c->deadline == std::chrono::steady_clock::time_point::max()) req.time_limit = opts_.request_deadline;
    } catch (...) {
      c->done(std::current_exception(), {});
      return;
    }
    client_->submit(std::move(req), [this, c](detail::http_response&& r) { on_response(c, std::move(r)); });
  }

  void on_response(const std::shared_ptr<call>& c, detail::http_response&& r) noexcept {
    try {
      ++c->attempts;
      const auto now = std::chrono::steady_clock::now();
      if (c->deadline == std::chrono::steady_clock::time_point::max() && opts_.request_deadline.count() > 0)
        c->deadline = r.deadline != std::chrono::steady_clock::time_point::max() ? r.deadline : now + opts_.request_deadline;
      remote_error::info info;
      info.operation = c->operation;
      info.key = c->shown.empty() ? display_key(c->key) : c->shown;
      info.endpoint = shown_endpoint();
      info.attempts = c->attempts;
      info.http_status = r.transport_code == 0 ? r.status : 0;
      bool retry = false;
      if (r.transport_code != 0) {
        info.message = r.transport_error;
        // A body longer than the range asked for was cut off: say what was wrong with the answer.
        if (r.overflow && c->check) {
          info.http_status = r.status;
          if (auto problem = c->check(r); !problem.empty()) info.message = std::move(problem);
        }
        retry = true;
      } else if (r.status >= 200 && r.status < 300) {
        std::string problem = c->check ? c->check(r) : std::string();
        if (problem.empty()) {
          c->done(nullptr, std::move(r));
          return;
        }
        info.message = std::move(problem);
        retry = true;
      } else {
        info.code = detail::xml_text(r.body, "Code").value_or("");
        info.message = detail::xml_text(r.body, "Message").value_or("");
        info.request_id = detail::xml_text(r.body, "RequestId").value_or("");
        if (info.request_id.empty())
          if (const auto* id = r.header("x-amz-request-id")) info.request_id = *id;
        retry = r.status >= 500 || r.status == 429 || info.code == "SlowDown" || info.code == "RequestTimeout";
      }
      if (const auto* id = r.header("x-amz-request-id"); id != nullptr && info.request_id.empty()) info.request_id = *id;
      if (r.deadline_passed) {
        info.message = fmt::format("request_deadline {} ran out (it bounds all attempts together): {}",
                                   detail::format_timeout(opts_.request_deadline), info.message);
        if (!c->earlier_failure.empty()) info.message += fmt::format("; the attempt before: {}", c->earlier_failure);
      } else if (retry && c->attempts <= opts_.max_retries) {
        const auto wait = backoff(c->attempts, r);
        if (now + wait < c->deadline) {
          retries_.fetch_add(1, std::memory_order_relaxed);
          c->earlier_failure = info.http_status != 0 ? fmt::format("HTTP {}{}{}", info.http_status, info.code.empty() ? "" : " ", info.code)
                                                     : info.message;
          issue(c, now + wait);
          return;
        }
        info.message += fmt::format("; no time left for another attempt within request_deadline {} ({} gone, the next "
                                    "would start {} later)",
                                    detail::format_timeout(opts_.request_deadline),
                                    detail::format_elapsed(now - (c->deadline - opts_.request_deadline)),
                                    detail::format_elapsed(wait));
      }
      c->done(std::make_exception_ptr(remote_error(std::move(info))), std::move(r));
    } catch (...) {
      c->done(std::current_exception(), {});
    }
  }

  // Full jitter: uniform in [0, min(cap, base * 2^attempt)]; never sooner than Retry-After.
  std::chrono::milliseconds backoff(unsigned attempt, const detail::http_response& r) {
    const double ceiling = std::min<double>(static_cast<double>(opts_.retry_cap.count()),
                                            static_cast<double>(opts_.retry_base.count()) * std::ldexp(1.0, static_cast<int>(std::min(attempt, 30U))));
    double ms = 0;
    {
      std::lock_guard lock(rng_mutex_);
      ms = std::uniform_real_distribution<double>(0, ceiling)(rng_);
    }
    if (const auto* ra = r.header("retry-after")) {
      char* end = nullptr;
      const double s = std::strtod(ra->c_str(), &end);
      if (end != ra->c_str() && s > 0) ms = std::max(ms, std::min(s, 60.0) * 1000.0);
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
  }

  // ---- writes --------------------------------------------------------------------------------

  void finish_write(const std::shared_ptr<write_op>& op, std::exception_ptr e) noexcept {
    if (e) {
      // The store keeps the object it had (a PUT or a completed upload replaces it at once).
      std::lock_guard lock(mutex_);
      const auto it = index_.find(op->object);
      if (it != index_.end()) {
        used_ -= it->second;
        if (op->existed) {
          it->second = op->old_size;
          used_ += op->old_size;
        } else {
          index_.erase(it);
        }
      }
    }
    write_meter_.end(e ? 0 : op->new_size);
    op->promise.complete(e);
    inflight_.done();
  }

  void upload(const std::shared_ptr<write_op>& op, std::span<const std::byte> data) {
    if (data.size() <= opts_.part_size) {
      hash_then(data, [this, op, data](std::exception_ptr e, detail::payload_digests d) {
        if (e) return finish_write(op, e);
        auto c = make_call("PUT", "PUT", key_of(op->object));
        c->body = data;
        c->payload_sha256 = std::move(d.sha256_hex);
        c->check = etag_check(std::move(d.md5));
        c->done = [this, op, n = data.size()](std::exception_ptr e2, detail::http_response&&) {
          if (!e2) {
            puts_.fetch_add(1, std::memory_order_relaxed);
            bytes_written_.fetch_add(n, std::memory_order_relaxed);
          }
          finish_write(op, e2);
        };
        issue(c);
      });
      return;
    }
    auto mp = std::make_shared<multipart>();
    mp->op = op;
    mp->data = data;
    mp->key = key_of(op->object);
    mp->part = part_size_for(data.size());
    mp->count = static_cast<std::size_t>((data.size() + mp->part - 1) / mp->part);
    mp->etags.resize(mp->count);
    mp->md5s.resize(mp->count);
    mp->remaining = mp->count;
    auto c = make_call("CREATE MULTIPART UPLOAD", "POST", mp->key);
    c->query = {{"uploads", ""}};
    c->check = [](const detail::http_response& r) -> std::string {
      return detail::xml_text(r.body, "UploadId") ? "" : "the answer names no UploadId";
    };
    c->done = [this, mp](std::exception_ptr e, detail::http_response&& r) {
      if (e) return finish_write(mp->op, e);
      mp->upload_id = *detail::xml_text(r.body, "UploadId");
      for (std::size_t i = 0; i < mp->count; ++i) upload_part(mp, i);
    };
    issue(c);
  }

  void upload_part(const std::shared_ptr<multipart>& mp, std::size_t i) {
    const std::uint64_t from = i * mp->part;
    const auto piece = mp->data.subspan(from, std::min<std::uint64_t>(mp->part, mp->data.size() - from));
    hash_then(piece, [this, mp, i, piece](std::exception_ptr e, detail::payload_digests d) {
      if (e) return part_done(mp, i, e, {});
      auto c = make_call(fmt::format("UPLOAD PART {}", i + 1), "PUT", mp->key);
      c->query = {{"partNumber", std::to_string(i + 1)}, {"uploadId", mp->upload_id}};
      c->body = piece;
      c->payload_sha256 = std::move(d.sha256_hex);
      mp->md5s[i] = d.md5;  // each part writes its own element
      c->check = etag_check(std::move(d.md5));
      c->done = [this, mp, i, n = piece.size()](std::exception_ptr e2, detail::http_response&& r) {
        std::string etag;
        if (!e2) {
          if (const auto* t = r.header("etag")) etag = *t;
          parts_.fetch_add(1, std::memory_order_relaxed);
          bytes_written_.fetch_add(n, std::memory_order_relaxed);
        }
        part_done(mp, i, e2, std::move(etag));
      };
      issue(c);
    });
  }

  void part_done(const std::shared_ptr<multipart>& mp, std::size_t i, std::exception_ptr e, std::string etag) {
    bool last = false;
    {
      std::lock_guard lock(mp->mutex);
      if (e && !mp->first_error) mp->first_error = e;
      if (!e) mp->etags[i] = std::move(etag);
      last = --mp->remaining == 0;
    }
    if (!last) return;
    if (mp->first_error) {
      abort_upload(mp);
      return finish_write(mp->op, mp->first_error);
    }
    std::string xml = "<CompleteMultipartUpload>";
    for (std::size_t p = 0; p < mp->count; ++p)
      xml += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", p + 1,
                         detail::xml_escape(mp->etags[p]));
    xml += "</CompleteMultipartUpload>";
    mp->complete_xml = std::move(xml);
    // The ETag of a multipart object is the MD5 of its parts' MD5s, then "-<parts>".
    std::vector<unsigned char> all;
    for (const auto& m : mp->md5s) all.insert(all.end(), m.begin(), m.end());
    std::string expect;
    if (opts_.verify_etag) {
      detail::evp_hasher md5(::EVP_md5());
      md5.update(std::as_bytes(std::span(all)));
      expect = fmt::format("\"{}-{}\"", detail::sigv4_detail::to_hex(md5.final_bytes()), mp->count);
    }
    const auto body = std::as_bytes(std::span(mp->complete_xml.data(), mp->complete_xml.size()));
    auto c = make_call("COMPLETE MULTIPART UPLOAD", "POST", mp->key);
    c->query = {{"uploadId", mp->upload_id}};
    c->body = body;
    c->payload_sha256 = detail::sha256_hex(body);
    c->headers = {{"content-type", "application/xml"}};
    // S3 may answer 200 and put an error in the body of a completion.
    c->check = [expect](const detail::http_response& r) -> std::string {
      if (r.body.find("<Error>") != std::string::npos)
        return fmt::format("the completion failed: {} {}", detail::xml_text(r.body, "Code").value_or("?"),
                           detail::xml_text(r.body, "Message").value_or(""));
      if (r.body.find("CompleteMultipartUploadResult") == std::string::npos) return "the completion was not confirmed";
      const auto got = detail::xml_text(r.body, "ETag");
      if (!expect.empty() && got && *got != expect)
        return fmt::format("the object's ETag {} is not {}, the one its parts give", *got, expect);
      return "";
    };
    c->done = [this, mp](std::exception_ptr e2, detail::http_response&&) {
      if (e2) {
        abort_upload(mp);
      } else {
        multipart_.fetch_add(1, std::memory_order_relaxed);
      }
      finish_write(mp->op, e2);
    };
    issue(c);
  }

  // Aborts a failed upload so its parts do not linger (and cost). Best effort, but awaited by
  // the destructor; a failure is reported as a notice naming the key and the upload.
  void abort_upload(const std::shared_ptr<multipart>& mp) noexcept {
    if (mp->upload_id.empty()) return;
    try {
      inflight_.add();
      auto c = make_call("ABORT MULTIPART UPLOAD", "DELETE", mp->key);
      c->query = {{"uploadId", mp->upload_id}};
      c->done = [this, mp](std::exception_ptr e, detail::http_response&&) {
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& ex) {
            notice(fmt::format("tier '{}': could not abort upload {} of {}: {}", opts_.name, mp->upload_id,
                               display_key(mp->key), ex.what()));
          }
        } else {
          aborted_.fetch_add(1, std::memory_order_relaxed);
        }
        inflight_.done();
      };
      issue(c);
    } catch (...) {
      inflight_.done();
    }
  }

  std::function<std::string(const detail::http_response&)> etag_check(std::vector<unsigned char> md5) const {
    if (!opts_.verify_etag) return {};
    return [expect = fmt::format("\"{}\"", detail::sigv4_detail::to_hex(md5))](const detail::http_response& r) -> std::string {
      const auto* etag = r.header("etag");
      if (etag == nullptr) return "the answer has no ETag";
      if (*etag != expect) return fmt::format("ETag {} is not {}, the MD5 of the bytes sent", *etag, expect);
      return "";
    };
  }

  // A write that does not cover [0, end of object): read what stays, patch, upload it all.
  void patch(const std::shared_ptr<write_op>& op, std::uint64_t offset, std::span<const std::byte> bytes) {
    patches_.fetch_add(1, std::memory_order_relaxed);
    op->buffer.assign(op->new_size, std::byte{0});
    std::memcpy(op->buffer.data() + offset, bytes.data(), bytes.size());
    const std::uint64_t end = offset + bytes.size();
    // What the old object keeps: [0, min(offset, old)) and [end, old).
    std::vector<std::pair<std::uint64_t, std::uint64_t>> keep;
    if (offset > 0 && op->old_size > 0) keep.emplace_back(0, std::min(offset, op->old_size));
    if (end < op->old_size) keep.emplace_back(end, op->old_size - end);
    if (keep.empty()) return upload(op, std::span<const std::byte>(op->buffer));
    struct join {
      std::mutex mutex;
      std::size_t remaining = 0;
      std::exception_ptr first;
    };
    auto j = std::make_shared<join>();
    j->remaining = keep.size();
    const std::string key = key_of(op->object);
    for (const auto& [from, len] : keep) {
      patch_bytes_read_.fetch_add(len, std::memory_order_relaxed);
      read_ranges(key, from, std::span(op->buffer).subspan(from, len), op->old_size,
                  [this, op, j](std::exception_ptr e) {
                    bool last = false;
                    {
                      std::lock_guard lock(j->mutex);
                      if (e && !j->first) j->first = e;
                      last = --j->remaining == 0;
                    }
                    if (!last) return;
                    if (j->first) return finish_write(op, j->first);
                    upload(op, std::span<const std::byte>(op->buffer));
                  });
    }
  }

  // Hashes on the pool, then goes on there (signing and queueing are quick).
  template <class Then>
  void hash_then(std::span<const std::byte> data, Then then) {
    try {
      (void)hashers_->submit([this, data, then = std::move(then)]() mutable noexcept {
        detail::payload_digests d;
        try {
          d = detail::digest_payload(data, sign_payload_, opts_.verify_etag);
        } catch (...) {
          then(std::current_exception(), {});
          return;
        }
        then(nullptr, std::move(d));
      });
    } catch (...) {
      then(std::current_exception(), {});
    }
  }

  // ---- reads ---------------------------------------------------------------------------------

  // Part-aligned ranged GETs of [offset, offset + dst.size()) of `key`, whose size must be
  // `total`; `done` runs once, after every GET ended.
  void read_ranges(const std::string& key, std::uint64_t offset, std::span<std::byte> dst, std::uint64_t total,
                   unique_function<void(std::exception_ptr)> done) {
    struct join {
      std::mutex mutex;
      std::size_t remaining = 0;
      std::exception_ptr first;
      unique_function<void(std::exception_ptr)> done;
    };
    auto j = std::make_shared<join>();
    j->done = std::move(done);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (std::uint64_t pos = offset, end = offset + dst.size(); pos < end;) {
      const std::uint64_t next = std::min(end, (pos / opts_.part_size + 1) * opts_.part_size);
      ranges.emplace_back(pos, next - pos);
      pos = next;
    }
    j->remaining = ranges.size();
    for (const auto& [from, len] : ranges) {
      auto c = make_call("GET", "GET", key);
      const std::uint64_t last = from + len - 1;
      c->headers = {{"range", fmt::format("bytes={}-{}", from, last)}};
      c->receive = dst.subspan(from - offset, len);
      c->check = [want = fmt::format("bytes {}-{}/{}", from, last, total), from, last,
                  len](const detail::http_response& r) -> std::string {
        if (r.status != 206) return fmt::format("answered {} to a GET of bytes {}-{}, not 206", r.status, from, last);
        const auto* cr = r.header("content-range");
        if (cr == nullptr) return "a ranged GET came without Content-Range";
        if (*cr != want) return fmt::format("Content-Range '{}' does not match '{}'", *cr, want);
        if (r.received != len) return fmt::format("{} bytes came for a range of {}", r.received, len);
        return "";
      };
      c->done = [this, j, len](std::exception_ptr e, detail::http_response&&) {
        if (!e) {
          gets_.fetch_add(1, std::memory_order_relaxed);
          bytes_read_.fetch_add(len, std::memory_order_relaxed);
        }
        bool end = false;
        {
          std::lock_guard lock(j->mutex);
          if (e && !j->first) j->first = e;
          end = --j->remaining == 0;
        }
        if (end) j->done(j->first);
      };
      issue(c);
    }
  }

  // ---- the index -----------------------------------------------------------------------------

  // One listing of the prefix (all pages) fills the index with the objects of earlier runs.
  void list_existing() {
    std::string token;
    for (;;) {
      completion_promise promise;
      auto fut = promise.get_future();
      std::string body;
      auto c = make_call("LIST", "GET", "");
      c->shown = display_key(opts_.prefix);
      c->query = {{"list-type", "2"}, {"prefix", opts_.prefix}, {"max-keys", std::to_string(opts_.list_page_size)}};
      if (!token.empty()) c->query.emplace_back("continuation-token", token);
      c->check = [](const detail::http_response& r) -> std::string {
        return r.body.find("<ListBucketResult") == std::string::npos ? "the answer is not a ListBucketResult" : "";
      };
      c->done = [&body, p = std::move(promise)](std::exception_ptr e, detail::http_response&& r) mutable {
        if (!e) body = std::move(r.body);
        p.complete(e);
      };
      issue(c);
      fut.get();
      lists_.fetch_add(1, std::memory_order_relaxed);
      for (std::size_t at = body.find("<Contents>"); at != std::string::npos; at = body.find("<Contents>", at + 1)) {
        const auto end = body.find("</Contents>", at);
        const std::string_view entry = std::string_view(body).substr(at, end == std::string::npos ? std::string::npos : end - at);
        const auto key = detail::xml_text(entry, "Key");
        const auto size = detail::xml_text(entry, "Size");
        if (!key || !size || !key->starts_with(opts_.prefix)) continue;
        const std::string_view rest = std::string_view(*key).substr(opts_.prefix.size());
        if (rest.size() < 4 || rest[2] != '/') continue;
        const std::string object(rest.substr(3));
        if (!is_object_name(object) || key_of(object) != *key) continue;  // not one of ours
        const std::uint64_t n = std::strtoull(size->c_str(), nullptr, 10);
        index_[object] = n;
        used_ += n;
      }
      if (detail::xml_text(body, "IsTruncated").value_or("false") != "true") break;
      token = detail::xml_text(body, "NextContinuationToken").value_or("");
      STRATA_EXPECTS(!token.empty(), error, "tier '{}': a truncated listing of {} has no continuation token", opts_.name,
                     display_key(opts_.prefix));
    }
  }

  object_store_options opts_;
  detail::aws_credentials creds_;
  detail::sigv4_scope scope_;
  std::string scheme_;
  std::string host_;
  bool path_style_ = true;
  bool sign_payload_ = true;
  mutable std::mutex mutex_;
  std::map<std::string, std::uint64_t, std::less<>> index_;
  std::uint64_t used_ = 0;
  std::mutex rng_mutex_;
  std::mt19937_64 rng_{std::random_device{}()};
  throughput_meter read_meter_;
  throughput_meter write_meter_;
  std::atomic<std::uint64_t> retries_{0}, puts_{0}, multipart_{0}, parts_{0}, aborted_{0}, gets_{0}, patches_{0},
      patch_bytes_read_{0}, bytes_written_{0}, bytes_read_{0}, lists_{0};
  detail::inflight_counter inflight_;
  std::unique_ptr<thread_pool> hashers_;
  std::unique_ptr<detail::http_client> client_;
};

static_assert(tier<object_store_tier>);

}  // namespace strata

#endif  // STRATA_HAS_S3
