// train_mlp: trains a small multi-layer perceptron on the CPU with strata's offloaded AdamW.
//
// The data are synthetic: a fixed random "teacher" MLP maps random inputs to targets, and a
// "student" of the same shape learns them with an MSE loss. The student's weights are bf16 (the
// hand-written forward and backward widen them to float, and hand bf16 gradients to the
// optimizer); its fp32 state (master weights, moments) lives on two file paths behind a host
// cache, and every step writes the updated bf16 weights back into the model. The same training
// is then repeated with the in-memory kernel (adamw_update_cpu over the whole flat arrays), and
// the final weights of both must be bit-identical.
//
//   train_mlp --layers 4 --hidden 256 --epochs 20 --path /nvme/mlp --path /pfs/mlp
//
// Forward and backward are deterministic: work is split by rows or samples, and every element
// sums its terms in a fixed order, so results do not depend on --threads.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <strata/strata.hpp>

namespace {

constexpr const char* usage =
    "usage: train_mlp [options]\n"
    "Trains an MLP (teacher-student data, MSE loss) with bf16 weights and strata's offloaded AdamW,\n"
    "then again with the in-memory AdamW, and checks that both end bit-identical.\n"
    "Prints the loss on all samples before training (epoch 0) and after each epoch.\n"
    "Exit code 0: the loss fell (the last epoch's is below epoch 0's and, with --epochs 2 or more,\n"
    "below the first epoch's) and the weights are bit-identical; 1: either is not so, or a run-time\n"
    "error; 2: bad arguments.\n"
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
    "                    quarter of the subgroups\n"
    "  --path DIR        a directory for the optimizer state (give two); default train_mlp-a and\n"
    "                    train_mlp-b in the current directory\n"
    "  --threads N       threads for forward, backward and the update; default: all CPUs\n"
    "  --seed N          seed of the data, the teacher and the initial weights; default 1\n"
    "  --keep            keep the state files (otherwise removed, with the directories if empty)\n"
    "  --help            this text\n";

struct config {
  std::size_t layers = 3, hidden = 128, inputs = 32, outputs = 8;
  std::size_t samples = 2048, batch = 64, epochs = 15;
  double lr = 1e-2, weight_decay = 1e-4;
  std::size_t subgroup = 0;         // 0: the default
  std::uint64_t cache = 0;          // subgroups, or bytes when cache_bytes
  bool cache_given = false, cache_bytes = false;
  std::vector<std::filesystem::path> paths;
  std::size_t threads = 0;           // 0: strata::default_thread_count()
  std::uint64_t seed = 1;
  bool keep = false;
};

/// A bad command line: a config_error, reported on one line with exit code 2.
[[noreturn]] void bad_usage(const std::string& message) { throw strata::config_error(message); }

/// parse(text), its config_error (which quotes the text) prefixed with the option.
template <class Parse>
std::uint64_t parse_for(std::string_view opt, const std::string& text, Parse parse) {
  try {
    return parse(text);
  } catch (const strata::error& e) {
    bad_usage(fmt::format("{}: {}", opt, e.what()));
  }
}

std::size_t parse_number(std::string_view opt, const std::string& text, std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t v = parse_for(opt, text, strata::parse_count);
  if (v < lo || v > hi) bad_usage(fmt::format("{} is {}; expected {} to {}", opt, text, lo, hi));
  return static_cast<std::size_t>(v);
}

double parse_real(std::string_view opt, const std::string& text, bool positive) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v) || v < 0 ||
      (positive && v == 0))
    bad_usage(fmt::format("{} is '{}'; expected a {} number", opt, text, positive ? "positive" : "non-negative"));
  return v;
}

/// --cache: a plain number counts subgroups; a size with a unit ("512KiB") is bytes.
void parse_cache(config& c, std::string_view opt, const std::string& text) {
  c.cache_given = true;
  c.cache_bytes = !text.empty() && !std::isdigit(static_cast<unsigned char>(text.back()));
  c.cache = parse_for(opt, text, c.cache_bytes ? strata::parse_size : strata::parse_count);
}

