// mlp_common.hpp: what train_mlp (CPU) and train_mlp_cuda (GPU) share, so that both train the
// same model on the same data with the same schedule and judge the result by the same rules: the
// command line, the random numbers, the model's shape and initial weights, the teacher-student
// data, the training loop's order and learning rate, the optimizer's layout, and the final checks.
// Each example keeps only its forward and backward (and, on the GPU, device memory).
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <strata/core/env.hpp>
#include <strata/core/error.hpp>
#include <strata/tier/path_arg.hpp>
#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/core/units.hpp>
#include <strata/offload/offload_layout.hpp>
#include <strata/offload/offload_options.hpp>
#include <strata/offload/offload_stats.hpp>
#include <strata/optim/adamw_cpu.hpp>
#include <strata/optim/adamw_math.hpp>
#include <strata/tier/checksummed.hpp>
#include <strata/tier/file_tier.hpp>

namespace mlp_example {

// --- the command line ----------------------------------------------------------------------------

/// The --help lines on output and exit codes; an example ends them with its own codes and ".\n".
inline constexpr std::string_view help_exit_codes =
    "Prints the loss on all samples before training (epoch 0) and after each epoch.\n"
    "Exit code 0: the loss fell (the last epoch's is below epoch 0's and, with --epochs 2 or more,\n"
    "below the first epoch's) and the weights are bit-identical; 1: either is not so, or a run-time\n"
    "error; 2: bad arguments";

/// The --help lines of the model, data and optimizer options (parse_args reads them all).
inline constexpr std::string_view help_model_options =
    "  --layers N        linear layers (N-1 hidden layers of tanh units); default 3\n"
    "  --hidden N        units per hidden layer; default 128\n"
    "  --inputs N        input features; default 32\n"
    "  --outputs N       outputs; default 8\n"
    "  --samples N       training samples; default 2048\n"
    "  --batch N         samples per step; default 64\n"
    "  --epochs N        passes over the samples; default 15\n"
    "  --lr X            peak learning rate (cosine decay to a tenth); default 1e-2\n"
    "  --weight-decay X  AdamW's decoupled weight decay; default 1e-4\n"
    "  --subgroup N      parameters per subgroup; default: a multiple of 1024 giving about 12\n"
    "  --cache N|SIZE    host cache: N subgroups, or SIZE bytes with a unit (512KiB); default: a\n"
    "                    quarter of the subgroups\n";

/// The last --help lines; --path and --threads, which mean different things per example, go
/// between help_model_options and these.
inline constexpr std::string_view help_run_options =
    "  --seed N          seed of the data, the teacher and the initial weights; default 1\n"
    "  --keep            keep the state files (otherwise removed, with the directories if empty)\n"
    "  --help            this text\n";

/// The options both examples take; an example derives from it for its own (parse_args' `extra`).
struct config {
  std::size_t layers = 3, hidden = 128, inputs = 32, outputs = 8;
  std::size_t samples = 2048, batch = 64, epochs = 15;
  double lr = 1e-2, weight_decay = 1e-4;
  std::size_t subgroup = 0;  // 0: the default
  std::uint64_t cache = 0;   // subgroups, or bytes when cache_bytes
  bool cache_given = false, cache_bytes = false;
  std::vector<std::filesystem::path> paths;  // two, or none where the example has no default
  std::size_t threads = 0;                   // 0: strata::default_thread_count()
  std::uint64_t seed = 1;
  bool keep = false;
};

/// A bad command line: a config_error, reported on one line with exit code 2.
[[noreturn]] inline void bad_usage(const std::string& message) { throw strata::config_error(message); }

/// parse(text), its config_error (which quotes the text) prefixed with the option.
template <class Parse>
std::uint64_t parse_for(std::string_view opt, const std::string& text, Parse parse) {
  try {
    return parse(text);
  } catch (const strata::error& e) {
    bad_usage(fmt::format("{}: {}", opt, e.what()));
  }
}

/// A directory or file given as `opt`, parsed by the library (strata::parse_path_arg): an empty
/// one, an object store URL or any other URL is a usage error naming it, never a folder "s3:".
inline std::filesystem::path file_system_path(std::string_view opt, const std::string& text) {
  strata::path_arg p;
  try {
    p = strata::parse_path_arg(text, opt);
  } catch (const strata::error& e) {
    bad_usage(e.what());
  }
  if (p.kind != strata::path_kind::directory)
    bad_usage(fmt::format("{} {}: this tool keeps its state in directories, not in an object store (offload_demo, "
                          "strata-bench and the Python front take s3:// paths)",
                          opt, text));
  return p.directory;
}

/// A count in [lo, hi].
inline std::size_t parse_number(std::string_view opt, const std::string& text, std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t v = parse_for(opt, text, strata::parse_count);
  if (v < lo || v > hi) bad_usage(fmt::format("{} is {}; expected {} to {}", opt, text, lo, hi));
  return static_cast<std::size_t>(v);
}

/// A finite, non-negative (with `positive`, positive) real; all of `text` must be the number.
inline double parse_real(std::string_view opt, const std::string& text, bool positive) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v) || v < 0 ||
      (positive && v == 0))
    bad_usage(fmt::format("{} is '{}'; expected a {} number", opt, text, positive ? "positive" : "non-negative"));
  return v;
}

