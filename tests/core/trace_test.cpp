#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <future>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/core/metrics.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/core/trace.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace trace_test {

using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {
json parse(const strata::tracer& t) { return json::parse(t.chrome_trace_json()); }  // throws if invalid

std::vector<json> spans(const json& trace, const std::string& name = {}) {
  std::vector<json> out;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X" && (name.empty() || e.at("name") == name)) out.push_back(e);
  return out;
}

// Timestamps are exact decimal microseconds: compare them in integer nanoseconds.
long long ns(const json& v) { return std::llround(v.get<double>() * 1000.0); }

bool contains(const json& outer, const json& inner) {
  return outer.at("tid") == inner.at("tid") && ns(outer.at("ts")) <= ns(inner.at("ts")) &&
         ns(inner.at("ts")) + ns(inner.at("dur")) <= ns(outer.at("ts")) + ns(outer.at("dur"));
}

std::map<int, std::string> track_names(const json& trace) {
  std::map<int, std::string> names;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names[e.at("tid")] = e.at("args").at("name");
  return names;
}
}  // namespace

TEST_CASE("nested spans on one thread produce valid JSON and nest by time on one track") {
  strata::tracer t;
  {
    strata::trace_span step(&t, "step");
    {
      strata::trace_span read(&t, "read", "io");
      read.arg("bytes", 8388608).arg("object", "sg-17.m").arg("gbps", 3.5);
      std::this_thread::sleep_for(1ms);
    }
    strata::trace_span update(&t, "update");
    std::this_thread::sleep_for(1ms);
  }
  const json trace = parse(t);
  REQUIRE(spans(trace).size() == 3);
  const auto step = spans(trace, "step").at(0);
  const auto read = spans(trace, "read").at(0);
  const auto update = spans(trace, "update").at(0);
  CHECK(contains(step, read));
  CHECK(contains(step, update));
  CHECK(ns(read.at("ts")) + ns(read.at("dur")) <= ns(update.at("ts")));  // siblings do not overlap
  CHECK(read.at("cat") == "io");
  CHECK(read.at("args").at("bytes") == 8388608);
  CHECK(read.at("args").at("object") == "sg-17.m");
  CHECK(read.at("args").at("gbps") == 3.5);
  CHECK(read.at("pid") == static_cast<int>(::getpid()));
  CHECK(ns(read.at("dur")) >= 1'000'000);
  // Parents come before their children in the file.
  std::vector<std::string> order;
  for (const auto& e : spans(trace)) order.push_back(e.at("name"));
  CHECK(order == std::vector<std::string>{"step", "read", "update"});
}

TEST_CASE("each thread gets its own named track and its spans nest on it") {
  strata::tracer t;
  {
    strata::thread_pool pool(4, "tracepool");
    std::vector<std::future<void>> fs;
    for (int i = 0; i < 16; ++i)
      fs.push_back(pool.submit([&t, i] {
        strata::trace_span outer(&t, "task");
        outer.arg("i", i);
        for (int k = 0; k < 3; ++k) strata::trace_span inner(&t, "chunk");
      }));
    for (auto& f : fs) f.get();
  }
  const json trace = parse(t);
  const auto tasks = spans(trace, "task");
  const auto chunks = spans(trace, "chunk");
  REQUIRE(tasks.size() == 16);
  REQUIRE(chunks.size() == 48);
  for (const auto& c : chunks) {  // every chunk lies inside exactly one task of its own thread
    int parents = 0;
    for (const auto& p : tasks) parents += contains(p, c) ? 1 : 0;
    CHECK(parents == 1);
  }
  const auto names = track_names(trace);
  for (const auto& task : tasks) {
    const int tid = task.at("tid");
    REQUIRE(names.count(tid) == 1);
    CHECK(names.at(tid).find("tracepool-") == 0);  // named after the pool's worker thread
  }
}

