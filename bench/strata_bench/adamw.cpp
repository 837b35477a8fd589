// strata-bench adamw: the CPU update of an update rule (AdamW by default; --rule adamw-bf16,
// adamw-8bit, sgd, lion) or, when built with CUDA, the GPU AdamW update, against the
// memory-bandwidth bound measured in the same run.
//
// On the CPU the bound is rule_streams_cpu (rule_streams.hpp): the same loads and stores over
// the same buffers, tiles, threads and instruction set, with the arithmetic taken out, in each
// way it knows (with or without software prefetches, ordinary or non-temporal stores of state),
// timed in turn with the update; the fastest way is the bound, so the ratio is an efficiency
// (<= 1 up to noise). A plain memcpy, which the update used to be compared with, has two streams
// instead of eight and is no bound; it is still printed for reference.
//
// Bytes per parameter, each counted once: read the state (fp32 master weights and the rule's
// arrays: AdamW 12 B, with bf16 moments 8 B, with 8-bit moments 6 B and a scale per 256, SGD with
// momentum and Lion 8 B) and the gradient (4 or 2 B); write the state and the 16-bit model copy
// (2 B, unless --no-model-copy).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <strata/core/aligned_buffer.hpp>
#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/core/units.hpp>
#include <strata/optim/adamw_8bit_rule.hpp>
#include <strata/optim/adamw_bf16_rule.hpp>
#include <strata/optim/adamw_cpu.hpp>
#include <strata/optim/adamw_rule.hpp>
#include <strata/optim/lion_rule.hpp>
#include <strata/optim/sgd_rule.hpp>
#include <strata/optim/update_rule.hpp>

#include "adamw_bench.hpp"
#include "rule_streams.hpp"
#include "cli.hpp"
#include "report.hpp"

namespace strata::bench {
namespace {

/// Best seconds of the update and of the fastest way of moving its streams (rule_streams.hpp)
/// over the same buffers.
struct cpu_times {
  double update = 0;
  double streams = 0;
  streams_way way{};
  double from_cache = 0;  // the same update computed from caches (cpu_seconds_from_cache)
};

/// What is measured: a rule's format, its update over a whole state (tile and isa applied where
/// the rule's kernel takes them) and its constants for a step.
template <class R>
struct rule_case {
  typename R::options_type options;
  std::size_t tile;
  cpu_isa isa;
};

template <class R, class G>
void update_once(const rule_case<R>& c, const state_view& v, std::span<const G> g, std::span<bf16> copy,
                 const typename R::step_params& k, thread_pool* pool) {
  const std::size_t n = v.count;
  if constexpr (std::is_same_v<R, adamw_rule> || std::is_same_v<R, adamw_bf16_rule>) {
    using M = std::conditional_t<std::is_same_v<R, adamw_rule>, float, bf16>;
    adamw_update_cpu<G, bf16, M>(std::span<float>(v.master, n), std::span<M>(v.array<M>(0), n),
                                 std::span<M>(v.array<M>(1), n), std::span<M>(), g, copy, k, pool, c.tile, c.isa);
  } else if constexpr (std::is_same_v<R, sgd_rule>) {
    sgd_update_cpu<G, bf16>(std::span<float>(v.master, n),
                            k.has_momentum ? std::span<float>(v.array<float>(0), n) : std::span<float>(), g, copy, k,
                            pool, c.tile, c.isa);
  } else if constexpr (std::is_same_v<R, lion_rule>) {
    lion_update_cpu<G, bf16>(std::span<float>(v.master, n), std::span<float>(v.array<float>(0), n), g, copy, k, pool,
                             c.tile, c.isa);
  } else {
    static_assert(std::is_same_v<R, adamw_8bit_rule>);
    R::template update_cpu<G, bf16>(v, 0, n, g.data(), copy.empty() ? nullptr : copy.data(), k, pool, c.isa);
  }
}

/// The buffers of one measurement: a rule's state for n parameters, n gradients and a model copy.
template <class G>
struct bench_buffers {
  aligned_buffer state_buffer, grad_buffer, copy_buffer;
  state_view v;
  std::span<G> g;
  std::span<bf16> out;

