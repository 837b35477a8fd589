#pragma once
/// `node_limiter`: a limiter shared by every process on a node that names it (for example all
/// ranks that do I/O over one PFS link), which survives the death of a holder.
///
/// How it works. The limiter named N lives in the directory <dir>/N (dir: the constructor's
/// argument, else default_node_limiter_dir()). Its file `queue.lock` holds the cap and a ticket
/// counter, read and written only under flock(queue.lock). Each acquire takes the next ticket T
/// and creates the file t-T, which it keeps flock()ed (exclusively) for as long as it waits or
/// holds. T holds a permit once fewer than `permits` live tickets older than T remain; waiters
/// re-check with a backoff of 50 us to 1 ms. A ticket is live while its file is locked: the kernel
/// drops the lock when the process dies, however it dies (SIGKILL included), and the next check
/// deletes the dead ticket, so a dead holder or waiter never blocks the others. Strict ticket
/// order makes it fair: a process that releases and asks again queues behind everyone waiting.
///
/// acquire_async() takes its ticket at once; while it waits, one thread of this object (started
/// on first need) re-checks every waiting ticket of the object with the same backoff and
/// completes its completion when it holds a permit, so no caller's thread waits.
///
/// Threads. flock() locks belong to open file descriptions, not to processes (fcntl locks would
/// be shared by all threads of a process and could not tell them apart), and every acquire opens
/// its own ticket file, so threads of one process queue and exclude each other exactly like
/// processes do, through one node_limiter object or several with the same name. One object may
/// be shared by threads. release() gives back the oldest permit this object holds.
///
/// Damage. queue.lock's header carries a magic number and a checksum, and is checked on every
/// use. A header that is missing, short, garbage or out of range (a ticket counter near 2^64, a
/// cap of 0) is rebuilt: the cap from this process, the counter past every ticket in the
/// directory, so no new ticket can jump the queue. Each ticket file records its process's cap,
/// so the rebuild also works while processes hold or wait, as long as they all record this
/// process's cap; otherwise it is a config_error naming the file until none does. Every rebuild
/// of a file that held something says so with a notice(). A queue.lock that is removed or
/// replaced meanwhile is opened again by its path. The directories and files are opened as
/// node_dir.hpp says (no symbolic links, no FIFOs, only this user's): anything else at our names
/// is a foreign_file_error naming it, and an entry named like a ticket that is not one is never
/// counted (nor removed). A process stopped while it holds queue.lock (a few microseconds of
/// bookkeeping) still stalls the others until it runs again: replacing the file under it could
/// let two tickets be granted one permit.
///
/// Limits. The directory must be on a node-local file system with flock (tmpfs, ext4, xfs; not
/// NFS, where flock becomes a per-process fcntl lock). Do not delete it while processes use it.
/// A child made by fork() without exec shares its parent's descriptors, and so its permits.
/// Every process of a node must run the same layout version of these files.

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <exception>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/checksum.hpp"
#include "strata/core/completion.hpp"
#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/node_dir.hpp"
#include "strata/core/notice.hpp"
#include "strata/sync/limiter.hpp"

namespace strata {

class node_limiter {
 public:
  /// Opens (creating when needed) the limiter `name` with `permits` holders at most, in
  /// `directory` (empty: default_node_limiter_dir()). `name` is a file name: letters, digits,
  /// '.', '_' and '-', not starting with '.'. Every process must give the same `permits`; a
  /// different value is a config_error while any process is queued or holding, and replaces the
  /// old one otherwise.
  node_limiter(std::string name, std::size_t permits, std::filesystem::path directory = {})
      : name_(std::move(name)), permits_(permits) {
    detail::check_node_name("node_limiter", name_);
    STRATA_EXPECTS(permits >= 1 && permits <= max_permits, config_error,
                   "node_limiter '{}': permits must be in [1, {}], got {}", name_, max_permits, permits);
    if (directory.empty()) directory = default_node_limiter_dir();
    dir_ = directory / name_;
    detail::make_node_directory(directory);
    detail::make_node_directory(dir_);
    lock_path_ = dir_ / "queue.lock";
    lock_file_ = detail::open_node_file(lock_path_);
    std::lock_guard self(mutex_);
    queue_lock q(*this);
    (void)read_header();  // checks the cap against the other processes'
  }

