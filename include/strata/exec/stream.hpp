#pragma once
/// The `stream` concept: an in-order queue of work that moves bytes between host and device
/// memory and runs host tasks, and the `stream_event` concept: a point in a stream that other
/// streams and the host can wait for. Modelled on CUDA streams and events, so that the same
/// pipeline code runs on a GPU (cuda_stream) and on worker threads (host_stream) in CI.
///
/// Contract, for every model:
/// - Work runs in the order it was enqueued; `copy_to_device(dst, src)` copies host bytes into
///   device memory, `copy_to_host(dst, src)` the other way; both spans stay valid (and `src`
///   unchanged) until the stream has run the copy. `enqueue_host(task)` runs a short host task in
///   stream order (it must not enqueue work on, or wait for, this stream).
/// - `record()` returns an event that completes when all work enqueued before it has run.
///   `wait(e)` makes work enqueued afterwards wait for `e` (of any stream of the same model); the
///   host is not blocked. `sync()` blocks the host until all enqueued work has run.
/// - Errors are typed exceptions (stream_error, cuda_error, or whatever a host task threw). Once
///   work fails, every event recorded after it completes with that error, and `wait` passes a
///   failed event's error on to the waiting stream; later work may be skipped (host models) or
///   still run (CUDA copies and kernels), so nothing after a failure may be relied on.
///   `sync()` rethrows the first error since the last sync() and clears it: the stream is usable
///   again. Precondition violations (mismatched copy sizes) throw config_error at the call.
/// - Calls are made from one thread at a time (the pipeline's); events may be read from any.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "strata/core/completion.hpp"
#include "strata/core/unique_function.hpp"

namespace strata {

/// A task a stream runs on the host, in stream order. Throwing fails the stream.
using host_task = unique_function<void()>;

/// What a stream does with a piece of work (for fault injection, recording and tracing).
enum class stream_op : std::uint8_t { copy_to_device, copy_to_host, task };

[[nodiscard]] constexpr std::string_view to_string(stream_op op) noexcept {
  switch (op) {
    case stream_op::copy_to_device: return "copy_to_device";
    case stream_op::copy_to_host: return "copy_to_host";
    case stream_op::task: return "task";
  }
  return "unknown";
}

/// A point in a stream: `ready()` polls without blocking; `completion()` completes (with the
/// stream's error, if work before the point failed) when the stream has run everything before it.
template <class E>
concept stream_event = std::copy_constructible<E> && requires(const E& e) {
  { e.ready() } -> std::same_as<bool>;
  { e.completion() } -> std::same_as<completion>;
};

/// An in-order work queue; see the contract in this header's comment.
template <class S>
concept stream = requires(S& s, const S& cs, std::span<std::byte> dst, std::span<const std::byte> src, host_task fn,
                          const typename S::event_type& e) {
  requires stream_event<typename S::event_type>;
  { s.copy_to_device(dst, src) } -> std::same_as<void>;
  { s.copy_to_host(dst, src) } -> std::same_as<void>;
  { s.enqueue_host(std::move(fn)) } -> std::same_as<void>;
  { s.record() } -> std::same_as<typename S::event_type>;
  { s.wait(e) } -> std::same_as<void>;
  { s.sync() } -> std::same_as<void>;
  { cs.name() } -> std::convertible_to<std::string_view>;
};

}  // namespace strata
