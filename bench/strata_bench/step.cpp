// strata-bench step: end-to-end optimizer steps of strata's offloaded optimizer (AdamW, or --rule) under each preset
// (zero_infinity, mlp_offload, strata) over the same paths, with where the time went, the bytes
// each path moved, the full-duplex lower bound of docs/design.md section 2 and, with --compare,
// each preset's speedup over zero_infinity measured in the same process with the presets
// interleaved. Variants for honest comparisons: --compare-equal adds zero_infinity striped over
// every path (RAID0) with the same host cache; --mlp-lock runs mlp_offload with MLP-Offload's
// separate read and write locks, one shared lock, or none (the ablation).
//
// One measured iteration of a preset = the gradient hand-over of backward (accept_gradients_at,
// one subgroup at a time: a host copy, or ZeRO-Infinity's fp32 write to the tier) + step(). The
// gradient hand-over is part of the iteration because it is what ZeRO-Infinity pays in backward
// and what keeping 16-bit gradients in host memory saves (docs/design.md section 1).
//
// With --compute T an iteration also has a training step's compute, on a simulated device: forward
// takes the first third of T, backward the rest, and backward's gradients land evenly over it in
// reverse subgroup order (the last layers first), each handed over as it lands, as a GPU would; the
// host waits for the device as a training loop does. strata overlaps the step's I/O with that
// compute (the step is declared before forward with begin_step: each subgroup is updated as its
// gradients land, the next step's first reads start as a step returns, its last writes land after
// it); the systems the other presets emulate run their step after backward. The bound of the iteration is max(T, the step's I/O bound), and
// strata-no-overlap (strata with every overlap off) is the ablation.
//
// An iteration's bound leaves out the bytes in flight as it began (they may have moved before it).
// Back to back, they moved in the step before, whose bound left them out too: --run N measures N
// iterations of a preset back to back and also bounds each run's whole window, counting them once.
//
// A path is DIR[:READ[:WRITE]]. READ/WRITE (bytes per second, e.g. 1GB, 500MB) cap the path with
// the throttled adaptor, to emulate a PFS link or an object store on one machine; WRITE defaults
// to READ. Every path is also probed (O_DIRECT write then read of --probe bytes) before the
// runs, so the bound uses bandwidths measured in the same run: the probe's, or the cap when lower.
//
// A path may also be an object store, s3://bucket/prefix[:READ[:WRITE]] (offload_path_config::url;
// credentials, endpoint and region from the AWS_* variables): READ/WRITE cap it the same way, and
// its probe writes and reads --probe bytes through an object_store_tier under <prefix>/.probe/.
// Each preset's state goes under <prefix>/strata-bench-step/<preset>/, as under DIR for a directory.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <strata/core/aligned_buffer.hpp>
#include <strata/core/fs.hpp>
#include <strata/core/half.hpp>
#include <strata/tier/path_arg.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/core/trace.hpp>
#include <strata/core/units.hpp>
#include <strata/offload/offload_layout.hpp>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/presets.hpp>
#include <strata/tier/file_tier.hpp>
#include <strata/tier/object_store_tier.hpp>
#include <strata/core/host_memory.hpp>
#include <strata/core/process_memory.hpp>

#include "cli.hpp"
#include "report.hpp"
#include "step_device.hpp"

namespace strata::bench {
namespace {

namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

double since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

/// One --path.
struct path_spec {
  fs::path dir;     // a directory, or empty for an object store
  std::string url;  // an object store: "s3://bucket/prefix" (no bandwidths), else empty
  std::string name;
  double read_cap = 0, write_cap = 0;        // bytes/s; 0: uncapped
  double probe_read = 0, probe_write = 0;    // bytes/s measured before the runs (0: not probed)
  bool probe_stats_valid = false;
#if STRATA_HAS_S3
  object_store_stats probe_stats{};  // what the object store's probe cost
#endif
  [[nodiscard]] bool is_s3() const noexcept { return !url.empty(); }
  /// Where the path is, for messages: its directory or URL.
  [[nodiscard]] std::string where() const { return is_s3() ? url : dir.string(); }
  [[nodiscard]] double read_bw() const { return effective(read_cap, probe_read); }
  [[nodiscard]] double write_bw() const { return effective(write_cap, probe_write); }
  static double effective(double cap, double probed) {
    if (cap > 0 && probed > 0) return std::min(cap, probed);
    return cap > 0 ? cap : probed;
  }
};

path_spec parse_path(const std::string& text, std::size_t index) {
  path_spec p;
  if (text.starts_with("s3://")) {
#if STRATA_HAS_S3
    s3_path_arg a;
    try {
      a = parse_s3_path_arg(text);
    } catch (const config_error& e) {
      throw usage_error(fmt::format("step: --path '{}': {} (expected s3://bucket/prefix[:READ[:WRITE]], e.g. "
                                    "s3://strata/run7:500MB)",
                                    text, e.what()));
    }
    p.url = a.url;
    p.name = fmt::format("path{}", index);
    p.read_cap = a.read_bandwidth;
    p.write_cap = a.write_bandwidth;
    return p;
#else
    throw usage_error(fmt::format("step: --path {}: strata-bench was built without the S3 tier (libcurl and "
                                  "libcrypto, STRATA_ENABLE_S3)",
                                  text));
#endif
  }
  try {  // (a URL that is not s3:// is refused, not taken for DIR:READ)
    (void)parse_path_arg(text, "step: --path");
  } catch (const config_error& e) {
    throw usage_error(e.what());
  }
  const auto colon = text.find(':');
  p.dir = text.substr(0, colon);
  if (p.dir.empty()) throw usage_error(fmt::format("step: --path '{}' has no directory", text));
  p.name = index == 0 ? "path0" : fmt::format("path{}", index);
  if (colon != std::string::npos) {
    const std::string rest = text.substr(colon + 1);
    const auto c2 = rest.find(':');
    try {
      p.read_cap = static_cast<double>(parse_size(rest.substr(0, c2)));
      p.write_cap = c2 == std::string::npos ? p.read_cap : static_cast<double>(parse_size(rest.substr(c2 + 1)));
    } catch (const config_error& e) {
      throw usage_error(fmt::format("step: --path '{}': {} (expected DIR[:READ[:WRITE]], e.g. /pfs/x:1GB:800MB)", text,
                                    e.what()));
    }
    if (p.read_cap <= 0 || p.write_cap <= 0)
      throw usage_error(fmt::format("step: --path '{}': bandwidths must be positive", text));
  }
  return p;
}

#if STRATA_HAS_S3
/// Write-then-read of `bytes` through an object_store_tier under <prefix>/.probe/ (median of
/// `reps`), as `strata-bench io --path s3://...` does; its objects are removed after.
void probe_s3(path_spec& p, std::uint64_t bytes, int reps) {
  const std::string url = s3_sub_url(p.url, ".probe");
  const auto o = s3_bench_options(url, "probe");
  aligned_buffer data(bytes, 4096, buffer_init::uninitialized);
  fill_incompressible(data.bytes());
  const std::uint64_t object = std::min<std::uint64_t>(bytes, 64u << 20);
  std::vector<std::string> names;
  for (std::uint64_t off = 0, i = 0; off < bytes; off += object, ++i) names.push_back(probe_object_name(i));
  object_store_tier t(o);
  refuse_existing(t, names, url, "step: probe");
  const auto rates = probe_write_read(t, data.bytes(), object, static_cast<std::uint64_t>(reps));
  p.probe_write = median(rates.write) * 1e9;
  p.probe_read = median(rates.read) * 1e9;
  p.probe_stats = t.stats();
  p.probe_stats_valid = true;
}
#endif

/// O_DIRECT write-then-read of `bytes` under `dir` (median of `reps`), as `strata-bench io` does.
void probe(path_spec& p, std::uint64_t bytes, int reps) {
#if STRATA_HAS_S3
  if (p.is_s3()) return probe_s3(p, bytes, reps);
#endif
  file_tier_options o;
  o.directory = p.dir / ".probe";
  o.name = "probe";
  direct_io_buffer data(bytes, buffer_init::zeroed);
  for (std::uint64_t i = 0; i < bytes; i += 4096) data.data()[i] = static_cast<std::byte>(i >> 12);
  const std::uint64_t object = std::min<std::uint64_t>(bytes, 64u << 20);
  probe_rates rates;
  {
    file_tier t(o);
    rates = probe_write_read(t, data.bytes(), object, static_cast<std::uint64_t>(reps));
  }
  std::error_code ec;
  fs::remove(o.directory, ec);
  p.probe_write = median(rates.write) * 1e9;
  p.probe_read = median(rates.read) * 1e9;
}

// --- up-front checks: memory the run will really allocate, and how long its rates make it -------

/// What a page-aligned host block of `bytes` really costs: its whole pages and one more, which
/// glibc's posix_memalign spends on alignment (measured 2026-12 as RSS over 100000 blocks:
/// 8201 bytes per 4 KiB block, 135177 per 128 KiB). Slots and host-tier objects are such blocks,
/// so a million 1-parameter subgroups cost 8 KiB each per copy, not the 12 bytes of their state.
std::uint64_t aligned_block_cost(std::uint64_t bytes) {
  constexpr std::uint64_t page = 4096;
  return bytes == 0 ? 0 : (bytes + page - 1) / page * page + page;
}

/// The host memory a run will allocate, item by item, compared with the machine's before any of
/// it is: a run that cannot fit is one line with the numbers, not the OOM killer at 24 GB.
class memory_account {
 public:
  void add(std::string what, std::uint64_t bytes) {
    if (bytes > 0) items_.push_back({std::move(what), bytes});
  }
  [[nodiscard]] std::uint64_t total() const {
    std::uint64_t t = 0;
    for (const auto& i : items_) t += i.bytes;
    return t;
  }
  /// capacity_error naming every item (largest first) when the total exceeds physical memory.
  void require(std::string_view run, std::string_view advice) const {
    const std::uint64_t need = total(), mem = physical_memory();
    if (mem == 0 || need <= mem) return;
    auto items = items_;
    std::sort(items.begin(), items.end(), [](const item& a, const item& b) { return a.bytes > b.bytes; });
    std::string parts;
    for (const auto& i : items)
      parts += fmt::format("{}{} for {}", parts.empty() ? "" : ", ", format_size(i.bytes), i.what);
    throw capacity_error(fmt::format("{} need {} of host memory ({}); this machine has {}; {}", run, format_size(need),
                                     parts, format_size(mem), advice),
                         need, mem);
  }

