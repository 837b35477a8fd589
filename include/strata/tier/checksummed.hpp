#pragma once
/// checksummed<Tier>: every object's bytes carry checksums (XXH3-64 from libxxhash, one per
/// `block_bytes` block); a read whose bytes do not match raises integrity_error naming the tier,
/// the object and the offset of the first bad block. Verification runs as each request
/// completes, on the inner tier's completion thread.
///
/// Writes of whole blocks (the last block of the object may be short: that is how objects, a
/// subgroup's state, are written) are checksummed from the caller's bytes alone, on the adaptor's
/// own thread while the inner write runs, so issuing a write costs the caller no hashing. A write that
/// cuts blocks (gradients handed over in pieces) reads the rest of the cut blocks back first,
/// verified, and writes the completed blocks: it waits for those reads in the calling thread, so
/// do not issue one from a completion of the inner tier. Reads may be any range; an unaligned one
/// reads the covering blocks into a scratch buffer to verify them.
///
/// Checksums live in memory. `checksums(object)` exports them (for a checkpoint manifest) and
/// `set_checksums` restores them after a restart; an object without checksums fails to read
/// with integrity_error, unless `require_checksums` is false.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/checksum.hpp"
#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/thread_pool.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/detail/adaptor_base.hpp"
#include "strata/tier/detail/inflight_counter.hpp"

namespace strata {

/// Options of a checksummed tier.
struct checksum_options {
  std::uint64_t block_bytes = 1ULL << 20;  ///< checksum granularity
  bool require_checksums = true;           ///< reading an object with no checksums is an error
};

/// The checksums of one object, as exported for a manifest.
struct object_checksums {
  std::uint64_t size = 0;
  std::uint64_t block_bytes = 0;
  std::vector<std::uint64_t> blocks;  ///< XXH3-64 of each block; the last may cover fewer bytes
  friend bool operator==(const object_checksums&, const object_checksums&) = default;
};

template <class Inner>
class checksummed : public detail::adaptor_base<Inner> {
  using base = detail::adaptor_base<Inner>;

