#pragma once
/// The erased offloaded optimizer, after the convention of core/erased.hpp:
/// - `offloaded_optimizer_ref`: non-owning, copyable; refers to any offloaded_optimizer<Rule, ...>
///   (any rule, tier stack, policy, executor) or to what make_offloaded_optimizer built. What a
///   function that drives an optimizer it does not own takes (a training loop, a tool).
/// - `any_offloaded_optimizer_on<Exec>`: owning, move-only value (make_offloaded_optimizer
///   returns one); its updates may run on executor Exec, so gradients and the model copy may be in
///   Exec's device memory. `any_offloaded_optimizer` is it for host_executor<>.
/// Every member keeps the contract of offloaded_optimizer's (offload/offloaded_optimizer.hpp);
/// one call through a table of function pointers per member, whatever the rule.
///
/// The rule is a run-time value here: rule() is its tag ("adamw", "adamw-bf16", "adamw-8bit", "sgd", "lion"),
/// state_format() its arrays, read_state(name) reads any of them.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "strata/core/erased.hpp"
#include "strata/core/half.hpp"
#include "strata/exec/device_span.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/offload/offload_stats.hpp"
#include "strata/offload/param_tensors.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/param_steps.hpp"
#include "strata/optim/step_rates.hpp"
#include "strata/optim/update_rule.hpp"
#include "strata/tier/any_tier.hpp"

namespace strata {

/// Gradients of a step in host memory, in the model's type.
using host_grad_span = std::variant<std::span<const float>, std::span<const bf16>, std::span<const fp16>>;
/// A host model copy that a step writes the updated weights into, in the model's own type (fp32
/// exactly; bf16 and fp16 rounded to nearest even), size() elements.
using host_model_span = std::variant<std::span<float>, std::span<bf16>, std::span<fp16>>;
/// A framework's tensors (param_tensor), weights of the gradients' type.
using host_tensor_span = std::variant<std::span<const param_tensor<float, float>>,
                                      std::span<const param_tensor<bf16, bf16>>,
                                      std::span<const param_tensor<fp16, fp16>>>;
/// Gradients in an executor's device memory.
using device_grad_span = std::variant<device_span<const float>, device_span<const bf16>, device_span<const fp16>>;
/// A model copy in an executor's device memory that a step writes in place, size() elements.
using device_model_span = std::variant<device_span<float>, device_span<bf16>, device_span<fp16>>;

namespace detail {

// A model's optimizer: the object itself, or what it wraps (`optimizer()`, as the run-time
// optimizers of make_offloaded_optimizer do, which add their paths and preset).
template <class T>
decltype(auto) optimizer_of(T& t) {
  if constexpr (requires { t.optimizer(); })
    return t.optimizer();
  else
    return (t);
}

/// The table of an offloaded optimizer's host surface (see the file comment).
struct offloaded_optimizer_table {
  static constexpr std::string_view concept_name = "offloaded optimizer";
  erased_ops ops_;
  offload_step_stats (*step)(void*, const host_grad_span*, const step_rates&, const host_model_span*);
  offload_step_stats (*step_tensors)(void*, const host_tensor_span&, const step_rates&, const step_options&);
  grad_stats (*gradient_stats)(void*, const host_tensor_span&);
  void (*accept_gradients_at)(void*, std::size_t, const host_grad_span&);
  void (*begin_step)(void*, const step_rates&, const host_model_span*);
  void (*discard_gradients)(void*);
  std::vector<path_traffic> (*path_totals)(const void*);
  void (*read_master)(void*, std::span<float>);
  void (*read_state)(void*, std::string_view, std::span<float>);
  void (*save)(void*, const std::filesystem::path*, any_tier*, const host_tensor_span*);
  void (*flush)(void*);
  std::size_t (*remove_state)(void*);
  std::uint64_t (*step_count)(const void*);
  const param_steps& (*param_step_counts)(const void*);
  float (*loss_scale)(const void*);
  std::int64_t (*loss_growth_tracker)(const void*);
  void (*restore_loss_scale)(void*, float, std::int64_t);
  offload_stats (*stats)(const void*);
  std::size_t (*size)(const void*);
  std::string_view (*preset)(const void*);
  const offload_options& (*offload)(const void*);
  std::string_view (*rule)(const void*);
  const state_format& (*format)(const void*);

