#pragma once
/// strata's exception hierarchy. Every exception strata throws derives from strata::error, and
/// its message names the thing that failed (path, offset, object, subgroup, errno text), so a
/// log line alone is enough to act on.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

namespace strata {

/// Base of every exception strata throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A configuration or argument is invalid (bad size string, bad option, impossible budget).
class config_error : public error {
 public:
  using error::error;
};

/// A resource (a tier directory, an object prefix) is owned by someone else: another process
/// (its pid, when known) or another object of this one.
class busy_error : public error {
 public:
  explicit busy_error(const std::string& what, long holder_pid = 0) : error(what), pid_(holder_pid) {}
  /// The process holding it (0: unknown, or this process).
  [[nodiscard]] long holder_pid() const noexcept { return pid_; }

 private:
  long pid_;
};

/// A file strata would have to write, truncate or remove is not provably its own: it was there
/// before strata created it and no record of strata's names it, or it is a symlink, a FIFO, a
/// directory, another user's file or one with other hard links. strata never follows, changes or
/// removes such a file; the message names it and says what to do.
class foreign_file_error : public busy_error {
 public:
  foreign_file_error(const std::string& what, std::filesystem::path file)
      : busy_error(what), path_(std::make_shared<const std::filesystem::path>(std::move(file))) {}
  /// The file that was left alone.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return *path_; }

 private:
  std::shared_ptr<const std::filesystem::path> path_;  // shared: copying the exception cannot throw
};

/// A budget or a device is full: host memory budget exceeded, ENOSPC/EDQUOT on a tier.
/// Carries the bytes asked for and the bytes available when the caller knows them (else 0).
class capacity_error : public error {
 public:
  explicit capacity_error(const std::string& message, std::uint64_t requested = 0,
                          std::uint64_t available = 0)
      : error(message), requested_(requested), available_(available) {}
  /// Bytes that were asked for (0 if unknown).
  [[nodiscard]] std::uint64_t requested() const noexcept { return requested_; }
  /// Bytes that were available (0 if unknown).
  [[nodiscard]] std::uint64_t available() const noexcept { return available_; }

 private:
  std::uint64_t requested_;
  std::uint64_t available_;
};

namespace detail {
/// errno as text; std::system_category is thread-safe where strerror is not.
inline std::string errno_text(int err) { return std::generic_category().message(err); }
}  // namespace detail

/// A system call on a file failed.
/// what(): "pwrite /nvme/strata/sg-17.m at offset 8388608: No space left on device".
class io_error : public error {
 public:
  io_error(std::string_view operation, const std::filesystem::path& path,
           std::optional<std::uint64_t> offset, int err)
      : error(format(operation, path, offset, err)),
        info_(std::make_shared<const info>(info{std::string(operation), path, offset, err})) {}
  io_error(std::string_view operation, const std::filesystem::path& path, int err)
      : io_error(operation, path, std::nullopt, err) {}

  /// The system call or step that failed ("open", "pread", "fsync", ...).
  [[nodiscard]] const std::string& operation() const noexcept { return info_->operation; }
  /// The file it failed on.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return info_->path; }
  /// The byte offset in the file, when the call had one.
  [[nodiscard]] std::optional<std::uint64_t> offset() const noexcept { return info_->offset; }
  /// The errno value.
  [[nodiscard]] int error_number() const noexcept { return info_->err; }
  /// The errno value as a std::error_code (generic category).
  [[nodiscard]] std::error_code code() const noexcept { return {info_->err, std::generic_category()}; }

 private:
  struct info {
    std::string operation;
    std::filesystem::path path;
    std::optional<std::uint64_t> offset;
    int err;
  };
  static std::string format(std::string_view op, const std::filesystem::path& path,
                            std::optional<std::uint64_t> offset, int err) {
    if (offset) return fmt::format("{} {} at offset {}: {}", op, path.string(), *offset, detail::errno_text(err));
    return fmt::format("{} {}: {}", op, path.string(), detail::errno_text(err));
  }
  // Shared so that copying the exception (which the runtime may do) cannot throw.
  std::shared_ptr<const info> info_;
};

/// Stored bytes do not match their checksum: the state on a tier is corrupt.
class integrity_error : public error {
 public:
  integrity_error(std::string_view tier, std::string_view object, std::uint64_t offset,
                  std::uint64_t expected, std::uint64_t actual)
      : error(fmt::format("integrity check failed on tier '{}', object '{}' at offset {}: checksum "
                          "{:#018x}, expected {:#018x}",
                          tier, object, offset, actual, expected)),
        info_(std::make_shared<const info>(info{std::string(tier), std::string(object), offset})) {}

