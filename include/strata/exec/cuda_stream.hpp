#pragma once
/// cuda_stream: the CUDA model of a stream (exec/stream.hpp): an RAII cudaStream_t whose copies
/// are cudaMemcpyAsync, whose host tasks are cudaLaunchHostFunc, and whose events are
/// cudaEvent_t paired with a completion that a host function fulfils. Also cuda_device_buffer,
/// device memory from cudaMalloc. Needs strata built with CUDA (STRATA_HAS_CUDA); compiles to
/// nothing otherwise. Ordinary C++ (no kernels): any translation unit can use it.
///
/// Errors. A CUDA call that fails when work is enqueued, and a host task that throws, fail the
/// stream: the error is kept and every event recorded afterwards completes with it, until sync()
/// rethrows and clears it. Copies and kernels enqueued after a failure still run (CUDA does not
/// skip them), as the stream contract allows. sync() also reports errors of the device itself
/// (cudaStreamSynchronize) as cuda_error.
///
/// Host tasks are cudaLaunchHostFunc (CUDA skips them after a device error); event completions
/// and the error hand-over of wait() are stream callbacks (cudaStreamAddCallback), which CUDA
/// runs with the stream's status even after a device error, so a faulting kernel fails the
/// events after it instead of leaving them pending. Both run on a CUDA driver thread and must not
/// call CUDA: continuations of an event's completion run there, so they must only record what
/// happened (strata's pipeline posts a message to its own thread).

#include "strata/core/config.hpp"

#if STRATA_HAS_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/core/cuda.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/exec/stream.hpp"

namespace strata {

namespace detail {
/// What a cuda_stream's host functions and its caller share: the first error since sync().
struct cuda_stream_state {
  std::mutex mutex;
  std::exception_ptr failed;
  void fail(std::exception_ptr e) noexcept {
    std::lock_guard lock(mutex);
    if (!failed) failed = std::move(e);
  }
  [[nodiscard]] std::exception_ptr error() noexcept {
    std::lock_guard lock(mutex);
    return failed;
  }
  [[nodiscard]] std::exception_ptr take() noexcept {
    std::lock_guard lock(mutex);
    return std::exchange(failed, nullptr);
  }
};
}  // namespace detail

/// An event of a cuda_stream: the cudaEvent_t other streams wait on, and the completion the host
/// waits on. Copies share the event.
class cuda_event {
 public:
  cuda_event() : done_(make_ready_completion()) {}

  /// An event recorded by someone else (a framework's backward on its own stream), which strata's
  /// streams can wait on (stream.wait) and which is never destroyed here: `event` must outlive
  /// every wait enqueued on it. It carries no error of its producer, and completion() is not a
  /// host wait for it (it is complete at once); ready() asks CUDA (cudaEventQuery).
  [[nodiscard]] static cuda_event wrap(cudaEvent_t event) {
    STRATA_EXPECTS(event != nullptr, config_error, "cuda_event::wrap: null cudaEvent_t");
    auto h = std::make_shared<handle>();
    h->event = event;
    h->owned = false;
    return cuda_event(std::move(h), make_ready_completion());
  }

  [[nodiscard]] bool ready() const {
    if (handle_ && !handle_->owned) return cudaEventQuery(handle_->event) != cudaErrorNotReady;
    return done_.ready();
  }
  [[nodiscard]] strata::completion completion() const { return done_; }
  /// The CUDA event (null for a default-constructed event, which is complete).
  [[nodiscard]] cudaEvent_t native() const noexcept { return handle_ ? handle_->event : nullptr; }
  /// Whether the CUDA event is destroyed with the last copy of this event (false: wrap()).
  [[nodiscard]] bool owns_event() const noexcept { return handle_ && handle_->owned; }

 private:
  friend class cuda_stream;
  struct handle {
    cudaEvent_t event = nullptr;
    bool owned = true;
    handle() = default;
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    ~handle() {
      if (event != nullptr && owned) (void)cudaEventDestroy(event);
    }
  };
  cuda_event(std::shared_ptr<handle> h, strata::completion c) : handle_(std::move(h)), done_(std::move(c)) {}
  std::shared_ptr<handle> handle_;
  strata::completion done_;
};

static_assert(stream_event<cuda_event>);

class cuda_stream {
 public:
  using event_type = cuda_event;

