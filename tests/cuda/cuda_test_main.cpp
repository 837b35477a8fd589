// Runner for tests that need a GPU: when none is usable it says why and exits 77, which ctest
// reports as "Skipped" (SKIP_RETURN_CODE), so a CPU-only CI neither fails nor silently passes.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "strata/core/cuda.hpp"

int main(int argc, char** argv) {
  const auto avail = strata::cuda_devices();
  if (avail.devices == 0) {
    std::printf("SKIPPED: no usable CUDA device: %s\n", avail.reason.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
