#pragma once
/// Checkpoint files of offloaded_adamw: writing one (a data file with every subgroup's state,
/// fsync'ed, then the manifest published atomically) and reading one back with every byte
/// verified against the manifest's checksums. The manifest format is checkpoint_manifest's.
///
/// Crash safety: the data file has a fresh name per save and the manifest is replaced by rename
/// after the data is durable, so a crash at any point leaves the previous checkpoint loadable.
///
/// Ownership: a checkpoint directory may hold anything else (it may be a user's folder, or a
/// symlink to one). Every file a save creates is named in the directory's journal before it
/// exists (".strata-objects.checkpoint", tier/detail/object_journal.hpp), so a killed save's
/// files are known for strata's by the next one; a file no journal names is never written,
/// renamed over or removed, and a user's "manifest" where a save would put its own is refused
/// with foreign_file_error naming it.

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
#include "strata/core/notice.hpp"
#include "strata/tier/checksummed.hpp"
#include "strata/tier/detail/object_journal.hpp"

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

/// Whether `name` has the form of the manifest a save writes before it renames it (manifest.<16 hex>.tmp).
[[nodiscard]] inline bool is_checkpoint_manifest_temp_name(std::string_view name) {
  constexpr std::string_view head = "manifest.", tail = ".tmp";
  if (name.size() != head.size() + 16 + tail.size() || !name.starts_with(head) || !name.ends_with(tail)) return false;
  const auto hex = name.substr(head.size(), 16);
  return std::all_of(hex.begin(), hex.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// The scope of the journal of a checkpoint directory (".strata-objects.checkpoint", in
/// object_journal's format): every file a save creates there is named in it before it exists.
inline constexpr std::string_view checkpoint_journal_scope = "checkpoint";

[[nodiscard]] inline std::filesystem::path checkpoint_journal_path(const std::filesystem::path& dir) {
  return dir / fmt::format("{}.{}", object_journal::file_name, checkpoint_journal_scope);
}

/// Why the file at `path` cannot be strata's ("" when it can; nullopt when there is none).
[[nodiscard]] inline std::optional<std::string> not_own_file_at(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    throw io_error("lstat", path, errno);
  }
  return not_own_reason(st);
}

/// The files of strata's in a checkpoint directory (locked by the caller): those its journal
/// names that are still strata's (regular files of this user with one link), and, where no
/// journal names the manifest, a checkpoint strata wrote without one (an earlier release) when
/// it proves itself: its manifest parses (its own checksum line) and is taken as strata's, and
/// its data file too when every byte matches the manifest. Anything else is not strata's.
class checkpoint_files {
 public:
  using names = object_journal::names;

  /// Opens the journal of `dir`, creating it when `create` (else only reads one that is there).
  checkpoint_files(const std::filesystem::path& dir, bool create) : dir_(dir) {
    const auto path = checkpoint_journal_path(dir);
    const bool existed = not_own_file_at(path).has_value();
    if (existed || create) {
      try {
        journal_ = object_journal(dir, checkpoint_journal_scope);
      } catch (const foreign_file_error&) {
        throw;
      } catch (...) {  // (a full disk while writing its header): no empty journal is left
        if (!existed) ::unlink(path.c_str());
        throw;
      }
      created_ = !existed;
      for (const auto& n : journal_.recorded())
        if (n.find('/') != std::string::npos || n == "." || n == "..") continue;  // (never outside `dir`)
        else if (const auto why = not_own_file_at(dir / n); why && why->empty()) live_.insert(n);
    }
    if (live_.contains("manifest")) return;
    const auto manifest = dir / "manifest";
    const auto why = not_own_file_at(manifest);
    if (!why) return;
    if (!why->empty()) {
      foreign_ = *why;
      return;
    }
    try {
      const auto m = read_checkpoint_manifest(dir);
      adopted_.insert("manifest");
      const auto data = not_own_file_at(dir / m.data_file);
      if (data && data->empty() && is_checkpoint_data_name(m.data_file)) {
        (void)verify_checkpoint(dir);
        adopted_.insert(m.data_file);
      }
    } catch (const error&) {  // not a strata manifest, or its data does not prove itself: left alone
      if (!adopted_.contains("manifest")) foreign_ = "a file that is not a strata checkpoint manifest";
    }
  }

  /// Throws foreign_file_error naming the manifest when it is there and not strata's.
  void require_own_manifest() const {
    if (foreign_) throw_not_own(dir_ / "manifest", *foreign_);
  }
  /// Strata's files here (journaled or proven).
  [[nodiscard]] names ours() const {
    names all = live_;
    all.insert(adopted_.begin(), adopted_.end());
    return all;
  }
  /// Files proven strata's that the journal does not name yet.
  [[nodiscard]] const names& adopted() const noexcept { return adopted_; }
  [[nodiscard]] bool journaled(std::string_view name) const { return live_.contains(name); }
  [[nodiscard]] object_journal& journal() noexcept { return journal_; }
  /// Whether this object created the journal file.
  [[nodiscard]] bool created_journal() const noexcept { return created_; }

 private:
  std::filesystem::path dir_;
  object_journal journal_;
  bool created_ = false;
  names live_, adopted_;
  std::optional<std::string> foreign_;
};

/// Creates `path`, new, with `text`, fsync'ed (a file of strata's own: never an existing one).
inline void write_new_file(const std::filesystem::path& path, std::string_view text) {
  auto fd = open_own_file(path, O_WRONLY | O_CREAT | O_EXCL);
  write_all(fd.get(), std::as_bytes(std::span(text.data(), text.size())), path);
  sync_file(fd.get(), path);
  fd.close(path);
}

inline void sync_directory(const std::filesystem::path& dir) {
  auto dfd = open_file(dir, O_RDONLY | O_DIRECTORY);
  sync_file(dfd.get(), dir);
}

}  // namespace detail

