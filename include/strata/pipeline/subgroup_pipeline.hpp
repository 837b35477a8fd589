#pragma once
/// subgroup_pipeline: moves subgroups' state between a tier, host slots and an executor's device
/// while a kernel (pipeline/kernel.hpp) updates each of them once per pass, with the transfers
/// hidden behind the updates. It is the reusable half of an offloaded optimizer (offloaded_adamw
/// is a facade over it); give it a tier stack, an eviction policy for its host cache, an executor
/// and an update site policy, and a kernel that says how to update one subgroup.
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
/// This class decides what happens when (the passes and their scheduling); how one subgroup
/// moves (read, update, commit, write, completions) is pipeline/detail/pipeline_core.hpp. The
/// tier, the cache policy and the update site are taken type-erased (any_tier,
/// any_eviction_policy, any_update_site), so the pipeline is compiled once per executor, whatever
/// the tier stack and the policies.
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
/// Reads between passes. prefetch(next order) starts reading the subgroups the next pass needs
/// first and returns at once, so those reads run while the caller does other work (a training
/// loop's forward and backward); the next run() takes them over as if it had issued them, and
/// every other call waits for them first. They read into free host slots (the cache's own
/// subgroups stay), so they cost the budget nothing; they change no state, so a failed one is
/// forgotten and the pass reads that subgroup again (and reports that read's error).
///
/// Writes after a pass (pipeline_options::return_before_writes): run() returns once every update
/// committed, with its last writes in flight; the next run() takes them over (a subgroup it
/// updates whose write lands then stays in its slot, not read again), every other call waits for
/// them first. A failed one is raised, typed, by the call that finds it (that run(), or the
/// waiting call: flush(), visit(), ...); its subgroup keeps the only copy in its slot and the next
/// call writes it first, as after any failed write.
///
/// Not thread-safe: one thread calls at a time. Every call returns with nothing in flight but the
/// reads prefetch() started and the writes a run() left behind.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <utility>
#include <vector>

#include "strata/core/budget.hpp"
#include "strata/core/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/trace.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_executor.hpp"
#include "strata/pipeline/detail/pipeline_core.hpp"
#include "strata/pipeline/kernel.hpp"
#include "strata/pipeline/options.hpp"
#include "strata/pipeline/slot_pool.hpp"
#include "strata/pipeline/subgroup_state.hpp"
#include "strata/policy/any_eviction_policy.hpp"
#include "strata/policy/sweep_aware.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// The pipeline over executor `Exec`; see the file comment.
template <executor Exec>
class subgroup_pipeline : private detail::pipeline_core<Exec> {
  using core = detail::pipeline_core<Exec>;
  using typename core::kernel_type;
  using core::npos;

 public:
  using executor_type = Exec;

  /// Allocates every slot now (from `budget`, which must outlive the pipeline, and from `exec`);
  /// writes nothing. `tier` (any tier, or an any_tier that owns or refers to one) and `exec` must
  /// outlive the pipeline; `evict` ranks the host cache; `site` says where each update runs
  /// (always_host by default: the executor is then used for nothing).
  template <tier Tier>
  subgroup_pipeline(Tier& tier, Exec& exec, host_budget& budget, std::vector<pipeline_object> objects,
                    pipeline_options o, any_eviction_policy evict = sweep_aware{}, any_update_site site = {},
                    tracer* trace = nullptr)
      : core(any_tier::ref(tier), exec, budget, std::move(objects), std::move(o), std::move(evict), std::move(site), trace) {}
  /// As above, over a tier given as an any_tier that the pipeline keeps (one that owns its tier,
  /// or refers to one that outlives the pipeline).
  subgroup_pipeline(any_tier&& tier, Exec& exec, host_budget& budget, std::vector<pipeline_object> objects,
                    pipeline_options o, any_eviction_policy evict = sweep_aware{}, any_update_site site = {},
                    tracer* trace = nullptr)
      : core(std::move(tier), exec, budget, std::move(objects), std::move(o), std::move(evict), std::move(site), trace) {}
  subgroup_pipeline(const subgroup_pipeline&) = delete;
  subgroup_pipeline& operator=(const subgroup_pipeline&) = delete;
  /// Waits for reads prefetch() started and writes a run() left (they post to this pipeline).
  ~subgroup_pipeline() { this->settle_noexcept(); }

  // --- passes -------------------------------------------------------------------------------------

