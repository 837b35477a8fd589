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
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <strata/strata.hpp>

#include "mlp_common.hpp"

namespace {

using mlp_example::config;
using mlp_example::mlp_shape;
using mlp_example::rng;

/// The --help text.
std::string usage() {
  return fmt::format(
      "usage: train_mlp [options]\n"
      "Trains an MLP (teacher-student data, MSE loss) with bf16 weights and strata's offloaded AdamW,\n"
      "then again with the in-memory AdamW, and checks that both end bit-identical.\n"
      "{}.\n"
      "{}"
      "  --path DIR        a directory for the optimizer state (give two); default train_mlp-a and\n"
      "                    train_mlp-b in the current directory\n"
      "  --threads N       threads for forward, backward and the update; default: all CPUs\n"
      "{}",
      mlp_example::help_exit_codes, mlp_example::help_model_options, mlp_example::help_run_options);
}

// --- forward and backward on the CPU -------------------------------------------------------------

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
  auto drawn = mlp_example::draw_teacher_data(net, samples, r);
  workspace ws(net, samples);
  load_model(net, drawn.teacher, ws);
  std::copy(drawn.inputs.begin(), drawn.inputs.end(), ws.act[0].begin());
  forward(net, samples, ws, pool);
  const std::vector<float>& y = ws.act.back();
  const float scale = mlp_example::unit_mean_square_scale(y);
  dataset ds{std::move(drawn.inputs), std::vector<float>(y.size())};
  for (std::size_t k = 0; k < y.size(); ++k) ds.targets[k] = y[k] * scale;
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

/// Trains the bf16 `model` for c.epochs; update(grads, lr, model) is the optimizer's step, which
/// writes the updated weights into `model`. Returns (and with `print` prints) the loss on the data
/// set before training and after each epoch.
template <class Update>
std::vector<double> train(const config& c, const mlp_shape& net, const dataset& data, std::span<strata::bf16> model,
                          strata::thread_pool* pool, bool print, Update&& update) {
  const std::size_t in = net.widths.front(), out = net.widths.back();
  workspace ws(net, c.batch);
  std::vector<strata::bf16> grads(net.params);
  std::span<const std::uint32_t> order;  // the current epoch's
  return mlp_example::train_epochs(
      c, print, [&] { return evaluate(net, data, model, c.batch, ws, pool); },
      [&](std::span<const std::uint32_t> epoch_order) { order = epoch_order; },
      [&](std::size_t s, double lr) {
        for (std::size_t b = 0; b < c.batch; ++b) {
          const std::size_t k = order[s * c.batch + b];
          std::copy_n(data.inputs.data() + k * in, in, ws.act[0].data() + b * in);
          std::copy_n(data.targets.data() + k * out, out, ws.target.data() + b * out);
        }
        load_model(net, model, ws);
        forward(net, c.batch, ws, pool);
        backward(net, c.batch, ws, pool);
        for (std::size_t k = 0; k < net.params; ++k) grads[k] = strata::bf16(ws.grad[k]);
        update(std::span<const strata::bf16>(grads), lr, model);
      });
}

int run(const config& c) {
  const mlp_shape net(c);
  const strata::offload_options base = mlp_example::offload_base(c, net.params);

  std::unique_ptr<strata::thread_pool> pool;
  if (c.threads > 1) pool = std::make_unique<strata::thread_pool>(c.threads, "train_mlp");
  rng r(c.seed);
  const dataset data = make_data(net, c.samples, r, pool.get());
  const std::vector<float> init = mlp_example::init_weights(net, r);
  const std::vector<strata::bf16> init_model = mlp_example::to_bf16(init);

  const strata::adamw_options adamw{.lr = c.lr, .weight_decay = c.weight_decay};

  // 1. Offloaded: the "strata" preset over two file paths and a host cache.
  using P = strata::presets::strata_preset;
  P::paths<strata::file_tier, strata::file_tier> tier(P::placement(), mlp_example::state_path(c.paths[0]),
                                                      mlp_example::state_path(c.paths[1]));
  P::optimizer<decltype(tier)> opt(tier, init, adamw, P::options(net.params, adamw, base));
  std::printf("train_mlp: MLP %s (%zu parameters, bf16), %zu samples, batch %zu, %zu epochs, %zu threads\n",
              net.describe().c_str(), net.params, c.samples, c.batch, c.epochs, c.threads);
  std::printf("offloaded AdamW (strata preset): %zu subgroups of %zu, host cache %zu subgroups, paths %s, %s\n",
              opt.subgroup_count(), base.subgroup_elems, opt.stats().cache_slots, c.paths[0].c_str(),
              c.paths[1].c_str());
  std::fflush(stdout);

  std::vector<strata::bf16> model = init_model;
  std::vector<strata::path_traffic> traffic;  // summed over the steps
  auto t0 = std::chrono::steady_clock::now();
  const auto losses =
      train(c, net, data, model, pool.get(), true, [&](auto grads, double lr, std::span<strata::bf16> out) {
        mlp_example::add_traffic(traffic, opt.step(grads, lr, out).paths);
      });
  const double offloaded_s = mlp_example::seconds_since(t0);
  const auto totals = opt.stats();
  std::printf("optimizer: %llu steps, cache hits %llu / misses %llu%s\n", static_cast<unsigned long long>(totals.steps),
              static_cast<unsigned long long>(totals.cache_hits), static_cast<unsigned long long>(totals.cache_misses),
              mlp_example::describe_traffic(traffic).c_str());

  // 2. In memory: adamw_update_cpu over the whole flat arrays; same init, data order, lr and gradients.
  mlp_example::in_memory_adamw ref(init, adamw, pool.get());
  std::vector<strata::bf16> ref_model = init_model;
  t0 = std::chrono::steady_clock::now();
  train(c, net, data, ref_model, pool.get(), false,
        [&](auto grads, double lr, std::span<strata::bf16> out) { ref.step(grads, lr, out); });
  mlp_example::print_times(offloaded_s, mlp_example::seconds_since(t0), model);
  const bool identical = mlp_example::bit_identical(opt, model, ref, ref_model);

  if (!c.keep) {  // our objects (the first that fails ends the run), then the directories if empty
    for (std::size_t s = 0; s < opt.subgroup_count(); ++s) tier.remove(opt.object_name(s));
    mlp_example::remove_empty_directories(c.paths);
  }
  const bool fell = mlp_example::loss_fell("train_mlp", losses);
  return identical && fell ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return mlp_example::example_main<config>(
      "train_mlp", usage(), argc, argv,
      [&](config& c) { mlp_example::parse_args(c, argc, argv, {"train_mlp-a", "train_mlp-b"}); }, run);
}