  /// A non-blocking stream on `device` (-1: the current device).
  explicit cuda_stream(std::string name = "cuda", int device = -1)
      : name_(std::move(name)), state_(std::make_shared<detail::cuda_stream_state>()) {
    if (device >= 0) STRATA_CUDA_TRY(cudaSetDevice(device));
    STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  /// A stream someone else created (a framework's current stream), used as strata's own but
  /// never synchronized or destroyed by this object: `stream` must outlive it and the work it
  /// enqueues. Errors of strata's work on it are reported by sync() as on an owned stream.
  [[nodiscard]] static std::unique_ptr<cuda_stream> wrap(cudaStream_t stream, std::string name = "foreign") {
    return std::unique_ptr<cuda_stream>(new cuda_stream(stream, std::move(name)));
  }

  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  /// Waits for the stream's work, then destroys it (a wrapped stream: neither).
  ~cuda_stream() {
    if (!owned_) return;
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  /// Whether this object created the CUDA stream (false: wrap()).
  [[nodiscard]] bool owns_stream() const noexcept { return owned_; }

  void copy_to_device(std::span<std::byte> dst, std::span<const std::byte> src) {
    copy("copy_to_device", dst, src, cudaMemcpyHostToDevice);
  }
  void copy_to_host(std::span<std::byte> dst, std::span<const std::byte> src) {
    copy("copy_to_host", dst, src, cudaMemcpyDeviceToHost);
  }

  void enqueue_host(host_task task) {
    auto* t = new host_call{std::move(task), state_};
    launch(&host_call::run, t, "enqueue_host", [t] { delete t; });
  }

  [[nodiscard]] cuda_event record() {
    auto h = std::make_shared<cuda_event::handle>();
    try {
      STRATA_CUDA_TRY(cudaEventCreateWithFlags(&h->event, cudaEventDisableTiming));
    } catch (...) {
      state_->fail(std::current_exception());
      return cuda_event(nullptr, make_ready_completion(state_->error()));
    }
    // The completion is fulfilled by a host function first and the CUDA event is recorded after
    // it, so a stream that waits on the event runs only once the completion has settled (wait()
    // relies on that to pass errors on).
    auto* p = new event_call{completion_promise{}, state_, name_};
    auto done = p->promise.get_future();
    add_callback(&event_call::run, p, "record", [p] {
      p->promise.set_exception(p->state->error());
      delete p;
    });
    if (const cudaError_t rc = cudaEventRecord(h->event, stream_); rc != cudaSuccess) {
      // Nobody may wait on an event that was never recorded: hand out a failed, complete one.
      fail_call(rc, "cudaEventRecord", __LINE__);
      return cuda_event(nullptr, make_ready_completion(state_->error()));
    }
    return cuda_event(std::move(h), std::move(done));
  }

  void wait(const cuda_event& e) {
    if (e.native() == nullptr) {  // complete already: pass on its error, if any
      if (auto err = e.completion().exception()) state_->fail(err);
      return;
    }
    if (const cudaError_t rc = cudaStreamWaitEvent(stream_, e.native(), 0); rc != cudaSuccess)
      fail_call(rc, "cudaStreamWaitEvent", __LINE__);
    auto* w = new wait_call{e.completion(), state_, name_};
    add_callback(&wait_call::run, w, "wait", [w] { delete w; });
  }

  /// Waits for the stream; rethrows the first error since the last sync (which it clears), else
  /// a device error the stream reports.
  void sync() {
    const auto err = state_->take();  // cleared even when the device reports an error too
    const cudaError_t rc = cudaStreamSynchronize(stream_);
    if (err) {
      (void)cudaGetLastError();
      std::rethrow_exception(err);
    }
    STRATA_CUDA_TRY(rc);
  }

  [[nodiscard]] std::string_view name() const noexcept { return name_; }
  /// The CUDA stream, for kernels launched on it.
  [[nodiscard]] cudaStream_t native() const noexcept { return stream_; }

 private:
  struct host_call {
    host_task task;
    std::shared_ptr<detail::cuda_stream_state> state;
    static void CUDART_CB run(void* p) noexcept {
      std::unique_ptr<host_call> self(static_cast<host_call*>(p));
      if (self->state->error()) return;  // as on host streams: nothing runs after a failure
      try {
        self->task();
      } catch (...) {
        self->state->fail(std::current_exception());
      }
    }
  };
  // A device error as a stream callback sees it (no CUDA call may name it there; sync() then
  // reports the full cuda_error).
  static void fail_from_status(detail::cuda_stream_state& state, const std::string& stream, cudaError_t status) noexcept {
    if (status == cudaSuccess) return;
    try {
      state.fail(std::make_exception_ptr(
          stream_error(stream, "device work", fmt::format("CUDA error {} (sync() names it)", static_cast<int>(status)))));
    } catch (...) {
      state.fail(std::current_exception());
    }
  }
  struct event_call {
    completion_promise promise;
    std::shared_ptr<detail::cuda_stream_state> state;
    std::string stream;
    static void CUDART_CB run(cudaStream_t, cudaError_t status, void* p) noexcept {
      std::unique_ptr<event_call> self(static_cast<event_call*>(p));
      fail_from_status(*self->state, self->stream, status);
      self->promise.complete(self->state->error());
    }
  };
  struct wait_call {
    strata::completion waited;
    std::shared_ptr<detail::cuda_stream_state> state;
    std::string stream;
    static void CUDART_CB run(cudaStream_t, cudaError_t status, void* p) noexcept {
      std::unique_ptr<wait_call> self(static_cast<wait_call*>(p));
      fail_from_status(*self->state, self->stream, status);
      if (auto err = self->waited.exception()) self->state->fail(err);
    }
  };

  // Launches a host function; when CUDA refuses, fails the stream and runs `undo` (which frees
  // the function's argument, completing what it would have completed).
  template <class Undo>
  void launch(void (*fn)(void*), void* arg, const char* what, Undo&& undo) {
    if (const cudaError_t rc = cudaLaunchHostFunc(stream_, fn, arg); rc != cudaSuccess) {
      fail_call(rc, what, __LINE__);
      undo();
    }
  }
  // A stream callback: runs with the stream's status, also after a device error.
  template <class Undo>
  void add_callback(cudaStreamCallback_t fn, void* arg, const char* what, Undo&& undo) {
    if (const cudaError_t rc = cudaStreamAddCallback(stream_, fn, arg, 0); rc != cudaSuccess) {
      fail_call(rc, what, __LINE__);
      undo();
    }
  }

  void fail_call(cudaError_t rc, const char* what, int line) noexcept {
    (void)cudaGetLastError();
    try {
      state_->fail(std::make_exception_ptr(cuda_error(static_cast<int>(rc), cudaGetErrorName(rc),
                                                      cudaGetErrorString(rc),
                                                      fmt::format("{} on stream '{}'", what, name_), __FILE__, line)));
    } catch (...) {
      state_->fail(std::current_exception());
    }
  }

  void copy(const char* what, std::span<std::byte> dst, std::span<const std::byte> src, cudaMemcpyKind kind) {
    STRATA_EXPECTS(dst.size() == src.size(), config_error, "stream '{}': {} of {} bytes into {} bytes", name_, what,
                   src.size(), dst.size());
    if (src.empty()) return;
    if (const cudaError_t rc = cudaMemcpyAsync(dst.data(), src.data(), src.size(), kind, stream_); rc != cudaSuccess)
      fail_call(rc, what, __LINE__);
  }

  cuda_stream(cudaStream_t foreign, std::string name)
      : name_(std::move(name)), state_(std::make_shared<detail::cuda_stream_state>()), stream_(foreign), owned_(false) {}

  std::string name_;
  std::shared_ptr<detail::cuda_stream_state> state_;
  cudaStream_t stream_ = nullptr;
  bool owned_ = true;
};

static_assert(stream<cuda_stream>);

/// Device memory from cudaMalloc, freed with cudaFree. Move-only.
class cuda_device_buffer {
 public:
  cuda_device_buffer() = default;
  explicit cuda_device_buffer(std::size_t bytes) : size_(bytes) {
    if (bytes > 0) STRATA_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&data_), bytes));
  }
  cuda_device_buffer(cuda_device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  cuda_device_buffer& operator=(cuda_device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  cuda_device_buffer(const cuda_device_buffer&) = delete;
  cuda_device_buffer& operator=(const cuda_device_buffer&) = delete;
  ~cuda_device_buffer() { release(); }

  [[nodiscard]] std::byte* data() noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace strata

#endif  // STRATA_HAS_CUDA
