#pragma once
/// slot_pool: the bounded buffers a subgroup pipeline moves state through, and the host cache
/// that decides which subgroups keep theirs between passes.
///
/// - Host slots (one subgroup's state, plus any side data read with it), allocated once from a
///   host_budget whose memory kind follows the executor (pinned for CUDA, so copies to the device
///   run at full speed).
/// - Device slots (executor memory, state plus the kernel's scratch), each paired with a host
///   "landing" slot that the copy back from the device fills: the subgroup's own host slot keeps
///   the old state until the update commits, and then the two swap roles.
/// - The cache index of the subgroups kept between passes, ranked by an any_eviction_policy (one
///   virtual call per cache event), so that the pipeline's machinery is compiled once per
///   executor, not once per policy. The pipeline pins a cached subgroup in the policy while work
///   on it is in flight, so it is never the victim.
///
/// Not thread-safe: the pipeline's thread owns it.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "strata/core/budget.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/exec/executor.hpp"
#include "strata/policy/cache_index.hpp"
#include "strata/policy/any_eviction_policy.hpp"

namespace strata {

/// How many buffers of which size a slot_pool holds.
struct slot_pool_options {
  std::size_t host_slots = 0;         ///< host slots for reads, updates and writes (the cache's included)
  std::size_t host_slot_bytes = 0;    ///< bytes of each host slot
  std::size_t cache_slots = 0;        ///< how many of them the cache keeps between passes (0: no cache)
  std::size_t device_slots = 0;       ///< device slots (each with its landing host slot)
  std::size_t device_slot_bytes = 0;  ///< bytes of each device slot
};

template <executor Exec>
class slot_pool {
 public:
  using device_buffer_type = typename Exec::device_buffer;

  /// Allocates every buffer now (host ones from `budget`, device ones from `exec`): a budget too
  /// small fails here, never mid-pass. `evict` ranks the cache (needed when o.cache_slots > 0).
  slot_pool(host_budget& budget, Exec& exec, slot_pool_options o, any_eviction_policy evict) : opts_(o) {
    STRATA_EXPECTS(o.cache_slots < o.host_slots || (o.host_slots == 0 && o.cache_slots == 0), config_error,
                   "slot_pool: {} cache slots need more than {} host slots", o.cache_slots, o.host_slots);
    STRATA_EXPECTS(o.cache_slots == 0 || !evict.empty(), config_error,
                   "slot_pool: a cache of {} slots needs an eviction policy", o.cache_slots);
    for (std::size_t i = 0; i < o.host_slots + o.device_slots; ++i)
      host_.push_back(budget.allocate(o.host_slot_bytes, i < o.host_slots ? "a subgroup slot" : "a device landing slot"));
    for (std::size_t i = 0; i < o.host_slots; ++i) free_host_.push_back(o.host_slots - 1 - i);
    for (std::size_t i = 0; i < o.device_slots; ++i) {
      landing_.push_back(o.host_slots + i);
      device_.push_back(exec.allocate_device(o.device_slot_bytes));
      free_device_.push_back(o.device_slots - 1 - i);
    }
    if (o.cache_slots > 0) cache_.emplace(o.cache_slots, std::move(evict));
  }
  slot_pool(const slot_pool&) = delete;
  slot_pool& operator=(const slot_pool&) = delete;

  /// A free host slot, if any.
  [[nodiscard]] std::optional<std::size_t> take_host() { return take(free_host_); }
  void give_host(std::size_t slot) { free_host_.push_back(slot); }
  [[nodiscard]] std::size_t free_host() const noexcept { return free_host_.size(); }
  /// The bytes of host slot `slot` (general or landing).
  [[nodiscard]] std::span<std::byte> host(std::size_t slot) noexcept { return {host_[slot].data(), opts_.host_slot_bytes}; }

  /// A free landing slot (for the copy back of a device update), if any.
  [[nodiscard]] std::optional<std::size_t> take_landing() { return take(landing_); }
  void give_landing(std::size_t slot) { landing_.push_back(slot); }

  /// A free device slot, if any.
  [[nodiscard]] std::optional<std::size_t> take_device() { return take(free_device_); }
  void give_device(std::size_t slot) { free_device_.push_back(slot); }
  [[nodiscard]] std::size_t free_device() const noexcept { return free_device_.size(); }
  [[nodiscard]] std::span<std::byte> device(std::size_t slot) noexcept {
    return {device_[slot].data(), opts_.device_slot_bytes};
  }

  /// The host cache (null without one).
  [[nodiscard]] cache_index<any_eviction_policy>* cache() noexcept { return cache_ ? &*cache_ : nullptr; }
  [[nodiscard]] const cache_index<any_eviction_policy>* cache() const noexcept { return cache_ ? &*cache_ : nullptr; }
  [[nodiscard]] bool cached(std::size_t s) const { return cache_ && cache_->contains(s); }

  [[nodiscard]] const slot_pool_options& options() const noexcept { return opts_; }

 private:
  static std::optional<std::size_t> take(std::vector<std::size_t>& list) {
    if (list.empty()) return std::nullopt;
    const std::size_t s = list.back();
    list.pop_back();
    return s;
  }

  slot_pool_options opts_;
  std::vector<host_buffer> host_;
  std::vector<std::size_t> free_host_;
  std::vector<std::size_t> landing_;
  std::vector<device_buffer_type> device_;
  std::vector<std::size_t> free_device_;
  std::optional<cache_index<any_eviction_policy>> cache_;
};

}  // namespace strata
