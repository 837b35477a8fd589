#pragma once
// The executor contract (exec/executor.hpp) as one typed doctest suite, and AdamW on executors
// (offload/adamw_device.hpp). A fixture provides:
//   using executor_type;
//   std::unique_ptr<executor_type> make(std::string name, std::uint64_t device_memory);
//   void add_one(executor_type&, std::span<std::byte> device): enqueue on compute a kernel that
//     adds 1 (mod 256) to every byte of `device` (device memory of the executor).
// The host models run it in executor_test.cpp (plain, paced, jittered, several kernel threads);
// cuda_executor in tests/cuda/exec_cuda_test.cu on a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/core/half.hpp>
#include <strata/core/host_memory.hpp>
#include <strata/exec/executor.hpp>
#include <strata/offload/adamw_device.hpp>
#include <strata/optim/adamw_cpu.hpp>

namespace strata_test {

// Host memory of the kind an executor's copies want (pinned for CUDA), filled from `bytes`.
template <class Exec>
strata::host_allocation staged(const Exec& exec, std::span<const std::byte> bytes) {
  strata::host_allocation a(bytes.size(), strata::resolve_host_memory(exec.staging()));
  if (!bytes.empty()) std::memcpy(a.data(), bytes.data(), bytes.size());
  return a;
}

}  // namespace strata_test

TEST_CASE_TEMPLATE_DEFINE("an executor's device memory stays within its budget and goes back when freed", F,
                          executor_budget) {
  F fx;
  auto ex = fx.make("budgeted", 3 * 4096);
  CHECK(ex->device_budget() == 3 * 4096);
  CHECK(ex->device_used() == 0);
  {
    auto a = ex->allocate_device(4096);
    auto b = ex->allocate_device(4096);
    CHECK(a.size() == 4096);
    CHECK(ex->device_used() == 2 * 4096);
    // More than is left is a capacity_error that names the executor; nothing is charged for it.
    CHECK_THROWS_WITH_AS((void)ex->allocate_device(2 * 4096), doctest::Contains("'budgeted'"), strata::capacity_error);
    CHECK(ex->device_used() == 2 * 4096);
    a = {};
    CHECK(ex->device_used() == 4096);
    auto c = ex->allocate_device(2 * 4096);  // now it fits
    CHECK(ex->device_used() == 3 * 4096);
  }
  CHECK(ex->device_used() == 0);
}

TEST_CASE_TEMPLATE_DEFINE("an executor has three distinct streams named after it", F, executor_streams) {
  F fx;
  auto ex = fx.make("three", strata::unlimited_capacity);
  CHECK(&ex->h2d() != &ex->compute());
  CHECK(&ex->compute() != &ex->d2h());
  CHECK(&ex->h2d() != &ex->d2h());
  CHECK(std::string(ex->name()) == "three");
  CHECK(std::string(ex->h2d().name()) == "three.h2d");
  CHECK(std::string(ex->compute().name()) == "three.compute");
  CHECK(std::string(ex->d2h().name()) == "three.d2h");
}

TEST_CASE_TEMPLATE_DEFINE("copy in, kernel, copy out, chained by events, give each buffer's bytes plus one", F,
                          executor_chain) {
  F fx;
  auto ex = fx.make("chain", strata::unlimited_capacity);
  // Several rounds in flight at once: round k's copy in overlaps round k-1's kernel, and so on.
  constexpr int rounds = 4;
  const std::size_t n = (std::size_t{1} << 20) + 3;
  std::vector<std::vector<std::byte>> inputs;
  std::vector<strata::host_allocation> in, out;
  std::vector<typename F::executor_type::device_buffer> dev;
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::byte> bytes(n);
    std::mt19937 rng(static_cast<unsigned>(r));
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    in.push_back(strata_test::staged(*ex, bytes));
    out.push_back(strata_test::staged(*ex, std::vector<std::byte>(n)));
    dev.push_back(ex->allocate_device(n));
    inputs.push_back(std::move(bytes));
  }
  for (int r = 0; r < rounds; ++r) {
    const std::span<std::byte> d(dev[r].data(), n);
    ex->h2d().copy_to_device(d, std::span<const std::byte>(in[r].data(), n));
    ex->compute().wait(ex->h2d().record());
    fx.add_one(*ex, d);
    ex->d2h().wait(ex->compute().record());
    ex->d2h().copy_to_host(std::span<std::byte>(out[r].data(), n), d);
  }
  ex->d2h().sync();
  for (int r = 0; r < rounds; ++r) {
    CAPTURE(r);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i)
      wrong += out[r].data()[i] != static_cast<std::byte>(static_cast<unsigned>(inputs[r][i]) + 1u);
    CHECK(wrong == 0);
  }
}