 private:
  struct item {
    std::string what;
    std::uint64_t bytes;
  };
  std::vector<item> items_;
};

/// "N subgroups of S parameters" for the messages.
std::string describe_subgroups(const offload_layout& l) {
  return fmt::format("{} subgroup{} of {} parameter{}", l.subgroups(), l.subgroups() == 1 ? "" : "s",
                     l.subgroup_elems, l.subgroup_elems == 1 ? "" : "s");
}

/// Refuses, before anything is allocated, a subgroup count whose bookkeeping alone (per subgroup
/// and tier object, see offload_layout::bookkeeping_bytes) exceeds physical memory: with
/// `layouts` (one per optimizer the run builds), and the smallest --subgroup that would fit it.
void require_bookkeeping_fits(std::string_view run, const std::vector<offload_layout>& layouts) {
  std::uint64_t need = 0, per_subgroup = 0;  // per_subgroup: over all the optimizers
  for (const auto& l : layouts) {
    need += l.bookkeeping_bytes();
    per_subgroup += l.bookkeeping_bytes() / std::max<std::uint64_t>(1, l.subgroups());
  }
  const std::uint64_t mem = physical_memory();
  if (mem == 0 || need <= mem || layouts.empty()) return;
  const auto& l = layouts.front();
  const std::uint64_t fitting = std::max<std::uint64_t>(1, mem / std::max<std::uint64_t>(1, per_subgroup));
  const std::uint64_t smallest = (static_cast<std::uint64_t>(l.params) + fitting - 1) / fitting;
  throw capacity_error(
      fmt::format("{}: {}{}: strata's bookkeeping of about {} per subgroup{} needs {} of host memory before any "
                  "slot or state; this machine has {}; use --subgroup {} or more",
                  run, describe_subgroups(l),
                  layouts.size() > 1 ? fmt::format(" in {} optimizers", layouts.size()) : "",
                  format_size(per_subgroup), layouts.size() > 1 ? " over them" : "", format_size(need),
                  format_size(mem), smallest),
      need, mem);
}

/// "42 s", "3.5 h", "12 days", "31 years": a run time for a warning.
std::string describe_duration(double s) {
  if (s < 120) return fmt::format("{:.0f} s", s);
  if (s < 2 * 3600) return fmt::format("{:.0f} min", s / 60);
  if (s < 2 * 86400) return fmt::format("{:.1f} h", s / 3600);
  if (s < 2 * 365 * 86400.0) return fmt::format("{:.0f} days", s / 86400);
  return fmt::format("{:.3g} years", s / (365 * 86400.0));
}

/// The floor of a run's time, phase by phase (each phase's floor is its slowest part), so that a
/// warning can name the part that makes it long.
class run_time_floor {
 public:
  /// A phase whose parts run at once: it lasts as long as the longest.
  void phase(std::vector<std::pair<double, std::string>> parts) {
    double longest = 0;
    for (auto& [s, what] : parts) {
      if (!(s > 0)) continue;
      longest = std::max(longest, s);
      if (s > worst_s_) worst_s_ = s, worst_ = std::move(what);
    }
    total_s_ += longest;
  }
  /// One line on stderr when the floor passes an hour (1 B/s runs forever without a word else);
  /// the run goes on: the rates may be what the user means to measure.
  void warn_if_long(std::string_view run) const {
    if (total_s_ <= 3600) return;
    fmt::print(stderr,
               "strata-bench: {}: warning: these rates make this run take at least {} by its bound, most of it {} "
               "({}); it goes on (Ctrl-C stops it)\n",
               run, describe_duration(total_s_), worst_, describe_duration(worst_s_));
    std::fflush(stderr);
  }

 private:
  double total_s_ = 0, worst_s_ = 0;
  std::string worst_;
};

/// "1 B/s", "500 MB/s" (decimal, as the caps are written).
std::string describe_rate(double bytes_per_s) {
  if (bytes_per_s >= 1e9) return fmt::format("{:.3g} GB/s", bytes_per_s / 1e9);
  if (bytes_per_s >= 1e6) return fmt::format("{:.3g} MB/s", bytes_per_s / 1e6);
  if (bytes_per_s >= 1e3) return fmt::format("{:.3g} kB/s", bytes_per_s / 1e3);
  return fmt::format("{:.3g} B/s", bytes_per_s);
}

/// Figures of one measured iteration of one preset.
struct iteration {
  double total_s = 0;  // grads_s + step
  double grads_s = 0;  // forward and backward's compute (--compute) and the gradient hand-over
  double read_wait_s = 0, compute_s = 0, write_wait_s = 0, other_s = 0, kernel_s = 0;
  std::uint64_t cache_hits = 0, cache_misses = 0;
  std::uint64_t early_updates = 0, speculative_updates = 0;  // subgroups updated as gradients landed
  std::uint64_t grad_written = 0;  // fp32 gradient bytes backward wrote to the tier (zero_infinity)
  std::vector<std::uint64_t> path_read, path_written;  // completed bytes per path, gradients included
  double bound_s = 0, serial_bound_s = 0;
  double io_bound_s = 0;  // the I/O bound alone (bound_s is max(compute, it) with --compute)
  // Bytes in flight as the iteration began (reads the last step started, writes it left): they
  // complete inside the iteration but may have moved before it, so the bound leaves them out.
  std::uint64_t carried_read = 0, carried_written = 0;
  clk::time_point began{}, ended{};  // the window: begin_step to step()'s return
};

/// A run: measured iterations of one preset back to back (--run), one window from the first's
/// begin to the last's return.
struct run_figures {
  double wall_s = 0;   // the run's window, the gaps between its iterations included
  double bound_s = 0;  // a lower bound of wall_s (run_bound)
};

/// How one runner differs from its preset's defaults.
struct variant {
  std::string label;   // the table's name, also the runner's directory and object prefix
  std::string preset;  // make_offloaded_optimizer's preset
  std::string lock = "separate";  // mlp_offload: separate, shared or none
  bool equal = false;             // zero_infinity striped over every path, with the others' cache
  std::string rule = "adamw";     // the update rule (--rule)
  bool overlap = true;  // strata: the step's I/O overlaps forward and backward (prefetch_next_step,
                        // update_as_gradients_land, return_before_writes)
  bool speculate = true;  // strata with clipping or loss scaling: speculate_updates
};

/// The bench's config of `rule`: torch's defaults, SGD with momentum 0.9 (a momentum buffer, as
/// SGD is trained), so that each rule moves the state it is used with.
offloaded_optimizer_config rule_config(const std::string& rule) {
  offloaded_optimizer_config c;
  c.rule = rule;
  c.sgd.momentum = 0.9;
  return c;
}

/// The state format of `rule` as the bench configures it.
state_format format_of(const std::string& rule) {
  const auto c = rule_config(rule);
  return strata::detail::with_rule(rule, "step", [&]<class R>(std::type_identity<R>) {
    return R::format(strata::detail::rule_options_of<R>(c));
  });
}

/// One preset under test: its optimizer and its paths (indices into the --path list).
struct runner {
  std::string preset;  // the variant's label
  variant v;
  std::vector<std::size_t> paths;
  std::optional<any_offloaded_optimizer> opt;
  double setup_s = 0;
  std::vector<iteration> iters;
  std::vector<run_figures> runs;  // iters in runs of --run, each back to back
  std::uint64_t writes_left_bytes = 0;  // of its last step: they land in its next iteration
};

/// Cumulative bytes of each path of the running preset, sampled over time (for the throughput chart).
struct sample {
  double t;
  std::size_t preset;
  std::vector<std::uint64_t> read, written;
};

/// Samples the running preset's per-path totals every `period`; also draws the progress line.
class sampler {
 public:
  sampler(std::chrono::milliseconds period, clk::time_point t0, tracer* trace, bool progress)
      : period_(period), t0_(t0), trace_(trace), progress_(progress), thread_([this] { loop(); }) {}
  ~sampler() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (progress_) std::fprintf(stderr, "\r\033[K");
  }
  void running(runner* r, std::size_t index, std::string status) {
    std::lock_guard lock(mutex_);
    if (current_ != nullptr && r == nullptr) {
      take_locked();  // the end of the iteration (its last writes) belongs to its preset
      if (trace_ != nullptr)
        for (const auto& p : current_->opt->path_totals()) {  // counters drop to 0 while others run
          trace_->counter(fmt::format("{} {} read GB/s", current_->preset, p.name), 0.0);
          trace_->counter(fmt::format("{} {} write GB/s", current_->preset, p.name), 0.0);
        }
    }
    current_ = r;
    index_ = index;
    status_ = std::move(status);
    if (r != nullptr) take_locked();
  }
  std::vector<sample> samples() {
    std::lock_guard lock(mutex_);
    return samples_;
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, period_, [&] { return stop_; });
      if (stop_) break;
      if (current_ != nullptr) take_locked();
      if (progress_) draw_locked();
    }
  }
  void take_locked() {
    const auto totals = current_->opt->path_totals();
    sample s{since(t0_), index_, {}, {}};
    for (const auto& p : totals) {
      s.read.push_back(p.bytes_read);
      s.written.push_back(p.bytes_written);
    }
    if (trace_ != nullptr && !samples_.empty() && samples_.back().preset == index_ &&
        samples_.back().read.size() == s.read.size()) {
      const auto& prev = samples_.back();
      const double dt = s.t - prev.t;
      for (std::size_t i = 0; dt > 0 && i < totals.size(); ++i) {
        trace_->counter(fmt::format("{} {} read GB/s", current_->preset, totals[i].name),
                        static_cast<double>(s.read[i] - prev.read[i]) / dt / 1e9);
        trace_->counter(fmt::format("{} {} write GB/s", current_->preset, totals[i].name),
                        static_cast<double>(s.written[i] - prev.written[i]) / dt / 1e9);
      }
    }
    samples_.push_back(std::move(s));
  }
  void draw_locked() {
    std::fprintf(stderr, "\r\033[K[%6.1f s] %s", since(t0_), status_.c_str());
    std::fflush(stderr);
  }

  std::chrono::milliseconds period_;
  clk::time_point t0_;
  tracer* trace_;
  bool progress_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  runner* current_ = nullptr;
  std::size_t index_ = 0;
  std::string status_;
  std::vector<sample> samples_;
  std::thread thread_;  // last: starts after every member above exists
};

template <class G>
std::vector<G> make_grads(std::uint64_t n) {
  // Cheap deterministic values of gradient size (a normal generator would take longer than a step).
  std::vector<G> g(n);
  std::uint32_t x = 7;
  for (auto& v : g) {
    x = x * 1664525u + 1013904223u;
    v = G(static_cast<float>(static_cast<std::int32_t>(x)) * 0x1p-41f);
  }
  return g;
}

