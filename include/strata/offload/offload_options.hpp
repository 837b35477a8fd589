#pragma once
/// Options of strata::offloaded_adamw that are not AdamW hyper-parameters: how the parameters are
/// split into subgroups, how much host memory the optimizer may use, how deep its pipeline is, and
/// what happens to the gradients before the update (clipping, loss scaling).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/optim/grad_norm.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Where gradients wait between backward and the update.
enum class gradient_residency : std::uint8_t {
  host,  ///< in host memory, in the type they arrive in (16-bit stays 16-bit); converted inside the update
  tier,  ///< widened to fp32 and written to the tier, read back at the update (ZeRO-Infinity's way)
  /// host when the budget left after the pipeline and cache holds a store of every parameter's
  /// gradients at 4 bytes each (fp32, the widest they come in), else tier: decided at
  /// construction, before anything is written (offload().gradients tells which).
  automatic,
  /// The caller keeps its gradients and gives them to each step (a span of every parameter's,
  /// or framework tensors: param_tensor), so no store is kept or budgeted; accept_gradients is
  /// refused.
  caller,
};

[[nodiscard]] constexpr std::string_view to_string(gradient_residency g) noexcept {
  switch (g) {
    case gradient_residency::host: return "host";
    case gradient_residency::tier: return "tier";
    case gradient_residency::automatic: return "automatic";
    case gradient_residency::caller: return "caller";
  }
  return "unknown";
}

/// Subgroup size, host memory and pipeline of an offloaded_adamw.
struct offload_options {
  /// Parameters per subgroup (the unit of transfer and of caching); the last subgroup may be shorter.
  std::size_t subgroup_elems = std::size_t{1} << 24;
  /// Host memory for subgroups kept between updates (whole subgroup slots; the remainder is unused).
  std::uint64_t host_cache_bytes = 0;
  /// Subgroups kept between updates, when set: replaces host_cache_bytes (whose slots are page
  /// rounded, so a byte count computed without that rounding silently holds one slot fewer).
  std::optional<std::size_t> cache_subgroups{};
  /// Every byte of host memory the optimizer allocates (cache, pipeline slots, gradient store)
  /// must fit in this; a budget too small for the pipeline is a config_error at construction.
  std::uint64_t host_memory_budget = unlimited_capacity;
  /// Subgroups read ahead of the update, per path (0: only the next one). The host slots of the
  /// pipeline are prefetch_depth + write_behind_depth + 1 (see required_host_memory).
  std::size_t prefetch_depth = 2;
  /// Writes in flight at once, per path (at least 1).
  std::size_t write_behind_depth = 2;
  /// Device updates in flight at once, when the update site may choose the device.
  std::size_t device_depth = 2;
  /// Write a cached subgroup right after its update when it will leave the cache before the
  /// step ends (as the eviction policy plans it, eviction_policy_with_plan; else when the order
  /// still walks a cache's worth after it), so that writes start with the step (it stays
  /// cached, clean).
  bool eager_writes = true;
  /// Once a step has started every read it needs, and from the moment it returns on an
  /// optimizer thread, strata reads the subgroups the next step updates first
  /// (those this step updated, in the next step's order, that the cache does not hold) into
  /// free pipeline slots, one kept free, as slots free up (as the writes the step left land),
  /// while the caller computes the next gradients. They change no state; the next call that
  /// needs the pipeline ends them (what they read stays for the next step). A failed read is
  /// read again by the step; a failed write they find is raised, typed, by the next call.
  bool prefetch_next_step = true;
  /// A step returns once the model copy holds every updated weight, with its last state writes
  /// still in flight (they land while the caller computes the next gradients; the host slots
  /// they hold bound them). The next step takes them over; flush(), save(), reads of the state,
  /// remove_state() and destruction wait for them. A failed one is raised, typed, by the call
  /// that finds it, and loses nothing: its subgroup keeps the state in its slot and the next
  /// call writes it first.
  bool return_before_writes = true;
  /// After begin_step (the rates of a step declared before backward), each subgroup whose
  /// gradients are all handed over is read and updated at once, while backward goes on, in the
  /// order they land; with clipping or loss scaling on (the update needs the norm of every
  /// gradient) see speculate_updates. The update order follows the landing order of the last
  /// such step. Off: begin_step only declares.
  bool update_as_gradients_land = true;
  /// With update_as_gradients_land and clipping or loss scaling on: each landed subgroup is read
  /// and then updated on a copy of its state in a free host slot, as if the step neither clipped
  /// nor was skipped (one slot kept free for the reads of later subgroups; the copies hold their
  /// slots until step()). step() adopts the copies when it finds exactly that (a clip coefficient
  /// of 1, no inf/NaN: the same bits as updating then), else drops them and updates those
  /// subgroups itself: the subgroups' own state is never changed, written or shown in the model
  /// copy before step() decides. Not after a step that clipped or was skipped (the next one
  /// likely does too: its copies would only take slots from the reads). Off: a landed subgroup
  /// is only read, and updated by step().
  bool speculate_updates = true;
  /// CPU threads of the update kernel (the calling thread included).
  std::size_t threads = default_thread_count();
  /// Where gradients given to accept_gradients (and, with `tier`, to step) wait for the update.
  gradient_residency gradients = gradient_residency::host;
  /// Clip the gradients to this global L2 norm before the update, as
  /// torch.nn.utils.clip_grad_norm_(max_norm) does after GradScaler.unscale_; 0: no clipping.
  double max_grad_norm = 0;
  /// Dynamic loss scaling (torch.amp.GradScaler): multiply the loss by the optimizer's
  /// loss_scale() before backward; a step whose gradients hold an inf/NaN is skipped.
  loss_scaler_options loss_scaling{};
  /// Prefix of the tier objects ("<prefix>.sg-<i>"), so that several optimizers can share a tier.
  std::string object_prefix = "strata";

