#pragma once
/// subgroup_kernel<Rule, ...>: the kernel an offloaded optimizer gives its subgroup_pipeline for
/// one step. It updates one subgroup's state (fp32 master weights, then the rule's arrays, as
/// offload_layout lays it out) with its gradients by the update rule `Rule`
/// (optim/update_rule.hpp), and writes the model copy (16-bit, or fp32), on the host
/// (Rule::update_cpu over the host slot) or on the device (gradients copied in next to the state,
/// the executor's kernel, offload/rule_device.hpp; the model copy copied out). Both give the same
/// bits. Usable for any pipeline of this layout. A subgroup that crosses parameter ranges of
/// different rates (step_rates) is updated a piece per range. adamw_subgroup_kernel is the
/// kernel with adamw_rule.
///
/// The model copy lives in host memory (host kernels write it, device ones copy it out) or in the
/// executor's device memory (device kernels write it in place; host kernels write it into host
/// staging and, once their update committed, it is copied in on the h2d stream: sync that stream
/// to wait for the copies).

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/exec/device_span.hpp"
#include "strata/exec/executor.hpp"
#include "strata/offload/rule_device.hpp"
#include "strata/offload/offload_layout.hpp"
#include "strata/optim/adamw_rule.hpp"
#include "strata/optim/cpu_dispatch.hpp"
#include "strata/optim/step_rates.hpp"
#include "strata/optim/update_rule.hpp"

namespace strata {

/// Where the model copy of a step (16-bit, or fp32) goes (both empty: none).
template <class H>
struct model_copy {
  std::span<H> host;        ///< in host memory
  device_span<H> device;    ///< or in the executor's device memory
  std::span<H> staging;     ///< with `device`: host memory of the same size for host kernels (pinned for CUDA)

  [[nodiscard]] bool empty() const noexcept { return host.empty() && device.empty(); }
};

namespace detail {

// adopt_model_copy over chunks of `chunk` elements; a full chunk's loops have a constant trip
// count, which the compiler vectorizes at -O2.
template <class H, std::size_t chunk = 1024>
std::size_t adopt_chunks(float* master, const H* model, std::size_t n) {
  std::size_t adopted = 0;
  const auto one = [&](float* p, const H* h, std::size_t k) {
    if constexpr (std::is_same_v<H, float>) {
      if (std::memcmp(p, h, k * sizeof(float)) == 0) return;  // the common case: nothing written
      for (std::size_t i = 0; i < k; ++i)
        if (std::bit_cast<std::uint32_t>(p[i]) != std::bit_cast<std::uint32_t>(h[i])) {
          p[i] = h[i];
          ++adopted;
        }
    } else {
      std::uint16_t rounded[chunk];
      if (k == chunk) {
        for (std::size_t i = 0; i < chunk; ++i) rounded[i] = H(p[i]).bits;
      } else {
        for (std::size_t i = 0; i < k; ++i) rounded[i] = H(p[i]).bits;
      }
      if (std::memcmp(rounded, h, k * sizeof(H)) == 0) return;
      for (std::size_t i = 0; i < k; ++i)
        if (rounded[i] != h[i].bits) {
          p[i] = static_cast<float>(h[i]);
          ++adopted;
        }
    }
  };
  for (std::size_t at = 0; at < n; at += chunk) one(master + at, model + at, std::min(chunk, n - at));
  return adopted;
}

// The parts of one subgroup's step, in order, for a block-quantized state (update_rule: a block
// is updated whole, in one call): config_error when two share a block. (The optimizer checks a
// step's parts with it before the step changes anything.)
class block_claims {
 public:
  block_claims(std::size_t block, std::size_t subgroup, std::size_t base, std::string_view rule)
      : block_(block), subgroup_(subgroup), base_(base), rule_(rule) {}
  // Parameters [lo, hi) (absolute) are one call's, or a part's without gradients.
  void claim(std::size_t lo, std::size_t hi) {
    if (block_ == 0 || lo == hi) return;
    STRATA_EXPECTS(!any_ || (lo - base_) / block_ > (hi_ - 1 - base_) / block_, config_error,
                   "offloaded {}: parameters [{}, {}) and [{}, {}) of subgroup {} share a quantization block of {} "
                   "parameters, which is updated whole: start every tensor and every range of rates at a multiple "
                   "of {} parameters",
                   rule_, lo_, hi_, lo, hi, subgroup_, block_, block_);
    any_ = true;
    lo_ = lo;
    hi_ = hi;
  }