template <class G>
iteration run_iteration(runner& r, std::span<const G> grads, std::size_t subgroup, double lr, double compute_s) {
  iteration it;
  const auto before = r.opt->path_totals();
  const auto grad_bytes_before = r.opt->stats().gradient_bytes_written;
  const auto t0 = clk::now();
  it.began = t0;
  // The step is declared before forward, as a training loop knows its learning rate then: with
  // update_as_gradients_land (strata), each subgroup is updated as its gradients land.
  r.opt->begin_step(lr);
  const std::size_t pieces = (grads.size() + subgroup - 1) / subgroup;
  const auto hand_over = [&](std::size_t k) {
    const std::size_t first = k * subgroup;
    r.opt->accept_gradients_at(first, grads.subspan(first, std::min(subgroup, grads.size() - first)));
  };
  if (compute_s > 0) {
    // The simulated device: forward, then backward's gradients landing at fixed times, last
    // subgroup first. A hand-over that runs late does not delay the device's later gradients.
    const auto at = [&](double s) { return t0 + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(s)); };
    const double forward = compute_s / 3, backward = compute_s - forward;
    for (std::size_t k = 0; k < pieces; ++k) {
      std::this_thread::sleep_until(at(forward + backward * static_cast<double>(k + 1) / static_cast<double>(pieces)));
      hand_over(pieces - 1 - k);
    }
  } else {
    // Backward hands gradients over as it produces them, one subgroup at a time.
    for (std::size_t k = 0; k < pieces; ++k) hand_over(k);
  }
  it.grads_s = since(t0);
  it.grad_written = r.opt->stats().gradient_bytes_written - grad_bytes_before;
  const auto st = r.opt->step(lr);
  it.ended = clk::now();
  it.total_s = std::chrono::duration<double>(it.ended - t0).count();
  it.carried_read = st.prefetched_bytes;
  it.carried_written = std::exchange(r.writes_left_bytes, st.writes_left_bytes);
  it.read_wait_s = st.read_wait_s;
  it.early_updates = st.early_updates;
  it.speculative_updates = st.speculative_updates;
  it.compute_s = st.compute_s;
  it.kernel_s = st.kernel_s;
  it.write_wait_s = st.write_wait_s;
  it.other_s = std::max(0.0, it.total_s - it.grads_s - it.read_wait_s - it.compute_s - it.write_wait_s);
  it.cache_hits = st.cache_hits;
  it.cache_misses = st.cache_misses;
  const auto after = r.opt->path_totals();
  for (std::size_t i = 0; i < after.size(); ++i) {
    it.path_read.push_back(after[i].bytes_read - before[i].bytes_read);
    it.path_written.push_back(after[i].bytes_written - before[i].bytes_written);
  }
  return it;
}

struct io_bounds {
  double full_duplex = 0, serial = 0;
};
/// The formula of fill_bounds over the bytes of back-to-back iterations `its` (their paths'
/// bytes and gradient writes summed, less what was in flight as the first began) and their kernel
/// time; nothing when a path's speed is unknown.
std::optional<io_bounds> io_bound_of(std::span<const iteration> its, const runner& r,
                                     const std::vector<path_spec>& paths) {
  double rbw = 0, wbw = 0, rb = 0, wb = 0, grads = 0, kernel = 0;
  for (std::size_t k = 0; k < r.paths.size(); ++k) {
    const auto& p = paths[r.paths[k]];
    if (p.read_bw() <= 0 || p.write_bw() <= 0) return std::nullopt;  // a path of unknown speed: no bound
    rbw += p.read_bw();
    wbw += p.write_bw();
    for (const auto& it : its) {
      rb += static_cast<double>(it.path_read[k]);
      wb += static_cast<double>(it.path_written[k]);
    }
  }
  if (rbw <= 0 || wbw <= 0 || its.empty()) return std::nullopt;
  for (const auto& it : its) {
    grads += static_cast<double>(it.grad_written);
    kernel += it.kernel_s;
  }
  rb = std::max(0.0, rb - static_cast<double>(its.front().carried_read));
  wb = std::max(0.0, wb - static_cast<double>(its.front().carried_written));
  grads = std::min(grads, wb);
  return io_bounds{grads / wbw + std::max({rb / rbw, (wb - grads) / wbw, kernel}),
                   std::max(rb / rbw + wb / wbw, kernel)};
}

/// docs/design.md section 2 over the whole iteration, from the bandwidths of the preset's paths:
/// the full-duplex bound, gradient writes of backward (zero_infinity's) first, then the larger of
/// read time, write time and kernel time, since each path reads and writes at once but the
/// update reads gradients only after backward wrote them. A lower bound when the bandwidths are
/// the paths' ceilings (caps, or probes the medium cannot beat). Also the serial form, read time
/// + write time, which is not a lower bound on full-duplex links.
/// With compute on a device, the iteration's bound is max(compute, that bound): the device and the
/// paths each need their time at least, whatever overlaps. Bytes are those that completed within
/// the iteration, less those in flight as it began (they may have moved before it).
void fill_bounds(iteration& it, const runner& r, const std::vector<path_spec>& paths, double compute_s) {
  const auto b = io_bound_of(std::span<const iteration>(&it, 1), r, paths);
  if (!b) return;
  it.io_bound_s = b->full_duplex;
  it.bound_s = std::max(compute_s, it.io_bound_s);
  it.serial_bound_s = b->serial;
}

/// The bound of a run of back-to-back iterations (its[0..n)), a lower bound of its window: the
/// larger of the sum of the iterations' own bounds (disjoint windows) and fill_bounds' formula
/// over the run's bytes, which leaves out only what was in flight as the run began. Back to
/// back, what a step leaves in flight moves inside the next window, whose own bound leaves it
/// out again although nothing ran in between to move it: over a run it counts once.
run_figures run_bound(std::span<const iteration> its, const runner& r, const std::vector<path_spec>& paths,
                      double compute_s) {
  run_figures f;
  if (its.empty()) return f;
  f.wall_s = std::chrono::duration<double>(its.back().ended - its.front().began).count();
  const auto b = io_bound_of(its, r, paths);
  if (!b) return f;
  double own = 0;
  for (const auto& it : its) own += it.bound_s;
  f.bound_s = std::max({own, b->full_duplex, compute_s * static_cast<double>(its.size())});
  return f;
}

struct summary {
  double total = 0, lo = 0, hi = 0, grads = 0, read_wait = 0, compute = 0, kernel = 0, write_wait = 0, other = 0,
         bound = 0, serial_bound = 0, update = 0, io_bound = 0;
  std::vector<double> path_read, path_written;  // bytes, median
  double run_eff = 0, run_lo = 0, run_hi = 0;    // bound / wall of the runs (--run): median, min, max
};

summary summarize(const runner& r) {
  summary s;
  auto med = [&](auto field) {
    std::vector<double> v;
    for (const auto& it : r.iters) v.push_back(field(it));
    return median(v);
  };
  s.total = med([](const iteration& i) { return i.total_s; });
  s.lo = s.hi = r.iters.front().total_s;
  for (const auto& it : r.iters) s.lo = std::min(s.lo, it.total_s), s.hi = std::max(s.hi, it.total_s);
  s.grads = med([](const iteration& i) { return i.grads_s; });
  s.read_wait = med([](const iteration& i) { return i.read_wait_s; });
  s.compute = med([](const iteration& i) { return i.compute_s; });
  s.kernel = med([](const iteration& i) { return i.kernel_s; });
  s.write_wait = med([](const iteration& i) { return i.write_wait_s; });
  s.other = med([](const iteration& i) { return i.other_s; });
  s.bound = med([](const iteration& i) { return i.bound_s; });
  s.serial_bound = med([](const iteration& i) { return i.serial_bound_s; });
  s.io_bound = med([](const iteration& i) { return i.io_bound_s; });
  s.update = med([](const iteration& i) { return i.total_s - i.grads_s; });
  for (std::size_t k = 0; k < r.paths.size(); ++k) {
    s.path_read.push_back(med([k](const iteration& i) { return static_cast<double>(i.path_read[k]); }));
    s.path_written.push_back(med([k](const iteration& i) { return static_cast<double>(i.path_written[k]); }));
  }
  std::vector<double> effs;
  for (const auto& run : r.runs)
    if (run.bound_s > 0 && run.wall_s > 0) effs.push_back(run.bound_s / run.wall_s);
  if (!effs.empty()) {
    s.run_eff = median(effs);
    s.run_lo = *std::min_element(effs.begin(), effs.end());
    s.run_hi = *std::max_element(effs.begin(), effs.end());
  }
  return s;
}