  node_limiter(const node_limiter&) = delete;
  node_limiter& operator=(const node_limiter&) = delete;

  /// Fails the acquire_async calls still waiting, then gives back every permit this object holds.
  ~node_limiter() {
    std::deque<pending> left;
    {
      std::lock_guard self(mutex_);
      stopping_ = true;
      left.swap(pending_);
    }
    poll_cv_.notify_all();
    if (poller_.joinable()) poller_.join();
    for (auto& p : left) {
      withdraw(p.t);
      p.promise.set_exception(std::make_exception_ptr(
          error(fmt::format("node_limiter '{}' destroyed while an acquire was waiting", name_))));
    }
    while (!held_.empty()) release();
  }

  void acquire() { (void)acquire_until(std::nullopt); }

  [[nodiscard]] bool try_acquire() {
    return acquire_until(std::chrono::steady_clock::now() - std::chrono::seconds(1));
  }

  template <class Rep, class Period>
  [[nodiscard]] bool try_acquire_for(std::chrono::duration<Rep, Period> timeout) {
    const auto now = std::chrono::steady_clock::now();
    const auto room = std::chrono::steady_clock::time_point::max() - now;
    if (std::chrono::duration<double>(timeout) >= std::chrono::duration<double>(room)) return acquire_until(std::nullopt);
    return acquire_until(now + std::chrono::ceil<std::chrono::steady_clock::duration>(timeout));
  }