  /// Gives every subgroup its first state, `fill(s, state bytes)` in a host slot, and writes it to
  /// the tier, up to write_behind_depth x paths writes in flight (a multipath places each object
  /// as it is written). The cache starts empty.
  template <class Fill>
  void initialize(Fill&& fill) {
    this->settle();
    for (std::size_t s = 0; s < this->recs_.size(); ++s)  // prefetched: about to be replaced
      if (clean_read_ahead(s)) this->drop(s);
    this->begin_call();
    std::size_t next = 0;
    this->run_loop(
        [&] {
          while (!this->err_ && next < this->objects_.size() && this->pool_.free_host() > 0) {
            const std::size_t s = next++;
            const std::size_t slot = *this->pool_.take_host();
            try {
              fill(s, this->state_span(slot, s));
            } catch (...) {
              this->pool_.give_host(slot);
              this->fail(std::current_exception());
              return;
            }
            auto& r = this->recs_[s];
            r = {};
            r.slot = slot;
            r.state = {subgroup_phase::resident, true};
            this->queue_write(s);
          }
          this->issue_writes();
        },
        [&] { return next >= this->objects_.size(); }, nullptr);
    this->end_call();
  }

  /// Updates the subgroups of `todo` (in that order; a subsequence of `order`) once each through
  /// `kernel`. `order` is the pass's whole order and `next` the next pass's (for the cache
  /// policy); `step` numbers the pass for the site policy. See the file comment for failures.
  template <host_kernel Kernel>
  pass_stats run(std::span<const std::size_t> order, std::span<const std::size_t> next,
                 std::span<const std::size_t> todo, std::uint64_t step, Kernel& kernel) {
    return run(order, next, todo, step, kernel, next);
  }
  /// As above; with pipeline_options::read_next_in_pass, once it has started every read it needs
  /// it reads `reads_next` (the part of the next order expected to be updated) rather than `next`.
  template <host_kernel Kernel>
  pass_stats run(std::span<const std::size_t> order, std::span<const std::size_t> next,
                 std::span<const std::size_t> todo, std::uint64_t step, Kernel& kernel,
                 std::span<const std::size_t> reads_next) {
    if constexpr (!device_kernel<Kernel, Exec>)
      STRATA_EXPECTS(!this->site_.uses_device(), config_error,
                     "subgroup_pipeline::run: the update site may choose the device, but the kernel has no device "
                     "update");
    const std::size_t n = this->objects_.size();
    for (const std::size_t s : reads_next)
      STRATA_EXPECTS(s < n, config_error, "subgroup_pipeline::run: subgroup {} to read next is past the {} subgroups", s,
                     n);
    return run_with(order, next, todo, step, kernel_type(kernel), core::pass_kind::closed, reads_next);
  }

