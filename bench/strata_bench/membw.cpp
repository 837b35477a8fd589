// strata-bench membw: host memory-copy bandwidth, the bound for CPU-side streaming work.
#include <fmt/format.h>
#include <strata/core/thread_pool.hpp>
#include <strata/core/units.hpp>

#include "cli.hpp"
#include "report.hpp"

namespace strata::bench {
namespace {
int run(args& a) {
  const auto bytes = a.size("size", parse_size("1GiB"));
  const auto threads = a.count("threads", default_thread_count());
  const auto reps = a.count("reps", 5);
  const bool json = a.flag("json");
  a.finish();
  if (bytes == 0 || threads == 0 || threads > 1024 || reps == 0)
    throw usage_error("membw: --size, --threads (1..1024) and --reps must be positive");
  const auto bw = measure_copy_bandwidth(bytes, threads, static_cast<int>(reps));
  if (json)
    fmt::print("{}\n", json_object{}.add("size_bytes", bytes).add("threads", threads).add("copy_GBps", bw.GBps).str());
  else
    fmt::print("memcpy of {} with {} threads: {:.2f} GB/s (read + write, best of {})\n", format_size(bytes), threads,
               bw.GBps, reps);
  return 0;
}
const registration reg{{"membw", "host memory-copy bandwidth (the bound for CPU kernels)",
                        "[--size 1GiB] [--threads N] [--reps 5] [--json]", &run}};
}  // namespace
}  // namespace strata::bench
