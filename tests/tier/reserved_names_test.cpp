// The names strata reserves in a directory (its lock ".strata-lock[.<scope>]" and journal
// ".strata-objects[.<scope>]") are strata's only when strata made the file there: a user's file
// at one is refused by name and never written, truncated, renamed over or removed, while the
// files a killed run left are recognised and taken over. Adopting takes only files named as the
// tier's objects and leaves nothing behind; the directories a tier made go with it when empty,
// also those a killed run made, and a failed start leaves none.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "tier_fixtures.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace reserved_names_test {

using namespace strata_test;

namespace {

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

strata::file_tier_options opts(const fs::path& dir, const std::string& scope = {}) {
  auto o = file_opts(dir, strata::io_backend::posix, strata::unlimited_capacity, "names");
  o.scope = scope;
  return o;
}

const std::vector<std::byte> data = random_bytes(5000, 7);

// Runs `body` in a child that then dies without any clean-up (as a killed run does).
template <class Body>
void in_killed_child(Body body) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      body();
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);  // no destructor runs: lock file, journal, objects and directories stay
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

}  // namespace

TEST_CASE("a user's file at a lock or journal name, scoped or not, empty or not, is refused by name and left as it "
          "was") {
  for (const std::string name : {".strata-lock", ".strata-objects", ".strata-lock.opt-a", ".strata-objects.opt-a"})
    for (const std::string& text : {std::string("my notes\n"), std::string()}) {
      CAPTURE(name);
      CAPTURE(text);
      temp_dir dir;
      write_text(dir / name, text);
      const std::string scope = name.ends_with(".opt-a") ? "opt-a" : "";
      try {
        strata::file_tier t(opts(dir.path(), scope));
        FAIL("a tier opened over a user's " << name);
      } catch (const strata::foreign_file_error& e) {
        CHECK(e.path() == dir / name);
        CHECK(std::string(e.what()).find(name) != std::string::npos);
      }
      CHECK(read_text(dir / name) == text);
      CHECK(listing(dir.path()) == std::set<std::string>{name});  // nothing of the attempt is left
    }
}

TEST_CASE("a checkpoint save's directory lock refuses a user's lock file by name and leaves it") {
  temp_dir dir;
  write_text(dir / ".strata-lock", "mine");
  CHECK_THROWS_WITH_AS(strata::directory_lock(dir.path(), "a checkpoint save"), doctest::Contains(".strata-lock"),
                       strata::foreign_file_error);
  CHECK(read_text(dir / ".strata-lock") == "mine");
}

TEST_CASE("the lock files and journal a killed run left are strata's: the next run takes them over and leaves "
          "nothing") {
  for (const std::string scope : {"", "opt-a"}) {
    CAPTURE(scope);
    temp_dir dir;
    in_killed_child([&] {
      auto& t = *new strata::file_tier(opts(dir.path(), scope));  // (never destroyed: the child dies)
      t.write("strata.sg-0", 0, data).get();
    });
    const std::string lock = scope.empty() ? ".strata-lock" : ".strata-lock." + scope;
    REQUIRE(fs::exists(dir / lock));
    CHECK(read_text(dir / lock).starts_with(strata::directory_lock::header));
    {
      strata::file_tier t(opts(dir.path(), scope));
      CHECK(t.used() == data.size());
      CHECK(t.remove("strata.sg-0"));
    }
    CHECK(fs::is_empty(dir.path()));
  }
}

TEST_CASE("a lock file of the release before (no header) is taken over; an empty one is refused and left") {
  temp_dir dir;
  write_text(dir / ".strata-lock", "4242\nfile_tier 'old'\nhost\n0c5e2a3e-2d1b-4f8e-9b57-1b9d1f0e4c11\n12345\n");
  {
    strata::file_tier t(opts(dir.path()));
    CHECK(read_text(dir / ".strata-lock").starts_with(strata::directory_lock::header));
  }
  CHECK(fs::is_empty(dir.path()));
  write_text(dir / ".strata-lock", "");
  CHECK_THROWS_WITH_AS(strata::file_tier(opts(dir.path())), doctest::Contains("is empty"), strata::foreign_file_error);
  CHECK(fs::exists(dir / ".strata-lock"));
}