  /// Takes a ticket now and completes once it holds a permit; an I/O error on the limiter's files
  /// fails the completion.
  [[nodiscard]] completion acquire_async() {
    try {
      std::lock_guard self(mutex_);
      ticket t;
      if (take_ticket_and_check(t)) return make_ready_completion();
      try {  // the poller first: a waiting ticket nobody polls would hold a permit forever once granted
        if (!poller_.joinable()) poller_ = std::thread([this] { poll(); });
        pending_.push_back(pending{std::move(t), completion_promise{}});
      } catch (...) {
        withdraw(t);
        throw;
      }
      auto f = pending_.back().promise.get_future();
      poll_cv_.notify_all();
      return f;
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  /// Gives back the oldest permit this object holds (unlinks its ticket, then closes it, which
  /// drops the lock). Releasing more than was acquired is a bug and aborts.
  void release() noexcept {
    ticket t;
    {
      std::lock_guard self(mutex_);
      STRATA_ASSERT(!held_.empty());
      t = std::move(held_.front());
      held_.pop_front();
    }
    withdraw(t);
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::size_t permits() const noexcept { return permits_; }
  /// The directory of this limiter's files (<dir>/<name>).
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }
  /// Permits this object holds now.
  [[nodiscard]] std::size_t held() const {
    std::lock_guard self(mutex_);
    return held_.size();
  }

 private:
  static constexpr std::size_t max_permits = 1U << 16;
  // Ticket numbers stay below this (2^63 tickets is centuries at any rate): a header or a file
  // name beyond it is garbage, and counting up can never wrap.
  static constexpr std::uint64_t ticket_limit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t header_magic = 0x5354524e4c510002ULL;  // "STRNLQ", layout version 2 (XXH3)
  static constexpr std::uint64_t ticket_magic = 0x5354524e4c540001ULL;  // "STRNLT", layout version 1

  struct ticket {
    std::uint64_t number = 0;
    unique_fd fd;
    std::string path;
  };

  /// flock(queue.lock) for one short critical section; the caller holds mutex_, because the
  /// lock belongs to the descriptor that all threads using this object share. When the path names
  /// another file by then (queue.lock was removed or replaced), it opens that one and locks it
  /// instead, so that every process keeps meeting the others' lock.
  class queue_lock {
   public:
    explicit queue_lock(node_limiter& l) : l_(l) {
      for (int round = 0;; ++round) {
        while (::flock(l_.lock_file_.fd.get(), LOCK_EX) != 0)
          if (errno != EINTR) throw io_error("flock", l_.lock_path_, errno);
        if (round >= 8 || detail::names_file(l_.lock_path_, l_.lock_file_)) return;
        ::flock(l_.lock_file_.fd.get(), LOCK_UN);
        l_.lock_file_ = detail::open_node_file(l_.lock_path_);
      }
    }
    ~queue_lock() { ::flock(l_.lock_file_.fd.get(), LOCK_UN); }
    queue_lock(const queue_lock&) = delete;
    queue_lock& operator=(const queue_lock&) = delete;

   private:
    node_limiter& l_;
  };

  struct header {
    std::uint64_t permits = 0;
    std::uint64_t next_ticket = 0;
  };

  // The bytes of queue.lock's header: magic, permits, next ticket, checksum of the first three.
  using header_bytes = std::array<std::uint64_t, 4>;

  // Under queue_lock. Reads the header (rebuilding a damaged one) and reconciles the cap.
  header read_header() {
    header_bytes raw{};
    ssize_t n;
    do n = ::pread(lock_file_.fd.get(), raw.data(), sizeof raw, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) throw io_error("pread", lock_path_, 0, errno);
    header h{raw[1], raw[2]};
    if (static_cast<std::size_t>(n) < sizeof raw) {
      h = rebuild_header(n == 0 ? "" : fmt::format("{} bytes long", n));
    } else if (raw[0] != header_magic || raw[3] != checksum64(std::as_bytes(std::span(raw).first(3)))) {
      h = rebuild_header(raw[0] == header_magic ? "its checksum does not match" : "not a queue file of this version");
    } else if (h.permits < 1 || h.permits > max_permits || h.next_ticket >= ticket_limit) {
      h = rebuild_header(fmt::format("permits {}, next ticket {}", h.permits, h.next_ticket));
    }
    if (h.permits != permits_) {
      if (live_tickets_below(ticket_limit, 1) > 0)
        throw config_error(fmt::format("node_limiter '{}': this process asks for {} permits but the processes "
                                       "using {} now have {}",
                                       name_, permits_, dir_.string(), h.permits));
      h.permits = permits_;
      write_header(h);
    }
    return h;
  }

  // Under queue_lock: a header for a queue.lock that has none (new, or an empty one: `damage`
  // empty) or a damaged one, written back. Its counter goes past every ticket in the directory.
  header rebuild_header(const std::string& damage) {
    std::uint64_t live = 0, next = 0;
    bool foreign_cap = false;
    for_each_ticket([&](std::uint64_t number, const std::filesystem::path& path) {
      next = std::max(next, number + 1);
      unique_fd fd;
      if (probe(path, &fd) != ticket_state::live) return true;
      ++live;
      std::array<std::uint64_t, 2> rec{};
      ssize_t n;
      do n = ::pread(fd.get(), rec.data(), sizeof rec, 0);
      while (n < 0 && errno == EINTR);
      if (n != static_cast<ssize_t>(sizeof rec) || rec[0] != ticket_magic || rec[1] != permits_) foreign_cap = true;
      return true;
    });
    if (live > 0 && foreign_cap)
      throw config_error(fmt::format("node_limiter '{}': {} is damaged ({}), and of the {} processes holding or "
                                     "waiting for a permit some have not recorded this process's cap of {}; it is set "
                                     "up again once none is left",
                                     name_, lock_path_.string(), damage.empty() ? "empty" : damage, live, permits_));
    if (!damage.empty() || live > 0)
      notice(fmt::format("node_limiter '{}': {} was damaged ({}); rebuilt it ({} permits, next ticket {})", name_,
                         lock_path_.string(), damage.empty() ? "empty" : damage, permits_, next));
    const header h{permits_, next};
    write_header(h);
    return h;
  }

  void write_header(const header& h) {
    header_bytes raw{header_magic, h.permits, h.next_ticket, 0};
    raw[3] = checksum64(std::as_bytes(std::span(raw).first(3)));
    ssize_t n;
    do n = ::pwrite(lock_file_.fd.get(), raw.data(), sizeof raw, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) throw io_error("pwrite", lock_path_, 0, errno);
    if (static_cast<std::size_t>(n) != sizeof raw) throw io_error("pwrite", lock_path_, 0, EIO);
  }

  [[nodiscard]] std::string ticket_path(std::uint64_t number) const {
    return (dir_ / fmt::format("t-{:020}", number)).string();
  }

  // Under queue_lock: the ticket file is created, locked and filled in before any other process
  // can scan, so a scan never mistakes a ticket being born for a dead one.
  ticket take_ticket() {
    header h = read_header();
    for (;;) {
      ticket t;
      t.number = h.next_ticket++;
      if (t.number >= ticket_limit) throw config_error(fmt::format("node_limiter '{}': {} ran out of ticket numbers",
                                                                   name_, lock_path_.string()));
      t.path = ticket_path(t.number);
      write_header(h);  // first, so that a crash below leaves a gap, never a reused number
      const int fd = ::open(t.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) {
        if (errno == EEXIST || errno == EINTR) continue;  // a stray file: take the next number
        throw io_error("open", t.path, errno);
      }
      t.fd.reset(fd);
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        ::unlink(t.path.c_str());
        throw io_error("flock", t.path, err);
      }
      // The cap it was taken under, for a rebuild of a damaged header while it is live.
      const std::array<std::uint64_t, 2> rec{ticket_magic, permits_};
      ssize_t n;
      do n = ::pwrite(fd, rec.data(), sizeof rec, 0);
      while (n < 0 && errno == EINTR);
      if (n != static_cast<ssize_t>(sizeof rec)) {
        const int err = n < 0 ? errno : EIO;
        ::unlink(t.path.c_str());
        throw io_error("pwrite", t.path, 0, err);
      }
      return t;
    }
  }

  // Calls f(number, path) for each entry of the directory named like a ticket, while it returns
  // true.
  template <class F>
  void for_each_ticket(F&& f) {
    DIR* d = ::opendir(dir_.c_str());
    if (d == nullptr) throw io_error("opendir", dir_, errno);
    struct closer {
      DIR* d;
      ~closer() { ::closedir(d); }
    } close_dir{d};
    for (;;) {
      errno = 0;
      const dirent* e = ::readdir(d);
      if (e == nullptr) {
        if (errno != 0) throw io_error("readdir", dir_, errno);
        return;
      }
      const std::string_view file(e->d_name);
      if (!file.starts_with("t-")) continue;
      std::uint64_t number = 0;
      const auto [ptr, ec] = std::from_chars(file.data() + 2, file.data() + file.size(), number);
      if (ec != std::errc{} || ptr != file.data() + file.size() || number >= ticket_limit) continue;
      if (!f(number, dir_ / file)) return;
    }
  }

  enum class ticket_state { gone, dead, live, not_a_ticket };

  // Under queue_lock: whether the ticket file `path` is held by a live process (kept open in
  // `keep`, when given); a dead one is deleted. An entry that is not a regular file of this user
  // is not a ticket: it is never counted, nor deleted.
  ticket_state probe(const std::filesystem::path& path, unique_fd* keep = nullptr) {
    const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return ticket_state::gone;  // released meanwhile
      if (errno == ELOOP || errno == EISDIR || errno == ENXIO || errno == EWOULDBLOCK)
        return ticket_state::not_a_ticket;  // a link, a directory, a socket
      throw io_error("open", path, errno);
    }
    unique_fd other_fd(fd);
    struct stat st{};
    if (::fstat(fd, &st) != 0) throw io_error("fstat", path, errno);
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) return ticket_state::not_a_ticket;
    int rc;
    do rc = ::flock(fd, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      if (errno != EWOULDBLOCK) throw io_error("flock", path, errno);
      if (keep != nullptr) *keep = std::move(other_fd);
      return ticket_state::live;
    }
    // Unlocked: its owner released it or died. Names are never reused, so this cannot delete
    // a newer ticket.
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw io_error("unlink", path, errno);
    return ticket_state::dead;
  }

