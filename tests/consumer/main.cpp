// Uses a little of everything in core, and prints the feature macros the target gave it.
#include <cstdio>

#include <strata/strata.hpp>

int main() {
  using namespace strata::literals;
  strata::thread_pool pool(2, "consumer");
  strata::direct_io_buffer buf(strata::parse_size("8KiB"));
  auto ok = pool.submit([&] { return buf.padded_size() == 8_KiB; });
  if (!ok.get()) return 1;
  std::printf("strata %s STRATA_HAS_CUDA=%d STRATA_HAS_URING=%d\n", strata::version_string, STRATA_HAS_CUDA,
              STRATA_HAS_URING);
  return 0;
}
