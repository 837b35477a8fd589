// strata._core: the native half of the Python front. It wraps the run-time optimizer
// (any_offloaded_optimizer, of any update rule) and takes tensors through DLPack (nanobind's ndarray), so any framework's
// CPU tensors cross without a copy and nothing links against libtorch. The GIL is released
// while strata works (steps, gradient hand-over, save, load, reads).
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <strata/core/error.hpp>
#include <strata/core/half.hpp>
#include <strata/offload/make_offloaded_adamw.hpp>
#include <strata/offload/make_offloaded_optimizer.hpp>
#include <strata/tier/path_arg.hpp>
#include <strata/version.hpp>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// --- errors -----------------------------------------------------------------------------------

// strata's typed errors as Python classes (created at import, kept for the module's life).
struct error_classes {
  PyObject* error = nullptr;
  PyObject* config = nullptr;
  PyObject* busy = nullptr;
  PyObject* foreign_file = nullptr;
  PyObject* capacity = nullptr;
  PyObject* io = nullptr;
  PyObject* integrity = nullptr;
  PyObject* stream = nullptr;
  PyObject* cuda = nullptr;
};
error_classes errors;

PyObject* new_error_class(nb::module_& m, const char* name, const char* doc, std::initializer_list<PyObject*> bases) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(bases.size()));
  Py_ssize_t i = 0;
  for (PyObject* b : bases) {
    Py_INCREF(b);
    PyTuple_SET_ITEM(tuple, i++, b);
  }
  const std::string qualified = std::string("strata.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, tuple, nullptr);
  Py_DECREF(tuple);
  if (cls == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

void translate(const std::exception_ptr& p, void*) {
  // Most derived first; the text is strata's message, which names the thing that failed.
  try {
    std::rethrow_exception(p);
  } catch (const strata::foreign_file_error& e) {
    PyErr_SetString(errors.foreign_file, e.what());
  } catch (const strata::busy_error& e) {
    PyErr_SetString(errors.busy, e.what());
  } catch (const strata::config_error& e) {
    PyErr_SetString(errors.config, e.what());
  } catch (const strata::capacity_error& e) {
    PyErr_SetString(errors.capacity, e.what());
  } catch (const strata::integrity_error& e) {
    PyErr_SetString(errors.integrity, e.what());
  } catch (const strata::io_error& e) {
    PyErr_SetString(errors.io, e.what());
  } catch (const strata::cuda_error& e) {
    PyErr_SetString(errors.cuda, e.what());
  } catch (const strata::stream_error& e) {
    PyErr_SetString(errors.stream, e.what());
  } catch (const strata::error& e) {
    PyErr_SetString(errors.error, e.what());
  }
}

[[noreturn]] void config_fail(const std::string& what) { throw strata::config_error(what); }

// --- arrays -----------------------------------------------------------------------------------

// Any dtype and shape; checked here so the message names the argument.
using array = nb::ndarray<>;

enum class dtype_kind { f32, bf16, f16 };

dtype_kind kind_of(const array& a, const char* what) {
  const nb::dlpack::dtype d = a.dtype();
  if (d == nb::dtype<float>()) return dtype_kind::f32;
  if (d.bits == 16 && d.lanes == 1 && d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat))
    return dtype_kind::bf16;
  if (d.bits == 16 && d.lanes == 1 && d.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float))
    return dtype_kind::f16;
  config_fail(fmt::format("strata: {} has an unsupported dtype (code {}, {} bits); use float32, bfloat16 or float16",
                          what, d.code, d.bits));
}

// The array's elements as one contiguous run in host memory (any shape, C order, no gaps).
void check_flat(const array& a, const char* what) {
  if (a.device_type() != nb::device::cpu::value)
    config_fail(fmt::format("strata: {} lives on device type {} (id {}); this build takes host tensors (the "
                            "Python front stages CUDA tensors itself)",
                            what, a.device_type(), a.device_id()));
  std::int64_t expect = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect)
      config_fail(fmt::format("strata: {} is not contiguous (dimension {} has stride {}, expected {})", what, i,
                              a.stride(i), expect));
    expect *= static_cast<std::int64_t>(a.shape(i));
  }
}

template <class T>
std::span<T> span_of(const array& a) {
  return {static_cast<T*>(a.data()), a.size()};
}

std::span<const float> floats(const array& a, const char* what) {
  check_flat(a, what);
  if (kind_of(a, what) != dtype_kind::f32) config_fail(fmt::format("strata: {} must be float32", what));
  return span_of<const float>(a);
}

std::optional<array> optional_array(const nb::handle& h) {
  if (h.is_none()) return std::nullopt;
  return nb::cast<array>(h, false);
}

strata::host_model_span model_span(const array& a) {
  check_flat(a, "the model copy");
  switch (kind_of(a, "the model copy")) {
    case dtype_kind::f32: return span_of<float>(a);
    case dtype_kind::bf16: return span_of<strata::bf16>(a);
    case dtype_kind::f16: break;
  }
  return span_of<strata::fp16>(a);
}

