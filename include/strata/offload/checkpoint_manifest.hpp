#pragma once
/// The manifest of an offloaded_adamw checkpoint: a small text file ("manifest") that names the
/// data file of the checkpoint and records everything needed to resume bit-identically (step
/// count, hyper-parameters as exact hexadecimal floats, the subgroup layout) plus one XXH3-64
/// checksum per subgroup. Its last line is the checksum of every line before it, so a truncated
/// or edited manifest is refused with integrity_error. It is published with write_file_atomic
/// (fsync), after the data file is fsync'ed: a reader sees the previous checkpoint or this one.
///
///   strata-offloaded-adamw-checkpoint 2
///   step 12
///   params 1000003
///   subgroup_elems 65536
///   sections 3
///   lr 0x1.0624dd2f1a9fcp-10
///   ... (beta1 beta2 eps weight_decay decoupled amsgrad maximize)
///   loss_scaling 1                    (dynamic loss scaling: whether it was on, its scale and
///   loss_scale 0x1p+16                 growth tracker; version 1 manifests have none of these
///   growth_tracker 37                  and are still read)
///   step_runs 2                       (steps each parameter has taken, as runs from a first
///   run 0 12                           parameter: param_steps; version 1 and 2 manifests have
///   run 4096 11                        none, every parameter then took `step`)
///   data state-12-5f3a9c.bin
///   data_bytes 12000036
///   sg 0 786432 0x1234abcd...        (subgroup, bytes, checksum; offsets follow in order)
///   checksum 0x9e3779b97f4a7c15

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/param_steps.hpp"
#include "strata/tier/checksummed.hpp"

namespace strata {

/// What a checkpoint manifest records.
struct checkpoint_manifest {
  static constexpr std::string_view magic = "strata-offloaded-adamw-checkpoint 3";
  static constexpr std::string_view magic_v2 = "strata-offloaded-adamw-checkpoint 2";
  static constexpr std::string_view magic_v1 = "strata-offloaded-adamw-checkpoint 1";
  std::uint64_t step = 0;
  std::uint64_t params = 0;
  std::uint64_t subgroup_elems = 0;
  std::uint64_t sections = 3;  ///< fp32 arrays per parameter: master, m, v (and max v with amsgrad)
  adamw_options options{};
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
    std::string body = fmt::format("{}\nstep {}\nparams {}\nsubgroup_elems {}\nsections {}\n", magic, step, params,
                                   subgroup_elems, sections);
    body += fmt::format("lr {:a}\nbeta1 {:a}\nbeta2 {:a}\neps {:a}\nweight_decay {:a}\n", options.lr, options.beta1,
                        options.beta2, options.eps, options.decay());
    body += fmt::format("decoupled {}\namsgrad {}\nmaximize {}\n", int(options.decoupled), int(options.amsgrad),
                        int(options.maximize));
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
    if (lines.empty() || (lines[0] != magic && lines[0] != magic_v2 && lines[0] != magic_v1))
      throw bad("not a strata offloaded_adamw checkpoint of a version this build reads (bad first line)");
    const bool v1 = lines[0] == magic_v1;
    const bool v3 = lines[0] == magic;
    i = 1;
    m.step = parse_u64(next("step"), bad);
    m.params = parse_u64(next("params"), bad);
    m.subgroup_elems = parse_u64(next("subgroup_elems"), bad);
    m.sections = parse_u64(next("sections"), bad);
    m.options.lr = parse_double(next("lr"), bad);
    m.options.beta1 = parse_double(next("beta1"), bad);
    m.options.beta2 = parse_double(next("beta2"), bad);
    m.options.eps = parse_double(next("eps"), bad);
    m.options.weight_decay = parse_double(next("weight_decay"), bad);
    m.options.decoupled = parse_u64(next("decoupled"), bad) != 0;
    m.options.amsgrad = parse_u64(next("amsgrad"), bad) != 0;
    m.options.maximize = parse_u64(next("maximize"), bad) != 0;
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
    if (v3) {
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
    if (m.subgroup_elems == 0 || (m.sections != 3 && m.sections != 4)) throw bad("bad layout");
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
    if (total != m.data_bytes || m.data_bytes != m.params * m.sections * sizeof(float))
      throw bad("subgroup sizes do not add up to the data size");
    return m;
  }

 private:
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
