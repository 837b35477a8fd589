#pragma once
// Small helpers that the subcommands share: a JSON object for --json, medians, and the same-run
// memory-copy bandwidth that CPU-side figures are compared with.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <strata/core/completion.hpp>
#include <strata/core/aligned_buffer.hpp>
#include <strata/core/thread_pool.hpp>
#include <strata/tier/object_store_tier.hpp>  // empty without STRATA_HAS_S3
#include <strata/tier/tier_probe.hpp>

namespace strata::bench {

/// Builds one flat JSON object: {"key": value, ...}, keys in insertion order.
class json_object {
 public:
  json_object& add(std::string_view key, double v) {
    return raw(key, std::isfinite(v) ? fmt::format("{}", v) : std::string("null"));
  }
  json_object& add(std::string_view key, std::int64_t v) { return raw(key, fmt::format("{}", v)); }
  json_object& add(std::string_view key, std::uint64_t v) { return raw(key, fmt::format("{}", v)); }
  json_object& add(std::string_view key, std::string_view v) { return raw(key, quote(v)); }
  json_object& add(std::string_view key, const char* v) { return add(key, std::string_view(v)); }
  json_object& add(std::string_view key, bool v) { return raw(key, v ? "true" : "false"); }
  json_object& add(std::string_view key, const json_object& v) { return raw(key, v.str()); }
  /// An array of already-serialized JSON values.
  json_object& add_array(std::string_view key, const std::vector<std::string>& values) {
    std::string a = "[";
    for (std::size_t i = 0; i < values.size(); ++i) a += (i ? ", " : "") + values[i];
    return raw(key, a + "]");
  }
  [[nodiscard]] std::string str() const { return "{" + body_ + "}"; }

 private:
  json_object& raw(std::string_view key, std::string_view value) {
    if (!body_.empty()) body_ += ", ";
    body_ += quote(key) + ": " + std::string(value);
    return *this;
  }
  static std::string quote(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) < 0x20) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        continue;
      }
      out += c;
    }
    return out + "\"";
  }
  std::string body_;
};

/// "s3://bucket/prefix" + "/" + `sub`: a prefix inside another (no doubled or missing '/').
inline std::string s3_sub_url(std::string_view url, std::string_view sub) {
  std::string u(url);
  while (u.ends_with('/')) u.pop_back();
  return fmt::format("{}/{}", u, sub);
}

/// Fills `data` with xorshift64 bytes: incompressible, so a store that compresses what it keeps
/// (some do) moves every byte, as it would for optimizer state.
inline void fill_incompressible(std::span<std::byte> data) {
  std::uint64_t x = 0x9e3779b97f4a7c15ULL;
  std::size_t i = 0;
  for (; i + 8 <= data.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data.data() + i, &x, 8);
  }
  for (; i < data.size(); ++i) data[i] = static_cast<std::byte>(i);
}

#if STRATA_HAS_S3
/// An object store tier's counters as a JSON object (io --json, step --json).
inline json_object stats_json(const object_store_stats& s) {
  json_object j;
  j.add("requests", s.requests).add("retries", s.retries).add("puts", s.puts);
  j.add("multipart_uploads", s.multipart_uploads).add("parts", s.parts).add("aborted_uploads", s.aborted_uploads);
  j.add("gets", s.gets).add("direct_gets", s.direct_gets).add("patches", s.patches).add("patch_bytes_read", s.patch_bytes_read);
  j.add("bytes_written", s.bytes_written).add("bytes_read", s.bytes_read).add("lists", s.lists);
  return j;
}

/// The same counters on one line: what the tier did to serve the passes (patches, which re-upload
/// whole objects, are what a benchmark must not hide).
inline std::string describe_stats(const object_store_stats& s) {
  return fmt::format("{} requests ({} retries): {} PUTs, {} multipart uploads of {} parts ({} aborted), {} ranged GETs ({} "
                     "received directly), {} listings; {} patches ({} read back); {} uploaded, {} downloaded",
                     s.requests, s.retries, s.puts, s.multipart_uploads, s.parts, s.aborted_uploads, s.gets, s.direct_gets, s.lists,
                     s.patches, format_size(s.patch_bytes_read), format_size(s.bytes_written),
                     format_size(s.bytes_read));
}

/// A tier on `url` for a benchmark's own objects, which must not exist yet: it refuses (naming
/// a few) a prefix that already holds objects of a tier, so that it overwrites and removes only
/// what it wrote (S3 has no lock or journal to tell another run's objects from ours).
inline object_store_options s3_bench_options(std::string_view url, std::string name) {
  const auto where = parse_s3_url(url);
  object_store_options o;
  o.bucket = where.bucket;
  o.prefix = where.prefix;
  o.name = std::move(name);
  return o;
}

/// Throws when `t` holds any of `names` (listed when it opened): not ours to overwrite or remove.
inline void refuse_existing(const object_store_tier& t, const std::vector<std::string>& names, std::string_view url,
                            std::string_view what) {
  std::vector<std::string> found;
  for (const auto& n : names)
    if (t.size(n)) found.push_back(n);
  if (found.empty()) return;
  const std::size_t shown = std::min<std::size_t>(found.size(), 3);
  std::string list;
  for (std::size_t i = 0; i < shown; ++i) list += fmt::format("{}{}", i ? ", " : "", found[i]);
  throw error(fmt::format("{}: {} already holds {} object{} that this run would write ({}{}), another run's? Not "
                          "overwriting or removing them: give a prefix of its own",
                          what, url, found.size(), found.size() == 1 ? "" : "s", list,
                          found.size() > shown ? ", ..." : ""));
}
#endif

/// The median (the mean of the two middle values for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;
}

/// Result of a memory-copy bandwidth measurement.
struct copy_bandwidth {
  double GBps = 0;         ///< bytes read + bytes written, per second, best repetition
  std::uint64_t bytes = 0; ///< size of the source buffer
};

/// Copies a `bytes`-sized buffer with `threads` threads `reps` times and reports the best rate,
/// counting each byte once read and once written: the bound a streaming kernel is measured
/// against on this machine, in this run.
inline copy_bandwidth measure_copy_bandwidth(std::uint64_t bytes, std::size_t threads, int reps = 5) {
  aligned_buffer src(bytes, 64, buffer_init::zeroed);
  aligned_buffer dst(bytes, 64, buffer_init::zeroed);  // zeroed: pages are touched before timing
  thread_pool pool(threads, "membw");
  const std::uint64_t per = (bytes / threads + 63) / 64 * 64;
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::future<void>> fs;
    for (std::size_t t = 0; t < threads; ++t) {
      const std::uint64_t off = std::min<std::uint64_t>(t * per, bytes);
      const std::uint64_t len = std::min<std::uint64_t>(per, bytes - off);
      fs.push_back(pool.submit([&, off, len] { std::memcpy(dst.data() + off, src.data() + off, len); }));
    }
    for (auto& f : fs) f.get();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
  }
  return {best, bytes};
}

}  // namespace strata::bench
