#pragma once
/// subgroup_pipeline: moves subgroups' state between a tier, host slots and an executor's device
/// while a kernel updates each of them once per pass, with the transfers hidden behind the
/// updates. It is the reusable half of an offloaded optimizer (offloaded_adamw is a facade over
/// it); give it a tier stack, an eviction policy for its host cache, an executor and an update
/// site policy, and a kernel that says how to update one subgroup.
///
/// One thread (the caller's) drives a pass as an event loop: it starts transfers and updates,
/// and sleeps until one of them completes; completions only post a message, so no thread ever
/// blocks on a transfer, a permit or a stream. What it keeps moving at once:
/// - reads, per path: up to `prefetch_depth` subgroups of each path read ahead of the update (in
///   the pass's order), so every path streams at its own speed and a slow one never holds back a
///   fast one; a host slot is always kept for the next subgroup the update needs, so read-ahead
///   cannot starve it;
/// - writes, per path: up to `write_behind_depth` in flight on each path, oldest first. With
///   `eager_writes`, a cached subgroup that the order will push out of the cache before the pass
///   ends is written right after its update (it stays cached, clean), so the write stream starts
///   with the pass and ends with the reads;
/// - updates: on the host (the kernel's `host` on the pipeline's CPU worker, up to two queued) or
///   on the device (copy in on h2d, kernel on compute, copy back on d2h into a landing slot, with
///   events between the streams; up to `device_depth` at once, so the copy of one overlaps the
///   kernel of another), as the site policy says.
///
/// Commit. A subgroup's update commits at its last event (host: the kernel returned; device: the
/// copy back completed) and only then does the pipeline call `kernel.committed(s)`, mark the state
/// dirty and let a write or the cache have it. A failure before that leaves the old state where
/// it was. No tier write of a subgroup is issued before its update committed.
///
/// Failures. The first error stops new work; the pass waits for everything in flight, clears the
/// streams (sync) and rethrows it. Subgroups whose update committed keep it (in the cache, on the
/// tier, or in their slot when their write failed: written first by the next pass or flush());
/// the others are at the previous pass. Run the pass again with the remaining subgroups.
///
/// The kernel, for subgroup `s` (`slot`: its bytes of the host slot, the state then its side
/// object; `device`: the whole device slot, the state then `device_extra_bytes` of scratch):
///   void host(std::size_t s, std::span<std::byte> slot);   on the CPU worker; it must either
///                                                           throw before changing the state or
///                                                           not throw
///   void committed(std::size_t s);                          on the driving thread
/// and, when the site policy may choose the device:
///   void device_in(std::size_t s, std::span<std::byte> slot, std::span<std::byte> device, stream&);
///   void device_update(std::size_t s, std::span<std::byte> device, Exec&);     enqueue on compute
///   void device_out(std::size_t s, std::span<std::byte> device, stream&);
/// (device_in/out enqueue the kernel's own copies, e.g. gradients in and a 16-bit model copy out;
/// the pipeline copies the state).
///
/// Not thread-safe: one thread calls at a time. Every call returns with nothing in flight.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/trace.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_stream.hpp"
#include "strata/pipeline/host_budget.hpp"
#include "strata/tier/tier_paths.hpp"
#include "strata/pipeline/slot_pool.hpp"
#include "strata/pipeline/subgroup_state.hpp"
#include "strata/policy/eviction_policy.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// One subgroup as the pipeline stores it: its state object and, optionally, a side object read
/// into the slot after the state with every read (never written by the pipeline: e.g. fp32
/// gradients that backward wrote to the tier).
struct pipeline_object {
  std::string name;
  std::uint64_t bytes = 0;
  std::string aux_name{};
  std::uint64_t aux_bytes = 0;
};

/// Depths and sizes of a subgroup_pipeline.
struct pipeline_options {
  std::size_t cache_slots = 0;         ///< subgroups the host cache keeps between passes
  std::size_t prefetch_depth = 2;      ///< subgroups read ahead, per path (0: only the next one)
  std::size_t write_behind_depth = 2;  ///< writes in flight, per path (at least 1)
  std::size_t device_depth = 2;        ///< device updates in flight, when the site uses the device
  std::size_t device_extra_bytes = 0;  ///< device scratch per subgroup beyond its state (the kernel's)
  bool eager_writes = true;            ///< write cached subgroups the order will evict right after their update
  std::string trace_prefix = "pipeline";  ///< span names: <prefix>.read_wait, .compute, .write_wait, .device_update

  /// Host slots these options need: the cache, the read-ahead, the writes and the one updating.
  [[nodiscard]] std::size_t host_slots() const noexcept { return cache_slots + prefetch_depth + write_behind_depth + 1; }

  void validate() const {
    STRATA_EXPECTS(write_behind_depth >= 1, config_error, "pipeline_options: write_behind_depth must be at least 1");
    STRATA_EXPECTS(prefetch_depth <= 4096 && write_behind_depth <= 4096 && device_depth <= 4096, config_error,
                   "pipeline_options: prefetch_depth {}, write_behind_depth {} or device_depth {} above 4096",
                   prefetch_depth, write_behind_depth, device_depth);
  }
};

/// What one pass did. Times are the driving thread's, split by what it waited for (they never
/// overlap, so they add up to at most total_s).
struct pass_stats {
  std::size_t updated = 0;          ///< subgroups whose update committed
  std::size_t host_updates = 0;
  std::size_t device_updates = 0;
  double read_wait_s = 0;           ///< waiting for the state the next update needs
  double compute_s = 0;             ///< waiting while an update ran and nothing else was needed
  double kernel_s = 0;              ///< host kernels' own time, summed (they run one at a time)
  double write_wait_s = 0;          ///< waiting for writes (slots they hold, the end of the pass)
  double total_s = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t cache_misses = 0;
  std::uint64_t bytes_read = 0;     ///< state and side objects
  std::uint64_t bytes_written = 0;
  std::vector<std::uint64_t> path_read;     ///< per path
  std::vector<std::uint64_t> path_written;  ///< per path
};

