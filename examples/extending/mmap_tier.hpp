#pragma once
// mmap_tier: a strata tier written outside the library (docs/extending.md). Its objects are
// memory-mapped files in one directory, so a read or a write is a memcpy and the kernel's page
// cache does the I/O. Made for media that are memory already, exposed as files: tmpfs
// (/dev/shm), a DAX mount of persistent memory, CXL memory; on a disk, file_tier's asynchronous
// direct I/O overlaps better. What mmap costs: an I/O error under a mapping is a SIGBUS, not an
// io_error, so space is reserved with posix_fallocate before a mapping grows (a full disk is then
// a capacity_error at the write, never a SIGBUS at the copy).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <strata/core/completion.hpp>
#include <strata/core/error.hpp>
#include <strata/core/expects.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/core/units.hpp>
#include <strata/tier/tier.hpp>

namespace extending {

// doc-snippet: options
/// Options of an mmap_tier.
struct mmap_tier_options {
  /// The tier's own directory (created if missing). Files in it named as objects are adopted, so
  /// a tier reopened on the directory finds what the last one flushed.
  std::filesystem::path directory;
  std::string name = "mmap";
  /// Bytes of objects the tier may hold; a write past it is a capacity_error.
  std::uint64_t capacity = strata::unlimited_capacity;
  /// Threads that do the copies, so that page faults stall them, not the caller (the pipeline's
  /// event loop); 0 copies on the calling thread, as host_tier does.
  std::size_t threads = 2;
  /// Declared bandwidths for placement and the step's bound (bytes/s; 0: unknown).
  double read_bandwidth = 0;
  double write_bandwidth = 0;
};
// doc-snippet-end

/// Objects as memory-mapped files; the tier contract of strata/tier/tier.hpp. Not movable (it
/// owns threads and mappings): adaptors and multipath construct it in place.
class mmap_tier {
 public:
  explicit mmap_tier(mmap_tier_options o) : opts_(std::move(o)) {
    STRATA_EXPECTS(!opts_.directory.empty(), strata::config_error, "mmap_tier '{}': no directory given", opts_.name);
    std::error_code ec;
    std::filesystem::create_directories(opts_.directory, ec);
    if (ec) throw strata::io_error("mkdir", opts_.directory, ec.value());
    dir_fd_ = ::open(opts_.directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd_ < 0) throw strata::io_error("open", opts_.directory, errno);
    try {
      for (const auto& f : std::filesystem::directory_iterator(opts_.directory)) {
        const std::string name = f.path().filename().string();
        if (f.is_regular_file() && strata::is_object_name(name)) objects_.emplace(name, open_object(name, 0));
      }
      if (opts_.threads > 0) pool_ = std::make_unique<strata::thread_pool>(opts_.threads, opts_.name);
    } catch (...) {
      close_all();
      throw;
    }
  }
  ~mmap_tier() { close_all(); }
  mmap_tier(const mmap_tier&) = delete;
  mmap_tier& operator=(const mmap_tier&) = delete;

  // doc-snippet: write
  strata::completion write(std::string_view object, std::uint64_t offset, std::span<const std::byte> bytes) {
    std::byte* base = nullptr;
    try {
      const std::uint64_t end = strata::validate_write(opts_.name, object, offset, bytes.size());
      std::unique_lock lock(mutex_);
      auto it = objects_.find(object);
      const std::uint64_t had = it == objects_.end() ? 0 : it->second.size;
      if (end > had && used_ + (end - had) > opts_.capacity)  // refused before anything changes
        throw strata::over_budget_error(opts_.name, object, offset, bytes.size(), used_ + (end - had), opts_.capacity);
      const bool created = it == objects_.end();
      if (created) it = objects_.emplace(std::string(object), open_object(object, O_CREAT | O_TRUNC)).first;
      try {
        grow(it->first, it->second, end);
      } catch (...) {
        if (created) {  // a new object that could not be made leaves no trace
          ::unlink(path(object).c_str());
          forget(it);
        }
        throw;
      }
      base = it->second.base;
    } catch (...) {
      return strata::make_ready_completion(std::current_exception());  // errors travel in the future
    }
    // The mapping stays put without the lock: requests on one object never overlap a write.
    return copy(base + offset, bytes.data(), bytes.size());
  }
  // doc-snippet-end

  strata::completion read(std::string_view object, std::uint64_t offset, std::span<std::byte> dst) {
    const std::byte* base = nullptr;
    try {
      std::shared_lock lock(mutex_);
      const auto it = objects_.find(object);
      const auto size = it == objects_.end() ? std::nullopt : std::optional<std::uint64_t>(it->second.size);
      strata::check_read_range(opts_.name, object, offset, dst.size(), size);  // config_error past the end
      base = it->second.base;
    } catch (...) {
      return strata::make_ready_completion(std::current_exception());
    }
    return copy(dst.data(), base + offset, dst.size());
  }

  bool remove(std::string_view object) {
    std::unique_lock lock(mutex_);
    const auto it = objects_.find(object);
    if (it == objects_.end()) return false;
    if (::unlink(path(object).c_str()) != 0 && errno != ENOENT) throw strata::io_error("unlink", path(object), errno);
    forget(it);
    return true;
  }

