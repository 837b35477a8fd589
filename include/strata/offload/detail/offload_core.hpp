#pragma once
/// offload_core<Exec, Rule>: everything an offloaded optimizer does (offloaded_adamw with
/// adamw_rule, offloaded_sgd, offloaded_lion), with the tier, the update order, the eviction
/// policy and the update site taken at run time (any_tier, any_update_order, any_eviction_policy,
/// any_update_site), so it is compiled once per executor and update rule rather than once per
/// tier stack and policy. The rule (optim/update_rule.hpp) brings the state's arrays, the
/// per-step constants and the kernels; everything else (layout, gradient intake, clipping and
/// loss scaling, checkpoints) is the engine's and the same for every rule.
/// offloaded_optimizer (offload/offloaded_optimizer.hpp) is the typed facade users construct; see
/// its file comment for the contract of every member.

#include <algorithm>
#include <array>
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
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/budget.hpp"
#include "strata/core/completion.hpp"
#include "strata/core/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/trace.hpp"
#include "strata/core/units.hpp"
#include "strata/exec/device_span.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/subgroup_kernel.hpp"
#include "strata/offload/checkpoint.hpp"
#include "strata/offload/checkpoint_manifest.hpp"
#include "strata/offload/tier_checkpoint.hpp"
#include "strata/offload/gradient_intake.hpp"
#include "strata/offload/param_tensors.hpp"
#include "strata/offload/offload_layout.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/offload/offload_stats.hpp"
#include "strata/offload/prefix_claim.hpp"
#include "strata/optim/adamw_cpu.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/adamw_state.hpp"
#include "strata/optim/grad_norm.hpp"
#include "strata/optim/loss_scaler.hpp"
#include "strata/optim/param_steps.hpp"
#include "strata/optim/step_rates.hpp"
#include "strata/optim/update_rule.hpp"
#include "strata/pipeline/subgroup_pipeline.hpp"
#include "strata/policy/any_eviction_policy.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/tier.hpp"

namespace strata::detail {

template <executor Exec, update_rule Rule = adamw_rule>
class offload_core {
 public:
  using executor_type = Exec;
  using rule_type = Rule;
  using options_type = typename Rule::options_type;
  using pipeline_type = subgroup_pipeline<Exec>;
  /// An event of the executor's streams (what accept_gradients from device memory waits for).
  using event_type = typename Exec::stream_type::event_type;

  offload_core(offload_core&&) noexcept = default;
  offload_core& operator=(offload_core&&) = delete;
  offload_core(const offload_core&) = delete;
  offload_core& operator=(const offload_core&) = delete;
  ~offload_core() = default;

  // --- steps ------------------------------------------------------------------------------------

  /// One step with the options' lr over gradients of every parameter (float, bf16 or fp16).
  template <gradient_type G>
  offload_step_stats step(std::span<const G> grads) {
    return step(grads, options_.lr);
  }
  /// One step with learning rate `rates` (a scheduler's value, or one lr and weight decay per
  /// range of parameters: step_rates).
  template <gradient_type G>
  offload_step_stats step(std::span<const G> grads, const step_rates& rates) {
    return step(grads, rates, std::span<bf16>{});
  }
  /// One step that also writes the updated weights, rounded to bf16/fp16 (or exact, for a float
  /// model), into `model_out` (size() elements, or empty for none) in the same pass.
  template <gradient_type G, class H>
    requires model_copy_type<H>
  offload_step_stats step(std::span<const G> grads, const step_rates& rates, std::span<H> model_out) {
    STRATA_EXPECTS(grads.size() == layout_.params, config_error,
                   "{}: got {} gradients for {} parameters", who("step"), grads.size(), layout_.params);
    check_undeclared("step");
    check_rates(rates);
    check_model_out(model_out.size());
    if (layout_.tier_gradients) {
      s_->intake.reset();
      stage_gradients_to_tier(grads, 0);
      return run_step<float>(rates, model_copy<H>{model_out, {}, {}}, tier_gradients<H>(), s_->intake.norms());
    }
    grad_norm_accumulator norms;
    if (tracks_norm() && !partial_)
      for (std::size_t s = 0; s < layout_.subgroups(); ++s)
        norms.add(s, grad_stats_cpu(grads.subspan(begin(s), length(s)), scaler_.inv_scale(), s_->pool.get()));
    return run_step<G>(rates, model_copy<H>{model_out, {}, {}}, piece_source<G, H>{grads, nullptr, &layout_}, norms);
  }

  /// One step over framework tensors as they are (param_tensor: each tensor's gradients and
  /// weights in the caller's memory, valid until this returns; ascending, disjoint): the
  /// updated weights are written into each tensor's own `model` span. Tensors without gradients
  /// (and parameters no tensor covers) are left exactly as they are: their state, weights and
  /// step counts (param_steps) do not change, and a subgroup without any gradient is neither
  /// read nor written, as torch.optim.AdamW skips a parameter whose .grad is None. `opts` may
  /// make the tensors' weights the truth (adopt_model) and give the clip/skip decision for the
  /// whole model. With clipping or loss scaling on and no decision given, the norm is that of
  /// the gradients given. A retry of a failed step must give gradients for the same parameters
  /// (config_error otherwise).
  template <gradient_type G, model_copy_type H>
  offload_step_stats step(std::span<const param_tensor<G, H>> tensors, const step_rates& rates,
                          const step_options& opts = {}) {
    check_undeclared("step");
    check_rates(rates);
    auto cover = gradient_coverage::of(tensors, layout_.params, who("step"));
    STRATA_EXPECTS(!partial_ || !partial_tensors_ || cover == partial_cover_, config_error,
                   "{}: retrying step {} with gradients of other parameters than it began with", who("step"),
                   step_count_ + 1);
    STRATA_EXPECTS(!opts.adopt_model || !device_site_, config_error,
                   "{}: adopt_model needs host updates (the update site may choose the device)", who("step"));
    grad_norm_accumulator norms;
    if (tracks_norm() && !partial_ && !opts.decision)
      for (std::size_t s = 0; s < layout_.subgroups(); ++s)  // (a subgroup without gradients adds nothing)
        norms.add(s, cover.touches(begin(s), begin(s) + length(s)) ? tensor_stats(tensors, begin(s), begin(s) + length(s))
                                                                    : grad_stats{0.0, 0});
    partial_cover_ = std::move(cover);
    if (layout_.tier_gradients) {
      if (!partial_) {
        s_->intake.reset();
        for (const auto& t : tensors)
          if (!t.grad.empty()) stage_gradients_to_tier(t.grad, t.first, /*track=*/false);
      }
      return run_step<float>(rates, model_copy<H>{}, piece_source<float, H, param_tensor<G, H>>{{}, nullptr, &layout_, tensors, true, true},
                             norms, &partial_cover_, opts);
    }
    return run_step<G>(rates, model_copy<H>{}, piece_source<G, H>{{}, nullptr, &layout_, tensors, false, true}, norms,
                       &partial_cover_, opts);
  }

  /// The squared norm of the tensors' gradients (unscaled by the current loss scale, as the step
  /// would see them) and their count: what a caller adds up over several optimizers or processes
  /// to decide one step for the whole model (decide_step, then step_options::decision).
  template <gradient_type G, model_copy_type H>
  [[nodiscard]] grad_stats gradient_stats(std::span<const param_tensor<G, H>> tensors) {
    (void)gradient_coverage::of(tensors, layout_.params, who("gradient_stats"));
    return tensor_stats(tensors, 0, layout_.params);
  }

  /// Sets the loss scaler's scale and growth tracker (another optimizer's, so that several
  /// optimizers of one model scale alike). No-op when loss scaling is off; between steps.
  void restore_loss_scale(float scale, std::int64_t growth_tracker) {
    check_undeclared("restore_loss_scale");
    STRATA_EXPECTS(!partial_, config_error, "{}: during a failed step", who("restore_loss_scale"));
    STRATA_EXPECTS(std::isfinite(scale) && scale > 0 && growth_tracker >= 0, config_error,
                   "{}: scale {} / growth tracker {}", who("restore_loss_scale"), scale, growth_tracker);
    scaler_.restore(scale, growth_tracker);
    track_norm();
  }

