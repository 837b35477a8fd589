// The process the kill tests SIGKILL: trains the kill_common model on a file tier, saving a
// checkpoint first and then (mode "save") after every step or (mode "step") every third step.
// Prints "ready" once the first checkpoint is durable, then runs until killed or `max_steps`.
//   strata_offload_kill_helper <step|save> <workdir> <max_steps>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <span>
#include <string>

#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "kill_common.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <step|save> <workdir> <max_steps>\n", argv[0]);
    return 2;
  }
  try {
    const std::string mode = argv[1];
    const std::filesystem::path work = argv[2];
    const std::uint64_t max_steps = std::strtoull(argv[3], nullptr, 10);
    std::filesystem::remove_all(work / "tier");
    strata::file_tier_options fo;
    fo.directory = work / "tier";
    fo.name = "nvme";
    strata::file_tier tier(fo);
    strata::offload_options off;
    off.subgroup_elems = strata_kill::subgroup;
    off.host_cache_bytes = 3 * strata::host_budget::footprint(strata_kill::subgroup * 12);
    off.threads = 1;
    const auto init = strata_kill::initial();
    strata::offloaded_adamw<strata::file_tier, strata::sweep_aware, strata::alternating> opt(tier, init,
                                                                                            strata_kill::options(), off);
    opt.save(work / "ckpt");
    std::printf("ready\n");
    std::fflush(stdout);
    for (std::uint64_t t = 0; t < max_steps; ++t) {
      const auto g = strata_kill::grads(t);
      opt.step(std::span<const strata::bf16>(g), strata_kill::lr(t));
      if (mode == "save" || t % 3 == 2) opt.save(work / "ckpt");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kill helper: %s\n", e.what());
    return 1;
  }
}
