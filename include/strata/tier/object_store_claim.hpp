#pragma once
/// object_store_claim: one run's claim on one scope (object prefix, e.g. "strata") of an object
/// store's prefix, what directory_lock and the object journal are to a directory. An object store
/// has neither locks nor appends, so the claim is a small control object,
/// "<prefix>.strata-claim.<scope>", written before the first state object and naming its owner:
/// host name, boot id, pid and process start time, a random run id, when it was claimed and
/// renewed, and its lease.
///
/// - A contender finds the claim and judges its owner. Same host and boot: the owner is alive iff
///   a process with its pid and start time runs, neither a zombie nor exiting (its lease is not
///   needed). Another host: alive
///   while its lease runs; the age of the claim comes from the store (its Date minus the claim's
///   Last-Modified), so no clock of ours is compared with another host's. A live owner is refused
///   with a busy_error naming the prefix, the scope and the owner. A dead owner's claim is taken
///   over (a conditional replace: of two contenders one wins), and its objects named like
///   strata's of the scope ("<scope>.sg-<i>", "<scope>.gr-<i>") are removed: the new run writes
///   its own. A crashed owner's takeover is reported as a notice naming it.
/// - No claim: the prefix's objects that no claim covers are another job's (or a user's); they
///   are refused with a busy_error naming them, unless adopt_existing, which takes those of
///   strata's names of the scope as the run's own. Objects not named like strata's are never
///   touched. A claim that cannot be read (damaged, of another version) is refused, naming it:
///   it is never taken silently.
/// - Two runs starting at once: the claim is created with a conditional PUT (If-None-Match: *;
///   SeaweedFS and AWS S3 honour it) and taken over with If-Match on the ETag read: exactly one
///   wins, the other then finds a live owner. A store that ignored the conditions would let both
///   win; strata refuses nothing then, as before claims.
/// - The lease is renewed by a background thread every `renew_every` (a conditional replace, so
///   a claim taken over after this run stalled longer than its lease is noticed, reported, and
///   never written again), not on the run's own requests: an optimizer whose state sits in host
///   memory may make no request for longer than a lease.
/// - Release (the destructor): when no object of the scope is left (a clean end, remove_state, a
///   failed construction's unwinding) the claim is deleted (If-Match: only ours); otherwise (a run
///   kept with --keep, a failed removal) it stays, marked released, naming the objects as
///   strata's, so the next run takes them over at once. A killed run's claim stays as it was: the
///   next run on its host finds its pid gone; one on another host waits out the lease.
/// - Known limits: a same-host owner in another pid namespace with the same host name is judged
///   by a pid of ours; a run stopped (SIGSTOP, a hung host) longer than its lease loses its
///   claim to another host's run, and its own remove_state would then remove objects that are no
///   longer its (it is told so, on stderr).
#include "strata/core/config.hpp"

#if STRATA_HAS_S3

#include <unistd.h>

#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/directory_lock.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/node_dir.hpp"
#include "strata/core/notice.hpp"
#include "strata/tier/object_store_tier.hpp"

namespace strata {

/// A store of control objects beside its objects (object_store_tier's control object API).
template <class S>
concept claim_store = requires(S& s, const S& cs, std::string_view name, std::string_view text) {
  { s.read_control(name) } -> std::same_as<std::optional<control_object>>;
  { s.create_control(name, text) } -> std::same_as<std::optional<std::string>>;
  { s.replace_control(name, text, text) } -> std::same_as<std::optional<std::string>>;
  { s.remove_control(name, text) } -> std::same_as<bool>;
  { s.remove(name) } -> std::same_as<bool>;
  { cs.objects() } -> std::same_as<std::vector<std::string>>;
  { cs.name() } -> std::convertible_to<std::string_view>;
};
static_assert(claim_store<object_store_tier>);

namespace detail {

/// Whether process `pid`, started at `start` (clock ticks since boot), still runs: not when there
/// is none, when another took its pid, or when it is a zombie or exiting (a SIGKILLed owner
/// whose parent has not reaped it yet is gone for good).
[[nodiscard]] inline bool process_runs(long pid, std::uint64_t start) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(in, line)) return false;
  const auto close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  std::istringstream rest(line.substr(close + 2));
  std::string field, state;
  std::uint64_t flags = 0, started = 0;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3) state = field;
    if (i == 9) flags = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 22) started = std::strtoull(field.c_str(), nullptr, 10);
  }
  constexpr std::uint64_t pf_exiting = 0x4;
  return started == start && state != "Z" && state != "X" && state != "x" && (flags & pf_exiting) == 0;
}

}  // namespace detail

