#pragma once
/// The completion of a tier request. Tiers return `io_future` and complete `io_promise`; both are
/// the general strata::completion and strata::completion_promise (core/completion.hpp), under the
/// names the tier layer has always used.

#include <exception>
#include <utility>

#include "strata/core/completion.hpp"

namespace strata {

/// A tier request's completion (see core/completion.hpp for the contract).
using io_future = completion;
/// The completing side of a tier request.
using io_promise = completion_promise;

/// A tier request that has already completed (successfully, or with `e`).
[[nodiscard]] inline io_future make_ready_io_future(std::exception_ptr e = nullptr) {
  return make_ready_completion(std::move(e));
}

/// Runs `f()` now and returns a completed io_future that carries its exception, if any.
template <class F>
[[nodiscard]] io_future run_as_io_future(F&& f) {
  return run_as_completion(std::forward<F>(f));
}

}  // namespace strata
