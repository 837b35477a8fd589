#pragma once
/// The `rate_limiter` concept: caps bytes per second rather than holders. Units are consumed,
/// not returned, so there is no release and no permit. Same naming as `limiter`: acquire(bytes)
/// blocks, try_acquire(bytes) never blocks, try_acquire_for(bytes, timeout) blocks at most
/// `timeout`. Every model may be shared by threads without a lock.

#include <chrono>
#include <concepts>
#include <cstdint>

namespace strata {

/// Paces transfers to a byte rate (an emulated PFS link, a polite share of a real one).
template <class R>
concept rate_limiter = requires(R& r, std::uint64_t bytes, std::chrono::milliseconds t) {
  { r.acquire(bytes) } -> std::same_as<void>;
  { r.try_acquire(bytes) } -> std::same_as<bool>;
  { r.try_acquire_for(bytes, t) } -> std::same_as<bool>;
};

}  // namespace strata
