// The C++ fragments the pages show (docs/cpp-guide.md): each is a region of this file between
// `doc-snippet: NAME` and `doc-snippet-end`, which tools/check-docs.py holds the page to, and each
// test runs its fragment and checks what the page says about it. ctest points
// STRATA_NODE_LIMITER_DIR at a directory of the build, so the node limiters here are the test's own,
// and STRATA_DOCS_DIR at docs/.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <strata/strata.hpp>

namespace {

namespace fs = std::filesystem;

struct scratch_dir {  // a fresh directory under the test's working directory, removed after
  fs::path path;
  explicit scratch_dir(const std::string& name) : path(fs::absolute("docs-snippets-" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("the cache loop of the guide keeps the last subgroups of a step for the next one") {
  const std::size_t k = 3, n = 8, steps = 3;
  std::size_t reads = 0;
  // doc-snippet: cache_loop
  strata::cache_index<strata::sweep_aware> cache(k);  // k host slots
  const strata::alternating order;
  for (std::uint64_t step = 0; step < steps; ++step) {
    const auto cur = strata::order_of(order, step, n), next = strata::order_of(order, step + 1, n);
    cache.begin_step(cur, next);
    for (std::size_t sg : cur)
      if (auto r = cache.access(sg); !r.hit) { /* write back r.evicted if any, read sg */ ++reads; }
  }
  // doc-snippet-end
  // The first step reads all 8, each later one only the 8 - k the cache does not hold.
  CHECK(reads == n + (steps - 1) * (n - k));
}

TEST_CASE("the node limiter of the guide admits one holder at a time and times out behind it") {
  bool got = false, second = true;
  // doc-snippet: node_limiter
  strata::node_limiter pfs("pfs", 1);  // one process at a time on the PFS link
  {
    strata::permit p(pfs);  // blocks; released at scope end
    /* pread/pwrite on the PFS */
    got = true;
    // doc-snippet-end
    strata::node_limiter other("pfs", 1);  // another user of the same node-wide limiter
    second = static_cast<bool>(strata::permit(other, std::chrono::milliseconds(50)));
  }
  // doc-snippet: node_limiter_timeout
  if (strata::permit p(pfs, std::chrono::seconds(5)); p) { /* got it within 5 s */ }
  // doc-snippet-end
  CHECK(got);
  CHECK_FALSE(second);
}

TEST_CASE("the kernel fragment of the guide clips, unscales and updates like adamw_step_cpu") {
  const std::size_t n = 4096;
  std::vector<float> master(n, 0.5f), m(n), v(n);
  std::vector<strata::bf16> grads(n, strata::bf16(2.0f)), model_copy(n);
  strata::thread_pool pool(2, "docs");
  const float loss_scale = 1024.0f;
  for (auto& g : grads) g = strata::bf16(2.0f * loss_scale);
  std::uint64_t step = 0;
  const double lr = 1e-3;
  // doc-snippet: adamw_kernel
  strata::adamw_options opt;           // lr, betas, eps, weight_decay (unset: 1e-2 AdamW, 0 Adam), decoupled, amsgrad, maximize
  strata::grad_norm_accumulator norm;  // per step: add each subgroup's norm as its gradients arrive
  norm.add(0, strata::grad_stats_cpu(std::span<const strata::bf16>(grads), 1.0f / loss_scale, &pool));
  const auto d = strata::decide_step(norm, /*max_grad_norm=*/1.0);  // inf/NaN anywhere: d.skip
  if (!d.skip) {
    const auto k = strata::make_adamw_step_params(opt, ++step, lr, 1.0 / loss_scale, d.clip);
    strata::adamw_update_cpu(std::span<float>(master), std::span<float>(m), std::span<float>(v),
                             std::span<float>() /* amsgrad only */, std::span<const strata::bf16>(grads),
                             std::span<strata::bf16>(model_copy) /* or empty */, k, &pool);
  }
  // doc-snippet-end
  REQUIRE_FALSE(d.skip);
  CHECK(d.clip < 1.0);  // the norm, 2 * sqrt(4096) = 128, is clipped to 1
  CHECK(step == 1);
  CHECK(master[0] < 0.5f);
  CHECK(float(model_copy[0]) == float(strata::bf16(master[0])));
}

TEST_CASE("the offloaded_adamw fragment of the guide runs over a directory and a node-limited one") {
  const scratch_dir root("offload");
  const fs::path nvme_dir = root.path / "nvme", pfs_dir = root.path / "pfs", ckpt_dir = root.path / "ckpt-1000";
  const std::size_t n = 200'000;
  std::vector<float> initial_weights(n, 0.25f);
  std::vector<strata::bf16> grads(n, strata::bf16(0.01f)), model_weights(n);
  const strata::adamw_options adamw_options{.lr = 1e-3, .weight_decay = 0.01};
  const double lr = 1e-3;
  // doc-snippet: offloaded_adamw
  strata::file_tier nvme({.directory = nvme_dir, .name = "nvme"});
  // Node-wide read and write locks on the PFS link (one reader and one writer of the node at a time)
  auto pfs_locks = strata::make_node_rw_limiter("pfs", 1, strata::rw_sharing::separate);
  strata::limited<strata::file_tier, strata::node_limiter> pfs(pfs_locks, strata::file_tier_options{.directory = pfs_dir, .name = "pfs"});
  using P = strata::presets::mlp_offload;  // or zero_infinity, strata_preset
  P::paths<strata::file_tier, strata::file_tier> tier(P::placement(), nvme, pfs);
  strata::offload_options base{.subgroup_elems = 50'000, .host_memory_budget = 64ULL << 20};
  P::optimizer<decltype(tier)> opt(tier, initial_weights, adamw_options, P::options(n, adamw_options, base));

  opt.step(std::span<const strata::bf16>(grads), lr, std::span<strata::bf16>(model_weights));  // or, per subgroup
  for (std::size_t s = 0; s < opt.subgroup_count(); ++s)                                          // as backward ends it:
    opt.accept_gradients(s, std::span<const strata::bf16>(grads).subspan(opt.begin(s), opt.length(s)));
  auto stats = opt.step(lr, std::span<strata::bf16>(model_weights));  // stats.to_string(): waits, bytes, bound
  opt.save(ckpt_dir);  // load(dir, tier, options) resumes bit-identically
  // doc-snippet-end
  CHECK(opt.step_count() == 2);
  CHECK(stats.subgroups == opt.subgroup_count());
  CHECK(fs::exists(ckpt_dir / "manifest"));
  CHECK(float(model_weights[0]) < 0.25f);
  opt.remove_state();
}

TEST_CASE("the other-rules fragment of the guide runs SGD and AdamW with bf16 moments through the same engine") {
  const std::size_t n = 10'000;
  std::vector<float> initial_weights(n, 0.25f);
  std::vector<strata::bf16> grads(n, strata::bf16(0.01f));
  const strata::adamw_options adamw_options{.lr = 1e-3, .weight_decay = 0.01};
  const strata::offload_options offload{.subgroup_elems = 4096};
  // doc-snippet: other_rules
  strata::host_tier t1, t2;  // any tier stack, as above
  strata::offloaded_sgd<strata::host_tier> sgd(t1, initial_weights, {.lr = 0.1, .momentum = 0.9, .nesterov = true},
                                               offload);
  sgd.step(std::span<const strata::bf16>(grads), 0.1);
  std::vector<float> momentum(n);
  sgd.read_state("momentum_buffer", momentum);  // each array of the rule's state, by torch's name

  strata::offloaded_adamw_bf16<strata::host_tier> adamw16(t2, initial_weights, adamw_options, offload);
  adamw16.step(std::span<const strata::bf16>(grads), 1e-3);
  const auto bytes = adamw16.layout().state_bytes_per_param();  // 8: fp32 master, bf16 m and v (AdamW: 12)
  // doc-snippet-end
  CHECK(momentum[0] == static_cast<float>(strata::bf16(0.01f)));  // the first step's buffer is the gradient
  CHECK(bytes == 8);
  std::vector<float> w(n);
  adamw16.read_master(w);
  CHECK(w[0] < 0.25f);
}

TEST_CASE("the simulated device fragment of the guide updates every other subgroup on the executor") {
  strata::host_tier tier(strata::host_tier_options{.name = "host"});
  const std::size_t n = 100'000;
  std::vector<float> weights(n, 0.5f), grads(n, 0.01f);
  const strata::adamw_options adamw{};
  const strata::offload_options offload{.subgroup_elems = 10'000};
  // doc-snippet: simulated_device
  using sim_stream = strata::paced<strata::host_stream>;
  strata::host_executor<sim_stream> sim({.kernel_rate = 20e9}, [](strata::stream_role, const std::string& name) {
    return std::make_unique<sim_stream>(strata::pace_options{.h2d_bandwidth = 25e9, .d2h_bandwidth = 25e9}, name);
  });
  strata::offloaded_adamw<decltype(tier), strata::sweep_aware, strata::alternating, decltype(sim),
                          strata::alternating_site>
      opt(tier, sim, weights, adamw, offload, {}, {}, strata::alternating_site{1, 1});  // every other one on the "GPU"
  // doc-snippet-end
  const auto st = opt.step(std::span<const float>(grads));
  CHECK(st.device_updates == opt.subgroup_count() / 2);
}

TEST_CASE("the environment page lists every variable strata reads, with its default") {
  const char* docs = std::getenv("STRATA_DOCS_DIR");
  REQUIRE_MESSAGE(docs != nullptr, "STRATA_DOCS_DIR is not set: run this test through ctest, which sets it");
  std::ifstream in(fs::path(docs) / "environment.md");
  REQUIRE(in);
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& v : strata::env_variables) {
    // One table row per variable: | `NAME` | meaning | default |, the default as env.hpp gives it.
    const auto row = page.find("| `" + std::string(v.name) + "` |");
    CHECK_MESSAGE(row != std::string::npos, v.name << " is missing from docs/environment.md");
    if (row == std::string::npos) continue;
    std::string line = page.substr(row, page.find('\n', row) - row);
    std::erase(line, '`');
    CHECK_MESSAGE(line.find("| " + std::string(v.default_value) + " |") != std::string::npos,
                  v.name << ": docs/environment.md gives another default than " << v.default_value << ": " << line);
  }
}