constexpr const char* usage_text =
    "[--params 200M] [--subgroup 8M] [--cache BYTES|25%] [--path DIR[:READ[:WRITE]]]... "
    "[--preset zero_infinity|mlp_offload|strata|all] [--rule adamw[,adamw-bf16,sgd,lion]] [--iters 3] [--run 1] [--warmup 1]\n"
    "[--compare] [--compare-equal] [--compute SECONDS] [--ablate-overlap] [--ablate-speculation]\n"
    "[--mlp-lock separate|shared|none[,...]] "
    "[--grad bf16|fp16|fp32] [--threads N] [--probe 512MiB] [--max-grad-norm X] [--loss-scaling] [--no-integrity]\n"
    "[--json FILE] "
    "[--trace FILE] [--keep]\n"
    "   or: --device sim|cuda [--params] [--subgroup] [--threads] [--iters] [--warmup] [--cache BYTES] [--path ...]\n"
    "       [--device-share S] [--compare-cpu] [--h2d 16GB] [--d2h 16GB] [--device-rate 4G] [--device-memory BYTES]\n"
    "       [--json FILE] [--trace FILE]\n"
    "\n"
    "  --params N      parameters (2e9, 500M, ...); AdamW's fp32 state is 12 bytes each\n"
    "  --subgroup N    parameters per subgroup (the unit of transfer and caching)\n"
    "  --cache C       host cache of mlp_offload and strata: bytes (2GiB) or a share of the subgroups\n"
    "                  (25%, the default; mlp_offload keeps at least 2)\n"
    "  --path DIR[:READ[:WRITE]]\n"
    "                  a path (repeat; the first is the node-local one, the only one zero_infinity uses);\n"
    "                  READ/WRITE in bytes/s cap it (throttled) to emulate a PFS or object store\n"
    "  --path s3://bucket/prefix[:READ[:WRITE]]\n"
    "                  a path that is an object store (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,\n"
    "                  AWS_REGION); READ/WRITE cap it as for a directory; probed through object_store_tier\n"
    "                  under <prefix>/.probe/, the state under <prefix>/strata-bench-step/<preset>/\n"
    "  --preset P      which presets run (all: those the path count allows; mlp_offload needs two)\n"
    "  --rule R        the update rule: adamw (fp32 state, 12 B/param), adamw-bf16 (bf16 moments, 8),\n"
    "                  adamw-8bit (8-bit moments, 6.03), sgd (momentum 0.9: 8), lion (8); a comma list runs each rule's optimizers interleaved in one\n"
    "                  run (with --compare) and prints each one's speedup over adamw's\n"
    "  --compare       run the presets interleaved in one process and print speedups over zero_infinity,\n"
    "                  for the whole iteration, backward's gradient hand-over and the update apart\n"
    "  --compare-equal with --compare: also zero_infinity-raid0, zero_infinity striped over every path (RAID0,\n"
    "                  1 MiB units) with the same host cache as the others, and speedups over it: what the\n"
    "                  techniques give beyond the extra bandwidth\n"
    "  --compute T     each iteration has T seconds of compute on a simulated device: forward (T/3), then\n"
    "                  backward (2T/3) with the gradients landing in reverse subgroup order, handed over as\n"
    "                  they land; prints the iteration against max(T, the step's I/O bound). Implies\n"
    "                  --ablate-overlap\n"
    "  --ablate-overlap  also run strata-no-overlap: the strata preset with its step's I/O kept out of forward\n"
    "                  and backward (no reads of the next step started as a step returns, no updates as\n"
    "                  gradients land, no writes after the step returns: offload_options::prefetch_next_step,\n"
    "                  update_as_gradients_land and return_before_writes off;\n"
    "                  the other presets never overlap, as their systems)\n"
    "  --ablate-speculation  also run strata-no-speculation: strata with offload_options::speculate_updates off\n"
    "                  (with --max-grad-norm or --loss-scaling, landed subgroups are then only read during\n"
    "                  backward and updated by step())\n"
    "  --mlp-lock L    mlp_offload's node-wide lock on its PFS path: separate (MLP-Offload's read and write\n"
    "                  locks, the default), shared (one lock for both) or none; a comma list runs one\n"
    "                  mlp_offload per mode in the same run (e.g. separate,none: the lock's ablation)\n"
    "  --iters N       measured iterations per preset (figures are medians, with min-max), or rounds of --run\n"
    "  --run N         measured iterations of a preset back to back in each round (interleaved presets) or\n"
    "                  in each run (one preset): each run also gets a bound over its whole window ('run eff'),\n"
    "                  where bytes one step leaves in flight count in the next (default 1: no run column)\n"
    "  --warmup N      unmeasured iterations per preset first\n"
    "  --grad T        gradient type handed over by backward (16-bit stays in host memory, except\n"
    "                  zero_infinity, which writes fp32 to the tier)\n"
    "  --threads N     update kernel threads (default: all CPUs)\n"
    "  --probe BYTES   size of the O_DIRECT write+read probe of each path before the runs (s3://: through\n"
    "                  object_store_tier; 0: none; then the bound uses the caps only)\n"
    "  --json FILE     every figure, every iteration and the per-path byte timeline (bench/plot.py)\n"
    "  --trace FILE    Chrome trace (ui.perfetto.dev): step phases and per-path GB/s counters\n"
    "  --max-grad-norm X  clip gradients to this global norm (offload_options::max_grad_norm; 0: off)\n"
    "  --loss-scaling  dynamic loss scaling on (offload_options::loss_scaling; the gradients are then checked)\n"
    "  --no-integrity  do not checksum the state on the paths (offloaded_adamw_config::verify_integrity)\n"
    "  --keep          keep the state files (under DIR/strata-bench-step/ or s3://.../strata-bench-step/; otherwise\n"
    "                  the run removes the objects it wrote and the directories it made, if empty, also on\n"
    "                  failure; nothing else)\n"
    "\n"
    "  --device D      sim or cuda: the strata preset with the bf16 model and gradients in device memory; each\n"
    "                  subgroup updated on the CPU or the device as the cost model (or --device-share) says;\n"
    "                  per-stream busy time and the step's bound; --trace has one track per stream. The state\n"
    "                  is in host memory (all cached) unless --path is given; --cache is then in bytes (default 0)\n"
    "  --device-share S  force this share of the subgroups onto the device (0: CPU only, 1: all)\n"
    "  --compare-cpu   interleave CPU-only steps and print the split's speedup over them\n"
    "  --h2d/--d2h BW  sim: the paced PCIe link per direction (bytes/s)\n"
    "  --device-rate R sim: the paced device kernel (parameters/s)\n"
    "  --device-memory BYTES  the executor's device budget";

std::string gb(double bytes) { return fmt::format("{:.2f}", bytes / 1e9); }

std::vector<std::string> numbers(const std::vector<std::uint64_t>& v) {
  std::vector<std::string> out;
  for (const auto b : v) out.push_back(fmt::format("{}", b));
  return out;
}

/// The options make_offloaded_adamw gives variant `v`'s optimizer for this base (as the runners
/// below configure it), so that the checks size what will be allocated.
offload_options preset_options(const variant& v, std::size_t params, offload_options base) {
  const auto f = format_of(v.rule);
  if (v.preset == "zero_infinity" && !v.equal) base.host_cache_bytes = 0;
  base.prefetch_next_step = v.overlap;  // (the emulating presets turn it off)
  base.update_as_gradients_land = v.overlap;
  base.return_before_writes = v.overlap;
  base.speculate_updates = v.speculate;
  if (v.preset == "zero_infinity") return presets::zero_infinity::options(params, f, base);
  if (v.preset == "mlp_offload") return presets::mlp_offload::options(params, f, base);
  return presets::strata_preset::options(params, f, base);
}

/// Warns when the paths' bandwidths (caps, or probes) make the run very long: per variant, its
/// initial state written, then each round its uncached state read and written (and
/// zero_infinity's fp32 gradients written and read back), over the paths in the shares its
/// placement gives them: fixed for mlp_offload (2:1) and the striped baseline (equal), by
/// bandwidth otherwise. A path of unknown speed (no cap, no probe) leaves a variant out.
void warn_if_slow(const std::vector<variant>& variants, const std::vector<offload_layout>& layouts,
                  const std::vector<offload_options>& opts, const std::vector<path_spec>& paths, std::uint64_t rounds) {
  run_time_floor t;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& v = variants[i];
    const auto& l = layouts[i];
    const std::size_t used = v.preset == "zero_infinity" && !v.equal ? 1 : paths.size();
    std::vector<double> shares(used, 0.0);
    if (v.preset == "mlp_offload" && used == 2) shares = {2.0 / 3, 1.0 / 3};
    else if (v.equal || used == 1) std::fill(shares.begin(), shares.end(), 1.0 / static_cast<double>(used));
    // Seconds for `bytes` in one direction over the variant's paths, and the path that takes longest.
    const auto over = [&](double bytes, bool write) -> std::pair<double, std::string> {
      const auto bw = [&](std::size_t k) { return write ? paths[k].write_bw() : paths[k].read_bw(); };
      const char* dir = write ? "write" : "read";
      if (shares.front() == 0) {  // by bandwidth: the sum of the paths', when all are known
        double sum = 0;
        for (std::size_t k = 0; k < used; ++k) {
          if (bw(k) <= 0) return {0, ""};
          sum += bw(k);
        }
        return {bytes / sum, fmt::format("{}'s paths ({} {})", v.label, dir, describe_rate(sum))};
      }
      std::pair<double, std::string> worst{0, ""};
      for (std::size_t k = 0; k < used; ++k)
        if (bw(k) > 0 && shares[k] * bytes / bw(k) > worst.first)
          worst = {shares[k] * bytes / bw(k), fmt::format("{} on path {} ({} {})", v.label, paths[k].name, dir,
                                                          describe_rate(bw(k)))};
      return worst;
    };
    const double n = static_cast<double>(l.params), state = static_cast<double>(l.state_bytes_per_param()) * n;
    const double uncached = state * static_cast<double>(l.subgroups() - l.cache_slots(opts[i])) /
                            static_cast<double>(l.subgroups());
    const double grads = l.tier_gradients ? 4.0 * n : 0.0;
    const auto [init_s, init_what] = over(state, true);
    t.phase({{init_s, fmt::format("writing the initial state: {}", init_what)}});
    const double r = static_cast<double>(rounds);
    const auto [gw_s, gw_what] = over(r * grads, true);
    t.phase({{gw_s, fmt::format("backward's fp32 gradients: {}", gw_what)}});
    const auto [rd_s, rd_what] = over(r * (uncached + grads), false);
    const auto [wr_s, wr_what] = over(r * uncached, true);
    t.phase({{rd_s, fmt::format("the steps' reads: {}", rd_what)},
             {wr_s, fmt::format("the steps' writes: {}", wr_what)}});
  }
  t.warn_if_long("step");
}

