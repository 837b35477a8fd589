#pragma once
/// update_rule: what an optimizer's update is to the offload engine (offload/), so that one engine
/// (layout, gradient intake, clipping and loss scaling, checkpoints, presets, the run-time
/// optimizer) serves AdamW, SGD, Lion and whatever comes next. A rule is a type with static
/// members only:
///
///   using options_type = ...;        hyper-parameters with lr, decay() and validate()
///   using step_params = ...;         per-step constants, trivially copyable (a CUDA kernel's argument)
///   static constexpr std::string_view tag = "...";   recorded in checkpoints
///   static state_format format(const options_type&);   the state arrays besides fp32 master weights
///   static step_params make_step_params(const options_type&, const rule_step&);
///   template <G, H> static void update_cpu(const state_view&, std::size_t at, std::size_t n,
///                                          const G* grads, H* model_out, const step_params&, thread_pool*);
///       updates parameters [at, at + n) of the state in `state_view` (a subgroup's, in a host
///       slot) with their n gradients (grads[0, n)), and writes the updated weights rounded to
///       H (bf16, fp16 or float) into model_out[0, n) unless model_out is null; the same bits for
///       any thread count, instruction set and split of the span
///   static void reference(double& p, std::span<double> state, double g, const options_type&,
///                         const rule_step&);
///       the update of one parameter in float64 (state: one value per array, in format order),
///       what the tests hold the kernels to
///   static rule_option_values save_options(const options_type&);
///   static options_type load_options(const rule_option_values&);
///       the hyper-parameters by name, as checkpoints record them (load: config_error naming a
///       missing one)
///
/// On an executor's device a rule runs through offload/rule_device.hpp: on host_executor its
/// update_cpu (any rule), on CUDA the specialization of `cuda_update<R>` that the rule's .cuh
/// header defines (`template <G, H> static void launch(const state_view&, std::size_t at,
/// std::size_t n, const G*, H*, const step_params&, cudaStream_t)`, the same bits as update_cpu).
///
/// The engine keeps a subgroup's state as ONE object: the master weights (fp32), then each array
/// of the format in order, back to back, each array `n` elements of its type for a subgroup of n
/// parameters (state_format::offset). Arrays come in order of non-increasing element size, so
/// every array is aligned to its element in a slot. A rule's step is element-wise: an update of
/// [at, at + n) gives the same bits as an update of a larger span over the same elements.

#include <algorithm>
#include <cmath>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/config.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/param_steps.hpp"
#include "strata/optim/step_rates.hpp"

namespace strata {

/// The element type of one state array.
enum class state_element : std::uint8_t { f32, bf16 };

/// Bytes of one element of type `e`.
[[nodiscard]] constexpr std::size_t element_bytes(state_element e) noexcept { return e == state_element::f32 ? 4 : 2; }
/// The element's name as checkpoints record it ("f32", "bf16").
[[nodiscard]] constexpr std::string_view to_string(state_element e) noexcept {
  return e == state_element::f32 ? "f32" : "bf16";
}

/// One state array of a rule.
struct state_array {
  std::string_view name;   ///< as torch names it in a state_dict ("exp_avg", "momentum_buffer")
  state_element element = state_element::f32;
  bool non_negative = false;  ///< values below zero are invalid (a second moment)
  friend constexpr bool operator==(const state_array&, const state_array&) = default;
};

/// The most arrays a rule keeps besides the master weights.
inline constexpr std::size_t max_state_arrays = 4;

/// The arrays a rule keeps per parameter besides the fp32 master weights, in the order they are
/// laid out.
struct state_format {
  std::array<state_array, max_state_arrays> arrays{};
  std::size_t count = 0;

  constexpr state_format() = default;
  constexpr state_format(std::initializer_list<state_array> a) {
    for (const auto& x : a) arrays[count++] = x;
  }
  [[nodiscard]] constexpr std::span<const state_array> items() const noexcept { return {arrays.data(), count}; }
  /// Bytes of state per parameter, master included.
  [[nodiscard]] constexpr std::size_t bytes_per_param() const noexcept {
    std::size_t b = sizeof(float);
    for (std::size_t i = 0; i < count; ++i) b += element_bytes(arrays[i].element);
    return b;
  }
  /// Byte offset of array `i` (0-based among the rule's arrays) in the state of n parameters.
  [[nodiscard]] constexpr std::size_t offset(std::size_t i, std::size_t n) const noexcept {
    std::size_t b = sizeof(float) * n;
    for (std::size_t j = 0; j < i; ++j) b += element_bytes(arrays[j].element) * n;
    return b;
  }
  /// Whether every array is aligned to its element (element sizes non-increasing).
  [[nodiscard]] constexpr bool aligned() const noexcept {
    std::size_t prev = sizeof(float);
    for (std::size_t i = 0; i < count; ++i) {
      if (element_bytes(arrays[i].element) > prev) return false;
      prev = element_bytes(arrays[i].element);
    }
    return true;
  }
  /// Index of the array called `name`, or count when there is none.
  [[nodiscard]] constexpr std::size_t find(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < count; ++i)
      if (arrays[i].name == name) return i;
    return count;
  }
  friend constexpr bool operator==(const state_format& a, const state_format& b) noexcept {
    if (a.count != b.count) return false;
    for (std::size_t i = 0; i < a.count; ++i)
      if (!(a.arrays[i] == b.arrays[i])) return false;
    return true;
  }
};

