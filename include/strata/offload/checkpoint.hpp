#pragma once
/// Checkpoint files of offloaded_adamw: writing one (a data file with every subgroup's state,
/// fsync'ed, then the manifest published atomically) and reading one back with every byte
/// verified against the manifest's checksums. The manifest format is checkpoint_manifest's.
///
/// Crash safety: the data file has a fresh name per save and the manifest is replaced by rename
/// after the data is durable, so a crash at any point leaves the previous checkpoint loadable.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "strata/core/directory_lock.hpp"
#include "strata/core/error.hpp"
#include "strata/core/expects.hpp"
#include "strata/core/fs.hpp"
#include "strata/offload/checkpoint_manifest.hpp"
#include "strata/tier/checksummed.hpp"

namespace strata {

namespace detail {

inline std::string read_small_file(const std::filesystem::path& path) {
  auto fd = open_file(path, O_RDONLY | O_NONBLOCK);  // (a FIFO must not block the reader)
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error("read", path, text.size(), errno);
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > (64u << 20))
      throw integrity_error("checkpoint", path.string(), 0, "manifest refused: larger than 64 MiB");
  }
  return text;
}

inline void pread_all(int fd, std::span<std::byte> dst, std::uint64_t offset, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < dst.size()) {
    const ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error("pread", path, offset + done, errno);
    }
    if (n == 0) throw integrity_error("checkpoint", path.string(), offset + done, "data file ends early (truncated)");
    done += static_cast<std::size_t>(n);
  }
}

