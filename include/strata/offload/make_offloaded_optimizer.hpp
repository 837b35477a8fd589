#pragma once
/// The run-time form of offloaded_optimizer, for tools and fronts whose rule, paths and preset
/// come from a command line, a config file or Python: make_offloaded_optimizer(config, params)
/// builds the tier stack (a dynamic_multipath of file, host or object-store paths, each
/// optionally bandwidth-capped and, for mlp_offload's PFS path, behind a node_limiter) and the
/// preset's optimizer of the config's update rule over it, and returns it as an
/// any_offloaded_optimizer (offload/any_offloaded_optimizer.hpp). load_offloaded_optimizer does
/// the same from a checkpoint. Rules: "adamw", "adamw-bf16", "adamw-8bit" (options:
/// config.adamw), "sgd" (config.sgd), "lion" (config.lion).

#include <array>
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
#include <type_traits>
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
#include "strata/offload/checkpoint_manifest.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/offload/param_tensors.hpp"
#include "strata/offload/offload_stats.hpp"
#include "strata/offload/any_offloaded_optimizer.hpp"
#include "strata/offload/offloaded_adamw.hpp"
#include "strata/offload/offloaded_adamw_8bit.hpp"
#include "strata/offload/offloaded_adamw_bf16.hpp"
#include "strata/offload/offloaded_lion.hpp"
#include "strata/offload/offloaded_sgd.hpp"
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

/// Everything make_offloaded_optimizer needs.
struct offloaded_optimizer_config {
  std::string preset = "strata";  ///< "zero_infinity", "mlp_offload" or "strata"
  /// The update rule: "adamw", "adamw-bf16" (AdamW with bf16 moments), "adamw-8bit" (with 8-bit
  /// block-quantized moments; subgroups a multiple of 256 parameters), "sgd" or "lion". Loading
  /// a checkpoint of another rule is a config_error; empty: the checkpoint's rule (load only).
  std::string rule = "adamw";
  std::vector<offload_path_config> paths;
  adamw_options adamw{};          ///< the options of "adamw", "adamw-bf16" and "adamw-8bit"
  sgd_options sgd{};              ///< the options of "sgd"
  lion_options lion{};            ///< the options of "lion"
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

/// The config of make_offloaded_adamw (the same: its rule is "adamw" unless set).
using offloaded_adamw_config = offloaded_optimizer_config;

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

// The options of rule R in the config.
template <update_rule R>
const typename R::options_type& rule_options_of(const offloaded_optimizer_config& c) {
  using O = typename R::options_type;
  if constexpr (std::same_as<O, adamw_options>)
    return c.adamw;
  else if constexpr (std::same_as<O, sgd_options>)
    return c.sgd;
  else
    return c.lion;
}

/// Calls f(std::type_identity<R>{}) for the rule whose tag is `rule`.
template <class F>
decltype(auto) with_rule(std::string_view rule, std::string_view who, F&& f) {
  if (rule == adamw_rule::tag) return f(std::type_identity<adamw_rule>{});
  if (rule == adamw_bf16_rule::tag) return f(std::type_identity<adamw_bf16_rule>{});
  if (rule == adamw_8bit_rule::tag) return f(std::type_identity<adamw_8bit_rule>{});
  if (rule == sgd_rule::tag) return f(std::type_identity<sgd_rule>{});
  if (rule == lion_rule::tag) return f(std::type_identity<lion_rule>{});
  throw config_error(fmt::format("{}: unknown update rule '{}' (expected adamw, adamw-bf16, adamw-8bit, sgd or lion)", who, rule));
}

/// AdamW's state as arrays by name (for the AdamW rules other than adamw_rule itself).
struct adamw_named_state {
  explicit adamw_named_state(const adamw_state_view& v) {
    const std::pair<std::string_view, std::span<const float>> all[] = {
        {"exp_avg", v.exp_avg}, {"exp_avg_sq", v.exp_avg_sq}, {"max_exp_avg_sq", v.max_exp_avg_sq}};
    for (const auto& [name, values] : all)
      if (!values.empty()) arrays[count++] = named_array{name, values};
    view = rule_state_view{std::span<const named_array>(arrays.data(), count), v.step, v.step_runs};
  }
  std::array<named_array, 3> arrays{};
  std::size_t count = 0;
  rule_state_view view;
};

/// The model behind what make_offloaded_optimizer returns: the paths (and the node limiter they
/// hold), the executor when none was given, and the preset's optimizer of rule Rule over them.
template <class Preset, class Placement, update_rule Rule, executor Exec = host_executor<>,
          update_site Site = always_host>
class runtime_offloaded_optimizer {
 public:
  using tier_type = dynamic_multipath<Placement>;
  using optimizer_type = typename Preset::template rule_optimizer<Rule, tier_type, Exec, Site>;

