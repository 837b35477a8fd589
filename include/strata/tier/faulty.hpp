#pragma once
/// faulty<Tier>: injects failures into a tier for tests: EIO, ENOSPC, short transfers, delays
/// and bit flips, at chosen requests (the n-th matching one, for k times) or at random (with a
/// seeded generator, so a failing test reproduces). Faults never touch objects other than the
/// one the failing request names.
///
///   strata::faulty<strata::file_tier> t(file_opts);
///   t.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = "sg-3", .after = 2});

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/core/detail/fault_rules.hpp"
#include "strata/core/detail/faulty_fwd.hpp"
#include "strata/core/error.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/detail/adaptor_base.hpp"
#include "strata/tier/detail/inflight_counter.hpp"
#include "strata/tier/detail/timer_thread.hpp"

namespace strata {

/// What an injected fault does.
enum class fault_kind : std::uint8_t {
  eio,             ///< the request fails with io_error (EIO) and does not reach the tier
  enospc,          ///< the request fails with capacity_error (ENOSPC) and does not reach the tier
  short_transfer,  ///< only a prefix (half, rounded down to 4 KiB blocks) is transferred, then io_error (EIO)
  delay,           ///< the request succeeds `delay` later than it would
  bit_flip,        ///< one bit of the data is flipped: in what is stored (write) or returned (read)
};

/// Which requests a fault applies to.
enum class fault_op : std::uint8_t { read, write, any };

/// One injection rule.
struct fault {
  fault_kind kind = fault_kind::eio;
  fault_op op = fault_op::any;
  std::string object;         ///< only this object; empty = any
  std::uint64_t after = 0;    ///< let this many matching requests pass first
  std::uint64_t times = 1;    ///< then fire this many times; 0 = every time
  double probability = 1.0;   ///< chance to fire on each eligible request
  std::chrono::microseconds delay{0};  ///< for fault_kind::delay
};

template <class Inner>
  requires tier<std::remove_reference_t<Inner>>
class faulty<Inner> : public detail::adaptor_base<Inner> {
  using base = detail::adaptor_base<Inner>;

 public:
  template <class... Args>
  explicit faulty(Args&&... inner_args) : base(std::in_place, std::forward<Args>(inner_args)...) {}
  faulty(const faulty&) = delete;
  faulty& operator=(const faulty&) = delete;
  ~faulty() { inflight_.wait_zero(); }

