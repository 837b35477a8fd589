#pragma once
/// traced<S>: measures when a stream is busy. Every copy and host task is bracketed by two stamps
/// taken in stream order (host tasks), so the interval between them is the time the stream spent
/// on that work, after any wait before it was satisfied. The adaptor adds the intervals up (busy
/// seconds, operations, bytes; readable from any thread) and, with a tracer, records each one as
/// a span on a track of its own named after the stream: a Chrome trace then has one row per
/// stream, under the threads' rows.
///
/// Cost: two host tasks per operation. On host streams that is two queue entries; on a CUDA
/// stream it is two host callbacks (a few microseconds each, during which the stream waits), so
/// use it to see where the time goes, not in production runs of small transfers.
///
/// Work enqueued on the wrapped stream directly (e.g. a kernel launched on a CUDA stream's native
/// handle) is measured when it is enqueued through bracket(op, bytes, enqueue).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "strata/core/trace.hpp"
#include "strata/exec/detail/stream_adaptor_base.hpp"
#include "strata/exec/stream.hpp"

namespace strata {

/// What a traced stream measured since construction (or reset()).
struct stream_activity {
  double busy_s = 0;            ///< seconds the stream spent on its operations (intervals never overlap)
  std::uint64_t operations = 0;  ///< copies and host tasks that ran
  std::uint64_t bytes = 0;       ///< bytes the copies moved
};

template <class Inner>
class traced : public detail::stream_adaptor_base<Inner> {
  using base = detail::stream_adaptor_base<Inner>;

 public:
  /// A stream whose operations are measured and, when `trace` is not null, recorded on a track
  /// named after the stream.
  template <class... Args>
  explicit traced(tracer* trace, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...),
        shared_(std::make_shared<shared>(trace, trace != nullptr ? trace->make_track(std::string(this->inner_.name())) : 0)) {}
  traced(const traced&) = delete;
  traced& operator=(const traced&) = delete;

  void copy_to_device(std::span<std::byte> dst, std::span<const std::byte> src) {
    bracket(stream_op::copy_to_device, src.size(), [&] { this->inner_.copy_to_device(dst, src); });
  }
  void copy_to_host(std::span<std::byte> dst, std::span<const std::byte> src) {
    bracket(stream_op::copy_to_host, src.size(), [&] { this->inner_.copy_to_host(dst, src); });
  }
  void enqueue_host(host_task task) {
    bracket(stream_op::task, 0, [&] { this->inner_.enqueue_host(std::move(task)); });
  }

  /// Measures whatever `enqueue()` enqueues on the wrapped stream as one operation of kind `op`.
  template <class F>
  void bracket(stream_op op, std::size_t bytes, F&& enqueue) {
    auto begin = std::make_shared<tracer::clock::time_point>();
    this->inner_.enqueue_host([begin] { *begin = tracer::clock::now(); });
    std::forward<F>(enqueue)();
    this->inner_.enqueue_host([s = shared_, begin, op, bytes] { s->done(op, bytes, *begin, tracer::clock::now()); });
  }

  /// What the stream did so far. Work still queued is not counted yet: sync() first for a total.
  [[nodiscard]] stream_activity activity() const noexcept {
    return {static_cast<double>(shared_->busy_ns.load()) * 1e-9, shared_->operations.load(), shared_->bytes.load()};
  }
  /// Starts the counts from zero (the trace keeps its spans).
  void reset() noexcept {
    shared_->busy_ns = 0;
    shared_->operations = 0;
    shared_->bytes = 0;
  }

 private:
  // Shared with the stamps in flight, so that they never refer to a destroyed adaptor.
  struct shared {
    shared(tracer* t, track_id k) : trace(t), track(k) {}
    void done(stream_op op, std::size_t n, tracer::clock::time_point begin, tracer::clock::time_point end) {
      busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count();
      operations += 1;
      bytes += n;
      if (trace != nullptr)
        trace->complete(track, to_string(op), begin, end,
                        n > 0 ? std::vector<trace_arg>{{"bytes", static_cast<std::int64_t>(n)}} : std::vector<trace_arg>{},
                        "stream");
    }
    tracer* trace;
    track_id track;
    std::atomic<std::int64_t> busy_ns{0};
    std::atomic<std::uint64_t> operations{0};
    std::atomic<std::uint64_t> bytes{0};
  };
  std::shared_ptr<shared> shared_;
};

}  // namespace strata
