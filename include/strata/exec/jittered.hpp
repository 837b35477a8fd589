#pragma once
/// jittered<S>: delays a stream's work by seeded random amounts, so that work on different
/// streams interleaves differently from run to run. A pipeline that forgot a wait (reads a
/// buffer before the copy into it ran, reuses one while a copy still reads it) then fails a
/// bit-identity test for some seed instead of passing by luck. The delays come from a seeded
/// generator, so a seed reproduces the same delays (the interleaving still depends on the OS).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <random>
#include <span>
#include <thread>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/exec/detail/stream_adaptor_base.hpp"
#include "strata/exec/stream.hpp"

namespace strata {

/// How much jitter: before each piece of work, with `probability`, a pause of up to `max_delay`.
struct jitter_options {
  std::uint64_t seed = 1;
  std::chrono::microseconds max_delay{500};
  double probability = 0.5;
};

template <class Inner>
class jittered : public detail::stream_adaptor_base<Inner> {
  using base = detail::stream_adaptor_base<Inner>;

 public:
  template <class... Args>
  explicit jittered(jitter_options o, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...), opts_(o), rng_(o.seed) {
    STRATA_EXPECTS(o.max_delay.count() >= 0 && o.probability >= 0 && o.probability <= 1, config_error,
                   "jitter_options: max_delay {} us must not be negative and probability {} must be in [0, 1]",
                   o.max_delay.count(), o.probability);
  }
  jittered(const jittered&) = delete;
  jittered& operator=(const jittered&) = delete;

  void copy_to_device(std::span<std::byte> dst, std::span<const std::byte> src) {
    pause();
    this->inner_.copy_to_device(dst, src);
  }
  void copy_to_host(std::span<std::byte> dst, std::span<const std::byte> src) {
    pause();
    this->inner_.copy_to_host(dst, src);
  }
  void enqueue_host(host_task task) {
    pause();
    this->inner_.enqueue_host(std::move(task));
  }
  [[nodiscard]] typename base::event_type record() {
    pause();
    return this->inner_.record();
  }
  void wait(const typename base::event_type& e) {
    pause();
    this->inner_.wait(e);
  }

 private:
  void pause() {
    std::chrono::microseconds d{0};
    {
      std::lock_guard lock(mutex_);
      if (opts_.max_delay.count() == 0 || std::uniform_real_distribution<double>(0, 1)(rng_) >= opts_.probability)
        return;
      d = std::chrono::microseconds(std::uniform_int_distribution<std::int64_t>(0, opts_.max_delay.count())(rng_));
    }
    this->inner_.enqueue_host([d] { std::this_thread::sleep_for(d); });
  }

  jitter_options opts_;
  std::mutex mutex_;
  std::mt19937_64 rng_;
};

}  // namespace strata
