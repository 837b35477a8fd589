#pragma once
/// offload_layout: how an offloaded optimizer lays out its parameters and their state, in one
/// place, for the optimizer, its presets, strata-bench and anyone sizing a budget: subgroups of
/// `subgroup_elems` parameters (the last may be shorter); per subgroup one state object
/// "<prefix>.sg-<i>" holding the fp32 master weights and then each array of the update rule's
/// state_format (AdamW: master | m | v (| max v with amsgrad), all fp32), and with gradients on
/// the tier one fp32 gradient object "<prefix>.gr-<i>"; one host slot per subgroup in flight
/// holding the state (and the gradients read with it), page-rounded; one device slot holding the
/// state, the gradients and the 16-bit model copy, each part 256-byte aligned.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/budget.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/update_rule.hpp"
#include "strata/pipeline/subgroup_pipeline.hpp"

namespace strata {

struct offload_layout {
  /// The most parameters a layout takes (2^58).
  static constexpr std::size_t max_params = std::size_t{1} << 58;

  std::size_t params = 0;
  std::size_t subgroup_elems = 1;
  state_format format = adamw_rule::format(adamw_options{});  ///< the rule's arrays after the master weights
  bool tier_gradients = false;

  /// The layout of `params` parameters whose state has `format`'s arrays, under these options
  /// (validated: config_error naming the value).
  [[nodiscard]] static offload_layout of_format(std::size_t params, const state_format& format,
                                                 const offload_options& o) {
    o.validate();
    STRATA_EXPECTS(params > 0, config_error, "offload_layout: no parameters");
    STRATA_EXPECTS(format.aligned(), config_error,
                   "offload_layout: state format '{}' has a wider array after a narrower one (arrays go widest first)",
                   describe(format));
    // Byte counts of the state (at most 24 bytes a parameter with fp32 gradients) fit in 64 bits
    // and a subgroup count in memory: refused before anything is sized or allocated.
    STRATA_EXPECTS(params <= max_params, config_error,
                   "offload_layout: {} parameters is more than the {} (2^58) whose state sizes fit in 64 bits", params,
                   max_params);
    // (a block-quantized state's blocks then never straddle subgroups, and a tensor that starts
    // at a multiple of the block in the flat parameters starts one in its subgroup)
    STRATA_EXPECTS(format.block() == 0 || o.subgroup_elems % format.block() == 0, config_error,
                   "offload_layout: subgroup_elems {} is not a multiple of the {} parameters of a quantization block "
                   "of state format '{}'",
                   o.subgroup_elems, format.block(), describe(format));
    if (o.gradients == gradient_residency::automatic)
      return of_format(params, format, resolved_format(params, format, o));
    offload_layout l;
    l.params = params;
    l.subgroup_elems = o.subgroup_elems;
    l.format = format;
    l.tier_gradients = o.gradients == gradient_residency::tier;
    return l;
  }
  /// The layout of AdamW's state (of_format with adamw_rule::format(a)).
  [[nodiscard]] static offload_layout of(std::size_t params, const adamw_options& a, const offload_options& o) {
    return of_format(params, adamw_rule::format(a), o);
  }

  /// `o` with gradient_residency::automatic decided for `params` parameters (other residencies
  /// as given): host when the budget holds the host layout's pipeline and cache plus an fp32
  /// gradient store of every parameter, else tier when the budget holds the tier layout's
  /// pipeline and cache, else host (a step over the caller's gradients still runs; a gradient
  /// store handed over by accept_gradients then does not fit, a capacity_error there).
  [[nodiscard]] static offload_options resolved_format(std::size_t params, const state_format& format,
                                                       offload_options o, bool device = false) {
    if (o.gradients != gradient_residency::automatic) return o;
    o.gradients = gradient_residency::host;
    if (o.host_memory_budget == unlimited_capacity) return o;
    const std::uint64_t pipeline = of_format(params, format, o).required_host_memory(o, device);
    const std::uint64_t store = host_budget::footprint(static_cast<std::uint64_t>(params) * sizeof(float));
    if (pipeline <= o.host_memory_budget && o.host_memory_budget - pipeline >= store) return o;
    offload_options t = o;
    t.gradients = gradient_residency::tier;
    return of_format(params, format, t).required_host_memory(t, device) <= o.host_memory_budget ? t : o;
  }
  /// resolved_format() for AdamW's state.
  [[nodiscard]] static offload_options resolved(std::size_t params, const adamw_options& a, offload_options o,
                                                bool device = false) {
    return resolved_format(params, adamw_rule::format(a), std::move(o), device);
  }