/// --cache: a plain number counts subgroups; a size with a unit ("512KiB") is bytes.
inline void parse_cache(config& c, std::string_view opt, const std::string& text) {
  c.cache_given = true;
  c.cache_bytes = !text.empty() && !std::isdigit(static_cast<unsigned char>(text.back()));
  c.cache = parse_for(opt, text, c.cache_bytes ? strata::parse_size : strata::parse_count);
}

/// parse_args' `extra` for an example without options of its own.
struct no_extra_options {
  template <class Value>
  bool operator()(std::string_view, Value&) const {
    return false;
  }
};

/// Parses the command line (less --help, which example_main answers) into `c`, throwing
/// config_error (bad_usage) for a bad one. extra(opt, value) takes the example's own options: it
/// returns whether it knew `opt`, and value() returns the option's value (or throws when there is
/// none). Without --path, the paths are `default_paths` (none or two).
template <class Extra = no_extra_options>
void parse_args(config& c, int argc, char** argv, std::vector<std::filesystem::path> default_paths = {},
                Extra&& extra = {}) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_usage(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--layers") c.layers = parse_number(a, value(), 1, 64);
    else if (a == "--hidden") c.hidden = parse_number(a, value(), 1, 1 << 16);
    else if (a == "--inputs") c.inputs = parse_number(a, value(), 1, 1 << 16);
    else if (a == "--outputs") c.outputs = parse_number(a, value(), 1, 1 << 16);
    else if (a == "--samples") c.samples = parse_number(a, value(), 1, 1 << 24);
    else if (a == "--batch") c.batch = parse_number(a, value(), 1, 1 << 20);
    else if (a == "--epochs") c.epochs = parse_number(a, value(), 1, 1 << 20);
    else if (a == "--lr") c.lr = parse_real(a, value(), true);
    else if (a == "--weight-decay") c.weight_decay = parse_real(a, value(), false);
    else if (a == "--subgroup") c.subgroup = parse_number(a, value(), 1, std::uint64_t{1} << 40);
    else if (a == "--cache") parse_cache(c, a, value());
    else if (a == "--path") c.paths.emplace_back(file_system_path(a, value()));
    else if (a == "--threads") c.threads = parse_number(a, value(), 1, 1024);
    else if (a == "--seed") c.seed = parse_for(a, value(), strata::parse_count);
    else if (a == "--keep") c.keep = true;
    else if (!extra(a, value)) bad_usage(fmt::format("unknown option {} (see --help)", a));
  }
  if (c.threads == 0) c.threads = strata::default_thread_count();  // config_error for a bad STRATA_NUM_THREADS
  if (c.batch > c.samples) bad_usage(fmt::format("--batch {} exceeds --samples {}", c.batch, c.samples));
  if (c.paths.empty()) c.paths = std::move(default_paths);
  if (c.paths.size() != 0 && c.paths.size() != 2) bad_usage(fmt::format("give --path twice (got {})", c.paths.size()));
  if (c.paths.size() == 2) {
    std::error_code e0, e1;  // the same directory twice would make the two paths one
    const auto p0 = std::filesystem::weakly_canonical(std::filesystem::absolute(c.paths[0]), e0);
    const auto p1 = std::filesystem::weakly_canonical(std::filesystem::absolute(c.paths[1]), e1);
    if (!e0 && !e1 && p0 == p1)
      bad_usage(
          fmt::format("--path {} and --path {} are the same directory", c.paths[0].string(), c.paths[1].string()));
  }
}