config parse_args(int argc, char** argv) {
  config c;
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
    else if (a == "--path") c.paths.emplace_back(value());
    else if (a == "--threads") c.threads = parse_number(a, value(), 1, 1024);
    else if (a == "--seed") c.seed = parse_for(a, value(), strata::parse_count);
    else if (a == "--keep") c.keep = true;
    else bad_usage(fmt::format("unknown option {} (see --help)", a));
  }
  if (c.threads == 0) c.threads = strata::default_thread_count();  // config_error for a bad STRATA_NUM_THREADS
  if (c.batch > c.samples) bad_usage(fmt::format("--batch {} exceeds --samples {}", c.batch, c.samples));
  if (c.paths.empty()) c.paths = {"train_mlp-a", "train_mlp-b"};
  if (c.paths.size() != 2) bad_usage(fmt::format("give --path twice (got {})", c.paths.size()));
  std::error_code e0, e1;  // the same directory twice would make the two paths one
  const auto p0 = std::filesystem::weakly_canonical(std::filesystem::absolute(c.paths[0]), e0);
  const auto p1 = std::filesystem::weakly_canonical(std::filesystem::absolute(c.paths[1]), e1);
  if (!e0 && !e1 && p0 == p1)
    bad_usage(fmt::format("--path {} and --path {} are the same directory", c.paths[0].string(), c.paths[1].string()));
  return c;
}

// --- random numbers: splitmix64, so that the data and weights are the same on every platform ----

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

// --- the model ----------------------------------------------------------------------------------

/// Layer l maps widths[l] inputs to widths[l+1] outputs: its weights W (widths[l] x widths[l+1],
/// row i holds input i's weights, so the inner loops run over outputs) and then its biases, in
/// one flat parameter array.
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
  [[nodiscard]] std::string describe() const {
    std::string s;
    for (auto w : widths) s += (s.empty() ? "" : "-") + std::to_string(w);
    return s;
  }
};

/// Weights with variance 1/fan_in (uniform), zero biases.
std::vector<float> init_weights(const mlp_shape& net, rng& r) {
  std::vector<float> p(net.params, 0.0f);
  for (std::size_t l = 0; l < net.layers(); ++l) {
    const float a = std::sqrt(3.0f / static_cast<float>(net.widths[l]));
    for (std::size_t k = 0; k < net.widths[l] * net.widths[l + 1]; ++k) p[net.offset[l] + k] = r.uniform(a);
  }
  return p;
}

/// Runs f(lo, hi) over [0, n) in one contiguous range per thread (the calling thread takes the
/// first). Each f writes only its own range's results, so the split changes no value.
template <class F>
void parallel_for(strata::thread_pool* pool, std::size_t n, const F& f) {
  const std::size_t parts = pool ? std::min(pool->size(), n) : 1;
  std::vector<std::future<void>> rest;
  for (std::size_t p = 1; p < parts; ++p)
    rest.push_back(pool->submit([&f, lo = n * p / parts, hi = n * (p + 1) / parts] { f(lo, hi); }));
  f(0, n / parts);
  for (auto& r : rest) r.get();
}

/// Buffers of forward and backward for one batch.
struct workspace {
  std::vector<float> w;                   // the model widened to float
  std::vector<float> wt;                  // each layer's W transposed (for the backward of inputs)
  std::vector<std::vector<float>> act;    // act[l]: batch x widths[l]; act[0] the inputs
  std::vector<std::vector<float>> delta;  // delta[l]: d loss / d pre-activation of layer l's outputs
  std::vector<float> target, grad;
  std::vector<double> sample_loss;

  workspace(const mlp_shape& net, std::size_t batch)
      : w(net.params), wt(net.params), target(batch * net.widths.back()), grad(net.params), sample_loss(batch) {
    for (auto width : net.widths) act.emplace_back(batch * width);
    for (std::size_t l = 0; l < net.layers(); ++l) delta.emplace_back(batch * net.widths[l + 1]);
  }
};

