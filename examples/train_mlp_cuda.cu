// train_mlp_cuda: train_mlp on a GPU. The same MLP (teacher-student data, MSE loss, bf16
// weights), with forward and backward as CUDA kernels on a stream of their own; the bf16 weights
// and the gradients live in device memory.
//
// The optimizer is strata's offloaded AdamW on a cuda_executor, its fp32 state on two file paths
// behind a host cache. As backward finishes each layer (last layer first), the subgroups whose
// gradients are now complete are handed over with the stream's event (accept_gradients with a
// device_span returns at once: the copies run on the executor's d2h stream while backward goes
// on); step() then updates each subgroup on the CPU or the GPU (--site) and writes the updated
// weights into the model in device memory. The same training is repeated with the in-memory CPU
// kernel (adamw_update_cpu over the flat arrays) on the same GPU forward and backward, and the
// final state of both (bf16 weights, master weights, moments) must be bit-identical.
//
//   train_mlp_cuda --layers 4 --hidden 256 --epochs 20 --site alternating --path /nvme/mlp --path /pfs/mlp
//
// Determinism: no cuBLAS, no atomics, no reduction trees. Every kernel computes each output
// element in one thread that sums its terms in a fixed order in fp32, and the loss is summed per
// sample on the GPU, then over the samples in order on the host. A run gives the same bits every
// time, and both optimizers get the same gradients for as long as they hold the same weights.
// (The bits differ from train_mlp's CPU forward and backward: nvcc fuses multiply-adds.)
//
// Without a usable GPU it says so on one line and exits 77 (ctest: Skipped).
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <strata/core/cuda.hpp>
#include <strata/core/error.hpp>
#include <strata/core/half.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/exec/cuda_executor.cuh>
#include <strata/exec/cuda_stream.hpp>
#include <strata/exec/device_span.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/offload/presets.hpp>
#include <strata/optim/adamw_math.hpp>
#include <strata/policy/update_site.hpp>
#include <strata/tier/file_tier.hpp>

#include "mlp_common.hpp"