/// An example's main: prints `usage` for --help or -h (anywhere on the line) and exits 0; else
/// parse(c) fills a Config, and a bad command line is reported on one line, "<program>: <why>",
/// with exit code 2; then run(c) gives the exit code, a run-time error (strata::error: typed,
/// with the path or operation that failed) likewise reported with exit code 1.
template <class Config, class Parse, class Run>
int example_main(const char* program, const std::string& usage, int argc, char** argv, Parse&& parse, Run&& run) {
  Config c;
  try {
    for (int i = 1; i < argc; ++i)
      if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
        std::fputs(usage.c_str(), stdout);
        return 0;
      }
    for (const auto& var : strata::unknown_env_variables())
      std::fprintf(stderr, "%s: warning: %s is not a strata variable (misspelt?); it is ignored\n", program,
                   var.c_str());
    strata::check_env_variables();
    parse(c);
  } catch (const std::exception& e) {  // config_error from bad_usage or the environment (STRATA_*)
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 2;
  }
  try {
    return run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

// --- random numbers: splitmix64, so that the data and weights are the same on every platform ----

/// splitmix64: a small generator whose sequence is fixed by its seed alone.
class rng {
 public:
  explicit rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [-a, a), from 24 random bits (exact in float).
  float uniform(float a) { return (static_cast<float>(next() >> 40) * 0x1p-23f - 1.0f) * a; }

 private:
  std::uint64_t state_;
};

// --- the model and the data ----------------------------------------------------------------------

/// Layer l maps widths[l] inputs to widths[l+1] outputs: its weights W (widths[l] x widths[l+1],
/// row i holds input i's weights, so the CPU's inner loops run over outputs) and then its biases,
/// in one flat parameter array.
struct mlp_shape {
  std::vector<std::size_t> widths;
  std::vector<std::size_t> offset;  // first parameter of each layer
  std::size_t params = 0;

  explicit mlp_shape(const config& c) {
    widths.push_back(c.inputs);
    for (std::size_t l = 1; l < c.layers; ++l) widths.push_back(c.hidden);
    widths.push_back(c.outputs);
    for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
      offset.push_back(params);
      params += (widths[l] + 1) * widths[l + 1];
    }
  }
  [[nodiscard]] std::size_t layers() const { return offset.size(); }
  /// The widths, "32-128-8".
  [[nodiscard]] std::string describe() const {
    std::string s;
    for (auto w : widths) s += (s.empty() ? "" : "-") + std::to_string(w);
    return s;
  }
};

/// Weights with variance 1/fan_in (uniform), zero biases.
inline std::vector<float> init_weights(const mlp_shape& net, rng& r) {
  std::vector<float> p(net.params, 0.0f);
  for (std::size_t l = 0; l < net.layers(); ++l) {
    const float a = std::sqrt(3.0f / static_cast<float>(net.widths[l]));
    for (std::size_t k = 0; k < net.widths[l] * net.widths[l + 1]; ++k) p[net.offset[l] + k] = r.uniform(a);
  }
  return p;
}

/// v rounded to bf16, the type of the model's weights.
inline std::vector<strata::bf16> to_bf16(std::span<const float> v) {
  std::vector<strata::bf16> out(v.size());
  for (std::size_t k = 0; k < v.size(); ++k) out[k] = strata::bf16(v[k]);
  return out;
}

/// The synthetic data set before its targets: `samples` inputs uniform with unit variance, and
/// the teacher's bf16 weights. Drawn from `r` in this order (then come the student's weights), so
/// that both examples train on the same data.
struct teacher_data {
  std::vector<float> inputs;
  std::vector<strata::bf16> teacher;
};

inline teacher_data draw_teacher_data(const mlp_shape& net, std::size_t samples, rng& r) {
  teacher_data d;
  d.inputs.resize(samples * net.widths.front());
  for (auto& v : d.inputs) v = r.uniform(std::sqrt(3.0f));
  d.teacher = to_bf16(init_weights(net, r));
  return d;
}

/// The factor that scales the teacher's outputs `y` to a mean square of 1, the targets (so that
/// predicting zeros scores a loss of 1).
inline float unit_mean_square_scale(std::span<const float> y) {
  double sq = 0;
  for (float v : y) sq += static_cast<double>(v) * v;
  const double rms = std::sqrt(sq / static_cast<double>(y.size()));
  return rms > 0 ? static_cast<float>(1.0 / rms) : 1.0f;
}

