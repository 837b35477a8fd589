#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "strata/core/env.hpp"
#include "strata/core/node_dir.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/tier/file_tier.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace env_test {

namespace {
// Sets a variable for one scope and restores the previous state after.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    had_ = std::getenv(name) != nullptr;
    ::setenv(name, value, 1);
  }
  ~scoped_env() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};
}  // namespace

TEST_CASE("unset variables give the default") {
  ::unsetenv("STRATA_TEST_X");
  CHECK(strata::env_integer<int>("STRATA_TEST_X", 5) == 5);
  CHECK(strata::env_size("STRATA_TEST_X", 42) == 42);
  CHECK(strata::env_bool("STRATA_TEST_X", true));
  CHECK(strata::env_choice("STRATA_TEST_X", {"a", "b"}, "b") == "b");
  CHECK_FALSE(strata::env_raw("STRATA_TEST_X").has_value());
}

// A set but empty variable is a value gone missing in a script, not a request for the default:
// every reader kind refuses it, naming the variable.
TEST_CASE("a set but empty variable is refused by every reader, naming it") {
  scoped_env e("STRATA_TEST_X", "");
  const auto msg = "environment variable STRATA_TEST_X is set but empty: unset it or give a value";
  CHECK_THROWS_WITH_AS((void)strata::env_integer<int>("STRATA_TEST_X", 5), msg, strata::config_error);
  CHECK_THROWS_WITH_AS((void)strata::env_size("STRATA_TEST_X", 42), msg, strata::config_error);
  CHECK_THROWS_WITH_AS((void)strata::env_bool("STRATA_TEST_X", true), msg, strata::config_error);
  CHECK_THROWS_WITH_AS((void)strata::env_choice("STRATA_TEST_X", {"a", "b"}, "b"), msg, strata::config_error);
  CHECK_THROWS_WITH_AS((void)strata::env_raw("STRATA_TEST_X"), msg, strata::config_error);
}

TEST_CASE("the variables strata reads refuse an empty value") {
  {
    scoped_env e("STRATA_IO_THREADS", "");
    CHECK_THROWS_WITH_AS((void)strata::file_tier_options{}, doctest::Contains("STRATA_IO_THREADS is set but empty"),
                         strata::config_error);
  }
  {
    scoped_env e("STRATA_NUM_THREADS", "");
    CHECK_THROWS_WITH_AS((void)strata::default_thread_count(), doctest::Contains("STRATA_NUM_THREADS is set but empty"),
                         strata::config_error);
  }
  {
    scoped_env e("STRATA_NODE_LIMITER_DIR", "");
    CHECK_THROWS_WITH_AS((void)strata::default_node_limiter_dir(),
                         doctest::Contains("STRATA_NODE_LIMITER_DIR is set but empty"), strata::config_error);
  }
  {
    scoped_env e("STRATA_NODE_LIMITER_DIR", "/tmp/strata-env-test");
    CHECK(strata::default_node_limiter_dir() == "/tmp/strata-env-test");
  }
}

TEST_CASE("an empty variable is refused up front even where the run would never read it") {
  CHECK_NOTHROW(strata::check_env_variables());
  for (const auto& v : strata::env_variables) {
    const std::string name(v.name);
    scoped_env e(name.c_str(), "");
    const std::string message = name + " is set but empty";
    CHECK_THROWS_WITH_AS(strata::check_env_variables(), doctest::Contains(message.c_str()),
                         strata::config_error);
  }
}

TEST_CASE("integers are parsed whole and range-checked") {
  {
    scoped_env e("STRATA_TEST_X", "12");
    CHECK(strata::env_integer<int>("STRATA_TEST_X", 5, 1, 16) == 12);
    CHECK_THROWS_WITH_AS((void)strata::env_integer<int>("STRATA_TEST_X", 5, 1, 8),
                         "environment variable STRATA_TEST_X=\"12\": must be in [1, 8]", strata::config_error);
  }
  {
    scoped_env e("STRATA_TEST_X", "12abc");
    CHECK_THROWS_WITH_AS((void)strata::env_integer<int>("STRATA_TEST_X", 5), doctest::Contains("not an integer"),
                         strata::config_error);
  }
  {
    scoped_env e("STRATA_TEST_X", "99999999999999999999");
    CHECK_THROWS_WITH_AS((void)strata::env_integer<int>("STRATA_TEST_X", 5), doctest::Contains("out of range"),
                         strata::config_error);
  }
}

TEST_CASE("sizes use parse_size and say which variable was wrong") {
  {
    scoped_env e("STRATA_TEST_SIZE", "8MiB");
    CHECK(strata::env_size("STRATA_TEST_SIZE", 0) == (8U << 20));
    CHECK_THROWS_WITH_AS((void)strata::env_size("STRATA_TEST_SIZE", 0, 0, 1U << 20),
                         doctest::Contains("must be between 0 B and 1 MiB"), strata::config_error);
  }
  scoped_env e("STRATA_TEST_SIZE", "8 parsecs");
  CHECK_THROWS_WITH_AS((void)strata::env_size("STRATA_TEST_SIZE", 0),
                       doctest::Contains("STRATA_TEST_SIZE=\"8 parsecs\": invalid size"), strata::config_error);
}

TEST_CASE("booleans accept the usual spellings and nothing else") {
  for (const char* yes : {"1", "true", "TRUE", "yes", "On"}) {
    scoped_env e("STRATA_TEST_B", yes);
    CHECK(strata::env_bool("STRATA_TEST_B", false));
  }
  for (const char* no : {"0", "false", "No", "off"}) {
    scoped_env e("STRATA_TEST_B", no);
    CHECK_FALSE(strata::env_bool("STRATA_TEST_B", true));
  }
  scoped_env e("STRATA_TEST_B", "maybe");
  CHECK_THROWS_AS((void)strata::env_bool("STRATA_TEST_B", true), strata::config_error);
}

TEST_CASE("choices must match one of the allowed values") {
  scoped_env e("STRATA_TEST_C", "uring");
  CHECK(strata::env_choice("STRATA_TEST_C", {"auto", "uring", "posix"}, "auto") == "uring");
  scoped_env f("STRATA_TEST_C", "aio");
  CHECK_THROWS_WITH_AS((void)strata::env_choice("STRATA_TEST_C", {"auto", "uring", "posix"}, "auto"),
                       doctest::Contains("expected one of: auto, uring, posix"), strata::config_error);
}

TEST_CASE("misspelt STRATA_ variables are reported and known ones are not") {
  scoped_env known("STRATA_NUM_THREADS", "3");
  scoped_env typo("STRATA_NUM_THREAD", "3");
  const auto unknown = strata::unknown_env_variables();
  CHECK(std::find(unknown.begin(), unknown.end(), "STRATA_NUM_THREAD") != unknown.end());
  CHECK(std::find(unknown.begin(), unknown.end(), "STRATA_NUM_THREADS") == unknown.end());
}

TEST_CASE("STRATA_NUM_THREADS sets the default pool size and is validated") {
  {
    scoped_env e("STRATA_NUM_THREADS", "3");
    CHECK(strata::default_thread_count() == 3);
    strata::thread_pool pool;
    CHECK(pool.size() == 3);
  }
  {
    scoped_env e("STRATA_NUM_THREADS", "0");
    CHECK_THROWS_WITH_AS((void)strata::default_thread_count(), doctest::Contains("must be in [1, 1024]"),
                         strata::config_error);
  }
  ::unsetenv("STRATA_NUM_THREADS");
  CHECK(strata::default_thread_count() == strata::online_cpus());
}

}  // namespace env_test
