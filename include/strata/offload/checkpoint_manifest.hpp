#pragma once
/// The manifest of an offloaded optimizer's checkpoint: a small text file ("manifest") that names
/// the data file of the checkpoint and records everything needed to resume bit-identically (the
/// update rule and its state format, step count, hyper-parameters as exact hexadecimal floats,
/// the subgroup layout) plus one XXH3-64 checksum per subgroup. Its last line is the checksum of
/// every line before it, so a truncated or edited manifest is refused with integrity_error. It is
/// published with write_file_atomic (fsync), after the data file is fsync'ed: a reader sees the
/// previous checkpoint or this one.
///
///   strata-offload-checkpoint 4
///   rule adamw                        (the update rule's tag: update_rule)
///   state exp_avg:f32,exp_avg_sq:f32  (its arrays after the fp32 master weights; "-" for none)
///   step 12
///   params 1000003
///   subgroup_elems 65536
///   options 8                         (the rule's hyper-parameters, by name)
///   option lr 0x1.0624dd2f1a9fcp-10
///   ... (AdamW: beta1 beta2 eps weight_decay decoupled amsgrad maximize)
///   loss_scaling 1                    (dynamic loss scaling: whether it was on, its scale and
///   loss_scale 0x1p+16                 growth tracker)
///   growth_tracker 37
///   step_runs 2                       (steps each parameter has taken, as runs from a first
///   run 0 12                           parameter: param_steps)
///   run 4096 11
///   data state-12-5f3a9c.bin
///   data_bytes 12000036
///   sg 0 786432 0x1234abcd...        (subgroup, bytes, checksum; offsets follow in order)
///   checksum 0x9e3779b97f4a7c15
///
/// Manifests of versions 1 to 3 ("strata-offloaded-adamw-checkpoint N", written before the
/// engine was generic over rules) are AdamW's: after subgroup_elems they have "sections 3" (or 4
/// with amsgrad) and the eight AdamW options as bare "lr 0x..." lines; version 1 has no loss
/// scaling lines, versions 1 and 2 no step runs (every parameter then took `step`). They are still
/// read.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/param_steps.hpp"
#include "strata/optim/update_rule.hpp"
#include "strata/tier/checksummed.hpp"

namespace strata {

/// What a checkpoint manifest records.
struct checkpoint_manifest {
  static constexpr std::string_view magic = "strata-offload-checkpoint 4";
  static constexpr std::string_view magic_v3 = "strata-offloaded-adamw-checkpoint 3";
  static constexpr std::string_view magic_v2 = "strata-offloaded-adamw-checkpoint 2";
  static constexpr std::string_view magic_v1 = "strata-offloaded-adamw-checkpoint 1";
  std::string rule{adamw_rule::tag};  ///< the update rule's tag
  /// Its state arrays after the master weights (describe(state_format)); AdamW's by default.
  std::string state = describe(adamw_rule::format(adamw_options{}));
  std::uint64_t step = 0;
  std::uint64_t params = 0;
  std::uint64_t subgroup_elems = 0;
  rule_option_values options = adamw_rule::save_options(adamw_options{});  ///< the rule's hyper-parameters
  bool loss_scaling = false;        ///< dynamic loss scaling was on (false in version 1 manifests)
  float loss_scale = 1;             ///< its scale when saved
  std::int64_t growth_tracker = 0;  ///< its clean steps in a row
  /// Steps each parameter has taken (param_steps' runs); empty: every one took `step`.
  std::vector<param_step_run> step_runs;
  std::string data_file;  ///< file name, in the checkpoint directory
  std::uint64_t data_bytes = 0;
  std::vector<std::uint64_t> subgroup_bytes;
  std::vector<std::uint64_t> checksums;  ///< XXH3-64 of each subgroup's state bytes

