#pragma once
/// The eviction policy's erasure pair (core/erased.hpp): `eviction_policy_ref` refers to a policy
/// the caller keeps alive; `any_eviction_policy` owns one (move-only), so that the subgroup
/// pipeline's machinery is compiled once per executor, not once per policy. One call through a
/// table per cache event, a handful per subgroup and step. A default-constructed
/// any_eviction_policy holds the policy of a cache without entries, which refuses every entry
/// (empty(): a cache without entries needs no policy).

#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "strata/core/erased.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/policy/eviction_policy.hpp"

namespace strata {

namespace detail {

/// The policy of a cache without entries: it holds nothing and refuses to (what an
/// any_eviction_policy holds when none was given).
struct no_eviction_policy {
  void on_step_begin(std::span<const std::size_t>, std::span<const std::size_t>) {}
  void on_insert(std::size_t) { refuse(); }
  void on_access(std::size_t) { refuse(); }
  void on_erase(std::size_t) noexcept {}
  void pin(std::size_t) { refuse(); }
  void unpin(std::size_t) noexcept {}
  [[nodiscard]] std::optional<std::size_t> victim() const { return std::nullopt; }
  [[nodiscard]] bool contains(std::size_t) const { return false; }
  [[nodiscard]] std::size_t size() const { return 0; }

 private:
  [[noreturn]] static void refuse() { throw config_error("any_eviction_policy: no policy was given"); }
};

/// The table of an eviction policy (core/erased.hpp).
struct eviction_policy_table {
  static constexpr std::string_view concept_name = "eviction policy";
  erased_ops ops_;
  void (*on_step_begin)(void*, std::span<const std::size_t>, std::span<const std::size_t>);
  void (*on_insert)(void*, std::size_t);
  void (*on_access)(void*, std::size_t);
  void (*on_erase)(void*, std::size_t) noexcept;
  void (*pin)(void*, std::size_t);
  void (*unpin)(void*, std::size_t) noexcept;
  std::optional<std::size_t> (*victim)(const void*);
  bool (*contains)(const void*, std::size_t);
  std::size_t (*size)(const void*);
  std::optional<bool> (*keeps_for_next_step)(const void*, std::size_t, std::size_t);  // (nullopt: no plan)
  [[nodiscard]] const erased_ops& ops() const noexcept { return ops_; }

  template <class P>
  static constexpr eviction_policy_table of() {
    return {erased_ops_of<P>,
            [](void* p, std::span<const std::size_t> o, std::span<const std::size_t> n) {
              static_cast<P*>(p)->on_step_begin(o, n);
            },
            [](void* p, std::size_t id) { static_cast<P*>(p)->on_insert(id); },
            [](void* p, std::size_t id) { static_cast<P*>(p)->on_access(id); },
            [](void* p, std::size_t id) noexcept { static_cast<P*>(p)->on_erase(id); },
            [](void* p, std::size_t id) { static_cast<P*>(p)->pin(id); },
            [](void* p, std::size_t id) noexcept { static_cast<P*>(p)->unpin(id); },
            [](const void* p) { return static_cast<const P*>(p)->victim(); },
            [](const void* p, std::size_t id) { return static_cast<const P*>(p)->contains(id); },
            [](const void* p) { return static_cast<const P*>(p)->size(); },
            [](const void* p, std::size_t id, std::size_t capacity) -> std::optional<bool> {
              if constexpr (eviction_policy_with_plan<P>)
                return static_cast<const P*>(p)->keeps_for_next_step(id, capacity);
              else
                return std::nullopt;
            }};
  }
};
template <class P>
inline constexpr eviction_policy_table eviction_policy_table_of = eviction_policy_table::of<P>();

/// The policy's members, written once for the ref and the owning value.
template <class D>
class eviction_policy_calls {
 public:
  void on_step_begin(std::span<const std::size_t> order, std::span<const std::size_t> next) {
    t().on_step_begin(self(), order, next);
  }
  void on_insert(std::size_t id) { t().on_insert(self(), id); }
  void on_access(std::size_t id) { t().on_access(self(), id); }
  void on_erase(std::size_t id) noexcept {
    if (void* p = self_or_null()) t().on_erase(p, id);
  }
  void pin(std::size_t id) { t().pin(self(), id); }
  void unpin(std::size_t id) noexcept {
    if (void* p = self_or_null()) t().unpin(p, id);
  }
  [[nodiscard]] std::optional<std::size_t> victim() const { return t().victim(self()); }
  [[nodiscard]] bool contains(std::size_t id) const { return t().contains(self(), id); }
  [[nodiscard]] std::size_t size() const { return t().size(self()); }
  /// The held policy's keeps_for_next_step (eviction_policy_with_plan), or nullopt when it has
  /// none.
  [[nodiscard]] std::optional<bool> keeps_for_next_step(std::size_t id, std::size_t capacity) const {
    return t().keeps_for_next_step(self(), id, capacity);
  }
  /// Whether it holds no policy (a cache without entries).
  [[nodiscard]] bool empty() const noexcept { return static_cast<const D*>(this)->template target<no_eviction_policy>() != nullptr; }

