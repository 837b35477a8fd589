#pragma once
/// The run-time AdamW under the names it had before the engine took other rules:
/// make_offloaded_adamw is make_offloaded_optimizer (offload/make_offloaded_optimizer.hpp) for an
/// AdamW rule ("adamw", "adamw-bf16" for bf16 moments or "adamw-8bit" for 8-bit ones), starting from AdamW's own state
/// (adamw_state_view, e.g. torch.optim.AdamW's); load_offloaded_adamw loads an AdamW checkpoint.
/// Both return the same any_offloaded_optimizer (any_offloaded_adamw names it).

#include <filesystem>
#include <span>
#include <string_view>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/any_offloaded_optimizer.hpp"
#include "strata/offload/make_offloaded_optimizer.hpp"
#include "strata/optim/adamw_8bit_rule.hpp"
#include "strata/optim/adamw_bf16_rule.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/adamw_state.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/any_tier.hpp"

namespace strata {

/// The run-time AdamW (an any_offloaded_optimizer of an AdamW rule).
using any_offloaded_adamw = any_offloaded_optimizer;
/// The same with updates on executor Exec.
template <executor Exec>
using any_offloaded_adamw_on = any_offloaded_optimizer_on<Exec>;

namespace detail {
inline const offloaded_optimizer_config& adamw_config(const offloaded_optimizer_config& c, std::string_view who) {
  STRATA_EXPECTS(c.rule == adamw_rule::tag || c.rule == adamw_bf16_rule::tag || c.rule == adamw_8bit_rule::tag,
                 config_error,
                 "{}: update rule '{}' is not AdamW's (adamw, adamw-bf16 or adamw-8bit; make_offloaded_optimizer takes "
                 "any)",
                 who,
                 c.rule);
  return c;
}
}  // namespace detail

/// Builds the preset's AdamW over the configured paths, starting from `params` (fp32, a 16-bit
/// model's own weights, or its tensors; see host_weights) and, when given, existing AdamW state
/// (moments and steps taken; see offloaded_adamw::from_state).
[[nodiscard]] inline any_offloaded_adamw make_offloaded_adamw(const offloaded_adamw_config& config, host_weights params,
                                                              const adamw_state_view& state = {}) {
  return detail::make_from_weights(detail::adamw_config(config, "make_offloaded_adamw"), params, state,
                                   "make_offloaded_adamw");
}
/// As above, from fp32 weights.
[[nodiscard]] inline any_offloaded_adamw make_offloaded_adamw(const offloaded_adamw_config& config,
                                                              std::span<const float> params,
                                                              const adamw_state_view& state = {}) {
  return make_offloaded_adamw(config, host_weights(params), state);
}

/// As above, with updates on `exec` (which must outlive the optimizer) where `site` says, and
/// gradients and the model copy accepted in exec's device memory.
template <executor Exec, update_site Site>
[[nodiscard]] any_offloaded_adamw_on<Exec> make_offloaded_adamw(const offloaded_adamw_config& config, Exec& exec,
                                                                Site site, std::span<const float> params,
                                                                const adamw_state_view& state = {}) {
  return detail::make_on(detail::adamw_config(config, "make_offloaded_adamw"), exec, std::move(site), params, state,
                         "make_offloaded_adamw");
}

/// Builds the preset's AdamW over the configured paths from the checkpoint in `dir`; a checkpoint
/// of another rule is a config_error naming both.
[[nodiscard]] inline any_offloaded_adamw load_offloaded_adamw(const offloaded_adamw_config& config,
                                                              const std::filesystem::path& dir) {
  return load_offloaded_optimizer(detail::adamw_config(config, "load_offloaded_adamw"), dir);
}
/// As above, from the checkpoint in `store`.
[[nodiscard]] inline any_offloaded_adamw load_offloaded_adamw(const offloaded_adamw_config& config, any_tier& store) {
  return load_offloaded_optimizer(detail::adamw_config(config, "load_offloaded_adamw"), store);
}
/// As above, with updates on `exec` where `site` says.
template <executor Exec, update_site Site>
[[nodiscard]] any_offloaded_adamw_on<Exec> load_offloaded_adamw(const offloaded_adamw_config& config, Exec& exec,
                                                                Site site, const std::filesystem::path& dir) {
  return load_offloaded_optimizer(detail::adamw_config(config, "load_offloaded_adamw"), exec, std::move(site), dir);
}

}  // namespace strata
