// The update_rule concept accepts every rule strata ships and rejects near misses (each bad rule
// lacks or breaks one thing); state_format lays arrays out as the engine reads them.
#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>

#include "strata/optim/adamw_bf16_rule.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/lion_rule.hpp"
#include "strata/optim/sgd_rule.hpp"
#include "strata/optim/update_rule.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace rule_concept_test {

namespace {

struct options {
  double lr = 1e-3;
  [[nodiscard]] double decay() const { return 0; }
  void validate() const {}
};
struct params {
  float lr = 0;
};

struct bare_options {  // no validate()
  double lr = 1e-3;
  [[nodiscard]] double decay() const { return 0; }
};
struct heavy_params {  // not trivially copyable: no CUDA kernel's argument
  heavy_params() = default;
  heavy_params(const heavy_params&) {}
};

// A complete rule (no arrays: plain SGD) over options O and constants P; the near misses below
// each change one thing.
template <class O = options, class P = params>
struct rule_of {
  using options_type = O;
  using step_params = P;
  static constexpr std::string_view tag = "good";
  static strata::state_format format(const O&) { return {}; }
  static P make_step_params(const O&, const strata::rule_step&) { return {}; }
  template <class G, class H>
  static void update_cpu(const strata::state_view&, std::size_t, std::size_t, const G*, H*, const P&,
                         strata::thread_pool*) {}
  static void reference(double&, std::span<double>, double, const O&, const strata::rule_step&) {}
  static strata::rule_option_values save_options(const O&) { return {}; }
  static O load_options(const strata::rule_option_values&) { return {}; }
};
using good_rule = rule_of<>;

struct no_tag : good_rule {
  static constexpr int tag = 0;  // not a name
};
struct format_not_a_state_format : good_rule {
  static int format(const options&) { return 0; }
};
struct no_reference {
  using options_type = options;
  using step_params = params;
  static constexpr std::string_view tag = "x";
  static strata::state_format format(const options&) { return {}; }
  static params make_step_params(const options&, const strata::rule_step&) { return {}; }
  template <class G, class H>
  static void update_cpu(const strata::state_view&, std::size_t, std::size_t, const G*, H*, const params&,
                         strata::thread_pool*) {}
  static strata::rule_option_values save_options(const options&) { return {}; }
  static options load_options(const strata::rule_option_values&) { return {}; }
};
using params_not_trivially_copyable = rule_of<options, heavy_params>;
struct host_kernel_for_float_only : good_rule {
  template <class G, class H>
    requires std::is_same_v<G, float>
  static void update_cpu(const strata::state_view&, std::size_t, std::size_t, const G*, H*, const params&,
                         strata::thread_pool*) {}
};
using options_without_validate = rule_of<bare_options>;

static_assert(strata::update_rule<good_rule>);
static_assert(!strata::update_rule<no_tag>);
static_assert(!strata::update_rule<format_not_a_state_format>);
static_assert(!strata::update_rule<no_reference>);
static_assert(!strata::update_rule<params_not_trivially_copyable>);
static_assert(!strata::update_rule<host_kernel_for_float_only>);
static_assert(!strata::update_rule<options_without_validate>);

static_assert(strata::update_rule<strata::adamw_rule>);
static_assert(strata::update_rule<strata::adamw_bf16_rule>);
static_assert(strata::update_rule<strata::sgd_rule>);
static_assert(strata::update_rule<strata::lion_rule>);

}  // namespace

TEST_CASE("a state format lays the arrays after the master weights, widest first, and says so") {
  const strata::state_format f{{"a", strata::state_element::f32}, {"b", strata::state_element::bf16, true}};
  CHECK(f.count == 2);
  CHECK(f.bytes_per_param() == 10);
  CHECK(f.offset(0, 7) == 28);      // after 7 fp32 master weights
  CHECK(f.offset(1, 7) == 28 + 28);  // after 7 fp32 elements of a
  CHECK(f.aligned());
  CHECK(f.find("b") == 1);
  CHECK(f.find("c") == f.count);
  CHECK(strata::describe(f) == "a:f32,b:bf16");
  const strata::state_format narrow_first{{"b", strata::state_element::bf16}, {"a", strata::state_element::f32}};
  CHECK_FALSE(narrow_first.aligned());  // a wider array after a narrower one would be misaligned
  CHECK(strata::describe(strata::state_format{}).empty());
  CHECK(strata::state_format{}.bytes_per_param() == 4);

  std::byte slot[70] = {};
  const auto v = strata::state_view::of(slot, f, 7);
  CHECK(reinterpret_cast<std::byte*>(v.master) == slot);
  CHECK(v.array<float>(0) == reinterpret_cast<float*>(slot + 28));
  CHECK(v.array<strata::bf16>(1, 3) == reinterpret_cast<strata::bf16*>(slot + 56) + 3);
}

TEST_CASE("a rule's options by name must be complete: a missing one is a config_error naming it") {
  auto values = strata::sgd_rule::save_options(strata::sgd_options{.lr = 0.5, .momentum = 0.9});
  CHECK(strata::sgd_rule::load_options(values).momentum == 0.9);
  values.erase(values.begin() + 1);  // momentum
  try {
    (void)strata::sgd_rule::load_options(values);
    FAIL("accepted options without momentum");
  } catch (const strata::config_error& e) {
    CHECK(std::string_view(e.what()).find("'momentum'") != std::string_view::npos);
  }
}

}  // namespace rule_concept_test
