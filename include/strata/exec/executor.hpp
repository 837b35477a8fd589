#pragma once
/// The `executor` concept: where a subgroup's update runs when it does not run on the CPU over
/// host memory. An executor owns three streams (h2d copies in, compute, d2h copies out: separate,
/// so that the copy of subgroup k+1 overlaps the kernel of subgroup k and both overlap the copy
/// out of k-1) and device memory under a budget, and says what host memory its copies need to
/// run at full speed (pinned for CUDA). It knows no optimizer: the update kernel belongs to
/// whoever drives it (offload/adamw_device.hpp enqueues AdamW on each model through its own
/// launch function: `launch(items, kernel(pool))` on the host, `launch(kernel(cudaStream_t))`
/// on CUDA).
///
/// Models: host_executor (exec/host_executor.hpp: "device" memory is host memory, streams are
/// worker threads, optionally paced to emulate PCIe and a GPU) and cuda_executor
/// (exec/cuda_executor.cuh, nvcc only).
///
/// Contract: device allocations never exceed device_budget() (capacity_error) and the executor
/// outlives them. Not thread-safe: one thread drives an executor.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "strata/core/host_memory.hpp"
#include "strata/exec/stream.hpp"

namespace strata {

/// The three streams of an executor.
enum class stream_role : std::uint8_t { h2d, compute, d2h };

[[nodiscard]] constexpr std::string_view to_string(stream_role r) noexcept {
  switch (r) {
    case stream_role::h2d: return "h2d";
    case stream_role::compute: return "compute";
    case stream_role::d2h: return "d2h";
  }
  return "unknown";
}

/// Owning device memory of an executor.
template <class B>
concept device_buffer = std::movable<B> && requires(B& b, const B& cb) {
  { b.data() } -> std::same_as<std::byte*>;
  { cb.size() } -> std::same_as<std::size_t>;
};

/// See the file comment.
template <class E>
concept executor = requires(E& e, const E& ce, std::size_t bytes) {
  requires stream<typename E::stream_type>;
  requires device_buffer<typename E::device_buffer>;
  { e.h2d() } -> std::same_as<typename E::stream_type&>;
  { e.compute() } -> std::same_as<typename E::stream_type&>;
  { e.d2h() } -> std::same_as<typename E::stream_type&>;
  { ce.staging() } -> std::same_as<host_memory_request>;
  { ce.device_budget() } -> std::same_as<std::uint64_t>;
  { ce.device_used() } -> std::same_as<std::uint64_t>;
  { e.allocate_device(bytes) } -> std::same_as<typename E::device_buffer>;
  { ce.name() } -> std::convertible_to<std::string_view>;
};

}  // namespace strata
