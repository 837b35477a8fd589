#pragma once
/// adamw_state_view: AdamW state that exists already (a run of another optimizer, e.g.
/// torch.optim.AdamW's state_dict: exp_avg, exp_avg_sq, max_exp_avg_sq and step), to start an
/// optimizer from instead of zero moments. The next step is then step + 1, with the bias
/// corrections of that step, so a run moved over continues bit for bit.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/optim/param_steps.hpp"

namespace strata {

/// Moments of every parameter and the steps taken (see the file comment). An empty span stands for
/// zeros; max_exp_avg_sq is for amsgrad only.
struct adamw_state_view {
  std::span<const float> exp_avg;         ///< first moment (m)
  std::span<const float> exp_avg_sq;      ///< second moment (v)
  std::span<const float> max_exp_avg_sq;  ///< running maximum of v (amsgrad)
  std::uint64_t step = 0;                 ///< steps already taken
  /// Steps each parameter has taken when they differ (torch keeps one count per tensor, and a
  /// tensor without a gradient in a step keeps its own): runs over the flat index (param_steps),
  /// none above `step`; empty: every parameter has taken `step`.
  std::span<const param_step_run> step_runs{};

  /// Throws config_error naming `who`, the array and the first bad index unless the state fits
  /// `params` parameters: each given array has one value per parameter, all finite, the second
  /// moments and their maximum not negative, and a maximum only with amsgrad.
  void validate(std::size_t params, bool amsgrad, std::string_view who) const {
    check(exp_avg, "exp_avg", params, false, who);
    check(exp_avg_sq, "exp_avg_sq", params, true, who);
    STRATA_EXPECTS(amsgrad || max_exp_avg_sq.empty(), config_error,
                   "{}: max_exp_avg_sq given, but amsgrad is off (it has no running maximum)", who);
    check(max_exp_avg_sq, "max_exp_avg_sq", params, true, who);
  }

 private:
  static void check(std::span<const float> a, std::string_view name, std::size_t params, bool non_negative,
                    std::string_view who) {
    if (a.empty()) return;
    STRATA_EXPECTS(a.size() == params, config_error, "{}: {} has {} values for {} parameters", who, name, a.size(),
                   params);
    for (std::size_t i = 0; i < a.size(); ++i)
      STRATA_EXPECTS(std::isfinite(a[i]) && (!non_negative || a[i] >= 0), config_error,
                     "{}: {}[{}] is {}, which {}", who, name, i, a[i],
                     non_negative ? "a second moment cannot be (finite, not negative)" : "is not finite");
  }
};

}  // namespace strata
