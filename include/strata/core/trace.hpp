#pragma once
/// Named spans per thread or per stream, written as a Chrome trace JSON file that Perfetto
/// (ui.perfetto.dev) and chrome://tracing open.
///
/// A tracer has a mode: `off` records nothing (a span costs one atomic load), `summary` feeds only
/// the aggregate metrics (count/total/min/max per span name, bounded memory), `full` also keeps
/// every event, up to `max_events` (later events are counted as dropped, not stored).
/// Each OS thread gets its own track, named after the thread; work that is not a thread (a CUDA
/// stream, an I/O queue) gets a named track from `make_track` and is recorded with explicit
/// begin/end times. All members are thread-safe.

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "strata/core/fs.hpp"
#include "strata/core/metrics.hpp"
#include "strata/version.hpp"

namespace strata {

/// What a tracer records.
enum class trace_mode : std::uint8_t { off, summary, full };

/// One key/value shown with an event in the trace viewer.
struct trace_arg {
  std::string key;
  std::variant<std::int64_t, double, std::string> value;
};

/// Identifies a row of the trace (a thread or a named stream).
using track_id = std::uint32_t;

class tracer {
 public:
  using clock = std::chrono::steady_clock;

  /// A tracer whose time origin is now.
  explicit tracer(trace_mode mode = trace_mode::full, std::size_t max_events = 1'000'000)
      : mode_(mode), max_events_(max_events), epoch_(clock::now()) {}

  tracer(const tracer&) = delete;
  tracer& operator=(const tracer&) = delete;

  [[nodiscard]] trace_mode mode() const noexcept { return mode_.load(std::memory_order_relaxed); }
  void set_mode(trace_mode m) noexcept { mode_.store(m, std::memory_order_relaxed); }
  /// Whether spans are recorded at all (mode is not off).
  [[nodiscard]] bool recording() const noexcept { return mode() != trace_mode::off; }

  /// The calling thread's track, created on first use and named after the thread.
  [[nodiscard]] track_id thread_track() {
    std::lock_guard lock(mutex_);
    return thread_track_locked();
  }

  /// Renames the calling thread's track.
  void name_thread_track(std::string name) {
    std::lock_guard lock(mutex_);
    tracks_[thread_track_locked() - 1] = std::move(name);
  }

  /// A new track for work that is not an OS thread, e.g. "cuda stream 1" or "nvme0 queue".
  [[nodiscard]] track_id make_track(std::string name) {
    std::lock_guard lock(mutex_);
    tracks_.push_back(std::move(name));
    return static_cast<track_id>(tracks_.size());
  }

  /// Records a span that ran on `track` from `begin` to `end`.
  void complete(track_id track, std::string_view name, clock::time_point begin, clock::time_point end,
                std::vector<trace_arg> args = {}, std::string_view category = "strata") {
    const auto m = mode();
    if (m == trace_mode::off) return;
    summary_.record(name, std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin));
    if (m == trace_mode::full) push({'X', track, ns_since_epoch(begin), (end - begin).count(), std::string(name),
                                     std::string(category), std::move(args), 0.0});
  }

  /// Records a point in time on `track` (e.g. "checkpoint written").
  void instant(track_id track, std::string_view name, std::vector<trace_arg> args = {},
               std::string_view category = "strata") {
    if (mode() != trace_mode::full) return;
    push({'i', track, ns_since_epoch(clock::now()), 0, std::string(name), std::string(category), std::move(args),
          0.0});
  }

  /// Records the value of a quantity that changes over time (e.g. bytes in flight); shown as a graph.
  void counter(std::string_view name, double value) {
    if (mode() != trace_mode::full) return;
    push({'C', 0, ns_since_epoch(clock::now()), 0, std::string(name), "strata", {}, value});
  }

  /// Aggregates of every span recorded (also in summary mode), and of counters added here.
  [[nodiscard]] metrics& summary() noexcept { return summary_; }
  [[nodiscard]] const metrics& summary() const noexcept { return summary_; }