// --- configuration ----------------------------------------------------------------------------

template <class T>
T take(nb::dict& d, const char* key, T fallback) {
  if (!d.contains(key)) return fallback;
  nb::object v = d[key];
  PyDict_DelItemString(d.ptr(), key);
  if (v.is_none()) return fallback;
  try {
    return nb::cast<T>(v);
  } catch (const nb::cast_error&) {
    config_fail(fmt::format("strata: option '{}' has the wrong type ({})", key,
                            nb::cast<std::string>(nb::str(v.type()))));
  }
}

strata::offload_path_config path_of(nb::handle h, std::size_t i) {
  strata::offload_path_config p;
  if (nb::isinstance<nb::dict>(h)) {
    // A copy (take() removes the keys it reads): the caller's dict is used again for the next
    // optimizer, and nb::dict(d) would be the same object.
    nb::dict d = nb::steal<nb::dict>(PyDict_Copy(h.ptr()));
    if (!d.is_valid()) throw nb::python_error();
    p.directory = take<std::string>(d, "directory", "");
    p.url = take<std::string>(d, "url", "");
    p.name = take<std::string>(d, "name", "");
    p.node_limited = take<bool>(d, "node_limited", false);
    p.read_cap = take<double>(d, "read_cap", 0);
    p.write_cap = take<double>(d, "write_cap", 0);
    p.read_bandwidth = take<double>(d, "read_bandwidth", 0);
    p.write_bandwidth = take<double>(d, "write_bandwidth", 0);
    if (d.size() != 0)
      config_fail(fmt::format("strata: path {} has unknown keys {}", i, nb::cast<std::string>(nb::str(d.keys()))));
    return p;
  }
  if (h.is_none()) return p;  // host memory
  const auto text = nb::cast<std::string>(nb::str(h));  // str or os.PathLike (its str is the path)
  const auto parsed = strata::parse_path_arg(text, fmt::format("strata: path {}", i));
  if (parsed.kind == strata::path_kind::object_store)
    p.url = parsed.url;
  else
    p.directory = parsed.directory;
  return p;
}

strata::offloaded_adamw_config config_of(nb::dict options) {
  nb::dict d = nb::steal<nb::dict>(PyDict_Copy(options.ptr()));  // (take() removes the keys it reads)
  if (!d.is_valid()) throw nb::python_error();
  strata::offloaded_adamw_config c;
  c.preset = take<std::string>(d, "preset", c.preset);
  if (d.contains("paths")) {
    nb::object paths = d["paths"];
    PyDict_DelItemString(d.ptr(), "paths");
    std::size_t i = 0;
    for (nb::handle h : paths) c.paths.push_back(path_of(h, i++));
  }
  c.rule = take<std::string>(d, "rule", c.rule);
  // The rule's hyper-parameters, under torch's names.
  if (c.rule == "sgd") {
    auto& a = c.sgd;
    a.lr = take<double>(d, "lr", a.lr);
    a.momentum = take<double>(d, "momentum", a.momentum);
    a.dampening = take<double>(d, "dampening", a.dampening);
    if (d.contains("weight_decay")) a.weight_decay = take<double>(d, "weight_decay", 0.0);
    a.nesterov = take<bool>(d, "nesterov", a.nesterov);
    a.maximize = take<bool>(d, "maximize", a.maximize);
  } else if (c.rule == "lion") {
    auto& a = c.lion;
    a.lr = take<double>(d, "lr", a.lr);
    a.beta1 = take<double>(d, "beta1", a.beta1);
    a.beta2 = take<double>(d, "beta2", a.beta2);
    if (d.contains("weight_decay")) a.weight_decay = take<double>(d, "weight_decay", 0.0);
    a.maximize = take<bool>(d, "maximize", a.maximize);
  } else {
    auto& a = c.adamw;
    a.lr = take<double>(d, "lr", a.lr);
    a.beta1 = take<double>(d, "beta1", a.beta1);
    a.beta2 = take<double>(d, "beta2", a.beta2);
    a.eps = take<double>(d, "eps", a.eps);
    if (d.contains("weight_decay")) a.weight_decay = take<double>(d, "weight_decay", 0.0);
    a.decoupled = take<bool>(d, "decoupled", a.decoupled);
    a.amsgrad = take<bool>(d, "amsgrad", a.amsgrad);
    a.maximize = take<bool>(d, "maximize", a.maximize);
  }
  auto& o = c.offload;
  o.subgroup_elems = take<std::size_t>(d, "subgroup_size", o.subgroup_elems);
  o.host_cache_bytes = take<std::uint64_t>(d, "cache_bytes", o.host_cache_bytes);
  if (d.contains("cache_subgroups")) o.cache_subgroups = take<std::size_t>(d, "cache_subgroups", 0);
  o.host_memory_budget = take<std::uint64_t>(d, "host_memory_budget", o.host_memory_budget);
  o.prefetch_depth = take<std::size_t>(d, "prefetch_depth", o.prefetch_depth);
  o.write_behind_depth = take<std::size_t>(d, "write_behind_depth", o.write_behind_depth);
  o.prefetch_next_step = take<bool>(d, "prefetch_next_step", o.prefetch_next_step);
  o.return_before_writes = take<bool>(d, "return_before_writes", o.return_before_writes);
  o.update_as_gradients_land = take<bool>(d, "update_as_gradients_land", o.update_as_gradients_land);
  o.speculate_updates = take<bool>(d, "speculate_updates", o.speculate_updates);
  o.threads = take<std::size_t>(d, "threads", o.threads);
  const std::string residency = take<std::string>(d, "gradients", "host");
  if (residency != "host" && residency != "tier" && residency != "automatic" && residency != "caller")
    config_fail(fmt::format("strata: gradients='{}' (expected 'host', 'tier', 'automatic' or 'caller')", residency));
  o.gradients = residency == "host"        ? strata::gradient_residency::host
                : residency == "tier"      ? strata::gradient_residency::tier
                : residency == "caller"    ? strata::gradient_residency::caller
                                           : strata::gradient_residency::automatic;
  o.max_grad_norm = take<double>(d, "max_grad_norm", o.max_grad_norm);
  o.loss_scaling.enabled = take<bool>(d, "loss_scaling", false);
  o.loss_scaling.init_scale = take<double>(d, "init_scale", o.loss_scaling.init_scale);
  o.loss_scaling.growth_factor = take<double>(d, "growth_factor", o.loss_scaling.growth_factor);
  o.loss_scaling.backoff_factor = take<double>(d, "backoff_factor", o.loss_scaling.backoff_factor);
  o.loss_scaling.growth_interval = take<std::int64_t>(d, "growth_interval", o.loss_scaling.growth_interval);
  o.object_prefix = take<std::string>(d, "object_prefix", o.object_prefix);
  c.verify_integrity = take<bool>(d, "integrity", c.verify_integrity);
  c.stripe_paths = take<bool>(d, "stripe_paths", c.stripe_paths);
  c.scope_paths = take<bool>(d, "scope_paths", c.scope_paths);
  c.node_limiter_permits = take<std::size_t>(d, "node_limiter_permits", c.node_limiter_permits);
  c.node_limiter_name = take<std::string>(d, "node_limiter_name", c.node_limiter_name);
  if (d.size() != 0) config_fail(fmt::format("strata: unknown options {}", nb::cast<std::string>(nb::str(d.keys()))));
  return c;
}

