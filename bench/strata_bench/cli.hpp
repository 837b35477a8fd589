#pragma once
// The strata-bench command line: subcommands register themselves (one .cpp each), options are
// "--key value" or "--flag", and every mistake is a usage_error that main() prints on one line
// with exit code 2.
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/error.hpp>

namespace strata::bench {

/// A bad command line: printed as "strata-bench: <message>", exit code 2.
struct usage_error : strata::config_error {
  using config_error::config_error;
};

/// A finite decimal number, the whole of `text` ("0.25", "1e-3"); usage_error naming `what` otherwise.
[[nodiscard]] double parse_real(const std::string& text, std::string_view what);

/// Parsed options of one subcommand. Every accessor marks its key as used; finish() rejects
/// options no accessor asked for, so a typo never passes silently.
class args {
 public:
  args(std::string command, const std::vector<std::string>& argv);

  /// The last value of --key, if given.
  [[nodiscard]] std::optional<std::string> get(std::string_view key);
  /// Every value of a repeatable --key, in order.
  [[nodiscard]] std::vector<std::string> get_all(std::string_view key);
  [[nodiscard]] std::string get_or(std::string_view key, std::string_view fallback);
  /// A byte size ("1GiB", "512MiB"): see strata::parse_size.
  [[nodiscard]] std::uint64_t size(std::string_view key, std::uint64_t fallback);
  /// A count ("2e9", "500M"): see strata::parse_count.
  [[nodiscard]] std::uint64_t count(std::string_view key, std::uint64_t fallback);
  /// A finite number (see parse_real).
  [[nodiscard]] double real(std::string_view key, double fallback);
  /// One of `choices`.
  [[nodiscard]] std::string choice(std::string_view key, std::initializer_list<std::string_view> choices,
                                   std::string_view fallback);
  /// Whether the value-less --key was given.
  [[nodiscard]] bool flag(std::string_view key);
  /// Throws usage_error naming the first option that no accessor consumed.
  void finish() const;

  [[nodiscard]] const std::string& command() const noexcept { return command_; }

 private:
  struct option {
    std::vector<std::string> values;  // empty for a flag
    bool is_flag = false;
    bool used = false;
  };
  option* find(std::string_view key);
  std::string command_;
  std::map<std::string, option, std::less<>> options_;
};

/// A subcommand: `name` on the command line, `summary` in the list, `usage` for --help.
struct command {
  std::string_view name;
  std::string_view summary;
  std::string_view usage;
  int (*run)(args&);
};

/// Registers a subcommand at static-initialization time: `static registration r{{...}};`.
struct registration {
  explicit registration(command c);
};

/// The registered subcommands, sorted by name.
[[nodiscard]] const std::vector<command>& commands();

}  // namespace strata::bench
