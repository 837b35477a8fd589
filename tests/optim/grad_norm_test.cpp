// Gradient norms: the fixed reduction order (same bits for any threads, tiles, path), inf/NaN
// detection, the cross-subgroup accumulator, the step decision and the dynamic loss scaler.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "strata/optim/grad_norm.hpp"
#include "strata/optim/loss_scaler.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace grad_norm_test {

namespace {

// The documented order, written out plainly: 2048-element blocks, 8 lanes, a fixed tree per
// block, blocks added in order.
template <class G>
double sum_by_definition(const std::vector<G>& g, float scale) {
  double total = 0;
  for (std::size_t off = 0; off < g.size(); off += 2048) {
    double lane[8] = {};
    for (std::size_t i = off; i < std::min(g.size(), off + 2048); ++i) {
      const double u = static_cast<float>(static_cast<float>(g[i]) * scale);
      lane[(i - off) % 8] += u * u;
    }
    total += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  return total;
}

template <class G>
std::vector<G> random_grads(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> decade(-6, 3);
  std::vector<G> g(n);
  for (auto& x : g) x = G(normal(rng) * std::pow(10.0f, static_cast<float>(decade(rng))));
  return g;
}

std::vector<strata::cpu_isa> paths() {
  std::vector<strata::cpu_isa> p{strata::cpu_isa::portable};
  for (auto isa : {strata::cpu_isa::avx2, strata::cpu_isa::avx512})
    if (strata::cpu_supports(isa)) p.push_back(isa);
  return p;
}

}  // namespace

TEST_CASE_TEMPLATE("a subgroup's squared norm has the same bits for every path, thread count and tile", G, float,
                   strata::bf16, strata::fp16) {
  strata::thread_pool pool(3);
  for (std::size_t n : {0UL, 1UL, 7UL, 8UL, 9UL, 2047UL, 2048UL, 2049UL, 20003UL}) {
    const auto g = random_grads<G>(n, static_cast<std::uint32_t>(n));
    const double want = sum_by_definition(g, 0.125f);
    for (auto isa : paths())
      for (std::size_t tile : {1UL, 2048UL, 5000UL, 1UL << 16})
        for (strata::thread_pool* p : {static_cast<strata::thread_pool*>(nullptr), &pool}) {
          const auto s = strata::grad_stats_cpu(std::span<const G>(g), 0.125f, p, tile, isa);
          INFO("n=", n, " tile=", tile, " isa=", std::string(strata::to_string(isa)));
          REQUIRE(s.count == n);
          REQUIRE(s.sum_squares == want);  // exact equality: the order is fixed
          REQUIRE(s.finite());
        }
  }
}

TEST_CASE("an inf or NaN gradient, or an fp16 overflow, makes the sum non-finite on every path") {
  for (auto isa : paths()) {
    for (std::size_t at : {0UL, 5UL, 4095UL, 9999UL}) {
      auto g = random_grads<float>(10000, 3);
      g[at] = std::numeric_limits<float>::quiet_NaN();
      CHECK_FALSE(strata::grad_stats_cpu(std::span<const float>(g), 1.0f, nullptr, 1 << 16, isa).finite());
      g[at] = -std::numeric_limits<float>::infinity();
      CHECK_FALSE(strata::grad_stats_cpu(std::span<const float>(g), 1.0f, nullptr, 1 << 16, isa).finite());
      auto h = random_grads<strata::fp16>(10000, 4);
      h[at] = strata::fp16(70000.0f);  // overflows fp16: infinity, as a scaled-loss overflow produces
      CHECK_FALSE(strata::grad_stats_cpu(std::span<const strata::fp16>(h), 1.0f, nullptr, 1 << 16, isa).finite());
    }
  }
  // The largest finite values do not overflow the double sum.
  std::vector<float> big(5000, std::numeric_limits<float>::max());
  CHECK(strata::grad_stats_cpu(std::span<const float>(big)).finite());
}

TEST_CASE("the accumulator's total does not depend on the order or thread in which subgroups arrive") {
  std::vector<strata::grad_stats> parts;
  for (std::uint32_t i = 0; i < 64; ++i) {
    const auto g = random_grads<strata::bf16>(3000 + i, 100 + i);
    parts.push_back(strata::grad_stats_cpu(std::span<const strata::bf16>(g)));
  }
  strata::grad_norm_accumulator in_order;
  for (std::size_t i = 0; i < parts.size(); ++i) in_order.add(i, parts[i]);
  std::vector<std::size_t> order(parts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(9));
  strata::grad_norm_accumulator shuffled;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (std::size_t j = static_cast<std::size_t>(t); j < order.size(); j += 4) shuffled.add(order[j], parts[order[j]]);
    });
  for (auto& th : threads) th.join();
  CHECK(shuffled.subgroups() == 64);
  CHECK(shuffled.sum_squares() == in_order.sum_squares());
  CHECK(shuffled.norm() == std::sqrt(in_order.sum_squares()));
  CHECK_FALSE(shuffled.found_nonfinite());
  CHECK_THROWS_WITH_AS(shuffled.add(17, parts[17]), "grad_norm_accumulator: subgroup 17 added twice in one step",
                       strata::config_error);
  shuffled.reset();
  CHECK(shuffled.subgroups() == 0);
  CHECK(shuffled.norm() == 0);
}

