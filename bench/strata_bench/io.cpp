// strata-bench io: write then read --size bytes through a file_tier under --path, and report
// GB/s for each. --block is the size of each I/O operation (the tier's chunk), --depth how many
// are in flight (io_uring queue depth, or POSIX threads). With --checksum it also reads through
// the checksummed adaptor, in the same run, and reports what verification costs.
//
// With --path s3://bucket/prefix the same passes go through an object_store_tier (credentials,
// endpoint and region from the AWS_* variables): --depth is then its connections, --part its
// upload part and ranged-GET size; --block, --backend and --direct do not apply. The tier's
// counters (requests, retries, parts, patches) are reported with the rates. The run writes only
// objects "probe-<i>" under the prefix, refuses a prefix that already holds one of them, and
// removes them at the end, also on failure.
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
#include <strata/tier/path_arg.hpp>
#include <strata/tier/checksummed.hpp>
#include <strata/tier/file_tier.hpp>
#include <strata/tier/object_store_tier.hpp>

#include "cli.hpp"
#include "report.hpp"

namespace strata::bench {
namespace {

#if STRATA_HAS_S3
/// io over an object store: the same passes, through object_store_tier (see the file comment).
int run_s3(args& a, const std::string& url_arg) {
  const auto size = a.size("size", parse_size("1GiB"));
  const auto object = a.size("object", parse_size("64MiB"));
  const auto depth = a.count("depth", 16);
  const auto part = a.size("part", parse_size("8MiB"));
  const auto reps = a.count("reps", 3);
  const bool checksum = a.flag("checksum");
  const bool json = a.flag("json");
  for (const char* file_only : {"block", "backend", "direct"})
    if (a.get(file_only))
      throw usage_error(fmt::format("io: --{} is for a directory; it does not apply to an object store (--path {}); "
                                    "--part sets the upload part and ranged-GET size",
                                    file_only, url_arg));
  a.finish();
  s3_path_arg where;
  try {
    where = parse_s3_path_arg(url_arg);
  } catch (const config_error& e) {
    throw usage_error(fmt::format("io: --path: {} (expected s3://bucket/prefix)", e.what()));  // (it names the URL)
  }
  if (where.read_bandwidth > 0)
    throw usage_error(fmt::format("io: --path '{}': io measures the store; bandwidths (:READ:WRITE) do not apply",
                                  url_arg));
  if (size == 0 || object == 0 || depth == 0 || depth > 1024 || reps == 0)
    throw usage_error("io: --size and --object must be positive, --depth (connections) in 1..1024");
  if (part < object_store_tier::min_part_size)
    throw usage_error(fmt::format("io: --part {} is below S3's minimum part of {}", format_size(part),
                                  format_size(object_store_tier::min_part_size)));

  auto o = s3_bench_options(where.url, where.url);
  o.part_size = part;
  o.max_connections = static_cast<unsigned>(depth);
  std::vector<std::string> names;
  for (std::uint64_t off = 0, i = 0; off < size; off += object, ++i) names.push_back(probe_object_name(i));
  aligned_buffer data(size, 4096, buffer_init::uninitialized);
  fill_incompressible(data.bytes());

  std::vector<double> w, r, rc;
  object_store_stats stats, checked_stats;
  std::string endpoint;
  {
    object_store_tier t(o);
    refuse_existing(t, names, t.name(), "io");
    endpoint = t.endpoint();
    auto rates = probe_write_read(t, data.bytes(), object, reps);  // removes its objects, also on failure
    w = std::move(rates.write);
    r = std::move(rates.read);
    stats = t.stats();
  }
  if (checksum) {
    checksummed<object_store_tier> t(checksum_options{}, o);
    refuse_existing(t.inner(), names, t.inner().name(), "io");
    const probe_objects_guard<checksummed<object_store_tier>> objects{t, size, object};
    (void)probe_pass(t, true, data.bytes(), object);
    for (std::uint64_t k = 0; k < reps; ++k)
      rc.push_back(static_cast<double>(size) / probe_pass(t, false, data.bytes(), object) / 1e9);
    checked_stats = t.inner().stats();
  }

  const double wm = median(w), rm = median(r);
  if (json) {
    json_object j;
    j.add("path", where.url).add("size_bytes", size).add("object_bytes", object).add("part_bytes", part);
    j.add("depth", depth).add("backend", "s3").add("endpoint", endpoint).add("reps", reps);
    j.add("write_GBps", wm).add("read_GBps", rm);
    if (checksum) j.add("read_checksummed_GBps", median(rc)).add("checksum_overhead", 1.0 - median(rc) / rm);
    j.add("s3", stats_json(stats));
    if (checksum) j.add("s3_checksummed", stats_json(checked_stats));
    fmt::print("{}\n", j.str());
  } else {
    fmt::print("io: {} in {} objects of {}, part {}, {} connections, object store {} at {} (--block and O_DIRECT do "
               "not apply)\n",
               format_size(size), names.size(), format_size(object), format_size(part), depth, where.url, endpoint);
    fmt::print("  write {:.3f} GB/s   (median of {}: {:.3f})\n", wm, reps, fmt::join(w, " "));
    fmt::print("  read  {:.3f} GB/s   (median of {}: {:.3f})\n", rm, reps, fmt::join(r, " "));
    if (checksum)
      fmt::print("  read with XXH3 verification {:.3f} GB/s: {:.1f}% slower\n", median(rc),
                 100.0 * (1.0 - median(rc) / rm));
    fmt::print("  tier: {}\n", describe_stats(stats));
    if (checksum) fmt::print("  tier (checksummed passes): {}\n", describe_stats(checked_stats));
  }
  return 0;
}
#endif

int run(args& a) {
  const std::string path_arg = a.get_or("path", "strata-bench-io");
  path_kind kind = path_kind::directory;
  try {
    kind = parse_path_arg(path_arg, "io: --path").kind;
  } catch (const config_error& e) {
    throw usage_error(e.what());
  }
  if (kind == path_kind::object_store) {
#if STRATA_HAS_S3
    return run_s3(a, path_arg);
#else
    throw usage_error(fmt::format("io: --path {}: strata-bench was built without the S3 tier (libcurl and libcrypto, "
                                  "STRATA_ENABLE_S3)",
                                  path_arg));
#endif
  }
  const std::filesystem::path dir = path_arg;
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
    auto rates = probe_write_read(t, data.bytes(), object, reps);
    w = std::move(rates.write);
    r = std::move(rates.read);
  }
  if (checksum) {
    checksummed<file_tier> t(checksum_options{}, o);
    const probe_objects_guard<checksummed<file_tier>> objects{t, size, object};
    (void)probe_pass(t, true, data.bytes(), object);
    for (std::uint64_t k = 0; k < reps; ++k)
      rc.push_back(static_cast<double>(size) / probe_pass(t, false, data.bytes(), object) / 1e9);
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

const registration reg{{"io", "file-tier (or S3 object-store tier) write/read throughput (compare with fio)",
                        "[--path DIR] [--size 1GiB] [--block 8MiB] [--depth 32] [--object 64MiB] "
                        "[--backend uring|posix] [--direct on|off] [--reps 3] [--checksum] [--json]\n"
                        "   or: --path s3://bucket/prefix [--size 1GiB] [--object 64MiB] [--depth 16] [--part 8MiB] "
                        "[--reps 3] [--checksum] [--json]\n"
                        "\n"
                        "  --path DIR      a directory, through file_tier (made if missing; removed if this run made it)\n"
                        "  --path s3://bucket/prefix\n"
                        "                  an object store, through object_store_tier (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,\n"
                        "                  AWS_SECRET_ACCESS_KEY, AWS_REGION; timeouts in seconds from\n"
                        "                  STRATA_S3_CONNECT_TIMEOUT, STRATA_S3_FIRST_BYTE_TIMEOUT (default 10) and\n"
                        "                  STRATA_S3_REQUEST_DEADLINE (default 120, all retries of a request)); writes\n"
                        "                  only objects probe-<i> under the prefix, refuses a prefix that holds one\n"
                        "                  already, removes them at the end\n"
                        "  --size BYTES    bytes written then read per pass\n"
                        "  --object BYTES  object size (the passes write and read --size / --object objects at once)\n"
                        "  --block BYTES   directory: size of each I/O operation (the tier's chunk); not for s3://\n"
                        "  --depth N       directory: operations in flight (io_uring depth or POSIX threads);\n"
                        "                  s3://: HTTP connections (default 16)\n"
                        "  --part BYTES    s3:// only: upload part and ranged-GET size (>= 5MiB)\n"
                        "  --backend B, --direct on|off  directory only (O_DIRECT does not apply to an object store)\n"
                        "  --reps N        write+read rounds (figures are medians)\n"
                        "  --checksum      also read through checksummed<> (XXH3 verification) and report its cost\n"
                        "  --json          one JSON object (with s3://: the tier's counters under \"s3\")",
                        &run}};

}  // namespace
}  // namespace strata::bench
