// What the tests that damage shared files need: a forked child watched by a hang guard (so that
// a crash or a hang is reported, not suffered, by the runner) and the notices strata emits.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "strata/core/notice.hpp"

namespace strata_test {

/// How a forked child ended: its exit code, the signal that killed it, or that it hung.
struct child_end {
  int code = -1;
  int signal = 0;
  bool hung = false;
  [[nodiscard]] bool ok() const { return !hung && signal == 0 && code == 0; }
};

inline std::string describe(const child_end& e) {
  if (e.hung) return "the child hung (killed after 30 s)";
  if (e.signal != 0) return fmt::format("the child died of signal {} ({})", e.signal, ::strsignal(e.signal));
  return fmt::format("the child exited with {}", e.code);
}

/// Runs `body` in a forked child (its return value is the exit code; an exception is 99) and
/// waits for it, killing it if it runs past `guard` (a hang guard, not a timing check).
template <class F>
child_end in_child(F&& body, std::chrono::seconds guard = std::chrono::seconds(30)) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  child_end end;
  const auto deadline = std::chrono::steady_clock::now() + guard;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    REQUIRE(r >= 0);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      end.hung = true;
      return end;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status)) end.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) end.signal = WTERMSIG(status);
  return end;
}

/// Collects the notices emitted while it lives.
class notices {
 public:
  notices() {
    old_ = strata::set_notice_handler([this](std::string_view text) {
      std::lock_guard lock(mutex_);
      seen_.emplace_back(text);
    });
  }
  ~notices() { strata::set_notice_handler(std::move(old_)); }
  notices(const notices&) = delete;
  notices& operator=(const notices&) = delete;
  [[nodiscard]] bool any_with(const std::string& a, const std::string& b = {}) const {
    std::lock_guard lock(mutex_);
    for (const auto& s : seen_)
      if (s.find(a) != std::string::npos && s.find(b) != std::string::npos) return true;
    return false;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> seen_;
  std::function<void(std::string_view)> old_;
};

}  // namespace strata_test
