// An eviction policy of your own in strata's optimizer: offloaded AdamW walking its subgroups in
// one fixed order with the mru policy of mru.hpp, against lru in the same setting and against the
// default optimizer (sweep_aware, alternating order). Exits 1 unless the states are bit-identical
// and mru hits where lru does not.
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "mru.hpp"

int main() {
  const std::size_t n = 1 << 18, subgroup = 1 << 15;  // 8 subgroups; 3 of them fit the cache
  const std::vector<float> weights(n, 0.5f);
  const strata::adamw_options adamw{.lr = 1e-2, .weight_decay = 0.01};
  const strata::offload_options offload{.subgroup_elems = subgroup, .cache_subgroups = 3, .threads = 2};

  // doc-snippet: plug_in
  strata::host_tier t0, t1, t2;  // one tier each: their objects have the same names
  strata::offloaded_adamw<strata::host_tier> by_default(t0, weights, adamw, offload);
  strata::offloaded_adamw<strata::host_tier, extending::mru, strata::sequential> by_mru(t1, weights, adamw, offload);
  strata::offloaded_adamw<strata::host_tier, strata::lru, strata::sequential> by_lru(t2, weights, adamw, offload);
  // doc-snippet-end

  std::vector<float> grads(n);
  std::string mru_hits, lru_hits;
  std::uint64_t later_mru_hits = 0;
  for (int t = 0; t < 5; ++t) {
    for (std::size_t i = 0; i < n; ++i) grads[i] = static_cast<float>((i * 5 + t) % 11) / 11.0f - 0.5f;
    (void)by_default.step(std::span<const float>(grads), adamw.lr);
    const auto m = by_mru.step(std::span<const float>(grads), adamw.lr);
    const auto l = by_lru.step(std::span<const float>(grads), adamw.lr);
    mru_hits += " " + std::to_string(m.cache_hits);
    lru_hits += " " + std::to_string(l.cache_hits);
    if (t > 0) later_mru_hits += m.cache_hits;
  }
  std::printf("cache hits per step, sequential order, 3 of 8 subgroups cached:\n  mru:%s\n  lru:%s\n",
              mru_hits.c_str(), lru_hits.c_str());

  // doc-snippet: compare
  auto state = [n](auto& opt) {
    std::vector<float> s(3 * n);
    opt.read_master(std::span(s).first(n));
    opt.read_moments(std::span(s).subspan(n, n), std::span(s).subspan(2 * n));
    return s;
  };
  const auto expected = state(by_default);
  const bool same = std::memcmp(state(by_mru).data(), expected.data(), 3 * n * sizeof(float)) == 0 &&
                    std::memcmp(state(by_lru).data(), expected.data(), 3 * n * sizeof(float)) == 0;
  std::printf("state bit-identical to the default optimizer's: %s\n", same ? "yes" : "NO");
  // doc-snippet-end
  return same && later_mru_hits > 0 ? 0 : 1;
}
