#pragma once
/// The run-time form of offloaded_adamw, for tools whose paths and preset come from a command
/// line or a config file: make_offloaded_adamw(config, params) builds the tier stack (a
/// dynamic_multipath of file or host paths, each optionally bandwidth-capped and, for
/// mlp_offload's PFS path, behind a node_limiter) and the preset's optimizer over it, and returns
/// it behind the any_offloaded_adamw interface. load_offloaded_adamw does the same from a checkpoint.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "strata/core/config.hpp"
#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/trace.hpp"
#include "strata/exec/device_span.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/param_tensors.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/offload/offload_stats.hpp"
#include "strata/offload/offloaded_adamw.hpp"
#include "strata/offload/presets.hpp"
#include "strata/optim/adamw_state.hpp"
#include "strata/optim/grad_norm.hpp"
#include "strata/optim/param_steps.hpp"
#include "strata/optim/step_rates.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/sync/node_limiter.hpp"
#include "strata/sync/rw_limiter.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/checksummed.hpp"
#include "strata/tier/file_tier.hpp"
#include "strata/tier/host_tier.hpp"
#include "strata/tier/limited.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/object_store_claim.hpp"
#include "strata/tier/object_store_tier.hpp"
#include "strata/tier/striped.hpp"
#include "strata/tier/throttled.hpp"

