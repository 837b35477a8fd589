// offload_demo: trains a synthetic model with strata's offloaded AdamW over run-time configured
// paths and prints, per step, where the time went next to the lower bound of docs/design.md section 2.
//
//   offload_demo --params 1e9 --subgroup 64M --preset strata --budget 3GiB
//                --path /nvme/strata@2GB/1.5GB --path /pfs/strata@1GB/0.8GB --steps 3
//
// A path is DIR[@READ/WRITE]: READ and WRITE are the path's bandwidths in bytes per second (from
// fio or `strata-bench io`), used for placement and for the bound. With --cap they also cap the
// path (throttled), to emulate a slower device on one disk.
//
// A path may be an object store: s3://bucket/prefix[@READ/WRITE] or s3://bucket/prefix[:READ[:WRITE]]
// (credentials, endpoint and region from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_REGION). The run claims its object prefix there before it writes (object_store_claim): a
// prefix in use by a live run is refused, a killed run's objects are taken over, objects that no
// claim covers are refused unless --adopt-existing; the run removes the objects it wrote
// (remove_state), then its claim, and nothing else.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <strata/strata.hpp>

namespace {

constexpr const char* usage =
    "usage: offload_demo [options]\n"
    "  --params N        parameters (e.g. 1e9, 250M); default 10M\n"
    "  --subgroup N      parameters per subgroup; default 4M\n"
    "  --preset NAME     zero_infinity | mlp_offload | strata; default strata\n"
    "  --rule NAME       adamw | adamw-bf16 (bf16 moments) | adamw-8bit (8-bit moments) | sgd (momentum 0.9) |\n"
    "                    lion; default adamw\n"
    "  --path DIR[@R/W]  a path (repeat; DIR 'host': host memory); R/W its read/write bandwidth in\n"
    "                    bytes/s (e.g. 2GB/1.5GB); a trailing '!' also caps that path to them\n"
    "  --path s3://bucket/prefix[@R/W]  or  s3://bucket/prefix[:R[:W]]\n"
    "                    an object store (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,\n"
    "                    AWS_REGION); bandwidths as above (one given: both); a prefix in use by a\n"
    "                    live run is refused, a killed run's objects are taken over\n"
    "  --cap             also cap each path to its declared bandwidth (emulation)\n"
    "  --probe SIZE      before set-up, write then read SIZE through each directory path alone\n"
    "                    (O_DIRECT, 3 rounds, medians) and judge every step against the bound\n"
    "                    from those rates too: the medium measured apart from the pipeline\n"
    "  --cache SIZE      host cache (mlp_offload, or strata without --budget)\n"
    "  --budget SIZE     host memory budget (strata sizes its cache from it)\n"
    "  --steps N         steps; default 3\n"
    "  --threads N       kernel threads; default: all CPUs\n"
    "  --keep            keep the state objects and the directories made for them\n"
    "  --adopt-existing  replace files in the paths that strata did not make and that are named as\n"
    "                    its objects (another job's strata.sg-<i>; any other file stays refused), or\n"
    "                    objects of those names in an s3:// prefix that no strata claim covers;\n"
    "                    without it they are refused and left alone\n"
    "  --no-integrity    do not checksum the state on the paths (faster, unverified reads)\n"
    "  --help            this text\n";

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "offload_demo: %s\n%s", msg.c_str(), usage);
  std::exit(2);
}

/// A count in [lo, hi] ("3", "1e9", "250M"), or a usage error naming the flag.
std::uint64_t count_in(std::string_view flag, const std::string& text, std::uint64_t lo, std::uint64_t hi) {
  std::uint64_t v = 0;
  try {
    v = strata::parse_count(text);
  } catch (const strata::error& e) {
    fail(fmt::format("{}: {}", flag, e.what()));
  }
  if (v < lo || v > hi) fail(fmt::format("{} {} is out of range ({}..{})", flag, text, lo, hi));
  return v;
}

