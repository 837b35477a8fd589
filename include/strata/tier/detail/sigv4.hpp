#pragma once
/// AWS Signature Version 4 (header-based authorization), our own signer: SHA-256 and HMAC-SHA256
/// come from OpenSSL's libcrypto. We do not use curl's CURLOPT_AWS_SIGV4: curl 7.88 (Debian 12)
/// signs query strings and empty-valued parameters wrongly.
///
/// Checked against AWS's published SigV4 test suite and the S3 single-chunk examples
/// (tests/s3/sigv4_test.cpp). The secret access key is used only to derive the signing key; it is
/// never put into a header, a message or an exception, and the buffers that held it or keys
/// derived from it are wiped (OPENSSL_cleanse) after use.
///
/// Every function here is thread-safe (no shared state); one sha256_hasher is used by one thread
/// at a time.

#include "strata/core/config.hpp"

#if STRATA_HAS_S3

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata::detail {

/// Credentials to sign with.
struct aws_credentials {
  std::string access_key_id;
  std::string secret_access_key;  ///< never put into any message, exception, or log
  std::string session_token;      ///< empty: none
};

/// One request to sign. Nothing in it is encoded: the signer encodes what it signs, and the
/// caller sends the same path and query encoded the same way (uri_encode).
struct sigv4_request {
  std::string method;                                         ///< "GET", "PUT", ...
  std::string host;                                           ///< the Host header value (with ":port" when not default)
  std::string path;                                           ///< the URI path, not encoded, e.g. "/bucket/dir/key"
  std::vector<std::pair<std::string, std::string>> query;    ///< not encoded; any order; values may be empty
  std::vector<std::pair<std::string, std::string>> headers;  ///< further headers to sign and send; any case
  std::string payload_sha256;                                 ///< lowercase hex of the body, or "UNSIGNED-PAYLOAD"
};

/// The credential scope's region and service.
struct sigv4_scope {
  std::string region;
  std::string service = "s3";
};

/// How the path becomes the canonical URI.
/// - s3: each path segment URI-encoded once, '/' kept, no normalisation (S3 object keys may hold
///   "//", "." and ".." segments, and S3 signs them as they are).
/// - generic: AWS's rules for the other services: the path is normalised ("." and ".." segments
///   and duplicate slashes removed), then each segment is URI-encoded. AWS words this as
///   "encode twice", counting the encoding the HTTP layer applies to the path on the wire; from an
///   unencoded path, as here, the published test suite expects one encoding ("/" U+1234 ->
///   "/%E1%88%B4", "/example space/" -> "/example%20space/", "$" -> "%24"), and so do we.
enum class sigv4_path_style { s3, generic };

namespace sigv4_detail {

inline constexpr std::string_view algorithm = "AWS4-HMAC-SHA256";
inline constexpr std::string_view unsigned_payload = "UNSIGNED-PAYLOAD";
inline constexpr std::size_t digest_size = 32;  // SHA-256
using digest = std::array<unsigned char, digest_size>;

/// The earliest error on this thread's OpenSSL error queue, as text; the queue is cleared.
inline std::string openssl_error_text() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no OpenSSL error recorded";
  std::array<char, 256> text{};
  ERR_error_string_n(code, text.data(), text.size());
  return text.data();
}

/// Throws strata::error naming the OpenSSL call that failed (never its arguments).
[[noreturn]] inline void openssl_failed(std::string_view call) {
  throw strata::error(fmt::format("sigv4: OpenSSL {} failed: {}", call, openssl_error_text()));
}

inline const EVP_MD* sha256_md() {
  const EVP_MD* md = EVP_sha256();
  if (md == nullptr) openssl_failed("EVP_sha256");
  return md;
}

inline std::string to_hex(std::span<const unsigned char> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const unsigned char b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 0xF]);
  }
  return out;
}

/// Wipes what it holds when it goes: key material.
template <class Bytes>
struct wiped {
  Bytes bytes{};
  wiped() = default;
  wiped(const wiped&) = delete;
  wiped& operator=(const wiped&) = delete;
  ~wiped() {
    if (!bytes.empty()) OPENSSL_cleanse(bytes.data(), bytes.size());
  }
};

