// The other processes of the node_limiter tests. Usage:
//   node_limiter_helper <mode> <dir> <name> <permits> [args]
//   loop <iterations> <hold_us> <log>  acquire, hold, release, `iterations` times; then write one
//                                      "acquire_ns release_ns" line per permit (CLOCK_MONOTONIC)
//   hold <ready>                       acquire, create <ready>, then sleep until killed
//   hog <ready>                        acquire and release as fast as possible until killed;
//                                      creates <ready> after its first permit
//   wait                               acquire (the test kills it while it waits in the queue)
// Exit code 0 on success, 2 on bad usage, 1 on any error (printed).
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strata/sync/node_limiter.hpp"

namespace {

std::uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000U + static_cast<std::uint64_t>(ts.tv_nsec);
}

void touch(const std::string& path) {
  std::ofstream(path + ".tmp") << ::getpid() << '\n';
  std::rename((path + ".tmp").c_str(), path.c_str());  // appears whole
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s loop|hold|hog|wait <dir> <name> <permits> [args]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  strata::node_limiter limiter(argv[3], std::stoul(argv[4]), argv[2]);
  if (mode == "loop" && argc == 8) {
    const unsigned long iterations = std::stoul(argv[5]);
    const auto hold = std::chrono::microseconds(std::stoul(argv[6]));
    std::vector<std::pair<std::uint64_t, std::uint64_t>> held;
    for (unsigned long i = 0; i < iterations; ++i) {
      limiter.acquire();
      const auto t0 = monotonic_ns();  // after acquire() returned: inside the real holding time
      if (hold.count() > 0) std::this_thread::sleep_for(hold);
      const auto t1 = monotonic_ns();  // before release(): inside it too
      limiter.release();
      held.emplace_back(t0, t1);
    }
    std::ofstream log(argv[7]);
    for (auto [a, r] : held) log << a << ' ' << r << '\n';
    return log ? 0 : 1;
  }
  if (mode == "hold" && argc == 6) {
    limiter.acquire();
    touch(argv[5]);
    for (;;) ::pause();
  }
  if (mode == "hog" && argc == 6) {
    limiter.acquire();
    limiter.release();
    touch(argv[5]);
    for (;;) {
      limiter.acquire();
      limiter.release();
    }
  }
  if (mode == "wait" && argc == 5) {
    limiter.acquire();
    return 0;
  }
  std::fprintf(stderr, "%s: bad arguments for mode %s\n", argv[0], mode.c_str());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "node_limiter_helper: %s\n", e.what());
  return 1;
}