  [[nodiscard]] std::string to_text() const {
    std::string body = fmt::format("{}\nrule {}\nstate {}\nstep {}\nparams {}\nsubgroup_elems {}\noptions {}\n", magic,
                                   rule, state.empty() ? "-" : state, step, params, subgroup_elems, options.size());
    for (const auto& [name, value] : options) body += fmt::format("option {} {:a}\n", name, value);
    body += fmt::format("loss_scaling {}\nloss_scale {:a}\ngrowth_tracker {}\n", int(loss_scaling),
                        static_cast<double>(loss_scale), growth_tracker);
    if (step_runs.empty()) {
      body += fmt::format("step_runs 1\nrun 0 {}\n", step);
    } else {
      body += fmt::format("step_runs {}\n", step_runs.size());
      for (const auto& r : step_runs) body += fmt::format("run {} {}\n", r.first, r.steps);
    }
    body += fmt::format("data {}\ndata_bytes {}\n", data_file, data_bytes);
    for (std::size_t i = 0; i < checksums.size(); ++i)
      body += fmt::format("sg {} {} {:#018x}\n", i, subgroup_bytes[i], checksums[i]);
    body += fmt::format("checksum {:#018x}\n", checksum64(std::as_bytes(std::span(body.data(), body.size()))));
    return body;
  }

