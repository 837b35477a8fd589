#pragma once
/// The `update_site` concept and its models: where each subgroup's update runs. On the host, the
/// CPU kernel updates the state in its host slot; on the device, the state is copied in, a kernel
/// updates it there and it is copied back (Deep Optimizer States runs every other subgroup on the
/// GPU so that the CPU and the GPU work at once). A site is asked per subgroup, with the
/// subgroup's position in the step's order, so fixed patterns are easy to express; a cost model
/// can be one too. any_update_site owns any of them (what the subgroup pipeline takes),
/// update_site_ref refers to one (core/erased.hpp).

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/erased.hpp"
#include "strata/core/expects.hpp"

namespace strata {

/// Where one update runs.
enum class site_kind : std::uint8_t { host, device };

[[nodiscard]] constexpr std::string_view to_string(site_kind k) noexcept {
  return k == site_kind::host ? "host" : "device";
}

/// Chooses the site of the update at `position` of the step's order (subgroup `subgroup`, step
/// `step`); `uses_device()` says whether it may ever choose the device (a pipeline then allocates
/// device memory). Deterministic: a retried step gets the same answer.
template <class S>
concept update_site = requires(const S& s, std::size_t position, std::size_t subgroup, std::uint64_t step) {
  { s.site(position, subgroup, step) } -> std::same_as<site_kind>;
  { s.uses_device() } -> std::same_as<bool>;
};

/// Every update on the host (the CPU kernel): no device memory, no copies.
struct always_host {
  [[nodiscard]] constexpr site_kind site(std::size_t, std::size_t, std::uint64_t) const noexcept {
    return site_kind::host;
  }
  [[nodiscard]] constexpr bool uses_device() const noexcept { return false; }
};
static_assert(update_site<always_host>);

/// Every update on the device.
struct always_device {
  [[nodiscard]] constexpr site_kind site(std::size_t, std::size_t, std::uint64_t) const noexcept {
    return site_kind::device;
  }
  [[nodiscard]] constexpr bool uses_device() const noexcept { return true; }
};
static_assert(update_site<always_device>);

/// `k_host` updates on the host, then `k_device` on the device, repeating along the order
/// ({1, 1}: every other subgroup on the GPU, as Deep Optimizer States does).
struct alternating_site {
  std::size_t k_host = 1;
  std::size_t k_device = 1;

  [[nodiscard]] site_kind site(std::size_t position, std::size_t, std::uint64_t) const {
    STRATA_EXPECTS(k_host + k_device > 0, config_error, "alternating_site: k_host and k_device are both 0");
    return position % (k_host + k_device) < k_host ? site_kind::host : site_kind::device;
  }
  [[nodiscard]] constexpr bool uses_device() const noexcept { return k_device > 0; }
};
static_assert(update_site<alternating_site>);

/// A share of the updates on the device, spread evenly along the order: position p runs on the
/// device when floor((p + 1) * share) > floor(p * share) (0.25: positions 3, 7, 11, ...; 1: all).
/// The fixed split of a step that a cost model (pipeline/update_cost_model.hpp) chose, or one
/// forced by the user.
struct fraction_site {
  double device_share = 0;  ///< in [0, 1]

  [[nodiscard]] site_kind site(std::size_t position, std::size_t, std::uint64_t) const {
    return on_device(device_share, position) ? site_kind::device : site_kind::host;
  }
  [[nodiscard]] constexpr bool uses_device() const noexcept { return device_share > 0; }

  /// The rule above, for sites that compute their share per step.
  [[nodiscard]] static bool on_device(double share, std::size_t position) {
    STRATA_EXPECTS(share >= 0 && share <= 1, config_error, "fraction_site: device share {} is not in [0, 1]", share);
    const double p = static_cast<double>(position);
    return std::floor((p + 1) * share) > std::floor(p * share);
  }
};
static_assert(update_site<fraction_site>);

namespace detail {
/// The table of an update site (core/erased.hpp).
struct update_site_table {
  static constexpr std::string_view concept_name = "update site";
  erased_ops ops_;
  site_kind (*site)(const void*, std::size_t, std::size_t, std::uint64_t);
  bool (*uses_device)(const void*);
  [[nodiscard]] const erased_ops& ops() const noexcept { return ops_; }
  template <class S>
  static constexpr update_site_table of() {
    return {erased_ops_of<S>,
            [](const void* p, std::size_t position, std::size_t subgroup, std::uint64_t step) {
              return static_cast<const S*>(p)->site(position, subgroup, step);
            },
            [](const void* p) { return static_cast<bool>(static_cast<const S*>(p)->uses_device()); }};
  }
};
template <class S>
inline constexpr update_site_table update_site_table_of = update_site_table::of<S>();
}  // namespace detail

class any_update_site;

/// A non-owning reference to an update site, which must outlive it (core/erased.hpp). Copyable.
class update_site_ref {
 public:
  template <update_site S>
    requires(!std::same_as<S, update_site_ref> && !std::same_as<S, any_update_site>)
  update_site_ref(const S& s) noexcept  // NOLINT(google-explicit-constructor): a reference to a site is one
      : ref_(const_cast<S*>(&s), detail::update_site_table_of<S>) {}
  update_site_ref(const void* self, const detail::update_site_table& t) noexcept : ref_(const_cast<void*>(self), t) {}

  [[nodiscard]] site_kind site(std::size_t position, std::size_t subgroup, std::uint64_t step) const {
    return ref_.table().site(ref_.self(), position, subgroup, step);
  }
  [[nodiscard]] bool uses_device() const { return ref_.table().uses_device(ref_.self()); }
  /// The site if it is an S, else null.
  template <update_site S>
  [[nodiscard]] const S* target() const noexcept {
    return ref_.template target<S>();
  }

 private:
  detail::erased_ref<detail::update_site_table> ref_;
};
static_assert(update_site<update_site_ref>);

/// Any update site, chosen at run time and owned (core/erased.hpp): move-only, never empty once
/// made. Default: always_host. One call through a table per subgroup.
class any_update_site {
 public:
  any_update_site() : any_update_site(always_host{}) {}
  template <update_site S>
    requires(!std::same_as<std::remove_cvref_t<S>, any_update_site>)
  any_update_site(S s)  // NOLINT(google-explicit-constructor): a site is one
      : box_(std::make_unique<S>(std::move(s)), detail::update_site_table_of<S>) {}
  any_update_site(any_update_site&&) noexcept = default;
  any_update_site& operator=(any_update_site&&) noexcept = default;

  [[nodiscard]] site_kind site(std::size_t position, std::size_t subgroup, std::uint64_t step) const {
    return box_.table().site(box_.self(), position, subgroup, step);
  }
  [[nodiscard]] bool uses_device() const { return box_.table().uses_device(box_.self()); }
  /// The site if it is an S, else null.
  template <update_site S>
  [[nodiscard]] const S* target() const noexcept {
    return box_.template target<S>();
  }
  operator update_site_ref() const { return {box_.self(), box_.table()}; }  // NOLINT(google-explicit-constructor)

 private:
  detail::erased_box<detail::update_site_table> box_;
};
static_assert(update_site<any_update_site>);

}  // namespace strata
