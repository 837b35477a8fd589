#include "cli.hpp"

#include <cmath>
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <strata/core/units.hpp>

namespace strata::bench {

namespace {
std::vector<command>& registry() {
  static std::vector<command> r;
  return r;
}
}  // namespace

registration::registration(command c) {
  auto& r = registry();
  r.insert(std::upper_bound(r.begin(), r.end(), c, [](const command& a, const command& b) { return a.name < b.name; }),
           c);
}

const std::vector<command>& commands() { return registry(); }

args::args(std::string command, const std::vector<std::string>& argv) : command_(std::move(command)) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (!a.starts_with("--") || a.size() == 2) throw usage_error(fmt::format("{}: unexpected argument '{}'", command_, a));
    std::string key = a.substr(2);
    std::optional<std::string> value;
    if (const auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key.resize(eq);
    } else if (i + 1 < argv.size() && !argv[i + 1].starts_with("--")) {
      value = argv[++i];
    }
    auto& o = options_[key];
    if (value)
      o.values.push_back(*value);
    else
      o.is_flag = true;
  }
}

args::option* args::find(std::string_view key) {
  const auto it = options_.find(key);
  if (it == options_.end()) return nullptr;
  it->second.used = true;
  return &it->second;
}

std::optional<std::string> args::get(std::string_view key) {
  auto* o = find(key);
  if (o == nullptr) return std::nullopt;
  if (o->values.empty()) throw usage_error(fmt::format("{}: --{} needs a value", command_, key));
  return o->values.back();
}

std::vector<std::string> args::get_all(std::string_view key) {
  auto* o = find(key);
  if (o == nullptr) return {};
  if (o->is_flag) throw usage_error(fmt::format("{}: --{} needs a value", command_, key));
  return o->values;
}

std::string args::get_or(std::string_view key, std::string_view fallback) {
  auto v = get(key);
  return v ? *v : std::string(fallback);
}

std::uint64_t args::size(std::string_view key, std::uint64_t fallback) {
  const auto v = get(key);
  if (!v) return fallback;
  try {
    return parse_size(*v);
  } catch (const config_error& e) {
    throw usage_error(fmt::format("{}: --{}: {}", command_, key, e.what()));
  }
}

std::uint64_t args::count(std::string_view key, std::uint64_t fallback) {
  const auto v = get(key);
  if (!v) return fallback;
  try {
    return parse_count(*v);
  } catch (const config_error& e) {
    throw usage_error(fmt::format("{}: --{}: {}", command_, key, e.what()));
  }
}

double parse_real(const std::string& text, std::string_view what) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || !std::isfinite(v))
    throw usage_error(fmt::format("{}: '{}' is not a number", what, text));
  return v;
}

double args::real(std::string_view key, double fallback) {
  const auto v = get(key);
  return v ? parse_real(*v, fmt::format("{}: --{}", command_, key)) : fallback;
}

std::string args::choice(std::string_view key, std::initializer_list<std::string_view> choices,
                         std::string_view fallback) {
  const auto v = get(key);
  if (!v) return std::string(fallback);
  if (std::find(choices.begin(), choices.end(), *v) == choices.end())
    throw usage_error(fmt::format("{}: --{} is '{}'; expected one of: {}", command_, key, *v, fmt::join(choices, ", ")));
  return *v;
}

bool args::flag(std::string_view key) {
  auto* o = find(key);
  if (o == nullptr) return false;
  if (!o->values.empty()) throw usage_error(fmt::format("{}: --{} takes no value", command_, key));
  return true;
}

void args::finish() const {
  for (const auto& [key, o] : options_)
    if (!o.used) throw usage_error(fmt::format("{}: unknown option --{} (see strata-bench {} --help)", command_, key, command_));
}

}  // namespace strata::bench
