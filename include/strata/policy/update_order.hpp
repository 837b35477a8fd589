#pragma once
/// The `update_order` concept and its models: the order in which a step walks the subgroups.
/// `sequential` (0..n-1 every step), `alternating` (forward, then reverse, ...: the last subgroups
/// of one step are the first of the next, so they can stay cached) and `custom_order` (a
/// permutation per step given by the user, validated).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata {

/// An update order writes the order of step `step` into `out`: a permutation of
/// [0, out.size()). Deterministic: the same step always gives the same order, so the order of
/// step+1 is known during step (eviction policies look ahead with it).
template <class O>
concept update_order = requires(const O& o, std::uint64_t step, std::span<std::size_t> out) {
  { o.order(step, out) } -> std::same_as<void>;
};

/// The order of step `step` over `n` subgroups, as a vector.
template <update_order O>
[[nodiscard]] std::vector<std::size_t> order_of(const O& o, std::uint64_t step, std::size_t n) {
  std::vector<std::size_t> v(n);
  o.order(step, v);
  return v;
}

/// Throws config_error naming `who`, the step and the offending subgroup unless `order` is a
/// permutation of [0, n).
inline void check_permutation(std::span<const std::size_t> order, std::size_t n, std::uint64_t step,
                              std::string_view who) {
  STRATA_EXPECTS(order.size() == n, config_error, "{}: the order of step {} has {} entries for {} subgroups", who,
                 step, order.size(), n);
  std::vector<bool> seen(n, false);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::size_t s = order[i];
    STRATA_EXPECTS(s < n, config_error, "{}: the order of step {} names subgroup {} at position {}, but there are {}",
                   who, step, s, i, n);
    STRATA_EXPECTS(!seen[s], config_error, "{}: the order of step {} names subgroup {} twice (again at position {})",
                   who, step, s, i);
    seen[s] = true;
  }
}

/// 0, 1, ..., n-1 every step.
struct sequential {
  void order(std::uint64_t /*step*/, std::span<std::size_t> out) const noexcept {
    std::iota(out.begin(), out.end(), std::size_t{0});
  }
};
static_assert(update_order<sequential>);

/// Even steps 0..n-1, odd steps n-1..0 (MLP-Offload's cache-friendly order).
struct alternating {
  void order(std::uint64_t step, std::span<std::size_t> out) const noexcept {
    std::iota(out.begin(), out.end(), std::size_t{0});
    if (step % 2 == 1) std::reverse(out.begin(), out.end());
  }
};
static_assert(update_order<alternating>);

/// A user-given permutation per step: either a list used in turn (step s takes entry s mod size)
/// or a function of the step and the number of subgroups. Every permutation is validated (a
/// list at construction, a function's result at each call); a bad one is a config_error that
/// names the step and the subgroup.
class custom_order {
 public:
  using generator = std::function<std::vector<std::size_t>(std::uint64_t step, std::size_t n)>;

  explicit custom_order(std::vector<std::vector<std::size_t>> per_step) : list_(std::move(per_step)) {
    STRATA_EXPECTS(!list_.empty(), config_error, "custom_order: needs at least one permutation");
    for (std::size_t i = 0; i < list_.size(); ++i) check_permutation(list_[i], list_[0].size(), i, "custom_order");
  }

  explicit custom_order(generator g) : generate_(std::move(g)) {
    STRATA_EXPECTS(static_cast<bool>(generate_), config_error, "custom_order: the generator is empty");
  }

  void order(std::uint64_t step, std::span<std::size_t> out) const {
    if (generate_) {
      const auto v = generate_(step, out.size());
      check_permutation(v, out.size(), step, "custom_order");
      std::copy(v.begin(), v.end(), out.begin());
      return;
    }
    const auto& v = list_[static_cast<std::size_t>(step % list_.size())];
    STRATA_EXPECTS(v.size() == out.size(), config_error,
                   "custom_order: the order of step {} has {} entries for {} subgroups", step, v.size(), out.size());
    std::copy(v.begin(), v.end(), out.begin());
  }

 private:
  std::vector<std::vector<std::size_t>> list_;
  generator generate_;
};
static_assert(update_order<custom_order>);

/// Any update order, chosen at run time: shares one immutable copy of the order it was made from
/// (orders are const: the same step always gives the same order), so copies are cheap. One
/// virtual call per step. Empty when default-constructed.
class any_update_order {
 public:
  any_update_order() noexcept = default;
  template <update_order O>
    requires(!std::same_as<std::remove_cvref_t<O>, any_update_order>)
  any_update_order(O o)  // NOLINT(google-explicit-constructor): an order is one
      : impl_(std::make_shared<const model<O>>(std::move(o))) {}

  void order(std::uint64_t step, std::span<std::size_t> out) const {
    STRATA_EXPECTS(impl_ != nullptr, config_error, "any_update_order: no order was given");
    impl_->order(step, out);
  }
  [[nodiscard]] bool empty() const noexcept { return impl_ == nullptr; }

 private:
  struct iface {
    virtual ~iface() = default;
    virtual void order(std::uint64_t, std::span<std::size_t>) const = 0;
  };
  template <class O>
  struct model final : iface {
    explicit model(O o) : value(std::move(o)) {}
    void order(std::uint64_t step, std::span<std::size_t> out) const override { value.order(step, out); }
    O value;
  };
  std::shared_ptr<const iface> impl_;
};
static_assert(update_order<any_update_order>);

}  // namespace strata
