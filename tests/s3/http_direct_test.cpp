// The direct receive path of the HTTP client (tier/detail/http_direct.hpp) against a scripted
// loopback server: what it takes (HTTP/1.1 with a Content-Length, split anywhere, kept alive),
// what it hands to curl (chunked, HTTP/1.0, 1xx) and how it fails (an answer longer than the
// buffer, a close before the answer on a reused connection, a body cut short).
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <strata/tier/detail/http_direct.hpp>

namespace http_direct_test {

using strata::detail::direct_connection;
using progress = direct_connection::progress;

namespace {

// A one-connection server on 127.0.0.1: accepts, then runs `script` on the connected socket.
class scripted_server {
 public:
  explicit scripted_server(std::function<void(int)> script) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_ < 0) throw std::runtime_error("socket");
    addr_.sin_family = AF_INET;
    addr_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr_;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&addr_), sizeof addr_) != 0 || ::listen(listen_, 1) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&addr_), &len) != 0)
      throw std::runtime_error("bind/listen");
    thread_ = std::thread([this, script = std::move(script)] {
      const int fd = ::accept(listen_, nullptr, nullptr);
      if (fd < 0) return;
      script(fd);
      ::close(fd);
    });
  }
  ~scripted_server() {
    thread_.join();
    ::close(listen_);
  }
  [[nodiscard]] const sockaddr* addr() const { return reinterpret_cast<const sockaddr*>(&addr_); }

 private:
  int listen_ = -1;
  sockaddr_in addr_{};
  std::thread thread_;
};

// Reads one request head (up to the empty line) from `fd`; returns it.
std::string read_request(int fd) {
  std::string got;
  char c = 0;
  while (got.find("\r\n\r\n") == std::string::npos && ::recv(fd, &c, 1, 0) == 1) got.push_back(c);
  return got;
}

void send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    s.remove_prefix(static_cast<std::size_t>(n));
  }
}

