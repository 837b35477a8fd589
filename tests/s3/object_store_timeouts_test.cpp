// object_store_tier against an endpoint that accepts connections and never answers (or answers the
// headers and then stalls): each attempt ends at first_byte_timeout, a request with all its
// retries at request_deadline, through curl and on the direct receive path alike, as a
// remote_error naming the key, the endpoint, what timed out and after how long.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <strata/tier/object_store_tier.hpp>

namespace object_store_timeouts_test {

using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t big = 2 << 20;  // at least direct_receive_min (1 MiB by default)

// An S3 endpoint on 127.0.0.1 that accepts every connection and reads every request, answers a
// listing of the bucket (when told to) with the objects it holds, and never answers anything else
// (or, told to, answers its status and headers and a few bytes of its body, and then nothing).
class silent_endpoint {
 public:
  silent_endpoint() {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_ < 0 || ::pipe2(stop_, O_CLOEXEC) != 0) throw std::runtime_error("socket/pipe");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_, 64) != 0 ||
        ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("bind/listen");
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  silent_endpoint(const silent_endpoint&) = delete;
  silent_endpoint& operator=(const silent_endpoint&) = delete;
  ~silent_endpoint() {
    (void)::write(stop_[1], "x", 1);
    thread_.join();
    for (const auto& c : clients_) ::close(c.fd);
    ::close(listen_);
    ::close(stop_[0]);
    ::close(stop_[1]);
  }

  [[nodiscard]] std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", port_); }
  [[nodiscard]] std::string authority() const { return fmt::format("127.0.0.1:{}", port_); }
  /// Listings name `key` of `size` bytes from now on.
  void hold(const std::string& key, std::uint64_t size) {
    std::lock_guard lock(mutex_);
    contents_ += fmt::format("<Contents><Key>{}</Key><Size>{}</Size></Contents>", key, size);
  }
  /// Listings go unanswered too.
  void silence_listings() { answer_listings_ = false; }
  /// Other requests get their answer's head and the first bytes of its body, then nothing.
  void stall_after_headers() { stall_after_headers_ = true; }
  /// Requests left unanswered so far.
  [[nodiscard]] unsigned unanswered() const { return unanswered_.load(); }

 private:
  struct client {
    int fd;
    std::string in;
    bool silent = false;  // a request it will never answer came: the rest is read and dropped
  };

  void serve() {
    for (;;) {
      std::vector<pollfd> fds{{stop_[0], POLLIN, 0}, {listen_, POLLIN, 0}};
      for (const auto& c : clients_) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 1000) < 0) return;
      if (fds[0].revents != 0) return;
      if (fds[1].revents != 0)
        if (const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC); fd >= 0) clients_.push_back({fd, {}});
      for (std::size_t i = 2; i < fds.size(); ++i) {  // (clients_[i - 2]: accepted ones are polled next time)
        if (fds[i].revents == 0) continue;
        client& c = clients_[i - 2];
        char buf[65536];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n <= 0) {  // closed by the client
          ::close(c.fd);
          c.fd = -1;
          continue;
        }
        if (c.silent) continue;
        c.in.append(buf, static_cast<std::size_t>(n));
        const auto end = c.in.find("\r\n\r\n");
        if (end == std::string::npos) continue;
        const bool listing = c.in.starts_with("GET ") && c.in.find("list-type=2") < end;
        if (listing && answer_listings_) {
          std::string body;
          {
            std::lock_guard lock(mutex_);
            body = fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>strata</Name>"
                               "<IsTruncated>false</IsTruncated>{}</ListBucketResult>",
                               contents_);
          }
          const std::string answer = fmt::format(
              "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{}", body.size(), body);
          (void)::send(c.fd, answer.data(), answer.size(), MSG_NOSIGNAL);
          c.in.erase(0, end + 4);
        } else {
          ++unanswered_;
          c.silent = true;
          if (stall_after_headers_) {
            const std::string head = answer_head(c.in.substr(0, end));
            (void)::send(c.fd, head.data(), head.size(), MSG_NOSIGNAL);
          }
        }
      }
      std::erase_if(clients_, [](const client& c) { return c.fd < 0; });
    }
  }

  // A 200 (206 for a ranged GET) whose body would be long, with its first bytes.
  static std::string answer_head(const std::string& request) {
    const std::string some(1000, 'x');
    const auto range = request.find("bytes=");
    if (!request.starts_with("GET ") || range == std::string::npos)
      return fmt::format("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{}", some);
    unsigned long long first = 0, last = 0;
    if (std::sscanf(request.c_str() + range, "bytes=%llu-%llu", &first, &last) != 2 || last < first) last = first = 0;
    return fmt::format("HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {}-{}/{}\r\n\r\n{}",
                       last - first + 1, first, last, big, some);
  }

  int listen_ = -1;
  int stop_[2] = {-1, -1};
  unsigned port_ = 0;
  std::vector<client> clients_;
  std::mutex mutex_;
  std::string contents_;
  std::atomic<bool> answer_listings_{true};
  std::atomic<bool> stall_after_headers_{false};
  std::atomic<unsigned> unanswered_{0};
  std::thread thread_;
};

