#pragma once
/// The `update_site` concept and its models: where each subgroup's update runs. On the host, the
/// CPU kernel updates the state in its host slot; on the device, the state is copied in, a kernel
/// updates it there and it is copied back (Deep Optimizer States runs every other subgroup on the
/// GPU so that the CPU and the GPU work at once). A site is asked per subgroup, with the
/// subgroup's position in the step's order, so fixed patterns are easy to express; a cost model
/// can be one too.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "strata/core/error.hpp"
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

}  // namespace strata
