#pragma once
/// strata::offloaded_optimizer<Rule, ...>: an optimizer whose state (fp32 master weights and the
/// arrays of its update rule: for AdamW the first and second moments, and the running maximum of
/// the second moment with amsgrad) lives on a tier stack and is streamed through a bounded set of
/// host buffers for each update (docs/design.md section 3). `offloaded_adamw`
/// (offload/offloaded_adamw.hpp), `offloaded_sgd` and `offloaded_lion` are it with adamw_rule,
/// sgd_rule and lion_rule (optim/update_rule.hpp says what a rule is).
///
/// It is a facade over parts that stand on their own: offload_layout (subgroups, objects, slot
/// sizes), gradient_intake (gradients handed over by backward), subgroup_pipeline (reads, updates
/// on the host or the device, writes, the host cache), subgroup_kernel (the update of one
/// subgroup by the rule) and the checkpoint files (offload/checkpoint.hpp). Build your own
/// optimizer from those parts when this one does not fit. The machinery is
/// detail::offload_core<Exec, Rule>, which takes the tier, order, eviction policy and update site
/// type-erased (compiled once per executor and rule); this class adds the typed constructors,
/// load() and tier().
///
/// Layout. The parameters are split into subgroups of `subgroup_elems` (the last may be shorter).
/// Each subgroup's state is ONE tier object, "<prefix>.sg-<i>", holding its arrays back to back
/// (master | the rule's arrays: AdamW's m | v [| max v]): one read and one write per subgroup and
/// step, and a single checksum range. With gradients on the tier (ZeRO-Infinity style) each subgroup also has an fp32
/// gradient object "<prefix>.gr-<i>".
///
/// Host memory. All host buffers are whole-subgroup slots from one budget (host_budget):
/// `cache` slots keep updated subgroups between steps (which ones: the eviction policy), and
/// `prefetch_depth + write_behind_depth + 1` pipeline slots hold subgroups being read, updated and
/// written (plus `device_depth` landing slots when updates may run on the device). The gradient
/// store of accept_gradients (host residency) is charged to the same budget.
///
/// A step. The pipeline walks the subgroups in the update order of the step: a subgroup is
/// either resident (a cache hit: no read) or read into a free slot, up to `prefetch_depth`
/// subgroups ahead on every path at once; it is updated where the site policy says (the rule's
/// CPU kernel by default: bit-identical to one call over the whole flat array, and so is the
/// device kernel), then either admitted to the cache (the policy names a victim,
/// written if dirty) or written behind, at most `write_behind_depth` writes per path in flight.
/// Writes are durable after flush() or save().
///
/// Failures. Every public call returns with no request in flight. A tier or stream error during a
/// step is rethrown (typed, as it was reported) after the work in flight drains, and no subgroup
/// is ever half-updated: each subgroup is either at the old step (its state unchanged where it
/// was) or at the new one (its updated state in the cache, on the tier, or, when its write failed,
/// held in its slot and written first thing by the next call). Call step again with the same
/// gradients and rates: the subgroups already updated are skipped, and the result is
/// bit-identical to a step that never failed. Other rates for the retry are a config_error.
/// Until the step completes, step_count() keeps the old value, save() refuses (config_error) and
/// read_master/read_state show each subgroup as it is (some already updated).
///
/// Gradients. With offload_options::max_grad_norm or loss_scaling on, the global norm of the
/// unscaled gradients is known before any subgroup is updated (accept_gradients sums each
/// subgroup as it arrives; step(grads) sums them first): the update then unscales by 1 /
/// loss_scale() and clips by the global norm in the kernel's one pass over the gradients
/// (GradScaler.unscale_, clip_grad_norm_, then the update, as in torch), on the host and on the
/// device alike. An inf/NaN gradient skips the whole step: no state, no model copy, not the
/// step count changes; the loss scale backs off (grows after growth_interval clean steps), and
/// the step's stats say which subgroups held it. The scale is saved in checkpoints.
///
/// Device memory. Gradients may come from the executor's device memory (accept_gradients with a
/// device_span and backward's event: the copy is enqueued on the d2h stream, the call returns at
/// once) and the 16-bit model copy may live there (step(lr, device_span): device updates write it
/// in place, host updates are copied in on the h2d stream).
///
/// Not thread-safe: one thread calls at a time (the pipeline uses its own threads).
///
/// Template parameters: the update rule, the tier stack (a multipath carries the placement policy: path choice is
/// the tier's job), the eviction policy of the host cache, the update order, the executor that
/// runs device updates (host_executor: no GPU needed; cuda_executor on a GPU) and the update site
/// policy (always_host by default: the executor is then never used).

