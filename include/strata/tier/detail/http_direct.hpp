#pragma once
// The receiving side of http_client for large GETs over plain http://: keep-alive HTTP/1.1
// connections of strata's own whose 2xx bodies are received straight into the caller's buffer.
// curl hands a body over from its own receive buffer, so every byte was copied once more after
// the kernel's copy; on a loopback store that shares the CPUs with the client, that copy cost
// about 15% of read throughput. Only what S3 answers a GET with is taken here (HTTP/1.1, a
// Content-Length body); any other shape (chunked, 1xx, HTTP/1.0) is `unsupported` and the
// client hands the request back to curl. TLS, proxies and every other method stay with curl.
#include "strata/core/config.hpp"

#if STRATA_HAS_S3

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/tier/detail/http_message.hpp"

namespace strata::detail {

/// An http:// URL cut into what a connection and a request line need.
struct http_target {
  std::string authority;  ///< host[:port] as the URL gives it (the Host header)
  std::string host;       ///< without brackets for an IPv6 literal
  std::string port;    ///< "80" when the URL gives none
  std::string target;  ///< path and query ("/" when empty)
};

/// The parts of an http:// URL; false for another scheme or a URL with user info.
inline bool split_http_url(std::string_view url, http_target& out) {
  constexpr std::string_view scheme = "http://";
  if (!url.starts_with(scheme)) return false;
  url.remove_prefix(scheme.size());
  const auto slash = url.find_first_of("/?");
  std::string_view authority = url.substr(0, slash);
  out.target = slash == std::string_view::npos ? "/" : std::string(url.substr(slash));
  if (out.target.front() == '?') out.target.insert(out.target.begin(), '/');
  if (authority.empty() || authority.find('@') != std::string_view::npos) return false;
  out.authority = std::string(authority);
  std::string_view host = authority, port = "80";
  if (authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) return false;
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return false;
      port = authority.substr(close + 2);
    }
  } else if (const auto colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.find_first_not_of("0123456789") != std::string_view::npos) return false;
  out.host = std::string(host);
  out.port = std::string(port);
  return true;
}

/// One keep-alive connection that carries one GET at a time, driven without blocking: the
/// client calls advance() whenever it may have progress (after a poll on fd() for events()).
class direct_connection {
 public:
  enum class progress : std::uint8_t {
    working,      ///< waiting for the socket (see events())
    done,         ///< the response is in the http_response (status, headers, body or received)
    failed,       ///< transport failure: transport_code and transport_error are set
    unsupported,  ///< an answer shape this path does not take: hand the request to curl
  };

  direct_connection(std::string endpoint, const sockaddr* addr, socklen_t len) : endpoint_(std::move(endpoint)) {
    fd_ = ::socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    if (fd_ < 0) {
      fail_errno("socket", errno);
      return;
    }
    const int one = 1;
    // Best effort, as curl's TCP_NODELAY and keep-alive: a failure costs latency, not data.
    (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)::setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    if (::connect(fd_, addr, len) == 0) {
      phase_ = phase::idle;
    } else if (errno == EINPROGRESS) {
      phase_ = phase::connecting;
    } else {
      fail_errno("connect", errno);
    }
  }
  direct_connection(const direct_connection&) = delete;
  direct_connection& operator=(const direct_connection&) = delete;
  ~direct_connection() { close(); }

