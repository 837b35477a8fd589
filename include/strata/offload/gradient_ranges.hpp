#pragma once
/// gradient_range: the gradients of one range of parameters, in the caller's memory, for a step
/// over some of the parameters (offloaded_adamw::step with a span of ranges). A framework hands
/// each tensor's gradient as it is, with no copy into one flat array; parameters no range covers
/// have no gradient this step and are left exactly as they are, as torch.optim.AdamW leaves a
/// parameter whose .grad is None: no moment, weight decay, model copy or step-count change, and a
/// subgroup no range touches is neither read nor written.
///
/// gradient_coverage is the union of a step's ranges as sorted, disjoint runs (adjacent ranges
/// merged), which is what the update walks.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"

namespace strata {

/// Gradients of parameters [first, first + grads.size()).
template <gradient_type G>
struct gradient_range {
  std::size_t first = 0;
  std::span<const G> grads;
};

/// The parameters a step's gradient ranges cover, as ascending disjoint runs [lo, hi).
class gradient_coverage {
 public:
  /// Every one of `params` parameters.
  [[nodiscard]] static gradient_coverage all(std::size_t params) {
    gradient_coverage c;
    if (params > 0) c.runs_.emplace_back(0, params);
    return c;
  }

  /// The runs `ranges` cover; config_error naming `who` and the range unless they are in
  /// ascending order of `first`, do not overlap, are not empty and lie within `params`.
  template <gradient_type G>
  [[nodiscard]] static gradient_coverage of(std::span<const gradient_range<G>> ranges, std::size_t params,
                                            std::string_view who) {
    gradient_coverage c;
    std::size_t end = 0;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const auto& r = ranges[i];
      STRATA_EXPECTS(!r.grads.empty(), config_error, "{}: gradient range {} (at parameter {}) is empty", who, i, r.first);
      STRATA_EXPECTS(r.first <= params && r.grads.size() <= params - r.first, config_error,
                     "{}: gradient range {} [{}, {}) passes the {} parameters", who, i, r.first,
                     r.first + r.grads.size(), params);
      STRATA_EXPECTS(i == 0 || r.first >= end, config_error,
                     "{}: gradient range {} [{}, {}) starts before the end of the one before it ({}): ranges must be "
                     "in ascending order and not overlap",
                     who, i, r.first, r.first + r.grads.size(), end);
      end = r.first + r.grads.size();
      if (!c.runs_.empty() && c.runs_.back().second == r.first)
        c.runs_.back().second = end;
      else
        c.runs_.emplace_back(r.first, end);
    }
    return c;
  }

  [[nodiscard]] std::span<const std::pair<std::size_t, std::size_t>> runs() const noexcept { return runs_; }
  [[nodiscard]] bool empty() const noexcept { return runs_.empty(); }
  /// Parameters covered.
  [[nodiscard]] std::size_t count() const noexcept {
    std::size_t n = 0;
    for (const auto& [lo, hi] : runs_) n += hi - lo;
    return n;
  }
  /// Whether any parameter of [lo, hi) is covered.
  [[nodiscard]] bool touches(std::size_t lo, std::size_t hi) const {
    auto it = first_ending_after(lo);
    return it != runs_.end() && it->first < hi;
  }
  /// Calls f(a, b) for each covered run's part [a, b) of [lo, hi), in order.
  template <class F>
  void for_each_in(std::size_t lo, std::size_t hi, F&& f) const {
    for (auto it = first_ending_after(lo); it != runs_.end() && it->first < hi; ++it)
      f(std::max(lo, it->first), std::min(hi, it->second));
  }

  bool operator==(const gradient_coverage&) const = default;

 private:
  std::vector<std::pair<std::size_t, std::size_t>> runs_;

  [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>>::const_iterator first_ending_after(std::size_t lo) const {
    return std::upper_bound(runs_.begin(), runs_.end(), lo,
                            [](std::size_t v, const std::pair<std::size_t, std::size_t>& r) { return v < r.second; });
  }
};

}  // namespace strata