strata::step_rates rates_of(nb::handle h) {
  if (!nb::isinstance<nb::list>(h) && !nb::isinstance<nb::tuple>(h)) return strata::step_rates(nb::cast<double>(h));
  std::vector<strata::param_range> ranges;
  for (nb::handle r : h) {
    auto t = nb::cast<nb::tuple>(r);
    if (t.size() != 4) config_fail("strata: a rate range is (first, count, lr, weight_decay)");
    ranges.push_back({nb::cast<std::size_t>(t[0]), nb::cast<std::size_t>(t[1]), nb::cast<double>(t[2]),
                      nb::cast<double>(t[3])});
  }
  return strata::step_rates(std::move(ranges));
}

// --- checkpoints in a directory or an object store ---------------------------------------------

bool is_s3(const std::string& where) { return where.rfind("s3://", 0) == 0; }

// The object store prefix of an "s3://bucket/prefix" checkpoint (endpoint and credentials from
// the AWS_* variables, as the C++ tools take them).
strata::any_tier store_of(const std::string& url) {
#if STRATA_HAS_S3
  const auto where = strata::parse_s3_url(url);
  strata::object_store_options so;
  so.bucket = where.bucket;
  so.prefix = where.prefix;
  return strata::any_tier::make<strata::object_store_tier>(so);
#else
  config_fail(fmt::format("strata: {}: this build of strata has no S3 tier (it needs libcurl and libcrypto when built)",
                          url));
#endif
}

// --- results ----------------------------------------------------------------------------------

nb::list paths_of(const std::vector<strata::path_traffic>& v) {
  nb::list out;
  for (const auto& p : v) {
    nb::dict d;
    d["name"] = p.name;
    d["read_bandwidth"] = p.read_bandwidth;
    d["write_bandwidth"] = p.write_bandwidth;
    d["bytes_read"] = p.bytes_read;
    d["bytes_written"] = p.bytes_written;
    out.append(d);
  }
  return out;
}

