#pragma once
/// The paths of a tier stack as the optimizer's statistics see them: a multipath has one path per
/// inner tier (its descriptors and which path holds an object), any other tier is one path.

#include <cstddef>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/tier/tier.hpp"

namespace strata::detail {

template <class T>
concept dynamic_paths = requires(T& t, std::size_t i) {
  { t.path_count() } -> std::convertible_to<std::size_t>;
  { t.path(i).descriptor() } -> std::same_as<tier_descriptor>;
};

template <class T>
concept static_paths = requires(T& t) {
  { std::remove_cvref_t<T>::path_count() } -> std::convertible_to<std::size_t>;
  { t.template path<0>().descriptor() } -> std::same_as<tier_descriptor>;
};

template <class T, std::size_t... I>
std::vector<tier_descriptor> static_path_descriptors(T& t, std::index_sequence<I...>) {
  return {t.template path<I>().descriptor()...};
}

/// One descriptor per path of `t`.
template <class T>
[[nodiscard]] std::vector<tier_descriptor> path_descriptors(T& t) {
  if constexpr (dynamic_paths<T>) {
    std::vector<tier_descriptor> d;
    for (std::size_t i = 0; i < t.path_count(); ++i) d.push_back(t.path(i).descriptor());
    return d;
  } else if constexpr (static_paths<T>) {
    return static_path_descriptors(t, std::make_index_sequence<std::remove_cvref_t<T>::path_count()>{});
  } else {
    return {t.descriptor()};
  }
}

/// The path of `t` that holds `object`: 0 for a single-path tier, nullopt for an object a
/// multipath has not placed yet.
template <class T>
[[nodiscard]] std::optional<std::size_t> placed_path(const T& t, std::string_view object) {
  if constexpr (requires { { t.path_of(object) } -> std::same_as<std::optional<std::size_t>>; })
    return t.path_of(object);
  else
    return std::size_t{0};
}

/// The path of `t` that holds `object` (0 for a single-path tier or an unknown object).
template <class T>
[[nodiscard]] std::size_t path_index(const T& t, std::string_view object) {
  if constexpr (requires { { t.path_of(object) } -> std::same_as<std::optional<std::size_t>>; })
    return t.path_of(object).value_or(0);
  else
    return 0;
}

}  // namespace strata::detail
