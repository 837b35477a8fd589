#pragma once
// The stream contract (exec/stream.hpp) as one typed doctest suite. A fixture provides:
//   using stream_type;  std::unique_ptr<stream_type> make(std::string name);
//   buffers: host(n) and device(n) returning objects with data() / size() / span().
// host_streams run it in stream_test.cpp (plain and under every adaptor); cuda_stream in
// tests/cuda/exec_cuda_test.cu on a GPU.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/exec/stream.hpp>

namespace strata_test {

/// A gate host tasks wait on, so a test controls when a stream gets past a point. Its wait has a
/// generous guard so that a broken stream fails the test instead of hanging it.
class gate {
 public:
  void open() {
    {
      std::lock_guard lock(m_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait() {
    std::unique_lock lock(m_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return open_; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
  return v;
}

}  // namespace strata_test

TEST_CASE_TEMPLATE_DEFINE("a stream copies to the device and back in order, byte for byte", F, stream_copies) {
  F fx;
  auto s = fx.make("copies");
  for (const std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{1} << 20}) {
    CAPTURE(n);
    const auto src = strata_test::pattern(n, static_cast<unsigned>(n));
    auto host_in = fx.host(n);
    auto dev = fx.device(n);
    auto host_out = fx.host(n);
    std::memcpy(host_in.data(), src.data(), n);
    s->copy_to_device(dev.span(), host_in.span());
    s->copy_to_host(host_out.span(), dev.span());
    s->sync();
    CHECK(std::memcmp(host_out.data(), src.data(), n) == 0);
  }
}

TEST_CASE_TEMPLATE_DEFINE("a stream runs its work in the order it was enqueued", F, stream_order) {
  F fx;
  auto s = fx.make("order");
  std::vector<int> seen;  // touched only by the stream's work, read after sync
  auto buf = fx.host(64);
  auto dev = fx.device(64);
  for (int i = 0; i < 200; ++i) {
    s->enqueue_host([&seen, i] { seen.push_back(i); });
    if (i % 17 == 0) s->copy_to_device(dev.span(), buf.span());
  }
  s->sync();
  REQUIRE(seen.size() == 200);
  for (int i = 0; i < 200; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
}

TEST_CASE_TEMPLATE_DEFINE("an event completes only once the work before it has run", F, stream_event_after_work) {
  F fx;
  auto s = fx.make("event");
  strata_test::gate g;
  std::atomic<bool> ran{false};
  s->enqueue_host([&] {
    g.wait();
    ran = true;
  });
  const auto e = s->record();
  CHECK_FALSE(e.ready());
  CHECK_FALSE(e.completion().wait_for(std::chrono::milliseconds(20)));
  g.open();
  e.completion().get();
  CHECK(e.ready());
  CHECK(ran.load());
  s->sync();
}

TEST_CASE_TEMPLATE_DEFINE("wait(e) holds a stream's later work until another stream reaches e", F, stream_cross_wait) {
  F fx;
  auto a = fx.make("a");
  auto b = fx.make("b");
  strata_test::gate g;
  std::atomic<int> step{0};
  a->enqueue_host([&] {
    g.wait();
    step = 1;
  });
  const auto e = a->record();
  b->wait(e);
  std::atomic<int> seen_by_b{-1};
  b->enqueue_host([&] { seen_by_b = step.load(); });
  const auto eb = b->record();
  CHECK_FALSE(eb.completion().wait_for(std::chrono::milliseconds(20)));  // b is held, the caller is not
  g.open();
  eb.completion().get();
  CHECK(seen_by_b.load() == 1);
  a->sync();
  b->sync();
}

TEST_CASE_TEMPLATE_DEFINE("a failed piece of work fails every later event with its typed error until sync clears it",
                          F, stream_failure) {
  F fx;
  auto s = fx.make("fails");
  const auto before = s->record();
  s->enqueue_host([] { throw strata::io_error("pread", "/x/sg-3", 4096, 5); });
  std::atomic<bool> later_ran{false};
  const auto e1 = s->record();
  const auto e2 = s->record();
  before.completion().get();  // work before the failure is fine
  CHECK_THROWS_AS(e1.completion().get(), strata::io_error);
  CHECK_THROWS_AS(e2.completion().get(), strata::io_error);
  CHECK_THROWS_WITH_AS(s->sync(), "pread /x/sg-3 at offset 4096: Input/output error", strata::io_error);
  s->sync();  // cleared: a second sync is clean
  s->enqueue_host([&] { later_ran = true; });
  const auto e3 = s->record();
  e3.completion().get();
  CHECK(later_ran.load());
}

TEST_CASE_TEMPLATE_DEFINE("waiting on a failed event passes its error to the waiting stream", F, stream_failure_spreads) {
  F fx;
  auto a = fx.make("a");
  auto b = fx.make("b");
  a->enqueue_host([] { throw strata::capacity_error("device full"); });
  const auto ea = a->record();
  b->wait(ea);
  const auto eb = b->record();
  CHECK_THROWS_AS(eb.completion().get(), strata::capacity_error);
  CHECK_THROWS_AS(b->sync(), strata::capacity_error);
  CHECK_THROWS_AS(a->sync(), strata::capacity_error);
}

TEST_CASE_TEMPLATE_DEFINE("copies of different sizes are refused at the call with a config_error", F, stream_sizes) {
  F fx;
  auto s = fx.make("sizes");
  auto h = fx.host(16);
  auto d = fx.device(8);
  CHECK_THROWS_AS(s->copy_to_device(d.span(), h.span()), strata::config_error);
  CHECK_THROWS_AS(s->copy_to_host(h.span(), d.span()), strata::config_error);
  s->sync();
}

// Runs every case of the suite over the fixtures given.
#define STRATA_STREAM_SUITE_INVOKE(...)                           \
  TEST_CASE_TEMPLATE_INVOKE(stream_copies, __VA_ARGS__);           \
  TEST_CASE_TEMPLATE_INVOKE(stream_order, __VA_ARGS__);            \
  TEST_CASE_TEMPLATE_INVOKE(stream_event_after_work, __VA_ARGS__); \
  TEST_CASE_TEMPLATE_INVOKE(stream_cross_wait, __VA_ARGS__);       \
  TEST_CASE_TEMPLATE_INVOKE(stream_failure, __VA_ARGS__);          \
  TEST_CASE_TEMPLATE_INVOKE(stream_failure_spreads, __VA_ARGS__);  \
  TEST_CASE_TEMPLATE_INVOKE(stream_sizes, __VA_ARGS__)