/// Where a subgroup's state is (host or device memory): the master weights and each array's first
/// element; an update of [at, at + n) offsets each by `at` elements of its type.
struct state_view {
  float* master = nullptr;
  std::byte* arrays[max_state_arrays] = {};  // a plain array: device code indexes it too

  /// The view of the state of n parameters laid out by `f` from `base`.
  [[nodiscard]] static state_view of(std::byte* base, const state_format& f, std::size_t n) noexcept {
    state_view v;
    v.master = reinterpret_cast<float*>(base);
    for (std::size_t i = 0; i < f.count; ++i) v.arrays[i] = base + f.offset(i, n);
    return v;
  }
  /// Array i as elements of T, from element `at`.
  template <class T>
  [[nodiscard]] STRATA_HOST_DEVICE T* array(std::size_t i, std::size_t at = 0) const noexcept {
    return reinterpret_cast<T*>(arrays[i]) + at;
  }
};

/// What one step of one range of parameters is: its count (1-based, as torch's state['step'] after
/// its increment), learning rate and weight decay (a scheduler's and a param group's), the
/// gradient scale (1 / loss scale) and the clip coefficient of the global norm.
struct rule_step {
  std::int64_t step = 1;
  double lr = 1e-3;
  double weight_decay = 0;
  double grad_scale = 1;
  double clip = 1;
};

/// A rule's hyper-parameters by name, as checkpoints record them (booleans as 0 and 1).
using rule_option_values = std::vector<std::pair<std::string, double>>;

namespace detail {
/// The value called `name` in `values`; config_error naming `who` and the option when missing.
[[nodiscard]] inline double option_value(const rule_option_values& values, std::string_view name,
                                         std::string_view who) {
  for (const auto& [k, v] : values)
    if (k == name) return v;
  throw config_error(fmt::format("{}: the options give no '{}'", who, name));
}
}  // namespace detail

/// The text a checkpoint records for a state format: "name:element" per array, comma-separated
/// ("exp_avg:f32,exp_avg_sq:f32"; empty for none).
[[nodiscard]] inline std::string describe(const state_format& f) {
  std::string s;
  for (std::size_t i = 0; i < f.count; ++i) {
    if (i > 0) s += ',';
    s += f.arrays[i].name;
    s += ':';
    s += to_string(f.arrays[i].element);
  }
  return s;
}

/// One state array that exists already: its name in the rule's format and every parameter's value.
struct named_array {
  std::string_view name;
  std::span<const float> values;
};

/// State of any rule that exists already (another run's, e.g. a torch optimizer's state_dict), to
/// start an offloaded optimizer from: arrays by name (fp32 values; an array of the format not
/// given is zeros; a 16-bit array is rounded to nearest even) and the steps taken, as
/// adamw_state_view for AdamW. The next step is step + 1.
struct rule_state_view {
  std::span<const named_array> arrays{};
  std::uint64_t step = 0;
  /// Steps each parameter has taken when they differ (param_steps runs, none above `step`);
  /// empty: every parameter has taken `step`.
  std::span<const param_step_run> step_runs{};

  /// Throws config_error naming `who`, the array and the first bad index unless the state fits
  /// `params` parameters of `format`: every name one of the format's, at most once, one value per
  /// parameter, all finite, and none negative in an array the format marks non-negative.
  void validate(const state_format& format, std::size_t params, std::string_view who) const {
    for (std::size_t i = 0; i < arrays.size(); ++i) {
      const named_array& a = arrays[i];
      const std::size_t at = format.find(a.name);
      STRATA_EXPECTS(at < format.count, config_error, "{}: the state has no array '{}' (it has '{}')", who, a.name,
                     describe(format));
      for (std::size_t j = 0; j < i; ++j)
        STRATA_EXPECTS(arrays[j].name != a.name, config_error, "{}: array '{}' given twice", who, a.name);
      STRATA_EXPECTS(a.values.size() == params, config_error, "{}: {} has {} values for {} parameters", who, a.name,
                     a.values.size(), params);
      const bool non_negative = format.arrays[at].non_negative;
      for (std::size_t k = 0; k < a.values.size(); ++k)
        STRATA_EXPECTS(std::isfinite(a.values[k]) && (!non_negative || a.values[k] >= 0), config_error,
                       "{}: {}[{}] is {}, which {}", who, a.name, k, a.values[k],
                       non_negative ? "this array cannot hold (finite, not negative)" : "is not finite");
    }
  }
};

