#pragma once
/// pipeline_state: what a subgroup pipeline holds and the bookkeeping every step of a subgroup's
/// life uses: the type-erased tier and its paths, the executor, the objects, the slots and the
/// cache, one record per subgroup (its phase through the state machine of subgroup_state.hpp,
/// its slots, its path), the write queues, what is in flight, the pass in progress and the
/// mailbox that completions post to. pipeline_core (the life of a subgroup) and
/// subgroup_pipeline (the passes) build on it.
///
/// Completions (from tier threads, stream workers, the CPU worker) only post a message; the
/// driving thread handles them, so every member but the mailbox is touched by one thread.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/budget.hpp"
#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/trace.hpp"
#include "strata/exec/executor.hpp"
#include "strata/exec/host_stream.hpp"
#include "strata/pipeline/kernel.hpp"
#include "strata/pipeline/options.hpp"
#include "strata/pipeline/slot_pool.hpp"
#include "strata/pipeline/subgroup_state.hpp"
#include "strata/policy/any_eviction_policy.hpp"
#include "strata/policy/update_site.hpp"
#include "strata/tier/any_tier.hpp"

namespace strata::detail {

template <executor Exec>
class pipeline_state {
 protected:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_host_updates = 2;  // queued on the CPU worker, so it never idles
  using clock = std::chrono::steady_clock;
  using kernel_type = kernel_ref<Exec>;

  pipeline_state(any_tier tier, Exec& exec, host_budget& budget, std::vector<pipeline_object> objects,
                pipeline_options o, any_eviction_policy evict, any_update_site site, tracer* trace)
      : tier_(std::move(tier)),
        exec_(&exec),
        objects_(std::move(objects)),
        opts_((o.validate(), std::move(o))),
        site_(std::move(site)),
        tracer_(trace),
        pool_(budget, exec, pool_options(objects_, opts_, site_), std::move(evict)),
        cpu_(opts_.trace_prefix + ".cpu") {
    STRATA_EXPECTS(!objects_.empty(), config_error, "subgroup_pipeline: no subgroups");
    STRATA_EXPECTS(!site_.uses_device() || opts_.device_depth > 0, config_error,
                   "subgroup_pipeline: the update site may choose the device, but device_depth is 0");
    recs_.resize(objects_.size());
    wanted_.assign(objects_.size(), false);
    offered_.assign(objects_.size(), false);
    paths_ = tier_.path_descriptors();
    path_writes_.assign(paths_.size() + 1, 0);  // the last: objects not placed yet
    early_path_bytes_.assign(paths_.size(), 0);
    write_queue_.resize(paths_.size() + 1);
  }
  pipeline_state(const pipeline_state&) = delete;
  pipeline_state& operator=(const pipeline_state&) = delete;

  struct record {
    subgroup_state state{};
    std::size_t slot = npos;      // host slot while the state has one
    std::size_t landing = npos;   // landing slot of a device update
    std::size_t device = npos;    // device slot of a device update
    std::size_t path = npos;      // path of the state object (known once placed)
    std::size_t aux_path = npos;
    std::size_t write_queue = 0;  // the queue its write in flight came from
    bool aux_ready = false;       // the side object is in the slot for this pass
    bool aux_reading = false;
    bool queued = false;          // in a write queue
    bool hit = false;             // was cached when its update started
    bool pinned = false;          // pinned in the cache policy while work on it is in flight
    bool early = false;           // read by prefetch() for the next pass, not completed yet
    bool for_next = false;        // read by a pass for the next one (read_next_in_pass): kept
    bool next_read = false;       // that read is in flight (counted in next_reads_)
    bool left_behind = false;     // written by a pass that returned before the write landed
    std::size_t spec = npos;      // host slot holding a speculative update's result (run_speculative)
    bool speculating = false;     // that update runs on the CPU worker
    bool adopting = false;        // adopted: `spec` holds the old state until the update commits
  };
  // `offer`: a subgroup for the open pass (subgroup_pipeline::offer), npos when the offers end.
  enum class msg_kind : std::uint8_t { read, aux_read, write, host_update, h2d, kernel, d2h, offer, speculate };
  struct message {
    msg_kind kind;
    std::size_t s;
    std::exception_ptr error;
    double seconds = 0;  // a host kernel's duration
  };
  // `offers`: an open pass with nothing to do until the next subgroup is offered (not the
  // pipeline's wait: the caller's computation, counted nowhere).
  enum class waiting_for : std::uint8_t { read, compute, write, offers };
  // What a pass is: closed (its todo given), or open (the todo grows as subgroups are offered)
  // and then either updating them, or only reading them for the pass that will, or reading them
  // and updating copies of their state that the pass that will may adopt (speculation).
  enum class pass_kind : std::uint8_t { closed, open_update, open_read, open_speculate };

