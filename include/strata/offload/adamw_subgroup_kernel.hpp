#pragma once
/// adamw_subgroup_kernel: the kernel offloaded_adamw gives its subgroup_pipeline for one step. It
/// updates one subgroup's state (master | m | v [| max v], fp32, as offload_layout lays it out)
/// with its gradients, and writes the model copy (16-bit, or fp32), on the host (adamw_update_cpu over the
/// host slot) or on the device (gradients copied in next to the state, the executor's kernel, the
/// model copy copied out). Both give the same bits. Usable for any pipeline of this layout. A
/// subgroup that crosses parameter ranges of different rates (step_rates) is updated a piece per
/// range.
///
/// The model copy lives in host memory (host kernels write it, device ones copy it out) or in the
/// executor's device memory (device kernels write it in place; host kernels write it into host
/// staging and, once their update committed, it is copied in on the h2d stream: sync that stream
/// to wait for the copies).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/exec/device_span.hpp"
#include "strata/exec/executor.hpp"
#include "strata/offload/adamw_device.hpp"
#include "strata/offload/offload_layout.hpp"
#include "strata/optim/adamw_cpu.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/optim/step_rates.hpp"

namespace strata {

/// Where the model copy of a step (16-bit, or fp32) goes (both empty: none).
template <class H>
struct model_copy {
  std::span<H> host;        ///< in host memory
  device_span<H> device;    ///< or in the executor's device memory
  std::span<H> staging;     ///< with `device`: host memory of the same size for host kernels (pinned for CUDA)

  [[nodiscard]] bool empty() const noexcept { return host.empty() && device.empty(); }
};

/// `GradsOf(s, host slot) -> std::span<const G>`: subgroup s's gradients in host memory (a span
/// of the caller's, of the gradient store, or of the slot's side data). `Commit(s)`: called when
/// subgroup s's update committed.
template <executor Exec, gradient_type G, class H, class GradsOf, class Commit>
  requires model_copy_type<H>
class adamw_subgroup_kernel {
 public:
  /// `exec` is needed only for a model copy in device memory.
  adamw_subgroup_kernel(const offload_layout& layout, step_constants k, GradsOf grads_of,
                        model_copy<H> model, thread_pool* pool, Commit commit, Exec* exec = nullptr)
      : layout_(layout),
        k_(std::move(k)),
        grads_of_(std::move(grads_of)),
        model_(model),
        pool_(pool),
        commit_(std::move(commit)),
        exec_(exec),
        on_host_(model.device.empty() ? 0 : layout.subgroups(), 0) {
    STRATA_EXPECTS(model_.device.empty() || (exec_ != nullptr && model_.staging.size() == model_.device.size()),
                   config_error, "adamw_subgroup_kernel: a model copy in device memory needs the executor and staging");
  }

  void host(std::size_t s, std::span<std::byte> slot) {
    const std::size_t n = layout_.length(s);
    float* st = reinterpret_cast<float*>(slot.data());
    const std::span<const G> grads = grads_of_(s, slot);
    const std::span<H> model = model_of(s);
    k_.for_each_piece(layout_.begin(s), n, [&](std::size_t at, std::size_t len, const adamw_step_params& k) {
      adamw_update_cpu<G, H>(std::span<float>(st + at, len), std::span<float>(st + n + at, len),
                             std::span<float>(st + 2 * n + at, len),
                             layout_.sections == 4 ? std::span<float>(st + 3 * n + at, len) : std::span<float>(),
                             grads.subspan(at, len), model.empty() ? model : model.subspan(at, len), k, pool_);
    });
    if (!on_host_.empty()) on_host_[s] = 1;  // read by committed(), which the pipeline calls after this returns
  }

  void committed(std::size_t s) {
    if (!on_host_.empty() && on_host_[s] != 0) {
      const auto staged = model_of(s);
      exec_->h2d().copy_to_device(model_.device.subspan(layout_.begin(s), layout_.length(s)).bytes(),
                                  std::as_bytes(staged));
    }
    commit_(s);
  }

  template <class S>
  void device_in(std::size_t s, std::span<std::byte> slot, std::span<std::byte> device, S& h2d) {
    const auto g = std::as_bytes(grads_of_(s, slot));
    h2d.copy_to_device(device.subspan(static_cast<std::size_t>(layout_.device_gradient_offset()), g.size()), g);
  }

  void device_update(std::size_t s, std::span<std::byte> device, Exec& exec)
    requires adamw_executor<Exec>
  {
    const std::size_t n = layout_.length(s);
    float* st = reinterpret_cast<float*>(device.data());
    auto* g = reinterpret_cast<const G*>(device.data() + layout_.device_gradient_offset());
    // in place in a device model; else in the slot, copied out by device_out (a float copy is
    // the updated master itself, which device_out copies from the state: nothing to write)
    H* out = !model_.device.empty() ? model_.device.data() + layout_.begin(s)
                                    : reinterpret_cast<H*>(device.data() + layout_.device_model_offset());
    const bool write_copy = !model_.empty() && (!model_.device.empty() || !std::is_same_v<H, float>);
    k_.for_each_piece(layout_.begin(s), n, [&](std::size_t at, std::size_t len, const adamw_step_params& k) {
      enqueue_adamw(exec,
                    adamw_group<G, H>{std::span<float>(st + at, len), std::span<float>(st + n + at, len),
                                      std::span<float>(st + 2 * n + at, len),
                                      layout_.sections == 4 ? std::span<float>(st + 3 * n + at, len)
                                                            : std::span<float>(),
                                      std::span<const G>(g + at, len),
                                      write_copy ? std::span<H>(out + at, len) : std::span<H>()},
                    k);
    });
  }

  template <class S>
  void device_out(std::size_t s, std::span<std::byte> device, S& d2h) {
    if (model_.host.empty()) return;  // none, or written in place
    const auto out = std::as_writable_bytes(model_of(s));
    const std::uint64_t from = std::is_same_v<H, float> ? 0 : layout_.device_model_offset();  // see device_update
    d2h.copy_to_host(out, device.subspan(static_cast<std::size_t>(from), out.size()));
  }

 private:
  [[nodiscard]] std::span<H> model_of(std::size_t s) const {
    const std::span<H> host = model_.device.empty() ? model_.host : model_.staging;
    return host.empty() ? std::span<H>() : host.subspan(layout_.begin(s), layout_.length(s));
  }

  offload_layout layout_;
  step_constants k_;
  GradsOf grads_of_;
  model_copy<H> model_;
  thread_pool* pool_;
  Commit commit_;
  Exec* exec_;
  std::vector<char> on_host_;  // with a device model: which subgroups a host kernel updated
};

}  // namespace strata
