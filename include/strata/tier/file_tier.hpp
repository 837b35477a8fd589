#pragma once
/// file_tier: objects as files in one directory (a node-local NVMe mount, a PFS mount, ...).
///
/// - Two engines behind one interface: io_uring (liburing, `queue_depth` in flight) and a POSIX
///   thread pool (pread/pwrite) that always exists. `io_backend::automatic` picks io_uring when
///   strata was built with it and the kernel allows it, else POSIX, and says so once.
/// - O_DIRECT by default. Callers never need aligned memory or 512-byte multiples: aligned
///   requests go straight from the caller's memory; the unaligned head or tail of a request goes
///   through a 4096-aligned bounce buffer (read-modify-write of the edge blocks), and the file is
///   truncated back to the object's true length. A filesystem that refuses O_DIRECT (tmpfs) gets
///   buffered I/O, reported once through strata::notice.
/// - Requests are split into `chunk_bytes` pieces at absolute multiples of `chunk_bytes`, all
///   issued at once; short transfers are continued and EINTR/EAGAIN retried; ENOSPC/EDQUOT become
///   capacity_error, other failures io_error naming path, offset and errno text.
/// - Durability: writes are durable after flush() (fdatasync of touched files, fsync of the
///   directory when files were created or removed), not before.
/// - Ownership: the directory is locked for the tier's life (directory_lock), and only files
///   strata made are ever written or removed. Every object file it creates is named in the
///   directory's journal (".strata-objects", tier/detail/object_journal.hpp) before it exists, so
///   objects a killed run left are reclaimed by the next one; a file that no journal line names
///   (another job's, a user's) can be read but writing or removing it is a foreign_file_error
///   naming it, unless `adopt_existing` is set and it is named as the tier's objects are. Object
///   files are opened with O_NOFOLLOW (new ones with O_EXCL) and must be regular files of this
///   user: a symlink, a FIFO or a hard link in the directory is never followed, changed or
///   removed. The lock and journal names (".strata-lock[.<scope>]", ".strata-objects[.<scope>]")
///   are strata's only when the file there is one strata wrote; any other is refused by name.
/// - Directories: a missing directory is made (with its missing parents) and recorded in the
///   journal as it is created; when the tier ends (or fails to start) with no object left, its
///   journal and lock go and then each directory made for it, this run or a killed one, that is
///   empty by then. A directory strata did not make, or one that holds anything else, stays.
/// Environment defaults: STRATA_IO_BACKEND, STRATA_DIRECT_IO, STRATA_CHUNK_BYTES,
/// STRATA_QUEUE_DEPTH, STRATA_IO_THREADS (see docs/environment.md).

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "strata/core/aligned_buffer.hpp"
#include "strata/core/completion.hpp"
#include "strata/core/directory_lock.hpp"
#include "strata/core/env.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/notice.hpp"
#include "strata/core/units.hpp"
#include "strata/tier/detail/file_io_backend.hpp"
#include "strata/tier/detail/object_journal.hpp"
#include "strata/tier/throughput_meter.hpp"
#include "strata/tier/tier.hpp"

namespace strata {

/// Which engine a file_tier uses.
enum class io_backend : std::uint8_t { automatic, uring, posix };

[[nodiscard]] constexpr std::string_view to_string(io_backend b) noexcept {
  switch (b) {
    case io_backend::automatic: return "auto";
    case io_backend::uring: return "uring";
    case io_backend::posix: return "posix";
  }
  return "unknown";
}

/// Options of a file_tier. Defaults come from STRATA_* variables when set.
struct file_tier_options {
  std::filesystem::path directory;  ///< created if missing
  std::string name;                 ///< default: the directory's path
  io_backend backend = backend_from_env();
  bool direct = env_bool("STRATA_DIRECT_IO", true);
  std::uint64_t chunk_bytes = env_size("STRATA_CHUNK_BYTES", 8ULL << 20, 4096, 1ULL << 30);
  unsigned queue_depth = env_integer<unsigned>("STRATA_QUEUE_DEPTH", 32, 1, 4096);
  std::size_t threads = env_integer<std::size_t>("STRATA_IO_THREADS", 4, 1, 256);
  std::uint64_t capacity = unlimited_capacity;  ///< budget; the medium's free space also bounds it
  /// Own the directory while the tier lives (directory_lock: a second tier on it, in any
  /// process, is a busy_error naming the holder's pid). Off only for a directory that other
  /// code coordinates itself.
  bool lock_directory = true;
  /// Own only this scope of the directory (directory_lock's scope, e.g. the object prefix of
  /// the optimizer using it): tiers of other scopes, in this process or others, share the
  /// directory, each with its lock ".strata-lock.<scope>" and journal ".strata-objects.<scope>",
  /// and the files another scope made are foreign to this one. Empty: the whole directory.
  std::string scope{};
  /// Take files already in the directory that no journal of strata's names (another job's
  /// objects, files copied in by hand) as this tier's own, to be overwritten and removed like
  /// objects it wrote, when they are named as the tier's objects are (adoptable_prefixes). Off,
  /// or another name: writing or removing one is a foreign_file_error naming it.
  bool adopt_existing = false;
  /// The names adopt_existing takes: "<p><digits>" for a p here. The default is how
  /// offloaded_adamw names its objects ("<object_prefix>.sg-<i>", ".gr-<i>") with the default
  /// prefix; make_offloaded_adamw gives its optimizer's. Empty: none.
  std::vector<std::string> adoptable_prefixes{"strata.sg-", "strata.gr-"};
  double read_bandwidth = 0;                     ///< declared, bytes/s; 0 = use the measured value
  double write_bandwidth = 0;
  file_syscalls syscalls{};  ///< POSIX engine's syscalls (a test hook)