  /// Throws config_error naming the first invalid value.
  void validate() const {
    STRATA_EXPECTS(subgroup_elems > 0, config_error, "offload_options: subgroup_elems must be positive");
    STRATA_EXPECTS(subgroup_elems <= (std::size_t{1} << 40), config_error,
                   "offload_options: subgroup_elems {} is too large", subgroup_elems);
    STRATA_EXPECTS(write_behind_depth >= 1, config_error,
                   "offload_options: write_behind_depth must be at least 1 (got 0)");
    STRATA_EXPECTS(prefetch_depth <= 4096 && write_behind_depth <= 4096 && device_depth <= 4096, config_error,
                   "offload_options: prefetch_depth {} / write_behind_depth {} / device_depth {} above 4096",
                   prefetch_depth, write_behind_depth, device_depth);
    STRATA_EXPECTS(threads >= 1 && threads <= 1024, config_error, "offload_options: threads {} (need 1..1024)",
                   threads);
    STRATA_EXPECTS(max_grad_norm >= 0 && std::isfinite(max_grad_norm), config_error,
                   "offload_options: max_grad_norm {} (need a finite value >= 0; 0: no clipping)", max_grad_norm);
    loss_scaling.validate();
    bool ok = !object_prefix.empty() && object_prefix.size() <= 100 && object_prefix.front() != '.';
    for (char c : object_prefix)
      ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-');
    STRATA_EXPECTS(ok, config_error, "offload_options: object_prefix '{}' (use 1-100 of [A-Za-z0-9._-])",
                   object_prefix);
  }
};

/// How one step over gradient ranges (offloaded_adamw::step with gradient_range spans) treats
/// the model copy it is given and the clipping and loss-scaling decision.
struct step_options {
  /// The model copy given to the step is the truth, as a framework's parameters are between
  /// steps: where an element differs from its master weight rounded to the copy's type (someone
  /// wrote into the model since the last step: loaded weights, an initialisation, a clamp), the
  /// master takes the copy's value (widened) before the update. Exact for an fp32 copy; a 16-bit
  /// copy that holds the rounded master leaves the master's extra bits alone. Host updates only.
  bool adopt_model = false;
  /// The clip and skip decision for the whole model, made by the caller from every optimizer's
  /// (or process's) gradient_stats; none: the optimizer decides from its own gradients when
  /// clipping or loss scaling is on.
  std::optional<step_decision> decision{};
};

}  // namespace strata
