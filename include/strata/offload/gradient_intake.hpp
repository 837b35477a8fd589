#pragma once
/// gradient_intake: where an offloaded optimizer keeps the gradients that backward hands over before the
/// step (accept_gradients), with host residency: in host memory, in the type they arrive in
/// (16-bit stays 16-bit: MLP-Offload's delayed conversion), in one store of every parameter
/// charged to the optimizer's host budget on first use. It keeps the exact ranges each subgroup
/// received this step, so a range handed over twice is refused (config_error) and a step can
/// refuse to run on gradients that did not all arrive: none is ever stale or counted twice.
///
/// With norm tracking on (gradient clipping or loss scaling), it also sums each subgroup's
/// squared gradients (unscaled) as they arrive, so the global norm is known when backward ends:
/// with host residency when a subgroup's last gradient arrives; with tier residency (the
/// gradients are not kept in host memory) piece by piece, per block of grad_norm_block elements,
/// which is why such pieces must start and end on block boundaries of their subgroup. Either
/// way the sums equal grad_stats_cpu over the whole subgroup, bit for bit.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/budget.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/offload/offload_layout.hpp"
#include "strata/optim/grad_norm.hpp"

namespace strata {

/// The element type of a step's gradients.
enum class grad_kind : std::uint8_t { f32, b16, f16 };

template <class G>
[[nodiscard]] constexpr grad_kind grad_kind_of() noexcept {
  return std::is_same_v<G, float> ? grad_kind::f32 : std::is_same_v<G, bf16> ? grad_kind::b16 : grad_kind::f16;
}
[[nodiscard]] constexpr std::string_view to_string(grad_kind k) noexcept {
  return k == grad_kind::f32 ? "float" : k == grad_kind::b16 ? "bf16" : "fp16";
}

class gradient_intake {
 public:
  /// `budget` must outlive the intake. `who` names the optimizer in messages.
  gradient_intake(const offload_layout& layout, host_budget& budget, std::string who = "offloaded_adamw")
      : layout_(layout),
        budget_(&budget),
        received_(layout.subgroups(), 0),
        ranges_(layout.subgroups()),
        who_(std::move(who)) {}

  /// Turns norm tracking on: gradients are multiplied by `grad_scale` (the inverse loss scale)
  /// before they are squared, and summed on `pool` (may be null). Call between steps.
  void track_norm(float grad_scale, thread_pool* pool) {
    tracking_ = true;
    norm_scale_ = grad_scale;
    pool_ = pool;
  }
  [[nodiscard]] bool tracks_norm() const noexcept { return tracking_; }
  /// The subgroups' gradient sums of this step (complete subgroups only).
  [[nodiscard]] const grad_norm_accumulator& norms() const noexcept { return norms_; }

  /// Checks that [first, first + n) lies in the parameters and overlaps nothing received this
  /// step (config_error naming the range, the subgroup and the range it overlaps).
  void check(std::size_t first, std::size_t n) const {
    STRATA_EXPECTS(first <= layout_.params && n <= layout_.params - first, config_error,
                   "{}::accept_gradients: range [{}, {}) passes the {} parameters", who_, first, first + n,
                   layout_.params);
    for_each_piece(first, n, [&](std::size_t s, std::size_t lo, std::size_t hi) {
      if (const auto seen = overlap(s, lo, hi))
        throw config_error(fmt::format("{}::accept_gradients: range [{}, {}) of subgroup {} overlaps "
                                       "[{}, {}), received earlier this step (each gradient is handed over once)", who_,
                                       lo, hi, s, seen->first, seen->second));
      const std::size_t off = lo - layout_.begin(s);
      STRATA_EXPECTS(!tracking_ || !layout_.tier_gradients ||
                         (off % grad_norm_block == 0 && ((hi - lo) % grad_norm_block == 0 || hi == layout_.begin(s) + layout_.length(s))),
                     config_error,
                     "{}::accept_gradients: with gradients on the tier and clipping or loss scaling on, "
                     "pieces must start and end on {}-element blocks of their subgroup; [{}, {}) cuts subgroup {}", who_,
                     grad_norm_block, lo, hi, s);
    });
  }

  /// Copies gradients of [first, first + grads.size()) into the store (check first) and, unless
  /// `sum` is false (the caller sums them later: sum_subgroup), adds the subgroups it completes
  /// to the norm.
  template <gradient_type G>
  void store(std::size_t first, std::span<const G> grads, bool sum = true) {
    const std::span<G> dst = reserve<G>(first, grads.size());
    std::memcpy(dst.data(), grads.data(), grads.size_bytes());
    if (tracking_ && sum)
      for_each_piece(first, grads.size(), [&](std::size_t s, std::size_t, std::size_t) {
        if (complete(s) && !summed(s)) sum_subgroup(s);
      });
  }

  /// Where gradients [first, first + n) of type G go in the store, counted as received (check
  /// first): for copies that land later (from device memory). Call sum_subgroup once they have.
  template <gradient_type G>
  [[nodiscard]] std::span<G> reserve(std::size_t first, std::size_t n) {
    if (store_.data() == nullptr) {
      store_ = budget_->allocate(layout_.params * sizeof(G), "the gradient store of accept_gradients");
      kind_ = grad_kind_of<G>();
    }
    STRATA_EXPECTS(kind_ == grad_kind_of<G>(), config_error,
                   "{}::accept_gradients: gradients of this step arrived as {}, now as {}", who_,
                   to_string(kind_), to_string(grad_kind_of<G>()));
    count(first, n);
    return {reinterpret_cast<G*>(store_.data()) + first, n};
  }