  [[nodiscard]] const erased_ops& ops() const noexcept { return ops_; }

  template <class T>
  static constexpr offloaded_optimizer_table of() {
    return {
        erased_ops_of<T>,
        [](void* p, const host_grad_span* g, const step_rates& r, const host_model_span* m) {
          auto& o = optimizer_of(*static_cast<T*>(p));
          if (g == nullptr) {
            if (m == nullptr) return o.step(r);
            return std::visit([&](auto out) { return o.step(r, out); }, *m);
          }
          return std::visit(
              [&](auto grads) {
                if (m == nullptr) return o.step(grads, r);
                return std::visit([&](auto out) { return o.step(grads, r, out); }, *m);
              },
              *g);
        },
        [](void* p, const host_tensor_span& t, const step_rates& r, const step_options& so) {
          return std::visit([&](auto ts) { return optimizer_of(*static_cast<T*>(p)).step(ts, r, so); }, t);
        },
        [](void* p, const host_tensor_span& t) {
          return std::visit([&](auto ts) { return optimizer_of(*static_cast<T*>(p)).gradient_stats(ts); }, t);
        },
        [](void* p, std::size_t first, const host_grad_span& g) {
          std::visit([&](auto grads) { optimizer_of(*static_cast<T*>(p)).accept_gradients_at(first, grads); }, g);
        },
        [](void* p, const step_rates& r, const host_model_span* m) {
          auto& o = optimizer_of(*static_cast<T*>(p));
          if (m == nullptr) return o.begin_step(r);
          std::visit([&](auto out) { o.begin_step(r, out); }, *m);
        },
        [](void* p) { optimizer_of(*static_cast<T*>(p)).discard_gradients(); },
        [](const void* p) -> std::vector<path_traffic> {
          const T& t = *static_cast<const T*>(p);
          if constexpr (requires { t.path_totals(); })
            return t.path_totals();
          else
            return {};
        },
        [](void* p, std::span<float> out) { optimizer_of(*static_cast<T*>(p)).read_master(out); },
        [](void* p, std::string_view name, std::span<float> out) {
          optimizer_of(*static_cast<T*>(p)).read_state(name, out);
        },
        [](void* p, const std::filesystem::path* dir, any_tier* store, const host_tensor_span* t) {
          auto& o = optimizer_of(*static_cast<T*>(p));
          if (t == nullptr) {
            if (dir != nullptr)
              o.save(*dir);
            else
              o.save(*store);
            return;
          }
          std::visit(
              [&](auto ts) {
                if (dir != nullptr)
                  o.save(*dir, ts);
                else
                  o.save(*store, ts);
              },
              *t);
        },
        [](void* p) { optimizer_of(*static_cast<T*>(p)).flush(); },
        [](void* p) { return optimizer_of(*static_cast<T*>(p)).remove_state(); },
        [](const void* p) { return optimizer_of(*static_cast<T*>(const_cast<void*>(p))).step_count(); },
        [](const void* p) -> const param_steps& {
          return optimizer_of(*static_cast<T*>(const_cast<void*>(p))).param_step_counts();
        },
        [](const void* p) { return optimizer_of(*static_cast<T*>(const_cast<void*>(p))).loss_scale(); },
        [](const void* p) {
          return optimizer_of(*static_cast<T*>(const_cast<void*>(p))).loss_scaler().growth_tracker();
        },
        [](void* p, float scale, std::int64_t tracker) {
          optimizer_of(*static_cast<T*>(p)).restore_loss_scale(scale, tracker);
        },
        [](const void* p) { return optimizer_of(*static_cast<T*>(const_cast<void*>(p))).stats(); },
        [](const void* p) { return optimizer_of(*static_cast<T*>(const_cast<void*>(p))).size(); },
        [](const void* p) -> std::string_view {
          const T& t = *static_cast<const T*>(p);
          if constexpr (requires { t.preset(); })
            return t.preset();
          else
            return "custom";
        },
        [](const void* p) -> const offload_options& {
          return optimizer_of(*static_cast<T*>(const_cast<void*>(p))).offload();
        },
        [](const void*) -> std::string_view {
          using O = std::remove_cvref_t<decltype(optimizer_of(std::declval<T&>()))>;
          return O::rule_type::tag;
        },
        [](const void* p) -> const state_format& {
          return optimizer_of(*static_cast<T*>(const_cast<void*>(p))).layout().format;
        },
    };
  }
};

/// The table of the device surface on executor Exec: the host table and three more.
template <executor Exec>
struct offloaded_optimizer_table_on {
  static constexpr std::string_view concept_name = "offloaded optimizer";
  using event_type = typename Exec::stream_type::event_type;
  offloaded_optimizer_table host;
  void (*accept_device_gradients_at)(void*, std::size_t, const device_grad_span&, const event_type&);
  offload_step_stats (*step_device)(void*, const step_rates&, const device_model_span&);
  Exec& (*executor)(void*);