  /// An open pass: updates through `kernel` the subgroups that offer() names while it runs, in
  /// the order offered, until close_offers(); with `update` false it only reads them (per path
  /// as far as free host slots allow, one kept free) for the pass that will update them (the
  /// next run(), which takes the reads over). Another thread (the one that offers) goes on
  /// meanwhile: this is how the updates of a step run while backward still hands gradients
  /// over. `order` is the pass's order as planned (offers outside it are a config_error) and
  /// `next` the next pass's. Failures as run(); after one the pass ends without waiting for the
  /// offers, and later ones are ignored (the next run() updates those subgroups). Returns when
  /// the offers were closed and every offered update committed (with return_before_writes,
  /// before their writes land; read only, before the reads land). The thread that drives it must
  /// outlive what it leaves in flight (io_uring cancels the requests of a thread that exits).
  template <host_kernel Kernel>
  pass_stats run_open(std::span<const std::size_t> order, std::span<const std::size_t> next, std::uint64_t step,
                      Kernel& kernel, bool update) {
    if constexpr (!device_kernel<Kernel, Exec>)
      STRATA_EXPECTS(!this->site_.uses_device(), config_error,
                     "subgroup_pipeline::run_open: the update site may choose the device, but the kernel has no "
                     "device update");
    return run_with(order, next, {}, step, kernel_type(kernel),
                    update ? core::pass_kind::open_update : core::pass_kind::open_read);
  }
  /// An open pass that reads the offered subgroups as run_open(..., false) does and, as each is
  /// resident, updates a copy of its state in a free host slot (speculation: one slot kept free
  /// for the reads of later offers; the offered reads come first, the reads ahead of offers
  /// after). The subgroups' own state stays as it was: nothing is written, committed or
  /// counted. The next call takes the copies over as their updates if adopt_speculation(true)
  /// came before it and it is a run() whose kernel makes the same update (the caller's promise:
  /// same constants, same gradients) and can adopt them (adopting_kernel); any other call drops
  /// them. A failed speculative update is dropped (the subgroup is then updated as usual).
  template <host_kernel Kernel>
  pass_stats run_speculative(std::span<const std::size_t> order, std::span<const std::size_t> next,
                             std::uint64_t step, Kernel& kernel) {
    return run_with(order, next, {}, step, kernel_type(kernel), core::pass_kind::open_speculate);
  }
  /// Between calls: with `adopt`, the next run() takes the speculative results over (those of
  /// the subgroups it updates on the host; the others are dropped); without, they are dropped now.
  void adopt_speculation(bool adopt) noexcept {
    this->adopt_next_ = adopt;
    if (!adopt) this->drop_speculation();
  }
  /// Names the next subgroup of the open pass. Thread-safe (the one call that is): from the
  /// thread that produces the work while run_open() drives the pass on another.
  void offer(std::size_t s) noexcept { this->post(core::msg_kind::offer, s, nullptr); }
  /// Ends the offers of the open pass (thread-safe); with `cancel` (an error), the pass drains
  /// what is in flight, starts nothing more and run_open() throws it.
  void close_offers(std::exception_ptr cancel = nullptr) noexcept {
    this->post(core::msg_kind::offer, npos, std::move(cancel));
  }
  /// Drops offers that no open pass took (an open pass that ended on an error leaves them):
  /// call before starting the next open pass.
  void forget_offers() {
    std::lock_guard lock(this->mail_mutex_);
    std::erase_if(this->mail_, [](const auto& m) { return m.kind == core::msg_kind::offer; });
  }

  /// Calls fn(s, state bytes) for every subgroup in index order: from its host slot when it has
  /// one, else read through free slots (several at once).
  template <class F>
  void visit(F&& fn) {
    this->settle();
    this->begin_call();
    const std::size_t n = this->objects_.size();
    if (this->pool_.free_host() == 0)  // (read ahead for the next pass: their slots go back)
      for (std::size_t s = 0; s < n; ++s)
        if (clean_read_ahead(s)) this->drop(s);
    std::size_t next = 0;   // next subgroup to hand to fn
    std::size_t issue = 0;  // next subgroup to read
    std::vector<char> borrowed(n, 0);
    this->run_loop(
        [&] {
          while (!this->err_ && next < n) {
            auto& r = this->recs_[next];
            if (r.state.phase == subgroup_phase::resident) {
              try {
                fn(next, std::span<const std::byte>(this->state_span(r.slot, next)));
              } catch (...) {
                this->fail(std::current_exception());
                return;
              }
              if (borrowed[next] != 0) this->drop(next);
              ++next;
              continue;
            }
            if (r.state.phase == subgroup_phase::reading) break;
            STRATA_ASSERT(r.state.phase == subgroup_phase::on_tier);
            issue = std::max(issue, next);
            break;
          }
          while (!this->err_ && issue < n && this->pool_.free_host() > 0) {
            if (this->recs_[issue].state.phase == subgroup_phase::on_tier) {
              borrowed[issue] = 1;
              this->issue_read(issue, /*with_aux=*/false);
            }
            ++issue;
          }
        },
        [&] { return next >= n; }, nullptr);
    for (std::size_t s = 0; s < n; ++s)  // after a failure: give borrowed slots back
      if (borrowed[s] != 0 && this->recs_[s].state.phase == subgroup_phase::resident && !this->recs_[s].state.dirty)
        this->drop(s);
    this->end_call();
  }

  /// Writes every subgroup whose host copy is newer than the tier's, then flushes the tier: the
  /// tier then holds the whole current state durably.
  void flush() {
    this->settle();
    this->begin_call();
    for (std::size_t s = 0; s < this->recs_.size(); ++s)
      if (resident_dirty(s)) this->queue_write(s);
    this->run_loop([&] { this->issue_writes(); }, [] { return true; }, nullptr);
    this->end_call();
    this->tier_.flush();
  }

