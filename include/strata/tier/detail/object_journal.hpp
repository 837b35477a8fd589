#pragma once
// The record of which files in a tier directory strata made: ".strata-objects", a header line and
// then one line per event, "+ <name>" appended before an object file is created and "- <name>"
// after it is removed. A run that is killed leaves its objects named there, so the next run knows
// them for strata's and reclaims them; a file that no line names (another job's, a user's) is not
// strata's and is never written or removed. Appends are single write(2)s on an O_APPEND
// descriptor: a kill leaves at most a torn last line, which names nothing. The owner of the
// directory rewrites the journal at open to what is still there, and removes it when it names
// nothing.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/core/error.hpp"
#include "strata/core/fs.hpp"
#include "strata/core/notice.hpp"

namespace strata::detail {

class object_journal {
 public:
  static constexpr std::string_view file_name = ".strata-objects";
  static constexpr std::string_view header = "strata-objects 1\n";
  using names = std::set<std::string, std::less<>>;

  object_journal() = default;
  /// Opens (creating it) the journal of `dir` (of one `scope` of it: ".strata-objects.<scope>",
  /// see directory_lock); recorded() then says which names it holds.
  explicit object_journal(const std::filesystem::path& dir, std::string_view scope = {})
      : path_(scope.empty() ? dir / file_name : dir / fmt::format("{}.{}", file_name, scope)) {
    fd_ = open_own_file(path_, O_RDWR | O_CREAT | O_APPEND, 0644);
    const std::string text = read_all();
    if (text.empty()) append(std::string(header));
    parse(text);
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

  /// Replaces the journal by one that names exactly `live` (atomically: rename).
  void rewrite(const names& live) {
    std::string text(header);
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
    if (text.empty()) return;
    if (!text.starts_with(header)) {
      notice(fmt::format("{} is damaged (no header): the files it named are not known to be strata's and will be "
                         "left alone",
                         path_.string()));
      return;
    }
    text.remove_prefix(header.size());
    while (!text.empty()) {
      const auto nl = text.find('\n');
      if (nl == std::string_view::npos) break;  // a torn last line names nothing
      const auto line = text.substr(0, nl);
      text.remove_prefix(nl + 1);
      if (line.size() < 3 || line[1] != ' ') continue;
      const auto name = line.substr(2);
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
};

}  // namespace strata::detail
