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
/// - The cache index (cache_index<Evict>) of the subgroups kept between passes. A subgroup in
///   flight is pinned in the eviction policy (pin/unpin), so it is never the victim. The policy
///   is type-erased behind `pipeline_cache` (one virtual call per subgroup event), so that the
///   pipeline's machinery is compiled once per executor, not once per policy.
///
/// Not thread-safe: the pipeline's thread owns it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/exec/executor.hpp"
#include "strata/pipeline/host_budget.hpp"
#include "strata/policy/cache_index.hpp"
#include "strata/policy/eviction_policy.hpp"

namespace strata {

/// The host cache as the pipeline uses it: cache_index<Evict> behind virtual calls.
class pipeline_cache {
 public:
  virtual ~pipeline_cache() = default;
  virtual void begin_step(std::span<const std::size_t> order, std::span<const std::size_t> next) = 0;
  /// The walk uses `id`: admits it when absent (evicting a victim), counts a hit or a miss.
  virtual cache_lookup access(std::size_t id) = 0;
  [[nodiscard]] virtual bool contains(std::size_t id) const = 0;
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
  [[nodiscard]] virtual std::size_t capacity() const noexcept = 0;
  /// Whether some cached subgroup is unpinned (so that admitting one can evict it).
  [[nodiscard]] virtual bool has_victim() const = 0;
  virtual void pin(std::size_t id) = 0;
  virtual void unpin(std::size_t id) noexcept = 0;
};

namespace detail {
template <eviction_policy Evict>
class pipeline_cache_of final : public pipeline_cache {
 public:
  pipeline_cache_of(std::size_t capacity, Evict evict) : index_(capacity, std::move(evict)) {}
  void begin_step(std::span<const std::size_t> order, std::span<const std::size_t> next) override {
    index_.begin_step(order, next);
  }
  cache_lookup access(std::size_t id) override { return index_.access(id); }
  [[nodiscard]] bool contains(std::size_t id) const override { return index_.contains(id); }
  [[nodiscard]] std::size_t size() const noexcept override { return index_.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept override { return index_.capacity(); }
  [[nodiscard]] bool has_victim() const override { return index_.policy().victim().has_value(); }
  void pin(std::size_t id) override { index_.pin(id); }
  void unpin(std::size_t id) noexcept override { index_.unpin(id); }

 private:
  cache_index<Evict> index_;
};
}  // namespace detail

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
  /// small fails here, never mid-pass. `evict` ranks the cache (when o.cache_slots > 0).
  template <eviction_policy Evict>
  slot_pool(host_budget& budget, Exec& exec, slot_pool_options o, Evict evict) : opts_(o) {
    STRATA_EXPECTS(o.cache_slots < o.host_slots || (o.host_slots == 0 && o.cache_slots == 0), config_error,
                   "slot_pool: {} cache slots need more than {} host slots", o.cache_slots, o.host_slots);
    for (std::size_t i = 0; i < o.host_slots + o.device_slots; ++i)
      host_.push_back(budget.allocate(o.host_slot_bytes, i < o.host_slots ? "a subgroup slot" : "a device landing slot"));
    for (std::size_t i = 0; i < o.host_slots; ++i) free_host_.push_back(o.host_slots - 1 - i);
    for (std::size_t i = 0; i < o.device_slots; ++i) {
      landing_.push_back(o.host_slots + i);
      device_.push_back(exec.allocate_device(o.device_slot_bytes));
      free_device_.push_back(o.device_slots - 1 - i);
    }
    if (o.cache_slots > 0) cache_ = std::make_unique<detail::pipeline_cache_of<Evict>>(o.cache_slots, std::move(evict));
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
  [[nodiscard]] pipeline_cache* cache() noexcept { return cache_.get(); }
  [[nodiscard]] const pipeline_cache* cache() const noexcept { return cache_.get(); }
  [[nodiscard]] bool cached(std::size_t s) const { return cache_ && cache_->contains(s); }

  /// Work on `s` starts: pins it in the eviction policy when it is cached. Pins nest.
  void pin(std::size_t s) {
    if (!cached(s)) return;
    cache_->pin(s);
    ++pins_[s];
  }
  /// Work on `s` ended: releases a pin that pin() took.
  void unpin(std::size_t s) noexcept {
    const auto it = pins_.find(s);
    if (it == pins_.end()) return;
    cache_->unpin(s);
    if (--it->second == 0) pins_.erase(it);
  }
  [[nodiscard]] bool pinned(std::size_t s) const { return pins_.contains(s); }

  [[nodiscard]] const slot_pool_options& options() const noexcept { return opts_; }

 private:
  static std::optional<std::size_t> take(std::vector<std::size_t>& list) {
    if (list.empty()) return std::nullopt;
    const std::size_t s = list.back();
    list.pop_back();
    return s;
  }

  slot_pool_options opts_;
  std::vector<budgeted_allocation> host_;
  std::vector<std::size_t> free_host_;
  std::vector<std::size_t> landing_;
  std::vector<device_buffer_type> device_;
  std::vector<std::size_t> free_device_;
  std::unique_ptr<pipeline_cache> cache_;
  std::unordered_map<std::size_t, unsigned> pins_;
};

}  // namespace strata
