#pragma once
/// step_rates: the learning rate and weight decay of one AdamW step, either one learning rate for
/// every parameter (a double converts to it; the weight decay is the options') or one pair per
/// range of parameters, as PyTorch's param groups give them (each group's scheduler sets its own
/// lr). step_constants resolves them into the kernel's constants per range and cuts any span of
/// parameters (a subgroup, which may cross ranges) into pieces of one range each. The update is
/// element-wise, so a piece gives the same bits as the whole would with its range's constants.

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
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/param_steps.hpp"

namespace strata {

/// Parameters [first, first + count) and their learning rate and weight decay for one step.
struct param_range {
  std::size_t first = 0;    ///< first parameter of the range
  std::size_t count = 0;    ///< parameters in it (at least 1)
  double lr = 0;            ///< learning rate this step
  double weight_decay = 0;  ///< decoupled (AdamW) or L2 (Adam), as adamw_options::decoupled says

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

/// The kernel constants of one step, per range of parameters (one range when the rates are uniform).
class step_constants {
 public:
  /// One set of constants for every parameter.
  explicit step_constants(const adamw_step_params& k) : first_{0}, k_{k} {}

  /// The constants of step `step` (1-based) for `rates` (validated against `params` by the caller)
  /// with the gradient scale and clip coefficient of make_adamw_step_params.
  step_constants(const adamw_options& options, const step_rates& rates, std::int64_t step, double grad_scale,
                 double clip) {
    if (rates.uniform()) {
      first_.push_back(0);
      k_.push_back(make_adamw_step_params(options, step, rates.lr(), grad_scale, clip));
      return;
    }
    for (const param_range& r : rates.ranges()) {
      adamw_options o = options;
      o.weight_decay = r.weight_decay;
      first_.push_back(r.first);
      k_.push_back(make_adamw_step_params(o, step, r.lr, grad_scale, clip));
    }
  }

  /// The constants of the next step for `rates` over `params`'s parameters, each piece with the
  /// bias corrections of its own count (`steps` + 1): rates ranges and step runs cut the
  /// parameters into pieces of one lr, weight decay and step each. Uniform rates and steps give
  /// exactly the constants of the constructor above.
  step_constants(const adamw_options& options, const step_rates& rates, const param_steps& steps, double grad_scale,
                 double clip) {
    STRATA_ASSERT(steps.params() > 0);
    const auto add = [&](std::size_t first, std::size_t count, double lr, double wd) {
      adamw_options o = options;
      o.weight_decay = wd;
      steps.for_each(first, count, [&](std::size_t at, std::size_t, std::uint64_t taken) {
        first_.push_back(at);
        k_.push_back(make_adamw_step_params(o, static_cast<std::int64_t>(taken) + 1, lr, grad_scale, clip));
      });
    };
    if (rates.uniform())
      add(0, steps.params(), rates.lr(), options.decay());
    else
      for (const param_range& r : rates.ranges()) add(r.first, r.count, r.lr, r.weight_decay);
  }

  /// Calls `f(offset, length, k)` for each piece of parameters [first, first + count) that lies
  /// in one range, in order; `offset` counts from `first`.
  template <class F>
  void for_each_piece(std::size_t first, std::size_t count, F&& f) const {
    // The range holding `first`: the last whose start is not after it.
    auto i = static_cast<std::size_t>(std::upper_bound(first_.begin(), first_.end(), first) - first_.begin()) - 1;
    std::size_t at = first;
    const std::size_t end = first + count;
    while (at < end) {
      const std::size_t piece_end = i + 1 < first_.size() ? std::min(end, first_[i + 1]) : end;
      f(at - first, piece_end - at, k_[i]);
      at = piece_end;
      ++i;
    }
  }

 private:
  std::vector<std::size_t> first_;  // where each range starts, ascending
  std::vector<adamw_step_params> k_;
};

}  // namespace strata
