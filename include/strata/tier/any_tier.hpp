#pragma once
/// any_tier: a type-erased tier, for stacks chosen at run time (a list of paths in a config) and
/// for components that take any tier without being compiled once per tier stack (the subgroup
/// pipeline). Owns its tier (`any_tier::make<T>(args...)`, or from a unique_ptr) or refers to
/// one the caller keeps alive (`any_tier::ref(t)`). Movable; one virtual call per request.
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

class any_tier {
 public:
  /// Constructs a T in place and owns it.
  template <tier T, class... Args>
  [[nodiscard]] static any_tier make(Args&&... args) {
    return any_tier(std::in_place, std::make_unique<owning<T>>(std::forward<Args>(args)...));
  }
  /// Takes ownership of an existing tier.
  template <tier T>
  explicit any_tier(std::unique_ptr<T> t) : impl_(std::make_unique<holding<T>>(std::move(t))) {
    STRATA_EXPECTS(static_cast<holding<T>*>(impl_.get())->ptr != nullptr, config_error, "any_tier: null tier");
  }
  /// Refers to `t`, which must outlive this any_tier.
  template <tier T>
  [[nodiscard]] static any_tier ref(T& t) {
    return any_tier(std::in_place, std::make_unique<referring<T>>(t));
  }

  any_tier(any_tier&&) noexcept = default;
  any_tier& operator=(any_tier&&) noexcept = default;

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    return impl_->write(object, offset, bytes);
  }
  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    return impl_->read(object, offset, dst);
  }
  bool remove(std::string_view object) { return impl_->remove(object); }
  void flush() { impl_->flush(); }
  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const { return impl_->size(object); }
  [[nodiscard]] std::uint64_t capacity() const { return impl_->capacity(); }
  [[nodiscard]] std::uint64_t used() const { return impl_->used(); }
  [[nodiscard]] std::string_view name() const { return impl_->name(); }
  [[nodiscard]] tier_descriptor descriptor() const { return impl_->descriptor(); }

  /// Paths of the erased tier (1 unless it is a multipath).
  [[nodiscard]] std::size_t path_count() const { return impl_->path_count(); }
  /// One descriptor per path, in path order (bandwidths measured meanwhile included).
  [[nodiscard]] std::vector<tier_descriptor> path_descriptors() const { return impl_->path_descriptors(); }
  /// The path that holds `object`: 0 for a single-path tier; for a multipath, nullopt when it has
  /// not placed the object yet.
  [[nodiscard]] std::optional<std::size_t> path_of(std::string_view object) const { return impl_->path_of(object); }

  /// The erased tier if it is a T (owned or referred to), else null.
  template <tier T>
  [[nodiscard]] T* target() noexcept {
    return static_cast<T*>(impl_->target(typeid(T)));
  }

 private:
  struct iface {
    virtual ~iface() = default;
    virtual completion write(std::string_view, std::uint64_t, std::span<const std::byte>) = 0;
    virtual completion read(std::string_view, std::uint64_t, std::span<std::byte>) = 0;
    virtual bool remove(std::string_view) = 0;
    virtual void flush() = 0;
    [[nodiscard]] virtual std::optional<std::uint64_t> size(std::string_view) const = 0;
    [[nodiscard]] virtual std::uint64_t capacity() const = 0;
    [[nodiscard]] virtual std::uint64_t used() const = 0;
    [[nodiscard]] virtual std::string_view name() const = 0;
    [[nodiscard]] virtual tier_descriptor descriptor() const = 0;
    [[nodiscard]] virtual std::size_t path_count() const = 0;
    [[nodiscard]] virtual std::vector<tier_descriptor> path_descriptors() const = 0;
    [[nodiscard]] virtual std::optional<std::size_t> path_of(std::string_view) const = 0;
    [[nodiscard]] virtual void* target(const std::type_info&) noexcept = 0;
  };
  // One forwarding implementation over "how to reach the tier" (Access::get).
  template <class T, class Derived>
  struct forwarding : iface {
    T& t() { return static_cast<Derived*>(this)->get(); }
    const T& t() const { return static_cast<const Derived*>(this)->get(); }
    completion write(std::string_view o, std::uint64_t off, std::span<const std::byte> b) override {
      return t().write(o, off, b);
    }
    completion read(std::string_view o, std::uint64_t off, std::span<std::byte> d) override { return t().read(o, off, d); }
    bool remove(std::string_view o) override { return t().remove(o); }
    void flush() override { t().flush(); }
    [[nodiscard]] std::optional<std::uint64_t> size(std::string_view o) const override { return t().size(o); }
    [[nodiscard]] std::uint64_t capacity() const override { return t().capacity(); }
    [[nodiscard]] std::uint64_t used() const override { return t().used(); }
    [[nodiscard]] std::string_view name() const override { return t().name(); }
    [[nodiscard]] tier_descriptor descriptor() const override { return t().descriptor(); }
    [[nodiscard]] std::size_t path_count() const override {
      if constexpr (multi_path_tier<T>)
        return t().path_count();
      else
        return 1;
    }
    [[nodiscard]] std::vector<tier_descriptor> path_descriptors() const override {
      if constexpr (multi_path_tier<T>)
        return t().path_descriptors();
      else
        return {t().descriptor()};
    }
    [[nodiscard]] std::optional<std::size_t> path_of(std::string_view o) const override {
      if constexpr (multi_path_tier<T>)
        return t().path_of(o);
      else
        return std::size_t{0};
    }
    [[nodiscard]] void* target(const std::type_info& ti) noexcept override {
      return ti == typeid(T) ? static_cast<void*>(&t()) : nullptr;
    }
  };
  template <class T>
  struct owning final : forwarding<T, owning<T>> {
    template <class... Args>
    explicit owning(Args&&... args) : value(std::forward<Args>(args)...) {}
    T& get() { return value; }
    const T& get() const { return value; }
    T value;
  };
  template <class T>
  struct holding final : forwarding<T, holding<T>> {
    explicit holding(std::unique_ptr<T> p) : ptr(std::move(p)) {}
    T& get() { return *ptr; }
    const T& get() const { return *ptr; }
    std::unique_ptr<T> ptr;
  };
  template <class T>
  struct referring final : forwarding<T, referring<T>> {
    explicit referring(T& r) : value(&r) {}
    T& get() { return *value; }
    const T& get() const { return *value; }
    T* value;
  };

  // Tagged: the erased models are tiers themselves and must not reach the public constructor.
  any_tier(std::in_place_t, std::unique_ptr<iface> impl) : impl_(std::move(impl)) {}
  std::unique_ptr<iface> impl_;
};

static_assert(tier<any_tier>);
static_assert(multi_path_tier<any_tier>);

}  // namespace strata