  // Under queue_lock: live tickets numbered below `number`, counting up to `enough`; deletes the
  // dead ones it meets.
  std::size_t live_tickets_below(std::uint64_t number, std::size_t enough) {
    std::size_t live = 0;
    for_each_ticket([&](std::uint64_t other, const std::filesystem::path& path) {
      if (other >= number || probe(path) != ticket_state::live) return true;
      return ++live < enough;
    });
    return live;
  }

  // Under mutex_: takes a ticket into `t`; when it holds a permit at once, moves it to held_ and
  // returns true; else `t` waits (the caller polls or queues it).
  bool take_ticket_and_check(ticket& t) {
    queue_lock q(*this);
    t = take_ticket();
    bool granted = false;
    try {
      granted = live_tickets_below(t.number, permits_) < permits_;
    } catch (...) {
      withdraw(t);
      throw;
    }
    if (granted) held_.push_back(std::move(t));
    return granted;
  }

  static void withdraw(ticket& t) noexcept {
    ::unlink(t.path.c_str());  // before the lock drops, so nobody sees it unlocked and alive
    t.fd.reset();
  }

  bool acquire_until(std::optional<std::chrono::steady_clock::time_point> deadline) {
    ticket t;
    bool granted = false;
    {
      std::lock_guard self(mutex_);
      if (take_ticket_and_check(t)) return true;
    }
    auto backoff = std::chrono::microseconds(50);
    try {
      for (;;) {
        auto pause = backoff;
        if (deadline) {
          const auto now = std::chrono::steady_clock::now();
          if (now >= *deadline) {
            withdraw(t);
            return false;
          }
          pause = std::min(pause, std::chrono::ceil<std::chrono::microseconds>(*deadline - now));
        }
        std::this_thread::sleep_for(pause);
        backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
        std::lock_guard self(mutex_);
        {
          queue_lock q(*this);
          granted = live_tickets_below(t.number, permits_) < permits_;
        }
        if (granted) {
          held_.push_back(std::move(t));
          return true;
        }
      }
    } catch (...) {
      withdraw(t);
      throw;
    }
  }

