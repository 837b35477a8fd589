#pragma once
/// any_eviction_policy: an eviction policy chosen at run time, made the same way as any_tier:
/// it owns any model of `eviction_policy` and forwards every call (one virtual call per cache
/// event, a handful per subgroup and step). The subgroup pipeline takes its cache policy this
/// way, so its machinery is compiled once per executor, not once per policy. Empty when
/// default-constructed (empty(): a cache without entries needs no policy).

#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/policy/eviction_policy.hpp"

namespace strata {

class any_eviction_policy {
 public:
  /// No policy.
  any_eviction_policy() noexcept = default;
  /// Owns a copy of `p` (any eviction_policy but an any_eviction_policy).
  template <eviction_policy P>
    requires(!std::same_as<std::remove_cvref_t<P>, any_eviction_policy>)
  any_eviction_policy(P p)  // NOLINT(google-explicit-constructor): a policy is one
      : impl_(std::make_unique<model<P>>(std::move(p))) {}

  any_eviction_policy(any_eviction_policy&&) noexcept = default;
  any_eviction_policy& operator=(any_eviction_policy&&) noexcept = default;

  void on_step_begin(std::span<const std::size_t> order, std::span<const std::size_t> next) {
    get().on_step_begin(order, next);
  }
  void on_insert(std::size_t id) { get().on_insert(id); }
  void on_access(std::size_t id) { get().on_access(id); }
  void on_erase(std::size_t id) noexcept {
    if (impl_) impl_->on_erase(id);
  }
  void pin(std::size_t id) { get().pin(id); }
  void unpin(std::size_t id) noexcept {
    if (impl_) impl_->unpin(id);
  }
  [[nodiscard]] std::optional<std::size_t> victim() const { return get().victim(); }
  [[nodiscard]] bool contains(std::size_t id) const { return impl_ && impl_->contains(id); }
  [[nodiscard]] std::size_t size() const { return impl_ ? impl_->size() : 0; }

  /// Whether it holds no policy.
  [[nodiscard]] bool empty() const noexcept { return impl_ == nullptr; }
  /// The policy if it is a P, else null.
  template <eviction_policy P>
  [[nodiscard]] P* target() noexcept {
    return impl_ ? static_cast<P*>(impl_->target(typeid(P))) : nullptr;
  }

 private:
  struct iface {
    virtual ~iface() = default;
    virtual void on_step_begin(std::span<const std::size_t>, std::span<const std::size_t>) = 0;
    virtual void on_insert(std::size_t) = 0;
    virtual void on_access(std::size_t) = 0;
    virtual void on_erase(std::size_t) noexcept = 0;
    virtual void pin(std::size_t) = 0;
    virtual void unpin(std::size_t) noexcept = 0;
    [[nodiscard]] virtual std::optional<std::size_t> victim() const = 0;
    [[nodiscard]] virtual bool contains(std::size_t) const = 0;
    [[nodiscard]] virtual std::size_t size() const = 0;
    [[nodiscard]] virtual void* target(const std::type_info&) noexcept = 0;
  };
  template <class P>
  struct model final : iface {
    explicit model(P p) : policy(std::move(p)) {}
    void on_step_begin(std::span<const std::size_t> o, std::span<const std::size_t> n) override {
      policy.on_step_begin(o, n);
    }
    void on_insert(std::size_t id) override { policy.on_insert(id); }
    void on_access(std::size_t id) override { policy.on_access(id); }
    void on_erase(std::size_t id) noexcept override { policy.on_erase(id); }
    void pin(std::size_t id) override { policy.pin(id); }
    void unpin(std::size_t id) noexcept override { policy.unpin(id); }
    [[nodiscard]] std::optional<std::size_t> victim() const override { return policy.victim(); }
    [[nodiscard]] bool contains(std::size_t id) const override { return policy.contains(id); }
    [[nodiscard]] std::size_t size() const override { return policy.size(); }
    [[nodiscard]] void* target(const std::type_info& ti) noexcept override {
      return ti == typeid(P) ? static_cast<void*>(&policy) : nullptr;
    }
    P policy;
  };

  iface& get() const {
    STRATA_EXPECTS(impl_ != nullptr, config_error, "any_eviction_policy: no policy was given");
    return *impl_;
  }

  std::unique_ptr<iface> impl_;
};

static_assert(eviction_policy<any_eviction_policy>);

}  // namespace strata