  /// Events stored so far.
  [[nodiscard]] std::size_t event_count() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }
  /// Events not stored because max_events was reached.
  [[nodiscard]] std::size_t dropped_events() const {
    std::lock_guard lock(mutex_);
    return dropped_;
  }

  /// Forgets events and aggregates; tracks stay.
  void clear() {
    std::lock_guard lock(mutex_);
    events_.clear();
    dropped_ = 0;
    summary_.reset();
  }

  /// The trace as Chrome trace JSON (the object form, with "traceEvents").
  [[nodiscard]] std::string chrome_trace_json() const {
    std::vector<event> events;
    std::vector<std::string> tracks;
    std::size_t dropped = 0;
    {
      std::lock_guard lock(mutex_);
      events = events_;
      tracks = tracks_;
      dropped = dropped_;
    }
    // Parents before children on each track, so viewers that stack by order nest them right.
    std::stable_sort(events.begin(), events.end(), [](const event& a, const event& b) {
      if (a.track != b.track) return a.track < b.track;
      if (a.ts_ns != b.ts_ns) return a.ts_ns < b.ts_ns;
      return a.dur_ns > b.dur_ns;
    });
    const int pid = static_cast<int>(::getpid());
    std::string out = R"({"displayTimeUnit":"ms","traceEvents":[)";
    bool first = true;
    const auto sep = [&] {
      if (!first) out += ",\n";
      first = false;
    };
    sep();
    out += fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"tid":0,"args":{{"name":"strata"}}}})", pid);
    for (std::size_t i = 0; i < tracks.size(); ++i) {
      sep();
      out += fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})", pid, i + 1,
                         json_string(tracks[i]));
      sep();
      out += fmt::format(R"({{"ph":"M","name":"thread_sort_index","pid":{},"tid":{},"args":{{"sort_index":{}}}}})",
                         pid, i + 1, i + 1);
    }
    for (const auto& e : events) {
      sep();
      out += fmt::format(R"({{"ph":"{}","name":{},"cat":{},"pid":{},"tid":{},"ts":{})", e.phase,
                         json_string(e.name), json_string(e.category), pid, e.track, micros(e.ts_ns));
      if (e.phase == 'X') out += fmt::format(R"(,"dur":{})", micros(e.dur_ns));
      if (e.phase == 'i') out += R"(,"s":"t")";
      if (e.phase == 'C') {
        out += fmt::format(R"(,"args":{{"value":{}}})", json_number(e.value));
      } else if (!e.args.empty()) {
        out += R"(,"args":{)";
        for (std::size_t i = 0; i < e.args.size(); ++i) {
          if (i != 0) out += ',';
          out += json_string(e.args[i].key);
          out += ':';
          std::visit(
              [&](const auto& v) {
                using V = std::decay_t<decltype(v)>;
                if constexpr (std::is_same_v<V, std::string>)
                  out += json_string(v);
                else if constexpr (std::is_same_v<V, double>)
                  out += json_number(v);
                else
                  out += fmt::format("{}", v);
              },
              e.args[i].value);
        }
        out += '}';
      }
      out += '}';
    }
    out += fmt::format(R"(],"otherData":{{"strata_version":"{}","dropped_events":{}}}}})", version_string, dropped);
    out += '\n';
    return out;
  }

  /// Writes chrome_trace_json() to `path` atomically; io_error names the path on failure.
  void write_chrome_trace(const std::filesystem::path& path) const { write_file_atomic(path, chrome_trace_json()); }

  /// Nanoseconds from this tracer's origin to `t`.
  [[nodiscard]] std::int64_t ns_since_epoch(clock::time_point t) const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - epoch_).count();
  }

 private:
  struct event {
    char phase;
    track_id track;
    std::int64_t ts_ns;
    std::int64_t dur_ns;
    std::string name;
    std::string category;
    std::vector<trace_arg> args;
    double value;
  };

  void push(event e) {
    std::lock_guard lock(mutex_);
    if (events_.size() >= max_events_) {
      ++dropped_;
      return;
    }
    events_.push_back(std::move(e));
  }

  track_id thread_track_locked() {
    const auto id = std::this_thread::get_id();
    if (auto it = thread_tracks_.find(id); it != thread_tracks_.end()) return it->second;
    char buf[16] = {};
    std::string name;
    if (::pthread_getname_np(::pthread_self(), buf, sizeof(buf)) == 0) name = buf;
    tracks_.push_back(fmt::format("{} (thread {})", name.empty() ? "thread" : name, thread_tracks_.size() + 1));
    const auto track = static_cast<track_id>(tracks_.size());
    thread_tracks_.emplace(id, track);
    return track;
  }

  // Exact microseconds with nanosecond digits: no floating-point rounding, so nesting survives.
  static std::string micros(std::int64_t ns) {
    const char* sign = ns < 0 ? "-" : "";
    const auto a = ns < 0 ? -ns : ns;
    return fmt::format("{}{}.{:03}", sign, a / 1000, a % 1000);
  }

  static std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

  static std::string json_string(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 2);
    out += '"';
    for (const char c : s) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20)
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
          else
            out += c;
      }
    }
    out += '"';
    return out;
  }

  std::atomic<trace_mode> mode_;
  std::size_t max_events_;
  clock::time_point epoch_;
  metrics summary_;
  mutable std::mutex mutex_;
  std::vector<event> events_;
  std::size_t dropped_ = 0;
  std::vector<std::string> tracks_;  // index = track_id - 1
  std::unordered_map<std::thread::id, track_id> thread_tracks_;
};