  struct pending {
    ticket t;
    completion_promise promise;
  };

  // The thread behind acquire_async: re-checks the waiting tickets (oldest first: a ticket is
  // never granted before an older one of the same object) and completes the granted ones.
  void poll() {
    auto backoff = std::chrono::microseconds(50);
    std::unique_lock self(mutex_);
    for (;;) {
      poll_cv_.wait_for(self, backoff, [&] { return stopping_; });
      if (stopping_) return;
      if (pending_.empty()) {
        backoff = std::chrono::microseconds(50);
        poll_cv_.wait(self, [&] { return stopping_ || !pending_.empty(); });
        continue;
      }
      std::vector<completion_promise> granted;
      std::exception_ptr failure;
      try {
        queue_lock q(*this);
        while (!pending_.empty() && live_tickets_below(pending_.front().t.number, permits_) < permits_) {
          held_.push_back(std::move(pending_.front().t));
          granted.push_back(std::move(pending_.front().promise));
          pending_.pop_front();
        }
      } catch (...) {
        failure = std::current_exception();  // the limiter's files failed: fail every waiter
      }
      std::deque<pending> failed;
      if (failure) failed.swap(pending_);
      backoff = granted.empty() ? std::min(backoff * 2, std::chrono::microseconds(1000)) : std::chrono::microseconds(50);
      self.unlock();  // continuations may call back into this object (release, acquire_async)
      for (auto& p : granted) detail::grant_unit(std::move(p));
      for (auto& p : failed) {
        withdraw(p.t);
        p.promise.set_exception(failure);
      }
      self.lock();
    }
  }

  std::string name_;
  std::size_t permits_;
  std::filesystem::path dir_;
  std::filesystem::path lock_path_;
  detail::node_file lock_file_;
  mutable std::mutex mutex_;  // guards held_, pending_ and this object's use of queue.lock
  std::deque<ticket> held_;
  std::deque<pending> pending_;  // acquire_async tickets still waiting, oldest first
  std::condition_variable poll_cv_;
  bool stopping_ = false;
  std::thread poller_;
};

static_assert(limiter<node_limiter>);

}  // namespace strata
