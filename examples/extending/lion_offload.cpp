// An update rule in strata's optimizer: Lion (optim/lion_rule.hpp) offloaded to a directory by
// offloaded_lion, against the rule's own kernel over one flat array in memory, then saved and
// resumed from its checkpoint. Exits 1 unless the offloaded state is bit-identical to the flat
// one before and after the resume, and an AdamW optimizer refuses the Lion checkpoint by name.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <strata/strata.hpp>

int main(int argc, char** argv) {
  const std::filesystem::path root = argc > 1 ? argv[1] : "lion_offload";
  std::filesystem::remove_all(root);
  const std::size_t n = 1 << 18;
  std::vector<float> weights(n);
  for (std::size_t i = 0; i < n; ++i) weights[i] = static_cast<float>(i % 17) / 17.0f - 0.5f;

  // doc-snippet: plug_in
  const strata::lion_options lion{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.99, .weight_decay = 0.1};
  const strata::offload_options offload{.subgroup_elems = 1 << 15, .cache_subgroups = 2, .threads = 2};
  strata::file_tier disk(strata::file_tier_options{.directory = root / "state", .name = "disk"});
  strata::offloaded_lion<strata::file_tier> opt(disk, weights, lion, offload);
  std::printf("Lion state: %s (%llu bytes a parameter, master included)\n",
              strata::describe(strata::lion_rule::format(lion)).c_str(),
              static_cast<unsigned long long>(opt.layout().state_bytes_per_param()));
  // doc-snippet-end

  // The same rule over one flat array: its kernel, once per step, over every parameter.
  std::vector<float> p = weights, m(n, 0.0f);
  strata::state_view flat;
  flat.master = p.data();
  flat.arrays[0] = reinterpret_cast<std::byte*>(m.data());
  std::vector<float> grads(n);
  const auto step_both = [&](auto& o, int t) {
    for (std::size_t i = 0; i < n; ++i) grads[i] = static_cast<float>((i * 7 + t) % 13) / 13.0f - 0.5f;
    (void)o.step(std::span<const float>(grads), lion.lr);
    const auto k = strata::lion_rule::make_step_params(lion, {.step = t + 1, .lr = lion.lr, .weight_decay = 0.1});
    strata::lion_rule::update_cpu<float, strata::bf16>(flat, 0, n, grads.data(), nullptr, k, nullptr);
  };
  // doc-snippet: compare
  const auto same_as_flat = [&](auto& o) {
    std::vector<float> got(n);
    o.read_master(got);
    bool same = std::memcmp(got.data(), p.data(), n * sizeof(float)) == 0;
    o.read_state("exp_avg", got);
    return same && std::memcmp(got.data(), m.data(), n * sizeof(float)) == 0;
  };
  for (int t = 0; t < 3; ++t) step_both(opt, t);
  const bool before = same_as_flat(opt);
  opt.save(root / "checkpoint");
  strata::file_tier other_disk(strata::file_tier_options{.directory = root / "resumed", .name = "resumed"});
  auto resumed = strata::offloaded_lion<strata::file_tier>::load(root / "checkpoint", other_disk, offload);
  for (int t = 3; t < 5; ++t) step_both(resumed, t);
  const bool after = same_as_flat(resumed);
  std::printf("step 3, bit-identical to the flat kernel: %s; resumed, step 5: %s\n", before ? "yes" : "NO",
              after ? "yes" : "NO");
  // doc-snippet-end

  std::string refused;
  try {
    strata::file_tier adamw_disk(strata::file_tier_options{.directory = root / "adamw", .name = "adamw"});
    (void)strata::offloaded_adamw<strata::file_tier>::load(root / "checkpoint", adamw_disk, offload);
  } catch (const strata::config_error& e) {
    refused = e.what();
  }
  std::printf("loaded as AdamW: %s\n", refused.empty() ? "(accepted!)" : refused.c_str());
  return before && after && refused.find("'lion'") != std::string::npos ? 0 : 1;
}