  /// Declares the next step over handed-over gradients (step() without gradients) before
  /// backward hands any over: its rates and the host model copy it writes (empty: none). With
  /// offload_options::update_as_gradients_land (on by default), each subgroup whose gradients
  /// are all in is then read and updated at once, on a thread of the optimizer, while backward
  /// goes on, in landing order: the update is the one step() would make, bit for bit, and its
  /// weights go into the model copy when it commits, before step() (backward has handed over
  /// that subgroup's gradients, so it no longer needs those weights; a loop whose backward still
  /// reads them, e.g. a weight tied to a later use, must hand its gradients over last). With
  /// clipping or loss scaling on, a subgroup is only read as it lands and is updated by step(),
  /// which knows the norm of every gradient then. Gradients handed over from device memory,
  /// gradients on the tier and an update site that may choose the device make the step run in
  /// step() as before (this then only declares). step() must repeat the rates and the model copy
  /// (config_error otherwise). Until step(), a call other than accept_gradients and step() first
  /// ends the early updates: those made stay, and the step is then part-way (as after a failure:
  /// step() with the same rates finishes it; discard_gradients() refuses). An error of an early
  /// update is raised by step(), typed; the subgroups updated before it keep their update.
  template <class H = bf16>
    requires model_copy_type<H>
  void begin_step(const step_rates& rates, std::span<H> model_out = {}) {
    check_rates(rates);
    STRATA_EXPECTS(!partial_, config_error, "{}: step {} failed part-way: finish it with step() first",
                   who("begin_step"), step_count_ + 1);
    STRATA_EXPECTS(!declared_, config_error, "{}: step {} is declared already (call step())", who("begin_step"),
                   step_count_ + 1);
    check_model_out(model_out.size());
    check_blocks(piece_source<float, H>{{}, nullptr, &layout_},
                 rule_constants<Rule>(options_, rates, steps_, scaler_.inv_scale(), step_decision{}.clip));
    declared_step d;
    d.rates = rates;
    d.model = model_out.data();
    d.model_size = model_out.size();
    d.model_type = model_type_of<H>();
    d.follow_landing = offload_.update_as_gradients_land;
    d.early = d.follow_landing && offload_.gradients == gradient_residency::host && !layout_.tier_gradients &&
              !device_site_ && s_->landing.empty();
    d.start = &offload_core::start_early_of<H>;
    declared_ = std::move(d);
    // Gradients handed over before this call: their complete subgroups land now, in index order.
    if (declared_->follow_landing)
      for (std::size_t s = 0; s < layout_.subgroups(); ++s)
        if (s_->intake.complete(s)) landed(s);
  }

  /// Hands over the gradients of subgroup `subgroup` (its full length) as backward produces them;
  /// step() without gradients then uses them. 16-bit gradients stay 16-bit in host memory (host
  /// residency); with tier residency they are widened to fp32 and written to the tier now.
  template <gradient_type G>
  void accept_gradients(std::size_t subgroup, std::span<const G> grads) {
    STRATA_EXPECTS(subgroup < layout_.subgroups(), config_error,
                   "{}: subgroup {} of {}", who("accept_gradients"), subgroup, layout_.subgroups());
    STRATA_EXPECTS(grads.size() == length(subgroup), config_error,
                   "{}: got {} gradients for subgroup {} of {} parameters", who("accept_gradients"),
                   grads.size(), subgroup, length(subgroup));
    accept_gradients_at(begin(subgroup), grads);
  }

  /// Hands over the gradients of parameters [first, first + grads.size()), which may span
  /// subgroups. Ranges must not overlap within a step.
  template <gradient_type G>
  void accept_gradients_at(std::size_t first, std::span<const G> grads) {
    check_accepts();
    s_->intake.check(first, grads.size());
    if (layout_.tier_gradients) {  // (the intake sums them for the norm as they are staged)
      stage_gradients_to_tier(grads, first);
      return;
    }
    if (s_->landing.empty()) {
      s_->intake.store(first, grads);
      if (declared_ && declared_->follow_landing)
        s_->intake.for_each_piece(first, grads.size(), [&](std::size_t s, std::size_t, std::size_t) {
          if (s_->intake.complete(s)) landed(s);
        });
      return;
    }
    // Device pieces of these subgroups may still be landing: sum after them, in stream order.
    auto& in = s_->intake;
    in.store(first, grads, false);
    std::vector<std::size_t> completed;
    if (tracks_norm())
      in.for_each_piece(first, grads.size(), [&](std::size_t s, std::size_t, std::size_t) {
        if (in.complete(s)) completed.push_back(s);
      });
    land_after(make_ready_completion(), std::move(completed));
  }

  /// Hands over subgroup `subgroup`'s gradients that backward left in the executor's device
  /// memory once `ready` has completed (accept_gradients_at with the subgroup's range).
  template <gradient_type G>
  void accept_gradients(std::size_t subgroup, device_span<const G> grads, const event_type& ready) {
    STRATA_EXPECTS(subgroup < layout_.subgroups(), config_error,
                   "{}: subgroup {} of {}", who("accept_gradients"), subgroup, layout_.subgroups());
    STRATA_EXPECTS(grads.size() == length(subgroup), config_error,
                   "{}: got {} gradients for subgroup {} of {} parameters", who("accept_gradients"),
                   grads.size(), subgroup, length(subgroup));
    accept_gradients_at(begin(subgroup), grads, ready);
  }

  /// Hands over the gradients of parameters [first, first + grads.size()) (which may span
  /// subgroups: one parameter tensor of a framework) that backward left in the executor's device
  /// memory, once `ready` (an event of the executor's streams, or a foreign one wrapped by the
  /// executor's event type, recorded after backward wrote them) has completed: the copy into the
  /// gradient store (pinned when the executor asks for it) is enqueued on the executor's d2h
  /// stream and this returns at once, so the copy overlaps the rest of backward. With clipping or
  /// loss scaling each subgroup's norm is summed on a worker thread as soon as its last piece has
  /// landed. step() waits for the copies; a failed copy makes step() throw its typed error before
  /// any state changes, and every gradient of the step must then be handed over again. Host
  /// residency only; `grads` must stay valid until step().
  template <gradient_type G>
  void accept_gradients_at(std::size_t first, device_span<const G> grads, const event_type& ready) {
    check_accepts();
    STRATA_EXPECTS(!layout_.tier_gradients, config_error,
                   "{}: gradients in device memory need gradient_residency::host", who("accept_gradients"));
    if (declared_) declared_->early = false;  // (the subgroups they complete are updated by step())
    auto& in = s_->intake;
    in.check(first, grads.size());
    const std::span<G> dst = in.template reserve<G>(first, grads.size());
    std::vector<std::size_t> completed;  // the subgroups this range completes, summed once it lands
    if (tracks_norm())
      in.for_each_piece(first, grads.size(), [&](std::size_t s, std::size_t, std::size_t) {
        if (in.complete(s)) completed.push_back(s);
      });
    auto& d2h = s_->exec_ref->d2h();
    d2h.wait(ready);
    d2h.copy_to_host(std::as_writable_bytes(dst), grads.bytes());
    // The worker takes the copies in stream order, so earlier pieces of a subgroup land first.
    land_after(d2h.record().completion(), std::move(completed));
  }

  /// Drops the gradients handed over since the last step (a batch the caller decided to skip,
  /// or a backward that failed part-way), so every gradient may be handed over again. Copies from
  /// device memory still in flight are waited for first; a failed one is not an error here. Ends
  /// a declared step (begin_step) as it was not taken; config_error when some subgroups of the
  /// step were updated already (as their gradients landed, or before a failure): their
  /// gradients cannot be taken back, so the step must be finished.
  void discard_gradients() {
    (void)settle_declared(/*rethrow=*/false);
    // Gradients some subgroups were updated with cannot be taken back: the step must finish.
    const std::size_t updated = updated_this_step();
    STRATA_EXPECTS(updated == 0, config_error,
                   "{}: {} subgroups of step {} were updated already (as their gradients landed, or before a failure); "
                   "hand the rest over and call step()",
                   who("discard_gradients"), updated, step_count_ + 1);
    try {
      land_device_gradients();
    } catch (const std::exception&) {  // those gradients are being dropped anyway
    }
    s_->intake.reset();
    track_norm();
  }

  /// One step over the gradients given to accept_gradients, with the options' lr.
  offload_step_stats step() { return step(options_.lr); }
  /// One step over the accepted gradients with learning rate `rates` (one, or one per range).
  offload_step_stats step(const step_rates& rates) { return step(rates, std::span<bf16>{}); }
  /// One step over the accepted gradients, writing the updated weights (16-bit or fp32) into `model_out`.
  template <class H>
    requires model_copy_type<H>
  offload_step_stats step(const step_rates& rates, std::span<H> model_out) {
    check_model_out(model_out.size());
    return accepted_step(rates, model_copy<H>{model_out, {}, {}});
  }
  /// One step over the accepted gradients that writes the updated weights (16-bit or fp32) into `model` in
  /// the executor's device memory (size() elements): device updates write them in place, host
  /// updates into host staging (pinned for CUDA, charged to the host budget on first use), copied
  /// in on the executor's h2d stream as each update commits. All copies have landed when this
  /// returns. If one fails, the step has still completed (step_count() says so) and its typed
  /// error is rethrown: the device copy of the weights is then stale.
  template <class H>
    requires model_copy_type<H>
  offload_step_stats step(const step_rates& rates, device_span<H> model) {
    check_model_out(model.size());
    STRATA_EXPECTS(!model.empty(), config_error, "{}: empty device model copy", who("step"));
    auto& staging = s_->model_staging;
    if (staging.size() < model.size_bytes())
      staging = s_->budget.allocate(model.size_bytes(), "the host staging of the device model copy");
    const std::span<H> staged(reinterpret_cast<H*>(staging.data()), model.size());
    return accepted_step(rates, model_copy<H>{{}, model, staged});
  }

  // --- state ------------------------------------------------------------------------------------

