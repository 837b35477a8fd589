#pragma once
/// The `executor` concept: where a subgroup's update runs when it does not run on the CPU over
/// host memory. An executor owns three streams (h2d copies in, compute, d2h copies out: separate,
/// so that the copy of subgroup k+1 overlaps the kernel of subgroup k and both overlap the copy
/// out of k-1), device memory, and the AdamW kernel on its compute stream. It also says what
/// host memory its copies need to run at full speed (pinned for CUDA).
///
/// Models: host_executor (exec/host_executor.hpp: "device" memory is host memory, streams are
/// worker threads, optionally paced to emulate PCIe and a GPU) and cuda_executor
/// (exec/cuda_executor.cuh, nvcc only).
///
/// Contract: enqueue_update(group, k) enqueues on compute() the update of one group whose spans
/// are device memory of this executor (allocate_device), bit-identical to adamw_update_cpu on
/// the same inputs. Device allocations never exceed device_budget() (capacity_error). Not
/// thread-safe: one thread drives an executor.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "strata/core/half.hpp"
#include "strata/exec/stream.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/tier/host_memory.hpp"

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
concept executor = requires(E& e, const E& ce, std::size_t bytes, const adamw_step_params& k,
                            const adamw_group<float, bf16>& g32, const adamw_group<bf16, bf16>& gb,
                            const adamw_group<fp16, fp16>& gh) {
  requires stream<typename E::stream_type>;
  requires device_buffer<typename E::device_buffer>;
  { e.h2d() } -> std::same_as<typename E::stream_type&>;
  { e.compute() } -> std::same_as<typename E::stream_type&>;
  { e.d2h() } -> std::same_as<typename E::stream_type&>;
  { ce.staging() } -> std::same_as<host_memory_request>;
  { ce.device_budget() } -> std::same_as<std::uint64_t>;
  { ce.device_used() } -> std::same_as<std::uint64_t>;
  { e.allocate_device(bytes) } -> std::same_as<typename E::device_buffer>;
  { e.enqueue_update(g32, k) } -> std::same_as<void>;
  { e.enqueue_update(gb, k) } -> std::same_as<void>;
  { e.enqueue_update(gh, k) } -> std::same_as<void>;
  { ce.name() } -> std::convertible_to<std::string_view>;
};

}  // namespace strata
