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
#include "mlp_cpu.hpp"

namespace {

using mlp_example::config;
using mlp_example::dataset;
using mlp_example::mlp_shape;
using mlp_example::rng;
using mlp_example::workspace;

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