namespace strata {

/// One path of a run-time configured optimizer.
struct offload_path_config {
  std::filesystem::path directory;  ///< where the objects go; empty: host memory (for tests and demos)
  std::string name;                 ///< shown in stats; default: the directory (or "host<i>")
  /// An object store instead of a directory: "s3://bucket/prefix" (credentials, region and
  /// endpoint from the AWS_* variables; see object_store_tier). Needs STRATA_HAS_S3.
  std::string url{};
  double read_cap = 0;              ///< bytes/s; > 0 shapes the path with throttled<> (emulates a slower device)
  double write_cap = 0;             ///< bytes/s; as read_cap
  double read_bandwidth = 0;        ///< declared speed for placement and the bound (0: the cap, else measured)
  double write_bandwidth = 0;
  bool node_limited = false;        ///< requests hold the node-wide limiter (mlp_offload marks its PFS path)
  /// Take files in the directory that strata did not make and that are named as the optimizer's
  /// objects ("<object_prefix>.sg-<i>") as the path's own (to be replaced and removed); off, or
  /// any other file: refused (file_tier_options::adopt_existing). For an object store: objects
  /// of the optimizer's names that no claim covers (object_store_claim_options::adopt_existing).
  bool adopt_existing = false;
  /// An object store path's claim: how long a run on another host waits after this run's last
  /// renewal before it judges it gone (object_store_claim_options::lease).
  std::chrono::milliseconds claim_lease{60'000};
};

/// Everything make_offloaded_adamw needs.
struct offloaded_adamw_config {
  std::string preset = "strata";  ///< "zero_infinity", "mlp_offload" or "strata"
  std::vector<offload_path_config> paths;
  adamw_options adamw{};
  offload_options offload{};      ///< the base the preset adjusts (subgroup size, budget, threads, ...)
  std::string node_limiter_name = "strata-pfs";
  std::size_t node_limiter_permits = 1;
  /// Whether node-limited paths take one permit per direction (separate: reads and writes each
  /// have `node_limiter_permits`, as MLP-Offload's read and write locks) or share one set.
  rw_sharing node_limiter_sharing = rw_sharing::separate;
  /// mlp_offload: its PFS path is node-limited (false: the ablation without the lock).
  bool mlp_offload_lock = true;
  /// Stripe every object over all paths as RAID0 does (one path of striped<>; any preset, e.g.
  /// zero_infinity given the same paths as the others in an equal-resources comparison).
  bool stripe_paths = false;
  std::uint64_t stripe_bytes = std::uint64_t{1} << 20;  ///< stripe unit of stripe_paths
  std::filesystem::path node_limiter_dir{};  ///< empty: default_node_limiter_dir()
  /// Own only the optimizer's object prefix of each directory path (file_tier_options::scope),
  /// not the whole directory: several optimizers, of this process or of others (the ranks of a
  /// job), then share a directory, each with its own offload.object_prefix.
  bool scope_paths = false;
  tracer* trace = nullptr;
  /// Verify every byte read back from a path against an XXH3-64 checksum per block taken when it
  /// was written (checksummed<>), so a damaged state file is an integrity_error, never a wrong
  /// weight. On by default; off saves the hashing (see BENCHMARKS.md for its cost).
  bool verify_integrity = true;
  /// Checksum block of verify_integrity. Tier gradients (zero_infinity) handed over in pieces
  /// that cut these blocks cost a read-back of the cut blocks (whole subgroups never do).
  std::uint64_t integrity_block_bytes = 64 * 1024;
};

/// A host model copy that a step writes the updated weights into, in the model's own type (fp32
/// exactly; bf16 and fp16 rounded to nearest even), size() elements.
using host_model_span = std::variant<std::span<float>, std::span<bf16>, std::span<fp16>>;

/// A run-time configured offloaded_adamw (see offloaded_adamw for each member's contract).
class any_offloaded_adamw {
 public:
  virtual ~any_offloaded_adamw() = default;
  /// One step; `rates` is one learning rate, or one lr and weight decay per range of parameters.
  virtual offload_step_stats step(std::span<const float> grads, const step_rates& rates) = 0;
  virtual offload_step_stats step(std::span<const bf16> grads, const step_rates& rates) = 0;
  virtual offload_step_stats step(std::span<const fp16> grads, const step_rates& rates) = 0;
  /// One step that also writes the updated weights into `model` in the same pass (no read-back).
  virtual offload_step_stats step(std::span<const float> grads, const step_rates& rates, host_model_span model) = 0;
  virtual offload_step_stats step(std::span<const bf16> grads, const step_rates& rates, host_model_span model) = 0;
  virtual offload_step_stats step(std::span<const fp16> grads, const step_rates& rates, host_model_span model) = 0;
  /// Hands over gradients of parameters [first, first + grads.size()) as backward produces them
  /// (with the zero_infinity preset they are widened and written to the tier now).
  virtual void accept_gradients_at(std::size_t first, std::span<const float> grads) = 0;
  virtual void accept_gradients_at(std::size_t first, std::span<const bf16> grads) = 0;
  virtual void accept_gradients_at(std::size_t first, std::span<const fp16> grads) = 0;
  /// One step over framework tensors as they are, each tensor's weights updated in place
  /// (offloaded_adamw::step with param_tensor: tensors without gradients are left as they are).
  /// The weights are of the gradients' type, as a framework's tensors are.
  virtual offload_step_stats step(std::span<const param_tensor<float, float>> tensors, const step_rates& rates,
                                  const step_options& opts) = 0;
  virtual offload_step_stats step(std::span<const param_tensor<bf16, bf16>> tensors, const step_rates& rates,
                                  const step_options& opts) = 0;
  virtual offload_step_stats step(std::span<const param_tensor<fp16, fp16>> tensors, const step_rates& rates,
                                  const step_options& opts) = 0;
  /// The squared norm and count of the tensors' gradients, unscaled (offloaded_adamw::gradient_stats).
  [[nodiscard]] virtual grad_stats gradient_stats(std::span<const param_tensor<float, float>> tensors) = 0;
  [[nodiscard]] virtual grad_stats gradient_stats(std::span<const param_tensor<bf16, bf16>> tensors) = 0;
  [[nodiscard]] virtual grad_stats gradient_stats(std::span<const param_tensor<fp16, fp16>> tensors) = 0;
  /// Drops the gradients handed over since the last step (offloaded_adamw::discard_gradients).
  virtual void discard_gradients() = 0;
  /// One step over the gradients handed to accept_gradients_at.
  virtual offload_step_stats step(const step_rates& rates) = 0;
  /// As above, writing the updated weights into `model`.
  virtual offload_step_stats step(const step_rates& rates, host_model_span model) = 0;
  /// Each path's name, declared bandwidths and the bytes its completed requests moved since
  /// construction. Safe to call from another thread while a step runs (to sample throughput).
  [[nodiscard]] virtual std::vector<path_traffic> path_totals() const = 0;
  virtual void read_master(std::span<float> out) = 0;
  virtual void read_moments(std::span<float> m, std::span<float> v) = 0;
  /// The running maximum of v (amsgrad only).
  virtual void read_max_exp_avg_sq(std::span<float> out) = 0;
  virtual void save(const std::filesystem::path& dir) = 0;
  /// Saves into a store (an object store's prefix; see offload/tier_checkpoint.hpp).
  virtual void save(any_tier& store) = 0;
  /// Saves with the tensors' weights as the truth (offloaded_adamw::save with tensors).
  virtual void save(const std::filesystem::path& dir, std::span<const param_tensor<float, float>> tensors) = 0;
  virtual void save(const std::filesystem::path& dir, std::span<const param_tensor<bf16, bf16>> tensors) = 0;
  virtual void save(const std::filesystem::path& dir, std::span<const param_tensor<fp16, fp16>> tensors) = 0;
  virtual void save(any_tier& store, std::span<const param_tensor<float, float>> tensors) = 0;
  virtual void save(any_tier& store, std::span<const param_tensor<bf16, bf16>> tensors) = 0;
  virtual void save(any_tier& store, std::span<const param_tensor<fp16, fp16>> tensors) = 0;
  virtual void flush() = 0;
  /// Removes the tier objects the optimizer created (see offloaded_adamw::remove_state).
  virtual std::size_t remove_state() = 0;
  [[nodiscard]] virtual std::uint64_t step_count() const = 0;
  /// Steps each parameter has taken (offloaded_adamw::param_step_counts).
  [[nodiscard]] virtual const param_steps& param_step_counts() const = 0;
  /// What to multiply the loss by before backward (offload.loss_scaling; 1 when off).
  [[nodiscard]] virtual float loss_scale() const = 0;
  /// The loss scaler's clean steps in a row (with loss_scale(): what restore_loss_scale takes).
  [[nodiscard]] virtual std::int64_t loss_growth_tracker() const = 0;
  /// Sets the loss scale and growth tracker (offloaded_adamw::restore_loss_scale).
  virtual void restore_loss_scale(float scale, std::int64_t growth_tracker) = 0;
  [[nodiscard]] virtual offload_stats stats() const = 0;
  [[nodiscard]] virtual std::size_t size() const = 0;
  [[nodiscard]] virtual std::string_view preset() const = 0;
  [[nodiscard]] virtual const offload_options& offload() const = 0;
};

/// A model copy in an executor's device memory that a step writes in place (see
/// offloaded_adamw::step with a device_span), size() elements.
using device_model_span = std::variant<device_span<float>, device_span<bf16>, device_span<fp16>>;

/// A run-time configured offloaded_adamw whose updates may run on an executor of type Exec, so
/// that gradients and the model may stay in its device memory (make_offloaded_adamw with an
/// executor). Exec's event type orders the copies: on CUDA, cuda_event::wrap takes a framework's
/// cudaEvent_t.
template <executor Exec>
class any_offloaded_adamw_on : public any_offloaded_adamw {
 public:
  using event_type = typename Exec::stream_type::event_type;
  using any_offloaded_adamw::accept_gradients_at;
  using any_offloaded_adamw::step;
  /// Hands over device gradients of parameters [first, first + grads.size()) once `ready` has
  /// completed (offloaded_adamw::accept_gradients_at with a device_span); returns at once.
  virtual void accept_gradients_at(std::size_t first, device_span<const float> grads, const event_type& ready) = 0;
  virtual void accept_gradients_at(std::size_t first, device_span<const bf16> grads, const event_type& ready) = 0;
  virtual void accept_gradients_at(std::size_t first, device_span<const fp16> grads, const event_type& ready) = 0;
  /// One step over the handed-over gradients that writes the updated weights into `model` in
  /// device memory; every copy has landed when it returns.
  virtual offload_step_stats step(const step_rates& rates, device_model_span model) = 0;
  [[nodiscard]] virtual Exec& executor() noexcept = 0;
};

namespace detail {

using node_rw_limiter = rw_limiter<node_limiter>;

#if STRATA_HAS_S3
/// An object store path of a run-time optimizer: the tier, and this run's claim on the
/// optimizer's scope of it, taken before the first state object is written and ended after the
/// tier's last request (tier/object_store_claim.hpp).
class claimed_object_store {
 public:
  claimed_object_store(object_store_options so, object_store_claim_options co)
      : store_(std::move(so)), claim_(store_, std::move(co)) {}
  completion write(std::string_view o, std::uint64_t off, std::span<const std::byte> b) { return store_.write(o, off, b); }
  completion read(std::string_view o, std::uint64_t off, std::span<std::byte> d) { return store_.read(o, off, d); }
  bool remove(std::string_view o) { return store_.remove(o); }
  void flush() { store_.flush(); }
  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view o) const { return store_.size(o); }
  [[nodiscard]] std::uint64_t capacity() const { return store_.capacity(); }
  [[nodiscard]] std::uint64_t used() const { return store_.used(); }
  [[nodiscard]] std::string_view name() const { return store_.name(); }
  [[nodiscard]] tier_descriptor descriptor() const { return store_.descriptor(); }
  [[nodiscard]] object_store_tier& store() noexcept { return store_; }
  [[nodiscard]] const object_store_claim<object_store_tier>& claim() const noexcept { return claim_; }

