// An object store as a third path: a local "NVMe" directory and an S3 prefix under one multipath,
// every block checksummed, then a checkpoint of an optimizer saved into another prefix and loaded
// back. Credentials, region and endpoint come from the AWS_* variables (tools/s3-server.sh env).
//   object_store s3://strata/example [DIR]
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <strata/strata.hpp>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: object_store s3://bucket/prefix [DIR]\n");
    return 2;
  }
  const auto where = strata::parse_s3_url(argv[1]);
  const std::filesystem::path dir = argc > 2 ? argv[2] : "strata-object-store-example";
  try {
    using paths_t = strata::multipath<strata::bandwidth_proportional, strata::file_tier, strata::object_store_tier>;
    strata::checksummed<paths_t> state(
        strata::checksum_options{}, strata::bandwidth_proportional{},
        strata::file_tier_options{.directory = dir, .name = "nvme", .read_bandwidth = 2e9, .write_bandwidth = 1e9},
        strata::object_store_options{.bucket = where.bucket, .prefix = where.under("state"),
                                     .read_bandwidth = 1e9, .write_bandwidth = 0.5e9});

    std::vector<std::byte> sg(12 << 20, std::byte{7});  // one subgroup's state: a multipart upload on S3
    std::vector<strata::completion> writes;
    for (int i = 0; i < 6; ++i) writes.push_back(state.write("sg-" + std::to_string(i), 0, sg));
    strata::wait_all(writes);
    std::vector<std::byte> back(sg.size());
    bool intact = true;
    for (int i = 0; i < 6; ++i) {
      state.read("sg-" + std::to_string(i), 0, back).get();  // checked against its checksums
      intact = intact && back == sg;
    }
    auto& s3 = state.inner().path<1>();
    const auto placed = state.inner().placed_bytes();
    const auto st = s3.stats();
    std::printf("nvme holds %s, %s holds %s (%llu requests, %llu parts); intact: %s\n",
                strata::format_size(placed[0]).c_str(), std::string(s3.name()).c_str(),
                strata::format_size(placed[1]).c_str(), static_cast<unsigned long long>(st.requests),
                static_cast<unsigned long long>(st.parts), intact ? "yes" : "NO");
    for (int i = 0; i < 6; ++i) state.remove("sg-" + std::to_string(i));

    // A checkpoint in the store: one object per subgroup, the manifest, then a pointer to it.
    strata::host_tier tier(strata::host_tier_options{.name = "host"});
    std::vector<float> params(1'000'000, 0.5f), grads(params.size(), 0.01f);
    strata::offloaded_adamw<strata::host_tier> opt(tier, params, {}, strata::offload_options{.subgroup_elems = 250'000});
    opt.step(std::span<const float>(grads));
    strata::object_store_tier ckpt(strata::object_store_options{.bucket = where.bucket, .prefix = where.under("ckpt")});
    auto store = strata::any_tier::ref(ckpt);
    opt.save(store);
    strata::host_tier tier2(strata::host_tier_options{.name = "host2"});
    auto resumed = strata::offloaded_adamw<strata::host_tier>::load(store, tier2);
    std::printf("checkpoint of step %llu in %s: %zu objects, loaded back at step %llu\n",
                static_cast<unsigned long long>(opt.step_count()), std::string(ckpt.name()).c_str(), ckpt.objects().size(),
                static_cast<unsigned long long>(resumed.step_count()));
    for (const auto& o : ckpt.objects()) ckpt.remove(o);
    std::filesystem::remove_all(dir);
    return intact && resumed.step_count() == 1 ? 0 : 1;
  } catch (const strata::error& e) {
    std::fprintf(stderr, "object_store: %s\n", e.what());
    return 1;
  }
}