int run(int argc, char** argv) {
  for (const auto& name : strata::unknown_env_variables())
    std::fprintf(stderr, "offload_demo: warning: %s is not a strata variable (misspelt?); it is ignored\n", name.c_str());
  strata::check_env_variables();
  strata::offloaded_adamw_config cfg;
  std::uint64_t params = 10'000'000;
  std::uint64_t steps = 3;
  bool cap = false, keep = false, adopt = false;
  std::uint64_t probe_bytes = 0;
  std::vector<std::string> path_args;
  cfg.offload.subgroup_elems = 4u << 20;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      const auto value = [&]() -> std::string {
        if (i + 1 >= argc) fail(std::string(a) + " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        std::printf("%s", usage);
        return 0;
      } else if (a == "--params") {
        params = count_in(a, value(), 1, std::uint64_t{1} << 48);
      } else if (a == "--subgroup") {
        cfg.offload.subgroup_elems = static_cast<std::size_t>(count_in(a, value(), 1, std::uint64_t{1} << 40));
      } else if (a == "--preset") {
        cfg.preset = value();
      } else if (a == "--rule") {
        cfg.rule = value();
        cfg.sgd.momentum = 0.9;  // SGD as it is trained: with a momentum buffer
      } else if (a == "--path") {
        path_args.push_back(value());
      } else if (a == "--cap") {
        cap = true;
      } else if (a == "--probe") {
        probe_bytes = strata::parse_size(value());
        if (probe_bytes == 0) fail("--probe needs a size above zero");
      } else if (a == "--cache") {
        cfg.offload.host_cache_bytes = strata::parse_size(value());
      } else if (a == "--budget") {
        cfg.offload.host_memory_budget = strata::parse_size(value());
      } else if (a == "--steps") {
        steps = count_in(a, value(), 0, 1'000'000);
      } else if (a == "--threads") {
        cfg.offload.threads = static_cast<std::size_t>(count_in(a, value(), 1, 1024));
      } else if (a == "--keep") {
        keep = true;
      } else if (a == "--adopt-existing") {
        adopt = true;
      } else if (a == "--no-integrity") {
        cfg.verify_integrity = false;
      } else {
        fail("unknown option " + std::string(a));
      }
    }
    if (path_args.empty()) fail("give at least one --path");
    for (const auto& p : path_args) {
      strata::offload_path_config pc;
      pc.adopt_existing = adopt;
      const auto at = p.find('@');
      const std::string dir = p.substr(0, at);
      if (dir.empty()) fail(fmt::format("--path '{}' has no directory (DIR[@READ/WRITE]; 'host' for host memory)", p));
      strata::path_arg parsed;
      try {
        parsed = strata::parse_path_arg(dir, "--path", /*allow_host=*/true);
      } catch (const strata::error& e) {
        fail(e.what());
      }
      if (parsed.kind == strata::path_kind::object_store) {
#if STRATA_HAS_S3
        // s3://bucket/prefix[@READ/WRITE], or the form strata-bench takes: s3://bucket/prefix[:READ[:WRITE]].
        const auto a = strata::parse_s3_path_arg(dir);
        if (a.read_bandwidth > 0 && at != std::string::npos)
          fail(fmt::format("--path '{}': give the bandwidths once (@READ/WRITE or :READ:WRITE)", p));
        pc.url = a.url;
        pc.name = a.url;
        if (a.read_bandwidth > 0) {
          pc.read_bandwidth = a.read_bandwidth;
          pc.write_bandwidth = a.write_bandwidth;
          if (cap) {
            pc.read_cap = pc.read_bandwidth;
            pc.write_cap = pc.write_bandwidth;
          }
        }
#else
        fail(fmt::format("--path {}: this build has no S3 tier (libcurl and libcrypto, STRATA_ENABLE_S3)", dir));
#endif
      } else if (parsed.kind == strata::path_kind::directory) {
        pc.directory = parsed.directory;  // (host: a path in host memory, for emulation and tests)
      }
      if (at != std::string::npos) {
        auto bw = p.substr(at + 1);
        const bool capped = cap || (!bw.empty() && bw.back() == '!');
        if (!bw.empty() && bw.back() == '!') bw.pop_back();
        const auto slash = bw.find('/');
        if (slash == std::string::npos) fail("bandwidths are READ/WRITE in '" + p + "'");
        pc.read_bandwidth = static_cast<double>(strata::parse_size(bw.substr(0, slash)));
        pc.write_bandwidth = static_cast<double>(strata::parse_size(bw.substr(slash + 1)));
        if (capped) {
          pc.read_cap = pc.read_bandwidth;
          pc.write_cap = pc.write_bandwidth;
        }
      }
      for (const auto& q : cfg.paths) {
        if (!pc.directory.empty() && !q.directory.empty() &&
            std::filesystem::weakly_canonical(q.directory) == std::filesystem::weakly_canonical(pc.directory))
          fail(fmt::format("--path {} is given twice (each path needs its own directory)", pc.directory.string()));
        const auto trimmed = [](std::string u) {
          while (u.ends_with('/')) u.pop_back();
          return u;
        };
        if (!pc.url.empty() && trimmed(q.url) == trimmed(pc.url))
          fail(fmt::format("--path {} is given twice (each path needs its own prefix)", pc.url));
      }
      cfg.paths.push_back(pc);
    }
  } catch (const strata::error& e) {
    fail(e.what());
  }

  if (cfg.offload.subgroup_elems > params) {  // a subgroup larger than the model is the model
    std::printf("offload_demo: --subgroup %zu is more than the %llu parameters: one subgroup of %llu\n",
                cfg.offload.subgroup_elems, static_cast<unsigned long long>(params),
                static_cast<unsigned long long>(params));
    cfg.offload.subgroup_elems = static_cast<std::size_t>(params);
  }
  // What must fit before anything is allocated: the demo's own arrays (fp32 weights, bf16
  // gradients), strata's bookkeeping per subgroup, and the state of paths in host memory.
  {
    const auto layout = strata::offload_layout::of_format(
        params,
        cfg.rule == "sgd" ? strata::sgd_rule::format(cfg.sgd)
        : cfg.rule == "lion" ? strata::lion_rule::format(cfg.lion)
        : cfg.rule == "adamw-bf16" ? strata::adamw_bf16_rule::format(cfg.adamw)
        : cfg.rule == "adamw-8bit" ? strata::adamw_8bit_rule::format(cfg.adamw)
                                   : strata::adamw_rule::format(cfg.adamw),
        cfg.offload);
    std::uint64_t host_paths = 0;
    for (const auto& p : cfg.paths) host_paths += p.directory.empty() && p.url.empty() ? 1 : 0;
    const std::uint64_t state = host_paths > 0 ? layout.total_state_bytes() : 0;
    strata::require_physical_memory(
        params * (sizeof(float) + sizeof(strata::bf16)) + layout.bookkeeping_bytes() + state,
        fmt::format("the demo's {} parameters in {} subgroups (weights, gradients, {} of bookkeeping{})", params,
                    layout.subgroups(), strata::format_size(layout.bookkeeping_bytes()),
                    state > 0 ? ", the state in host memory" : ""));
  }

  // Only what this run created is removed afterwards (unless --keep): the optimizer's objects,
  // then the directories it made, if empty.
  strata::created_directories dirs;
  std::optional<strata::any_offloaded_adamw> opt;
  // remove_state() goes on past a path that fails (the others are emptied), and so does this.
  struct cleanup {
    bool keep;
    strata::created_directories& dirs;
    std::optional<strata::any_offloaded_adamw>& opt;
    // The first failure, or empty.
    std::string run() noexcept {
      std::string failed;
      if (keep) return failed;
      try {
        if (opt) (void)opt->remove_state();
      } catch (const std::exception& e) {
        failed = e.what();
      }
      opt.reset();  // the paths close: an object store's claim goes with its last object
      dirs.remove_empty();
      keep = true;  // done
      return failed;
    }
    ~cleanup() {
      if (const auto failed = run(); !failed.empty()) std::fprintf(stderr, "offload_demo: cleanup: %s\n", failed.c_str());
    }
  } guard{keep, dirs, opt};
  // (A missing path directory is made by its file_tier, which records it before writing in it
  // and removes it, when empty, at the end of this run or of the next one after a kill.)

  // The independent bound: each directory measured alone through a file_tier of its own, before
  // the optimizer writes anything (an object store or host path leaves it out).
  double probe_read = 0, probe_write = 0;
  bool probed = probe_bytes > 0;
  if (probed) {
    strata::direct_io_buffer data(probe_bytes);
    for (std::uint64_t i = 0; i < probe_bytes; i += 4096) data.data()[i] = static_cast<std::byte>(i >> 12);
    for (const auto& p : cfg.paths) {
      if (p.directory.empty()) {
        std::printf("probe: %s is not a directory; no independent bound\n", p.url.empty() ? "host" : p.url.c_str());
        probed = false;
        break;
      }
      strata::file_tier_options o;
      o.directory = p.directory / ".probe";
      o.name = "probe";
      const bool made = !std::filesystem::exists(o.directory);
      strata::probe_rates r;
      {
        strata::file_tier t(o);
        r = strata::probe_write_read(t, data.bytes(), std::min<std::uint64_t>(probe_bytes, 64u << 20), 3);
      }
      if (made) std::filesystem::remove(o.directory);
      std::ranges::sort(r.write);
      std::ranges::sort(r.read);
      const double w = r.write[1] * 1e9, rd = r.read[1] * 1e9;  // medians of 3
      std::printf("probe: %s alone (%s, O_DIRECT, median of 3): read %.2f, write %.2f GB/s\n", p.directory.c_str(),
                  strata::format_size(probe_bytes).c_str(), rd / 1e9, w / 1e9);
      probe_read += p.read_cap > 0 ? std::min(p.read_cap, rd) : rd;
      probe_write += p.write_cap > 0 ? std::min(p.write_cap, w) : w;
    }
  }

  // Peak resident memory per phase, split into the demo's own arrays, what strata holds (its
  // budgeted host memory) and the rest (process, libraries, bookkeeping).
  const bool peaks = strata::reset_peak_resident();
  const auto print_peak = [&](const char* phase, const char* arrays, std::uint64_t array_bytes,
                              const strata::offload_stats& st) {
    const auto m = strata::read_process_memory();
    const double other = static_cast<double>(m.peak) - static_cast<double>(array_bytes) -
                         static_cast<double>(st.host_memory_peak);
    std::printf("%s: peak RSS %s = the demo's %s %s + strata's pipeline, cache and gradient store %s (budget %s) "
                "+ the rest %s%.2f GiB%s\n",
                phase, strata::format_size(m.peak).c_str(), arrays, strata::format_size(array_bytes).c_str(),
                strata::format_size(st.host_memory_peak).c_str(),
                st.host_memory_budget == strata::unlimited_capacity ? "unlimited"
                                                                    : strata::format_size(st.host_memory_budget).c_str(),
                other < 0 ? "-" : "", std::abs(other) / double(1ULL << 30),
                peaks ? "" : " (the kernel refused to reset the peak: it counts from the start)");
  };

  // Cheap deterministic values (a normal generator would take longer than a step at 1e9).
  std::vector<float> init(params);
  std::uint32_t x = 1;
  for (auto& p : init) {
    x = x * 1664525u + 1013904223u;
    p = static_cast<float>(static_cast<std::int32_t>(x)) * 0x1p-31f;
  }
  const auto t0 = std::chrono::steady_clock::now();
  opt = strata::make_offloaded_optimizer(cfg, init);
  const double setup = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto st0 = opt->stats();
  const double per_param = opt->state_format().mean_bytes_per_param();
  std::printf("preset %s, rule %s: %llu parameters (%s of state: %.3g bytes a parameter, fp32 master and %s), "
              "%zu-parameter subgroups, cache %zu subgroups, pipeline %zu slots, host memory %s of %s; initial write "
              "%.1f s\n",
              std::string(opt->preset()).c_str(), std::string(opt->rule()).c_str(),
              static_cast<unsigned long long>(params), strata::format_size(static_cast<std::uint64_t>(static_cast<double>(params) * per_param)).c_str(), per_param,
              strata::describe(opt->state_format()).c_str(), opt->offload().subgroup_elems, st0.cache_slots,
              st0.pipeline_slots, strata::format_size(st0.host_memory_used).c_str(),
              st0.host_memory_budget == strata::unlimited_capacity ? "unlimited"
                                                                   : strata::format_size(st0.host_memory_budget).c_str(),
              setup);
  print_peak("set-up", "fp32 initial weights", params * sizeof(float), st0);
  init.clear();
  init.shrink_to_fit();
  std::vector<strata::bf16> grads(params);
  for (auto& g : grads) {
    x = x * 1664525u + 1013904223u;
    g = strata::bf16(static_cast<float>(static_cast<std::int32_t>(x)) * 0x1p-41f);
  }
  if (peaks) strata::reset_peak_resident();
  for (std::uint64_t t = 0; t < steps; ++t) {
    const auto s = opt->step(std::span<const strata::bf16>(grads), 1e-4);
    std::printf("%s\n", s.to_string().c_str());
    std::printf("  moved %.2f bytes a parameter (read %.2f, written %.2f)\n",
                static_cast<double>(s.bytes_read + s.bytes_written) / static_cast<double>(params),
                static_cast<double>(s.bytes_read) / static_cast<double>(params),
                static_cast<double>(s.bytes_written) / static_cast<double>(params));
    if (probed) {
      const double bound = std::max({static_cast<double>(s.bytes_read) / probe_read,
                                     static_cast<double>(s.bytes_written) / probe_write, s.kernel_s});
      std::printf("  independent bound (the probes, not this step's own rates): %.3f s, efficiency %.3f\n", bound,
                  s.total_s > 0 ? bound / s.total_s : 0.0);
    }
    for (const auto& p : s.paths)
      std::printf("  path %s: read %s, written %s (declared %.2f / %.2f GB/s)\n", p.name.c_str(),
                  strata::format_size(p.bytes_read).c_str(), strata::format_size(p.bytes_written).c_str(),
                  p.read_bandwidth / 1e9, p.write_bandwidth / 1e9);
    std::fflush(stdout);
  }
  if (steps > 0) print_peak("steps", "bf16 gradients", params * sizeof(strata::bf16), opt->stats());
  // What each path moved over the whole run (the initial state included).
  for (const auto& p : opt->path_totals())
    std::printf("path %s: %llu bytes read, %llu bytes written in all\n", p.name.c_str(),
                static_cast<unsigned long long>(p.bytes_read), static_cast<unsigned long long>(p.bytes_written));
  if (const auto failed = guard.run(); !failed.empty()) throw strata::error("cleanup: " + failed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Every failure is one line and exit code 1 (usage errors: 2), never an abort.
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "offload_demo: out of host memory (try fewer --params or a smaller --budget)\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_demo: %s\n", e.what());
  }
  return 1;
}