namespace {

constexpr int skipped_exit_code = 77;  // no GPU: ctest's SKIP_RETURN_CODE

using mlp_example::mlp_shape;
using mlp_example::rng;

/// The --help text.
std::string usage() {
  return fmt::format(
      "usage: train_mlp_cuda [options]\n"
      "Trains an MLP (teacher-student data, MSE loss) on a GPU: bf16 weights and gradients in device\n"
      "memory, forward and backward as CUDA kernels, strata's offloaded AdamW on a cuda_executor\n"
      "(gradients handed over from device memory per subgroup as backward produces them, updates on\n"
      "the CPU and/or the GPU). Then trains again, on the same GPU forward and backward, with the\n"
      "in-memory CPU AdamW, and checks that both end bit-identical.\n"
      "{}; 77: no usable CUDA device.\n"
      "{}"
      "  --site WHERE      where subgroups are updated: host (the CPU kernel), device (the CUDA\n"
      "                    kernel) or alternating (every other subgroup on each); default alternating\n"
      "  --path DIR        a directory for the optimizer state (give two); default: two in a new\n"
      "                    temporary directory\n"
      "  --threads N       CPU threads of the update kernels; default: all CPUs\n"
      "{}",
      mlp_example::help_exit_codes, mlp_example::help_model_options, mlp_example::help_run_options);
}

/// The shared options (without --path: two in a temporary directory), and --site.
struct config : mlp_example::config {
  std::string site_name = "alternating";
  strata::alternating_site site{1, 1};
};

/// --site: host and device put every update there; alternating, every other one.
void parse_site(config& c, std::string_view opt, const std::string& text) {
  if (text == "host") c.site = {1, 0};
  else if (text == "device") c.site = {0, 1};
  else if (text == "alternating") c.site = {1, 1};
  else mlp_example::bad_usage(fmt::format("{} is '{}'; expected host, device or alternating", opt, text));
  c.site_name = text;
}

/// The command line: the shared options, and --site.
void parse_args(config& c, int argc, char** argv) {
  mlp_example::parse_args(c, argc, argv, {}, [&c](std::string_view opt, auto& value) {
    if (opt != "--site") return false;
    parse_site(c, opt, value());
    return true;
  });
}

// --- the kernels: one thread per output element, its terms summed in a fixed order --------------

__device__ std::size_t first_index() { return std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; }
__device__ std::size_t grid_stride() { return std::size_t{gridDim.x} * blockDim.x; }

/// dst[b] = src[index[b]] for `rows` rows of `width` floats.
__global__ void gather_rows(const float* src, const std::uint32_t* index, std::size_t rows, std::size_t width,
                            float* dst) {
  for (std::size_t k = first_index(); k < rows * width; k += grid_stride())
    dst[k] = src[std::size_t{index[k / width]} * width + k % width];
}

/// y[b][o] = bias[o] + sum over i (in order) of x[b][i] W[i][o]; tanh of it on hidden layers.
__global__ void linear_forward(const strata::bf16* w, const float* x, std::size_t batch, std::size_t in,
                               std::size_t out, bool hidden, float* y) {
  for (std::size_t k = first_index(); k < batch * out; k += grid_stride()) {
    const std::size_t b = k / out, o = k % out;
    float z = static_cast<float>(w[in * out + o]);
    for (std::size_t i = 0; i < in; ++i) z += x[b * in + i] * static_cast<float>(w[i * out + o]);
    y[k] = hidden ? tanhf(z) : z;
  }
}

/// The batch's MSE: d[b][o] = scale (y - t), the d loss / d output of backward, and each
/// sample's sum of squared errors (in double, outputs in order) in sample_sq[b].
__global__ void mse_delta(const float* y, const float* t, std::size_t batch, std::size_t out, float scale, float* d,
                          double* sample_sq) {
  for (std::size_t b = first_index(); b < batch; b += grid_stride()) {
    double sum = 0;
    for (std::size_t o = 0; o < out; ++o) {
      const float e = y[b * out + o] - t[b * out + o];
      sum += static_cast<double>(e) * e;
      d[b * out + o] = scale * e;
    }
    sample_sq[b] = sum;
  }
}

/// One layer's gradients, rounded to bf16: dW[i][o] = sum over samples (in order) of x[b][i] d[b][o]
/// (rows i < in), then the biases' sum of d[b][o] (row in), laid out as the parameters are.
__global__ void linear_grad(const float* x, const float* d, std::size_t batch, std::size_t in, std::size_t out,
                            strata::bf16* g) {
  for (std::size_t k = first_index(); k < (in + 1) * out; k += grid_stride()) {
    const std::size_t i = k / out, o = k % out;
    float s = 0;
    if (i < in)
      for (std::size_t b = 0; b < batch; ++b) s += x[b * in + i] * d[b * out + o];
    else
      for (std::size_t b = 0; b < batch; ++b) s += d[b * out + o];
    g[k] = strata::bf16(s);
  }
}

/// The previous layer's delta: dp[b][i] = (sum over o, in order, of W[i][o] d[b][o]) (1 - x[b][i]^2),
/// x being this layer's input (the previous layer's tanh output).
__global__ void linear_backward_input(const strata::bf16* w, const float* x, const float* d, std::size_t batch,
                                      std::size_t in, std::size_t out, float* dp) {
  for (std::size_t k = first_index(); k < batch * in; k += grid_stride()) {
    const std::size_t b = k / in, i = k % in;
    float s = 0;
    for (std::size_t o = 0; o < out; ++o) s += static_cast<float>(w[i * out + o]) * d[b * out + o];
    dp[k] = s * (1.0f - x[k] * x[k]);
  }
}

// --- device memory and the GPU side of training --------------------------------------------------

/// n elements of T in device memory (cudaMalloc; uninitialized).
template <class T>
class device_array {
 public:
  explicit device_array(std::size_t n) : n_(n), memory_(n * sizeof(T)) {}
  [[nodiscard]] T* data() noexcept { return reinterpret_cast<T*>(memory_.data()); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] strata::device_span<T> span() noexcept { return {data(), n_}; }