 public:
  template <class... Args>
  explicit checksummed(checksum_options o, Args&&... inner_args)
      : base(std::in_place, std::forward<Args>(inner_args)...), opts_(o) {
    STRATA_EXPECTS(o.block_bytes > 0, config_error, "checksummed: block_bytes must be positive");
  }
  /// With the default checksum_options, the inner tier constructed from one argument (its
  /// options, or the tier itself for a reference type): what a multipath path is built from.
  template <class A>
    requires(!std::same_as<std::remove_cvref_t<A>, checksum_options> && std::constructible_from<Inner, A &&>)
  explicit checksummed(A&& inner_arg) : checksummed(checksum_options{}, std::forward<A>(inner_arg)) {}
  checksummed(const checksummed&) = delete;
  checksummed& operator=(const checksummed&) = delete;
  ~checksummed() { inflight_.wait_zero(); }

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    try {
      const std::uint64_t B = opts_.block_bytes;
      const std::uint64_t end = offset + bytes.size();
      const std::uint64_t old_size = this->inner_.size(object).value_or(0);
      if (offset % B != 0 || (bytes.size() % B != 0 && end < old_size))
        return write_merged(object, offset, bytes, old_size);
      // The caller keeps the bytes as they are until the write completes (the tier contract), so
      // they are hashed while they travel, on this adaptor's thread: a caller that issues writes
      // (a pipeline's driver) is never held for ~10 ms per 100 MB of XXH3.
      auto job = std::make_shared<hashed_write>(std::string(object), offset, end);
      auto out = job->promise.get_future();
      completion written = this->inner_.write(object, offset, bytes);
      inflight_.add();
      try {
        (void)hasher_.submit([this, job, bytes] { hash_into(*job, bytes); });
      } catch (...) {  // no task could be queued: hash here
        hash_into(*job, bytes);
      }
      try {
        written.on_complete([this, job](std::exception_ptr e) { arrive(*job, std::move(e)); });
      } catch (...) {  // no room for the continuation: never complete while the write still reads the bytes
        written.wait();
        auto e = written.exception();
        arrive(*job, e ? e : std::current_exception());
      }
      return out;
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    try {
      const std::uint64_t B = opts_.block_bytes;
      auto sums = lookup(object);
      if (!sums) {
        if (!opts_.require_checksums) return this->inner_.read(object, offset, dst);
        if (!this->inner_.size(object)) return this->inner_.read(object, offset, dst);  // the inner tier reports it
        throw integrity_error(this->inner_.name(), object, offset, "no checksums are recorded for it");
      }
      const std::uint64_t size = sums->size;
      if (offset > size || dst.size() > size - offset)
        throw out_of_range_error(this->inner_.name(), object, offset, dst.size(), size);
      const std::uint64_t end = offset + dst.size();
      const std::uint64_t w0 = offset / B * B;
      const std::uint64_t w1 = std::min(size, (end + B - 1) / B * B);
      completion_promise p;
      auto out = p.get_future();
      inflight_.add();
      auto sp = std::make_shared<completion_promise>(std::move(p));
      if (w0 == offset && w1 == end) {  // whole blocks: verify in place
        this->inner_.read(object, offset, dst)
            .on_complete([this, sp, obj = std::string(object), sums, dst, offset](std::exception_ptr e) {
              sp->complete(e ? e : verify(obj, *sums, offset, dst));
              inflight_.done();
            });
        return out;
      }
      auto scratch = std::make_shared<std::vector<std::byte>>(w1 - w0);
      this->inner_.read(object, w0, *scratch)
          .on_complete([this, sp, obj = std::string(object), sums, scratch, dst, offset, w0](std::exception_ptr e) {
            if (!e) e = verify(obj, *sums, w0, *scratch);
            if (!e) std::memcpy(dst.data(), scratch->data() + (offset - w0), dst.size());
            sp->complete(e);
            inflight_.done();
          });
      return out;
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  bool remove(std::string_view object) {
    const bool removed = this->inner_.remove(object);
    std::lock_guard lock(mutex_);
    if (const auto it = table_.find(object); it != table_.end()) table_.erase(it);
    return removed;
  }

  /// The checksums of `object`, if any were recorded or restored.
  [[nodiscard]] std::optional<object_checksums> checksums(std::string_view object) const {
    auto s = lookup(object);
    if (!s) return std::nullopt;
    return *s;
  }
  /// Restores checksums exported earlier (e.g. from a checkpoint manifest).
  void set_checksums(std::string_view object, object_checksums sums) {
    STRATA_EXPECTS(sums.block_bytes == opts_.block_bytes, config_error,
                   "tier '{}': checksums of object '{}' use {}-byte blocks, this tier uses {}", this->inner_.name(),
                   object, sums.block_bytes, opts_.block_bytes);
    STRATA_EXPECTS(sums.blocks.size() == (sums.size + sums.block_bytes - 1) / sums.block_bytes, config_error,
                   "tier '{}': {} checksums cannot describe {} bytes of object '{}'", this->inner_.name(),
                   sums.blocks.size(), sums.size, object);
    std::lock_guard lock(mutex_);
    table_[std::string(object)] = std::make_shared<const object_checksums>(std::move(sums));
  }

  [[nodiscard]] const checksum_options& options() const noexcept { return opts_; }

 private:
  /// A write that cuts checksum blocks: the cut blocks are completed with the object's bytes
  /// around it (read back and verified first; zeros past its end) and written whole, so every
  /// block's checksum covers exactly what is stored. The edge reads are waited for here.
  completion write_merged(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes,
                         std::uint64_t old_size) {
    const std::uint64_t B = opts_.block_bytes;
    const std::uint64_t end = offset + bytes.size();
    const std::uint64_t w0 = offset / B * B;
    const std::uint64_t w1 = std::min((end + B - 1) / B * B, std::max(end, old_size));
    auto merged = std::make_shared<std::vector<std::byte>>(w1 - w0, std::byte{0});
    const auto fill = [&](std::uint64_t from, std::uint64_t to) {  // existing bytes [from, to), verified
      to = std::min(to, old_size);
      if (from < to) read(object, from, std::span(*merged).subspan(from - w0, to - from)).get();
    };
    fill(w0, offset);
    fill(end, w1);
    std::memcpy(merged->data() + (offset - w0), bytes.data(), bytes.size());
    std::vector<std::uint64_t> sums;
    for (std::uint64_t pos = 0; pos < merged->size(); pos += B)
      sums.push_back(checksum64(std::span<const std::byte>(*merged).subspan(pos, std::min<std::uint64_t>(B, merged->size() - pos))));
    completion_promise p;
    auto out = p.get_future();
    inflight_.add();
    auto sp = std::make_shared<completion_promise>(std::move(p));
    this->inner_.write(object, w0, *merged)
        .on_complete([this, sp, merged, obj = std::string(object), w0, w1, sums = std::move(sums)](std::exception_ptr e) {
          if (!e) record(obj, w0, w1, sums);
          sp->complete(e);
          inflight_.done();
        });
    return out;
  }

  // A whole-block write: done when the inner write has completed and its bytes are hashed.
  struct hashed_write {
    hashed_write(std::string o, std::uint64_t off, std::uint64_t e) : object(std::move(o)), offset(off), end(e) {}
    std::string object;
    std::uint64_t offset;
    std::uint64_t end;
    completion_promise promise;
    std::mutex mutex;
    int arrived = 0;
    std::exception_ptr error;  // the write's, else the hashing's
    std::vector<std::uint64_t> sums;
  };

  void hash_into(hashed_write& job, std::span<const std::byte> bytes) noexcept {
    std::exception_ptr e;
    try {
      const std::uint64_t B = opts_.block_bytes;
      std::vector<std::uint64_t> sums;
      sums.reserve((bytes.size() + B - 1) / B);
      for (std::uint64_t pos = 0; pos < bytes.size(); pos += B)
        sums.push_back(checksum64(bytes.subspan(pos, std::min<std::uint64_t>(B, bytes.size() - pos))));
      std::lock_guard lock(job.mutex);
      job.sums = std::move(sums);
    } catch (...) {
      e = std::current_exception();
    }
    arrive(job, std::move(e));
  }

  // The second of the two arrivals records the checksums (only for a write that succeeded) and
  // completes the request.
  void arrive(hashed_write& job, std::exception_ptr e) noexcept {
    {
      std::lock_guard lock(job.mutex);
      if (e && !job.error) job.error = std::move(e);
      if (++job.arrived < 2) return;
    }
    if (!job.error) {
      try {
        record(job.object, job.offset, job.end, job.sums);
      } catch (...) {
        job.error = std::current_exception();
      }
    }
    job.promise.complete(job.error);
    inflight_.done();
  }

  std::shared_ptr<const object_checksums> lookup(std::string_view object) const {
    std::lock_guard lock(mutex_);
    const auto it = table_.find(object);
    return it == table_.end() ? nullptr : it->second;
  }

  void record(const std::string& object, std::uint64_t offset, std::uint64_t end,
              const std::vector<std::uint64_t>& sums) {
    const std::uint64_t B = opts_.block_bytes;
    std::lock_guard lock(mutex_);
    auto& slot = table_[object];
    auto next = slot ? std::make_shared<object_checksums>(*slot)
                     : std::make_shared<object_checksums>(object_checksums{0, B, {}});
    next->size = std::max(next->size, end);
    next->blocks.resize((next->size + B - 1) / B, 0);
    std::copy(sums.begin(), sums.end(), next->blocks.begin() + static_cast<std::ptrdiff_t>(offset / B));
    slot = std::move(next);  // readers holding the old table keep a consistent copy
  }

  std::exception_ptr verify(const std::string& object, const object_checksums& sums, std::uint64_t offset,
                            std::span<const std::byte> bytes) const noexcept {
    const std::uint64_t B = opts_.block_bytes;
    for (std::uint64_t pos = 0; pos < bytes.size(); pos += B) {
      const auto n = std::min<std::uint64_t>(B, bytes.size() - pos);
      const std::uint64_t block = (offset + pos) / B;
      const std::uint64_t actual = checksum64(bytes.subspan(pos, n));
      if (block >= sums.blocks.size() || actual != sums.blocks[block]) {
        try {
          return std::make_exception_ptr(integrity_error(this->inner_.name(), object, offset + pos,
                                                         block < sums.blocks.size() ? sums.blocks[block] : 0, actual));
        } catch (...) {
          return std::current_exception();
        }
      }
    }
    return nullptr;
  }

  checksum_options opts_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const object_checksums>, std::less<>> table_;
  thread_pool hasher_{1, "checksum"};
  detail::inflight_counter inflight_;  // destroyed first
};

static_assert(tier<checksummed<any_tier>>);
static_assert(tier<checksummed<any_tier&>>);

}  // namespace strata
