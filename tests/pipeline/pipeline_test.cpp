// subgroup_pipeline's schedule, proven on host streams: the copy of subgroup k+1 overlaps the
// kernel of subgroup k, depths stay bounded, no tier write starts before its copy back from the
// device ended, a slow path never holds back a fast one, eager writes start before any read
// completes, failures on a stream leave every subgroup at the old or the new state, and reads
// started between passes (prefetch) run while the caller goes on and serve the next pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <strata/exec/detail/stream_adaptor_base.hpp>
#include <strata/exec/faulty_stream.hpp>
#include <strata/exec/host_executor.hpp>
#include <strata/exec/paced.hpp>
#include <strata/pipeline/subgroup_pipeline.hpp>
#include <strata/policy/lru.hpp>
#include <strata/policy/placement.hpp>
#include <strata/policy/sweep_aware.hpp>
#include <strata/policy/update_order.hpp>
#include <strata/tier/detail/adaptor_base.hpp>
#include <strata/tier/faulty.hpp>
#include <strata/tier/host_tier.hpp>
#include <strata/tier/multipath.hpp>
#include <strata/tier/throttled.hpp>

// The folder's tests compile together: this file's names stay in its own namespace.
namespace pipeline_test {

using namespace std::chrono_literals;

namespace {

constexpr auto hang_guard = 60s;  // only guards against hangs

// What the recording streams and probe tiers saw.
struct op_log {
  std::mutex m;
  std::condition_variable cv;
  int h2d_started = 0;   // state copies to the device begun
  int device_now = 0;    // device updates between their copy in and the end of their copy back
  int device_most = 0;
  std::set<const std::byte*> d2h_pending;  // host buffers a copy back is filling
  std::vector<std::string> write_before_d2h;  // violations
  void h2d_begins() {
    std::lock_guard l(m);
    ++h2d_started;
    device_most = std::max(device_most, ++device_now);
    cv.notify_all();
  }
  bool wait_h2d(int n) {
    std::unique_lock l(m);
    return cv.wait_for(l, hang_guard, [&] { return h2d_started >= n; });
  }
};

// A stream that tells the log when copies begin and end.
template <class Inner>
class recording : public strata::detail::stream_adaptor_base<Inner> {
  using base = strata::detail::stream_adaptor_base<Inner>;

 public:
  template <class... A>
  explicit recording(op_log* log, A&&... a) : base(std::in_place, std::forward<A>(a)...), log_(log) {}
  void copy_to_device(std::span<std::byte> dst, std::span<const std::byte> src) {
    this->inner_.enqueue_host([log = log_] { log->h2d_begins(); });
    this->inner_.copy_to_device(dst, src);
  }
  void copy_to_host(std::span<std::byte> dst, std::span<const std::byte> src) {
    this->inner_.enqueue_host([log = log_, p = dst.data()] {
      std::lock_guard l(log->m);
      log->d2h_pending.insert(p);
    });
    this->inner_.copy_to_host(dst, src);
    this->inner_.enqueue_host([log = log_, p = dst.data()] {
      std::lock_guard l(log->m);
      log->d2h_pending.erase(p);
      --log->device_now;
    });
  }

 private:
  op_log* log_;
};

// A tier that counts its requests in flight (the most at once) and checks every write against
// the copies back in progress.
template <class Inner>
class probe : public strata::detail::adaptor_base<Inner> {
  using base = strata::detail::adaptor_base<Inner>;

 public:
  template <class... A>
  explicit probe(op_log* log, A&&... a) : base(std::in_place, std::forward<A>(a)...), log_(log) {}
  strata::completion read(std::string_view o, std::uint64_t off, std::span<std::byte> dst) {
    return count(reads_, most_reads_, this->inner_.read(o, off, dst));
  }
  strata::completion write(std::string_view o, std::uint64_t off, std::span<const std::byte> src) {
    if (log_ != nullptr) {
      std::lock_guard l(log_->m);
      if (log_->d2h_pending.contains(src.data())) log_->write_before_d2h.emplace_back(o);
    }
    return count(writes_, most_writes_, this->inner_.write(o, off, src));
  }
  void reset_most() {
    most_reads_ = reads_.load();
    most_writes_ = writes_.load();
  }
  int most_reads() const { return most_reads_.load(); }
  int most_writes() const { return most_writes_.load(); }
  int reads_done() const { return reads_done_.load(); }

 private:
  strata::completion count(std::atomic<int>& now, std::atomic<int>& most, strata::completion f) {
    const int n = ++now;
    int seen = most.load();
    while (n > seen && !most.compare_exchange_weak(seen, n)) {
    }
    f.on_complete([&now, this, reading = &now == &reads_](std::exception_ptr) {
      --now;
      if (reading) ++reads_done_;
    });
    return f;
  }
  op_log* log_;
  std::atomic<int> reads_{0}, writes_{0}, most_reads_{0}, most_writes_{0}, reads_done_{0};
};

using stream_t = recording<strata::paced<strata::host_stream>>;
using exec_t = strata::host_executor<stream_t>;
using path_t = probe<strata::throttled<strata::host_tier>>;

exec_t make_executor(op_log& log, double bw) {
  return exec_t({.name = "sim"}, [&log, bw](strata::stream_role, const std::string& name) {
    return std::make_unique<stream_t>(&log, strata::pace_options{.h2d_bandwidth = bw, .d2h_bandwidth = bw}, name);
  });
}

std::vector<strata::pipeline_object> float_objects(std::size_t subgroups, std::size_t n) {
  std::vector<strata::pipeline_object> v;
  for (std::size_t s = 0; s < subgroups; ++s) v.push_back({fmt::format("sg-{}", s), n * sizeof(float)});
  return v;
}

// Adds 1 to every float of a subgroup, on the host or (as a task on the compute stream) on the
// device. The k-th device kernel waits until the copy in of the (k+1)-th device update has begun,
// and records whether it saw that happen: only a pipeline that overlaps the two lets it.
template <class Exec>
struct add_one_kernel {
  op_log* log = nullptr;
  std::size_t device_updates = 0;  // expected this pass (the last one has no successor)
  std::atomic<std::size_t> kernels{0};
  std::vector<int> overlapped;
  std::mutex m;
  std::vector<std::size_t> committed_order;  // read once the pass is over
  std::atomic<int> commits{0};              // read while it runs

