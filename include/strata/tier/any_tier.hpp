#pragma once
/// The tier's erasure pair (core/erased.hpp): `tier_ref` refers to any tier the caller keeps alive
/// (copyable, never empty); `any_tier` owns one (`any_tier::make<T>(args...)`, or from a
/// unique_ptr; move-only), for stacks chosen at run time (a list of paths in a config) and for
/// components that take any tier without being compiled once per tier stack (the subgroup
/// pipeline). `any_tier::ref(t)` is an any_tier that owns a tier_ref to t (a tier_ref is a tier).
/// One call through a table of function pointers per request.
///
/// It also answers the path queries of the erased tier: a multipath (or an any_tier over one)
/// has one path per inner tier, with its descriptor, and knows which path holds an object; any
/// other tier is one path, which holds every object.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <typeinfo>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/completion.hpp"
#include "strata/core/erased.hpp"
#include "strata/core/expects.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// A tier made of several paths (multipath, dynamic_multipath, any_tier): it names them and says
/// which one holds an object.
template <class T>
concept multi_path_tier = tier<T> && requires(const T& t, std::string_view object) {
  { t.path_count() } -> std::convertible_to<std::size_t>;
  { t.path_descriptors() } -> std::same_as<std::vector<tier_descriptor>>;
  { t.path_of(object) } -> std::same_as<std::optional<std::size_t>>;
};

namespace detail {

/// The table of a tier (see the file comment).
struct tier_table {
  static constexpr std::string_view concept_name = "tier";
  erased_ops ops_;
  completion (*write)(void*, std::string_view, std::uint64_t, std::span<const std::byte>);
  completion (*read)(void*, std::string_view, std::uint64_t, std::span<std::byte>);
  bool (*remove)(void*, std::string_view);
  void (*flush)(void*);
  std::optional<std::uint64_t> (*size)(const void*, std::string_view);
  std::uint64_t (*capacity)(const void*);
  std::uint64_t (*used)(const void*);
  std::string_view (*name)(const void*);
  tier_descriptor (*descriptor)(const void*);
  std::size_t (*path_count)(const void*);
  std::vector<tier_descriptor> (*path_descriptors)(const void*);
  std::optional<std::size_t> (*path_of)(const void*, std::string_view);
  // The object if it is of the type, looking through erased references (any_tier::ref).
  void* (*target)(void*, const std::type_info&) noexcept;

  [[nodiscard]] const erased_ops& ops() const noexcept { return ops_; }

  template <class T>
  static constexpr tier_table of() {
    return {
        erased_ops_of<T>,
        [](void* p, std::string_view o, std::uint64_t off, std::span<const std::byte> b) {
          return static_cast<T*>(p)->write(o, off, b);
        },
        [](void* p, std::string_view o, std::uint64_t off, std::span<std::byte> d) {
          return static_cast<T*>(p)->read(o, off, d);
        },
        [](void* p, std::string_view o) { return static_cast<T*>(p)->remove(o); },
        [](void* p) { static_cast<T*>(p)->flush(); },
        [](const void* p, std::string_view o) { return static_cast<const T*>(p)->size(o); },
        [](const void* p) { return static_cast<const T*>(p)->capacity(); },
        [](const void* p) { return static_cast<const T*>(p)->used(); },
        [](const void* p) { return static_cast<const T*>(p)->name(); },
        [](const void* p) { return static_cast<const T*>(p)->descriptor(); },
        [](const void* p) -> std::size_t {
          if constexpr (multi_path_tier<T>)
            return static_cast<const T*>(p)->path_count();
          else
            return 1;
        },
        [](const void* p) -> std::vector<tier_descriptor> {
          if constexpr (multi_path_tier<T>)
            return static_cast<const T*>(p)->path_descriptors();
          else
            return {static_cast<const T*>(p)->descriptor()};
        },
        [](const void* p, std::string_view o) -> std::optional<std::size_t> {
          if constexpr (multi_path_tier<T>)
            return static_cast<const T*>(p)->path_of(o);
          else
            return std::size_t{0};
        },
        [](void* p, const std::type_info& ti) noexcept -> void* {
          if (ti == typeid(T)) return p;
          if constexpr (requires(T& t) { t.erased_target(ti); })
            return static_cast<T*>(p)->erased_target(ti);
          else
            return nullptr;
        },
    };
  }
};

template <class T>
inline constexpr tier_table tier_table_of = tier_table::of<T>();

/// The tier's members, written once for tier_ref and any_tier: `D` gives self() and table().
template <class D>
class tier_calls {
 public:
  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    return t().write(self(), object, offset, bytes);
  }
  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    return t().read(self(), object, offset, dst);
  }
  bool remove(std::string_view object) { return t().remove(self(), object); }
  void flush() { t().flush(self()); }
  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const { return t().size(self(), object); }
  [[nodiscard]] std::uint64_t capacity() const { return t().capacity(self()); }
  [[nodiscard]] std::uint64_t used() const { return t().used(self()); }
  [[nodiscard]] std::string_view name() const { return t().name(self()); }
  [[nodiscard]] tier_descriptor descriptor() const { return t().descriptor(self()); }

  /// Paths of the erased tier (1 unless it is a multipath).
  [[nodiscard]] std::size_t path_count() const { return t().path_count(self()); }
  /// One descriptor per path, in path order (bandwidths measured meanwhile included).
  [[nodiscard]] std::vector<tier_descriptor> path_descriptors() const { return t().path_descriptors(self()); }
  /// The path that holds `object`: 0 for a single-path tier; for a multipath, nullopt when it has
  /// not placed the object yet.
  [[nodiscard]] std::optional<std::size_t> path_of(std::string_view object) const {
    return t().path_of(self(), object);
  }

  /// The erased tier if it is a T (owned or referred to), else null.
  template <tier T>
  [[nodiscard]] T* target() noexcept {
    return static_cast<T*>(erased_target(typeid(T)));
  }
  /// As target(), by type_info (what an erasure holding this one looks through).
  [[nodiscard]] void* erased_target(const std::type_info& ti) noexcept {
    void* p = static_cast<const D*>(this)->erased_self_or_null();
    return p == nullptr ? nullptr : t().target(p, ti);
  }

 private:
  [[nodiscard]] void* self() const { return static_cast<const D*>(this)->erased_self(); }
  [[nodiscard]] const tier_table& t() const noexcept { return static_cast<const D*>(this)->erased_table(); }
};

}  // namespace detail