namespace detail {
template <class K>
concept pipeline_host_kernel = requires(K& k, std::size_t s, std::span<std::byte> slot) {
  k.host(s, slot);
  k.committed(s);
};
template <class K, class Exec>
concept pipeline_device_kernel =
    requires(K& k, std::size_t s, std::span<std::byte> slot, std::span<std::byte> dev, Exec& e) {
      k.device_in(s, slot, dev, e.h2d());
      k.device_update(s, dev, e);
      k.device_out(s, dev, e.d2h());
    };
/// A kernel seen through function pointers, so that the pipeline's machinery is compiled once per
/// pipeline type rather than once per kernel type (a call per subgroup costs nothing).
template <class Exec>
struct kernel_ref {
  using stream_t = typename Exec::stream_type;
  void* self = nullptr;
  void (*host)(void*, std::size_t, std::span<std::byte>) = nullptr;
  void (*committed)(void*, std::size_t) = nullptr;
  void (*device_in)(void*, std::size_t, std::span<std::byte>, std::span<std::byte>, stream_t&) = nullptr;
  void (*device_update)(void*, std::size_t, std::span<std::byte>, Exec&) = nullptr;
  void (*device_out)(void*, std::size_t, std::span<std::byte>, stream_t&) = nullptr;

  template <class K>
  static kernel_ref of(K& k) {
    kernel_ref r;
    r.self = &k;
    r.host = [](void* p, std::size_t s, std::span<std::byte> slot) { static_cast<K*>(p)->host(s, slot); };
    r.committed = [](void* p, std::size_t s) { static_cast<K*>(p)->committed(s); };
    if constexpr (pipeline_device_kernel<K, Exec>) {
      r.device_in = [](void* p, std::size_t s, std::span<std::byte> slot, std::span<std::byte> dev, stream_t& st) {
        static_cast<K*>(p)->device_in(s, slot, dev, st);
      };
      r.device_update = [](void* p, std::size_t s, std::span<std::byte> dev, Exec& e) {
        static_cast<K*>(p)->device_update(s, dev, e);
      };
      r.device_out = [](void* p, std::size_t s, std::span<std::byte> dev, stream_t& st) {
        static_cast<K*>(p)->device_out(s, dev, st);
      };
    }
    return r;
  }
};

/// The tier as the pipeline core sees it: requests through any_tier, and where objects are.
struct pipeline_tier {
  any_tier tier;
  std::function<std::optional<std::size_t>(std::string_view)> placed_path;  ///< nullopt: not placed yet
  std::function<std::vector<tier_descriptor>()> paths;
};

/// Everything of subgroup_pipeline that does not depend on the tier's or the policy's type (both
/// are type-erased: one virtual call per request or subgroup event), so that it is compiled once
/// per executor and site rather than once per tier stack and policy.
template <executor Exec, update_site Site>
class pipeline_core {
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_host_updates = 2;  // queued on the CPU worker, so it never idles
  using clock = std::chrono::steady_clock;

 public:
  using executor_type = Exec;
  using site_type = Site;

  template <eviction_policy Evict>
  pipeline_core(pipeline_tier tier, Exec& exec, host_budget& budget, std::vector<pipeline_object> objects,
                pipeline_options o, Evict evict, Site site, tracer* trace)
      : tier_(std::move(tier.tier)),
        placed_path_(std::move(tier.placed_path)),
        describe_paths_(std::move(tier.paths)),
        exec_(&exec),
        objects_(std::move(objects)),
        opts_(std::move(o)),
        site_(std::move(site)),
        tracer_(trace),
        pool_(budget, exec, pool_options(objects_, opts_, site_), std::move(evict)),
        cpu_(opts_.trace_prefix + ".cpu") {
    opts_.validate();
    STRATA_EXPECTS(!objects_.empty(), config_error, "subgroup_pipeline: no subgroups");
    STRATA_EXPECTS(!site_.uses_device() || opts_.device_depth > 0, config_error,
                   "subgroup_pipeline: the update site may choose the device, but device_depth is 0");
    recs_.resize(objects_.size());
    wanted_.assign(objects_.size(), false);
    paths_ = describe_paths_();
    path_reads_.assign(paths_.size(), 0);
    path_writes_.assign(paths_.size() + 1, 0);  // the last: objects not placed yet
    write_queue_.resize(paths_.size() + 1);
  }
  pipeline_core(const pipeline_core&) = delete;
  pipeline_core& operator=(const pipeline_core&) = delete;

  /// Host slot bytes for `objects` (the largest state plus side object).
  [[nodiscard]] static std::size_t host_slot_bytes(std::span<const pipeline_object> objects) {
    std::uint64_t b = 0;
    for (const auto& o : objects) b = std::max(b, o.bytes + o.aux_bytes);
    return static_cast<std::size_t>(b);
  }

  // --- passes -------------------------------------------------------------------------------------

  /// Gives every subgroup its first state, `fill(s, state bytes)` in a host slot, and writes it to
  /// the tier, up to write_behind_depth x paths writes in flight (a multipath places each object
  /// as it is written). The cache starts empty.
  template <class Fill>
  void initialize(Fill&& fill) {
    initialize_with(std::function<void(std::size_t, std::span<std::byte>)>(std::ref(fill)));
  }

