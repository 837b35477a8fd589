// strata-bench membw: host memory bandwidth with two kernels, same threads, same run:
//  - memcpy: one read and one write stream per thread (read + write counted);
//  - adamw streams: the CPU AdamW update's eight streams without its arithmetic
//    (rule_streams.hpp, the kernels' way: read p, m, v and the gradient, write p, m, v and the
//    bf16 model copy), one of the ways `strata-bench adamw` takes the fastest of for its bound.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>

#include <fmt/format.h>
#include <strata/core/aligned_buffer.hpp>
#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/core/units.hpp>
#include <strata/optim/adamw_cpu.hpp>
#include <strata/optim/adamw_rule.hpp>

#include "cli.hpp"
#include "report.hpp"
#include "rule_streams.hpp"

namespace strata::bench {
namespace {

/// Best GB/s (bytes moved, each once) of the AdamW streams over `bytes` of state and gradients.
template <class G>
double adamw_streams_GBps(std::uint64_t bytes, std::size_t threads, int reps) {
  constexpr std::uint64_t per_param = 24 + sizeof(G) + 2;
  const std::uint64_t n = std::max<std::uint64_t>(bytes / per_param, 1);
  const state_format f = adamw_rule::format(adamw_options{});
  aligned_buffer sb(f.state_bytes(n), 64, buffer_init::zeroed), gb(n * sizeof(G), 64, buffer_init::zeroed),
      ob(n * 2, 64, buffer_init::zeroed);
  const state_view v = state_view::of(sb.data(), f, n);
  thread_pool pool(threads, "membw");
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {  // repetition 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    rule_streams_cpu<G, bf16>(v, f, std::span<const G>(gb.as<G>()), ob.as<bf16>(), &pool, adamw_default_tile_elems,
                              cpu_isa::automatic);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return static_cast<double>(n * per_param) / best / 1e9;
}

int run(args& a) {
  const auto bytes = a.size("size", parse_size("1GiB"));
  const auto threads = a.count("threads", default_thread_count());
  const auto reps = a.count("reps", 5);
  const auto grad = a.choice("grad", {"fp32", "bf16", "fp16"}, "fp32");
  const bool json = a.flag("json");
  a.finish();
  if (bytes == 0 || threads == 0 || threads > 1024 || reps == 0)
    throw usage_error("membw: --size, --threads (1..1024) and --reps must be positive");
  const int r = static_cast<int>(reps);
  const auto bw = measure_copy_bandwidth(bytes, threads, r);
  const double streams = grad == "fp32"   ? adamw_streams_GBps<float>(bytes, threads, r)
                         : grad == "bf16" ? adamw_streams_GBps<bf16>(bytes, threads, r)
                                          : adamw_streams_GBps<fp16>(bytes, threads, r);
  if (json)
    fmt::print("{}\n", json_object{}
                           .add("size_bytes", bytes)
                           .add("threads", threads)
                           .add("grad", grad)
                           .add("copy_GBps", bw.GBps)
                           .add("adamw_streams_GBps", streams)
                           .str());
  else
    fmt::print("{} with {} threads, best of {}:\n  memcpy        {:.2f} GB/s (read + write)\n  adamw streams "
               "{:.2f} GB/s (read p m v g, write p m v and the bf16 copy; {} gradients)\n",
               format_size(bytes), threads, reps, bw.GBps, streams, grad);
  return 0;
}
const registration reg{{"membw", "host memory bandwidth: memcpy and the AdamW update's streams (its bound)",
                        "[--size 1GiB] [--threads N] [--reps 5] [--grad fp32|bf16|fp16] [--json]", &run}};
}  // namespace
}  // namespace strata::bench
