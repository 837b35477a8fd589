// The C interface of strata_c.h over make_offloaded_adamw / any_offloaded_adamw: a shared library
// whose only exported symbols are the extern "C" functions (the library is built with hidden
// visibility), so strata's templates stay inside it.
#include "strata_c.h"

#include <exception>
#include <memory>
#include <optional>
#include <new>
#include <span>
#include <string>
#include <utility>

#include <strata/strata.hpp>

// doc-snippet: handle
// The opaque handle: C sees a pointer to it, C++ keeps the run-time optimizer inside.
struct strata_adamw {
  std::optional<strata::any_offloaded_adamw> opt;
};
// doc-snippet-end

namespace {

thread_local std::string last_error;

// doc-snippet: guarded
// The status of a failed call, with its message kept for strata_last_error.
strata_status fail(strata_status status, const char* what) noexcept {
  try {
    last_error = what;
  } catch (const std::bad_alloc&) {
    last_error.clear();  // no memory for the message: the status still says what failed
  }
  return status;
}

// Runs `f`; an exception becomes its status and this thread's message. Nothing crosses into C.
template <class F>
strata_status guarded(F&& f) noexcept {
  try {
    std::forward<F>(f)();
    last_error.clear();
    return STRATA_OK;
  } catch (const strata::config_error& e) {
    return fail(STRATA_CONFIG_ERROR, e.what());
  } catch (const strata::io_error& e) {
    return fail(STRATA_IO_ERROR, e.what());
  } catch (const strata::capacity_error& e) {
    return fail(STRATA_CAPACITY_ERROR, e.what());
  } catch (const strata::integrity_error& e) {
    return fail(STRATA_INTEGRITY_ERROR, e.what());
  } catch (const strata::busy_error& e) {
    return fail(STRATA_BUSY_ERROR, e.what());
  } catch (const std::exception& e) {
    return fail(STRATA_ERROR, e.what());
  } catch (...) {
    return fail(STRATA_ERROR, "unknown exception");
  }
}
// doc-snippet-end

template <class T>
T* checked(T* p, const char* call, const char* what) {
  STRATA_EXPECTS(p != nullptr, strata::config_error, "{}: {} is NULL", call, what);
  return p;
}

// doc-snippet: config
strata::offloaded_adamw_config to_config(const strata_adamw_config* c, const char* call) {
  checked(c, call, "config");
  strata::offloaded_adamw_config config;
  config.preset = checked(c->preset, call, "config->preset");
  STRATA_EXPECTS(c->path_count == 0 || c->paths != nullptr, strata::config_error, "{}: config->paths is NULL", call);
  for (std::size_t i = 0; i < c->path_count; ++i) {
    strata::offload_path_config path;
    path.directory = checked(c->paths[i], call, "a path");  // "": host memory
    config.paths.push_back(std::move(path));
  }
  config.adamw = {.lr = c->lr, .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps, .weight_decay = c->weight_decay};
  config.offload.subgroup_elems = c->subgroup_elems;
  config.offload.cache_subgroups = c->cache_subgroups;
  config.offload.threads = c->threads;
  return config;  // make_offloaded_adamw validates every value and names the bad one
}
// doc-snippet-end

strata_step_stats to_stats(const strata::offload_step_stats& s) {
  return {s.step, s.cache_hits, s.cache_misses, s.bytes_read, s.bytes_written, s.total_s};
}

}  // namespace

