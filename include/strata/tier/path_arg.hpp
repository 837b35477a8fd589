#pragma once
/// path_arg: what a path given on a command line or in a config names: a directory, an object
/// store prefix ("s3://bucket/prefix"), or host memory ("host", where the caller allows it). Every
/// tool and front parses its paths here, so that none takes "s3:" for the name of a directory:
/// text that looks like a URL and is not one strata reads is a config_error naming it, and
/// where a directory named so is meant, "./s3:x" says it.

#include <filesystem>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "strata/core/error.hpp"

namespace strata {

/// What a path names.
enum class path_kind : unsigned char { directory, object_store, host };

/// A parsed path (see the file comment).
struct path_arg {
  path_kind kind = path_kind::directory;
  std::filesystem::path directory{};  ///< kind directory
  std::string url{};                  ///< kind object_store: "s3://bucket/prefix" (checked in full by the S3 tier)
};

/// Parses `text`, the path `what` names (an option, "path 2"): config_error naming both when it
/// is empty, looks like a URL of another scheme or a malformed "s3:" one, or has no bucket.
[[nodiscard]] inline path_arg parse_path_arg(std::string_view text, std::string_view what, bool allow_host = false) {
  const auto bad = [&](std::string_view why) {
    return config_error(fmt::format("{}: '{}' {}", what, text, why));
  };
  if (text.empty()) throw config_error(fmt::format("{}: the path is empty", what));
  if (text.find('\0') != std::string_view::npos)  // (shown up to it: a message is a C string)
    throw config_error(fmt::format("{}: '{}\\0...' holds a NUL character", what, text.substr(0, text.find('\0'))));
  if (allow_host && text == "host") return {path_kind::host, {}, {}};
  // A scheme: letters, digits, '+', '-', '.' before the first ':' (as RFC 3986 says).
  const auto colon = text.find(':');
  bool scheme = colon != std::string_view::npos && colon > 0;
  for (std::size_t i = 0; scheme && i < colon; ++i) {
    const char c = text[i];
    scheme = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && ((c >= '0' && c <= '9') || c == '+' ||
                                                                            c == '-' || c == '.'));
  }
  if (!scheme) return {path_kind::directory, std::filesystem::path(text), {}};
  const std::string_view name = text.substr(0, colon);
  if (name == "s3") {
    if (text.substr(colon, 3) != "://")
      throw bad("is not an object store URL (s3://bucket/prefix); for a directory of that name write ./" +
                std::string(text));
    const std::string_view rest = text.substr(colon + 3);
    if (rest.empty() || rest.front() == '/') throw bad("names no bucket (s3://bucket/prefix)");
    return {path_kind::object_store, {}, std::string(text)};
  }
  if (text.substr(colon, 3) == "://" || name == "S3" || name == "file" || name == "http" || name == "https" ||
      name == "gs" || name == "az" || name == "hdfs")
    throw bad("is a URL of a kind strata does not take (directories and s3://bucket/prefix only); for a directory "
              "of that name write ./" + std::string(text));
  return {path_kind::directory, std::filesystem::path(text), {}};
}

}  // namespace strata