inline digest hmac_sha256(std::span<const unsigned char> key, std::string_view data) {
  STRATA_EXPECTS(key.size() <= static_cast<std::size_t>(INT_MAX), strata::config_error,
                 "sigv4: a signing key of {} bytes is too long", key.size());
  digest out{};
  unsigned int len = 0;
  if (HMAC(sha256_md(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len) == nullptr)
    openssl_failed("HMAC");
  if (len != out.size()) throw strata::error(fmt::format("sigv4: OpenSSL HMAC returned {} bytes, not 32", len));
  return out;
}

/// RFC 3986 unreserved: A-Z a-z 0-9 - . _ ~
constexpr bool is_unreserved(unsigned char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

/// RFC 7230 token characters (header names, methods).
constexpr bool is_tchar(unsigned char c) noexcept {
  if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

constexpr bool is_token(std::string_view s) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); });
}

/// No whitespace, no control characters, no '/': fits in a credential scope or a Host value.
constexpr bool is_plain(std::string_view s, bool allow_slash) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(), [&](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c > 0x20 && c != 0x7F && c != ',' && (allow_slash || c != '/');
  });
}

constexpr char lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

inline std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), lower);
  return out;
}

/// A header value as signed: leading and trailing blanks removed, each inner run of blanks one
/// space. CR and LF are refused (they would split the header when sent).
inline std::string canonical_header_value(std::string_view name, std::string_view value) {
  std::string out;
  out.reserve(value.size());
  bool pending_space = false;
  for (const char c : value) {
    STRATA_EXPECTS(c != '\r' && c != '\n' && c != '\0', strata::config_error,
                   "sigv4: the value of header '{}' holds a CR, LF or NUL character", name);
    if (c == ' ' || c == '\t') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

inline bool is_lower_hex_sha256(std::string_view s) noexcept {
  return s.size() == 2 * digest_size &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// "20150830T123600Z": 8 digits, 'T', 6 digits, 'Z'.
inline bool is_amz_date(std::string_view s) noexcept {
  if (s.size() != 16 || s[8] != 'T' || s[15] != 'Z') return false;
  for (std::size_t i = 0; i < 15; ++i) {
    if (i == 8) continue;
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

/// The path with "." and ".." segments and empty segments (duplicate slashes) removed; a trailing
/// slash is kept, as in RFC 3986's remove_dot_segments.
inline std::string normalized_path(std::string_view path) {
  std::vector<std::string_view> kept;
  bool trailing_slash = false;
  std::size_t pos = 0;
  while (pos <= path.size()) {
    const std::size_t end = std::min(path.find('/', pos), path.size());
    const std::string_view segment = path.substr(pos, end - pos);
    const bool last = end == path.size();
    if (segment == "..") {
      if (!kept.empty()) kept.pop_back();
      trailing_slash = last;
    } else if (segment == ".") {
      trailing_slash = last;
    } else if (segment.empty()) {
      trailing_slash = last;
    } else {
      kept.push_back(segment);
      trailing_slash = false;
    }
    pos = end + 1;
  }
  std::string out = "/";
  for (std::size_t i = 0; i < kept.size(); ++i) {
    if (i > 0) out += '/';
    out += kept[i];
  }
  if (trailing_slash && !kept.empty()) out += '/';
  return out;
}

/// The canonical request and its signed-header list ("host;x-amz-date").
struct canonical_form {
  std::string request;
  std::string signed_headers;
};

}  // namespace sigv4_detail

/// An incremental digest of libcrypto (SHA-256 by default; the object-store tier also takes
/// MD5 for ETags): update() any number of times, then final_bytes() or hex_final(), after which
/// the hasher starts afresh. Movable, not copyable; a moved-from hasher may only be destroyed or
/// assigned to.
class evp_hasher {
 public:
  explicit evp_hasher(const EVP_MD* md = sigv4_detail::sha256_md()) : md_(md), ctx_(EVP_MD_CTX_new()) {
    if (!ctx_) sigv4_detail::openssl_failed("EVP_MD_CTX_new");
    init();
  }

  /// Adds `data` to the bytes hashed.
  void update(std::span<const std::byte> data) {
    STRATA_ASSERT(ctx_ != nullptr);
    if (data.empty()) return;
    if (EVP_DigestUpdate(ctx_.get(), data.data(), data.size()) != 1) sigv4_detail::openssl_failed("EVP_DigestUpdate");
  }
  void update(std::string_view data) { update(std::as_bytes(std::span(data.data(), data.size()))); }

  /// The digest of every byte added since construction or the last final; the hasher is reset.
  [[nodiscard]] std::vector<unsigned char> final_bytes() {
    STRATA_ASSERT(ctx_ != nullptr);
    std::vector<unsigned char> out(EVP_MAX_MD_SIZE);
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), out.data(), &len) != 1) sigv4_detail::openssl_failed("EVP_DigestFinal_ex");
    out.resize(len);
    init();
    return out;
  }
  /// The same as lowercase hex digits (64 for SHA-256).
  [[nodiscard]] std::string hex_final() { return sigv4_detail::to_hex(final_bytes()); }

 private:
  void init() {
    if (EVP_DigestInit_ex(ctx_.get(), md_, nullptr) != 1) sigv4_detail::openssl_failed("EVP_DigestInit_ex");
  }
  struct ctx_free {
    void operator()(EVP_MD_CTX* ctx) const noexcept { EVP_MD_CTX_free(ctx); }
  };
  const EVP_MD* md_;
  std::unique_ptr<EVP_MD_CTX, ctx_free> ctx_;
};

/// Incremental SHA-256, as 64 lowercase hex digits (see evp_hasher).
class sha256_hasher : public evp_hasher {
 public:
  sha256_hasher() : evp_hasher(sigv4_detail::sha256_md()) {}
};

/// SHA-256 of `data` as 64 lowercase hex digits.
[[nodiscard]] inline std::string sha256_hex(std::span<const std::byte> data) {
  sigv4_detail::digest out{};
  unsigned int len = 0;
  // EVP_Digest wants a non-null pointer even for no bytes.
  static constexpr unsigned char none = 0;
  const void* p = data.empty() ? static_cast<const void*>(&none) : static_cast<const void*>(data.data());
  if (EVP_Digest(p, data.size(), out.data(), &len, sigv4_detail::sha256_md(), nullptr) != 1)
    sigv4_detail::openssl_failed("EVP_Digest");
  if (len != out.size()) throw strata::error(fmt::format("sigv4: OpenSSL EVP_Digest returned {} bytes, not 32", len));
  return sigv4_detail::to_hex(out);
}
[[nodiscard]] inline std::string sha256_hex(std::string_view data) {
  return sha256_hex(std::as_bytes(std::span(data.data(), data.size())));
}

/// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters (A-Z a-z 0-9 - . _ ~) are
/// kept, every other byte becomes %XX with uppercase hex; '/' is kept unless `encode_slash`.
[[nodiscard]] inline std::string uri_encode(std::string_view s, bool encode_slash) {
  static constexpr char digits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (sigv4_detail::is_unreserved(c) || (c == '/' && !encode_slash)) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(digits[c >> 4]);
      out.push_back(digits[c & 0xF]);
    }
  }
  return out;
}

