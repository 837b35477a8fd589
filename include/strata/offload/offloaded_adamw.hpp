#pragma once
/// strata::offloaded_adamw: AdamW whose fp32 state (master weights, first and second moments,
/// and the running maximum of the second moment with amsgrad) lives on a tier stack and is
/// streamed through a bounded set of host buffers for each update (DESIGN section 4).
///
/// Layout. The parameters are split into subgroups of `subgroup_elems` (the last may be shorter).
/// Each subgroup's state is ONE tier object, "<prefix>.sg-<i>", holding its arrays back to back
/// (master | m | v [| max v]): one read and one write per subgroup and step, and a single checksum
/// range. With gradients on the tier (ZeRO-Infinity style) each subgroup also has an fp32
/// gradient object "<prefix>.gr-<i>".
///
/// Host memory. All host buffers are whole-subgroup slots from one budget (host_budget):
/// `cache` slots keep updated subgroups between steps (which ones: the eviction policy), and
/// `prefetch_depth + write_behind_depth + 1` pipeline slots hold subgroups being read, updated and
/// written. The gradient store of accept_gradients (host residency) is charged to the same budget.
///
/// A step. Subgroups are walked in the update order of the step. A subgroup is either resident
/// (a cache hit: no read) or read into a free slot, `prefetch_depth` subgroups ahead on every path
/// at once (the tier runs the requests concurrently). It is updated by the CPU kernel
/// (adamw_update_cpu, bit-identical to one call over the whole flat array), then either admitted
/// to the cache (the policy names a victim, which is written behind if dirty) or written behind,
/// with at most `write_behind_depth` writes in flight. Writes are durable after flush() or save().
///
/// Failures. Every public call returns with no request in flight. A tier error during a step is
/// rethrown (typed, as the tier reported it) after the in-flight requests drain, and no subgroup
/// is ever half-updated: each subgroup is either at the old step (its state unchanged where it
/// was) or at the new one (its updated state in the cache, on the tier, or, when its write failed,
/// held in its slot and written first thing by the next call). Call step again with the same
/// gradients and learning rate: the subgroups already updated are skipped, and the result is
/// bit-identical to a step that never failed. A different lr for the retry is a config_error.
/// Until the step completes, step_count() keeps the old value, save() refuses (config_error) and
/// read_master/read_moments show each subgroup as it is (some already updated).
///
/// Not thread-safe: one thread calls at a time (the kernel itself uses `threads` threads).
///
/// Template parameters: the tier stack (a multipath carries the placement policy: path choice is
/// the tier's job), the eviction policy of the host cache, and the update order. The update runs
/// on the host executor (the CPU kernel over a strata::thread_pool); a CUDA executor is future
/// work and will be a further parameter with this as its default.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/half.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/trace.hpp"
#include "strata/core/units.hpp"
#include "strata/offload/checkpoint_manifest.hpp"
#include "strata/offload/host_budget.hpp"
#include "strata/offload/offload_options.hpp"
#include "strata/offload/offload_stats.hpp"
#include "strata/offload/tier_paths.hpp"
#include "strata/optim/adamw_cpu.hpp"
#include "strata/optim/adamw_math.hpp"
#include "strata/policy/cache_index.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/placement.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_order.hpp"
#include "strata/tier/checksummed.hpp"
#include "strata/tier/io_future.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Offloaded AdamW; see the file comment. The tier is referred to, not owned: it must outlive
/// the optimizer.
template <tier Tier = dynamic_multipath<bandwidth_proportional>, eviction_policy Evict = sweep_aware,
          update_order Order = alternating>
class offloaded_adamw {
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  using clock = std::chrono::steady_clock;

 public:
  using tier_type = Tier;
  using eviction_type = Evict;
  using order_type = Order;

  /// Partitions `params` (the initial fp32 weights) into subgroups, zeroes the moments and writes
  /// every subgroup's state to `tier`. Throws config_error for invalid options or a budget too
  /// small for the pipeline (the message says how much is needed), and the tier's errors.
  offloaded_adamw(Tier& tier, std::span<const float> params, adamw_options options, offload_options offload = {},
                  Order order = Order{}, Evict evict = Evict{}, tracer* trace = nullptr)
      : offloaded_adamw(tier, params.size(), options, std::move(offload), std::move(order), std::move(evict), trace,
                        0) {
    initialize([&](std::size_t s, float* state) {
      const std::size_t n = length(s);
      std::memcpy(state, params.data() + begin(s), n * sizeof(float));
      std::memset(state + n, 0, (sections_ - 1) * n * sizeof(float));
    });
  }