 private:
  object_store_tier store_;
  object_store_claim<object_store_tier> claim_;  // ends (released, or removed) before the tier closes
};
static_assert(tier<claimed_object_store>);
#endif

inline any_tier make_offload_path(const offload_path_config& p, std::size_t index, const node_rw_limiter* limiter,
                                  std::string_view scope = {}, std::string_view object_prefix = "strata");

/// A path of the config, under checksummed<> when the config verifies integrity.
inline any_tier make_verified_path(const offloaded_adamw_config& c, std::size_t index, const node_rw_limiter* limiter) {
  any_tier path = make_offload_path(c.paths[index], index, limiter,
                                    c.scope_paths ? std::string_view(c.offload.object_prefix) : std::string_view(),
                                    c.offload.object_prefix);
  if (!c.verify_integrity) return path;
  return any_tier::make<checksummed<any_tier>>(checksum_options{.block_bytes = c.integrity_block_bytes}, std::move(path));
}

// The path's tier, then each layer the config asks for on top of it: a bandwidth cap
// (throttled), the node-wide permit (limited). An object store is claimed for `object_prefix`.
inline any_tier make_offload_path(const offload_path_config& p, std::size_t index, const node_rw_limiter* limiter,
                                  std::string_view scope, std::string_view object_prefix) {
  const double rbw = p.read_bandwidth > 0 ? p.read_bandwidth : p.read_cap;
  const double wbw = p.write_bandwidth > 0 ? p.write_bandwidth : p.write_cap;
  any_tier path = [&] {
    if (!p.url.empty()) {
#if STRATA_HAS_S3
      const auto where = parse_s3_url(p.url);
      object_store_options so;
      so.bucket = where.bucket;
      so.prefix = where.prefix;
      so.name = p.name;
      so.read_bandwidth = rbw;
      so.write_bandwidth = wbw;
      object_store_claim_options co;
      co.scope = std::string(object_prefix);
      co.adopt_existing = p.adopt_existing;
      co.lease = p.claim_lease;
      return any_tier::make<claimed_object_store>(std::move(so), std::move(co));
#else
      throw config_error(fmt::format("path {}: strata was built without the S3 tier (libcurl and libcrypto, "
                                     "STRATA_ENABLE_S3)",
                                     p.url));
#endif
    }
    if (p.directory.empty())
      return any_tier::make<host_tier>(host_tier_options{.name = p.name.empty() ? fmt::format("host{}", index) : p.name,
                                                         .read_bandwidth = rbw,
                                                         .write_bandwidth = wbw});
    file_tier_options fo;
    fo.directory = p.directory;
    fo.name = p.name;
    fo.read_bandwidth = rbw;
    fo.write_bandwidth = wbw;
    fo.adopt_existing = p.adopt_existing;
    fo.adoptable_prefixes = {fmt::format("{}.sg-", object_prefix), fmt::format("{}.gr-", object_prefix)};  // (offload_layout's names)
    fo.scope = std::string(scope);
    return any_tier::make<file_tier>(fo);
  }();
  if (p.read_cap > 0 || p.write_cap > 0)
    path = any_tier::make<throttled<any_tier>>(throttle_options{p.read_cap, p.write_cap, {}}, std::move(path));
  if (p.node_limited && limiter != nullptr) path = any_tier::make<limited<any_tier, node_limiter>>(*limiter, std::move(path));
  return path;
}

template <class Preset, class Placement, executor Exec = host_executor<>, update_site Site = always_host>
class runtime_offloaded_adamw final : public any_offloaded_adamw_on<Exec> {
 public:
  using tier_type = dynamic_multipath<Placement>;
  using optimizer = typename Preset::template device_optimizer<tier_type, Exec, Site>;
  using event_type = typename any_offloaded_adamw_on<Exec>::event_type;