  static void add(std::span<std::byte> bytes) {
    auto* f = reinterpret_cast<float*>(bytes.data());
    for (std::size_t i = 0; i < bytes.size() / sizeof(float); ++i) f[i] += 1.0f;
  }
  void host(std::size_t, std::span<std::byte> slot) { add(slot); }
  void committed(std::size_t s) {
    committed_order.push_back(s);
    ++commits;
  }
  template <class S>
  void device_in(std::size_t, std::span<std::byte>, std::span<std::byte>, S&) {}
  void device_update(std::size_t, std::span<std::byte> dev, Exec& e) {
    e.compute().enqueue_host([this, dev] {
      const std::size_t k = kernels++;
      if (log != nullptr && k + 1 < device_updates) {
        const bool saw = log->wait_h2d(static_cast<int>(k) + 2);
        std::lock_guard l(m);
        overlapped.push_back(saw ? 1 : 0);
      }
      add(dev);
    });
  }
  template <class S>
  void device_out(std::size_t, std::span<std::byte>, S&) {}
};

}  // namespace

TEST_CASE("device updates overlap the copy of k+1 with the kernel of k, depths stay bounded, and no write precedes its copy back") {
  const std::size_t subgroups = 12, n = 64 * 1024;  // 256 KiB a subgroup
  op_log log;
  auto exec = make_executor(log, 2e9);
  path_t fast(&log, strata::throttle_options{400e6, 400e6, {}}, strata::host_tier_options{.name = "fast"});
  path_t slow(&log, strata::throttle_options{200e6, 200e6, {}}, strata::host_tier_options{.name = "slow"});
  strata::multipath<strata::fixed_ratio, path_t&, path_t&> tier(strata::fixed_ratio({2, 1}), fast, slow);
  strata::host_budget budget(strata::unlimited_capacity);
  strata::pipeline_options po;
  po.cache_slots = 3;
  po.prefetch_depth = 2;
  po.write_behind_depth = 2;
  po.device_depth = 3;
  strata::subgroup_pipeline<exec_t> pipe(tier, exec, budget, float_objects(subgroups, n), po, strata::sweep_aware{},
                                        strata::always_device{});
  pipe.initialize([](std::size_t s, std::span<std::byte> b) {
    auto* f = reinterpret_cast<float*>(b.data());
    for (std::size_t i = 0; i < b.size() / 4; ++i) f[i] = static_cast<float>(s);
  });
  fast.reset_most();  // initialize writes objects not placed yet: the per-path depths hold for passes
  slow.reset_most();
  for (std::uint64_t step = 0; step < 3; ++step) {
    CAPTURE(step);
    const auto order = strata::order_of(strata::alternating{}, step, subgroups);
    const auto next = strata::order_of(strata::alternating{}, step + 1, subgroups);
    add_one_kernel<exec_t> k;
    k.log = &log;
    k.device_updates = subgroups;
    {
      std::lock_guard l(log.m);
      log.h2d_started = 0;
    }
    const auto st = pipe.run(order, next, order, step, k);
    CHECK(st.updated == subgroups);
    CHECK(st.device_updates == subgroups);
    REQUIRE(k.overlapped.size() == subgroups - 1);
    CHECK(std::accumulate(k.overlapped.begin(), k.overlapped.end(), 0) == static_cast<int>(subgroups - 1));
    CHECK(k.committed_order.size() == subgroups);
  }
  CHECK(log.device_most <= 3);
  CHECK(log.device_most >= 2);
  CHECK(log.write_before_d2h.empty());
  CHECK(fast.most_reads() <= 2);
  CHECK(slow.most_reads() <= 2);
  CHECK(fast.most_writes() <= 2);
  CHECK(slow.most_writes() <= 2);
  pipe.visit([&](std::size_t s, std::span<const std::byte> b) {
    const auto* f = reinterpret_cast<const float*>(b.data());
    CHECK(f[0] == static_cast<float>(s) + 3.0f);
    CHECK(f[b.size() / 4 - 1] == static_cast<float>(s) + 3.0f);
  });
}

// A tier whose reads wait at a gate until the test opens it.
class gated_tier : public strata::detail::adaptor_base<strata::host_tier> {
 public:
  explicit gated_tier(std::string name)
      : adaptor_base(std::in_place, strata::host_tier_options{.name = std::move(name)}) {}
  strata::completion read(std::string_view o, std::uint64_t off, std::span<std::byte> dst) {
    strata::completion_promise p;
    auto f = p.get_future();
    ++reads_;
    {
      std::lock_guard l(m_);
      if (!closed_) return inner_.read(o, off, dst);
      held_.push_back({std::string(o), off, dst, std::move(p)});
      ++waiting_;
    }
    cv_.notify_all();
    return f;
  }
  strata::completion write(std::string_view o, std::uint64_t off, std::span<const std::byte> src) {
    ++writes_;
    {
      std::lock_guard l(m_);
      if (writes_closed_) {
        strata::completion_promise p;
        auto f = p.get_future();
        held_writes_.push_back({std::string(o), off, src, std::move(p)});
        return f;
      }
    }
    cv_.notify_all();
    return inner_.write(o, off, src);
  }
  // Writes wait until open_writes() (reads go on).
  void close_writes() {
    std::lock_guard l(m_);
    writes_closed_ = true;
  }
  void open_writes() {
    release(writes_closed_, held_writes_, [&](held_write& h) { inner_.write(h.object, h.offset, h.src).get(); });
  }
  int writes_waiting() {
    std::lock_guard l(m_);
    return static_cast<int>(held_writes_.size());
  }
  void close() {
    std::lock_guard l(m_);
    closed_ = true;
  }
  void open() {
    release(closed_, held_, [&](held& h) { inner_.read(h.object, h.offset, h.dst).get(); });
  }
  int waiting() {
    std::lock_guard l(m_);
    return waiting_;
  }
  int writes() const { return writes_.load(); }
  int reads() const { return reads_.load(); }