  /// Restores the checkpoint in `dir` (see save) onto `tier`, which may be any tier stack (other
  /// paths, other placement than when saved). The checkpoint's subgroup size, hyper-parameters and
  /// step count are used; `offload` gives the rest (cache, pipeline, threads). A corrupted,
  /// truncated or incomplete checkpoint is refused with integrity_error; a missing one with io_error.
  [[nodiscard]] static offloaded_adamw load(const std::filesystem::path& dir, Tier& tier, offload_options offload = {},
                                            Order order = Order{}, Evict evict = Evict{}, tracer* trace = nullptr) {
    const auto manifest_path = dir / "manifest";
    const auto m = load_manifest(dir);
    offload.subgroup_elems = static_cast<std::size_t>(m.subgroup_elems);
    adamw_options opts = m.options;
    if (opts.amsgrad != (m.sections == 4))
      throw integrity_error("checkpoint", manifest_path.string(), 0, "amsgrad does not match the number of arrays");
    offloaded_adamw opt(tier, static_cast<std::size_t>(m.params), opts, std::move(offload), std::move(order),
                        std::move(evict), trace, 0);
    const auto data_path = dir / m.data_file;
    auto fd = open_file(data_path, O_RDONLY);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw io_error("fstat", data_path, errno);
    if (static_cast<std::uint64_t>(st.st_size) != m.data_bytes)
      throw integrity_error("checkpoint", data_path.string(), static_cast<std::uint64_t>(st.st_size),
                            fmt::format("data file has {} bytes, the manifest says {} (truncated?)", st.st_size,
                                        m.data_bytes));
    if (m.subgroup_bytes.size() != opt.subgroups_)
      throw integrity_error("checkpoint", data_path.string(), 0, "subgroup count does not match the layout");
    std::uint64_t offset = 0;
    std::vector<std::uint64_t> offsets(opt.subgroups_);
    for (std::size_t s = 0; s < opt.subgroups_; ++s) {
      offsets[s] = offset;
      if (m.subgroup_bytes[s] != opt.state_bytes(s))
        throw integrity_error("checkpoint", data_path.string(), offset,
                              fmt::format("subgroup {} has {} bytes, the layout needs {}", s, m.subgroup_bytes[s],
                                          opt.state_bytes(s)));
      offset += m.subgroup_bytes[s];
    }
    opt.initialize([&](std::size_t s, float* state) {
      auto bytes = std::span(reinterpret_cast<std::byte*>(state), opt.state_bytes(s));
      pread_all(fd.get(), bytes, offsets[s], data_path);
      const auto sum = checksum64(bytes);
      if (sum != m.checksums[s])
        throw integrity_error("checkpoint", fmt::format("{} (subgroup {})", data_path.string(), s), offsets[s],
                              m.checksums[s], sum);
    });
    opt.step_count_ = m.step;
    std::fill(opt.version_.begin(), opt.version_.end(), m.step);
    return opt;
  }

  /// The verified manifest of the checkpoint in `dir` (step count, layout, hyper-parameters).
  [[nodiscard]] static checkpoint_manifest load_manifest(const std::filesystem::path& dir) {
    const auto manifest_path = dir / "manifest";
    return checkpoint_manifest::parse(read_small_file(manifest_path), manifest_path.string());
  }

  offloaded_adamw(offloaded_adamw&&) noexcept = default;
  offloaded_adamw& operator=(offloaded_adamw&&) = delete;
  offloaded_adamw(const offloaded_adamw&) = delete;
  offloaded_adamw& operator=(const offloaded_adamw&) = delete;
  /// No request is ever in flight between calls, so nothing is waited for here. Unwritten
  /// updated state (cached subgroups) is lost: save() first to keep it.
  ~offloaded_adamw() = default;

  // --- steps ------------------------------------------------------------------------------------

  /// One step with the options' lr over gradients of every parameter (float, bf16 or fp16).
  template <gradient_type G>
  offload_step_stats step(std::span<const G> grads) {
    return step(grads, options_.lr);
  }
  /// One step with learning rate `lr` (a scheduler's value).
  template <gradient_type G>
  offload_step_stats step(std::span<const G> grads, double lr) {
    return step(grads, lr, std::span<bf16>{});
  }
  /// One step that also writes the updated weights, rounded to bf16/fp16, into `model_out`
  /// (size() elements, or empty for none) in the same pass.
  template <gradient_type G, class H>
    requires is_half_v<H>
  offload_step_stats step(std::span<const G> grads, double lr, std::span<H> model_out) {
    STRATA_EXPECTS(grads.size() == params_, config_error, "offloaded_adamw::step: got {} gradients for {} parameters",
                   grads.size(), params_);
    check_lr(lr);
    check_model_out(model_out.size());
    if (offload_.gradients == gradient_residency::tier) {
      for (std::size_t s = 0; s < subgroups_; ++s) received_[s] = 0;
      stage_gradients_to_tier(grads, 0);
      return run_step<float>(lr, model_out, [&](std::size_t, float* slot_grad) {
        return std::span<const float>(slot_grad, 0);
      });
    }
    return run_step<G>(lr, model_out, [&](std::size_t s, float*) { return grads.subspan(begin(s), length(s)); });
  }

  /// Hands over the gradients of subgroup `subgroup` (its full length) as backward produces them;
  /// step() without gradients then uses them. 16-bit gradients stay 16-bit in host memory (host
  /// residency); with tier residency they are widened to fp32 and written to the tier now.
  template <gradient_type G>
  void accept_gradients(std::size_t subgroup, std::span<const G> grads) {
    STRATA_EXPECTS(subgroup < subgroups_, config_error, "offloaded_adamw::accept_gradients: subgroup {} of {}",
                   subgroup, subgroups_);
    STRATA_EXPECTS(grads.size() == length(subgroup), config_error,
                   "offloaded_adamw::accept_gradients: got {} gradients for subgroup {} of {} parameters",
                   grads.size(), subgroup, length(subgroup));
    accept_gradients_at(begin(subgroup), grads);
  }