  [[nodiscard]] const erased_ops& ops() const noexcept { return host.ops(); }

  template <class T>
  static constexpr offloaded_optimizer_table_on of() {
    return {
        offloaded_optimizer_table::of<T>(),
        [](void* p, std::size_t first, const device_grad_span& g, const event_type& ready) {
          std::visit([&](auto grads) { optimizer_of(*static_cast<T*>(p)).accept_gradients_at(first, grads, ready); },
                     g);
        },
        [](void* p, const step_rates& r, const device_model_span& m) {
          return std::visit([&](auto model) { return optimizer_of(*static_cast<T*>(p)).step(r, model); }, m);
        },
        [](void* p) -> Exec& { return static_cast<T*>(p)->executor(); },
    };
  }
};

template <class T>
inline constexpr offloaded_optimizer_table offloaded_optimizer_table_of = offloaded_optimizer_table::of<T>();
template <class T, class Exec>
inline constexpr offloaded_optimizer_table_on<Exec> offloaded_optimizer_table_on_of =
    offloaded_optimizer_table_on<Exec>::template of<T>();

/// The host surface, written once for the ref and the owning value: `D` gives self() and
/// host_table().
template <class D>
class offloaded_optimizer_calls {
 public:
  /// One step; `rates` is one learning rate, or one lr and weight decay per range of parameters.
  offload_step_stats step(host_grad_span grads, const step_rates& rates) const {
    return t().step(self(), &grads, rates, nullptr);
  }
  /// One step that also writes the updated weights into `model` in the same pass (no read-back).
  offload_step_stats step(host_grad_span grads, const step_rates& rates, host_model_span model) const {
    return t().step(self(), &grads, rates, &model);
  }
  /// One step over the gradients handed to accept_gradients_at.
  offload_step_stats step(const step_rates& rates) const { return t().step(self(), nullptr, rates, nullptr); }
  /// As above, writing the updated weights into `model`.
  offload_step_stats step(const step_rates& rates, host_model_span model) const {
    return t().step(self(), nullptr, rates, &model);
  }
  /// One step over framework tensors as they are, each tensor's weights updated in place
  /// (tensors without gradients are left as they are).
  offload_step_stats step(host_tensor_span tensors, const step_rates& rates, const step_options& opts = {}) const {
    return t().step_tensors(self(), tensors, rates, opts);
  }
  /// The squared norm and count of the tensors' gradients, unscaled.
  [[nodiscard]] grad_stats gradient_stats(host_tensor_span tensors) const { return t().gradient_stats(self(), tensors); }
  /// Hands over gradients of parameters [first, first + grads.size()) as backward produces them
  /// (with the zero_infinity preset they are widened and written to the tier now).
  void accept_gradients_at(std::size_t first, host_grad_span grads) const {
    t().accept_gradients_at(self(), first, grads);
  }
  /// Declares the next step over handed-over gradients before backward hands any over, so that
  /// its subgroups may be updated as their gradients land (offload_options::update_as_gradients_land).
  void begin_step(const step_rates& rates) const { t().begin_step(self(), rates, nullptr); }
  /// As above, with the model copy the step writes the updated weights into (step() must repeat it).
  void begin_step(const step_rates& rates, host_model_span model) const { t().begin_step(self(), rates, &model); }
  /// Drops the gradients handed over since the last step.
  void discard_gradients() const { t().discard_gradients(self()); }
  /// Each path's name, declared bandwidths and the bytes its completed requests moved since
  /// construction (empty for an optimizer built without make_offloaded_optimizer). Safe to call
  /// from another thread while a step runs (to sample throughput).
  [[nodiscard]] std::vector<path_traffic> path_totals() const { return t().path_totals(self()); }
  void read_master(std::span<float> out) const { t().read_master(self(), out); }
  /// One array of the rule's state by name (state_format()); an unknown name is a config_error.
  void read_state(std::string_view name, std::span<float> out) const { t().read_state(self(), name, out); }
  /// AdamW's moments (read_state("exp_avg") and read_state("exp_avg_sq")).
  void read_moments(std::span<float> m, std::span<float> v) const {
    read_state("exp_avg", m);
    read_state("exp_avg_sq", v);
  }
  /// The running maximum of v (AdamW with amsgrad only).
  void read_max_exp_avg_sq(std::span<float> out) const { read_state("max_exp_avg_sq", out); }
  void save(const std::filesystem::path& dir) const { t().save(self(), &dir, nullptr, nullptr); }
  /// Saves into a store (an object store's prefix; see offload/tier_checkpoint.hpp).
  void save(any_tier& store) const { t().save(self(), nullptr, &store, nullptr); }
  /// Saves with the tensors' weights as the truth.
  void save(const std::filesystem::path& dir, host_tensor_span tensors) const {
    t().save(self(), &dir, nullptr, &tensors);
  }
  void save(any_tier& store, host_tensor_span tensors) const { t().save(self(), nullptr, &store, &tensors); }
  void flush() const { t().flush(self()); }
  /// Removes the tier objects the optimizer created.
  std::size_t remove_state() const { return t().remove_state(self()); }
  [[nodiscard]] std::uint64_t step_count() const { return t().step_count(self()); }
  /// Steps each parameter has taken.
  [[nodiscard]] const param_steps& param_step_counts() const { return t().param_step_counts(self()); }
  /// What to multiply the loss by before backward (offload.loss_scaling; 1 when off).
  [[nodiscard]] float loss_scale() const { return t().loss_scale(self()); }
  /// The loss scaler's clean steps in a row (with loss_scale(): what restore_loss_scale takes).
  [[nodiscard]] std::int64_t loss_growth_tracker() const { return t().loss_growth_tracker(self()); }
  /// Sets the loss scale and growth tracker.
  void restore_loss_scale(float scale, std::int64_t growth_tracker) const {
    t().restore_loss_scale(self(), scale, growth_tracker);
  }
  [[nodiscard]] offload_stats stats() const { return t().stats(self()); }
  [[nodiscard]] std::size_t size() const { return t().size(self()); }
  /// The preset's name ("custom" for an optimizer assembled by hand).
  [[nodiscard]] std::string_view preset() const { return t().preset(self()); }
  [[nodiscard]] const offload_options& offload() const { return t().offload(self()); }
  /// The update rule's tag, as checkpoints record it.
  [[nodiscard]] std::string_view rule() const { return t().rule(self()); }
  /// The rule's state arrays (names and element types) after the fp32 master.
  [[nodiscard]] const ::strata::state_format& state_format() const { return t().format(self()); }

