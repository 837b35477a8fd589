#include <doctest/doctest.h>

#include <string>

#include "strata/core/cuda.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace cuda_host_test {

TEST_CASE("device discovery never throws and explains an absence") {
  const auto avail = strata::cuda_devices();
  CHECK(avail.devices >= 0);
  if (avail.devices == 0) {
    CHECK_FALSE(avail.reason.empty());
    MESSAGE("no CUDA device here: " << avail.reason);
  }
}

#if STRATA_HAS_CUDA
TEST_CASE("a failing CUDA call becomes a cuda_error naming the call, with or without a device") {
  // An invalid device ordinal fails everywhere: no driver, no device, or a real GPU.
  try {
    STRATA_CUDA_TRY(cudaSetDevice(-1));
    FAIL("cudaSetDevice(-1) succeeded");
  } catch (const strata::cuda_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("cudaSetDevice(-1) failed at") == 0);
    CHECK(msg.find("cuda_host_test.cpp") != std::string::npos);
    CHECK(msg.find("cudaError") != std::string::npos);
    CHECK(e.code() != 0);
  }
}
#endif

}  // namespace cuda_host_test