 private:
  // Opens a gate and runs what waited behind it, completing each one's promise.
  template <class Held, class Run>
  void release(bool& closed, std::vector<Held>& waiting, Run run) {
    std::vector<Held> list;
    {
      std::lock_guard l(m_);
      closed = false;
      list.swap(waiting);
    }
    for (auto& h : list) {
      try {
        run(h);
        h.p.set_value();
      } catch (...) {
        h.p.set_exception(std::current_exception());
      }
    }
  }
  struct held {
    std::string object;
    std::uint64_t offset;
    std::span<std::byte> dst;
    strata::completion_promise p;
  };
  struct held_write {
    std::string object;
    std::uint64_t offset;
    std::span<const std::byte> src;
    strata::completion_promise p;
  };
  bool writes_closed_ = false;
  std::vector<held_write> held_writes_;
  std::mutex m_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<held> held_;
  int waiting_ = 0;
  std::atomic<int> writes_{0}, reads_{0};
};
static_assert(strata::tier<gated_tier>);

template <class Pred>
bool eventually(Pred&& pred) {
  const auto end = std::chrono::steady_clock::now() + hang_guard;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST_CASE("a path whose reads hang does not hold back the other path's read-ahead") {
  const std::size_t subgroups = 12, n = 1024;
  gated_tier stuck("stuck");
  probe<strata::host_tier> free_path(nullptr, strata::host_tier_options{.name = "free"});
  strata::multipath<strata::fixed_ratio, gated_tier&, probe<strata::host_tier>&> tier(strata::fixed_ratio({1, 1}),
                                                                                         stuck, free_path);
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  strata::pipeline_options po;
  po.prefetch_depth = 3;
  po.write_behind_depth = 3;
  strata::subgroup_pipeline<strata::host_executor<>> pipe(tier, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  // Placement 1:1 from subgroup 0: even subgroups on "stuck", odd on "free".
  stuck.close();
  const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
  add_one_kernel<strata::host_executor<>> k;
  auto pass = std::async(std::launch::async, [&] { return pipe.run(order, {}, order, 0, k); });
  // Subgroup 0 (stuck) is needed first; meanwhile the free path reads its own three ahead.
  CHECK(eventually([&] { return free_path.reads_done() >= 3; }));
  CHECK(stuck.waiting() >= 1);
  CHECK(k.commits.load() == 0);  // nothing could be updated: subgroup 0 is still being read
  stuck.open();
  const auto st = pass.get();
  CHECK(st.updated == subgroups);
}

TEST_CASE("eager writes: cached subgroups the order will evict are written before any read of the step completes") {
  for (const bool eager : {true, false}) {
    CAPTURE(eager);
    const std::size_t subgroups = 10, n = 1024;
    gated_tier t("t");
    strata::host_executor<> exec;
    strata::host_budget budget(strata::unlimited_capacity);
    strata::pipeline_options po;
    po.cache_slots = 4;
    po.eager_writes = eager;
    strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po);
    pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
    add_one_kernel<strata::host_executor<>> k0;
    auto o0 = strata::order_of(strata::alternating{}, 0, subgroups), o1 = strata::order_of(strata::alternating{}, 1, subgroups);
    pipe.run(o0, o1, o0, 0, k0);  // leaves 6..9 cached and dirty
    const int writes_before = t.writes();
    t.close();
    add_one_kernel<strata::host_executor<>> k1;
    auto pass = std::async(std::launch::async, [&] { return pipe.run(o1, o0, o1, 1, k1); });
    // Step 1 walks 9..0: 9, 8, 7, 6 are hits; 9..6 sit at positions 0..3 < 10 - 4, so the order
    // pushes them out: written eagerly while every read still waits at the gate.
    REQUIRE(eventually([&] { return t.waiting() >= 1; }));
    if (eager) {
      CHECK(eventually([&] { return t.writes() - writes_before == 4; }));
    } else {
      std::this_thread::sleep_for(20ms);
      CHECK(t.writes() == writes_before);  // nothing to write before a miss is updated
    }
    t.open();
    const auto st = pass.get();
    CHECK(st.cache_hits == 4);
    CHECK(st.bytes_written == 6 * n * sizeof(float));  // 10 - 4 kept, either way
  }
}

// sweep_aware without its plan: ranks alike, but cannot say what it keeps for the next step.
struct planless_sweep_aware {
  strata::sweep_aware p;
  void on_step_begin(std::span<const std::size_t> o, std::span<const std::size_t> n) { p.on_step_begin(o, n); }
  void on_insert(std::size_t id) { p.on_insert(id); }
  void on_access(std::size_t id) { p.on_access(id); }
  void on_erase(std::size_t id) noexcept { p.on_erase(id); }
  void pin(std::size_t id) { p.pin(id); }
  void unpin(std::size_t id) noexcept { p.unpin(id); }
  [[nodiscard]] std::optional<std::size_t> victim() const { return p.victim(); }
  [[nodiscard]] bool contains(std::size_t id) const { return p.contains(id); }
  [[nodiscard]] std::size_t size() const { return p.size(); }
};
static_assert(strata::eviction_policy<planless_sweep_aware>);
static_assert(!strata::eviction_policy_with_plan<planless_sweep_aware>);
static_assert(strata::eviction_policy_with_plan<strata::sweep_aware>);

TEST_CASE("eager writes: a hit that the policy keeps for the next pass, which starts where this one does, is not written") {
  // Updates that follow backward's landing order walk the same order every step: the hits come
  // first in each pass and are the next pass's first again, so writing them is wasted bandwidth.
  const std::size_t subgroups = 10, n = 1024;
  const std::size_t bytes = n * sizeof(float);
  for (const bool plan : {true, false}) {
    CAPTURE(plan);
    strata::host_tier t(strata::host_tier_options{.name = "t"});
    strata::host_executor<> exec;
    strata::host_budget budget(strata::unlimited_capacity);
    strata::pipeline_options po;
    po.cache_slots = 4;
    strata::any_eviction_policy policy = plan ? strata::any_eviction_policy(strata::sweep_aware{})
                                              : strata::any_eviction_policy(planless_sweep_aware{});
    strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                            std::move(policy));
    pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
    const std::vector<std::size_t> order{9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    add_one_kernel<strata::host_executor<>> k0, k1;
    pipe.run(order, order, order, 0, k0);
    const auto st = pipe.run(order, order, order, 1, k1);
    CHECK(st.cache_hits == 4);
    for (const std::size_t s : {9, 8, 7, 6}) CHECK(pipe.cached(s));
    // The misses are written either way; the hits only by the policy that cannot tell.
    CHECK(st.bytes_written == (plan ? 6 : 10) * bytes);
    for (const std::size_t s : {9, 8, 7, 6}) CHECK(pipe.state(s).dirty == plan);  // (flush() writes them)
    pipe.flush();
    pipe.visit([&](std::size_t s, std::span<const std::byte> b) {
      CAPTURE(s);
      float v = 0;
      std::memcpy(&v, b.data(), sizeof v);
      CHECK(v == 2.0f);  // two passes of +1, wherever the state is
    });
  }
}

TEST_CASE("a failed copy or kernel leaves each subgroup at the old or the new state; the retry finishes the pass") {
  const std::size_t subgroups = 9, n = 4096;
  for (const auto role : {strata::stream_role::h2d, strata::stream_role::compute, strata::stream_role::d2h})
    for (const std::uint64_t after : {0, 2, 5}) {
      CAPTURE(strata::to_string(role));
      CAPTURE(after);
      using S = strata::faulty<strata::host_stream>;
      S* target = nullptr;
      strata::host_executor<S> exec({}, [&](strata::stream_role r, const std::string& name) {
        auto s = std::make_unique<S>(name);
        if (r == role) target = s.get();
        return s;
      });
      strata::host_tier t(strata::host_tier_options{.name = "t"});
      strata::host_budget budget(strata::unlimited_capacity);
      strata::pipeline_options po;
      po.cache_slots = 2;
      strata::subgroup_pipeline<strata::host_executor<S>> pipe(
          t, exec, budget, float_objects(subgroups, n), po, strata::sweep_aware{}, strata::alternating_site{1, 2});
      pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
      target->inject({.op = role == strata::stream_role::compute ? std::optional(strata::stream_op::task)
                                                                 : std::optional<strata::stream_op>(),
                      .after = after});
      const auto order = strata::order_of(strata::alternating{}, 0, subgroups);
      std::vector<std::size_t> todo = order;
      std::vector<int> updates(subgroups, 0);
      bool failed = false;
      for (int attempt = 0; attempt < 3 && !todo.empty(); ++attempt) {
        add_one_kernel<strata::host_executor<S>> k;
        try {
          pipe.run(order, {}, todo, 0, k);
        } catch (const strata::stream_error& e) {
          failed = true;
          CHECK(std::string(e.what()).find("injected fault") != std::string::npos);
        }
        for (const auto s : k.committed_order) ++updates[s];
        std::vector<std::size_t> left;
        for (const auto s : todo)
          if (updates[s] == 0) left.push_back(s);
        todo = left;
      }
      CHECK(failed);
      CHECK(todo.empty());
      // Exactly one update each: a failed one never half-applied, a committed one never repeated.
      pipe.visit([&](std::size_t s, std::span<const std::byte> b) {
        CAPTURE(s);
        CHECK(updates[s] == 1);
        const auto* f = reinterpret_cast<const float*>(b.data());
        for (std::size_t i = 0; i < n; i += 1021) CHECK(f[i] == 1.0f);
      });
    }
}

TEST_CASE("a pass refuses a subgroup listed twice, and a device site needs a device depth") {
  strata::host_tier t(strata::host_tier_options{.name = "t"});
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(3, 16),
                                                          strata::pipeline_options{}, strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  add_one_kernel<strata::host_executor<>> k;
  const std::vector<std::size_t> order{0, 1, 2};
  CHECK_THROWS_AS(pipe.run(order, {}, std::vector<std::size_t>{0, 0}, 0, k), strata::config_error);  // twice
  CHECK_THROWS_AS(strata::subgroup_pipeline<strata::host_executor<>>(t, exec, budget, float_objects(3, 16),
                                                                      strata::pipeline_options{.device_depth = 0},
                                                                      strata::lru{}, strata::always_device{}),
                  strata::config_error);
  const auto st = pipe.run(order, {}, order, 0, k);
  CHECK(st.updated == 3);
}

TEST_CASE("cached subgroups an lru cache evicts before their update give their slots back (no starved read)") {
  // lru under the sequential order evicts, at the start of each pass, subgroups the pass has yet
  // to update; their slots must return, or the slots sized for cache + read-ahead run out.
  for (const std::size_t cache : {std::size_t{2}, std::size_t{3}, std::size_t{4}}) {
    CAPTURE(cache);
    const std::size_t subgroups = 7, n = 256;
    strata::host_tier t(strata::host_tier_options{.name = "t"});
    strata::host_executor<> exec;
    strata::host_budget budget(strata::unlimited_capacity);
    strata::pipeline_options po;
    po.cache_slots = cache;
    po.prefetch_depth = 0;
    po.write_behind_depth = 1;
    strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                            strata::lru{});
    pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
    const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
    for (std::uint64_t step = 0; step < 4; ++step) {
      add_one_kernel<strata::host_executor<>> k;
      CHECK(pipe.run(order, order, order, step, k).updated == subgroups);
    }
    pipe.visit([&](std::size_t, std::span<const std::byte> b) {
      CHECK(reinterpret_cast<const float*>(b.data())[0] == 4.0f);
    });
    CHECK(pipe.slots().free_host() + cache == po.host_slots());  // every slot but the cache's is back
  }
}

TEST_CASE("prefetch starts the next pass's first uncached reads, returns while they are in flight, and the pass takes them over") {
  const std::size_t subgroups = 6, n = 256;
  gated_tier t("t");
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  strata::pipeline_options po;
  po.cache_slots = 2;
  po.prefetch_depth = 2;
  po.write_behind_depth = 1;
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
  {
    add_one_kernel<strata::host_executor<>> k;
    CHECK(pipe.run(order, order, order, 0, k).updated == subgroups);
  }
  std::size_t cached = 0;
  for (std::size_t s = 0; s < subgroups; ++s) cached += pipe.cached(s) ? 1 : 0;
  REQUIRE(cached == 2);
  REQUIRE_FALSE(pipe.cached(0));
  REQUIRE_FALSE(pipe.cached(1));
  t.close();  // every read now waits until open(): prefetch must not
  const int reads_before = t.reads();
  CHECK(pipe.prefetch(order) == 2);  // prefetch_depth on the one path: subgroups 0 and 1
  CHECK(t.waiting() == 2);
  CHECK(pipe.state(0).phase == strata::subgroup_phase::reading);
  CHECK(pipe.state(1).phase == strata::subgroup_phase::reading);
  CHECK(pipe.prefetch(order) == 0);  // already in flight: nothing more (the depth is reached)
  t.open();
  add_one_kernel<strata::host_executor<>> k;
  const auto st = pipe.run(order, order, order, 1, k);
  CHECK(st.updated == subgroups);
  CHECK(st.prefetched == 2);
  CHECK(st.cache_misses == subgroups);  // (lru evicts the cached ones before the order reaches them)
  CHECK(st.prefetched_bytes == 2 * n * sizeof(float));
  CHECK(st.bytes_read == subgroups * n * sizeof(float));
  CHECK(t.reads() - reads_before == static_cast<int>(subgroups));  // none read twice
  pipe.visit([&](std::size_t, std::span<const std::byte> b) {
    const auto* f = reinterpret_cast<const float*>(b.data());
    CHECK(f[0] == 2.0f);
    CHECK(f[n - 1] == 2.0f);
  });
}

TEST_CASE("a prefetched read that fails is forgotten: the next call goes on and the pass reads the subgroup again") {
  const std::size_t subgroups = 5, n = 256;
  strata::faulty<strata::host_tier> t(strata::host_tier_options{.name = "t"});
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  strata::pipeline_options po;
  po.prefetch_depth = 2;
  po.write_behind_depth = 1;
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
  for (std::uint64_t step = 0; step < 3; ++step) {
    CAPTURE(step);
    t.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::read, .object = "sg-0"});
    CHECK(pipe.prefetch(order) == 2);
    if (step == 1) {  // a call other than run() waits for the reads; the failure is not its error
      CHECK_NOTHROW(pipe.visit([](std::size_t, std::span<const std::byte>) {}));
      CHECK(pipe.state(0).phase == strata::subgroup_phase::on_tier);
      CHECK(pipe.state(1).phase == strata::subgroup_phase::resident);
    }
    add_one_kernel<strata::host_executor<>> k;
    const auto st = pipe.run(order, order, order, step, k);
    CHECK(st.updated == subgroups);
    t.clear();
  }
  CHECK(t.fired() == 3);
  pipe.visit([&](std::size_t, std::span<const std::byte> b) {
    CHECK(reinterpret_cast<const float*>(b.data())[0] == 3.0f);
  });
  CHECK(pipe.slots().free_host() == po.host_slots());
}