  /// Hands over the gradients of parameters [first, first + grads.size()), which may span
  /// subgroups. Ranges must not overlap within a step.
  template <gradient_type G>
  void accept_gradients_at(std::size_t first, std::span<const G> grads) {
    STRATA_EXPECTS(first <= params_ && grads.size() <= params_ - first, config_error,
                   "offloaded_adamw::accept_gradients: range [{}, {}) passes the {} parameters", first,
                   first + grads.size(), params_);
    for (std::size_t s = first / offload_.subgroup_elems; s < subgroups_ && begin(s) < first + grads.size(); ++s) {
      const std::size_t lo = std::max(first, begin(s));
      const std::size_t hi = std::min(first + grads.size(), begin(s) + length(s));
      STRATA_EXPECTS(received_[s] + (hi - lo) <= length(s), config_error,
                     "offloaded_adamw::accept_gradients: subgroup {} received more than its {} gradients this step "
                     "(overlapping ranges?)",
                     s, length(s));
    }
    if (offload_.gradients == gradient_residency::tier) {
      stage_gradients_to_tier(grads, first);
      return;
    }
    if (!grad_store_.data()) {
      grad_store_ = budget_->allocate(params_ * sizeof(G), "the gradient store of accept_gradients");
      grad_kind_ = kind_of<G>();
    }
    STRATA_EXPECTS(grad_kind_ == kind_of<G>(), config_error,
                   "offloaded_adamw::accept_gradients: gradients of this step arrived as {}, now as {}",
                   kind_name(grad_kind_), kind_name(kind_of<G>()));
    std::memcpy(grad_store_.data() + first * sizeof(G), grads.data(), grads.size_bytes());
    for (std::size_t s = first / offload_.subgroup_elems; s < subgroups_ && begin(s) < first + grads.size(); ++s) {
      const std::size_t lo = std::max(first, begin(s));
      const std::size_t hi = std::min(first + grads.size(), begin(s) + length(s));
      received_[s] += hi - lo;
    }
  }

  /// One step over the gradients given to accept_gradients, with the options' lr.
  offload_step_stats step() { return step(options_.lr); }
  /// One step over the accepted gradients with learning rate `lr`.
  offload_step_stats step(double lr) { return step(lr, std::span<bf16>{}); }
  /// One step over the accepted gradients, writing the updated 16-bit weights into `model_out`.
  template <class H>
    requires is_half_v<H>
  offload_step_stats step(double lr, std::span<H> model_out) {
    check_lr(lr);
    check_model_out(model_out.size());
    for (std::size_t s = 0; s < subgroups_; ++s)
      STRATA_EXPECTS(received_[s] == length(s) || version_[s] > step_count_, config_error,
                     "offloaded_adamw::step: subgroup {} has {} of its {} gradients (call accept_gradients first)", s,
                     received_[s], length(s));
    offload_step_stats st;
    if (offload_.gradients == gradient_residency::tier) {
      st = run_step<float>(lr, model_out, [&](std::size_t, float*) { return std::span<const float>(); });
    } else {
      switch (grad_kind_) {
        case grad_kind::f32: st = run_step<float>(lr, model_out, stored<float>()); break;
        case grad_kind::b16: st = run_step<bf16>(lr, model_out, stored<bf16>()); break;
        case grad_kind::f16: st = run_step<fp16>(lr, model_out, stored<fp16>()); break;
      }
    }
    std::fill(received_.begin(), received_.end(), std::size_t{0});
    return st;
  }

  // --- state ------------------------------------------------------------------------------------

  /// Copies the fp32 master weights of every parameter into `out` (size() elements).
  void read_master(std::span<float> out) {
    STRATA_EXPECTS(out.size() == params_, config_error, "offloaded_adamw::read_master: span of {} for {} parameters",
                   out.size(), params_);
    visit_states([&](std::size_t s, const float* state) {
      std::memcpy(out.data() + begin(s), state, length(s) * sizeof(float));
    });
  }
  /// Copies the first and second moments into `m` and `v` (size() elements each).
  void read_moments(std::span<float> m, std::span<float> v) {
    STRATA_EXPECTS(m.size() == params_ && v.size() == params_, config_error,
                   "offloaded_adamw::read_moments: spans of {} and {} for {} parameters", m.size(), v.size(), params_);
    visit_states([&](std::size_t s, const float* state) {
      const std::size_t n = length(s);
      std::memcpy(m.data() + begin(s), state + n, n * sizeof(float));
      std::memcpy(v.data() + begin(s), state + 2 * n, n * sizeof(float));
    });
  }
  /// Copies the running maximum of v (amsgrad only) into `out`.
  void read_max_exp_avg_sq(std::span<float> out) {
    STRATA_EXPECTS(options_.amsgrad, config_error, "offloaded_adamw::read_max_exp_avg_sq: amsgrad is off");
    STRATA_EXPECTS(out.size() == params_, config_error, "offloaded_adamw::read_max_exp_avg_sq: span of {} for {}",
                   out.size(), params_);
    visit_states([&](std::size_t s, const float* state) {
      const std::size_t n = length(s);
      std::memcpy(out.data() + begin(s), state + 3 * n, n * sizeof(float));
    });
  }

  /// Writes every cached (dirty) subgroup to the tier and flushes the tier: the tier then holds
  /// the whole current state durably.
  void flush() {
    flush_stranded();
    for (std::size_t s = 0; s < subgroups_; ++s) {
      if (resident_[s] == npos || !dirty_[s]) continue;
      auto fut = tier_->write(names_[s], 0, slot_bytes_of(resident_[s], state_bytes(s)));
      fut.get();
      dirty_[s] = false;
    }
    tier_->flush();
  }

