#pragma once
/// Where to run each update, from measured speeds: the CPU kernel over host slots, or the
/// executor's device (state and gradients copied in, kernel, state and model copied out). The two
/// run at once (Deep Optimizer States): of a step's N subgroups of n parameters, k go to the
/// device, spread evenly along the order with the first one first (position p is a device one
/// when ceil((p + 1) k / N) > ceil(p k / N)), and the model predicts the step's update time by
/// walking the order as the pipeline does:
///
///   a host subgroup takes n c on the pipeline's thread           c = 1 / host kernel rate
///   a device subgroup is issued when the thread reaches it and one of `depth` device slots is
///   free (the thread waits for one otherwise), then goes through copy in (n bytes_in / h2d),
///   kernel (n / device rate) and copy out (n bytes_out / d2h), each stage one at a time
///   the step ends when the thread is done and the last copy out is
///
/// and picks the k with the shortest step (the fewest on the device among equals). Whole
/// subgroups, the pipeline's fill and the order matter because a step has tens of subgroups: a
/// continuous balance c / (c + g) sends a share to a device whose round trip then ends long
/// after the host. `measure_update_rates` (offload/adamw_device.hpp) measures the four speeds of
/// the AdamW update on an executor and the CPU with a probe subgroup (the same code measures PCIe
/// and a GPU, or a simulated device);
/// `cost_model_site` applies the model's k (or a forced share) per step; `observe` folds each
/// finished step's host kernel time back into the host rate (a probe runs in warm caches, a step
/// does not), separately for steps with and without device updates: while the device's copies
/// run, the CPU kernel shares memory bandwidth with them (and, on a simulated device, the CPU
/// itself), so host subgroups of a split step take `host_slowdown` times longer.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/policy/update_site.hpp"

namespace strata {

/// Speeds of the two places an update can run.
struct update_rates {
  double host_params_per_s = 0;    ///< the CPU kernel over host memory
  double device_params_per_s = 0;  ///< the executor's kernel over its device memory
  double h2d_bytes_per_s = 0;      ///< copies from staging memory into device memory
  double d2h_bytes_per_s = 0;      ///< and back
};

/// Bytes one device update moves per parameter (offload_layout knows them for an optimizer:
/// state arrays and gradients in, state arrays and the 16-bit model copy out).
struct device_traffic {
  double in_per_param = 14;   ///< 3 fp32 arrays + a 16-bit gradient
  double out_per_param = 14;  ///< 3 fp32 arrays + a 16-bit model copy
};

/// Whether position `p` of `n` is one of the `k` device positions (the rule of the file comment).
[[nodiscard]] constexpr bool device_position(std::uint64_t p, std::uint64_t k, std::uint64_t n) noexcept {
  return n > 0 && ((p % n + 1) * k + n - 1) / n > ((p % n) * k + n - 1) / n;
}

/// The split model of the file comment.
struct update_cost_model {
  update_rates rates{};
  device_traffic traffic{};
  /// Device updates in flight at once (offload_options::device_depth, or fewer when free device
  /// memory holds fewer slots; 0: no device).
  std::size_t device_depth = 2;
  /// How much longer a host update takes while device updates run beside it (>= 1).
  double host_slowdown = 1;

  /// Predicted update time of a step of `subgroups` subgroups of `params` parameters with `k` on
  /// the device (infinity when k > 0 and no device update is possible).
  [[nodiscard]] double seconds(std::size_t subgroups, double params, std::size_t k) const {
    k = std::min(k, subgroups);
    const double alone = params * per(rates.host_params_per_s, 1);
    if (k == 0) return static_cast<double>(subgroups) * alone;
    const double host = alone * std::max(1.0, host_slowdown);
    if (!device_usable()) return std::numeric_limits<double>::infinity();
    const double in = params * per(rates.h2d_bytes_per_s, traffic.in_per_param);
    const double kernel = params * per(rates.device_params_per_s, 1);
    const double out = params * per(rates.d2h_bytes_per_s, traffic.out_per_param);
    std::vector<double> slot_free(device_depth, 0.0);  // when each device slot is free again
    double thread = 0, in_free = 0, kernel_free = 0, out_free = 0;
    for (std::size_t p = 0; p < subgroups; ++p) {
      if (!device_position(p, k, subgroups)) {
        thread += host;
        continue;
      }
      auto slot = std::min_element(slot_free.begin(), slot_free.end());
      thread = std::max(thread, *slot);  // the thread waits for a slot
      in_free = std::max(thread, in_free) + in;
      kernel_free = std::max(in_free, kernel_free) + kernel;
      out_free = std::max(kernel_free, out_free) + out;
      *slot = out_free;
    }
    return std::max(thread, out_free);
  }
  /// The k of the file comment.
  [[nodiscard]] std::size_t best_device_count(std::size_t subgroups, double params) const {
    std::size_t best = 0;
    double best_s = seconds(subgroups, params, 0);
    for (std::size_t k = 1; k <= subgroups && device_usable(); ++k)
      if (const double t = seconds(subgroups, params, k); t < best_s) {
        best = k;
        best_s = t;
      }
    return best;
  }
  /// The device_depth that `free_bytes` of device memory allows when each device update needs
  /// `slot_bytes` (state, gradients, model copy): min(depth, free_bytes / slot_bytes).
  [[nodiscard]] static std::size_t fitting_depth(std::size_t depth, std::uint64_t free_bytes,
                                                 std::uint64_t slot_bytes) noexcept {
    return slot_bytes == 0 ? depth : static_cast<std::size_t>(std::min<std::uint64_t>(depth, free_bytes / slot_bytes));
  }
  /// Whether a device update is possible at all (every rate known, a slot to run in).
  [[nodiscard]] bool device_usable() const noexcept {
    return device_depth > 0 && rates.device_params_per_s > 0 && rates.h2d_bytes_per_s > 0 && rates.d2h_bytes_per_s > 0;
  }