TEST_CASE("subgroups prefetched for a pass that does not update them give their slots back") {
  const std::size_t subgroups = 6, n = 256;
  strata::host_tier t(strata::host_tier_options{.name = "t"});
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  strata::pipeline_options po;
  po.prefetch_depth = 3;
  po.write_behind_depth = 1;
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
  CHECK(pipe.prefetch(order) == 3);  // 0, 1, 2
  pipe.settle();
  // The pass updates 3, 4 and 5 only: the read-ahead of 0..2 must not starve it of slots.
  const std::vector<std::size_t> todo{3, 4, 5};
  add_one_kernel<strata::host_executor<>> k;
  const auto st = pipe.run(order, order, todo, 0, k);
  CHECK(st.updated == 3);
  CHECK(st.prefetched == 3);
  CHECK(pipe.slots().free_host() == po.host_slots());
  pipe.visit([&](std::size_t s, std::span<const std::byte> b) {
    CHECK(reinterpret_cast<const float*>(b.data())[0] == (s >= 3 ? 1.0f : 0.0f));
  });
}

TEST_CASE("a pipeline destroyed with prefetched reads in flight waits for them") {
  strata::faulty<strata::host_tier> t(strata::host_tier_options{.name = "t"});
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  strata::pipeline_options po;
  po.prefetch_depth = 2;
  po.write_behind_depth = 1;
  const auto order = strata::order_of(strata::sequential{}, 0, 4);
  {
    strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(4, 4096), po, strata::lru{});
    pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
    t.inject({.kind = strata::fault_kind::delay, .op = strata::fault_op::read, .object = {}, .after = 0,
              .times = 0, .probability = 1.0, .delay = std::chrono::milliseconds(50)});
    CHECK(pipe.prefetch(order) == 2);
  }  // (ASan and TSan see a read that lands in a freed slot or posts to a dead pipeline)
  CHECK(budget.used() == 0);
}

