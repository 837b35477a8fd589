#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/fs.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace error_test {

namespace fs = std::filesystem;

TEST_CASE("every typed error is a strata::error") {
  CHECK_THROWS_AS(throw strata::config_error("x"), strata::error);
  CHECK_THROWS_AS(throw strata::capacity_error("x"), strata::error);
  CHECK_THROWS_AS(throw strata::io_error("pread", "/p", 0, EIO), strata::error);
  CHECK_THROWS_AS(throw strata::integrity_error("t", "o", 0, 1, 2), strata::error);
  CHECK_THROWS_AS(throw strata::cuda_error(1, "cudaErrorX", "desc", "f()", "a.cu", 1), strata::error);
  CHECK_THROWS_AS(throw strata::config_error("x"), std::runtime_error);
}

TEST_CASE("io_error names the operation, path, offset and errno text") {
  const strata::io_error e("pwrite", "/nvme/strata/sg-17.m", 8388608, ENOSPC);
  CHECK(std::string(e.what()) == "pwrite /nvme/strata/sg-17.m at offset 8388608: " + std::string(std::strerror(ENOSPC)));
  CHECK(e.operation() == "pwrite");
  CHECK(e.path() == "/nvme/strata/sg-17.m");
  CHECK(e.offset() == 8388608);
  CHECK(e.error_number() == ENOSPC);
  CHECK(e.code() == std::errc::no_space_on_device);

  const strata::io_error no_offset("open", "/missing", ENOENT);
  CHECK(std::string(no_offset.what()) == "open /missing: " + std::string(std::strerror(ENOENT)));
  CHECK_FALSE(no_offset.offset().has_value());

  const strata::io_error copy = e;  // copies share the details and keep the message
  CHECK(std::string(copy.what()) == e.what());
  CHECK(copy.path() == e.path());
}

TEST_CASE("integrity_error names tier, object, offset and both checksums") {
  const strata::integrity_error e("nvme0", "sg-3.v", 4096, 0x1234, 0xbeef);
  const std::string msg = e.what();
  CHECK(msg.find("tier 'nvme0'") != std::string::npos);
  CHECK(msg.find("object 'sg-3.v'") != std::string::npos);
  CHECK(msg.find("offset 4096") != std::string::npos);
  CHECK(msg.find("0x000000000000beef") != std::string::npos);
  CHECK(msg.find("0x0000000000001234") != std::string::npos);
  CHECK(e.tier() == "nvme0");
  CHECK(e.object() == "sg-3.v");
  CHECK(e.offset() == 4096);
}

TEST_CASE("capacity_error and cuda_error keep their numbers") {
  const strata::capacity_error c("host budget exceeded", 100, 10);
  CHECK(c.requested() == 100);
  CHECK(c.available() == 10);
  const strata::cuda_error g(2, "cudaErrorMemoryAllocation", "out of memory", "cudaMalloc(&p, n)", "x.cu", 7);
  CHECK(g.code() == 2);
  CHECK(std::string(g.what()) == "cudaMalloc(&p, n) failed at x.cu:7: cudaErrorMemoryAllocation (out of memory)");
}

TEST_CASE("STRATA_EXPECTS throws the given type with a formatted message, and only when false") {
  const auto check = [](std::size_t got, std::size_t want) {
    STRATA_EXPECTS(got == want, strata::config_error, "step(): got {} gradients for {} parameters", got, want);
    return true;
  };
  CHECK(check(3, 3));
  CHECK_THROWS_WITH_AS(check(2, 3), "step(): got 2 gradients for 3 parameters", strata::config_error);
}

TEST_CASE("open_file reports the path and errno of a failed open") {
  const fs::path missing = fs::temp_directory_path() / "strata-no-such-dir" / "file";
  try {
    (void)strata::open_file(missing, O_RDONLY);
    FAIL("open of a missing file succeeded");
  } catch (const strata::io_error& e) {
    CHECK(e.path() == missing);
    CHECK(e.error_number() == ENOENT);
    CHECK(std::string(e.what()).find(missing.string()) != std::string::npos);
  }
}

TEST_CASE("write_file_atomic replaces a file whole, durably when asked, and leaves no temporary") {
  const fs::path dir = fs::temp_directory_path() / ("strata-error-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path p = dir / "manifest.json";
  strata::write_file_atomic(p, "first");
  strata::write_file_atomic(p, "second, longer", strata::durability::fsync);
  CHECK(fs::file_size(p) == 14);
  CHECK_FALSE(fs::exists(dir / "manifest.json.tmp"));

  // Writing into a directory that does not exist fails with the temporary's path and ENOENT.
  CHECK_THROWS_WITH_AS(strata::write_file_atomic(dir / "nope" / "x", "y"), doctest::Contains("nope/x.tmp"),
                       strata::io_error);
  fs::remove_all(dir);
}

TEST_CASE("write_all reports a full device as a capacity_error naming the file and the offset reached") {
  // /dev/full accepts open and fails every write with ENOSPC.
  REQUIRE(::access("/dev/full", W_OK) == 0);
  auto fd = strata::open_file("/dev/full", O_WRONLY);
  const std::string data(100, 'x');
  try {
    strata::write_all(fd.get(), std::as_bytes(std::span(data.data(), data.size())), "/dev/full");
    FAIL("write to /dev/full succeeded");
  } catch (const strata::capacity_error& e) {
    CHECK(std::string(e.what()) == "write /dev/full at offset 0: " + std::string(std::strerror(ENOSPC)));
  }
}

}  // namespace error_test
