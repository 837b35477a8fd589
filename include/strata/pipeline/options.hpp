#pragma once
/// What a subgroup pipeline is given and what it reports: the objects it moves (one per
/// subgroup), its depths and sizes, and the statistics of one pass.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata {

/// One subgroup as the pipeline stores it: its state object and, optionally, a side object read
/// into the slot after the state with every read (never written by the pipeline: e.g. fp32
/// gradients that backward wrote to the tier), at the first multiple of aux_alignment after the
/// state (aux_offset), so that its elements are aligned whatever the state's size.
struct pipeline_object {
  std::string name;
  std::uint64_t bytes = 0;
  std::string aux_name{};
  std::uint64_t aux_bytes = 0;

  static constexpr std::uint64_t aux_alignment = 16;
  /// Where the side object starts in a slot: the state's bytes rounded up to aux_alignment.
  [[nodiscard]] static constexpr std::uint64_t aux_offset(std::uint64_t state_bytes) noexcept {
    return (state_bytes + aux_alignment - 1) / aux_alignment * aux_alignment;
  }
  /// Bytes of a slot that holds this object and its side object.
  [[nodiscard]] constexpr std::uint64_t slot_bytes() const noexcept {
    return aux_bytes > 0 ? aux_offset(bytes) + aux_bytes : bytes;
  }
};

/// Depths and sizes of a subgroup_pipeline.
struct pipeline_options {
  std::size_t cache_slots = 0;         ///< subgroups the host cache keeps between passes
  std::size_t prefetch_depth = 2;      ///< subgroups read ahead, per path (0: only the next one)
  std::size_t write_behind_depth = 2;  ///< writes in flight, per path (at least 1)
  std::size_t device_depth = 2;        ///< device updates in flight, when the site uses the device
  std::size_t device_extra_bytes = 0;  ///< device scratch per subgroup beyond its state (the kernel's)
  /// Write a cached subgroup right after its update when it will leave the cache before the pass
  /// ends (as its policy plans, eviction_policy_with_plan; else when the order still walks a
  /// cache's worth after it).
  bool eager_writes = true;
  /// run() returns once every update of the pass committed, with its last writes in flight (those
  /// still queued are issued as it returns; the host slots they hold bound them): the next call
  /// takes them over or waits for them, and reports a failed one.
  bool return_before_writes = false;
  /// Once a pass has started every read it needs, it reads the first subgroups of the next
  /// pass's order (`next`, given to run()) into free host slots, one kept free, so that the paths
  /// do not idle while its last updates and writes finish; it returns with those reads in flight
  /// and the next pass takes them over (counted there as prefetched). A failed one changes nothing.
  bool read_next_in_pass = false;
  /// An open pass (run_open) also reads the subgroups of its order as planned that were not
  /// offered yet, in that order, up to prefetch_depth per path, into free host slots (one kept
  /// free, so that an offered subgroup always finds one), once every offered subgroup's read has
  /// started: the state of backward's later subgroups is resident when their gradients land
  /// instead of being read only then. A failed one changes nothing (the subgroup is read again
  /// once offered).
  bool read_ahead_of_offers = false;
  std::string trace_prefix = "pipeline";  ///< span names: <prefix>.read_wait, .compute, .write_wait, .device_update

  /// Host slots these options need: the cache, the read-ahead, the writes and the one updating.
  [[nodiscard]] std::size_t host_slots() const noexcept { return cache_slots + prefetch_depth + write_behind_depth + 1; }

  void validate() const {
    STRATA_EXPECTS(write_behind_depth >= 1, config_error, "pipeline_options: write_behind_depth must be at least 1");
    STRATA_EXPECTS(prefetch_depth <= 4096 && write_behind_depth <= 4096 && device_depth <= 4096, config_error,
                   "pipeline_options: prefetch_depth {}, write_behind_depth {} or device_depth {} above 4096",
                   prefetch_depth, write_behind_depth, device_depth);
  }
};

/// What one pass did. Times are the driving thread's, split by what it waited for (they never
/// overlap, so they add up to at most total_s).
struct pass_stats {
  std::size_t updated = 0;          ///< subgroups whose update committed
  std::size_t host_updates = 0;
  std::size_t device_updates = 0;
  double read_wait_s = 0;           ///< waiting for the state the next update needs
  double compute_s = 0;             ///< waiting while an update ran and nothing else was needed
  double kernel_s = 0;              ///< host kernels' own time, summed (they run one at a time)
  double write_wait_s = 0;          ///< waiting for writes (slots they hold, the end of the pass)
  double total_s = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t cache_misses = 0;
  std::uint64_t bytes_read = 0;     ///< state and side objects
  std::uint64_t bytes_written = 0;
  std::vector<std::uint64_t> path_read;     ///< per path
  std::vector<std::uint64_t> path_written;  ///< per path
  /// Subgroups whose read prefetch() started before the pass, and their bytes (in bytes_read
  /// too; moved, in part or whole, before the pass began).
  std::size_t prefetched = 0;
  std::uint64_t prefetched_bytes = 0;
  /// Writes still in flight when run() returned (return_before_writes), and their bytes (in
  /// bytes_written too; they land after the pass).
  std::size_t writes_left = 0;
  std::uint64_t writes_left_bytes = 0;
  /// Speculative updates made (an open pass of run_speculative), and those adopted as updates
  /// (a run() after adopt_speculation(true); in `updated` too).
  std::size_t speculated = 0;
  std::size_t adopted = 0;
};

}  // namespace strata
