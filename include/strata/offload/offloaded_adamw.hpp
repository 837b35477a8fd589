#pragma once
/// strata::offloaded_adamw: AdamW whose fp32 state (master weights, first and second moments,
/// and the running maximum of the second moment with amsgrad) lives on a tier stack and is
/// streamed through a bounded set of host buffers for each update (docs/design.md section 3).
///
/// It is a facade over parts that stand on their own: offload_layout (subgroups, objects, slot
/// sizes), gradient_intake (gradients handed over by backward), subgroup_pipeline (reads, updates
/// on the host or the device, writes, the host cache), adamw_subgroup_kernel (the update of one
/// subgroup) and the checkpoint files (offload/checkpoint.hpp). Build your own optimizer from
/// those parts when this one does not fit.
///
/// Layout. The parameters are split into subgroups of `subgroup_elems` (the last may be shorter).
/// Each subgroup's state is ONE tier object, "<prefix>.sg-<i>", holding its arrays back to back
/// (master | m | v [| max v]): one read and one write per subgroup and step, and a single checksum
/// range. With gradients on the tier (ZeRO-Infinity style) each subgroup also has an fp32
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
/// subgroups ahead on every path at once; it is updated where the site policy says (the CPU
/// kernel, adamw_update_cpu, by default: bit-identical to one call over the whole flat array,
/// and so is the device kernel), then either admitted to the cache (the policy names a victim,
/// written if dirty) or written behind, at most `write_behind_depth` writes per path in flight.
/// Writes are durable after flush() or save().
///
/// Failures. Every public call returns with no request in flight. A tier or stream error during a
/// step is rethrown (typed, as it was reported) after the work in flight drains, and no subgroup
/// is ever half-updated: each subgroup is either at the old step (its state unchanged where it
/// was) or at the new one (its updated state in the cache, on the tier, or, when its write failed,
/// held in its slot and written first thing by the next call). Call step again with the same
/// gradients and learning rate: the subgroups already updated are skipped, and the result is
/// bit-identical to a step that never failed. A different lr for the retry is a config_error.
/// Until the step completes, step_count() keeps the old value, save() refuses (config_error) and
/// read_master/read_moments show each subgroup as it is (some already updated).
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
/// Template parameters: the tier stack (a multipath carries the placement policy: path choice is
/// the tier's job), the eviction policy of the host cache, the update order, the executor that
/// runs device updates (host_executor: no GPU needed; cuda_executor on a GPU) and the update site
/// policy (always_host by default: the executor is then never used).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/budget.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/trace.hpp"
#include "strata/core/units.hpp"
#include "strata/exec/device_span.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/adamw_subgroup_kernel.hpp"
#include "strata/offload/checkpoint.hpp"
#include "strata/offload/checkpoint_manifest.hpp"
#include "strata/offload/gradient_intake.hpp"
#include "strata/offload/offload_layout.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/offload/offload_stats.hpp"
#include "strata/offload/prefix_claim.hpp"
#include "strata/optim/adamw_cpu.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/grad_norm.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/pipeline/subgroup_pipeline.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Offloaded AdamW; see the file comment. The tier (and a given executor) is referred to, not
/// owned: it must outlive the optimizer.
template <tier Tier = dynamic_multipath<bandwidth_proportional>, eviction_policy Evict = sweep_aware,
          update_order Order = alternating, executor Exec = host_executor<>, update_site Site = always_host>
class offloaded_adamw {
 public:
  using tier_type = Tier;
  using eviction_type = Evict;
  using order_type = Order;
  using executor_type = Exec;
  using site_type = Site;
  using pipeline_type = subgroup_pipeline<Exec, Site>;
  /// An event of the executor's streams (what accept_gradients from device memory waits for).
  using event_type = typename Exec::stream_type::event_type;

  /// Partitions `params` (the initial fp32 weights) into subgroups, zeroes the moments and writes
  /// every subgroup's state to `tier`, replacing objects of its names that a killed or earlier
  /// run left there (a file_tier refuses to replace anyone else's: foreign_file_error). Throws
  /// config_error for invalid options or a budget too small for the pipeline (the message says
  /// how much is needed), and the tier's errors.
  /// Updates run where `Site` says, on an executor the optimizer owns.
  offloaded_adamw(Tier& tier, std::span<const float> params, adamw_options options, offload_options offload = {},
                  Order order = Order{}, Evict evict = Evict{}, tracer* trace = nullptr)
    requires std::default_initializable<Exec>
      : offloaded_adamw(tier, nullptr, params.size(), options, std::move(offload), std::move(order), std::move(evict),
                        Site{}, trace) {
    check_tier_room();
    initialize_from(params);
  }

  /// As above, with device updates on `exec` (which must outlive the optimizer) where `site` says.
  offloaded_adamw(Tier& tier, Exec& exec, std::span<const float> params, adamw_options options,
                  offload_options offload = {}, Order order = Order{}, Evict evict = Evict{}, Site site = Site{},
                  tracer* trace = nullptr)
      : offloaded_adamw(tier, &exec, params.size(), options, std::move(offload), std::move(order), std::move(evict),
                        std::move(site), trace) {
    check_tier_room();
    initialize_from(params);
  }