  /// Updates the subgroups of `todo` (in that order; a subsequence of `order`) once each through
  /// `kernel`. `order` is the pass's whole order and `next` the next pass's (for the cache
  /// policy); `step` numbers the pass for the site policy. See the file comment for failures.
  template <class Kernel>
    requires detail::pipeline_host_kernel<Kernel>
  pass_stats run(std::span<const std::size_t> order, std::span<const std::size_t> next,
                 std::span<const std::size_t> todo, std::uint64_t step, Kernel& kernel) {
    if constexpr (!detail::pipeline_device_kernel<Kernel, Exec>)
      STRATA_EXPECTS(!site_.uses_device(), config_error,
                     "subgroup_pipeline::run: the update site may choose the device, but the kernel has no device "
                     "update");
    auto ref = detail::kernel_ref<Exec>::of(kernel);
    return run_with(order, next, todo, step, ref);
  }

  /// Calls fn(s, state bytes) for every subgroup in index order: from its host slot when it has
  /// one, else read through free slots (several at once).
  template <class F>
  void visit(F&& fn) {
    visit_with(std::function<void(std::size_t, std::span<const std::byte>)>(std::ref(fn)));
  }

  /// Writes every subgroup whose host copy is newer than the tier's, then flushes the tier: the
  /// tier then holds the whole current state durably.
  void flush() {
    begin_call();
    for (std::size_t s = 0; s < recs_.size(); ++s)
      if (recs_[s].state.phase == subgroup_phase::resident && recs_[s].state.dirty) queue_write(s);
    run_loop([&] { issue_writes(nullptr); }, [] { return true; }, nullptr);
    end_call();
    tier_.flush();
  }

  /// Lends a free host slot to `fn(std::span<std::byte>)` between passes (scratch memory that
  /// costs the budget nothing more); capacity_error when every slot holds a subgroup.
  template <class F>
  decltype(auto) with_free_slot(F&& fn) {
    STRATA_ASSERT(in_flight() == 0);
    const auto slot = pool_.take_host();
    STRATA_EXPECTS(slot.has_value(), capacity_error,
                   "subgroup_pipeline: no free host slot to lend (all {} hold subgroups)", pool_.options().host_slots);
    struct give_back {
      slot_pool<Exec>& pool;
      std::size_t slot;
      ~give_back() { pool.give_host(slot); }
    } guard{pool_, *slot};
    return std::forward<F>(fn)(pool_.host(*slot));
  }

  // --- what it holds --------------------------------------------------------------------------------

  [[nodiscard]] std::size_t subgroup_count() const noexcept { return objects_.size(); }
  [[nodiscard]] const pipeline_object& object(std::size_t s) const { return objects_.at(s); }
  [[nodiscard]] subgroup_state state(std::size_t s) const { return recs_.at(s).state; }
  /// Whether subgroup `s` is in the host cache now.
  [[nodiscard]] bool cached(std::size_t s) const { return pool_.cached(s); }
  /// The paths of the tier (one for a tier that is not a multipath).
  [[nodiscard]] std::size_t path_count() const noexcept { return paths_.size(); }
  [[nodiscard]] const std::vector<tier_descriptor>& paths() const noexcept { return paths_; }
  /// Re-reads the paths' descriptors (bandwidths measured meanwhile).
  void refresh_paths() { paths_ = describe_paths_(); }
  [[nodiscard]] const slot_pool<Exec>& slots() const noexcept { return pool_; }
  [[nodiscard]] const pipeline_options& options() const noexcept { return opts_; }
  [[nodiscard]] const Site& site() const noexcept { return site_; }
  [[nodiscard]] Exec& executor() noexcept { return *exec_; }

 private:
  using kernel_type = detail::kernel_ref<Exec>;

  void initialize_with(const std::function<void(std::size_t, std::span<std::byte>)>& fill) {
    begin_call();
    std::size_t next = 0;
    run_loop(
        [&] {
          while (!err_ && next < objects_.size() && pool_.free_host() > 0) {
            const std::size_t s = next++;
            const std::size_t slot = *pool_.take_host();
            try {
              fill(s, state_span(slot, s));
            } catch (...) {
              pool_.give_host(slot);
              fail(std::current_exception());
              return;
            }
            auto& r = recs_[s];
            r = {};
            r.slot = slot;
            r.state = {subgroup_phase::resident, true};
            queue_write(s);
          }
          issue_writes(nullptr);
        },
        [&] { return next >= objects_.size(); }, nullptr);
    end_call();
  }

