// Your own offloaded optimizer from strata's parts: SGD with momentum whose fp32 state (weights
// and momentum) lives in two directories, the "PFS" one behind a limiter, streamed through a
// subgroup pipeline with an LRU host cache and the alternating order.
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <strata/strata.hpp>

// doc-snippet: kernel
// How to update one subgroup: the pipeline hands over its state (w | m, fp32) in a host slot.
struct sgd_momentum {
  std::span<const float> grads;  // of every parameter
  std::size_t subgroup_elems;
  float lr, momentum;
  void host(std::size_t s, std::span<std::byte> state) {
    const std::size_t n = state.size() / (2 * sizeof(float));
    float* w = reinterpret_cast<float*>(state.data());
    float* m = w + n;
    const float* g = grads.data() + s * subgroup_elems;
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = momentum * m[i] + g[i];
      w[i] -= lr * m[i];
    }
  }
  void committed(std::size_t) {}  // the update of subgroup s is in: count it, log it, ...
};
// doc-snippet-end

int main(int argc, char** argv) {
  const std::filesystem::path root = argc > 1 ? argv[1] : "strata-custom-pipeline";
  // doc-snippet: tiers
  using pfs_t = strata::limited<strata::file_tier, strata::counting_limiter>;  // node_limiter: node-wide
  using paths_t = strata::multipath<strata::bandwidth_proportional, strata::file_tier, pfs_t&>;
  strata::counting_limiter pfs_lock(1);  // one request at a time on the PFS link, queued without blocking
  pfs_t pfs(pfs_lock, strata::file_tier_options{.directory = root / "pfs", .name = "pfs", .read_bandwidth = 1e9,
                                                .write_bandwidth = 1e9});
  paths_t tier(strata::bandwidth_proportional{},
               strata::file_tier_options{.directory = root / "nvme", .name = "nvme", .read_bandwidth = 2e9,
                                         .write_bandwidth = 2e9},
               pfs);
  // doc-snippet-end

  // doc-snippet: pipeline
  const std::size_t n = 1 << 20, sg = 1 << 17;  // 8 subgroups of 128 Ki parameters
  std::vector<strata::pipeline_object> objects;
  for (std::size_t s = 0; s < n / sg; ++s) objects.push_back({"sgd.sg-" + std::to_string(s), sg * 2 * sizeof(float)});
  strata::host_executor<> exec;          // only used by device updates; always_host runs on the CPU
  strata::host_budget budget(16 << 20);  // every host slot comes out of this
  strata::subgroup_pipeline<strata::host_executor<>> pipe(
      tier, exec, budget, objects, {.cache_slots = 3, .prefetch_depth = 2, .write_behind_depth = 2}, strata::lru{});
  pipe.initialize([](std::size_t, std::span<std::byte> state) {  // w = 1, m = 0
    const auto f = std::span(reinterpret_cast<float*>(state.data()), state.size() / sizeof(float));
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = i < f.size() / 2 ? 1.0f : 0.0f;
  });
  // doc-snippet-end

  // doc-snippet: steps
  const std::vector<float> grads(n, 0.5f);
  sgd_momentum sgd{grads, sg, 0.1f, 0.9f};
  for (std::uint64_t step = 0; step < 3; ++step) {
    const auto order = strata::order_of(strata::alternating{}, step, objects.size());
    const auto next = strata::order_of(strata::alternating{}, step + 1, objects.size());
    const strata::pass_stats st = pipe.run(order, next, order, step, sgd);
    std::printf("step %d: %zu updated, %llu cache hits, read %s, written %s\n", static_cast<int>(step), st.updated,
                static_cast<unsigned long long>(st.cache_hits), strata::format_size(st.bytes_read).c_str(),
                strata::format_size(st.bytes_written).c_str());
  }
  // doc-snippet-end
  // doc-snippet: visit
  float w = 0;
  pipe.visit([&](std::size_t s, std::span<const std::byte> state) {
    if (s == 7) w = reinterpret_cast<const float*>(state.data())[0];
  });
  const float expected = 1.0f - 0.1f * (0.5f + 0.95f + 1.355f);  // m: 0.5, 0.95, 1.355
  std::printf("w: 1 -> %.4f (expected %.4f)\n", static_cast<double>(w), static_cast<double>(expected));
  // doc-snippet-end

  for (const auto& o : objects) tier.remove(o.name);  // clean up what we created
  std::error_code ec;
  for (const auto& dir : {root / "nvme", root / "pfs", root}) std::filesystem::remove(dir, ec);
  return w > expected - 1e-5f && w < expected + 1e-5f ? 0 : 1;
}