  /// Adds a rule; rules are checked in the order added, the first that fires wins.
  void inject(fault f) { rules_.inject(std::move(f)); }
  /// Removes every rule.
  void clear() { rules_.clear(); }
  /// Seeds the generator behind `probability` and the choice of the flipped bit.
  void seed(std::uint64_t s) { rules_.seed(s); }
  /// How many faults have fired.
  [[nodiscard]] std::uint64_t fired() const noexcept { return rules_.fired(); }

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    const auto f = match(fault_op::write, object, bytes.size());
    if (!f) return this->inner_.write(object, offset, bytes);
    switch (f->kind) {
      case fault_kind::eio: return failed(io_error("pwrite (injected fault)", where(object), offset, EIO));
      case fault_kind::enospc:
        return failed(capacity_error(fmt::format("pwrite {} at offset {} (injected fault): {}", where(object).string(),
                                                 offset, detail::errno_text(ENOSPC))));
      case fault_kind::short_transfer: {
        const auto half = short_length(bytes.size());
        return chain(this->inner_.write(object, offset, bytes.first(half)),
                     io_error("pwrite (injected short write)", where(object), offset + half, EIO));
      }
      case fault_kind::delay: return delayed(this->inner_.write(object, offset, bytes), f->delay);
      case fault_kind::bit_flip: {
        // Store a corrupted copy; the caller's bytes stay as they were.
        auto copy = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
        if (!copy->empty()) flip((*copy)[f->bit / 8 % copy->size()], f->bit);
        auto fut = this->inner_.write(object, offset, *copy);
        return then(std::move(fut), [copy](std::exception_ptr e) { return e; });  // the copy lives until then
      }
    }
    return this->inner_.write(object, offset, bytes);
  }

  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    const auto f = match(fault_op::read, object, dst.size());
    if (!f) return this->inner_.read(object, offset, dst);
    switch (f->kind) {
      case fault_kind::eio:
      case fault_kind::enospc: return failed(io_error("pread (injected fault)", where(object), offset, EIO));
      case fault_kind::short_transfer: {
        const auto half = short_length(dst.size());
        return chain(this->inner_.read(object, offset, dst.first(half)),
                     io_error("pread (injected short read)", where(object), offset + half, EIO));
      }
      case fault_kind::delay: return delayed(this->inner_.read(object, offset, dst), f->delay);
      case fault_kind::bit_flip:
        return then(this->inner_.read(object, offset, dst), [dst, bit = f->bit](std::exception_ptr e) {
          if (!e && !dst.empty()) flip(dst[bit / 8 % dst.size()], bit);
          return e;
        });
    }
    return this->inner_.read(object, offset, dst);
  }

 private:
  struct firing {
    fault_kind kind;
    std::chrono::microseconds delay;
    std::uint64_t bit;  // which bit to flip, drawn from the seeded generator
  };

  std::optional<firing> match(fault_op op, std::string_view object, std::uint64_t bytes) {
    return rules_.match(
        [&](const fault& f) { return (f.op == fault_op::any || f.op == op) && (f.object.empty() || f.object == object); },
        [&](const fault& f, std::mt19937_64& rng) {
          const std::uint64_t bits = bytes == 0 ? 1 : bytes * 8;
          return firing{f.kind, f.delay, std::uniform_int_distribution<std::uint64_t>(0, bits - 1)(rng)};
        });
  }

  std::filesystem::path where(std::string_view object) const {
    return std::filesystem::path(std::string(this->inner_.name())) / std::string(object);
  }

  // Devices stop short on block boundaries, so the prefix is whole 4 KiB blocks when it can be.
  static std::uint64_t short_length(std::uint64_t n) noexcept {
    const std::uint64_t half = n / 2;
    return half >= 4096 ? half / 4096 * 4096 : half;
  }

  static void flip(std::byte& b, std::uint64_t bit) noexcept { b ^= static_cast<std::byte>(1U << (bit % 8)); }

  template <class E>
  static completion failed(E e) {
    return make_ready_completion(std::make_exception_ptr(std::move(e)));
  }

  // Completes with `f(inner's error)` once `inner` is done, so nothing touches the caller's
  // memory after the returned future completes.
  template <class F>
  completion then(completion inner, F f) {
    completion_promise p;
    auto out = p.get_future();
    inflight_.add();
    auto sp = std::make_shared<completion_promise>(std::move(p));
    inner.on_complete([this, sp, f = std::move(f)](std::exception_ptr e) mutable {
      sp->complete(f(std::move(e)));
      inflight_.done();
    });
    return out;
  }

  // Completes with `err` (or the inner error) once `inner` is done.
  template <class E>
  completion chain(completion inner, E err) {
    return then(std::move(inner), [err = std::move(err)](std::exception_ptr e) {
      return e ? e : std::make_exception_ptr(err);
    });
  }

  completion delayed(completion inner, std::chrono::microseconds d) {
    completion_promise p;
    auto out = p.get_future();
    inflight_.add();
    auto sp = std::make_shared<completion_promise>(std::move(p));
    inner.on_complete([this, sp, d](std::exception_ptr e) {
      timer_.at(detail::timer_thread::clock::now() + d, [this, sp, e] {
        sp->complete(e);
        inflight_.done();
      });
    });
    return out;
  }

  detail::fault_rules<fault> rules_;
  detail::timer_thread timer_{"faulty"};
  detail::inflight_counter inflight_;  // destroyed first
};

static_assert(tier<faulty<any_tier>>);
static_assert(tier<faulty<any_tier&>>);

}  // namespace strata