/// "20150830T123600Z": the UTC date and time of `t`, to the second (rounded down).
[[nodiscard]] inline std::string amz_date(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto secs = floor<seconds>(t);
  const auto day = floor<days>(secs);
  const year_month_day ymd{day};
  const hh_mm_ss<seconds> hms{secs - day};
  const int year = static_cast<int>(ymd.year());
  STRATA_EXPECTS(year >= 0 && year <= 9999, strata::config_error,
                 "sigv4: the signing time's year {} has no four-digit form", year);
  return fmt::format("{:04}{:02}{:02}T{:02}{:02}{:02}Z", year, static_cast<unsigned>(ymd.month()),
                     static_cast<unsigned>(ymd.day()), hms.hours().count(), hms.minutes().count(),
                     hms.seconds().count());
}

/// The canonical query string: names and values URI-encoded, sorted, "name=value" joined by
/// '&' (an empty value gives "name="). The URL sent must carry the query in exactly this form.
[[nodiscard]] inline std::string sigv4_canonical_query(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> params;
  params.reserve(query.size());
  for (const auto& [name, value] : query) {
    STRATA_EXPECTS(!name.empty(), strata::config_error, "sigv4: a query parameter has an empty name");
    params.emplace_back(uri_encode(name, true), uri_encode(value, true));
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out += '&';
    out += name;
    out += '=';
    out += value;
  }
  return out;
}

