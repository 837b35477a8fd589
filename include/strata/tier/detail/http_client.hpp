#pragma once
// An HTTP/1.1 client for the object-store tier: libcurl's multi interface driven by one I/O
// thread. Connections stay open between requests (the multi handle's pool, at most
// `max_connections`), many transfers run at once without a thread each, and a request may wait
// out a retry's backoff (`not_before`) in the client instead of in a sleeping thread.
// A response body of a 2xx answer lands in the caller's buffer: large GETs over http:// are
// received straight into it on connections of the client's own (http_direct.hpp), other bodies
// are copied there from curl's buffer; other bodies (error documents, listings) are collected as
// text. Callbacks run on the I/O thread: they must
// be short and must not wait for other requests of the same client.
#include "strata/core/config.hpp"

#if STRATA_HAS_S3

#include <curl/curl.h>
#include <linux/sockios.h>
#include <pthread.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/detail/streaming_copy.hpp"
#include "strata/core/error.hpp"
#include "strata/core/notice.hpp"
#include "strata/core/unique_function.hpp"
#include "strata/tier/detail/http_direct.hpp"
#include "strata/tier/detail/http_message.hpp"

namespace strata::detail {

struct http_client_options {
  std::string name = "http";
  unsigned max_connections = 16;  ///< connections open at once (more requests queue in curl)
  std::string ca_file;            ///< CA bundle for TLS; empty: the system's
  bool verify_tls = true;
  std::chrono::milliseconds connect_timeout{10000};
  /// A transfer that moves under 1 KiB/s for this long is abandoned (a transport error, retried).
  std::chrono::seconds stall_timeout{60};
  /// A request whose answer has not begun this long after it was sent whole (a body's last byte
  /// delivered) is abandoned (a transport error, CURLE_OPERATION_TIMEDOUT). 0: no limit.
  std::chrono::milliseconds first_byte_timeout{0};
  /// GETs into a buffer of at least this many bytes over http:// are received straight into it
  /// (http_direct.hpp), on keep-alive connections beside curl's (at most max_connections more);
  /// UINT64_MAX: every request through curl. Off when the environment names a proxy (curl's).
  std::uint64_t direct_receive_min = 1 << 20;
};

class http_client {
 public:
  using callback = unique_function<void(http_response&&)>;
  using clock = std::chrono::steady_clock;

  explicit http_client(http_client_options o) : opts_(std::move(o)) {
    global_init();
    multi_ = ::curl_multi_init();
    if (multi_ == nullptr) throw error(fmt::format("{}: curl_multi_init failed", opts_.name));
    const long conns = static_cast<long>(std::max(1U, opts_.max_connections));
    check_multi(::curl_multi_setopt(multi_, CURLMOPT_MAX_TOTAL_CONNECTIONS, conns), "CURLMOPT_MAX_TOTAL_CONNECTIONS");
    check_multi(::curl_multi_setopt(multi_, CURLMOPT_MAX_HOST_CONNECTIONS, conns), "CURLMOPT_MAX_HOST_CONNECTIONS");
    // Keep as many idle connections as may be open, so keep-alive survives bursts.
    check_multi(::curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, conns), "CURLMOPT_MAXCONNECTS");
    direct_on_ = opts_.direct_receive_min != UINT64_MAX;
    for (const char* proxy : {"http_proxy", "all_proxy", "ALL_PROXY"})
      if (const char* v = std::getenv(proxy); v != nullptr && *v != '\0') direct_on_ = false;
    try {
      thread_ = std::thread([this] { run(); });
    } catch (...) {
      ::curl_multi_cleanup(multi_);
      throw;
    }
  }

  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;