  /// Lends a free host slot to `fn(std::span<std::byte>)` between passes (scratch memory that
  /// costs the budget nothing more); capacity_error when every slot holds a subgroup.
  template <class F>
  decltype(auto) with_free_slot(F&& fn) {
    STRATA_ASSERT(this->in_flight() == this->reads_ + this->writes_);  // between passes (prefetch keeps a slot free)
    this->drop_speculation();
    auto& pool = this->pool_;
    const auto slot = pool.take_host();
    STRATA_EXPECTS(slot.has_value(), capacity_error,
                   "subgroup_pipeline: no free host slot to lend (all {} hold subgroups)", pool.options().host_slots);
    struct give_back {
      slot_pool<Exec>& pool;
      std::size_t slot;
      ~give_back() { pool.give_host(slot); }
    } guard{pool, *slot};
    return std::forward<F>(fn)(pool.host(*slot));
  }

  // --- between passes -----------------------------------------------------------------------------

  /// Starts reading, for the next pass, the first subgroups of `order` (that pass's order, or the
  /// part of it expected to be updated) that are neither cached nor resident: per path up to
  /// prefetch_depth (at least 1), as the pass itself reads ahead, while more than one host slot
  /// is free (one stays free for with_free_slot). Returns at once with the reads in flight; see
  /// the file comment. Returns how many reads it started. `depth` (0: prefetch_depth) sets how
  /// many per path: an order known to be the next pass's own (its landing order, say) may fill
  /// every free slot but one.
  std::size_t prefetch(std::span<const std::size_t> order, std::size_t depth = 0) {
    STRATA_ASSERT(this->in_flight() == this->reads_ + this->writes_);
    this->drop_speculation();
    auto& pool = this->pool_;
    const std::size_t n = this->objects_.size();
    const std::size_t paths = this->paths_.size();
    if (depth == 0) depth = std::max<std::size_t>(this->opts_.prefetch_depth, 1);
    std::vector<std::size_t> ahead(paths, 0);
    std::size_t started = 0, saturated = 0;
    for (const std::size_t s : order) {
      STRATA_EXPECTS(s < n, config_error, "subgroup_pipeline::prefetch: subgroup {} past the {} subgroups", s, n);
      auto& r = this->recs_[s];
      const std::size_t path = this->path_of(s);
      if (r.state.phase == subgroup_phase::on_tier) {
        if (ahead[path] >= depth) continue;
        if (pool.free_host() <= 1) break;
        read_early(s);
        ++started;
      } else if (pool.cached(s) ||
                 (r.state.phase != subgroup_phase::reading && r.state.phase != subgroup_phase::resident)) {
        continue;  // cached: nothing to read
      }
      if (++ahead[path] == depth && ++saturated == paths) break;
    }
    return started;
  }

  /// prefetch() that goes on while the caller does other work: reads the subgroups of `order`
  /// (the next pass's, or its first part) that are neither cached nor resident, in that order,
  /// into free host slots (one kept free) as slots free up, i.e. as the writes the last pass
  /// left land, until every one was read, no slot can free up any more (only reads in flight),
  /// or close_offers() (from another thread) ends it. Run it on a thread of its own while the
  /// caller's forward and backward run; that thread must outlive what it leaves in flight
  /// (io_uring cancels the requests of a thread that exits). Returns with its reads in flight,
  /// which the next call takes over as prefetch()'s (the next run() counts them as prefetched).
  /// A failed read changes nothing; a failed write left by the last pass is raised here, typed
  /// (its subgroup keeps the only copy in its slot, written first by the next call). Nothing
  /// but close_offers() may be called on the pipeline meanwhile. Returns how many reads it
  /// started.
  std::size_t read_ahead(std::span<const std::size_t> order) {
    const std::size_t n = this->objects_.size();
    for (const std::size_t s : order)
      STRATA_EXPECTS(s < n, config_error, "subgroup_pipeline::read_ahead: subgroup {} past the {} subgroups", s, n);
    this->begin_call();
    struct end_open {  // open (close_offers() ends it) until it returns, however it does
      subgroup_pipeline* self;
      ~end_open() { self->open_ = false, self->open_updates_ = true; }
    } closing{this};
    this->todo_.assign(order.begin(), order.end());
    this->wanted_.assign(n, false);
    this->pos_ = 0;
    this->open_ = true;
    this->offers_closed_ = false;
    this->open_updates_ = false;
    std::size_t started = 0;
    auto& pool = this->pool_;
    this->run_loop(
        [&] {
          this->issue_writes();
          auto& todo = this->todo_;
          for (; !this->err_ && this->pos_ < todo.size(); ++this->pos_) {
            const std::size_t s = todo[this->pos_];
            const auto phase = this->recs_[s].state.phase;
            if (phase == subgroup_phase::writing && !pool.cached(s)) {
              this->wanted_[s] = true;  // its slot stays when its write lands: read at no cost
              continue;
            }
            if (phase != subgroup_phase::on_tier) continue;  // cached or resident
            if (pool.free_host() <= 1) return;
            read_early(s);
            ++started;
          }
        },
        [&] {
          return this->offers_closed_ || this->pos_ >= this->todo_.size() ||
                 (pool.free_host() <= 1 && this->writes_ == 0 && !this->writes_queued());
        },
        nullptr, core::leave::reads_and_writes);
    this->end_call();
    return started;
  }

