#pragma once
// What http_client sends and gets back: a request, its response, and the header-line parser that
// curl's path and the direct receive path share.
#include "strata/core/config.hpp"

#if STRATA_HAS_S3

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace strata::detail {

/// The longest body kept as text (an error document or a listing page is far smaller).
inline constexpr std::size_t max_text_body = 4 << 20;

struct http_request {
  std::string method = "GET";  ///< GET, HEAD, PUT, POST or DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::span<const std::byte> body;  ///< PUT/POST body; the caller keeps it alive until the callback
  std::span<std::byte> receive;     ///< where a 2xx body goes (it must fit); else into response.body
  std::chrono::steady_clock::time_point not_before{};  ///< not started before (a retry's backoff)
  /// Cut off at this time wherever it is (queued, connecting, sending, waiting for or receiving
  /// the answer): a transport error with `deadline_passed` set. max(): none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  /// Also cut off this long after it goes out on a connection (0: no limit). Time spent queued
  /// behind other requests of the client does not count.
  std::chrono::milliseconds time_limit{0};
};

struct http_response {
  long status = 0;  ///< 0: no response (see transport_error)
  std::vector<std::pair<std::string, std::string>> headers;  ///< names in lower case
  std::string body;                                           ///< a body that did not go to `receive`
  std::uint64_t received = 0;                                 ///< bytes placed in request.receive
  bool overflow = false;                                      ///< the 2xx body did not fit `receive`
  int transport_code = 0;                                     ///< CURLcode; 0 when a response came whole
  std::string transport_error;
  bool deadline_passed = false;  ///< the request was cut off by its deadline or time limit
  /// The deadline the request ran under once it went out on a connection (its own, or its time
  /// limit counted from then, whichever came first); max(): none, or it never went out.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  /// The value of a header (name in lower case), or nullptr.
  [[nodiscard]] const std::string* header(std::string_view lower_name) const noexcept {
    for (const auto& [k, v] : headers)
      if (k == lower_name) return &v;
    return nullptr;
  }
};

/// A configured time as messages show it: "250 ms", "20 s", "1.5 s".
inline std::string format_timeout(std::chrono::milliseconds t) {
  if (t.count() < 1000) return fmt::format("{} ms", t.count());
  if (t.count() % 1000 == 0) return fmt::format("{} s", t.count() / 1000);
  return fmt::format("{:.1f} s", static_cast<double>(t.count()) / 1000.0);
}

/// A time that went by, as messages show it: "3.0 s".
inline std::string format_elapsed(std::chrono::steady_clock::duration d) {
  return fmt::format("{:.1f} s", std::chrono::duration<double>(d).count());
}

/// Appends a "Name: value" header line to `out` with the name in lower case and the value trimmed;
/// false for a line that is not a header (a status line, an empty line).
inline bool parse_header_line(std::string_view line, std::vector<std::pair<std::string, std::string>>& out) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  const auto colon = line.find(':');
  if (colon == std::string_view::npos || line.starts_with("HTTP/")) return false;
  std::string name(line.substr(0, colon));
  for (char& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  out.emplace_back(std::move(name), std::string(value));
  return true;
}

}  // namespace strata::detail

#endif  // STRATA_HAS_S3