/// Writes a checkpoint into `dir` (created if missing): `m` gives step, layout and options;
/// `visit(fn)` must call fn(s, std::span<const std::byte> state) for every subgroup s in order.
///
/// The directory is strata's only in part: every file a save creates (data files, the
/// manifest, its temporaries) is named in the directory's journal (".strata-objects.checkpoint")
/// before it exists, and only those are ever replaced or removed. A manifest that the journal
/// does not name is refused with foreign_file_error naming it and left as it is, unless it proves
/// itself a strata checkpoint (one written before checkpoints had a journal; see
/// detail::checkpoint_files). Once the new manifest is durable, the data file of the checkpoint
/// it replaces and what killed saves left are removed; any other file stays, whatever its name.
///
/// The directory is locked while the save runs (directory_lock): a second save into it, from
/// any process, is a busy_error naming the holder. A full device is a capacity_error, and a
/// failed save leaves the directory as it was (the directories it created are removed too).
template <class Visit>
void write_checkpoint(const std::filesystem::path& dir, checkpoint_manifest m, std::size_t subgroups, Visit&& visit) {
  created_directories made;
  made.create(dir);
  std::optional<directory_lock> owner;
  std::optional<detail::checkpoint_files> files;
  std::random_device rd;
  unique_fd fd;
  std::filesystem::path data_path, temp_path;
  bool data_created = false, temp_created = false, renamed = false, named_manifest = false;
  const auto undo = [&]() noexcept {  // a failed save leaves nothing of itself
    fd.reset();
    if (temp_created) ::unlink(temp_path.c_str());
    if (data_created) ::unlink(data_path.c_str());
    if (files && files->created_journal()) {
      files->journal().remove_file();  // it named only what this save made, all gone now
    } else if (files) {
      try {  // (a line that stays only names a file that is not there)
        if (temp_created) files->journal().removed(temp_path.filename().string());
        if (data_created) files->journal().removed(m.data_file);
        if (named_manifest) files->journal().removed("manifest");
      } catch (const error&) {
      }
    }
    files.reset();
    owner.reset();
    made.remove_empty();
  };
  try {
    owner.emplace(dir, fmt::format("a checkpoint save of step {}", m.step));
    files.emplace(dir, true);
    files->require_own_manifest();
    auto& journal = files->journal();
    // A fresh name, journaled and then created new (never an existing file, never through a symlink).
    for (int attempt = 0; !data_created; ++attempt) {
      m.data_file = fmt::format("state-{}-{:08x}{:08x}.bin", m.step, rd(), rd());
      data_path = dir / m.data_file;
      journal.created(m.data_file);
      journal.sync();
      try {
        fd = open_own_file(data_path, O_WRONLY | O_CREAT | O_EXCL);
        data_created = true;
      } catch (const foreign_file_error&) {  // someone's file has that name: it stays, take another
        journal.removed(m.data_file);
        if (attempt > 8) throw;
      }
    }
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
    // The manifest: written under a fresh name, then renamed over the previous one (strata's).
    const std::string temp_name = fmt::format("manifest.{:08x}{:08x}.tmp", rd(), rd());
    temp_path = dir / temp_name;
    journal.created(temp_name);
    for (const auto& n : files->adopted()) journal.created(n);  // proven strata's: now journaled
    if (!files->journaled("manifest") && !files->adopted().contains("manifest")) {
      journal.created("manifest");
      named_manifest = true;
    }
    journal.sync();
    temp_created = true;  // (from here on, whether or not the open gets that far)
    try {
      detail::write_new_file(temp_path, m.to_text());
    } catch (const foreign_file_error&) {
      temp_created = false;  // not ours: stays
      throw;
    }
    if (::rename(temp_path.c_str(), (dir / "manifest").c_str()) != 0)
      throw io_error("rename to " + (dir / "manifest").string(), temp_path, errno);
    renamed = true;
    detail::sync_directory(dir);
  } catch (...) {
    if (!renamed) undo();  // (renamed: the new checkpoint is live, its data file stays)
    throw;
  }
  // The new checkpoint is durable: the one it replaced and leftovers of killed saves can go, if
  // they are still files of ours (a symlink or a hard link put there is left alone).
  for (const auto& name : files->ours()) {
    if (name == m.data_file) continue;
    if (!detail::is_checkpoint_data_name(name) && !detail::is_checkpoint_manifest_temp_name(name)) continue;
    if (const auto why = detail::not_own_file_at(dir / name); why && why->empty()) ::unlink((dir / name).c_str());
  }
  try {
    files->journal().rewrite({"manifest", m.data_file});
  } catch (const error& e) {  // its appended lines still name every file of ours: only longer
    notice(fmt::format("checkpoint {}: {}", dir.string(), e.what()));
  }
}

/// Removes the checkpoint in `dir` (a retention policy's older one): the files its journal names
/// (manifest, data file, what killed saves left) and the journal; a checkpoint written without a
/// journal (by an earlier release) loses its manifest, and its data file when every byte of it
/// matches the manifest. Every other file stays, and so does `dir`. Returns whether a checkpoint
/// of strata's was there. A save in progress there is a busy_error.
inline bool remove_checkpoint(const std::filesystem::path& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    throw io_error("lstat", dir, errno);
  }
  const directory_lock owner(dir, "the removal of a checkpoint");
  detail::checkpoint_files files(dir, false);
  const auto ours = files.ours();
  // The manifest first: a reader meets no checkpoint rather than one without its data.
  if (ours.contains("manifest")) ::unlink((dir / "manifest").c_str());
  for (const auto& name : ours)
    if (detail::is_checkpoint_data_name(name) || detail::is_checkpoint_manifest_temp_name(name))
      if (const auto why = detail::not_own_file_at(dir / name); why && why->empty()) ::unlink((dir / name).c_str());
  files.journal().remove_file();
  return ours.contains("manifest");
}

}  // namespace strata