 private:
  static double per(double rate, double amount) noexcept {
    return rate > 0 ? amount / rate : std::numeric_limits<double>::infinity();
  }
};

/// The update site that follows an update_cost_model for a step of `subgroups` subgroups of
/// `subgroup_params` parameters: k of them on the device (the model's, or a forced share), at
/// the positions device_position() names (exactly k of the N, evenly spread, the first one
/// first). Copies share the model, so keep one to call observe() and force() while the pipeline
/// holds another. Not thread-safe: force() and observe() between steps.
class cost_model_site {
 public:
  cost_model_site(update_cost_model model, std::size_t subgroups, std::size_t subgroup_params)
      : state_(std::make_shared<shared>(shared{model, subgroups, static_cast<double>(subgroup_params), {}, {}, {}, {}})) {
    STRATA_EXPECTS(subgroups > 0 && subgroup_params > 0, config_error,
                   "cost_model_site: {} subgroups of {} parameters", subgroups, subgroup_params);
  }

  [[nodiscard]] site_kind site(std::size_t position, std::size_t, std::uint64_t) const {
    // One k for the whole step: it changes only through force() and observe(), between steps.
    return device_position(position, device_count(), state_->subgroups) ? site_kind::device : site_kind::host;
  }
  /// Device memory is set aside when a device update is possible or one is forced, so that a
  /// later force() or a change of measured rates finds it there.
  [[nodiscard]] bool uses_device() const noexcept {
    return state_->model.device_usable() || (state_->forced && *state_->forced > 0);
  }

  /// Subgroups of a step on the device: the forced share's (rounded), else the model's.
  [[nodiscard]] std::size_t device_count() const {
    auto& s = *state_;
    if (s.forced) return static_cast<std::size_t>(std::llround(*s.forced * static_cast<double>(s.subgroups)));
    if (!s.chosen) s.chosen = s.model.best_device_count(s.subgroups, s.subgroup_params);  // once per change
    return *s.chosen;
  }
  /// device_count() / subgroups.
  [[nodiscard]] double device_share() const {
    return static_cast<double>(device_count()) / static_cast<double>(state_->subgroups);
  }
  /// The model's predicted update time of a step with `k` subgroups on the device.
  [[nodiscard]] double predicted_seconds(std::size_t k) const {
    return state_->model.seconds(state_->subgroups, state_->subgroup_params, k);
  }
  /// Forces a fixed share (std::nullopt: back to the model). config_error outside [0, 1].
  void force(std::optional<double> share) {
    STRATA_EXPECTS(!share || (*share >= 0 && *share <= 1), config_error,
                   "cost_model_site: forced device share {} is not in [0, 1]", share ? *share : 0.0);
    state_->forced = share;
  }
  /// Folds a finished step's host kernel figures into the model (parameters over seconds, summed
  /// over the steps observed): steps without device updates give the host rate, steps with some
  /// give the host rate beside the device and so host_slowdown (the ratio of the two, once both
  /// are known; at least 1). Call between steps.
  void observe(std::uint64_t host_params, double host_kernel_s, std::size_t device_updates = 0) {
    if (host_params == 0 || !(host_kernel_s > 0)) return;
    auto& s = *state_;
    auto& sums = device_updates == 0 ? s.alone : s.shared;
    sums.params += static_cast<double>(host_params);
    sums.seconds += host_kernel_s;
    if (s.alone.seconds > 0) s.model.rates.host_params_per_s = s.alone.params / s.alone.seconds;
    else s.model.rates.host_params_per_s = s.shared.params / s.shared.seconds;  // the best known so far
    if (s.alone.seconds > 0 && s.shared.seconds > 0)
      s.model.host_slowdown = std::max(1.0, (s.alone.params / s.alone.seconds) / (s.shared.params / s.shared.seconds));
    s.chosen.reset();
  }
  [[nodiscard]] const update_cost_model& model() const noexcept { return state_->model; }

 private:
  struct shared {
    update_cost_model model;
    std::size_t subgroups;
    double subgroup_params;
    std::optional<double> forced;
    struct sums {
      double params = 0, seconds = 0;
    } alone, shared;
    std::optional<std::size_t> chosen;  // the model's k for the current rates
  };
  std::shared_ptr<shared> state_;
};
static_assert(update_site<cost_model_site>);

}  // namespace strata
