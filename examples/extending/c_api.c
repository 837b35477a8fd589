/* strata's offloaded AdamW driven from C through strata_c.h.
 *   c_api train DIR   trains a small model with its state in DIR/nvme and DIR/pfs, checks the first
 *                     step against AdamW's formula, saves a checkpoint and resumes it on other paths
 *                     (host memory): the resumed run must match the original bit for bit
 *   c_api errors DIR  bad calls return their status with strata's message
 * Exits 0 when every check holds, 1 otherwise, 2 on a usage error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata_c.h"

#define N ((size_t)1 << 16)
#define SUBGROUP ((size_t)1 << 13) /* 8 subgroups */

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (last error: %s)\n", what, strata_last_error());
    ++failures;
  }
}

/* Stops at a failed call: nothing after it could run. */
static void must(strata_status s, const char* call) {
  if (s != STRATA_OK) {
    fprintf(stderr, "%s failed with status %d: %s\n", call, (int)s, strata_last_error());
    exit(1);
  }
}

/* The gradient of sum((w - 0.25)^2) / 2, and that loss. */
static double gradients(const float* w, float* g) {
  double loss = 0;
  for (size_t i = 0; i < N; ++i) {
    g[i] = w[i] - 0.25f;
    loss += 0.5 * (double)g[i] * g[i];
  }
  return loss;
}

static int train(const char* dir) {
  char nvme[4096], pfs[4096], checkpoint[4096];
  snprintf(nvme, sizeof nvme, "%s/nvme", dir);
  snprintf(pfs, sizeof pfs, "%s/pfs", dir);
  snprintf(checkpoint, sizeof checkpoint, "%s/checkpoint", dir);
  float* w = malloc(N * sizeof(float));
  float* g = malloc(N * sizeof(float));
  float* kept = malloc(N * sizeof(float));
  if (!w || !g || !kept) return 1;
  for (size_t i = 0; i < N; ++i) w[i] = 0.5f;

  // doc-snippet: create
  const char* paths[] = {nvme, pfs};
  strata_adamw_config config;
  strata_adamw_config_init(&config); /* strata's defaults, then what differs */
  config.paths = paths;
  config.path_count = 2;
  config.lr = 1e-2;
  config.subgroup_elems = SUBGROUP;
  config.cache_subgroups = 3;
  config.threads = 2;
  strata_adamw* opt = NULL;
  must(strata_adamw_create(&config, w, N, &opt), "strata_adamw_create");
  // doc-snippet-end

  // doc-snippet: steps
  double first_loss = 0, loss = 0;
  for (int t = 0; t < 5; ++t) {
    loss = gradients(w, g);
    if (t == 0) first_loss = loss;
    strata_step_stats s;
    must(strata_adamw_step(opt, g, config.lr, w, &s), "strata_adamw_step"); /* updates w in place */
    printf("step %llu: loss %.4f, %llu cache hits, read %llu bytes\n", (unsigned long long)s.step, loss,
           (unsigned long long)s.cache_hits, (unsigned long long)s.bytes_read);
    if (t == 0) { /* AdamW's first step moves w by lr * g / (|g| + eps) after the decay */
      const double expected = 0.5 * (1 - config.lr * config.weight_decay) - config.lr * 0.25 / (0.25 + config.eps);
      expect(fabs(w[0] - expected) < 1e-6 && fabs(w[N - 1] - expected) < 1e-6, "the first step follows AdamW");
    }
  }
  expect(gradients(w, g) < first_loss, "the loss falls");
  // doc-snippet-end

  // doc-snippet: resume
  must(strata_adamw_save(opt, checkpoint), "strata_adamw_save");
  for (int t = 0; t < 2; ++t) {
    gradients(w, g);
    must(strata_adamw_step(opt, g, config.lr, w, NULL), "strata_adamw_step");
  }
  memcpy(kept, w, N * sizeof(float));

  const char* memory[] = {""}; /* "": a path in host memory */
  config.paths = memory;
  config.path_count = 1;
  strata_adamw* resumed = NULL;
  must(strata_adamw_load(&config, checkpoint, &resumed), "strata_adamw_load");
  must(strata_adamw_read_master(resumed, w), "strata_adamw_read_master"); /* fp32 model: the master weights */
  for (int t = 0; t < 2; ++t) {
    gradients(w, g);
    must(strata_adamw_step(resumed, g, config.lr, w, NULL), "strata_adamw_step");
  }
  const int same = memcmp(kept, w, N * sizeof(float)) == 0;
  expect(same && strata_adamw_step_count(resumed) == 7, "the resumed run matches the original bit for bit");
  printf("resumed from the checkpoint in host memory: step %llu, bit-identical: %s\n",
         (unsigned long long)strata_adamw_step_count(resumed), same ? "yes" : "NO");
  // doc-snippet-end

  /* A bf16 model, as a mixed-precision one is: gradients and weights as their bit patterns. */
  strata_adamw* half = NULL;
  uint16_t model16[16], grads16[16];
  float start[16];
  for (size_t i = 0; i < 16; ++i) start[i] = 0.5f, model16[i] = 0x3F00 /* 0.5 */, grads16[i] = 0x3E80 /* 0.25 */;
  config.subgroup_elems = 8;
  must(strata_adamw_create(&config, start, 16, &half), "strata_adamw_create");
  must(strata_adamw_step_bf16(half, grads16, config.lr, model16, NULL), "strata_adamw_step_bf16");
  must(strata_adamw_read_master(half, start), "strata_adamw_read_master");
  const uint32_t bits = (uint32_t)model16[15] << 16;
  float widened;
  memcpy(&widened, &bits, sizeof widened);
  expect(fabsf(widened - start[15]) <= start[15] / 256, "the bf16 model is the master weight, rounded");
  strata_adamw_destroy(half);

  size_t removed = 0;
  must(strata_adamw_remove_state(opt, &removed), "strata_adamw_remove_state");
  expect(removed == N / SUBGROUP, "remove_state removes one object per subgroup");
  strata_adamw_destroy(opt);
  strata_adamw_destroy(resumed);
  free(w);
  free(g);
  free(kept);
  return failures == 0 ? 0 : 1;
}

