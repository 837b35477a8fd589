#pragma once
// Shared helpers of the offload tests: an in-memory AdamW reference over one flat array (the
// optim kernels, nothing else), one with clipping and loss scaling (adamw_step_cpu),
// deterministic parameters and gradients, tier stacks.
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <strata/strata.hpp>

#include "../tier/tier_fixtures.hpp"

namespace strata_test {

/// AdamW on one flat array: the optim kernel of the AdamW issue, called once per step over
/// every parameter. What offloaded_adamw must equal bit for bit.
struct flat_reference {
  std::vector<float> p, m, v, vmax;
  strata::adamw_options o;
  std::int64_t steps = 0;

  flat_reference(std::span<const float> init, strata::adamw_options opts)
      : p(init.begin(), init.end()), m(init.size(), 0.0f), v(init.size(), 0.0f),
        vmax(opts.amsgrad ? init.size() : 0, 0.0f), o(opts) {}

  template <class G, class H = strata::bf16>
  void step(std::span<const G> g, double lr, std::span<H> out = {}) {
    const auto k = strata::make_adamw_step_params(o, ++steps, lr);
    strata::adamw_update_cpu<G, H>(p, m, v, vmax, g, out, k);
  }
};

/// The message of the E (any exception by default) that fn throws, or "(no exception)".
template <class E = std::exception, class Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

inline std::vector<float> random_params(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class G>
std::vector<G> random_grads(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1e-2f);
  std::vector<G> v(n);
  for (auto& x : v) x = G(d(rng));
  return v;
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

/// First index where two float arrays differ bitwise, for messages; size when none.
inline std::size_t first_difference(std::span<const float> a, std::span<const float> b) {
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return a.size() == b.size() ? a.size() : std::min(a.size(), b.size());
}

/// Asserts the optimizer's master weights and moments equal these arrays, bit for bit.
template <class Opt>
void require_same_arrays(Opt& opt, std::span<const float> want_p, std::span<const float> want_m,
                         std::span<const float> want_v) {
  const std::size_t n = want_p.size();
  std::vector<float> p(n), m(n), v(n);
  opt.read_master(p);
  opt.read_moments(m, v);
  INFO("first master difference at " << first_difference(p, want_p));
  REQUIRE(same_bits(p, want_p));
  INFO("first m difference at " << first_difference(m, want_m));
  REQUIRE(same_bits(m, want_m));
  INFO("first v difference at " << first_difference(v, want_v));
  REQUIRE(same_bits(v, want_v));
}

/// Asserts the optimizer's master weights and moments equal the reference's, bit for bit.
template <class Opt>
void require_same_state(Opt& opt, const flat_reference& ref) {
  const std::size_t n = ref.p.size();
  require_same_arrays(opt, ref.p, ref.m, ref.v);
  if (ref.o.amsgrad) {
    std::vector<float> vm(n);
    opt.read_max_exp_avg_sq(vm);
    REQUIRE(same_bits(vm, ref.vmax));
  }
  REQUIRE(opt.step_count() == static_cast<std::uint64_t>(ref.steps));
}

/// What the optimizer must equal: adamw_step_cpu over the optimizer's subgroups (the global norm
/// adds per-subgroup sums) and a scaler updated after every step.
struct scaled_reference {
  std::vector<float> p, m, v, vmax;
  strata::adamw_options o;
  std::int64_t steps = 0;
  std::size_t subgroup;
  std::optional<double> max_norm;
  strata::dynamic_loss_scaler scaler;

  scaled_reference(std::span<const float> init, strata::adamw_options opts, std::size_t sg,
                   const strata::offload_options& off)
      : p(init.begin(), init.end()), m(init.size(), 0.0f), v(init.size(), 0.0f),
        vmax(opts.amsgrad ? init.size() : 0, 0.0f), o(opts), subgroup(sg),
        max_norm(off.max_grad_norm > 0 ? std::optional<double>(off.max_grad_norm) : std::nullopt),
        scaler(off.loss_scaling) {}

  template <class G, class H>
  strata::adamw_step_report step(std::span<const G> g, double lr, std::span<H> out) {
    std::vector<strata::adamw_group<G, H>> groups;
    for (std::size_t b = 0; b < p.size(); b += subgroup) {
      const std::size_t n = std::min(subgroup, p.size() - b);
      groups.push_back({std::span<float>(p).subspan(b, n), std::span<float>(m).subspan(b, n),
                        std::span<float>(v).subspan(b, n),
                        vmax.empty() ? std::span<float>() : std::span<float>(vmax).subspan(b, n), g.subspan(b, n),
                        out.empty() ? std::span<H>() : out.subspan(b, n)});
    }
    const auto r = strata::adamw_step_cpu<G, H>(std::span<const strata::adamw_group<G, H>>(groups), o, steps, lr,
                                                scaler.inv_scale(), max_norm);
    scaler.update(r.skipped);
    return r;
  }
};

/// Asserts the optimizer's state, step count and loss scaler equal the reference's.
template <class Opt>
void require_same(Opt& opt, const scaled_reference& ref) {
  flat_reference flat(ref.p, ref.o);
  flat.p = ref.p;
  flat.m = ref.m;
  flat.v = ref.v;
  flat.vmax = ref.vmax;
  flat.steps = ref.steps;
  require_same_state(opt, flat);
  CHECK(opt.loss_scale() == ref.scaler.scale());
  CHECK(opt.loss_scaler().growth_tracker() == ref.scaler.growth_tracker());
}

}  // namespace strata_test