 private:
  std::size_t block_, subgroup_, base_;
  std::string_view rule_;
  bool any_ = false;
  std::size_t lo_ = 0, hi_ = 0;
};

}  // namespace detail

/// Makes `master` follow `model`, a model copy someone may have written into since the update
/// wrote it: each master weight whose value rounded to H differs from the copy's (bit for bit)
/// becomes the copy's value, widened. Returns how many did. (For H = float the copy is the master
/// itself after an update, so any difference is a write; for 16-bit copies a write of the very
/// value the master rounds to goes unseen, and leaves the master's extra bits as they are.) One
/// read of both arrays, on the calling thread and up to pool->size() - 1 of `pool`'s workers.
template <class H>
  requires model_copy_type<H>
std::size_t adopt_model_copy(std::span<float> master, std::span<const H> model, thread_pool* pool = nullptr) {
  STRATA_ASSERT(master.size() == model.size());
  std::atomic<std::size_t> adopted{0};
  detail::parallel_tiles(master.size(), std::size_t{1} << 16, pool, [&](std::size_t b, std::size_t e) {
    adopted.fetch_add(detail::adopt_chunks<H>(master.data() + b, model.data() + b, e - b), std::memory_order_relaxed);
  });
  return adopted.load();
}

/// `Pieces::for_each(s, host slot, f)` calls f(lo, hi, grads, model) for the parts [lo, hi) of
/// subgroup s in order: `grads` their gradients in host memory (a span of the caller's, of the
/// gradient store, or of the slot's side data; empty: no gradient this step, the part is left
/// as it is) and `model` their weights when they live apart from the kernel's model copy (a
/// framework tensor's own; empty: the part of the model copy, if any). Parameters no part
/// covers are left as they are. `Pieces::has_own_weights()`: whether pieces bring weights of their
/// own. `Commit(s)`: called when subgroup s's update committed.
template <update_rule Rule, executor Exec, gradient_type G, class H, class Pieces, class Commit>
  requires model_copy_type<H>
class subgroup_kernel {
 public:
  using step_params = typename Rule::step_params;

  /// `exec` is needed only for a model copy in device memory. `adopt_model`: the host weights
  /// are read first and the master follows them where they were written (adopt_model_copy;
  /// host updates only).
  subgroup_kernel(const offload_layout& layout, rule_constants<Rule> k, Pieces pieces, model_copy<H> model,
                        thread_pool* pool, Commit commit, Exec* exec = nullptr, bool adopt_model = false)
      : layout_(layout),
        k_(std::move(k)),
        pieces_(std::move(pieces)),
        model_(model),
        pool_(pool),
        commit_(std::move(commit)),
        exec_(exec),
        adopt_(adopt_model),
        on_host_(model.device.empty() ? 0 : layout.subgroups(), 0) {
    STRATA_EXPECTS(model_.device.empty() || (exec_ != nullptr && model_.staging.size() == model_.device.size()),
                   config_error, "subgroup_kernel: a model copy in device memory needs the executor and staging");
    STRATA_EXPECTS(!adopt_ || model_.device.empty(), config_error,
                   "subgroup_kernel: adopting the model needs its weights in host memory");
  }

  void host(std::size_t s, std::span<std::byte> slot) {
    const std::size_t n = layout_.length(s);
    const std::size_t base = layout_.begin(s);
    const state_view view = state_view::of(slot.data(), layout_.format, n);
    pieces_.for_each(s, slot, [&](std::size_t lo, std::size_t hi, std::span<const G> grads, std::span<H> own) {
      const std::span<H> model = weights(s, lo, hi, own);
      if (adopt_ && !model.empty()) adopt_model_copy<H>(std::span<float>(view.master + (lo - base), hi - lo), model, pool_);
      if (grads.empty()) return;
      k_.for_each_piece(lo, hi - lo, [&](std::size_t off, std::size_t len, const step_params& k) {
        Rule::template update_cpu<G, H>(view, lo - base + off, len, grads.data() + off,
                                        model.empty() ? nullptr : model.data() + off, k, pool_);
      });
    });
    if (!on_host_.empty()) on_host_[s] = 1;  // read by committed(), which the pipeline calls after this returns
  }

