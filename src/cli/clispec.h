/* Speculative decoding on the command line, shared by run, serve and bench:
 *
 *   --spec ngram|draft|mtp|off   the proposer (default: draft with --draft, else off)
 *   --draft MODEL                a draft model: a GGUF file, a directory or org/repo[:quant]
 *   --spec-k N                   draft tokens per step at most (1..16, default 4)
 *   --spec-max-batch N           no speculation in a step with more decoding sequences
 *                                (default 8)
 *   --spec-fixed                 propose k tokens every step (no adaptive k: measurements)
 *
 * A draft runs on its own backend instance (the target's kind and device) with its own KV
 * store of the target's block count and size (engine/spec.h). Its vocabulary must be the
 * target's: the tokenizers must agree token for token; one may be longer than the other by
 * padding (at most CLI_SPEC_VOCAB_SLACK ids, as Qwen2.5's 0.5B and 7B files are), else the
 * draft is refused with both sizes and the first differing token. */
#ifndef SMELT_CLI_CLISPEC_H
#define SMELT_CLI_CLISPEC_H

#include <stdint.h>

#include "engine/memplan.h"
#include "engine/spec.h"
#include "util/err.h"

struct backend;
struct gguf_file;
struct kv_store;
struct model;
struct tok;

#define CLI_SPEC_VOCAB_SLACK 256

struct cli_spec {
    const char *kind;  /* --spec (NULL: not given) */
    const char *draft; /* --draft */
    int k, max_batch;  /* --spec-k, --spec-max-batch (0: default) */
    bool fixed;        /* --spec-fixed */
    /* the draft, once loaded */
    char path[4096];
    struct gguf_file *f;
    struct tok *tok;
    struct backend *bk;
    struct model *m;
    struct kv_store *kv;
    uint64_t device_b; /* device bytes the draft's weights and scratch hold (0 on the CPU) */
};

/* The options' lines for a command's --help. */
extern const char cli_spec_usage[];

/* When argv[*i] is one of the options, takes it (and its value: *i moves past it) and
 * returns 1; 0 when it is not; 2 (after a message naming the command) for a bad value. */
int cli_spec_arg(struct cli_spec *s, const char *cmd, int argc, char **argv, int *i);

/* The configuration the options ask for (kind SPEC_OFF when none); an inconsistent pair
 * (--spec draft without --draft, --draft with another kind) is SMELT_ERR_INVALID. */
smelt_status cli_spec_config(const struct cli_spec *s, struct spec_config *out, struct err *e);

/* With --draft: loads the draft on a backend like the target's (name, device, threads),
 * checks its vocabulary against the target's tokenizer, and on a device measures its
 * largest steps (shape: the caller's, the draft running the same rows) so its scratch is
 * reserved before the target's KV pool is sized. With --spec mtp: makes the target model's
 * MTP head (model_mtp_new: it shares the target's weights and backend; refused, naming the
 * key, for a file without one). A no-op otherwise. */
smelt_status cli_spec_load(struct cli_spec *s, const char *backend, int device, int threads,
                           const struct tok *target, struct model *target_m,
                           const struct memplan_shape *shape, struct err *e);

/* KV bytes the draft (or the MTP head) takes per token (0 without one): the target's memory
 * plan adds it to its own, as the two pools have the same number of blocks. */
uint64_t cli_spec_kv_bytes(const struct cli_spec *s, uint32_t kv_type);

/* Allocates the draft's KV store (n_blocks of block_size) and points cfg at the draft. */
smelt_status cli_spec_kv(struct cli_spec *s, uint32_t kv_type, int32_t block_size,
                         int32_t n_blocks, struct spec_config *cfg, struct err *e);

void cli_spec_free(struct cli_spec *s);

#endif
