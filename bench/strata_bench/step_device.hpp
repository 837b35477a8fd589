#pragma once
// strata-bench step --device sim|cuda: offloaded_adamw steps with the model and the gradients in
// device memory, as on a training node: backward's gradients are handed over from device memory
// (D2H on the d2h stream while "backward" ends), each subgroup is updated on the CPU (weights
// copied back H2D) or on the device (state H2D, kernel writes the model in place, state D2H) as
// the cost model or --device-share says, and the step ends when everything has landed.
//
// Every stream of the executor is traced<>: the table shows how long each was busy, and the
// Chrome trace (--trace) has one track per stream beside the pipeline's spans. The bound is the
// step's own lower bound for the split it ran: the longest of its H2D bytes / H2D bandwidth, its
// D2H bytes / D2H bandwidth, its host kernels' time (they run one at a time) and its device
// updates / device kernel rate. With --device sim the bandwidths and the kernel rate are the
// paced ones (exact floors); with --device cuda they are the rates measured before the runs.
//
// sim: host_executor<traced<paced<host_stream>>>: copies paced to --h2d/--d2h on one shared link
// per direction, the device kernel (the CPU kernel on one more thread) paced to --device-rate.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/core/trace.hpp>
#include <strata/core/units.hpp>
#include <strata/exec/device_span.hpp>
#include <strata/exec/traced.hpp>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/offload/presets.hpp>
#include <strata/offload/adamw_device.hpp>
#include <strata/pipeline/update_cost_model.hpp>

#include "cli.hpp"
#include "report.hpp"

namespace strata::bench {

/// What --device runs with (parsed by step.cpp).
struct device_step_config {
  std::uint64_t params = 0, subgroup = 0, threads = 1, iters = 3, warmup = 1;
  std::uint64_t cache_bytes = 0;
  std::vector<offload_path_config> paths;  // empty: the state in host memory
  std::optional<double> share;             // forced device share; none: the cost model decides
  bool compare_cpu = false;                // also run CPU-only steps, interleaved
  bool integrity = true;                   // checksummed paths
  std::optional<std::string> json_path, trace_path;
  tracer* trace = nullptr;
};

/// Speeds the bound uses, and whether they are exact floors (paced) or measured.
struct device_bound_rates {
  double h2d = 0, d2h = 0, device_params_per_s = 0;
  bool paced = false;
};

namespace detail {

/// One measured step.
struct device_iteration {
  double step_s = 0, grads_s = 0, update_s = 0, kernel_s = 0, bound_s = 0, update_bound_s = 0, predicted_s = 0;
  std::size_t device_subgroups = 0, subgroups = 0;
  stream_activity h2d, compute, d2h;
};

inline stream_activity minus(stream_activity a, const stream_activity& b) {
  a.busy_s -= b.busy_s;
  a.operations -= b.operations;
  a.bytes -= b.bytes;
  return a;
}

}  // namespace detail

/// Runs the steps on `exec` (whose streams are traced<...>) and prints the table.
template <class Exec>
int run_device_steps(const device_step_config& c, Exec& exec, std::string_view kind, device_bound_rates bound_rates) {
  using tier_type = dynamic_multipath<bandwidth_proportional>;
  using optimizer = offloaded_adamw<tier_type, presets::strata_preset::eviction, presets::strata_preset::order, Exec,
                                    cost_model_site>;
  const std::size_t n = static_cast<std::size_t>(c.params);
  const std::size_t sg = static_cast<std::size_t>(c.subgroup);
  adamw_options ao;
  offload_options base;
  base.subgroup_elems = sg;
  base.threads = static_cast<std::size_t>(c.threads);
  base.host_cache_bytes = c.cache_bytes;
  offload_options off = presets::strata_preset::options(n, ao, base);
  const offload_layout layout = offload_layout::of(n, ao, off);
  if (c.cache_bytes == unlimited_capacity) off.host_cache_bytes = layout.cache_bytes(layout.subgroups());

  // The rates as a user would measure them, on this executor: the cost model starts from them.
  thread_pool pool(static_cast<std::size_t>(c.threads), "probe");
  const update_rates rates = measure_update_rates(exec, sg, c.threads > 1 ? &pool : nullptr);
  const device_traffic traffic{static_cast<double>(layout.state_bytes_per_param() + 2),
                               static_cast<double>(layout.state_bytes_per_param())};
  const std::size_t depth = update_cost_model::fitting_depth(
      off.device_depth, exec.device_budget() - exec.device_used(), layout.max_state_bytes() + layout.device_extra_bytes());
  if (bound_rates.h2d <= 0) bound_rates.h2d = rates.h2d_bytes_per_s;
  if (bound_rates.d2h <= 0) bound_rates.d2h = rates.d2h_bytes_per_s;
  if (bound_rates.device_params_per_s <= 0) bound_rates.device_params_per_s = rates.device_params_per_s;
  cost_model_site site(update_cost_model{rates, traffic, depth}, layout.subgroups(), sg);

  offloaded_adamw_config pc;  // the paths as make_offloaded_adamw builds them (checksummed unless --no-integrity)
  pc.paths = c.paths;
  pc.verify_integrity = c.integrity;
  if (pc.paths.empty()) pc.paths.push_back(offload_path_config{.directory = {}, .name = "host"});
  std::vector<any_tier> paths;
  for (std::size_t i = 0; i < pc.paths.size(); ++i) paths.push_back(strata::detail::make_verified_path(pc, i, nullptr));
  tier_type tier(bandwidth_proportional{}, std::move(paths), "paths");

  std::vector<float> init(n);
  std::uint32_t x = 1;
  for (auto& p : init) {
    x = x * 1664525u + 1013904223u;
    p = static_cast<float>(static_cast<std::int32_t>(x)) * 0x1p-31f;
  }
  const auto t_setup = std::chrono::steady_clock::now();
  optimizer opt(tier, exec, init, ao, off, {}, {}, site, c.trace);
  struct remove_state_at_end {  // the run's state never outlives it, also when it fails
    optimizer& opt;
    ~remove_state_at_end() {
      try {
        (void)opt.remove_state();
      } catch (const std::exception& e) {
        fmt::print(stderr, "strata-bench: step: removing the state: {}\n", e.what());
      }
    }
  } remove_guard{opt};
  const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_setup).count();