TEST_CASE("adopting takes only files named as the tier's objects, and leaves nothing of the tier behind") {
  temp_dir dir;
  for (const auto* n : {"strata.sg-3", "strata.gr-1", "thesis.txt", "strata.sg-x", "other.sg-1", "strata.sg-"})
    write_text(dir / n, "theirs");
  auto o = opts(dir.path());
  o.adopt_existing = true;
  {
    strata::file_tier t(o);
    CHECK(t.used() == 2 * 6);
    t.write("strata.sg-3", 0, data).get();
    CHECK(t.remove("strata.sg-3"));
    CHECK(t.remove("strata.gr-1"));
    for (const auto* n : {"thesis.txt", "strata.sg-x", "other.sg-1", "strata.sg-"}) {
      CAPTURE(n);
      CHECK_THROWS_AS(t.write(n, 0, data).get(), strata::foreign_file_error);
      CHECK_THROWS_AS((void)t.remove(n), strata::foreign_file_error);
    }
  }
  CHECK(listing(dir.path()) == std::set<std::string>{"thesis.txt", "strata.sg-x", "other.sg-1", "strata.sg-"});
  CHECK(read_text(dir / "thesis.txt") == "theirs");
  o.adoptable_prefixes = {"other.sg-"};  // another optimizer's prefix: only its objects
  {
    strata::file_tier t(o);
    CHECK(t.used() == 6);
    CHECK(t.remove("other.sg-1"));
  }
  CHECK(listing(dir.path()) == std::set<std::string>{"thesis.txt", "strata.sg-x", "strata.sg-"});
}

TEST_CASE("a failed start leaves no directory it made, and the directories it did not make as they were") {
  temp_dir dir;
  auto o = opts(dir / "made" / "by" / "tier");
  o.direct = true;
  // Every open of the O_DIRECT probe fails: the start fails after the directory, lock and journal exist.
  o.syscalls.open = [](const char*, int, mode_t) -> int {
    errno = EIO;
    return -1;
  };
  CHECK_THROWS_AS(strata::file_tier{o}, strata::io_error);
  CHECK(fs::is_empty(dir.path()));
  // A directory that was there stays (and its user's file).
  fs::create_directories(dir / "theirs");
  write_text(dir / "theirs" / "notes.txt", "mine");
  o.directory = dir / "theirs";
  CHECK_THROWS_AS(strata::file_tier{o}, strata::io_error);
  CHECK(listing(dir / "theirs") == std::set<std::string>{"notes.txt"});
  fs::remove(dir / "theirs" / "notes.txt");
  CHECK_THROWS_AS(strata::file_tier{o}, strata::io_error);
  CHECK(fs::is_directory(dir / "theirs"));
}

TEST_CASE("a tier's clean end removes the directories it made, and keeps those that hold anything else") {
  temp_dir dir;
  {
    strata::file_tier t(opts(dir / "a" / "b"));
    t.write("x", 0, data).get();
    CHECK(t.remove("x"));
  }
  CHECK(fs::is_empty(dir.path()));
  {
    strata::file_tier t(opts(dir / "a" / "b"));
    write_text(dir / "a" / "notes.txt", "mine");  // a user's file beside the tier's directory
  }
  CHECK(listing(dir.path()) == std::set<std::string>{"a"});
  CHECK(listing(dir / "a") == std::set<std::string>{"notes.txt"});
  // A journal (strata's) that records directories with another identity, or not above the
  // tier's, removes none of them.
  const auto d = dir / "theirs";
  fs::create_directories(d);
  write_text(d / ".strata-objects", std::string(strata::detail::object_journal::header) + "d 1:2 " + d.string() +
                                        "\nd 1:3 " + (dir / "a").string() + "\n");
  { strata::file_tier t(opts(d)); }
  CHECK(fs::is_directory(d));
  CHECK(fs::is_empty(d));
  CHECK(fs::exists(dir / "a" / "notes.txt"));
}

TEST_CASE("directories a killed run made are removed by the next run's clean end; one with a user's file stays") {
  temp_dir dir;
  const auto deep = dir / "made" / "deep";
  in_killed_child([&] {
    auto& t = *new strata::file_tier(opts(deep));  // (never destroyed: the child dies)
    t.write("strata.sg-0", 0, data).get();
  });
  REQUIRE(fs::exists(deep / "strata.sg-0"));
  {
    strata::file_tier t(opts(deep));
    CHECK(t.remove("strata.sg-0"));
  }
  CHECK(fs::is_empty(dir.path()));
  // Killed again, with nothing written: the next run still knows the directories for its own.
  in_killed_child([&] { (void)new strata::file_tier(opts(deep)); });
  REQUIRE(fs::is_directory(deep));
  { strata::file_tier t(opts(deep)); }
  CHECK(fs::is_empty(dir.path()));
  // A user's file put into them meanwhile keeps them (and is left alone).
  in_killed_child([&] { (void)new strata::file_tier(opts(deep)); });
  write_text(dir / "made" / "notes.txt", "mine");
  { strata::file_tier t(opts(deep)); }
  CHECK(listing(dir / "made") == std::set<std::string>{"notes.txt"});
}

}  // namespace reserved_names_test