 private:
  std::size_t n_;
  strata::cuda_device_buffer memory_;
};

/// Forward and backward of the MLP for up to `batch` samples at a time, on one CUDA stream.
/// Calls enqueue work and return at once, except those that hand results to the host (they wait
/// for the stream and rethrow its errors). Copies from pageable host memory are staged before
/// cudaMemcpyAsync returns, so the source may change right after an upload.
class gpu_mlp {
 public:
  gpu_mlp(const mlp_shape& net, std::size_t batch)
      : net_(net), stream_("train_mlp_cuda.backprop", 0), sample_sq_(batch) {
    for (std::size_t l = 0; l < net.layers(); ++l) {
      act_.emplace_back(batch * net.widths[l + 1]);
      delta_.emplace_back(batch * net.widths[l + 1]);
    }
  }

  /// The stream of forward and backward (backward's events are recorded on it).
  [[nodiscard]] strata::cuda_stream& stream() noexcept { return stream_; }

  template <class T>
  void upload(device_array<T>& dst, std::span<const T> src) {
    stream_.copy_to_device(dst.span().subspan(0, src.size()).bytes(), std::as_bytes(src));
  }
  /// Waits for the stream, then copies `src` (device memory) into `dst`.
  template <class T>
  void download(std::span<T> dst, strata::device_span<const T> src) {
    stream_.copy_to_host(std::as_writable_bytes(dst), src.bytes());
    stream_.sync();
  }

  /// dst[b] = src[index[b]] for `rows` rows of `width` floats (all device memory).
  void gather(const float* src, const std::uint32_t* index, std::size_t rows, std::size_t width, float* dst) {
    launch(gather_rows, rows * width, src, index, rows, width, dst);
  }

  /// Forward of n samples (n x inputs floats at x) with the weights w (all device memory).
  void forward(const strata::bf16* w, const float* x, std::size_t n) {
    x_ = x;
    n_ = n;
    for (std::size_t l = 0; l < net_.layers(); ++l) {
      const std::size_t in = net_.widths[l], out = net_.widths[l + 1];
      launch(linear_forward, n * out, w + net_.offset[l], input(l), n, in, out, l + 1 < net_.layers(), act_[l].data());
    }
  }

  /// The MSE of the last forward against the targets t (n x outputs floats, device memory).
  void loss(const float* t) {
    const std::size_t out = net_.widths.back();
    const float scale = 2.0f / static_cast<float>(n_ * out);
    launch(mse_delta, n_, act_.back().data(), t, n_, out, scale, delta_.back().data(), sample_sq_.data());
  }

  /// Waits: the last loss()'s sum of squared errors, summed over the samples in order.
  double sum_sq() {
    std::vector<double> per_sample(n_);
    download(std::span<double>(per_sample), strata::device_span<const double>(sample_sq_.data(), n_));
    double sum = 0;
    for (double s : per_sample) sum += s;
    return sum;
  }

  /// Waits: copies the last forward's outputs (n x outputs) into `out`.
  void outputs(std::span<float> out) {
    download(out, strata::device_span<const float>(act_.back().data(), n_ * net_.widths.back()));
  }

  /// Backward from the last loss() into `grads` (bf16, every parameter), last layer first. After
  /// each layer's gradients are enqueued, layer_done(the layer's first parameter): the gradients
  /// of every parameter from there on are then enqueued.
  template <class LayerDone>
  void backward(const strata::bf16* w, strata::bf16* grads, LayerDone&& layer_done) {
    for (std::size_t l = net_.layers(); l-- > 0;) {
      const std::size_t in = net_.widths[l], out = net_.widths[l + 1];
      launch(linear_grad, (in + 1) * out, input(l), delta_[l].data(), n_, in, out, grads + net_.offset[l]);
      layer_done(net_.offset[l]);
      if (l > 0)
        launch(linear_backward_input, n_ * in, w + net_.offset[l], input(l), delta_[l].data(), n_, in, out,
               delta_[l - 1].data());
    }
  }

 private:
  static constexpr unsigned block_threads = 256;
  static constexpr std::size_t max_blocks = 4096;  // the kernels loop over the rest (grid stride)

  template <class... Params, class... Args>
  void launch(void (*kernel)(Params...), std::size_t n, Args... args) {
    if (n == 0) return;
    const auto blocks = static_cast<unsigned>(std::min((n + block_threads - 1) / block_threads, max_blocks));
    kernel<<<blocks, block_threads, 0, stream_.native()>>>(args...);
    STRATA_CUDA_TRY(cudaGetLastError());  // a launch that failed to start
  }

