// Needs a GPU (label `cuda`): cuda_stream passes the same stream suite as the host models, and
// cuda_executor's updates, alone and inside offloaded_adamw (every site policy), give the CPU
// kernel's bits.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <strata/exec/cuda_executor.cuh>
#include <strata/exec/cuda_stream.hpp>
#include <strata/offload/offloaded_adamw.hpp>
#include <strata/policy/lru.hpp>
#include <strata/tier/host_tier.hpp>

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

}  // namespace

STRATA_STREAM_SUITE_INVOKE(cuda_stream_fixture);

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
