#pragma once
/// Precondition checks that throw typed exceptions with formatted messages, and internal
/// assertions for invariants that no input can break.

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "strata/core/error.hpp"

/// Throws `Exception(fmt::format(fmt, args...))` unless `cond` holds. Use for anything a caller or
/// a configuration can get wrong:
///   STRATA_EXPECTS(grads.size() == size(), strata::config_error,
///                  "step(): got {} gradients for {} parameters", grads.size(), size());
#define STRATA_EXPECTS(cond, Exception, ...)                   \
  do {                                                         \
    if (!(cond)) [[unlikely]] {                                \
      throw Exception(::fmt::format(__VA_ARGS__));             \
    }                                                          \
  } while (false)

namespace strata::detail {
[[noreturn]] inline void assertion_failed(const char* expr, const char* file, int line) noexcept {
  std::fprintf(stderr, "strata: internal invariant violated: %s at %s:%d\n", expr, file, line);
  std::abort();
}
}  // namespace strata::detail

/// Aborts with file and line when an internal invariant is false: a bug in strata, never a user
/// error. Compiled out with STRATA_DISABLE_ASSERTS.
#ifdef STRATA_DISABLE_ASSERTS
#define STRATA_ASSERT(cond) ((void)0)
#else
#define STRATA_ASSERT(cond) \
  ((cond) ? (void)0 : ::strata::detail::assertion_failed(#cond, __FILE__, __LINE__))
#endif