  // The model and backward's gradients in device memory.
  auto grads_mem = exec.allocate_device(n * sizeof(bf16));
  auto model_mem = exec.allocate_device(n * sizeof(bf16));
  const device_span<bf16> dgrads(reinterpret_cast<bf16*>(grads_mem.data()), n);
  const device_span<bf16> dmodel(reinterpret_cast<bf16*>(model_mem.data()), n);
  {
    std::vector<bf16> g(n), m(n);
    for (std::size_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      g[i] = bf16(static_cast<float>(static_cast<std::int32_t>(x)) * 0x1p-41f);
      m[i] = bf16(init[i]);
    }
    exec.h2d().copy_to_device(dgrads.bytes(), std::as_bytes(std::span(g)));
    exec.h2d().copy_to_device(dmodel.bytes(), std::as_bytes(std::span(m)));
    exec.h2d().sync();
  }
  fmt::print("step --device {}: {} parameters ({} of fp32 state), subgroups of {} ({}), {} host kernel threads, "
             "state on {}; cache {} subgroups; initial state written in {:.1f} s\n",
             kind, n, format_size(static_cast<std::uint64_t>(n) * 12), sg, layout.subgroups(), c.threads,
             c.paths.empty() ? std::string("host memory") : fmt::format("{} path(s)", c.paths.size()),
             opt.stats().cache_slots, setup_s);
  fmt::print("  measured before the runs: host kernel {:.2f} Gparams/s, device kernel {:.2f} Gparams/s, h2d {:.2f} GB/s, "
             "d2h {:.2f} GB/s; {} device updates in flight\n",
             rates.host_params_per_s / 1e9, rates.device_params_per_s / 1e9, rates.h2d_bytes_per_s / 1e9,
             rates.d2h_bytes_per_s / 1e9, depth);
  fmt::print("  bound uses: h2d {:.2f} GB/s, d2h {:.2f} GB/s, device kernel {:.2f} Gparams/s ({})\n", bound_rates.h2d / 1e9,
             bound_rates.d2h / 1e9, bound_rates.device_params_per_s / 1e9,
             bound_rates.paced ? "paced: exact floors" : "measured");

