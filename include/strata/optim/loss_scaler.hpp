#pragma once
/// Dynamic loss scaling as torch.amp.GradScaler does it. The loss is multiplied by `scale()`
/// before backward, so 16-bit gradients keep their small values; the step multiplies them by
/// `inv_scale()` (GradScaler.unscale_). A step whose gradients hold an inf or a NaN is skipped
/// and the scale backs off; after `growth_interval` steps in a row without one it grows.
///
/// Same arithmetic as torch (amp_update_scale_ in ATen): the scale is a float, the new scale is
/// float(scale * factor) with the factor in double, a grown scale that is not finite is not
/// taken, and the inverse is float(1 / double(scale)) (`_scale.double().reciprocal().float()`).

#include <cmath>
#include <cstdint>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata {

/// Settings of dynamic loss scaling, named and defaulted as torch.amp.GradScaler's.
struct loss_scaler_options {
  bool enabled = false;          ///< off: scale() is 1 and nothing grows or backs off
  double init_scale = 65536.0;   ///< 2^16
  double growth_factor = 2.0;    ///< applied after growth_interval clean steps in a row
  double backoff_factor = 0.5;   ///< applied after a step with inf/NaN gradients
  std::int64_t growth_interval = 2000;

  /// Throws config_error naming the first value GradScaler would also reject (or that makes no sense).
  void validate() const {
    STRATA_EXPECTS(std::isfinite(init_scale) && init_scale > 0 && static_cast<float>(init_scale) > 0 &&
                       std::isfinite(static_cast<float>(init_scale)),
                   config_error, "loss_scaler_options: init_scale {} must be a positive finite float", init_scale);
    STRATA_EXPECTS(std::isfinite(growth_factor) && growth_factor > 1.0, config_error,
                   "loss_scaler_options: growth_factor {} must be greater than 1", growth_factor);
    STRATA_EXPECTS(backoff_factor > 0.0 && backoff_factor < 1.0, config_error,
                   "loss_scaler_options: backoff_factor {} must be in (0, 1)", backoff_factor);
    STRATA_EXPECTS(growth_interval > 0, config_error, "loss_scaler_options: growth_interval {} must be positive",
                   growth_interval);
  }
};

/// The scale and its growth tracker; see the file comment.
class dynamic_loss_scaler {
 public:
  explicit dynamic_loss_scaler(loss_scaler_options o = {}) : opts_(o) {
    opts_.validate();
    scale_ = opts_.enabled ? static_cast<float>(opts_.init_scale) : 1.0f;
  }

  /// What to multiply the loss by (1 when disabled).
  [[nodiscard]] float scale() const noexcept { return scale_; }
  /// What to multiply the gradients by before the update: float(1 / double(scale)).
  [[nodiscard]] float inv_scale() const noexcept { return static_cast<float>(1.0 / static_cast<double>(scale_)); }
  /// Clean steps in a row since the scale last changed.
  [[nodiscard]] std::int64_t growth_tracker() const noexcept { return tracker_; }
  [[nodiscard]] const loss_scaler_options& options() const noexcept { return opts_; }
  [[nodiscard]] bool enabled() const noexcept { return opts_.enabled; }

  /// After a step: back off if it found inf/NaN gradients, else count it and grow every
  /// growth_interval clean steps. Nothing changes when disabled.
  void update(bool found_nonfinite) noexcept {
    if (!opts_.enabled) return;
    if (found_nonfinite) {
      // torch would go on to 0 and then divide by it; a scale that small is already useless
      const float backed = static_cast<float>(static_cast<double>(scale_) * opts_.backoff_factor);
      if (backed > 0) scale_ = backed;
      tracker_ = 0;
      return;
    }
    if (++tracker_ == opts_.growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(scale_) * opts_.growth_factor);
      if (std::isfinite(grown)) scale_ = grown;
      tracker_ = 0;
    }
  }

  /// Restores a saved scale and tracker (a checkpoint's); config_error if they cannot be a
  /// scaler's state. Ignored when disabled.
  void restore(float scale, std::int64_t tracker) {
    if (!opts_.enabled) return;
    STRATA_EXPECTS(std::isfinite(scale) && scale > 0 && tracker >= 0 && tracker < opts_.growth_interval, config_error,
                   "dynamic_loss_scaler: cannot restore scale {} with growth tracker {} (growth_interval {})", scale,
                   tracker, opts_.growth_interval);
    scale_ = scale;
    tracker_ = tracker;
  }

 private:
  loss_scaler_options opts_;
  float scale_ = 1.0f;
  std::int64_t tracker_ = 0;
};

}  // namespace strata