// --- training ------------------------------------------------------------------------------------

/// Cosine decay from lr to lr/10 over the run (a scheduler's value per step).
inline double schedule(double lr, std::size_t step, std::size_t steps) {
  const double pi = 3.14159265358979323846;
  return lr * (0.1 + 0.45 * (1.0 + std::cos(pi * static_cast<double>(step) / static_cast<double>(steps))));
}

/// The training loop of both examples: c.epochs passes over the samples, each in a new shuffled
/// order (the same orders for every run with this seed). evaluate() returns the loss on the whole
/// data set; it is taken before training and after each epoch, and returned (with `print`, also
/// printed). begin_epoch(order) gets each epoch's order of the samples (--samples is at most 2^24,
/// so they fit 32 bits); step(s, lr) then trains on its batch s, the samples order[s * c.batch,
/// (s + 1) * c.batch), with the scheduled learning rate.
template <class Evaluate, class BeginEpoch, class Step>
std::vector<double> train_epochs(const config& c, bool print, Evaluate&& evaluate, BeginEpoch&& begin_epoch,
                                 Step&& step) {
  std::vector<double> losses;
  const auto report = [&](double loss) {
    if (print) {
      std::printf("epoch %zu: loss %.4f\n", losses.size(), loss);
      std::fflush(stdout);
    }
    losses.push_back(loss);
  };
  const std::size_t per_epoch = c.samples / c.batch, steps = per_epoch * c.epochs;
  std::vector<std::uint32_t> order(c.samples);
  rng shuffle(c.seed ^ 0x5eedda7aULL);
  report(evaluate());
  std::size_t done = 0;  // steps so far
  for (std::size_t e = 0; e < c.epochs; ++e) {
    for (std::size_t k = 0; k < c.samples; ++k) order[k] = static_cast<std::uint32_t>(k);
    for (std::size_t k = c.samples - 1; k > 0; --k) std::swap(order[k], order[shuffle.next() % (k + 1)]);
    begin_epoch(std::span<const std::uint32_t>(order));
    for (std::size_t s = 0; s < per_epoch; ++s, ++done) step(s, schedule(c.lr, done, steps));
    report(evaluate());
  }
  return losses;
}

/// Seconds from t0 to now.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --- the optimizers --------------------------------------------------------------------------------

/// The offloaded optimizer's options from --subgroup, --cache and --threads for `params`
/// parameters. About 12 subgroups by default, each a multiple of 1024 parameters (whole 4 KiB
/// blocks of state); a host cache of a quarter of them by default.
inline strata::offload_options offload_base(const config& c, std::size_t params) {
  const std::size_t subgroup =
      c.subgroup ? c.subgroup : std::max<std::size_t>(1024, (params / 12 + 1023) / 1024 * 1024);
  strata::offload_options layout_options;
  layout_options.subgroup_elems = subgroup;
  const auto layout = strata::offload_layout::of(params, strata::adamw_options{}, layout_options);
  const std::size_t subgroups = layout.subgroups();
  // A cache slot holds one subgroup's fp32 master weights, m and v.
  const std::uint64_t slot = layout.slot_footprint();
  const std::uint64_t cache_bytes = !c.cache_given ? std::max<std::size_t>(1, subgroups / 4) * slot
                                    : c.cache_bytes ? c.cache
                                                    : c.cache * slot;
  return {.subgroup_elems = subgroup, .host_cache_bytes = cache_bytes, .threads = c.threads};
}

/// One path of the optimizer state: a file tier in `dir`, named after it.
inline strata::file_tier_options state_path(const std::filesystem::path& dir) {
  return {.directory = dir, .name = dir.string()};
}

/// Adds one step's traffic per path into `sum` (so the state's initial write is in none).
inline void add_traffic(std::vector<strata::path_traffic>& sum, const std::vector<strata::path_traffic>& step) {
  if (sum.empty()) {  // the paths' names and the first step's bytes
    sum = step;
    return;
  }
  for (std::size_t p = 0; p < step.size() && p < sum.size(); ++p) {
    sum[p].bytes_read += step[p].bytes_read;
    sum[p].bytes_written += step[p].bytes_written;
  }
}