// doc-snippet: errors
/* A failed call returns its status and leaves strata's message, which names what was wrong. */
static void expect_error(strata_status got, strata_status want, const char* needle, const char* what) {
  const int ok = got == want && strstr(strata_last_error(), needle) != NULL;
  printf("%s: status %d, \"%s\"\n", what, (int)got, strata_last_error());
  expect(ok, what);
}

static int errors(const char* dir) {
  float w[16] = {0}, g[16] = {0};
  const char* memory[] = {""};
  strata_adamw_config config;
  strata_adamw_config_init(&config);
  config.paths = memory;
  config.path_count = 1;
  config.subgroup_elems = 8;
  strata_adamw* opt = NULL;

  config.preset = "adam";
  expect_error(strata_adamw_create(&config, w, 16, &opt), STRATA_CONFIG_ERROR, "unknown preset 'adam'", "bad preset");
  expect(opt == NULL, "a failed create gives no handle");
  config.preset = "strata";
  config.beta1 = 1.5;
  expect_error(strata_adamw_create(&config, w, 16, &opt), STRATA_CONFIG_ERROR, "beta1 1.5", "bad beta1");
  config.beta1 = 0.9;
  config.path_count = 0;
  expect_error(strata_adamw_create(&config, w, 16, &opt), STRATA_CONFIG_ERROR, "no paths", "no paths");
  config.path_count = 1;

  char missing[4096];
  snprintf(missing, sizeof missing, "%s/no-such-checkpoint", dir);
  expect_error(strata_adamw_load(&config, missing, &opt), STRATA_IO_ERROR, "no-such-checkpoint", "missing checkpoint");

  must(strata_adamw_create(&config, w, 16, &opt), "strata_adamw_create");
  expect_error(strata_adamw_step(opt, NULL, 1e-3, w, NULL), STRATA_CONFIG_ERROR, "grads is NULL", "NULL gradients");
  expect_error(strata_adamw_step(opt, g, -1.0, w, NULL), STRATA_CONFIG_ERROR, "-1", "negative lr");
  must(strata_adamw_step(opt, g, 1e-3, w, NULL), "strata_adamw_step");
  expect(strcmp(strata_last_error(), "") == 0 && strata_adamw_step_count(opt) == 1, "a good call clears the error");
  strata_adamw_destroy(opt);
  return failures == 0 ? 0 : 1;
}
// doc-snippet-end

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "train") == 0) return train(argv[2]);
  if (argc == 3 && strcmp(argv[1], "errors") == 0) return errors(argv[2]);
  fprintf(stderr, "usage: c_api train|errors DIR\n");
  return 2;
}