  [[nodiscard]] const float* input(std::size_t l) { return l == 0 ? x_ : act_[l - 1].data(); }

  const mlp_shape& net_;
  strata::cuda_stream stream_;
  std::vector<device_array<float>> act_;    // act_[l]: layer l's outputs (after tanh on hidden layers)
  std::vector<device_array<float>> delta_;  // delta_[l]: d loss / d layer l's outputs before tanh
  device_array<double> sample_sq_;
  const float* x_ = nullptr;  // the last forward's inputs
  std::size_t n_ = 0;         // and its samples
};

/// The synthetic data set in device memory: inputs uniform with unit variance, targets from the
/// teacher, scaled to a mean square of 1 (so predicting zeros scores a loss of 1).
struct dataset {
  std::size_t samples;
  device_array<float> inputs, targets;
};

dataset make_data(const mlp_shape& net, const config& c, rng& r, gpu_mlp& gpu) {
  const std::size_t in = net.widths.front(), out = net.widths.back();
  dataset ds{c.samples, device_array<float>(c.samples * in), device_array<float>(c.samples * out)};
  const auto drawn = mlp_example::draw_teacher_data(net, c.samples, r);
  gpu.upload(ds.inputs, std::span<const float>(drawn.inputs));
  device_array<strata::bf16> w(net.params);
  gpu.upload(w, std::span<const strata::bf16>(drawn.teacher));
  std::vector<float> targets(c.samples * out);
  for (std::size_t first = 0; first < c.samples; first += c.batch) {
    const std::size_t n = std::min(c.batch, c.samples - first);
    gpu.forward(w.data(), ds.inputs.data() + first * in, n);
    gpu.outputs(std::span<float>(targets).subspan(first * out, n * out));
  }
  const float scale = mlp_example::unit_mean_square_scale(targets);
  for (auto& t : targets) t *= scale;
  gpu.upload(ds.targets, std::span<const float>(targets));
  gpu.stream().sync();  // (w goes now)
  return ds;
}

/// The loss of the weights w (device memory) on the whole data set (mean over samples and
/// outputs), a batch at a time.
double evaluate(const mlp_shape& net, dataset& data, const strata::bf16* w, std::size_t batch, gpu_mlp& gpu) {
  const std::size_t in = net.widths.front(), out = net.widths.back();
  double sum = 0;
  for (std::size_t first = 0; first < data.samples; first += batch) {
    gpu.forward(w, data.inputs.data() + first * in, std::min(batch, data.samples - first));
    gpu.loss(data.targets.data() + first * out);
    sum += gpu.sum_sq();
  }
  return sum / static_cast<double>(data.samples * out);
}

/// Trains the bf16 weights w (device memory) for c.epochs, backward writing the gradients into
/// `grads` (device memory): layer_done(first) is backward's (see gpu_mlp::backward), update(lr)
/// the optimizer's step, which leaves the updated weights in w. Returns (and with `print` prints)
/// the loss on the data set before training and after each epoch.
template <class LayerDone, class Update>
std::vector<double> train(const config& c, const mlp_shape& net, dataset& data, gpu_mlp& gpu, strata::bf16* w,
                          strata::bf16* grads, bool print, LayerDone&& layer_done, Update&& update) {
  const std::size_t in = net.widths.front(), out = net.widths.back();
  device_array<float> batch_x(c.batch * in), batch_t(c.batch * out);
  device_array<std::uint32_t> order(c.samples);  // the current epoch's
  return mlp_example::train_epochs(
      c, print, [&] { return evaluate(net, data, w, c.batch, gpu); },
      [&](std::span<const std::uint32_t> epoch_order) { gpu.upload(order, epoch_order); },
      [&](std::size_t s, double lr) {
        const std::uint32_t* index = order.data() + s * c.batch;
        gpu.gather(data.inputs.data(), index, c.batch, in, batch_x.data());
        gpu.gather(data.targets.data(), index, c.batch, out, batch_t.data());
        gpu.forward(w, batch_x.data(), c.batch);
        gpu.loss(batch_t.data());
        gpu.backward(w, grads, layer_done);
        update(lr);
      });
}

/// Runs `f` when the scope ends (cleanup on every way out).
template <class F>
class at_exit {
 public:
  explicit at_exit(F f) : f_(std::move(f)) {}
  at_exit(const at_exit&) = delete;
  at_exit& operator=(const at_exit&) = delete;
  ~at_exit() { f_(); }