  /// Updates on `exec` (which must outlive this) where `site` says; none: an executor of its own.
  runtime_offloaded_optimizer(const offloaded_optimizer_config& c, Placement placement, Exec* exec = nullptr,
                              Site site = Site{})
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
  runtime_offloaded_optimizer(const runtime_offloaded_optimizer&) = delete;
  runtime_offloaded_optimizer& operator=(const runtime_offloaded_optimizer&) = delete;

  /// `state`: a rule_state_view, or AdamW's adamw_state_view (an AdamW rule's).
  template <class P, class State>
  void create(const offloaded_optimizer_config& c, std::span<const P> params, const State& state) {
    std::size_t n = params.size();
    if constexpr (is_param_tensor_v<P>) n = params.empty() ? 0 : params.back().first + params.back().count;
    const auto& options = rule_options_of<Rule>(c);
    const auto offload = Preset::options(n, Rule::format(options), c.offload, site_.uses_device());
    if constexpr (std::same_as<State, adamw_state_view> && !std::same_as<Rule, adamw_rule>) {
      const adamw_named_state named(state);
      opt_.emplace(optimizer_type::from_state(tier_, *exec_, params, named.view, options, offload,
                                              typename Preset::order{}, typename Preset::eviction{}, site_, c.trace));
    } else {
      opt_.emplace(optimizer_type::from_state(tier_, *exec_, params, state, options, offload, typename Preset::order{},
                                              typename Preset::eviction{}, site_, c.trace));
    }
  }
  template <class Where>  // a directory or a store
  void load(const offloaded_optimizer_config& c, Where& dir) {
    // The preset's options depend on the parameter count, which the checkpoint holds: read it first.
    const auto probe = optimizer_type::load_manifest(dir);
    STRATA_EXPECTS(probe.rule == Rule::tag, config_error,
                   "load_offloaded_optimizer: the checkpoint holds the state of update rule '{}', not '{}'", probe.rule,
                   Rule::tag);
    auto base = c.offload;
    base.subgroup_elems = static_cast<std::size_t>(probe.subgroup_elems);
    const auto options = Rule::load_options(probe.options);
    opt_.emplace(optimizer_type::load(dir, tier_, *exec_,
                                      Preset::options(probe.params, Rule::format(options), base, site_.uses_device()),
                                      typename Preset::order{}, typename Preset::eviction{}, site_, c.trace));
  }

  [[nodiscard]] optimizer_type& optimizer() { return *opt_; }
  [[nodiscard]] const optimizer_type& optimizer() const { return *opt_; }
  [[nodiscard]] Exec& executor() noexcept { return *exec_; }
  [[nodiscard]] std::string_view preset() const noexcept { return Preset::name; }
  [[nodiscard]] std::vector<path_traffic> path_totals() const {
    const auto done = striped_ != nullptr ? striped_->completed_bytes() : tier_.completed_bytes();
    std::vector<path_traffic> v(done.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto& d = descriptors_[i];
      v[i] = {d.name, d.read_bandwidth, d.write_bandwidth, done[i].read, done[i].written};
    }
    return v;
  }