strata::object_store_options options_for(const silent_endpoint& ep) {
  strata::object_store_options o;
  o.endpoint = ep.endpoint();
  o.bucket = "strata";
  o.prefix = "silent";
  o.region = "us-east-1";
  o.access_key_id = "SILENTKEY";
  o.secret_access_key = "SilentSecret";
  o.retry_base = 1ms;
  o.retry_cap = 20ms;
  o.first_byte_timeout = 1s;
  o.request_deadline = 3s;
  return o;
}

// What fails, and how long it took.
struct failure {
  strata::remote_error error;
  std::chrono::steady_clock::duration took;
};

template <class F>
failure time_failure(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const strata::remote_error& e) {
    MESSAGE(std::string(e.what()));
    return {e, std::chrono::steady_clock::now() - t0};
  }
  FAIL("no remote_error");
  throw std::logic_error("unreachable");
}

// The operations each test runs: a small PUT, a GET through curl, a GET received directly into
// the caller's buffer (http_direct.hpp).
enum class operation { small_put, curl_get, direct_get };
constexpr operation operations[] = {operation::small_put, operation::curl_get, operation::direct_get};

std::string describe(operation op) {
  switch (op) {
    case operation::small_put: return "a small PUT";
    case operation::curl_get: return "a GET through curl";
    case operation::direct_get: return "a large GET received directly into the buffer";
  }
  return "?";
}

// Runs `op` on a tier of the endpoint and returns how it failed; `key` is the key it names.
failure fail_one_operation(silent_endpoint& ep, strata::object_store_options o, operation op, std::string& key) {
  INFO(describe(op));
  {
    strata::object_store_tier probe(o);  // the listing (answered) tells it the object to read
    ep.hold(probe.key_of("big"), big);
  }
  std::vector<std::byte> buf(big);
  if (op == operation::curl_get) o.direct_receive_min = UINT64_MAX;
  strata::object_store_tier t(o);
  if (op == operation::small_put) {
    key = t.key_of("small");
    return time_failure([&] { t.write("small", 0, std::span(buf).first(1000)).get(); });
  }
  if (op == operation::direct_get) REQUIRE(big >= o.direct_receive_min);
  key = t.key_of("big");
  auto f = time_failure([&] { t.read("big", 0, buf).get(); });
  CHECK((t.stats().direct_gets > 0) == (op == operation::direct_get));
  return f;
}

bool has(const strata::remote_error& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

}  // namespace

// The bounds on how long a failure took are correctness bounds, not speed claims: with the old
// behaviour (a 60 s stall timer per attempt, seven attempts) each of these took minutes.