  /// Copies the fp32 master weights of every parameter into `out` (size() elements).
  void read_master(std::span<float> out) {
    STRATA_EXPECTS(out.size() == layout_.params, config_error,
                   "{}: span of {} for {} parameters", who("read_master"), out.size(), layout_.params);
    visit_arrays([&](std::size_t s, const float* state) {
      std::memcpy(out.data() + begin(s), state, length(s) * sizeof(float));
    });
  }
  /// Copies the state array called `name` (one of the rule's format: "exp_avg",
  /// "momentum_buffer", ...) of every parameter into `out` (size() elements), widened to fp32.
  /// config_error for a name the rule does not keep.
  void read_state(std::string_view name, std::span<float> out) {
    const std::size_t a = layout_.format.find(name);
    STRATA_EXPECTS(a < layout_.format.count, config_error,
                   "offloaded_{}::read_state: the state has no array '{}' (it has '{}')", Rule::tag, name,
                   strata::describe(layout_.format));
    STRATA_EXPECTS(out.size() == layout_.params, config_error, "offloaded_{}::read_state: span of {} for {} parameters",
                   Rule::tag, out.size(), layout_.params);
    visit_arrays([&](std::size_t s, const float* state) {
      // (read only: the view is not const because kernels write through it)
      const state_view v = state_view::of(reinterpret_cast<std::byte*>(const_cast<float*>(state)), layout_.format,
                                          length(s));
      read_state_array(v, layout_.format, a, out.subspan(begin(s), length(s)));
    });
  }
  /// Copies the first and second moments into `m` and `v` (size() elements each).
  void read_moments(std::span<float> m, std::span<float> v)
    requires std::same_as<Rule, adamw_rule>
  {
    STRATA_EXPECTS(m.size() == layout_.params && v.size() == layout_.params, config_error,
                   "{}: spans of {} and {} for {} parameters", who("read_moments"), m.size(), v.size(),
                   layout_.params);
    read_state("exp_avg", m);
    read_state("exp_avg_sq", v);
  }
  /// Copies the running maximum of v (amsgrad only) into `out`.
  void read_max_exp_avg_sq(std::span<float> out)
    requires std::same_as<Rule, adamw_rule>
  {
    STRATA_EXPECTS(options_.amsgrad, config_error, "{}: amsgrad is off", who("read_max_exp_avg_sq"));
    STRATA_EXPECTS(out.size() == layout_.params, config_error,
                   "{}: span of {} for {}", who("read_max_exp_avg_sq"), out.size(), layout_.params);
    read_state("max_exp_avg_sq", out);
  }

  /// Writes every cached (dirty) subgroup to the tier and flushes the tier: the tier then holds
  /// the whole current state durably.
  void flush() {
    check_state("flush");
    settle_declared();
    s_->pipeline.flush();
  }

  /// Removes every tier object this optimizer created (each subgroup's state object and, with
  /// gradients on the tier, its gradient object) and forgets what the host cache held; other
  /// objects and saved checkpoints stay. Afterwards the optimizer takes no step, flush, save or
  /// read (config_error): destroy it. Without this call an optimizer's objects outlive it on the
  /// tier (as a killed one's do); the next optimizer with the same prefix there (a restarted job,
  /// from a checkpoint or fresh) removes and rewrites them before it writes anything. Returns how
  /// many objects were removed. A removal that fails (a path that is down) does not stop the
  /// others: every object that can be removed is, then the first failure is rethrown (the tier's
  /// typed error, naming the object's path), so one failed path never leaves objects on another.
  std::size_t remove_state() {
    check_state("remove_state");
    try {
      settle_declared();
    } catch (...) {  // its objects go
    }
    try {
      s_->pipeline.settle();  // (reads of the next step, writes of the last: their objects go)
    } catch (...) {  // a write that failed: of an object about to be removed
    }
    removed_ = true;
    std::size_t n = 0;
    std::exception_ptr first;
    for_each_object_name([&](const std::string& name, std::uint64_t) {
      try {
        n += s_->pipeline.tier().remove(name) ? 1 : 0;
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    });
    if (first) std::rethrow_exception(first);
    return n;
  }

  /// Writes a consistent checkpoint of the state (after the last completed step) into `dir`
  /// (created if missing): one data file, fsync'ed, then the manifest published atomically
  /// (write_file_atomic with fsync). A crash at any point leaves the previous checkpoint in `dir`
  /// loadable. Data files of earlier checkpoints are removed once the new manifest is durable.
  /// Throws config_error during a failed step (finish it first), io_error on file errors.
  void save(const std::filesystem::path& dir) {
    auto m = manifest_for_save();
    trace_span span(tracer_, "offload.save");
    write_checkpoint(dir, std::move(m), layout_.subgroups(), [&](auto&& fn) { s_->pipeline.visit(fn); });
  }

  /// save(dir), with the tensors' weights as the truth (step_options::adopt_model): where they
  /// were written since the last step, the checkpoint holds their values as master weights, as
  /// the next step would adopt them. Their gradients are not used; the running state is not
  /// changed.
  template <gradient_type G, model_copy_type H>
  void save(const std::filesystem::path& dir, std::span<const param_tensor<G, H>> tensors) {
    (void)gradient_coverage::of(tensors, layout_.params, who("save"));
    auto m = manifest_for_save();
    trace_span span(tracer_, "offload.save");
    write_checkpoint(dir, std::move(m), layout_.subgroups(), adopted_visit(tensors));
  }
  /// save(store) with the tensors' weights as the truth (see above).
  template <gradient_type G, model_copy_type H>
  void save(any_tier& store, std::span<const param_tensor<G, H>> tensors) {
    (void)gradient_coverage::of(tensors, layout_.params, who("save"));
    auto m = manifest_for_save();
    trace_span span(tracer_, "offload.save");
    write_checkpoint(store, std::move(m), layout_.subgroups(), adopted_visit(tensors));
  }

  /// Writes a consistent checkpoint into `store`, a tier (an object_store_tier on a prefix of its
  /// own, say): one object per subgroup, then the manifest, then a pointer to it (see
  /// offload/tier_checkpoint.hpp). The previous checkpoint stays loadable until the pointer moved.
  void save(any_tier& store) {
    auto m = manifest_for_save();
    trace_span span(tracer_, "offload.save");
    write_checkpoint(store, std::move(m), layout_.subgroups(), [&](auto&& fn) { s_->pipeline.visit(fn); });
  }

  /// Steps completed (skipped steps not included).
  [[nodiscard]] std::uint64_t step_count() const noexcept { return step_count_; }
  /// Steps each parameter has taken: step_count() for every one unless steps over gradient
  /// ranges left some out (the bias corrections of a parameter's next update count its own).
  [[nodiscard]] const param_steps& param_step_counts() const noexcept { return steps_; }
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
  /// The rule's hyper-parameters.
  [[nodiscard]] const options_type& options() const noexcept { return options_; }
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
  [[nodiscard]] static std::uint64_t required_host_memory(std::size_t params, const options_type& o,
                                                          const offload_options& off, bool device = false) {
    const offload_options r = offload_layout::resolved_format(params, Rule::format(o), off, device);
    return offload_layout::of_format(params, Rule::format(o), r).required_host_memory(r, device);
  }
  /// The pipeline underneath (its state per subgroup, its slots and cache).
  /// (The reads of the next step that run between steps end first: the pipeline is the caller's.)
  [[nodiscard]] pipeline_type& pipeline() noexcept {
    end_reads_ahead();
    return s_->pipeline;
  }

 protected:
  // The updates (or reads) of a declared step (begin_step) that run while backward hands
  // gradients over: a driver thread runs the pipeline's open pass, which the hand-overs offer
  // subgroups to. Between steps the same thread reads the next step's first subgroups as the
  // writes the last one left land (prefetch_next_step). It refers only to what does not move
  // with the optimizer (parts, and its own copies of the layout and the versions).
  struct early_pass {
    pipeline_type* pipe;
    offload_layout layout;               // the kernel's
    std::vector<std::uint64_t> version;  // version_ as the pass leaves it
    pass_stats stats;
    std::exception_ptr error;
    bool update = false;  // updates (else only reads) the subgroups offered
    bool speculate = false;  // ... or updates copies of their state, which step() may adopt
    float inv_scale = 1;     // the loss scale's inverse the speculative updates used
    bool ahead = false;   // the pass in progress reads the next step's first subgroups (between steps)
    std::exception_ptr ahead_error;  // of a write the last step left, raised by the next call
    // One thread for the optimizer's life, not one per pass: a request stays tied to the thread
    // that issued it (io_uring cancels those of a thread that exits), and the writes a pass
    // leaves in flight land after it.
    thread_pool driver{1, "strata-early"};
    std::future<void> pass;  // of the open pass in progress

    early_pass(pipeline_type& p, const offload_layout& l) : pipe(&p), layout(l) {}
    early_pass(const early_pass&) = delete;
    early_pass& operator=(const early_pass&) = delete;
    ~early_pass() {
      end(std::make_exception_ptr(config_error("the optimizer was destroyed during backward")));
      try {
        pipe->settle();  // what the driver issued lands before its thread ends
      } catch (...) {  // (destruction reports nothing; the state on the tier is as after a crash)
      }
    }
    [[nodiscard]] bool running() const noexcept { return pass.valid(); }
    // Ends the offers (with `cancel`: the pass starts nothing more) and waits for the pass.
    void end(std::exception_ptr cancel = nullptr) noexcept {
      if (!pass.valid()) return;
      pipe->close_offers(std::move(cancel));
      pass.wait();
      pass = {};
    }
  };

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
    std::unique_ptr<early_pass> early;  // last: its driver stops before anything it uses goes

    parts(any_tier t, Exec* exec, std::unique_ptr<Exec> owned, const offload_layout& layout,
          const offload_options& off, any_eviction_policy evict, any_update_site site, tracer* trace)
        : owned_exec(std::move(owned)),
          exec_ref(&exec_of(exec)),
          budget(off.host_memory_budget, exec_of(exec).staging()),
          intake(layout, budget, who()),
          pool(off.threads > 1 ? std::make_unique<thread_pool>(off.threads, "strata-adamw") : nullptr),
          pipeline(std::move(t), exec_of(exec), budget, layout.objects(off.object_prefix), pipeline_opts(layout, off),
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
      p.read_next_in_pass = off.prefetch_next_step;  // (the step's tail reads what follows)
      p.read_ahead_of_offers = off.update_as_gradients_land;  // (backward's later subgroups)
      p.return_before_writes = off.return_before_writes;
      p.trace_prefix = "offload";
      return p;
    }
  };