  /// Updates on `exec` (which must outlive this) where `site` says; none: an executor of its own.
  runtime_offloaded_adamw(const offloaded_adamw_config& c, Placement placement, Exec* exec = nullptr, Site site = Site{})
      : limiter_(make_limiter(c)),
        tier_(std::move(placement), make_paths(c, limiter_.get()), "paths"),
        owned_exec_(exec == nullptr ? own_executor() : nullptr),
        exec_(exec == nullptr ? owned_exec_.get() : exec),
        site_(std::move(site)) {
    // Descriptors are taken once, so path_totals() reads only atomics while a step runs.
    striped_ = tier_.path(0).template target<striped>();
    if (striped_ != nullptr) {
      for (std::size_t i = 0; i < striped_->member_count(); ++i) descriptors_.push_back(striped_->member(i).descriptor());
    } else {
      for (std::size_t i = 0; i < tier_.path_count(); ++i) descriptors_.push_back(tier_.path(i).descriptor());
    }
  }

  template <class P>
  void create(const offloaded_adamw_config& c, std::span<const P> params, const adamw_state_view& state) {
    std::size_t n = params.size();
    if constexpr (is_param_tensor_v<P>) n = params.empty() ? 0 : params.back().first + params.back().count;
    opt_.emplace(optimizer::from_state(tier_, *exec_, params, state, c.adamw,
                                       Preset::options(n, c.adamw, c.offload, site_.uses_device()),
                                       typename Preset::order{},
                                       typename Preset::eviction{}, site_, c.trace));
  }
  template <class Where>  // a directory or a store
  void load(const offloaded_adamw_config& c, Where& dir) {
    // The preset's options depend on the parameter count, which the checkpoint holds: read it first.
    const auto probe = optimizer::load_manifest(dir);
    STRATA_EXPECTS(probe.rule == adamw_rule::tag, config_error,
                   "load_offloaded_adamw: the checkpoint holds the state of update rule '{}', not AdamW's", probe.rule);
    auto base = c.offload;
    base.subgroup_elems = static_cast<std::size_t>(probe.subgroup_elems);
    const adamw_options adamw = adamw_rule::load_options(probe.options);
    opt_.emplace(optimizer::load(dir, tier_, *exec_, Preset::options(probe.params, adamw, base, site_.uses_device()),
                                 typename Preset::order{}, typename Preset::eviction{}, site_, c.trace));
  }