  /// Takes over, as this step's update of subgroup s, the update a kernel of the same constants
  /// made of a copy of its state with no model copy (a speculative one, in `slot` now): writes
  /// the model copy as host() would have (the updated weights rounded to H, where the step has
  /// gradients), on the calling thread and up to pool->size() - 1 of the pool's workers.
  void adopted(std::size_t s, std::span<std::byte> slot) {
    STRATA_ASSERT(!adopt_);  // (the master would have followed the model first)
    const std::size_t base = layout_.begin(s);
    const state_view view = state_view::of(slot.data(), layout_.format, layout_.length(s));
    pieces_.for_each(s, slot, [&](std::size_t lo, std::size_t hi, std::span<const G> grads, std::span<H> own) {
      const std::span<H> model = weights(s, lo, hi, own);
      if (grads.empty() || model.empty()) return;
      const float* master = view.master + (lo - base);
      detail::parallel_tiles(model.size(), std::size_t{1} << 16, pool_, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) model[i] = H(master[i]);
      });
    });
    if (!on_host_.empty()) on_host_[s] = 1;
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
    const std::size_t base = layout_.begin(s);
    const auto to = device.subspan(static_cast<std::size_t>(layout_.device_gradient_offset()));
    pieces_.for_each(s, slot, [&](std::size_t lo, std::size_t, std::span<const G> grads, std::span<H>) {
      if (!grads.empty()) h2d.copy_to_device(to.subspan((lo - base) * sizeof(G), grads.size_bytes()), std::as_bytes(grads));
    });
  }

  void device_update(std::size_t s, std::span<std::byte> device, Exec& exec)
    requires rule_executor<Exec, Rule>
  {
    const std::size_t n = layout_.length(s);
    const state_view view = state_view::of(device.data(), layout_.format, n);
    auto* g = reinterpret_cast<const G*>(device.data() + layout_.device_gradient_offset());
    // in place in a device model; else in the slot, copied out by device_out (a float copy is
    // the updated master itself, which device_out copies from the state: nothing to write)
    H* out = !model_.device.empty() ? model_.device.data() + layout_.begin(s)
                                    : reinterpret_cast<H*>(device.data() + layout_.device_model_offset());
    const bool write_copy =
        (!model_.empty() || pieces_.has_own_weights()) && (!model_.device.empty() || !std::is_same_v<H, float>);
    const std::size_t base = layout_.begin(s);
    pieces_.for_each(s, {}, [&](std::size_t lo, std::size_t hi, std::span<const G> grads, std::span<H>) {
      if (grads.empty()) return;
      k_.for_each_piece(lo, hi - lo, [&](std::size_t off, std::size_t len, const step_params& k) {
        const std::size_t at = lo - base + off;
        enqueue_update<Rule>(exec, view, at, len, g + at, write_copy ? out + at : static_cast<H*>(nullptr), k);
      });
    });
  }

  template <class S>
  void device_out(std::size_t s, std::span<std::byte> device, S& d2h) {
    if (!model_.device.empty()) return;  // written in place
    const std::uint64_t from = std::is_same_v<H, float> ? 0 : layout_.device_model_offset();  // see device_update
    const std::size_t base = layout_.begin(s);
    pieces_.for_each(s, {}, [&](std::size_t lo, std::size_t hi, std::span<const G> grads, std::span<H> own) {
      const std::span<H> model = weights(s, lo, hi, own);
      if (grads.empty() || model.empty()) return;  // only updated weights change
      d2h.copy_to_host(std::as_writable_bytes(model),
                       device.subspan(static_cast<std::size_t>(from) + (lo - base) * sizeof(H), model.size_bytes()));
    });
  }

 private:
  // The weights of [lo, hi) of subgroup s: the piece's own, else the model copy's part (or none).
  [[nodiscard]] std::span<H> weights(std::size_t s, std::size_t lo, std::size_t hi, std::span<H> own) const {
    if (!own.empty()) return own;
    const std::span<H> copy = model_of(s);
    return copy.empty() ? copy : copy.subspan(lo - layout_.begin(s), hi - lo);
  }

  [[nodiscard]] std::span<H> model_of(std::size_t s) const {
    const std::span<H> host = model_.device.empty() ? model_.host : model_.staging;
    return host.empty() ? std::span<H>() : host.subspan(layout_.begin(s), layout_.length(s));
  }

  offload_layout layout_;
  rule_constants<Rule> k_;
  Pieces pieces_;
  model_copy<H> model_;
  thread_pool* pool_;
  Commit commit_;
  Exec* exec_;
  bool adopt_;
  std::vector<char> on_host_;  // with a device model: which subgroups a host kernel updated
};

/// The kernel of an AdamW step (the name it had before the engine was generic over rules).
template <executor Exec, gradient_type G, class H, class Pieces, class Commit>
using adamw_subgroup_kernel = subgroup_kernel<adamw_rule, Exec, G, H, Pieces, Commit>;

}  // namespace strata