  /// Ends every request still queued or in flight with a transport error, then joins the thread.
  ~http_client() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ::curl_multi_wakeup(multi_);
    if (thread_.joinable()) thread_.join();
    ::curl_multi_cleanup(multi_);
  }

  /// Queues a request; `done` runs on the I/O thread with the response (or a transport error).
  void submit(http_request req, callback done) {
    auto t = std::make_unique<transfer>();
    t->req = std::move(req);
    t->done = std::move(done);
    {
      std::lock_guard lock(mutex_);
      if (stopping_) {
        t->resp.transport_code = CURLE_ABORTED_BY_CALLBACK;
        t->resp.transport_error = "the HTTP client is closing";
      } else {
        incoming_.push_back(std::move(t));
      }
    }
    if (t) {
      finish(std::move(t));  // on this thread: the client is going away
      return;
    }
    ::curl_multi_wakeup(multi_);
  }

  /// Requests started so far (retries included).
  [[nodiscard]] std::uint64_t started() const noexcept { return started_.load(std::memory_order_relaxed); }
  /// Of those, GETs sent on the direct receive path (http_direct.hpp).
  [[nodiscard]] std::uint64_t direct_started() const noexcept { return direct_started_.load(std::memory_order_relaxed); }

 private:
  struct transfer {
    http_request req;
    callback done;
    http_response resp;
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    std::uint64_t upload_pos = 0;
    http_target target;          // direct receive: where it goes
    bool direct_resent = false;  // sent again after a reused direct connection closed unanswered
    clock::time_point started{};                   // it went out on a connection ({}: not yet)
    clock::time_point deadline = clock::time_point::max();  // the one it runs under once it went out
    clock::time_point sent{};  // sent whole, the answer's first byte awaited ({}: not yet, or curl's path resends)
    bool first_byte = false;   // a byte of the answer came (curl's path)
    char errbuf[CURL_ERROR_SIZE] = {};
    ~transfer() {
      if (headers != nullptr) ::curl_slist_free_all(headers);
      if (easy != nullptr) ::curl_easy_cleanup(easy);
    }
  };

  static void global_init() {
    // curl_global_init is not thread-safe in curl 7.88: once per process, before any handle.
    static const CURLcode rc = ::curl_global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK) throw error(fmt::format("curl_global_init: {}", ::curl_easy_strerror(rc)));
  }

  void check_multi(CURLMcode rc, const char* what) const {
    if (rc != CURLM_OK) throw error(fmt::format("{}: curl_multi_setopt({}): {}", opts_.name, what, ::curl_multi_strerror(rc)));
  }

  template <class V>
  void set(CURL* e, CURLoption opt, V value, const char* what) const {
    const CURLcode rc = ::curl_easy_setopt(e, opt, value);
    if (rc != CURLE_OK) throw error(fmt::format("{}: curl_easy_setopt({}): {}", opts_.name, what, ::curl_easy_strerror(rc)));
  }

  static std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) noexcept {
    auto* t = static_cast<transfer*>(user);
    const std::size_t len = size * n;
    t->first_byte = true;
    const std::string_view line(data, len);
    if (line.starts_with("HTTP/")) {
      t->resp.headers.clear();  // an interim response (100 Continue) came first
      return len;
    }
    try {
      (void)parse_header_line(line, t->resp.headers);
    } catch (...) {
      return 0;  // out of memory: abort the transfer
    }
    return len;
  }

  static constexpr std::uint64_t stream_receive_min = 1 << 20;

  static std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) noexcept {
    auto* t = static_cast<transfer*>(user);
    const std::size_t len = size * n;
    long status = 0;
    ::curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300 && !t->req.receive.empty()) {
      const std::uint64_t room = t->req.receive.size() - t->resp.received;
      if (len > room) {
        t->resp.overflow = true;
        return 0;  // more than was asked for: abort rather than write past the buffer
      }
      // A large read overflows the caches anyway: stream it into the caller's buffer.
      if (t->req.receive.size() >= stream_receive_min)
        streaming_copy(t->req.receive.data() + t->resp.received, data, len);
      else
        std::memcpy(t->req.receive.data() + t->resp.received, data, len);
      t->resp.received += len;
      return len;
    }
    if (t->resp.body.size() + len > max_text_body) return 0;
    try {
      t->resp.body.append(data, len);
    } catch (...) {
      return 0;
    }
    return len;
  }

  static std::size_t on_upload(char* dst, std::size_t size, std::size_t n, void* user) noexcept {
    auto* t = static_cast<transfer*>(user);
    const std::uint64_t left = t->req.body.size() - t->upload_pos;
    const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(left, size * n));
    std::memcpy(dst, t->req.body.data() + t->upload_pos, len);
    t->upload_pos += len;
    if (t->upload_pos == t->req.body.size() && t->sent == clock::time_point{}) t->sent = clock::now();
    return len;
  }

  // curl rewinds an upload when it resends the request (a reused connection that was closed).
  static int on_seek(void* user, curl_off_t offset, int origin) noexcept {
    auto* t = static_cast<transfer*>(user);
    if (origin != SEEK_SET || offset < 0 || static_cast<std::uint64_t>(offset) > t->req.body.size())
      return CURL_SEEKFUNC_CANTSEEK;
    t->upload_pos = static_cast<std::uint64_t>(offset);
    t->sent = {};
    return CURL_SEEKFUNC_OK;
  }

  // The request is about to go out on a connection (a new or a reused one; again when curl
  // resends it): the deadline clock starts on the first, the first-byte clock on each.
  static int on_prereq(void* user, char*, char*, int, int) noexcept {
    auto* t = static_cast<transfer*>(user);
    const auto now = clock::now();
    went_out(*t, now);
    t->first_byte = false;
    t->sent = t->req.body.empty() ? now : clock::time_point{};
    return CURL_PREREQFUNC_OK;
  }

  static void went_out(transfer& t, clock::time_point now) noexcept {
    if (t.started != clock::time_point{}) return;
    t.started = now;
    t.deadline = t.req.deadline;
    if (t.req.time_limit.count() > 0 && t.req.deadline - now > t.req.time_limit) t.deadline = now + t.req.time_limit;
  }

  // The deadline a transfer runs under now: its own until it went out, then also its time limit.
  static clock::time_point until(const transfer& t) noexcept {
    return t.started != clock::time_point{} ? t.deadline : t.req.deadline;
  }

  // "host:port" of a request's URL, for messages.
  static std::string_view endpoint_of(std::string_view url) noexcept {
    if (const auto sep = url.find("://"); sep != std::string_view::npos) url.remove_prefix(sep + 3);
    return url.substr(0, url.find_first_of("/?"));
  }

  static std::string deadline_message(const transfer& t, clock::time_point now, bool answering) {
    if (t.started == clock::time_point{})
      return fmt::format("the attempt was cut off before it went out to {}", endpoint_of(t.req.url));
    return fmt::format("the attempt was cut off {} after it went out to {}, {}", format_elapsed(now - t.started),
                       endpoint_of(t.req.url), answering ? "while its answer came" : "with no answer yet");
  }

  static void cut_off(std::unique_ptr<transfer> t, clock::time_point now, bool answering) noexcept {
    t->resp.deadline_passed = true;
    std::string why;
    try {
      why = deadline_message(*t, now, answering);
    } catch (...) {  // out of memory for the message: the flag says what happened
    }
    fail(std::move(t), CURLE_OPERATION_TIMEDOUT, std::move(why));
  }

  // Bytes of a request curl gave its socket that the peer has not yet acknowledged (0 when unknown).
  static int unacknowledged(const transfer& t) noexcept {
    curl_socket_t s = CURL_SOCKET_BAD;
    if (::curl_easy_getinfo(t.easy, CURLINFO_ACTIVESOCKET, &s) != CURLE_OK || s == CURL_SOCKET_BAD) return 0;
    int n = 0;
    return ::ioctl(s, SIOCOUTQ, &n) == 0 ? n : 0;
  }

  // Ends curl's transfers past their deadline, or whose answer has not begun first_byte_timeout
  // after they were sent whole.
  void expire_curl(clock::time_point now, std::map<CURL*, std::unique_ptr<transfer>>& running) noexcept {
    const auto fbt = opts_.first_byte_timeout;
    for (auto it = running.begin(); it != running.end();) {
      transfer& t = *it->second;
      bool late = now >= until(t);
      std::string why;
      if (!late && fbt.count() > 0 && t.sent != clock::time_point{} && !t.first_byte && now - t.sent >= fbt) {
        if (!t.req.body.empty() && unacknowledged(t) > 0) {
          t.sent = now;  // the body is still on its way (the peer is taking it): not the answer's wait yet
        } else {
          try {
            why = fmt::format("no answer from {} within {} of sending the request (first_byte_timeout)",
                              endpoint_of(t.req.url), format_timeout(fbt));
          } catch (...) {
            why = "no answer within first_byte_timeout of sending the request";
          }
        }
      }
      if (!late && why.empty()) {
        ++it;
        continue;
      }
      auto done = std::move(it->second);
      it = running.erase(it);
      ::curl_multi_remove_handle(multi_, done->easy);
      if (late) {
        const bool answering = done->first_byte;
        cut_off(std::move(done), now, answering);
      } else {
        fail(std::move(done), CURLE_OPERATION_TIMEDOUT, std::move(why));
      }
    }
  }

  void prepare(transfer& t) const {
    t.easy = ::curl_easy_init();
    if (t.easy == nullptr) throw error(fmt::format("{}: curl_easy_init failed", opts_.name));
    CURL* e = t.easy;
    set(e, CURLOPT_URL, t.req.url.c_str(), "CURLOPT_URL");
    set(e, CURLOPT_PROTOCOLS_STR, "http,https", "CURLOPT_PROTOCOLS_STR");
    set(e, CURLOPT_NOSIGNAL, 1L, "CURLOPT_NOSIGNAL");
    set(e, CURLOPT_PRIVATE, static_cast<void*>(&t), "CURLOPT_PRIVATE");
    set(e, CURLOPT_ERRORBUFFER, t.errbuf, "CURLOPT_ERRORBUFFER");
    set(e, CURLOPT_HEADERFUNCTION, &on_header, "CURLOPT_HEADERFUNCTION");
    set(e, CURLOPT_HEADERDATA, static_cast<void*>(&t), "CURLOPT_HEADERDATA");
    set(e, CURLOPT_WRITEFUNCTION, &on_body, "CURLOPT_WRITEFUNCTION");
    set(e, CURLOPT_WRITEDATA, static_cast<void*>(&t), "CURLOPT_WRITEDATA");
    set(e, CURLOPT_PREREQFUNCTION, &on_prereq, "CURLOPT_PREREQFUNCTION");
    set(e, CURLOPT_PREREQDATA, static_cast<void*>(&t), "CURLOPT_PREREQDATA");
    set(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts_.connect_timeout.count()), "CURLOPT_CONNECTTIMEOUT_MS");
    set(e, CURLOPT_LOW_SPEED_LIMIT, 1024L, "CURLOPT_LOW_SPEED_LIMIT");
    set(e, CURLOPT_LOW_SPEED_TIME, static_cast<long>(opts_.stall_timeout.count()), "CURLOPT_LOW_SPEED_TIME");
    set(e, CURLOPT_TCP_KEEPALIVE, 1L, "CURLOPT_TCP_KEEPALIVE");
    set(e, CURLOPT_TCP_NODELAY, 1L, "CURLOPT_TCP_NODELAY");
    set(e, CURLOPT_FOLLOWLOCATION, 0L, "CURLOPT_FOLLOWLOCATION");
    set(e, CURLOPT_SSL_VERIFYPEER, opts_.verify_tls ? 1L : 0L, "CURLOPT_SSL_VERIFYPEER");
    set(e, CURLOPT_SSL_VERIFYHOST, opts_.verify_tls ? 2L : 0L, "CURLOPT_SSL_VERIFYHOST");
    if (!opts_.ca_file.empty()) set(e, CURLOPT_CAINFO, opts_.ca_file.c_str(), "CURLOPT_CAINFO");

    const auto& m = t.req.method;
    const bool sends_body = m == "PUT" || m == "POST";
    if (m == "HEAD") {
      set(e, CURLOPT_NOBODY, 1L, "CURLOPT_NOBODY");
    } else if (m == "PUT") {
      set(e, CURLOPT_UPLOAD, 1L, "CURLOPT_UPLOAD");
      set(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(t.req.body.size()), "CURLOPT_INFILESIZE_LARGE");
    } else if (m == "POST") {
      set(e, CURLOPT_POST, 1L, "CURLOPT_POST");
      set(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t.req.body.size()), "CURLOPT_POSTFIELDSIZE_LARGE");
    } else if (m == "DELETE") {
      set(e, CURLOPT_CUSTOMREQUEST, "DELETE", "CURLOPT_CUSTOMREQUEST");
    } else if (m != "GET") {
      throw config_error(fmt::format("{}: unsupported HTTP method '{}'", opts_.name, m));
    }
    if (sends_body) {
      set(e, CURLOPT_READFUNCTION, &on_upload, "CURLOPT_READFUNCTION");
      set(e, CURLOPT_READDATA, static_cast<void*>(&t), "CURLOPT_READDATA");
      set(e, CURLOPT_SEEKFUNCTION, &on_seek, "CURLOPT_SEEKFUNCTION");
      set(e, CURLOPT_SEEKDATA, static_cast<void*>(&t), "CURLOPT_SEEKDATA");
    }
    bool has_type = false;
    for (const auto& [k, v] : t.req.headers) {
      has_type = has_type || (k.size() == 12 && ::strncasecmp(k.c_str(), "content-type", 12) == 0);
      append_header(t, fmt::format("{}: {}", k, v));
    }
    append_header(t, "Expect:");  // no 100-continue round trip before each body
    if (m == "POST" && !has_type) append_header(t, "Content-Type:");  // not curl's form type
    set(e, CURLOPT_HTTPHEADER, t.headers, "CURLOPT_HTTPHEADER");
  }

  void append_header(transfer& t, const std::string& line) const {
    curl_slist* l = ::curl_slist_append(t.headers, line.c_str());
    if (l == nullptr) throw error(fmt::format("{}: curl_slist_append failed", opts_.name));
    t.headers = l;
  }

  // Runs the callback; a callback must not throw, but if one does the I/O thread survives it.
  static void finish(std::unique_ptr<transfer> t) noexcept {
    if (t->started != clock::time_point{}) t->resp.deadline = t->deadline;
    try {
      t->done(std::move(t->resp));
    } catch (const std::exception& e) {
      notice(fmt::format("http_client: a completion callback threw: {}", e.what()));
    } catch (...) {
      notice("http_client: a completion callback threw");
    }
  }

  void start(std::unique_ptr<transfer> t, std::map<CURL*, std::unique_ptr<transfer>>& running) noexcept {
    if (const auto now = clock::now(); now >= until(*t)) return cut_off(std::move(t), now, false);
    if (direct_on_ && t->req.method == "GET" && t->req.receive.size() >= opts_.direct_receive_min &&
        split_http_url(t->req.url, t->target)) {
      try {
        direct_queue_.push_back(std::move(t));
        return;
      } catch (...) {  // out of memory: curl's path needs none of the queue
      }
    }
    start_curl(std::move(t), running);
  }

  void start_curl(std::unique_ptr<transfer> t, std::map<CURL*, std::unique_ptr<transfer>>& running) noexcept {
    try {
      prepare(*t);
      const CURLMcode rc = ::curl_multi_add_handle(multi_, t->easy);
      if (rc != CURLM_OK) throw error(fmt::format("curl_multi_add_handle: {}", ::curl_multi_strerror(rc)));
      started_.fetch_add(1, std::memory_order_relaxed);
      CURL* e = t->easy;
      running.emplace(e, std::move(t));
    } catch (const std::exception& ex) {
      t->resp.transport_code = CURLE_FAILED_INIT;
      t->resp.transport_error = ex.what();
      finish(std::move(t));
    }
  }

  // ---- direct receive (I/O thread only) -----------------------------------------------------

  struct direct_slot {
    std::unique_ptr<direct_connection> conn;
    std::unique_ptr<transfer> t;  // the request it carries, if any
  };

  // The request head of a direct GET; throws config_error on a header that would split it.
  static std::string request_head(const transfer& t) {
    const auto unsafe = [](std::string_view x, bool name) {
      return x.empty() && name ? true : std::any_of(x.begin(), x.end(), [name](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7f || (name && (c == ':' || c == ' '));
      });
    };
    if (unsafe(t.target.target, true)) throw config_error("http_client: a request target that needs curl's checks");
    std::string h = fmt::format("GET {} HTTP/1.1\r\n", t.target.target);
    bool host = false;
    for (const auto& [k, v] : t.req.headers) {
      if (unsafe(k, true) || unsafe(v, false))
        throw config_error(fmt::format("http_client: header '{}' is empty or holds a control character", k));
      host = host || ::strcasecmp(k.c_str(), "host") == 0;
      h += fmt::format("{}: {}\r\n", k, v);
    }
    if (!host) h += fmt::format("Host: {}\r\n", t.target.authority);
    h += "\r\n";
    return h;
  }

  // The address of host:port, looked up once per client (getaddrinfo blocks this thread then).
  const std::pair<sockaddr_storage, socklen_t>& address_of(const http_target& where, const std::string& key) {
    if (const auto it = resolved_.find(key); it != resolved_.end()) return it->second;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (const int rc = ::getaddrinfo(where.host.c_str(), where.port.c_str(), &hints, &res); rc != 0 || res == nullptr)
      throw error(fmt::format("resolve {}: {}", key, rc != 0 ? ::gai_strerror(rc) : "no address"));
    std::pair<sockaddr_storage, socklen_t> a{};
    std::memcpy(&a.first, res->ai_addr, std::min<std::size_t>(res->ai_addrlen, sizeof a.first));
    a.second = static_cast<socklen_t>(std::min<std::size_t>(res->ai_addrlen, sizeof a.first));
    ::freeaddrinfo(res);
    return resolved_.emplace(key, a).first->second;
  }

  static void fail(std::unique_ptr<transfer> t, int code, std::string message) noexcept {
    t->resp.transport_code = code;
    t->resp.transport_error = std::move(message);
    finish(std::move(t));
  }

  // Gives queued GETs a connection to their endpoint (an idle one, else a new one while fewer
  // than max_connections are open, else one idle to another endpoint, closed and replaced).
  void dispatch_direct(std::chrono::steady_clock::time_point now,
                       std::map<CURL*, std::unique_ptr<transfer>>& running) noexcept {
    while (!direct_queue_.empty()) {
      std::unique_ptr<transfer>& t = direct_queue_.front();
      std::string key;
      direct_slot* slot = nullptr;
      try {
        key = fmt::format("{}:{}", t->target.host, t->target.port);
        // Idle connections the server closed (or wrote to unasked) go; a request sent again
        // after a connection dropped it takes a fresh one.
        std::erase_if(direct_, [](const direct_slot& d) { return !d.t && d.conn->stale(); });
        if (!t->direct_resent)
          for (auto& d : direct_)
            if (!d.t && d.conn->idle() && d.conn->endpoint() == key) slot = &d;
        if (slot == nullptr) {
          if (direct_.size() >= std::max(1U, opts_.max_connections)) {
            const auto idle = std::find_if(direct_.begin(), direct_.end(), [](const direct_slot& d) { return !d.t; });
            if (idle == direct_.end()) return;  // every connection is carrying a request
            direct_.erase(idle);
          }
          const auto& [addr, len] = address_of(t->target, key);
          auto conn = std::make_unique<direct_connection>(key, reinterpret_cast<const sockaddr*>(&addr), len);
          if (conn->broken()) throw error(conn->open_error());
          slot = &direct_.emplace_back(direct_slot{std::move(conn), nullptr});
        }
        slot->conn->begin(request_head(*t), t->req.receive, t->resp, now);
        went_out(*t, now);
      } catch (const std::exception&) {
        // No connection (a name that does not resolve, a refused connect) or a request this path
        // cannot write: curl tries it its own way (every address, proxies) and reports its error.
        auto other = std::move(t);
        direct_queue_.pop_front();
        count_hand_over();
        start_curl(std::move(other), running);
        continue;
      }
      slot->t = std::move(t);
      direct_queue_.pop_front();
      started_.fetch_add(1, std::memory_order_relaxed);
      direct_started_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Moves every direct GET as far as its socket allows; finished ones complete, connections that
  // failed go. A request that a reused connection dropped unanswered (a server's idle close) is
  // sent once more on a fresh one, as curl does; an answer this path does not take goes to curl.
  void pump_direct(std::map<CURL*, std::unique_ptr<transfer>>& running) noexcept {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = direct_queue_.begin(); it != direct_queue_.end();) {  // queued past their deadline
      if (now < until(**it)) {
        ++it;
        continue;
      }
      auto t = std::move(*it);
      it = direct_queue_.erase(it);
      cut_off(std::move(t), now, false);
    }
    dispatch_direct(now, running);
    bool freed = false;
    for (auto& d : direct_) {
      if (!d.t) continue;
      auto p = direct_connection::progress::failed;
      bool late = false;
      try {
        p = d.conn->advance(now);
        late = p == direct_connection::progress::working && now >= until(*d.t);
        if (late) {
          d.conn->close();
          p = direct_connection::progress::failed;
        } else if (p == direct_connection::progress::working) {
          p = d.conn->check_time(now, opts_.connect_timeout, opts_.stall_timeout, opts_.first_byte_timeout);
        }
      } catch (const std::exception& e) {  // out of memory for a header or an error body
        d.t->resp.transport_code = CURLE_OUT_OF_MEMORY;
        d.t->resp.transport_error = e.what();
        d.conn->close();
        p = direct_connection::progress::failed;
      }
      if (p == direct_connection::progress::failed && d.conn->connect_failed())
        p = direct_connection::progress::unsupported;  // never connected: curl tries its own way
      if (p == direct_connection::progress::working) continue;
      // (Not one that timed out: a server that does not answer would not answer it again.)
      const bool resend = p == direct_connection::progress::failed && !late && d.conn->served() > 0 &&
                          !d.conn->answered() && d.t->resp.transport_code != CURLE_OPERATION_TIMEDOUT &&
                          !d.t->direct_resent;
      const bool answering = d.conn->answered();
      d.conn->release();
      auto t = std::move(d.t);
      freed = true;
      if (late) {
        cut_off(std::move(t), now, answering);
      } else if (p == direct_connection::progress::done) {
        unsupported_ = 0;
        finish(std::move(t));
      } else if (p == direct_connection::progress::failed && !resend) {
        finish(std::move(t));
      } else {
        t->resp = http_response{};
        if (p == direct_connection::progress::unsupported) count_hand_over();
        if (p == direct_connection::progress::failed) {
          t->direct_resent = true;
          try {
            direct_queue_.push_front(std::move(t));
            continue;
          } catch (...) {  // out of memory: curl's path takes it
          }
        }
        start_curl(std::move(t), running);
      }
    }
    std::erase_if(direct_, [](const direct_slot& d) { return !d.t && d.conn->broken(); });
    if (freed) dispatch_direct(now, running);
  }

  // A GET the direct path handed to curl; after three in a row it hands every one over.
  void count_hand_over() noexcept {
    if (++unsupported_ != 3) return;
    direct_on_ = false;
    try {
      notice(fmt::format("{}: three GETs in a row could not be received directly (no connection, or answers that "
                         "are not HTTP/1.1 with a Content-Length); every request goes through curl from now on",
                         opts_.name));
    } catch (...) {  // out of memory for the notice: the switch is made all the same
    }
  }

  // The poll set of the direct connections that wait for their sockets.
  void direct_waitfds(std::vector<curl_waitfd>& fds) const {
    fds.clear();
    for (const auto& d : direct_)
      if (d.t)
        if (const short ev = d.conn->events(); ev != 0)
          fds.push_back({d.conn->fd(), static_cast<short>((ev & POLLIN ? CURL_WAIT_POLLIN : 0) |
                                                          (ev & POLLOUT ? CURL_WAIT_POLLOUT : 0)),
                         0});
  }

  void run() noexcept {
    ::pthread_setname_np(::pthread_self(), "strata-http");
    std::map<CURL*, std::unique_ptr<transfer>> running;
    std::multimap<std::chrono::steady_clock::time_point, std::unique_ptr<transfer>> waiting;
    std::vector<curl_waitfd> fds;
    std::chrono::steady_clock::time_point last_check{};
    for (;;) {
      std::deque<std::unique_ptr<transfer>> fresh;
      bool stop = false;
      {
        std::lock_guard lock(mutex_);
        fresh.swap(incoming_);
        stop = stopping_;
      }
      if (stop) {
        for (auto& t : fresh) waiting.emplace(std::chrono::steady_clock::time_point{}, std::move(t));
        break;
      }
      const auto now = std::chrono::steady_clock::now();
      for (auto& t : fresh) {
        if (t->req.not_before > now) {
          const auto when = t->req.not_before;
          waiting.emplace(when, std::move(t));
        } else {
          start(std::move(t), running);
        }
      }
      while (!waiting.empty() && waiting.begin()->first <= now) {
        auto t = std::move(waiting.begin()->second);
        waiting.erase(waiting.begin());
        start(std::move(t), running);
      }
      pump_direct(running);
      int still = 0;
      const CURLMcode prc = ::curl_multi_perform(multi_, &still);
      if (prc != CURLM_OK) notice(fmt::format("{}: curl_multi_perform: {}", opts_.name, ::curl_multi_strerror(prc)));
      int left = 0;
      while (CURLMsg* msg = ::curl_multi_info_read(multi_, &left)) {
        if (msg->msg != CURLMSG_DONE) continue;
        const auto it = running.find(msg->easy_handle);
        if (it == running.end()) continue;
        auto t = std::move(it->second);
        running.erase(it);
        ::curl_multi_remove_handle(multi_, t->easy);
        const CURLcode code = msg->data.result;
        ::curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->resp.status);
        if (code != CURLE_OK) {
          t->resp.transport_code = static_cast<int>(code);
          t->resp.transport_error = t->errbuf[0] != '\0' ? std::string(t->errbuf) : ::curl_easy_strerror(code);
          if (t->resp.overflow) t->resp.transport_error = "the response body is longer than the range asked for";
        }
        finish(std::move(t));
      }
      // Timers: curl's transfers checked here, the direct ones in pump_direct; while any request
      // is out, the loop wakes often enough to end one on time.
      if (const auto checked = std::chrono::steady_clock::now(); checked - last_check >= std::chrono::milliseconds(20)) {
        expire_curl(checked, running);
        last_check = checked;
      }
      int timeout_ms = running.empty() && std::none_of(direct_.begin(), direct_.end(), [](const direct_slot& d) {
        return d.t != nullptr;
      }) ? 1000 : 100;
      if (!waiting.empty()) {
        const auto due = waiting.begin()->first - std::chrono::steady_clock::now();
        timeout_ms = static_cast<int>(std::clamp<std::int64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(due).count() + 1, 0, timeout_ms));
      }
      try {
        direct_waitfds(fds);
      } catch (...) {  // out of memory: the 1 s timeout still moves the direct GETs
        fds.clear();
      }
      if (!direct_queue_.empty() && fds.empty()) timeout_ms = std::min(timeout_ms, 10);
      const CURLMcode wrc = ::curl_multi_poll(multi_, fds.data(), static_cast<unsigned>(fds.size()), timeout_ms, nullptr);
      if (wrc != CURLM_OK) notice(fmt::format("{}: curl_multi_poll: {}", opts_.name, ::curl_multi_strerror(wrc)));
    }
    // Closing: every request not done gets a transport error, so no caller waits forever.
    for (auto& [e, t] : running) {
      ::curl_multi_remove_handle(multi_, e);
      fail(std::move(t), CURLE_ABORTED_BY_CALLBACK, "the HTTP client closed with the request in flight");
    }
    for (auto& d : direct_)
      if (d.t) fail(std::move(d.t), CURLE_ABORTED_BY_CALLBACK, "the HTTP client closed with the request in flight");
    direct_.clear();
    for (auto& t : direct_queue_)
      fail(std::move(t), CURLE_ABORTED_BY_CALLBACK, "the HTTP client closed before the request started");
    for (auto& [when, t] : waiting)
      fail(std::move(t), CURLE_ABORTED_BY_CALLBACK, "the HTTP client closed before the request started");
  }

  http_client_options opts_;
  CURLM* multi_ = nullptr;
  std::mutex mutex_;
  std::deque<std::unique_ptr<transfer>> incoming_;
  bool stopping_ = false;
  std::atomic<std::uint64_t> started_{0};
  std::atomic<std::uint64_t> direct_started_{0};
  // Direct receive, touched by the I/O thread only (after construction).
  bool direct_on_ = false;
  unsigned unsupported_ = 0;  // answers in a row the direct path handed to curl
  std::vector<direct_slot> direct_;
  std::deque<std::unique_ptr<transfer>> direct_queue_;
  std::map<std::string, std::pair<sockaddr_storage, socklen_t>> resolved_;
  std::thread thread_;  // last: started when everything else is ready
};

}  // namespace strata::detail

#endif  // STRATA_HAS_S3
