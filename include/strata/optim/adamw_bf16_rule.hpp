#pragma once
/// AdamW with 16-bit moments as an update_rule (optim/update_rule.hpp): the first and second
/// moments (and the running maximum of the second with amsgrad) are stored in bf16, the master
/// weights in fp32, and the update is computed in fp32: 8 bytes of state a parameter instead of
/// AdamW's 12, so an offloaded step reads and writes a third fewer bytes.
///
/// Rounding. Each step widens the stored moments to fp32 (exactly), runs AdamW's element formula
/// (optim/adamw_math.hpp: the same operations, in the same order, as adamw_rule) and rounds the
/// new moments to bf16 to nearest even (NaN stays NaN), as a bf16 model copy is rounded. So one
/// step of this rule gives exactly the weights adamw_rule gives from the widened moments, and
/// moments that are adamw_rule's rounded to bf16 (tests/optim/adamw_bf16_rule_test.cpp proves
/// both, bit for bit). bf16 keeps fp32's exponent range, so no moment underflows or overflows
/// that fp32 would keep; it keeps 8 significant bits, so a moment carries a relative error of at
/// most 2^-9 from its last rounding; the second moment's reaches the update through its square
/// root (half that). Small changes round away: with beta2 = 0.999 a step moves v by 0.1% of
/// (g^2 - v), less than half a bf16 unit (about 0.2%) unless g^2 and v differ by more than about
/// 2x, so v follows g^2 in larger moves only (m likewise with beta1 = 0.9 when g and m differ by
/// less than about 2% of m). Rounding is to nearest, not stochastic: every run gives the same
/// bits.
///
/// The host kernels are adamw_rule's (adamw_update_cpu: portable, AVX2, AVX-512, threads, tiles)
/// instantiated for bf16 moments; the CUDA kernel is adamw_cuda.cuh's likewise. Every path gives the same bits.

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
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/cpu_dispatch.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/update_rule.hpp"

namespace strata {

/// AdamW with bf16 moments (see the file comment): adamw_rule's options, constants and options
/// by name, with its own tag, state format, kernels and reference.
struct adamw_bf16_rule : adamw_rule {
  static constexpr std::string_view tag = "adamw-bf16";

  /// m and v in bf16, and the running maximum of v with amsgrad.
  [[nodiscard]] static constexpr state_format format(const adamw_options& o) noexcept {
    return detail::adamw_format(o, state_element::bf16);
  }

  /// Updates parameters [at, at + n) of `v` (see update_rule).
  template <gradient_type G, model_copy_type H>
  static void update_cpu(const state_view& v, std::size_t at, std::size_t n, const G* grads, H* model_out,
                         const adamw_step_params& k, thread_pool* pool) {
    if (n == 0) return;
    STRATA_EXPECTS(v.master != nullptr && v.arrays[0] != nullptr && v.arrays[1] != nullptr && grads != nullptr &&
                       (!k.amsgrad || v.arrays[2] != nullptr),
                   config_error, "adamw_bf16_rule::update_cpu: missing master weights, moments or gradients");
    adamw_update_cpu<G, H, bf16>(std::span<float>(v.master + at, n), std::span<bf16>(v.array<bf16>(0, at), n),
                                 std::span<bf16>(v.array<bf16>(1, at), n),
                                 k.amsgrad ? std::span<bf16>(v.array<bf16>(2, at), n) : std::span<bf16>(),
                                 std::span<const G>(grads, n),
                                 model_out == nullptr ? std::span<H>() : std::span<H>(model_out, n), k, pool);
  }

  /// adamw_rule's float64 update, the moments then rounded to bf16 as they are stored.
  static void reference(double& p, std::span<double> state, double g, const adamw_options& o, const rule_step& s) {
    adamw_rule::reference(p, state, g, o, s);
    for (double& x : state) x = static_cast<double>(static_cast<float>(bf16(static_cast<float>(x))));
  }
};

static_assert(update_rule<adamw_bf16_rule>);

}  // namespace strata