#include <concepts>
#include <cstddef>
#include <filesystem>
#include <span>
#include <utility>

#include "strata/core/config.hpp"
#include "strata/core/trace.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/checkpoint_manifest.hpp"
#include "strata/offload/detail/offload_core.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/offload/param_tensors.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/adamw_state.hpp"
#include "strata/optim/update_rule.hpp"
#include "strata/policy/any_eviction_policy.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// An offloaded optimizer; see the file comment. The tier (and a given executor) is referred to,
/// not owned: it must outlive the optimizer.
template <update_rule Rule, tier Tier = dynamic_multipath<bandwidth_proportional>, eviction_policy Evict = sweep_aware,
          update_order Order = alternating, executor Exec = host_executor<>, update_site Site = always_host>
class offloaded_optimizer : public detail::offload_core<Exec, Rule> {
  using core = detail::offload_core<Exec, Rule>;

 public:
  using options_type = typename Rule::options_type;
  using tier_type = Tier;
  using eviction_type = Evict;
  using order_type = Order;
  using site_type = Site;

  /// Partitions `params` (the initial fp32 weights) into subgroups, zeroes the rule's arrays (the
  /// moments) and writes
  /// every subgroup's state to `tier`, replacing objects of its names that a killed or earlier
  /// run left there (a file_tier refuses to replace anyone else's: foreign_file_error). Throws
  /// config_error for invalid options or a budget too small for the pipeline (the message says
  /// how much is needed), and the tier's errors.
  /// Updates run where `Site` says, on an executor the optimizer owns.
  offloaded_optimizer(Tier& tier, std::span<const float> params, options_type options, offload_options offload = {},
                  Order order = Order{}, Evict evict = Evict{}, tracer* trace = nullptr)
    requires std::default_initializable<Exec>
      : offloaded_optimizer(tier, nullptr, params.size(), options, std::move(offload), std::move(order), std::move(evict),
                        Site{}, trace) {
    this->check_tier_room();
    this->initialize_from(params);
  }

  /// As above, with device updates on `exec` (which must outlive the optimizer) where `site` says.
  offloaded_optimizer(Tier& tier, Exec& exec, std::span<const float> params, options_type options,
                  offload_options offload = {}, Order order = Order{}, Evict evict = Evict{}, Site site = Site{},
                  tracer* trace = nullptr)
      : offloaded_optimizer(tier, &exec, params.size(), options, std::move(offload), std::move(order), std::move(evict),
                        std::move(site), trace) {
    this->check_tier_room();
    this->initialize_from(params);
  }