  // The common constructor: validates, sizes and allocates; writes nothing.
  offload_core(any_tier tier, const void* identity, Exec* exec, std::size_t params, options_type options,
               offload_options offload, any_update_order order, any_eviction_policy evict, any_update_site site,
               tracer* trace)
      : options_(options),
        offload_(resolved_options(params, options_, std::move(offload), site.uses_device())),
        order_(std::move(order)),
        tracer_(trace),
        layout_(checked_layout(params, options_, offload_)),
        scaler_(offload_.loss_scaling),
        claim_(identity, tier.name(), offload_.object_prefix) {
    const bool device = site.uses_device();
    const std::uint64_t slot = layout_.slot_footprint();
    const std::size_t cache = layout_.cache_slots(offload_);
    const std::size_t pipeline = layout_.host_slots(offload_, device) - cache;
    const std::uint64_t needed = layout_.required_host_memory(offload_, device);
    STRATA_EXPECTS(needed <= offload_.host_memory_budget, config_error,
                   "{}: host memory budget {} is too small: {} needed = {} pipeline slots (prefetch {}, "
                   "write-behind {}, 1 updating{}) + {} cache slots, each {} ({} parameters x {} bytes); at least {} "
                   "without a cache", who(),
                   format_size(offload_.host_memory_budget), format_size(needed), pipeline, offload_.prefetch_depth,
                   offload_.write_behind_depth,
                   device ? fmt::format(", {} device landing", offload_.device_depth) : std::string(), cache,
                   format_size(slot), layout_.max_length(), layout_.slot_bytes() / layout_.max_length(),
                   format_size(pipeline * slot));
    std::unique_ptr<Exec> owned;
    if constexpr (std::default_initializable<Exec>)
      if (exec == nullptr) owned = std::make_unique<Exec>();
    STRATA_ASSERT(exec != nullptr || owned != nullptr);
    s_ = std::make_unique<parts>(std::move(tier), exec, std::move(owned), layout_, offload_, std::move(evict), std::move(site),
                                 trace);
    version_.assign(layout_.subgroups(), 0);
    steps_ = param_steps(params);
    device_site_ = device;
    track_norm();
    totals_.host_memory_budget = offload_.host_memory_budget;
  }

  // The options with the gradient residency decided (automatic: by the budget), validated.
  static offload_options resolved_options(std::size_t params, options_type& options, offload_options offload,
                                          bool device) {
    options.validate();
    STRATA_EXPECTS(params > 0, config_error, "offloaded_{}: no parameters", Rule::tag);
    return offload_layout::resolved_format(params, Rule::format(options), std::move(offload), device);
  }
  static offload_layout checked_layout(std::size_t params, options_type& options, const offload_options& offload) {
    options.validate();
    STRATA_EXPECTS(params > 0, config_error, "offloaded_{}: no parameters", Rule::tag);
    return offload_layout::of_format(params, Rule::format(options), offload);  // (refuses counts whose sizes overflow)
  }

  // What a save records (everything but the data), after checking that one may be taken now.
  checkpoint_manifest manifest_for_save() {
    check_state("save");
    settle_declared();
    STRATA_EXPECTS(!partial_, config_error,
                   "{}: step {} failed part-way; retry it before saving", who("save"), step_count_ + 1);
    checkpoint_manifest m;
    m.step = step_count_;
    m.params = layout_.params;
    m.subgroup_elems = layout_.subgroup_elems;
    m.rule = std::string(Rule::tag);
    m.state = strata::describe(layout_.format);
    m.options = Rule::save_options(options_);
    m.loss_scaling = scaler_.enabled();
    m.loss_scale = scaler_.scale();
    m.growth_tracker = scaler_.growth_tracker();
    m.step_runs.assign(steps_.runs().begin(), steps_.runs().end());
    return m;
  }

  // The manifest of the checkpoint in `dir` (a directory or a store) and the rule's options it
  // records: a checkpoint of another rule is a config_error naming both, a state format other
  // than the one its options imply an integrity_error.
  template <class Where>
  static std::pair<checkpoint_manifest, options_type> checked_manifest(Where&& where) {
    auto m = read_checkpoint_manifest(where);
    STRATA_EXPECTS(m.rule == Rule::tag, config_error,
                   "checkpoint {} holds the state of update rule '{}'; this optimizer's rule is '{}' (load it with "
                   "offloaded_{})",
                   describe(where), m.rule, Rule::tag, m.rule);
    options_type o;
    try {
      o = Rule::load_options(m.options);
    } catch (const config_error& e) {
      throw integrity_error("checkpoint", describe(where), 0, e.what());
    }
    if (strata::describe(Rule::format(o)) != m.state)
      throw integrity_error("checkpoint", describe(where), 0,
                            fmt::format("state format '{}' is not the one its options give rule '{}' ('{}')", m.state,
                                        Rule::tag, strata::describe(Rule::format(o))));
    return {std::move(m), o};
  }
  static std::string describe(const std::filesystem::path& dir) { return (dir / "manifest").string(); }
  static std::string describe(const any_tier& store) { return fmt::format("{}/manifest", store.name()); }

  // Restores the state of checkpoint `m` in `dir` (read by the caller) onto the tier.
  void restore(const std::filesystem::path& dir, const checkpoint_manifest& m) {
    restore_from(checkpoint_reader(dir, m, layout_.subgroups(), [&](std::size_t s) { return layout_.state_bytes(s); }), m);
  }
  // The same from a checkpoint in a store.
  void restore(any_tier& store, const checkpoint_manifest& m) {
    restore_from(store_checkpoint_reader(store, m, layout_.subgroups(), [&](std::size_t s) { return layout_.state_bytes(s); }),
                 m);
  }
  template <class Reader>
  void restore_from(const Reader& reader, const checkpoint_manifest& m) {
    check_tier_room();
    write_initial_state([&](std::size_t s, std::span<std::byte> state) { reader.read(s, state); });
    step_count_ = m.step;
    std::fill(version_.begin(), version_.end(), m.step);
    steps_ = m.step_runs.empty() ? param_steps(layout_.params, m.step)
                                 : param_steps::from_runs(layout_.params, m.step_runs, "checkpoint");
    if (m.loss_scaling) scaler_.restore(m.loss_scale, m.growth_tracker);  // a no-op when scaling is off now
    track_norm();
  }

  // State that exists already for initialize_with: per array of the format (in order), every
  // parameter's fp32 values (empty: zeros), and the steps taken.
  struct existing_state {
    std::array<std::span<const float>, max_state_arrays> arrays{};
    std::uint64_t step = 0;
    std::span<const param_step_run> step_runs{};
  };
  // AdamW's (validated).
  existing_state existing_of(const adamw_state_view& v) const
    requires std::same_as<Rule, adamw_rule>
  {
    v.validate(layout_.params, options_.amsgrad, "offloaded_adamw");
    return {{v.exp_avg, v.exp_avg_sq, v.max_exp_avg_sq, {}}, v.step, v.step_runs};
  }
  // Any rule's, arrays by name (validated).
  existing_state existing_of(const rule_state_view& v) const {
    v.validate(layout_.format, layout_.params, who());
    existing_state e{{}, v.step, v.step_runs};
    for (const named_array& a : v.arrays) e.arrays[layout_.format.find(a.name)] = a.values;
    return e;
  }

  template <class P>
  void initialize_from(std::span<const P> params) {
    initialize_from(params, existing_state{});
  }
  template <class P>
  void initialize_from(std::span<const P> params, const adamw_state_view& existing)
    requires std::same_as<Rule, adamw_rule>
  {
    initialize_from(params, existing_of(existing));
  }
  template <class P>
  void initialize_from(std::span<const P> params, const rule_state_view& existing) {
    initialize_from(params, existing_of(existing));
  }

