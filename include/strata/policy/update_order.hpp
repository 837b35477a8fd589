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
#include "strata/core/erased.hpp"
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

namespace detail {
/// The table of an update order (core/erased.hpp).
struct update_order_table {
  static constexpr std::string_view concept_name = "update order";
  erased_ops ops_;
  void (*order)(const void*, std::uint64_t, std::span<std::size_t>);
  [[nodiscard]] const erased_ops& ops() const noexcept { return ops_; }
  template <class O>
  static constexpr update_order_table of() {
    return {erased_ops_of<O>, [](const void* p, std::uint64_t step, std::span<std::size_t> out) {
              static_cast<const O*>(p)->order(step, out);
            }};
  }
};
template <class O>
inline constexpr update_order_table update_order_table_of = update_order_table::of<O>();
}  // namespace detail

class any_update_order;

/// A non-owning reference to an update order, which must outlive it (core/erased.hpp). Copyable.
class update_order_ref {
 public:
  template <update_order O>
    requires(!std::same_as<O, update_order_ref> && !std::same_as<O, any_update_order>)
  update_order_ref(const O& o) noexcept  // NOLINT(google-explicit-constructor): a reference to an order is one
      : ref_(const_cast<O*>(&o), detail::update_order_table_of<O>) {}
  update_order_ref(const void* self, const detail::update_order_table& t) noexcept : ref_(const_cast<void*>(self), t) {}

  void order(std::uint64_t step, std::span<std::size_t> out) const { ref_.table().order(ref_.self(), step, out); }
  /// The order if it is an O, else null.
  template <update_order O>
  [[nodiscard]] const O* target() const noexcept {
    return ref_.template target<O>();
  }

 private:
  detail::erased_ref<detail::update_order_table> ref_;
};
static_assert(update_order<update_order_ref>);

/// Any update order, chosen at run time and owned (core/erased.hpp): move-only, never empty once
/// made. One call through a table per step.
class any_update_order {
 public:
  template <update_order O>
    requires(!std::same_as<std::remove_cvref_t<O>, any_update_order>)
  any_update_order(O o)  // NOLINT(google-explicit-constructor): an order is one
      : box_(std::make_unique<O>(std::move(o)), detail::update_order_table_of<O>) {}
  any_update_order(any_update_order&&) noexcept = default;
  any_update_order& operator=(any_update_order&&) noexcept = default;

  void order(std::uint64_t step, std::span<std::size_t> out) const { box_.table().order(box_.self(), step, out); }
  /// The order if it is an O, else null.
  template <update_order O>
  [[nodiscard]] const O* target() const noexcept {
    return box_.template target<O>();
  }
  operator update_order_ref() const { return {box_.self(), box_.table()}; }  // NOLINT(google-explicit-constructor)

 private:
  detail::erased_box<detail::update_order_table> box_;
};
static_assert(update_order<any_update_order>);

}  // namespace strata
