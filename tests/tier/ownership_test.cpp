// No file strata writes can be a user's: a file_tier writes and removes only objects it made
// (named in its directory's journal, also across a killed run), never follows a symlink, never
// blocks on a FIFO, never changes another user's file or a hard link, and locks the directory
// itself, so a deleted lock file admits nobody.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "tier_fixtures.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace ownership_test {

using namespace strata_test;

namespace {

strata::file_tier_options opts(const fs::path& dir) {
  return file_opts(dir, strata::io_backend::automatic, strata::unlimited_capacity, "own");
}

const std::vector<std::byte> data = random_bytes(5000, 1);  // not a multiple of a block: padded writes

}  // namespace

TEST_CASE("objects a run left are the next run's own: the journal names them, they are rewritten and removed") {
  temp_dir dir;
  {
    strata::file_tier a(opts(dir.path()));
    a.write("strata.sg-0", 0, data).get();
    a.write("strata.sg-1", 0, data).get();
    CHECK(a.remove("strata.sg-1"));
  }  // as a killed run leaves them: objects and journal stay
  CHECK(fs::exists(dir / ".strata-objects"));
  strata::file_tier b(opts(dir.path()));
  CHECK(b.size("strata.sg-0") == data.size());
  CHECK(b.used() == data.size());
  b.write("strata.sg-0", 0, random_bytes(100, 2)).get();
  CHECK(b.remove("strata.sg-0"));
  CHECK_FALSE(b.remove("strata.sg-0"));
}

TEST_CASE("tiers of other scopes share a directory, each owning only its objects; a second owner of a scope is "
          "refused") {
  temp_dir dir;
  auto scoped = [&](const std::string& scope) {
    auto o = opts(dir.path());
    o.scope = scope;
    return o;
  };
  {
    strata::file_tier a(scoped("opt-a"));
    strata::file_tier b(scoped("opt-b"));
    a.write("opt-a.sg-0", 0, data).get();
    b.write("opt-b.sg-0", 0, data).get();
    CHECK(fs::exists(dir / ".strata-lock.opt-a"));
    CHECK(fs::exists(dir / ".strata-objects.opt-b"));
    try {
      strata::file_tier again(scoped("opt-a"));
      FAIL("a second owner of scope opt-a was admitted");
    } catch (const strata::busy_error& e) {
      CHECK(std::string(e.what()).find("scope 'opt-a'") != std::string::npos);
    }
    // The other scope's object is foreign to this one: never written or removed.
    CHECK_THROWS_AS(a.write("opt-b.sg-0", 0, data).get(), strata::foreign_file_error);
    CHECK_THROWS_AS((void)a.remove("opt-b.sg-0"), strata::foreign_file_error);
    CHECK(b.used() == data.size());
  }  // (a killed run leaves objects and journals)
  {
    strata::file_tier a(scoped("opt-a"));  // reclaims only its own
    CHECK(a.used() == data.size());
    CHECK(a.remove("opt-a.sg-0"));
    CHECK(fs::exists(dir / "opt-b.sg-0"));
  }
  CHECK_FALSE(fs::exists(dir / ".strata-lock.opt-a"));
  CHECK_FALSE(fs::exists(dir / ".strata-objects.opt-a"));
  CHECK_THROWS_AS(strata::file_tier(scoped("../x")), strata::config_error);
}