// Sends `s` in pieces of `piece` bytes, pausing between them, so the client sees every split.
void send_slowly(int fd, std::string_view s, std::size_t piece) {
  for (std::size_t i = 0; i < s.size(); i += piece) {
    send_all(fd, s.substr(i, piece));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Drives the connection until the request is no longer working.
progress drive(direct_connection& c) {
  for (;;) {
    const auto p = c.advance(std::chrono::steady_clock::now());
    if (p != progress::working) return p;
    pollfd fd{c.fd(), c.events(), 0};
    (void)::poll(&fd, 1, 1000);
  }
}

std::string get_head(std::string_view target) {
  return "GET " + std::string(target) + " HTTP/1.1\r\nhost: test\r\n\r\n";
}

std::string body_of(std::size_t n) {
  std::string b(n, '\0');
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<char>('a' + i % 26);
  return b;
}

// Sends a GET for /b/k on `c` (kept open) and drives it to its end.
progress get_on(direct_connection& c, std::span<std::byte> buf, strata::detail::http_response& r) {
  c.begin(get_head("/b/k"), buf, r, std::chrono::steady_clock::now());
  return drive(c);
}

struct get_result {
  progress p = progress::working;
  strata::detail::http_response r;
  bool answered = false;  // any byte of the answer arrived
  bool broken = false;    // the connection is closed after the request
};

// One GET into `buf` against a server that reads the request, writes `answer` and closes.
get_result one_get(const std::string& answer, std::span<std::byte> buf) {
  scripted_server server([&](int fd) {
    (void)read_request(fd);
    send_all(fd, answer);
  });
  direct_connection c("s", server.addr(), sizeof(sockaddr_in));
  get_result out;
  out.p = get_on(c, buf, out.r);
  out.answered = c.answered();
  c.release();
  out.broken = c.broken();
  return out;
}

}  // namespace

TEST_CASE("an http URL splits into host, port, Host header and request target; other URLs are refused") {
  strata::detail::http_target t;
  REQUIRE(strata::detail::split_http_url("http://127.0.0.1:9000/bucket/k%2Fey?partNumber=1", t));
  CHECK(t.authority == "127.0.0.1:9000");
  CHECK(t.host == "127.0.0.1");
  CHECK(t.port == "9000");
  CHECK(t.target == "/bucket/k%2Fey?partNumber=1");
  REQUIRE(strata::detail::split_http_url("http://store.example", t));
  CHECK(t.port == "80");
  CHECK(t.target == "/");
  REQUIRE(strata::detail::split_http_url("http://[::1]:8080/b", t));
  CHECK(t.host == "::1");
  CHECK(t.port == "8080");
  CHECK(t.authority == "[::1]:8080");
  REQUIRE(strata::detail::split_http_url("http://h?list-type=2", t));
  CHECK(t.target == "/?list-type=2");
  CHECK_FALSE(strata::detail::split_http_url("https://h/b", t));
  CHECK_FALSE(strata::detail::split_http_url("http://user:pw@h/b", t));
  CHECK_FALSE(strata::detail::split_http_url("http://h:/b", t));
  CHECK_FALSE(strata::detail::split_http_url("http://h:80x/b", t));
  CHECK_FALSE(strata::detail::split_http_url("http://[::1/b", t));
}

TEST_CASE("a 206 whose head and body arrive in small pieces lands whole in the buffer, and the connection "
          "carries a second request") {
  const std::string body = body_of(100000);
  std::string seen_first, seen_second;
  scripted_server server([&](int fd) {
    seen_first = read_request(fd);
    send_slowly(fd,
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99999/200000\r\nx-amz-request-id: r1\r\n"
                "Content-Length: 100000\r\n\r\n" +
                    body,
                7000);
    seen_second = read_request(fd);
    send_all(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: 3\r\n\r\nxyz");
  });
  direct_connection c("127.0.0.1:test", server.addr(), sizeof(sockaddr_in));
  REQUIRE_FALSE(c.broken());
  std::vector<std::byte> buf(100000);
  strata::detail::http_response r;
  REQUIRE(get_on(c, buf, r) == progress::done);
  c.release();
  CHECK(r.status == 206);
  CHECK(r.received == body.size());
  CHECK(std::memcmp(buf.data(), body.data(), body.size()) == 0);
  REQUIRE(r.header("x-amz-request-id") != nullptr);
  CHECK(*r.header("x-amz-request-id") == "r1");
  CHECK(*r.header("content-range") == "bytes 0-99999/200000");
  CHECK(seen_first == get_head("/b/k"));

  CHECK(c.idle());
  strata::detail::http_response r2;
  c.begin(get_head("/b/k2"), std::span(buf).first(3), r2, std::chrono::steady_clock::now());
  REQUIRE(drive(c) == progress::done);
  c.release();
  CHECK(r2.received == 3);
  CHECK(std::memcmp(buf.data(), "xyz", 3) == 0);
  CHECK(c.served() == 2);
}

TEST_CASE("an error answer's body is kept as text, and the buffer is left alone") {
  const std::string xml = "<Error><Code>SlowDown</Code></Error>";
  std::vector<std::byte> buf(64, std::byte{0x5a});
  const auto g = one_get("HTTP/1.1 503 Slow Down\r\nContent-Length: " + std::to_string(xml.size()) + "\r\n\r\n" + xml, buf);
  REQUIRE(g.p == progress::done);
  CHECK(g.r.status == 503);
  CHECK(g.r.body == xml);
  CHECK(g.r.received == 0);
  CHECK(buf[0] == std::byte{0x5a});
  CHECK_FALSE(g.broken);  // kept alive for the next request
}

TEST_CASE("chunked, HTTP/1.0 and interim answers are handed to curl") {
  for (const std::string answer : {"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                                   "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc",
                                   "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
                                   "HTTP/1.1 200 OK\r\n\r\nabc"}) {
    CAPTURE(answer);
    std::vector<std::byte> buf(3);
    const auto g = one_get(answer, buf);
    CHECK(g.p == progress::unsupported);
    CHECK(g.broken);
  }
}

TEST_CASE("an error answer without a Content-Length delivers its status and headers and closes the connection") {
  std::vector<std::byte> buf(8);
  const auto g =
      one_get("HTTP/1.1 503 Slow Down\r\nRetry-After: 2\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n<Err>\r\n0\r\n\r\n", buf);
  REQUIRE(g.p == progress::done);
  CHECK(g.r.status == 503);
  REQUIRE(g.r.header("retry-after") != nullptr);
  CHECK(*g.r.header("retry-after") == "2");
  CHECK(g.r.body.empty());
  CHECK(g.broken);  // the rest of that body is never read as the next answer
}

TEST_CASE("an idle connection the server closed is stale, so it is not reused") {
  scripted_server server([&](int fd) {
    (void)read_request(fd);
    send_all(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: 1\r\n\r\nA");
  });  // the script ends: the server closes
  direct_connection c("s", server.addr(), sizeof(sockaddr_in));
  std::vector<std::byte> buf(1);
  strata::detail::http_response r;
  REQUIRE(get_on(c, buf, r) == progress::done);
  c.release();
  REQUIRE(c.idle());
  pollfd p{c.fd(), POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);  // the close arrived
  CHECK(c.stale());
}

TEST_CASE("a body longer than the buffer is refused as an overflow without writing past it") {
  std::vector<std::byte> buf(8, std::byte{0});
  const auto g = one_get("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789", std::span(buf).first(4));
  CHECK(g.p == progress::failed);
  CHECK(g.r.overflow);
  CHECK(g.r.status == 200);
  CHECK(g.r.transport_code != 0);
  CHECK(buf[4] == std::byte{0});
}

TEST_CASE("a body cut short is a transport failure after an answer; a close before any answer is not answered") {
  SUBCASE("cut short") {
    std::vector<std::byte> buf(10);
    const auto g = one_get("HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\r\n01234", buf);
    CHECK(g.p == progress::failed);
    CHECK(g.answered);
    CHECK(g.r.transport_error.find("5 bytes into a body of 10") != std::string::npos);
  }
  SUBCASE("closed unanswered after serving one: the request may go again on a fresh connection") {
    scripted_server server([&](int fd) {
      (void)read_request(fd);
      send_all(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: 1\r\n\r\nA");
      (void)read_request(fd);  // then closes: a server's idle close racing the next request
    });
    direct_connection c("s", server.addr(), sizeof(sockaddr_in));
    std::vector<std::byte> buf(1);
    strata::detail::http_response r;
    REQUIRE(get_on(c, buf, r) == progress::done);
    c.release();
    strata::detail::http_response r2;
    CHECK(get_on(c, buf, r2) == progress::failed);
    CHECK(c.served() == 1);
    CHECK_FALSE(c.answered());
    c.release();
    CHECK(r2.transport_error.find("before answering") != std::string::npos);
  }
}

TEST_CASE("a connect to a port nobody listens on fails as a connect failure, with the errno text") {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  {
    // A port that was free a moment ago (bound, then closed without listening).
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    socklen_t len = sizeof a;
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    ::close(s);
  }
  direct_connection c("127.0.0.1:closed", reinterpret_cast<const sockaddr*>(&a), sizeof a);
  if (c.broken()) {
    CHECK(c.open_error().find("refused") != std::string::npos);
    return;
  }
  std::vector<std::byte> buf(1);
  strata::detail::http_response r;
  c.begin(get_head("/"), buf, r, std::chrono::steady_clock::now());
  CHECK(drive(c) == progress::failed);
  CHECK(c.connect_failed());
  c.release();
  CHECK(r.transport_error.find("refused") != std::string::npos);
}

}  // namespace http_direct_test