  // The first state from `params` and existing state (zeros where `existing` has none), after
  // existing.step steps.
  template <class P>  // float, or a 16-bit model's weights (widened exactly)
  void initialize_from(std::span<const P> params, const existing_state& existing) {
    STRATA_EXPECTS(params.size() == layout_.params, config_error, "offloaded_{}: {} weights for {} parameters",
                   Rule::tag, params.size(), layout_.params);
    initialize_with(existing, [&](std::size_t s, float* master) {
      for (std::size_t i = 0; i < length(s); ++i) master[i] = static_cast<float>(params[begin(s) + i]);
    });
  }
  // The same from framework tensors' weights (param_tensor; their gradients are not used), which
  // must cover every parameter: no flat copy of the model is made.
  template <class G, class H>
  void initialize_from(std::span<const param_tensor<G, H>> tensors, const adamw_state_view& existing)
    requires std::same_as<Rule, adamw_rule>
  {
    initialize_from(tensors, existing_of(existing));
  }
  template <class G, class H>
  void initialize_from(std::span<const param_tensor<G, H>> tensors, const rule_state_view& existing) {
    initialize_from(tensors, existing_of(existing));
  }
  template <class G, class H>
  void initialize_from(std::span<const param_tensor<G, H>> tensors, const existing_state& existing) {
    (void)gradient_coverage::of(tensors, layout_.params, who());
    std::size_t covered = 0;
    for (const auto& t : tensors) {
      STRATA_EXPECTS(t.model.size() == t.count, config_error,
                     "{}: the tensor at parameter {} brings no weights to start from", who(), t.first);
      covered += t.count;
    }
    STRATA_EXPECTS(covered == layout_.params, config_error, "{}: the tensors hold {} of the {} parameters", who(),
                   covered, layout_.params);
    const piece_source<G, H> pieces{{}, nullptr, &layout_, tensors, false, true};
    initialize_with(existing, [&](std::size_t s, float* master) {
      pieces.for_each(s, {}, [&](std::size_t lo, std::size_t hi, std::span<const G>, std::span<H> w) {
        for (std::size_t i = lo; i < hi; ++i) master[i - begin(s)] = static_cast<float>(w[i - lo]);
      });
    });
  }

  // The first state: each subgroup's master weights from `master_of(s, master)`, existing
  // moments (zeros where `existing` has none), after existing.step steps.
  template <class MasterOf>
  void initialize_with(const existing_state& existing, MasterOf&& master_of) {
    // (validated before anything is written)
    for (std::size_t a = 0; a < max_state_arrays; ++a)
      STRATA_ASSERT(existing.arrays[a].empty() ||
                    (a < layout_.format.count && existing.arrays[a].size() == layout_.params));
    param_steps steps = existing.step_runs.empty()
                            ? param_steps(layout_.params, existing.step)
                            : param_steps::from_runs(layout_.params, existing.step_runs, who() + ": step_runs");
    STRATA_EXPECTS(steps.max() <= existing.step, config_error,
                   "{}: a parameter has taken {} steps, more than the state's {}", who(), steps.max(),
                   existing.step);
    write_initial_state([&](std::size_t s, std::span<std::byte> state) {
      const std::size_t n = length(s);
      master_of(s, reinterpret_cast<float*>(state.data()));
      const state_view v = state_view::of(state.data(), layout_.format, n);
      for (std::size_t a = 0; a < layout_.format.count; ++a) {
        const std::span<const float> from = existing.arrays[a];
        write_state_array(v, layout_.format, a, from.empty() ? from : from.subspan(begin(s), n));
      }
    });
    step_count_ = existing.step;
    std::fill(version_.begin(), version_.end(), existing.step);
    steps_ = std::move(steps);
  }

