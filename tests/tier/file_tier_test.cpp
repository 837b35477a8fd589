// What only file_tier does: O_DIRECT with its fallback, bounce buffers and read-modify-write at
// unaligned edges, chunking, syscall failures and retries, and reopening a directory.
#include <doctest/doctest.h>

#include <sys/mount.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "tier_fixtures.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace file_tier_test {

using namespace strata_test;
using namespace std::chrono_literals;

namespace {

// Captures strata::notice lines for one scope.
struct notice_capture {
  notice_capture() {
    strata::set_notice_handler([this](std::string_view s) {
      std::lock_guard lock(mutex);
      lines.emplace_back(s);
    });
  }
  ~notice_capture() { strata::set_notice_handler({}); }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return lines.size();
  }
  std::mutex mutex;
  std::vector<std::string> lines;
};

// Syscall hooks: plain functions (the hook holds function pointers), steered by globals.
std::atomic<int> g_calls{0};
std::atomic<std::size_t> g_max_transfer{0};  // 0: no limit
std::atomic<int> g_fail_errno{0};            // injected on every call when set
std::atomic<bool> g_interrupt{false};        // every third call fails with EINTR, every fifth EAGAIN

ssize_t hooked(bool write, int fd, void* buf, std::size_t n, off_t off) {
  const int k = g_calls.fetch_add(1) + 1;
  if (const int e = g_fail_errno.load(); e != 0) {
    errno = e;
    return -1;
  }
  if (g_interrupt.load() && k % 3 == 0) {
    errno = EINTR;
    return -1;
  }
  if (g_interrupt.load() && k % 5 == 0) {
    errno = EAGAIN;
    return -1;
  }
  if (const auto m = g_max_transfer.load(); m != 0 && n > m) n = m;
  return write ? ::pwrite(fd, buf, n, off) : ::pread(fd, buf, n, off);
}
ssize_t hooked_pread(int fd, void* b, std::size_t n, off_t o) { return hooked(false, fd, b, n, o); }
ssize_t hooked_pwrite(int fd, const void* b, std::size_t n, off_t o) {
  return hooked(true, fd, const_cast<void*>(b), n, o);
}

strata::file_tier_options hooked_opts(const fs::path& dir, bool direct) {
  auto o = file_opts(dir, strata::io_backend::posix, strata::unlimited_capacity, "hooked");
  o.direct = direct;
  o.syscalls = {hooked_pread, hooked_pwrite};
  return o;
}

void reset_hooks() {
  g_calls = 0;
  g_max_transfer = 0;
  g_fail_errno = 0;
  g_interrupt = false;
}

}  // namespace

namespace {
// ramfs refuses O_DIRECT (tmpfs takes it since Linux 6.6). Mounting needs root; when that is
// not allowed the refusal is simulated through the open hook instead.
class ramfs_mount {
 public:
  ramfs_mount() {
    if (::mount("none", dir_.path().c_str(), "ramfs", 0, nullptr) == 0) mounted_ = true;
  }
  ~ramfs_mount() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  ramfs_mount(const ramfs_mount&) = delete;
  ramfs_mount& operator=(const ramfs_mount&) = delete;
  [[nodiscard]] bool mounted() const { return mounted_; }
  [[nodiscard]] const fs::path& path() const { return dir_.path(); }

 private:
  temp_dir dir_{fs::temp_directory_path(), "ramfs"};
  bool mounted_ = false;
};

int refuse_direct(const char* path, int flags, mode_t mode) {
  if ((flags & O_DIRECT) != 0) {
    errno = EINVAL;
    return -1;
  }
  return ::open(path, flags, mode);
}

void check_fallback(const fs::path& dir, strata::file_syscalls calls) {
  notice_capture notes;
  auto o = file_opts(dir, strata::io_backend::automatic, strata::unlimited_capacity, "nodirect");
  o.syscalls = calls;
  strata::file_tier t(o);
  CHECK_FALSE(t.direct_io());
  CHECK(t.cpu_copies());  // buffered: the io_uring engine hands every transfer to kernel workers
  for (int i = 0; i < 5; ++i) {
    const auto data = random_bytes(5000 + i, i);
    t.write(fmt::format("o{}", i), 0, data).get();
    std::vector<std::byte> back(data.size());
    t.read(fmt::format("o{}", i), 0, back).get();
    CHECK(back == data);
  }
  REQUIRE(notes.count() == 1);  // once per tier, not once per request
  CHECK(notes.lines[0].find("does not support O_DIRECT") != std::string::npos);
  CHECK(notes.lines[0].find(dir.string()) != std::string::npos);
}
}  // namespace