/// A rule: see the file comment.
template <class R>
concept update_rule =
    std::is_trivially_copyable_v<typename R::step_params> &&
    requires(const typename R::options_type& o, const rule_step& s, const state_view& v, std::size_t n,
             const typename R::step_params& k, thread_pool* pool, double& p, std::span<double> st, double g) {
      { R::tag } -> std::convertible_to<std::string_view>;
      { o.lr } -> std::convertible_to<double>;
      { o.decay() } -> std::convertible_to<double>;
      o.validate();
      { R::format(o) } -> std::same_as<state_format>;
      { R::make_step_params(o, s) } -> std::same_as<typename R::step_params>;
      R::template update_cpu<float, bf16>(v, n, n, static_cast<const float*>(nullptr), static_cast<bf16*>(nullptr), k,
                                          pool);
      R::template update_cpu<fp16, float>(v, n, n, static_cast<const fp16*>(nullptr), static_cast<float*>(nullptr), k,
                                          pool);
      R::reference(p, st, g, o, s);
      { R::save_options(o) } -> std::same_as<rule_option_values>;
      { R::load_options(std::declval<const rule_option_values&>()) } -> std::same_as<typename R::options_type>;
    };

/// The kernel constants of one step of rule R, per range of parameters (one range when the rates
/// are uniform and every parameter has taken the same steps).
template <update_rule R>
class rule_constants {
 public:
  using step_params = typename R::step_params;

  /// One set of constants for every parameter.
  explicit rule_constants(const step_params& k) : first_{0}, k_{k} {}

  /// The constants of step `step` (1-based) for `rates` (validated against the parameter count by
  /// the caller), with gradient scale `grad_scale` and clip coefficient `clip`.
  rule_constants(const typename R::options_type& options, const step_rates& rates, std::int64_t step,
                 double grad_scale, double clip) {
    if (rates.uniform()) {
      first_.push_back(0);
      k_.push_back(R::make_step_params(options, rule_step{step, rates.lr(), options.decay(), grad_scale, clip}));
      return;
    }
    for (const param_range& r : rates.ranges()) {
      first_.push_back(r.first);
      k_.push_back(R::make_step_params(options, rule_step{step, r.lr, r.weight_decay, grad_scale, clip}));
    }
  }

  /// The constants of the next step for `rates` over `steps`'s parameters, each piece with the
  /// step of its own count (`steps` + 1): rates ranges and step runs cut the parameters into
  /// pieces of one lr, weight decay and step each. Uniform rates and steps give exactly the
  /// constants of the constructor above.
  rule_constants(const typename R::options_type& options, const step_rates& rates, const param_steps& steps,
                 double grad_scale, double clip) {
    STRATA_ASSERT(steps.params() > 0);
    const auto add = [&](std::size_t first, std::size_t count, double lr, double wd) {
      steps.for_each(first, count, [&](std::size_t at, std::size_t, std::uint64_t taken) {
        first_.push_back(at);
        k_.push_back(R::make_step_params(
            options, rule_step{static_cast<std::int64_t>(taken) + 1, lr, wd, grad_scale, clip}));
      });
    };
    if (rates.uniform())
      add(0, steps.params(), rates.lr(), options.decay());
    else
      for (const param_range& r : rates.ranges()) add(r.first, r.count, r.lr, r.weight_decay);
  }

  /// Calls `f(offset, length, k)` for each piece of parameters [first, first + count) that lies
  /// in one range, in order; `offset` counts from `first`.
  template <class F>
  void for_each_piece(std::size_t first, std::size_t count, F&& f) const {
    // The range holding `first`: the last whose start is not after it.
    auto i = static_cast<std::size_t>(std::upper_bound(first_.begin(), first_.end(), first) - first_.begin()) - 1;
    std::size_t at = first;
    const std::size_t end = first + count;
    while (at < end) {
      const std::size_t piece_end = i + 1 < first_.size() ? std::min(end, first_[i + 1]) : end;
      f(at - first, piece_end - at, k_[i]);
      at = piece_end;
      ++i;
    }
  }

 private:
  std::vector<std::size_t> first_;  // where each range starts, ascending
  std::vector<step_params> k_;
};


/// The CUDA kernel of rule R, specialized by the rule's .cuh header (see the file comment); a rule
/// without one updates on the host only.
template <class R>
struct cuda_update;

}  // namespace strata