// Read-ahead 2, one write behind, and a pass that returns before its last writes land.
strata::pipeline_options writes_after_options() {
  strata::pipeline_options po;
  po.prefetch_depth = 2;
  po.write_behind_depth = 1;
  po.return_before_writes = true;
  return po;
}

TEST_CASE("a pass that returns before its writes leaves them in flight; the next pass takes them over and does not "
          "read again the subgroups it updates first") {
  const std::size_t subgroups = 4, n = 256;  // as many as host slots: the pass never waits for a write
  gated_tier t("t");
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  const auto po = writes_after_options();
  REQUIRE(po.host_slots() == subgroups);
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  const auto order = strata::order_of(strata::alternating{}, 0, subgroups);
  t.close_writes();
  add_one_kernel<strata::host_executor<>> k;
  const auto st = pipe.run(order, strata::order_of(strata::alternating{}, 1, subgroups), order, 0, k);
  CHECK(st.updated == subgroups);
  CHECK(st.writes_left == subgroups);
  CHECK(st.writes_left_bytes == subgroups * n * sizeof(float));
  CHECK(st.bytes_written == subgroups * n * sizeof(float));  // counted by the pass that issued them
  CHECK(t.writes_waiting() == static_cast<int>(subgroups));  // (write_behind_depth: all issued at the return)
  for (std::size_t s = 0; s < subgroups; ++s) CHECK(pipe.state(s).phase == strata::subgroup_phase::writing);
  t.open_writes();
  const int reads_before = t.reads();
  const auto next = strata::order_of(strata::alternating{}, 1, subgroups);
  const auto st1 = pipe.run(next, order, next, 1, k);
  CHECK(st1.updated == subgroups);
  CHECK(st1.bytes_written == subgroups * n * sizeof(float));
  // The first prefetch_depth + 1 of its order stay in their slots as their writes land; the last
  // one gives its slot back and is read.
  CHECK(t.reads() - reads_before == 1);
  CHECK(st1.bytes_read == n * sizeof(float));
  pipe.visit([&](std::size_t, std::span<const std::byte> b) { CHECK(reinterpret_cast<const float*>(b.data())[0] == 2.0f); });
  pipe.flush();
  CHECK(pipe.slots().free_host() == po.host_slots());
  for (std::size_t s = 0; s < subgroups; ++s) {
    std::vector<float> back(n);
    t.read(fmt::format("sg-{}", s), 0, std::as_writable_bytes(std::span<float>(back))).get();
    CHECK(back[n - 1] == 2.0f);
  }
}