  /// Parses `text` (read from `where`); integrity_error on anything malformed, truncated or edited.
  [[nodiscard]] static checkpoint_manifest parse(std::string_view text, std::string_view where) {
    const auto bad = [&](std::string_view why) {
      return integrity_error("checkpoint", where, 0, fmt::format("manifest refused: {}", why));
    };
    const auto last = text.rfind("checksum ");
    if (last == std::string_view::npos || (last != 0 && text[last - 1] != '\n'))
      throw bad("no checksum line (truncated?)");
    const std::string_view body = text.substr(0, last);
    std::string_view tail = text.substr(last + 9);
    if (!tail.empty() && tail.back() == '\n') tail.remove_suffix(1);
    const std::uint64_t expected = parse_u64(tail, bad);
    const std::uint64_t actual = checksum64(std::as_bytes(std::span(body.data(), body.size())));
    if (expected != actual)
      throw integrity_error("checkpoint", where, last, expected, actual);

    checkpoint_manifest m;
    std::vector<std::string_view> lines;
    for (std::size_t pos = 0; pos < body.size();) {
      const auto nl = body.find('\n', pos);
      if (nl == std::string_view::npos) throw bad("unterminated line");
      lines.push_back(body.substr(pos, nl - pos));
      pos = nl + 1;
    }
    std::size_t i = 0;
    const auto next = [&](std::string_view key) -> std::string_view {
      if (i >= lines.size()) throw bad(fmt::format("missing '{}'", key));
      const auto line = lines[i++];
      if (line.substr(0, key.size()) != key || line.size() <= key.size() || line[key.size()] != ' ')
        throw bad(fmt::format("expected '{}' at line {}, found '{}'", key, i, line));
      return line.substr(key.size() + 1);
    };
    if (lines.empty() ||
        (lines[0] != magic && lines[0] != magic_v3 && lines[0] != magic_v2 && lines[0] != magic_v1))
      throw bad("not a strata offload checkpoint of a version this build reads (bad first line)");
    const bool v1 = lines[0] == magic_v1;
    const bool v4 = lines[0] == magic;
    const bool runs_recorded = v4 || lines[0] == magic_v3;
    i = 1;
    if (v4) {
      m.rule = std::string(next("rule"));
      const std::string_view st = next("state");
      m.state = st == "-" ? std::string() : std::string(st);
      if (!valid_name(m.rule)) throw bad(fmt::format("bad rule '{}'", m.rule));
      if (!state_sizes(m.state)) throw bad(fmt::format("bad state format '{}'", m.state));
    }
    m.step = parse_u64(next("step"), bad);
    m.params = parse_u64(next("params"), bad);
    m.subgroup_elems = parse_u64(next("subgroup_elems"), bad);
    if (v4) {
      const std::uint64_t count = parse_u64(next("options"), bad);
      if (count > 64) throw bad(fmt::format("bad option count {}", count));
      m.options.clear();
      for (std::uint64_t o = 0; o < count; ++o) {
        const auto rest = next("option");
        const auto sp = rest.find(' ');
        if (sp == std::string_view::npos || !valid_name(rest.substr(0, sp)))
          throw bad(fmt::format("bad option line '{}'", rest));
        m.options.emplace_back(std::string(rest.substr(0, sp)), parse_double(rest.substr(sp + 1), bad));
      }
    } else {  // AdamW's, in the fixed order of versions 1 to 3
      m.rule = std::string(adamw_rule::tag);
      const std::uint64_t sections = parse_u64(next("sections"), bad);
      if (sections != 3 && sections != 4) throw bad("bad layout");
      adamw_options a;
      a.lr = parse_double(next("lr"), bad);
      a.beta1 = parse_double(next("beta1"), bad);
      a.beta2 = parse_double(next("beta2"), bad);
      a.eps = parse_double(next("eps"), bad);
      a.weight_decay = parse_double(next("weight_decay"), bad);
      a.decoupled = parse_u64(next("decoupled"), bad) != 0;
      a.amsgrad = parse_u64(next("amsgrad"), bad) != 0;
      a.maximize = parse_u64(next("maximize"), bad) != 0;
      if (a.amsgrad != (sections == 4)) throw bad("amsgrad does not match the number of arrays");
      m.options = adamw_rule::save_options(a);
      m.state = describe(adamw_rule::format(a));
    }
    if (!v1) {
      m.loss_scaling = parse_u64(next("loss_scaling"), bad) != 0;
      const double scale = parse_double(next("loss_scale"), bad);
      const std::uint64_t tracker = parse_u64(next("growth_tracker"), bad);
      if (!(scale > 0) || !std::isfinite(static_cast<float>(scale)) || static_cast<double>(static_cast<float>(scale)) != scale ||
          tracker > static_cast<std::uint64_t>(INT64_MAX))
        throw bad(fmt::format("bad loss scale {} or growth tracker {}", scale, tracker));
      m.loss_scale = static_cast<float>(scale);
      m.growth_tracker = static_cast<std::int64_t>(tracker);
    }
    if (runs_recorded) {
      const std::uint64_t runs = parse_u64(next("step_runs"), bad);
      if (runs == 0 || runs > m.params) throw bad(fmt::format("bad step_runs {}", runs));
      for (std::uint64_t r = 0; r < runs; ++r) {
        const auto rest = next("run");
        const auto sp = rest.find(' ');
        if (sp == std::string_view::npos) throw bad(fmt::format("bad run line '{}'", rest));
        const param_step_run run{static_cast<std::size_t>(parse_u64(rest.substr(0, sp), bad)),
                                 parse_u64(rest.substr(sp + 1), bad)};
        if ((r == 0 && run.first != 0) || (r > 0 && run.first <= m.step_runs.back().first) || run.first >= m.params ||
            run.steps > m.step)
          throw bad(fmt::format("step run {} ('{}') out of order, past the parameters or past step {}", r, rest, m.step));
        m.step_runs.push_back(run);
      }
    }
    m.data_file = std::string(next("data"));
    m.data_bytes = parse_u64(next("data_bytes"), bad);
    if (m.subgroup_elems == 0) throw bad("bad layout");
    if (m.data_file.empty() || m.data_file.find('/') != std::string::npos || m.data_file.front() == '.')
      throw bad(fmt::format("bad data file name '{}'", m.data_file));
    const std::uint64_t count = (m.params + m.subgroup_elems - 1) / m.subgroup_elems;
    std::uint64_t total = 0;
    for (std::uint64_t s = 0; s < count; ++s) {
      const auto rest = next("sg");
      const auto a = rest.find(' ');
      const auto b = a == std::string_view::npos ? a : rest.find(' ', a + 1);
      if (b == std::string_view::npos) throw bad(fmt::format("bad subgroup line '{}'", rest));
      if (parse_u64(rest.substr(0, a), bad) != s) throw bad(fmt::format("subgroup {} out of order", s));
      m.subgroup_bytes.push_back(parse_u64(rest.substr(a + 1, b - a - 1), bad));
      m.checksums.push_back(parse_u64(rest.substr(b + 1), bad));
      total += m.subgroup_bytes.back();
    }
    if (i != lines.size()) throw bad("unexpected lines after the subgroups");
    if (total != m.data_bytes || m.data_bytes != m.state_bytes())
      throw bad("subgroup sizes do not add up to the data size");
    for (std::uint64_t s = 0; s < count; ++s)
      if (m.subgroup_bytes[s] != m.state_bytes_of(std::min(m.subgroup_elems, m.params - s * m.subgroup_elems)))
        throw bad(fmt::format("subgroup {} has {} bytes, not its state's", s, m.subgroup_bytes[s]));
    return m;
  }