  /// Waits for the reads prefetch() started and the writes a run() left behind; what they read
  /// stays for the next pass. Raises a failed write's error (its subgroup keeps its slot).
  void settle() { core::settle(); }

  // --- what it holds ------------------------------------------------------------------------------

  [[nodiscard]] std::size_t subgroup_count() const noexcept { return this->objects_.size(); }
  [[nodiscard]] const pipeline_object& object(std::size_t s) const { return this->objects_.at(s); }
  [[nodiscard]] subgroup_state state(std::size_t s) const { return this->recs_.at(s).state; }
  /// Whether subgroup `s` is in the host cache now.
  [[nodiscard]] bool cached(std::size_t s) const { return this->pool_.cached(s); }
  /// The paths of the tier (one for a tier that is not a multipath).
  [[nodiscard]] std::size_t path_count() const noexcept { return this->paths_.size(); }
  [[nodiscard]] const std::vector<tier_descriptor>& paths() const noexcept { return this->paths_; }
  /// Re-reads the paths' descriptors (bandwidths measured meanwhile).
  void refresh_paths() { this->paths_ = this->tier_.path_descriptors(); }
  [[nodiscard]] const slot_pool<Exec>& slots() const noexcept { return this->pool_; }
  [[nodiscard]] const pipeline_options& options() const noexcept { return this->opts_; }
  [[nodiscard]] const any_update_site& site() const noexcept { return this->site_; }
  [[nodiscard]] Exec& executor() noexcept { return *this->exec_; }
  /// The tier, as the pipeline sees it.
  [[nodiscard]] any_tier& tier() noexcept { return this->tier_; }
  [[nodiscard]] const any_tier& tier() const noexcept { return this->tier_; }

 private:
  [[nodiscard]] bool resident_dirty(std::size_t s) const noexcept {
    const auto& st = this->recs_[s].state;
    return st.phase == subgroup_phase::resident && st.dirty;
  }
  // A read for the next pass, started between passes (counted in that pass as prefetched).
  void read_early(std::size_t s) {
    this->issue_read(s, /*with_aux=*/false);
    this->recs_[s].early = true;
    ++this->early_count_;
    this->early_bytes_ += this->objects_[s].bytes;
    this->early_path_bytes_[this->path_of(s)] += this->objects_[s].bytes;
  }

  // Resident in a slot of its own, clean, not cached: read ahead (by prefetch, or by a pass
  // that failed), so the slot may go back at no cost.
  [[nodiscard]] bool clean_read_ahead(std::size_t s) const {
    const auto& st = this->recs_[s].state;
    return st.phase == subgroup_phase::resident && !st.dirty && !this->pool_.cached(s);
  }