  pass_stats run_with(std::span<const std::size_t> order, std::span<const std::size_t> next,
                      std::span<const std::size_t> todo, std::uint64_t step, kernel_type& kernel) {
    const auto t0 = clock::now();
    trace_span pass_span(tracer_, span_name("pass"));
    begin_call();
    position_.assign(objects_.size(), npos);
    for (std::size_t i = 0; i < order.size(); ++i) {
      STRATA_EXPECTS(order[i] < objects_.size() && position_[order[i]] == npos, config_error,
                     "subgroup_pipeline::run: the order names subgroup {} twice or past the {} subgroups", order[i],
                     objects_.size());
      position_[order[i]] = i;
    }
    std::vector<bool> wanted(objects_.size(), false);
    for (const std::size_t s : todo) {
      STRATA_EXPECTS(s < objects_.size() && position_[s] != npos && !wanted[s], config_error,
                     "subgroup_pipeline::run: subgroup {} is not in the order, or listed twice", s);
      wanted[s] = true;
    }
    pass_stats st;
    st.path_read.assign(paths_.size(), 0);
    st.path_written.assign(paths_.size(), 0);
    struct forget_stats {  // stats_ never outlives `st`
      pass_stats*& p;
      ~forget_stats() { p = nullptr; }
    } forget{stats_};
    stats_ = &st;
    if (auto* c = pool_.cache()) c->begin_step(order, next);
    todo_.assign(todo.begin(), todo.end());
    wanted_ = std::move(wanted);
    order_size_ = order.size();
    step_ = step;
    pos_ = 0;
    for (auto& r : recs_) r.aux_ready = false;  // side objects (gradients) are per pass
    // Subgroups whose write failed in an earlier call hold the only copy of their state: first.
    for (std::size_t s = 0; s < recs_.size(); ++s)
      if (recs_[s].state.phase == subgroup_phase::resident && recs_[s].state.dirty && !pool_.cached(s) &&
          !wanted_[s])
        queue_write(s);

    run_loop([&] { schedule(kernel); }, [&] { return pos_ >= todo_.size(); }, &kernel);

    wanted_.assign(objects_.size(), false);
    // Read ahead but never updated (a failed pass): clean, so the slot goes back.
    for (std::size_t s = 0; s < recs_.size(); ++s)
      if (recs_[s].state.phase == subgroup_phase::resident && !recs_[s].state.dirty && !pool_.cached(s)) drop(s);
    st.total_s = seconds_since(t0);
    end_call();
    return st;
  }

  void visit_with(const std::function<void(std::size_t, std::span<const std::byte>)>& fn) {
    begin_call();
    std::size_t next = 0;   // next subgroup to hand to fn
    std::size_t issue = 0;  // next subgroup to read
    std::vector<char> borrowed(objects_.size(), 0);
    run_loop(
        [&] {
          while (!err_ && next < objects_.size()) {
            auto& r = recs_[next];
            if (r.state.phase == subgroup_phase::resident) {
              try {
                fn(next, std::span<const std::byte>(state_span(r.slot, next)));
              } catch (...) {
                fail(std::current_exception());
                return;
              }
              if (borrowed[next] != 0) drop(next);
              ++next;
              continue;
            }
            if (r.state.phase == subgroup_phase::reading) break;
            STRATA_ASSERT(r.state.phase == subgroup_phase::on_tier);
            issue = std::max(issue, next);
            break;
          }
          while (!err_ && issue < objects_.size() && pool_.free_host() > 0) {
            if (recs_[issue].state.phase == subgroup_phase::on_tier) {
              borrowed[issue] = 1;
              issue_read(issue, /*with_aux=*/false);
            }
            ++issue;
          }
        },
        [&] { return next >= objects_.size(); }, nullptr);
    for (std::size_t s = 0; s < recs_.size(); ++s)  // after a failure: give borrowed slots back
      if (borrowed[s] != 0 && recs_[s].state.phase == subgroup_phase::resident && !recs_[s].state.dirty) drop(s);
    end_call();
  }


  struct record {
    subgroup_state state{};
    std::size_t slot = npos;     // host slot while the state has one
    std::size_t landing = npos;  // landing slot of a device update
    std::size_t device = npos;   // device slot of a device update
    std::size_t path = npos;     // path of the state object (known once placed)
    std::size_t aux_path = npos;
    bool aux_ready = false;      // the side object is in the slot for this pass
    bool aux_reading = false;
    bool queued = false;         // in a write queue
    std::size_t write_queue = 0;  // the queue its write in flight came from
    bool hit = false;            // was cached when its update started
  };

  enum class msg_kind : std::uint8_t { read, aux_read, write, host_update, h2d, kernel, d2h };
  struct message {
    msg_kind kind;
    std::size_t s;
    std::exception_ptr error;
    double seconds = 0;  // a host kernel's duration
  };
  enum class waiting_for : std::uint8_t { read, compute, write };

  static slot_pool_options pool_options(const std::vector<pipeline_object>& objects, const pipeline_options& o,
                                        const Site& site) {
    slot_pool_options p;
    p.host_slots = o.host_slots();
    p.host_slot_bytes = host_slot_bytes(objects);
    p.cache_slots = std::min(o.cache_slots, objects.size());
    if (site.uses_device()) {
      p.device_slots = o.device_depth;
      std::uint64_t state = 0;
      for (const auto& ob : objects) state = std::max(state, ob.bytes);
      p.device_slot_bytes = static_cast<std::size_t>(state + o.device_extra_bytes);
    }
    return p;
  }

  // --- the event loop ---------------------------------------------------------------------------

  void begin_call() {
    STRATA_ASSERT(in_flight() == 0);
    err_ = nullptr;
  }
  void end_call() {
    for (auto& q : write_queue_) {
      for (const std::size_t s : q) recs_[s].queued = false;
      q.clear();
    }
    if (err_) {
      if (site_.uses_device()) {
        // Wait for work a failure left running and clear the streams' errors (the first one is
        // ours already); what it reports now is stale.
        sync_streams();
        std::lock_guard lock(mail_mutex_);
        mail_.clear();
      }
      std::rethrow_exception(std::exchange(err_, nullptr));
    }
  }

  void sync_streams() noexcept {
    for (auto* st : {&exec_->h2d(), &exec_->compute(), &exec_->d2h()}) try {
        st->sync();
      } catch (...) {
      }
  }

