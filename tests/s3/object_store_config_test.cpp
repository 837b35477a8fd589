// What object_store_tier refuses before it sends anything: an AWS_* (or STRATA_S3_*) variable it
// reads that is set but empty, and a prefix whose keys a client, proxy or server would not carry
// faithfully ('.' and '..' segments, empty segments, control characters, NUL, backslashes). Each
// is a config_error naming the variable or the bucket and prefix, never a request that fails
// later as 403 SignatureDoesNotMatch or goes to a default endpoint.
#include <doctest/doctest.h>

#include <stdlib.h>  // NOLINT(modernize-deprecated-headers): setenv, unsetenv

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include <strata/tier/object_store_tier.hpp>

namespace object_store_config_test {

using namespace std::chrono_literals;
using namespace std::string_view_literals;

namespace {

constexpr std::array<const char*, 10> variables{
    "AWS_REGION",           "AWS_DEFAULT_REGION",           "AWS_ENDPOINT_URL_S3",       "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",    "AWS_SECRET_ACCESS_KEY",        "AWS_SESSION_TOKEN",         "STRATA_S3_CONNECT_TIMEOUT",
    "STRATA_S3_FIRST_BYTE_TIMEOUT", "STRATA_S3_REQUEST_DEADLINE"};

// Unsets the variables the tier reads for the test's life and restores them after.
class clean_env {
 public:
  clean_env() {
    for (std::size_t i = 0; i < variables.size(); ++i) {
      if (const char* v = std::getenv(variables[i])) saved_[i] = v;  // NOLINT(concurrency-mt-unsafe)
      ::unsetenv(variables[i]);
    }
  }
  clean_env(const clean_env&) = delete;
  clean_env& operator=(const clean_env&) = delete;
  ~clean_env() {
    for (std::size_t i = 0; i < variables.size(); ++i) {
      if (saved_[i]) {
        ::setenv(variables[i], saved_[i]->c_str(), 1);
      } else {
        ::unsetenv(variables[i]);
      }
    }
  }