extern "C" {

const char* strata_last_error(void) { return last_error.c_str(); }

// Defaults come from strata's own option structs, so C and C++ start from the same values.
void strata_adamw_config_init(strata_adamw_config* config) {
  if (config == nullptr) return;
  const strata::adamw_options adamw;
  const strata::offload_options offload;
  *config = {.preset = "strata",
             .paths = nullptr,
             .path_count = 0,
             .lr = adamw.lr,
             .beta1 = adamw.beta1,
             .beta2 = adamw.beta2,
             .eps = adamw.eps,
             .weight_decay = adamw.decay(),
             .subgroup_elems = offload.subgroup_elems,
             .cache_subgroups = 0,
             .threads = offload.threads};
}

// doc-snippet: create
strata_status strata_adamw_create(const strata_adamw_config* config, const float* params, size_t count,
                                  strata_adamw** out) {
  return guarded([&] {
    checked(out, "strata_adamw_create", "out");
    *out = nullptr;
    const auto c = to_config(config, "strata_adamw_create");
    auto handle = std::make_unique<strata_adamw>();
    handle->opt = strata::make_offloaded_adamw(
        c, std::span<const float>(count == 0 ? params : checked(params, "strata_adamw_create", "params"), count));
    *out = handle.release();
  });
}
// doc-snippet-end

strata_status strata_adamw_load(const strata_adamw_config* config, const char* dir, strata_adamw** out) {
  return guarded([&] {
    checked(out, "strata_adamw_load", "out");
    *out = nullptr;
    const auto c = to_config(config, "strata_adamw_load");
    auto handle = std::make_unique<strata_adamw>();
    handle->opt = strata::load_offloaded_adamw(c, checked(dir, "strata_adamw_load", "dir"));
    *out = handle.release();
  });
}

// doc-snippet: step
strata_status strata_adamw_step(strata_adamw* opt, const float* grads, double lr, float* model,
                                strata_step_stats* stats) {
  return guarded([&] {
    auto& o = *checked(opt, "strata_adamw_step", "opt")->opt;
    const std::span<const float> g(checked(grads, "strata_adamw_step", "grads"), o.size());
    const auto s = model == nullptr ? o.step(g, lr) : o.step(g, lr, std::span<float>(model, o.size()));
    if (stats != nullptr) *stats = to_stats(s);
  });
}
// doc-snippet-end

strata_status strata_adamw_step_bf16(strata_adamw* opt, const uint16_t* grads, double lr, uint16_t* model,
                                     strata_step_stats* stats) {
  static_assert(sizeof(strata::bf16) == sizeof(uint16_t));
  return guarded([&] {
    auto& o = *checked(opt, "strata_adamw_step_bf16", "opt")->opt;
    // strata::bf16 is its bit pattern, so the caller's uint16_t array is read as one.
    const std::span<const strata::bf16> g(
        reinterpret_cast<const strata::bf16*>(checked(grads, "strata_adamw_step_bf16", "grads")), o.size());
    const auto s = model == nullptr
                       ? o.step(g, lr)
                       : o.step(g, lr, std::span<strata::bf16>(reinterpret_cast<strata::bf16*>(model), o.size()));
    if (stats != nullptr) *stats = to_stats(s);
  });
}

strata_status strata_adamw_read_master(strata_adamw* opt, float* out) {
  return guarded([&] {
    auto& o = *checked(opt, "strata_adamw_read_master", "opt")->opt;
    o.read_master(std::span<float>(checked(out, "strata_adamw_read_master", "out"), o.size()));
  });
}

strata_status strata_adamw_save(strata_adamw* opt, const char* dir) {
  return guarded([&] {
    checked(opt, "strata_adamw_save", "opt")->opt->save(checked(dir, "strata_adamw_save", "dir"));
  });
}

strata_status strata_adamw_remove_state(strata_adamw* opt, size_t* removed) {
  return guarded([&] {
    const std::size_t n = checked(opt, "strata_adamw_remove_state", "opt")->opt->remove_state();
    if (removed != nullptr) *removed = n;
  });
}

size_t strata_adamw_size(const strata_adamw* opt) { return opt == nullptr ? 0 : opt->opt->size(); }
uint64_t strata_adamw_step_count(const strata_adamw* opt) { return opt == nullptr ? 0 : opt->opt->step_count(); }
void strata_adamw_destroy(strata_adamw* opt) { delete opt; }

}  // extern "C"