  /// "host:port" this connection goes to.
  [[nodiscard]] const std::string& endpoint() const noexcept { return endpoint_; }
  [[nodiscard]] int fd() const noexcept { return fd_; }
  /// Responses this connection completed (a failure on a reused one may just be a server's
  /// idle close: the request may go again on a fresh connection).
  [[nodiscard]] std::uint64_t served() const noexcept { return served_; }
  /// Any byte of the current response arrived (a request that got none was not answered).
  [[nodiscard]] bool answered() const noexcept { return answered_; }
  /// Ready for the next request (connected or connecting, nothing in flight, not closing).
  [[nodiscard]] bool idle() const noexcept {
    return fd_ >= 0 && resp_ == nullptr && !close_after_ && (phase_ == phase::idle || phase_ == phase::connecting);
  }
  [[nodiscard]] bool busy() const noexcept { return resp_ != nullptr; }
  /// A connect that failed at once (before any request): its error is in open_error().
  [[nodiscard]] bool broken() const noexcept { return fd_ < 0 || phase_ == phase::broken; }
  [[nodiscard]] const std::string& open_error() const noexcept { return open_error_; }
  /// The request failed because the connection never came up (curl may get through: another
  /// address of the name, a proxy rule).
  [[nodiscard]] bool connect_failed() const noexcept { return connect_failed_; }
  /// An idle connection the server closed or wrote to unasked (a 408, say): not to be reused.
  [[nodiscard]] bool stale() const noexcept {
    if (fd_ < 0 || phase_ != phase::idle) return fd_ < 0;
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable, hung up, or poll failed: do not trust it
  }

  /// poll events the current phase waits for (0 when idle).
  [[nodiscard]] short events() const noexcept {
    if (resp_ == nullptr) return 0;
    return phase_ == phase::connecting || phase_ == phase::sending ? POLLOUT : POLLIN;
  }

  /// Starts a request: `head` is the request line and headers with their final empty line; a 2xx
  /// body goes to `receive` (an answer longer than it is refused), others into resp.body.
  void begin(std::string head, std::span<std::byte> receive, http_response& resp,
             std::chrono::steady_clock::time_point now) {
    out_ = std::move(head);
    out_pos_ = 0;
    receive_ = receive;
    resp_ = &resp;
    head_.clear();
    answered_ = drop_body_ = false;
    body_len_ = body_got_ = 0;
    started_ = window_start_ = now;
    window_bytes_ = 0;
    if (phase_ == phase::idle) phase_ = phase::sending;
  }

