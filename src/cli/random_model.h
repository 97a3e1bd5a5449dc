/* Random-weight models in the exact shapes, tensor names and metadata of real ones, for
 * benchmarks and tests (`smelt quantize --random PRESET OUT TYPE`). The llama/qwen presets
 * match ../shared/bench/mkmodel.py (same shapes, names, keys, synthetic SentencePiece vocab
 * of the real size); gemma3 presets follow the real Gemma 3 GGUF conventions.
 *
 * Weights come from a counter-based generator: element e of tensor i is a function of
 * (seed, i, e) only, so any row range can be produced by any thread, the file does not
 * depend on the thread count, and nothing is held in memory beyond the rows being
 * quantized. Values: approximately N(0, 1) (sum of four 16-bit uniforms, standardized)
 * times 0.02 for matrices and biases; 1 + 0.05 * that for norm weights (as mkmodel.py).
 */
#ifndef SMELT_CLI_RANDOM_MODEL_H
#define SMELT_CLI_RANDOM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/err.h"

/* A hybrid recurrent model's extra shape (qwen35: Gated DeltaNet layers between
 * full-attention ones). */
struct rm_hybrid {
    int interval;                 /* full attention on layers i with (i + 1) % interval == 0 */
    int k_heads, v_heads, head_k, head_v, conv; /* DeltaNet: ssm.group_count, time_step_rank, ... */
    int n_rot;                    /* partial rotary dims of the attention layers */
    int sections[4];              /* rope.dimension_sections */
    int n_mtp;                    /* MTP layers after the trunk (nextn_predict_layers) */
    int n_ff_shexp;               /* MoE (qwen35moe): a shared expert of this width beside
                                   * the routed ones, with its sigmoid gate; 0: none */
};

struct rm_preset {
    const char *name, *arch;
    int n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    float rope_base;
    bool tied, qkv_bias, qk_norm;
    bool gemma;         /* gemma3: post-attention/post-FFN norms, key/value_length, sliding window */
    int sliding_window; /* gemma3 and gpt-oss */
    int n_expert, n_expert_used, n_ff_exp; /* mixture of experts (0: dense) */
    const struct rm_hybrid *hybrid;        /* NULL: every layer is attention */
    bool oai; /* gpt-oss: output bias, sinks, post_attention_norm as the FFN's norm, router
               * and expert biases, YaRN (factor 32 over 4096), every other layer windowed */
};

/* RM_ROUTER: an MoE router, F32 like the converter writes it (never quantized). RM_DECAY:
 * -(1 + 0.05 N(0, 1)), a recurrent layer's log-decay scale (ssm_a). RM_CONV: a recurrent
 * layer's causal-conv kernel (ssm_conv1d, (d_conv, channels)), values as a matrix's but F32
 * like the converter writes it (never quantized; llama.cpp's ssm_conv op takes F32 only). */
enum rm_kind { RM_MATRIX, RM_NORM, RM_BIAS, RM_ROUTER, RM_DECAY, RM_CONV };

struct rm_tensor {
    char name[64];
    uint32_t n_dims;
    int64_t ne[3]; /* ne[0] is the row length; ne[2] > 1: a stack of expert matrices */
    enum rm_kind kind;
};

const struct rm_preset *rm_preset_find(const char *name);
/* "llama3-8b, llama3-1b, ..." for usage text. */
const char *rm_preset_names(void);

/* The tensor list in file order (mkmodel.py's order); *out is malloc'd, *n its length. */
smelt_status rm_tensors(const struct rm_preset *p, struct rm_tensor **out, int64_t *n,
                        struct err *e);

/* Sets the architecture, tokenizer (synthetic vocab) and general.* keys; file_type is
 * written as general.file_type. */
smelt_status rm_write_metadata(struct gguf_writer *w, const struct rm_preset *p,
                               uint32_t file_type, struct err *e);

/* Rows [row0, row0 + nrows) of tensor index ti as f32 into out (nrows * ne[0] floats). */
void rm_fill_rows(const struct rm_tensor *t, uint64_t seed, int64_t ti, int64_t row0,
                  int64_t nrows, float *out);

#endif
