#pragma once
/// `rw_limiter<L>`: the permits for reads and for writes on one resource, either shared (one cap
/// for both: a PFS link that is saturated by either) or separate (a cap each: a device whose reads
/// and writes do not compete much), chosen by configuration rather than by type.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/sync/limiter.hpp"
#include "strata/sync/node_limiter.hpp"

namespace strata {

/// Which way a transfer moves data, relative to the tier it touches.
enum class io_direction : std::uint8_t { read, write };

/// Whether reads and writes draw on one set of permits or on one set each.
enum class rw_sharing : std::uint8_t { shared, separate };

/// Hands out the limiter to use for a read or a write. Thread-safe as L is.
template <limiter L>
class rw_limiter {
 public:
  /// Reads and writes share `both`.
  explicit rw_limiter(std::shared_ptr<L> both) : reads_(both), writes_(std::move(both)) {
    STRATA_EXPECTS(reads_ != nullptr, config_error, "rw_limiter: no limiter given");
  }
  /// Reads use `reads`, writes use `writes`.
  rw_limiter(std::shared_ptr<L> reads, std::shared_ptr<L> writes)
      : reads_(std::move(reads)), writes_(std::move(writes)) {
    STRATA_EXPECTS(reads_ != nullptr && writes_ != nullptr, config_error, "rw_limiter: no limiter given");
  }

  [[nodiscard]] L& get(io_direction d) const noexcept { return d == io_direction::read ? *reads_ : *writes_; }
  [[nodiscard]] L& reads() const noexcept { return *reads_; }
  [[nodiscard]] L& writes() const noexcept { return *writes_; }
  [[nodiscard]] rw_sharing sharing() const noexcept {
    return reads_ == writes_ ? rw_sharing::shared : rw_sharing::separate;
  }

 private:
  std::shared_ptr<L> reads_;
  std::shared_ptr<L> writes_;
};

/// Node-wide read/write permits: `name` for both when shared, `name`.read and `name`.write when
/// separate (`permits` each). Every process on the node must choose the same sharing.
[[nodiscard]] inline rw_limiter<node_limiter> make_node_rw_limiter(const std::string& name, std::size_t permits,
                                                                   rw_sharing sharing,
                                                                   const std::filesystem::path& directory = {}) {
  if (sharing == rw_sharing::shared)
    return rw_limiter<node_limiter>(std::make_shared<node_limiter>(name, permits, directory));
  return {std::make_shared<node_limiter>(name + ".read", permits, directory),
          std::make_shared<node_limiter>(name + ".write", permits, directory)};
}

}  // namespace strata