 private:
  std::array<std::optional<std::string>, variables.size()> saved_;
};

std::string config_message(const strata::object_store_options& o) {
  try {
    strata::object_store_tier t(o);
  } catch (const strata::config_error& e) {
    return e.what();
  }
  FAIL("no config_error");
  return {};
}

bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// Options that give everything but what `var` stands for; the endpoint refuses connections (port
// 1), so a tier that took an empty value would fail later, differently.
strata::object_store_options options_without(std::string_view var) {
  strata::object_store_options o;
  o.bucket = "strata";
  o.prefix = "config";
  if (!var.starts_with("AWS_ENDPOINT_URL")) o.endpoint = "http://127.0.0.1:1";
  if (!var.ends_with("REGION")) o.region = "us-east-1";
  if (var != "AWS_ACCESS_KEY_ID") o.access_key_id = "KEY";
  if (var != "AWS_SECRET_ACCESS_KEY") o.secret_access_key = "secret";
  if (var != "AWS_SESSION_TOKEN") o.session_token = "token";
  o.max_retries = 0;
  return o;
}

}  // namespace

TEST_CASE("an empty AWS_* variable that object_store_tier reads is a config_error naming it") {
  for (const char* var : {"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL",
                          "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}) {
    INFO(var);
    clean_env env;
    ::setenv(var, "", 1);
    const auto message = config_message(options_without(var));
    CHECK(message == fmt::format("environment variable {} is set but empty: unset it or give a value", var));
  }
}

TEST_CASE("an empty AWS_* fallback variable is a config_error even when the one before it is set") {
  clean_env env;
  ::setenv("AWS_REGION", "eu-west-1", 1);
  ::setenv("AWS_DEFAULT_REGION", "", 1);
  CHECK(contains(config_message(options_without("AWS_REGION")), "AWS_DEFAULT_REGION is set but empty"));
  ::unsetenv("AWS_DEFAULT_REGION");
  ::setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1", 1);
  ::setenv("AWS_ENDPOINT_URL", "", 1);
  CHECK(contains(config_message(options_without("AWS_ENDPOINT_URL")), "AWS_ENDPOINT_URL is set but empty"));
}

TEST_CASE("the S3 timeouts come from STRATA_S3_* variables, and an empty or malformed one is a config_error") {
  clean_env env;
  {
    const strata::object_store_options o;
    CHECK(o.connect_timeout == 10s);
    CHECK(o.first_byte_timeout == 10s);
    CHECK(o.request_deadline == 120s);
  }
  ::setenv("STRATA_S3_CONNECT_TIMEOUT", "0.25", 1);
  ::setenv("STRATA_S3_FIRST_BYTE_TIMEOUT", "2.5", 1);
  ::setenv("STRATA_S3_REQUEST_DEADLINE", "0", 1);
  {
    const strata::object_store_options o;
    CHECK(o.connect_timeout == 250ms);
    CHECK(o.first_byte_timeout == 2500ms);
    CHECK(o.request_deadline == 0ms);
  }
  const auto refused = [](const char* var, const char* value) {
    ::setenv(var, value, 1);
    std::string message;
    try {
      const strata::object_store_options o;
    } catch (const strata::config_error& e) {
      message = e.what();
    }
    ::unsetenv(var);
    return message;
  };
  CHECK(refused("STRATA_S3_FIRST_BYTE_TIMEOUT", "") ==
        "environment variable STRATA_S3_FIRST_BYTE_TIMEOUT is set but empty: unset it or give a value");
  CHECK(contains(refused("STRATA_S3_REQUEST_DEADLINE", "2m"),
                 "STRATA_S3_REQUEST_DEADLINE=\"2m\": not a number of seconds"));
  CHECK(contains(refused("STRATA_S3_FIRST_BYTE_TIMEOUT", "-1"), "STRATA_S3_FIRST_BYTE_TIMEOUT=\"-1\": must be between"));
  CHECK(contains(refused("STRATA_S3_CONNECT_TIMEOUT", "0"), "STRATA_S3_CONNECT_TIMEOUT=\"0\": must be between"));
  for (const std::string_view var : {"STRATA_S3_CONNECT_TIMEOUT", "STRATA_S3_FIRST_BYTE_TIMEOUT", "STRATA_S3_REQUEST_DEADLINE"}) {
    bool registered = false;  // (so the tools do not warn about them as misspelt)
    for (const auto& v : strata::env_variables) registered = registered || v.name == var;
    CHECK(registered);
  }
}

TEST_CASE("a prefix with '.', '..' or empty segments, control characters or backslashes is a config_error naming it") {
  clean_env env;
  struct bad {
    std::string_view url;
    std::string_view says;
  };
  for (const auto& b : {bad{"s3://strata/../../etc", "key prefix '../../etc' has a '..' segment"},
                        bad{"s3://strata/..", "key prefix '..' has a '..' segment"},
                        bad{"s3://strata/run/./7", "key prefix 'run/./7' has a '.' segment"},
                        bad{"s3://strata/run/..", "key prefix 'run/..' has a '..' segment"},
                        bad{"s3://strata/run//7", "key prefix 'run//7' has an empty segment"},
                        bad{"s3://strata//run", "key prefix '/run' has an empty segment"},
                        bad{"s3://strata/run\n7", "key prefix 'run\\x0a7' holds a control character (\\x0a)"},
                        bad{"s3://strata/run\x7f", "holds a control character (\\x7f)"},
                        bad{"s3://strata/run\0x"sv, "key prefix 'run\\x00x' holds a control character (\\x00)"},
                        bad{"s3://strata/run\\7", "holds a backslash"}}) {
    INFO(std::string(b.url));
    std::string message;
    try {
      (void)strata::parse_s3_url(b.url);
    } catch (const strata::config_error& e) {
      message = e.what();
    }
    CHECK(contains(message, b.says));
    CHECK(contains(message, "'s3://strata/"));
  }
  // The same prefixes given as options: refused when the tier is made, before any request.
  for (const std::string_view prefix : {"../../etc"sv, "a/./b"sv, "a//b"sv, "/a"sv, "a\tb"sv, "a\0b"sv}) {
    INFO(std::string(prefix));
    strata::object_store_options o;
    o.bucket = "strata";
    o.prefix = std::string(prefix);
    o.endpoint = "http://127.0.0.1:1";
    o.region = "us-east-1";
    o.access_key_id = "KEY";
    o.secret_access_key = "secret";
    const auto message = config_message(o);
    CHECK(contains(message, "object_store_tier 's3://strata/"));
    CHECK(contains(message, "key prefix '"));
  }
  // Names S3 takes as they are: dots inside a segment, a trailing '/', no prefix.
  CHECK(strata::parse_s3_url("s3://strata/run.7/..x/y../").prefix == "run.7/..x/y../");
  CHECK(strata::parse_s3_url("s3://strata/").prefix.empty());
  CHECK(strata::parse_s3_url("s3://my.bucket-1/a b/c+d").prefix == "a b/c+d");
}

TEST_CASE("a bucket name S3 does not allow is a config_error naming it") {
  for (const std::string_view url : {"s3://-strata/x", "s3://strata-/x", "s3://st..rata/x", "s3://Strata/x", "s3://st/x"}) {
    INFO(std::string(url));
    CHECK_THROWS_WITH_AS((void)strata::parse_s3_url(url), doctest::Contains("bucket name"), strata::config_error);
  }
  clean_env env;
  strata::object_store_options o;
  o.bucket = "..";
  o.endpoint = "http://127.0.0.1:1";
  o.region = "us-east-1";
  o.access_key_id = "KEY";
  o.secret_access_key = "secret";
  CHECK(contains(config_message(o), "object_store_tier: bucket name '..' is not valid"));
}

}  // namespace object_store_config_test
