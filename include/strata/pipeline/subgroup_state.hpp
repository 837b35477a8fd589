#pragma once
/// The life of one subgroup's state in a pipeline, as an explicit state machine: where the state
/// is (phase) and whether the host copy is newer than the tier's (dirty), and a pure transition
/// function that says which events are legal in which state and where they lead. The pipeline
/// applies every event it sees through `transition`, so an illegal move is caught where it happens
/// (a bug: it aborts), and the rules can be checked exhaustively (tests/pipeline).
///
///   on_tier --read--> reading --read_done--> resident(clean)           read_failed: back to on_tier
///   resident --update--> updating --update_done--> resident(dirty)     host kernel, in place
///   resident --h2d--> to_device --h2d_done--> on_device --kernel_done--> to_host --d2h_done-->
///            resident(dirty)                                          device kernel; a failure in
///                                                                     any of these: back to
///                                                                     resident, unchanged
///   resident --write--> writing --write_done--> resident(clean)        write_failed: resident, dirty
///   resident(clean) --drop--> on_tier                                  the slot goes back
///
/// The update is committed at update_done or d2h_done (the last event of the update) and only
/// there: before it the subgroup is at the old step, after it at the new one, never in between.
/// A dirty subgroup can never be dropped, so no sequence of events loses an update.

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

/// Where a subgroup's state is.
enum class subgroup_phase : std::uint8_t {
  on_tier,    ///< only on the tier: no host slot
  reading,    ///< tier -> host slot in flight
  resident,   ///< in a host slot, idle
  updating,   ///< the host kernel updates the host slot in place
  to_device,  ///< host slot -> device slot in flight
  on_device,  ///< the device kernel runs
  to_host,    ///< device slot -> a fresh host slot in flight (the old one keeps the old state)
  writing,    ///< host slot -> tier in flight (the slot stays until it completes)
};
inline constexpr std::size_t subgroup_phase_count = 8;

/// What happens to a subgroup.
enum class subgroup_event : std::uint8_t {
  read, read_done, read_failed,
  update, update_done, update_failed,
  h2d, h2d_done, kernel_done, d2h_done, device_failed,
  write, write_done, write_failed,
  drop,
};
inline constexpr std::size_t subgroup_event_count = 15;

[[nodiscard]] constexpr std::string_view to_string(subgroup_phase p) noexcept {
  constexpr std::array<std::string_view, subgroup_phase_count> names{
      "on_tier", "reading", "resident", "updating", "to_device", "on_device", "to_host", "writing"};
  return static_cast<std::size_t>(p) < names.size() ? names[static_cast<std::size_t>(p)] : "unknown";
}

[[nodiscard]] constexpr std::string_view to_string(subgroup_event e) noexcept {
  constexpr std::array<std::string_view, subgroup_event_count> names{
      "read", "read_done", "read_failed", "update", "update_done", "update_failed", "h2d", "h2d_done",
      "kernel_done", "d2h_done", "device_failed", "write", "write_done", "write_failed", "drop"};
  return static_cast<std::size_t>(e) < names.size() ? names[static_cast<std::size_t>(e)] : "unknown";
}

/// A subgroup's state: its phase and whether its host copy holds an update the tier lacks.
struct subgroup_state {
  subgroup_phase phase = subgroup_phase::on_tier;
  bool dirty = false;
  friend constexpr bool operator==(const subgroup_state&, const subgroup_state&) = default;
};

/// Where `event` leads from `s`, or nullopt when it is illegal there. Pure and constexpr.
[[nodiscard]] constexpr std::optional<subgroup_state> transition(subgroup_state s, subgroup_event event) noexcept {
  using P = subgroup_phase;
  using E = subgroup_event;
  const auto to = [](P p, bool dirty) { return std::optional<subgroup_state>(subgroup_state{p, dirty}); };
  switch (s.phase) {
    case P::on_tier:
      if (s.dirty) return std::nullopt;  // only a host copy can be newer than the tier
      if (event == E::read) return to(P::reading, false);
      return std::nullopt;
    case P::reading:
      if (s.dirty) return std::nullopt;
      if (event == E::read_done) return to(P::resident, false);
      if (event == E::read_failed) return to(P::on_tier, false);
      return std::nullopt;
    case P::resident:
      switch (event) {
        case E::update: return to(P::updating, s.dirty);
        case E::h2d: return to(P::to_device, s.dirty);
        case E::write: return s.dirty ? to(P::writing, true) : std::nullopt;  // a clean copy has nothing to write
        case E::drop: return s.dirty ? std::nullopt : to(P::on_tier, false);  // never lose an update
        default: return std::nullopt;
      }
    case P::updating:
      if (event == E::update_done) return to(P::resident, true);
      if (event == E::update_failed) return to(P::resident, s.dirty);
      return std::nullopt;
    case P::to_device:
      if (event == E::h2d_done) return to(P::on_device, s.dirty);
      if (event == E::device_failed) return to(P::resident, s.dirty);
      return std::nullopt;
    case P::on_device:
      if (event == E::kernel_done) return to(P::to_host, s.dirty);
      if (event == E::device_failed) return to(P::resident, s.dirty);
      return std::nullopt;
    case P::to_host:
      if (event == E::d2h_done) return to(P::resident, true);
      if (event == E::device_failed) return to(P::resident, s.dirty);
      return std::nullopt;
    case P::writing:
      if (!s.dirty) return std::nullopt;
      if (event == E::write_done) return to(P::resident, false);
      if (event == E::write_failed) return to(P::resident, true);
      return std::nullopt;
  }
  return std::nullopt;
}

/// Whether the subgroup holds a host slot in state `s` (every phase but on_tier).
[[nodiscard]] constexpr bool holds_host_slot(subgroup_state s) noexcept { return s.phase != subgroup_phase::on_tier; }

/// Whether work on the subgroup is in flight (it must not be dropped, evicted or started again).
[[nodiscard]] constexpr bool in_flight(subgroup_state s) noexcept {
  return s.phase != subgroup_phase::on_tier && s.phase != subgroup_phase::resident;
}

}  // namespace strata
