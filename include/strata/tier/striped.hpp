#pragma once
/// striped: one tier made of several (its "members"), each object cut into fixed stripe units laid
/// round robin over the members, as RAID0 does: unit k of an object lives on member k mod n, at
/// offset (k / n) x unit of that member's object of the same name. Every request is cut into
/// stripe-unit pieces, without copying a byte: reads are issued all at once, writes one at a time
/// per member (a tier may not run two writes on one object at once) with the members in parallel,
/// so one large request moves at the members' summed bandwidth and, like RAID0, at n times the
/// slowest member's (each member gets
/// an equal share of every object).
///
/// It is the baseline for "the same paths, without strata's placement": ZeRO-Infinity given every
/// path a node has, striped the way an administrator would (`strata-bench step --compare-equal`).
/// A multipath places whole objects on one path each instead, by a policy.
///
/// Objects are written without holes: a write may start anywhere up to the object's current end
/// (overwrite or append), never past it, so every unit inside an object's size exists on its
/// member; a write past the end is a config_error. An object's size grows when a write completes;
/// sizes of objects left by an earlier run (or by a failed write) are found from their members'.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/completion.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/tier/any_tier.hpp"
#include "strata/tier/multipath.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// How striped cuts objects.
struct striped_options {
  std::string name = "striped";
  /// Bytes of one stripe unit (a multiple of 4096 keeps O_DIRECT members aligned).
  std::uint64_t stripe_bytes = std::uint64_t{1} << 20;
};