 private:
  static std::unique_ptr<Exec> own_executor() {
    if constexpr (std::default_initializable<Exec>) {
      return std::make_unique<Exec>();
    } else {
      throw config_error(fmt::format("make_offloaded_optimizer: executor '{}' must be given", typeid(Exec).name()));
    }
  }
  static std::unique_ptr<node_rw_limiter> make_limiter(const offloaded_optimizer_config& c) {
    bool any = false;
    for (const auto& p : c.paths) any = any || p.node_limited;
    if (!any) return nullptr;
    return std::make_unique<node_rw_limiter>(make_node_rw_limiter(c.node_limiter_name, c.node_limiter_permits,
                                                                  c.node_limiter_sharing, c.node_limiter_dir));
  }
  static std::vector<any_tier> make_paths(const offloaded_optimizer_config& c, const node_rw_limiter* limiter) {
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
  std::optional<optimizer_type> opt_;
};

/// Builds the config's preset and rule over its paths; `build(model, config)` creates or loads.
template <executor Exec, update_site Site, class Build>
any_offloaded_optimizer_on<Exec> make_runtime(offloaded_optimizer_config c, Exec* exec, Site site, Build&& build,
                                              std::string_view who) {
  check_env_variables();  // an empty STRATA_* is refused whether or not this run reads it
  STRATA_EXPECTS(!c.paths.empty(), config_error, "{}: no paths given", who);
  STRATA_EXPECTS(!c.stripe_paths || c.stripe_bytes > 0, config_error, "{}: stripe_bytes must be positive", who);
  const auto make = [&]<class Preset, class Placement>(std::type_identity<Preset>, Placement placement) {
    return with_rule(c.rule, who, [&]<class Rule>(std::type_identity<Rule>) {
      auto o = std::make_unique<runtime_offloaded_optimizer<Preset, Placement, Rule, Exec, Site>>(c, std::move(placement),
                                                                                                   exec, site);
      build(*o, c);
      return any_offloaded_optimizer_on<Exec>(std::move(o));
    });
  };
  if (c.preset == "zero_infinity") {
    STRATA_EXPECTS(c.paths.size() == 1 || c.stripe_paths, config_error,
                   "{}: preset zero_infinity uses one path, got {} (stripe_paths makes one of them)", who,
                   c.paths.size());
    return make(std::type_identity<presets::zero_infinity>{}, bandwidth_proportional{});
  }
  if (c.preset == "mlp_offload") {
    STRATA_EXPECTS(c.paths.size() == 2 && !c.stripe_paths, config_error,
                   "{}: preset mlp_offload uses two paths (NVMe, PFS), got {}{}", who, c.paths.size(),
                   c.stripe_paths ? " striped into one" : "");
    c.paths[1].node_limited = c.mlp_offload_lock;
    return make(std::type_identity<presets::mlp_offload>{}, presets::mlp_offload::placement());
  }
  if (c.preset == "strata") return make(std::type_identity<presets::strata_preset>{}, bandwidth_proportional{});
  throw config_error(
      fmt::format("{}: unknown preset '{}' (expected zero_infinity, mlp_offload or strata)", who, c.preset));
}

/// The config with the rule of the checkpoint in `where` when it names none.
template <class Where>
offloaded_optimizer_config with_checkpoint_rule(offloaded_optimizer_config c, Where& where) {
  if (c.rule.empty()) c.rule = read_checkpoint_manifest(where).rule;
  return c;
}

}  // namespace detail

/// Weights a run-time optimizer starts from: fp32, or a 16-bit model's own (widened exactly),
/// one flat array or the framework's tensors (param_tensor, covering every parameter once; no
/// flat copy is made).
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

namespace detail {
/// make_offloaded_optimizer and make_offloaded_adamw: from host weights, or on an executor;
/// `state` a rule_state_view or AdamW's adamw_state_view.
template <class State>
any_offloaded_optimizer make_from_weights(const offloaded_optimizer_config& config, const host_weights& params,
                                          const State& state, std::string_view who) {
  return make_runtime<host_executor<>>(
      config, nullptr, always_host{},
      [&](auto& o, const offloaded_optimizer_config& c) { std::visit([&](auto p) { o.create(c, p, state); }, params.span); },
      who);
}
template <executor Exec, update_site Site, class State>
any_offloaded_optimizer_on<Exec> make_on(const offloaded_optimizer_config& config, Exec& exec, Site site,
                                         std::span<const float> params, const State& state, std::string_view who) {
  return make_runtime(
      config, &exec, std::move(site), [&](auto& o, const offloaded_optimizer_config& c) { o.create(c, params, state); },
      who);
}
}  // namespace detail

/// Builds the preset's optimizer of the config's rule over the configured paths, starting from
/// `params` and, when given, existing state of the rule (its arrays by name and the steps taken;
/// see offloaded_optimizer::from_state).
[[nodiscard]] inline any_offloaded_optimizer make_offloaded_optimizer(const offloaded_optimizer_config& config,
                                                                      host_weights params,
                                                                      const rule_state_view& state = {}) {
  return detail::make_from_weights(config, params, state, "make_offloaded_optimizer");
}

/// As above, from fp32 weights.
[[nodiscard]] inline any_offloaded_optimizer make_offloaded_optimizer(const offloaded_optimizer_config& config,
                                                                      std::span<const float> params,
                                                                      const rule_state_view& state = {}) {
  return make_offloaded_optimizer(config, host_weights(params), state);
}

/// As above, with updates on `exec` (which must outlive the optimizer) where `site` says, and
/// gradients and the model copy accepted in exec's device memory.
template <executor Exec, update_site Site>
[[nodiscard]] any_offloaded_optimizer_on<Exec> make_offloaded_optimizer(const offloaded_optimizer_config& config,
                                                                        Exec& exec, Site site,
                                                                        std::span<const float> params,
                                                                        const rule_state_view& state = {}) {
  return detail::make_on(config, exec, std::move(site), params, state, "make_offloaded_optimizer");
}

/// Builds the preset's optimizer over the configured paths from the checkpoint in `dir` (a
/// directory) or `store` (an object store's prefix). config.rule must be the checkpoint's, or
/// empty to take it from the checkpoint.
[[nodiscard]] inline any_offloaded_optimizer load_offloaded_optimizer(const offloaded_optimizer_config& config,
                                                                      const std::filesystem::path& dir) {
  return detail::make_runtime<host_executor<>>(
      detail::with_checkpoint_rule(config, dir), nullptr, always_host{},
      [&](auto& o, const offloaded_optimizer_config& c) { o.load(c, dir); }, "load_offloaded_optimizer");
}
[[nodiscard]] inline any_offloaded_optimizer load_offloaded_optimizer(const offloaded_optimizer_config& config,
                                                                      any_tier& store) {
  return detail::make_runtime<host_executor<>>(
      detail::with_checkpoint_rule(config, store), nullptr, always_host{},
      [&](auto& o, const offloaded_optimizer_config& c) { o.load(c, store); }, "load_offloaded_optimizer");
}
/// As above, with updates on `exec` where `site` says.
template <executor Exec, update_site Site>
[[nodiscard]] any_offloaded_optimizer_on<Exec> load_offloaded_optimizer(const offloaded_optimizer_config& config,
                                                                        Exec& exec, Site site,
                                                                        const std::filesystem::path& dir) {
  return detail::make_runtime(
      detail::with_checkpoint_rule(config, dir), &exec, std::move(site),
      [&](auto& o, const offloaded_optimizer_config& c) { o.load(c, dir); }, "load_offloaded_optimizer");
}

}  // namespace strata