nb::dict step_stats_of(const strata::offload_step_stats& s) {
  nb::dict d;
  d["step"] = s.step;
  d["subgroups"] = s.subgroups;
  d["read_wait_s"] = s.read_wait_s;
  d["compute_s"] = s.compute_s;
  d["kernel_s"] = s.kernel_s;
  d["write_wait_s"] = s.write_wait_s;
  d["total_s"] = s.total_s;
  d["cache_hits"] = s.cache_hits;
  d["cache_misses"] = s.cache_misses;
  d["prefetched"] = s.prefetched;
  d["prefetched_bytes"] = s.prefetched_bytes;
  d["writes_left"] = s.writes_left;
  d["writes_left_bytes"] = s.writes_left_bytes;
  d["early_updates"] = s.early_updates;
  d["speculative_updates"] = s.speculative_updates;
  d["early_bytes_read"] = s.early_bytes_read;
  d["bytes_read"] = s.bytes_read;
  d["bytes_written"] = s.bytes_written;
  d["paths"] = paths_of(s.paths);
  d["skipped"] = s.skipped;
  d["grad_norm"] = s.grad_norm ? nb::cast(*s.grad_norm) : nb::none();
  d["clip"] = s.clip;
  d["loss_scale"] = s.loss_scale;
  return d;
}

nb::dict stats_of(const strata::offload_stats& s) {
  nb::dict d;
  d["steps"] = s.steps;
  d["skipped_steps"] = s.skipped_steps;
  d["last"] = step_stats_of(s.last);
  d["cache_hits"] = s.cache_hits;
  d["cache_misses"] = s.cache_misses;
  d["bytes_read"] = s.bytes_read;
  d["bytes_written"] = s.bytes_written;
  d["gradient_bytes_written"] = s.gradient_bytes_written;
  d["host_memory_used"] = s.host_memory_used;
  d["host_memory_peak"] = s.host_memory_peak;
  d["host_memory_budget"] = s.host_memory_budget;
  d["cache_slots"] = s.cache_slots;
  d["pipeline_slots"] = s.pipeline_slots;
  return d;
}

// --- the optimizer ----------------------------------------------------------------------------

class optimizer {
 public:
  explicit optimizer(strata::any_offloaded_optimizer o)
      : o_(std::make_shared<strata::any_offloaded_optimizer>(std::move(o))) {}

  strata::any_offloaded_optimizer& get() { return *ptr(); }
  // A reference that keeps the optimizer alive through a call that releases the GIL, so that
  // close() from another thread meanwhile cannot free it under the call.
  std::shared_ptr<strata::any_offloaded_optimizer> ptr() {
    if (!o_) config_fail("strata: the optimizer was closed");
    return o_;
  }

  void close() noexcept {
    o_.reset();
    declared_model = nb::object();
  }

  // The model copy a declared step (begin_step) writes into, kept alive until its step().
  nb::object declared_model;

 private:
  std::shared_ptr<strata::any_offloaded_optimizer> o_;
};

// [(first, steps), ...] as param_steps' runs.
std::vector<strata::param_step_run> step_runs_of(nb::handle h) {
  std::vector<strata::param_step_run> runs;
  if (h.is_none()) return runs;
  for (nb::handle r : h) {
    auto t = nb::cast<nb::tuple>(r);
    if (t.size() != 2) config_fail("strata: a step run is (first parameter, steps)");
    runs.push_back({nb::cast<std::size_t>(t[0]), nb::cast<std::uint64_t>(t[1])});
  }
  return runs;
}

std::unique_ptr<optimizer> load(const std::string& dir, nb::kwargs kw) {
  const auto c = config_of(nb::dict(kw));
  nb::gil_scoped_release unlocked;
  if (is_s3(dir)) {
    auto store = store_of(dir);
    return std::make_unique<optimizer>(strata::load_offloaded_optimizer(c, store));
  }
  return std::make_unique<optimizer>(strata::load_offloaded_optimizer(c, dir));
}

void accept_gradients(optimizer& self, std::size_t first, const array& g) {
  check_flat(g, "the gradient");
  const dtype_kind k = kind_of(g, "the gradient");
  const auto keep = self.ptr();
  auto& o = *keep;
  nb::gil_scoped_release unlocked;
  switch (k) {
    case dtype_kind::f32: return o.accept_gradients_at(first, span_of<const float>(g));
    case dtype_kind::bf16: return o.accept_gradients_at(first, span_of<const strata::bf16>(g));
    case dtype_kind::f16: return o.accept_gradients_at(first, span_of<const strata::fp16>(g));
  }
}

void begin_step(optimizer& self, nb::handle rates_in, nb::handle model_in) {
  const auto rates = rates_of(rates_in);
  const auto model = optional_array(model_in);
  std::optional<strata::host_model_span> out;
  if (model) out = model_span(*model);
  const auto keep = self.ptr();
  auto& o = *keep;
  {
    nb::gil_scoped_release unlocked;
    if (out)
      o.begin_step(rates, *out);
    else
      o.begin_step(rates);
  }
  if (model) self.declared_model = nb::borrow(model_in);
}