  /// Restores the checkpoint in `dir` (see save) onto `tier`, which may be any tier stack (other
  /// paths, other placement than when saved). The checkpoint's subgroup size, hyper-parameters and
  /// step count are used; `offload` gives the rest (cache, pipeline, threads). A corrupted,
  /// truncated or incomplete checkpoint is refused with integrity_error; a missing one with io_error.
  [[nodiscard]] static offloaded_adamw load(const std::filesystem::path& dir, Tier& tier, offload_options offload = {},
                                            Order order = Order{}, Evict evict = Evict{}, tracer* trace = nullptr)
    requires std::default_initializable<Exec>
  {
    return load_impl(dir, tier, nullptr, std::move(offload), std::move(order), std::move(evict), Site{}, trace);
  }
  /// As above, with device updates on `exec` where `site` says.
  [[nodiscard]] static offloaded_adamw load(const std::filesystem::path& dir, Tier& tier, Exec& exec,
                                            offload_options offload = {}, Order order = Order{}, Evict evict = Evict{},
                                            Site site = Site{}, tracer* trace = nullptr) {
    return load_impl(dir, tier, &exec, std::move(offload), std::move(order), std::move(evict), std::move(site), trace);
  }

  /// The verified manifest of the checkpoint in `dir` (step count, layout, hyper-parameters).
  [[nodiscard]] static checkpoint_manifest load_manifest(const std::filesystem::path& dir) {
    return read_checkpoint_manifest(dir);
  }

  offloaded_adamw(offloaded_adamw&&) noexcept = default;
  offloaded_adamw& operator=(offloaded_adamw&&) = delete;
  offloaded_adamw(const offloaded_adamw&) = delete;
  offloaded_adamw& operator=(const offloaded_adamw&) = delete;
  /// No request is ever in flight between calls, so nothing is waited for here. Unwritten
  /// updated state (cached subgroups) is lost: save() first to keep it.
  ~offloaded_adamw() = default;

  // --- steps ------------------------------------------------------------------------------------

  /// One step with the options' lr over gradients of every parameter (float, bf16 or fp16).
  template <gradient_type G>
  offload_step_stats step(std::span<const G> grads) {
    return step(grads, options_.lr);
  }
  /// One step with learning rate `lr` (a scheduler's value).
  template <gradient_type G>
  offload_step_stats step(std::span<const G> grads, double lr) {
    return step(grads, lr, std::span<bf16>{});
  }
  /// One step that also writes the updated weights, rounded to bf16/fp16, into `model_out`
  /// (size() elements, or empty for none) in the same pass.
  template <gradient_type G, class H>
    requires is_half_v<H>
  offload_step_stats step(std::span<const G> grads, double lr, std::span<H> model_out) {
    STRATA_EXPECTS(grads.size() == layout_.params, config_error,
                   "offloaded_adamw::step: got {} gradients for {} parameters", grads.size(), layout_.params);
    check_lr(lr);
    check_model_out(model_out.size());
    if (layout_.tier_gradients) {
      s_->intake.reset();
      stage_gradients_to_tier(grads, 0);
      return run_step<float>(lr, model_copy<H>{model_out, {}, {}}, tier_gradients(), s_->intake.norms());
    }
    grad_norm_accumulator norms;
    if (tracks_norm() && !partial_)
      for (std::size_t s = 0; s < layout_.subgroups(); ++s)
        norms.add(s, grad_stats_cpu(grads.subspan(begin(s), length(s)), scaler_.inv_scale(), s_->pool.get()));
    const auto grads_of = [this, grads](std::size_t s, std::span<std::byte>) {
      return grads.subspan(begin(s), length(s));
    };
    return run_step<G>(lr, model_copy<H>{model_out, {}, {}}, grads_of, norms);
  }

  /// Hands over the gradients of subgroup `subgroup` (its full length) as backward produces them;
  /// step() without gradients then uses them. 16-bit gradients stay 16-bit in host memory (host
  /// residency); with tier residency they are widened to fp32 and written to the tier now.
  template <gradient_type G>
  void accept_gradients(std::size_t subgroup, std::span<const G> grads) {
    STRATA_EXPECTS(subgroup < layout_.subgroups(), config_error,
                   "offloaded_adamw::accept_gradients: subgroup {} of {}", subgroup, layout_.subgroups());
    STRATA_EXPECTS(grads.size() == length(subgroup), config_error,
                   "offloaded_adamw::accept_gradients: got {} gradients for subgroup {} of {} parameters",
                   grads.size(), subgroup, length(subgroup));
    accept_gradients_at(begin(subgroup), grads);
  }

