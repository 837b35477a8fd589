#pragma once
/// pipeline_core: how one subgroup moves through a subgroup pipeline, in the order of its life:
/// read from the tier into a host slot, updated on the host or on the device, committed (kept in
/// the cache or queued for writing), written behind, and each completion handled on the driving
/// thread (run_loop). subgroup_pipeline (pipeline/subgroup_pipeline.hpp) decides what happens
/// when (the passes and their scheduling) and calls these; pipeline_state holds the bookkeeping.
/// The tier, the cache policy, the site and the kernel are type-erased (any_tier,
/// any_eviction_policy, any_update_site, kernel_ref), so this is compiled once per executor.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/trace.hpp"
#include "strata/exec/executor.hpp"
#include "strata/pipeline/detail/pipeline_state.hpp"
#include "strata/pipeline/subgroup_state.hpp"
#include "strata/policy/update_site.hpp"

namespace strata::detail {

template <executor Exec>
class pipeline_core : protected pipeline_state<Exec> {
 protected:
  using base = pipeline_state<Exec>;
  using typename base::kernel_type;
  using typename base::message;
  using typename base::msg_kind;
  using typename base::waiting_for;
  using base::npos;
  using base::base;
  // (the state's members, by name: it is a dependent base)
  using base::aux_reads_, base::cpu_, base::device_updates_, base::err_, base::exec_, base::host_updates_,
      base::mail_, base::mail_cv_, base::mail_mutex_, base::next_reads_, base::objects_, base::opts_, base::order_size_,
      base::path_writes_, base::paths_, base::pool_, base::position_, base::reads_, base::recs_, base::stats_,
      base::tier_, base::tracer_, base::write_queue_, base::writes_;
  using base::apply, base::aux_path_of, base::aux_span, base::count, base::fail, base::has_aux,
      base::in_flight, base::issue_safely, base::known_path, base::path_of, base::pin, base::post,
      base::seconds_since, base::slot_span, base::span_name, base::state_span, base::sync_streams, base::unpin,
      base::waiting_reason, base::writes_queued;
  using typename base::clock;

  // --- read ---------------------------------------------------------------------------------------

  void issue_read(std::size_t s, bool with_aux) {
    auto& r = recs_[s];
    const auto slot = pool_.take_host();
    STRATA_ASSERT(slot.has_value());
    r.slot = *slot;
    apply(s, subgroup_event::read);
    r.aux_ready = false;
    ++reads_;
    count(false, path_of(s), objects_[s].bytes);
    std::vector<completion> parts;
    parts.push_back(issue_safely([&] { return tier_.read(objects_[s].name, 0, state_span(r.slot, s)); }));
    if (with_aux) {
      count(false, aux_path_of(s), objects_[s].aux_bytes);
      parts.push_back(issue_safely([&] { return tier_.read(objects_[s].aux_name, 0, aux_span(r.slot, s)); }));
    }
    when_all(std::move(parts)).on_complete([this, s](std::exception_ptr e) { post(msg_kind::read, s, std::move(e)); });
  }

  // A cached subgroup still needs its side object for this pass.
  void issue_aux_read(std::size_t s) {
    auto& r = recs_[s];
    r.aux_reading = true;
    pin(s);
    ++aux_reads_;
    count(false, aux_path_of(s), objects_[s].aux_bytes);
    issue_safely([&] { return tier_.read(objects_[s].aux_name, 0, aux_span(r.slot, s)); })
        .on_complete([this, s](std::exception_ptr e) { post(msg_kind::aux_read, s, std::move(e)); });
  }

  // --- update on the host -------------------------------------------------------------------------