/// RAID0 over run-time members; see the file comment.
class striped {
 public:
  striped(std::vector<any_tier> members, striped_options o) : members_(std::move(members)), opts_(std::move(o)) {
    STRATA_EXPECTS(!members_.empty(), config_error, "striped '{}': needs at least one member", opts_.name);
    STRATA_EXPECTS(opts_.stripe_bytes > 0, config_error, "striped '{}': stripe_bytes must be positive", opts_.name);
    for (std::size_t i = 0; i < members_.size(); ++i) totals_.push_back(std::make_unique<member_totals>());
  }
  striped(const striped&) = delete;
  striped& operator=(const striped&) = delete;

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    try {
      const std::uint64_t end = validate_write(opts_.name, object, offset, bytes.size());
      {
        std::lock_guard lock(mutex_);
        const std::uint64_t size = known_size_locked(object).value_or(0);
        STRATA_EXPECTS(offset <= size, config_error,
                       "striped '{}': write at offset {} of object '{}' would leave a hole (its size is {}); striped "
                       "objects are written without holes",
                       opts_.name, offset, object, size);
      }
      // The chain outlives this call: it holds its own copy of the name.
      auto done = split(offset, bytes.size(), true, [name = std::string(object), bytes](any_tier& m, const piece& pc) {
        return m.write(name, pc.at, bytes.subspan(pc.from, pc.length));
      });
      // The size grows when the write lands; after a failed one it is found again from what the
      // members hold (as a failed pwrite may leave part of its bytes).
      done.on_complete([this, name = std::string(object), end](std::exception_ptr e) {
        std::lock_guard lock(mutex_);
        if (e) {
          sizes_.erase(name);
          return;
        }
        auto& size = sizes_[name];
        size = std::max(size, end);
      });
      return done;
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    try {
      std::optional<std::uint64_t> size;
      {
        std::lock_guard lock(mutex_);
        size = known_size_locked(object);
      }
      if (!size || offset > *size || dst.size() > *size - offset)
        throw out_of_range_error(opts_.name, object, offset, dst.size(), size);
      return split(offset, dst.size(), false, [object, dst](any_tier& m, const piece& pc) {
        return m.read(object, pc.at, dst.subspan(pc.from, pc.length));
      });
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  bool remove(std::string_view object) {
    bool any = false;
    for (auto& m : members_) any = m.remove(object) || any;
    std::lock_guard lock(mutex_);
    if (const auto it = sizes_.find(object); it != sizes_.end()) sizes_.erase(it);
    return any;
  }

  void flush() {
    for (auto& m : members_) m.flush();
  }

  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const {
    std::lock_guard lock(mutex_);
    return known_size_locked(object);
  }
  /// RAID0: n times the smallest member's capacity.
  [[nodiscard]] std::uint64_t capacity() const {
    std::uint64_t least = unlimited_capacity;
    for (const auto& m : members_) least = std::min(least, m.capacity());
    const auto n = static_cast<std::uint64_t>(members_.size());
    return least > unlimited_capacity / n ? unlimited_capacity : least * n;
  }
  [[nodiscard]] std::uint64_t used() const {
    std::uint64_t u = 0;
    for (const auto& m : members_) u += m.used();
    return u;
  }
  [[nodiscard]] std::string_view name() const { return opts_.name; }
  /// RAID0: n times the slowest member's bandwidth per direction (0 when one is unknown).
  [[nodiscard]] tier_descriptor descriptor() const {
    tier_descriptor d{opts_.name, tier_kind::composite, 0, 0, false};
    double r = 0, w = 0;
    bool first = true;
    for (const auto& m : members_) {
      const auto md = m.descriptor();
      r = first ? md.read_bandwidth : std::min(r, md.read_bandwidth);
      w = first ? md.write_bandwidth : std::min(w, md.write_bandwidth);
      d.measured = d.measured || md.measured;
      first = false;
    }
    d.read_bandwidth = r * static_cast<double>(members_.size());
    d.write_bandwidth = w * static_cast<double>(members_.size());
    return d;
  }

  [[nodiscard]] std::size_t member_count() const noexcept { return members_.size(); }
  [[nodiscard]] any_tier& member(std::size_t i) { return members_.at(i); }
  [[nodiscard]] const any_tier& member(std::size_t i) const { return members_.at(i); }
  [[nodiscard]] std::uint64_t stripe_bytes() const noexcept { return opts_.stripe_bytes; }

  /// Bytes each member has moved by completed requests, per direction. Safe to call while
  /// requests run.
  [[nodiscard]] std::vector<path_io_totals> completed_bytes() const {
    std::vector<path_io_totals> v;
    v.reserve(totals_.size());
    for (const auto& t : totals_)
      v.push_back({t->read.load(std::memory_order_relaxed), t->written.load(std::memory_order_relaxed)});
    return v;
  }

 private:
  struct member_totals {
    std::atomic<std::uint64_t> read{0};
    std::atomic<std::uint64_t> written{0};
  };

  /// One piece of a request: `length` bytes at `from` of the caller's buffer, at `at` of the
  /// member's object.
  struct piece {
    std::size_t from;
    std::size_t length;
    std::uint64_t at;
  };

  /// Cuts [offset, offset + length) into stripe-unit pieces, per member, and issues them with
  /// `issue(member, piece)`: reads all at once; writes one after another per member (members
  /// in parallel), since a member may not run two writes on one object at once (the tier
  /// contract). No byte is copied. Joins everything.
  template <class Issue>
  completion split(std::uint64_t offset, std::size_t length, bool write, Issue issue) {
    const std::uint64_t unit = opts_.stripe_bytes;
    const auto n = static_cast<std::uint64_t>(members_.size());
    std::vector<std::vector<piece>> pieces(members_.size());
    for (std::size_t done = 0; done < length;) {
      const std::uint64_t at = offset + done;
      const std::uint64_t k = at / unit;
      const std::uint64_t within = at % unit;
      const auto len = static_cast<std::size_t>(std::min<std::uint64_t>(unit - within, length - done));
      pieces[static_cast<std::size_t>(k % n)].push_back({done, len, (k / n) * unit + within});
      done += len;
    }
    std::vector<completion> parts;
    for (std::size_t m = 0; m < members_.size(); ++m) {
      if (pieces[m].empty()) continue;
      if (write) {
        parts.push_back(write_chain(m, std::move(pieces[m]), issue));
        continue;
      }
      for (const auto& pc : pieces[m]) parts.push_back(counted(m, pc.length, false, issue_one(m, pc, issue)));
    }
    return when_all(std::move(parts));
  }

  template <class Issue>
  completion issue_one(std::size_t m, const piece& pc, Issue& issue) {
    try {
      return issue(members_[m], pc);
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  completion counted(std::size_t m, std::size_t bytes, bool write, completion f) {
    auto& t = *totals_[m];
    f.on_complete([&t, bytes, write](std::exception_ptr e) {
      if (!e) (write ? t.written : t.read).fetch_add(bytes, std::memory_order_relaxed);
    });
    return f;
  }

  /// Writes member m's pieces in order, each issued when the previous one completed (from its
  /// completion); the first error ends the chain.
  template <class Issue>
  completion write_chain(std::size_t m, std::vector<piece> list, Issue issue) {
    struct chain {
      striped* self;
      std::size_t member;
      std::vector<piece> list;
      Issue issue;
      std::size_t next = 0;
      completion_promise done;
    };
    auto c = std::make_shared<chain>(chain{this, m, std::move(list), std::move(issue), 0, completion_promise{}});
    auto result = c->done.get_future();
    step_chain(c);
    return result;
  }

  template <class Chain>
  static void step_chain(const std::shared_ptr<Chain>& c) {
    const piece pc = c->list[c->next++];
    auto f = c->self->counted(c->member, pc.length, true, c->self->issue_one(c->member, pc, c->issue));
    f.on_complete([c](std::exception_ptr e) {
      if (e || c->next == c->list.size()) {
        c->done.complete(e);
        return;
      }
      step_chain(c);
    });
  }

  /// The object's size: as written through this object, or found from its members' sizes.
  [[nodiscard]] std::optional<std::uint64_t> known_size_locked(std::string_view object) const {
    if (const auto it = sizes_.find(object); it != sizes_.end()) return it->second;
    const std::uint64_t unit = opts_.stripe_bytes;
    const auto n = static_cast<std::uint64_t>(members_.size());
    std::optional<std::uint64_t> size;
    for (std::size_t m = 0; m < members_.size(); ++m) {
      const auto ms = members_[m].size(object);
      if (!ms || *ms == 0) {
        if (ms) size = size.value_or(0);
        continue;
      }
      // The member's last byte is in its local unit (ms - 1) / unit, which is global unit u*n + m.
      const std::uint64_t u = (*ms - 1) / unit;
      const std::uint64_t end = (u * n + m) * unit + (*ms - u * unit);
      size = std::max(size.value_or(0), end);
    }
    if (size) sizes_.emplace(std::string(object), *size);
    return size;
  }

  std::vector<any_tier> members_;
  striped_options opts_;
  std::vector<std::unique_ptr<member_totals>> totals_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::uint64_t, std::less<>> sizes_;
};

static_assert(tier<striped>);

}  // namespace strata
