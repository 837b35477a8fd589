// Crash safety: a process training on a file tier is SIGKILLed at random points during step()
// and during save(); the last complete checkpoint always loads, and training continued from it
// is bit-identical to an uninterrupted run. A job restarted after each of 100 kills resumes by
// itself, on the directories the kills left, with nobody cleaning up; a deleted lock file admits
// no second owner.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <thread>

#include <doctest/doctest.h>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "../test_env.hpp"
#include "kill_common.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace kill_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;

/// Starts the helper and returns its pid once it printed "ready".
pid_t start_helper(const std::string& mode, const fs::path& work) {
  const std::string helper = strata_test::runner_path("STRATA_OFFLOAD_KILL_HELPER");
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    ::execl(helper.c_str(), helper.c_str(), mode.c_str(), work.c_str(), "1000000",
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

/// Starts the helper in `mode` without waiting for it; its stderr goes to `log`.
pid_t spawn_helper(const std::string& mode, const fs::path& work, std::uint64_t max_steps, const fs::path& log) {
  const std::string helper = strata_test::runner_path("STRATA_OFFLOAD_KILL_HELPER");
  const std::string steps = std::to_string(max_steps);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDERR_FILENO);
      ::dup2(fd, STDOUT_FILENO);
    }
    ::execl(helper.c_str(), helper.c_str(), mode.c_str(), work.c_str(), steps.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("SIGKILL during step(), save(), updates as gradients land or speculative ones leaves a checkpoint that "
          "resumes bit-identically") {
  std::mt19937_64 rng(0x5eed);
  for (const std::string mode : {"step", "save", "early", "speculate"}) {
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

TEST_CASE("a tier directory in use by another process is refused with its pid, also once its lock file is deleted; "
          "killing the holder frees it") {
  for (const bool deleted : {false, true}) {
    CAPTURE(deleted);
    const fs::path work = fs::temp_directory_path() / fmt::format("strata-owner-{}", ::getpid());
    fs::remove_all(work);
    fs::create_directories(work);
    const pid_t pid = start_helper("step", work);  // trains on work/tier until killed
    // The directory itself is locked: without its holder file a newcomer is refused all the same.
    if (deleted) REQUIRE(fs::remove(work / "tier" / std::string(strata::directory_lock::file_name)));
    strata::file_tier_options fo;
    fo.directory = work / "tier";
    fo.name = "intruder";
    try {
      strata::file_tier t(fo);
      FAIL("a second process opened a tier directory in use");
    } catch (const strata::busy_error& e) {
      MESSAGE(std::string(e.what()));
      // Without the holder file the pid comes from /proc/locks, where the kernel shows this pid
      // namespace's pids.
      if (!deleted || e.holder_pid() != 0) CHECK(e.holder_pid() == pid);
      if (!deleted) CHECK(std::string(e.what()).find(fmt::format("pid {}", pid)) != std::string::npos);
    }
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK_NOTHROW(strata::file_tier{fo});  // the lock died with its holder
    fs::remove_all(work);
  }
}

TEST_CASE("100 SIGKILLs at random points of a checksummed two-path job: each restart resumes by itself, bit-identically") {
  temp_dir work(fs::temp_directory_path(), "offload-kill-loop");
  const auto log = work.path() / "helper.log";
  std::mt19937_64 rng(0x10c0);
  int kills = 0, runs = 0, inside_writes = 0;
  std::uint64_t furthest = 0;
  while (kills < 100) {
    REQUIRE(runs < 1000);
    ++runs;
    const pid_t pid = spawn_helper("auto", work.path(), 1'000'000, log);
    // Half of the kills in the first 40 ms (start-up, the directory scan, the initial write or
    // the load), half up to 250 ms (a step's reads and padded writes, a save).
    const int us = rng() % 2 == 0 ? std::uniform_int_distribution<int>(0, 40'000)(rng)
                                  : std::uniform_int_distribution<int>(40'000, 250'000)(rng);
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    ::kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      ++kills;
    } else {
      INFO("the job failed on its own after " << kills << " kills:\n" << read_text(log));
      REQUIRE(false);
    }
    if (fs::exists(work.path() / "ckpt" / "manifest"))
      furthest = std::max(furthest, strata::read_checkpoint_manifest(work.path() / "ckpt").step);
    // A state object longer than a subgroup's state: killed inside a padded write.
    for (const auto* d : {"nvme", "pfs"})
      if (fs::exists(work.path() / d))
        for (const auto& e : fs::directory_iterator(work.path() / d))
          if (e.path().filename().string().starts_with("strata.sg-") && fs::file_size(e.path()) % 4096 == 0) {
            ++inside_writes;
            break;
          }
  }
  MESSAGE(kills << " kills in " << runs << " runs (" << inside_writes
                << " left a padded object); the checkpoint reached step " << furthest);
  CHECK(furthest > 0);  // the job made progress between kills, not only restarts
  // The last run is left alone: it resumes once more and finishes 3 steps later.
  const std::uint64_t steps = furthest + 3;
  const pid_t pid = spawn_helper("auto", work.path(), steps, log);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO(read_text(log));
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  strata::host_tier tier(strata::host_tier_options{.name = "check"});
  auto opt = strata::offloaded_adamw<strata::host_tier>::load(work.path() / "ckpt", tier);
  REQUIRE(opt.step_count() == steps);
  flat_reference ref(strata_kill::initial(), strata_kill::options());
  for (std::uint64_t t = 0; t < steps; ++t) {
    const auto g = strata_kill::grads(t);
    ref.step(std::span<const strata::bf16>(g), strata_kill::lr(t));
  }
  require_same_state(opt, ref);
  // What the kills left was reclaimed: the paths hold the job's objects and journal, the
  // checkpoint its manifest, one data file and its journal; no probe, lock or temporary file.
  for (const auto* d : {"nvme", "pfs", "ckpt"})
    for (const auto& e : fs::directory_iterator(work.path() / d)) {
      const auto name = e.path().filename().string();
      CAPTURE(name);
      CHECK((name.starts_with("strata.sg-") || name == ".strata-objects" || name == ".strata-objects.checkpoint" ||
             name == "manifest" ||
             (name.starts_with("state-") && name.ends_with(".bin"))));
    }
}

}  // namespace kill_test
