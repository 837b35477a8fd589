#pragma once
/// What one step of strata::offloaded_adamw did and where its time went, with the lower bound of
/// docs/design.md section 2 computed from the paths' bandwidths, so every report carries its own
/// yardstick.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "strata/core/units.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Traffic of one path (one tier of a multipath, or the whole tier) during a step.
struct path_traffic {
  std::string name;
  double read_bandwidth = 0;   ///< bytes/s from the path's descriptor (0: unknown)
  double write_bandwidth = 0;  ///< bytes/s from the path's descriptor (0: unknown)
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
};

/// One step's figures. Times are seconds of the calling thread: waiting for reads, running the
/// kernel, waiting for writes (to free a slot or at the end of the step), and the whole step.
struct offload_step_stats {
  std::uint64_t step = 0;          ///< step_count() after this step
  std::size_t subgroups = 0;       ///< subgroups updated by this call
  std::size_t device_updates = 0;  ///< of them, updated on the executor's device (the rest on the CPU)
  double read_wait_s = 0;
  double compute_s = 0;
  double kernel_s = 0;             ///< the host kernel's own time, summed over subgroups (device kernels not included)
  double write_wait_s = 0;
  double total_s = 0;
  std::uint64_t cache_hits = 0;    ///< subgroups found in the host cache
  std::uint64_t cache_misses = 0;  ///< subgroups read from a tier
  /// Reads of this step that the previous one started as it returned (prefetch_next_step), and
  /// their bytes (in bytes_read too; a subgroup this step does not update was read for nothing).
  std::uint64_t prefetched = 0;
  std::uint64_t prefetched_bytes = 0;
  /// Writes of this step still in flight when it returned (return_before_writes), and their
  /// bytes (in bytes_written too; they land while the caller computes the next gradients).
  std::uint64_t writes_left = 0;
  std::uint64_t writes_left_bytes = 0;
  /// Subgroups of this step updated while backward handed gradients over (begin_step with
  /// update_as_gradients_land), before step() was called; in `subgroups` too, and their bytes in
  /// bytes_read and bytes_written (moved before the call began).
  std::size_t early_updates = 0;
  /// Subgroups of this step whose update was made while backward handed gradients over, on a copy
  /// of their state (speculatively: clipping or loss scaling on), and that step() adopted as its
  /// own (it found no clipping and no inf/NaN); in `subgroups` too, not in early_updates.
  std::size_t speculative_updates = 0;
  /// Bytes of this step read before step() was called, as gradients landed (in bytes_read too).
  std::uint64_t early_bytes_read = 0;
  std::uint64_t bytes_read = 0;    ///< state (and fp32 gradients, when they live on the tier) read
  std::uint64_t bytes_written = 0; ///< state written (gradient writes of backward are not counted here)
  std::vector<path_traffic> paths;
  /// The step found an inf/NaN gradient and was skipped: no state, no model copy and not the
  /// step count changed (clipping or loss scaling must be on for gradients to be checked).
  bool skipped = false;
  /// Global L2 norm of the unscaled gradients (inf/NaN when skipped); empty when neither
  /// clipping nor loss scaling is on (the gradients are then not summed).
  std::optional<double> grad_norm;
  float clip = 1;        ///< clip coefficient applied (1: none)
  float loss_scale = 1;  ///< the scale this step's gradients carried (dynamic loss scaling; 1: off)
  std::vector<std::size_t> nonfinite_subgroups;  ///< subgroups holding inf/NaN gradients (when skipped)
  /// docs/design.md section 2, the full-duplex bound: max(read / sum of read bandwidths,
  /// written / sum of write bandwidths, kernel_s); 0 when a bandwidth is unknown. A real lower
  /// bound when the bandwidths are the paths' ceilings (a path may read and write at once).
  /// "read" leaves out prefetched_bytes (they may have moved before the call began), "written"
  /// writes_left_bytes (they may move after it returned).
  double bound_s = 0;
  /// read / sum of read bandwidths + written / sum of write bandwidths, or kernel_s when larger:
  /// what the step would take if no path could read and write at once (not a lower bound).
  double serial_bound_s = 0;
  /// bound_s / total_s (1 = as fast as the paths allow; <= 1 when the bandwidths are ceilings);
  /// 0 when the bound is unknown.
  double efficiency = 0;

  /// Fills bound_s and efficiency from paths, bytes and times.
  void compute_bound() {
    double rbw = 0, wbw = 0;
    bool known = !paths.empty();
    for (const auto& p : paths) {
      known = known && p.read_bandwidth > 0 && p.write_bandwidth > 0;
      rbw += p.read_bandwidth;
      wbw += p.write_bandwidth;
    }
    if (!known) {
      bound_s = serial_bound_s = efficiency = 0;
      return;
    }
    const double read = static_cast<double>(bytes_read - std::min(prefetched_bytes, bytes_read)) / rbw;
    const double write = static_cast<double>(bytes_written - std::min(writes_left_bytes, bytes_written)) / wbw;
    bound_s = std::max({read, write, kernel_s});
    serial_bound_s = std::max(read + write, kernel_s);
    efficiency = total_s > 0 ? bound_s / total_s : 0;
  }

  /// One line for logs: "step 3: 12 subgroups, 1.20 s (read wait 0.80, compute 0.30, write wait 0.05),
  /// read 1.50 GiB, written 1.50 GiB, hits 4 / misses 8, bound 1.10 s, efficiency 0.92".
  [[nodiscard]] std::string to_string() const {
    if (skipped)
      return fmt::format("step {}: skipped, inf/NaN gradients in subgroups {} (loss scale {})", step + 1,
                         nonfinite_subgroups, loss_scale);
    return fmt::format(
        "step {}: {} subgroups, {:.3f} s (read wait {:.3f}, compute {:.3f}, write wait {:.3f}), read {}, written "
        "{}, hits {} / misses {}, bound {:.3f} s, efficiency {:.3f}",
        step, subgroups, total_s, read_wait_s, compute_s, write_wait_s, format_size(bytes_read),
        format_size(bytes_written), cache_hits, cache_misses, bound_s, efficiency);
  }
};

/// Totals since construction.
struct offload_stats {
  std::uint64_t steps = 0;
  std::uint64_t skipped_steps = 0;  ///< steps skipped for inf/NaN gradients (not counted in steps)
  offload_step_stats last;          ///< the latest step that completed
  std::uint64_t cache_hits = 0;
  std::uint64_t cache_misses = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t gradient_bytes_written = 0;  ///< fp32 gradients written by accept_gradients (tier residency)
  std::uint64_t host_memory_used = 0;        ///< bytes the optimizer holds now
  std::uint64_t host_memory_peak = 0;        ///< most it ever held (never above the budget)
  std::uint64_t host_memory_budget = 0;
  std::size_t cache_slots = 0;               ///< subgroups the host cache holds
  std::size_t pipeline_slots = 0;            ///< prefetch + write-behind + the one being updated
};

}  // namespace strata
