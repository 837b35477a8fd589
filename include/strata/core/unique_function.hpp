#pragma once
/// strata::unique_function<R(Args...)>: a move-only callable wrapper (std::move_only_function is
/// C++23). Holds lambdas that own move-only state (a promise, a unique_ptr), which std::function
/// cannot. Calling an empty one is a bug (asserts).

#include <memory>
#include <type_traits>
#include <utility>

#include "strata/core/expects.hpp"

namespace strata {

template <class Signature>
class unique_function;

template <class R, class... Args>
class unique_function<R(Args...)> {
 public:
  unique_function() noexcept = default;
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, unique_function> && std::is_invocable_r_v<R, std::decay_t<F>&, Args...>)
  unique_function(F&& f) : impl_(std::make_unique<model<std::decay_t<F>>>(std::forward<F>(f))) {}  // NOLINT

  unique_function(unique_function&&) noexcept = default;
  unique_function& operator=(unique_function&&) noexcept = default;
  unique_function(const unique_function&) = delete;
  unique_function& operator=(const unique_function&) = delete;

  R operator()(Args... args) {
    STRATA_ASSERT(impl_ != nullptr);
    return impl_->call(std::forward<Args>(args)...);
  }
  explicit operator bool() const noexcept { return impl_ != nullptr; }

 private:
  struct base {
    virtual ~base() = default;
    virtual R call(Args... args) = 0;
  };
  template <class F>
  struct model final : base {
    template <class G>
    explicit model(G&& g) : fn(std::forward<G>(g)) {}
    R call(Args... args) override { return fn(std::forward<Args>(args)...); }
    F fn;
  };
  std::unique_ptr<base> impl_;
};

}  // namespace strata