TEST_CASE("read_ahead reads the next pass's subgroups into slots as the writes the last pass left land, keeps those "
          "being written that the next pass wants, and ends at close_offers") {
  const std::size_t subgroups = 8, n = 256;
  gated_tier t("t");
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  const auto po = writes_after_options();
  REQUIRE(po.host_slots() == 4);
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
  const std::vector<std::size_t> first{0, 1, 2, 3};
  const std::vector<std::size_t> next{2, 3, 4, 5, 6, 7, 0, 1};
  t.close_writes();
  add_one_kernel<strata::host_executor<>> k;
  const auto st = pipe.run(order, next, first, 0, k);
  REQUIRE(st.writes_left == 4);  // every slot holds a subgroup being written
  const int reads_before = t.reads();
  {  // Nothing is free: it waits for the writes, and close_offers ends it with nothing read.
    auto ahead = std::async(std::launch::async, [&] { return pipe.read_ahead(next); });
    CHECK(ahead.wait_for(20ms) == std::future_status::timeout);  // (still waiting; no bound on time)
    pipe.close_offers();
    CHECK(ahead.get() == 0);
  }
  CHECK(t.reads() == reads_before);
  // Again, and the writes land: 0 and 1 give their slots back, 2 and 3 (first in the next order)
  // keep theirs; one free slot is read into (subgroup 4) and one stays free.
  auto ahead = std::async(std::launch::async, [&] { return pipe.read_ahead(next); });
  t.open_writes();
  CHECK(ahead.get() == 1);
  CHECK(pipe.state(2).phase == strata::subgroup_phase::resident);
  CHECK(pipe.state(3).phase == strata::subgroup_phase::resident);
  CHECK(pipe.state(0).phase == strata::subgroup_phase::on_tier);
  CHECK(pipe.slots().free_host() == 1);
  const auto st1 = pipe.run(next, next, next, 1, k);
  CHECK(st1.updated == subgroups);
  CHECK(st1.prefetched == 1);
  CHECK(st1.bytes_read == 6 * n * sizeof(float));  // 4 (prefetched), 5, 6, 7, 0, 1: 2 and 3 not read again
  CHECK(t.reads() - reads_before == 6);
  pipe.flush();
  pipe.visit([&](std::size_t s, std::span<const std::byte> b) {
    CHECK(reinterpret_cast<const float*>(b.data())[0] == (s < 4 ? 2.0f : 1.0f));
  });
  CHECK(pipe.slots().free_host() == po.host_slots());
}

namespace {
// Six zeroed subgroups of 256 floats on a gated tier, 4 host slots, reads for the next pass on.
struct reads_next_rig {
  static constexpr std::size_t subgroups = 6, n = 256;
  static strata::pipeline_options options() {
    auto po = writes_after_options();
    po.read_next_in_pass = true;
    return po;
  }
  gated_tier t{"t"};
  strata::host_executor<> exec;
  strata::host_budget budget{strata::unlimited_capacity};
  strata::pipeline_options po = options();
  strata::subgroup_pipeline<strata::host_executor<>> pipe{t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{}};
  std::vector<std::size_t> order = strata::order_of(strata::sequential{}, 0, subgroups);
  add_one_kernel<strata::host_executor<>> k;
  reads_next_rig() {
    REQUIRE(po.host_slots() == 4);
    pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  }
};
}  // namespace

