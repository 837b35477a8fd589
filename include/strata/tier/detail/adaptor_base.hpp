#pragma once
/// The part every tier adaptor shares: it owns (or, with a reference type, refers to) the tier
/// it wraps and forwards what it does not change. Adaptors construct their inner tier in place
/// from trailing constructor arguments, because tiers own threads and are not movable:
///   strata::throttled<strata::file_tier> t(strata::throttle_options{...}, strata::file_tier_options{...});

#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/tier/tier.hpp"

namespace strata::detail {

template <class Inner>
class adaptor_base {
 public:
  using inner_type = std::remove_reference_t<Inner>;
  static_assert(tier<inner_type>, "an adaptor wraps a strata::tier");

  template <class... Args>
  explicit adaptor_base(std::in_place_t, Args&&... args) : inner_(std::forward<Args>(args)...) {}

  /// The wrapped tier.
  [[nodiscard]] inner_type& inner() noexcept { return inner_; }
  [[nodiscard]] const inner_type& inner() const noexcept { return inner_; }

  bool remove(std::string_view object) { return inner_.remove(object); }
  void flush() { inner_.flush(); }
  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const { return inner_.size(object); }
  [[nodiscard]] std::uint64_t capacity() const { return inner_.capacity(); }
  [[nodiscard]] std::uint64_t used() const { return inner_.used(); }
  [[nodiscard]] std::string_view name() const { return inner_.name(); }
  [[nodiscard]] tier_descriptor descriptor() const { return inner_.descriptor(); }

 protected:
  Inner inner_;
};

}  // namespace strata::detail