  /// As the constructor, but starting from existing AdamW state (`state`: moments and steps taken,
  /// e.g. torch.optim.AdamW's) instead of zero moments: the next step is state.step + 1 and
  /// continues that run bit for bit. Bad state (sizes, non-finite values, negative second moments,
  /// a maximum without amsgrad) is a config_error naming the array and index, before anything is
  /// written.
  [[nodiscard]] static offloaded_optimizer from_state(Tier& tier, std::span<const float> params,
                                                  const adamw_state_view& state, options_type options,
                                                  offload_options offload = {}, Order order = Order{},
                                                  Evict evict = Evict{}, tracer* trace = nullptr)
    requires std::default_initializable<Exec> && std::same_as<Rule, adamw_rule>
  {
    offloaded_optimizer opt(tier, nullptr, params.size(), options, std::move(offload), std::move(order), std::move(evict),
                        Site{}, trace);
    opt.check_tier_room();
    opt.initialize_from(params, state);
    return opt;
  }
  /// As above, with device updates on `exec` where `site` says. The weights may be 16-bit (a
  /// bf16 or fp16 model's own, widened exactly to the fp32 master), so no fp32 copy of the model
  /// is needed to start.
  /// (`params` may also be framework tensors' weights, a span of param_tensor covering every
  /// parameter once, whose gradients are not used: no flat copy of the model is made.)
  template <class P>
    requires(model_copy_type<P> || is_param_tensor_v<P>) && std::same_as<Rule, adamw_rule>
  [[nodiscard]] static offloaded_optimizer from_state(Tier& tier, Exec& exec, std::span<const P> params,
                                                  const adamw_state_view& state, options_type options,
                                                  offload_options offload = {}, Order order = Order{},
                                                  Evict evict = Evict{}, Site site = Site{}, tracer* trace = nullptr) {
    std::size_t n = params.size();
    if constexpr (is_param_tensor_v<P>) n = params.empty() ? 0 : params.back().first + params.back().count;
    offloaded_optimizer opt(tier, &exec, n, options, std::move(offload), std::move(order), std::move(evict),
                        std::move(site), trace);
    opt.check_tier_room();
    opt.initialize_from(params, state);
    return opt;
  }

  /// As the constructor, but starting from existing state of the rule (`state`: its arrays by the
  /// names of the rule's format, e.g. torch's "momentum_buffer" for SGD, and the steps taken)
  /// instead of zeros: the next step is state.step + 1. An unknown or repeated name, a size, a
  /// non-finite value or a negative one where the format forbids it is a config_error naming the
  /// array and index, before anything is written.
  [[nodiscard]] static offloaded_optimizer from_state(Tier& tier, std::span<const float> params,
                                                      const rule_state_view& state, options_type options,
                                                      offload_options offload = {}, Order order = Order{},
                                                      Evict evict = Evict{}, tracer* trace = nullptr)
    requires std::default_initializable<Exec>
  {
    offloaded_optimizer opt(tier, nullptr, params.size(), options, std::move(offload), std::move(order),
                            std::move(evict), Site{}, trace);
    opt.check_tier_room();
    opt.initialize_from(params, state);
    return opt;
  }
  /// As above, with device updates on `exec` where `site` says; the weights may be 16-bit or
  /// framework tensors (see the AdamW form above).
  template <class P>
    requires model_copy_type<P> || is_param_tensor_v<P>
  [[nodiscard]] static offloaded_optimizer from_state(Tier& tier, Exec& exec, std::span<const P> params,
                                                      const rule_state_view& state, options_type options,
                                                      offload_options offload = {}, Order order = Order{},
                                                      Evict evict = Evict{}, Site site = Site{},
                                                      tracer* trace = nullptr) {
    std::size_t n = params.size();
    if constexpr (is_param_tensor_v<P>) n = params.empty() ? 0 : params.back().first + params.back().count;
    offloaded_optimizer opt(tier, &exec, n, options, std::move(offload), std::move(order), std::move(evict),
                            std::move(site), trace);
    opt.check_tier_room();
    opt.initialize_from(params, state);
    return opt;
  }

  /// Restores the checkpoint in `dir` (see save) onto `tier`, which may be any tier stack (other
  /// paths, other placement than when saved). The checkpoint's subgroup size, hyper-parameters and
  /// step count are used; `offload` gives the rest (cache, pipeline, threads). A corrupted,
  /// truncated or incomplete checkpoint is refused with integrity_error; a missing one with
  /// io_error; one of another update rule (an SGD checkpoint loaded as AdamW) with config_error.
  [[nodiscard]] static offloaded_optimizer load(const std::filesystem::path& dir, Tier& tier, offload_options offload = {},
                                            Order order = Order{}, Evict evict = Evict{}, tracer* trace = nullptr)
    requires std::default_initializable<Exec>
  {
    return load_impl(dir, tier, nullptr, std::move(offload), std::move(order), std::move(evict), Site{}, trace);
  }
  /// As above, with device updates on `exec` where `site` says.
  [[nodiscard]] static offloaded_optimizer load(const std::filesystem::path& dir, Tier& tier, Exec& exec,
                                            offload_options offload = {}, Order order = Order{}, Evict evict = Evict{},
                                            Site site = Site{}, tracer* trace = nullptr) {
    return load_impl(dir, tier, &exec, std::move(offload), std::move(order), std::move(evict), std::move(site), trace);
  }