  // --- where a subgroup's bytes are ---------------------------------------------------------------

  [[nodiscard]] bool has_aux(std::size_t s) const noexcept { return objects_[s].aux_bytes > 0; }

  // The path holding the state object, once it is placed.
  [[nodiscard]] std::optional<std::size_t> known_path(std::size_t s) {
    auto& r = recs_[s];
    if (r.path == npos) {
      const auto p = tier_.path_of(objects_[s].name);
      if (!p) return std::nullopt;
      r.path = std::min(*p, paths_.size() - 1);
    }
    return r.path;
  }
  [[nodiscard]] std::size_t path_of(std::size_t s) { return known_path(s).value_or(0); }
  [[nodiscard]] std::size_t aux_path_of(std::size_t s) {
    auto& r = recs_[s];
    if (r.aux_path == npos) r.aux_path = std::min(tier_.path_of(objects_[s].aux_name).value_or(0), paths_.size() - 1);
    return r.aux_path;
  }

  [[nodiscard]] std::span<std::byte> state_span(std::size_t slot, std::size_t s) noexcept {
    return pool_.host(slot).first(static_cast<std::size_t>(objects_[s].bytes));
  }
  // What a kernel sees of a host slot: the subgroup's state, then its side object.
  [[nodiscard]] std::span<std::byte> slot_span(std::size_t slot, std::size_t s) noexcept {
    return pool_.host(slot).first(static_cast<std::size_t>(objects_[s].slot_bytes()));
  }
  [[nodiscard]] std::span<std::byte> aux_span(std::size_t slot, std::size_t s) noexcept {
    return pool_.host(slot).subspan(static_cast<std::size_t>(pipeline_object::aux_offset(objects_[s].bytes)),
                                    static_cast<std::size_t>(objects_[s].aux_bytes));
  }

  // Work on `s` starts: a cached subgroup is pinned, so the cache policy never makes it a victim.
  void pin(std::size_t s) {
    if (!pool_.cached(s)) return;
    pool_.cache()->pin(s);
    recs_[s].pinned = true;
  }
  void unpin(std::size_t s) noexcept {
    if (!std::exchange(recs_[s].pinned, false)) return;
    pool_.cache()->unpin(s);
  }

  // --- what is in flight ----------------------------------------------------------------------------

  [[nodiscard]] bool writes_queued() const noexcept {
    return std::any_of(write_queue_.begin(), write_queue_.end(), [](const auto& q) { return !q.empty(); });
  }
  [[nodiscard]] std::size_t in_flight() const noexcept {
    return reads_ + writes_ + host_updates_ + device_updates_ + aux_reads_;
  }

  // What the driver waits for now, for the statistics: an update that runs, else the state the
  // next update needs, else writes.
  [[nodiscard]] waiting_for waiting_reason() const {
    if (open_ && !offers_closed_) return waiting_for::offers;  // (backward still runs)
    if (host_updates_ > 0) return waiting_for::compute;
    if (!err_ && pos_ < todo_.size() && open_updates_) {
      const auto& r = recs_[todo_[pos_]];
      if (r.state.phase == subgroup_phase::on_tier || r.state.phase == subgroup_phase::reading || r.aux_reading)
        return pool_.free_host() == 0 && r.state.phase == subgroup_phase::on_tier ? waiting_for::write
                                                                                   : waiting_for::read;
    }
    if (device_updates_ > 0) return waiting_for::compute;
    return waiting_for::write;
  }