/// Loads the model (bf16 -> float, W and its transpose) into the workspace.
void load_model(const mlp_shape& net, std::span<const strata::bf16> model, workspace& ws) {
  for (std::size_t k = 0; k < net.params; ++k) ws.w[k] = static_cast<float>(model[k]);
  for (std::size_t l = 0; l < net.layers(); ++l) {
    const std::size_t in = net.widths[l], out = net.widths[l + 1];
    const float* w = ws.w.data() + net.offset[l];
    float* wt = ws.wt.data() + net.offset[l];
    for (std::size_t i = 0; i < in; ++i)
      for (std::size_t o = 0; o < out; ++o) wt[o * in + i] = w[i * out + o];
  }
}

/// Forward over the batch in ws.act[0] and the error against ws.target; leaves ws.delta.back() =
/// d loss / d output (loss: the batch's MSE) and returns the batch's sum of squared errors.
double forward(const mlp_shape& net, std::size_t batch, workspace& ws, strata::thread_pool* pool) {
  const std::size_t last = net.layers() - 1, outputs = net.widths.back();
  parallel_for(pool, batch, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t b = lo; b < hi; ++b) {
      for (std::size_t l = 0; l <= last; ++l) {
        const std::size_t in = net.widths[l], out = net.widths[l + 1];
        const float* w = ws.w.data() + net.offset[l];
        const float* x = ws.act[l].data() + b * in;
        float* z = ws.act[l + 1].data() + b * out;
        std::copy_n(w + in * out, out, z);  // the biases
        for (std::size_t i = 0; i < in; ++i)
          for (std::size_t o = 0; o < out; ++o) z[o] += x[i] * w[i * out + o];
        if (l < last)
          for (std::size_t o = 0; o < out; ++o) z[o] = std::tanh(z[o]);
      }
      const float scale = 2.0f / static_cast<float>(batch * outputs);
      const float* y = ws.act.back().data() + b * outputs;
      const float* t = ws.target.data() + b * outputs;
      float* d = ws.delta.back().data() + b * outputs;
      double sum = 0;
      for (std::size_t o = 0; o < outputs; ++o) {
        const float e = y[o] - t[o];
        sum += static_cast<double>(e) * e;
        d[o] = scale * e;
      }
      ws.sample_loss[b] = sum;
    }
  });
  double sum = 0;
  for (std::size_t b = 0; b < batch; ++b) sum += ws.sample_loss[b];  // in sample order
  return sum;
}

/// Backward from ws.delta.back() into ws.grad (every parameter's gradient).
void backward(const mlp_shape& net, std::size_t batch, workspace& ws, strata::thread_pool* pool) {
  for (std::size_t l = net.layers(); l-- > 0;) {
    const std::size_t in = net.widths[l], out = net.widths[l + 1];
    const float* x = ws.act[l].data();
    const float* d = ws.delta[l].data();
    float* g = ws.grad.data() + net.offset[l];
    // dW[i][o] = sum over samples of x[b][i] * d[b][o]: split by rows i, samples summed in order.
    parallel_for(pool, in, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) {
        float* row = g + i * out;
        std::fill_n(row, out, 0.0f);
        for (std::size_t b = 0; b < batch; ++b)
          for (std::size_t o = 0; o < out; ++o) row[o] += x[b * in + i] * d[b * out + o];
      }
    });
    float* gb = g + in * out;
    std::fill_n(gb, out, 0.0f);
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t o = 0; o < out; ++o) gb[o] += d[b * out + o];
    if (l == 0) break;
    // The previous layer's delta: (W d) * tanh'(z), with tanh' = 1 - act^2; split by samples.
    const float* wt = ws.wt.data() + net.offset[l];
    float* dp = ws.delta[l - 1].data();
    parallel_for(pool, batch, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t b = lo; b < hi; ++b) {
        float* row = dp + b * in;
        std::fill_n(row, in, 0.0f);
        for (std::size_t o = 0; o < out; ++o)
          for (std::size_t i = 0; i < in; ++i) row[i] += wt[o * in + i] * d[b * out + o];
        for (std::size_t i = 0; i < in; ++i) row[i] *= 1.0f - x[b * in + i] * x[b * in + i];
      }
    });
  }
}

