// Agreement with PyTorch: trajectories of torch.optim.AdamW/Adam (tools/make_adamw_golden.py,
// stored in tests/data/adamw_golden.bin) replayed through strata's CPU kernel on every path.
// PyTorch's own CPU kernels differ from a correctly rounded evaluation by about one ULP here and
// there (its sqrt is not correctly rounded), so the check is a relative error below 1e-6.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/optim/adamw_cpu.hpp"

#include "../test_env.hpp"

// The folder's tests compile together: this file's names stay in its own namespace.
namespace adamw_golden_test {

namespace {

class reader {
 public:
  explicit reader(const char* path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error(std::string("cannot open ") + path);
    data_.assign(std::istreambuf_iterator<char>(f), {});
  }
  template <class T>
  T get() {
    T v;
    take(&v, sizeof v);
    return v;
  }
  template <class T>
  std::vector<T> vec(std::size_t n) {
    std::vector<T> v(n);
    take(v.data(), n * sizeof(T));
    return v;
  }
  std::string str(std::size_t n) {
    std::string s(n, '\0');
    take(s.data(), n);
    return s;
  }
  bool done() const { return pos_ == data_.size(); }

 private:
  void take(void* out, std::size_t n) {
    if (pos_ + n > data_.size()) throw std::runtime_error("golden file truncated");
    std::memcpy(out, data_.data() + pos_, n);
    pos_ += n;
  }
  std::vector<char> data_;
  std::size_t pos_ = 0;
};

struct trajectory_step {
  double lr;
  std::vector<std::uint8_t> grad_bytes;
  std::vector<float> p, m, v, vmax;
};

struct golden_case {
  std::string name;
  strata::adamw_options options;
  double grad_scale;
  int grad_dtype;
  std::uint32_t n;
  std::vector<float> p0;
  std::vector<trajectory_step> steps;
};

std::vector<golden_case> load() {
  reader r(strata_test::runner_path("STRATA_GOLDEN_FILE").c_str());
  REQUIRE(r.str(8) == "STRATAGD");
  REQUIRE(r.get<std::uint32_t>() == 1);
  const auto count = r.get<std::uint32_t>();
  std::vector<golden_case> cases;
  for (std::uint32_t c = 0; c < count; ++c) {
    golden_case gc;
    gc.name = r.str(r.get<std::uint32_t>());
    gc.options.beta1 = r.get<double>();
    gc.options.beta2 = r.get<double>();
    gc.options.eps = r.get<double>();
    gc.options.weight_decay = r.get<double>();
    gc.grad_scale = r.get<double>();
    gc.options.decoupled = r.get<std::uint8_t>() != 0;
    gc.options.amsgrad = r.get<std::uint8_t>() != 0;
    gc.options.maximize = r.get<std::uint8_t>() != 0;
    gc.grad_dtype = r.get<std::uint8_t>();
    gc.n = r.get<std::uint32_t>();
    const auto steps = r.get<std::uint32_t>();
    gc.p0 = r.vec<float>(gc.n);
    for (std::uint32_t s = 0; s < steps; ++s) {
      trajectory_step st;
      st.lr = r.get<double>();
      st.grad_bytes = r.vec<std::uint8_t>(gc.n * (gc.grad_dtype == 0 ? 4 : 2));
      st.p = r.vec<float>(gc.n);
      st.m = r.vec<float>(gc.n);
      st.v = r.vec<float>(gc.n);
      if (gc.options.amsgrad) st.vmax = r.vec<float>(gc.n);
      gc.steps.push_back(std::move(st));
    }
    cases.push_back(std::move(gc));
  }
  REQUIRE(r.done());
  return cases;
}

double max_relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, want[i] == 0 ? d : d / std::fabs(static_cast<double>(want[i])));
  }
  return worst;
}

template <class G>
double replay(const golden_case& gc, strata::cpu_isa isa) {
  std::vector<float> p = gc.p0, m(gc.n, 0.0f), v(gc.n, 0.0f), vmax(gc.n, 0.0f);
  std::vector<strata::bf16> model(gc.n);
  double worst = 0;
  for (std::size_t s = 0; s < gc.steps.size(); ++s) {
    const auto& st = gc.steps[s];
    std::vector<G> g(gc.n);
    std::memcpy(g.data(), st.grad_bytes.data(), st.grad_bytes.size());
    const auto k = strata::make_adamw_step_params(gc.options, static_cast<std::int64_t>(s + 1), st.lr, gc.grad_scale);
    strata::adamw_update_cpu(std::span<float>(p), std::span<float>(m), std::span<float>(v), std::span<float>(vmax),
                             std::span<const G>(g), std::span<strata::bf16>(model), k, nullptr, 64, isa);
    worst = std::max({worst, max_relative_error(p, st.p), max_relative_error(m, st.m), max_relative_error(v, st.v)});
    if (gc.options.amsgrad) worst = std::max(worst, max_relative_error(vmax, st.vmax));
    for (std::size_t i = 0; i < gc.n; ++i) REQUIRE(model[i].bits == strata::bf16(p[i]).bits);
  }
  return worst;
}

}  // namespace

TEST_CASE("strata's AdamW follows PyTorch's trajectories to a relative error below 1e-6 on every path") {
  const auto cases = load();
  REQUIRE(cases.size() >= 10);
  std::vector<strata::cpu_isa> isas{strata::cpu_isa::portable};
  for (auto isa : {strata::cpu_isa::avx2, strata::cpu_isa::avx512})
    if (strata::cpu_supports(isa)) isas.push_back(isa);
  for (const auto& gc : cases)
    for (auto isa : isas) {
      const double err = gc.grad_dtype == 0   ? replay<float>(gc, isa)
                         : gc.grad_dtype == 1 ? replay<strata::bf16>(gc, isa)
                                              : replay<strata::fp16>(gc, isa);
      INFO(gc.name, " on ", std::string(strata::to_string(isa)));
      if (isa == strata::cpu_isa::portable) MESSAGE(gc.name, ": max relative error vs PyTorch ", err);
      CHECK(err < 1e-6);
    }
}

}  // namespace adamw_golden_test