TEST_CASE("a silent endpoint: each attempt ends first_byte_timeout after its request was sent") {
  for (const auto op : operations) {
    silent_endpoint ep;
    auto o = options_for(ep);
    o.request_deadline = 0ms;  // off: the first-byte timer alone ends the attempts
    o.max_retries = 1;
    std::string key;
    const auto f = fail_one_operation(ep, o, op, key);
    INFO(describe(op));
    CHECK(f.error.http_status() == 0);
    CHECK(f.error.attempts() == 2);
    CHECK(f.error.endpoint() == ep.endpoint());
    CHECK(has(f.error, "s3://strata/" + key + " at " + ep.endpoint() + ": "));
    CHECK(has(f.error, fmt::format("no answer from {} within 1 s of sending the request (first_byte_timeout)",
                                   ep.authority())));
    CHECK(f.took < 2 * o.first_byte_timeout + 30s);
    CHECK(ep.unanswered() >= 2);
  }
}

TEST_CASE("a silent endpoint: request_deadline ends a request with all its retries") {
  for (const bool first_byte_timer : {true, false}) {
    for (const auto op : operations) {
      silent_endpoint ep;
      auto o = options_for(ep);
      o.max_retries = 1000;  // retries would go on for many minutes: only the deadline ends them
      if (!first_byte_timer) o.first_byte_timeout = 0ms;  // the deadline cuts the one attempt off
      std::string key;
      const auto f = fail_one_operation(ep, o, op, key);
      INFO(describe(op), first_byte_timer ? " with" : " without", " a first-byte timer");
      CHECK(f.error.http_status() == 0);
      CHECK(f.error.endpoint() == ep.endpoint());
      CHECK(has(f.error, "s3://strata/" + key + " at " + ep.endpoint() + ": "));
      CHECK(has(f.error, "request_deadline 3 s ran out (it bounds all attempts together)"));
      if (first_byte_timer) {
        CHECK(f.error.attempts() >= 2);
        CHECK(has(f.error, "; the attempt before: no answer from"));
      } else {
        CHECK(f.error.attempts() == 1);
        CHECK(has(f.error, fmt::format(" after it went out to {}, with no answer yet", ep.authority())));
      }
      CHECK(f.took < o.request_deadline + 30s);
    }
  }
}

TEST_CASE("an endpoint that answers the headers and then stalls: request_deadline cuts the answer off") {
  for (const auto op : operations) {
    silent_endpoint ep;
    ep.stall_after_headers();
    auto o = options_for(ep);
    o.max_retries = 1000;
    std::string key;
    const auto f = fail_one_operation(ep, o, op, key);
    INFO(describe(op));
    CHECK(f.error.endpoint() == ep.endpoint());
    CHECK(has(f.error, "s3://strata/" + key + " at " + ep.endpoint() + ": "));
    CHECK(has(f.error, "request_deadline 3 s ran out"));
    CHECK(has(f.error, fmt::format(" after it went out to {}, while its answer came", ep.authority())));
    CHECK(f.error.attempts() == 1);  // the answer began: the first-byte timer did not end it
    CHECK(f.took < o.request_deadline + 30s);
  }
}

TEST_CASE("a tier opening on a silent endpoint fails within request_deadline, naming the listing and the endpoint") {
  silent_endpoint ep;
  ep.silence_listings();
  auto o = options_for(ep);
  o.max_retries = 1000;
  const auto f = time_failure([&] { strata::object_store_tier t(o); });
  CHECK(f.error.operation() == "LIST");
  CHECK(f.error.key() == "s3://strata/silent/");
  CHECK(has(f.error, "S3 LIST s3://strata/silent/ at " + ep.endpoint() + ": no response: request_deadline 3 s ran out"));
  CHECK(has(f.error, "(first_byte_timeout)"));
  CHECK(f.took < o.request_deadline + 30s);
}

}  // namespace object_store_timeouts_test