  offload_step_stats step(std::span<const float> g, const step_rates& r) override { return opt_->step(g, r); }
  offload_step_stats step(std::span<const bf16> g, const step_rates& r) override { return opt_->step(g, r); }
  offload_step_stats step(std::span<const fp16> g, const step_rates& r) override { return opt_->step(g, r); }
  offload_step_stats step(std::span<const float> g, const step_rates& r, host_model_span m) override {
    return std::visit([&](auto out) { return opt_->step(g, r, out); }, m);
  }
  offload_step_stats step(std::span<const bf16> g, const step_rates& r, host_model_span m) override {
    return std::visit([&](auto out) { return opt_->step(g, r, out); }, m);
  }
  offload_step_stats step(std::span<const fp16> g, const step_rates& r, host_model_span m) override {
    return std::visit([&](auto out) { return opt_->step(g, r, out); }, m);
  }
  offload_step_stats step(std::span<const param_tensor<float, float>> t, const step_rates& r,
                          const step_options& o) override {
    return opt_->step(t, r, o);
  }
  offload_step_stats step(std::span<const param_tensor<bf16, bf16>> t, const step_rates& r,
                          const step_options& o) override {
    return opt_->step(t, r, o);
  }
  offload_step_stats step(std::span<const param_tensor<fp16, fp16>> t, const step_rates& r,
                          const step_options& o) override {
    return opt_->step(t, r, o);
  }
  grad_stats gradient_stats(std::span<const param_tensor<float, float>> t) override { return opt_->gradient_stats(t); }
  grad_stats gradient_stats(std::span<const param_tensor<bf16, bf16>> t) override { return opt_->gradient_stats(t); }
  grad_stats gradient_stats(std::span<const param_tensor<fp16, fp16>> t) override { return opt_->gradient_stats(t); }
  void accept_gradients_at(std::size_t first, std::span<const float> g) override { opt_->accept_gradients_at(first, g); }
  void accept_gradients_at(std::size_t first, std::span<const bf16> g) override { opt_->accept_gradients_at(first, g); }
  void accept_gradients_at(std::size_t first, std::span<const fp16> g) override { opt_->accept_gradients_at(first, g); }
  void accept_gradients_at(std::size_t first, device_span<const float> g, const event_type& e) override {
    opt_->accept_gradients_at(first, g, e);
  }
  void accept_gradients_at(std::size_t first, device_span<const bf16> g, const event_type& e) override {
    opt_->accept_gradients_at(first, g, e);
  }
  void accept_gradients_at(std::size_t first, device_span<const fp16> g, const event_type& e) override {
    opt_->accept_gradients_at(first, g, e);
  }
  offload_step_stats step(const step_rates& r, device_model_span m) override {
    return std::visit([&](auto model) { return opt_->step(r, model); }, m);
  }
  [[nodiscard]] Exec& executor() noexcept override { return *exec_; }
  void discard_gradients() override { opt_->discard_gradients(); }
  offload_step_stats step(const step_rates& r) override { return opt_->step(r); }
  offload_step_stats step(const step_rates& r, host_model_span m) override {
    return std::visit([&](auto out) { return opt_->step(r, out); }, m);
  }
  [[nodiscard]] std::vector<path_traffic> path_totals() const override {
    const auto done = striped_ != nullptr ? striped_->completed_bytes() : tier_.completed_bytes();
    std::vector<path_traffic> v(done.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto& d = descriptors_[i];
      v[i] = {d.name, d.read_bandwidth, d.write_bandwidth, done[i].read, done[i].written};
    }
    return v;
  }
  void read_master(std::span<float> out) override { opt_->read_master(out); }
  void read_moments(std::span<float> m, std::span<float> v) override { opt_->read_moments(m, v); }
  void read_max_exp_avg_sq(std::span<float> out) override { opt_->read_max_exp_avg_sq(out); }
  void save(const std::filesystem::path& dir) override { opt_->save(dir); }
  void save(any_tier& store) override { opt_->save(store); }
  void save(const std::filesystem::path& dir, std::span<const param_tensor<float, float>> t) override { opt_->save(dir, t); }
  void save(const std::filesystem::path& dir, std::span<const param_tensor<bf16, bf16>> t) override { opt_->save(dir, t); }
  void save(const std::filesystem::path& dir, std::span<const param_tensor<fp16, fp16>> t) override { opt_->save(dir, t); }
  void save(any_tier& store, std::span<const param_tensor<float, float>> t) override { opt_->save(store, t); }
  void save(any_tier& store, std::span<const param_tensor<bf16, bf16>> t) override { opt_->save(store, t); }
  void save(any_tier& store, std::span<const param_tensor<fp16, fp16>> t) override { opt_->save(store, t); }
  void flush() override { opt_->flush(); }
  std::size_t remove_state() override { return opt_ ? opt_->remove_state() : 0; }
  [[nodiscard]] std::uint64_t step_count() const override { return opt_->step_count(); }
  [[nodiscard]] const param_steps& param_step_counts() const override { return opt_->param_step_counts(); }
  [[nodiscard]] float loss_scale() const override { return opt_->loss_scale(); }
  [[nodiscard]] std::int64_t loss_growth_tracker() const override { return opt_->loss_scaler().growth_tracker(); }
  void restore_loss_scale(float scale, std::int64_t tracker) override { opt_->restore_loss_scale(scale, tracker); }
  [[nodiscard]] offload_stats stats() const override { return opt_->stats(); }
  [[nodiscard]] std::size_t size() const override { return opt_->size(); }
  [[nodiscard]] std::string_view preset() const override { return Preset::name; }
  [[nodiscard]] const offload_options& offload() const override { return opt_->offload(); }