nb::dict step(optimizer& self, nb::handle rates_in, nb::handle grads_in, nb::handle model_in) {
  const auto rates = rates_of(rates_in);
  const auto grads = optional_array(grads_in);
  const auto model = optional_array(model_in);
  std::optional<strata::host_model_span> out;
  if (model) out = model_span(*model);
  std::optional<dtype_kind> gk;
  if (grads) {
    check_flat(*grads, "the gradients");
    gk = kind_of(*grads, "the gradients");
  }
  const auto keep = self.ptr();
  auto& o = *keep;
  strata::offload_step_stats st;
  {
    nb::gil_scoped_release unlocked;
    if (!grads) {
      st = out ? o.step(rates, *out) : o.step(rates);
    } else {
      auto run = [&](auto g) { return out ? o.step(g, rates, *out) : o.step(g, rates); };
      switch (*gk) {
        case dtype_kind::f32: st = run(span_of<const float>(*grads)); break;
        case dtype_kind::bf16: st = run(span_of<const strata::bf16>(*grads)); break;
        case dtype_kind::f16: st = run(span_of<const strata::fp16>(*grads)); break;
      }
    }
  }
  self.declared_model = nb::object();
  return step_stats_of(st);
}

// A step's tensors, [(first, count, grad or None, weights or None), ...], every array host,
// contiguous and of one floating dtype.
struct tensor_list {
  struct item {
    std::size_t first, count;
    std::optional<array> grad, model;
  };
  std::vector<item> items;
  dtype_kind kind = dtype_kind::f32;
};

tensor_list tensors_of(nb::handle list) {
  tensor_list out;
  std::optional<dtype_kind> kind;
  const auto take_array = [&](nb::handle h, const char* what) -> std::optional<array> {
    if (h.is_none()) return std::nullopt;
    auto a = nb::cast<array>(h, false);
    check_flat(a, what);
    const dtype_kind k = kind_of(a, what);
    if (kind && *kind != k) config_fail("strata: the tensors of one step must share one dtype");
    kind = k;
    return a;
  };
  for (nb::handle h : list) {
    auto t = nb::cast<nb::tuple>(h);
    if (t.size() != 4) config_fail("strata: a tensor is (first parameter, count, gradients or None, weights or None)");
    out.items.push_back({nb::cast<std::size_t>(t[0]), nb::cast<std::size_t>(t[1]), take_array(t[2], "a gradient"),
                         take_array(t[3], "a tensor's weights")});
  }
  out.kind = kind.value_or(dtype_kind::f32);
  return out;
}

// Calls fn(std::vector<param_tensor<T, T>>) with the list's arrays as spans of their dtype.
template <class F>
auto with_tensors(const tensor_list& list, F&& fn) {
  const auto as = [&](auto tag) {
    using T = decltype(tag);
    std::vector<strata::param_tensor<T, T>> v;
    v.reserve(list.items.size());
    for (const auto& i : list.items)
      v.push_back({i.first, i.count, i.grad ? span_of<const T>(*i.grad) : std::span<const T>(),
                   i.model ? span_of<T>(*i.model) : std::span<T>()});
    return fn(std::span<const strata::param_tensor<T, T>>(v));
  };
  switch (list.kind) {
    case dtype_kind::f32: return as(float{});
    case dtype_kind::bf16: return as(strata::bf16{});
    case dtype_kind::f16: break;
  }
  return as(strata::fp16{});
}

// `params`: one flat array, or tensors [(first, count, None, weights), ...] covering every
// parameter once (no flat copy of the model is made).
// A rule's state by array name, {name: array} (fp32, one value per parameter).
struct named_state {
  std::vector<std::string> names;
  std::vector<strata::named_array> arrays;
};
named_state named_state_of(nb::handle h) {
  named_state out;
  if (h.is_none()) return out;
  auto d = nb::cast<nb::dict>(h);
  out.names.reserve(d.size());
  for (auto [k, v] : d) {
    out.names.push_back(nb::cast<std::string>(k));
    const auto a = nb::cast<array>(v, false);
    out.arrays.push_back({{}, floats(a, out.names.back().c_str())});
  }
  for (std::size_t i = 0; i < out.arrays.size(); ++i) out.arrays[i].name = out.names[i];
  return out;
}