  /// Hands over the gradients of parameters [first, first + grads.size()), which may span
  /// subgroups. Ranges must not overlap within a step.
  template <gradient_type G>
  void accept_gradients_at(std::size_t first, std::span<const G> grads) {
    s_->intake.check(first, grads.size());
    if (layout_.tier_gradients) {  // (the intake sums them for the norm as they are staged)
      stage_gradients_to_tier(grads, first);
      return;
    }
    s_->intake.store(first, grads);
  }

  /// Hands over subgroup `subgroup`'s gradients that backward left in the executor's device
  /// memory, once `ready` (an event of the executor's streams, recorded after backward wrote
  /// them) has completed: the copy into the gradient store (pinned when the executor asks for
  /// it) is enqueued on the executor's d2h stream and this returns at once, so the copy overlaps
  /// the rest of backward. With clipping or loss scaling the subgroup's norm is summed on a
  /// worker thread as soon as its copy lands. step() waits for the copies; a failed copy makes
  /// step() throw its typed error before any state changes, and every gradient of the step must
  /// then be handed over again. Host residency only; `grads` must stay valid until step().
  template <gradient_type G>
  void accept_gradients(std::size_t subgroup, device_span<const G> grads, const event_type& ready) {
    STRATA_EXPECTS(subgroup < layout_.subgroups(), config_error,
                   "offloaded_adamw::accept_gradients: subgroup {} of {}", subgroup, layout_.subgroups());
    STRATA_EXPECTS(grads.size() == length(subgroup), config_error,
                   "offloaded_adamw::accept_gradients: got {} gradients for subgroup {} of {} parameters",
                   grads.size(), subgroup, length(subgroup));
    STRATA_EXPECTS(!layout_.tier_gradients, config_error,
                   "offloaded_adamw::accept_gradients: gradients in device memory need gradient_residency::host");
    auto& in = s_->intake;
    in.check(begin(subgroup), grads.size());
    const std::span<G> dst = in.template reserve<G>(begin(subgroup), grads.size());
    auto& d2h = s_->exec_ref->d2h();
    d2h.wait(ready);
    d2h.copy_to_host(std::as_writable_bytes(dst), grads.bytes());
    if (!s_->landing_worker) s_->landing_worker = std::make_unique<thread_pool>(1, "strata-grad-landing");
    // The worker takes the copies in stream order, so each subgroup is summed right after it lands.
    s_->landing.push_back(s_->landing_worker->submit(
        [landed = d2h.record().completion(), &in, subgroup, sum = tracks_norm()] {
          landed.get();
          if (sum) in.sum_subgroup(subgroup, true);
        }));
  }

  /// One step over the gradients given to accept_gradients, with the options' lr.
  offload_step_stats step() { return step(options_.lr); }
  /// One step over the accepted gradients with learning rate `lr`.
  offload_step_stats step(double lr) { return step(lr, std::span<bf16>{}); }
  /// One step over the accepted gradients, writing the updated 16-bit weights into `model_out`.
  template <class H>
    requires is_half_v<H>
  offload_step_stats step(double lr, std::span<H> model_out) {
    check_model_out(model_out.size());
    return accepted_step(lr, model_copy<H>{model_out, {}, {}});
  }
  /// One step over the accepted gradients that writes the updated 16-bit weights into `model` in
  /// the executor's device memory (size() elements): device updates write them in place, host
  /// updates into host staging (pinned for CUDA, charged to the host budget on first use), copied
  /// in on the executor's h2d stream as each update commits. All copies have landed when this
  /// returns. If one fails, the step has still completed (step_count() says so) and its typed
  /// error is rethrown: the device copy of the weights is then stale.
  template <class H>
    requires is_half_v<H>
  offload_step_stats step(double lr, device_span<H> model) {
    check_model_out(model.size());
    STRATA_EXPECTS(!model.empty(), config_error, "offloaded_adamw::step: empty device model copy");
    auto& staging = s_->model_staging;
    if (staging.size() < model.size_bytes())
      staging = s_->budget.allocate(model.size_bytes(), "the host staging of the device model copy");
    const std::span<H> staged(reinterpret_cast<H*>(staging.data()), model.size());
    return accepted_step(lr, model_copy<H>{{}, model, staged});
  }

  // --- state ------------------------------------------------------------------------------------