TEST_CASE("named tracks record explicit intervals, for streams that are not threads") {
  strata::tracer t;
  const auto stream = t.make_track("cuda stream 1");
  const auto t0 = strata::tracer::clock::now();
  t.complete(stream, "h2d", t0, t0 + 2ms, {{"bytes", std::int64_t{1} << 20}});
  t.complete(stream, "kernel", t0 + 2ms, t0 + 3ms);
  t.instant(stream, "event recorded");
  t.counter("bytes in flight", 4096);
  const json trace = parse(t);
  CHECK(track_names(trace).at(static_cast<int>(stream)) == "cuda stream 1");
  const auto h2d = spans(trace, "h2d").at(0);
  CHECK(h2d.at("tid") == stream);
  CHECK(ns(h2d.at("dur")) == 2'000'000);
  bool instant = false, counter = false;
  for (const auto& e : trace.at("traceEvents")) {
    instant = instant || (e.at("ph") == "i" && e.at("name") == "event recorded");
    counter = counter || (e.at("ph") == "C" && e.at("args").at("value") == 4096);
  }
  CHECK(instant);
  CHECK(counter);
}

TEST_CASE("names with quotes, backslashes and control characters stay valid JSON") {
  strata::tracer t;
  { strata::trace_span s(&t, "path \"C:\\x\"\n\t\x01 end"); }
  const json trace = parse(t);
  CHECK(spans(trace).at(0).at("name") == "path \"C:\\x\"\n\t\x01 end");
}

TEST_CASE("summary mode aggregates spans without storing events; off records nothing") {
  strata::tracer t(strata::trace_mode::summary);
  for (int i = 0; i < 5; ++i) strata::trace_span s(&t, "read");
  CHECK(t.event_count() == 0);
  const auto snap = t.summary().snapshot();
  REQUIRE(snap.duration("read") != nullptr);
  CHECK(snap.duration("read")->count == 5);
  CHECK(snap.duration("read")->min <= snap.duration("read")->max);

  t.set_mode(strata::trace_mode::off);
  { strata::trace_span s(&t, "read"); }
  CHECK(t.summary().snapshot().duration("read")->count == 5);
  { strata::trace_span s(nullptr, "no tracer"); }  // a null tracer is allowed and does nothing
}

TEST_CASE("events beyond max_events are dropped and counted, never unbounded") {
  strata::tracer t(strata::trace_mode::full, 10);
  for (int i = 0; i < 25; ++i) strata::trace_span s(&t, "s");
  CHECK(t.event_count() == 10);
  CHECK(t.dropped_events() == 15);
  const json trace = parse(t);
  CHECK(trace.at("otherData").at("dropped_events") == 15);
  CHECK(t.summary().snapshot().duration("s")->count == 25);  // aggregates still see every span
  t.clear();
  CHECK(t.event_count() == 0);
  CHECK(t.dropped_events() == 0);
}

TEST_CASE("write_chrome_trace writes a file that parses, and names the path when it cannot") {
  strata::tracer t;
  { strata::trace_span s(&t, "x"); }
  const auto path = std::filesystem::temp_directory_path() / ("strata-trace-" + std::to_string(::getpid()) + ".json");
  t.write_chrome_trace(path);
  std::ifstream in(path);
  const json trace = json::parse(in);
  CHECK(spans(trace, "x").size() == 1);
  std::filesystem::remove(path);
  CHECK_THROWS_WITH_AS(t.write_chrome_trace("/nonexistent-dir/trace.json"),
                       doctest::Contains("/nonexistent-dir/trace.json.tmp"), strata::io_error);
}

TEST_CASE("metrics aggregate durations and counters from many threads") {
  strata::metrics m;
  {
    strata::thread_pool pool(4);
    std::vector<std::future<void>> fs;
    for (int i = 1; i <= 100; ++i)
      fs.push_back(pool.submit([&m, i] {
        m.record("update", std::chrono::nanoseconds(i));
        m.add("bytes_read", 4096);
        m.add("ops");
      }));
    for (auto& f : fs) f.get();
  }
  const auto s = m.snapshot();
  const auto* u = s.duration("update");
  REQUIRE(u != nullptr);
  CHECK(u->count == 100);
  CHECK(u->total.count() == 5050);
  CHECK(u->min.count() == 1);
  CHECK(u->max.count() == 100);
  CHECK(u->mean().count() == 50);
  CHECK(s.counter("bytes_read") == 409600);
  CHECK(s.counter("ops") == 100);
  CHECK(s.counter("never") == 0);
  CHECK(s.duration("never") == nullptr);
  const auto table = s.to_string();
  CHECK(table.find("update") != std::string::npos);
  CHECK(table.find("409600") != std::string::npos);
  m.reset();
  CHECK(m.snapshot().durations.empty());
}

}  // namespace trace_test