/// "; <path>: read <size>, written <size>" for each path, the tail of the optimizer's line.
inline std::string describe_traffic(const std::vector<strata::path_traffic>& traffic) {
  std::string s;
  for (const auto& p : traffic)
    s += fmt::format("; {}: read {}, written {}", p.name, strata::format_size(p.bytes_read),
                     strata::format_size(p.bytes_written));
  return s;
}

/// The reference the offloaded optimizer must match: adamw_update_cpu over the whole flat
/// arrays, all in host memory.
class in_memory_adamw {
 public:
  in_memory_adamw(std::span<const float> init, const strata::adamw_options& adamw, strata::thread_pool* pool)
      : master_(init.begin(), init.end()), m_(init.size(), 0.0f), v_(init.size(), 0.0f), adamw_(adamw), pool_(pool) {}

  /// One step with learning rate `lr`: updates the state and writes the new weights into `model`.
  void step(std::span<const strata::bf16> grads, double lr, std::span<strata::bf16> model) {
    strata::adamw_update_cpu(std::span<float>(master_), std::span<float>(m_), std::span<float>(v_),
                             std::span<float>(), grads, model, strata::make_adamw_step_params(adamw_, ++steps_, lr),
                             pool_);
  }

  [[nodiscard]] const std::vector<float>& master() const noexcept { return master_; }
  [[nodiscard]] const std::vector<float>& m() const noexcept { return m_; }
  [[nodiscard]] const std::vector<float>& v() const noexcept { return v_; }

 private:
  std::vector<float> master_, m_, v_;
  strata::adamw_options adamw_;
  strata::thread_pool* pool_;
  std::int64_t steps_ = 0;
};

// --- the verdict ---------------------------------------------------------------------------------

/// Prints the line on the training times and the final weights' checksum.
inline void print_times(double offloaded_s, double in_memory_s, std::span<const strata::bf16> model) {
  std::printf("training time: offloaded %.2f s, in-memory %.2f s; final weights' checksum %016llx\n", offloaded_s,
              in_memory_s, static_cast<unsigned long long>(strata::checksum64(std::as_bytes(model))));
}

/// Compares the final state of both runs bit for bit: the bf16 model, the fp32 master weights, m
/// and v (`opt`'s read back from its tier). Prints the verdict and returns whether all are equal.
template <class Optimizer>
bool bit_identical(Optimizer& opt, std::span<const strata::bf16> model, const in_memory_adamw& ref,
                   std::span<const strata::bf16> ref_model) {
  const std::size_t params = model.size();
  std::vector<float> master(params), m(params), v(params);
  opt.read_master(master);
  opt.read_moments(m, v);
  const auto differ = [](const auto& a, const auto& b) {
    std::size_t n = 0;
    for (std::size_t k = 0; k < a.size(); ++k) n += std::memcmp(&a[k], &b[k], sizeof(a[k])) != 0;
    return n;
  };
  const std::size_t model_diff = differ(model, ref_model), master_diff = differ(master, ref.master()),
                    moment_diff = differ(m, ref.m()) + differ(v, ref.v());
  const bool identical = model_diff == 0 && master_diff == 0 && moment_diff == 0;
  if (identical)
    std::printf("bit-identical to in-memory AdamW: yes\n");
  else
    std::printf("bit-identical to in-memory AdamW: NO (of %zu parameters: %zu bf16 weights, %zu master weights and "
                "%zu moments differ)\n",
                params, model_diff, master_diff, moment_diff);
  return identical;
}

/// Training must have lowered the loss, and kept lowering it: the last epoch's below the start
/// (epoch 0) and, after more than one epoch, below the first epoch's. When not, says so on stderr
/// ("<program>: the loss did not fall ...").
inline bool loss_fell(const char* program, const std::vector<double>& losses) {
  const bool fell = losses.back() < losses[0] && (losses.size() == 2 || losses.back() < losses[1]);
  if (!fell)
    std::fprintf(stderr, "%s: the loss did not fall (epoch 0: %.4f, epoch 1: %.4f, epoch %zu: %.4f)\n", program,
                 losses[0], losses[1], losses.size() - 1, losses.back());
  return fell;
}

/// Removes each of `dirs` that is empty (std::filesystem::remove leaves one that is not, and
/// errors are ignored: what is left is the user's to see).
inline void remove_empty_directories(std::span<const std::filesystem::path> dirs) noexcept {
  std::error_code ec;
  for (const auto& dir : dirs) std::filesystem::remove(dir, ec);
}

}  // namespace mlp_example