  /// Copies the fp32 master weights of every parameter into `out` (size() elements).
  void read_master(std::span<float> out) {
    STRATA_EXPECTS(out.size() == layout_.params, config_error,
                   "offloaded_adamw::read_master: span of {} for {} parameters", out.size(), layout_.params);
    visit_arrays([&](std::size_t s, const float* state) {
      std::memcpy(out.data() + begin(s), state, length(s) * sizeof(float));
    });
  }
  /// Copies the first and second moments into `m` and `v` (size() elements each).
  void read_moments(std::span<float> m, std::span<float> v) {
    STRATA_EXPECTS(m.size() == layout_.params && v.size() == layout_.params, config_error,
                   "offloaded_adamw::read_moments: spans of {} and {} for {} parameters", m.size(), v.size(),
                   layout_.params);
    visit_arrays([&](std::size_t s, const float* state) {
      const std::size_t n = length(s);
      std::memcpy(m.data() + begin(s), state + n, n * sizeof(float));
      std::memcpy(v.data() + begin(s), state + 2 * n, n * sizeof(float));
    });
  }
  /// Copies the running maximum of v (amsgrad only) into `out`.
  void read_max_exp_avg_sq(std::span<float> out) {
    STRATA_EXPECTS(options_.amsgrad, config_error, "offloaded_adamw::read_max_exp_avg_sq: amsgrad is off");
    STRATA_EXPECTS(out.size() == layout_.params, config_error,
                   "offloaded_adamw::read_max_exp_avg_sq: span of {} for {}", out.size(), layout_.params);
    visit_arrays([&](std::size_t s, const float* state) {
      const std::size_t n = length(s);
      std::memcpy(out.data() + begin(s), state + 3 * n, n * sizeof(float));
    });
  }

  /// Writes every cached (dirty) subgroup to the tier and flushes the tier: the tier then holds
  /// the whole current state durably.
  void flush() {
    check_state("flush");
    s_->pipeline.flush();
  }

  /// Removes every tier object this optimizer created (each subgroup's state object and, with
  /// gradients on the tier, its gradient object) and forgets what the host cache held; other
  /// objects and saved checkpoints stay. Afterwards the optimizer takes no step, flush, save or
  /// read (config_error): destroy it. Without this call an optimizer's objects outlive it on the
  /// tier (as a killed one's do); the next optimizer with the same prefix there (a restarted job,
  /// from a checkpoint or fresh) removes and rewrites them before it writes anything. Returns how
  /// many objects were removed.
  std::size_t remove_state() {
    check_state("remove_state");
    removed_ = true;
    std::size_t n = 0;
    for (std::size_t s = 0; s < layout_.subgroups(); ++s) {
      n += tier_->remove(object_name(s)) ? 1 : 0;
      if (layout_.tier_gradients) n += tier_->remove(offload_layout::gradient_name(offload_.object_prefix, s)) ? 1 : 0;
    }
    return n;
  }

  /// Writes a consistent checkpoint of the state (after the last completed step) into `dir`
  /// (created if missing): one data file, fsync'ed, then the manifest published atomically
  /// (write_file_atomic with fsync). A crash at any point leaves the previous checkpoint in `dir`
  /// loadable. Data files of earlier checkpoints are removed once the new manifest is durable.
  /// Throws config_error during a failed step (finish it first), io_error on file errors.
  void save(const std::filesystem::path& dir) {
    check_state("save");
    STRATA_EXPECTS(!partial_, config_error,
                   "offloaded_adamw::save: step {} failed part-way; retry it before saving", step_count_ + 1);
    trace_span span(tracer_, "offload.save");
    checkpoint_manifest m;
    m.step = step_count_;
    m.params = layout_.params;
    m.subgroup_elems = layout_.subgroup_elems;
    m.sections = layout_.sections;
    m.options = options_;
    m.loss_scaling = scaler_.enabled();
    m.loss_scale = scaler_.scale();
    m.growth_tracker = scaler_.growth_tracker();
    write_checkpoint(dir, std::move(m), layout_.subgroups(), [&](auto&& fn) { s_->pipeline.visit(fn); });
  }

  /// Steps completed (skipped steps not included).
  [[nodiscard]] std::uint64_t step_count() const noexcept { return step_count_; }
  /// What to multiply the loss by before backward (dynamic loss scaling; 1 when off).
  [[nodiscard]] float loss_scale() const noexcept { return scaler_.scale(); }
  /// The loss scaler (its options, scale and growth tracker).
  [[nodiscard]] const dynamic_loss_scaler& loss_scaler() const noexcept { return scaler_; }
  /// Parameters.
  [[nodiscard]] std::size_t size() const noexcept { return layout_.params; }
  /// Subgroups.
  [[nodiscard]] std::size_t subgroup_count() const noexcept { return layout_.subgroups(); }
  /// First parameter of subgroup `s`.
  [[nodiscard]] std::size_t begin(std::size_t s) const noexcept { return layout_.begin(s); }
  /// Parameters of subgroup `s`.
  [[nodiscard]] std::size_t length(std::size_t s) const noexcept { return layout_.length(s); }
  /// The layout of parameters, objects and slots.
  [[nodiscard]] const offload_layout& layout() const noexcept { return layout_; }
  /// The tier object holding subgroup `s`'s state.
  [[nodiscard]] const std::string& object_name(std::size_t s) const { return s_->pipeline.object(s).name; }
  /// Whether subgroup `s` is in the host cache now.
  [[nodiscard]] bool cached(std::size_t s) const { return s_->pipeline.cached(s); }
  [[nodiscard]] const adamw_options& options() const noexcept { return options_; }
  [[nodiscard]] const offload_options& offload() const noexcept { return offload_; }
  /// Totals since construction and the last step's figures.
  [[nodiscard]] offload_stats stats() const {
    offload_stats s = totals_;
    s.host_memory_used = s_->budget.used();
    s.host_memory_peak = s_->budget.peak();
    s.host_memory_budget = s_->budget.limit();
    s.cache_slots = s_->pipeline.slots().options().cache_slots;
    s.pipeline_slots = s_->pipeline.slots().options().host_slots - s.cache_slots;
    return s;
  }
  /// Host memory the pipeline and cache need for these options (what the budget must cover
  /// besides the gradient store); with `device`, the landing slots of device updates too.
  [[nodiscard]] static std::uint64_t required_host_memory(std::size_t params, const adamw_options& o,
                                                          const offload_options& off, bool device = false) {
    return offload_layout::of(params, o, off).required_host_memory(off, device);
  }
  [[nodiscard]] Tier& tier() noexcept { return *tier_; }
  /// The pipeline underneath (its state per subgroup, its slots and cache).
  [[nodiscard]] pipeline_type& pipeline() noexcept { return s_->pipeline; }