  /// Bytes of state per parameter that `state` implies (master weights included, block scales
  /// of quantized arrays not).
  [[nodiscard]] std::uint64_t bytes_per_param() const noexcept {
    const auto z = state_sizes(state);
    return z ? z->per_param : 0;
  }
  /// Bytes of the state of n parameters, one subgroup's object (0 for a bad state format).
  [[nodiscard]] std::uint64_t state_bytes_of(std::uint64_t n) const noexcept {
    const auto z = state_sizes(state);
    return z ? z->bytes(n) : 0;
  }
  /// Bytes of every subgroup's state.
  [[nodiscard]] std::uint64_t state_bytes() const noexcept {
    if (params == 0 || subgroup_elems == 0) return 0;
    const std::uint64_t count = (params + subgroup_elems - 1) / subgroup_elems;
    return (count - 1) * state_bytes_of(subgroup_elems) + state_bytes_of(params - (count - 1) * subgroup_elems);
  }

  /// What a state format described as describe(state_format) does ("exp_avg:f32,exp_avg_sq:uq8")
  /// costs: bytes per parameter (4 for the master weights, plus each array's element) and the
  /// quantized arrays, each with one fp32 scale per block of q8_block_elems parameters.
  struct sizes {
    std::uint64_t per_param = sizeof(float);
    std::uint64_t quantized = 0;
    [[nodiscard]] std::uint64_t bytes(std::uint64_t n) const noexcept {
      return per_param * n + quantized * sizeof(float) * ((n + q8_block_elems - 1) / q8_block_elems);
    }
  };
  /// The sizes of `state`, or none when the text is not such a description.
  [[nodiscard]] static std::optional<sizes> state_sizes(std::string_view state) {
    sizes z;
    std::size_t arrays = 0;
    while (!state.empty()) {
      const auto comma = state.find(',');
      const std::string_view item = state.substr(0, comma);
      const auto colon = item.find(':');
      if (colon == std::string_view::npos || !valid_name(item.substr(0, colon)) || ++arrays > max_state_arrays)
        return std::nullopt;
      const std::string_view element = item.substr(colon + 1);
      bool known = false;
      for (const state_element e : {state_element::f32, state_element::bf16, state_element::q8, state_element::uq8})
        if (element == to_string(e)) {
          z.per_param += element_bytes(e);
          z.quantized += quantized(e) ? 1 : 0;
          known = true;
        }
      if (!known) return std::nullopt;
      if (comma == std::string_view::npos) break;
      state.remove_prefix(comma + 1);
      if (state.empty()) return std::nullopt;  // a trailing comma
    }
    return z;
  }

 private:
  // A rule's tag, an array's or an option's name: [A-Za-z0-9_-]+.
  [[nodiscard]] static bool valid_name(std::string_view s) noexcept {
    if (s.empty() || s.size() > 64) return false;
    for (const char c : s)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
        return false;
    return true;
  }

  template <class Bad>
  static std::uint64_t parse_u64(std::string_view s, const Bad& bad) {
    int base = 10;
    if (s.size() > 2 && s[0] == '0' && s[1] == 'x') {
      s.remove_prefix(2);
      base = 16;
    }
    std::uint64_t v = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty()) throw bad(fmt::format("bad number '{}'", s));
    return v;
  }
  template <class Bad>
  static double parse_double(std::string_view s, const Bad& bad) {
    const std::string copy(s);
    char* end = nullptr;
    const double v = std::strtod(copy.c_str(), &end);
    if (copy.empty() || end != copy.c_str() + copy.size()) throw bad(fmt::format("bad number '{}'", s));
    return v;
  }
};

}  // namespace strata