/// Records one span on the calling thread's track from construction to end() or destruction.
/// A null tracer or one that is off makes it a no-op, so components take a `tracer*` that may be
/// null and trace unconditionally.
class trace_span {
 public:
  trace_span(tracer* t, std::string_view name, std::string_view category = "strata")
      : tracer_(t != nullptr && t->recording() ? t : nullptr) {
    if (tracer_ == nullptr) return;
    name_ = name;
    category_ = category;
    track_ = tracer_->thread_track();
    begin_ = tracer::clock::now();
  }
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;
  trace_span(trace_span&& o) noexcept
      : tracer_(std::exchange(o.tracer_, nullptr)),
        name_(std::move(o.name_)),
        category_(std::move(o.category_)),
        track_(o.track_),
        begin_(o.begin_),
        args_(std::move(o.args_)) {}
  trace_span& operator=(trace_span&&) = delete;
  ~trace_span() { end(); }

  /// Attaches a value shown with the span (bytes, subgroup, path).
  template <class V>
  trace_span& arg(std::string key, V&& value) {
    if (tracer_ == nullptr) return *this;
    if constexpr (std::is_integral_v<std::decay_t<V>>)
      args_.push_back({std::move(key), static_cast<std::int64_t>(value)});
    else if constexpr (std::is_floating_point_v<std::decay_t<V>>)
      args_.push_back({std::move(key), static_cast<double>(value)});
    else
      args_.push_back({std::move(key), std::string(std::forward<V>(value))});
    return *this;
  }

  /// Ends the span now; later calls do nothing. Never throws: a trace must not fail the work.
  void end() noexcept {
    if (tracer_ == nullptr) return;
    auto* t = std::exchange(tracer_, nullptr);
    try {
      t->complete(track_, name_, begin_, tracer::clock::now(), std::move(args_), category_);
    } catch (...) {  // out of memory while tracing: drop the event, keep the work going
    }
  }

 private:
  tracer* tracer_;
  std::string name_;
  std::string category_;
  track_id track_ = 0;
  tracer::clock::time_point begin_{};
  std::vector<trace_arg> args_;
};

}  // namespace strata
