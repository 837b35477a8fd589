#pragma once
/// param_tensor: one framework tensor's share of an optimizer's flat parameters, for a step that
/// works on the tensors as they are (offloaded_adamw::step with a span of them): its gradients
/// this step, in the caller's memory, and its weights, which the step writes in place. Nothing
/// is copied into or out of one flat array. A tensor without gradients this step (or a parameter
/// no tensor covers) is left exactly as it is, as torch.optim.AdamW leaves a tensor whose .grad
/// is None: no moment, weight decay, weight or step-count change, and a subgroup no gradient
/// touches is neither read nor written.
///
/// gradient_coverage is the union of the parameters that have gradients in a step, as sorted,
/// disjoint runs (adjacent tensors merged), which is what the update walks.

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

/// Parameters [first, first + count) of one tensor: `grad`, its gradients this step (count
/// elements, or empty: none this step), and `model`, its weights in the tensor's own type (count
/// elements, or empty: none to write).
template <gradient_type G, model_copy_type H>
struct param_tensor {
  std::size_t first = 0;
  std::size_t count = 0;
  std::span<const G> grad{};
  std::span<H> model{};
};

template <class T>
inline constexpr bool is_param_tensor_v = false;
template <class G, class H>
inline constexpr bool is_param_tensor_v<param_tensor<G, H>> = true;

/// The parameters a step's tensors give gradients for, as ascending disjoint runs [lo, hi).
class gradient_coverage {
 public:
  /// The runs of `tensors` that have gradients; config_error naming `who` and the tensor unless
  /// the tensors are in ascending order of `first`, do not overlap, are not empty, lie within
  /// `params` and have gradients and weights of `count` elements (or none).
  template <gradient_type G, model_copy_type H>
  [[nodiscard]] static gradient_coverage of(std::span<const param_tensor<G, H>> tensors, std::size_t params,
                                            std::string_view who) {
    gradient_coverage c;
    std::size_t end = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      STRATA_EXPECTS(t.count > 0, config_error, "{}: tensor {} (at parameter {}) is empty", who, i, t.first);
      STRATA_EXPECTS(t.first <= params && t.count <= params - t.first, config_error,
                     "{}: tensor {} [{}, {}) passes the {} parameters", who, i, t.first, t.first + t.count, params);
      STRATA_EXPECTS(i == 0 || t.first >= end, config_error,
                     "{}: tensor {} [{}, {}) starts before the end of the one before it ({}): tensors must be in "
                     "ascending order and not overlap",
                     who, i, t.first, t.first + t.count, end);
      STRATA_EXPECTS(t.grad.empty() || t.grad.size() == t.count, config_error,
                     "{}: tensor {} [{}, {}) has {} gradients for {} parameters", who, i, t.first, t.first + t.count,
                     t.grad.size(), t.count);
      STRATA_EXPECTS(t.model.empty() || t.model.size() == t.count, config_error,
                     "{}: tensor {} [{}, {}) has {} weights for {} parameters", who, i, t.first, t.first + t.count,
                     t.model.size(), t.count);
      end = t.first + t.count;
      if (t.grad.empty()) continue;
      if (!c.runs_.empty() && c.runs_.back().second == t.first)
        c.runs_.back().second = end;
      else
        c.runs_.emplace_back(t.first, end);
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
    const auto it = std::upper_bound(runs_.begin(), runs_.end(), lo,
                                     [](std::size_t v, const std::pair<std::size_t, std::size_t>& r) { return v < r.second; });
    return it != runs_.end() && it->first < hi;
  }

  bool operator==(const gradient_coverage&) const = default;

 private:
  std::vector<std::pair<std::size_t, std::size_t>> runs_;
};

}  // namespace strata