  // Between calls only reads that prefetch() started and writes a run() left behind
  // (return_before_writes) may be in flight: run() takes them over, every other call waits for
  // them first (settle).
  // Speculative results live from the open pass that made them to the start of the next call,
  // which adopts them (run() after adopt_speculation(true)) or drops them (any other).
  void begin_call(bool keep_speculation = false) {
    STRATA_ASSERT(in_flight() == reads_ + writes_);
    err_ = nullptr;
    adopt_next_ = false;
    if (!keep_speculation) drop_speculation();
  }
  // Gives back the slots of the speculative results (none runs: between calls, or at a pass's end).
  void drop_speculation() noexcept {
    for (auto& r : recs_)
      if (r.spec != npos && !r.speculating && !r.adopting) {
        pool_.give_host(r.spec);
        r.spec = npos;
      }
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

  [[nodiscard]] std::string span_name(const char* what) const { return opts_.trace_prefix + "." + what; }
  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  static slot_pool_options pool_options(const std::vector<pipeline_object>& objects, const pipeline_options& o,
                                        const any_update_site& site) {
    slot_pool_options p;
    p.host_slots = o.host_slots();
    std::uint64_t slot = 0, state = 0;
    for (const auto& ob : objects) {
      slot = std::max(slot, ob.slot_bytes());
      state = std::max(state, ob.bytes);
    }
    p.host_slot_bytes = static_cast<std::size_t>(slot);
    p.cache_slots = std::min(o.cache_slots, objects.size());
    if (site.uses_device()) {
      p.device_slots = o.device_depth;
      p.device_slot_bytes = static_cast<std::size_t>(state + o.device_extra_bytes);
    }
    return p;
  }

  // Notifies under the lock: once the driver can see the message it may finish and destroy the
  // pipeline, so the poster must not touch it after unlocking.
  void post(msg_kind k, std::size_t s, std::exception_ptr e, double seconds = 0) noexcept {
    std::lock_guard lock(mail_mutex_);
    mail_.push_back({k, s, std::move(e), seconds});
    mail_cv_.notify_one();
  }

  any_tier tier_;
  Exec* exec_;
  std::vector<pipeline_object> objects_;
  pipeline_options opts_;
  any_update_site site_;
  tracer* tracer_;
  slot_pool<Exec> pool_;
  std::vector<record> recs_;
  std::vector<tier_descriptor> paths_;
  std::vector<std::size_t> path_writes_;             // per path (and the unplaced queue), in flight
  std::vector<std::deque<std::size_t>> write_queue_;  // per path (and the unplaced queue), oldest first
  std::size_t reads_ = 0, writes_ = 0, aux_reads_ = 0, host_updates_ = 0, device_updates_ = 0;
  // Reads prefetch() started since the last pass, for that pass's statistics.
  std::size_t early_count_ = 0;
  std::size_t next_reads_ = 0;     // reads in flight that a pass started for the next one
  std::vector<std::size_t> next_;  // the next pass's order (read_next_in_pass)
  std::uint64_t early_bytes_ = 0;
  std::vector<std::uint64_t> early_path_bytes_;
  // The pass in progress.
  std::vector<std::size_t> todo_;
  std::vector<std::size_t> position_;  // place of each subgroup in the pass's order
  std::vector<bool> wanted_;           // in todo, update not started yet
  std::vector<bool> offered_;          // offered to the open pass
  std::vector<std::size_t> planned_;   // the open pass's order, to read ahead of its offers
  std::size_t order_size_ = 0;
  std::size_t pos_ = 0;  // next entry of todo_ to start
  std::size_t spec_pos_ = 0;     // next entry of todo_ to speculate on (open_speculate)
  bool adopt_next_ = false;      // the next run() adopts the speculative results (adopt_speculation)
  bool adopting_pass_ = false;   // this pass does
  std::uint64_t step_ = 0;
  bool open_ = false;            // an open pass runs: offers go to its todo (else they are stale)
  bool offers_closed_ = false;   // the open pass was told that no subgroup comes after
  bool open_updates_ = true;     // the pass updates its todo (an open pass may only read it)
  pass_stats* stats_ = nullptr;  // counted only during run()
  std::exception_ptr err_;
  // Completions post here; only the driving thread reads.
  std::mutex mail_mutex_;
  std::condition_variable mail_cv_;
  std::vector<message> mail_;
  host_stream cpu_;  // last: its worker stops (after its work) before anything it uses goes
};

}  // namespace strata::detail