  pass_stats run_with(std::span<const std::size_t> order, std::span<const std::size_t> next,
                      std::span<const std::size_t> todo, std::uint64_t step, const kernel_type& kernel,
                      typename core::pass_kind kind = core::pass_kind::closed,
                      std::span<const std::size_t> reads_next = {}) {
    const auto t0 = core::clock::now();
    trace_span pass_span(this->tracer_, this->span_name("pass"));
    const bool adopt = std::exchange(this->adopt_next_, false) && kind == core::pass_kind::closed;
    this->begin_call(adopt);
    this->adopting_pass_ = adopt;
    this->spec_pos_ = 0;
    const std::size_t n = this->objects_.size();
    auto& position = this->position_;
    position.assign(n, npos);
    for (std::size_t i = 0; i < order.size(); ++i) {
      STRATA_EXPECTS(order[i] < n && position[order[i]] == npos, config_error,
                     "subgroup_pipeline::run: the order names subgroup {} twice or past the {} subgroups", order[i], n);
      position[order[i]] = i;
    }
    std::vector<bool> wanted(n, false);
    for (const std::size_t s : todo) {
      STRATA_EXPECTS(s < n && position[s] != npos && !wanted[s], config_error,
                     "subgroup_pipeline::run: subgroup {} is not in the order, or listed twice", s);
      wanted[s] = true;
    }
    pass_stats st;
    st.path_read.assign(this->paths_.size(), 0);
    st.path_written.assign(this->paths_.size(), 0);
    struct forget_stats {  // stats_ never outlives `st`
      pass_stats*& p;
      ~forget_stats() { p = nullptr; }
    } forget{this->stats_};
    this->stats_ = &st;
    if (auto* c = this->pool_.cache()) c->begin_step(order, next);
    this->todo_.assign(todo.begin(), todo.end());
    this->wanted_ = std::move(wanted);
    this->offered_.assign(n, false);
    if (kind == core::pass_kind::closed || !this->opts_.read_ahead_of_offers)
      this->planned_.clear();
    else
      this->planned_.assign(order.begin(), order.end());
    this->order_size_ = order.size();
    this->step_ = step;
    this->pos_ = 0;
    for (auto& r : this->recs_) {
      r.aux_ready = false;  // side objects (gradients) are per pass
      if (r.state.phase != subgroup_phase::reading) r.for_next = false;
    }
    // (an open pass is followed by the run() that finishes its step: only that one reads ahead)
    if (kind != core::pass_kind::closed)
      this->next_.clear();
    else
      this->next_.assign(reads_next.begin(), reads_next.end());
    // Reads prefetch() started count in this pass; what it read that this pass does not update
    // gives its slot back (the reads still in flight: when they land).
    st.prefetched = std::exchange(this->early_count_, 0);
    st.prefetched_bytes = std::exchange(this->early_bytes_, 0);
    st.bytes_read += st.prefetched_bytes;
    for (std::size_t p = 0; p < this->paths_.size() && p < this->early_path_bytes_.size(); ++p)
      st.path_read[p] += std::exchange(this->early_path_bytes_[p], 0);
    if (kind == core::pass_kind::closed)  // (an open pass keeps them: they are offered later)
      for (std::size_t s = 0; s < n; ++s)
        if (!this->wanted_[s] && clean_read_ahead(s)) this->drop(s);
    // Subgroups whose write failed in an earlier call hold the only copy of their state: first.
    for (std::size_t s = 0; s < n; ++s)
      if (resident_dirty(s) && !this->pool_.cached(s) && !this->wanted_[s]) this->queue_write(s);

    using leave_kind = typename core::leave;
    struct end_open {  // the pass is open until it returns, however it does
      subgroup_pipeline* self;
      ~end_open() { self->open_ = false, self->open_updates_ = true; }
    } closing{this};
    this->open_ = kind != core::pass_kind::closed;
    this->offers_closed_ = false;
    this->open_updates_ = kind != core::pass_kind::open_read;
    const leave_kind left = this->opts_.return_before_writes ? leave_kind::writes : leave_kind::nothing;
    if (kind == core::pass_kind::open_read || kind == core::pass_kind::open_speculate)
      this->run_loop([&] { read_offered(kind == core::pass_kind::open_speculate ? &kernel : nullptr); },
                     [&] { return this->offers_closed_; }, &kernel, leave_kind::reads_and_writes);
    else
      this->run_loop([&] { schedule(kernel); },
                     [&] { return this->pos_ >= this->todo_.size() && (!this->open_ || this->offers_closed_); },
                     &kernel, left);

    this->wanted_.assign(n, false);
    for (std::size_t s = 0; s < n; ++s)
      if (this->recs_[s].state.phase == subgroup_phase::writing) {
        this->recs_[s].left_behind = true;
        ++st.writes_left;
        st.writes_left_bytes += this->objects_[s].bytes;
      }
    this->planned_.clear();
    // Read ahead but never updated (a failed pass): clean, so the slot goes back; an open pass
    // that only reads leaves them to the pass that updates them, and so does an open pass that
    // updates and ended well (what it read ahead of offers that never came: the run() that
    // finishes its step takes them over).
    if (kind == core::pass_kind::closed || (kind == core::pass_kind::open_update && this->err_))
      for (std::size_t s = 0; s < n; ++s)
        if (clean_read_ahead(s) && !this->recs_[s].for_next) this->drop(s);
    if (kind != core::pass_kind::open_speculate) this->drop_speculation();  // (not adopted: no longer needed)
    this->adopting_pass_ = false;
    st.total_s = core::seconds_since(t0);
    this->end_call();
    return st;
  }