  static io_backend backend_from_env() {
    const auto v = env_choice("STRATA_IO_BACKEND", {"auto", "uring", "posix"}, "auto");
    return v == "uring" ? io_backend::uring : v == "posix" ? io_backend::posix : io_backend::automatic;
  }
};

class file_tier {
 public:
  static constexpr std::uint64_t block = direct_io_alignment;

  explicit file_tier(file_tier_options o) : opts_(std::move(o)) {
    if (opts_.name.empty()) opts_.name = opts_.directory.string();
    STRATA_EXPECTS(!opts_.directory.empty(), config_error, "file_tier: no directory given");
    STRATA_EXPECTS(opts_.scope.empty() || directory_lock::valid_scope(opts_.scope), config_error,
                   "file_tier '{}': scope '{}' (use 1-100 of [A-Za-z0-9._-])", opts_.name, opts_.scope);
    STRATA_EXPECTS(opts_.chunk_bytes % block == 0 && opts_.chunk_bytes > 0, config_error,
                   "file_tier '{}': chunk_bytes {} is not a positive multiple of {}", opts_.name, opts_.chunk_bytes,
                   block);
    const auto made = make_directory();
    try {
      if (::access(opts_.directory.c_str(), R_OK | W_OK | X_OK) != 0) throw io_error("access", opts_.directory, errno);
      // Two tiers on one directory (two processes, or two optimizers) would corrupt each other.
      if (opts_.lock_directory)
        lock_ = directory_lock(opts_.directory, fmt::format("file_tier '{}'", opts_.name), opts_.scope);
      journal_ = detail::object_journal(opts_.directory, opts_.scope, made);
      direct_ = opts_.direct && probe_direct_io();
      cpu_copies_ = !direct_ || memory_filesystem(opts_.directory);
      scan_existing();
      engine_ = make_engine();
    } catch (...) {
      // Nothing of a failed start stays: a journal that names nothing, the lock, the
      // directories made for it (when empty).
      const bool nothing = sizes_.empty() && (scanned_ || journal_.recorded().empty());
      release_directory(nothing, made);
      throw;
    }
  }

  file_tier(const file_tier&) = delete;
  file_tier& operator=(const file_tier&) = delete;
  /// Waits for every request in flight (the engine drains), then closes; when no object of this
  /// tier is left, the journal goes, then the lock, then the directories made for it if empty.
  ~file_tier() {
    engine_.reset();
    std::lock_guard lock(mutex_);
    release_directory(sizes_.empty(), {});
  }

  completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    try {
      const std::uint64_t end = validate_write(opts_.name, object, offset, bytes.size());
      const auto path = path_of(object);
      std::uint64_t old_size = 0;
      bool fresh = false;
      {
        std::lock_guard lock(mutex_);
        check_not_foreign_locked(object, "write");
        const auto it = sizes_.find(object);
        old_size = it == sizes_.end() ? 0 : it->second;
        const std::uint64_t growth = end > old_size ? end - old_size : 0;
        if (growth > 0 && (used_ + growth > opts_.capacity || used_ + growth < used_))
          throw over_budget_error(opts_.name, object, offset, bytes.size(), used_ + growth, opts_.capacity);
        if (it == sizes_.end()) {
          journal_.created(object);  // before the file exists: a kill from here on leaves it known as ours
          sizes_.emplace(std::string(object), std::max(old_size, end));
          directory_dirty_ = true;
          fresh = true;
        } else {
          it->second = std::max(old_size, end);
        }
        used_ += growth;
        dirty_.insert(std::string(object));
      }
      std::shared_ptr<unique_fd> fd;
      try {
        fd = open_counted(path, O_RDWR | (fresh ? O_CREAT | O_EXCL : 0) | (direct_ ? O_DIRECT : 0));
        if (end > old_size) reserve_space(fd->get(), path, old_size, end);
      } catch (const foreign_file_error&) {
        // Someone else's file is under this name now (it appeared since the scan, or replaced
        // ours): it stays theirs.
        std::lock_guard lock(mutex_);
        forget_created_locked(object);
        foreign_.emplace(std::string(object));
        throw;
      } catch (...) {
        settle_size(std::string(object), path, nullptr);
        throw;
      }
      auto req = std::make_shared<request>(this, std::string(object), path, std::move(fd), /*write=*/true, offset,
                                           bytes.size(), const_cast<std::byte*>(bytes.data()), old_size);
      return start(req);
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    try {
      validate_object_name(opts_.name, object);
      const auto size = this->size(object);
      check_read_range(opts_.name, object, offset, dst.size(), size);
      const auto path = path_of(object);
      auto fd = open_counted(path, O_RDONLY | (direct_ ? O_DIRECT : 0), /*own=*/!is_foreign(object));
      auto req = std::make_shared<request>(this, std::string(object), path, std::move(fd), /*write=*/false, offset,
                                           dst.size(), dst.data(), *size);
      return start(req);
    } catch (...) {
      return make_ready_completion(std::current_exception());
    }
  }

  /// Removes an object this tier owns; a file of that name that is not strata's is a
  /// foreign_file_error (and stays).
  bool remove(std::string_view object) {
    validate_object_name(opts_.name, object);
    const auto path = path_of(object);
    std::lock_guard lock(mutex_);
    check_not_foreign_locked(object, "remove");
    if (!sizes_.contains(object)) {
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0) return false;
      foreign_.emplace(std::string(object));  // appeared after the scan: not ours
      check_not_foreign_locked(object, "remove");
    }
    bool existed = true;
    if (::unlink(path.c_str()) != 0) {
      if (errno != ENOENT) throw io_error("unlink", path, errno);
      existed = false;  // removed behind the tier's back: forget it all the same
    }
    forget_created_locked(object);
    directory_dirty_ = true;
    return existed;
  }

  /// Makes every completed write durable: fdatasync of each file written since the last flush,
  /// then fsync of the directory if files were created or removed.
  void flush() {
    std::set<std::string> dirty;
    bool dir_dirty = false;
    {
      std::lock_guard lock(mutex_);
      dirty.swap(dirty_);
      dir_dirty = std::exchange(directory_dirty_, false);
    }
    try {
      for (const auto& object : dirty) {
        const auto path = path_of(object);
        unique_fd fd;
        try {
          fd = open_own_file(path, O_RDONLY);
        } catch (const io_error& e) {
          if (e.error_number() == ENOENT) continue;  // removed since: nothing to sync
          throw;
        }
        sync_file(fd.get(), path, true);
      }
      if (dir_dirty) {
        journal_.sync();  // the journal names every file before the directory shows it
        auto dfd = open_file(opts_.directory, O_RDONLY | O_DIRECTORY);
        if (::fsync(dfd.get()) != 0) throw io_error("fsync", opts_.directory, errno);
      }
    } catch (...) {
      std::lock_guard lock(mutex_);  // not durable yet: a later flush must try again
      dirty_.merge(dirty);
      directory_dirty_ = directory_dirty_ || dir_dirty;
      throw;
    }
  }

  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const {
    {
      std::lock_guard lock(mutex_);
      if (const auto it = sizes_.find(object); it != sizes_.end()) return it->second;
    }
    // Not ours: report a regular file that is there (readable), never follow a symlink.
    struct stat st {};
    const auto path = opts_.directory / std::string(object);
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    return static_cast<std::uint64_t>(st.st_size);
  }

  /// The budget, bounded by what the filesystem can still take.
  [[nodiscard]] std::uint64_t capacity() const {
    struct statvfs vfs {};
    const std::uint64_t u = used();
    if (::statvfs(opts_.directory.c_str(), &vfs) != 0) return opts_.capacity;
    const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    const std::uint64_t medium = free_bytes > unlimited_capacity - u ? unlimited_capacity : u + free_bytes;
    return std::min(opts_.capacity, medium);
  }
  [[nodiscard]] std::uint64_t used() const {
    std::lock_guard lock(mutex_);
    return used_;
  }
  [[nodiscard]] std::string_view name() const { return opts_.name; }
  /// Declared bandwidths where given, else those measured from the requests served so far.
  [[nodiscard]] tier_descriptor descriptor() const {
    return declared_or_measured(opts_.name, tier_kind::file, opts_.read_bandwidth, opts_.write_bandwidth, read_meter_,
                                write_meter_);
  }

