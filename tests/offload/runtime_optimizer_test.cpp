// The erased optimizer (offload/any_offloaded_optimizer.hpp): make_offloaded_optimizer builds every
// rule and gives the same bits as the typed optimizer of that rule; offloaded_optimizer_ref refers
// to a typed one; the owning value moves and refuses use once moved from; checkpoints name their
// rule on load.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <strata/offload/any_offloaded_optimizer.hpp>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/make_offloaded_optimizer.hpp>
#include <strata/offload/offloaded_optimizer.hpp>
#include <strata/optim/adamw_bf16_rule.hpp>
#include <strata/optim/lion_rule.hpp>
#include <strata/optim/sgd_rule.hpp>
#include <strata/tier/host_tier.hpp>

#include "offload_test_support.hpp"

namespace runtime_optimizer_test {

namespace {

using namespace strata_test;
namespace fs = std::filesystem;

static_assert(std::is_copy_constructible_v<strata::offloaded_optimizer_ref>);
static_assert(!std::is_copy_constructible_v<strata::any_offloaded_optimizer>);
static_assert(std::is_nothrow_move_constructible_v<strata::any_offloaded_optimizer>);
static_assert(std::is_convertible_v<strata::any_offloaded_optimizer&, strata::offloaded_optimizer_ref>);
static_assert(!std::is_convertible_v<int&, strata::offloaded_optimizer_ref>);

strata::offloaded_optimizer_config config(std::string rule, const fs::path& dir = {}) {
  strata::offloaded_optimizer_config c;
  c.rule = std::move(rule);
  strata::offload_path_config p;
  p.directory = dir;  // empty: host memory
  c.paths.push_back(p);
  c.offload.subgroup_elems = 700;
  c.offload.threads = 2;
  c.verify_integrity = false;
  c.sgd.momentum = 0.9;
  c.sgd.weight_decay = 0.01;
  c.lion.weight_decay = 0.1;
  return c;
}

template <class Rule>
const typename Rule::options_type& options_of(const strata::offloaded_optimizer_config& c) {
  if constexpr (std::is_same_v<typename Rule::options_type, strata::adamw_options>)
    return c.adamw;
  else if constexpr (std::is_same_v<typename Rule::options_type, strata::sgd_options>)
    return c.sgd;
  else
    return c.lion;
}

}  // namespace

TEST_CASE_TEMPLATE("make_offloaded_optimizer gives each rule the bits of its typed optimizer", Rule,
                   strata::adamw_rule, strata::adamw_bf16_rule, strata::sgd_rule, strata::lion_rule) {
  const std::size_t n = 5003;
  const auto init = random_params(n, 7);
  const auto c = config(std::string(Rule::tag));
  auto erased = strata::make_offloaded_optimizer(c, init);
  CHECK(erased.rule() == Rule::tag);
  const auto options = options_of<Rule>(c);
  const auto format = Rule::format(options);
  CHECK(erased.state_format() == format);

  strata::host_tier tier;
  strata::offloaded_optimizer<Rule, strata::host_tier> typed(
      tier, init, options, strata::presets::strata_preset::options(n, format, c.offload));
  const strata::offloaded_optimizer_ref ref = typed;  // the same surface over the typed one
  CHECK(ref.rule() == Rule::tag);
  CHECK(ref.preset() == "custom");
  CHECK(ref.path_totals().empty());
  CHECK(ref.target<decltype(typed)>() == &typed);
  CHECK(ref.template target<int>() == nullptr);

  for (int t = 0; t < 4; ++t) {
    const auto g = random_grads<strata::bf16>(n, 100 + t);
    erased.step(std::span<const strata::bf16>(g), 1e-3 * (t + 1));
    ref.step(std::span<const strata::bf16>(g), 1e-3 * (t + 1));
  }
  CHECK(erased.step_count() == 4);
  CHECK(ref.step_count() == 4);
  std::vector<float> a(n), b(n);
  erased.read_master(a);
  typed.read_master(b);
  CHECK(same_bits(a, b));
  for (std::size_t i = 0; i < format.count; ++i) {
    erased.read_state(format.arrays[i].name, a);
    ref.read_state(format.arrays[i].name, b);
    CHECK_MESSAGE(same_bits(a, b), format.arrays[i].name);
  }
  CHECK_THROWS_AS(erased.read_state("no_such_array", a), strata::config_error);
}

TEST_CASE("any_offloaded_optimizer moves, and one moved from is a config_error, not a crash") {
  const auto init = random_params(1000, 8);
  auto a = strata::make_offloaded_optimizer(config("sgd"), init);
  auto b = std::move(a);
  CHECK(b.size() == 1000);
  CHECK(b.preset() == "strata");
  CHECK(b.target<int>() == nullptr);
  CHECK_THROWS_AS((void)a.size(), strata::config_error);  // NOLINT(bugprone-use-after-move): the point
  a = std::move(b);
  CHECK(a.size() == 1000);
  const strata::offloaded_optimizer_ref r = a;
  CHECK(r.size() == 1000);
}

TEST_CASE("a checkpoint loads into its own rule, or the checkpoint's when the config names none") {
  temp_dir dir(fs::temp_directory_path(), "runtime-rule");
  const auto init = random_params(2000, 9);
  {
    auto opt = strata::make_offloaded_optimizer(config("lion"), init);
    const auto g = random_grads<float>(2000, 3);
    opt.step(std::span<const float>(g), 1e-3);
    opt.save(dir.path() / "ckpt");
  }
  CHECK_THROWS_AS((void)strata::load_offloaded_optimizer(config("sgd"), dir.path() / "ckpt"), strata::config_error);
  CHECK_THROWS_AS((void)strata::load_offloaded_adamw(config("adamw"), dir.path() / "ckpt"), strata::config_error);
  auto any = strata::load_offloaded_optimizer(config(""), dir.path() / "ckpt");
  CHECK(any.rule() == "lion");
  CHECK(any.step_count() == 1);
  auto same = strata::load_offloaded_optimizer(config("lion"), dir.path() / "ckpt");
  CHECK(same.step_count() == 1);
}

TEST_CASE("make_offloaded_optimizer refuses an unknown rule, and make_offloaded_adamw a rule not AdamW's") {
  const auto init = random_params(100, 10);
  CHECK_THROWS_WITH_AS((void)strata::make_offloaded_optimizer(config("adam"), init),
                       doctest::Contains("unknown update rule 'adam'"), strata::config_error);
  CHECK_THROWS_WITH_AS((void)strata::make_offloaded_adamw(config("sgd"), init), doctest::Contains("not AdamW's"),
                       strata::config_error);
  auto bf16 = strata::make_offloaded_adamw(config("adamw-bf16"), init);
  CHECK(bf16.rule() == "adamw-bf16");
}

}  // namespace runtime_optimizer_test