#if STRATA_EXTERN_TEMPLATES
// The run-time optimizers of the presets and rules and the layers of their paths, compiled once
// in cmake/strata_instances.cpp (see STRATA_EXTERN_TEMPLATES in core/config.hpp).
#define STRATA_RUNTIME_OPTIMIZERS(X)                                      \
  X(presets::zero_infinity, bandwidth_proportional, adamw_rule)          \
  X(presets::mlp_offload, fixed_ratio, adamw_rule)                       \
  X(presets::strata_preset, bandwidth_proportional, adamw_rule)          \
  X(presets::zero_infinity, bandwidth_proportional, adamw_bf16_rule)     \
  X(presets::mlp_offload, fixed_ratio, adamw_bf16_rule)                  \
  X(presets::strata_preset, bandwidth_proportional, adamw_bf16_rule)     \
  X(presets::zero_infinity, bandwidth_proportional, adamw_8bit_rule)     \
  X(presets::mlp_offload, fixed_ratio, adamw_8bit_rule)                  \
  X(presets::strata_preset, bandwidth_proportional, adamw_8bit_rule)     \
  X(presets::zero_infinity, bandwidth_proportional, sgd_rule)            \
  X(presets::mlp_offload, fixed_ratio, sgd_rule)                         \
  X(presets::strata_preset, bandwidth_proportional, sgd_rule)            \
  X(presets::zero_infinity, bandwidth_proportional, lion_rule)           \
  X(presets::mlp_offload, fixed_ratio, lion_rule)                        \
  X(presets::strata_preset, bandwidth_proportional, lion_rule)
namespace strata {
extern template class detail::multipath_core<fixed_ratio, dynamic_multipath<fixed_ratio>>;
extern template class dynamic_multipath<fixed_ratio>;
extern template class throttled<any_tier>;
extern template class limited<any_tier, node_limiter>;
extern template class checksummed<any_tier>;
#define STRATA_EXTERN_RUNTIME(P, Pl, R) extern template class detail::runtime_offloaded_optimizer<P, Pl, R>;
STRATA_RUNTIME_OPTIMIZERS(STRATA_EXTERN_RUNTIME)
#undef STRATA_EXTERN_RUNTIME
}  // namespace strata
#endif
