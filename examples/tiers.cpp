// Tiers in a few lines: a node-local "NVMe" directory and a bandwidth-capped "PFS" directory,
// combined 2:1 by a multipath, with every block checksummed.
#include <cstdio>
#include <filesystem>
#include <vector>

#include <strata/strata.hpp>

int main(int argc, char** argv) {
  const std::filesystem::path root = argc > 1 ? argv[1] : "strata-tiers-example";
  using pfs_t = strata::throttled<strata::file_tier>;  // emulates a shared PFS link on one machine
  using paths_t = strata::multipath<strata::fixed_ratio, strata::file_tier, pfs_t&>;

  pfs_t pfs(strata::throttle_options{.read_bandwidth = 500e6, .write_bandwidth = 250e6},
            strata::file_tier_options{.directory = root / "pfs", .name = "pfs"});
  strata::checksummed<paths_t> state(strata::checksum_options{}, strata::fixed_ratio({2, 1}),
                                     strata::file_tier_options{.directory = root / "nvme", .name = "nvme"}, pfs);

  std::vector<std::byte> sg(3 << 20, std::byte{1});  // one subgroup's state, 3 MiB
  std::vector<strata::completion> writes;
  for (int i = 0; i < 6; ++i) writes.push_back(state.write("sg-" + std::to_string(i), 0, sg));
  strata::wait_all(writes);  // both paths worked at once; the first error, if any, is rethrown
  state.flush();             // durable from here on

  std::vector<std::byte> back(sg.size());
  state.read("sg-4", 0, back).get();  // verified against its checksums on the way in
  const auto placed = state.inner().placed_bytes();
  std::printf("nvme holds %s, pfs holds %s; sg-4 intact: %s\n", strata::format_size(placed[0]).c_str(),
              strata::format_size(placed[1]).c_str(), back == sg ? "yes" : "NO");
  std::filesystem::remove_all(root);
  return back == sg ? 0 : 1;
}
