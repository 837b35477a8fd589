// Every tool and front parses its paths through parse_path_arg: a directory, an s3:// prefix, or
// (where allowed) host memory; never a folder named "s3:" made out of a URL.
#include <doctest/doctest.h>

#include <string>

#include <strata/core/error.hpp>
#include <strata/tier/path_arg.hpp>

namespace path_arg_test {

std::string message_of(std::string_view text, bool allow_host = false) {
  try {
    (void)strata::parse_path_arg(text, "--path", allow_host);
  } catch (const strata::config_error& e) {
    return e.what();
  }
  return {};
}

TEST_CASE("paths parse as directories, object store prefixes or host memory, never a folder named after a URL") {
  const auto dir = strata::parse_path_arg("/nvme/run-1", "--path");
  CHECK(dir.kind == strata::path_kind::directory);
  CHECK(dir.directory == "/nvme/run-1");
  CHECK(strata::parse_path_arg("./s3:/x", "--path").kind == strata::path_kind::directory);
  CHECK(strata::parse_path_arg("run:7", "--path").kind == strata::path_kind::directory);  // not a URL
  const auto s3 = strata::parse_path_arg("s3://strata/mpq", "--path");
  CHECK(s3.kind == strata::path_kind::object_store);
  CHECK(s3.url == "s3://strata/mpq");
  CHECK(strata::parse_path_arg("host", "--path", true).kind == strata::path_kind::host);
  CHECK(strata::parse_path_arg("host", "--path").kind == strata::path_kind::directory);
}

TEST_CASE("an empty path, a malformed s3 URL and other schemes are config errors naming the path") {
  CHECK(message_of("") == "--path: the path is empty");
  CHECK(message_of("s3:/strata/x").find("'s3:/strata/x' is not an object store URL") != std::string::npos);
  CHECK(message_of("s3:/strata/x").find("./s3:/strata/x") != std::string::npos);
  CHECK(message_of("s3:").find("is not an object store URL") != std::string::npos);
  CHECK(message_of("s3://").find("names no bucket") != std::string::npos);
  CHECK(message_of("s3:///x").find("names no bucket") != std::string::npos);
  for (const char* url : {"S3://strata/x", "file:///tmp/x", "https://host/x", "gs://b/x", "hdfs://n/x", "az:x"})
    CHECK_MESSAGE(message_of(url).find("is a URL of a kind strata does not take") != std::string::npos, url);
  CHECK(message_of(std::string_view("a\0b", 3)).find("NUL") != std::string::npos);
}

}  // namespace path_arg_test