TEST_CASE("the journal goes with the last object: nothing of the tier is left in the directory") {
  temp_dir dir;
  {
    strata::file_tier t(opts(dir.path()));
    t.write("x", 0, data).get();
    CHECK(t.remove("x"));
  }
  CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("a file no journal names is someone else's: readable, never written or removed, unless adopted (named as "
          "the tier's objects are)") {
  temp_dir dir;
  write_text(dir / "strata.sg-3", "another job's state");
  write_text(dir / "notes.txt", "mine");
  {
    strata::file_tier t(opts(dir.path()));
    CHECK(t.size("strata.sg-3") == 19);
    CHECK(t.used() == 0);  // not counted against the tier's budget
    std::vector<std::byte> back(19);
    t.read("strata.sg-3", 0, back).get();
    try {
      t.write("strata.sg-3", 0, data).get();
      FAIL("wrote over a file strata did not make");
    } catch (const strata::foreign_file_error& e) {
      CHECK(e.path() == dir / "strata.sg-3");
      CHECK(std::string(e.what()).find("strata.sg-3") != std::string::npos);
      CHECK(std::string(e.what()).find("adopt_existing") != std::string::npos);
    }
    CHECK_THROWS_AS(t.remove("strata.sg-3"), strata::foreign_file_error);
    CHECK_THROWS_AS(t.remove("notes.txt"), strata::busy_error);  // (foreign_file_error is one)
  }
  CHECK(read_text(dir / "strata.sg-3") == "another job's state");
  CHECK(read_text(dir / "notes.txt") == "mine");
  auto adopt = opts(dir.path());
  adopt.adopt_existing = true;
  {
    strata::file_tier t(adopt);
    CHECK(t.used() == 19);  // notes.txt is no object's name: never adopted
    t.write("strata.sg-3", 0, data).get();
    CHECK_THROWS_AS(t.remove("notes.txt"), strata::foreign_file_error);
  }
  strata::file_tier later(opts(dir.path()));  // adopted files are recorded like the tier's own
  CHECK(later.remove("strata.sg-3"));
  CHECK(read_text(dir / "notes.txt") == "mine");
}

TEST_CASE("a file that appears under a new object's name after the tier opened stays its maker's") {
  temp_dir dir;
  strata::file_tier t(opts(dir.path()));
  write_text(dir / "late", "made after the scan");
  CHECK_THROWS_AS(t.write("late", 0, data).get(), strata::foreign_file_error);
  CHECK_THROWS_AS(t.remove("late"), strata::foreign_file_error);
  CHECK(read_text(dir / "late") == "made after the scan");
  t.write("fine", 0, data).get();  // the tier goes on with other objects
}

TEST_CASE("symlinks, dangling symlinks, FIFOs and hard links under object names are never followed or changed") {
  temp_dir dir, outside(fs::temp_directory_path(), "outside");
  write_text(outside / "users-file", "precious");
  fs::create_symlink(outside / "users-file", dir / "link");
  fs::create_symlink(outside / "created-by-strata", dir / "dangling");
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0644) == 0);
  fs::create_hard_link(outside / "users-file", dir / "hardlink");
  for (const bool adopt : {false, true}) {  // adopting takes only plain files
    CAPTURE(adopt);
    auto o = opts(dir.path());
    o.adopt_existing = adopt;
    strata::file_tier t(o);
    for (const auto* name : {"link", "dangling", "fifo", "hardlink"}) {
      CAPTURE(name);
      CHECK_THROWS_AS(t.write(name, 0, data).get(), strata::foreign_file_error);
      CHECK_THROWS_AS(t.remove(name), strata::foreign_file_error);
    }
    std::vector<std::byte> back(4);
    CHECK_THROWS(t.read("link", 0, back).get());  // not followed for reads either
    CHECK_THROWS(t.read("fifo", 0, back).get());  // and never blocks
  }
  CHECK(read_text(outside / "users-file") == "precious");
  CHECK_FALSE(fs::exists(outside / "created-by-strata"));
  CHECK(fs::is_symlink(dir / "link"));
  CHECK(fs::is_fifo(dir / "fifo"));
}

TEST_CASE("a lock or journal file that is a symlink or a FIFO is refused, and its target left alone") {
  temp_dir outside(fs::temp_directory_path(), "outside");
  write_text(outside / "users-file", "precious");
  for (const std::string own : {".strata-lock", ".strata-objects"}) {
    CAPTURE(own);
    {  // a symlink to a user's file
      temp_dir dir;
      fs::create_symlink(outside / "users-file", dir / own);
      CHECK_THROWS_WITH_AS(strata::file_tier(opts(dir.path())), doctest::Contains("is a symlink"),
                           strata::foreign_file_error);
      CHECK(read_text(outside / "users-file") == "precious");
    }
    {  // a dangling symlink: nothing is created where it points
      temp_dir dir;
      fs::create_symlink(outside / ("made" + own), dir / own);
      CHECK_THROWS_AS(strata::file_tier(opts(dir.path())), strata::foreign_file_error);
      CHECK_FALSE(fs::exists(outside / ("made" + own)));
    }
    {  // a FIFO: refused at once, never blocks
      temp_dir dir;
      REQUIRE(::mkfifo((dir / own).c_str(), 0644) == 0);
      CHECK_THROWS_WITH_AS(strata::file_tier(opts(dir.path())), doctest::Contains("is a FIFO"),
                           strata::foreign_file_error);
    }
  }
}

TEST_CASE("the directory itself is locked: deleting the lock file admits no second owner") {
  temp_dir dir;
  strata::file_tier first(opts(dir.path()));
  REQUIRE(fs::remove(dir / std::string(strata::directory_lock::file_name)));
  auto o = opts(dir.path());
  o.name = "second";
  CHECK_THROWS_AS(strata::file_tier{o}, strata::busy_error);
  // Another process meets the same lock (a child that only opens the tier and reports).
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      strata::directory_lock l(dir.path(), "child");
      ::_exit(1);
    } catch (const strata::busy_error&) {
      ::_exit(0);
    } catch (...) {
      ::_exit(2);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("a journal without strata's header is not strata's: the tier is refused by its name, and it and the files "
          "it names are left alone") {
  temp_dir dir;
  {
    strata::file_tier t(opts(dir.path()));
    t.write("a", 0, data).get();
  }
  write_text(dir / ".strata-objects", "garbage\n+ a\n");
  CHECK_THROWS_WITH_AS(strata::file_tier(opts(dir.path())), doctest::Contains(".strata-objects"),
                       strata::foreign_file_error);
  CHECK(read_text(dir / ".strata-objects") == "garbage\n+ a\n");
  CHECK(fs::file_size(dir / "a") == data.size());
}

}  // namespace ownership_test
