// Needs a GPU (label `cuda`): cuda_stream and cuda_executor pass the same stream and executor
// suites as the host models, and cuda_executor's updates, alone and inside offloaded_adamw (every
// site policy), give the CPU kernel's bits.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/exec/cuda_executor.cuh>
#include <strata/exec/cuda_stream.hpp>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/policy/lru.hpp>
#include <strata/tier/device_tier.hpp>
#include <strata/tier/host_tier.hpp>

#include "../exec/executor_suite.hpp"
#include "../exec/stream_suite.hpp"
#include "../offload/offload_test_support.hpp"

namespace {

struct pinned_buffer {
  explicit pinned_buffer(std::size_t n) : n_(n) { STRATA_CUDA_TRY(cudaHostAlloc(&p_, n, cudaHostAllocDefault)); }
  pinned_buffer(pinned_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  ~pinned_buffer() {
    if (p_ != nullptr) (void)cudaFreeHost(p_);
  }
  std::byte* data() { return static_cast<std::byte*>(p_); }
  std::span<std::byte> span() { return {data(), n_}; }
  void* p_ = nullptr;
  std::size_t n_;
};
struct device_memory {
  explicit device_memory(std::size_t n) : b(n) {}
  std::span<std::byte> span() { return {b.data(), b.size()}; }
  strata::cuda_device_buffer b;
};

struct cuda_stream_fixture {
  using stream_type = strata::cuda_stream;
  std::unique_ptr<stream_type> make(std::string name) { return std::make_unique<stream_type>(std::move(name)); }
  pinned_buffer host(std::size_t n) { return pinned_buffer(n); }
  device_memory device(std::size_t n) { return device_memory(n); }
};

// Streams someone else created (a framework's), wrapped without ownership: the same suite.
struct foreign_cuda_stream_fixture : cuda_stream_fixture {
  std::vector<cudaStream_t> raw;
  std::unique_ptr<stream_type> make(std::string name) {
    cudaStream_t st = nullptr;
    STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    raw.push_back(st);
    return stream_type::wrap(st, std::move(name));
  }
  foreign_cuda_stream_fixture() = default;
  foreign_cuda_stream_fixture(const foreign_cuda_stream_fixture&) = delete;
  foreign_cuda_stream_fixture& operator=(const foreign_cuda_stream_fixture&) = delete;
  ~foreign_cuda_stream_fixture() {
    for (auto st : raw) {
      (void)cudaStreamSynchronize(st);
      (void)cudaStreamDestroy(st);
    }
  }
};

struct traced_cuda_stream_fixture : cuda_stream_fixture {
  using stream_type = strata::traced<strata::cuda_stream>;
  strata::tracer trace;
  std::unique_ptr<stream_type> make(std::string name) { return std::make_unique<stream_type>(&trace, std::move(name)); }
};

__global__ void add_one_kernel(unsigned char* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<unsigned char>(p[i] + 1);
}

// cuda_executor on plain and on traced streams, for the executor suite.
template <class S>
struct cuda_executor_fixture {
  using executor_type = strata::basic_cuda_executor<S>;
  strata::tracer trace;
  std::unique_ptr<executor_type> make(std::string name, std::uint64_t device_memory) {
    strata::cuda_executor_options o{.name = std::move(name), .device_memory = device_memory};
    if constexpr (std::is_same_v<S, strata::cuda_stream>)
      return std::make_unique<executor_type>(o);
    else
      return std::make_unique<executor_type>(o, [this](strata::stream_role, const std::string& n, int device) {
        return std::make_unique<S>(&trace, n, device);
      });
  }
  void add_one(executor_type& ex, std::span<std::byte> dev) {
    ex.launch([&](cudaStream_t st) {
      add_one_kernel<<<64, 256, 0, st>>>(reinterpret_cast<unsigned char*>(dev.data()), dev.size());
      STRATA_CUDA_TRY(cudaGetLastError());
    });
  }
};

}  // namespace

STRATA_STREAM_SUITE_INVOKE(cuda_stream_fixture, foreign_cuda_stream_fixture, traced_cuda_stream_fixture);
STRATA_EXECUTOR_SUITE_INVOKE(cuda_executor_fixture<strata::cuda_stream>,
                             cuda_executor_fixture<strata::traced<strata::cuda_stream>>);

TEST_CASE("a wrapped foreign event orders strata's copy after the foreign kernel; strata destroys neither handle") {
  cudaStream_t producer = nullptr, consumer = nullptr;
  cudaEvent_t done = nullptr;
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  STRATA_CUDA_TRY(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  {
    const std::size_t n = std::size_t{1} << 24;
    strata::cuda_device_buffer dev(n);
    pinned_buffer host(n);
    STRATA_CUDA_TRY(cudaMemsetAsync(dev.data(), 41, n, producer));
    for (int i = 0; i < 8; ++i)  // long enough that an unordered copy would see 41
      add_one_kernel<<<64, 256, 0, producer>>>(reinterpret_cast<unsigned char*>(dev.data()), n);
    STRATA_CUDA_TRY(cudaGetLastError());
    STRATA_CUDA_TRY(cudaEventRecord(done, producer));
    {
      auto s = strata::cuda_stream::wrap(consumer, "consumer");
      CHECK_FALSE(s->owns_stream());
      const auto e = strata::cuda_event::wrap(done);
      CHECK_FALSE(e.owns_event());
      s->wait(e);
      s->copy_to_host(host.span(), std::span<const std::byte>(dev.data(), n));
      s->sync();
      CHECK(e.ready());
    }
    CHECK(static_cast<int>(host.data()[0]) == 49);
    CHECK(static_cast<int>(host.data()[n - 1]) == 49);
  }
  // Both handles are still valid: the wrappers released nothing.
  CHECK(cudaEventQuery(done) == cudaSuccess);
  CHECK(cudaStreamQuery(consumer) == cudaSuccess);
  CHECK(cudaEventDestroy(done) == cudaSuccess);
  CHECK(cudaStreamDestroy(consumer) == cudaSuccess);
  CHECK(cudaStreamDestroy(producer) == cudaSuccess);
}

TEST_CASE("a cuda_executor on traced streams measures the kernel on the compute stream") {
  using exec_t = strata::basic_cuda_executor<strata::traced<strata::cuda_stream>>;
  strata::tracer trace;
  exec_t exec({}, [&](strata::stream_role, const std::string& name, int device) {
    return std::make_unique<strata::traced<strata::cuda_stream>>(&trace, name, device);
  });
  const std::size_t n = 1 << 20;
  auto mem = exec.allocate_device(n * 16);
  auto* f = reinterpret_cast<float*>(mem.data());
  STRATA_CUDA_TRY(cudaMemset(mem.data(), 0, n * 16));
  const auto* grad = reinterpret_cast<const strata::bf16*>(f + 3 * n);
  strata::adamw_group<strata::bf16, strata::bf16> g{{f, n}, {f + n, n}, {f + 2 * n, n}, {}, {grad, n}, {}};
  const strata::adamw_step_params k{};
  strata::enqueue_adamw(exec, g, k);
  exec.compute().sync();
  CHECK(exec.compute().activity().operations == 1);
  CHECK(exec.compute().activity().busy_s > 0);
  CHECK(exec.h2d().activity().operations == 0);
}

TEST_CASE("offloaded_adamw on the GPU (every site policy) is bit-identical to AdamW on one flat array") {
  using namespace strata_test;
  const std::size_t n = 300'007, sg = 40'000;
  const auto init = random_params(n, 3);
  strata::adamw_options ao;
  ao.weight_decay = 0.01;
  strata::cuda_executor exec;
  auto run = [&](auto site) {
    strata::host_tier tier(strata::host_tier_options{.name = "host"});
    strata::offload_options off;
    off.subgroup_elems = sg;
    off.host_cache_bytes = 2 * strata::offload_layout::of(n, ao, off).slot_footprint();
    strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating, strata::cuda_executor,
                            decltype(site)>
        opt(tier, exec, init, ao, off, {}, {}, site);
    flat_reference ref(init, ao);
    for (int t = 0; t < 3; ++t) {
      const auto g = random_grads<strata::bf16>(n, static_cast<std::uint64_t>(t));
      std::vector<strata::bf16> out(n), ref_out(n);
      opt.step(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(out));
      ref.step(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(ref_out));
      CHECK(std::memcmp(out.data(), ref_out.data(), n * 2) == 0);
    }
    require_same_state(opt, ref);
  };
  run(strata::always_device{});
  run(strata::alternating_site{1, 1});
  run(strata::alternating_site{1, 3});
}

TEST_CASE("on the GPU, gradients and the model in device memory step as host ones do, for every site") {
  using namespace strata_test;
  const std::size_t n = 200'003, sg = 30'000;
  const auto init = random_params(n, 8);
  strata::adamw_options ao;
  strata::cuda_executor exec;
  auto grads_dev = exec.allocate_device(n * sizeof(strata::bf16));
  auto model_dev = exec.allocate_device(n * sizeof(strata::bf16));
  const strata::device_span<strata::bf16> dgrads(reinterpret_cast<strata::bf16*>(grads_dev.data()), n);
  const strata::device_span<strata::bf16> dmodel(reinterpret_cast<strata::bf16*>(model_dev.data()), n);
  strata::cuda_stream backward("backward");
  auto run = [&](auto site, bool norm) {
    strata::host_tier tier(strata::host_tier_options{.name = "host"});
    strata::offload_options off;
    off.subgroup_elems = sg;
    off.host_cache_bytes = 2 * strata::offload_layout::of(n, ao, off).slot_footprint();
    if (norm) {
      off.max_grad_norm = 0.05;
      off.loss_scaling.enabled = true;
      off.loss_scaling.init_scale = 256;
    }
    strata::offloaded_adamw<strata::host_tier, strata::lru, strata::alternating, strata::cuda_executor,
                            decltype(site)>
        opt(tier, exec, init, ao, off, {}, {}, site);
    scaled_reference ref(init, ao, sg, off);
    for (int t = 0; t < 3; ++t) {
      const auto raw = random_grads<float>(n, 90 + static_cast<std::uint64_t>(t));
      std::vector<strata::bf16> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = strata::bf16(raw[i] * opt.loss_scale());
      // "Backward" writes the gradients on its own stream; the optimizer waits for its event.
      backward.copy_to_device(dgrads.bytes(), std::as_bytes(std::span(g)));
      const auto ready = backward.record();
      for (std::size_t s = 0; s < opt.subgroup_count(); ++s)
        opt.accept_gradients(s, strata::device_span<const strata::bf16>(dgrads).subspan(opt.begin(s), opt.length(s)),
                             ready);
      opt.step(1e-3, dmodel);
      std::vector<strata::bf16> out(n), ref_out(n);
      STRATA_CUDA_TRY(cudaMemcpy(out.data(), dmodel.data(), n * 2, cudaMemcpyDeviceToHost));
      ref.step(std::span<const strata::bf16>(g), 1e-3, std::span<strata::bf16>(ref_out));
      CHECK(std::memcmp(out.data(), ref_out.data(), n * 2) == 0);
      require_same(opt, ref);
    }
    backward.sync();
  };
  for (const bool norm : {false, true}) {
    CAPTURE(norm);
    run(strata::always_host{}, norm);
    run(strata::always_device{}, norm);
    run(strata::alternating_site{1, 2}, norm);
  }
}

TEST_CASE("the run-time optimizer on the GPU takes a framework's gradient ranges after its foreign event") {
  using namespace strata_test;
  const std::size_t n = 250'001;
  strata::offloaded_adamw_config c;
  c.paths.resize(2);  // in host memory
  c.offload.subgroup_elems = 40'000;
  const auto init = random_params(n, 9);
  strata::cuda_executor exec;
  auto dev = strata::make_offloaded_adamw(c, exec, strata::alternating_site{1, 1}, init);
  auto host = strata::make_offloaded_adamw(c, init);
  auto grads_mem = exec.allocate_device(n * sizeof(strata::bf16));
  auto model_mem = exec.allocate_device(n * sizeof(strata::bf16));
  const strata::device_span<strata::bf16> dg(reinterpret_cast<strata::bf16*>(grads_mem.data()), n);
  const strata::device_span<strata::bf16> dm(reinterpret_cast<strata::bf16*>(model_mem.data()), n);
  cudaStream_t framework = nullptr;  // a framework's own stream and event, as torch's
  cudaEvent_t backward_done = nullptr;
  STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&framework, cudaStreamNonBlocking));
  STRATA_CUDA_TRY(cudaEventCreateWithFlags(&backward_done, cudaEventDisableTiming));
  for (int t = 0; t < 2; ++t) {
    const auto g = random_grads<strata::bf16>(n, 70 + static_cast<std::uint64_t>(t));
    STRATA_CUDA_TRY(cudaMemcpyAsync(dg.data(), g.data(), n * 2, cudaMemcpyHostToDevice, framework));
    STRATA_CUDA_TRY(cudaEventRecord(backward_done, framework));
    const auto ready = strata::cuda_event::wrap(backward_done);
    const strata::device_span<const strata::bf16> d(dg);
    dev.accept_gradients_at(0, d.subspan(0, 100'000), ready);  // parameter tensors across subgroups
    dev.accept_gradients_at(100'000, d.subspan(100'000, n - 100'000), ready);
    dev.step(1e-3, strata::device_model_span{dm});
    std::vector<strata::bf16> host_model(n), device_model(n);
    host.step(std::span<const strata::bf16>(g), 1e-3, strata::host_model_span{std::span<strata::bf16>(host_model)});
    STRATA_CUDA_TRY(cudaMemcpy(device_model.data(), dm.data(), n * 2, cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(device_model.data(), host_model.data(), n * 2) == 0);
  }
  std::vector<float> a(n), b(n);
  dev.read_master(a);
  host.read_master(b);
  CHECK(std::memcmp(a.data(), b.data(), n * 4) == 0);
  STRATA_CUDA_TRY(cudaStreamSynchronize(framework));
  CHECK(cudaEventDestroy(backward_done) == cudaSuccess);
  CHECK(cudaStreamDestroy(framework) == cudaSuccess);
}

TEST_CASE("device_tier<cuda_executor> keeps objects in GPU memory byte for byte, growth included") {
  static_assert(strata::tier<strata::device_tier<strata::cuda_executor>>);
  strata::device_tier<strata::cuda_executor> t(strata::device_tier_options{.name = "gpu", .capacity = 64 << 20},
                                               strata::cuda_executor_options{});
  std::vector<std::byte> expect;
  for (int i = 0; i < 6; ++i) {
    std::vector<std::byte> piece(100'000 + 4093 * static_cast<std::size_t>(i));
    for (std::size_t k = 0; k < piece.size(); ++k) piece[k] = static_cast<std::byte>((k * 31 + static_cast<std::size_t>(i)) >> 2);
    t.write("obj", expect.size(), piece).get();
    expect.insert(expect.end(), piece.begin(), piece.end());
    std::vector<std::byte> out(expect.size());
    t.read("obj", 0, out).get();
    CHECK(out == expect);
  }
  CHECK_THROWS_AS(t.write("big", 0, std::vector<std::byte>(65 << 20)).get(), strata::capacity_error);
  CHECK(t.remove("obj"));
  t.flush();
  CHECK(t.executor().device_used() == 0);
}
