// The loopback S3 stub (s3_stub.py) run for one test: a child python3 that serves path-style S3
// on 127.0.0.1 and misbehaves on command (fault SPECs, documented in s3_stub.py). Its stdin is a
// pipe held open by this object, so the stub also ends when the test process dies.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace strata_test {

/// A running s3_stub.py (path from the STRATA_S3_STUB environment variable), stopped when this
/// object dies. Not copyable or movable; its member functions may be called from any thread.
class s3_stub {
 public:
  /// Starts the stub with these fault SPECs and this minimum size of a non-final multipart part;
  /// throws std::runtime_error (with the reason) when it does not report its port within 20 s.
  explicit s3_stub(std::vector<std::string> faults = {}, std::uint64_t min_part = 5 << 20) {
    const char* script = std::getenv("STRATA_S3_STUB");
    if (script == nullptr || *script == '\0')
      throw std::runtime_error("s3_stub: STRATA_S3_STUB is not set: run this test through ctest, which sets it");
    if (::access(script, R_OK) != 0) fail(std::string("STRATA_S3_STUB=") + script, errno);
    std::vector<std::string> args{"python3", script, "--min-part", std::to_string(min_part)};
    for (auto& f : faults) {
      args.emplace_back("--fault");
      args.push_back(std::move(f));
    }
    try {
      spawn(args);
      port_ = read_port(std::chrono::seconds(20));
    } catch (...) {
      stop();
      throw;
    }
  }

  ~s3_stub() { stop(); }
  s3_stub(const s3_stub&) = delete;
  s3_stub& operator=(const s3_stub&) = delete;

  /// "http://127.0.0.1:PORT", the endpoint to give the S3 tier (path-style addressing).
  [[nodiscard]] std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  [[nodiscard]] int port() const { return port_; }

  /// The stub's GET /_stub/stats: {"requests", "denied", "ops": {op: count}, "open_uploads",
  /// "objects", "faults_fired", "faults": [{"spec", "left"}]}.
  [[nodiscard]] std::string stats_json() const { return control("GET", "/_stub/stats", {}); }

  /// Adds a fault SPEC at run time; throws std::runtime_error when the stub rejects it.
  void add_fault(std::string spec) { (void)control("POST", "/_stub/fault", spec); }

 private:
  [[noreturn]] static void fail(const std::string& what, int err) {
    throw std::runtime_error("s3_stub: " + what + ": " + std::strerror(err));
  }

  void spawn(const std::vector<std::string>& args) {
    int in[2] = {-1, -1};
    int out[2] = {-1, -1};
    // Close-on-exec, so that no other child inherits the write end and keeps the stub alive.
    if (::pipe2(in, O_CLOEXEC) != 0) fail("pipe2", errno);
    stdin_ = in[1];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      const int err = errno;
      ::close(in[0]);
      fail("pipe2", err);
    }
    stdout_ = out[0];
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    sigset_t none;
    pid_t pid = -1;
    int rc = ::posix_spawn_file_actions_init(&actions);
    if (rc == 0) {
      rc = ::posix_spawnattr_init(&attr);
      if (rc == 0) {
        // A signal mask is inherited across exec: a test thread's blocked SIGTERM must not be.
        if (::sigemptyset(&none) != 0) rc = errno;
        if (rc == 0) rc = ::posix_spawnattr_setsigmask(&attr, &none);
        if (rc == 0) rc = ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
        if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
        if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
        if (rc == 0) rc = ::posix_spawnp(&pid, "python3", &actions, &attr, argv.data(), environ);
        ::posix_spawnattr_destroy(&attr);
      }
      ::posix_spawn_file_actions_destroy(&actions);
    }
    ::close(in[0]);
    ::close(out[1]);
    if (rc != 0) fail("cannot start python3 " + args[1], rc);
    pid_ = pid;
  }

  int read_port(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::string line;
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        throw std::runtime_error("s3_stub: no PORT line within " + std::to_string(limit.count()) + " s (got '" + line + "')");
      pollfd p{stdout_, POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(left.count()));
      if (n < 0 && errno != EINTR) fail("poll on the stub's stdout", errno);
      if (n <= 0) continue;
      char buf[256];
      const ssize_t got = ::read(stdout_, buf, sizeof buf);
      if (got < 0 && errno != EINTR) fail("read from the stub's stdout", errno);
      if (got == 0) throw std::runtime_error("s3_stub: the stub exited before reporting its port (" + reap() + ")");
      if (got > 0) line.append(buf, static_cast<std::size_t>(got));
    }
    line.resize(line.find('\n'));
    int port = 0;
    if (line.rfind("PORT ", 0) == 0) port = std::atoi(line.c_str() + 5);
    if (port <= 0 || port > 65535) throw std::runtime_error("s3_stub: expected 'PORT <n>', got '" + line + "'");
    return port;
  }

  /// Waits for the stub (already told to end) and describes how it ended.
  std::string reap() {
    if (pid_ <= 0) return "not started";
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (r < 0 && errno != EINTR) {
        pid_ = -1;
        return std::string("waitpid: ") + std::strerror(errno);
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);  // a stub that ignores SIGTERM must not hang the test
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        pid_ = -1;
        return "killed after 10 s";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("signal ") + ::strsignal(WTERMSIG(status));
    return "ended";
  }

  void stop() noexcept {
    if (stdin_ >= 0) ::close(stdin_);  // EOF on its stdin ends the stub even without the signal
    stdin_ = -1;
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      try {
        (void)reap();
      } catch (...) {  // std::string's allocation: nothing left to do about it here
      }
    }
    if (stdout_ >= 0) ::close(stdout_);
    stdout_ = -1;
  }

  /// One blocking HTTP/1.1 exchange (Connection: close) with the stub's control endpoint; returns
  /// the body of a 200 answer, throws with the status and body otherwise.
  std::string control(std::string_view method, std::string_view path, std::string_view body) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket", errno);
    struct closer {
      int fd;
      ~closer() { ::close(fd); }
    } guard{fd};
    timeval tv{10, 0};  // a hang guard, not a timing check
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) fail("setsockopt SO_RCVTIMEO", errno);
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) fail("setsockopt SO_SNDTIMEO", errno);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) fail("connect to " + endpoint(), errno);
    std::string request = std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nHost: 127.0.0.1:" +
                          std::to_string(port_) + "\r\nConnection: close\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
    for (std::size_t sent = 0; sent < request.size();) {
      const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("send to " + endpoint(), errno);
      sent += static_cast<std::size_t>(n);
    }
    std::string reply;
    for (;;) {
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("recv from " + endpoint(), errno);
      if (n == 0) break;
      reply.append(buf, static_cast<std::size_t>(n));
    }
    const auto end = reply.find("\r\n\r\n");
    if (reply.rfind("HTTP/1.", 0) != 0 || end == std::string::npos || reply.size() < 12)
      throw std::runtime_error("s3_stub: malformed answer to " + std::string(method) + " " + std::string(path));
    std::string content = reply.substr(end + 4);
    if (reply.compare(9, 3, "200") != 0)
      throw std::runtime_error("s3_stub: " + std::string(method) + " " + std::string(path) + " answered " +
                               reply.substr(9, 3) + ": " + content);
    return content;
  }

  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  int port_ = 0;
};

}  // namespace strata_test