TEST_CASE("a filesystem that refuses O_DIRECT gets buffered I/O, reported once") {
  temp_dir dir;
  check_fallback(dir.path(), strata::file_syscalls{.open = refuse_direct});
  ramfs_mount ramfs;
  if (ramfs.mounted()) {
    check_fallback(ramfs.path(), strata::file_syscalls{});
  } else {
    MESSAGE("ramfs could not be mounted here (not root?): only the simulated refusal was tested");
  }
}

TEST_CASE("/dev/shm works whether or not its kernel takes O_DIRECT, its transfers are CPU copies, and the root filesystem takes O_DIRECT") {
  notice_capture notes;
  temp_dir shm("/dev/shm", "shm");
  strata::file_tier t(file_opts(shm.path(), strata::io_backend::automatic, strata::unlimited_capacity, "shm"));
  const auto data = random_bytes(70000, 3);
  t.write("x", 0, data).get();
  std::vector<std::byte> back(data.size());
  t.read("x", 0, back).get();
  CHECK(back == data);
  CHECK(notes.count() == (t.direct_io() ? 0U : 1U));
  CHECK(t.cpu_copies());  // tmpfs copies even under O_DIRECT: never inline in the caller's thread
  const std::string mode = t.direct_io() ? "yes" : "no (buffered fallback)";
  MESSAGE("/dev/shm O_DIRECT: " << mode);
  temp_dir disk;
  strata::file_tier d(file_opts(disk.path(), strata::io_backend::automatic, strata::unlimited_capacity));
  CHECK(d.direct_io());
  CHECK_FALSE(d.cpu_copies());
}

TEST_CASE("unaligned overwrites keep the neighbouring bytes (read-modify-write of edge blocks)") {
  for (auto backend : {strata::io_backend::posix, strata::io_backend::uring}) {
    temp_dir dir;
    strata::file_tier t(file_opts(dir.path(), backend, strata::unlimited_capacity));
    REQUIRE(t.direct_io());
    auto data = random_bytes(10000, 1);
    t.write("obj", 0, data).get();
    for (auto [off, len] : {std::pair{5000, 100}, std::pair{4000, 200}, std::pair{0, 1}, std::pair{9999, 1}}) {
      const auto patch = random_bytes(len, off);
      t.write("obj", off, patch).get();
      std::memcpy(data.data() + off, patch.data(), len);
    }
    std::vector<std::byte> back(data.size());
    t.read("obj", 0, back).get();
    CHECK(back == data);
    CHECK(fs::file_size(t.path_of("obj")) == 10000);  // padding past the end was truncated away
    const auto tail = random_bytes(300, 9);           // growing from an unaligned end
    t.write("obj", 10000, tail).get();
    CHECK(fs::file_size(t.path_of("obj")) == 10300);
  }
}

TEST_CASE("the io_uring and POSIX engines write the same files and read each other's") {
  temp_dir dir;
  const auto data = random_bytes(3 * test_chunk + 4097, 42);
  {
    strata::file_tier u(file_opts(dir.path(), strata::io_backend::uring, strata::unlimited_capacity));
    CHECK(u.engine() == "io_uring");
    u.write("x", 0, data).get();
  }
  strata::file_tier p(file_opts(dir.path(), strata::io_backend::posix, strata::unlimited_capacity));
  CHECK(p.engine() == "posix");
  std::vector<std::byte> back(data.size());
  p.read("x", 0, back).get();
  CHECK(back == data);
}

TEST_CASE("reopening a directory finds the objects an earlier run left") {
  temp_dir dir;
  const auto data = random_bytes(12345, 3);
  {
    strata::file_tier a(file_opts(dir.path(), strata::io_backend::automatic, strata::unlimited_capacity));
    a.write("sg-0", 0, data).get();
    a.flush();
  }
  strata::file_tier b(file_opts(dir.path(), strata::io_backend::automatic, strata::unlimited_capacity));
  CHECK(b.size("sg-0") == data.size());
  CHECK(b.used() == data.size());
  std::vector<std::byte> back(data.size());
  b.read("sg-0", 0, back).get();
  CHECK(back == data);
}