  // Writes every subgroup's first state. Objects of our names that are there already are a
  // killed or earlier run's (a tier refuses to give up anyone else's: foreign_file_error): they
  // are removed first, so nothing of them (a longer file, stale checksums, a copy on another
  // path) survives into this state, whatever the crash left. When the write fails (a full disk,
  // an I/O error), the objects it created are removed again.
  template <class Fill>
  void write_initial_state(Fill&& fill) {
    end_reads_ahead();
    s_->pipeline.settle();
    reclaim_objects();
    try {
      s_->pipeline.initialize(std::forward<Fill>(fill));
    } catch (...) {
      for (std::size_t s = 0; s < layout_.subgroups(); ++s) {
        try {
          (void)s_->pipeline.tier().remove(object_name(s));
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
      for (int copies = 0; s_->pipeline.tier().size(name).has_value(); ++copies) {
        if (!s_->pipeline.tier().remove(name) || copies > 64)
          throw io_error(fmt::format("remove (an earlier run's object, tier '{}')", s_->pipeline.tier().name()), name, EBUSY);
      }
    });
  }

  // The whole state must fit the tier: checked before anything is written or reclaimed, so a
  // disk that cannot hold it is a capacity_error that says how much is needed, not a failure
  // half-way. Objects of our names count as room (they are replaced).
  void check_tier_room() const {
    const std::uint64_t cap = s_->pipeline.tier().capacity();
    if (cap == unlimited_capacity) return;
    std::uint64_t need = 0, reclaimed = 0;
    for_each_object_name([&](const std::string& name, std::uint64_t bytes) {
      need += bytes;
      reclaimed += s_->pipeline.tier().size(name).value_or(0);
    });
    const std::uint64_t used = s_->pipeline.tier().used();
    const std::uint64_t room = (cap > used ? cap - used : 0) + std::min(reclaimed, used);
    if (need > room)
      throw capacity_error(fmt::format("{}: the optimizer state of {} parameters needs {} on tier '{}', "
                                       "which has {} free ({} of {} in use)", who(),
                                       layout_.params, format_size(need), s_->pipeline.tier().name(), format_size(room),
                                       format_size(used), format_size(cap)),
                           need, room);
  }

  // A visit for write_checkpoint that hands each subgroup's state with its master weights
  // following the tensors' weights (adopt_model_copy), copied: the running state stays as it is.
  template <gradient_type G, model_copy_type H>
  auto adopted_visit(std::span<const param_tensor<G, H>> tensors) {
    return [this, tensors](auto&& fn) {
      std::vector<std::byte> copy;
      const piece_source<G, H> pieces{{}, nullptr, &layout_, tensors, false, true};
      s_->pipeline.visit([&](std::size_t s, std::span<const std::byte> state) {
        copy.assign(state.begin(), state.end());
        float* master = reinterpret_cast<float*>(copy.data());
        pieces.for_each(s, {}, [&](std::size_t lo, std::size_t hi, std::span<const G>, std::span<H> model) {
          if (!model.empty()) adopt_model_copy<H>(std::span<float>(master + (lo - begin(s)), hi - lo), model);
        });
        fn(s, std::span<const std::byte>(copy));
      });
    };
  }

  // --- a step declared before backward (begin_step) ----------------------------------------------

  struct declared_step {
    step_rates rates{0.0};
    const void* model = nullptr;  // the host model copy (model_size elements of model_type)
    std::size_t model_size = 0;
    int model_type = 0;
    bool follow_landing = false;  // update_as_gradients_land: the order follows the landing
    bool early = false;           // subgroups are offered to the early pass as they land
    std::vector<std::size_t> landed;  // subgroups whose gradients are all in, in landing order
    void (*start)(offload_core&, grad_kind) = nullptr;  // starts the early pass for the model type
  };
  template <class H>
  static constexpr int model_type_of() {
    return std::is_same_v<H, float> ? 1 : std::is_same_v<H, bf16> ? 2 : 3;
  }

  void check_undeclared(std::string_view what) const {
    STRATA_EXPECTS(!declared_, config_error,
                   "{}: step {} was declared by begin_step over handed-over gradients: call step() without them "
                   "first",
                   who(what), step_count_ + 1);
  }

  // Subgroup `s`'s gradients are all in: it joins the landing order and, with early updates, the
  // early pass (started by the first one, when the gradients' type is known).
  void landed(std::size_t s) {
    auto& d = *declared_;
    d.landed.push_back(s);
    if (!d.early || version_[s] != step_count_) return;
    if (!s_->early || !s_->early->running() || s_->early->ahead) {  // (reads between steps end first)
      try {
        d.start(*this, s_->intake.kind());
      } catch (...) {  // a thread that cannot start: step() does it all, as without begin_step
        d.early = false;
        return;
      }
    }
    s_->pipeline.offer(s);
  }

  template <class H>
  static void start_early_of(offload_core& self, grad_kind k) {
    switch (k) {
      case grad_kind::f32: self.template start_early<float, H>(); return;
      case grad_kind::b16: self.template start_early<bf16, H>(); return;
      case grad_kind::f16: self.template start_early<fp16, H>(); return;
    }
  }

  // The order of the declared step's pass as planned before anything landed: the last declared
  // step's landing order when every subgroup landed in it, else the update order's.
  [[nodiscard]] std::vector<std::size_t> planned_order() const {
    const std::size_t n = layout_.subgroups();
    if (landing_order_.size() == n) return landing_order_;
    return order_of(order_, step_count_, n);
  }

  template <class G, class H>
  void start_early() {
    const auto& d = *declared_;
    end_reads_ahead();  // (the early pass reads on in the same order)
    if (!s_->early) s_->early = std::make_unique<early_pass>(s_->pipeline, layout_);
    early_pass& e = *s_->early;
    e.version = version_;
    // With clipping or loss scaling the update needs every gradient's norm (or inf check): the
    // pass then updates copies, as if neither clipped nor skipped, and step() adopts them when
    // that is what it decides (else they are dropped: the slots kept the state as it was).
    e.update = !tracks_norm();
    e.speculate = !e.update && offload_.speculate_updates && last_unclipped_;
    e.inv_scale = scaler_.inv_scale();
    e.stats = {};
    e.error = nullptr;
    std::vector<std::size_t> order = planned_order();
    check_permutation(order, layout_.subgroups(), step_count_, who());
    rule_constants<Rule> k(options_, d.rates, steps_, scaler_.inv_scale(), step_decision{}.clip);
    const model_copy<H> model{std::span<H>(static_cast<H*>(const_cast<void*>(d.model)), d.model_size), {}, {}};
    s_->pipeline.forget_offers();
    parts* p = s_.get();
    e.pass = e.driver.submit([p, &e, order = std::move(order), k = std::move(k), model, step = step_count_]() mutable {
      try {
        subgroup_kernel<Rule, Exec, G, H, piece_source<G, H>, count_version> kernel(
            e.layout, std::move(k), piece_source<G, H>{{}, &p->intake, &e.layout},
            e.speculate ? model_copy<H>{} : model, p->pool.get(), count_version{&e.version}, p->exec_ref);
        e.stats = e.speculate ? p->pipeline.run_speculative(order, order, step, kernel)
                              : p->pipeline.run_open(order, order, step, kernel, e.update);
      } catch (...) {
        e.error = std::current_exception();
      }
    });
  }

  // Adds what the early pass moved and updated to the figures of the pass that finished the step
  // (its waits were backward's time, not the step's).
  static void add_early(pass_stats& ps, const pass_stats& e) {
    ps.updated += e.updated;
    ps.host_updates += e.host_updates;
    ps.device_updates += e.device_updates;
    ps.kernel_s += e.kernel_s;
    ps.cache_hits += e.cache_hits;
    ps.cache_misses += e.cache_misses;
    ps.bytes_read += e.bytes_read;
    ps.bytes_written += e.bytes_written;
    ps.prefetched += e.prefetched;
    ps.prefetched_bytes += e.prefetched_bytes;
    for (std::size_t i = 0; i < ps.path_read.size() && i < e.path_read.size(); ++i) {
      ps.path_read[i] += e.path_read[i];
      ps.path_written[i] += e.path_written[i];
    }
  }

  // What the early pass of a declared step did.
  struct early_outcome {
    bool declared = false;
    bool follow_landing = false;
    bool ran = false;
    bool speculated = false;  // speculative updates wait in the pipeline, made at `inv_scale`
    float inv_scale = 1;
    std::vector<std::size_t> landed;
    pass_stats stats;
    std::exception_ptr error;
  };
  // Ends the declared step's early pass (if one runs): waits for it; the subgroups it updated
  // are at the next step in version_.
  early_outcome end_declared() {
    end_reads_ahead();
    early_outcome out;
    if (!declared_) return out;
    out.declared = true;
    out.follow_landing = declared_->follow_landing;
    out.landed = std::move(declared_->landed);
    declared_.reset();
    early_pass* e = s_->early.get();
    if (e == nullptr || !e->running()) return out;
    e->end();
    out.ran = true;
    out.stats = std::exchange(e->stats, {});
    out.error = std::exchange(e->error, nullptr);
    out.speculated = e->speculate && out.stats.speculated > 0;
    out.inv_scale = e->inv_scale;
    if (e->update) version_ = e->version;
    return out;
  }
  // Subgroups updated by the step in progress.
  [[nodiscard]] std::size_t updated_this_step() const {
    return static_cast<std::size_t>(
        std::count_if(version_.begin(), version_.end(), [&](std::uint64_t v) { return v > step_count_; }));
  }
  // Ends the declared step before a call that needs the pipeline: the early updates made stay
  // and make the step part-way (step() with its rates finishes it). Raises an early update's
  // error (with `rethrow`). Returns how many subgroups it had updated.
  std::size_t settle_declared(bool rethrow = true) {
    end_reads_ahead();
    if (!declared_) {
      if (rethrow) raise_ahead_error();
      return 0;
    }
    const step_rates rates = declared_->rates;
    const early_outcome out = end_declared();
    const std::size_t updated = updated_this_step();
    if (updated > 0) {
      partial_ = true;
      partial_tensors_ = false;
      partial_rates_ = rates;
      decision_ = step_decision{};
    }
    if (rethrow && out.error) std::rethrow_exception(out.error);
    if (rethrow) raise_ahead_error();
    return updated;
  }

  // Starts reading the next step's first subgroups, `first` in its order, on the early pass's
  // thread: into free slots as the writes this step left land, while the caller's forward and
  // backward run, until the next call that needs the pipeline (end_reads_ahead). Where no
  // thread can be had, reads what fits now (prefetch).
  void start_reads_ahead(std::vector<std::size_t> first) {
    auto& pipe = s_->pipeline;
    try {
      if (!s_->early) s_->early = std::make_unique<early_pass>(pipe, layout_);
      early_pass& e = *s_->early;
      STRATA_ASSERT(!e.running());
      pipe.forget_offers();  // (a close that found its pass ended would end this one at once)
      e.ahead = true;
      pipeline_type* p = &pipe;
      e.pass = e.driver.submit([p, &e, first = std::move(first)] {
        try {
          (void)p->read_ahead(first);
        } catch (...) {
          e.ahead_error = std::current_exception();
        }
      });
    } catch (...) {
      if (s_->early) s_->early->ahead = false;
      pipe.prefetch(first);
    }
  }
  // Ends the reads between steps (if they run): the pipeline is this thread's again; what they
  // read stays for the next pass. A failed write they found waits in ahead_error.
  void end_reads_ahead() noexcept {
    early_pass* e = s_ ? s_->early.get() : nullptr;
    if (e == nullptr || !e->ahead) return;
    e->end();
    e->ahead = false;
  }
  // The error of a write the last step left, found between steps: raised once, by the next call
  // (its subgroup keeps the only copy in its slot; that call's pass writes it first).
  void raise_ahead_error() {
    early_pass* e = s_ ? s_->early.get() : nullptr;
    if (e != nullptr && e->ahead_error) std::rethrow_exception(std::exchange(e->ahead_error, nullptr));
  }

  void check_accepts() const {
    STRATA_EXPECTS(offload_.gradients != gradient_residency::caller, config_error,
                   "{}: gradient_residency::caller keeps no gradients between calls: give "
                   "them to step()", who("accept_gradients"));
  }

  // Whether the gradients are summed before a step (clipping or loss scaling needs the norm).
  [[nodiscard]] bool tracks_norm() const noexcept { return offload_.max_grad_norm > 0 || scaler_.enabled(); }
  // (Re)arms the intake's norm with the current inverse scale; between steps only.
  void track_norm() {
    if (tracks_norm()) s_->intake.track_norm(scaler_.inv_scale(), s_->pool.get());
  }

  // After `landed`, sums the subgroups in `completed` on the landing worker (which runs in the
  // order of the calls, so every earlier piece has landed by then).
  void land_after(strata::completion landed, std::vector<std::size_t> completed) {
    if (!s_->landing_worker) s_->landing_worker = std::make_unique<thread_pool>(1, "strata-grad-landing");
    auto& in = s_->intake;
    s_->landing.push_back(s_->landing_worker->submit([landed = std::move(landed), &in, completed = std::move(completed)] {
      landed.get();
      for (const std::size_t s : completed) in.sum_subgroup(s, true);
    }));
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
  offload_step_stats accepted_step(const step_rates& rates, model_copy<H> model) {
    check_rates(rates);
    if (declared_) {
      const auto& d = *declared_;
      STRATA_EXPECTS(rates == d.rates, config_error, "{}: step {} was declared with {} (begin_step), not {}",
                     who("step"), step_count_ + 1, describe(d.rates), describe(rates));
      STRATA_EXPECTS(model.device.empty() && d.model == static_cast<const void*>(model.host.data()) &&
                         d.model_size == model.host.size() && (d.model_size == 0 || d.model_type == model_type_of<H>()),
                     config_error, "{}: step {} was declared (begin_step) with another model copy", who("step"),
                     step_count_ + 1);
    }
    land_device_gradients();
    auto& in = s_->intake;
    for (std::size_t s = 0; s < layout_.subgroups(); ++s)
      STRATA_EXPECTS(in.complete(s) || version_[s] > step_count_, config_error,
                     "{}: subgroup {} has {} of its {} gradients (call accept_gradients first)", who("step"), s,
                     in.received(s), length(s));
    if (layout_.tier_gradients) return run_step<float>(rates, model, tier_gradients<H>(), in.norms());
    switch (in.kind()) {
      case grad_kind::f32: return run_step<float>(rates, model, stored<float, H>(), in.norms());
      case grad_kind::b16: return run_step<bf16>(rates, model, stored<bf16, H>(), in.norms());
      case grad_kind::f16: break;
    }
    return run_step<fp16>(rates, model, stored<fp16, H>(), in.norms());
  }


  void check_rates(const step_rates& rates) const {
    check_state("step");
    rates.validate(layout_.params, who("step"));
    STRATA_EXPECTS(!partial_ || rates == partial_rates_, config_error,
                   "{}: retrying step {} with other rates than it began with ({} now, {} then)", who("step"),
                   step_count_ + 1, describe(rates), describe(partial_rates_));
  }
  [[nodiscard]] static std::string describe(const step_rates& r) {
    return r.uniform() ? fmt::format("lr {}", r.lr()) : fmt::format("{} parameter ranges", r.ranges().size());
  }
  void check_model_out(std::size_t n) const {
    STRATA_EXPECTS(n == 0 || n == layout_.params, config_error,
                   "{}: model copy has {} elements for {} parameters (give all or none)", who("step"), n,
                   layout_.params);
  }

  // Where a step finds subgroup s's gradients: the caller's span of every parameter's, the
  // gradient store, or (fp32, read from the tier) the slot after the state. One type per gradient
  // type, so each (gradient, model copy) pair compiles the step once.
  // Where a step finds subgroup s's gradients: the caller's span of every parameter's, the
  // gradient store, (fp32, read from the tier) the slot after the state, or the caller's
  // tensors (param_tensor), which also bring their own weights. With `tier` set the tensors
  // give coverage and weights and the gradients come from the slot. One type per gradient type,
  // so each (gradient, model copy) pair compiles the step once.
  template <class G, class H, class T = param_tensor<G, H>>
  struct piece_source {
    std::span<const G> all{};
    const gradient_intake* store = nullptr;
    const offload_layout* layout = nullptr;
    std::span<const T> tensors{};
    bool tier = false;          // with tensors: gradients from the slot
    bool from_tensors = false;  // the tensors give the parts (even when there are none)

    [[nodiscard]] bool has_own_weights() const noexcept { return from_tensors; }
    // Calls f(lo, hi, grads, own weights) for subgroup s's parts (see adamw_subgroup_kernel);
    // `slot` may be empty when only the bounds and whether there are gradients matter.
    template <class F>
    void for_each(std::size_t s, std::span<std::byte> slot, F&& f) const {
      const std::size_t lo = layout->begin(s), hi = lo + layout->length(s);
      if (!from_tensors) {
        f(lo, hi, whole(s, slot), std::span<H>());
        return;
      }
      auto it = std::upper_bound(tensors.begin(), tensors.end(), lo,
                                 [](std::size_t v, const T& t) { return v < t.first + t.count; });
      for (; it != tensors.end() && it->first < hi; ++it) {
        const std::size_t a = std::max(lo, it->first), b = std::min(hi, it->first + it->count);
        std::span<const G> g;
        if (!it->grad.empty()) {
          if constexpr (std::is_same_v<T, param_tensor<G, H>>)
            g = tier ? whole(s, slot).subspan(a - lo, b - a) : it->grad.subspan(a - it->first, b - a);
          else
            g = whole(s, slot).subspan(a - lo, b - a);
        }
        f(a, b, g, it->model.empty() ? std::span<H>() : it->model.subspan(a - it->first, b - a));
      }
    }

   private:
    std::span<const G> whole(std::size_t s, std::span<std::byte> slot) const {
      if (store != nullptr) return store->template of<G>(s);
      if (!all.empty()) return all.subspan(layout->begin(s), layout->length(s));
      if constexpr (std::is_same_v<G, float>)
        return {reinterpret_cast<const float*>(slot.data() + pipeline_object::aux_offset(layout->state_bytes(s))),
                layout->length(s)};
      STRATA_ASSERT(false && "only fp32 gradients are read from the tier");
      return {};
    }
  };
  // A block-quantized state is updated a whole block at a time (update_rule): refuses, before the
  // step changes anything, one whose parts (tensors, with or without gradients, and the pieces of
  // one rate and step count within them) would share a block.
  template <class Src>
  void check_blocks(const Src& pieces, const rule_constants<Rule>& k) const {
    const std::size_t block = layout_.format.block();
    if (block == 0) return;
    for (std::size_t s = 0; s < layout_.subgroups(); ++s) {
      detail::block_claims claims(block, s, begin(s), Rule::tag);
      const auto part = [&](std::size_t lo, std::size_t hi, bool has_grads) {
        if (!has_grads) return claims.claim(lo, hi);
        k.for_each_piece(lo, hi - lo, [&](std::size_t off, std::size_t len, const typename Rule::step_params&) {
          claims.claim(lo + off, lo + off + len);
        });
      };
      const std::size_t lo = begin(s), hi = lo + length(s);
      if (!pieces.from_tensors) {
        part(lo, hi, true);
        continue;
      }
      using T = typename decltype(pieces.tensors)::value_type;
      auto it = std::upper_bound(pieces.tensors.begin(), pieces.tensors.end(), lo,
                                 [](std::size_t v, const T& t) { return v < t.first + t.count; });
      for (; it != pieces.tensors.end() && it->first < hi; ++it)
        part(std::max(lo, it->first), std::min(hi, it->first + it->count), !it->grad.empty());
    }
  }

  template <class G, class H>
  piece_source<G, H> stored() {
    return {{}, &s_->intake, &layout_};
  }
  template <class H>
  piece_source<float, H> tier_gradients() {
    return {{}, nullptr, &layout_};
  }

  // The stats of the tensors' gradients within [lo, hi) (unscaled by the current loss scale).
  template <class G, class H>
  grad_stats tensor_stats(std::span<const param_tensor<G, H>> tensors, std::size_t lo, std::size_t hi) const {
    grad_stats total;
    for (const auto& t : tensors) {
      const std::size_t a = std::max(lo, t.first), b = std::min(hi, t.first + t.count);
      if (a >= b || t.grad.empty()) continue;
      const grad_stats g = grad_stats_cpu(t.grad.subspan(a - t.first, b - a), scaler_.inv_scale(), s_->pool.get());
      total.sum_squares += g.sum_squares;
      total.count += g.count;
    }
    return total;
  }

  // What the pipeline calls when a subgroup's update committed: it is at the next step.
  struct count_version {
    std::vector<std::uint64_t>* version;
    void operator()(std::size_t s) const { ++(*version)[s]; }
  };

  // "offloaded_<tag>[::member]": how messages name this optimizer and its members.
  [[nodiscard]] static std::string who(std::string_view member = {}) {
    return member.empty() ? fmt::format("offloaded_{}", Rule::tag) : fmt::format("offloaded_{}::{}", Rule::tag, member);
  }

  void check_state(std::string_view what) const {
    STRATA_EXPECTS(!removed_, config_error, "{}::{}: the state was removed (remove_state)", who(), what);
  }

  template <class F>
  void visit_arrays(F&& fn) {
    check_state("read");
    settle_declared();
    s_->pipeline.visit([&](std::size_t s, std::span<const std::byte> state) {
      fn(s, reinterpret_cast<const float*>(state.data()));
    });
  }

  // Widens gradients [first, first + n) to fp32 and writes them to their subgroups' gradient
  // objects, through a free host slot used as scratch.
  // Without `track` the norm is not summed here (the caller computed it from the ranges).
  template <class G>
  void stage_gradients_to_tier(std::span<const G> grads, std::size_t first, bool track = true) {
    end_reads_ahead();
    s_->pipeline.with_free_slot([&](std::span<std::byte> scratch) {
      float* buf = reinterpret_cast<float*>(scratch.data());
      s_->intake.for_each_piece(first, grads.size(), [&](std::size_t s, std::size_t lo, std::size_t hi) {
        STRATA_ASSERT((hi - lo) * sizeof(float) <= scratch.size());
        for (std::size_t i = lo; i < hi; ++i) buf[i - lo] = detail::widen(grads[i - first]);
        const auto bytes = std::as_bytes(std::span<const float>(buf, hi - lo));
        s_->pipeline.tier().write(offload_layout::gradient_name(offload_.object_prefix, s), (lo - begin(s)) * sizeof(float), bytes)
            .get();
        totals_.gradient_bytes_written += bytes.size();
        s_->intake.count(lo, hi - lo);
        if (track) s_->intake.add_to_norm(s, lo, std::span<const float>(buf, hi - lo));
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
    last_unclipped_ = false;
    finish_gradients(true);
    ++totals_.skipped_steps;
    totals_.last = st;
    return st;
  }

  // `norms` holds every subgroup's gradient sums when tracks_norm() (a retried step reuses the
  // decision its first attempt made, so the subgroups updated then and now agree). Defined out of
  // the class (not inline), so that an extern template declaration suppresses it (see below).
  // `cover`: the parameters with gradients (null: all); `opts`: see step_options.
  template <class G, class H, class Src>
  offload_step_stats run_step(const step_rates& rates, model_copy<H> model, Src pieces, const grad_norm_accumulator& norms,
                              const gradient_coverage* cover = nullptr, const step_options& opts = {});

  options_type options_;
  offload_options offload_;
  any_update_order order_;
  tracer* tracer_;
  offload_layout layout_;
  dynamic_loss_scaler scaler_;
  prefix_claim claim_;        // no other optimizer of this process uses our objects of this tier
  step_decision decision_{};  // of the step in progress (kept when it fails part-way)
  bool last_unclipped_ = true;  // the last step neither clipped nor was skipped (speculate_updates)
  std::unique_ptr<parts> s_;
  std::vector<std::uint64_t> version_;  // steps applied to each subgroup
  std::uint64_t step_count_ = 0;
  param_steps steps_;                   // steps each parameter has taken (torch's per-tensor count)
  gradient_coverage partial_cover_;     // of the step in progress over tensors
  bool partial_tensors_ = false;        // the step in progress is one over tensors
  bool device_site_ = false;            // the update site may choose the device
  bool partial_ = false;
  bool removed_ = false;  // remove_state() ran
  step_rates partial_rates_{0.0};  // of the step in progress (a retry must repeat them)
  offload_stats totals_;
  std::optional<declared_step> declared_;   // by begin_step, until its step()
  std::vector<std::size_t> landing_order_;  // the last declared step's, when every subgroup landed
};

template <executor Exec, update_rule Rule>
template <class G, class H, class Src>
offload_step_stats offload_core<Exec, Rule>::run_step(const step_rates& rates, model_copy<H> model, Src pieces,
                                               const grad_norm_accumulator& norms, const gradient_coverage* cover,
                                               const step_options& opts) {
  STRATA_EXPECTS(!partial_ || partial_tensors_ == (cover != nullptr), config_error,
                 "{}: retrying step {} {} tensors, which it began {}", who("step"), step_count_ + 1,
                 cover != nullptr ? "with" : "without", partial_tensors_ ? "with" : "without");
  land_device_gradients();  // (no-op when none are in flight) before the intake may be reset
  // The updates made as gradients landed (begin_step) are this step's first.
  early_outcome early = end_declared();
  if (!early.error && s_->early) early.error = std::exchange(s_->early->ahead_error, nullptr);
  if (early.error) {
    if (updated_this_step() > 0) {  // part-way: a retry updates the rest
      partial_ = true;
      partial_tensors_ = false;
      partial_rates_ = rates;
      decision_ = step_decision{};
    }
    std::rethrow_exception(early.error);
  }
  trace_span step_span(tracer_, "offload.step");
  if (!partial_) {
    decision_ = step_decision{};
    if (opts.decision) {
      decision_ = *opts.decision;
      STRATA_EXPECTS(decision_.skip || (decision_.clip >= 0 && decision_.clip <= 1), config_error,
                     "{}: the decision's clip coefficient {} is not in [0, 1]", who("step"), decision_.clip);
    } else if (tracks_norm()) {
      STRATA_ASSERT(norms.subgroups() == layout_.subgroups());
      decision_ = decide_step(norms, offload_.max_grad_norm > 0 ? std::optional<double>(offload_.max_grad_norm)
                                                                : std::nullopt);
    }
    if (decision_.skip) {
      s_->pipeline.adopt_speculation(false);
      return skip_step(norms);
    }
  }
  // The updates made on copies during backward are this step's, bit for bit, when its constants
  // are theirs: no clipping (a coefficient of exactly 1), the same loss scale, the same rates (as
  // step() checked) and gradients (handed over whole before they were made), no model adoption.
  s_->pipeline.adopt_speculation(early.speculated && !partial_ && !decision_.skip &&
                                 decision_.clip == step_decision{}.clip && early.inv_scale == scaler_.inv_scale() &&
                                 !opts.adopt_model);
  rule_constants<Rule> k(options_, rates, steps_, scaler_.inv_scale(), decision_.clip);
  if (!partial_) check_blocks(pieces, k);
  const std::size_t n = layout_.subgroups();
  std::vector<std::size_t> order, next;
  if (early.follow_landing) {
    // The landing order (the early pass's own), then what did not land in it; the next step is
    // expected to land alike, so the cache keeps what it needs first.
    std::vector<char> seen(n, 0);
    for (const std::size_t s : early.landed) {
      order.push_back(s);
      seen[s] = 1;
    }
    for (const std::size_t s : planned_order())
      if (seen[s] == 0) order.push_back(s);
    if (early.landed.size() == n) landing_order_ = early.landed;
    next = order;
  } else {
    order = order_of(order_, step_count_, n);
    next = order_of(order_, step_count_ + 1, n);
  }
  check_permutation(order, n, step_count_, who());
  const auto touched = [&](std::size_t s) { return cover == nullptr || cover->touches(begin(s), begin(s) + length(s)); };
  std::vector<std::size_t> todo;
  for (const std::size_t s : order)
    if (version_[s] == step_count_ && touched(s)) todo.push_back(s);
  partial_ = true;
  partial_tensors_ = cover != nullptr;
  partial_rates_ = rates;

  subgroup_kernel<Rule, Exec, G, H, Src, count_version> kernel(layout_, std::move(k), std::move(pieces), model,
                                                               s_->pool.get(), count_version{&version_}, s_->exec_ref,
                                                               opts.adopt_model);
  std::vector<std::size_t> first;  // the next order, as far as this step's gradients reach
  for (const std::size_t s : next)
    if (touched(s)) first.push_back(s);
  pass_stats ps = s_->pipeline.run(order, next, todo, step_count_, kernel, first);
  if (early.ran) add_early(ps, early.stats);
  if (cover == nullptr) {
    steps_.advance_all();
  } else {
    for (std::size_t s = 0; s < n; ++s)
      if (!touched(s)) ++version_[s];  // at the new step, untouched
    for (const auto& [lo, hi] : cover->runs()) steps_.advance(lo, hi - lo);
  }
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
  last_unclipped_ = decision_.clip == step_decision{}.clip;
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
  st.prefetched = ps.prefetched;
  st.prefetched_bytes = ps.prefetched_bytes;
  st.writes_left = ps.writes_left;
  st.writes_left_bytes = ps.writes_left_bytes;
  st.early_updates = early.stats.updated;
  st.speculative_updates = ps.adopted;
  st.early_bytes_read = early.stats.bytes_read;
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
  if (offload_.prefetch_next_step) {
    try {
      // Into every free slot but one, as slots free up while forward and backward run: the
      // reads fill the I/O that they leave idle, and are what the next step needs first.
      start_reads_ahead(std::move(first));
    } catch (...) {  // the step is done; a read not started is read by the next step
    }
  }
  if (model_copy_failed) std::rethrow_exception(model_copy_failed);
  return st;
}

}  // namespace strata::detail

#if STRATA_EXTERN_TEMPLATES
// The step of an optimizer on host_executor<> is compiled once per shipped rule, in
// cmake/strata_instances.cpp (see STRATA_EXTERN_TEMPLATES in core/config.hpp), not in every
// translation unit that steps one.
#include "strata/optim/adamw_8bit_rule.hpp"
#include "strata/optim/adamw_bf16_rule.hpp"
#include "strata/optim/lion_rule.hpp"
#include "strata/optim/sgd_rule.hpp"
// The core of each shipped rule on host_executor<> and its steps of every type pair, declared
// (EXTERN = extern) or defined (EXTERN empty, in cmake/strata_instances.cpp).
#define STRATA_OFFLOAD_RUN_STEP_OF(EXTERN, R, G, H)                                                         \
  EXTERN template offload_step_stats offload_core<host_executor<>, R>::run_step<G, H>(                      \
      const step_rates&, model_copy<H>, offload_core<host_executor<>, R>::piece_source<G, H>,               \
      const grad_norm_accumulator&, const gradient_coverage*, const step_options&);
#define STRATA_OFFLOAD_INSTANCES(EXTERN)                                                                     \
  EXTERN template class offload_core<host_executor<>, adamw_rule>;                                          \
  EXTERN template class offload_core<host_executor<>, adamw_bf16_rule>;                                     \
  EXTERN template class offload_core<host_executor<>, adamw_8bit_rule>;                                     \
  EXTERN template class offload_core<host_executor<>, sgd_rule>;                                            \
  EXTERN template class offload_core<host_executor<>, lion_rule>;                                           \
  STRATA_ADAMW_TYPE_PAIRS_WITH(STRATA_OFFLOAD_RUN_STEP_OF, EXTERN, adamw_rule)                              \
  STRATA_ADAMW_TYPE_PAIRS_WITH(STRATA_OFFLOAD_RUN_STEP_OF, EXTERN, adamw_bf16_rule)                         \
  STRATA_ADAMW_TYPE_PAIRS_WITH(STRATA_OFFLOAD_RUN_STEP_OF, EXTERN, adamw_8bit_rule)                         \
  STRATA_ADAMW_TYPE_PAIRS_WITH(STRATA_OFFLOAD_RUN_STEP_OF, EXTERN, sgd_rule)                                \
  STRATA_ADAMW_TYPE_PAIRS_WITH(STRATA_OFFLOAD_RUN_STEP_OF, EXTERN, lion_rule)
namespace strata::detail {
STRATA_OFFLOAD_INSTANCES(extern)
}  // namespace strata::detail
#endif
