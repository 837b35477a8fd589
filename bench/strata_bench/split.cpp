// strata-bench split: does the update cost model pick a good CPU/device split? On a simulated
// device (host_executor whose copies are paced to --h2d/--d2h and whose kernel is paced to
// --device-rate), it measures the update rates (measure_update_rates, as a user would), lets the
// cost model choose the device share, then times steps of offloaded_adamw with every fixed share
// of a sweep and with the model's share, in the same run, and prints the model's step time
// against the best fixed one (ratio best_fixed / model: 1 = as good as the best of the sweep).
//
// The state is cached in host memory for the whole run (host tier, cache of every subgroup, the
// alternating order), so after the first step a step is only the updates: what the split
// decides. The host kernel runs on --threads CPU threads; the simulated device's kernel uses one
// more CPU thread (it runs the CPU kernel, then sleeps to its pace). The model starts from the
// probe's rates and, after every step, learns the host rate from the step's own kernel time.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/core/units.hpp>
#include <strata/exec/host_executor.hpp>
#include <strata/exec/paced.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/offload/adamw_device.hpp>
#include <strata/pipeline/update_cost_model.hpp>
#include <strata/tier/host_tier.hpp>

#include "cli.hpp"
#include "report.hpp"

namespace strata::bench {
namespace {

using sim_stream = paced<host_stream>;
using sim_executor = host_executor<sim_stream>;
using optimizer = offloaded_adamw<host_tier, sweep_aware, alternating, sim_executor, cost_model_site>;

std::vector<double> parse_shares(const std::string& text) {
  std::vector<double> out;
  for (std::size_t pos = 0; pos <= text.size();) {
    const auto comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    const double v = parse_real(item, fmt::format("split: --shares '{}'", text));
    if (!(v >= 0 && v <= 1))
      throw usage_error(fmt::format("split: --shares '{}': '{}' is not a share in [0, 1]", text, item));
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

int run(args& a) {
  const auto n = a.count("params", 32'000'000);
  const auto subgroup = a.count("subgroup", 2'000'000);
  const auto threads = a.count("threads", 1);
  const double h2d = static_cast<double>(a.size("h2d", 4'000'000'000));
  const double d2h = static_cast<double>(a.size("d2h", 4'000'000'000));
  const double device_rate = static_cast<double>(a.count("device-rate", 300'000'000));
  const auto iters = a.count("iters", 2);
  const auto shares = parse_shares(a.get_or("shares", "0,0.125,0.25,0.375,0.5,0.625,0.75,0.875,1"));
  const bool json = a.flag("json");
  a.finish();
  if (n == 0 || subgroup == 0 || threads == 0 || threads > 1024 || iters == 0 || h2d <= 0 || d2h <= 0 ||
      device_rate <= 0)
    throw usage_error("split: --params, --subgroup, --threads (1..1024), --iters, --h2d, --d2h and --device-rate must be positive");

  sim_executor exec({.name = "sim", .kernel_rate = device_rate},
                    [&](stream_role, const std::string& name) {
                      return std::make_unique<sim_stream>(pace_options{.h2d_bandwidth = h2d, .d2h_bandwidth = d2h}, name);
                    });
  thread_pool pool(threads, "split-probe");
  // The rates as a user would measure them: one subgroup, on this executor and these threads.
  const update_rates rates = measure_update_rates(exec, subgroup, threads > 1 ? &pool : nullptr);
  adamw_options ao;
  offload_options off;
  off.subgroup_elems = subgroup;
  off.threads = threads;
  off.device_depth = 2;
  const offload_layout layout = offload_layout::of(n, ao, off);
  off.host_cache_bytes = layout.cache_bytes(layout.subgroups());
  // A step's device traffic: the state and bf16 gradients in, the state out (no model copy).
  const device_traffic traffic{static_cast<double>(layout.state_bytes_per_param() + 2),
                               static_cast<double>(layout.state_bytes_per_param())};
  // As many device updates in flight as the options ask and the device's free memory holds.
  const std::size_t depth = update_cost_model::fitting_depth(
      off.device_depth, exec.device_budget() - exec.device_used(), layout.max_state_bytes() + layout.device_extra_bytes());
  cost_model_site site(update_cost_model{rates, traffic, depth}, layout.subgroups(), subgroup);

  std::mt19937 rng(1);
  std::vector<float> init(n);
  for (auto& x : init) x = static_cast<float>(rng() % 2001) * 1e-3f - 1.0f;
  std::vector<bf16> grads(n);
  for (auto& g : grads) g = bf16(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-5f);
  host_tier tier(host_tier_options{.name = "host"});
  optimizer opt(tier, exec, init, ao, off, {}, {}, site);
  // After every step the host kernel's time refines the host rate, as a training loop would do.
  const auto step = [&] {
    const auto st = opt.step(std::span<const bf16>(grads));
    site.observe((st.subgroups - st.device_updates) * subgroup, st.kernel_s, st.device_updates);
    return st;
  };
  step();  // fills the cache: every later step is all hits

  // Interleaved rounds (share by share, then again), best step of each: drift hits all alike.
  std::vector<double> fixed(shares.size(), 1e30);
  double model_s = 1e30;
  double model_share = 0;
  for (std::uint64_t it = 0; it < iters; ++it) {
    for (std::size_t i = 0; i <= shares.size(); ++i) {
      const bool is_fixed = i < shares.size();
      site.force(is_fixed ? std::optional<double>(shares[i]) : std::nullopt);
      if (!is_fixed) model_share = site.device_share();
      double& best_s = is_fixed ? fixed[i] : model_s;
      best_s = std::min(best_s, step().total_s);
    }
  }
  const auto best = std::min_element(fixed.begin(), fixed.end());
  const double best_share = shares[static_cast<std::size_t>(best - fixed.begin())];
  const double ratio = *best / model_s;
  const auto predicted = [&](double share) {
    return site.predicted_seconds(static_cast<std::size_t>(std::llround(share * static_cast<double>(layout.subgroups()))));
  };
  if (json) {
    json_object o;
    o.add("params", n)
        .add("subgroup", subgroup)
        .add("threads", threads)
        .add("h2d_paced", h2d)
        .add("d2h_paced", d2h)
        .add("device_rate_paced", device_rate)
        .add("host_params_per_s_probe", rates.host_params_per_s)
        .add("host_params_per_s_observed", site.model().rates.host_params_per_s)
        .add("device_params_per_s", rates.device_params_per_s)
        .add("h2d_bytes_per_s", rates.h2d_bytes_per_s)
        .add("d2h_bytes_per_s", rates.d2h_bytes_per_s)
        .add("model_share", model_share)
        .add("model_s", model_s)
        .add("best_fixed_share", best_share)
        .add("best_fixed_s", *best)
        .add("ratio", ratio);
    for (std::size_t i = 0; i < shares.size(); ++i) o.add(fmt::format("fixed_{:.3f}_s", shares[i]), fixed[i]);
    fmt::print("{}\n", o.str());
    return 0;
  }
  fmt::print("split on a simulated device: {} params, subgroups of {}, {} host kernel thread(s)\n", n, subgroup, threads);
  fmt::print("  paced: h2d {}/s, d2h {}/s, device kernel {:.0f} Mparams/s\n", format_size(static_cast<std::uint64_t>(h2d)),
             format_size(static_cast<std::uint64_t>(d2h)), device_rate / 1e6);
  fmt::print("  measured: host {:.0f} Mparams/s (probe; {:.0f} in the steps), device {:.0f} Mparams/s, h2d {}/s, d2h {}/s\n",
             rates.host_params_per_s / 1e6, site.model().rates.host_params_per_s / 1e6, rates.device_params_per_s / 1e6,
             format_size(static_cast<std::uint64_t>(rates.h2d_bytes_per_s)),
             format_size(static_cast<std::uint64_t>(rates.d2h_bytes_per_s)));
  fmt::print("  {:>8} {:>10} {:>12}\n", "share", "step s", "predicted s");
  for (std::size_t i = 0; i < shares.size(); ++i)
    fmt::print("  {:>8.3f} {:>10.4f} {:>12.4f}\n", shares[i], fixed[i], predicted(shares[i]));
  fmt::print("  model's share {:.3f}: {:.4f} s (predicted {:.4f}); best fixed share {:.3f}: {:.4f} s; ratio {:.3f}\n",
             model_share, model_s, predicted(model_share), best_share, *best, ratio);
  return 0;
}

const registration reg{{"split", "CPU/device update split: the cost model's choice vs a sweep of fixed splits (simulated device)",
                        "[--params 32M] [--subgroup 2M] [--threads 1] [--h2d 4GB] [--d2h 4GB] [--device-rate 300M] "
                        "[--shares 0,0.125,...,1] [--iters 2] [--json]",
                        &run}};
}  // namespace
}  // namespace strata::bench
