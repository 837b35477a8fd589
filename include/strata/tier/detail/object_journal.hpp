#pragma once
// The record of which files in a tier directory strata made: ".strata-objects", a header line and
// then one line per event, "+ <name>" appended before an object file is created and "- <name>"
// after it is removed. A run that is killed leaves its objects named there, so the next run knows
// them for strata's and reclaims them; a file that no line names (another job's, a user's) is not
// strata's and is never written or removed. Appends are single write(2)s on an O_APPEND
// descriptor: a kill leaves at most a torn last line, which names nothing. The owner of the
// directory removes the journal when it names nothing.
//
// A line "d <text>" records a directory the journal's owner made for it (file_tier writes its
// identity and path), so that a run that is killed leaves it known, and the next run can remove
// it, when empty, at its clean end.
//
// The journal is created whole with its header (written unnamed, then linked in: a kill never
// leaves it empty), so a file at its name without the header, an empty one included, is not
// strata's: it is refused with a foreign_file_error naming it and never written or removed.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/fs.hpp"

namespace strata::detail {

class object_journal {
 public:
  static constexpr std::string_view file_name = ".strata-objects";
  static constexpr std::string_view header = "strata-objects 1\n";
  using names = std::set<std::string, std::less<>>;

  object_journal() = default;
  /// Opens (creating it) the journal of `dir` (of one `scope` of it: ".strata-objects.<scope>",
  /// see directory_lock); recorded() then says which names it holds. A new journal records
  /// `directories` (see made_directory) from the moment it exists.
  explicit object_journal(const std::filesystem::path& dir, std::string_view scope = {},
                          std::span<const std::string> directories = {})
      : path_(scope.empty() ? dir / file_name : dir / fmt::format("{}.{}", file_name, scope)) {
    std::string fresh(header);
    for (const auto& d : directories) fresh += fmt::format("d {}\n", d);
    for (int attempt = 0;; ++attempt) {
      if (attempt > 100) throw io_error("open (the journal keeps changing)", path_, EAGAIN);
      if ((fd_ = create_file_whole(path_, fresh))) {
        if (::fcntl(fd_.get(), F_SETFL, O_APPEND) != 0) throw io_error("fcntl (O_APPEND)", path_, errno);
        created_ = true;
        parse(fresh);
        return;
      }
      try {
        fd_ = open_own_file(path_, O_RDWR | O_APPEND);
      } catch (const io_error& e) {
        if (e.error_number() == ENOENT) continue;  // removed meanwhile
        throw;
      }
      break;
    }
    const std::string text = read_all();
    if (!text.starts_with(header))
      throw foreign_file_error(
          fmt::format("{} is {}, so not a journal strata made: strata never writes, truncates or removes a file it did "
                      "not make, and will not use {} while it is there. Move it away{}",
                      path_.string(),
                      text.empty() ? std::string("empty")
                                   : fmt::format("a file that does not start with '{}'", header.substr(0, header.size() - 1)),
                      dir.string(),
                      text.empty() ? " (an earlier strata release killed as it started could leave an empty one: "
                                     "remove it if so)"
                                   : ""),
          path_);
    // End a torn last line so that the next one stands alone; the '#' keeps it naming nothing
    // (no object name holds one), where a cut name could name another object.
    if (!text.ends_with('\n')) append("#\n");
    parse(text);
    for (const auto& d : directories)
      if (std::ranges::find(directories_, d) == directories_.end()) made_directory(d);
  }
  object_journal(object_journal&&) noexcept = default;
  object_journal& operator=(object_journal&&) noexcept = default;
  object_journal(const object_journal&) = delete;
  object_journal& operator=(const object_journal&) = delete;
  ~object_journal() = default;

  /// The names recorded as strata's when the journal was opened.
  [[nodiscard]] const names& recorded() const noexcept { return recorded_; }

  /// Records that strata is about to create `name` (before the file exists).
  void created(std::string_view name) { append(fmt::format("+ {}\n", name)); }
  /// Records that strata removed `name`.
  void removed(std::string_view name) { append(fmt::format("- {}\n", name)); }
  /// Records a directory its owner made (one line, no newline in it).
  void made_directory(std::string_view text) {
    append(fmt::format("d {}\n", text));
    directories_.emplace_back(text);
  }
  /// The directories recorded, oldest first.
  [[nodiscard]] const std::vector<std::string>& directories() const noexcept { return directories_; }
  /// Whether this object created the journal file (rather than opening one that was there).
  [[nodiscard]] bool created() const noexcept { return created_; }

  /// Replaces the journal by one that names exactly `live` (atomically: rename).
  void rewrite(const names& live) {
    std::string text(header);
    for (const auto& d : directories_) text += fmt::format("d {}\n", d);
    for (const auto& n : live) text += fmt::format("+ {}\n", n);
    write_file_atomic(path_, text);
    fd_ = open_own_file(path_, O_RDWR | O_APPEND, 0644);
  }

  /// Makes the appended lines durable (before the directory entries they announce).
  void sync() const {
    if (fd_) sync_file(fd_.get(), path_, true);
  }

  /// Removes the journal file (when it names nothing); errors are ignored.
  void remove_file() noexcept {
    if (!fd_) return;
    struct stat mine {}, named {};
    if (::fstat(fd_.get(), &mine) == 0 && ::lstat(path_.c_str(), &named) == 0 && mine.st_ino == named.st_ino &&
        mine.st_dev == named.st_dev)
      ::unlink(path_.c_str());
    fd_.reset();
  }

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::string read_all() const {
    std::string text;
    char buf[65536];
    for (off_t at = 0;;) {
      const ssize_t n = ::pread(fd_.get(), buf, sizeof buf, at);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw io_error("pread", path_, static_cast<std::uint64_t>(at), errno);
      }
      if (n == 0) return text;
      text.append(buf, static_cast<std::size_t>(n));
      at += n;
    }
  }

  void parse(std::string_view text) {
    text.remove_prefix(header.size());
    while (!text.empty()) {
      const auto nl = text.find('\n');
      if (nl == std::string_view::npos) break;  // a torn last line names nothing
      const auto line = text.substr(0, nl);
      text.remove_prefix(nl + 1);
      if (line.size() < 3 || line[1] != ' ') continue;
      const auto name = line.substr(2);
      if (line[0] == 'd' && std::ranges::find(directories_, name) == directories_.end()) directories_.emplace_back(name);
      if (line[0] == '+') recorded_.emplace(name);
      if (line[0] == '-')
        if (const auto it = recorded_.find(name); it != recorded_.end()) recorded_.erase(it);
    }
  }

  void append(const std::string& line) {
    // One write(2) (O_APPEND): the line is whole in the file or, after a kill, torn at its end.
    for (;;) {
      const ssize_t n = ::write(fd_.get(), line.data(), line.size());
      if (n == static_cast<ssize_t>(line.size())) return;
      if (n < 0 && errno == EINTR) continue;
      if (n >= 0) throw io_error("write (short append)", path_, EIO);
      detail::throw_write_error("write", path_, std::nullopt, errno);
    }
  }

  std::filesystem::path path_;
  unique_fd fd_;
  names recorded_;
  std::vector<std::string> directories_;
  bool created_ = false;
};

}  // namespace strata::detail