 private:
  static std::unique_ptr<Exec> own_executor() {
    if constexpr (std::default_initializable<Exec>) {
      return std::make_unique<Exec>();
    } else {
      throw config_error(fmt::format("make_offloaded_adamw: executor '{}' must be given", typeid(Exec).name()));
    }
  }
  static std::unique_ptr<node_rw_limiter> make_limiter(const offloaded_adamw_config& c) {
    bool any = false;
    for (const auto& p : c.paths) any = any || p.node_limited;
    if (!any) return nullptr;
    return std::make_unique<node_rw_limiter>(make_node_rw_limiter(c.node_limiter_name, c.node_limiter_permits,
                                                                  c.node_limiter_sharing, c.node_limiter_dir));
  }
  static std::vector<any_tier> make_paths(const offloaded_adamw_config& c, const node_rw_limiter* limiter) {
    std::vector<any_tier> v;
    for (std::size_t i = 0; i < c.paths.size(); ++i) v.push_back(make_verified_path(c, i, limiter));
    if (!c.stripe_paths) return v;
    std::vector<any_tier> one;
    one.push_back(any_tier::make<striped>(std::move(v), striped_options{.name = "raid0", .stripe_bytes = c.stripe_bytes}));
    return one;
  }

  std::unique_ptr<node_rw_limiter> limiter_;  // outlives the paths that hold it
  tier_type tier_;                          // outlives the optimizer
  std::unique_ptr<Exec> owned_exec_;        // (when none was given) outlives the optimizer
  Exec* exec_;
  Site site_;
  striped* striped_ = nullptr;               // the one path when stripe_paths (per-member totals)
  std::vector<tier_descriptor> descriptors_;
  std::optional<optimizer> opt_;
};

template <executor Exec, update_site Site, class Build>
std::unique_ptr<any_offloaded_adamw_on<Exec>> make_runtime(offloaded_adamw_config c, Exec* exec, Site site,
                                                           Build&& build) {
  check_env_variables();  // an empty STRATA_* is refused whether or not this run reads it
  STRATA_EXPECTS(!c.paths.empty(), config_error, "make_offloaded_adamw: no paths given");
  STRATA_EXPECTS(!c.stripe_paths || c.stripe_bytes > 0, config_error, "make_offloaded_adamw: stripe_bytes must be positive");
  if (c.preset == "zero_infinity") {
    STRATA_EXPECTS(c.paths.size() == 1 || c.stripe_paths, config_error,
                   "make_offloaded_adamw: preset zero_infinity uses one path, got {} (stripe_paths makes one of them)",
                   c.paths.size());
    auto o = std::make_unique<runtime_offloaded_adamw<presets::zero_infinity, bandwidth_proportional, Exec, Site>>(
        c, bandwidth_proportional{}, exec, site);
    build(*o, c);
    return o;
  }
  if (c.preset == "mlp_offload") {
    STRATA_EXPECTS(c.paths.size() == 2 && !c.stripe_paths, config_error,
                   "make_offloaded_adamw: preset mlp_offload uses two paths (NVMe, PFS), got {}{}", c.paths.size(),
                   c.stripe_paths ? " striped into one" : "");
    c.paths[1].node_limited = c.mlp_offload_lock;
    auto o = std::make_unique<runtime_offloaded_adamw<presets::mlp_offload, fixed_ratio, Exec, Site>>(
        c, presets::mlp_offload::placement(), exec, site);
    build(*o, c);
    return o;
  }
  if (c.preset == "strata") {
    auto o = std::make_unique<runtime_offloaded_adamw<presets::strata_preset, bandwidth_proportional, Exec, Site>>(
        c, bandwidth_proportional{}, exec, site);
    build(*o, c);
    return o;
  }
  throw config_error(fmt::format("make_offloaded_adamw: unknown preset '{}' (expected zero_infinity, mlp_offload or strata)",
                                 c.preset));
}

}  // namespace detail

/// Builds the preset's optimizer over the configured paths, starting from `params` and, when
/// given, existing AdamW state (moments and steps taken; see offloaded_adamw::from_state).
[[nodiscard]] inline std::unique_ptr<any_offloaded_adamw> make_offloaded_adamw(const offloaded_adamw_config& config,
                                                                                std::span<const float> params,
                                                                                const adamw_state_view& state = {}) {
  return detail::make_runtime<host_executor<>>(config, nullptr, always_host{},
                                               [&](auto& o, const offloaded_adamw_config& c) { o.create(c, params, state); });
}

/// Weights a run-time optimizer starts from: fp32, or a 16-bit model's own (widened exactly),
/// one flat array or the framework's tensors (param_tensor, covering every parameter once; no
/// flat copy is made). Explicit, so that a float array still picks the overload above.
struct host_weights {
  explicit host_weights(std::span<const float> w) noexcept : span(w) {}
  explicit host_weights(std::span<const bf16> w) noexcept : span(w) {}
  explicit host_weights(std::span<const fp16> w) noexcept : span(w) {}
  explicit host_weights(std::span<const param_tensor<float, float>> w) noexcept : span(w) {}
  explicit host_weights(std::span<const param_tensor<bf16, bf16>> w) noexcept : span(w) {}
  explicit host_weights(std::span<const param_tensor<fp16, fp16>> w) noexcept : span(w) {}
  std::variant<std::span<const float>, std::span<const bf16>, std::span<const fp16>,
               std::span<const param_tensor<float, float>>, std::span<const param_tensor<bf16, bf16>>,
               std::span<const param_tensor<fp16, fp16>>>
      span;
};

/// As above, from a model's weights in its own type (no fp32 copy of a 16-bit model needed).
[[nodiscard]] inline std::unique_ptr<any_offloaded_adamw> make_offloaded_adamw(const offloaded_adamw_config& config,
                                                                                host_weights params,
                                                                                const adamw_state_view& state = {}) {
  return detail::make_runtime<host_executor<>>(config, nullptr, always_host{}, [&](auto& o, const offloaded_adamw_config& c) {
    std::visit([&](auto p) { o.create(c, p, state); }, params.span);
  });
}

/// As above, with updates on `exec` (which must outlive the optimizer) where `site` says, and
/// gradients and the model copy accepted in exec's device memory (any_offloaded_adamw_on).
template <executor Exec, update_site Site>
[[nodiscard]] std::unique_ptr<any_offloaded_adamw_on<Exec>> make_offloaded_adamw(const offloaded_adamw_config& config,
                                                                                 Exec& exec, Site site,
                                                                                 std::span<const float> params,
                                                                                 const adamw_state_view& state = {}) {
  return detail::make_runtime(config, &exec, std::move(site),
                              [&](auto& o, const offloaded_adamw_config& c) { o.create(c, params, state); });
}

/// Builds the preset's optimizer over the configured paths from the checkpoint in `dir`.
[[nodiscard]] inline std::unique_ptr<any_offloaded_adamw> load_offloaded_adamw(const offloaded_adamw_config& config,
                                                                                const std::filesystem::path& dir) {
  return detail::make_runtime<host_executor<>>(config, nullptr, always_host{},
                                               [&](auto& o, const offloaded_adamw_config& c) { o.load(c, dir); });
}

/// Builds the preset's optimizer over the configured paths from the checkpoint in `store`.
[[nodiscard]] inline std::unique_ptr<any_offloaded_adamw> load_offloaded_adamw(const offloaded_adamw_config& config,
                                                                                any_tier& store) {
  return detail::make_runtime<host_executor<>>(config, nullptr, always_host{},
                                               [&](auto& o, const offloaded_adamw_config& c) { o.load(c, store); });
}

/// As above, with updates on `exec` where `site` says (see make_offloaded_adamw).
template <executor Exec, update_site Site>
[[nodiscard]] std::unique_ptr<any_offloaded_adamw_on<Exec>> load_offloaded_adamw(const offloaded_adamw_config& config,
                                                                                 Exec& exec, Site site,
                                                                                 const std::filesystem::path& dir) {
  return detail::make_runtime(config, &exec, std::move(site),
                              [&](auto& o, const offloaded_adamw_config& c) { o.load(c, dir); });
}

}  // namespace strata

#if STRATA_EXTERN_TEMPLATES
// The run-time optimizers of the three presets and the layers of their paths, compiled once in
// cmake/strata_instances.cpp (see STRATA_EXTERN_TEMPLATES in core/config.hpp).
namespace strata {
extern template class detail::multipath_core<fixed_ratio, dynamic_multipath<fixed_ratio>>;
extern template class dynamic_multipath<fixed_ratio>;
extern template class throttled<any_tier>;
extern template class limited<any_tier, node_limiter>;
extern template class checksummed<any_tier>;
extern template class detail::runtime_offloaded_adamw<presets::zero_infinity, bandwidth_proportional>;
extern template class detail::runtime_offloaded_adamw<presets::mlp_offload, fixed_ratio>;
extern template class detail::runtime_offloaded_adamw<presets::strata_preset, bandwidth_proportional>;
}  // namespace strata
#endif