 private:
  [[nodiscard]] void* self() const { return static_cast<const D*>(this)->erased_self(); }
  [[nodiscard]] const offloaded_optimizer_table& t() const { return static_cast<const D*>(this)->host_table(); }
};

}  // namespace detail

/// A non-owning reference to an offloaded optimizer (see the file comment); the optimizer must
/// outlive it. Copyable; two pointers.
class offloaded_optimizer_ref : public detail::offloaded_optimizer_calls<offloaded_optimizer_ref> {
 public:
  /// Refers to `o`: an offloaded_optimizer<Rule, ...> or a run-time optimizer's model.
  template <class T>
    requires(!std::is_const_v<T> && !std::derived_from<T, detail::offloaded_optimizer_calls<T>> &&
             requires(T& t) { detail::optimizer_of(t).layout(); })
  offloaded_optimizer_ref(T& o) noexcept  // NOLINT(google-explicit-constructor): a reference to one is one
      : ref_(&o, detail::offloaded_optimizer_table_of<T>) {}
  offloaded_optimizer_ref(void* self, const detail::offloaded_optimizer_table& table) noexcept : ref_(self, table) {}

  /// The optimizer if it is a T, else null.
  template <class T>
  [[nodiscard]] T* target() const noexcept {
    return ref_.template target<T>();
  }

