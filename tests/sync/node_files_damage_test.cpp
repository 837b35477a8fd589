// A node_limiter's files (its directory, queue.lock, the ticket files) are shared by every
// process of a node, and anyone with access can damage them under their users: scribble over
// queue.lock, remove it, plant a link or a FIFO at one of its names. None of that may hang,
// let two holders in past the cap, write through a link, or crash: each case is recovered from
// or refused with a typed error naming the file. Cases that hung before run in a forked child,
// watched by a hang guard, so that the runner survives to say so.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "strata/core/notice.hpp"
#include "strata/sync/node_limiter.hpp"
#include "../child_process.hpp"
#include "temp_dir.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace node_files_damage_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;
using namespace strata_test;

namespace {


/// Replaces the whole of `path` with `bytes`, as a stray process would.
void overwrite(const fs::path& path, const void* bytes, std::size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes, size) == static_cast<ssize_t>(size));
  ::close(fd);
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// One permit of "io" is held by `holder`: `other` gets none, however often it asks.
void check_excludes(strata::node_limiter& holder, strata::node_limiter& other) {
  holder.acquire();
  for (int i = 0; i < 4; ++i) CHECK_FALSE(other.try_acquire());
  holder.release();
  CHECK(other.try_acquire());
  other.release();
}

}  // namespace

TEST_CASE("garbage in queue.lock while no ticket is live is set up again, and the limiter works") {
  temp_dir dir;
  { strata::node_limiter make("io", 1, dir.path()); }
  const auto lock = dir.path() / "io" / "queue.lock";
  std::mt19937_64 g(7);
  for (std::size_t size : {1, 7, 16, 31, 32, 33, 64, 4096}) {
    CAPTURE(size);
    std::vector<unsigned char> junk(size);
    for (auto& b : junk) b = static_cast<unsigned char>(g());
    overwrite(lock, junk.data(), junk.size());
    notices seen;
    strata::node_limiter a("io", 1, dir.path()), b("io", 1, dir.path());
    CHECK(seen.any_with(lock.string(), "damaged"));
    check_excludes(a, b);
  }
}

TEST_CASE("a queue.lock whose ticket counter is near 2^64 neither wraps nor lets a second holder in") {
  temp_dir dir;
  { strata::node_limiter make("io", 1, dir.path()); }
  const auto lock = dir.path() / "io" / "queue.lock";
  const auto max = std::numeric_limits<std::uint64_t>::max();
  for (const std::array<std::uint64_t, 2> raw : {std::array<std::uint64_t, 2>{1, max - 1},
                                                 std::array<std::uint64_t, 2>{0, max},
                                                 std::array<std::uint64_t, 2>{max, 5}}) {
    CAPTURE(raw[0]);
    CAPTURE(raw[1]);
    overwrite(lock, raw.data(), sizeof raw);  // permits and counter as the bare numbers they once were
    notices quiet;
    strata::node_limiter a("io", 1, dir.path()), b("io", 1, dir.path());
    check_excludes(a, b);
    check_excludes(b, a);
  }
}

TEST_CASE("a queue.lock damaged while processes hold and wait is rebuilt behind their tickets") {
  temp_dir dir;
  strata::node_limiter holder("io", 1, dir.path());
  holder.acquire();
  const auto lock = dir.path() / "io" / "queue.lock";
  const std::string junk(32, '\x5a');
  overwrite(lock, junk.data(), junk.size());
  notices seen;
  strata::node_limiter other("io", 1, dir.path());  // a newcomer meets the damage
  CHECK(seen.any_with(lock.string(), "rebuilt"));
  CHECK_FALSE(other.try_acquire());  // its ticket comes after the holder's: no second holder
  CHECK_FALSE(other.try_acquire());
  holder.release();
  CHECK(other.try_acquire());
  CHECK_FALSE(holder.try_acquire());
  other.release();
}

TEST_CASE("a queue.lock damaged while a ticket of another cap (or an unreadable one) is live is a config_error "
          "naming it, until none is") {
  temp_dir dir;
  const auto lock = dir.path() / "io" / "queue.lock";
  const std::string junk(32, '\x5a');
  SUBCASE("a holder with another cap") {
    strata::node_limiter holder("io", 2, dir.path());
    holder.acquire();
    overwrite(lock, junk.data(), junk.size());
    CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1, dir.path()), doctest::Contains(lock.c_str()),
                         strata::config_error);
    holder.release();
  }
  SUBCASE("a live ticket that records no cap") {
    { strata::node_limiter make("io", 1, dir.path()); }
    const auto t = dir.path() / "io" / "t-00000000000000000003";
    const int fd = ::open(t.c_str(), O_RDWR | O_CREAT, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    overwrite(lock, junk.data(), junk.size());
    CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1, dir.path()), doctest::Contains(lock.c_str()),
                         strata::config_error);
    ::close(fd);  // the "process" is gone: its ticket is dead
  }
  notices quiet;
  strata::node_limiter a("io", 1, dir.path()), b("io", 1, dir.path());  // set up again
  check_excludes(a, b);
}