/// A non-owning reference to a tier, which must outlive it. Copyable; two pointers; a tier itself.
class tier_ref : public detail::tier_calls<tier_ref> {
 public:
  /// Refers to `t` (for an any_tier, to the tier it holds).
  template <tier T>
    requires(!std::derived_from<T, detail::tier_calls<T>>)
  tier_ref(T& t) noexcept  // NOLINT(google-explicit-constructor): a reference to a tier is one
      : ref_(&t, detail::tier_table_of<T>) {}
  tier_ref(void* self, const detail::tier_table& table) noexcept : ref_(self, table) {}

 private:
  friend class detail::tier_calls<tier_ref>;
  [[nodiscard]] void* erased_self() const noexcept { return ref_.self(); }
  [[nodiscard]] void* erased_self_or_null() const noexcept { return ref_.self(); }
  [[nodiscard]] const detail::tier_table& erased_table() const noexcept { return ref_.table(); }
  detail::erased_ref<detail::tier_table> ref_;
};

/// An owning, move-only tier (see the file comment).
class any_tier : public detail::tier_calls<any_tier> {
 public:
  /// Constructs a T in place and owns it.
  template <tier T, class... Args>
  [[nodiscard]] static any_tier make(Args&&... args) {
    return any_tier(std::make_unique<T>(std::forward<Args>(args)...));
  }
  /// Takes ownership of an existing tier.
  template <tier T>
  explicit any_tier(std::unique_ptr<T> t) : box_(std::move(t), detail::tier_table_of<T>) {}
  /// Refers to `t`, which must outlive this any_tier (it owns a tier_ref).
  template <tier T>
  [[nodiscard]] static any_tier ref(T& t) {
    return any_tier(std::make_unique<tier_ref>(t));
  }

  any_tier(any_tier&&) noexcept = default;
  any_tier& operator=(any_tier&&) noexcept = default;

  /// A reference to the tier held.
  operator tier_ref() const { return {box_.self(), box_.table()}; }  // NOLINT(google-explicit-constructor)

 private:
  friend class detail::tier_calls<any_tier>;
  [[nodiscard]] void* erased_self() const { return box_.self(); }
  [[nodiscard]] void* erased_self_or_null() const noexcept { return box_.empty() ? nullptr : box_.self(); }
  [[nodiscard]] const detail::tier_table& erased_table() const noexcept { return box_.table(); }
  detail::erased_box<detail::tier_table> box_;
};

static_assert(tier<tier_ref>);
static_assert(multi_path_tier<tier_ref>);
static_assert(tier<any_tier>);
static_assert(multi_path_tier<any_tier>);

}  // namespace strata
