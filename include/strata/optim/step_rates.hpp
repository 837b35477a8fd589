#pragma once
/// step_rates: the learning rate and weight decay of one optimizer step, either one learning rate
/// for every parameter (a double converts to it; the weight decay is the options') or one pair per
/// range of parameters, as PyTorch's param groups give them (each group's scheduler sets its own
/// lr). rule_constants (optim/update_rule.hpp) resolves them into a rule's kernel constants per
/// range and cuts any span of parameters (a subgroup, which may cross ranges) into pieces of one
/// range each. The update is element-wise, so a piece gives the same bits as the whole would with
/// its range's constants.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/optim/param_steps.hpp"

namespace strata {

/// Parameters [first, first + count) and their learning rate and weight decay for one step.
struct param_range {
  std::size_t first = 0;    ///< first parameter of the range
  std::size_t count = 0;    ///< parameters in it (at least 1)
  double lr = 0;            ///< learning rate this step
  double weight_decay = 0;  ///< as the rule applies it (AdamW: decoupled, or L2 as adamw_options::decoupled says)

  bool operator==(const param_range&) const = default;
};

/// The rates of one step: see the file comment.
class step_rates {
 public:
  /// One learning rate for every parameter; the weight decay is the optimizer options'.
  step_rates(double lr) noexcept : lr_(lr) {}  // NOLINT(google-explicit-constructor): a scalar lr reads as one
  /// One pair per range: in order of `first`, adjacent, covering every parameter once (validate).
  explicit step_rates(std::vector<param_range> ranges) noexcept : ranges_(std::move(ranges)), per_range_(true) {}

  /// Whether one learning rate applies to every parameter.
  [[nodiscard]] bool uniform() const noexcept { return !per_range_; }
  /// The learning rate when uniform().
  [[nodiscard]] double lr() const noexcept { return lr_; }
  /// The ranges when not uniform().
  [[nodiscard]] std::span<const param_range> ranges() const noexcept { return ranges_; }

  /// Throws config_error, naming `who` and the range, unless the rates are usable for `params`
  /// parameters: finite, non-negative learning rates and weight decays; ranges in order, each
  /// starting where the previous one ended, none empty, the last ending at `params`.
  void validate(std::size_t params, std::string_view who) const {
    if (uniform()) {
      // 0 is allowed, as in PyTorch: warm-up schedules start there (the moments still advance).
      STRATA_EXPECTS(std::isfinite(lr_) && lr_ >= 0, config_error,
                     "{}: learning rate {} must be finite and not negative", who, lr_);
      return;
    }
    std::size_t end = 0;
    for (std::size_t i = 0; i < ranges_.size(); ++i) {
      const param_range& r = ranges_[i];
      STRATA_EXPECTS(r.first == end, config_error,
                     "{}: parameter range {} starts at {}, but the ranges before it end at {} (ranges must be in "
                     "order, adjacent and cover all {} parameters)",
                     who, i, r.first, end, params);
      STRATA_EXPECTS(r.count > 0, config_error, "{}: parameter range {} (from parameter {}) is empty", who, i, r.first);
      STRATA_EXPECTS(r.count <= params - end, config_error,
                     "{}: parameter range {} [{}, {}) ends past the last of the {} parameters", who, i, r.first,
                     r.first + r.count, params);
      STRATA_EXPECTS(std::isfinite(r.lr) && r.lr >= 0, config_error,
                     "{}: parameter range {} [{}, {}): learning rate {} must be finite and not negative", who, i,
                     r.first, r.first + r.count, r.lr);
      STRATA_EXPECTS(std::isfinite(r.weight_decay) && r.weight_decay >= 0, config_error,
                     "{}: parameter range {} [{}, {}): weight decay {} must be finite and not negative", who, i,
                     r.first, r.first + r.count, r.weight_decay);
      end += r.count;
    }
    STRATA_EXPECTS(end == params, config_error, "{}: the parameter ranges cover {} of the {} parameters", who, end,
                   params);
  }

  bool operator==(const step_rates&) const = default;

 private:
  double lr_ = 0;
  std::vector<param_range> ranges_;
  bool per_range_ = false;  // (no ranges at all is per range too: it covers nothing)
};

}  // namespace strata