 private:
  [[nodiscard]] void* self() const { return static_cast<const D*>(this)->erased_self(); }
  [[nodiscard]] void* self_or_null() const noexcept { return static_cast<const D*>(this)->erased_self_or_null(); }
  [[nodiscard]] const eviction_policy_table& t() const noexcept { return static_cast<const D*>(this)->erased_table(); }
};

}  // namespace detail

class any_eviction_policy;

/// A non-owning reference to an eviction policy, which must outlive it. Copyable.
class eviction_policy_ref : public detail::eviction_policy_calls<eviction_policy_ref> {
 public:
  template <eviction_policy P>
    requires(!std::same_as<P, eviction_policy_ref> && !std::same_as<P, any_eviction_policy>)
  eviction_policy_ref(P& p) noexcept  // NOLINT(google-explicit-constructor): a reference to a policy is one
      : ref_(&p, detail::eviction_policy_table_of<P>) {}
  eviction_policy_ref(void* self, const detail::eviction_policy_table& t) noexcept : ref_(self, t) {}

  /// The policy if it is a P, else null.
  template <class P>
  [[nodiscard]] P* target() const noexcept {
    return ref_.template target<P>();
  }

 private:
  friend class detail::eviction_policy_calls<eviction_policy_ref>;
  [[nodiscard]] void* erased_self() const noexcept { return ref_.self(); }
  [[nodiscard]] void* erased_self_or_null() const noexcept { return ref_.self(); }
  [[nodiscard]] const detail::eviction_policy_table& erased_table() const noexcept { return ref_.table(); }
  detail::erased_ref<detail::eviction_policy_table> ref_;
};

/// An owning, move-only eviction policy (see the file comment).
class any_eviction_policy : public detail::eviction_policy_calls<any_eviction_policy> {
 public:
  /// No policy (a cache without entries).
  any_eviction_policy() : any_eviction_policy(detail::no_eviction_policy{}) {}
  /// Owns a copy of `p` (any eviction_policy but an any_eviction_policy).
  template <eviction_policy P>
    requires(!std::same_as<std::remove_cvref_t<P>, any_eviction_policy>)
  any_eviction_policy(P p)  // NOLINT(google-explicit-constructor): a policy is one
      : box_(std::make_unique<P>(std::move(p)), detail::eviction_policy_table_of<P>) {}
  any_eviction_policy(any_eviction_policy&&) noexcept = default;
  any_eviction_policy& operator=(any_eviction_policy&&) noexcept = default;

  /// The policy if it is a P, else null.
  template <class P>
  [[nodiscard]] P* target() const noexcept {
    return box_.template target<P>();
  }
  operator eviction_policy_ref() const { return {box_.self(), box_.table()}; }  // NOLINT(google-explicit-constructor)

 private:
  friend class detail::eviction_policy_calls<any_eviction_policy>;
  [[nodiscard]] void* erased_self() const { return box_.self(); }
  [[nodiscard]] void* erased_self_or_null() const noexcept { return box_.empty() ? nullptr : box_.self(); }
  [[nodiscard]] const detail::eviction_policy_table& erased_table() const noexcept { return box_.table(); }
  detail::erased_box<detail::eviction_policy_table> box_;
};

static_assert(eviction_policy<detail::no_eviction_policy>);
static_assert(eviction_policy<eviction_policy_ref>);
static_assert(eviction_policy<any_eviction_policy>);

}  // namespace strata