  // First touch by the same tiles and threads that will run the kernel (NUMA placement); the
  // arrays start at zero (codes of 0 with scale 0 for quantized ones), as a new optimizer's.
  bench_buffers(const state_format& f, std::uint64_t n, thread_pool* pool)
      : state_buffer(f.state_bytes(n), 64), grad_buffer(n * sizeof(G), 64), copy_buffer(n * 2, 64),
        v(state_view::of(state_buffer.data(), f, n)), g(grad_buffer.as<G>()), out(copy_buffer.as<bf16>()) {
    detail::parallel_tiles(n, 16384, pool, [&](std::size_t b, std::size_t e) {
      std::minstd_rand rng(static_cast<unsigned>(b));
      for (std::size_t i = b; i < e; ++i) {
        v.master[i] = static_cast<float>(rng() % 1000) * 1e-3f;
        g[i] = G(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-4f);
        out[i] = bf16(0.0f);
      }
      for (std::size_t a = 0; a < f.count; ++a) {
        const state_element e_type = f.arrays[a].element;
        const std::size_t bytes = element_bytes(e_type);
        std::memset(v.arrays[a] + b * bytes, quantized(e_type) ? map_of(e_type).zero : 0, (e - b) * bytes);
      }
    });
    for (std::size_t a = 0; a < f.count; ++a)
      if (v.scales[a] != nullptr) std::fill_n(v.scales[a], q8_blocks(n), 0.0f);
  }
};

template <class F>
double seconds_of(F&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class R, class G>
cpu_times cpu_seconds_per_step(const rule_case<R>& c, std::uint64_t n, std::size_t threads, bool model_copy,
                               int reps) {
  const state_format f = R::format(c.options);
  thread_pool pool(threads, "adamw-bench");
  bench_buffers<G> buf(f, n, &pool);
  const auto copy = model_copy ? buf.out : std::span<bf16>();
  const std::span<const G> g(buf.g);
  cpu_times best{1e30, 1e30, {}};
  // Interleaved, so that the update and its bound see the same machine; repetition 0 warms up.
  for (int r = 0; r <= reps; ++r) {
    const auto k = R::make_step_params(c.options, rule_step{r + 1, c.options.lr, c.options.decay(), 1.0, 1.0});
    const double u = seconds_of([&] { update_once<R, G>(c, buf.v, g, copy, k, &pool); });
    if (r > 0) best.update = std::min(best.update, u);
    for (const streams_way w : streams_ways) {
      const double s = seconds_of([&] { rule_streams_cpu<G, bf16>(buf.v, f, g, copy, &pool, c.tile, c.isa, w); });
      if (r > 0 && s < best.streams) {
        best.streams = s;
        best.way = w;
      }
    }
  }
  return best;
}

/// Best seconds of the update of n parameters computed from caches: each thread updates 8192
/// parameters of its own (at most 240 KiB of state, gradients and copy: in its L2) over and over (one kernel call a tile, on that thread alone) until the threads have
/// updated n parameters between them. That is the arithmetic's own time, with little memory
/// traffic: no bound on the update in memory, but what it cannot beat either, so when it is above
/// the streams bound the update is compute-bound on this CPU. (Starting and joining the threads,
/// tens of microseconds, is counted.)
template <class R, class G>
double cpu_seconds_from_cache(const rule_case<R>& c, std::uint64_t n, std::size_t threads, bool model_copy, int reps) {
  const state_format f = R::format(c.options);
  const std::uint64_t resident = std::min<std::uint64_t>(8192, (n + threads - 1) / threads);
  const std::uint64_t rounds = std::max<std::uint64_t>(1, n / (threads * resident));
  std::vector<std::unique_ptr<bench_buffers<G>>> bufs;
  for (std::size_t t = 0; t < threads; ++t) bufs.push_back(std::make_unique<bench_buffers<G>>(f, resident, nullptr));
  // One step's constants for every call (the step count changes no instruction).
  const auto k = R::make_step_params(c.options, rule_step{10, c.options.lr, c.options.decay(), 1.0, 1.0});
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const double s = seconds_of([&] {
      std::vector<std::thread> workers;
      for (std::size_t t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
          bench_buffers<G>& b = *bufs[t];
          for (std::uint64_t i = 0; i < rounds; ++i)
            update_once<R, G>(c, b.v, std::span<const G>(b.g), model_copy ? b.out : std::span<bf16>(), k, nullptr);
        });
      for (auto& w : workers) w.join();
    });
    if (r > 0) best = std::min(best, s);
  }
  return best * static_cast<double>(n) / static_cast<double>(threads * rounds * resident);
}

/// The rule's hyper-parameters in this benchmark: torch's defaults, SGD with momentum 0.9.
template <class R>
typename R::options_type bench_options() {
  typename R::options_type o{};
  if constexpr (std::is_same_v<R, sgd_rule>) o.momentum = 0.9;
  return o;
}

/// Runs `f.template operator()<R>()` with the rule called `name`.
template <class F>
decltype(auto) with_bench_rule(std::string_view name, F&& f) {
  if (name == "adamw-bf16") return f.template operator()<adamw_bf16_rule>();
  if (name == "adamw-8bit") return f.template operator()<adamw_8bit_rule>();
  if (name == "sgd") return f.template operator()<sgd_rule>();
  if (name == "lion") return f.template operator()<lion_rule>();
  return f.template operator()<adamw_rule>();
}

int run(args& a) {
  const auto n = a.count("params", 64'000'000);
  const auto threads = a.count("threads", default_thread_count());
  const auto grad = a.choice("grad", {"fp32", "bf16", "fp16"}, "bf16");
  const auto moments = a.choice("moments", {"fp32", "bf16"}, "fp32");
  auto rule = a.choice("rule", {"adamw", "adamw-bf16", "adamw-8bit", "sgd", "lion"}, "adamw");
  const auto device = a.choice("device", {"cpu", "cuda"}, "cpu");
  const auto isa_name = a.choice("isa", {"automatic", "portable", "avx2", "avx512"}, "automatic");
  const auto reps = a.count("reps", 5);
  const auto tile = a.count("tile", adamw_default_tile_elems);
  const bool model_copy = !a.flag("no-model-copy");
  const bool json = a.flag("json");
  a.finish();
  if (n == 0 || threads == 0 || threads > 1024 || reps == 0 || tile == 0)
    throw usage_error("adamw: --params, --threads (1..1024), --reps and --tile must be positive");
  // --moments bf16 is AdamW with bf16 moments, the rule adamw-bf16.
  if (moments == "bf16") {
    if (rule != "adamw" && rule != "adamw-bf16")
      throw usage_error("adamw: --moments bf16 is --rule adamw-bf16; it does not go with --rule " + rule);
    rule = "adamw-bf16";
  }
  if (rule == "adamw-8bit" && tile % q8_block_elems != 0)
    throw usage_error(fmt::format("adamw: --rule adamw-8bit updates whole blocks of {}: --tile must be a multiple",
                                  q8_block_elems));
  const std::uint64_t grad_bytes = grad == "fp32" ? 4 : 2;
  // Every byte once: the state read and written, the gradient read, the copy written.
  const std::uint64_t state_bytes =
      with_bench_rule(rule, [&]<class R>() { return R::format(bench_options<R>()).state_bytes(n); });
  const std::uint64_t bytes = 2 * state_bytes + n * (grad_bytes + (model_copy ? 2 : 0));
  const double bytes_per_param = static_cast<double>(bytes) / static_cast<double>(n);
  const std::string state =
      with_bench_rule(rule, [&]<class R>() { return describe(R::format(bench_options<R>())); });

  double seconds = 0;
  double bound_GBps = 0;
  double memcpy_GBps = 0;
  double cache_gparams = 0;  // the update computed from caches (CPU only)
  std::string bound_name;
  std::string path;
  if (device == "cuda") {
#if STRATA_BENCH_CUDA
    if (rule != "adamw") throw usage_error("adamw: --device cuda measures AdamW with fp32 moments only (--rule adamw)");
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
    const cpu_times t = with_bench_rule(rule, [&]<class R>() {
      const auto per_step = [&]<class G>() {
        const rule_case<R> c{bench_options<R>(), tile, isa};
        cpu_times m = cpu_seconds_per_step<R, G>(c, n, threads, model_copy, r);
        m.from_cache = cpu_seconds_from_cache<R, G>(c, n, threads, model_copy, r);
        return m;
      };
      return grad == "fp32"   ? per_step.template operator()<float>()
             : grad == "bf16" ? per_step.template operator()<bf16>()
                              : per_step.template operator()<fp16>();
    });
    seconds = t.update;
    // The bound: the update's own streams without its arithmetic, the fastest way, interleaved with it.
    bound_GBps = static_cast<double>(bytes) / t.streams / 1e9;
    bound_name = "streams:" + to_string(t.way);
    // For reference only (a plain copy is no bound: it has fewer streams than the update).
    memcpy_GBps = measure_copy_bandwidth(std::max<std::uint64_t>(bytes / 2, 1), threads, r).GBps;
    cache_gparams = static_cast<double>(n) / t.from_cache / 1e9;
  }
  const double gparams = static_cast<double>(n) / seconds / 1e9;
  const double GBps = static_cast<double>(bytes) / seconds / 1e9;
  const double ratio = GBps / bound_GBps;
  if (json) {
    fmt::print("{}\n", json_object{}
                           .add("device", device)
                           .add("path", path)
                           .add("rule", rule)
                           .add("state", state)
                           .add("params", n)
                           .add("threads", threads)
                           .add("grad", grad)
                           .add("moments", rule == "adamw-bf16" ? "bf16" : rule == "adamw-8bit" ? "q8" : "fp32")
                           .add("model_copy", model_copy)
                           .add("bytes_per_param", bytes_per_param)
                           .add("seconds", seconds)
                           .add("Gparams_per_s", gparams)
                           .add("GBps", GBps)
                           .add("bound", bound_name)
                           .add("bound_GBps", bound_GBps)
                           .add("ratio", ratio)
                           .add("memcpy_GBps", memcpy_GBps)
                           .add("cache_Gparams_per_s", cache_gparams)
                           .str());
  } else {
    fmt::print("{} on {} ({}): {} params, {} grads, state {}{}, {} threads\n", rule, device, path, n, grad, state,
               model_copy ? " + bf16 model copy" : "", device == "cuda" ? 0 : threads);
    fmt::print("  {:.3f} ms per step, {:.3f} Gparams/s, {:.2f} GB/s ({:.3f} B/param, each byte once)\n",
               seconds * 1e3, gparams, GBps, bytes_per_param);
    fmt::print("  bound ({} in this run): {:.2f} GB/s; ratio {:.3f}\n", bound_name, bound_GBps, ratio);
    if (cache_gparams > 0)
      fmt::print("  the same update computed from caches: {:.3f} Gparams/s ({:.3f} of it in memory; the bound's rate "
                 "is {:.3f} of it)\n",
                 cache_gparams, gparams / cache_gparams,
                 bound_GBps / bytes_per_param / cache_gparams);
    if (memcpy_GBps > 0) fmt::print("  (memcpy with the same threads, not a bound: {:.2f} GB/s)\n", memcpy_GBps);
  }
  return 0;
}

const registration reg{{"adamw", "an update rule's throughput (AdamW by default) vs the same-run memory bandwidth bound",
                        "[--params 64M] [--threads N] [--grad fp32|bf16|fp16] "
                        "[--rule adamw|adamw-bf16|adamw-8bit|sgd|lion] [--moments fp32|bf16] [--device cpu|cuda] "
                        "[--isa automatic|portable|avx2|avx512] [--tile 16384] [--reps 5] [--no-model-copy] [--json]",
                        &run}};
}  // namespace
}  // namespace strata::bench