TEST_CASE("users of a queue.lock that was removed open it again by its path and keep excluding each other") {
  temp_dir dir;
  strata::node_limiter a("io", 1, dir.path());
  for (int i = 0; i < 3; ++i) {  // its counter moves on
    a.acquire();
    a.release();
  }
  fs::remove(dir.path() / "io" / "queue.lock");
  strata::node_limiter b("io", 1, dir.path());  // makes a new one, counting from 0
  check_excludes(a, b);
  check_excludes(b, a);
}

TEST_CASE("an entry named like a ticket that is no ticket (a symlink to a locked file, a FIFO) is never counted") {
  temp_dir dir, elsewhere;
  { strata::node_limiter make("io", 1, dir.path()); }
  const auto target = elsewhere.path() / "locked-by-someone";
  { std::ofstream(target) << "theirs"; }
  const int fd = ::open(target.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);  // held for good: followed, it would look like a live holder
  fs::create_symlink(target, dir.path() / "io" / "t-00000000000000000000");
  REQUIRE(::mkfifo((dir.path() / "io" / "t-00000000000000000001").c_str(), 0600) == 0);
  const auto end = in_child([&] {
    strata::node_limiter l("io", 1, dir.path());
    if (!l.try_acquire_for(10s)) return 1;
    l.release();
    return 0;
  });
  INFO(describe(end));
  CHECK(end.ok());
  CHECK(read_all(target) == "theirs");
  ::close(fd);
}

TEST_CASE("a symlink at queue.lock is refused, and the file it points to is left as it was") {
  temp_dir dir;
  const auto users_file = dir.path() / "notes.txt";
  { std::ofstream(users_file) << "a user's precious notes"; }
  fs::create_directory(dir.path() / "io");
  fs::create_symlink(users_file, dir.path() / "io" / "queue.lock");
  CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1, dir.path()),
                       doctest::Contains((dir.path() / "io" / "queue.lock").c_str()), strata::foreign_file_error);
  CHECK(read_all(users_file) == "a user's precious notes");
}

TEST_CASE("a dangling symlink at queue.lock is refused, and nothing is created where it points") {
  temp_dir dir, elsewhere;
  const auto target = elsewhere.path() / "created-by-mistake";
  fs::create_directory(dir.path() / "io");
  fs::create_symlink(target, dir.path() / "io" / "queue.lock");
  CHECK_THROWS_AS(strata::node_limiter("io", 1, dir.path()), strata::foreign_file_error);
  CHECK_FALSE(fs::exists(target));
}

TEST_CASE("a FIFO at queue.lock is refused at once, naming it") {
  temp_dir dir;
  fs::create_directory(dir.path() / "io");
  const auto lock = dir.path() / "io" / "queue.lock";
  REQUIRE(::mkfifo(lock.c_str(), 0600) == 0);
  const auto end = in_child([&] {  // a FIFO must not block the open
    try {
      strata::node_limiter l("io", 1, dir.path());
    } catch (const strata::foreign_file_error& e) {
      return std::string(e.what()).find("FIFO") != std::string::npos && e.path() == lock ? 0 : 1;
    }
    return 2;
  });
  INFO(describe(end));
  CHECK(end.ok());
}

TEST_CASE("a node directory or limiter directory that is a symlink is refused, and nothing is created where it "
          "points") {
  temp_dir dir, elsewhere;
  SUBCASE("the node directory, given") {
    fs::create_symlink(elsewhere.path(), dir.path() / "nodes");
    CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1, dir.path() / "nodes"),
                         doctest::Contains((dir.path() / "nodes").c_str()), strata::foreign_file_error);
  }
  SUBCASE("the node directory, from STRATA_NODE_LIMITER_DIR") {
    fs::create_symlink(elsewhere.path(), dir.path() / "nodes");
    ::setenv("STRATA_NODE_LIMITER_DIR", (dir.path() / "nodes").c_str(), 1);
    CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1), doctest::Contains("symlink"), strata::foreign_file_error);
    ::unsetenv("STRATA_NODE_LIMITER_DIR");
  }
  SUBCASE("the limiter's own directory") {
    fs::create_symlink(elsewhere.path(), dir.path() / "io");
    CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1, dir.path()), doctest::Contains((dir.path() / "io").c_str()),
                         strata::foreign_file_error);
  }
  CHECK(fs::is_empty(elsewhere.path()));
}

TEST_CASE("a node directory or queue.lock of another user is refused, naming it") {
  if (::geteuid() != 0) return;  // only root can give a file away
  temp_dir dir;
  const auto theirs = dir.path() / "theirs";
  fs::create_directory(theirs);
  REQUIRE(::chown(theirs.c_str(), 4242, 4242) == 0);
  CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1, theirs), doctest::Contains("uid 4242"),
                       strata::foreign_file_error);
  { strata::node_limiter make("io", 1, dir.path()); }
  REQUIRE(::chown((dir.path() / "io" / "queue.lock").c_str(), 4242, 4242) == 0);
  CHECK_THROWS_WITH_AS(strata::node_limiter("io", 1, dir.path()), doctest::Contains("uid 4242"),
                       strata::foreign_file_error);
}

}  // namespace node_files_damage_test
