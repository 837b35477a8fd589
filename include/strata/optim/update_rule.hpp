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
/// The engine keeps a subgroup's state as ONE object: the master weights (fp32), the block
/// scales of the quantized arrays, then each array of the format in order, back to back, each
/// array `n` elements of its type for a subgroup of n parameters (state_format::offset). Arrays
/// come in order of non-increasing element size, so every array is aligned to its element in a
/// slot. A rule's step is element-wise: an update of [at, at + n) gives the same bits as an
/// update of a larger span over the same elements. A rule with block-quantized arrays
/// (state_format::block() > 0) is element-wise per block instead: an update of [at, at + n)
/// rescales every block it touches, so the engine makes one call per block (no two calls of a
/// step share a block: config_error otherwise), and parameters of a touched block outside the
/// span keep their values up to the block's new scale (exactly when they are 0).

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
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
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/element_types.hpp"
#include "strata/optim/param_steps.hpp"
#include "strata/optim/quant8.hpp"
#include "strata/optim/step_rates.hpp"

namespace strata {

/// The element type of one state array: fp32, bf16, or 8-bit codes of a block-quantized array
/// (optim/quant8.hpp) with the signed map (q8: values of either sign) or the unsigned one (uq8:
/// values never negative), each block of the array with one fp32 scale.
enum class state_element : std::uint8_t { f32, bf16, q8, uq8 };

/// Bytes of one element of type `e` (a quantized array's code; its scales are apart).
[[nodiscard]] constexpr std::size_t element_bytes(state_element e) noexcept {
  return e == state_element::f32 ? 4 : e == state_element::bf16 ? 2 : 1;
}
/// Whether `e` is block-quantized.
[[nodiscard]] constexpr bool quantized(state_element e) noexcept {
  return e == state_element::q8 || e == state_element::uq8;
}
/// The element's name as checkpoints record it ("f32", "bf16", "q8", "uq8").
[[nodiscard]] constexpr std::string_view to_string(state_element e) noexcept {
  return e == state_element::f32 ? "f32" : e == state_element::bf16 ? "bf16" : e == state_element::q8 ? "q8" : "uq8";
}
/// The quantization map of a quantized element.
[[nodiscard]] constexpr const q8_map& map_of(state_element e) noexcept {
  return e == state_element::q8 ? q8_signed_map : q8_unsigned_map;
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
/// laid out. A subgroup of n parameters is one object: the master weights (n floats), then the
/// scales of each quantized array in order (one float per block of q8_block_elems parameters),
/// then each array's elements in order (n of its type). Arrays come in order of non-increasing
/// element size, so every part is aligned to its element in a slot.
struct state_format {
  std::array<state_array, max_state_arrays> arrays{};
  std::size_t count = 0;

  constexpr state_format() = default;
  constexpr state_format(std::initializer_list<state_array> a) {
    for (const auto& x : a) arrays[count++] = x;
  }
  [[nodiscard]] constexpr std::span<const state_array> items() const noexcept { return {arrays.data(), count}; }
  /// Bytes of the per-parameter parts a parameter has (master included, block scales not).
  [[nodiscard]] constexpr std::size_t bytes_per_param() const noexcept {
    std::size_t b = sizeof(float);
    for (std::size_t i = 0; i < count; ++i) b += element_bytes(arrays[i].element);
    return b;
  }
  /// Whether any array is block-quantized.
  [[nodiscard]] constexpr bool quantized() const noexcept {
    for (std::size_t i = 0; i < count; ++i)
      if (strata::quantized(arrays[i].element)) return true;
    return false;
  }
  /// Parameters per block of the quantized arrays (0 when there are none): updates of parameters
  /// sharing a block must happen in one call (see update_rule).
  [[nodiscard]] constexpr std::size_t block() const noexcept { return quantized() ? q8_block_elems : 0; }
  /// Bytes of the state of n parameters.
  [[nodiscard]] constexpr std::size_t state_bytes(std::size_t n) const noexcept {
    return offset(count, n);
  }
  /// Bytes a parameter costs on average over many (block scales spread over their blocks).
  [[nodiscard]] constexpr double mean_bytes_per_param() const noexcept {
    double b = static_cast<double>(bytes_per_param());
    for (std::size_t i = 0; i < count; ++i)
      if (strata::quantized(arrays[i].element)) b += static_cast<double>(sizeof(float)) / q8_block_elems;
    return b;
  }
  /// Byte offset of the scales of array `i` (a quantized one) in the state of n parameters.
  [[nodiscard]] constexpr std::size_t scale_offset(std::size_t i, std::size_t n) const noexcept {
    std::size_t b = sizeof(float) * n;
    for (std::size_t j = 0; j < i; ++j)
      if (strata::quantized(arrays[j].element)) b += sizeof(float) * q8_blocks(n);
    return b;
  }
  /// Byte offset of array `i`'s elements (0-based among the rule's arrays) in the state of n
  /// parameters; offset(count, n) is the state's size.
  [[nodiscard]] constexpr std::size_t offset(std::size_t i, std::size_t n) const noexcept {
    std::size_t b = scale_offset(count, n);
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

/// Where a subgroup's state is (host or device memory): its parameter count, the master weights,
/// each array's first element and each quantized array's first block scale; an update of
/// [at, at + n) offsets each by `at` elements of its type (the scales: by the blocks before
/// `at`'s).
struct state_view {
  float* master = nullptr;
  std::byte* arrays[max_state_arrays] = {};  // plain arrays: device code indexes them too
  float* scales[max_state_arrays] = {};      // null for an array that is not quantized
  std::size_t count = 0;                     // parameters of the state (a block rule's last block ends here)

  /// The view of the state of n parameters laid out by `f` from `base`.
  [[nodiscard]] static state_view of(std::byte* base, const state_format& f, std::size_t n) noexcept {
    state_view v;
    v.master = reinterpret_cast<float*>(base);
    v.count = n;
    for (std::size_t i = 0; i < f.count; ++i) {
      v.arrays[i] = base + f.offset(i, n);
      if (quantized(f.arrays[i].element)) v.scales[i] = reinterpret_cast<float*>(base + f.scale_offset(i, n));
    }
    return v;
  }
  /// Array i as elements of T, from element `at`.
  template <class T>
  [[nodiscard]] STRATA_HOST_DEVICE T* array(std::size_t i, std::size_t at = 0) const noexcept {
    return reinterpret_cast<T*>(arrays[i]) + at;
  }
};

/// Array `a` of the state `v` (laid out by `f`) widened to fp32 into out (v.count values; a
/// quantized array dequantized: map value times block scale).
inline void read_state_array(const state_view& v, const state_format& f, std::size_t a, std::span<float> out) {
  STRATA_ASSERT(a < f.count && out.size() == v.count);
  const state_element e = f.arrays[a].element;
  if (e == state_element::f32) {
    std::memcpy(out.data(), v.arrays[a], v.count * sizeof(float));
  } else if (e == state_element::bf16) {
    for (std::size_t i = 0; i < v.count; ++i) {
      bf16 h;
      std::memcpy(&h, v.arrays[a] + i * sizeof(bf16), sizeof(bf16));
      out[i] = static_cast<float>(h);
    }
  } else {
    const q8_map& map = map_of(e);
    const auto* codes = v.array<const std::uint8_t>(a);
    for (std::size_t i = 0; i < v.count; ++i)
      out[i] = detail::fp::fmul(map.value[codes[i]], v.scales[a][i / q8_block_elems]);
  }
}

/// Writes `values` (v.count fp32 values; empty: zeros) into array `a` of the state `v` (laid out
/// by `f`): as they are (f32), rounded to nearest even (bf16), or quantized block by block as the
/// kernels store them (q8, uq8: absmax scale, nearest code).
inline void write_state_array(const state_view& v, const state_format& f, std::size_t a,
                              std::span<const float> values) {
  STRATA_ASSERT(a < f.count && (values.empty() || values.size() == v.count));
  const state_element e = f.arrays[a].element;
  const std::size_t n = v.count;
  if (e == state_element::f32) {
    if (values.empty())
      std::memset(v.arrays[a], 0, n * sizeof(float));
    else
      std::memcpy(v.arrays[a], values.data(), n * sizeof(float));
  } else if (e == state_element::bf16) {
    for (std::size_t i = 0; i < n; ++i) {
      const bf16 h(values.empty() ? 0.0f : values[i]);
      std::memcpy(v.arrays[a] + i * sizeof(bf16), &h, sizeof(bf16));
    }
  } else {
    const q8_map& map = map_of(e);
    auto* codes = v.array<std::uint8_t>(a);
    for (std::size_t b = 0; b < q8_blocks(n); ++b) {
      const std::size_t lo = b * q8_block_elems, hi = std::min(n, lo + q8_block_elems);
      std::uint32_t bits = 0;
      if (!values.empty())
        for (std::size_t i = lo; i < hi; ++i) bits = std::max(bits, q8_abs_bits(values[i]));
      const float scale = std::bit_cast<float>(bits);
      v.scales[a][b] = scale;
      for (std::size_t i = lo; i < hi; ++i)
        codes[i] = bits == 0 ? map.zero : q8_encode(map.threshold, detail::fp::fdiv(values[i], scale));
    }
  }
}

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
