// node_limiter across processes: the cap holds between processes (checked from the intervals each
// one records on CLOCK_MONOTONIC), a process killed with SIGKILL while holding or waiting blocks
// nobody, and a process that re-acquires in a tight loop starves nobody. Every wait is bounded by
// a generous timeout that only guards against hangs.
#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strata/sync/limiter.hpp"
#include "../test_env.hpp"
#include "strata/sync/node_limiter.hpp"
#include "temp_dir.hpp"

extern char** environ;

// The folder's tests compile together: this file's names stay in its own namespace.
namespace node_limiter_multiprocess_test {

namespace {

using namespace std::chrono_literals;
using interval = std::pair<std::uint64_t, std::uint64_t>;

constexpr auto hang_guard = 120s;  // far above any healthy run, even on a loaded machine

// A helper process; killed (SIGKILL) and reaped when the test is done with it.
class helper {
 public:
  explicit helper(std::vector<std::string> args) {
    args.insert(args.begin(), strata_test::runner_path("STRATA_NODE_LIMITER_HELPER"));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ);
    REQUIRE_MESSAGE(rc == 0, "posix_spawn " << argv[0] << " failed: " << rc);
  }
  helper(const helper&) = delete;
  helper& operator=(const helper&) = delete;
  ~helper() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  /// Waits (bounded) for the helper to exit; its exit code, or nullopt if it hung or crashed.
  std::optional<int> wait(std::chrono::seconds limit = hang_guard) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return std::nullopt;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(5ms);
    }
  }

  void kill_now() {
    REQUIRE(::kill(pid_, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    CHECK(WIFSIGNALED(status));
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// Bounded wait for a condition that another process makes true.
template <class F>
bool eventually(F&& f) {
  const auto deadline = std::chrono::steady_clock::now() + hang_guard;
  while (!f()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

std::vector<interval> read_intervals(const std::filesystem::path& log) {
  std::vector<interval> v;
  std::ifstream in(log);
  interval i;
  while (in >> i.first >> i.second) v.push_back(i);
  return v;
}

// The most intervals that overlap at one instant. Intervals that only touch do not overlap.
std::size_t max_overlap(std::vector<interval> all) {
  std::vector<std::pair<std::uint64_t, int>> events;
  for (auto [a, r] : all) {
    events.emplace_back(a, +1);
    events.emplace_back(r, -1);
  }
  std::sort(events.begin(), events.end());  // at equal times -1 sorts first: a release before an acquire
  std::size_t now = 0;
  std::size_t most = 0;
  for (auto [t, d] : events) {
    now = d > 0 ? now + 1 : now - 1;
    most = std::max(most, now);
  }
  return most;
}

std::size_t ticket_files(const std::filesystem::path& dir) {
  std::size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().starts_with("t-")) ++n;
  return n;
}

}  // namespace

TEST_CASE("the overlap check counts intervals that overlap and not ones that touch") {
  CHECK(max_overlap({{0, 10}, {10, 20}, {20, 30}}) == 1);
  CHECK(max_overlap({{0, 10}, {5, 20}, {9, 12}, {11, 30}}) == 3);
  CHECK(max_overlap({}) == 0);
}

TEST_CASE("processes sharing a node_limiter never hold more permits at once than its cap") {
  for (std::size_t cap : {1, 2}) {
    CAPTURE(cap);
    strata_test::temp_dir dir;
    constexpr int processes = 4;
    constexpr int iterations = 25;
    std::vector<std::unique_ptr<helper>> helpers;
    for (int p = 0; p < processes; ++p)
      helpers.push_back(std::make_unique<helper>(std::vector<std::string>{
          "loop", dir.path().string(), "pfs", std::to_string(cap), std::to_string(iterations), "300",
          (dir.path() / ("log-" + std::to_string(p))).string()}));
    std::vector<interval> all;
    for (int p = 0; p < processes; ++p) {
      REQUIRE(helpers[p]->wait() == std::optional<int>(0));
      const auto mine = read_intervals(dir.path() / ("log-" + std::to_string(p)));
      CHECK(mine.size() == iterations);  // every process got all its permits
      all.insert(all.end(), mine.begin(), mine.end());
    }
    CHECK(max_overlap(all) <= cap);
    CHECK(ticket_files(dir.path() / "pfs") == 0);  // released tickets leave nothing behind
  }
}

TEST_CASE("a holder killed with SIGKILL does not block the processes waiting behind it") {
  strata_test::temp_dir dir;
  const auto ready = dir.path() / "holder-ready";
  helper holder({"hold", dir.path().string(), "pfs", "1", ready.string()});
  REQUIRE(eventually([&] { return std::filesystem::exists(ready); }));

  strata::node_limiter mine("pfs", 1, dir.path());
  CHECK_FALSE(mine.try_acquire());  // the holder really holds the only permit
  helper w1({"loop", dir.path().string(), "pfs", "1", "3", "0", (dir.path() / "w1").string()});
  helper w2({"loop", dir.path().string(), "pfs", "1", "3", "0", (dir.path() / "w2").string()});
  REQUIRE(eventually([&] { return ticket_files(dir.path() / "pfs") == 3; }));  // both queued behind it

  holder.kill_now();
  CHECK(w1.wait() == std::optional<int>(0));
  CHECK(w2.wait() == std::optional<int>(0));
  CHECK(read_intervals(dir.path() / "w1").size() == 3);
  CHECK(read_intervals(dir.path() / "w2").size() == 3);
  CHECK(mine.try_acquire_for(hang_guard));
  mine.release();
}

TEST_CASE("a waiter killed in the queue does not block the ones behind it") {
  strata_test::temp_dir dir;
  strata::node_limiter mine("pfs", 1, dir.path());
  mine.acquire();
  helper waiter({"wait", dir.path().string(), "pfs", "1"});
  REQUIRE(eventually([&] { return ticket_files(dir.path() / "pfs") == 2; }));
  helper behind({"loop", dir.path().string(), "pfs", "1", "2", "0", (dir.path() / "behind").string()});
  REQUIRE(eventually([&] { return ticket_files(dir.path() / "pfs") == 3; }));
  waiter.kill_now();  // its ticket stays on disk, unlocked
  mine.release();
  CHECK(behind.wait() == std::optional<int>(0));
  CHECK(read_intervals(dir.path() / "behind").size() == 2);
}

TEST_CASE("a process re-acquiring in a tight loop does not starve the others (cap 1, 4 processes)") {
  strata_test::temp_dir dir;
  const auto ready = dir.path() / "hog-ready";
  helper hog({"hog", dir.path().string(), "pfs", "1", ready.string()});
  REQUIRE(eventually([&] { return std::filesystem::exists(ready); }));
  std::vector<std::unique_ptr<helper>> others;
  for (int p = 0; p < 3; ++p)
    others.push_back(std::make_unique<helper>(std::vector<std::string>{
        "loop", dir.path().string(), "pfs", "1", "10", "0", (dir.path() / ("log-" + std::to_string(p))).string()}));
  std::vector<interval> all;
  for (int p = 0; p < 3; ++p) {
    REQUIRE(others[p]->wait() == std::optional<int>(0));  // bounded: a starved process fails here
    const auto mine = read_intervals(dir.path() / ("log-" + std::to_string(p)));
    CHECK(mine.size() == 10);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  CHECK(max_overlap(all) <= 1);
  hog.kill_now();
}

}  // namespace node_limiter_multiprocess_test