  /// Moves the current request as far as the socket allows without blocking.
  progress advance(std::chrono::steady_clock::time_point now) {
    for (;;) {
      switch (phase_) {
        case phase::connecting: {
          pollfd p{fd_, POLLOUT, 0};
          const int n = ::poll(&p, 1, 0);
          if (n == 0) return progress::working;
          int err = 0;
          socklen_t len = sizeof err;
          if (n < 0) err = errno;
          else if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          if (err != 0) {
            connect_failed_ = true;
            return transport_failure(7 /*CURLE_COULDNT_CONNECT*/, "connect", err);
          }
          phase_ = phase::sending;
          break;
        }
        case phase::sending: {
          while (out_pos_ < out_.size()) {
            const ssize_t n = ::send(fd_, out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return progress::working;
            if (n < 0) return transport_failure(55 /*CURLE_SEND_ERROR*/, "send", errno);
            out_pos_ += static_cast<std::size_t>(n);
          }
          sent_ = now;
          phase_ = phase::head;
          break;
        }
        case phase::head: {
          char buf[16384];
          const ssize_t n = receive_some(buf, sizeof buf);
          if (n < 0) return n == would_block ? progress::working : failure_;
          if (n == 0) return closed_early();
          moved(static_cast<std::size_t>(n), now);
          head_.append(buf, static_cast<std::size_t>(n));
          const auto end = head_.find("\r\n\r\n");
          if (end == std::string::npos) {
            if (head_.size() > 65536) return transport_failure(8 /*CURLE_WEIRD_SERVER_REPLY*/, "a response head over 64 KiB");
            return progress::working;
          }
          if (const auto p = parse_head(std::string_view(head_).substr(0, end + 2)); p != progress::working) return p;
          // Bytes after the head are the start of the body.
          const std::string_view rest = std::string_view(head_).substr(end + 4);
          if (drop_body_) break;  // (body_got_ and body_len_ are 0: complete, then closed)
          if (rest.size() > body_len_) return transport_failure(8, "more bytes after the response than its Content-Length");
          if (!rest.empty()) {
            if (phase_ == phase::body) std::memcpy(receive_.data(), rest.data(), rest.size());
            else resp_->body.append(rest);
          }
          body_got_ = rest.size();
          break;
        }
        case phase::body: {
          if (body_got_ == body_len_) return complete();
          const ssize_t n = receive_some(reinterpret_cast<char*>(receive_.data()) + body_got_, body_len_ - body_got_);
          if (n < 0) return n == would_block ? progress::working : failure_;
          if (n == 0) return closed_early();
          moved(static_cast<std::size_t>(n), now);
          body_got_ += static_cast<std::size_t>(n);
          break;
        }
        case phase::text: {
          if (body_got_ == body_len_) return complete();
          char buf[16384];
          const ssize_t n = receive_some(buf, std::min<std::size_t>(sizeof buf, body_len_ - body_got_));
          if (n < 0) return n == would_block ? progress::working : failure_;
          if (n == 0) return closed_early();
          moved(static_cast<std::size_t>(n), now);
          resp_->body.append(buf, static_cast<std::size_t>(n));
          body_got_ += static_cast<std::size_t>(n);
          break;
        }
        case phase::idle:
        case phase::broken:
          return progress::working;
      }
    }
  }

  /// A transport failure when the connect or the transfer outlived its limits: connecting longer
  /// than `connect_timeout`, no byte of the answer `first_byte` after the request was sent (0: no
  /// limit), or under 1 KiB/s for `stall` (curl's LOW_SPEED limits).
  progress check_time(std::chrono::steady_clock::time_point now, std::chrono::milliseconds connect_timeout,
                      std::chrono::seconds stall, std::chrono::milliseconds first_byte) {
    if (resp_ == nullptr) return progress::working;
    if (phase_ == phase::connecting && now - started_ > connect_timeout)
      return transport_failure(28 /*CURLE_OPERATION_TIMEDOUT*/,
                               fmt::format("connect to {} timed out after {} ms", endpoint_, connect_timeout.count()));
    if (phase_ == phase::head && !answered_ && first_byte.count() > 0 && now - sent_ >= first_byte)
      return transport_failure(28, fmt::format("no answer from {} within {} of sending the request (first_byte_timeout)",
                                               endpoint_, format_timeout(first_byte)));
    if (now - window_start_ >= stall) {
      if (window_bytes_ < 1024 * static_cast<std::uint64_t>(stall.count()))
        return transport_failure(28, fmt::format("under 1 KiB/s from {} for {} s", endpoint_, stall.count()));
      window_start_ = now;
      window_bytes_ = 0;
    }
    return progress::working;
  }

  /// Detaches the finished (done or failed) request; a failed connection is closed.
  void release() noexcept {
    resp_ = nullptr;
    receive_ = {};
    if (phase_ != phase::idle) close();
  }

  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);  // (nothing to recover on a failed close of a socket)
    fd_ = -1;
    phase_ = phase::broken;
  }

 private:
  enum class phase : std::uint8_t { connecting, idle, sending, head, body, text, broken };
  static constexpr ssize_t would_block = -2;

  // recv without blocking: bytes, 0 at EOF, would_block, or -1 with failure_ set.
  ssize_t receive_some(char* dst, std::size_t len) {
    for (;;) {
      const ssize_t n = ::recv(fd_, dst, len, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return would_block;
      failure_ = transport_failure(56 /*CURLE_RECV_ERROR*/, "recv", errno);
      return -1;
    }
  }

  void moved(std::size_t n, std::chrono::steady_clock::time_point) noexcept {
    answered_ = true;
    window_bytes_ += n;
  }

  progress parse_head(std::string_view head) {
    const auto eol = head.find("\r\n");
    const std::string_view status_line = head.substr(0, eol);
    // "HTTP/1.1 206 Partial Content": only HTTP/1.1 is taken (1.0 frames bodies differently).
    if (!status_line.starts_with("HTTP/1.1 ") || status_line.size() < 12) return progress::unsupported;
    long status = 0;
    const auto [p, ec] = std::from_chars(status_line.data() + 9, status_line.data() + 12, status);
    if (ec != std::errc() || p != status_line.data() + 12 || status < 200) return progress::unsupported;
    resp_->status = status;
    resp_->headers.clear();
    for (std::size_t pos = eol + 2; pos < head.size();) {
      const auto next = head.find("\r\n", pos);
      (void)parse_header_line(head.substr(pos, next - pos), resp_->headers);
      pos = next + 2;
    }
    if (const auto* c = resp_->header("connection"); c != nullptr && ::strcasecmp(c->c_str(), "close") == 0)
      close_after_ = true;
    const auto* length = resp_->header("content-length");
    const bool chunked = resp_->header("transfer-encoding") != nullptr;
    const bool success = status >= 200 && status < 300;
    if (!success && (chunked || length == nullptr)) {
      // An error answer framed otherwise: its status and headers (request id, Retry-After) are
      // what the caller's retry needs, so they are delivered now rather than sending the
      // request again through curl at once; the body is dropped with the connection.
      close_after_ = drop_body_ = true;
      body_len_ = body_got_ = 0;
      phase_ = phase::text;
      return progress::working;
    }
    if (chunked) return progress::unsupported;
    std::uint64_t len = 0;
    if (length == nullptr) {
      if (status != 204 && status != 304) return progress::unsupported;
    } else {
      const auto [q, lec] = std::from_chars(length->data(), length->data() + length->size(), len);
      if (lec != std::errc() || q != length->data() + length->size())
        return transport_failure(8, fmt::format("Content-Length '{}'", *length));
    }
    body_len_ = len;
    const bool to_buffer = status >= 200 && status < 300 && !receive_.empty();
    if (to_buffer && len > receive_.size()) {
      resp_->overflow = true;
      return transport_failure(23 /*CURLE_WRITE_ERROR*/, "the response body is longer than the range asked for");
    }
    if (!to_buffer && len > max_text_body) return transport_failure(23, fmt::format("a response body of {} bytes", len));
    phase_ = to_buffer ? phase::body : phase::text;
    return progress::working;
  }

  progress complete() {
    if (phase_ == phase::body) resp_->received = body_got_;
    ++served_;
    phase_ = close_after_ ? phase::broken : phase::idle;
    if (close_after_) close();
    return progress::done;
  }

  progress closed_early() {
    if (phase_ == phase::head)
      return transport_failure(52 /*CURLE_GOT_NOTHING*/, fmt::format("{} closed the connection before answering", endpoint_));
    return transport_failure(18 /*CURLE_PARTIAL_FILE*/, fmt::format("{} closed the connection {} bytes into a body of {}",
                                                                    endpoint_, body_got_, body_len_));
  }

  progress transport_failure(int code, std::string_view what, int err) {
    return transport_failure(code, fmt::format("{} {}: {}", what, endpoint_, std::system_category().message(err)));
  }
  progress transport_failure(int code, std::string message) {
    resp_->transport_code = code;
    resp_->transport_error = std::move(message);
    phase_ = phase::broken;
    return failure_ = progress::failed;
  }

  void fail_errno(const char* what, int err) {
    open_error_ = fmt::format("{} {}: {}", what, endpoint_, std::system_category().message(err));
    close();
  }

  std::string endpoint_;
  int fd_ = -1;
  phase phase_ = phase::broken;
  std::string open_error_;
  std::string out_;
  std::size_t out_pos_ = 0;
  std::string head_;
  std::span<std::byte> receive_;
  http_response* resp_ = nullptr;
  std::uint64_t body_len_ = 0, body_got_ = 0;
  std::uint64_t served_ = 0;
  bool answered_ = false;
  bool close_after_ = false;
  bool connect_failed_ = false;
  bool drop_body_ = false;  // an error answer without a Content-Length: its body is not read
  progress failure_ = progress::failed;
  std::chrono::steady_clock::time_point started_{}, window_start_{}, sent_{};
  std::uint64_t window_bytes_ = 0;
};

}  // namespace strata::detail

#endif  // STRATA_HAS_S3