TEST_CASE("short transfers are completed, and EINTR and EAGAIN retried") {
  for (bool direct : {false, true}) {
    CAPTURE(direct);
    reset_hooks();
    g_max_transfer = direct ? 4096 : 1000;  // O_DIRECT devices stop on block boundaries
    g_interrupt = true;
    temp_dir dir;
    strata::file_tier t(hooked_opts(dir.path(), direct));
    const auto data = random_bytes(2 * test_chunk + 12345, 5);
    t.write("obj", 0, data).get();
    std::vector<std::byte> back(data.size());
    t.read("obj", 0, back).get();
    CHECK(back == data);
    CHECK(g_calls.load() > static_cast<int>(2 * data.size() / g_max_transfer.load()));  // it really was split
    reset_hooks();
  }
}

TEST_CASE("ENOSPC and EDQUOT are capacity errors; other failures are io_errors naming path, offset and errno") {
  temp_dir dir;
  strata::file_tier t(hooked_opts(dir.path(), true));
  reset_hooks();
  t.write("fine", 0, random_bytes(5000, 1)).get();
  for (int e : {ENOSPC, EDQUOT}) {
    g_fail_errno = e;
    try {
      t.write("full", 0, random_bytes(5000, 2)).get();
      FAIL("write succeeded");
    } catch (const strata::capacity_error& err) {
      const std::string msg = err.what();
      CHECK(msg.find(t.path_of("full").string()) != std::string::npos);
      CHECK(msg.find(std::strerror(e)) != std::string::npos);
    }
  }
  g_fail_errno = EIO;
  try {
    t.write("broken", 8192, random_bytes(4096, 3)).get();
    FAIL("write succeeded");
  } catch (const strata::io_error& err) {
    CHECK(err.path() == t.path_of("broken"));
    CHECK(err.offset() == 8192);
    CHECK(err.error_number() == EIO);
    CHECK(std::string(err.what()).find(std::strerror(EIO)) != std::string::npos);
  }
  std::vector<std::byte> back(5000);
  CHECK_THROWS_AS(t.read("fine", 0, back).get(), strata::io_error);
  reset_hooks();
  t.read("fine", 0, back).get();  // untouched by the failures around it
  CHECK(back == random_bytes(5000, 1));
  CHECK(t.used() >= 5000);
}

TEST_CASE("a large request is split into chunks that are in flight together") {
  static std::atomic<int> inflight{0}, peak{0};
  struct slow {
    static ssize_t pread(int fd, void* b, std::size_t n, off_t o) {
      const int now = inflight.fetch_add(1) + 1;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {
      }
      // Hold this chunk until a second one is in flight (bounded: a serial engine fails the test).
      for (int i = 0; i < 2000 && peak.load() < 2; ++i) std::this_thread::sleep_for(1ms);
      const ssize_t r = ::pread(fd, b, n, o);
      inflight.fetch_sub(1);
      return r;
    }
  };
  temp_dir dir;
  auto o = file_opts(dir.path(), strata::io_backend::posix, strata::unlimited_capacity);
  o.syscalls.pread = slow::pread;
  strata::file_tier t(o);
  const auto data = random_bytes(8 * test_chunk, 8);
  t.write("big", 0, data).get();
  std::vector<std::byte> back(data.size());
  t.read("big", 0, back).get();
  CHECK(back == data);
  CHECK(peak.load() >= 2);
}

TEST_CASE("a directory that cannot be created is an io_error naming it") {
  temp_dir dir;
  const auto file = dir / "plain-file";
  strata::write_file_atomic(file, "x");
  try {
    strata::file_tier t(file_opts(file / "sub", strata::io_backend::automatic, strata::unlimited_capacity));
    FAIL("a tier was made under a regular file");
  } catch (const strata::io_error& e) {
    CHECK(std::string(e.what()).find("plain-file/sub") != std::string::npos);
  }
}

TEST_CASE("flush syncs what was written and tolerates objects removed meanwhile") {
  temp_dir dir;
  strata::file_tier t(file_opts(dir.path(), strata::io_backend::automatic, strata::unlimited_capacity));
  t.write("a", 0, random_bytes(100, 1)).get();
  t.write("b", 0, random_bytes(100, 2)).get();
  fs::remove(t.path_of("b"));  // gone behind the tier's back
  CHECK_NOTHROW(t.flush());
  CHECK(t.remove("a"));
  CHECK_NOTHROW(t.flush());
}

