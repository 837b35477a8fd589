// A tier of your own in strata's optimizer: offloaded AdamW whose state lives in memory-mapped
// files (mmap_tier.hpp) under strata's checksums, checked bit for bit against the same optimizer
// over host memory. Exits 1 when they differ.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <vector>

#include <strata/strata.hpp>

#include "mmap_tier.hpp"

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : "/dev/shm/strata-mmap-example";
  const std::size_t n = 1 << 18, subgroup = 1 << 15;  // 8 subgroups
  std::vector<float> weights(n);
  for (std::size_t i = 0; i < n; ++i) weights[i] = static_cast<float>(i % 97) / 97.0f;
  const strata::adamw_options adamw{.lr = 1e-2, .weight_decay = 0.01};
  const strata::offload_options offload{.subgroup_elems = subgroup, .cache_subgroups = 3, .threads = 2};

  // doc-snippet: plug_in
  // The new tier under a library adaptor, constructed in place from its options.
  using state_tier = strata::checksummed<extending::mmap_tier>;
  state_tier tier(strata::checksum_options{}, extending::mmap_tier_options{.directory = dir, .name = "shm"});
  strata::offloaded_adamw<state_tier> opt(tier, weights, adamw, offload);

  strata::host_tier memory;  // the reference: the same optimizer over host memory
  strata::offloaded_adamw<strata::host_tier> ref(memory, weights, adamw, offload);
  // doc-snippet-end

  std::vector<float> grads(n);
  for (int t = 0; t < 4; ++t) {
    for (std::size_t i = 0; i < n; ++i) grads[i] = static_cast<float>((i * 7 + t) % 13) / 13.0f - 0.5f;
    const auto s = opt.step(std::span<const float>(grads), adamw.lr);
    (void)ref.step(std::span<const float>(grads), adamw.lr);
    std::printf("step %llu: %zu subgroups, %llu cache hits, read %s, written %s\n",
                static_cast<unsigned long long>(s.step), s.subgroups, static_cast<unsigned long long>(s.cache_hits),
                strata::format_size(s.bytes_read).c_str(), strata::format_size(s.bytes_written).c_str());
  }

  // doc-snippet: compare
  std::vector<float> a(n), b(n), am(n), bm(n), av(n), bv(n);
  opt.read_master(a);
  ref.read_master(b);
  opt.read_moments(am, av);
  ref.read_moments(bm, bv);
  const bool same = std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0 &&
                    std::memcmp(am.data(), bm.data(), n * sizeof(float)) == 0 &&
                    std::memcmp(av.data(), bv.data(), n * sizeof(float)) == 0;
  const auto files = std::distance(std::filesystem::directory_iterator(dir), {});
  std::printf("mmap_tier holds %s in %td files; state bit-identical to host memory: %s\n",
              strata::format_size(tier.inner().used()).c_str(), files, same ? "yes" : "NO");
  // doc-snippet-end

  opt.remove_state();  // the optimizer's objects, then the directory if nothing else is there
  std::error_code ec;
  std::filesystem::remove(dir, ec);
  return same ? 0 : 1;
}
