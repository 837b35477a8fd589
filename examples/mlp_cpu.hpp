// mlp_cpu.hpp: the CPU forward and backward of the MLP examples (train_mlp, mpi_train), the data
// set and the loss, deterministic whatever the thread count: work is split by rows or samples,
// and every element sums its terms in a fixed order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <future>
#include <span>
#include <vector>

#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>

#include "mlp_common.hpp"

namespace mlp_example {

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
inline void load_model(const mlp_shape& net, std::span<const strata::bf16> model, workspace& ws) {
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
/// d loss / d output (loss: the MSE over `loss_batch` samples, by default this batch; a
/// data-parallel step passes its global batch) and returns the batch's sum of squared errors.
inline double forward(const mlp_shape& net, std::size_t batch, workspace& ws, strata::thread_pool* pool,
                      std::size_t loss_batch = 0) {
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
      const float scale = 2.0f / static_cast<float>((loss_batch ? loss_batch : batch) * outputs);
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
inline void backward(const mlp_shape& net, std::size_t batch, workspace& ws, strata::thread_pool* pool) {
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

inline dataset make_data(const mlp_shape& net, std::size_t samples, rng& r, strata::thread_pool* pool) {
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
inline double evaluate(const mlp_shape& net, const dataset& data, std::span<const strata::bf16> model, std::size_t batch,
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

}  // namespace mlp_example
