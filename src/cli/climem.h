/* Loading a model with the device memory plan (engine/memplan.h), shared by the commands
 * that run one (serve, run, bench): one code path, so they size memory alike.
 *
 *   cli_model_load   checks the weights fit the device before uploading them, then loads;
 *   cli_mem_plan     measures the activation peak (warm-up steps of the command's largest
 *                    shapes), reserves it, sizes the KV pool and prints one line:
 *                    "smelt CMD: memory: weights W MiB, activations A MiB, KV pool T tokens
 *                    (K MiB)[, recurrent state S slots (R MiB)][, F MiB free of N MiB]".
 *                    The state slots are taken from the free memory before the pool.
 * On the CPU backend nothing is measured: the pool is the size asked for, the command's
 * need, or the command's CPU default. */
#ifndef SMELT_CLI_CLIMEM_H
#define SMELT_CLI_CLIMEM_H

#include <stdint.h>

#include "engine/memplan.h"
#include "util/err.h"

struct backend;
struct gguf_file;
struct model;

/* Checks the weights of f fit bk's device (name: the model, for the message), then
 * loads it. n_cpu_moe > 0 (--n-cpu-moe) on a device backend: the experts of the first
 * n_cpu_moe layers stay in host memory and run on a CPU backend of `threads` threads (0:
 * all cores); ignored on the CPU backend. */
smelt_status cli_model_load(const char *name, const struct gguf_file *f, struct backend *bk,
                            int32_t n_cpu_moe, int threads, struct model **out, struct err *e);

struct cli_mem_req {
    const char *cmd;          /* "serve", "run", "bench": the info line's prefix */
    const struct gguf_file *f;
    double gpu_util;          /* (0, 1]; 0: 0.9 */
    int64_t kv_size;          /* > 0: --kv-size */
    int64_t need;             /* > 0: the pool the command needs (run, bench); 0: fill */
    int64_t min_tokens;       /* a full context the pool must hold (0: none) */
    int64_t max_tokens;       /* cap on a filled pool (0: none) */
    int64_t cpu_tokens;       /* a filled pool on the CPU */
    int32_t n_slots;          /* recurrent state slots the command allocates (0: none) */
    uint64_t others_b;        /* device bytes other models of the process hold (memplan_in) */
    uint64_t *used_b;         /* when set: gets the device bytes this model holds (weights,
                               * activations, state, KV pool); 0 on the CPU */
    uint64_t extra_per_token; /* KV bytes per pool token besides the model's (a draft model's
                               * store of the same blocks: cli/clispec.h) */
    struct memplan_shape shape; /* the command's largest steps */
};

/* The KV pool size in tokens for r on m's backend (see the file comment). */
smelt_status cli_mem_plan(struct model *m, const struct cli_mem_req *r, int64_t *tokens,
                          struct err *e);

#endif