TEST_CASE("the step decision skips on inf/NaN, clips above max_norm and leaves small norms alone") {
  strata::grad_norm_accumulator acc;
  acc.add(0, {9.0, 10});
  acc.add(1, {16.0, 10});  // norm 5
  auto d = strata::decide_step(acc);
  CHECK_FALSE(d.skip);
  CHECK(d.grad_norm == 5.0);
  CHECK(d.clip == 1.0f);
  d = strata::decide_step(acc, 1.0);
  CHECK(d.clip == doctest::Approx(0.2).epsilon(1e-6));
  CHECK(d.clip == 1.0f / (5.0f + 1e-6f));  // torch.nn.utils.clip_grad_norm_'s formula, in float
  d = strata::decide_step(acc, 10.0);
  CHECK(d.clip == 1.0f);
  acc.add(7, {std::numeric_limits<double>::infinity(), 1});
  d = strata::decide_step(acc, 1.0);
  CHECK(d.skip);
  CHECK(acc.found_nonfinite());
  CHECK(acc.nonfinite_subgroups() == std::vector<std::size_t>{7});
  CHECK_THROWS_AS((void)strata::clip_coefficient(1.0, 0.0), strata::config_error);
}

TEST_CASE("block sums of block-aligned pieces add up to the whole array's stats bit for bit") {
  const auto g = random_grads<strata::bf16>(5 * 2048 + 77, 41);
  const auto whole = strata::grad_stats_cpu(std::span<const strata::bf16>(g), 0.25f);
  std::vector<double> blocks(6);
  // Pieces of 2, 1 and 3 blocks (the last one short), summed in reverse order of arrival.
  const std::size_t cuts[] = {0, 2 * 2048, 3 * 2048, g.size()};
  for (int p = 2; p >= 0; --p) {
    const auto piece = std::span<const strata::bf16>(g).subspan(cuts[p], cuts[p + 1] - cuts[p]);
    strata::grad_block_sums_cpu(piece, 0.25f, std::span<double>(blocks).subspan(cuts[p] / 2048, (piece.size() + 2047) / 2048));
  }
  const auto pieced = strata::grad_stats_of_blocks(blocks, g.size());
  CHECK(pieced.count == whole.count);
  CHECK(std::memcmp(&pieced.sum_squares, &whole.sum_squares, sizeof(double)) == 0);
  CHECK(pieced.sum_squares == sum_by_definition(g, 0.25f));
  std::vector<double> wrong(2);
  CHECK_THROWS_AS(strata::grad_block_sums_cpu(std::span<const strata::bf16>(g), 1.0f, std::span<double>(wrong)),
                  strata::config_error);
}

TEST_CASE("the loss scaler backs off on inf/NaN, grows after growth_interval clean steps, as GradScaler") {
  strata::loss_scaler_options o;
  o.enabled = true;
  o.init_scale = 1024;
  o.growth_interval = 3;
  strata::dynamic_loss_scaler s(o);
  CHECK(s.scale() == 1024.0f);
  CHECK(s.inv_scale() == static_cast<float>(1.0 / 1024.0));
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 1024.0f);
  CHECK(s.growth_tracker() == 2);
  s.update(true);  // backoff resets the tracker
  CHECK(s.scale() == 512.0f);
  CHECK(s.growth_tracker() == 0);
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.scale() == 1024.0f);
  CHECK(s.growth_tracker() == 0);
  // A grown scale that would overflow a float is not taken (the tracker still resets).
  o.init_scale = 3e38;
  o.growth_interval = 1;
  strata::dynamic_loss_scaler big(o);
  big.update(false);
  CHECK(big.scale() == 3e38f);
  CHECK(big.growth_tracker() == 0);
  // A scale that would underflow to 0 stays at its smallest value instead.
  o.init_scale = std::numeric_limits<float>::denorm_min();
  strata::dynamic_loss_scaler tiny(o);
  tiny.update(true);
  CHECK(tiny.scale() == std::numeric_limits<float>::denorm_min());
  // A non-power-of-two factor rounds as float(scale * factor) in double, as ATen does.
  o = {};
  o.enabled = true;
  o.init_scale = 3;
  o.backoff_factor = 0.3;
  strata::dynamic_loss_scaler odd(o);
  odd.update(true);
  CHECK(odd.scale() == static_cast<float>(3.0 * 0.3));
  // Disabled: 1 forever.
  strata::dynamic_loss_scaler off;
  off.update(true);
  CHECK(off.scale() == 1.0f);
  CHECK(off.inv_scale() == 1.0f);
}

TEST_CASE("loss scaler options and restored state GradScaler would refuse are config_errors") {
  using edit = void (*)(strata::loss_scaler_options&);
  for (edit bad : std::initializer_list<edit>{[](strata::loss_scaler_options& o) { o.init_scale = 0; },
                   [](strata::loss_scaler_options& o) { o.init_scale = 1e300; },
                   [](strata::loss_scaler_options& o) { o.growth_factor = 1; },
                   [](strata::loss_scaler_options& o) { o.backoff_factor = 1; },
                   [](strata::loss_scaler_options& o) { o.backoff_factor = 0; },
                   [](strata::loss_scaler_options& o) { o.growth_interval = 0; }}) {
    strata::loss_scaler_options o;
    o.enabled = true;
    bad(o);
    CHECK_THROWS_AS(strata::dynamic_loss_scaler{o}, strata::config_error);
  }
  strata::loss_scaler_options o;
  o.enabled = true;
  o.growth_interval = 10;
  strata::dynamic_loss_scaler s(o);
  CHECK_THROWS_AS(s.restore(0.0f, 1), strata::config_error);
  CHECK_THROWS_AS(s.restore(8.0f, 10), strata::config_error);
  s.restore(8.0f, 9);
  CHECK(s.scale() == 8.0f);
  CHECK(s.growth_tracker() == 9);
}

}  // namespace grad_norm_test
