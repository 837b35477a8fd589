// core_demo: what strata's core gives a component, in one small program. It fills an O_DIRECT-
// aligned buffer, checksums it in tiles on a thread pool while tracing each tile, prints the
// aggregate timings, and writes a Chrome trace that Perfetto opens.
//
//   core_demo [--size 256MiB] [--tile 8MiB] [--threads N] [--trace core_demo.trace.json]
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <string_view>
#include <vector>

#include <strata/strata.hpp>

namespace {
void usage(std::FILE* to) {
  std::fputs(
      "usage: core_demo [--size BYTES] [--tile BYTES] [--threads N] [--trace FILE]\n"
      "  --size BYTES    buffer to checksum, e.g. 256MiB, 1.5GB (default 256MiB)\n"
      "  --tile BYTES    bytes per task (default 8MiB)\n"
      "  --threads N     worker threads (default: STRATA_NUM_THREADS or the online CPUs)\n"
      "  --trace FILE    Chrome trace to write (default core_demo.trace.json; open in ui.perfetto.dev)\n",
      to);
}

std::uint64_t fnv1a(std::span<const std::byte> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (auto b : bytes) h = (h ^ std::to_integer<std::uint64_t>(b)) * 0x100000001b3ULL;
  return h;
}
}  // namespace

int main(int argc, char** argv) try {
  std::uint64_t size = strata::parse_size("256MiB");
  std::uint64_t tile = strata::parse_size("8MiB");
  std::size_t threads = strata::default_thread_count();
  std::string trace_path = "core_demo.trace.json";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw strata::config_error(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (a == "--size") size = strata::parse_size(value());
    else if (a == "--tile") tile = strata::parse_size(value());
    else if (a == "--threads") threads = strata::parse_count(value());
    else if (a == "--trace") trace_path = value();
    else throw strata::config_error(fmt::format("unknown option '{}' (see --help)", a));
  }
  STRATA_EXPECTS(tile > 0, strata::config_error, "--tile must be positive");
  STRATA_EXPECTS(threads > 0 && threads <= 1024, strata::config_error, "--threads must be in [1, 1024], got {}", threads);

  strata::tracer tracer;
  strata::thread_pool pool(threads, "demo");
  strata::direct_io_buffer buf(size);
  {
    strata::trace_span fill(&tracer, "fill");
    for (std::size_t i = 0; i < buf.size(); ++i) buf.data()[i] = static_cast<std::byte>(i * 131 + 7);
  }
  std::vector<std::future<std::uint64_t>> parts;
  {
    strata::trace_span all(&tracer, "checksum all");
    for (std::uint64_t off = 0; off < size; off += tile) {
      const auto len = std::min(tile, size - off);
      parts.push_back(pool.submit([&, off, len] {
        strata::trace_span s(&tracer, "checksum tile");
        s.arg("offset", off).arg("bytes", len);
        return fnv1a(buf.bytes().subspan(off, len));
      }));
    }
    std::uint64_t combined = 0;
    for (auto& p : parts) combined = combined * 31 + p.get();
    all.arg("checksum", static_cast<std::int64_t>(combined));
    fmt::print("checksummed {} in {} tiles of {} on {} threads: {:#018x}\n", strata::format_size(size),
               parts.size(), strata::format_size(tile), pool.size(), combined);
  }
  fmt::print("{}", tracer.summary().snapshot().to_string());
  tracer.write_chrome_trace(trace_path);
  fmt::print("trace: {} ({} events; open it in ui.perfetto.dev)\n", trace_path, tracer.event_count());
  for (const auto& name : strata::unknown_env_variables())
    fmt::print(stderr, "warning: {} is not a variable strata reads\n", name);
  return 0;
} catch (const strata::config_error& e) {
  std::fprintf(stderr, "core_demo: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "core_demo: %s\n", e.what());
  return 1;
}
