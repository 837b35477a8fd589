#pragma once
/// prefix_claim: an optimizer's claim on its object prefix in one tier, process-wide, so that two
/// optimizers of one process never read and write the same objects ("<prefix>.sg-<i>") of one
/// tier object: the second is refused with a busy_error at construction. (Across processes the
/// tiers' own directory locks refuse the second owner.)

#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/core/error.hpp"

namespace strata {

/// See the file comment. Movable; the claim ends with its last owner.
class prefix_claim {
 public:
  prefix_claim() = default;
  /// Claims `prefix` in the tier at `tier` (named `tier_name` in the error).
  prefix_claim(const void* tier, std::string_view tier_name, std::string prefix) {
    std::lock_guard lock(mutex());
    if (!claims().emplace(tier, prefix).second)
      throw busy_error(fmt::format("tier '{}': object prefix '{}' is in use by another optimizer of this process (give "
                                   "each optimizer its own offload_options::object_prefix)",
                                   tier_name, prefix));
    key_ = {tier, std::move(prefix)};
  }
  prefix_claim(prefix_claim&& o) noexcept : key_(std::exchange(o.key_, {})) {}
  prefix_claim& operator=(prefix_claim&& o) noexcept {
    if (this != &o) {
      release();
      key_ = std::exchange(o.key_, {});
    }
    return *this;
  }
  prefix_claim(const prefix_claim&) = delete;
  prefix_claim& operator=(const prefix_claim&) = delete;
  ~prefix_claim() { release(); }

 private:
  using key = std::pair<const void*, std::string>;
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::set<key>& claims() {
    static std::set<key> s;
    return s;
  }
  void release() noexcept {
    if (key_.first == nullptr) return;
    std::lock_guard lock(mutex());
    claims().erase(key_);
    key_ = {};
  }
  key key_{};
};

}  // namespace strata
