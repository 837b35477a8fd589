// A node link's file is shared by every process of a node, and anyone with access can damage it
// under its users: truncate it, scribble over it, replace it, plant a link or a FIFO at its name,
// or hold its lock forever. None of that may crash (SIGBUS), hang or wedge a user: each case is
// either recovered from or refused with a typed error naming the file. Cases that crashed or hung
// before run in a forked child, watched by a hang guard, so that the runner survives to say so.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../child_process.hpp"
#include "tier_fixtures.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace node_link_damage_test {

using namespace strata_test;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;
using strata::detail::node_link;

namespace {


std::int64_t ns(clk::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// Overwrites `bytes` of `path` at `offset` (extending it where needed), as a stray process would.
void scribble(const fs::path& path, std::uint64_t offset, const std::vector<std::byte>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A slot a sound link gives for 1 ms asked for now: it starts within the hang guard's reach of
/// now (a damaged time line hands out slots hours or years ahead) and lasts what was asked.
bool sane(const strata::detail::link_slot& s, clk::time_point asked) {
  return s.start >= asked && s.start - asked < 30s && s.end - s.start == clk::duration(1ms);
}

}  // namespace

TEST_CASE("a node link file truncated under its users is set up again at the next use, without a signal") {
  temp_dir dir;
  const auto end = in_child([&] {
    notices seen;
    node_link a("t", dir.path()), b("t", dir.path());
    (void)a.reserve(0, clk::now(), 1ms, a.new_tag(), 0ms);
    for (const off_t size : {off_t{0}, off_t{10}, off_t{60}}) {
      if (::truncate(a.path().c_str(), size) != 0) return 1;
      auto now = clk::now();
      if (!sane(a.reserve(0, now, 1ms, a.new_tag(), 0ms), now)) return 2;  // the handle that saw it whole
      now = clk::now();
      if (!sane(b.reserve(1, now, 1ms, b.new_tag(), 0ms), now)) return 3;
      node_link c("t", dir.path());  // and a newcomer
      if (c.new_tag() == 0) return 4;
    }
    if (!seen.any_with(a.path().string(), "truncated")) return 5;  // and says so, naming the file
    return 0;
  });
  INFO(describe(end));
  CHECK(end.ok());
}

TEST_CASE("garbage over the middle of a node link file (once its lock word) neither hangs nor fails its users") {
  temp_dir dir;
  for (const auto fill : {std::byte{0xff}, std::byte{0x00}, std::byte{0xa5}}) {
    CAPTURE(static_cast<int>(fill));
    const auto end = in_child([&] {
      notices seen;
      node_link a("m", dir.path());
      (void)a.new_tag();
      scribble(a.path(), 48, std::vector<std::byte>(40, fill));  // where the robust mutex of layout 1 lay
      node_link b("m", dir.path());
      auto now = clk::now();
      if (!sane(a.reserve(0, now, 1ms, a.new_tag(), 0ms), now)) return 1;
      now = clk::now();
      if (!sane(b.reserve(0, now, 1ms, b.new_tag(), 0ms), now)) return 2;
      if (fill != std::byte{0x00} && !seen.any_with(a.path().string(), "damaged")) return 3;
      return 0;
    });
    INFO(describe(end));
    CHECK(end.ok());
  }
}

TEST_CASE("random bytes over a whole node link file are set up again, for its users and for newcomers") {
  temp_dir dir;
  const auto end = in_child([&] {
    notices quiet;
    node_link a("r", dir.path());
    for (std::uint64_t seed = 1; seed <= 40; ++seed) {
      const std::size_t size = seed % 4 == 0 ? 4096 : static_cast<std::size_t>(fs::file_size(a.path()));
      scribble(a.path(), 0, random_bytes(size, seed));
      auto now = clk::now();
      if (!sane(a.reserve(0, now, 1ms, a.new_tag(), 1ms), now)) return 1;  // the user it happened under
      scribble(a.path(), 0, random_bytes(size, seed + 1000));
      node_link b("r", dir.path());
      now = clk::now();
      if (!sane(b.reserve(seed % 2, now, 1ms, b.new_tag(), 1ms), now)) return 2;  // a newcomer
    }
    return 0;
  });
  INFO(describe(end));
  CHECK(end.ok());
}

TEST_CASE("a node link's time line a year ahead of now is cut back to now, with a notice naming the file") {
  temp_dir dir;
  node_link l("y", dir.path());
  const auto tag = l.new_tag();
  const auto year = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::hours(24 * 365)).count();

  SUBCASE("written over the raw bytes (where it lies is found from a reservation's end)") {
    const auto s = l.reserve(0, clk::now(), 1ms, tag, 0ms);
    const auto bytes = read_all(l.path());
    const std::int64_t end = ns(s.end);
    std::size_t at = bytes.size();
    for (std::size_t i = 0; i + 8 <= bytes.size(); i += 8)
      if (std::memcmp(bytes.data() + i, &end, 8) == 0) at = i;
    REQUIRE(at < bytes.size());
    const std::int64_t ahead = ns(clk::now()) + year;
    std::vector<std::byte> v(8);
    std::memcpy(v.data(), &ahead, 8);
    scribble(l.path(), at, v);
  }
  SUBCASE("in a record with a valid checksum (as a bug or a foreign clock would leave it)") {
    node_link::record r{};
    const int fd = ::open(l.path().c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    REQUIRE(::pread(fd, &r, sizeof r, 0) == static_cast<ssize_t>(sizeof r));
    r.next_free[0] = ns(clk::now()) + year;
    r.checksum = node_link::seal(r);
    REQUIRE(::pwrite(fd, &r, sizeof r, 0) == static_cast<ssize_t>(sizeof r));
    ::close(fd);
  }
  notices seen;
  const auto now = clk::now();
  const auto s = l.reserve(0, now, 1ms, tag, 0ms);
  CHECK(sane(s, now));
  CHECK(seen.any_with(l.path().string()));
}

TEST_CASE("a node link's long but real backlog (an hour of link time queued) is kept") {
  temp_dir dir;
  node_link l("h", dir.path());
  const auto now = clk::now();
  const auto first = l.reserve(0, now, 1h, l.new_tag(), 0ms);
  const auto second = l.reserve(0, clk::now(), 1ms, l.new_tag(), 0ms);
  CHECK(second.start == first.end);
}

TEST_CASE("a symlink at a node link's path is refused, and the file it points to is left as it was") {
  temp_dir dir;
  const auto users_file = dir.path() / "notes.txt";
  { std::ofstream(users_file) << "a user's precious notes"; }
  fs::create_symlink(users_file, dir.path() / "link-s");
  CHECK_THROWS_WITH_AS(node_link("s", dir.path()), doctest::Contains((dir.path() / "link-s").c_str()),
                       strata::foreign_file_error);
  CHECK(read_all(users_file) == "a user's precious notes");
}

TEST_CASE("a dangling symlink at a node link's path is refused, and nothing is created where it points") {
  temp_dir dir, elsewhere;
  const auto target = elsewhere.path() / "created-by-mistake";
  fs::create_symlink(target, dir.path() / "link-d");
  CHECK_THROWS_WITH_AS(node_link("d", dir.path()), doctest::Contains((dir.path() / "link-d").c_str()),
                       strata::foreign_file_error);
  CHECK_FALSE(fs::exists(target));
}

TEST_CASE("a FIFO or a directory at a node link's path is refused at once, naming it") {
  temp_dir dir;
  REQUIRE(::mkfifo((dir.path() / "link-f").c_str(), 0600) == 0);
  fs::create_directory(dir.path() / "link-g");
  const auto end = in_child([&] {  // a FIFO must not block the open
    try {
      node_link l("f", dir.path());
    } catch (const strata::foreign_file_error& e) {
      return std::string(e.what()).find("FIFO") != std::string::npos && e.path() == dir.path() / "link-f" ? 0 : 1;
    }
    return 2;
  });
  INFO(describe(end));
  CHECK(end.ok());
  CHECK_THROWS_WITH_AS(node_link("g", dir.path()), doctest::Contains("a directory"), strata::foreign_file_error);
}

TEST_CASE("a node link directory that is a symlink is refused, and nothing is created where it points") {
  temp_dir dir, elsewhere;
  fs::create_symlink(elsewhere.path(), dir.path() / "nodes");
  CHECK_THROWS_WITH_AS(node_link("x", dir.path() / "nodes"), doctest::Contains((dir.path() / "nodes").c_str()),
                       strata::foreign_file_error);
  CHECK(fs::is_empty(elsewhere.path()));
}

TEST_CASE("a node link file or directory of another user is refused, naming it") {
  if (::geteuid() != 0) return;  // only root can give a file away
  temp_dir dir;
  node_link mine("o", dir.path());
  REQUIRE(::chown(mine.path().c_str(), 4242, 4242) == 0);
  CHECK_THROWS_WITH_AS(node_link("o", dir.path()), doctest::Contains("uid 4242"), strata::foreign_file_error);
  const auto theirs = dir.path() / "theirs";
  fs::create_directory(theirs);
  REQUIRE(::chown(theirs.c_str(), 4242, 4242) == 0);
  CHECK_THROWS_WITH_AS(node_link("p", theirs), doctest::Contains(theirs.c_str()), strata::foreign_file_error);
  CHECK(fs::is_empty(theirs));
}

TEST_CASE("users of a node link whose file was removed or replaced follow its path and share one time line again") {
  temp_dir dir;
  const auto at = [](int ms) { return clk::time_point(std::chrono::milliseconds(1'000'000 + ms)); };
  node_link a("p", dir.path());
  const auto x = a.new_tag();
  SUBCASE("removed") { fs::remove(a.path()); }
  SUBCASE("replaced by rename") {
    { std::ofstream(dir.path() / "new") << ""; }
    fs::rename(dir.path() / "new", a.path());
  }
  node_link b("p", dir.path());  // a newcomer makes or opens the new file
  CHECK(b.reserve(0, at(0), 10ms, x, 0ms).start == at(0));
  CHECK(a.reserve(0, at(0), 10ms, x, 0ms).start == at(10));  // a sees b's slot
  CHECK(b.reserve(0, at(0), 10ms, x, 0ms).start == at(20));
}

TEST_CASE("a node link whose lock another process never lets go is replaced, and its users go on") {
  temp_dir dir;
  node_link a("k", dir.path());
  const int stuck = ::open(a.path().c_str(), O_RDWR);  // as a process stopped inside its critical section
  REQUIRE(stuck >= 0);
  REQUIRE(::flock(stuck, LOCK_EX) == 0);
  struct stat before{};
  REQUIRE(::stat(a.path().c_str(), &before) == 0);
  const auto end = in_child([&] {  // the hang guard: it must come back after node_link::lock_patience
    notices seen;
    node_link c("k", dir.path());
    const auto now = clk::now();
    if (!sane(c.reserve(0, now, 1ms, c.new_tag(), 0ms), now)) return 1;
    return seen.any_with(c.path().string(), "locked for over") ? 0 : 2;  // and says so
  });
  INFO(describe(end));
  CHECK(end.ok());
  struct stat after{};
  REQUIRE(::stat(a.path().c_str(), &after) == 0);
  CHECK(after.st_ino != before.st_ino);  // a fresh file under the path
  const auto now = clk::now();
  CHECK(sane(a.reserve(0, now, 1ms, a.new_tag(), 0ms), now));  // a follows it at once
  node_link b("k", dir.path());  // and shares it with newcomers
  const auto t = clk::now() + 1h;
  CHECK(a.reserve(1, t, 10ms, 1, 0ms).start == t);
  CHECK(b.reserve(1, t, 10ms, 1, 0ms).start == t + 10ms);
  ::close(stuck);
}

TEST_CASE("a throttled request whose node link fails fails its future, and the tier can still be destroyed") {
  temp_dir dir;
  ::setenv("STRATA_NODE_LIMITER_DIR", dir.path().c_str(), 1);
  const auto end = in_child([&] {
    strata::throttled<strata::host_tier> t(
        strata::throttle_options{.read_bandwidth = 1e9, .write_bandwidth = 1e9, .link = "broken"},
        strata::host_tier_options{.name = "pfs"});
    const auto file = dir.path() / "link-broken";
    fs::remove(file);
    fs::create_symlink(dir.path() / "elsewhere", file);  // the next use opens the path again, and refuses it
    try {
      t.write("x", 0, random_bytes(100, 1)).get();
      return 1;
    } catch (const strata::foreign_file_error&) {
    }
    return fs::exists(dir.path() / "elsewhere") ? 2 : 0;
  });  // returning at all means ~throttled did not wait forever for the failed request
  ::unsetenv("STRATA_NODE_LIMITER_DIR");
  INFO(describe(end));
  CHECK(end.ok());
}

}  // namespace node_link_damage_test
