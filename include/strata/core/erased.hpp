#pragma once
/// The one way strata erases the type of a model of a concept, after rmm and cccl's
/// `resource_ref` / `any_resource` pair. For a concept X:
/// - a table of plain function pointers, built once per model type at compile time;
/// - `X_ref`: non-owning, copyable, never empty: an object pointer and the table. The object must
///   outlive it. What a component takes when it uses an object it does not own.
/// - `any_X`: owning, move-only: the object (on the heap, so its address is stable) and the table.
///   Never empty once made; using one that was moved from is a config_error. Converts to X_ref.
/// Both forward every call through the same table, so a model's behaviour cannot differ between
/// them, and both give the object back with `target<T>()` (null unless it is a T).
///
/// This header holds what every pair shares: `erased_ops` (destroy and type, the first thing a
/// table gives through `ops()`), `erased_ref<Table>` and `erased_box<Table>`. A Table names its
/// concept for messages (`static constexpr std::string_view concept_name`).

#include <concepts>
#include <memory>
#include <string_view>
#include <typeinfo>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"

namespace strata::detail {

/// What every table gives: how to destroy an owned object and what type it is.
struct erased_ops {
  void (*destroy)(void*) noexcept;
  const std::type_info& (*type)() noexcept;
};

template <class T>
inline constexpr erased_ops erased_ops_of{[](void* p) noexcept { delete static_cast<T*>(p); },
                                          []() noexcept -> const std::type_info& { return typeid(T); }};

template <class Table>
concept erased_table = requires(const Table& t) {
  { t.ops() } -> std::same_as<const erased_ops&>;
  { Table::concept_name } -> std::convertible_to<std::string_view>;
};

/// Non-owning: (object, table). Copyable; never empty.
template <class Table>
class erased_ref {
 public:
  erased_ref(void* self, const Table& table) noexcept : self_(self), table_(&table) {}

  [[nodiscard]] void* self() const noexcept { return self_; }
  [[nodiscard]] const Table& table() const noexcept { return *table_; }
  /// The object if it is a T, else null.
  template <class T>
  [[nodiscard]] T* target() const noexcept {
    return table_->ops().type() == typeid(T) ? static_cast<T*>(self_) : nullptr;
  }

 private:
  void* self_;
  const Table* table_;
};

/// Owning: (object on the heap, table). Move-only; empty only once moved from.
template <class Table>
class erased_box {
 public:
  template <class T>
  erased_box(std::unique_ptr<T> object, const Table& table) : self_(object.get()), table_(&table) {
    STRATA_EXPECTS(self_ != nullptr, config_error, "{}: null object", Table::concept_name);
    (void)object.release();  // owned from here: table.ops().destroy deletes it as a T
  }
  erased_box(erased_box&& o) noexcept : self_(std::exchange(o.self_, nullptr)), table_(o.table_) {}
  erased_box& operator=(erased_box&& o) noexcept {
    if (this != &o) {
      reset();
      self_ = std::exchange(o.self_, nullptr);
      table_ = o.table_;
    }
    return *this;
  }
  erased_box(const erased_box&) = delete;
  erased_box& operator=(const erased_box&) = delete;
  ~erased_box() { reset(); }

  /// The object; a config_error once moved from.
  [[nodiscard]] void* self() const {
    STRATA_EXPECTS(self_ != nullptr, config_error, "{}: used after it was moved from", Table::concept_name);
    return self_;
  }
  [[nodiscard]] const Table& table() const noexcept { return *table_; }
  [[nodiscard]] bool empty() const noexcept { return self_ == nullptr; }
  template <class T>
  [[nodiscard]] T* target() const noexcept {
    return self_ != nullptr && table_->ops().type() == typeid(T) ? static_cast<T*>(self_) : nullptr;
  }

 private:
  void reset() noexcept {
    if (self_ != nullptr) table_->ops().destroy(std::exchange(self_, nullptr));
  }
  void* self_;
  const Table* table_;
};

}  // namespace strata::detail