/// The synthetic data set: inputs uniform with unit variance, targets from the teacher, scaled
/// to a mean square of 1 (so predicting zeros scores a loss of 1).
struct dataset {
  std::vector<float> inputs, targets;
};

dataset make_data(const mlp_shape& net, std::size_t samples, rng& r, strata::thread_pool* pool) {
  dataset ds;
  const std::size_t in = net.widths.front(), out = net.widths.back();
  ds.inputs.resize(samples * in);
  for (auto& v : ds.inputs) v = r.uniform(std::sqrt(3.0f));
  const auto teacher = init_weights(net, r);
  std::vector<strata::bf16> model(teacher.size());
  for (std::size_t k = 0; k < teacher.size(); ++k) model[k] = strata::bf16(teacher[k]);
  ds.targets.resize(samples * out);
  workspace ws(net, samples);
  load_model(net, model, ws);
  std::copy(ds.inputs.begin(), ds.inputs.end(), ws.act[0].begin());
  forward(net, samples, ws, pool);
  double sq = 0;
  for (float y : ws.act.back()) sq += static_cast<double>(y) * y;
  const double rms = std::sqrt(sq / static_cast<double>(ws.act.back().size()));
  const float scale = rms > 0 ? static_cast<float>(1.0 / rms) : 1.0f;
  for (std::size_t k = 0; k < ds.targets.size(); ++k) ds.targets[k] = ws.act.back()[k] * scale;
  return ds;
}

/// The model's loss on the whole data set (mean over samples and outputs), a batch at a time.
double evaluate(const mlp_shape& net, const dataset& data, std::span<const strata::bf16> model, std::size_t batch,
                workspace& ws, strata::thread_pool* pool) {
  const std::size_t in = net.widths.front(), out = net.widths.back(), samples = data.inputs.size() / in;
  load_model(net, model, ws);
  double sum = 0;
  for (std::size_t first = 0; first < samples; first += batch) {
    const std::size_t n = std::min(batch, samples - first);
    std::copy_n(data.inputs.data() + first * in, n * in, ws.act[0].data());
    std::copy_n(data.targets.data() + first * out, n * out, ws.target.data());
    sum += forward(net, n, ws, pool);
  }
  return sum / static_cast<double>(samples * out);
}

/// Cosine decay from lr to lr/10 over the run (a scheduler's value per step).
double schedule(double lr, std::size_t step, std::size_t steps) {
  const double pi = 3.14159265358979323846;
  return lr * (0.1 + 0.45 * (1.0 + std::cos(pi * static_cast<double>(step) / static_cast<double>(steps))));
}

