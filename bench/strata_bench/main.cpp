// strata-bench: the benchmark tool. `strata-bench --help` lists the subcommands; each is a file
// in this folder that registers itself (see cli.hpp).
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <strata/core/env.hpp>

#include "cli.hpp"

namespace {
void list_commands(std::FILE* to) {
  fmt::print(to, "usage: strata-bench <command> [options]   (strata-bench <command> --help for its options)\n\ncommands:\n");
  for (const auto& c : strata::bench::commands()) fmt::print(to, "  {:<10} {}\n", c.name, c.summary);
}
}  // namespace

int main(int argc, char** argv) {
  using strata::bench::usage_error;
  if (argc < 2) {
    list_commands(stderr);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    list_commands(stdout);
    return 0;
  }
  const strata::bench::command* cmd = nullptr;
  for (const auto& c : strata::bench::commands())
    if (c.name == name) cmd = &c;
  if (cmd == nullptr) {
    fmt::print(stderr, "strata-bench: unknown command '{}' (see strata-bench --help)\n", name);
    return 2;
  }
  std::vector<std::string> rest(argv + 2, argv + argc);
  for (const auto& a : rest)
    if (a == "--help" || a == "-h") {
      fmt::print("usage: strata-bench {} {}\n", cmd->name, cmd->usage);
      return 0;
    }
  for (const auto& var : strata::unknown_env_variables())
    fmt::print(stderr, "strata-bench: warning: {} is not a strata variable (misspelt?); it is ignored\n", var);
  try {
    strata::check_env_variables();
    strata::bench::args a(std::string(name), rest);
    return cmd->run(a);
  } catch (const strata::config_error& e) {  // usage_error is one; so is a bad size or option value
    fmt::print(stderr, "strata-bench: {}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "strata-bench {}: out of host memory (try a smaller --params or --size)\n", name);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "strata-bench {}: {}\n", name, e.what());
    return 1;
  }
}