 private:
  // What must not move when the optimizer does (the pipeline's threads refer to it).
  struct parts {
    std::unique_ptr<Exec> owned_exec;  // when no executor was given
    Exec* exec_ref;                    // the executor in use (owned or given)
    host_budget budget;                // before every budgeted allocation: outlives them
    gradient_intake intake;
    std::unique_ptr<thread_pool> pool;
    pipeline_type pipeline;
    // Gradients copied from device memory: one task per subgroup that waits for its copy and
    // sums it (the worker goes before the intake and the executor it refers to).
    std::unique_ptr<thread_pool> landing_worker;
    std::vector<std::future<void>> landing;
    host_buffer model_staging;  // host side of a model copy in device memory

    parts(Tier& tier, Exec* exec, std::unique_ptr<Exec> owned, const offload_layout& layout,
          const offload_options& off, Evict evict, Site site, tracer* trace)
        : owned_exec(std::move(owned)),
          exec_ref(&exec_of(exec)),
          budget(off.host_memory_budget, exec_of(exec).staging()),
          intake(layout, budget),
          pool(off.threads > 1 ? std::make_unique<thread_pool>(off.threads, "strata-adamw") : nullptr),
          pipeline(tier, exec_of(exec), budget, layout.objects(off.object_prefix), pipeline_opts(layout, off),
                   std::move(evict), std::move(site), trace) {}

    Exec& exec_of(Exec* given) { return given != nullptr ? *given : *owned_exec; }
    static pipeline_options pipeline_opts(const offload_layout& layout, const offload_options& off) {
      pipeline_options p;
      p.cache_slots = layout.cache_slots(off);
      p.prefetch_depth = off.prefetch_depth;
      p.write_behind_depth = off.write_behind_depth;
      p.device_depth = off.device_depth;
      p.device_extra_bytes = static_cast<std::size_t>(layout.device_extra_bytes());
      p.eager_writes = off.eager_writes;
      p.trace_prefix = "offload";
      return p;
    }
  };

  // The common constructor: validates, sizes and allocates; writes nothing.
  offloaded_adamw(Tier& tier, Exec* exec, std::size_t params, adamw_options options, offload_options offload,
                  Order order, Evict evict, Site site, tracer* trace)
      : tier_(&tier),
        options_(options),
        offload_(std::move(offload)),
        order_(std::move(order)),
        tracer_(trace),
        layout_(checked_layout(params, options_, offload_)),
        scaler_(offload_.loss_scaling),
        claim_(&tier, tier.name(), offload_.object_prefix) {
    const bool device = site.uses_device();
    const std::uint64_t slot = layout_.slot_footprint();
    const std::size_t cache = layout_.cache_slots(offload_);
    const std::size_t pipeline = layout_.host_slots(offload_, device) - cache;
    const std::uint64_t needed = layout_.required_host_memory(offload_, device);
    STRATA_EXPECTS(needed <= offload_.host_memory_budget, config_error,
                   "offloaded_adamw: host memory budget {} is too small: {} needed = {} pipeline slots (prefetch {}, "
                   "write-behind {}, 1 updating{}) + {} cache slots, each {} ({} parameters x {} arrays); at least {} "
                   "without a cache",
                   format_size(offload_.host_memory_budget), format_size(needed), pipeline, offload_.prefetch_depth,
                   offload_.write_behind_depth,
                   device ? fmt::format(", {} device landing", offload_.device_depth) : std::string(), cache,
                   format_size(slot), layout_.max_length(), layout_.slot_bytes() / sizeof(float) / layout_.max_length(),
                   format_size(pipeline * slot));
    std::unique_ptr<Exec> owned;
    if constexpr (std::default_initializable<Exec>)
      if (exec == nullptr) owned = std::make_unique<Exec>();
    STRATA_ASSERT(exec != nullptr || owned != nullptr);
    s_ = std::make_unique<parts>(tier, exec, std::move(owned), layout_, offload_, std::move(evict), std::move(site),
                                 trace);
    version_.assign(layout_.subgroups(), 0);
    track_norm();
    totals_.host_memory_budget = offload_.host_memory_budget;
  }