  /// Restores the checkpoint saved into `store` (save(any_tier&): an object store, say) onto
  /// `tier`; a missing or damaged part, manifest or pointer is an integrity_error.
  [[nodiscard]] static offloaded_optimizer load(any_tier& store, Tier& tier, offload_options offload = {},
                                            Order order = Order{}, Evict evict = Evict{}, tracer* trace = nullptr)
    requires std::default_initializable<Exec>
  {
    return load_impl(store, tier, nullptr, std::move(offload), std::move(order), std::move(evict), Site{}, trace);
  }
  /// As above, with device updates on `exec` where `site` says.
  [[nodiscard]] static offloaded_optimizer load(any_tier& store, Tier& tier, Exec& exec, offload_options offload = {},
                                            Order order = Order{}, Evict evict = Evict{}, Site site = Site{},
                                            tracer* trace = nullptr) {
    return load_impl(store, tier, &exec, std::move(offload), std::move(order), std::move(evict), std::move(site), trace);
  }

  /// The verified manifest of the checkpoint in `dir` (step count, layout, hyper-parameters).
  [[nodiscard]] static checkpoint_manifest load_manifest(const std::filesystem::path& dir) {
    return read_checkpoint_manifest(dir);
  }
  /// The verified manifest of the checkpoint in `store`.
  [[nodiscard]] static checkpoint_manifest load_manifest(any_tier& store) { return read_checkpoint_manifest(store); }

  offloaded_optimizer(offloaded_optimizer&&) noexcept = default;
  offloaded_optimizer& operator=(offloaded_optimizer&&) = delete;
  offloaded_optimizer(const offloaded_optimizer&) = delete;
  offloaded_optimizer& operator=(const offloaded_optimizer&) = delete;
  /// No request is ever in flight between calls, so nothing is waited for here. Unwritten
  /// updated state (cached subgroups) is lost: save() first to keep it.
  ~offloaded_optimizer() = default;

  [[nodiscard]] Tier& tier() noexcept { return *tier_; }

 private:
  // Validates, sizes and allocates; writes nothing.
  offloaded_optimizer(Tier& tier, Exec* exec, std::size_t params, options_type options, offload_options offload,
                  Order order, Evict evict, Site site, tracer* trace)
      : core(any_tier::ref(tier), &tier, exec, params, options, std::move(offload), any_update_order(std::move(order)),
             any_eviction_policy(std::move(evict)), any_update_site(std::move(site)), trace),
        tier_(&tier) {}

  template <class Where>  // a directory or a store
  static offloaded_optimizer load_impl(Where& dir, Tier& tier, Exec* exec, offload_options offload, Order order,
                                   Evict evict, Site site, tracer* trace) {
    const auto [m, options] = core::checked_manifest(dir);
    offload.subgroup_elems = static_cast<std::size_t>(m.subgroup_elems);
    offloaded_optimizer opt(tier, exec, static_cast<std::size_t>(m.params), options, std::move(offload), std::move(order),
                        std::move(evict), std::move(site), trace);
    opt.restore(dir, m);
    return opt;
  }

  Tier* tier_;
};

}  // namespace strata

#if STRATA_EXTERN_TEMPLATES
// The default tier stack, compiled once in cmake/strata_instances.cpp (core/config.hpp).
namespace strata {
extern template class detail::multipath_core<bandwidth_proportional, dynamic_multipath<bandwidth_proportional>>;
extern template class dynamic_multipath<bandwidth_proportional>;
}  // namespace strata
#endif