  // Schedules with `schedule` and handles completions until `started()` holds and nothing is in
  // flight or queued, or an error occurred and what was in flight has drained.
  void run_loop(const std::function<void()>& schedule, const std::function<bool()>& started, kernel_type* kernel) {
    std::vector<message> inbox;
    for (;;) {
      if (!err_) {
        try {
          schedule();
        } catch (...) {
          fail(std::current_exception());
        }
      }
      const bool queued = std::any_of(write_queue_.begin(), write_queue_.end(), [](const auto& q) { return !q.empty(); });
      if (in_flight() == 0 && (err_ || (started() && !queued))) return;
      if (in_flight() == 0) {  // nothing will ever complete: say why instead of waiting forever
        fail(std::make_exception_ptr(capacity_error(fmt::format(
            "subgroup_pipeline: no progress possible: {} of {} host slots are free and nothing is in flight "
            "(subgroups whose writes failed may hold them: flush() retries those writes)",
            pool_.free_host(), pool_.options().host_slots))));
        return;
      }
      const auto why = waiting_reason();
      const auto t0 = clock::now();
      {
        trace_span span(why == waiting_for::compute ? nullptr : tracer_,
                        span_name(why == waiting_for::read ? "read_wait" : "write_wait"));
        std::unique_lock lock(mail_mutex_);
        mail_cv_.wait(lock, [&] { return !mail_.empty(); });
        inbox.swap(mail_);
      }
      if (stats_ != nullptr) {
        const double dt = seconds_since(t0);
        (why == waiting_for::read ? stats_->read_wait_s
                                  : why == waiting_for::compute ? stats_->compute_s : stats_->write_wait_s) += dt;
      }
      for (auto& m : inbox) {
        try {
          handle(m, kernel);
        } catch (...) {  // a kernel's committed() threw, or an allocation failed: drain, then report
          fail(std::current_exception());
        }
      }
      inbox.clear();
    }
  }

  [[nodiscard]] std::size_t in_flight() const noexcept {
    return reads_ + writes_ + host_updates_ + device_updates_ + aux_reads_;
  }

  // What the driver waits for now, for the statistics: an update that runs, else the state the
  // next update needs, else writes.
  [[nodiscard]] waiting_for waiting_reason() const {
    if (host_updates_ > 0) return waiting_for::compute;
    if (!err_ && pos_ < todo_.size()) {
      const auto& r = recs_[todo_[pos_]];
      if (r.state.phase == subgroup_phase::on_tier || r.state.phase == subgroup_phase::reading || r.aux_reading)
        return pool_.free_host() == 0 && r.state.phase == subgroup_phase::on_tier ? waiting_for::write
                                                                                   : waiting_for::read;
    }
    if (device_updates_ > 0) return waiting_for::compute;
    return waiting_for::write;
  }

  // Notifies under the lock: once the driver can see the message it may finish and destroy the
  // pipeline, so the poster must not touch it after unlocking.
  void post(msg_kind k, std::size_t s, std::exception_ptr e, double seconds = 0) noexcept {
    std::lock_guard lock(mail_mutex_);
    mail_.push_back({k, s, std::move(e), seconds});
    mail_cv_.notify_one();
  }

  void fail(std::exception_ptr e) noexcept {
    if (!err_) err_ = std::move(e);
  }

  // Applies an event through the state machine; an illegal one is a bug in this class.
  void apply(std::size_t s, subgroup_event e) {
    const auto next = transition(recs_[s].state, e);
    if (!next) [[unlikely]] {
      std::fprintf(stderr, "strata: subgroup_pipeline: event %s is illegal for subgroup %zu in phase %s%s\n",
                   std::string(to_string(e)).c_str(), s, std::string(to_string(recs_[s].state.phase)).c_str(),
                   recs_[s].state.dirty ? " (dirty)" : "");
      STRATA_ASSERT(next.has_value());
    }
    recs_[s].state = *next;
  }

  // --- scheduling -------------------------------------------------------------------------------

  void schedule(kernel_type& kernel) {
    issue_writes(stats_);
    start_updates(kernel);
    issue_reads();
  }

  void issue_writes(pass_stats* st) {
    for (std::size_t p = 0; p < write_queue_.size(); ++p) {
      auto& q = write_queue_[p];
      const std::size_t depth = opts_.write_behind_depth * (p == paths_.size() ? paths_.size() : 1);
      while (!q.empty() && path_writes_[p] < depth) {
        const std::size_t s = q.front();
        q.erase(q.begin());
        auto& r = recs_[s];
        r.queued = false;
        if (r.state.phase != subgroup_phase::resident || !r.state.dirty) continue;
        issue_write(s, p, st);
      }
    }
  }

  void start_updates(kernel_type& kernel) {
    while (!err_ && pos_ < todo_.size()) {
      const std::size_t s = todo_[pos_];
      auto& r = recs_[s];
      if (r.state.phase != subgroup_phase::resident || r.aux_reading) return;
      if (has_aux(s) && !r.aux_ready) return;  // issue_reads asks for it
      const site_kind where = site_.site(position_[s], s, step_);
      if (where == site_kind::host) {
        if (host_updates_ >= max_host_updates) return;
        begin_update(s);
        start_host_update(s, kernel);
      } else {
        STRATA_EXPECTS(kernel.device_update != nullptr && site_.uses_device(), config_error,
                       "subgroup_pipeline: the site policy chose the device for subgroup {}, but says it never uses "
                       "the device or the kernel has no device update",
                       s);
        if (pool_.free_device() == 0) return;
        begin_update(s);
        start_device_update(s, kernel);
      }
      ++pos_;
    }
  }

  void begin_update(std::size_t s) {
    auto& r = recs_[s];
    r.hit = pool_.cached(s);
    if (auto* c = pool_.cache(); c != nullptr && r.hit) c->access(s);  // a hit is used now
    if (stats_ != nullptr) ++(r.hit ? stats_->cache_hits : stats_->cache_misses);
    pool_.pin(s);
    wanted_[s] = false;
  }