// `params`: one flat array, or tensors [(first, count, None, weights), ...] covering every
// parameter once (no flat copy of the model is made). Existing state: AdamW's moments by keyword,
// or any rule's arrays by name in `state`.
std::unique_ptr<optimizer> create(nb::handle params, nb::handle exp_avg, nb::handle exp_avg_sq,
                                  nb::handle max_exp_avg_sq, std::uint64_t step, nb::handle step_runs,
                                  nb::handle state_in, nb::kwargs kw) {
  const auto c = config_of(nb::dict(kw));
  const auto m = optional_array(exp_avg);
  const auto v = optional_array(exp_avg_sq);
  const auto vmax = optional_array(max_exp_avg_sq);
  const auto runs = step_runs_of(step_runs);
  const auto named = named_state_of(state_in);
  if (!named.arrays.empty() && (m || v || vmax))
    config_fail("strata: give the state by name (state=) or as AdamW's moments, not both");
  strata::adamw_state_view state;
  if (m) state.exp_avg = floats(*m, "exp_avg");
  if (v) state.exp_avg_sq = floats(*v, "exp_avg_sq");
  if (vmax) state.max_exp_avg_sq = floats(*vmax, "max_exp_avg_sq");
  state.step = step;
  state.step_runs = runs;
  const strata::rule_state_view rule_state{named.arrays, step, runs};
  const bool adamw = c.rule == "adamw" || c.rule == "adamw-bf16" || c.rule == "adamw-8bit";
  if (!adamw && (m || v || vmax))
    config_fail(fmt::format("strata: exp_avg, exp_avg_sq and max_exp_avg_sq are AdamW's; rule '{}' takes state=",
                            c.rule));
  const auto build = [&](strata::host_weights w) {
    nb::gil_scoped_release unlocked;
    if (adamw && named.arrays.empty()) return std::make_unique<optimizer>(strata::make_offloaded_adamw(c, w, state));
    return std::make_unique<optimizer>(strata::make_offloaded_optimizer(c, w, rule_state));
  };
  if (nb::isinstance<nb::list>(params) || nb::isinstance<nb::tuple>(params)) {
    const auto list = tensors_of(params);
    return with_tensors(list, [&](auto tensors) { return build(strata::host_weights(tensors)); });
  }
  const auto a = nb::cast<array>(params, false);
  check_flat(a, "params");
  switch (kind_of(a, "params")) {
    case dtype_kind::f32: return build(strata::host_weights(span_of<const float>(a)));
    case dtype_kind::bf16: return build(strata::host_weights(span_of<const strata::bf16>(a)));
    case dtype_kind::f16: break;
  }
  return build(strata::host_weights(span_of<const strata::fp16>(a)));
}

nb::dict step_tensors(optimizer& self, nb::handle rates_in, nb::handle tensors_in, bool adopt_model,
                      nb::handle decision_in) {
  const auto rates = rates_of(rates_in);
  const auto list = tensors_of(tensors_in);
  strata::step_options opts;
  opts.adopt_model = adopt_model;
  if (!decision_in.is_none()) {
    auto t = nb::cast<nb::tuple>(decision_in);
    if (t.size() != 3) config_fail("strata: a step decision is (skip, grad_norm, clip)");
    opts.decision = strata::step_decision{nb::cast<bool>(t[0]), nb::cast<double>(t[1]), nb::cast<float>(t[2])};
  }
  const auto keep = self.ptr();
  auto& o = *keep;
  strata::offload_step_stats st;
  with_tensors(list, [&](auto tensors) {
    nb::gil_scoped_release unlocked;
    st = o.step(tensors, rates, opts);
  });
  return step_stats_of(st);
}

nb::tuple gradient_stats(optimizer& self, nb::handle tensors_in) {
  const auto list = tensors_of(tensors_in);
  const auto keep = self.ptr();
  auto& o = *keep;
  strata::grad_stats g;
  with_tensors(list, [&](auto tensors) {
    nb::gil_scoped_release unlocked;
    g = o.gradient_stats(tensors);
  });
  return nb::make_tuple(g.sum_squares, g.count);
}