  // Runs `work` (a kernel's call for subgroup s) on the CPU worker, traced as `name`; its outcome
  // and duration come back as a `kind` message. Throws only when the task cannot be queued.
  template <class Work>
  void on_worker(std::size_t s, const char* name, msg_kind kind, Work work) {
    cpu_.enqueue_host([this, s, name, kind, work = std::move(work)] {
      std::exception_ptr e;
      const auto t0 = clock::now();
      try {
        trace_span span(tracer_, span_name(name));
        span.arg("subgroup", s);
        work();
      } catch (...) {
        e = std::current_exception();
      }
      post(kind, s, std::move(e), seconds_since(t0));  // never throws: the worker must go on
    });
  }

  void start_host_update(std::size_t s, const kernel_type& kernel) {
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
        self->unpin(s);
      }
    } guard{this, s};
    on_worker(s, "compute", msg_kind::host_update, [s, slot = slot_span(r.slot, s), kernel] { kernel.host(s, slot); });
    guard.armed = false;
  }

  // A speculative update (an open_speculate pass) of resident `s`: on the CPU worker, its state is
  // copied into a free host slot and the kernel updates the copy there; the subgroup's own slot
  // keeps the state as it was (resident with no write queued: a pass that commits nothing gives
  // no such slot back), so dropping the copy undoes the update. Nothing commits.
  void start_speculative_update(std::size_t s, const kernel_type& kernel) {
    auto& r = recs_[s];
    const std::size_t spare = *pool_.take_host();
    try {  // (the task touches only the bytes: its message comes to this thread, after what follows)
      on_worker(s, "speculate", msg_kind::speculate, [s, from = slot_span(r.slot, s), to = slot_span(spare, s), kernel] {
        std::memcpy(to.data(), from.data(), from.size());
        kernel.host(s, to);
      });
    } catch (...) {
      pool_.give_host(spare);
      throw;
    }
    r.spec = spare;
    r.speculating = true;
    ++host_updates_;
  }

  // Adopts subgroup `s`'s speculative result as its update in this pass: the slots swap roles
  // and the kernel does the rest of an update (adopted(), e.g. the model copy) on the CPU worker;
  // it then commits as a host update does, and only then does the old state's slot go back (a
  // failure swaps them back: the subgroup is at the previous step, as after any failed update).
  void start_adopted_update(std::size_t s, const kernel_type& kernel) {
    auto& r = recs_[s];
    on_worker(s, "adopt", msg_kind::host_update, [s, slot = slot_span(r.spec, s), kernel] { kernel.adopted(s, slot); });
    std::swap(r.slot, r.spec);  // (the task touches only the bytes: its message comes to this thread)
    r.adopting = true;
    apply(s, subgroup_event::update);
    ++host_updates_;
  }

  // --- update on the device -----------------------------------------------------------------------

  // Copy in on h2d, the kernel on compute, the copy back on d2h into a landing slot, with events
  // between the streams: the subgroup's own slot keeps the old state until the copy back landed.
  void start_device_update(std::size_t s, const kernel_type& kernel) {
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
      kernel.device_in(s, host, dev, h2d);
      const auto in = h2d.record();
      in.completion().on_complete([this, s](std::exception_ptr e) { post(msg_kind::h2d, s, std::move(e)); });
      compute.wait(in);
      kernel.device_update(s, dev, *exec_);
      const auto updated = compute.record();
      updated.completion().on_complete([this, s](std::exception_ptr e) { post(msg_kind::kernel, s, std::move(e)); });
      d2h.wait(updated);
      d2h.copy_to_host(landing, dev.first(bytes));
      kernel.device_out(s, dev, d2h);
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
    unpin(s);
  }

  // --- commit -------------------------------------------------------------------------------------

  // The update of `s` committed: the state is new and dirty. Decide where it goes next.
  void committed(std::size_t s, const kernel_type* kernel) {
    auto& r = recs_[s];
    unpin(s);
    if (stats_ != nullptr) ++stats_->updated;
    if (kernel != nullptr) kernel->committed(s);
    auto* cache = pool_.cache();
    bool keep = r.hit;
    if (!keep && cache != nullptr) keep = admit(s);
    if (!keep) {
      queue_write(s);  // written behind, then dropped
      return;
    }
    // Cached. If it will be pushed out before the pass ends, write it now.
    if (opts_.eager_writes && pushed_out(s)) queue_write(s);
  }
  // Whether cached `s` leaves the cache before the pass ends: as its policy plans (one that
  // keeps the next pass's first subgroups keeps a hit the next pass needs first again: a landing
  // order repeated each step), else when the walk still reaches a cache's worth after it.
  [[nodiscard]] bool pushed_out(std::size_t s) const {
    const auto* cache = pool_.cache();
    if (const auto kept = cache->policy().keeps_for_next_step(s, cache->capacity())) return !*kept;
    return position_[s] + cache->capacity() < order_size_;
  }

  // Admits `s` to the cache, evicting a victim; false when every cached subgroup is pinned or
  // the policy ranks `s` below all of them (it is used after every one: a bypass).
  bool admit(std::size_t s) {
    auto& cache = *pool_.cache();
    if (cache.size() >= cache.capacity() && !cache.policy().victim().has_value()) return false;
    const auto look = cache.access_or_bypass(s);
    if (look.evicted == s) return false;  // used after every cached one: written, not kept
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

  // --- write --------------------------------------------------------------------------------------

  // Queues a write on the subgroup's path (the last queue while a multipath has not placed it).
  void queue_write(std::size_t s) {
    auto& r = recs_[s];
    if (r.queued) return;
    r.queued = true;
    const auto p = known_path(s);
    write_queue_[p ? *p : paths_.size()].push_back(s);
  }

  // Up to write_behind_depth writes in flight per path, oldest first (the unplaced queue may use
  // every path's depth: a multipath spreads them).
  void issue_writes() {
    for (std::size_t p = 0; p < write_queue_.size(); ++p) {
      auto& q = write_queue_[p];
      const std::size_t depth = opts_.write_behind_depth * (p == paths_.size() ? paths_.size() : 1);
      while (!q.empty() && path_writes_[p] < depth) {
        const std::size_t s = q.front();
        q.pop_front();
        auto& r = recs_[s];
        r.queued = false;
        if (r.state.phase != subgroup_phase::resident || !r.state.dirty) continue;
        issue_write(s, p);
      }
    }
  }
  // Every queued write at once, past write_behind_depth: a pass returning before its writes.
  void issue_all_writes() {
    for (std::size_t p = 0; p < write_queue_.size(); ++p) {
      auto& q = write_queue_[p];
      while (!q.empty()) {
        const std::size_t s = q.front();
        q.pop_front();
        auto& r = recs_[s];
        r.queued = false;
        if (r.state.phase == subgroup_phase::resident && r.state.dirty) issue_write(s, p);
      }
    }
  }
  void issue_write(std::size_t s, std::size_t queue) {
    auto& r = recs_[s];
    apply(s, subgroup_event::write);
    r.write_queue = queue;
    ++path_writes_[queue];
    ++writes_;
    auto done = issue_safely([&] { return tier_.write(objects_[s].name, 0, state_span(r.slot, s)); });
    count(true, path_of(s), objects_[s].bytes);  // placed by now
    done.on_complete([this, s](std::exception_ptr e) { post(msg_kind::write, s, std::move(e)); });
  }

  // A subgroup whose write the last pass left behind lands while this pass is about to update it
  // (among the next ones the read-ahead would read): it stays in its slot instead of being read
  // again. Later ones go back, so that they never hold a slot an earlier read needs.
  [[nodiscard]] bool due_soon(std::size_t s) const {
    if (!this->wanted_[s]) return false;
    // read_ahead wants it for the next pass, while a slot stays free (visit, with_free_slot)
    if (stats_ == nullptr) return this->open_ && !this->open_updates_ && pool_.free_host() > 0;
    const std::size_t end = std::min(this->todo_.size(), this->pos_ + opts_.prefetch_depth + 1);
    for (std::size_t j = this->pos_; j < end; ++j)
      if (this->todo_[j] == s) return true;
    return false;
  }

  // The host slot goes back: the subgroup lives on the tier only.
  void drop(std::size_t s) {
    auto& r = recs_[s];
    apply(s, subgroup_event::drop);
    pool_.give_host(r.slot);
    r.slot = npos;
    r.aux_ready = false;
    r.for_next = false;
  }

  // --- completion handlers ------------------------------------------------------------------------

  // A subgroup offered to the open pass (or the end of the offers): it joins the pass's todo.
  // Offers outside an open pass are stale (their pass ended on an error): the next pass updates
  // those subgroups.
  void take_offer(const message& m) {
    if (!this->open_) return;
    if (m.s == npos) {
      this->offers_closed_ = true;
      if (m.error) fail(m.error);  // cancelled: drain, then end
      return;
    }
    const std::size_t s = m.s;
    auto& todo = this->todo_;
    if (s >= recs_.size() || position_[s] == npos || std::find(todo.begin(), todo.end(), s) != todo.end()) {
      fail(std::make_exception_ptr(config_error(fmt::format(
          "subgroup_pipeline::offer: subgroup {} is not in the pass's order, or was offered twice", s))));
      return;
    }
    todo.push_back(s);
    this->wanted_[s] = true;
    this->offered_[s] = true;
  }

  void handle(message& m, const kernel_type* kernel) {
    if (m.kind == msg_kind::offer) {
      take_offer(m);
      return;
    }
    const std::size_t s = m.s;
    auto& r = recs_[s];
    switch (m.kind) {
      case msg_kind::read: {
        --reads_;
        // (the flag, not for_next: a subgroup read for the next pass may be read again later)
        if (std::exchange(r.next_read, false)) {
          STRATA_ASSERT(next_reads_ > 0);
          --next_reads_;
        }
        const bool early = std::exchange(r.early, false);
        if (m.error) {
          apply(s, subgroup_event::read_failed);
          pool_.give_host(r.slot);
          r.slot = npos;
          // A read prefetch() started changes nothing when it fails: the pass that needs the
          // subgroup reads it again and reports that read's error.
          if (!early) fail(m.error);
        } else {
          apply(s, subgroup_event::read_done);
          r.aux_ready = has_aux(s) && !early;  // (prefetch reads the state alone)
          // prefetched for a pass that does not update it: the slot goes back at once
          // (an open pass keeps it: it is offered later)
          if (early && stats_ != nullptr && !this->open_ && !this->wanted_[s] && !pool_.cached(s) && !r.for_next)
            drop(s);
        }
        return;
      }
      case msg_kind::aux_read:
        --aux_reads_;
        r.aux_reading = false;
        unpin(s);
        if (m.error)
          fail(m.error);
        else
          r.aux_ready = true;
        return;
      case msg_kind::host_update:
        --host_updates_;
        if (stats_ != nullptr) stats_->kernel_s += m.seconds;
        if (std::exchange(r.adopting, false)) {  // the old state's slot: back to the pool, or back in place
          if (m.error) std::swap(r.slot, r.spec);
          pool_.give_host(std::exchange(r.spec, npos));
          if (!m.error && stats_ != nullptr) ++stats_->adopted;
        }
        if (m.error) {
          apply(s, subgroup_event::update_failed);
          unpin(s);
          fail(m.error);
          return;
        }
        apply(s, subgroup_event::update_done);
        if (stats_ != nullptr) ++stats_->host_updates;
        committed(s, kernel);
        return;
      case msg_kind::speculate:
        --host_updates_;
        r.speculating = false;
        if (stats_ != nullptr) stats_->kernel_s += m.seconds;
        if (m.error) {  // the copy goes: the step updates the subgroup itself (and meets the error)
          pool_.give_host(std::exchange(r.spec, npos));
          return;
        }
        if (stats_ != nullptr) ++stats_->speculated;
        return;
      case msg_kind::h2d:
      case msg_kind::kernel:
      case msg_kind::d2h: handle_device(m, kernel); return;
      case msg_kind::offer: return;  // (taken above)
      case msg_kind::write:
        --writes_;
        --path_writes_[r.write_queue];
        if (m.error) {
          apply(s, subgroup_event::write_failed);  // the slot holds the only copy: it stays
          r.left_behind = false;
          fail(m.error);
          return;
        }
        apply(s, subgroup_event::write_done);
        if (!pool_.cached(s) && !(std::exchange(r.left_behind, false) && due_soon(s))) drop(s);
        return;
    }
  }

  void handle_device(message& m, const kernel_type* kernel) {
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

  // --- reads between passes ----------------------------------------------------------------------

  // Waits for the reads prefetch() started and the writes a pass left behind (the only work in
  // flight between calls); what they read stays resident for the next pass. A failed write is
  // raised here, typed; its subgroup keeps the only copy in its slot, written by the next call.
  void settle() {
    if (reads_ == 0 && writes_ == 0) return;
    err_ = nullptr;
    run_loop([] {}, [] { return true; }, nullptr);
    this->end_call();
  }
  // The same where nothing may throw (destruction): only the counts are kept up.
  void settle_noexcept() noexcept {
    std::vector<message> inbox;
    while (reads_ > 0 || writes_ > 0) {
      {
        std::unique_lock lock(mail_mutex_);
        mail_cv_.wait(lock, [&] { return !mail_.empty(); });
        inbox.swap(mail_);
      }
      for (const auto& m : inbox) {
        if (m.kind == msg_kind::read) {
          --reads_;
          if (std::exchange(recs_[m.s].next_read, false)) --next_reads_;
        }
        if (m.kind == msg_kind::write) --writes_;
      }
      inbox.clear();
    }
  }

  // --- the event loop and failures ----------------------------------------------------------------

  // Schedules with `schedule` and handles completions until `started()` holds and nothing is in
  // flight or queued, or an error occurred and what was in flight has drained. With
  // `left` = leave::writes, it returns once only writes remain, issuing those still queued
  // (leave::reads_and_writes: reads may remain too).
  // What run_loop may return with still in flight once `started()` holds.
  enum class leave : std::uint8_t { nothing, writes, reads_and_writes };

  template <class Schedule, class Started>
  void run_loop(Schedule&& schedule, Started&& started, const kernel_type* kernel, leave left = leave::nothing) {
    std::vector<message> inbox;
    for (;;) {
      if (!err_) {
        try {
          schedule();
        } catch (...) {
          fail(std::current_exception());
        }
      }
      if (in_flight() == 0 && (err_ || (started() && !writes_queued()))) return;
      if (left != leave::nothing && !err_ && started() &&
          in_flight() == writes_ + (left == leave::reads_and_writes ? reads_ : next_reads_)) {
        issue_all_writes();
        return;
      }
      // Nothing will ever complete (an open pass waits for offers instead): say why instead of
      // waiting forever.
      if (in_flight() == 0 && !(this->open_ && !this->offers_closed_)) {
        fail(std::make_exception_ptr(capacity_error(fmt::format(
            "subgroup_pipeline: no progress possible: {} of {} host slots are free and nothing is in flight "
            "(subgroups whose writes failed may hold them: flush() retries those writes)",
            pool_.free_host(), pool_.options().host_slots))));
        return;
      }
      const auto why = waiting_reason();
      const auto t0 = clock::now();
      {
        trace_span span(why == waiting_for::compute || why == waiting_for::offers ? nullptr : tracer_,
                        span_name(why == waiting_for::read ? "read_wait" : "write_wait"));
        std::unique_lock lock(mail_mutex_);
        mail_cv_.wait(lock, [&] { return !mail_.empty(); });
        inbox.swap(mail_);
      }
      if (stats_ != nullptr && why != waiting_for::offers)
        (why == waiting_for::read ? stats_->read_wait_s
                                  : why == waiting_for::compute ? stats_->compute_s : stats_->write_wait_s) +=
            seconds_since(t0);
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

};

}  // namespace strata::detail