 private:
  friend class detail::offloaded_optimizer_calls<offloaded_optimizer_ref>;
  [[nodiscard]] void* erased_self() const noexcept { return ref_.self(); }
  [[nodiscard]] const detail::offloaded_optimizer_table& host_table() const noexcept { return ref_.table(); }
  detail::erased_ref<detail::offloaded_optimizer_table> ref_;
};

/// An owning, move-only offloaded optimizer whose updates may run on executor Exec (see the file
/// comment). make_offloaded_optimizer returns one; `make<T>(args...)` erases any other.
template <executor Exec>
class any_offloaded_optimizer_on : public detail::offloaded_optimizer_calls<any_offloaded_optimizer_on<Exec>> {
  using table_type = detail::offloaded_optimizer_table_on<Exec>;
  using calls = detail::offloaded_optimizer_calls<any_offloaded_optimizer_on<Exec>>;

 public:
  using event_type = typename Exec::stream_type::event_type;
  using calls::accept_gradients_at;
  using calls::step;

  /// Takes ownership of `o`, whose executor() names Exec.
  template <class T>
  explicit any_offloaded_optimizer_on(std::unique_ptr<T> o)
      : box_(std::move(o), detail::offloaded_optimizer_table_on_of<T, Exec>) {}
  /// Constructs a T in place and owns it.
  template <class T, class... Args>
  [[nodiscard]] static any_offloaded_optimizer_on make(Args&&... args) {
    return any_offloaded_optimizer_on(std::make_unique<T>(std::forward<Args>(args)...));
  }

  /// Hands over device gradients of parameters [first, first + grads.size()) once `ready` has
  /// completed; returns at once.
  void accept_gradients_at(std::size_t first, device_grad_span grads, const event_type& ready) const {
    box_.table().accept_device_gradients_at(box_.self(), first, grads, ready);
  }
  /// One step over the handed-over gradients that writes the updated weights into `model` in
  /// device memory; every copy has landed when it returns.
  offload_step_stats step(const step_rates& rates, device_model_span model) const {
    return box_.table().step_device(box_.self(), rates, model);
  }
  [[nodiscard]] Exec& executor() const { return box_.table().executor(box_.self()); }

  /// A reference to the host surface.
  [[nodiscard]] offloaded_optimizer_ref ref() const { return {box_.self(), box_.table().host}; }
  operator offloaded_optimizer_ref() const { return ref(); }  // NOLINT(google-explicit-constructor)
  /// The optimizer if it is a T, else null.
  template <class T>
  [[nodiscard]] T* target() const noexcept {
    return box_.template target<T>();
  }

 private:
  friend calls;
  [[nodiscard]] void* erased_self() const { return box_.self(); }
  [[nodiscard]] const detail::offloaded_optimizer_table& host_table() const noexcept { return box_.table().host; }
  detail::erased_box<table_type> box_;
};

/// An owning offloaded optimizer on the host (see the file comment).
using any_offloaded_optimizer = any_offloaded_optimizer_on<host_executor<>>;

}  // namespace strata