inline void pwrite_all(int fd, std::span<const std::byte> src, std::uint64_t offset, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < src.size()) {
    const ssize_t n = ::pwrite(fd, src.data() + done, src.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_write_error("pwrite", path, offset + done, errno);
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace detail

/// The verified manifest of the checkpoint in `dir`.
[[nodiscard]] inline checkpoint_manifest read_checkpoint_manifest(const std::filesystem::path& dir) {
  const auto path = dir / "manifest";
  return checkpoint_manifest::parse(detail::read_small_file(path), path.string());
}

namespace detail {

/// Whether `name` has the form of a data file write_checkpoint creates (state-<step>-<16 hex>.bin).
[[nodiscard]] inline bool is_checkpoint_data_name(std::string_view name) {
  constexpr std::string_view head = "state-", tail = ".bin";
  if (name.size() < head.size() + 1 + 1 + 16 + tail.size() || !name.starts_with(head) || !name.ends_with(tail))
    return false;
  const std::string_view mid = name.substr(head.size(), name.size() - head.size() - tail.size());
  const auto dash = mid.find('-');
  if (dash == 0 || dash == std::string_view::npos || mid.size() - dash - 1 != 16) return false;
  const auto all = [](std::string_view v, auto pred) { return std::all_of(v.begin(), v.end(), pred); };
  return all(mid.substr(0, dash), [](char c) { return c >= '0' && c <= '9'; }) &&
         all(mid.substr(dash + 1), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// The file naming the data files of saves in progress (read by the next save).
inline constexpr std::string_view checkpoint_journal = "manifest.pending";

}  // namespace detail

/// Writes a checkpoint into `dir` (created if missing): `m` gives step, layout and options;
/// `visit(fn)` must call fn(s, std::span<const std::byte> state) for every subgroup s in order.
/// Once the new manifest is durable, the data file of the checkpoint it replaces and those of
/// saves that were killed are removed, and nothing else: every data file is named in a journal
/// (manifest.pending) before it is created, so only files this function created are ever
/// removed, whatever else the directory holds.
///
/// The directory is locked while the save runs (directory_lock): a second save into it, from
/// any process, is a busy_error naming the holder. A full device is a capacity_error, and a
/// failed save leaves nothing of itself behind (its data file is removed, the journal restored).
template <class Visit>
void write_checkpoint(const std::filesystem::path& dir, checkpoint_manifest m, std::size_t subgroups, Visit&& visit) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw io_error("mkdir", dir, ec.value());
  const directory_lock owner(dir, fmt::format("a checkpoint save of step {}", m.step));
  // What this save may remove afterwards: the replaced checkpoint's data file, and data files of
  // saves that never published their manifest (journaled; only names of our own form count).
  std::vector<std::string> ours;
  try {
    ours.push_back(read_checkpoint_manifest(dir).data_file);
  } catch (const error&) {  // none, or unreadable: nothing of it is touched
  }
  const auto journal = dir / detail::checkpoint_journal;
  std::optional<std::string> old_journal;
  if (struct stat st {}; ::lstat(journal.c_str(), &st) == 0) {
    old_journal = detail::read_small_file(journal);
    for (std::size_t pos = 0; pos < old_journal->size();) {
      const auto nl = std::min(old_journal->find('\n', pos), old_journal->size());
      if (const auto name = old_journal->substr(pos, nl - pos); detail::is_checkpoint_data_name(name))
        ours.push_back(name);
      pos = nl + 1;
    }
  }
  // A fresh name, created new (never an existing file, never through a symlink).
  std::random_device rd;
  unique_fd fd;
  std::filesystem::path data_path;
  bool created = false;
  const auto undo = [&]() noexcept {  // a failed save leaves nothing of itself
    fd.reset();
    if (created) ::unlink(data_path.c_str());
    try {
      if (old_journal)
        write_file_atomic(journal, *old_journal, durability::fsync);
      else
        ::unlink(journal.c_str());
    } catch (const error&) {  // (it names only files of ours, which the next save clears)
    }
  };
  try {
    for (int attempt = 0; !created; ++attempt) {
      m.data_file = fmt::format("state-{}-{:08x}{:08x}.bin", m.step, rd(), rd());
      data_path = dir / m.data_file;
      std::string text;
      for (const auto& n : ours) text += n + "\n";
      write_file_atomic(journal, text + m.data_file + "\n", durability::fsync);
      try {
        fd = open_own_file(data_path, O_WRONLY | O_CREAT | O_EXCL);
        created = true;
      } catch (const foreign_file_error&) {  // someone's file has that name: it stays, take another
        if (attempt > 8) throw;
      }
    }
  } catch (...) {
    undo();
    throw;
  }
  try {
    std::uint64_t offset = 0;
    m.checksums.assign(subgroups, 0);
    m.subgroup_bytes.assign(subgroups, 0);
    std::size_t expected = 0;
    visit([&](std::size_t s, std::span<const std::byte> bytes) {
      STRATA_ASSERT(s == expected);
      ++expected;
      m.checksums[s] = checksum64(bytes);
      m.subgroup_bytes[s] = bytes.size();
      detail::pwrite_all(fd.get(), bytes, offset, data_path);
      offset += bytes.size();
    });
    m.data_bytes = offset;
    sync_file(fd.get(), data_path);
    fd.close(data_path);
    write_file_atomic(dir / "manifest", m.to_text(), durability::fsync);
  } catch (...) {
    bool published = false;  // the rename happened and a later sync failed: the data file is live
    try {
      published = read_checkpoint_manifest(dir).data_file == m.data_file;
    } catch (const error&) {
    }
    if (!published) undo();
    throw;
  }
  // The new checkpoint is durable: the one it replaced and leftovers of killed saves can go, if
  // they are still files of ours (a symlink or a hard link put there is left alone).
  for (const auto& name : ours) {
    if (name == m.data_file || !detail::is_checkpoint_data_name(name)) continue;
    const auto path = dir / name;
    if (struct stat st {}; ::lstat(path.c_str(), &st) == 0 && detail::not_own_reason(st).empty()) ::unlink(path.c_str());
  }
  ::unlink(journal.c_str());
}

/// Reads the subgroups of a checkpoint back, each verified against its checksum.
class checkpoint_reader {
 public:
  /// Opens the checkpoint in `dir` and checks that its data file has the size the manifest says
  /// and that the manifest's subgroups have `state_bytes(s)` bytes each (integrity_error if not;
  /// io_error when files are missing).
  template <class StateBytes>
  checkpoint_reader(const std::filesystem::path& dir, checkpoint_manifest m, std::size_t subgroups,
                    StateBytes&& state_bytes)
      : manifest_(std::move(m)), data_path_(dir / manifest_.data_file), fd_(open_file(data_path_, O_RDONLY)) {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw io_error("fstat", data_path_, errno);
    if (static_cast<std::uint64_t>(st.st_size) != manifest_.data_bytes)
      throw integrity_error("checkpoint", data_path_.string(), static_cast<std::uint64_t>(st.st_size),
                            fmt::format("data file has {} bytes, the manifest says {} (truncated?)", st.st_size,
                                        manifest_.data_bytes));
    if (manifest_.subgroup_bytes.size() != subgroups)
      throw integrity_error("checkpoint", data_path_.string(), 0, "subgroup count does not match the layout");
    std::uint64_t offset = 0;
    for (std::size_t s = 0; s < subgroups; ++s) {
      offsets_.push_back(offset);
      if (manifest_.subgroup_bytes[s] != state_bytes(s))
        throw integrity_error("checkpoint", data_path_.string(), offset,
                              fmt::format("subgroup {} has {} bytes, the layout needs {}", s, manifest_.subgroup_bytes[s],
                                          state_bytes(s)));
      offset += manifest_.subgroup_bytes[s];
    }
  }

  /// Fills `dst` (the subgroup's size) with subgroup `s`'s state; integrity_error on a mismatch.
  void read(std::size_t s, std::span<std::byte> dst) const {
    detail::pread_all(fd_.get(), dst, offsets_.at(s), data_path_);
    const auto sum = checksum64(dst);
    if (sum != manifest_.checksums[s])
      throw integrity_error("checkpoint", fmt::format("{} (subgroup {})", data_path_.string(), s), offsets_[s],
                            manifest_.checksums[s], sum);
  }
  [[nodiscard]] const checkpoint_manifest& manifest() const noexcept { return manifest_; }

 private:
  checkpoint_manifest manifest_;
  std::filesystem::path data_path_;
  unique_fd fd_;
  std::vector<std::uint64_t> offsets_;
};

/// Reads every byte of the checkpoint in `dir` and checks it against the manifest's checksums,
/// without loading it anywhere (one subgroup's worth of memory): integrity_error names the first
/// damaged subgroup, io_error a missing file. For a caller that must not give up a running
/// optimizer for a checkpoint that turns out to be damaged half-way through loading it.
inline checkpoint_manifest verify_checkpoint(const std::filesystem::path& dir) {
  auto m = read_checkpoint_manifest(dir);
  const std::size_t subgroups = m.subgroup_bytes.size();
  const checkpoint_reader reader(dir, m, subgroups, [&](std::size_t s) { return m.subgroup_bytes[s]; });
  std::uint64_t largest = 0;
  for (const auto b : m.subgroup_bytes) largest = std::max(largest, b);
  std::vector<std::byte> buf(static_cast<std::size_t>(largest));
  for (std::size_t s = 0; s < subgroups; ++s)
    reader.read(s, std::span<std::byte>(buf.data(), static_cast<std::size_t>(m.subgroup_bytes[s])));
  return m;
}

}  // namespace strata
