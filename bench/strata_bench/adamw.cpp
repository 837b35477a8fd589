// strata-bench adamw: AdamW update throughput on the CPU (or, when built with CUDA, the GPU),
// against the memory-bandwidth bound measured in the same run.
//
// On the CPU the bound is adamw_streams_cpu (adamw_streams.hpp): the same loads and stores over
// the same buffers, tiles, threads and instruction set, with the arithmetic taken out, timed in
// turn with the update; so the ratio is an efficiency (<= 1 up to noise). A plain memcpy, which
// the update used to be compared with, has two streams instead of eight and is no bound; it is
// still printed for reference.
//
// Bytes per parameter, each counted once: read master, m, v (12 B; 8 B with --moments bf16) and
// the gradient (4 or 2 B); write master, m, v (12 B; 8 B) and the 16-bit model copy (2 B, unless
// --no-model-copy).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <strata/core/aligned_buffer.hpp>
#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/core/units.hpp>
#include <strata/optim/adamw_cpu.hpp>

#include "adamw_bench.hpp"
#include "adamw_streams.hpp"
#include "cli.hpp"
#include "report.hpp"

namespace strata::bench {
namespace {

/// Best seconds of the update and of its streams (adamw_streams.hpp) over the same buffers.
struct cpu_times {
  double update = 0;
  double streams = 0;
};

template <class G, class M>
cpu_times cpu_seconds_per_step(std::uint64_t n, std::size_t threads, bool model_copy, cpu_isa isa, std::size_t tile,
                               int reps) {
  aligned_buffer pb(n * 4, 64), mb(n * sizeof(M), 64), vb(n * sizeof(M), 64), gb(n * sizeof(G), 64), ob(n * 2, 64);
  auto p = pb.as<float>();
  auto m = mb.as<M>(), v = vb.as<M>();
  auto g = gb.as<G>();
  auto out = ob.as<bf16>();
  thread_pool pool(threads, "adamw-bench");
  // First touch by the same tiles and threads that will run the kernel (NUMA placement).
  detail::parallel_tiles(n, tile, &pool, [&](std::size_t b, std::size_t e) {
    std::minstd_rand rng(static_cast<unsigned>(b));
    for (std::size_t i = b; i < e; ++i) {
      p[i] = static_cast<float>(rng() % 1000) * 1e-3f;
      m[i] = M(0.0f);
      v[i] = M(0.0f);
      g[i] = G(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-4f);
      out[i] = bf16(0.0f);
    }
  });
  const adamw_options o;
  const auto copy = model_copy ? out : std::span<bf16>();
  cpu_times best{1e30, 1e30};
  const auto seconds = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Interleaved, so that the update and its bound see the same machine; repetition 0 warms up.
  for (int r = 0; r <= reps; ++r) {
    const auto k = make_adamw_step_params(o, r + 1, 1e-3);
    const double u = seconds([&] {
      adamw_update_cpu<G, bf16, M>(p, m, v, std::span<M>(), std::span<const G>(g), copy, k, &pool, tile, isa);
    });
    const double b = seconds([&] { adamw_streams_cpu<G, bf16, M>(p, m, v, std::span<const G>(g), copy, &pool, tile, isa); });
    if (r > 0) {
      best.update = std::min(best.update, u);
      best.streams = std::min(best.streams, b);
    }
  }
  return best;
}

int run(args& a) {
  const auto n = a.count("params", 64'000'000);
  const auto threads = a.count("threads", default_thread_count());
  const auto grad = a.choice("grad", {"fp32", "bf16", "fp16"}, "bf16");
  const auto moments = a.choice("moments", {"fp32", "bf16"}, "fp32");
  const auto device = a.choice("device", {"cpu", "cuda"}, "cpu");
  const auto isa_name = a.choice("isa", {"automatic", "portable", "avx2", "avx512"}, "automatic");
  const auto reps = a.count("reps", 5);
  const auto tile = a.count("tile", adamw_default_tile_elems);
  const bool model_copy = !a.flag("no-model-copy");
  const bool json = a.flag("json");
  a.finish();
  if (n == 0 || threads == 0 || threads > 1024 || reps == 0 || tile == 0)
    throw usage_error("adamw: --params, --threads (1..1024), --reps and --tile must be positive");
  const std::uint64_t grad_bytes = grad == "fp32" ? 4 : 2;
  const std::uint64_t moment_bytes = moments == "fp32" ? 4 : 2;
  const std::uint64_t bytes_per_param = 2 * (4 + 2 * moment_bytes) + grad_bytes + (model_copy ? 2 : 0);

  double seconds = 0;
  double bound_GBps = 0;
  double memcpy_GBps = 0;
  std::string bound_name;
  std::string path;
  if (device == "cuda") {
#if STRATA_BENCH_CUDA
    if (moments != "fp32") throw usage_error("adamw: --device cuda measures fp32 moments only (--moments fp32)");
    const auto r = cuda_adamw_bench(n, grad, model_copy, static_cast<int>(reps));
    seconds = r.seconds;
    bound_GBps = r.d2d_copy_GBps;
    bound_name = "d2d_copy";
    path = r.device_name;
#else
    throw usage_error("adamw: --device cuda: this strata-bench was built without CUDA (no nvcc at configure time)");
#endif
  } else {
    cpu_isa isa = cpu_isa::automatic;
    if (isa_name == "portable") isa = cpu_isa::portable;
    if (isa_name == "avx2") isa = cpu_isa::avx2;
    if (isa_name == "avx512") isa = cpu_isa::avx512;
    isa = resolve_cpu_isa(isa);
    path = std::string(to_string(isa));
    const int r = static_cast<int>(reps);
    const auto per_step = [&]<class M>() {
      return grad == "fp32"   ? cpu_seconds_per_step<float, M>(n, threads, model_copy, isa, tile, r)
             : grad == "bf16" ? cpu_seconds_per_step<bf16, M>(n, threads, model_copy, isa, tile, r)
                              : cpu_seconds_per_step<fp16, M>(n, threads, model_copy, isa, tile, r);
    };
    const cpu_times t = moments == "fp32" ? per_step.template operator()<float>() : per_step.template operator()<bf16>();
    seconds = t.update;
    // The bound: the update's own streams without its arithmetic, interleaved with it.
    bound_GBps = static_cast<double>(n * bytes_per_param) / t.streams / 1e9;
    bound_name = "streams";
    // For reference only (a plain copy is no bound: it has fewer streams than the update).
    memcpy_GBps = measure_copy_bandwidth(std::max<std::uint64_t>(n * bytes_per_param / 2, 1), threads, r).GBps;
  }
  const double gparams = static_cast<double>(n) / seconds / 1e9;
  const double GBps = static_cast<double>(n * bytes_per_param) / seconds / 1e9;
  const double ratio = GBps / bound_GBps;
  if (json) {
    fmt::print("{}\n", json_object{}
                           .add("device", device)
                           .add("path", path)
                           .add("params", n)
                           .add("threads", threads)
                           .add("grad", grad)
                           .add("moments", moments)
                           .add("model_copy", model_copy)
                           .add("bytes_per_param", bytes_per_param)
                           .add("seconds", seconds)
                           .add("Gparams_per_s", gparams)
                           .add("GBps", GBps)
                           .add("bound", bound_name)
                           .add("bound_GBps", bound_GBps)
                           .add("ratio", ratio)
                           .add("memcpy_GBps", memcpy_GBps)
                           .str());
  } else {
    fmt::print("adamw on {} ({}): {} params, {} grads, {} moments{}, {} threads\n", device, path, n, grad, moments,
               model_copy ? " + bf16 model copy" : "", device == "cuda" ? 0 : threads);
    fmt::print("  {:.3f} ms per step, {:.3f} Gparams/s, {:.2f} GB/s ({} B/param, each byte once)\n", seconds * 1e3,
               gparams, GBps, bytes_per_param);
    fmt::print("  bound ({} in this run): {:.2f} GB/s; ratio {:.3f}\n", bound_name, bound_GBps, ratio);
    if (memcpy_GBps > 0) fmt::print("  (memcpy with the same threads, not a bound: {:.2f} GB/s)\n", memcpy_GBps);
  }
  return 0;
}

const registration reg{{"adamw", "AdamW update throughput vs the same-run memory bandwidth bound",
                        "[--params 64M] [--threads N] [--grad fp32|bf16|fp16] [--moments fp32|bf16] [--device cpu|cuda] "
                        "[--isa automatic|portable|avx2|avx512] [--tile 16384] [--reps 5] [--no-model-copy] [--json]",
                        &run}};
}  // namespace
}  // namespace strata::bench
