/* strata_c.h: a C interface to strata's run-time offloaded AdamW (make_offloaded_adamw), written
 * outside the library (docs/extending.md). C programs, and any language with a C foreign-function
 * interface (Python's ctypes, Rust, Go, Julia, Fortran), load libstrata_c and drive it.
 *
 * Conventions: every call that can fail returns a strata_status; on failure
 * strata_last_error() gives the C++ exception's message (per thread). Handles are opaque; sizes are
 * the parameter count given at creation. No call keeps a pointer it was given. */
#ifndef STRATA_C_H
#define STRATA_C_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define STRATA_C_API __attribute__((visibility("default")))
#else
#define STRATA_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

// doc-snippet: status
/* What a call returns: STRATA_OK, or which of strata's exceptions it caught. */
typedef enum strata_status {
  STRATA_OK = 0,
  STRATA_CONFIG_ERROR = 1,    /* strata::config_error: an invalid option, size or argument */
  STRATA_IO_ERROR = 2,        /* strata::io_error: a system call on a file failed */
  STRATA_CAPACITY_ERROR = 3,  /* strata::capacity_error: a budget, a disk or a device is full */
  STRATA_INTEGRITY_ERROR = 4, /* strata::integrity_error: stored state fails its checksum */
  STRATA_BUSY_ERROR = 5,      /* strata::busy_error: another run owns a directory or file */
  STRATA_ERROR = 6            /* anything else (another strata::error, out of memory) */
} strata_status;

/* The message of this thread's last failed call ("" when the last call succeeded). */
STRATA_C_API const char* strata_last_error(void);
// doc-snippet-end

// doc-snippet: config
/* What make_offloaded_adamw needs, in C. Fill it with strata_adamw_config_init (strata's own
 * defaults), then set what differs. */
typedef struct strata_adamw_config {
  const char* preset;       /* "strata", "mlp_offload" or "zero_infinity" */
  const char* const* paths; /* where the state lives: directories; "" keeps a path in host memory */
  size_t path_count;
  double lr, beta1, beta2, eps, weight_decay;
  size_t subgroup_elems;  /* parameters per subgroup, the unit of transfer and caching */
  size_t cache_subgroups; /* subgroups kept in host memory between steps */
  size_t threads;         /* CPU threads of the update */
} strata_adamw_config;

STRATA_C_API void strata_adamw_config_init(strata_adamw_config* config);
// doc-snippet-end

/* One step's figures (offload_step_stats). */
typedef struct strata_step_stats {
  uint64_t step;          /* steps taken after this one */
  uint64_t cache_hits;    /* subgroups found in host memory */
  uint64_t cache_misses;  /* subgroups read from a path */
  uint64_t bytes_read;
  uint64_t bytes_written;
  double seconds;
} strata_step_stats;

typedef struct strata_adamw strata_adamw; /* an optimizer; opaque */

/* Creates an optimizer over `count` parameters starting from `params` (fp32). */
STRATA_C_API strata_status strata_adamw_create(const strata_adamw_config* config, const float* params, size_t count,
                                               strata_adamw** out);
/* Creates one from the checkpoint in `dir` (strata_adamw_save), on the paths of `config`. */
STRATA_C_API strata_status strata_adamw_load(const strata_adamw_config* config, const char* dir, strata_adamw** out);
/* One step with fp32 gradients; writes the updated weights into `model` unless it is NULL.
 * `stats` may be NULL. */
STRATA_C_API strata_status strata_adamw_step(strata_adamw* opt, const float* grads, double lr, float* model,
                                             strata_step_stats* stats);
/* As above with bf16 gradients and model, as their bit patterns (C has no bf16 type). */
STRATA_C_API strata_status strata_adamw_step_bf16(strata_adamw* opt, const uint16_t* grads, double lr,
                                                  uint16_t* model, strata_step_stats* stats);
/* Copies the fp32 master weights into `out` (size() floats). */
STRATA_C_API strata_status strata_adamw_read_master(strata_adamw* opt, float* out);
/* Writes a checkpoint into `dir` (crash-safe: the previous one stays loadable until this one is). */
STRATA_C_API strata_status strata_adamw_save(strata_adamw* opt, const char* dir);
/* Removes the state objects this optimizer made on its paths; `removed` (may be NULL) gets their count. */
STRATA_C_API strata_status strata_adamw_remove_state(strata_adamw* opt, size_t* removed);
STRATA_C_API size_t strata_adamw_size(const strata_adamw* opt);
STRATA_C_API uint64_t strata_adamw_step_count(const strata_adamw* opt);
/* Frees the optimizer (NULL is ignored). Its state stays on its paths: remove_state first to drop it. */
STRATA_C_API void strata_adamw_destroy(strata_adamw* opt);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_C_H */