TEST_CASE("chunk size and backend come from STRATA_* variables, validated") {
  temp_dir dir;
  ::setenv("STRATA_IO_BACKEND", "posix", 1);
  {
    strata::file_tier_options o;
    o.directory = dir.path();
    strata::file_tier t(o);
    CHECK(t.engine() == "posix");
  }
  ::setenv("STRATA_IO_BACKEND", "aio", 1);
  CHECK_THROWS_WITH_AS(strata::file_tier_options{}, doctest::Contains("STRATA_IO_BACKEND=\"aio\""),
                       strata::config_error);
  ::unsetenv("STRATA_IO_BACKEND");
  ::setenv("STRATA_CHUNK_BYTES", "5000", 1);
  {
    strata::file_tier_options o;
    o.directory = dir.path();
    CHECK_THROWS_WITH_AS(strata::file_tier{o}, doctest::Contains("chunk_bytes 5000 is not a positive multiple of 4096"),
                         strata::config_error);
  }
  ::unsetenv("STRATA_CHUNK_BYTES");
}

TEST_CASE("requests in registered buffers use io_uring fixed-buffer operations and round-trip") {
  temp_dir dir;
  strata::file_tier t(file_opts(dir.path(), strata::io_backend::uring, strata::unlimited_capacity));
  strata::direct_io_buffer slot(4 * test_chunk);
  const std::span<std::byte> slots[] = {slot.bytes()};
  REQUIRE(t.register_buffers(slots));
  const auto data = random_bytes(slot.size(), 77);
  std::memcpy(slot.data(), data.data(), data.size());
  t.write("fixed", 0, slot.bytes()).get();
  std::memset(slot.data(), 0, slot.size());
  t.read("fixed", 0, slot.bytes()).get();
  CHECK(std::memcmp(slot.data(), data.data(), data.size()) == 0);
  CHECK(t.fixed_operations() == 8);  // 4 chunks written, 4 read
  std::vector<std::byte> elsewhere(data.size());
  t.read("fixed", 0, elsewhere).get();  // memory outside the registration: ordinary operations
  CHECK(elsewhere == data);
  CHECK(t.fixed_operations() == 8);
  CHECK(t.register_buffers({}));  // unregister

  temp_dir pdir;
  strata::file_tier p(file_opts(pdir.path(), strata::io_backend::posix, strata::unlimited_capacity));
  CHECK_FALSE(p.register_buffers(slots));
}

TEST_CASE("a host tier with locked memory keeps it in RAM or says why it cannot") {
  strata::host_tier_options o{.name = "locked", .capacity = strata::unlimited_capacity};
  o.memory.lock = true;
  strata::host_tier t(o);
  CHECK(t.memory_kind() == strata::host_memory_kind::locked);
  try {
    t.write("x", 0, random_bytes(64 * 1024, 1)).get();
    std::vector<std::byte> back(64 * 1024);
    t.read("x", 0, back).get();
    CHECK(back == random_bytes(64 * 1024, 1));
  } catch (const strata::capacity_error& e) {  // RLIMIT_MEMLOCK too low here: a typed, explained error
    CHECK(std::string(e.what()).find("RLIMIT_MEMLOCK") != std::string::npos);
  }
}

TEST_CASE("a device too full for a growing write is a capacity_error before any byte is written") {
  struct full {
    static int fallocate(int, int, off_t, off_t) {
      errno = ENOSPC;
      return -1;
    }
  };
  temp_dir dir;
  auto o = file_opts(dir.path(), strata::io_backend::automatic, strata::unlimited_capacity, "full");
  o.syscalls.fallocate = full::fallocate;
  {
    strata::file_tier t(o);
    CHECK_THROWS_WITH_AS(t.write("big", 0, random_bytes(10000, 1)).get(), doctest::Contains("fallocate"),
                         strata::capacity_error);
    CHECK(t.size("big").value_or(0) == 0);
    CHECK(t.used() == 0);
  }  // (one tier per directory at a time)
  struct unsupported {
    static int fallocate(int, int, off_t, off_t) {
      errno = EOPNOTSUPP;
      return -1;
    }
  };
  o.syscalls.fallocate = unsupported::fallocate;  // e.g. some network filesystems: written as they are
  strata::file_tier u(o);
  const auto data = random_bytes(10000, 2);
  u.write("ok", 0, data).get();
  std::vector<std::byte> back(data.size());
  u.read("ok", 0, back).get();
  CHECK(back == data);
}

}  // namespace file_tier_test