TEST_CASE_FIXTURE(reads_next_rig,
                  "with read_next_in_pass a pass that has started every read it needs reads the next pass's first "
                  "subgroups into free slots, returns with them in flight, and the next pass takes them over") {
  const std::vector<std::size_t> first{0, 1};
  t.close_writes();  // 0 and 1 keep their slots: two free, one of them kept free
  const auto st = pipe.run(order, order, first, 0, k);
  CHECK(st.updated == 2);
  CHECK(st.bytes_read == 2 * n * sizeof(float));  // (the read for the next pass counts there)
  CHECK(pipe.state(2).phase != strata::subgroup_phase::on_tier);  // read (or reading) for the next pass
  CHECK(pipe.state(3).phase == strata::subgroup_phase::on_tier);
  t.open_writes();
  const auto st1 = pipe.run(order, order, order, 1, k);
  CHECK(st1.updated == subgroups);
  CHECK(st1.prefetched == 1);
  CHECK(st1.prefetched_bytes == n * sizeof(float));
  pipe.flush();  // (what pass 1 read for a next pass stays in its slots)
  pipe.visit([&](std::size_t s, std::span<const std::byte> b) {
    CHECK(reinterpret_cast<const float*>(b.data())[0] == (s < 2 ? 2.0f : 1.0f));
  });
}

TEST_CASE_FIXTURE(reads_next_rig,
                  "a subgroup read for the next pass, updated by it and read again between passes leaves the count "
                  "of reads for the next pass right: the pass after still returns before its writes") {
  CHECK(pipe.prefetch(order) == 2);  // 0 and 1: pass 0 reads nothing itself
  pipe.settle();
  t.close();  // pass 0's read of 2 for the next pass is still in flight as pass 1 starts
  const std::vector<std::size_t> first{0, 1};
  CHECK(pipe.run(order, order, first, 0, k).updated == 2);
  CHECK(pipe.state(2).phase == strata::subgroup_phase::reading);
  const std::vector<std::size_t> two{2};
  auto pass1 = std::async(std::launch::async, [&] { return pipe.run(order, order, two, 1, k); });
  t.open();
  const auto st1 = pass1.get();
  CHECK(st1.updated == 1);
  // (how many subgroups pass 1 reads for pass 2 depends on when pass 0's writes free their slots)
  pipe.flush();  // 2 is written and gives its slot back
  CHECK(pipe.state(2).phase == strata::subgroup_phase::on_tier);
  const std::vector<std::size_t> again{2};
  CHECK(pipe.prefetch(again) == 1);  // read again, by prefetch() this time
  pipe.settle();
  t.close_writes();
  const std::vector<std::size_t> four{4};
  const auto st2 = pipe.run(order, order, four, 2, k);
  CHECK(st2.updated == 1);
  CHECK(st2.writes_left == 1);  // (a miscounted read for the next pass would keep the pass waiting for it)
  t.open_writes();
  pipe.flush();
  pipe.visit([&](std::size_t s, std::span<const std::byte> b) {
    CHECK(reinterpret_cast<const float*>(b.data())[0] == (s < 3 || s == 4 ? 1.0f : 0.0f));
  });
}

TEST_CASE("with read_ahead_of_offers an open pass reads the first subgroups of its planned order, per path as deep as "
          "prefetch_depth, before they are offered, and updates each once whatever order the offers come in") {
  const std::size_t subgroups = 6, n = 256;
  gated_tier t("t");
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  auto po = writes_after_options();
  po.read_ahead_of_offers = true;
  REQUIRE(po.host_slots() == 4);
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
  add_one_kernel<strata::host_executor<>> k;
  const int reads_before = t.reads();
  auto pass = std::async(std::launch::async, [&] { return pipe.run_open(order, order, 0, k, /*update=*/true); });
  // Nothing offered yet: 0 and 1 (prefetch_depth 2 on the one path) are read all the same.
  CHECK(eventually([&] { return t.reads() - reads_before == 2; }));
  SUBCASE("offered in the planned order") {
    for (const std::size_t s : order) pipe.offer(s);
  }
  SUBCASE("offered in another order: those read ahead wait in their slots, one slot stays free for the others") {
    for (const std::size_t s : {5, 3, 4, 2, 1, 0}) pipe.offer(s);
  }
  pipe.close_offers();
  const auto st = pass.get();
  CHECK(st.updated == subgroups);
  CHECK(st.bytes_read == subgroups * n * sizeof(float));  // each read once, counted in the pass
  CHECK(t.reads() - reads_before == static_cast<int>(subgroups));
  pipe.flush();
  pipe.visit([&](std::size_t, std::span<const std::byte> b) {
    CHECK(reinterpret_cast<const float*>(b.data())[0] == 1.0f);
  });
}

TEST_CASE("a write a pass left in flight that fails is raised, typed, by the next call and loses nothing") {
  const std::size_t subgroups = 4, n = 256;
  strata::faulty<strata::host_tier> t(strata::host_tier_options{.name = "t"});
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  const auto po = writes_after_options();
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
  // sg-3, updated last, is written as the pass returns: its write fails after the return.
  t.inject({.kind = strata::fault_kind::eio, .op = strata::fault_op::write, .object = "sg-3"});
  add_one_kernel<strata::host_executor<>> k;
  const auto st = pipe.run(order, order, order, 0, k);
  CHECK(st.updated == subgroups);
  CHECK(st.writes_left >= 1);
  CHECK(t.fired() == 1);
  SUBCASE("found by flush") {
    CHECK_THROWS_AS(pipe.flush(), strata::io_error);
  }
  SUBCASE("found by a visit") {
    CHECK_THROWS_AS(pipe.visit([](std::size_t, std::span<const std::byte>) {}), strata::io_error);
  }
  CHECK(pipe.state(3).phase == strata::subgroup_phase::resident);  // the only copy, in its slot
  CHECK(pipe.state(3).dirty);
  pipe.flush();  // written now
  std::vector<float> back(n);
  t.read("sg-3", 0, std::as_writable_bytes(std::span<float>(back))).get();
  CHECK(back[0] == 1.0f);
  CHECK(pipe.slots().free_host() == po.host_slots());
}