  static offload_layout checked_layout(std::size_t params, adamw_options& options, const offload_options& offload) {
    options.validate();
    STRATA_EXPECTS(params > 0, config_error, "offloaded_adamw: no parameters");
    return offload_layout::of(params, options, offload);  // (refuses counts whose sizes overflow)
  }

  static offloaded_adamw load_impl(const std::filesystem::path& dir, Tier& tier, Exec* exec, offload_options offload,
                                   Order order, Evict evict, Site site, tracer* trace) {
    const auto m = load_manifest(dir);
    offload.subgroup_elems = static_cast<std::size_t>(m.subgroup_elems);
    adamw_options opts = m.options;
    if (opts.amsgrad != (m.sections == 4))
      throw integrity_error("checkpoint", (dir / "manifest").string(), 0, "amsgrad does not match the number of arrays");
    offloaded_adamw opt(tier, exec, static_cast<std::size_t>(m.params), opts, std::move(offload), std::move(order),
                        std::move(evict), std::move(site), trace);
    const checkpoint_reader reader(dir, m, opt.layout_.subgroups(),
                                   [&](std::size_t s) { return opt.layout_.state_bytes(s); });
    opt.check_tier_room();
    opt.write_initial_state([&](std::size_t s, std::span<std::byte> state) { reader.read(s, state); });
    opt.step_count_ = m.step;
    std::fill(opt.version_.begin(), opt.version_.end(), m.step);
    if (m.loss_scaling) opt.scaler_.restore(m.loss_scale, m.growth_tracker);  // a no-op when scaling is off now
    opt.track_norm();
    return opt;
  }

  void initialize_from(std::span<const float> params) {
    write_initial_state([&](std::size_t s, std::span<std::byte> state) {
      const std::size_t n = length(s);
      std::memcpy(state.data(), params.data() + begin(s), n * sizeof(float));
      std::memset(state.data() + n * sizeof(float), 0, (layout_.sections - 1) * n * sizeof(float));
    });
  }

  // Writes every subgroup's first state. Objects of our names that are there already are a
  // killed or earlier run's (a tier refuses to give up anyone else's: foreign_file_error): they
  // are removed first, so nothing of them (a longer file, stale checksums, a copy on another
  // path) survives into this state, whatever the crash left. When the write fails (a full disk,
  // an I/O error), the objects it created are removed again.
  template <class Fill>
  void write_initial_state(Fill&& fill) {
    reclaim_objects();
    try {
      s_->pipeline.initialize(std::forward<Fill>(fill));
    } catch (...) {
      for (std::size_t s = 0; s < layout_.subgroups(); ++s) {
        try {
          (void)tier_->remove(object_name(s));
        } catch (...) {  // the construction's own error is the one to report
        }
      }
      throw;
    }
  }

  // The names this optimizer's objects have on the tier.
  template <class F>
  void for_each_object_name(F&& fn) const {
    for (std::size_t s = 0; s < layout_.subgroups(); ++s) {
      fn(object_name(s), layout_.state_bytes(s));
      if (layout_.tier_gradients) fn(offload_layout::gradient_name(offload_.object_prefix, s), length(s) * 4);
    }
  }

  // Removes every object of our names, on every path that holds one (a multipath finds one copy
  // at a time; a crash during a migration can leave two).
  void reclaim_objects() {
    for_each_object_name([&](const std::string& name, std::uint64_t) {
      for (int copies = 0; tier_->size(name).has_value(); ++copies) {
        if (!tier_->remove(name) || copies > 64)
          throw io_error(fmt::format("remove (an earlier run's object, tier '{}')", tier_->name()), name, EBUSY);
      }
    });
  }

  // The whole state must fit the tier: checked before anything is written or reclaimed, so a
  // disk that cannot hold it is a capacity_error that says how much is needed, not a failure
  // half-way. Objects of our names count as room (they are replaced).
  void check_tier_room() const {
    const std::uint64_t cap = tier_->capacity();
    if (cap == unlimited_capacity) return;
    std::uint64_t need = 0, reclaimed = 0;
    for_each_object_name([&](const std::string& name, std::uint64_t bytes) {
      need += bytes;
      reclaimed += tier_->size(name).value_or(0);
    });
    const std::uint64_t used = tier_->used();
    const std::uint64_t room = (cap > used ? cap - used : 0) + std::min(reclaimed, used);
    if (need > room)
      throw capacity_error(fmt::format("offloaded_adamw: the optimizer state of {} parameters needs {} on tier '{}', "
                                       "which has {} free ({} of {} in use)",
                                       layout_.params, format_size(need), tier_->name(), format_size(room),
                                       format_size(used), format_size(cap)),
                           need, room);
  }