  const auto one = [&](std::optional<double> share) {
    site.force(share);
    const auto before_h2d = exec.h2d().activity(), before_c = exec.compute().activity(),
               before_d2h = exec.d2h().activity();
    const auto t0 = std::chrono::steady_clock::now();
    const auto ready = exec.compute().record();  // backward's last kernel
    for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
      opt.accept_gradients(s, device_span<const bf16>(dgrads).subspan(opt.begin(s), opt.length(s)), ready);
    // In training the gradients' D2H runs while backward goes on; here backward is already done,
    // so the time until they landed is shown apart from the update that follows.
    exec.d2h().record().completion().wait();
    const auto t1 = std::chrono::steady_clock::now();
    const auto st = opt.step(1e-4, dmodel);
    detail::device_iteration it;
    const auto t2 = std::chrono::steady_clock::now();
    it.step_s = std::chrono::duration<double>(t2 - t0).count();
    it.grads_s = std::chrono::duration<double>(t1 - t0).count();
    it.update_s = std::chrono::duration<double>(t2 - t1).count();
    it.kernel_s = st.kernel_s;
    it.subgroups = st.subgroups;
    it.device_subgroups = st.device_updates;
    it.h2d = detail::minus(exec.h2d().activity(), before_h2d);
    it.compute = detail::minus(exec.compute().activity(), before_c);
    it.d2h = detail::minus(exec.d2h().activity(), before_d2h);
    const double device_params = static_cast<double>(st.device_updates * sg);
    const double h2d_s = static_cast<double>(it.h2d.bytes) / bound_rates.h2d;
    const double grads_d2h_s = static_cast<double>(n * sizeof(bf16)) / bound_rates.d2h;
    const double d2h_s = static_cast<double>(it.d2h.bytes) / bound_rates.d2h;
    const double kernels_s = std::max(it.kernel_s, device_params / bound_rates.device_params_per_s);
    it.bound_s = std::max({h2d_s, d2h_s, kernels_s});
    it.update_bound_s = std::max({h2d_s, d2h_s - grads_d2h_s, kernels_s});
    it.predicted_s = site.predicted_seconds(st.device_updates);
    site.observe((st.subgroups - st.device_updates) * sg, st.kernel_s, st.device_updates);  // forced steps teach it too
    return it;
  };
  std::vector<detail::device_iteration> split_its, cpu_its;
  for (std::uint64_t k = 0; k < c.warmup; ++k) {
    (void)one(c.share);
    if (c.compare_cpu) (void)one(0.0);
  }
  for (std::uint64_t k = 0; k < c.iters; ++k) {
    split_its.push_back(one(c.share));
    if (c.compare_cpu) cpu_its.push_back(one(0.0));
  }

  const auto row = [&](std::string_view name, const std::vector<detail::device_iteration>& its) {
    const auto med = [&](auto f) {
      std::vector<double> v;
      for (const auto& i : its) v.push_back(f(i));
      return median(std::move(v));
    };
    const double step = med([](const auto& i) { return i.step_s; });
    const double update = med([](const auto& i) { return i.update_s; });
    const double bound = med([](const auto& i) { return i.bound_s; });
    const double ubound = med([](const auto& i) { return i.update_bound_s; });
    fmt::print("{:<10} {:>7.3f} {:>7.3f} {:>7.3f} {:>5.0f}/{:<4} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>7.2f} {:>7.2f} "
               "{:>7.3f} {:>5.2f} {:>8.3f} {:>5.2f} {:>8.3f}\n",
               name, step, med([](const auto& i) { return i.grads_s; }), update, med([](const auto& i) { return static_cast<double>(i.device_subgroups); }), its.front().subgroups,
               med([](const auto& i) { return i.h2d.busy_s; }), med([](const auto& i) { return i.compute.busy_s; }),
               med([](const auto& i) { return i.d2h.busy_s; }), med([](const auto& i) { return i.kernel_s; }),
               med([](const auto& i) { return static_cast<double>(i.h2d.bytes) / 1e9; }),
               med([](const auto& i) { return static_cast<double>(i.d2h.bytes) / 1e9; }), bound, bound / step, ubound,
               ubound / update, med([](const auto& i) { return i.predicted_s; }));
    // How fast each link ran while busy, against the rate measured before the runs (pinned
    // cudaMemcpyAsync on a GPU), and how much the two directions overlapped.
    double hb = 0, hs = 0, db = 0, ds = 0, both = 0;
    for (const auto& i : its) {
      hb += static_cast<double>(i.h2d.bytes), hs += i.h2d.busy_s;
      db += static_cast<double>(i.d2h.bytes), ds += i.d2h.busy_s;
      both += i.h2d.busy_s + i.d2h.busy_s - i.step_s;
    }
    if (hs > 0 && ds > 0)
      fmt::print("{:<10} links while busy: h2d {:.2f} GB/s ({:.2f} of measured), d2h {:.2f} GB/s ({:.2f} of measured); "
                 "busy at once at least {:.3f} s per step\n",
                 "", hb / hs / 1e9, hb / hs / rates.h2d_bytes_per_s, db / ds / 1e9, db / ds / rates.d2h_bytes_per_s,
                 std::max(0.0, both / static_cast<double>(its.size())));
    return update;
  };
  fmt::print("\n{} measured steps each after {} warm-up{}; medians; GB = 1e9 bytes; busy = seconds the stream ran work\n",
             c.iters, c.warmup, c.compare_cpu ? ", CPU-only steps interleaved" : "");
  const std::string head = fmt::format(
      "{:<10} {:>7} {:>7} {:>7} {:>10} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>5} {:>8} {:>5} {:>8}", "split", "step s",
      "grads s", "upd s", "device sg", "h2d busy", "dev busy", "d2h busy", "cpu kern", "h2d GB", "d2h GB", "bound s", "eff",
      "upd bnd", "eff", "model s");
  fmt::print("{}\n{}\n", head, std::string(head.size(), '-'));
  const double split_s = row(c.share ? fmt::format("share {:.2f}", *c.share) : "model", split_its);
  double cpu_s = 0;
  if (c.compare_cpu) {
    cpu_s = row("cpu only", cpu_its);
    fmt::print("update, split vs CPU-only: {:.2f}x\n", cpu_s / split_s);
  }
  fmt::print("step = grads (D2H of backward's gradients; in training it runs during backward) + upd (the update).\n"
             "bound: max(h2d bytes / h2d bw, d2h bytes / d2h bw, host kernel time, device params / device kernel rate)\n"
             "for the split each step ran; upd bnd: the same without the gradients' D2H; eff = bound / time.\n"
             "model s: the cost model's prediction of the update for that split.\n");

