#pragma once
/// One-line notices for things a user should know but that are not errors (a filesystem that
/// refuses O_DIRECT, a backend that fell back). They go to stderr as "strata: <text>" unless the
/// application installs its own handler (a logger, or a test that captures them).

#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

namespace detail {
struct notice_sink {
  std::mutex mutex;
  std::function<void(std::string_view)> handler;
};
inline notice_sink& notices() {
  static notice_sink s;
  return s;
}
}  // namespace detail

/// Replaces the notice handler; an empty function restores the default (stderr). Returns the
/// previous handler.
inline std::function<void(std::string_view)> set_notice_handler(std::function<void(std::string_view)> h) {
  auto& s = detail::notices();
  std::lock_guard lock(s.mutex);
  return std::exchange(s.handler, std::move(h));
}

/// Emits one notice. Never throws: a failing handler must not fail the I/O that reports.
inline void notice(std::string_view text) noexcept {
  auto& s = detail::notices();
  std::lock_guard lock(s.mutex);
  try {
    if (s.handler) {
      s.handler(text);
      return;
    }
  } catch (...) {
  }
  std::fprintf(stderr, "strata: %.*s\n", static_cast<int>(text.size()), text.data());
}

}  // namespace strata
