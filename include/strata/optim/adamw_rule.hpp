#pragma once
/// AdamW (and Adam, with decoupled = false) as an update_rule (optim/update_rule.hpp): the rule
/// the offload engine ran before it was generic, unchanged. Its state is the first and second
/// moments in fp32 ("exp_avg", "exp_avg_sq", as torch names them) and, with amsgrad, their
/// running maximum ("max_exp_avg_sq"); the formula and its rounding are optim/adamw_math.hpp's,
/// the host kernels optim/adamw_cpu.hpp's and the CUDA kernel optim/adamw_cuda.cuh's.

#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/optim/adamw_cpu.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/update_rule.hpp"

namespace strata {

namespace detail {
/// AdamW's state format with moments of element `e`: m and v, and the running maximum of v with
/// amsgrad.
[[nodiscard]] constexpr state_format adamw_format(const adamw_options& o, state_element e) noexcept {
  if (o.amsgrad) return {{"exp_avg", e}, {"exp_avg_sq", e, true}, {"max_exp_avg_sq", e, true}};
  return {{"exp_avg", e}, {"exp_avg_sq", e, true}};
}
}  // namespace detail

struct adamw_rule {
  using options_type = adamw_options;
  using step_params = adamw_step_params;
  static constexpr std::string_view tag = "adamw";

  /// m and v, and the running maximum of v with amsgrad.
  [[nodiscard]] static constexpr state_format format(const adamw_options& o) noexcept {
    return detail::adamw_format(o, state_element::f32);
  }

  /// make_adamw_step_params with s's weight decay in place of o's (a range's; the options' own
  /// for uniform rates, so the constants are those of make_adamw_step_params(o, ...)).
  [[nodiscard]] static adamw_step_params make_step_params(const adamw_options& o, const rule_step& s) {
    adamw_options with = o;
    with.weight_decay = s.weight_decay;
    return make_adamw_step_params(with, s.step, s.lr, s.grad_scale, s.clip);
  }

  /// Updates parameters [at, at + n) of `v` (see update_rule): adamw_update_cpu on the offset arrays.
  template <gradient_type G, model_copy_type H>
  static void update_cpu(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                         const adamw_step_params& k, thread_pool* pool) {
    if (n == 0) return;
    STRATA_EXPECTS(v.master != nullptr && v.arrays[0] != nullptr && v.arrays[1] != nullptr && grads != nullptr &&
                       (!k.amsgrad || v.arrays[2] != nullptr),
                   config_error, "adamw_rule::update_cpu: missing master weights, moments or gradients");
    adamw_update_cpu<G, H>(std::span<float>(v.master + at, n), std::span<float>(v.array<float>(0, at), n),
                           std::span<float>(v.array<float>(1, at), n),
                           k.amsgrad ? std::span<float>(v.array<float>(2, at), n) : std::span<float>(),
                           std::span<const G>(grads, n),
                           model_out == nullptr ? std::span<H>() : std::span<H>(model_out, n), k, pool);
  }

  /// The update of one parameter in float64, in torch's order (state: m, v[, max v]).
  static void reference(double& p, std::span<double> state, double g, const adamw_options& o, const rule_step& s) {
    STRATA_EXPECTS(state.size() == format(o).count, config_error, "adamw_rule::reference: {} state values for {} arrays",
                   state.size(), format(o).count);
    double& m = state[0];
    double& v = state[1];
    g = g * s.grad_scale * s.clip;
    if (o.maximize) g = -g;
    if (o.decoupled)
      p *= 1.0 - s.lr * s.weight_decay;
    else
      g += s.weight_decay * p;
    m = o.beta1 * m + (1.0 - o.beta1) * g;
    v = o.beta2 * v + (1.0 - o.beta2) * g * g;
    double second = v;
    if (o.amsgrad) {
      state[2] = std::fmax(state[2], v);
      second = state[2];
    }
    const double t = static_cast<double>(s.step);
    const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
    p -= s.lr / bc1 * m / (std::sqrt(second) / std::sqrt(bc2) + o.eps);
  }

  /// The hyper-parameters by name (checkpoints).
  [[nodiscard]] static rule_option_values save_options(const adamw_options& o) {
    return {{"lr", o.lr},
            {"beta1", o.beta1},
            {"beta2", o.beta2},
            {"eps", o.eps},
            {"weight_decay", o.decay()},
            {"decoupled", o.decoupled ? 1.0 : 0.0},
            {"amsgrad", o.amsgrad ? 1.0 : 0.0},
            {"maximize", o.maximize ? 1.0 : 0.0}};
  }
  [[nodiscard]] static adamw_options load_options(const rule_option_values& v) {
    const auto at = [&](std::string_view name) { return detail::option_value(v, name, "adamw_rule"); };
    adamw_options o;
    o.lr = at("lr");
    o.beta1 = at("beta1");
    o.beta2 = at("beta2");
    o.eps = at("eps");
    o.weight_decay = at("weight_decay");
    o.decoupled = at("decoupled") != 0;
    o.amsgrad = at("amsgrad") != 0;
    o.maximize = at("maximize") != 0;
    return o;
  }
};

static_assert(update_rule<adamw_rule>);

/// The kernel constants of one AdamW step per range of parameters (the name the engine used
/// before it was generic over rules).
using step_constants = rule_constants<adamw_rule>;

}  // namespace strata
