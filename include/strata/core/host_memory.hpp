#pragma once
/// Host allocations for tiers and staging buffers: pinned through CUDA when a device is usable
/// (so copies to and from the GPU run at full PCIe speed), else page-aligned and, on request,
/// locked in RAM with mlock.

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "strata/core/cuda.hpp"
#include "strata/core/error.hpp"
#include "strata/core/units.hpp"

namespace strata {

/// What backs a host allocation.
enum class host_memory_kind : std::uint8_t {
  pageable,  ///< ordinary page-aligned memory
  locked,    ///< page-aligned and mlock()ed: never swapped out
  pinned,    ///< cudaHostAlloc: page-locked and registered with the CUDA driver
};

[[nodiscard]] constexpr std::string_view to_string(host_memory_kind k) noexcept {
  switch (k) {
    case host_memory_kind::pageable: return "pageable";
    case host_memory_kind::locked: return "locked";
    case host_memory_kind::pinned: return "pinned";
  }
  return "unknown";
}

/// What a caller asks for. Without a usable GPU, `pinned_if_available` falls back to locked
/// (with `lock`) or pageable memory.
struct host_memory_request {
  bool pinned_if_available = false;
  bool lock = false;  ///< mlock when not pinned
};

/// Physical memory of this machine in bytes (0 if the system does not say): what tools compare a
/// request with before they allocate, so that too large a model is a clear capacity_error
/// rather than std::bad_alloc or the OOM killer.
[[nodiscard]] inline std::uint64_t physical_memory() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

/// Throws capacity_error when `bytes` (for `what`) exceed this machine's physical memory.
inline void require_physical_memory(std::uint64_t bytes, std::string_view what) {
  const std::uint64_t mem = physical_memory();
  if (mem > 0 && bytes > mem)
    throw capacity_error(fmt::format("{} need {} of host memory; this machine has {}", what, format_size(bytes),
                                     format_size(mem)),
                         bytes, mem);
}

/// The kind a request gets on this machine (pinned needs CUDA and a usable device).
[[nodiscard]] inline host_memory_kind resolve_host_memory(host_memory_request r) noexcept {
  if (r.pinned_if_available && cuda_devices().devices > 0) return host_memory_kind::pinned;
  return r.lock ? host_memory_kind::locked : host_memory_kind::pageable;
}

/// An owning, page-aligned host allocation of a given kind. Move-only. Contents are zeroed.
class host_allocation {
 public:
  static constexpr std::size_t page = 4096;

  host_allocation() noexcept = default;
  host_allocation(std::size_t bytes, host_memory_kind kind) : kind_(kind) {
    if (bytes == 0) return;
    const auto padded = static_cast<std::size_t>(round_up(bytes, page));
    void* p = nullptr;
    if (kind == host_memory_kind::pinned) {
#if STRATA_HAS_CUDA
      STRATA_CUDA_TRY(cudaHostAlloc(&p, padded, cudaHostAllocPortable));
#else
      throw config_error("host_allocation: pinned memory needs strata built with CUDA");
#endif
    } else {
      if (const int rc = ::posix_memalign(&p, page, padded); rc != 0)
        throw capacity_error(fmt::format("cannot allocate {} of host memory: {}", format_size(padded),
                                         detail::errno_text(rc)),
                             padded, 0);
      if (kind == host_memory_kind::locked && ::mlock(p, padded) != 0) {
        const int err = errno;
        std::free(p);
        throw capacity_error(fmt::format("cannot lock {} of host memory in RAM (mlock: {}); raise RLIMIT_MEMLOCK "
                                         "(ulimit -l) or do not ask for locked memory",
                                         format_size(padded), detail::errno_text(err)),
                             padded, 0);
      }
    }
    std::memset(p, 0, padded);  // touch every page now, not inside a timed transfer
    data_ = static_cast<std::byte*>(p);
    bytes_ = bytes;
    padded_ = padded;
  }
  host_allocation(host_allocation&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)),
        padded_(std::exchange(o.padded_, 0)),
        kind_(o.kind_) {}
  host_allocation& operator=(host_allocation&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      padded_ = std::exchange(o.padded_, 0);
      kind_ = o.kind_;
    }
    return *this;
  }
  host_allocation(const host_allocation&) = delete;
  host_allocation& operator=(const host_allocation&) = delete;
  ~host_allocation() { release(); }

  [[nodiscard]] std::byte* data() noexcept { return data_; }
  [[nodiscard]] const std::byte* data() const noexcept { return data_; }
  /// Bytes asked for.
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  /// Bytes held: size() rounded up to whole pages (what budgets count).
  [[nodiscard]] std::size_t footprint() const noexcept { return padded_; }
  [[nodiscard]] host_memory_kind kind() const noexcept { return kind_; }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    if (kind_ == host_memory_kind::pinned) {
#if STRATA_HAS_CUDA
      (void)cudaFreeHost(data_);
#endif
    } else {
      if (kind_ == host_memory_kind::locked) ::munlock(data_, padded_);
      std::free(data_);
    }
    data_ = nullptr;
    bytes_ = padded_ = 0;
  }

  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t padded_ = 0;
  host_memory_kind kind_ = host_memory_kind::pageable;
};

}  // namespace strata