  // --- scheduling ---------------------------------------------------------------------------------

  void schedule(const kernel_type& kernel) {
    this->issue_writes();
    start_updates(kernel);
    issue_reads();
    read_planned();
    if (this->opts_.read_next_in_pass) read_next();
  }

  // An open pass with read_ahead_of_offers, once every offered subgroup's read has started: the
  // subgroups of the planned order not offered yet, in that order, per path up to prefetch_depth
  // ahead, into free host slots, one kept free. They are this pass's own (counted in it); marked
  // as prefetch() marks its reads, so a failed one changes nothing and the gradients' side
  // object is read once the subgroup is offered.
  void read_planned() {
    if (this->err_ || !this->open_ || this->offers_closed_ || this->planned_.empty()) return;
    for (std::size_t j = this->pos_; j < this->todo_.size(); ++j)
      if (this->recs_[this->todo_[j]].state.phase == subgroup_phase::on_tier) return;
    const std::size_t depth = std::max<std::size_t>(this->opts_.prefetch_depth, 1);
    std::vector<std::size_t> ahead(this->paths_.size(), 0);
    std::size_t saturated = 0;
    for (const std::size_t s : this->planned_) {
      if (this->offered_[s]) continue;
      auto& r = this->recs_[s];
      const auto phase = r.state.phase;
      const bool waiting = phase == subgroup_phase::reading ||
                           (phase == subgroup_phase::resident && !this->pool_.cached(s));
      if (phase != subgroup_phase::on_tier && !waiting) continue;
      const std::size_t p = this->path_of(s);
      if (ahead[p] == depth) continue;
      if (phase == subgroup_phase::on_tier) {
        if (this->pool_.free_host() <= 1) return;
        this->issue_read(s, /*with_aux=*/false);
        r.early = true;
      }
      if (++ahead[p] == depth && ++saturated == ahead.size()) return;
    }
  }

  // Once every read this pass needs has started (and, open, no more subgroups can be offered):
  // the next pass's first subgroups on the tier, into free host slots, one kept free. Their
  // bytes count in the next pass, as prefetch()'s.
  void read_next() {
    if (this->err_ || (this->open_ && !this->offers_closed_)) return;
    for (std::size_t j = this->pos_; j < this->todo_.size(); ++j)
      if (this->recs_[this->todo_[j]].state.phase == subgroup_phase::on_tier) return;
    for (const std::size_t s : this->next_) {
      auto& r = this->recs_[s];
      if (this->wanted_[s] || r.state.phase != subgroup_phase::on_tier) continue;
      if (this->pool_.free_host() <= 1) return;
      pass_stats* const counted = std::exchange(this->stats_, nullptr);  // (the next pass's bytes)
      read_early(s);
      this->stats_ = counted;
      r.for_next = true;
      r.next_read = true;
      ++this->next_reads_;
    }
  }

  // An open pass that only reads: the offered subgroups, in the order offered, into free host
  // slots (one kept free), marked as prefetch() marks its reads (a failed one changes nothing:
  // the pass that updates the subgroup reads it again); with `speculate`, then the speculative
  // updates of those that are resident; then the reads ahead of offers.
  void read_offered(const kernel_type* speculate) {
    this->issue_writes();
    auto& todo = this->todo_;
    while (!this->err_ && this->pos_ < todo.size()) {
      const std::size_t s = todo[this->pos_];
      auto& r = this->recs_[s];
      if (r.state.phase == subgroup_phase::on_tier) {
        if (this->pool_.free_host() <= 1) return;
        this->issue_read(s, /*with_aux=*/false);
        r.early = true;
      }
      ++this->pos_;
    }
    if (speculate != nullptr) speculate_offered(*speculate);
    read_planned();
  }

  // The speculative updates of the offered subgroups whose state is in a slot, in offer order,
  // while the CPU worker has room and more than one host slot is free. Not after the offers end:
  // the pass then only drains (the step waits for it).
  void speculate_offered(const kernel_type& kernel) {
    auto& todo = this->todo_;
    while (!this->err_ && !this->offers_closed_ && this->spec_pos_ < this->pos_) {
      const std::size_t s = todo[this->spec_pos_];
      const auto& r = this->recs_[s];
      if (r.state.phase == subgroup_phase::reading) return;
      // Not while a write is in flight or queued (a failed one retried: queued as the pass began):
      // its slot may go back when it lands, while the worker still copies from it. Nothing else
      // gives back a resident slot during a pass that commits nothing.
      if (r.state.phase == subgroup_phase::writing) return;
      if (r.state.phase == subgroup_phase::resident && !r.queued && r.spec == npos) {
        if (this->host_updates_ >= core::max_host_updates || this->pool_.free_host() <= 1) return;
        this->start_speculative_update(s, kernel);
      }
      ++this->spec_pos_;
    }
  }