template <class G>
int run_typed(args& a) {
  const auto params = a.count("params", parse_count("200M"));
  auto subgroup = a.count("subgroup", parse_count("8M"));
  const auto cache_opt = a.get("cache");
  auto path_args = a.get_all("path");
  const auto preset_arg = a.choice("preset", {"zero_infinity", "mlp_offload", "strata", "all"}, "all");
  const auto rule_arg = a.get_or("rule", "adamw");
  const auto rounds = a.count("iters", 3);
  const auto run_length = a.count("run", 1);
  const auto warmup = a.count("warmup", 1);
  const bool compare = a.flag("compare");
  const bool compare_equal = a.flag("compare-equal");
  const double compute_s = a.real("compute", 0);
  const bool ablate_overlap = a.flag("ablate-overlap") || compute_s > 0;
  const bool ablate_speculation = a.flag("ablate-speculation");
  const auto mlp_lock_arg = a.get_or("mlp-lock", "separate");
  const auto threads = a.count("threads", default_thread_count());
  const auto probe_bytes = a.size("probe", parse_size("512MiB"));
  const auto json_path = a.get("json");
  const auto trace_path = a.get("trace");
  const bool keep = a.flag("keep");
  const double max_grad_norm = a.real("max-grad-norm", 0);
  const bool loss_scaling = a.flag("loss-scaling");
  const bool integrity = !a.flag("no-integrity");
  (void)a.get("grad");  // consumed by run()
  a.finish();
  if (params == 0 || subgroup == 0) throw usage_error("step: --params and --subgroup must be positive");
  if (rounds == 0 || rounds > 1000 || warmup > 1000) throw usage_error("step: --iters must be 1..1000, --warmup 0..1000");
  if (run_length == 0 || run_length > 100) throw usage_error("step: --run must be 1..100");
  const auto iters = rounds * run_length;
  if (threads == 0 || threads > 1024) throw usage_error("step: --threads must be 1..1024");
  if (path_args.empty()) throw usage_error("step: give at least one --path DIR[:READ[:WRITE]]");
  if (max_grad_norm < 0) throw usage_error("step: --max-grad-norm must be >= 0 (0: no clipping)");
  if (!(compute_s >= 0) || compute_s > 3600) throw usage_error("step: --compute must be 0..3600 seconds");
  if (subgroup > params) {  // a subgroup larger than the model is the model (slots are sized by it)
    fmt::print("step: --subgroup {} is more than the {} parameters: one subgroup of {}\n", subgroup, params, params);
    subgroup = params;
  }
  std::vector<std::string> rules;
  for (std::size_t at = 0;;) {
    const auto comma = rule_arg.find(',', at);
    const auto rule = rule_arg.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (rule != "adamw" && rule != "adamw-bf16" && rule != "adamw-8bit" && rule != "sgd" && rule != "lion")
      throw usage_error(
          fmt::format("step: --rule '{}': expected adamw, adamw-bf16, adamw-8bit, sgd or lion (or a comma list)", rule));
    if (std::find(rules.begin(), rules.end(), rule) != rules.end())
      throw usage_error(fmt::format("step: --rule names '{}' twice", rule));
    rules.push_back(rule);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  offload_options layout_options;
  layout_options.subgroup_elems = static_cast<std::size_t>(subgroup);  // host gradients: the cached presets'
  // The cache share and the headline sizes are the first rule's.
  const auto layout = offload_layout::of_format(static_cast<std::size_t>(params), format_of(rules.front()), layout_options);
  const std::uint64_t state_bytes = layout.total_state_bytes();
  const std::uint64_t subgroups = layout.subgroups();
  // --cache as bytes, or as P% of the subgroups (whole slots as the optimizer allocates them, a
  // slot page-rounded), which is then each rule's own share: every rule caches the same subgroups.
  std::optional<double> cache_share;
  std::uint64_t cache_bytes = 0;
  {
    const std::string text = cache_opt.value_or("25%");
    try {
      if (!text.empty() && text.back() == '%') {
        const double pct = std::stod(text.substr(0, text.size() - 1));
        if (!(pct >= 0 && pct <= 100)) throw std::invalid_argument("percentage");
        cache_share = pct / 100.0;
        cache_bytes = layout.cache_bytes(static_cast<std::size_t>(static_cast<double>(subgroups) * *cache_share));
      } else {
        cache_bytes = parse_size(text);
      }
    } catch (const std::exception&) {
      throw usage_error(fmt::format("step: --cache '{}' (expected a size like 2GiB or a share like 25%)", text));
    }
  }
  const auto cache_of = [&](const std::string& rule) -> std::uint64_t {
    if (!cache_share) return cache_bytes;
    const auto l = offload_layout::of_format(static_cast<std::size_t>(params), format_of(rule), layout_options);
    return l.cache_bytes(static_cast<std::size_t>(static_cast<double>(subgroups) * *cache_share));
  };

  std::vector<path_spec> paths;
  for (std::size_t i = 0; i < path_args.size(); ++i) paths.push_back(parse_path(path_args[i], i));
  if (paths.size() >= 2) paths[0].name = "nvme", paths[1].name = "pfs";
  {  // an object store is named for what it is, wherever it comes: s3 (s3-<i> when there are several)
    const auto stores = std::count_if(paths.begin(), paths.end(), [](const path_spec& p) { return p.is_s3(); });
    for (std::size_t i = 0; i < paths.size(); ++i)
      if (paths[i].is_s3()) paths[i].name = stores == 1 ? "s3" : fmt::format("s3-{}", i);
  }
  const auto same_url = [](std::string x, std::string y) {
    while (x.ends_with('/')) x.pop_back();
    while (y.ends_with('/')) y.pop_back();
    return x == y;
  };
  for (std::size_t i = 0; i < paths.size(); ++i)
    for (std::size_t k = 0; k < i; ++k) {
      if (paths[i].is_s3() != paths[k].is_s3()) continue;
      if (paths[i].is_s3() ? same_url(paths[i].url, paths[k].url)
                           : fs::weakly_canonical(paths[i].dir) == fs::weakly_canonical(paths[k].dir))
        throw usage_error(fmt::format("step: --path {} is given twice (each path needs its own {})", paths[i].where(),
                                      paths[i].is_s3() ? "prefix" : "directory"));
    }

  std::vector<std::string> mlp_locks;
  for (std::size_t at = 0;;) {
    const auto comma = mlp_lock_arg.find(',', at);
    const auto mode = mlp_lock_arg.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (mode != "separate" && mode != "shared" && mode != "none")
      throw usage_error(fmt::format("step: --mlp-lock '{}': expected separate, shared or none (or a comma list)", mode));
    if (std::find(mlp_locks.begin(), mlp_locks.end(), mode) != mlp_locks.end())
      throw usage_error(fmt::format("step: --mlp-lock names '{}' twice", mode));
    mlp_locks.push_back(mode);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (compare_equal && !compare) throw usage_error("step: --compare-equal needs --compare");
  if (compare_equal && paths.size() < 2)
    throw usage_error("step: --compare-equal needs at least two paths (zero_infinity uses the first alone otherwise)");
  if (compare_equal && std::any_of(paths.begin(), paths.end(), [](const path_spec& p) { return p.is_s3(); }))
    throw usage_error(
        "step: --compare-equal stripes 1 MiB units over every path, and on an object store each unit appended to an "
        "object re-uploads the whole object (object_store_tier patches): not with an s3:// path");

  std::vector<std::string> presets;
  if (preset_arg == "all") {
    presets.push_back("zero_infinity");
    if (paths.size() == 2) presets.push_back("mlp_offload");
    presets.push_back("strata");
  } else {
    if (compare && preset_arg != "zero_infinity") presets.push_back("zero_infinity");  // the baseline
    presets.push_back(preset_arg);
  }
  if (std::find(presets.begin(), presets.end(), "mlp_offload") != presets.end() && paths.size() != 2)
    throw usage_error(fmt::format("step: preset mlp_offload needs exactly two paths (NVMe, PFS), got {}", paths.size()));
  std::vector<variant> variants;
  for (const auto& rule : rules) {
    // One rule keeps the presets' names; several name each runner preset.rule (a directory and an
    // object prefix too).
    const auto named = [&](std::string label) { return rules.size() == 1 ? label : fmt::format("{}.{}", label, rule); };
    for (const auto& name : presets) {
      if (name == "mlp_offload") {
        for (const auto& mode : mlp_locks)
          variants.push_back(
              {named(mode == "separate" ? name : fmt::format("{}-{}", name, mode == "none" ? "no-lock" : "shared-lock")),
               name, mode, false, rule});
      } else {
        variants.push_back({named(name), name, "separate", false, rule});
        if (name == "strata" && ablate_overlap)
          variants.push_back({named("strata-no-overlap"), name, "separate", false, rule, false});
        if (name == "strata" && ablate_speculation)
          variants.push_back({named("strata-no-speculation"), name, "separate", false, rule, true, false});
        if (name == "zero_infinity" && compare_equal)
          variants.push_back({named("zero_infinity-raid0"), name, "separate", true, rule});
      }
    }
  }

  // What the optimizers will allocate, counted before anything is: the bookkeeping of their
  // subgroups alone first (a million 1-parameter subgroups cost GiBs before any slot), then the
  // run's own arrays (fp32 weights, gradients), then everything together.
  std::vector<offload_options> variant_opts;
  std::vector<offload_layout> layouts;
  for (const auto& v : variants) {
    offload_options base;
    base.subgroup_elems = static_cast<std::size_t>(subgroup);
    base.threads = static_cast<std::size_t>(threads);
    base.host_cache_bytes = cache_of(v.rule);
    variant_opts.push_back(preset_options(v, static_cast<std::size_t>(params), base));
    layouts.push_back(offload_layout::of_format(static_cast<std::size_t>(params), format_of(v.rule), variant_opts.back()));
  }
  require_bookkeeping_fits("step", layouts);
  require_physical_memory(params * (sizeof(float) + sizeof(G)),
                          fmt::format("step: the weights and gradients of {} parameters", params));
  {
    memory_account m;
    m.add("the weights and gradients", params * (sizeof(float) + sizeof(G)));
    std::uint64_t slots = 0, slot_bytes = 0, stores = 0, bookkeeping = 0;
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const std::size_t k = layouts[i].host_slots(variant_opts[i], false);
      slots += k;
      slot_bytes += k * aligned_block_cost(layouts[i].slot_footprint());
      if (!layouts[i].tier_gradients) stores += aligned_block_cost(params * sizeof(G));
      bookkeeping += layouts[i].bookkeeping_bytes();
    }
    m.add(fmt::format("{} host slots", slots), slot_bytes);
    m.add("the gradient stores", stores);
    m.add("bookkeeping", bookkeeping);
    m.require(fmt::format("step: {} parameters in {}, {} optimizer{}", params, describe_subgroups(layout),
                          variants.size(), variants.size() == 1 ? "" : "s"),
              "use a larger --subgroup, a smaller --cache, fewer presets or fewer --params");
  }

  const bool progress = isatty(STDERR_FILENO) != 0;
  const auto t0 = clk::now();
  std::unique_ptr<tracer> trace;
  if (trace_path) trace = std::make_unique<tracer>();

  fmt::print("step: {} parameters ({} of {} state), subgroups of {} ({} of them), {} gradients, cache {}, "
             "{} kernel threads\n",
             params, format_size(state_bytes), rules.front(), subgroup, subgroups,
             std::is_same_v<G, float> ? "fp32" : std::is_same_v<G, bf16> ? "bf16" : "fp16", format_size(cache_bytes),
             threads);
  // The output file is opened now, so a bad --json path fails before the runs, not after.
  std::optional<std::ofstream> json_out;
  if (json_path) {
    json_out.emplace(*json_path);
    if (!*json_out) throw io_error("open --json", *json_path, errno);
  }
  // State files (the rule's bytes per parameter per preset) never outlive the run unless --keep, also
  // when it fails, and nothing else is ever removed: each optimizer removes its own objects
  // (remove_state, below), then the directories this run made go if they are empty. Declared
  // before the optimizers, so it runs after they closed their files.
  struct cleanup {
    created_directories made;
    bool keep;
    // The node limiters' files, when this run made their directory (a limiter keeps them for
    // the node's other processes; here no other process uses a directory this run made).
    std::vector<fs::path> limiter_files;
    ~cleanup() {
      if (keep) return;
      std::error_code ec;
      for (const auto& f : limiter_files) {
        fs::remove(f, ec);
        fs::remove(f.parent_path(), ec);  // only when empty
      }
      made.remove_empty();
    }
  } cleanup{{}, keep, {}};
  for (auto& p : paths) {
    if (!p.is_s3()) cleanup.made.create(p.dir);
    if (probe_bytes > 0) {
      if (progress) fmt::print(stderr, "\r\033[Kprobing {} ...", p.where());
      probe(p, probe_bytes, 3);
      if (progress) fmt::print(stderr, "\r\033[K");
    }
    fmt::print("  path {} = {}: cap {}, probe ({}) {}; used for the bound: read {:.2f}, write {:.2f} GB/s\n", p.name,
               p.where(),
               p.read_cap > 0 ? fmt::format("{:.2f}/{:.2f} GB/s", p.read_cap / 1e9, p.write_cap / 1e9) : "none",
               format_size(probe_bytes),
               p.probe_read > 0 ? fmt::format("read {:.2f}, write {:.2f} GB/s", p.probe_read / 1e9, p.probe_write / 1e9)
                                : "not run",
               p.read_bw() / 1e9, p.write_bw() / 1e9);
#if STRATA_HAS_S3
    if (p.probe_stats_valid) fmt::print("    probe's object store: {}\n", describe_stats(p.probe_stats));
#endif
  }

  warn_if_slow(variants, layouts, variant_opts, paths, warmup + iters);

  // From here on the peak resident memory is this run's: the optimizers and the gradients.
  const bool peak_reset = reset_peak_resident();

  // Build every preset's optimizer (each in its own directories), writing the initial state.
  std::vector<runner> runners;
  struct remove_states {
    std::vector<runner>& runners;
    bool keep;
    ~remove_states() {
      if (keep) return;
      for (auto& r : runners) {
        try {
          if (r.opt) (void)r.opt->remove_state();
        } catch (const std::exception& e) {
          fmt::print(stderr, "strata-bench: step: removing the state of {}: {}\n", r.preset, e.what());
        }
      }
    }
  } remove_states_guard{runners, keep};
  {
    std::vector<float> init(params);
    std::uint32_t x = 1;
    for (auto& p : init) {
      x = x * 1664525u + 1013904223u;
      p = static_cast<float>(static_cast<std::int32_t>(x)) * 0x1p-31f;
    }
    for (const auto& v : variants) {
      const std::string& name = v.label;
      runner r;
      r.preset = name;
      r.v = v;
      offloaded_optimizer_config c = rule_config(v.rule);
      c.preset = v.preset;
      c.offload.subgroup_elems = static_cast<std::size_t>(subgroup);
      c.offload.threads = static_cast<std::size_t>(threads);
      c.offload.host_cache_bytes = v.preset == "zero_infinity" && !v.equal ? 0 : cache_of(v.rule);
      c.offload.object_prefix = name;
      c.mlp_offload_lock = v.lock != "none";
      c.node_limiter_sharing = v.lock == "shared" ? rw_sharing::shared : rw_sharing::separate;
      c.stripe_paths = v.equal;
      c.offload.prefetch_next_step = v.overlap;
      c.offload.update_as_gradients_land = v.overlap;
      c.offload.return_before_writes = v.overlap;
      c.offload.speculate_updates = v.speculate;
      c.offload.max_grad_norm = max_grad_norm;
      c.offload.loss_scaling.enabled = loss_scaling;
      c.verify_integrity = integrity;
      // The node limiters' files go in the first directory path (with none: their default directory).
      const auto local = std::find_if(paths.begin(), paths.end(), [](const path_spec& p) { return !p.is_s3(); });
      c.node_limiter_name = "strata-bench-pfs";
      if (local != paths.end()) {
        c.node_limiter_dir = local->dir / "strata-bench-step" / "locks";
        if (!fs::exists(c.node_limiter_dir) && cleanup.limiter_files.empty())
          for (const char* suffix : {"", ".read", ".write"})
            cleanup.limiter_files.push_back(c.node_limiter_dir / (c.node_limiter_name + suffix) / "queue.lock");
        cleanup.made.create(c.node_limiter_dir);
      }
      c.trace = trace.get();
      const std::size_t used = v.preset == "zero_infinity" && !v.equal ? 1 : paths.size();
      for (std::size_t k = 0; k < used; ++k) {
        offload_path_config pc;
        if (paths[k].is_s3()) {
          pc.url = s3_sub_url(paths[k].url, fmt::format("strata-bench-step/{}", name));
        } else {
          pc.directory = paths[k].dir / "strata-bench-step" / name;
          cleanup.made.create(pc.directory);
        }
        pc.name = paths[k].name;
        pc.read_cap = paths[k].read_cap;
        pc.write_cap = paths[k].write_cap;
        pc.read_bandwidth = paths[k].read_bw();
        pc.write_bandwidth = paths[k].write_bw();
        c.paths.push_back(pc);
        r.paths.push_back(k);
      }
      if (progress) fmt::print(stderr, "\r\033[Kwriting the initial state of {} ...", name);
      const auto ts = clk::now();
      r.opt = make_offloaded_optimizer(c, init);
      r.setup_s = since(ts);
      if (progress) fmt::print(stderr, "\r\033[K");
      const auto st = r.opt->stats();
      fmt::print("  {}: rule {} ({:.3g} bytes of state per parameter: fp32 master, {}); initial state written in {:.1f} s; "
                 "cache {} subgroups, pipeline {} slots, host memory {}\n",
                 name, v.rule, r.opt->state_format().mean_bytes_per_param(), describe(r.opt->state_format()), r.setup_s,
                 st.cache_slots, st.pipeline_slots, format_size(st.host_memory_used));
      runners.push_back(std::move(r));
    }
  }
  if (progress) fmt::print(stderr, "\r\033[K");
  std::fflush(stdout);

  const auto grads = make_grads<G>(params);
  const std::span<const G> g(grads);
  std::vector<sample> timeline;
  {
    sampler smp(std::chrono::milliseconds(100), t0, trace.get(), progress);
    const auto one = [&](std::size_t i, std::uint64_t k, bool measured) {
      smp.running(&runners[i], i,
                  fmt::format("{} {} {}/{}", runners[i].preset, measured ? "iteration" : "warm-up", k + 1,
                              measured ? iters : warmup));
      auto it = run_iteration(runners[i], g, static_cast<std::size_t>(subgroup), 1e-4, compute_s);
      smp.running(nullptr, i, "");
      if (measured) {
        fill_bounds(it, runners[i], paths, compute_s);
        runners[i].iters.push_back(std::move(it));
      }
    };
    if (compare || rules.size() > 1 || ablate_overlap || ablate_speculation) {  // interleaved: ratios of the same conditions
      for (std::uint64_t k = 0; k < warmup; ++k)
        for (std::size_t i = 0; i < runners.size(); ++i) one(i, k, false);
      // A runner whose step overlaps the next iteration (reads started as it returns) runs an
      // unmeasured lead-in first, so that its measured iteration follows its own last step as in
      // training: what the lead-in started moves inside the measured window, never in the time
      // the other runners take (free time no training loop has).
      for (std::uint64_t k = 0; k < rounds; ++k)
        for (std::size_t i = 0; i < runners.size(); ++i) {
          if (runners[i].opt->offload().prefetch_next_step) one(i, k, false);
          for (std::uint64_t j = 0; j < run_length; ++j) one(i, k * run_length + j, true);
        }
    } else {
      for (std::size_t i = 0; i < runners.size(); ++i) {
        for (std::uint64_t k = 0; k < warmup; ++k) one(i, k, false);
        for (std::uint64_t k = 0; k < iters; ++k) one(i, k, true);
      }
    }
    timeline = smp.samples();
  }
  for (auto& r : runners)
    for (std::size_t k = 0; k + run_length <= r.iters.size(); k += run_length)
      r.runs.push_back(run_bound(std::span<const iteration>(r.iters).subspan(k, run_length), r, paths, compute_s));

  // The table.
  std::vector<summary> sums;
  for (const auto& r : runners) sums.push_back(summarize(r));
  // Speedups over a baseline: per measured round (the presets ran back to back), then the median
  // over rounds, with the min-max.
  struct ratio {
    double med = 0, lo = 0, hi = 0;
  };
  const auto ratios_over = [&](const runner& b, auto field) {
    std::vector<ratio> out(runners.size());
    for (std::size_t i = 0; i < runners.size(); ++i) {
      std::vector<double> v;
      for (std::size_t k = 0; k < runners[i].iters.size(); ++k) {
        const double own = field(runners[i].iters[k]);
        v.push_back(own > 0 ? field(b.iters[k]) / own : 0.0);
      }
      out[i] = {median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
    }
    return out;
  };
  const auto find_runner = [&](std::string_view label) {
    return std::find_if(runners.begin(), runners.end(), [&](const runner& r) { return r.preset == label; });
  };
  const auto whole = [](const iteration& i) { return i.total_s; };
  const auto backward = [](const iteration& i) { return i.grads_s; };
  const auto update = [](const iteration& i) { return i.total_s - i.grads_s; };
  const auto base = find_runner("zero_infinity");
  const auto equal = find_runner("zero_infinity-raid0");
  const bool ratios = compare && base != runners.end();
  const bool equal_ratios = compare && equal != runners.end();
  std::vector<ratio> speedup, speedup_equal, speedup_backward, speedup_update;
  if (ratios) {
    speedup = ratios_over(*base, whole);
    speedup_backward = ratios_over(*base, backward);
    speedup_update = ratios_over(*base, update);
  }
  if (equal_ratios) speedup_equal = ratios_over(*equal, whole);
  const auto show = [](const ratio& x) { return fmt::format("{:.2f}x ({:.2f}-{:.2f})", x.med, x.lo, x.hi); };

  const bool interleaved = compare || rules.size() > 1 || ablate_overlap || ablate_speculation;
  fmt::print("\n{} measured iterations per preset{}{}, after {} warm-up; medians (min-max); GB = 1e9 bytes\n", iters,
             run_length > 1 ? fmt::format(" in runs of {} back to back", run_length) : std::string(),
             interleaved ? ", presets interleaved" : "", warmup);
  const auto show_run = [](const summary& s) {
    return s.run_eff > 0 ? fmt::format("{:.2f} ({:.2f}-{:.2f})", s.run_eff, s.run_lo, s.run_hi) : std::string("-");
  };
  std::string head = fmt::format("{:<24} {:>20} {:>6} {:>9} {:>8} {:>10} {:>6}", "preset",
                                 compute_s > 0 ? "iteration s" : "step s", compute_s > 0 ? "fwd+bwd" : "grads",
                                 "read wait", "compute", "write wait", "other");
  for (const auto& p : paths) head += fmt::format(" {:>13}", p.name + " GB r/w");
  head += fmt::format(" {:>7} {:>5}", "bound s", "eff");
  if (run_length > 1) head += fmt::format(" {:>16}", "run eff");
  head += fmt::format(" {:>7}", "B/param");
  // Several rules: each runner's speedup over AdamW's (fp32 state) of the same preset and lock.
  const bool rule_ratios = rules.size() > 1 && std::find(rules.begin(), rules.end(), "adamw") != rules.end();
  std::vector<ratio> speedup_rule(runners.size());
  if (rule_ratios)
    for (std::size_t i = 0; i < runners.size(); ++i) {
      const auto twin = std::find_if(runners.begin(), runners.end(), [&](const runner& r) {
        return r.v.rule == "adamw" && r.v.preset == runners[i].v.preset && r.v.lock == runners[i].v.lock &&
               r.v.equal == runners[i].v.equal && r.v.overlap == runners[i].v.overlap &&
               r.v.speculate == runners[i].v.speculate;
      });
      if (twin != runners.end()) speedup_rule[i] = ratios_over(*twin, whole)[i];
    }
  if (rule_ratios) head += fmt::format(" {:>20}", "vs adamw");
  if (ratios) head += fmt::format(" {:>20}", "vs zero_infinity");
  if (equal_ratios) head += fmt::format(" {:>20}", "vs zero_inf.-raid0");
  fmt::print("{}\n{}\n", head, std::string(head.size(), '-'));
  for (std::size_t i = 0; i < runners.size(); ++i) {
    const auto& s = sums[i];
    std::string line = fmt::format("{:<24} {:>20} {:>6.2f} {:>9.2f} {:>8.2f} {:>10.2f} {:>6.2f}", runners[i].preset,
                                   fmt::format("{:.2f} ({:.2f}-{:.2f})", s.total, s.lo, s.hi), s.grads, s.read_wait,
                                   s.compute, s.write_wait, s.other);
    for (std::size_t k = 0; k < paths.size(); ++k) {
      const auto pos = std::find(runners[i].paths.begin(), runners[i].paths.end(), k);
      if (pos == runners[i].paths.end()) {
        line += fmt::format(" {:>13}", "-");
      } else {
        const auto j = static_cast<std::size_t>(pos - runners[i].paths.begin());
        line += fmt::format(" {:>13}", gb(s.path_read[j]) + "/" + gb(s.path_written[j]));
      }
    }
    line += s.bound > 0 ? fmt::format(" {:>7.2f} {:>5.2f}", s.bound, s.bound / s.total) : fmt::format(" {:>7} {:>5}", "-", "-");
    if (run_length > 1) line += fmt::format(" {:>16}", show_run(s));
    {  // the bytes a step moved per parameter, both directions, gradients on the tier included
      double moved = 0;
      for (std::size_t j = 0; j < s.path_read.size(); ++j) moved += s.path_read[j] + s.path_written[j];
      line += fmt::format(" {:>7.2f}", moved / static_cast<double>(params));
    }
    if (rule_ratios) line += fmt::format(" {:>20}", show(speedup_rule[i]));
    if (ratios) line += fmt::format(" {:>20}", show(speedup[i]));
    if (equal_ratios) line += fmt::format(" {:>20}", show(speedup_equal[i]));
    fmt::print("{}\n", line);
  }
  {
    // Peak RSS since the optimizers were built, split into the gradients this bench hands over
    // (the user's), what each optimizer holds (its budgeted host memory) and the rest.
    const auto mem = read_process_memory();
    const std::uint64_t grad_bytes = params * sizeof(G);
    std::uint64_t held = 0;
    std::string each;
    for (const auto& r : runners) {
      const auto st = r.opt->stats();
      held += st.host_memory_peak;
      each += fmt::format("{}{} {}", each.empty() ? "" : ", ", r.preset, format_size(st.host_memory_peak));
    }
    const double rest = static_cast<double>(mem.peak) - static_cast<double>(grad_bytes) - static_cast<double>(held);
    fmt::print("peak RSS {} = the bench's {} gradients {} + the optimizers' budgeted host memory {} ({}) + the rest "
               "{}{:.2f} GiB{}\n",
               format_size(mem.peak), std::is_same_v<G, float> ? "fp32" : std::is_same_v<G, bf16> ? "bf16" : "fp16",
               format_size(grad_bytes), format_size(held), each, rest < 0 ? "-" : "",
               std::abs(rest) / static_cast<double>(1ULL << 30),
               peak_reset ? "" : " (the kernel refused to reset the peak: it counts from the start)");
  }
  fmt::print("bound (docs/design.md section 2, full duplex): zero_infinity's gradient writes of backward / the sum of\n"
             "the paths' write bandwidths, then the largest of read bytes / summed read bandwidths, the other written\n"
             "bytes / summed write bandwidths and the host kernel's time (bytes completed in the iteration, less\n"
             "those in flight as it began: reads started and writes left by the last step); eff = bound / step (<= 1 when the\n"
             "bandwidths are the paths' ceilings: caps, or probes the medium cannot beat). B/param: bytes the step\n"
             "read and wrote per parameter (cache hits move none).\n");
  if (run_length > 1)
    fmt::print("run eff: per run of {} iterations back to back, its bound / its wall time (first begin to last\n"
               "return); its bound is the largest of the sum of its iterations' bounds{} and the formula above over\n"
               "the run's bytes less only those in flight as the run began (back to back, what a step leaves in\n"
               "flight moves in the next one's window); median over the runs (min-max).\n",
               run_length, compute_s > 0 ? ", the run's compute" : "");
  if (compute_s > 0) {
    // Each runner against the same rule's strata-no-overlap: per-round ratios, then their median.
    fmt::print("\nwith {:.3g} s of compute per iteration (simulated device: forward {:.3g} s, then backward with the\n"
               "gradients landing over {:.3g} s); bound = max(compute, the step's I/O bound); eff = bound / iteration:\n",
               compute_s, compute_s / 3, compute_s - compute_s / 3);
    std::string h3 = fmt::format("{:<24} {:>20} {:>9} {:>9} {:>8} {:>5} {:>20}", "preset", "iteration s", "compute s",
                                 "I/O bound", "bound s", "eff", "vs strata-no-overlap");
    if (run_length > 1) h3 += fmt::format(" {:>16}", "run eff");
    fmt::print("{}\n{}\n", h3, std::string(h3.size(), '-'));
    for (std::size_t i = 0; i < runners.size(); ++i) {
      const auto twin = std::find_if(runners.begin(), runners.end(), [&](const runner& r) {
        return r.v.preset == "strata" && !r.v.overlap && r.v.rule == runners[i].v.rule;
      });
      const auto& s = sums[i];
      fmt::print("{:<24} {:>20} {:>9.2f} {:>9.2f} {:>8.2f} {:>5.2f} {:>20}{}\n", runners[i].preset,
                 fmt::format("{:.2f} ({:.2f}-{:.2f})", s.total, s.lo, s.hi), compute_s, s.io_bound, s.bound,
                 s.bound > 0 ? s.bound / s.total : 0.0,
                 twin == runners.end() ? std::string("-") : show(ratios_over(*twin, whole)[i]),
                 run_length > 1 ? fmt::format(" {:>16}", show_run(s)) : std::string());
    }
  }
  if (ratios) {
    fmt::print("\nbackward (gradient hand-over) and update apart, speedups over zero_infinity (medians of per-round\n"
               "ratios); this backward has no GPU compute, only the hand-over each preset does:\n");
    std::string h2 = fmt::format("{:<24} {:>8} {:>20} {:>8} {:>20}", "preset", "bwd s", "bwd speedup", "update s",
                                 "update speedup");
    fmt::print("{}\n{}\n", h2, std::string(h2.size(), '-'));
    for (std::size_t i = 0; i < runners.size(); ++i)
      fmt::print("{:<24} {:>8.2f} {:>20} {:>8.2f} {:>20}\n", runners[i].preset, sums[i].grads,
                 show(speedup_backward[i]), sums[i].update, show(speedup_update[i]));
    fmt::print("MLP-Offload (SC'25) over ZeRO-3 in its own logs, 40B-120B on 4 GPUs: backward 11.2-17.4x, update\n"
               "1.68-2.34x (70B: 11.2x and 2.29x).\n");
  }

  if (json_path) {
    json_object j;
    j.add("command", "step").add("params", params).add("subgroup", subgroup).add("cache_bytes", cache_bytes);
    j.add("grad", std::is_same_v<G, float> ? "fp32" : std::is_same_v<G, bf16> ? "bf16" : "fp16");
    j.add("iters", iters).add("run", run_length).add("warmup", warmup).add("compare", compare).add("compare_equal", compare_equal);
    j.add("compute_s", compute_s);
    j.add("threads", threads);
    j.add("max_grad_norm", max_grad_norm).add("loss_scaling", loss_scaling).add("integrity", integrity);
    std::vector<std::string> pj;
    for (const auto& p : paths) {
      json_object o;
      o.add("name", p.name).add("dir", p.dir.string()).add("read_cap", p.read_cap).add("write_cap", p.write_cap);
      if (p.is_s3()) o.add("url", p.url);
#if STRATA_HAS_S3
      if (p.probe_stats_valid) o.add("probe_s3", stats_json(p.probe_stats));
#endif
      o.add("probe_read", p.probe_read).add("probe_write", p.probe_write);
      o.add("read_bw", p.read_bw()).add("write_bw", p.write_bw());
      pj.push_back(o.str());
    }
    j.add_array("paths", pj);
    std::vector<std::string> rj;
    for (std::size_t i = 0; i < runners.size(); ++i) {
      const auto& r = runners[i];
      const auto& s = sums[i];
      json_object o;
      o.add("preset", r.preset).add("setup_s", r.setup_s).add("rule", r.v.rule);
      o.add("prefetch_next_step", r.opt->offload().prefetch_next_step).add("overlap", r.v.overlap)
          .add("speculate_updates", r.opt->offload().speculate_updates);
      std::vector<std::string> used;
      for (const auto k : r.paths) used.push_back(fmt::format("\"{}\"", paths[k].name));
      o.add_array("paths", used);
      o.add("step_s", s.total).add("step_min_s", s.lo).add("step_max_s", s.hi);
      o.add("grads_s", s.grads).add("read_wait_s", s.read_wait).add("compute_s", s.compute).add("kernel_s", s.kernel);
      o.add("write_wait_s", s.write_wait).add("other_s", s.other);
      o.add("lock", r.v.preset == "mlp_offload" ? r.v.lock : "none").add("striped", r.v.equal);
      o.add("update_s", s.update).add("bound_s", s.bound).add("serial_bound_s", s.serial_bound);
      o.add("io_bound_s", s.io_bound);
      o.add("efficiency", s.bound > 0 ? s.bound / s.total : 0.0);
      o.add("run_efficiency", s.run_eff).add("run_efficiency_min", s.run_lo).add("run_efficiency_max", s.run_hi);
      if (ratios) {
        o.add("speedup_vs_zero_infinity", speedup[i].med).add("speedup_min", speedup[i].lo).add("speedup_max", speedup[i].hi);
        o.add("backward_speedup", speedup_backward[i].med).add("update_speedup", speedup_update[i].med);
      }
      if (equal_ratios) o.add("speedup_vs_zero_infinity_raid0", speedup_equal[i].med);
      std::vector<std::string> its;
      for (const auto& it : r.iters) {
        json_object x;
        x.add("step_s", it.total_s).add("grads_s", it.grads_s).add("read_wait_s", it.read_wait_s);
        x.add("compute_s", it.compute_s).add("kernel_s", it.kernel_s).add("write_wait_s", it.write_wait_s);
        x.add("other_s", it.other_s);
        x.add("cache_hits", it.cache_hits).add("cache_misses", it.cache_misses);
        x.add("early_updates", it.early_updates).add("speculative_updates", it.speculative_updates);
        x.add("grad_bytes_written", it.grad_written);
        x.add("bound_s", it.bound_s).add("serial_bound_s", it.serial_bound_s).add("io_bound_s", it.io_bound_s);
        x.add_array("path_bytes_read", numbers(it.path_read)).add_array("path_bytes_written", numbers(it.path_written));
        its.push_back(x.str());
      }
      o.add_array("iterations", its);
      std::vector<std::string> runs;  // after the iterations, which readers find after "setup_s"
      for (const auto& run : r.runs) {
        json_object x;
        x.add("wall_s", run.wall_s).add("bound_s", run.bound_s);
        runs.push_back(x.str());
      }
      o.add_array("runs", runs);
      rj.push_back(o.str());
    }
    j.add_array("presets", rj);
    std::vector<std::string> tl;
    for (const auto& s : timeline) {
      json_object x;
      x.add("t", s.t).add("preset", runners[s.preset].preset);
      x.add_array("read", numbers(s.read)).add_array("written", numbers(s.written));
      tl.push_back(x.str());
    }
    j.add_array("timeline", tl);
    auto& out = *json_out;
    out << j.str() << "\n";
    out.close();
    if (!out) throw io_error("write --json", *json_path, errno);
    fmt::print("wrote {}\n", *json_path);
  }
  if (trace) {
    trace->write_chrome_trace(*trace_path);
    fmt::print("wrote {} (open in ui.perfetto.dev)\n", *trace_path);
  }
  return 0;
}

/// Everything --device allocates on the host, counted before any of it is (run_device_steps
/// sizes its optimizer the same way), and the floor of its run time at the paced rates.
void check_device_run(const device_step_config& c, bool sim, double h2d, double d2h, double rate) {
  const auto n = static_cast<std::size_t>(c.params), sg = static_cast<std::size_t>(c.subgroup);
  offload_options base;
  base.subgroup_elems = sg;
  base.threads = static_cast<std::size_t>(c.threads);
  base.host_cache_bytes = c.cache_bytes;
  offload_options off = presets::strata_preset::options(n, adamw_options{}, base);
  const auto layout = offload_layout::of(n, adamw_options{}, off);
  if (c.cache_bytes == unlimited_capacity) off.host_cache_bytes = layout.cache_bytes(layout.subgroups());
  require_bookkeeping_fits("step --device", {layout});
  require_physical_memory(c.params * (sizeof(float) + 3 * sizeof(bf16)),
                          fmt::format("step --device: the weights, gradients and model of {} parameters", c.params));
  memory_account m;
  // fp32 initial weights, the bf16 gradients and model staged for the device (and, with sim, the
  // "device" copies, which live in host memory).
  m.add("the weights, gradients and model", c.params * (sizeof(float) + 2 * sizeof(bf16)) +
                                            (sim ? c.params * 2 * sizeof(bf16) : 0));
  const std::size_t slots = layout.host_slots(off, true);
  m.add(fmt::format("{} host slots", slots), slots * aligned_block_cost(layout.slot_footprint()));
  m.add("the gradient store", aligned_block_cost(c.params * sizeof(bf16)));
  if (c.paths.empty()) {  // the host path holds every subgroup's state, one block each
    const std::size_t last = layout.subgroups() - 1;
    m.add("the state on the host path",
          last * aligned_block_cost(layout.state_bytes(0)) + aligned_block_cost(layout.state_bytes(last)));
  }
  m.add(fmt::format("bookkeeping ({} per subgroup)", format_size(layout.bookkeeping_bytes() / layout.subgroups())),
        layout.bookkeeping_bytes());
  // measure_update_rates' probe subgroup: 16 bytes a parameter on each side.
  m.add("the rate probe", (sim ? 2 : 1) * aligned_block_cost(static_cast<std::uint64_t>(sg) * 16));
  if (sim)
    m.add("the simulated device's slots",
          off.device_depth * aligned_block_cost(layout.max_state_bytes() + layout.device_extra_bytes()));
  m.require(fmt::format("step --device: {} parameters in {}", c.params, describe_subgroups(layout)),
            layout.subgroups() > 1000 ? "use a larger --subgroup or fewer --params" : "use fewer --params");

  run_time_floor t;
  if (sim) {
    // measure_update_rates: a warm-up and 3 timed rounds of copies both ways and a kernel.
    const double probe = 4.0 * 16 * static_cast<double>(sg);
    const std::string probe_size = format_size(static_cast<std::uint64_t>(probe));
    t.phase({{probe / h2d, fmt::format("the rate probe's {} over --h2d {}", probe_size, describe_rate(h2d))}});
    t.phase({{probe / d2h, fmt::format("the rate probe's {} over --d2h {}", probe_size, describe_rate(d2h))}});
    t.phase({{4.0 * static_cast<double>(sg) / rate,
              fmt::format("the rate probe's kernels at --device-rate {:.3g} parameters/s", rate)}});
    // Every step moves the bf16 gradients D2H and, wherever a subgroup is updated, 2 bytes or
    // more of it H2D (the weights back, or the state in); device updates at the kernel rate.
    const double steps = static_cast<double>((c.warmup + c.iters) * (c.compare_cpu ? 2 : 1));
    const double bytes = steps * 2 * static_cast<double>(n);
    const auto what = [&](std::string_view link, double bw) {
      return fmt::format("{:.0f} steps' {} over --{} {}", steps, format_size(static_cast<std::uint64_t>(bytes)), link,
                         describe_rate(bw));
    };
    t.phase({{bytes / d2h, what("d2h", d2h)},
             {bytes / h2d, what("h2d", h2d)},
             {c.share ? *c.share * static_cast<double>(n) * steps / rate : 0.0,
              fmt::format("the device updates at --device-rate {:.3g} parameters/s", rate)}});
  }
  double caps = 0;  // the initial state over the paths' write caps (the placement splits by them)
  for (const auto& p : c.paths) caps = p.write_cap > 0 && caps >= 0 ? caps + p.write_cap : -1;
  if (caps > 0) {
    const double state = 12.0 * static_cast<double>(n);
    t.phase({{state / caps, fmt::format("writing the initial {} of state at the paths' caps of {}",
                                        format_size(static_cast<std::uint64_t>(state)), describe_rate(caps))}});
  }
  t.warn_if_long("step --device");
}

/// --device sim|cuda: the strata preset with the model and gradients in device memory.
int run_device(args& a, const std::string& device) {
  device_step_config c;
  c.params = a.count("params", parse_count("200M"));
  c.subgroup = a.count("subgroup", parse_count("8M"));
  c.threads = a.count("threads", default_thread_count());
  c.iters = a.count("iters", 3);
  c.warmup = a.count("warmup", 1);
  const auto path_args = a.get_all("path");
  // Without paths the state lives in host memory: in the cache, every subgroup (no copies).
  const auto cache = a.size("cache", path_args.empty() ? unlimited_capacity : 0);
  if (const auto s = a.get("device-share")) c.share = parse_real(*s, "step: --device-share");
  c.compare_cpu = a.flag("compare-cpu");
  c.integrity = !a.flag("no-integrity");
  const double h2d = static_cast<double>(a.size("h2d", parse_size("16GB")));
  const double d2h = static_cast<double>(a.size("d2h", parse_size("16GB")));
  const double rate = static_cast<double>(a.count("device-rate", parse_count("4G")));
  const auto device_memory = a.size("device-memory", unlimited_capacity);
  c.json_path = a.get("json");
  c.trace_path = a.get("trace");
  a.finish();
  if (c.params == 0 || c.subgroup == 0) throw usage_error("step: --params and --subgroup must be positive");
  if (c.iters == 0 || c.iters > 1000 || c.warmup > 1000) throw usage_error("step: --iters must be 1..1000, --warmup 0..1000");
  if (c.threads == 0 || c.threads > 1024) throw usage_error("step: --threads must be 1..1024");
  if (c.share && !(*c.share >= 0 && *c.share <= 1)) throw usage_error("step: --device-share must be in [0, 1]");
  if (h2d <= 0 || d2h <= 0 || rate <= 0) throw usage_error("step: --h2d, --d2h and --device-rate must be positive");
  c.cache_bytes = cache;
  for (std::size_t i = 0; i < path_args.size(); ++i) {
    const auto p = parse_path(path_args[i], i);
    offload_path_config pc;
    if (p.is_s3()) {
      pc.url = s3_sub_url(p.url, "strata-bench-step-device");
    } else {
      pc.directory = p.dir / "strata-bench-step-device";
    }
    pc.name = p.name;
    pc.read_cap = p.read_cap;
    pc.write_cap = p.write_cap;
    c.paths.push_back(pc);
  }
  // A subgroup larger than the model is the model: sizing slots, and the rate probe, by the
  // option would allocate (and pace) a subgroup that does not exist.
  if (c.subgroup > c.params) {
    fmt::print("step: --subgroup {} is more than the {} parameters: one subgroup of {}\n", c.subgroup, c.params,
               c.params);
    c.subgroup = c.params;
  }
  check_device_run(c, device == "sim", h2d, d2h, rate);
  // The state never outlives the run (also when it fails): the optimizer removes its objects,
  // then the directories made here go if they are empty.
  struct cleanup {
    created_directories made;
    ~cleanup() { made.remove_empty(); }
  } cleanup{};
  for (const auto& pc : c.paths)
    if (!pc.directory.empty()) cleanup.made.create(pc.directory);
  std::unique_ptr<tracer> trace;
  if (c.trace_path) trace = std::make_unique<tracer>();
  c.trace = trace.get();
  if (device == "sim") return run_device_sim(c, h2d, d2h, rate, device_memory);
  return run_device_cuda(c, device_memory);
}

int run(args& a) {
  const auto device = a.choice("device", {"none", "sim", "cuda"}, "none");
  if (device != "none") return run_device(a, device);
  const auto grad = a.choice("grad", {"bf16", "fp16", "fp32"}, "bf16");
  if (grad == "fp32") return run_typed<float>(a);
  if (grad == "fp16") return run_typed<fp16>(a);
  return run_typed<bf16>(a);
}

const registration reg{{"step", "end-to-end offloaded AdamW steps per preset, phases, bytes per path, bound",
                        usage_text, &run}};

}  // namespace
}  // namespace strata::bench