  // Reads for the subgroups the update needs next: per path, up to prefetch_depth subgroups ahead
  // in the pass's order, while host slots last, keeping one for every subgroup that comes earlier
  // in the order and waits for its path (so read-ahead never takes the slot of an earlier one).
  void issue_reads() {
    if (err_) return;
    std::vector<std::size_t> ahead(paths_.size(), 0);
    std::size_t reserved = 0;
    std::size_t saturated = 0;  // paths with their read-ahead full
    for (std::size_t j = pos_; j < todo_.size(); ++j) {
      const std::size_t s = todo_[j];
      auto& r = recs_[s];
      if (r.state.phase == subgroup_phase::on_tier) {
        const std::size_t p = path_of(s);
        const bool first = j == pos_;
        if ((first || ahead[p] < opts_.prefetch_depth) && pool_.free_host() > reserved) {
          issue_read(s, has_aux(s));
        } else {
          ++reserved;  // it needs a slot before anything after it
          if (pool_.free_host() <= reserved) return;
          continue;
        }
      } else if (r.state.phase == subgroup_phase::resident && has_aux(s) && !r.aux_ready && !r.aux_reading) {
        issue_aux_read(s);  // a cached subgroup still needs its side object
      }
      if (r.state.phase == subgroup_phase::reading ||
          (r.state.phase == subgroup_phase::resident && !pool_.cached(s))) {
        const std::size_t p = path_of(s);
        if (++ahead[p] == std::max<std::size_t>(opts_.prefetch_depth, 1) && ++saturated == paths_.size()) return;
      }
    }
  }

  // --- transfers ----------------------------------------------------------------------------------

  [[nodiscard]] bool has_aux(std::size_t s) const noexcept { return objects_[s].aux_bytes > 0; }

  // The path holding the state object, once it is placed.
  [[nodiscard]] std::optional<std::size_t> known_path(std::size_t s) {
    auto& r = recs_[s];
    if (r.path == npos) {
      const auto p = placed_path_(objects_[s].name);
      if (!p) return std::nullopt;
      r.path = std::min(*p, paths_.size() - 1);
    }
    return r.path;
  }
  [[nodiscard]] std::size_t path_of(std::size_t s) { return known_path(s).value_or(0); }
  [[nodiscard]] std::size_t aux_path_of(std::size_t s) {
    auto& r = recs_[s];
    if (r.aux_path == npos) r.aux_path = std::min(placed_path_(objects_[s].aux_name).value_or(0), paths_.size() - 1);
    return r.aux_path;
  }

  [[nodiscard]] std::span<std::byte> state_span(std::size_t slot, std::size_t s) noexcept {
    return pool_.host(slot).first(static_cast<std::size_t>(objects_[s].bytes));
  }
  // What a kernel sees of a host slot: the subgroup's state, then its side object.
  [[nodiscard]] std::span<std::byte> slot_span(std::size_t slot, std::size_t s) noexcept {
    return pool_.host(slot).first(static_cast<std::size_t>(objects_[s].bytes + objects_[s].aux_bytes));
  }
  [[nodiscard]] std::span<std::byte> aux_span(std::size_t slot, std::size_t s) noexcept {
    return pool_.host(slot).subspan(static_cast<std::size_t>(objects_[s].bytes),
                                    static_cast<std::size_t>(objects_[s].aux_bytes));
  }