 private:
  F f_;
};

/// The directories of the optimizer state: the two --path ones, or two in a temporary directory
/// made for this run. Unless `keep`, each is removed at the end if it is empty, and so is the
/// temporary directory (never anything else).
class state_dirs {
 public:
  state_dirs(std::vector<std::filesystem::path> given, bool keep) : paths_(std::move(given)), keep_(keep) {
    if (!paths_.empty()) return;
    std::string name = (std::filesystem::temp_directory_path() / "train_mlp_cuda-XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr) throw strata::io_error("mkdtemp", name, errno);
    temp_ = name;
    paths_ = {temp_ / "a", temp_ / "b"};
  }
  state_dirs(const state_dirs&) = delete;
  state_dirs& operator=(const state_dirs&) = delete;
  ~state_dirs() {
    if (keep_) return;
    mlp_example::remove_empty_directories(paths_);
    if (!temp_.empty()) mlp_example::remove_empty_directories(std::span(&temp_, 1));
  }
  [[nodiscard]] const std::filesystem::path& operator[](std::size_t i) const { return paths_[i]; }

 private:
  std::vector<std::filesystem::path> paths_;
  std::filesystem::path temp_;
  bool keep_;
};

int run(const config& c) {
  if (const auto gpus = strata::cuda_devices(); gpus.devices == 0) {
    std::printf("train_mlp_cuda: no CUDA device; skipped (%s)\n", gpus.reason.c_str());
    return skipped_exit_code;
  }
  const mlp_shape net(c);
  const strata::offload_options base = mlp_example::offload_base(c, net.params);

  STRATA_CUDA_TRY(cudaSetDevice(0));
  cudaDeviceProp device{};
  STRATA_CUDA_TRY(cudaGetDeviceProperties(&device, 0));
  const state_dirs dirs(c.paths, c.keep);
  std::unique_ptr<strata::thread_pool> pool;  // the in-memory update's threads
  if (c.threads > 1) pool = std::make_unique<strata::thread_pool>(c.threads, "train_mlp_cuda");
  gpu_mlp gpu(net, c.batch);
  rng r(c.seed);
  dataset data = make_data(net, c, r, gpu);
  const std::vector<float> init = mlp_example::init_weights(net, r);
  const std::vector<strata::bf16> init_model = mlp_example::to_bf16(init);
  device_array<strata::bf16> grads(net.params);  // backward's, for both runs

  const strata::adamw_options adamw{.lr = c.lr, .weight_decay = c.weight_decay};

  // 1. Offloaded: the "strata" preset over two file paths and a host cache, updates where --site
  //    says, gradients and weights in device memory.
  // doc-snippet: gpu_optimizer
  using P = strata::presets::strata_preset;
  using tier_t = P::paths<strata::file_tier, strata::file_tier>;
  using optimizer_t =
      strata::offloaded_adamw<tier_t, P::eviction, P::order, strata::cuda_executor, strata::alternating_site>;
  tier_t tier(P::placement(), mlp_example::state_path(dirs[0]), mlp_example::state_path(dirs[1]));
  strata::cuda_executor exec;  // device 0, its own h2d, compute and d2h streams
  optimizer_t opt(tier, exec, init, adamw, P::options(net.params, adamw, base), {}, {}, c.site);
  // doc-snippet-end
  const at_exit remove_state([&] {  // our objects (then state_dirs removes the directories if empty)
    if (c.keep) return;
    for (std::size_t s = 0; s < opt.subgroup_count(); ++s) try {
        tier.remove(opt.object_name(s));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "train_mlp_cuda: %s\n", e.what());
      }
  });
  std::printf("train_mlp_cuda: MLP %s (%zu parameters, bf16) on %s, %zu samples, batch %zu, %zu epochs\n",
              net.describe().c_str(), net.params, device.name, c.samples, c.batch, c.epochs);
  std::printf("offloaded AdamW (strata preset, cuda_executor): %zu subgroups of %zu, updates on %s, host cache %zu "
              "subgroups, %zu CPU threads, paths %s, %s\n",
              opt.subgroup_count(), base.subgroup_elems, c.site_name.c_str(), opt.stats().cache_slots, c.threads,
              dirs[0].c_str(), dirs[1].c_str());
  std::fflush(stdout);