namespace sigv4_detail {

inline canonical_form canonicalize(const sigv4_request& req, std::string_view amz_date_text,
                                   const std::vector<std::pair<std::string, std::string>>& extra_signed_headers,
                                   sigv4_path_style style) {
  STRATA_EXPECTS(is_token(req.method), strata::config_error, "sigv4: '{}' is not an HTTP method", req.method);
  STRATA_EXPECTS(is_plain(req.host, false), strata::config_error,
                 "sigv4: the host '{}' is empty or holds whitespace, a control character, ',' or '/'", req.host);
  STRATA_EXPECTS(req.path.empty() || req.path.front() == '/', strata::config_error,
                 "sigv4: the path '{}' does not start with '/'", req.path);
  STRATA_EXPECTS(req.payload_sha256 == unsigned_payload || is_lower_hex_sha256(req.payload_sha256),
                 strata::config_error,
                 "sigv4: the payload hash '{}' is neither 64 lowercase hex digits nor UNSIGNED-PAYLOAD",
                 req.payload_sha256);
  STRATA_EXPECTS(is_amz_date(amz_date_text), strata::config_error,
                 "sigv4: '{}' is not a date of the form 20150830T123600Z", amz_date_text);

  std::string uri;
  if (req.path.empty()) {
    uri = "/";
  } else if (style == sigv4_path_style::s3) {
    uri = uri_encode(req.path, false);
  } else {
    uri = uri_encode(normalized_path(req.path), false);
  }

  const std::string query = sigv4_canonical_query(req.query);

  std::vector<std::pair<std::string, std::string>> headers;
  headers.reserve(1 + req.headers.size() + extra_signed_headers.size());
  headers.emplace_back("host", req.host);
  const auto add = [&](const std::pair<std::string, std::string>& h) {
    STRATA_EXPECTS(is_token(h.first), strata::config_error, "sigv4: '{}' is not a header name", h.first);
    std::string name = lowercase(h.first);
    STRATA_EXPECTS(name != "host", strata::config_error,
                   "sigv4: give the Host header as sigv4_request::host, not among the headers");
    STRATA_EXPECTS(name != "authorization", strata::config_error,
                   "sigv4: the request already has an Authorization header");
    std::string value = canonical_header_value(h.first, h.second);
    headers.emplace_back(std::move(name), std::move(value));
  };
  for (const auto& h : req.headers) add(h);
  for (const auto& h : extra_signed_headers) add(h);
  // Stable: several headers of one name keep their order, joined by ','.
  std::stable_sort(headers.begin(), headers.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  std::string canonical_headers;
  std::string signed_headers;
  for (std::size_t i = 0; i < headers.size(); ++i) {
    if (i > 0 && headers[i].first == headers[i - 1].first) {
      canonical_headers.pop_back();  // the '\n' of the previous line
      canonical_headers += ',';
    } else {
      if (!signed_headers.empty()) signed_headers += ';';
      signed_headers += headers[i].first;
      canonical_headers += headers[i].first;
      canonical_headers += ':';
    }
    canonical_headers += headers[i].second;
    canonical_headers += '\n';
  }

  canonical_form out;
  out.request = fmt::format("{}\n{}\n{}\n{}\n{}\n{}", req.method, uri, query, canonical_headers, signed_headers,
                            req.payload_sha256);
  out.signed_headers = std::move(signed_headers);
  return out;
}

inline std::string credential_scope(std::string_view amz_date_text, const sigv4_scope& scope) {
  STRATA_EXPECTS(is_amz_date(amz_date_text), strata::config_error,
                 "sigv4: '{}' is not a date of the form 20150830T123600Z", amz_date_text);
  STRATA_EXPECTS(is_plain(scope.region, false), strata::config_error,
                 "sigv4: the region '{}' is empty or holds whitespace, a control character, ',' or '/'", scope.region);
  STRATA_EXPECTS(is_plain(scope.service, false), strata::config_error,
                 "sigv4: the service '{}' is empty or holds whitespace, a control character, ',' or '/'",
                 scope.service);
  return fmt::format("{}/{}/{}/aws4_request", amz_date_text.substr(0, 8), scope.region, scope.service);
}

}  // namespace sigv4_detail

/// The canonical request (task 1 of SigV4): method, canonical URI, canonical query, canonical
/// headers (host, `req.headers` and `extra_signed_headers`, which the signer adds: x-amz-date and
/// the like), signed headers, payload hash. `amz_date` is checked for form only: it is signed
/// through the x-amz-date header the caller lists in `extra_signed_headers`.
[[nodiscard]] inline std::string sigv4_canonical_request(
    const sigv4_request& req, std::string_view amz_date,
    const std::vector<std::pair<std::string, std::string>>& extra_signed_headers, sigv4_path_style style) {
  return sigv4_detail::canonicalize(req, amz_date, extra_signed_headers, style).request;
}

/// The string to sign (task 2): algorithm, date, credential scope, hash of the canonical request.
[[nodiscard]] inline std::string sigv4_string_to_sign(std::string_view canonical_request, std::string_view amz_date,
                                                      const sigv4_scope& scope) {
  return fmt::format("{}\n{}\n{}\n{}", sigv4_detail::algorithm, amz_date,
                     sigv4_detail::credential_scope(amz_date, scope), sha256_hex(canonical_request));
}

/// Signs `req` at time `now`. Returns the headers to add to the request, in this order:
/// x-amz-date, x-amz-content-sha256 (only for service "s3"), x-amz-security-token (when the
/// credentials have a session token), authorization. All but authorization are signed. The
/// request's own headers must not include Host (give it as `req.host`), Authorization, or one of
/// the headers returned here.
[[nodiscard]] inline std::vector<std::pair<std::string, std::string>> sigv4_sign(
    const sigv4_request& req, const aws_credentials& creds, const sigv4_scope& scope,
    std::chrono::system_clock::time_point now, sigv4_path_style style = sigv4_path_style::s3) {
  using namespace sigv4_detail;
  STRATA_EXPECTS(is_plain(creds.access_key_id, false), strata::config_error,
                 "sigv4: the access key id is empty or holds whitespace, a control character, ',' or '/'");
  STRATA_EXPECTS(!creds.secret_access_key.empty(), strata::config_error, "sigv4: the secret access key is empty");

  const bool s3 = scope.service == "s3";
  const bool token = !creds.session_token.empty();
  for (const auto& h : req.headers) {
    const std::string name = lowercase(h.first);
    STRATA_EXPECTS(name != "x-amz-date" && !(s3 && name == "x-amz-content-sha256") &&
                       !(token && name == "x-amz-security-token"),
                   strata::config_error, "sigv4: the request already has header '{}', which the signer adds", h.first);
  }

  std::vector<std::pair<std::string, std::string>> added;
  added.reserve(4);
  const std::string date = amz_date(now);
  added.emplace_back("x-amz-date", date);
  if (s3) added.emplace_back("x-amz-content-sha256", req.payload_sha256);
  if (token) added.emplace_back("x-amz-security-token", creds.session_token);

  const canonical_form canonical = canonicalize(req, date, added, style);
  const std::string scope_text = credential_scope(date, scope);
  const std::string to_sign = sigv4_string_to_sign(canonical.request, date, scope);

  // kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, yyyymmdd), region), service), "aws4_request")
  wiped<std::string> secret;
  secret.bytes.reserve(4 + creds.secret_access_key.size());  // built in place: no unwiped copy
  secret.bytes.append("AWS4").append(creds.secret_access_key);
  wiped<digest> key;
  key.bytes = hmac_sha256({reinterpret_cast<const unsigned char*>(secret.bytes.data()), secret.bytes.size()},
                          std::string_view(date).substr(0, 8));
  key.bytes = hmac_sha256(key.bytes, scope.region);
  key.bytes = hmac_sha256(key.bytes, scope.service);
  key.bytes = hmac_sha256(key.bytes, "aws4_request");
  const digest signature = hmac_sha256(key.bytes, to_sign);

  added.emplace_back("authorization", fmt::format("{} Credential={}/{}, SignedHeaders={}, Signature={}", algorithm,
                                                  creds.access_key_id, scope_text, canonical.signed_headers,
                                                  to_hex(signature)));
  return added;
}

}  // namespace strata::detail

#endif  // STRATA_HAS_S3