/// Who holds a claim: what tells a live owner from a dead one.
struct claim_identity {
  std::string host;
  std::string boot;        ///< /proc/sys/kernel/random/boot_id
  long pid = 0;
  std::uint64_t start = 0;  ///< the process's start time (clock ticks since boot)

  [[nodiscard]] static claim_identity of_this_process() {
    const long pid = static_cast<long>(::getpid());
    return {detail::host_name(), detail::boot_id(), pid, detail::process_start_ticks(pid).value_or(0)};
  }
};

struct object_store_claim_options {
  std::string scope = "strata";  ///< the object prefix claimed (offload_options::object_prefix)
  std::string owner{};           ///< shown to contenders ("offload_demo", a job name)
  /// Take the objects of the scope's strata names that no claim covers (another job's, or
  /// strata's from before claims) as this run's own; off: they are refused.
  bool adopt_existing = false;
  /// How long another host's contender waits after the last renewal before it judges the owner
  /// gone; must be well above renew_every and the store's 1 s date resolution.
  std::chrono::milliseconds lease{60'000};
  std::chrono::milliseconds renew_every{0};  ///< 0: lease / 4
  std::optional<claim_identity> identity{};  ///< the owner's (tests fake other hosts); none: this process
  /// After taking over a crashed owner's claim, wait this long before removing its objects: a
  /// PUT it sent whole just before it died may still be in the store's hands, and would land
  /// after the removal, over this run's object of that name. One that lands later still is a
  /// stale object under a name of this run's, which the checksummed stack refuses
  /// (integrity_error), never uses. 0: no wait.
  std::chrono::milliseconds settle{1'000};
};

/// Whether `name` is named like strata's objects ("<scope>.sg-<i>", "<scope>.gr-<i>"); its scope.
[[nodiscard]] inline std::optional<std::string_view> strata_object_scope(std::string_view name) noexcept {
  const auto dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  const auto tail = name.substr(dot + 1);
  if (!(tail.starts_with("sg-") || tail.starts_with("gr-")) || tail.size() < 4) return std::nullopt;
  for (char c : tail.substr(3))
    if (c < '0' || c > '9') return std::nullopt;
  return name.substr(0, dot);
}

/// See the file comment. Neither copyable nor movable (its renewal thread refers to it).
template <claim_store Store>
class object_store_claim {
 public:
  /// Name of the claim of `scope`: a control object, never one of the store's objects.
  [[nodiscard]] static std::string claim_name(std::string_view scope) { return fmt::format(".strata-claim.{}", scope); }

  /// Claims `o.scope` of `store` (which must outlive the claim), or throws busy_error (a live
  /// owner, objects of another job, a damaged claim) or the store's error.
  object_store_claim(Store& store, object_store_claim_options o)
      : store_(store), opts_(std::move(o)), name_(claim_name(opts_.scope)) {
    STRATA_EXPECTS(directory_lock::valid_scope(opts_.scope), config_error,
                   "claim on '{}': scope '{}' (use 1-100 of [A-Za-z0-9._-])", store_.name(), opts_.scope);
    STRATA_EXPECTS(opts_.lease >= std::chrono::seconds(3), config_error,
                   "claim on '{}': a lease of {} ms is below 3 s (the store dates objects to the second)",
                   store_.name(), opts_.lease.count());
    if (opts_.renew_every.count() <= 0) opts_.renew_every = opts_.lease / 4;
    me_ = opts_.identity.value_or(claim_identity::of_this_process());
    STRATA_EXPECTS(opts_.renew_every < opts_.lease, config_error,
                   "claim on '{}': renewing every {} ms keeps no lease of {} ms", store_.name(),
                   opts_.renew_every.count(), opts_.lease.count());
    if (opts_.owner.empty()) {  // the program's name, for a contender's message
      std::ifstream comm("/proc/self/comm");
      std::getline(comm, opts_.owner);
    }
    for (char& ch : opts_.owner)  // one line of the claim
      if (ch == '\n' || ch == '\r') ch = ' ';
    std::random_device rd;
    run_ = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
    claimed_ms_ = now_ms();
    acquire();
    try {
      if (taken_over_ && !last_owner_.empty() && opts_.settle.count() > 0) std::this_thread::sleep_for(opts_.settle);
      if (taken_over_ || opts_.adopt_existing) reclaim();
      if (taken_over_ && !last_owner_.empty())  // (a released claim is taken without a word)
        notice(fmt::format("{}: took over the claim of {}; its {} object{} removed", where(), last_owner_,
                           reclaimed_, reclaimed_ == 1 ? "" : "s"));
      renewer_ = std::thread([this] { renew_loop(); });
    } catch (...) {
      release();
      throw;
    }
  }
  object_store_claim(const object_store_claim&) = delete;
  object_store_claim& operator=(const object_store_claim&) = delete;
  ~object_store_claim() { release(); }

  /// Whether this run took over a dead (or released) owner's claim.
  [[nodiscard]] bool taken_over() const noexcept { return taken_over_; }
  /// Objects of the scope removed when the claim was taken (the last owner's, or adopted ones).
  [[nodiscard]] std::size_t reclaimed() const noexcept { return reclaimed_; }
  /// This run's random id, as the claim names it.
  [[nodiscard]] const std::string& run_id() const noexcept { return run_; }
  /// Whether another run took the claim over while this one held it (its lease ran out).
  [[nodiscard]] bool lost() const {
    std::lock_guard lock(mutex_);
    return lost_;
  }

  /// Ends the claim now (see the file comment); the destructor does nothing more. Never throws:
  /// what fails is reported as a notice, and the claim then stays for the next run to judge.
  void release() noexcept {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    wake_.notify_all();
    if (renewer_.joinable()) renewer_.join();
    std::lock_guard lock(mutex_);
    if (lost_ || etag_.empty()) return;
    try {
      bool left = false;
      for (const auto& n : store_.objects()) left = left || strata_object_scope(n) == std::string_view(opts_.scope);
      if (!left) {
        if (!store_.remove_control(name_, etag_))
          notice(fmt::format("tier '{}': the claim {} changed under this run; left as it is", store_.name(), name_));
      } else if (!store_.replace_control(name_, body("released"), etag_)) {
        notice(fmt::format("tier '{}': the claim {} changed under this run; left as it is", store_.name(), name_));
      }
    } catch (const std::exception& e) {
      notice(fmt::format("tier '{}': could not end the claim {} (the next run judges it by its owner): {}",
                         store_.name(), name_, e.what()));
    }
    etag_.clear();
  }

 private:
  struct parsed_claim {
    std::string state, owner, host, boot, run;
    long pid = 0;
    std::uint64_t start = 0;
    std::int64_t lease_ms = 0;
  };

  static std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  [[nodiscard]] std::string body(std::string_view state) const {
    return fmt::format(
        "strata-claim 1\nstate {}\nowner {}\nhost {}\nboot {}\npid {}\nstart {}\nrun {}\nlease_ms {}\nclaimed_ms {}\n"
        "renewed_ms {}\n",
        state, opts_.owner.empty() ? std::string("strata") : opts_.owner, me_.host, me_.boot, me_.pid, me_.start, run_,
        opts_.lease.count(), claimed_ms_, now_ms());
  }

  // The claim's fields, or nullopt when it is not a claim this version writes.
  static std::optional<parsed_claim> parse(std::string_view text) {
    constexpr std::string_view header = "strata-claim 1\n";
    if (!text.starts_with(header)) return std::nullopt;
    text.remove_prefix(header.size());
    std::map<std::string, std::string, std::less<>> f;
    while (!text.empty()) {
      const auto nl = text.find('\n');
      if (nl == std::string_view::npos) return std::nullopt;  // S3 writes whole objects: a cut one is not ours
      const auto line = text.substr(0, nl);
      text.remove_prefix(nl + 1);
      const auto sp = line.find(' ');
      if (sp == std::string_view::npos) return std::nullopt;
      f.emplace(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
    }
    parsed_claim c;
    for (const char* k : {"state", "host", "boot", "pid", "start", "run", "lease_ms"})
      if (!f.contains(k)) return std::nullopt;
    c.state = f["state"];
    c.owner = f.contains("owner") ? f["owner"] : "";
    c.host = f["host"];
    c.boot = f["boot"];
    c.run = f["run"];
    char* end = nullptr;
    c.pid = std::strtol(f["pid"].c_str(), &end, 10);
    if (*end != '\0' || c.pid <= 0) return std::nullopt;
    c.start = std::strtoull(f["start"].c_str(), &end, 10);
    if (*end != '\0') return std::nullopt;
    c.lease_ms = std::strtoll(f["lease_ms"].c_str(), &end, 10);
    if (*end != '\0' || c.lease_ms <= 0) return std::nullopt;
    if (c.state != "held" && c.state != "released") return std::nullopt;
    if (c.run.empty()) return std::nullopt;
    return c;
  }

  [[nodiscard]] std::string where() const { return fmt::format("scope '{}' of {}", opts_.scope, store_.name()); }

  // Whether the claim's owner may still be running; fills `why` with what was found.
  [[nodiscard]] bool alive(const parsed_claim& c, const control_object& o, std::string& why) const {
    if (c.state == "released") {
      why = "released";
      return false;
    }
    if (c.host == me_.host && c.boot == me_.boot) {
      const bool up = detail::process_runs(c.pid, c.start);
      why = up ? fmt::format("pid {} on this host{}", c.pid, c.pid == me_.pid ? ", this process" : "")
               : fmt::format("pid {} on this host, which has exited", c.pid);
      return up;
    }
    const bool known = o.age.count() > 0;
    const bool expired = known && o.age.count() > c.lease_ms;
    why = fmt::format("host {}, pid {}, renewed {} ago, lease {} s", c.host, c.pid,
                      known ? fmt::format("{} s", o.age.count() / 1000) : std::string("an unknown time"),
                      c.lease_ms / 1000);
    return !expired;
  }

  void acquire() {
    for (int attempt = 0; attempt < 8; ++attempt) {
      const auto found = store_.read_control(name_);
      if (!found) {
        refuse_unclaimed(false);
        if (auto tag = store_.create_control(name_, body("held"))) {
          etag_ = std::move(*tag);
          return;
        }
        if (won_anyway()) return;
        continue;  // another run created it first: judge that one
      }
      const auto c = parse(found->body);
      if (!c)
        throw busy_error(fmt::format("{}: its claim {} is not one strata can read (damaged, or of another version): "
                                     "not using the prefix; remove that object if no run uses it",
                                     where(), name_));
      if (c->run == run_) {  // a retried create that had succeeded
        etag_ = found->etag;
        return;
      }
      std::string why;
      if (alive(*c, *found, why))
        throw busy_error(fmt::format("{} is in use by {} ({}, run {}): each scope (object prefix) of an object store "
                                     "prefix belongs to one run at a time",
                                     where(), c->owner.empty() ? std::string("another run") : c->owner, why, c->run),
                         c->host == me_.host && c->boot == me_.boot ? c->pid : 0);
      refuse_unclaimed(true);
      if (c->state != "released")
        last_owner_ = fmt::format("{} ({}, run {})", c->owner.empty() ? std::string("another run") : c->owner, why, c->run);
      if (auto tag = store_.replace_control(name_, body("held"), found->etag)) {
        etag_ = std::move(*tag);
        taken_over_ = true;
        return;
      }
      if (won_anyway()) {
        taken_over_ = true;
        return;
      }
    }
    throw busy_error(fmt::format("{}: its claim {} keeps changing; another run is starting there", where(), name_));
  }

  // A conditional write that was answered 412 may be a retry of one that succeeded: read back.
  bool won_anyway() {
    const auto again = store_.read_control(name_);
    if (!again) return false;
    const auto c = parse(again->body);
    if (!c || c->run != run_) return false;
    etag_ = again->etag;
    return true;
  }

  // Objects that no claim covers (of another scope without a claim, or not named like strata's)
  // are another job's: refused unless adopting. Those of our scope are ours when we hold its
  // claim (`ours`), and without it only when adopting.
  void refuse_unclaimed(bool ours) {
    std::vector<std::string> foreign;
    std::map<std::string, bool, std::less<>> claimed;  // other scopes: whether a claim covers them
    for (const auto& n : store_.objects()) {
      const auto sc = strata_object_scope(n);
      if (sc && *sc == opts_.scope) {
        if (!ours) foreign.push_back(n);
        continue;
      }
      if (sc) {
        auto it = claimed.find(*sc);
        if (it == claimed.end())
          it = claimed.emplace(std::string(*sc), store_.read_control(claim_name(*sc)).has_value()).first;
        if (it->second) continue;
      }
      foreign.push_back(n);
    }
    if (foreign.empty() || opts_.adopt_existing) return;
    throw busy_error(fmt::format("{} already holds {} object{} that no strata claim covers ({}{}), another job's? Not "
                                 "using it: give a prefix of its own, or adopt them (--adopt-existing, "
                                 "offload_path_config::adopt_existing)",
                                 store_.name(), foreign.size(), foreign.size() == 1 ? "" : "s", foreign.front(),
                                 foreign.size() > 1 ? ", ..." : ""));
  }

  // The last owner's (or adopted) objects of our scope: the new run writes its own.
  void reclaim() {
    for (const auto& n : store_.objects())
      if (strata_object_scope(n) == std::string_view(opts_.scope)) reclaimed_ += store_.remove(n) ? 1 : 0;
  }

  void renew_loop() noexcept {
    std::unique_lock lock(mutex_);
    bool reported = false;
    while (!stopping_) {
      wake_.wait_for(lock, opts_.renew_every, [this] { return stopping_; });
      if (stopping_) return;
      try {
        if (auto tag = store_.replace_control(name_, body("held"), etag_)) {
          etag_ = std::move(*tag);
          reported = false;
          continue;
        }
        if (won_anyway()) continue;
        lost_ = true;
        notice(fmt::format("{}: this run's claim {} was taken over by another run (this one made no renewal for "
                           "longer than its lease of {} s?): its objects there are no longer this run's",
                           where(), name_, opts_.lease.count() / 1000));
        return;
      } catch (const std::exception& e) {
        if (!reported)
          notice(fmt::format("{}: could not renew this run's claim {} (trying again in {} s): {}", where(), name_,
                             opts_.renew_every.count() / 1000, e.what()));
        reported = true;
      }
    }
  }

  Store& store_;
  object_store_claim_options opts_;
  std::string name_;
  claim_identity me_;
  std::string run_;
  std::int64_t claimed_ms_ = 0;
  std::string last_owner_;  // whose claim was taken over
  bool taken_over_ = false;
  std::size_t reclaimed_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::string etag_;  // of the claim as this run last wrote it; empty: not held
  bool lost_ = false;
  bool stopping_ = false;
  std::thread renewer_;
};

}  // namespace strata

#endif  // STRATA_HAS_S3