/// Trains the bf16 `model` for c.epochs; update(grads, lr, model) is the optimizer's step, which
/// writes the updated weights into `model`. Returns (and with `print` prints) the loss on the data
/// set before training and after each epoch.
template <class Update>
std::vector<double> train(const config& c, const mlp_shape& net, const dataset& data, std::span<strata::bf16> model,
                          strata::thread_pool* pool, bool print, Update&& update) {
  std::vector<double> losses;
  const auto report = [&](double loss) {
    if (print) {
      std::printf("epoch %zu: loss %.4f\n", losses.size(), loss);
      std::fflush(stdout);
    }
    losses.push_back(loss);
  };
  const std::size_t in = net.widths.front(), out = net.widths.back();
  const std::size_t per_epoch = c.samples / c.batch, steps = per_epoch * c.epochs;
  workspace ws(net, c.batch);
  std::vector<strata::bf16> grads(net.params);
  std::vector<std::size_t> order(c.samples);
  rng shuffle(c.seed ^ 0x5eedda7aULL);  // the same order for every run with this seed
  report(evaluate(net, data, model, c.batch, ws, pool));
  std::size_t step = 0;
  for (std::size_t e = 0; e < c.epochs; ++e) {
    for (std::size_t k = 0; k < c.samples; ++k) order[k] = k;
    for (std::size_t k = c.samples - 1; k > 0; --k) std::swap(order[k], order[shuffle.next() % (k + 1)]);
    for (std::size_t s = 0; s < per_epoch; ++s, ++step) {
      for (std::size_t b = 0; b < c.batch; ++b) {
        const std::size_t k = order[s * c.batch + b];
        std::copy_n(data.inputs.data() + k * in, in, ws.act[0].data() + b * in);
        std::copy_n(data.targets.data() + k * out, out, ws.target.data() + b * out);
      }
      load_model(net, model, ws);
      forward(net, c.batch, ws, pool);
      backward(net, c.batch, ws, pool);
      for (std::size_t k = 0; k < net.params; ++k) grads[k] = strata::bf16(ws.grad[k]);
      update(std::span<const strata::bf16>(grads), schedule(c.lr, step, steps), model);
    }
    report(evaluate(net, data, model, c.batch, ws, pool));
  }
  return losses;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(const config& c) {
  const mlp_shape net(c);
  // About 12 subgroups by default, each a multiple of 1024 parameters (whole 4 KiB blocks of state).
  const std::size_t subgroup =
      c.subgroup ? c.subgroup : std::max<std::size_t>(1024, (net.params / 12 + 1023) / 1024 * 1024);
  strata::offload_options layout_options;
  layout_options.subgroup_elems = subgroup;
  const auto layout = strata::offload_layout::of(net.params, strata::adamw_options{}, layout_options);
  const std::size_t subgroups = layout.subgroups();
  // A cache slot holds one subgroup's fp32 master weights, m and v.
  const std::uint64_t slot = layout.slot_footprint();
  const std::uint64_t cache_bytes = !c.cache_given ? std::max<std::size_t>(1, subgroups / 4) * slot
                                    : c.cache_bytes ? c.cache
                                                    : c.cache * slot;

  std::unique_ptr<strata::thread_pool> pool;
  if (c.threads > 1) pool = std::make_unique<strata::thread_pool>(c.threads, "train_mlp");
  rng r(c.seed);
  const dataset data = make_data(net, c.samples, r, pool.get());
  const std::vector<float> init = init_weights(net, r);
  std::vector<strata::bf16> init_model(net.params);
  for (std::size_t k = 0; k < net.params; ++k) init_model[k] = strata::bf16(init[k]);

  const strata::adamw_options adamw{.lr = c.lr, .weight_decay = c.weight_decay};

  // 1. Offloaded: the "strata" preset over two file paths and a host cache.
  using P = strata::presets::strata_preset;
  const auto path = [](const std::filesystem::path& dir) {
    return strata::file_tier_options{.directory = dir, .name = dir.string()};
  };
  P::paths<strata::file_tier, strata::file_tier> tier(P::placement(), path(c.paths[0]), path(c.paths[1]));
  const strata::offload_options base{.subgroup_elems = subgroup, .host_cache_bytes = cache_bytes, .threads = c.threads};
  P::optimizer<decltype(tier)> opt(tier, init, adamw, P::options(net.params, adamw, base));
  std::printf("train_mlp: MLP %s (%zu parameters, bf16), %zu samples, batch %zu, %zu epochs, %zu threads\n",
              net.describe().c_str(), net.params, c.samples, c.batch, c.epochs, c.threads);
  std::printf("offloaded AdamW (strata preset): %zu subgroups of %zu, host cache %zu subgroups, paths %s, %s\n",
              opt.subgroup_count(), subgroup, opt.stats().cache_slots, c.paths[0].c_str(), c.paths[1].c_str());
  std::fflush(stdout);

  std::vector<strata::bf16> model = init_model;
  std::vector<strata::path_traffic> traffic;  // summed over the steps (the initial write is not in it)
  auto t0 = std::chrono::steady_clock::now();
  const auto losses =
      train(c, net, data, model, pool.get(), true, [&](auto grads, double lr, std::span<strata::bf16> out) {
        const auto st = opt.step(grads, lr, out);
        if (traffic.empty()) traffic = st.paths;
        for (std::size_t p = 0; p < st.paths.size() && p < traffic.size(); ++p) {
          traffic[p].bytes_read += st.paths[p].bytes_read;
          traffic[p].bytes_written += st.paths[p].bytes_written;
        }
      });
  const double offloaded_s = seconds_since(t0);
  const auto totals = opt.stats();
  std::string paths;
  for (const auto& p : traffic)
    paths += fmt::format("; {}: read {}, written {}", p.name, strata::format_size(p.bytes_read),
                         strata::format_size(p.bytes_written));
  std::printf("optimizer: %llu steps, cache hits %llu / misses %llu%s\n", static_cast<unsigned long long>(totals.steps),
              static_cast<unsigned long long>(totals.cache_hits), static_cast<unsigned long long>(totals.cache_misses),
              paths.c_str());

  // 2. In memory: adamw_update_cpu over the whole flat arrays; same init, data order, lr and gradients.
  std::vector<float> master = init, m(net.params, 0.0f), v(net.params, 0.0f);
  std::vector<strata::bf16> ref_model = init_model;
  std::int64_t step = 0;
  t0 = std::chrono::steady_clock::now();
  train(c, net, data, ref_model, pool.get(), false, [&](auto grads, double lr, std::span<strata::bf16> out) {
        strata::adamw_update_cpu(std::span<float>(master), std::span<float>(m), std::span<float>(v),
                                 std::span<float>(), grads, out, strata::make_adamw_step_params(adamw, ++step, lr),
                                 pool.get());
      });
  std::printf("training time: offloaded %.2f s, in-memory %.2f s; final weights' checksum %016llx\n", offloaded_s,
              seconds_since(t0),
              static_cast<unsigned long long>(strata::checksum64(std::as_bytes(std::span(model)))));

  // The final state of both, compared bit for bit: the bf16 model, the fp32 master weights, m and v.
  std::vector<float> off_master(net.params), off_m(net.params), off_v(net.params);
  opt.read_master(off_master);
  opt.read_moments(off_m, off_v);
  const auto differ = [](const auto& a, const auto& b) {
    std::size_t n = 0;
    for (std::size_t k = 0; k < a.size(); ++k) n += std::memcmp(&a[k], &b[k], sizeof(a[k])) != 0;
    return n;
  };
  const std::size_t model_diff = differ(model, ref_model), master_diff = differ(off_master, master),
                    moment_diff = differ(off_m, m) + differ(off_v, v);
  const bool identical = model_diff == 0 && master_diff == 0 && moment_diff == 0;
  if (identical)
    std::printf("bit-identical to in-memory AdamW: yes\n");
  else
    std::printf("bit-identical to in-memory AdamW: NO (of %zu parameters: %zu bf16 weights, %zu master weights and "
                "%zu moments differ)\n",
                net.params, model_diff, master_diff, moment_diff);

  if (!c.keep) {  // our objects, then the directories if nothing else is in them
    for (std::size_t s = 0; s < opt.subgroup_count(); ++s) tier.remove(opt.object_name(s));
    std::error_code ec;
    for (const auto& dir : c.paths) std::filesystem::remove(dir, ec);
  }
  // Training must have lowered the loss, and kept lowering it: the last epoch's below the start
  // (epoch 0) and, after more than one epoch, below the first epoch's.
  const bool fell = losses.back() < losses[0] && (losses.size() == 2 || losses.back() < losses[1]);
  if (!fell)
    std::fprintf(stderr, "train_mlp: the loss did not fall (epoch 0: %.4f, epoch 1: %.4f, epoch %zu: %.4f)\n",
                 losses[0], losses[1], losses.size() - 1, losses.back());
  return identical && fell ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  try {
    for (int i = 1; i < argc; ++i)
      if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
        std::printf("%s", usage);
        return 0;
      }
    c = parse_args(argc, argv);
  } catch (const std::exception& e) {  // config_error from bad_usage or the environment (STRATA_*)
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 2;
  }
  try {
    return run(c);
  } catch (const std::exception& e) {  // strata::error: typed, with the path or operation that failed
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