  /// Adds complete subgroup `s`'s stored gradients to the norm (when tracking), on the tracking
  /// pool or, from another thread than the caller's, on that thread alone (`own_thread`).
  /// Thread-safe against other subgroups' sums (not against store, reserve or reset).
  void sum_subgroup(std::size_t s, bool own_thread = false) {
    if (!tracking_) return;
    thread_pool* pool = own_thread ? nullptr : pool_;
    switch (kind_) {
      case grad_kind::f32: norms_.add(s, grad_stats_cpu(of<float>(s), norm_scale_, pool)); break;
      case grad_kind::b16: norms_.add(s, grad_stats_cpu(of<bf16>(s), norm_scale_, pool)); break;
      case grad_kind::f16: norms_.add(s, grad_stats_cpu(of<fp16>(s), norm_scale_, pool)); break;
    }
  }

  /// Tier residency: adds the piece [lo, lo + g.size()) of subgroup `s` (block-aligned: see
  /// check) to the norm, and the subgroup to the accumulator once it is complete (count first).
  template <gradient_type G>
  void add_to_norm(std::size_t s, std::size_t lo, std::span<const G> g) {
    if (!tracking_) return;
    auto& blocks = blocks_[s];
    if (blocks.empty()) blocks.resize((layout_.length(s) + grad_norm_block - 1) / grad_norm_block);
    const std::size_t b0 = (lo - layout_.begin(s)) / grad_norm_block;
    grad_block_sums_cpu(g, norm_scale_, std::span<double>(blocks).subspan(b0, (g.size() + grad_norm_block - 1) / grad_norm_block),
                        pool_);
    if (complete(s)) {
      norms_.add(s, grad_stats_of_blocks(blocks, layout_.length(s)));
      std::vector<double>().swap(blocks);
    }
  }

  /// Records that [first, first + n) arrived (check first; store calls it, tier residency calls
  /// it itself). Adjacent ranges are merged: in-order pieces keep one range per subgroup.
  void count(std::size_t first, std::size_t n) {
    for_each_piece(first, n, [&](std::size_t s, std::size_t lo, std::size_t hi) {
      if (hi == lo) return;
      received_[s] += hi - lo;  // check() refused overlaps, so pieces add up exactly
      auto& r = ranges_[s];
      auto next = r.lower_bound(lo);
      if (next != r.end() && next->first == hi) {  // joins the range after it
        hi = next->second;
        next = r.erase(next);
      }
      if (next != r.begin() && std::prev(next)->second == lo) {  // extends the range before it
        std::prev(next)->second = hi;
        return;
      }
      r.emplace(lo, hi);
    });
  }

  /// Gradients subgroup `s` received this step.
  [[nodiscard]] std::size_t received(std::size_t s) const { return received_.at(s); }
  [[nodiscard]] bool complete(std::size_t s) const { return received_.at(s) == layout_.length(s); }
  /// A new step begins: nothing received, nothing summed.
  void reset() {
    std::fill(received_.begin(), received_.end(), std::size_t{0});
    for (auto& r : ranges_) r.clear();
    norms_.reset();
    blocks_.clear();
  }
  /// The type the store holds (float until something was stored).
  [[nodiscard]] grad_kind kind() const noexcept { return kind_; }
  /// Subgroup `s`'s stored gradients, as G (the store's type).
  template <gradient_type G>
  [[nodiscard]] std::span<const G> of(std::size_t s) const {
    STRATA_ASSERT(kind_ == grad_kind_of<G>() && store_.data() != nullptr);
    return {reinterpret_cast<const G*>(store_.data()) + layout_.begin(s), layout_.length(s)};
  }

  /// Calls fn(s, lo, hi) for each subgroup s that [first, first + n) touches, with the part of it
  /// that lies in s as parameter indices [lo, hi).
  template <class F>
  void for_each_piece(std::size_t first, std::size_t n, F&& fn) const {
    for (std::size_t s = first / layout_.subgroup_elems; s < layout_.subgroups() && layout_.begin(s) < first + n; ++s)
      fn(s, std::max(first, layout_.begin(s)), std::min(first + n, layout_.begin(s) + layout_.length(s)));
  }

 private:
  offload_layout layout_;
  host_budget* budget_;
  host_buffer store_;
  grad_kind kind_ = grad_kind::f32;
  std::vector<std::size_t> received_;
  std::vector<std::map<std::size_t, std::size_t>> ranges_;  // per subgroup: received [lo, hi), disjoint, merged
  bool tracking_ = false;
  float norm_scale_ = 1.0f;
  thread_pool* pool_ = nullptr;
  grad_norm_accumulator norms_;
  std::string who_;
  std::map<std::size_t, std::vector<double>> blocks_;  // tier residency: block sums of incomplete subgroups

  [[nodiscard]] bool summed(std::size_t s) const { return norms_.contains(s); }
  /// A range of subgroup `s` received this step that [lo, hi) overlaps, if any.
  [[nodiscard]] std::optional<std::pair<std::size_t, std::size_t>> overlap(std::size_t s, std::size_t lo,
                                                                           std::size_t hi) const {
    if (hi == lo) return std::nullopt;
    const auto& r = ranges_[s];
    auto it = r.upper_bound(lo);  // the first range starting after lo
    if (it != r.begin() && std::prev(it)->second > lo) return *std::prev(it);
    if (it != r.end() && it->first < hi) return *it;
    return std::nullopt;
  }
};

}  // namespace strata