  // Whether the gradients are summed before a step (clipping or loss scaling needs the norm).
  [[nodiscard]] bool tracks_norm() const noexcept { return offload_.max_grad_norm > 0 || scaler_.enabled(); }
  // (Re)arms the intake's norm with the current inverse scale; between steps only.
  void track_norm() {
    if (tracks_norm()) s_->intake.track_norm(scaler_.inv_scale(), s_->pool.get());
  }

  // Waits for the gradients copied from device memory; on a failed copy the step's gradients
  // are dropped (to be handed over again), the d2h stream is cleared and the error rethrown.
  void land_device_gradients() {
    auto& landing = s_->landing;
    std::exception_ptr first;
    for (auto& f : landing) {
      try {
        f.get();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    landing.clear();
    if (!first) return;
    s_->intake.reset();
    track_norm();
    try {
      s_->exec_ref->d2h().sync();
    } catch (...) {  // the error being reported
    }
    std::rethrow_exception(first);
  }

  // One step over the accepted gradients, the model copy where `model` says.
  template <class H>
  offload_step_stats accepted_step(double lr, model_copy<H> model) {
    check_lr(lr);
    land_device_gradients();
    auto& in = s_->intake;
    for (std::size_t s = 0; s < layout_.subgroups(); ++s)
      STRATA_EXPECTS(in.complete(s) || version_[s] > step_count_, config_error,
                     "offloaded_adamw::step: subgroup {} has {} of its {} gradients (call accept_gradients first)", s,
                     in.received(s), length(s));
    if (layout_.tier_gradients) return run_step<float>(lr, model, tier_gradients(), in.norms());
    switch (in.kind()) {
      case grad_kind::f32: return run_step<float>(lr, model, stored<float>(), in.norms());
      case grad_kind::b16: return run_step<bf16>(lr, model, stored<bf16>(), in.norms());
      case grad_kind::f16: break;
    }
    return run_step<fp16>(lr, model, stored<fp16>(), in.norms());
  }


  void check_lr(double lr) const {
    check_state("step");
    // 0 is allowed, as in PyTorch: warm-up schedules start there (the moments still advance).
    STRATA_EXPECTS(std::isfinite(lr) && lr >= 0, config_error,
                   "offloaded_adamw::step: learning rate {} must be finite and not negative", lr);
    STRATA_EXPECTS(!partial_ || lr == partial_lr_, config_error,
                   "offloaded_adamw::step: retrying step {} with lr {}, but it began with lr {}", step_count_ + 1, lr,
                   partial_lr_);
  }
  void check_model_out(std::size_t n) const {
    STRATA_EXPECTS(n == 0 || n == layout_.params, config_error,
                   "offloaded_adamw::step: model copy has {} elements for {} parameters (give all or none)", n,
                   layout_.params);
  }

  template <class G>
  auto stored() {
    return [this](std::size_t s, std::span<std::byte>) { return s_->intake.template of<G>(s); };
  }
  // fp32 gradients read from the tier with the state sit after it in the slot.
  auto tier_gradients() {
    return [this](std::size_t s, std::span<std::byte> slot) {
      return std::span<const float>(reinterpret_cast<const float*>(slot.data() + layout_.state_bytes(s)), length(s));
    };
  }

  void check_state(std::string_view what) const {
    STRATA_EXPECTS(!removed_, config_error, "offloaded_adamw::{}: the state was removed (remove_state)", what);
  }

  template <class F>
  void visit_arrays(F&& fn) {
    check_state("read");
    s_->pipeline.visit([&](std::size_t s, std::span<const std::byte> state) {
      fn(s, reinterpret_cast<const float*>(state.data()));
    });
  }

  // Widens gradients [first, first + n) to fp32 and writes them to their subgroups' gradient
  // objects, through a free host slot used as scratch.
  template <class G>
  void stage_gradients_to_tier(std::span<const G> grads, std::size_t first) {
    s_->pipeline.with_free_slot([&](std::span<std::byte> scratch) {
      float* buf = reinterpret_cast<float*>(scratch.data());
      s_->intake.for_each_piece(first, grads.size(), [&](std::size_t s, std::size_t lo, std::size_t hi) {
        STRATA_ASSERT((hi - lo) * sizeof(float) <= scratch.size());
        for (std::size_t i = lo; i < hi; ++i) buf[i - lo] = detail::widen(grads[i - first]);
        const auto bytes = std::as_bytes(std::span<const float>(buf, hi - lo));
        tier_->write(offload_layout::gradient_name(offload_.object_prefix, s), (lo - begin(s)) * sizeof(float), bytes)
            .get();
        totals_.gradient_bytes_written += bytes.size();
        s_->intake.count(lo, hi - lo);
        s_->intake.add_to_norm(s, lo, std::span<const float>(buf, hi - lo));
      });
    });
  }

  // Ends a step's gradients: the scaler learns whether they were finite, the intake starts over.
  void finish_gradients(bool found_nonfinite) {
    scaler_.update(found_nonfinite);
    s_->intake.reset();
    track_norm();
  }

  // A step with inf/NaN gradients: nothing changes but the loss scale.
  offload_step_stats skip_step(const grad_norm_accumulator& norms) {
    offload_step_stats st;
    st.step = step_count_;
    st.skipped = true;
    st.grad_norm = decision_.grad_norm;
    st.loss_scale = scaler_.scale();
    st.nonfinite_subgroups = norms.nonfinite_subgroups();
    finish_gradients(true);
    ++totals_.skipped_steps;
    totals_.last = st;
    return st;
  }

  // `norms` holds every subgroup's gradient sums when tracks_norm() (a retried step reuses the
  // decision its first attempt made, so the subgroups updated then and now agree).
  template <class G, class H, class GradsOf>
  offload_step_stats run_step(double lr, model_copy<H> model, GradsOf grads_of, const grad_norm_accumulator& norms) {
    land_device_gradients();  // (no-op when none are in flight) before the intake may be reset
    trace_span step_span(tracer_, "offload.step");
    if (!partial_) {
      decision_ = step_decision{};
      if (tracks_norm()) {
        STRATA_ASSERT(norms.subgroups() == layout_.subgroups());
        decision_ = decide_step(norms, offload_.max_grad_norm > 0 ? std::optional<double>(offload_.max_grad_norm)
                                                                  : std::nullopt);
      }
      if (decision_.skip) return skip_step(norms);
    }
    const adamw_step_params k = make_adamw_step_params(options_, static_cast<std::int64_t>(step_count_) + 1, lr,
                                                       scaler_.inv_scale(), decision_.clip);
    const std::size_t n = layout_.subgroups();
    const auto order = order_of(order_, step_count_, n);
    const auto next = order_of(order_, step_count_ + 1, n);
    check_permutation(order, n, step_count_, "offloaded_adamw");
    std::vector<std::size_t> todo;
    for (const std::size_t s : order)
      if (version_[s] == step_count_) todo.push_back(s);
    partial_ = true;
    partial_lr_ = lr;

    auto commit = [this](std::size_t s) { ++version_[s]; };
    adamw_subgroup_kernel<Exec, G, H, GradsOf, decltype(commit)> kernel(layout_, k, std::move(grads_of), model,
                                                                         s_->pool.get(), commit, s_->exec_ref);
    const pass_stats ps = s_->pipeline.run(order, next, todo, step_count_, kernel);
    ++step_count_;
    partial_ = false;
    std::exception_ptr model_copy_failed;  // the step is complete either way
    if (!model.device.empty()) {
      try {
        s_->exec_ref->h2d().sync();
      } catch (...) {
        model_copy_failed = std::current_exception();
      }
    }

    offload_step_stats st;
    st.step = step_count_;
    if (tracks_norm()) st.grad_norm = decision_.grad_norm;
    st.clip = decision_.clip;
    st.loss_scale = scaler_.scale();
    finish_gradients(false);
    st.subgroups = ps.updated;
    st.device_updates = ps.device_updates;
    st.read_wait_s = ps.read_wait_s;
    st.compute_s = ps.compute_s;
    st.kernel_s = ps.kernel_s;
    st.write_wait_s = ps.write_wait_s;
    st.total_s = ps.total_s;
    st.cache_hits = ps.cache_hits;
    st.cache_misses = ps.cache_misses;
    st.bytes_read = ps.bytes_read;
    st.bytes_written = ps.bytes_written;
    auto& pipe = s_->pipeline;
    pipe.refresh_paths();
    for (std::size_t i = 0; i < pipe.path_count(); ++i) {
      const auto& d = pipe.paths()[i];
      st.paths.push_back({d.name, d.read_bandwidth, d.write_bandwidth, ps.path_read[i], ps.path_written[i]});
    }
    st.compute_bound();
    totals_.cache_hits += st.cache_hits;
    totals_.cache_misses += st.cache_misses;
    totals_.bytes_read += st.bytes_read;
    totals_.bytes_written += st.bytes_written;
    totals_.steps = step_count_;
    totals_.last = st;
    if (model_copy_failed) std::rethrow_exception(model_copy_failed);
    return st;
  }

  Tier* tier_;
  adamw_options options_;
  offload_options offload_;
  Order order_;
  tracer* tracer_;
  offload_layout layout_;
  dynamic_loss_scaler scaler_;
  prefix_claim claim_;        // no other optimizer of this process uses our objects of this tier
  step_decision decision_{};  // of the step in progress (kept when it fails part-way)
  std::unique_ptr<parts> s_;
  std::vector<std::uint64_t> version_;  // steps applied to each subgroup
  std::uint64_t step_count_ = 0;
  bool partial_ = false;
  bool removed_ = false;  // remove_state() ran
  double partial_lr_ = 0;
  offload_stats totals_;
};

}  // namespace strata