  if (c.json_path) {
    json_object j;
    j.add("command", "step").add("device", kind).add("params", c.params).add("subgroup", c.subgroup);
    j.add("threads", c.threads).add("iters", c.iters).add("warmup", c.warmup);
    j.add("host_params_per_s", rates.host_params_per_s).add("device_params_per_s", rates.device_params_per_s);
    j.add("h2d_bytes_per_s", rates.h2d_bytes_per_s).add("d2h_bytes_per_s", rates.d2h_bytes_per_s);
    j.add("bound_h2d", bound_rates.h2d).add("bound_d2h", bound_rates.d2h);
    j.add("bound_device_params_per_s", bound_rates.device_params_per_s).add("bound_paced", bound_rates.paced);
    const auto dump = [](const std::vector<detail::device_iteration>& its) {
      std::vector<std::string> out;
      for (const auto& i : its) {
        json_object o;
        o.add("step_s", i.step_s).add("grads_s", i.grads_s).add("update_s", i.update_s);
        o.add("bound_s", i.bound_s).add("update_bound_s", i.update_bound_s).add("predicted_s", i.predicted_s);
        o.add("kernel_s", i.kernel_s).add("device_subgroups", static_cast<std::uint64_t>(i.device_subgroups));
        o.add("subgroups", static_cast<std::uint64_t>(i.subgroups));
        o.add("h2d_busy_s", i.h2d.busy_s).add("compute_busy_s", i.compute.busy_s).add("d2h_busy_s", i.d2h.busy_s);
        o.add("h2d_bytes", i.h2d.bytes).add("d2h_bytes", i.d2h.bytes);
        out.push_back(o.str());
      }
      return out;
    };
    j.add_array("split", dump(split_its));
    if (c.compare_cpu) j.add_array("cpu_only", dump(cpu_its)).add("update_speedup_vs_cpu_only", cpu_s / split_s);
    std::ofstream out(*c.json_path);
    out << j.str() << "\n";
    out.close();
    if (!out) throw io_error("write --json", *c.json_path, errno);
    fmt::print("wrote {}\n", *c.json_path);
  }
  if (c.trace != nullptr && c.trace_path) {
    c.trace->write_chrome_trace(*c.trace_path);
    fmt::print("wrote {} (open in ui.perfetto.dev; one track per stream)\n", *c.trace_path);
  }
  return 0;
}

/// --device sim: a paced host executor (step_device.cpp).
int run_device_sim(const device_step_config& c, double h2d, double d2h, double device_rate, std::uint64_t device_memory);
/// --device cuda (step_device_cuda.cu; a usage_error when strata-bench was built without CUDA).
int run_device_cuda(const device_step_config& c, std::uint64_t device_memory);

}  // namespace strata::bench
