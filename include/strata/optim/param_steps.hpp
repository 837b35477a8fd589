#pragma once
/// param_steps: how many AdamW steps each parameter has taken, kept as runs of equal counts over
/// the flat parameter index. torch.optim.AdamW keeps one step count per parameter tensor and
/// leaves it alone in a step where the tensor has no gradient, so its bias corrections differ
/// from those of its neighbours from then on; an optimizer that skips ranges (offloaded_adamw's
/// step over gradient ranges) needs the same per-range count to give the same bits. When every
/// parameter takes every step there is one run, whatever the model's size.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata {

/// Parameters [first, next run's first) have taken `steps` steps.
struct param_step_run {
  std::size_t first = 0;
  std::uint64_t steps = 0;

  bool operator==(const param_step_run&) const = default;
};

/// See the file comment.
class param_steps {
 public:
  param_steps() = default;
  /// `params` parameters that have all taken `steps` steps.
  explicit param_steps(std::size_t params, std::uint64_t steps = 0) : params_(params) {
    if (params > 0) runs_.push_back({0, steps});
  }

  /// Takes runs from a checkpoint or a caller: config_error naming `who` unless they start at 0,
  /// ascend strictly and stay below `params` (adjacent equal runs are merged).
  [[nodiscard]] static param_steps from_runs(std::size_t params, std::span<const param_step_run> runs,
                                             std::string_view who) {
    STRATA_EXPECTS(params == 0 || (!runs.empty() && runs.front().first == 0), config_error,
                   "{}: step counts must start with a run at parameter 0 ({} runs given)", who, runs.size());
    param_steps p;
    p.params_ = params;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      STRATA_EXPECTS(runs[i].first < params, config_error, "{}: step run {} starts at parameter {}, past the {} parameters",
                     who, i, runs[i].first, params);
      STRATA_EXPECTS(i == 0 || runs[i].first > runs[i - 1].first, config_error,
                     "{}: step run {} starts at {}, not after run {} (at {})", who, i, runs[i].first, i - 1,
                     runs[i - 1].first);
      p.push(runs[i]);
    }
    return p;
  }

  [[nodiscard]] std::size_t params() const noexcept { return params_; }
  [[nodiscard]] std::span<const param_step_run> runs() const noexcept { return runs_; }
  /// Whether every parameter has taken the same number of steps.
  [[nodiscard]] bool uniform() const noexcept { return runs_.size() <= 1; }
  /// Steps parameter `i` has taken.
  [[nodiscard]] std::uint64_t at(std::size_t i) const {
    STRATA_ASSERT(i < params_);
    return run_holding(i)->steps;
  }
  /// The most steps any parameter has taken.
  [[nodiscard]] std::uint64_t max() const noexcept {
    std::uint64_t m = 0;
    for (const auto& r : runs_) m = std::max(m, r.steps);
    return m;
  }

  /// Calls f(first, count, steps) for each run's part of [first, first + count), in order.
  template <class F>
  void for_each(std::size_t first, std::size_t count, F&& f) const {
    const std::size_t end = first + count;
    for (auto it = run_holding(first); first < end; ++it) {
      const std::size_t stop = std::min(end, it + 1 != runs_.end() ? (it + 1)->first : params_);
      f(first, stop - first, it->steps);
      first = stop;
    }
  }

  /// Every parameter of [first, first + count) takes one more step.
  void advance(std::size_t first, std::size_t count) {
    if (count == 0) return;
    STRATA_ASSERT(first < params_ && count <= params_ - first);
    std::vector<param_step_run> out;
    out.reserve(runs_.size() + 2);
    const std::size_t end = first + count;
    for (std::size_t i = 0; i < runs_.size(); ++i) {
      const std::size_t lo = runs_[i].first;
      const std::size_t hi = i + 1 < runs_.size() ? runs_[i + 1].first : params_;
      const std::uint64_t s = runs_[i].steps;
      // The run's parts before, inside and after [first, end).
      if (lo < std::min(hi, first)) push_to(out, {lo, s});
      if (std::max(lo, first) < std::min(hi, end)) push_to(out, {std::max(lo, first), s + 1});
      if (std::max(lo, end) < hi) push_to(out, {std::max(lo, end), s});
    }
    runs_ = std::move(out);
  }
  /// Every parameter takes one more step.
  void advance_all() noexcept {
    for (auto& r : runs_) ++r.steps;
  }

  bool operator==(const param_steps&) const = default;

 private:
  std::size_t params_ = 0;
  std::vector<param_step_run> runs_;  // ascending, the first at 0, no two adjacent with equal steps

  [[nodiscard]] std::vector<param_step_run>::const_iterator run_holding(std::size_t i) const {
    return std::prev(std::upper_bound(runs_.begin(), runs_.end(), i,
                                      [](std::size_t v, const param_step_run& r) { return v < r.first; }));
  }
  static void push_to(std::vector<param_step_run>& v, param_step_run r) {
    if (v.empty() || v.back().steps != r.steps) v.push_back(r);
  }
  void push(param_step_run r) { push_to(runs_, r); }
};

}  // namespace strata