std::span<float> out_floats(const array& a, const char* what) {
  check_flat(a, what);
  if (kind_of(a, what) != dtype_kind::f32) config_fail(fmt::format("strata: {} must be float32", what));
  return span_of<float>(a);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "strata's native optimizer (see strata.torch for the PyTorch optimizer)";
  m.attr("__version__") = strata::version_string;

  errors.error = new_error_class(m, "Error", "Base of strata's errors; the text names what failed.", {PyExc_RuntimeError});
  errors.config = new_error_class(m, "ConfigError", "An invalid option, argument or call order.",
                                  {errors.error, PyExc_ValueError});
  errors.busy = new_error_class(m, "BusyError", "A resource (a directory, an object prefix) is in use by another owner.",
                                {errors.error});
  errors.foreign_file = new_error_class(
      m, "ForeignFileError", "A file strata did not create is in the way (strata never deletes it).", {errors.busy});
  errors.capacity = new_error_class(m, "CapacityError", "A tier or a memory budget is full.", {errors.error});
  errors.io = new_error_class(m, "IOError", "A read, write or sync failed; the text has the path and errno.",
                              {errors.error, PyExc_OSError});
  errors.integrity = new_error_class(m, "IntegrityError",
                                     "Stored state failed its checksum or a checkpoint is damaged or incomplete.",
                                     {errors.error});
  errors.stream = new_error_class(m, "StreamError", "An asynchronous transfer failed.", {errors.error});
  errors.cuda = new_error_class(m, "CudaError", "A CUDA call failed.", {errors.stream});
  nb::register_exception_translator(translate);

  m.def(
      "decide_step",
      [](double sum_squares, nb::handle max_grad_norm) {
        const auto d = strata::decide_step(
            sum_squares, max_grad_norm.is_none() ? std::nullopt : std::optional<double>(nb::cast<double>(max_grad_norm)));
        return nb::make_tuple(d.skip, d.grad_norm, d.clip);
      },
      "sum_squares"_a, "max_grad_norm"_a = nb::none(),
      "(skip, grad_norm, clip) of a step whose gradients' squares add up to sum_squares (strata's own rule).");

  m.def(
      "verify_checkpoint",
      [](const std::string& dir) {
        std::uint64_t step = 0;
        if (is_s3(dir)) {
          auto store = store_of(dir);
          nb::gil_scoped_release unlocked;
          return strata::verify_checkpoint(store).step;
        }
        {
          nb::gil_scoped_release unlocked;
          step = strata::verify_checkpoint(dir).step;
        }
        return step;
      },
      "directory"_a,
      "Reads the whole checkpoint (a directory or s3://bucket/prefix) back against its checksums; returns its step "
      "(IntegrityError if damaged).");

  m.def(
      "remove_store_checkpoint",
      [](const std::string& url) {
        auto store = store_of(url);
        nb::gil_scoped_release unlocked;
        return strata::remove_checkpoint(store);
      },
      "url"_a, "Removes the checkpoint at s3://bucket/prefix (its parts, manifest and pointer; nothing else).");

  m.def(
      "remove_checkpoint",
      [](const std::string& dir) {
        nb::gil_scoped_release unlocked;
        return strata::remove_checkpoint(std::filesystem::path(dir));
      },
      "directory"_a,
      "Removes the checkpoint in a directory: the files strata's journal there names (a checkpoint without one, "
      "from an earlier release, only when its data matches its manifest); nothing else, not the directory.");

  m.attr("has_s3") = bool(STRATA_HAS_S3);

  m.def(
      "validate_state",
      [](std::size_t params, bool amsgrad, const array& m_in, const array& v_in, nb::handle vmax_in) {
        strata::adamw_state_view st;
        st.exp_avg = floats(m_in, "exp_avg");
        st.exp_avg_sq = floats(v_in, "exp_avg_sq");
        const auto vmax = optional_array(vmax_in);
        if (vmax) st.max_exp_avg_sq = floats(*vmax, "max_exp_avg_sq");
        nb::gil_scoped_release unlocked;
        st.validate(params, amsgrad, "strata");
      },
      "params"_a, "amsgrad"_a, "exp_avg"_a, "exp_avg_sq"_a, "max_exp_avg_sq"_a = nb::none(),
      "Checks AdamW state before it replaces anything (ConfigError naming the array and index).");

  nb::class_<optimizer>(m, "Optimizer",
                        "strata's offloaded optimizer (AdamW, AdamW with bf16 moments, SGD or Lion) over flat parameters (the state "
                        "lives on the paths).")
      .def_static("create", &create, "params"_a, "exp_avg"_a = nb::none(), "exp_avg_sq"_a = nb::none(),
                  "max_exp_avg_sq"_a = nb::none(), "step"_a = 0, "step_runs"_a = nb::none(), "state"_a = nb::none(),
                  "options"_a,
                  "Builds the optimizer from fp32, bf16 or fp16 weights (and, optionally, existing AdamW moments and step, "
                  "with step_runs [(first, steps), ...] when the parameters' step counts differ).")
      .def_static("load", &load, "directory"_a, "options"_a, "Restores the checkpoint in `directory` onto the paths.")
      .def("accept_gradients", &accept_gradients, "first"_a, "grads"_a,
           "Hands over gradients of parameters [first, first + grads.numel()) for the next step.")
      .def("discard_gradients",
           [](optimizer& self) {
             const auto keep = self.ptr();
             auto& o = *keep;
             nb::gil_scoped_release unlocked;
             o.discard_gradients();
           })
      .def("begin_step", &begin_step, "rates"_a, "model"_a = nb::none(),
           "Declares the next step before backward (its rates, and the host array that will receive its weights, "
           "kept alive until step()): each subgroup whose gradients are all handed over (accept_gradients) is then "
           "updated while the others are still coming (update_as_gradients_land; with clipping or loss scaling, on a copy "
           "that step() adopts when it neither clips nor skips: speculate_updates); step() with the same rates and "
           "model finishes it, bit-identical to a step without the declaration.")
      .def("step", &step, "rates"_a, "grads"_a = nb::none(), "model"_a = nb::none(),
           "One step: `rates` is a learning rate or a list of (first, count, lr, weight_decay); `grads` all "
           "gradients (or None: those handed over); `model` receives the updated weights in its own dtype.")
      .def("step_tensors", &step_tensors, "rates"_a, "tensors"_a, "adopt_model"_a = true, "decision"_a = nb::none(),
           "One step over tensors [(first, count, grad or None, weights or None), ...] (ascending, disjoint, one "
           "dtype): each tensor's weights are updated in place; tensors without a gradient are left as they are. "
           "With adopt_model the weights are also the truth the master weights follow where they were written. "
           "`decision` (skip, grad_norm, clip) is the whole model's, from gradient_stats and decide_step.")
      .def("gradient_stats", &gradient_stats, "tensors"_a,
           "(sum of squares, count) of the tensors' gradients, unscaled by the loss scale.")
      .def("restore_loss_scale",
           [](optimizer& self, float scale, std::int64_t tracker) { self.get().restore_loss_scale(scale, tracker); })
      .def_prop_ro("loss_growth_tracker", [](optimizer& self) { return self.get().loss_growth_tracker(); })
      .def_prop_ro(
          "param_steps",
          [](optimizer& self) {
            nb::list out;
            for (const auto& r : self.get().param_step_counts().runs()) out.append(nb::make_tuple(r.first, r.steps));
            return out;
          },
          "Steps each parameter has taken, as runs [(first parameter, steps), ...].")
      .def("read_master",
           [](optimizer& self, const array& out) {
             auto s = out_floats(out, "the master weights' output");
             const auto keep = self.ptr();
             auto& o = *keep;
             nb::gil_scoped_release unlocked;
             o.read_master(s);
           })
      .def("read_state",
           [](optimizer& self, const std::string& name, const array& out) {
             auto s = out_floats(out, "the state's output");
             const auto keep = self.ptr();
             auto& o = *keep;
             nb::gil_scoped_release unlocked;
             o.read_state(name, s);
           },
           "name"_a, "out"_a, "Reads one array of the rule's state (state_format) into `out` (fp32).")
      .def("read_moments",
           [](optimizer& self, const array& m_out, const array& v_out) {
             auto ms = out_floats(m_out, "exp_avg's output");
             auto vs = out_floats(v_out, "exp_avg_sq's output");
             const auto keep = self.ptr();
             auto& o = *keep;
             nb::gil_scoped_release unlocked;
             o.read_moments(ms, vs);
           })
      .def("read_max_exp_avg_sq",
           [](optimizer& self, const array& out) {
             auto s = out_floats(out, "max_exp_avg_sq's output");
             const auto keep = self.ptr();
             auto& o = *keep;
             nb::gil_scoped_release unlocked;
             o.read_max_exp_avg_sq(s);
           })
      .def(
          "save",
          [](optimizer& self, const std::string& dir, nb::handle tensors_in) {
            const auto keep = self.ptr();
            auto& o = *keep;
            std::optional<strata::any_tier> store;
            if (is_s3(dir)) store = store_of(dir);
            if (tensors_in.is_none()) {
              nb::gil_scoped_release unlocked;
              if (store)
                o.save(*store);
              else
                o.save(dir);
              return;
            }
            const auto list = tensors_of(tensors_in);
            with_tensors(list, [&](auto tensors) {
              nb::gil_scoped_release unlocked;
              if (store)
                o.save(*store, tensors);
              else
                o.save(std::filesystem::path(dir), tensors);
            });
          },
          "directory"_a, "tensors"_a = nb::none(),
          "Writes a checkpoint; with `tensors` (as step_tensors), its master weights follow their weights where "
          "they were written.")
      .def("flush",
           [](optimizer& self) {
             const auto keep = self.ptr();
             auto& o = *keep;
             nb::gil_scoped_release unlocked;
             o.flush();
           })
      .def("remove_state",
           [](optimizer& self) {
             const auto keep = self.ptr();
             auto& o = *keep;
             nb::gil_scoped_release unlocked;
             return o.remove_state();
           })
      .def("close", &optimizer::close, "Releases the paths (the state stays; save() first to keep it).")
      .def("stats", [](optimizer& self) { return stats_of(self.get().stats()); })
      .def("path_totals", [](optimizer& self) { return paths_of(self.get().path_totals()); })
      .def_prop_ro("step_count", [](optimizer& self) { return self.get().step_count(); })
      .def_prop_ro("loss_scale", [](optimizer& self) { return self.get().loss_scale(); })
      .def_prop_ro("size", [](optimizer& self) { return self.get().size(); })
      .def_prop_ro("preset", [](optimizer& self) { return std::string(self.get().preset()); })
      .def_prop_ro("rule", [](optimizer& self) { return std::string(self.get().rule()); },
                   "The update rule's tag: 'adamw', 'adamw-bf16', 'adamw-8bit', 'sgd' or 'lion'.")
      .def_prop_ro(
          "state_format",
          [](optimizer& self) {
            nb::list out;
            const auto& f = self.get().state_format();
            for (std::size_t i = 0; i < f.count; ++i)
              out.append(nb::make_tuple(std::string(f.arrays[i].name), std::string(strata::to_string(f.arrays[i].element))));
            return out;
          },
          "The rule's state arrays after the fp32 master: [(name, 'f32' or 'bf16'), ...].")
      .def_prop_ro("subgroup_size", [](optimizer& self) { return self.get().offload().subgroup_elems; })
      .def_prop_ro(
          "gradients", [](optimizer& self) { return std::string(strata::to_string(self.get().offload().gradients)); },
          "Where handed-over gradients wait: 'host' or 'tier' ('automatic' resolved by the budget).");
}