  template <class Issue>
  static completion issue_safely(Issue&& issue) noexcept {
    try {
      return std::forward<Issue>(issue)();
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  void count(bool write, std::size_t path, std::uint64_t bytes) {
    if (stats_ == nullptr) return;
    (write ? stats_->bytes_written : stats_->bytes_read) += bytes;
    (write ? stats_->path_written : stats_->path_read)[path] += bytes;
  }

  void issue_read(std::size_t s, bool with_aux) {
    auto& r = recs_[s];
    const auto slot = pool_.take_host();
    STRATA_ASSERT(slot.has_value());
    r.slot = *slot;
    apply(s, subgroup_event::read);
    r.aux_ready = false;
    const std::size_t p = path_of(s);
    ++path_reads_[p];
    ++reads_;
    count(false, p, objects_[s].bytes);
    std::vector<completion> parts;
    parts.push_back(issue_safely([&] { return tier_.read(objects_[s].name, 0, state_span(r.slot, s)); }));
    if (with_aux) {
      count(false, aux_path_of(s), objects_[s].aux_bytes);
      parts.push_back(issue_safely([&] { return tier_.read(objects_[s].aux_name, 0, aux_span(r.slot, s)); }));
    }
    when_all(std::move(parts)).on_complete([this, s](std::exception_ptr e) { post(msg_kind::read, s, std::move(e)); });
  }

  void issue_aux_read(std::size_t s) {
    auto& r = recs_[s];
    r.aux_reading = true;
    pool_.pin(s);
    ++aux_reads_;
    count(false, aux_path_of(s), objects_[s].aux_bytes);
    issue_safely([&] { return tier_.read(objects_[s].aux_name, 0, aux_span(r.slot, s)); })
        .on_complete([this, s](std::exception_ptr e) { post(msg_kind::aux_read, s, std::move(e)); });
  }

  // Queues a write on the subgroup's path (the last queue while a multipath has not placed it).
  void queue_write(std::size_t s) {
    auto& r = recs_[s];
    if (r.queued) return;
    r.queued = true;
    const auto p = known_path(s);
    write_queue_[p ? *p : paths_.size()].push_back(s);
  }

  void issue_write(std::size_t s, std::size_t queue, pass_stats* st) {
    auto& r = recs_[s];
    apply(s, subgroup_event::write);
    r.write_queue = queue;
    ++path_writes_[queue];
    ++writes_;
    auto done = issue_safely([&] { return tier_.write(objects_[s].name, 0, state_span(r.slot, s)); });
    if (st != nullptr) count(true, path_of(s), objects_[s].bytes);  // placed by now
    done.on_complete([this, s](std::exception_ptr e) { post(msg_kind::write, s, std::move(e)); });
  }

  // The host slot goes back: the subgroup lives on the tier only.
  void drop(std::size_t s) {
    auto& r = recs_[s];
    apply(s, subgroup_event::drop);
    pool_.give_host(r.slot);
    r.slot = npos;
    r.aux_ready = false;
  }

  // --- updates ----------------------------------------------------------------------------------

  void start_host_update(std::size_t s, kernel_type& kernel) {
    auto& r = recs_[s];
    apply(s, subgroup_event::update);
    ++host_updates_;
    struct undo {  // if the task cannot be queued, no message will come: take the update back
      pipeline_core* self;
      std::size_t s;
      bool armed = true;
      ~undo() {
        if (!armed) return;
        --self->host_updates_;
        self->apply(s, subgroup_event::update_failed);
        self->pool_.unpin(s);
      }
    } guard{this, s};
    cpu_.enqueue_host([this, s, slot = slot_span(r.slot, s), &kernel] {
      std::exception_ptr e;
      const auto t0 = clock::now();
      try {
        trace_span span(tracer_, span_name("compute"));
        span.arg("subgroup", s);
        kernel.host(kernel.self, s, slot);
      } catch (...) {
        e = std::current_exception();
      }
      post(msg_kind::host_update, s, std::move(e), seconds_since(t0));  // never throws: the worker must go on
    });
    guard.armed = false;
  }

  void start_device_update(std::size_t s, kernel_type& kernel) {
    auto& r = recs_[s];
    r.device = *pool_.take_device();
    r.landing = *pool_.take_landing();
    apply(s, subgroup_event::h2d);
    ++device_updates_;
    const auto bytes = static_cast<std::size_t>(objects_[s].bytes);
    const auto host = slot_span(r.slot, s);
    const auto dev = pool_.device(r.device);
    const auto landing = pool_.host(r.landing).first(bytes);
    auto& h2d = exec_->h2d();
    auto& compute = exec_->compute();
    auto& d2h = exec_->d2h();
    try {
      h2d.copy_to_device(dev.first(bytes), host.first(bytes));
      kernel.device_in(kernel.self, s, host, dev, h2d);
      const auto in = h2d.record();
      in.completion().on_complete([this, s](std::exception_ptr e) { post(msg_kind::h2d, s, std::move(e)); });
      compute.wait(in);
      kernel.device_update(kernel.self, s, dev, *exec_);
      const auto updated = compute.record();
      updated.completion().on_complete([this, s](std::exception_ptr e) { post(msg_kind::kernel, s, std::move(e)); });
      d2h.wait(updated);
      d2h.copy_to_host(landing, dev.first(bytes));
      kernel.device_out(kernel.self, s, dev, d2h);
      d2h.record().completion().on_complete([this, s](std::exception_ptr e) { post(msg_kind::d2h, s, std::move(e)); });
    } catch (...) {
      // Enqueueing failed part-way: wait for what was enqueued (this path is rare), then fail.
      fail(std::current_exception());
      sync_streams();  // the events recorded before the failure have completed and posted
      {
        std::lock_guard lock(mail_mutex_);
        std::erase_if(mail_, [s](const message& m) { return m.s == s && m.kind >= msg_kind::h2d; });
      }
      device_failed(s);
    }
  }

  void device_failed(std::size_t s) {
    auto& r = recs_[s];
    apply(s, subgroup_event::device_failed);
    pool_.give_device(r.device);
    pool_.give_landing(r.landing);
    r.device = r.landing = npos;
    --device_updates_;
    pool_.unpin(s);
  }

  // The update of `s` committed: the state is new and dirty. Decide where it goes next.
  void committed(std::size_t s, kernel_type* kernel) {
    auto& r = recs_[s];
    pool_.unpin(s);
    if (stats_ != nullptr) ++stats_->updated;
    if (kernel != nullptr) kernel->committed(kernel->self, s);
    auto* cache = pool_.cache();
    bool keep = r.hit;
    if (!keep && cache != nullptr) keep = admit(s);
    if (!keep) {
      queue_write(s);  // written behind, then dropped
      return;
    }
    // Cached. If the order will push it out before the pass ends, write it now.
    if (opts_.eager_writes && position_[s] + cache->capacity() < order_size_) queue_write(s);
  }

  // Admits `s` to the cache, evicting a victim; false when every cached subgroup is pinned.
  bool admit(std::size_t s) {
    auto& cache = *pool_.cache();
    if (cache.size() >= cache.capacity() && !cache.has_victim()) return false;
    const auto look = cache.access(s);
    if (look.evicted) evict(*look.evicted);
    return true;
  }

  void evict(std::size_t v) {
    auto& r = recs_[v];
    switch (r.state.phase) {
      case subgroup_phase::resident:
        // Its slot goes back even when this pass still has to update it (it is read again then):
        // the host slots are sized for the cache and the read-ahead, nothing else.
        if (r.state.dirty)
          queue_write(v);  // dropped when the write ends
        else
          drop(v);
        return;
      case subgroup_phase::writing: return;  // dropped when the write ends
      default: STRATA_ASSERT(false && "a subgroup in flight was evicted");
    }
  }

  // --- completions --------------------------------------------------------------------------------

  void handle(message& m, kernel_type* kernel) {
    const std::size_t s = m.s;
    auto& r = recs_[s];
    switch (m.kind) {
      case msg_kind::read: {
        --reads_;
        --path_reads_[path_of(s)];
        if (m.error) {
          apply(s, subgroup_event::read_failed);
          pool_.give_host(r.slot);
          r.slot = npos;
          fail(m.error);
        } else {
          apply(s, subgroup_event::read_done);
          r.aux_ready = has_aux(s);
        }
        return;
      }
      case msg_kind::aux_read:
        --aux_reads_;
        r.aux_reading = false;
        pool_.unpin(s);
        if (m.error)
          fail(m.error);
        else
          r.aux_ready = true;
        return;
      case msg_kind::write: {
        --writes_;
        --path_writes_[r.write_queue];
        if (m.error) {
          apply(s, subgroup_event::write_failed);  // the slot holds the only copy: it stays
          fail(m.error);
          return;
        }
        apply(s, subgroup_event::write_done);
        if (!pool_.cached(s)) drop(s);
        return;
      }
      case msg_kind::host_update:
        --host_updates_;
        if (stats_ != nullptr) stats_->kernel_s += m.seconds;
        if (m.error) {
          apply(s, subgroup_event::update_failed);
          pool_.unpin(s);
          fail(m.error);
          return;
        }
        apply(s, subgroup_event::update_done);
        if (stats_ != nullptr) ++stats_->host_updates;
        committed(s, kernel);
        return;
      case msg_kind::h2d:
      case msg_kind::kernel:
      case msg_kind::d2h:
        handle_device(m, kernel);
        return;
    }
  }

  void handle_device(message& m, kernel_type* kernel) {
    const std::size_t s = m.s;
    auto& r = recs_[s];
    if (m.kind != msg_kind::d2h) {  // progress only; the copy back decides
      // After a failure a host stream skips its waits, so the copy back may report before these:
      // then they are stale.
      const auto expected = m.kind == msg_kind::h2d ? subgroup_phase::to_device : subgroup_phase::on_device;
      if (!m.error && r.state.phase == expected)
        apply(s, m.kind == msg_kind::h2d ? subgroup_event::h2d_done : subgroup_event::kernel_done);
      return;
    }
    if (m.error) {
      fail(m.error);
      device_failed(s);
      return;
    }
    if (r.state.phase == subgroup_phase::to_device) apply(s, subgroup_event::h2d_done);
    if (r.state.phase == subgroup_phase::on_device) apply(s, subgroup_event::kernel_done);
    apply(s, subgroup_event::d2h_done);
    // Commit: the landing slot holds the new state and becomes the subgroup's; its old slot
    // becomes a landing slot.
    pool_.give_landing(std::exchange(r.slot, r.landing));
    r.landing = npos;
    pool_.give_device(r.device);
    r.device = npos;
    --device_updates_;
    if (stats_ != nullptr) ++stats_->device_updates;
    committed(s, kernel);
  }

  [[nodiscard]] std::string span_name(const char* what) const { return opts_.trace_prefix + "." + what; }
  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  any_tier tier_;
  std::function<std::optional<std::size_t>(std::string_view)> placed_path_;
  std::function<std::vector<tier_descriptor>()> describe_paths_;
  Exec* exec_;
  std::vector<pipeline_object> objects_;
  pipeline_options opts_;
  Site site_;
  tracer* tracer_;
  slot_pool<Exec> pool_;
  std::vector<record> recs_;
  std::vector<tier_descriptor> paths_;
  std::vector<std::size_t> path_reads_;   // per path, in flight
  std::vector<std::size_t> path_writes_;  // per path, in flight
  std::vector<std::vector<std::size_t>> write_queue_;  // per path, oldest first
  std::size_t reads_ = 0, writes_ = 0, aux_reads_ = 0, host_updates_ = 0, device_updates_ = 0;
  // The pass in progress.
  std::vector<std::size_t> todo_;
  std::vector<std::size_t> position_;  // place of each subgroup in the pass's order
  std::vector<bool> wanted_;           // in todo, update not started yet
  std::size_t order_size_ = 0;
  std::size_t pos_ = 0;                // next entry of todo_ to start
  std::uint64_t step_ = 0;
  pass_stats* stats_ = nullptr;
  std::exception_ptr err_;
  // Completions post here; only the driving thread reads.
  std::mutex mail_mutex_;
  std::condition_variable mail_cv_;
  std::vector<message> mail_;
  host_stream cpu_;  // last: its worker stops (after its work) before anything it uses goes
};

}  // namespace detail

/// The pipeline over tier stack `Tier`, host cache policy `Evict`, executor `Exec` and update
/// site policy `Site`; see the file comment.
template <tier Tier, eviction_policy Evict, executor Exec, update_site Site>
class subgroup_pipeline : public detail::pipeline_core<Exec, Site> {
  using core = detail::pipeline_core<Exec, Site>;

 public:
  using tier_type = Tier;
  using eviction_type = Evict;

  /// Allocates every slot now (from `budget`, which must outlive the pipeline, and from `exec`);
  /// writes nothing. `tier` and `exec` must outlive the pipeline.
  subgroup_pipeline(Tier& tier, Exec& exec, host_budget& budget, std::vector<pipeline_object> objects,
                    pipeline_options o, Evict evict = Evict{}, Site site = Site{}, tracer* trace = nullptr)
      : core(detail::pipeline_tier{any_tier::ref(tier),
                                   [&tier](std::string_view object) { return detail::placed_path(tier, object); },
                                   [&tier] { return detail::path_descriptors(tier); }},
             exec, budget, std::move(objects), std::move(o), std::move(evict), std::move(site), trace),
        tier_(&tier) {}

  [[nodiscard]] Tier& tier() noexcept { return *tier_; }

 private:
  Tier* tier_;
};

}  // namespace strata
