// Crash safety: a process training on a file tier is SIGKILLed at random points during step()
// and during save(); the last complete checkpoint always loads, and training continued from it
// is bit-identical to an uninterrupted run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <thread>

#include <doctest/doctest.h>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "kill_common.hpp"

namespace {

using namespace strata_test;
namespace fs = std::filesystem;

/// Starts the helper and returns its pid once it printed "ready".
pid_t start_helper(const std::string& mode, const fs::path& work) {
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    ::execl(STRATA_OFFLOAD_KILL_HELPER, STRATA_OFFLOAD_KILL_HELPER, mode.c_str(), work.c_str(), "1000000",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  char buf[6] = {};
  std::size_t got = 0;
  while (got < 6) {
    const ssize_t r = ::read(pipefd[0], buf + got, 6 - got);
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  ::close(pipefd[0]);
  REQUIRE(std::string(buf, got) == "ready\n");
  return pid;
}

/// Starts the helper, waits for its "ready", lets it run `delay`, then SIGKILLs it. Returns
/// whether the kill landed (false when the helper finished first).
bool run_and_kill(const std::string& mode, const fs::path& work, std::chrono::microseconds delay) {
  const pid_t pid = start_helper(mode, work);
  std::this_thread::sleep_for(delay);
  const bool killed = ::kill(pid, SIGKILL) == 0;
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

/// Loads the checkpoint, checks it against the in-memory replay, continues 2 steps; returns the
/// step count the checkpoint held.
std::uint64_t check_resume(const fs::path& work) {
  strata::host_tier tier(strata::host_tier_options{.name = "resume"});
  strata::offload_options off;
  off.threads = 2;
  auto opt = strata::offloaded_adamw<strata::host_tier>::load(work / "ckpt", tier, off);
  const std::uint64_t k = opt.step_count();
  flat_reference ref(strata_kill::initial(), strata_kill::options());
  for (std::uint64_t t = 0; t < k; ++t) {
    const auto g = strata_kill::grads(t);
    ref.step(std::span<const strata::bf16>(g), strata_kill::lr(t));
  }
  require_same_state(opt, ref);
  for (std::uint64_t t = k; t < k + 2; ++t) {
    const auto g = strata_kill::grads(t);
    opt.step(std::span<const strata::bf16>(g), strata_kill::lr(t));
    ref.step(std::span<const strata::bf16>(g), strata_kill::lr(t));
  }
  require_same_state(opt, ref);
  return k;
}

}  // namespace

TEST_CASE("SIGKILL during step() or save() leaves a checkpoint that resumes bit-identically") {
  std::mt19937_64 rng(0x5eed);
  for (const std::string mode : {"step", "save"}) {
    std::uint64_t furthest = 0;
    for (int round = 0; round < 6; ++round) {
      CAPTURE(mode);
      CAPTURE(round);
      temp_dir work(fs::temp_directory_path(), "offload-kill");
      const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 150'000)(rng));
      CHECK(run_and_kill(mode, work.path(), delay));
      const auto k = check_resume(work.path());
      MESSAGE(mode << " round " << round << ": killed after " << delay.count() << " us, resumed from step " << k);
      furthest = std::max(furthest, k);
    }
    CHECK(furthest > 0);  // the kills landed mid-training, not only before the first step
  }
}

TEST_CASE("a tier directory in use by another process is refused with its pid; killing the holder frees it") {
  const fs::path work = fs::temp_directory_path() / fmt::format("strata-owner-{}", ::getpid());
  fs::remove_all(work);
  fs::create_directories(work);
  const pid_t pid = start_helper("step", work);  // trains on work/tier until killed
  strata::file_tier_options fo;
  fo.directory = work / "tier";
  fo.name = "intruder";
  try {
    strata::file_tier t(fo);
    FAIL("a second process opened a tier directory in use");
  } catch (const strata::busy_error& e) {
    CHECK(e.holder_pid() == pid);
    CHECK(std::string(e.what()).find(fmt::format("pid {}", pid)) != std::string::npos);
  }
  REQUIRE(::kill(pid, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK_NOTHROW(strata::file_tier{fo});  // the lock died with its holder
  fs::remove_all(work);
}