  /// The check could not be made or failed for another reason (no checksum recorded, truncated
  /// manifest); `reason` says which.
  integrity_error(std::string_view tier, std::string_view object, std::uint64_t offset, std::string_view reason)
      : error(fmt::format("integrity check failed on tier '{}', object '{}' at offset {}: {}", tier, object, offset,
                          reason)),
        info_(std::make_shared<const info>(info{std::string(tier), std::string(object), offset})) {}

  /// Name of the tier that returned the bad bytes.
  [[nodiscard]] const std::string& tier() const noexcept { return info_->tier; }
  /// Name of the object whose bytes are bad.
  [[nodiscard]] const std::string& object() const noexcept { return info_->object; }
  /// Offset of the first bad checksummed block within the object.
  [[nodiscard]] std::uint64_t offset() const noexcept { return info_->offset; }

 private:
  struct info {
    std::string tier;
    std::string object;
    std::uint64_t offset;
  };
  std::shared_ptr<const info> info_;
};

/// A request to a remote store (S3) failed for good: refused (a 4xx other than throttling), still
/// failing after every retry, or out of time. Names the operation, the key, the endpoint, the
/// HTTP status (0 when no response came), the store's error code and request id, or the
/// transport's error. Never holds a credential.
/// what(): "S3 PUT s3://bucket/run/3f/sg-7.m at https://s3.eu-west-1.amazonaws.com: HTTP 403
/// AccessDenied (request id 17A2...): Access Denied, after 1 attempt".
class remote_error : public error {
 public:
  struct info {
    std::string operation;   ///< "PUT", "GET", "LIST", "UPLOAD PART", ...
    std::string key;         ///< "s3://bucket/key"
    long http_status = 0;    ///< 0: no HTTP response (transport error)
    std::string code;        ///< the store's error code ("AccessDenied", "SlowDown"); empty if none
    std::string request_id;  ///< the store's request id; empty if none
    std::string message;     ///< the store's message, or the transport's error text
    unsigned attempts = 1;   ///< requests made, retries included
    std::string endpoint;    ///< where the requests went, "http://127.0.0.1:8333"; empty if not known
  };
  explicit remote_error(info i) : error(format(i)), info_(std::make_shared<const info>(std::move(i))) {}

  [[nodiscard]] const std::string& operation() const noexcept { return info_->operation; }
  [[nodiscard]] const std::string& key() const noexcept { return info_->key; }
  [[nodiscard]] long http_status() const noexcept { return info_->http_status; }
  [[nodiscard]] const std::string& code() const noexcept { return info_->code; }
  [[nodiscard]] const std::string& request_id() const noexcept { return info_->request_id; }
  [[nodiscard]] unsigned attempts() const noexcept { return info_->attempts; }
  [[nodiscard]] const std::string& endpoint() const noexcept { return info_->endpoint; }

 private:
  static std::string format(const info& i) {
    std::string s = fmt::format("S3 {} {}", i.operation, i.key);
    if (!i.endpoint.empty()) s += fmt::format(" at {}", i.endpoint);
    s += ": ";
    if (i.http_status != 0) {
      s += fmt::format("HTTP {}", i.http_status);
      if (!i.code.empty()) s += fmt::format(" {}", i.code);
      if (!i.request_id.empty()) s += fmt::format(" (request id {})", i.request_id);
      if (!i.message.empty()) s += fmt::format(": {}", i.message);
    } else {
      s += fmt::format("no response: {}", i.message);
    }
    s += fmt::format(", after {} attempt{}", i.attempts, i.attempts == 1 ? "" : "s");
    return s;
  }
  std::shared_ptr<const info> info_;  // shared: copying the exception cannot throw
};

/// Work on a stream (a copy, a host task, a kernel) failed, or was skipped because earlier work
/// on its stream failed. Names the stream and the operation.
/// what(): "stream 'h2d': copy_to_device #3 of 1048576 bytes: injected fault".
class stream_error : public error {
 public:
  stream_error(std::string_view stream, std::string_view operation, std::string_view reason)
      : error(fmt::format("stream '{}': {}: {}", stream, operation, reason)) {}
};

/// A CUDA runtime call failed. Defined without CUDA headers so that catch sites compile anywhere.
/// what(): "cudaMemcpyAsync(dst, src, n, kind, s) failed at tier.hpp:42: cudaErrorInvalidValue
/// (invalid argument)".
class cuda_error : public error {
 public:
  cuda_error(int code, std::string_view code_name, std::string_view description,
             std::string_view expression, std::string_view file, int line)
      : error(fmt::format("{} failed at {}:{}: {} ({})", expression, file, line, code_name, description)),
        code_(code) {}
  /// The cudaError_t value, as an int.
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

}  // namespace strata