TEST_CASE("a pipeline destroyed with writes a pass left in flight waits for them") {
  strata::faulty<strata::host_tier> t(strata::host_tier_options{.name = "t"});
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  const auto po = writes_after_options();
  const auto order = strata::order_of(strata::sequential{}, 0, 4);
  {
    strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(4, 4096), po, strata::lru{});
    pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
    t.inject({.kind = strata::fault_kind::delay, .op = strata::fault_op::write, .object = {}, .after = 0,
              .times = 0, .probability = 1.0, .delay = std::chrono::milliseconds(50)});
    add_one_kernel<strata::host_executor<>> k;
    CHECK(pipe.run(order, order, order, 0, k).writes_left >= 1);
  }  // (ASan and TSan see a write that reads a freed slot or posts to a dead pipeline)
  CHECK(budget.used() == 0);
}


namespace {
// Adds 1 to every float of a subgroup; counts its calls; its adopted() counts (and, for
// `fail_adopt`, throws) instead of adding: the speculative copy holds the update already.
struct adopting_add_one {
  std::atomic<int> hosts{0}, adoptions{0};
  std::size_t fail_adopt = static_cast<std::size_t>(-1);
  void host(std::size_t, std::span<std::byte> slot) {
    auto* f = reinterpret_cast<float*>(slot.data());
    for (std::size_t i = 0; i < slot.size() / sizeof(float); ++i) f[i] += 1.0f;
    ++hosts;
  }
  void adopted(std::size_t s, std::span<std::byte>) {
    if (s == fail_adopt) throw strata::io_error("adopted", "sg-1", EIO);
    ++adoptions;
  }
  void committed(std::size_t) {}
};
static_assert(strata::adopting_kernel<adopting_add_one>);
static_assert(!strata::adopting_kernel<add_one_kernel<strata::host_executor<>>>);
}  // namespace

TEST_CASE("speculative updates of an open pass change nothing until the next run() adopts them: adopted, each "
          "subgroup is updated once; dropped (another call first, or not adopted), the run updates them itself; a "
          "failed adoption leaves the old state") {
  const std::size_t subgroups = 6, n = 256;
  strata::host_tier t({.name = "t", .read_bandwidth = 0, .write_bandwidth = 0});
  strata::host_executor<> exec;
  strata::host_budget budget(strata::unlimited_capacity);
  auto po = writes_after_options();
  po.cache_slots = subgroups;  // every subgroup stays in a slot: 4 more slots free
  strata::subgroup_pipeline<strata::host_executor<>> pipe(t, exec, budget, float_objects(subgroups, n), po,
                                                          strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> b) { std::memset(b.data(), 0, b.size()); });
  const auto order = strata::order_of(strata::sequential{}, 0, subgroups);
  adopting_add_one warm;
  pipe.run(order, order, order, 0, warm);  // all cached, at 1
  const auto values = [&] {
    std::vector<float> v;
    pipe.visit([&](std::size_t, std::span<const std::byte> b) {
      const auto* f = reinterpret_cast<const float*>(b.data());
      CHECK(std::all_of(f, f + n, [&](float x) { return x == f[0]; }));
      v.push_back(f[0]);
    });
    return v;
  };
  adopting_add_one spec;
  auto pass = std::async(std::launch::async, [&] { return pipe.run_speculative(order, order, 1, spec); });
  for (const std::size_t s : order) pipe.offer(s);
  // Two run at once on the worker, and one slot stays free: three copies, then no slot.
  REQUIRE(eventually([&] { return spec.hosts.load() == 3; }));
  pipe.close_offers();
  const auto st = pass.get();
  CHECK(st.speculated == 3);
  CHECK(st.updated == 0);
  CHECK(st.bytes_written == 0);
  adopting_add_one k;
  SUBCASE("adopted: the first three are the copies, the rest updated; each once") {
    pipe.adopt_speculation(true);
    const auto r = pipe.run(order, order, order, 1, k);
    CHECK(r.adopted == 3);
    CHECK(r.updated == subgroups);
    CHECK(k.adoptions.load() == 3);
    CHECK(k.hosts.load() == 3);
    CHECK(values() == std::vector<float>(subgroups, 2.0f));
  }
  SUBCASE("not adopted: dropped, the run updates every subgroup") {
    pipe.adopt_speculation(false);
    const auto r = pipe.run(order, order, order, 1, k);
    CHECK(r.adopted == 0);
    CHECK(k.hosts.load() == static_cast<int>(subgroups));
    CHECK(values() == std::vector<float>(subgroups, 2.0f));
  }
  SUBCASE("another call first: it sees the old state and drops the copies") {
    pipe.adopt_speculation(true);
    CHECK(values() == std::vector<float>(subgroups, 1.0f));
    const auto r = pipe.run(order, order, order, 1, k);
    CHECK(r.adopted == 0);
    CHECK(k.hosts.load() == static_cast<int>(subgroups));
    CHECK(values() == std::vector<float>(subgroups, 2.0f));
  }
  SUBCASE("a failed adoption: that subgroup stays at the old state, the retry updates it") {
    k.fail_adopt = 1;
    pipe.adopt_speculation(true);
    CHECK_THROWS_AS(pipe.run(order, order, order, 1, k), strata::io_error);
    auto v = values();
    CHECK(v[1] == 1.0f);
    CHECK(std::count(v.begin(), v.end(), 2.0f) + std::count(v.begin(), v.end(), 1.0f) == static_cast<long>(subgroups));
    std::vector<std::size_t> rest;
    for (std::size_t s = 0; s < subgroups; ++s)
      if (v[s] == 1.0f) rest.push_back(s);
    pipe.run(order, order, rest, 1, k);
    CHECK(values() == std::vector<float>(subgroups, 2.0f));
  }
}

}  // namespace pipeline_test
