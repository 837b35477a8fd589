// strata-bench io: write then read --size bytes through a file_tier under --path, and report
// GB/s for each. --block is the size of each I/O operation (the tier's chunk), --depth how many
// are in flight (io_uring queue depth, or POSIX threads). With --checksum it also reads through
// the checksummed adaptor, in the same run, and reports what verification costs.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <strata/core/aligned_buffer.hpp>
#include <strata/core/units.hpp>
#include <strata/core/fs.hpp>
#include <strata/tier/checksummed.hpp>
#include <strata/tier/file_tier.hpp>

#include "cli.hpp"
#include "report.hpp"

namespace strata::bench {
namespace {

int run(args& a) {
  const std::filesystem::path dir = a.get_or("path", "strata-bench-io");
  const auto size = a.size("size", parse_size("1GiB"));
  const auto block = a.size("block", parse_size("8MiB"));
  const auto depth = a.count("depth", 32);
  const auto object = a.size("object", parse_size("64MiB"));
  const auto backend = a.choice("backend", {"uring", "posix"}, STRATA_HAS_URING ? "uring" : "posix");
  const auto direct = a.choice("direct", {"on", "off"}, "on");
  const auto reps = a.count("reps", 3);
  const bool checksum = a.flag("checksum");
  const bool json = a.flag("json");
  a.finish();
  if (size == 0 || block == 0 || block % 4096 != 0 || object == 0 || depth == 0 || depth > 4096 || reps == 0)
    throw usage_error("io: --size and --object must be positive, --block a multiple of 4096, --depth in 1..4096");

  file_tier_options o;
  o.directory = dir;
  o.name = "bench";
  o.backend = backend == "uring" ? io_backend::uring : io_backend::posix;
  o.direct = direct == "on";
  o.chunk_bytes = block;
  o.queue_depth = static_cast<unsigned>(depth);
  o.threads = static_cast<std::size_t>(depth);
  direct_io_buffer data(size, buffer_init::zeroed);
  for (std::uint64_t i = 0; i < size; i += 8) data.data()[i] = static_cast<std::byte>(i >> 3);  // not all zeros

  // Only what this run made is removed afterwards, also when it fails: its objects (the passes
  // remove them) and the directory, if it made it and it is empty.
  struct cleanup {
    created_directories made;
    ~cleanup() { made.remove_empty(); }
  } cleanup{};
  cleanup.made.create(dir);
  std::vector<double> w, r, rc;
  {
    file_tier t(o);
    auto rates = write_read_rounds(t, data.bytes(), object, reps);
    w = std::move(rates.write);
    r = std::move(rates.read);
  }
  if (checksum) {
    checksummed<file_tier> t(checksum_options{}, o);
    const pass_objects_guard<checksummed<file_tier>> objects{t, size, object};
    (void)timed_pass(t, true, data.bytes(), object);
    for (std::uint64_t k = 0; k < reps; ++k)
      rc.push_back(static_cast<double>(size) / timed_pass(t, false, data.bytes(), object) / 1e9);
  }

  const double wm = median(w), rm = median(r);
  if (json) {
    json_object j;
    j.add("path", dir.string()).add("size_bytes", size).add("block_bytes", block).add("depth", depth);
    j.add("backend", backend).add("direct", direct == "on").add("reps", reps);
    j.add("write_GBps", wm).add("read_GBps", rm);
    if (checksum) j.add("read_checksummed_GBps", median(rc)).add("checksum_overhead", 1.0 - median(rc) / rm);
    fmt::print("{}\n", j.str());
  } else {
    fmt::print("io: {} in {} objects of {}, block {}, depth {}, backend {}, O_DIRECT {}, under {}\n", format_size(size),
               (size + object - 1) / object, format_size(object), format_size(block), depth, backend, direct,
               dir.string());
    fmt::print("  write {:.3f} GB/s   (median of {}: {:.3f})\n", wm, reps, fmt::join(w, " "));
    fmt::print("  read  {:.3f} GB/s   (median of {}: {:.3f})\n", rm, reps, fmt::join(r, " "));
    if (checksum)
      fmt::print("  read with XXH3 verification {:.3f} GB/s: {:.1f}% slower\n", median(rc),
                 100.0 * (1.0 - median(rc) / rm));
  }
  return 0;
}

const registration reg{{"io", "file-tier write/read throughput (compare with fio)",
                        "[--path DIR] [--size 1GiB] [--block 8MiB] [--depth 32] [--object 64MiB] "
                        "[--backend uring|posix] [--direct on|off] [--reps 3] [--checksum] [--json]",
                        &run}};

}  // namespace
}  // namespace strata::bench