  // Starts the next updates of the pass, in its order, while their state is resident and their
  // site has room (two queued on the CPU worker, a free device slot).
  void start_updates(const kernel_type& kernel) {
    auto& todo = this->todo_;
    while (!this->err_ && this->pos_ < todo.size()) {
      const std::size_t s = todo[this->pos_];
      auto& r = this->recs_[s];
      if (r.state.phase != subgroup_phase::resident || r.aux_reading) return;
      if (this->has_aux(s) && !r.aux_ready) return;  // issue_reads asks for it
      const site_kind where = this->site_.site(this->position_[s], s, this->step_);
      if (r.spec != npos && !(this->adopting_pass_ && where == site_kind::host && kernel.can_adopt()))
        this->pool_.give_host(std::exchange(this->recs_[s].spec, npos));  // (not adopted: updated as usual)
      if (where == site_kind::host) {
        if (this->host_updates_ >= core::max_host_updates) return;
        begin_update(s);
        if (r.spec != npos)
          this->start_adopted_update(s, kernel);
        else
          this->start_host_update(s, kernel);
      } else {
        STRATA_EXPECTS(kernel.has_device() && this->site_.uses_device(), config_error,
                       "subgroup_pipeline: the site policy chose the device for subgroup {}, but says it never uses "
                       "the device or the kernel has no device update",
                       s);
        if (this->pool_.free_device() == 0) return;
        begin_update(s);
        this->start_device_update(s, kernel);
      }
      ++this->pos_;
    }
  }

  void begin_update(std::size_t s) {
    auto& r = this->recs_[s];
    r.hit = this->pool_.cached(s);
    if (auto* c = this->pool_.cache(); c != nullptr && r.hit) c->access(s);  // a hit is used now
    if (auto* st = this->stats_) ++(r.hit ? st->cache_hits : st->cache_misses);
    this->pin(s);
    this->wanted_[s] = false;
  }

  // Reads for the subgroups the update needs next: per path, up to prefetch_depth subgroups ahead
  // in the pass's order, while host slots last, keeping one for every subgroup that comes earlier
  // in the order and waits for its path (so read-ahead never takes the slot of an earlier one).
  void issue_reads() {
    if (this->err_) return;
    auto& pool = this->pool_;
    const std::size_t paths = this->paths_.size();
    const std::size_t depth = this->opts_.prefetch_depth;
    std::vector<std::size_t> ahead(paths, 0);
    std::size_t reserved = 0;
    std::size_t saturated = 0;  // paths with their read-ahead full
    for (std::size_t j = this->pos_; j < this->todo_.size(); ++j) {
      const std::size_t s = this->todo_[j];
      auto& r = this->recs_[s];
      if (r.state.phase == subgroup_phase::on_tier) {
        const bool first = j == this->pos_;
        if ((first || ahead[this->path_of(s)] < depth) && pool.free_host() > reserved) {
          this->issue_read(s, this->has_aux(s));
        } else {
          ++reserved;  // it needs a slot before anything after it
          if (pool.free_host() <= reserved) return;
          continue;
        }
      } else if (r.state.phase == subgroup_phase::resident && this->has_aux(s) && !r.aux_ready && !r.aux_reading) {
        this->issue_aux_read(s);  // a cached subgroup still needs its side object
      }
      if (r.state.phase == subgroup_phase::reading || (r.state.phase == subgroup_phase::resident && !pool.cached(s))) {
        if (++ahead[this->path_of(s)] == std::max<std::size_t>(depth, 1) && ++saturated == paths) return;
      }
    }
  }
};

}  // namespace strata

#if STRATA_EXTERN_TEMPLATES
// Compiled once, in cmake/strata_instances.cpp (see STRATA_EXTERN_TEMPLATES in core/config.hpp).
namespace strata {
extern template class detail::pipeline_state<host_executor<>>;
extern template class detail::pipeline_core<host_executor<>>;
extern template class subgroup_pipeline<host_executor<>>;
}  // namespace strata
#endif