  /// Writes a consistent checkpoint of the state (after the last completed step) into `dir`
  /// (created if missing): one data file, fsync'ed, then the manifest published atomically
  /// (write_file_atomic with fsync). A crash at any point leaves the previous checkpoint in `dir`
  /// loadable. Data files of earlier checkpoints are removed once the new manifest is durable.
  /// Throws config_error during a failed step (finish it first), io_error on file errors.
  void save(const std::filesystem::path& dir) {
    STRATA_EXPECTS(!partial_, config_error,
                   "offloaded_adamw::save: step {} failed part-way; retry it before saving", step_count_ + 1);
    trace_span span(tracer_, "offload.save");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw io_error("mkdir", dir, ec.value());
    checkpoint_manifest m;
    m.step = step_count_;
    m.params = params_;
    m.subgroup_elems = offload_.subgroup_elems;
    m.sections = sections_;
    m.options = options_;
    std::random_device rd;
    m.data_file = fmt::format("state-{}-{:08x}{:08x}.bin", step_count_, rd(), rd());
    const auto data_path = dir / m.data_file;
    {
      auto fd = open_file(data_path, O_WRONLY | O_CREAT | O_TRUNC);
      try {
        std::uint64_t offset = 0;
        m.checksums.assign(subgroups_, 0);
        m.subgroup_bytes.assign(subgroups_, 0);
        std::vector<std::uint64_t> offsets(subgroups_);
        for (std::size_t s = 0; s < subgroups_; ++s) {
          offsets[s] = offset;
          offset += state_bytes(s);
        }
        visit_states([&](std::size_t s, const float* state) {
          const auto bytes = std::span(reinterpret_cast<const std::byte*>(state), state_bytes(s));
          m.checksums[s] = checksum64(bytes);
          m.subgroup_bytes[s] = bytes.size();
          pwrite_all(fd.get(), bytes, offsets[s], data_path);
        });
        m.data_bytes = offset;
        if (::fsync(fd.get()) != 0) throw io_error("fsync", data_path, errno);
        fd.close(data_path);
      } catch (...) {
        fd.reset();
        ::unlink(data_path.c_str());
        throw;
      }
    }
    write_file_atomic(dir / "manifest", m.to_text(), durability::fsync);
    // The new checkpoint is durable: older data files (and leftovers of killed saves) can go.
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const auto name = entry.path().filename().string();
      if (name.rfind("state-", 0) == 0 && name != m.data_file) std::filesystem::remove(entry.path(), ec);
    }
  }

  /// Steps completed.
  [[nodiscard]] std::uint64_t step_count() const noexcept { return step_count_; }
  /// Parameters.
  [[nodiscard]] std::size_t size() const noexcept { return params_; }
  /// Subgroups.
  [[nodiscard]] std::size_t subgroup_count() const noexcept { return subgroups_; }
  /// First parameter of subgroup `s`.
  [[nodiscard]] std::size_t begin(std::size_t s) const noexcept { return s * offload_.subgroup_elems; }
  /// Parameters of subgroup `s`.
  [[nodiscard]] std::size_t length(std::size_t s) const noexcept {
    return std::min(offload_.subgroup_elems, params_ - begin(s));
  }
  /// The tier object holding subgroup `s`'s state.
  [[nodiscard]] const std::string& object_name(std::size_t s) const { return names_.at(s); }
  /// Whether subgroup `s` is in the host cache now.
  [[nodiscard]] bool cached(std::size_t s) const { return cache_ && cache_->contains(s); }
  [[nodiscard]] const adamw_options& options() const noexcept { return options_; }
  [[nodiscard]] const offload_options& offload() const noexcept { return offload_; }
  /// Totals since construction and the last step's figures.
  [[nodiscard]] offload_stats stats() const {
    offload_stats s = totals_;
    s.host_memory_used = budget_->used();
    s.host_memory_peak = budget_->peak();
    s.host_memory_budget = budget_->limit();
    s.cache_slots = cache_slots_;
    s.pipeline_slots = pipeline_slots_;
    return s;
  }
  /// Host memory the pipeline and cache need for these options (what the budget must cover
  /// besides the gradient store).
  [[nodiscard]] static std::uint64_t required_host_memory(std::size_t params, const adamw_options& o,
                                                          const offload_options& off) {
    const auto slot = host_budget::footprint(slot_size(params, o, off));
    const std::uint64_t cache = slot == 0 ? 0 : off.host_cache_bytes / slot;
    return (cache + off.prefetch_depth + off.write_behind_depth + 1) * slot;
  }
  [[nodiscard]] Tier& tier() noexcept { return *tier_; }

 private:
  enum class grad_kind : std::uint8_t { f32, b16, f16 };
  template <class G>
  static constexpr grad_kind kind_of() {
    return std::is_same_v<G, float> ? grad_kind::f32 : std::is_same_v<G, bf16> ? grad_kind::b16 : grad_kind::f16;
  }
  static constexpr std::string_view kind_name(grad_kind k) {
    return k == grad_kind::f32 ? "float" : k == grad_kind::b16 ? "bf16" : "fp16";
  }

  static std::size_t slot_size(std::size_t params, const adamw_options& o, const offload_options& off) {
    const std::size_t n = std::min(params, off.subgroup_elems);
    const std::size_t floats = n * ((o.amsgrad ? 4 : 3) + (off.gradients == gradient_residency::tier ? 1 : 0));
    return floats * sizeof(float);
  }

  // The common constructor: validates, sizes and allocates; writes nothing.
  offloaded_adamw(Tier& tier, std::size_t params, adamw_options options, offload_options offload, Order order,
                  Evict evict, tracer* trace, int /*tag*/)
      : tier_(&tier),
        options_(options),
        offload_(std::move(offload)),
        order_(std::move(order)),
        tracer_(trace),
        params_(params) {
    options_.validate();
    offload_.validate();
    STRATA_EXPECTS(params_ > 0, config_error, "offloaded_adamw: no parameters");
    sections_ = options_.amsgrad ? 4 : 3;
    subgroups_ = (params_ + offload_.subgroup_elems - 1) / offload_.subgroup_elems;
    slot_bytes_ = slot_size(params_, options_, offload_);
    const std::uint64_t slot_fp = host_budget::footprint(slot_bytes_);
    cache_slots_ = static_cast<std::size_t>(std::min<std::uint64_t>(offload_.host_cache_bytes / slot_fp, subgroups_));
    pipeline_slots_ = offload_.prefetch_depth + offload_.write_behind_depth + 1;
    const std::uint64_t pipeline = pipeline_slots_ * slot_fp;
    const std::uint64_t needed = pipeline + cache_slots_ * slot_fp;
    STRATA_EXPECTS(needed <= offload_.host_memory_budget, config_error,
                   "offloaded_adamw: host memory budget {} is too small: {} needed = {} pipeline slots (prefetch {}, "
                   "write-behind {}, 1 updating) + {} cache slots, each {} ({} parameters x {} arrays); at least {} "
                   "without a cache",
                   format_size(offload_.host_memory_budget), format_size(needed), pipeline_slots_,
                   offload_.prefetch_depth, offload_.write_behind_depth, cache_slots_, format_size(slot_fp),
                   std::min(params_, offload_.subgroup_elems), slot_bytes_ / sizeof(float) /
                   std::min(params_, offload_.subgroup_elems), format_size(pipeline));
    budget_ = std::make_unique<host_budget>(offload_.host_memory_budget);
    for (std::size_t i = 0; i < pipeline_slots_ + cache_slots_; ++i) {
      slots_.push_back(budget_->allocate(slot_bytes_, "a subgroup slot"));
      free_.push_back(i);
    }
    if (cache_slots_ > 0) cache_.emplace(cache_slots_, std::move(evict));
    if (offload_.threads > 1) pool_ = std::make_unique<thread_pool>(offload_.threads, "strata-adamw");
    names_.reserve(subgroups_);
    grad_names_.reserve(subgroups_);
    for (std::size_t s = 0; s < subgroups_; ++s) {
      names_.push_back(fmt::format("{}.sg-{}", offload_.object_prefix, s));
      grad_names_.push_back(fmt::format("{}.gr-{}", offload_.object_prefix, s));
    }
    resident_.assign(subgroups_, npos);
    dirty_.assign(subgroups_, false);
    version_.assign(subgroups_, 0);
    received_.assign(subgroups_, 0);
    reading_.assign(subgroups_, npos);
    read_futures_.resize(subgroups_);
    writing_.assign(subgroups_, npos);
    write_futures_.resize(subgroups_);
    paths_ = detail::path_descriptors(*tier_);
    totals_.host_memory_budget = offload_.host_memory_budget;
  }

  [[nodiscard]] std::uint64_t state_bytes(std::size_t s) const noexcept {
    return static_cast<std::uint64_t>(length(s)) * sections_ * sizeof(float);
  }
  [[nodiscard]] float* slot_floats(std::size_t slot) noexcept { return reinterpret_cast<float*>(slots_[slot].data()); }
  [[nodiscard]] std::span<std::byte> slot_bytes_of(std::size_t slot, std::uint64_t n) noexcept {
    return {slots_[slot].data(), static_cast<std::size_t>(n)};
  }
  // Gradients read from the tier sit after the state in the slot.
  [[nodiscard]] float* slot_grad(std::size_t slot, std::size_t s) noexcept {
    return slot_floats(slot) + length(s) * sections_;
  }

  void check_lr(double lr) const {
    STRATA_EXPECTS(std::isfinite(lr) && lr > 0, config_error,
                   "offloaded_adamw::step: learning rate {} must be positive and finite", lr);
    STRATA_EXPECTS(!partial_ || lr == partial_lr_, config_error,
                   "offloaded_adamw::step: retrying step {} with lr {}, but it began with lr {}", step_count_ + 1, lr,
                   partial_lr_);
  }
  void check_model_out(std::size_t n) const {
    STRATA_EXPECTS(n == 0 || n == params_, config_error,
                   "offloaded_adamw::step: model copy has {} elements for {} parameters (give all or none)", n,
                   params_);
  }

  template <class G>
  auto stored() {
    return [this](std::size_t s, float*) {
      return std::span<const G>(reinterpret_cast<const G*>(grad_store_.data()) + begin(s), length(s));
    };
  }

  // --- the pipeline ------------------------------------------------------------------------------

  std::size_t path_of_object(const std::string& object) const {
    return std::min(detail::path_index(*tier_, object), paths_.size() - 1);
  }
  std::size_t path_of(std::size_t s) const { return path_of_object(names_[s]); }

  // Issuing may block (a limited<> path waits for a permit on the calling thread): that time is
  // read wait too.
  void issue_read(std::size_t s, offload_step_stats& st) {
    const auto t0 = clock::now();
    issue_read_now(s, st);
    st.read_wait_s += seconds_since(t0);
  }
  void issue_read_now(std::size_t s, offload_step_stats& st) {
    STRATA_ASSERT(!free_.empty() && reading_[s] == npos && writing_[s] == npos && resident_[s] == npos);
    const std::size_t slot = free_.back();
    free_.pop_back();
    reading_[s] = slot;
    ++reads_in_flight_;
    try {
      const auto bytes = state_bytes(s);
      if (offload_.gradients == gradient_residency::tier) {
        std::vector<io_future> parts;
        parts.push_back(tier_->read(names_[s], 0, slot_bytes_of(slot, bytes)));
        parts.push_back(tier_->read(grad_names_[s], 0,
                                    std::as_writable_bytes(std::span(slot_grad(slot, s), length(s)))));
        read_futures_[s] = when_all(std::move(parts));
        count_read(st, s, bytes);
        st.bytes_read += length(s) * sizeof(float);
        st.paths[path_of_object(grad_names_[s])].bytes_read += length(s) * sizeof(float);
      } else {
        read_futures_[s] = tier_->read(names_[s], 0, slot_bytes_of(slot, bytes));
        count_read(st, s, bytes);
      }
    } catch (...) {
      read_futures_[s] = make_ready_io_future(std::current_exception());
    }
  }

  void count_read(offload_step_stats& st, std::size_t s, std::uint64_t bytes) {
    st.bytes_read += bytes;
    if (!st.paths.empty()) st.paths[path_of(s)].bytes_read += bytes;
  }

  // Waits for the read of `s`; returns its slot (freed again when the read failed).
  std::size_t finish_read(std::size_t s, std::exception_ptr& err) {
    const std::size_t slot = reading_[s];
    reading_[s] = npos;
    --reads_in_flight_;
    try {
      read_futures_[s].get();
    } catch (...) {
      if (!err) err = std::current_exception();
      free_.push_back(slot);
      read_futures_[s] = io_future();
      return npos;
    }
    read_futures_[s] = io_future();
    return slot;
  }

  void issue_write(std::size_t s, std::size_t slot, offload_step_stats* st) {
    const auto t0 = clock::now();
    issue_write_now(s, slot, st);
    if (st != nullptr) st->write_wait_s += seconds_since(t0);  // a limited<> path may block here
  }
  void issue_write_now(std::size_t s, std::size_t slot, offload_step_stats* st) {
    writing_[s] = slot;
    write_queue_.push_back(s);
    const auto bytes = state_bytes(s);
    try {
      write_futures_[s] = tier_->write(names_[s], 0, slot_bytes_of(slot, bytes));
    } catch (...) {
      write_futures_[s] = make_ready_io_future(std::current_exception());
    }
    if (st != nullptr) {
      st->bytes_written += bytes;
      if (!st->paths.empty()) st->paths[path_of(s)].bytes_written += bytes;
    }
  }

  // Waits for the write of `s`. Success: the slot is freed (or returned, with `keep`). Failure:
  // the state stays in its slot, which is the only good copy now (stranded until rewritten).
  std::size_t finish_write(std::size_t s, std::exception_ptr& err, bool keep = false) {
    const std::size_t slot = writing_[s];
    writing_[s] = npos;
    write_queue_.erase(std::find(write_queue_.begin(), write_queue_.end(), s));
    try {
      write_futures_[s].get();
    } catch (...) {
      write_futures_[s] = io_future();
      if (!err) err = std::current_exception();
      resident_[s] = slot;
      stranded_.push_back(s);
      return npos;
    }
    write_futures_[s] = io_future();
    dirty_[s] = false;
    if (keep) return slot;
    free_.push_back(slot);
    return npos;
  }

  void write_behind(std::size_t s, std::size_t slot, std::exception_ptr& err, offload_step_stats* st,
                    double* wait) {
    if (!dirty_[s]) {
      free_.push_back(slot);
      return;
    }
    while (write_queue_.size() >= offload_.write_behind_depth) {
      const auto t0 = clock::now();
      finish_write(write_queue_.front(), err);
      if (wait != nullptr) *wait += seconds_since(t0);
    }
    issue_write(s, slot, st);
  }

  // Waits for every request in flight; records the first error. Never throws.
  void drain(std::exception_ptr& err, double* write_wait) noexcept {
    for (std::size_t s = 0; s < subgroups_; ++s)
      if (reading_[s] != npos) {
        const auto slot = finish_read(s, err);
        if (slot != npos) free_.push_back(slot);
      }
    const auto t0 = clock::now();
    while (!write_queue_.empty()) finish_write(write_queue_.front(), err);
    if (write_wait != nullptr) *write_wait += seconds_since(t0);
  }

  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  // Rewrites the subgroups whose write failed; their slots hold the only good copy.
  void flush_stranded() {
    if (stranded_.empty()) return;
    std::exception_ptr err;
    auto list = std::exchange(stranded_, {});
    for (const std::size_t s : list) {
      const std::size_t slot = resident_[s];
      resident_[s] = npos;
      issue_write(s, slot, nullptr);
    }
    drain(err, nullptr);
    if (err) std::rethrow_exception(err);
  }

  // Fills every subgroup's state through `fill(s, state)` in a free slot and writes it.
  template <class Fill>
  void initialize(Fill&& fill) {
    std::exception_ptr err;
    try {
      for (std::size_t s = 0; s < subgroups_ && !err; ++s) {
        while (free_.empty() && !err) finish_write(write_queue_.front(), err);
        if (err) break;
        const std::size_t slot = free_.back();
        free_.pop_back();
        try {
          fill(s, slot_floats(slot));
        } catch (...) {
          free_.push_back(slot);
          throw;
        }
        dirty_[s] = true;
        write_behind(s, slot, err, nullptr, nullptr);
      }
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    drain(err, nullptr);
    if (err) std::rethrow_exception(err);
  }

  // Calls fn(s, state) for every subgroup in order, reading non-resident ones through free slots.
  template <class F>
  void visit_states(F&& fn) {
    flush_stranded();
    std::size_t s = 0;
    while (s < subgroups_) {
      std::vector<std::pair<std::size_t, std::size_t>> batch;
      std::vector<io_future> reads;
      std::vector<std::size_t> taken;
      std::size_t e = s;
      for (; e < subgroups_; ++e) {
        if (resident_[e] != npos) {
          batch.emplace_back(e, resident_[e]);
          continue;
        }
        if (free_.empty()) break;
        const std::size_t slot = free_.back();
        free_.pop_back();
        taken.push_back(slot);
        batch.emplace_back(e, slot);
        try {
          reads.push_back(tier_->read(names_[e], 0, slot_bytes_of(slot, state_bytes(e))));
        } catch (...) {
          reads.push_back(make_ready_io_future(std::current_exception()));
        }
      }
      STRATA_ASSERT(e > s);
      try {
        wait_all(reads);
        for (const auto& [x, slot] : batch) fn(x, slot_floats(slot));
      } catch (...) {
        free_.insert(free_.end(), taken.begin(), taken.end());
        throw;
      }
      free_.insert(free_.end(), taken.begin(), taken.end());
      s = e;
    }
  }

  // Widens gradients [first, first + n) to fp32 and writes them to their subgroups' gradient
  // objects, through free slots used as scratch.
  template <class G>
  void stage_gradients_to_tier(std::span<const G> grads, std::size_t first) {
    flush_stranded();
    STRATA_ASSERT(!free_.empty());
    const std::size_t scratch = free_.back();
    free_.pop_back();
    struct give_back {
      std::vector<std::size_t>& free;
      std::size_t slot;
      ~give_back() { free.push_back(slot); }
    } guard{free_, scratch};
    float* buf = slot_floats(scratch);
    const std::size_t cap = slot_bytes_ / sizeof(float);
    for (std::size_t s = first / offload_.subgroup_elems; s < subgroups_ && begin(s) < first + grads.size(); ++s) {
      const std::size_t lo = std::max(first, begin(s));
      const std::size_t hi = std::min(first + grads.size(), begin(s) + length(s));
      STRATA_ASSERT(hi - lo <= cap);
      for (std::size_t i = lo; i < hi; ++i) buf[i - lo] = detail::widen(grads[i - first]);
      const auto bytes = std::as_bytes(std::span<const float>(buf, hi - lo));
      tier_->write(grad_names_[s], (lo - begin(s)) * sizeof(float), bytes).get();
      totals_.gradient_bytes_written += bytes.size();
      received_[s] += hi - lo;
    }
  }

  template <class G, class H, class GradOf>
  offload_step_stats run_step(double lr, std::span<H> model_out, GradOf&& grad_of) {
    const auto t_start = clock::now();
    trace_span step_span(tracer_, "offload.step");
    flush_stranded();
    const adamw_step_params k = make_adamw_step_params(options_, static_cast<std::int64_t>(step_count_) + 1, lr);
    const auto order = order_of(order_, step_count_, subgroups_);
    const auto next = order_of(order_, step_count_ + 1, subgroups_);
    check_permutation(order, subgroups_, step_count_, "offloaded_adamw");
    if (cache_) cache_->begin_step(order, next);
    std::vector<std::size_t> todo;
    for (const std::size_t s : order)
      if (version_[s] == step_count_) todo.push_back(s);
    partial_ = true;
    partial_lr_ = lr;

    offload_step_stats st;
    st.paths.resize(paths_.size());
    for (std::size_t i = 0; i < paths_.size(); ++i) st.paths[i].name = paths_[i].name;
    std::exception_ptr err;
    const std::size_t depth = offload_.prefetch_depth;
    std::size_t next_pf = 0;
    const auto prefetch = [&](std::size_t i) {
      next_pf = std::max(next_pf, i + 1);
      while (next_pf < todo.size() && next_pf <= i + depth && reads_in_flight_ < depth && !free_.empty()) {
        const std::size_t j = todo[next_pf];
        if (resident_[j] == npos && reading_[j] == npos && writing_[j] == npos) issue_read(j, st);
        ++next_pf;
      }
    };
    try {
      for (std::size_t i = 0; i < todo.size() && !err; ++i) {
        const std::size_t s = todo[i];
        prefetch(i);
        std::size_t slot = resident_[s];
        const bool hit = slot != npos;
        bool grads_pending = hit;  // state found in host memory: tier-resident gradients still to read
        if (hit) {
          if (cache_) cache_->access(s);
          ++st.cache_hits;
        } else {
          ++st.cache_misses;
          const auto t0 = clock::now();
          trace_span wait_span(tracer_, "offload.read_wait");
          if (writing_[s] != npos) {
            // Evicted earlier in this step and still being written: its slot has the state.
            slot = finish_write(s, err, /*keep=*/true);
            if (slot == npos) {  // the write failed: the slot is stranded, and the step stops
              st.write_wait_s += seconds_since(t0);
              break;
            }
            grads_pending = true;
          } else {
            if (reading_[s] == npos) {
              while (free_.empty() && !write_queue_.empty()) finish_write(write_queue_.front(), err);
              STRATA_ASSERT(!free_.empty());
              issue_read_now(s, st);  // already inside the timed wait
            }
            slot = finish_read(s, err);
          }
          st.read_wait_s += seconds_since(t0);
          wait_span.end();
          if (slot == npos || err) {
            if (slot != npos) free_.push_back(slot);
            break;
          }
          prefetch(i);
        }
        if (grads_pending && offload_.gradients == gradient_residency::tier) {
          const auto t0 = clock::now();
          const auto g = std::as_writable_bytes(std::span(slot_grad(slot, s), length(s)));
          try {
            tier_->read(grad_names_[s], 0, g).get();
          } catch (...) {
            if (!err) err = std::current_exception();
          }
          st.bytes_read += g.size();
          st.paths[path_of_object(grad_names_[s])].bytes_read += g.size();
          st.read_wait_s += seconds_since(t0);
          if (err) {
            if (!hit) free_.push_back(slot);  // a taken-over slot holds clean, not-yet-updated state
            break;
          }
        }
        {
          const auto t0 = clock::now();
          trace_span compute_span(tracer_, "offload.compute");
          compute_span.arg("subgroup", s);
          update(s, slot, k, grad_of(s, slot_grad(slot, s)), model_out);
          st.compute_s += seconds_since(t0);
        }
        ++version_[s];
        dirty_[s] = true;
        ++st.subgroups;
        if (!hit) {
          if (cache_) {
            const auto r = cache_->access(s);
            resident_[s] = slot;
            if (r.evicted) {
              const std::size_t v = *r.evicted;
              const std::size_t vslot = resident_[v];
              resident_[v] = npos;
              write_behind(v, vslot, err, &st, &st.write_wait_s);
            }
          } else {
            write_behind(s, slot, err, &st, &st.write_wait_s);
          }
        }
      }
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    {
      trace_span wait_span(tracer_, "offload.write_wait");
      drain(err, &st.write_wait_s);
    }
    st.total_s = seconds_since(t_start);
    totals_.cache_hits += st.cache_hits;
    totals_.cache_misses += st.cache_misses;
    totals_.bytes_read += st.bytes_read;
    totals_.bytes_written += st.bytes_written;
    if (err) std::rethrow_exception(err);
    ++step_count_;
    partial_ = false;
    std::fill(received_.begin(), received_.end(), std::size_t{0});
    st.step = step_count_;
    paths_ = detail::path_descriptors(*tier_);
    for (std::size_t i = 0; i < paths_.size(); ++i) {
      st.paths[i].read_bandwidth = paths_[i].read_bandwidth;
      st.paths[i].write_bandwidth = paths_[i].write_bandwidth;
    }
    st.compute_bound();
    totals_.steps = step_count_;
    totals_.last = st;
    return st;
  }

  template <class G, class H>
  void update(std::size_t s, std::size_t slot, const adamw_step_params& k, std::span<const G> grads,
              std::span<H> model_out) {
    const std::size_t n = length(s);
    float* state = slot_floats(slot);
    std::span<const G> g = grads;
    if constexpr (std::is_same_v<G, float>)
      if (offload_.gradients == gradient_residency::tier) g = std::span<const float>(slot_grad(slot, s), n);
    std::span<float> vmax = options_.amsgrad ? std::span<float>(state + 3 * n, n) : std::span<float>();
    std::span<H> out = model_out.empty() ? std::span<H>() : model_out.subspan(begin(s), n);
    adamw_update_cpu<G, H>(std::span<float>(state, n), std::span<float>(state + n, n),
                           std::span<float>(state + 2 * n, n), vmax, g, out, k, pool_.get());
  }

  static std::string read_small_file(const std::filesystem::path& path) {
    auto fd = open_file(path, O_RDONLY);
    std::string text;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw io_error("read", path, text.size(), errno);
      }
      if (n == 0) break;
      text.append(buf, static_cast<std::size_t>(n));
      if (text.size() > (64u << 20))
        throw integrity_error("checkpoint", path.string(), 0, "manifest refused: larger than 64 MiB");
    }
    return text;
  }

  static void pread_all(int fd, std::span<std::byte> dst, std::uint64_t offset, const std::filesystem::path& path) {
    std::size_t done = 0;
    while (done < dst.size()) {
      const ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw io_error("pread", path, offset + done, errno);
      }
      if (n == 0)
        throw integrity_error("checkpoint", path.string(), offset + done, "data file ends early (truncated)");
      done += static_cast<std::size_t>(n);
    }
  }

  static void pwrite_all(int fd, std::span<const std::byte> src, std::uint64_t offset,
                         const std::filesystem::path& path) {
    std::size_t done = 0;
    while (done < src.size()) {
      const ssize_t n = ::pwrite(fd, src.data() + done, src.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == ENOSPC || errno == EDQUOT)
          throw capacity_error(fmt::format("pwrite {} at offset {}: {}", path.string(), offset + done,
                                           detail::errno_text(errno)));
        throw io_error("pwrite", path, offset + done, errno);
      }
      done += static_cast<std::size_t>(n);
    }
  }

  Tier* tier_;
  adamw_options options_;
  offload_options offload_;
  Order order_;
  tracer* tracer_;
  std::size_t params_;
  std::size_t sections_ = 3;
  std::size_t subgroups_ = 0;
  std::size_t slot_bytes_ = 0;
  std::size_t cache_slots_ = 0;
  std::size_t pipeline_slots_ = 0;
  std::unique_ptr<host_budget> budget_;  // before every budgeted allocation: outlives them
  std::vector<budgeted_allocation> slots_;
  budgeted_allocation grad_store_;
  grad_kind grad_kind_ = grad_kind::f32;
  std::vector<std::size_t> free_;
  std::optional<cache_index<Evict>> cache_;
  std::unique_ptr<thread_pool> pool_;
  std::vector<std::string> names_;
  std::vector<std::string> grad_names_;
  std::vector<std::size_t> resident_;  // slot holding the subgroup's state, or npos
  std::vector<bool> dirty_;            // the resident copy is newer than the tier's
  std::vector<std::uint64_t> version_;  // steps applied to the subgroup
  std::vector<std::size_t> received_;   // gradients accepted this step
  std::vector<std::size_t> reading_;    // slot of the read in flight, or npos
  std::vector<io_future> read_futures_;
  std::vector<std::size_t> writing_;    // slot of the write in flight, or npos
  std::vector<io_future> write_futures_;
  std::deque<std::size_t> write_queue_;  // subgroups with writes in flight, oldest first
  std::vector<std::size_t> stranded_;    // resident because their write failed
  std::size_t reads_in_flight_ = 0;
  std::vector<tier_descriptor> paths_;
  std::uint64_t step_count_ = 0;
  bool partial_ = false;
  double partial_lr_ = 0;
  offload_stats totals_;
};

}  // namespace strata