  /// Registers host buffers that requests will reuse (a pipeline's staging slots, say): with
  /// io_uring the kernel then pins their pages once instead of on every operation, and
  /// requests inside them use fixed-buffer operations. Replaces any earlier registration once
  /// the tier is idle; an empty list unregisters. Returns false with the POSIX engine (nothing to
  /// register). Throws io_error when the kernel refuses (e.g. RLIMIT_MEMLOCK).
  bool register_buffers(std::span<const std::span<std::byte>> buffers) { return engine_->register_buffers(buffers); }
  /// Operations that used a registered buffer so far.
  [[nodiscard]] std::uint64_t fixed_operations() const noexcept { return engine_->fixed_operations(); }

  /// Whether O_DIRECT is in use (false after a fallback to buffered I/O).
  [[nodiscard]] bool direct_io() const noexcept { return direct_; }
  /// Whether every transfer is a copy by the CPU (buffered I/O, or a memory filesystem such as
  /// tmpfs, whose O_DIRECT copies too). The io_uring engine then hands transfers to the kernel's
  /// workers, so that a caller issuing a read or write is never held for the copy.
  [[nodiscard]] bool cpu_copies() const noexcept { return cpu_copies_; }
  /// The engine in use: "io_uring" or "posix".
  [[nodiscard]] std::string_view engine() const noexcept { return engine_->name(); }
  /// The directory holding the objects.
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return opts_.directory; }
  /// The file that holds `object`.
  [[nodiscard]] std::filesystem::path path_of(std::string_view object) const {
    return opts_.directory / std::string(object);
  }

 private:
  // One read or write: its chunks complete independently; the last one completes the promise.
  // Descriptors of requests in flight are bounded (half the soft RLIMIT_NOFILE, 64..4096): past
  // that, a new request waits in write()/read() for one to close, so thousands of small
  // requests at once queue instead of failing with EMFILE.
  class fd_slots {
   public:
    fd_slots() {
      struct rlimit r {};
      const std::uint64_t soft = ::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY ? r.rlim_cur : 8192;
      free_ = static_cast<std::size_t>(std::clamp<std::uint64_t>(soft / 2, 64, 4096));
    }
    void acquire() {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return free_ > 0; });
      --free_;
    }
    void release() noexcept {
      {
        std::lock_guard lock(mutex_);
        ++free_;
      }
      cv_.notify_one();
    }

   private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::size_t free_ = 0;
  };

  /// A descriptor of `path` that holds one of the slots until it is closed.
  // Objects of ours go through open_own_file (no symlink, no FIFO, no hard link); a foreign
  // object is only ever read, still without following a symlink.
  std::shared_ptr<unique_fd> open_counted(const std::filesystem::path& path, int flags, bool own = true) {
    fd_slots_->acquire();
    try {
      auto fd = own ? open_own_file(path, flags) : open_file(path, flags | O_NOFOLLOW | O_NONBLOCK);
      return std::shared_ptr<unique_fd>(new unique_fd(std::move(fd)), [slots = fd_slots_](unique_fd* f) {
        delete f;
        slots->release();
      });
    } catch (...) {
      fd_slots_->release();
      throw;
    }
  }

  struct request {
    request(file_tier* t, std::string obj, std::filesystem::path p, std::shared_ptr<unique_fd> f, bool w,
            std::uint64_t off, std::uint64_t len, std::byte* b, std::uint64_t size_before)
        : tier(t), object(std::move(obj)), path(std::move(p)), fd(std::move(f)), write(w), offset(off),
          length(len), buf(b), old_size(size_before) {}
    file_tier* tier;
    std::string object;
    std::filesystem::path path;
    std::shared_ptr<unique_fd> fd;
    bool write;
    std::uint64_t offset;
    std::uint64_t length;
    std::byte* buf;
    std::uint64_t old_size;
    completion_promise promise;
    std::mutex mutex;
    std::size_t remaining = 0;
    std::exception_ptr first_error;
    bool bounced = false;
  };

  completion start(const std::shared_ptr<request>& req) {
    auto fut = req->promise.get_future();
    (req->write ? write_meter_ : read_meter_).begin();
    // Chunk boundaries at absolute multiples of chunk_bytes: no two chunks share a block.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> chunks;
    for (std::uint64_t pos = req->offset, end = req->offset + req->length; pos < end;) {
      const std::uint64_t next = std::min(end, (pos / opts_.chunk_bytes + 1) * opts_.chunk_bytes);
      chunks.emplace_back(pos, next - pos);
      pos = next;
    }
    if (chunks.empty()) {
      finish(req);
      return fut;
    }
    req->remaining = chunks.size();
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      try {
        start_chunk(req, chunks[i].first, chunks[i].second);
      } catch (...) {
        // Chunks already started still complete; the rest never will: account for them so the
        // future completes (with this error) only when nothing touches the caller's memory.
        std::unique_lock lock(req->mutex);
        if (!req->first_error) req->first_error = std::current_exception();
        req->remaining -= chunks.size() - i;
        const bool last = req->remaining == 0;
        lock.unlock();
        if (last) finish(req);
        break;
      }
    }
    return fut;
  }

  void start_chunk(const std::shared_ptr<request>& req, std::uint64_t pos, std::uint64_t len) {
    std::byte* user = req->buf + (pos - req->offset);
    const bool aligned = !direct_ || (pos % block == 0 && len % block == 0 &&
                                      reinterpret_cast<std::uintptr_t>(user) % block == 0);
    if (aligned) {
      submit(req, req->write, user, len, pos, false,
             [this, req, len](std::size_t done, int err) { chunk_done(req, done == len ? 0 : err, done); });
      return;
    }
    // Bounce through an aligned window covering whole blocks.
    const std::uint64_t a0 = pos / block * block;
    const std::uint64_t a1 = (pos + len + block - 1) / block * block;
    auto bounce = std::make_shared<direct_io_buffer>(acquire_bounce(a1 - a0));
    {
      std::lock_guard lock(req->mutex);
      req->bounced = true;
    }
    if (!req->write) {
      const std::uint64_t need = pos + len - a0;  // the file ends inside the last block: fine
      submit(req, false, bounce->data(), a1 - a0, a0, true,
             [this, req, bounce, pos, len, a0, need, user](std::size_t done, int err) {
               if (err == 0 && done < need) err = ENODATA;
               if (err == 0) std::memcpy(user, bounce->data() + (pos - a0), len);
               release_bounce(std::move(*bounce));
               chunk_done(req, err, err == 0 ? len : 0);
             });
      return;
    }
    // Write: the edge blocks keep their other bytes, so read them first when the file has them.
    std::memset(bounce->data(), 0, block);
    std::memset(bounce->data() + (a1 - a0 - block), 0, block);
    std::vector<std::uint64_t> edges;
    if (pos != a0 && a0 < req->old_size) edges.push_back(a0);
    const std::uint64_t tail = a1 - block;
    if ((pos + len) % block != 0 && tail < req->old_size && (edges.empty() || edges.front() != tail))
      edges.push_back(tail);
    auto after_edges = [this, req, bounce, pos, len, a0, a1, user] {
      std::memcpy(bounce->data() + (pos - a0), user, len);
      submit(req, true, bounce->data(), a1 - a0, a0, false, [this, req, bounce, a0, a1, len](std::size_t done, int err) {
        if (err == 0 && done != a1 - a0) err = EIO;
        release_bounce(std::move(*bounce));
        chunk_done(req, err, err == 0 ? len : 0);
      });
    };
    if (edges.empty()) {
      after_edges();
      return;
    }
    auto pending = std::make_shared<std::atomic<int>>(static_cast<int>(edges.size()));
    auto edge_error = std::make_shared<std::atomic<int>>(0);
    for (const std::uint64_t e : edges)
      submit(req, false, bounce->data() + (e - a0), block, e, true,
             [this, req, bounce, pending, edge_error, after_edges, len](std::size_t, int err) {
               if (err != 0) edge_error->store(err);
               if (pending->fetch_sub(1) != 1) return;
               if (const int ee = edge_error->load(); ee != 0) {
                 release_bounce(std::move(*bounce));
                 chunk_done(req, ee, 0);
                 return;
               }
               after_edges();
             });
  }

  template <class Done>
  void submit(const std::shared_ptr<request>& req, bool write, std::byte* buf, std::uint64_t len, std::uint64_t off,
              bool allow_eof, Done&& done) {
    auto op = std::make_unique<detail::raw_io>();
    op->fd = req->fd->get();
    op->write = write;
    op->buf = buf;
    op->len = len;
    op->offset = off;
    op->allow_eof = allow_eof;
    op->cpu_copy = cpu_copies_;
    op->done = std::forward<Done>(done);
    engine_->submit(std::move(op));
  }

  void chunk_done(const std::shared_ptr<request>& req, int err, std::uint64_t /*bytes*/) noexcept {
    std::unique_lock lock(req->mutex);
    if (err != 0 && !req->first_error) req->first_error = make_error(*req, err);
    if (--req->remaining != 0) return;
    lock.unlock();
    finish(req);
  }

  std::exception_ptr make_error(const request& req, int err) const noexcept {
    const char* op = req.write ? "pwrite" : "pread";
    try {
      if (err == ENOSPC || err == EDQUOT)
        return std::make_exception_ptr(capacity_error(
            fmt::format("{} {} (tier '{}', object '{}'): {}", op, req.path.string(), opts_.name, req.object,
                        detail::errno_text(err))));
      if (err == ENODATA)
        return std::make_exception_ptr(io_error(std::string(op) + " (file ended early)", req.path, req.offset, EIO));
      return std::make_exception_ptr(io_error(op, req.path, req.offset, err));
    } catch (...) {
      return std::current_exception();
    }
  }

  void finish(const std::shared_ptr<request>& req) noexcept {
    std::exception_ptr error = req->first_error;
    if (req->write) {
      const std::uint64_t logical = std::max(req->old_size, req->offset + req->length);
      // Padded O_DIRECT writes may have left whole blocks past the object's end.
      if (!error && req->bounced && ::ftruncate(req->fd->get(), static_cast<off_t>(logical)) != 0)
        error = std::make_exception_ptr(io_error("ftruncate", req->path, logical, errno));
      if (error) settle_size(req->object, req->path, req->fd.get());
    }
    (req->write ? write_meter_ : read_meter_).end(error ? 0 : req->length);
    req->fd.reset();  // close before completing: a caller may remove the file at once
    req->promise.complete(error);
  }

  // Allocates the blocks a growing write will fill before it is issued. Extending O_DIRECT
  // writes are serialized by filesystems such as ext4 (each must update the file size), so
  // without this the chunks of a new object would not run in parallel; it also turns a full
  // device into a capacity_error before any byte is written. Filesystems without fallocate are
  // simply written as they are.
  void reserve_space(int fd, const std::filesystem::path& path, std::uint64_t from, std::uint64_t to) {
    if (!fallocate_supported_.load(std::memory_order_relaxed)) return;
    for (;;) {
      if (opts_.syscalls.fallocate(fd, 0, static_cast<off_t>(from), static_cast<off_t>(to - from)) == 0) return;
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EOPNOTSUPP || err == ENOSYS) {
        fallocate_supported_.store(false, std::memory_order_relaxed);
        return;
      }
      if (err == ENOSPC || err == EDQUOT)
        throw capacity_error(fmt::format("fallocate {} ({} bytes at offset {}, tier '{}'): {}", path.string(), to - from,
                                         from, opts_.name, detail::errno_text(err)),
                             to - from, 0);
      throw io_error("fallocate", path, from, err);
    }
  }

  // After a failed write, trust the file, not the reservation.
  void settle_size(const std::string& object, const std::filesystem::path& path, const unique_fd* fd) noexcept {
    struct stat st {};
    const int rc = (fd != nullptr && *fd) ? ::fstat(fd->get(), &st) : ::stat(path.c_str(), &st);
    std::lock_guard lock(mutex_);
    const auto it = sizes_.find(object);
    if (it == sizes_.end()) return;
    const std::uint64_t actual = rc == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
    if (rc != 0) {
      forget_created_locked(object);
      return;
    }
    used_ = used_ - it->second + actual;
    it->second = actual;
  }

  // An object of ours is gone (removed, or never created): forget it and say so in the journal.
  void forget_created_locked(std::string_view object) {
    if (const auto it = sizes_.find(object); it != sizes_.end()) {
      used_ -= it->second;
      sizes_.erase(it);
    }
    if (const auto it = dirty_.find(std::string(object)); it != dirty_.end()) dirty_.erase(it);
    try {
      journal_.removed(object);
    } catch (const error& e) {  // the object is gone either way; a stale line only makes a file look ours
      notice(fmt::format("file_tier '{}': {}", opts_.name, e.what()));
    }
  }

  [[nodiscard]] bool is_foreign(std::string_view object) const {
    std::lock_guard lock(mutex_);
    return foreign_.contains(object);
  }

  void check_not_foreign_locked(std::string_view object, std::string_view what) const {
    if (!foreign_.contains(object)) return;
    const auto path = path_of(object);
    struct stat st {};
    const std::string kind = ::lstat(path.c_str(), &st) == 0
                                 ? std::string(detail::file_type_text(st.st_mode))
                                 : std::string("a file");
    throw foreign_file_error(
        fmt::format("tier '{}': will not {} object '{}': {} is {} that strata did not create (no journal of strata's "
                    "in {} names it); strata never overwrites or removes such a file. Move it away{}",
                    opts_.name, what, object, path.string(), kind, opts_.directory.string(),
                    adoptable(object) ? ", or let the tier take it as its own (file_tier_options::adopt_existing; "
                                        "offload_demo --adopt-existing)"
                                      : ""),
        path);
  }

  direct_io_buffer acquire_bounce(std::uint64_t bytes) {
    {
      std::lock_guard lock(bounce_mutex_);
      for (auto it = bounce_pool_.begin(); it != bounce_pool_.end(); ++it)
        if (it->size() >= bytes) {
          auto b = std::move(*it);
          bounce_pool_.erase(it);
          return b;
        }
    }
    return direct_io_buffer(std::max<std::uint64_t>(bytes, std::min<std::uint64_t>(opts_.chunk_bytes, 1ULL << 20)));
  }
  void release_bounce(direct_io_buffer&& b) noexcept {
    try {
      std::lock_guard lock(bounce_mutex_);
      if (bounce_pool_.size() < opts_.queue_depth) bounce_pool_.push_back(std::move(b));
    } catch (...) {  // the buffer is simply freed
    }
  }

  // Whether the directory takes O_DIRECT: an unnamed file (O_TMPFILE), so a kill never leaves a
  // probe behind; where O_TMPFILE is missing (NFS), a hidden name of this process's own, created
  // new (O_EXCL, O_NOFOLLOW), so the probe never opens, follows or removes a file it did not make.
  bool probe_direct_io() {
    const auto dir = opts_.directory.c_str();
    int fd = opts_.syscalls.open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      return true;
    }
    fd = opts_.syscalls.open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) {  // unnamed files work, O_DIRECT does not
      ::close(fd);
      return no_direct_io();
    }
    std::random_device rd;
    const auto probe = opts_.directory / fmt::format(".strata-direct-probe-{}-{:08x}", static_cast<long>(::getpid()), rd());
    fd = opts_.syscalls.open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_DIRECT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(probe.c_str());
      return true;
    }
    const int err = errno;
    if (err != EINVAL) throw io_error("open (O_DIRECT probe)", probe, err);
    return no_direct_io();
  }
  // tmpfs and ramfs: their pages are the medium, so every transfer is a memcpy.
  static bool memory_filesystem(const std::filesystem::path& dir) {
    struct statfs st {};
    if (::statfs(dir.c_str(), &st) != 0) throw io_error("statfs", dir, errno);
    constexpr auto tmpfs_magic = 0x01021994;  // TMPFS_MAGIC, linux/magic.h
    constexpr auto ramfs_magic = 0x858458f6;  // RAMFS_MAGIC
    return st.f_type == tmpfs_magic || st.f_type == static_cast<decltype(st.f_type)>(ramfs_magic);
  }
  bool no_direct_io() {
    notice(fmt::format("file_tier '{}': {} does not support O_DIRECT; using buffered I/O", opts_.name,
                       opts_.directory.string()));
    return false;
  }

  // Objects the journal names (a killed run's) are ours again; any other file with an object's
  // name is foreign unless adopt_existing takes it (named as the tier's objects are). The
  // journal then says what changed: recorded files that are gone (or not ours any more), files
  // adopted.
  void scan_existing() {
    const auto& recorded = journal_.recorded();
    detail::object_journal::names ours;
    try {
      for (const auto& entry : std::filesystem::directory_iterator(opts_.directory)) {
        const auto n = entry.path().filename().string();
        if (!is_object_name(n)) continue;  // no object can have this name: never touched
        struct stat st {};
        if (::lstat(entry.path().c_str(), &st) != 0) continue;  // gone meanwhile
        const bool regular_own = detail::not_own_reason(st).empty();
        if (regular_own && (recorded.contains(n) || (opts_.adopt_existing && adoptable(n)))) {
          sizes_.emplace(n, static_cast<std::uint64_t>(st.st_size));
          used_ += static_cast<std::uint64_t>(st.st_size);
          ours.insert(n);
        } else {
          foreign_.insert(n);
        }
      }
    } catch (const std::filesystem::filesystem_error& e) {  // a strata::error, naming the path
      throw io_error("scan", e.path1().empty() ? opts_.directory : e.path1(), e.code().value());
    }
    for (const auto& n : ours)
      if (!recorded.contains(n)) journal_.created(n);  // adopted
    if (opts_.lock_directory)  // (unlocked, others may be writing what the journal names)
      for (const auto& n : recorded)
        if (!ours.contains(n)) journal_.removed(n);
    scanned_ = true;
  }

  // Whether adopt_existing may take a file of this name: "<prefix><digits>".
  [[nodiscard]] bool adoptable(std::string_view n) const {
    return std::ranges::any_of(opts_.adoptable_prefixes, [&](const std::string& p) {
      return n.size() > p.size() && n.starts_with(p) &&
             n.substr(p.size()).find_first_not_of("0123456789") == std::string_view::npos;
    });
  }

  // Makes the directory (and missing parents) if needed; returns how the journal records each
  // one made: "<dev>:<inode> <absolute path>" (a path with a newline is not recorded).
  std::vector<std::string> make_directory() {
    created_directories made;
    made.create(opts_.directory);
    std::vector<std::string> ids;
    for (const auto& p : made.paths()) {
      struct stat st {};
      if (::lstat(p.c_str(), &st) != 0 || p.string().find('\n') != std::string::npos) continue;
      ids.push_back(fmt::format("{}:{} {}", static_cast<unsigned long long>(st.st_dev),
                                static_cast<unsigned long long>(st.st_ino), p.string()));
    }
    return ids;
  }

  // At the end, or after a failed start: with `nothing` of the tier left, its journal goes, then
  // the lock, then each directory made for it (`made_now`, and those the journal records from a
  // killed run) that is still that directory, is this one or above it, and is empty by then,
  // deepest first. Unlocked tiers leave the journal (others may share it).
  void release_directory(bool nothing, const std::vector<std::string>& made_now) noexcept {
    if (!nothing) {  // the objects stay, and so do the journal that names them and the directory
      lock_ = directory_lock();
      return;
    }
    try {
      std::vector<std::string> ids = journal_.directories();
      for (const auto& m : made_now)
        if (std::ranges::find(ids, m) == ids.end()) ids.push_back(m);
      if (opts_.lock_directory) journal_.remove_file();
      lock_ = directory_lock();
      std::error_code ec;
      const auto self = std::filesystem::absolute(opts_.directory, ec).lexically_normal();
      std::vector<std::pair<std::filesystem::path, struct stat>> dirs;
      for (const auto& id : ids) {
        const auto sp = id.find(' ');
        if (sp == std::string::npos) continue;
        struct stat want {};
        unsigned long long dev = 0, ino = 0;
        if (std::sscanf(id.substr(0, sp).c_str(), "%llu:%llu", &dev, &ino) != 2) continue;
        want.st_dev = static_cast<dev_t>(dev);
        want.st_ino = static_cast<ino_t>(ino);
        const std::filesystem::path p(id.substr(sp + 1));
        const auto rel = self.lexically_relative(p);
        if (rel.empty() || *rel.begin() == "..") continue;  // not this directory or one above it
        dirs.emplace_back(p, want);
      }
      std::ranges::sort(dirs, [](const auto& a, const auto& b) { return a.first.string().size() > b.first.string().size(); });
      for (const auto& [p, want] : dirs) {
        struct stat st {};
        if (::lstat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_dev != want.st_dev || st.st_ino != want.st_ino)
          continue;  // not the directory strata made (moved, replaced)
        ::rmdir(p.c_str());  // fails, and keeps it, when it holds anything
      }
    } catch (...) {  // best effort (out of memory): a directory left is only untidy
      lock_ = directory_lock();
    }
  }

  std::unique_ptr<detail::file_io_engine> make_engine() {
    const std::string n = opts_.name;
    if (opts_.backend == io_backend::posix) return std::make_unique<detail::posix_engine>(opts_.threads, opts_.syscalls, n);
#if STRATA_HAS_URING
    try {
      return std::make_unique<detail::uring_engine>(opts_.queue_depth, n);
    } catch (const io_error& e) {
      if (opts_.backend == io_backend::uring) throw;
      notice(fmt::format("file_tier '{}': io_uring unavailable ({}); using the POSIX thread pool", n, e.what()));
    }
#else
    STRATA_EXPECTS(opts_.backend != io_backend::uring, config_error,
                   "file_tier '{}': the io_uring backend was asked for, but strata was built without liburing", n);
#endif
    return std::make_unique<detail::posix_engine>(opts_.threads, opts_.syscalls, n);
  }

  file_tier_options opts_;
  directory_lock lock_;  // held for the tier's life; released after the engine drained
  detail::object_journal journal_;  // which files here strata made (guarded by mutex_ after construction)
  bool scanned_ = false;            // the journal says what is there (scan_existing finished)
  std::set<std::string, std::less<>> foreign_;  // files with object names that are not ours (mutex_)
  std::shared_ptr<fd_slots> fd_slots_ = std::make_shared<fd_slots>();  // shared with open descriptors
  bool direct_ = true;
  bool cpu_copies_ = false;  // see cpu_copies()
  std::atomic<bool> fallocate_supported_{true};
  mutable std::mutex mutex_;
  std::map<std::string, std::uint64_t, std::less<>> sizes_;
  std::uint64_t used_ = 0;
  std::set<std::string> dirty_;
  bool directory_dirty_ = false;
  std::mutex bounce_mutex_;
  std::vector<direct_io_buffer> bounce_pool_;
  throughput_meter read_meter_;
  throughput_meter write_meter_;
  std::unique_ptr<detail::file_io_engine> engine_;  // last: destroyed first, draining requests
};

static_assert(tier<file_tier>);

}  // namespace strata