  // doc-snippet: flush
  /// Writes back every dirty page and the directory entries: what was written before is durable.
  void flush() {
    std::shared_lock lock(mutex_);
    for (const auto& [name, o] : objects_)
      if (o.size > 0 && ::msync(o.base, o.size, MS_SYNC) != 0) throw strata::io_error("msync", path(name), errno);
    if (::fsync(dir_fd_) != 0) throw strata::io_error("fsync", opts_.directory, errno);
  }
  // doc-snippet-end

  [[nodiscard]] std::optional<std::uint64_t> size(std::string_view object) const {
    std::shared_lock lock(mutex_);
    const auto it = objects_.find(object);
    if (it == objects_.end()) return std::nullopt;
    return it->second.size;
  }
  [[nodiscard]] std::uint64_t capacity() const { return opts_.capacity; }
  [[nodiscard]] std::uint64_t used() const {
    std::shared_lock lock(mutex_);
    return used_;
  }
  [[nodiscard]] std::string_view name() const { return opts_.name; }
  [[nodiscard]] strata::tier_descriptor descriptor() const {
    return {opts_.name, strata::tier_kind::file, opts_.read_bandwidth, opts_.write_bandwidth, false};
  }

 private:
  struct mapped_file {
    int fd = -1;
    std::byte* base = nullptr;  // null while the file is empty (a mapping cannot be)
    std::uint64_t size = 0;
  };
  using object_map = std::map<std::string, mapped_file, std::less<>>;

  [[nodiscard]] std::filesystem::path path(std::string_view object) const { return opts_.directory / object; }

  // doc-snippet: copy
  // The copy of one request: on the pool, which completes the future from its thread, or here.
  strata::completion copy(std::byte* dst, const std::byte* src, std::size_t n) {
    if (pool_ == nullptr || n == 0) {
      if (n > 0) std::memcpy(dst, src, n);
      return strata::make_ready_completion();
    }
    strata::completion_promise done;
    strata::completion future = done.get_future();
    (void)pool_->submit([dst, src, n, done = std::move(done)]() mutable {
      std::memcpy(dst, src, n);
      done.set_value();
    });
    return future;
  }
  // doc-snippet-end

  // Opens (flags: O_CREAT | O_TRUNC for a new object) and maps the file of `object`.
  mapped_file open_object(std::string_view object, int flags) {
    mapped_file o;
    o.fd = ::open(path(object).c_str(), O_RDWR | O_CLOEXEC | flags, 0644);
    if (o.fd < 0) throw strata::io_error("open", path(object), errno);
    struct stat st {};
    if (::fstat(o.fd, &st) != 0) {
      const int err = errno;
      ::close(o.fd);
      throw strata::io_error("fstat", path(object), err);
    }
    try {
      grow(object, o, static_cast<std::uint64_t>(st.st_size));
    } catch (...) {
      ::close(o.fd);
      throw;
    }
    return o;
  }

  // Makes the file and its mapping `end` bytes long when they are shorter (never shrinks).
  void grow(std::string_view object, mapped_file& o, std::uint64_t end) {
    if (end <= o.size) return;
    struct stat st {};
    if (::fstat(o.fd, &st) != 0) throw strata::io_error("fstat", path(object), errno);
    if (static_cast<std::uint64_t>(st.st_size) < end) {
      // Blocks are reserved now: a store through the mapping can then never meet a full disk.
      if (const int err = ::posix_fallocate(o.fd, static_cast<off_t>(o.size), static_cast<off_t>(end - o.size));
          err != 0) {
        if (err == ENOSPC || err == EDQUOT)
          throw strata::capacity_error(fmt::format("tier '{}': no space for {} bytes of object '{}' in {}", opts_.name,
                                                   end, object, opts_.directory.string()),
                                       end - o.size);
        throw strata::io_error("posix_fallocate", path(object), o.size, err);
      }
    }
    void* m = o.base == nullptr ? ::mmap(nullptr, end, PROT_READ | PROT_WRITE, MAP_SHARED, o.fd, 0)
                                : ::mremap(o.base, o.size, end, MREMAP_MAYMOVE);
    if (m == MAP_FAILED) throw strata::io_error(o.base == nullptr ? "mmap" : "mremap", path(object), errno);
    o.base = static_cast<std::byte*>(m);
    used_ += end - o.size;
    o.size = end;
  }

  void forget(object_map::iterator it) noexcept {
    if (it->second.base != nullptr) ::munmap(it->second.base, it->second.size);
    ::close(it->second.fd);
    used_ -= it->second.size;
    objects_.erase(it);
  }

  void close_all() noexcept {
    pool_.reset();  // copies in flight finish before their mappings go
    while (!objects_.empty()) forget(objects_.begin());
    if (dir_fd_ >= 0) ::close(dir_fd_);
    dir_fd_ = -1;
  }

  mmap_tier_options opts_;
  int dir_fd_ = -1;
  mutable std::shared_mutex mutex_;  // guards objects_ and used_; the copies run outside it
  object_map objects_;
  std::uint64_t used_ = 0;
  std::unique_ptr<strata::thread_pool> pool_;
};

// doc-snippet: concept
static_assert(strata::tier<mmap_tier>);  // the compiler checks the interface; the typed suite, the contract
// doc-snippet-end

}  // namespace extending