// AdamW on the executor's device memory: the state and gradients copied in, enqueue_adamw, the
// state and the model copy copied out; bit for bit what adamw_update_cpu gives.
template <class F, class G, class H>
void check_adamw_matches_cpu() {
  F fx;
  auto ex = fx.make("adamw", strata::unlimited_capacity);
  const std::size_t n = 10'007;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> state(4 * n);  // p | m | v | vmax
  std::vector<G> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    state[i] = d(rng);
    state[n + i] = d(rng) * 1e-2f;
    state[2 * n + i] = std::abs(d(rng)) * 1e-3f;
    state[3 * n + i] = state[2 * n + i];
    g[i] = G(d(rng) * 1e-2f);
  }
  strata::adamw_options o;
  o.amsgrad = true;
  o.weight_decay = 0.01;
  const auto k = strata::make_adamw_step_params(o, 3, 1e-3);
  auto ref = state;
  std::vector<H> ref_out(n);
  float* r = ref.data();
  strata::adamw_update_cpu<G, H>({r, n}, {r + n, n}, {r + 2 * n, n}, {r + 3 * n, n}, g, ref_out, k);

  const std::size_t state_bytes = 4 * n * sizeof(float), grad_bytes = n * sizeof(G), out_bytes = n * sizeof(H);
  auto dev = ex->allocate_device(state_bytes + grad_bytes + out_bytes);
  const std::span<std::byte> all(dev.data(), state_bytes + grad_bytes + out_bytes);
  auto in_state = strata_test::staged(*ex, std::as_bytes(std::span(state)));
  auto in_grad = strata_test::staged(*ex, std::as_bytes(std::span(g)));
  ex->h2d().copy_to_device(all.first(state_bytes), std::span<const std::byte>(in_state.data(), state_bytes));
  ex->h2d().copy_to_device(all.subspan(state_bytes, grad_bytes), std::span<const std::byte>(in_grad.data(), grad_bytes));
  ex->compute().wait(ex->h2d().record());
  auto* f = reinterpret_cast<float*>(all.data());
  auto* dg = reinterpret_cast<const G*>(all.data() + state_bytes);
  auto* dout = reinterpret_cast<H*>(all.data() + state_bytes + grad_bytes);
  strata::enqueue_adamw(*ex, strata::adamw_group<G, H>{{f, n}, {f + n, n}, {f + 2 * n, n}, {f + 3 * n, n}, {dg, n}, {dout, n}},
                        k);
  ex->d2h().wait(ex->compute().record());
  auto back = strata_test::staged(*ex, std::vector<std::byte>(state_bytes + out_bytes));
  ex->d2h().copy_to_host(std::span<std::byte>(back.data(), state_bytes), all.first(state_bytes));
  ex->d2h().copy_to_host(std::span<std::byte>(back.data() + state_bytes, out_bytes),
                         all.subspan(state_bytes + grad_bytes, out_bytes));
  ex->d2h().sync();
  CHECK(std::memcmp(back.data(), ref.data(), state_bytes) == 0);
  CHECK(std::memcmp(back.data() + state_bytes, ref_out.data(), out_bytes) == 0);
}

TEST_CASE_TEMPLATE_DEFINE("enqueue_adamw gives adamw_update_cpu's bits for every gradient and model type", F,
                          executor_adamw) {
  check_adamw_matches_cpu<F, float, strata::bf16>();
  check_adamw_matches_cpu<F, strata::bf16, strata::bf16>();
  check_adamw_matches_cpu<F, strata::fp16, strata::fp16>();
}

#define STRATA_EXECUTOR_SUITE_INVOKE(...)                  \
  TEST_CASE_TEMPLATE_INVOKE(executor_budget, __VA_ARGS__);  \
  TEST_CASE_TEMPLATE_INVOKE(executor_streams, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(executor_chain, __VA_ARGS__);   \
  TEST_CASE_TEMPLATE_INVOKE(executor_adamw, __VA_ARGS__)