  [[nodiscard]] std::size_t subgroups() const noexcept { return (params + subgroup_elems - 1) / subgroup_elems; }
  /// First parameter of subgroup `s`.
  [[nodiscard]] std::size_t begin(std::size_t s) const noexcept { return s * subgroup_elems; }
  /// Parameters of subgroup `s`.
  [[nodiscard]] std::size_t length(std::size_t s) const noexcept { return std::min(subgroup_elems, params - begin(s)); }
  /// Parameters of the longest subgroup.
  [[nodiscard]] std::size_t max_length() const noexcept { return std::min(subgroup_elems, params); }
  /// Bytes of subgroup `s`'s state object.
  [[nodiscard]] std::uint64_t state_bytes(std::size_t s) const noexcept { return format.state_bytes(length(s)); }
  /// Bytes of every subgroup's state.
  [[nodiscard]] std::uint64_t total_state_bytes() const noexcept {
    if (subgroups() == 0) return 0;
    return (subgroups() - 1) * state_bytes(0) + state_bytes(subgroups() - 1);
  }
  /// Bytes of state per parameter (master weights and the rule's arrays; block scales spread
  /// over their blocks).
  [[nodiscard]] double state_bytes_per_param() const noexcept { return format.mean_bytes_per_param(); }
  /// Bytes of subgroup `s`'s fp32 gradient object (0 unless gradients live on the tier).
  [[nodiscard]] std::uint64_t gradient_bytes(std::size_t s) const noexcept {
    return tier_gradients ? static_cast<std::uint64_t>(length(s)) * sizeof(float) : 0;
  }
  /// Bytes of one host slot (the largest subgroup's state and tier gradients, which start at the
  /// next 16-byte boundary: pipeline_object::aux_offset).
  [[nodiscard]] std::uint64_t slot_bytes() const noexcept {
    const std::uint64_t state = format.state_bytes(max_length());
    return tier_gradients ? pipeline_object::aux_offset(state) + gradient_bytes(0) : state;
  }
  /// What one host slot costs a host_budget (whole pages).
  [[nodiscard]] std::uint64_t slot_footprint() const noexcept { return host_budget::footprint(slot_bytes()); }
  /// Whole slots a cache of `bytes` holds (capped at the subgroup count).
  [[nodiscard]] std::size_t cache_slots(std::uint64_t bytes) const noexcept {
    return static_cast<std::size_t>(std::min<std::uint64_t>(bytes / slot_footprint(), subgroups()));
  }
  /// Slots of the cache `o` asks for: cache_subgroups when set (capped at the subgroup count),
  /// else the whole slots of host_cache_bytes.
  [[nodiscard]] std::size_t cache_slots(const offload_options& o) const noexcept {
    return o.cache_subgroups ? std::min(*o.cache_subgroups, subgroups()) : cache_slots(o.host_cache_bytes);
  }
  /// Bytes of a cache of `k` subgroups (what to pass as host_cache_bytes).
  [[nodiscard]] std::uint64_t cache_bytes(std::size_t k) const noexcept { return k * slot_footprint(); }

  /// Host bytes per tier object (one per subgroup, two with gradients on the tier) that an
  /// optimizer and the tier stacks make_offloaded_adamw builds allocate beyond slots and stored
  /// data: object names, per-subgroup pipeline states and versions, eviction and order
  /// bookkeeping, gradient-intake ranges, the paths' per-object entries and checksum tables.
  /// Measured (2026-12, glibc 2.36, x86-64) as the peak RSS growth of strata-bench step runs with
  /// 1-parameter subgroups and no cache, from 10000 to 20000 subgroups: 1222 bytes a subgroup
  /// with --device sim over one checksummed file path, 785 for the strata preset over two paths,
  /// 1564 for zero_infinity (two objects a subgroup). 1.5 KiB leaves room for longer names.
  static constexpr std::uint64_t bookkeeping_bytes_per_object = 1536;
  /// Host bytes of that bookkeeping for the whole layout: what a subgroup count costs before a
  /// single slot is allocated (a million subgroups: about 1.5 GiB).
  [[nodiscard]] std::uint64_t bookkeeping_bytes() const noexcept {
    return static_cast<std::uint64_t>(subgroups()) * (tier_gradients ? 2 : 1) * bookkeeping_bytes_per_object;
  }

  // Device slots: state | gradients (room for fp32) | 16-bit model copy.
  static constexpr std::uint64_t device_alignment = 256;
  [[nodiscard]] static constexpr std::uint64_t align_up(std::uint64_t x) noexcept {
    return (x + device_alignment - 1) / device_alignment * device_alignment;
  }
  [[nodiscard]] std::uint64_t max_state_bytes() const noexcept { return state_bytes(0); }
  [[nodiscard]] std::uint64_t device_gradient_offset() const noexcept { return align_up(max_state_bytes()); }
  [[nodiscard]] std::uint64_t device_model_offset() const noexcept {
    return align_up(device_gradient_offset() + static_cast<std::uint64_t>(max_length()) * sizeof(float));
  }
  /// Device bytes of a slot beyond the state (the pipeline's device_extra_bytes).
  [[nodiscard]] std::uint64_t device_extra_bytes() const noexcept {
    return device_model_offset() + static_cast<std::uint64_t>(max_length()) * 2 - max_state_bytes();
  }

  /// Host slots of a pipeline with these options (cache, read-ahead, writes, the one updating),
  /// plus a landing slot per device update in flight when `device` is true.
  [[nodiscard]] std::size_t host_slots(const offload_options& o, bool device) const noexcept {
    return cache_slots(o) + o.prefetch_depth + o.write_behind_depth + 1 + (device ? o.device_depth : 0);
  }
  /// Host memory of the pipeline and cache (the budget must also cover the gradient store of
  /// accept_gradients: params x the gradient size, with host residency).
  [[nodiscard]] std::uint64_t required_host_memory(const offload_options& o, bool device = false) const noexcept {
    return host_slots(o, device) * slot_footprint();
  }

  /// The tier objects, as the pipeline takes them.
  [[nodiscard]] std::vector<pipeline_object> objects(const std::string& prefix) const {
    std::vector<pipeline_object> v;
    v.reserve(subgroups());
    for (std::size_t s = 0; s < subgroups(); ++s)
      v.push_back({state_name(prefix, s), state_bytes(s), tier_gradients ? gradient_name(prefix, s) : std::string{},
                   gradient_bytes(s)});
    return v;
  }
  [[nodiscard]] static std::string state_name(const std::string& prefix, std::size_t s) {
    return fmt::format("{}.sg-{}", prefix, s);
  }
  [[nodiscard]] static std::string gradient_name(const std::string& prefix, std::size_t s) {
    return fmt::format("{}.gr-{}", prefix, s);
  }
};

}  // namespace strata
