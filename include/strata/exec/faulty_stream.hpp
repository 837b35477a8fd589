#pragma once
/// faulty<S> for streams: fails chosen pieces of a stream's work, as a GPU copy or kernel can
/// fail, to test that whoever drives the stream never commits work after a failure and recovers
/// with sync(). A failing piece of work is not run: a stream_error naming the stream, the
/// operation and its ordinal takes its place, which fails the stream (exec/stream.hpp). Rules pick
/// the n-th matching operation for k times, or a seeded random share of them.
///
///   strata::faulty<strata::host_stream> s("d2h");
///   s.inject({.op = strata::stream_op::copy_to_host, .after = 3});   // the 4th D2H copy fails

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/detail/fault_rules.hpp"
#include "strata/core/detail/faulty_fwd.hpp"
#include "strata/core/error.hpp"
#include "strata/exec/detail/stream_adaptor_base.hpp"
#include "strata/exec/stream.hpp"

namespace strata {

/// One injection rule for a faulty stream.
struct stream_fault {
  std::optional<stream_op> op{};  ///< only this kind of work; empty = any
  std::uint64_t after = 0;        ///< let this many matching operations pass first
  std::uint64_t times = 1;        ///< then fire this many times; 0 = every time
  double probability = 1.0;       ///< chance to fire on each eligible operation
};

template <class Inner>
  requires stream<std::remove_reference_t<Inner>>
class faulty<Inner> : public detail::stream_adaptor_base<Inner> {
  using base = detail::stream_adaptor_base<Inner>;

 public:
  template <class... Args>
  explicit faulty(Args&&... inner_args) : base(std::in_place, std::forward<Args>(inner_args)...) {}
  faulty(const faulty&) = delete;
  faulty& operator=(const faulty&) = delete;

  /// Adds a rule; rules are checked in the order added, the first that fires wins.
  void inject(stream_fault f) { rules_.inject(f); }
  /// Removes every rule.
  void clear() { rules_.clear(); }
  /// Seeds the generator behind `probability`.
  void seed(std::uint64_t s) { rules_.seed(s); }
  /// How many faults have fired.
  [[nodiscard]] std::uint64_t fired() const noexcept { return rules_.fired(); }

  void copy_to_device(std::span<std::byte> dst, std::span<const std::byte> src) {
    if (!fire(stream_op::copy_to_device, src.size())) this->inner_.copy_to_device(dst, src);
  }
  void copy_to_host(std::span<std::byte> dst, std::span<const std::byte> src) {
    if (!fire(stream_op::copy_to_host, src.size())) this->inner_.copy_to_host(dst, src);
  }
  void enqueue_host(host_task task) {
    if (!fire(stream_op::task, 0)) this->inner_.enqueue_host(std::move(task));
  }

 private:
  // Whether a rule fires for this operation; if so, enqueues the failure in its place.
  bool fire(stream_op op, std::size_t bytes) {
    const std::uint64_t ordinal = ++count_[static_cast<std::size_t>(op)];
    if (!rules_.match([op](const stream_fault& f) { return !f.op || *f.op == op; },
                      [](const stream_fault&, std::mt19937_64&) { return true; }))
      return false;
    std::string what = op == stream_op::task ? fmt::format("{} #{}", to_string(op), ordinal)
                                                  : fmt::format("{} #{} of {} bytes", to_string(op), ordinal, bytes);
    this->inner_.enqueue_host([stream = std::string(this->name()), what = std::move(what)] {
      throw stream_error(stream, what, "injected fault");
    });
    return true;
  }

  detail::fault_rules<stream_fault> rules_;
  std::atomic<std::uint64_t> count_[3] = {0, 0, 0};  // operations seen, per stream_op
};

}  // namespace strata
