// strata's offloaded AdamW in a few lines: the fp32 state (master weights, moments) lives in two
// directories, a host cache keeps some of it in memory, and each step writes the bf16 model.
#include <cstdio>
#include <filesystem>
#include <span>
#include <system_error>
#include <vector>

#include <strata/strata.hpp>

int main(int argc, char** argv) {
  const std::filesystem::path nvme = argc > 1 ? argv[1] : "strata-nvme";  // e.g. node-local NVMe
  const std::filesystem::path pfs = argc > 2 ? argv[2] : "strata-pfs";    // e.g. a parallel file system
  using P = strata::presets::strata_preset;  // bandwidth-proportional placement, sweep-aware cache
  P::paths<strata::file_tier, strata::file_tier> tier(P::placement(),
                                                      strata::file_tier_options{.directory = nvme, .name = "nvme"},
                                                      strata::file_tier_options{.directory = pfs, .name = "pfs"});

  const std::size_t n = 1 << 20, subgroup = 128 << 10;  // 1M parameters in 8 subgroups
  std::vector<float> weights(n, 0.5f);                   // the initial fp32 weights
  std::vector<strata::bf16> model(n, strata::bf16(0.5f)), grads(n);  // what forward and backward use
  const strata::adamw_options adamw{.lr = 1e-2, .weight_decay = 0.01};
  const strata::offload_options base{.subgroup_elems = subgroup,  // fp32 master, m, v: 12 bytes a parameter
                                     .host_cache_bytes = 3 * subgroup * 12};  // 3 subgroups stay in memory
  P::optimizer<decltype(tier)> opt(tier, weights, adamw, P::options(n, adamw, base));

  std::vector<strata::offload_step_stats> steps;
  for (int t = 0; t < 4; ++t) {
    for (std::size_t i = 0; i < n; ++i)  // backward's bf16 gradients: here of sum((w - 0.25)^2) / 2
      grads[i] = strata::bf16(float(model[i]) - 0.25f);
    steps.push_back(opt.step(std::span<const strata::bf16>(grads), adamw.lr, std::span<strata::bf16>(model)));
  }
  for (const auto& s : steps) std::printf("%s\n", s.to_string().c_str());
  std::printf("model[0]: 0.5 -> %.4f\n", float(model[0]));

  opt.remove_state();  // clean up: the optimizer's own objects, nothing else
  std::error_code ec;  // then the directories, if nothing else is in them
  for (const auto& dir : {nvme, pfs}) std::filesystem::remove(dir, ec);
}