  device_array<strata::bf16> model(net.params);
  gpu.upload(model, std::span<const strata::bf16>(init_model));
  const strata::device_span<const strata::bf16> device_grads(grads.data(), net.params);
  // Subgroups [handed, count) have their gradients handed over in this step; backward completes
  // them from the last one down.
  // doc-snippet: gpu_hand_over
  std::size_t handed = opt.subgroup_count();
  const auto hand_over = [&](std::size_t first) {  // backward has finished every gradient from `first` on
    if (handed == 0 || opt.begin(handed - 1) < first) return;  // none complete yet
    const auto ready = gpu.stream().record();
    for (; handed > 0 && opt.begin(handed - 1) >= first; --handed)  // returns at once; D2H after `ready`
      opt.accept_gradients(handed - 1, device_grads.subspan(opt.begin(handed - 1), opt.length(handed - 1)), ready);
  };
  // doc-snippet-end
  std::size_t device_updates = 0, host_updates = 0;
  std::vector<strata::path_traffic> traffic;  // summed over the steps
  auto t0 = std::chrono::steady_clock::now();
  const auto losses = train(c, net, data, gpu, model.data(), grads.data(), true, hand_over, [&](double lr) {
    // doc-snippet: gpu_step
    const auto st = opt.step(lr, model.span());  // returns with the updated weights in `model`
    // doc-snippet-end
    handed = opt.subgroup_count();
    device_updates += st.device_updates;
    host_updates += st.subgroups - st.device_updates;
    mlp_example::add_traffic(traffic, st.paths);
  });
  const double offloaded_s = mlp_example::seconds_since(t0);
  const auto totals = opt.stats();
  std::printf("optimizer: %llu steps, subgroup updates on the GPU %zu / on the CPU %zu, cache hits %llu / misses "
              "%llu%s\n",
              static_cast<unsigned long long>(totals.steps), device_updates, host_updates,
              static_cast<unsigned long long>(totals.cache_hits), static_cast<unsigned long long>(totals.cache_misses),
              mlp_example::describe_traffic(traffic).c_str());

  // 2. In memory: adamw_update_cpu over the whole flat arrays on the host, with the same GPU
  //    forward and backward; same init, data order, lr and (so long as the weights agree) gradients.
  mlp_example::in_memory_adamw ref(init, adamw, pool.get());
  std::vector<strata::bf16> ref_model = init_model, ref_grads(net.params);
  device_array<strata::bf16> ref_device(net.params);
  gpu.upload(ref_device, std::span<const strata::bf16>(ref_model));
  t0 = std::chrono::steady_clock::now();
  train(c, net, data, gpu, ref_device.data(), grads.data(), false, [](std::size_t) {}, [&](double lr) {
    gpu.download(std::span<strata::bf16>(ref_grads), device_grads);  // waits for backward
    ref.step(ref_grads, lr, ref_model);
    gpu.upload(ref_device, std::span<const strata::bf16>(ref_model));
  });
  const double in_memory_s = mlp_example::seconds_since(t0);

  std::vector<strata::bf16> final_model(net.params);
  gpu.download(std::span<strata::bf16>(final_model), strata::device_span<const strata::bf16>(model.span()));
  mlp_example::print_times(offloaded_s, in_memory_s, final_model);
  const bool identical = mlp_example::bit_identical(opt, final_model, ref, ref_model);
  const bool fell = mlp_example::loss_fell("train_mlp_cuda", losses);
  return identical && fell ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return mlp_example::example_main<config>(
      "train_mlp_cuda", usage(), argc, argv, [&](config& c) { parse_args(c, argc, argv); }, run);
}
