// The process the kill tests SIGKILL: trains the kill_common model on a file tier, saving a
// checkpoint first and then (mode "save") after every step or (mode "step") every third step;
// mode "early" is "step" with the gradients handed over subgroup by subgroup in reverse after
// begin_step, so that a kill also lands while subgroups are updated as their gradients land;
// mode "speculate" is "early" with clipping on at a norm never reached, so that those updates
// are speculative (made on copies, adopted by step()).
// Prints "ready" once the first checkpoint is durable, then runs until killed or `max_steps`.
// Mode "auto" is a training job as users run one: the default stack of make_offloaded_adamw (two
// checksummed file paths) on workdir/nvme and workdir/pfs, resumed from workdir/ckpt when a
// checkpoint is there (else started fresh on whatever a killed run left), a save after every
// step, "done <steps>" at the end. Nothing is cleaned up by hand between runs.
//   strata_offload_kill_helper <step|save|early|speculate|auto> <workdir> <max_steps>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <strata/offload/offloaded_adamw.hpp>
#include <strata/strata.hpp>

#include "kill_common.hpp"

namespace {

int run_job(const std::filesystem::path& work, std::uint64_t max_steps) {
  strata::offloaded_adamw_config c;
  c.preset = "strata";
  c.offload.subgroup_elems = strata_kill::subgroup;
  c.offload.threads = 1;
  c.offload.host_memory_budget = 12 * strata::host_budget::footprint(strata_kill::subgroup * 12);
  c.integrity_block_bytes = 16 * 1024;  // several blocks per subgroup, the last one cut
  for (const auto* name : {"nvme", "pfs"}) {
    strata::offload_path_config p;
    p.directory = work / name;
    p.name = name;
    p.read_bandwidth = p.write_bandwidth = std::string_view(name) == "nvme" ? 2e9 : 1e9;
    c.paths.push_back(p);
  }
  c.adamw = strata_kill::options();
  const auto ckpt = work / "ckpt";
  std::optional<strata::any_offloaded_adamw> opt;
  if (std::filesystem::exists(ckpt / "manifest"))
    opt = strata::load_offloaded_adamw(c, ckpt);
  else
    opt = strata::make_offloaded_adamw(c, strata_kill::initial());
  for (std::uint64_t t = opt->step_count(); t < max_steps; ++t) {
    const auto g = strata_kill::grads(t);
    opt->step(std::span<const strata::bf16>(g), strata_kill::lr(t));
    opt->save(ckpt);
  }
  std::printf("done %llu\n", static_cast<unsigned long long>(opt->step_count()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <step|save|early|auto> <workdir> <max_steps>\n", argv[0]);
    return 2;
  }
  try {
    const std::string mode = argv[1];
    const std::filesystem::path work = argv[2];
    const std::uint64_t max_steps = std::strtoull(argv[3], nullptr, 10);
    if (mode == "auto") return run_job(work, max_steps);
    std::filesystem::remove_all(work / "tier");
    strata::file_tier_options fo;
    fo.directory = work / "tier";
    fo.name = "nvme";
    strata::file_tier tier(fo);
    strata::offload_options off;
    off.subgroup_elems = strata_kill::subgroup;
    off.host_cache_bytes = 3 * strata::host_budget::footprint(strata_kill::subgroup * 12);
    off.threads = 1;
    const bool early = mode == "early" || mode == "speculate";
    if (mode == "speculate") off.max_grad_norm = 1e30;  // (a coefficient of exactly 1: the same training)
    const auto init = strata_kill::initial();
    strata::offloaded_adamw<strata::file_tier, strata::sweep_aware, strata::alternating> opt(tier, init,
                                                                                            strata_kill::options(), off);
    opt.save(work / "ckpt");
    std::printf("ready\n");
    std::fflush(stdout);
    for (std::uint64_t t = 0; t < max_steps; ++t) {
      const auto g = strata_kill::grads(t);
      if (early) {
        opt.begin_step(strata_kill::lr(t));
        for (std::size_t s = opt.subgroup_count(); s-- > 0;)
          opt.accept_gradients(s, std::span<const strata::bf16>(g).subspan(opt.begin(s), opt.length(s)));
        opt.step(strata_kill::lr(t));
      } else {
        opt.step(std::span<const strata::bf16>(g), strata_kill::lr(t));
      }
      if (mode == "save" || t % 3 == 2) opt.save(work / "ckpt");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kill helper: %s\n", e.what());
    return 1;
  }
}
