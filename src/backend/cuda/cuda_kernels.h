/* Launchers of smelt's CUDA kernels (C linkage), used by the backend (cuda_ops.c,
 * cuda_matmul.c). Each family lives in its own .cu file (the products have their own
 * headers: cuda_mmv.h, cuda_mmq.h); every pointer is device memory; everything is enqueued on
 * the stream of the launch context `ctx` (cuda_ctx.h, the first argument) and returns
 * without waiting. Shapes follow backend.h: (ne0, ne1, ...) with ne0 contiguous.
 * Activations are F32. */
#ifndef SMELT_CUDA_KERNELS_H
#define SMELT_CUDA_KERNELS_H

#include <stdint.h>

#include "backend/cuda/cuda_ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_qweight;

/* ---- cuda_norm.cu ---- */

/* dst[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (w may be NULL); rows of n, row strides in
 * elements (in place ok). */
void cuda_rms_norm(struct cuda_ctx *ctx, float *dst, const float *x, const float *w, int64_t n,
                   int64_t rows, int64_t x_stride, int64_t dst_stride, float eps);
/* The same values as the mmq products' f16 activations in their scratch (cuda_mmq.h), the
 * split-tile counters zeroed: the bits cuda_rms_norm then cuda_mmq_quantize(dst, n, rows)
 * would leave there, in one launch. n % 16 == 0. */
void cuda_rms_norm_h16(struct cuda_ctx *ctx, void *scratch, const float *x, const float *w, int64_t n,
                       int64_t rows, int64_t x_stride, float eps);
/* The gated RMSNorm (bk_norm_gate): dst = act(gate) * (x / sqrt(mean(x^2) + eps) * w) over
 * `groups` contiguous groups of n (w (n) not NULL; act as cuda_glu's), the bits of
 * cuda_rms_norm on x then cuda_glu. xq not NULL (then n % 32 == 0): also writes the output's
 * int8 form, as cuda_mmv_quantize would over the groups * n values, at xq / xd
 * (cuda_mmv_scratch_parts). In place on gate ok. */
void cuda_norm_gate(struct cuda_ctx *ctx, float *dst, const float *x, const float *w, const float *gate, int act,
                    int64_t n, int64_t groups, float eps, int8_t *xq, void *xd);
/* Softmax over each row of n. */
void cuda_softmax(struct cuda_ctx *ctx, float *x, int64_t n, int64_t rows);
/* dst[r] = (x[r] - mean) / sqrt(var + eps) * w + b (biased variance; w, b may be NULL); rows
 * of n, row strides in elements (in place ok). */
void cuda_layer_norm(struct cuda_ctx *ctx, float *dst, const float *x, const float *w, const float *b,
                     int64_t n, int64_t rows, int64_t x_stride, int64_t dst_stride, float eps);

/* ---- cuda_elem.cu ---- */

/* dst = a + c; c is broadcast over rows when c_rows == 1 (n elements per row). */
void cuda_add(struct cuda_ctx *ctx, float *dst, const float *a, const float *c, int64_t n,
              int64_t rows, int64_t c_rows);
void cuda_scale(struct cuda_ctx *ctx, float *dst, const float *x, float s, int64_t n);
/* dst = act(gate) * up; act is enum glu_act's value: 0 = SiLU, 1 = tanh-GELU, 2 = sigmoid,
 * 3 = gpt-oss's clamped SwiGLU (GLU_SWIGLU_OAI: the clamp applies to up too). */
void cuda_glu(struct cuda_ctx *ctx, float *dst, const float *gate, const float *up, int act,
              int64_t n);
/* cuda_glu (row_n 0) or cuda_glu_row_gate (rows of row_n) that also writes dst's int8 form,
 * as cuda_mmv_quantize(dst, ...) would, at xq / xd (cuda_mmv_scratch_parts); n a multiple of 32. */
void cuda_glu_q(struct cuda_ctx *ctx, float *dst, const float *gate, const float *up, int act, int64_t n,
                int64_t row_n, int8_t *xq, void *xd);
/* The same with one gate per row: dst[r, i] = act(gate[r]) * up[r, i], rows of row_n. */
void cuda_glu_row_gate(struct cuda_ctx *ctx, float *dst, const float *gate, const float *up, int act,
                       int64_t row_n, int64_t rows);
/* The grouped expert rows of a mixture-of-experts FFN (cuda_moe_group's chunks of ch rows of
 * n_ff, chunk c belonging to expert eid[c], -1: unused and left alone): act(gate +
 * gate_b[e]) * (up + up_b[e]), biases (n_ff, n_expert) or NULL, act as cuda_glu's, written
 * as cuda_mmq_quantize would convert it into mmq_scratch (the down product by id reads it).
 * n_ff % 16 == 0. */
void cuda_glu_expert_mmq(struct cuda_ctx *ctx, void *mmq_scratch, const float *gate, const float *up, int act,
                         const float *gate_b, const float *up_b, const int32_t *eid, int ch, int64_t n_ff,
                         int64_t rows);
/* dst = src over a (ne0, ne1, ne2, ne3) F32 box; strides in floats, ne0 contiguous on both
 * sides (bk_copy: deinterleaving views, state slots). */
void cuda_copy(struct cuda_ctx *ctx, float *dst, const float *src, const int64_t ne[4],
               const int64_t dst_stride[3], const int64_t src_stride[3]);
void cuda_softcap(struct cuda_ctx *ctx, float *x, float cap, int64_t n);
/* dst = act(x) over n elements, act enum glu_act's GLU_SILU, GLU_GELU_TANH or GLU_GELU_ERF
 * (in place ok). */
void cuda_act(struct cuda_ctx *ctx, float *dst, const float *x, int act, int64_t n);
/* kpos[i] = n_keys[seq[i]] - 1 for n rows: the key bound of bidirectional attention. */
void cuda_key_bound(struct cuda_ctx *ctx, int32_t *kpos, const int32_t *seq, const int32_t *n_keys, int64_t n);

/* ---- cuda_getrows.cu ---- */

/* dst[t] = row ids[t] of src (rows of n elements of `type`, plain F32/F16/BF16 contiguous
 * with row stride src_stride bytes), as F32. */
void cuda_get_rows_plain(struct cuda_ctx *ctx, float *dst, const void *src, uint32_t type,
                         int64_t src_stride, const int32_t *ids, int64_t n, int64_t n_ids);
/* Same for a repacked weight (struct cuda_qweight). */
void cuda_get_rows_q(struct cuda_ctx *ctx, float *dst, const struct cuda_qweight *w,
                     const int32_t *ids, int64_t n_ids);

/* ---- cuda_convert.cu ---- */

/* W (repacked) dequantized to F16, rows [r0, r0 + nr) -> dst (nr, k) row-major. */
void cuda_dequant_f16(struct cuda_ctx *ctx, void *dst, const struct cuda_qweight *w, int64_t r0,
                      int64_t nr);
/* F32 -> F16, n elements. */
void cuda_f32_to_f16(struct cuda_ctx *ctx, void *dst, const float *src, int64_t n);

/* ---- cuda_gate.cu ---- */

/* Holds the stream until *flag (device view of host-mapped memory) is set or timeout_ns
 * pass (one thread, normal launch). */
void cuda_gate(struct cuda_ctx *ctx, const int *flag, unsigned long long timeout_ns);

/* ---- cuda_rope.cu ---- */

struct cuda_rope {
    int mode;      /* 0 NORM (adjacent pairs), 2 NEOX (halves) */
    int n_rot;
    float freq_base, freq_scale, ext_factor, attn_factor;
    float corr_lo, corr_hi; /* YaRN ramp range (dimension indices), computed on the host */
    float mscale;           /* attn_factor x YaRN magnitude correction */
    const float *freq_factors; /* device (n_rot/2) or NULL */
    /* device (n_rot/2): the rotation speed of pair i, angle = pos * freq[i] (base^(-2i/n_rot)
     * / freq_factors[i], times the linear/YaRN mix), made once per parameter set by
     * cuda_rope_freq_fill: the kernels then need no pow() per call */
    const double *freq;
};
/* Fills freq (n_rot/2 doubles, device) for r's parameters (r->freq is not read). */
void cuda_rope_freq_fill(struct cuda_ctx *ctx, double *freq, const struct cuda_rope *r);
/* Optional per-head RMSNorm (norm_w != NULL) then RoPE, in place on x (head_dim, n_head,
 * n_tokens) with positions pos (n_tokens). */
void cuda_rope_inplace(struct cuda_ctx *ctx, float *x, const int32_t *pos, int head_dim, int n_head,
                       int64_t n_tokens, const struct cuda_rope *r, const float *norm_w, float eps);
/* Stores rows of k (dk, n_kv, n_tokens) and v (dv, n_kv, n_tokens) into the caches
 * (d, block_size, n_kv, n_blocks) at slot[t], converting to cache_type (F32/F16/BF16). */
void cuda_kv_store(struct cuda_ctx *ctx, void *kc, void *vc, uint32_t cache_type, const float *k,
                   const float *v, const int32_t *slot, int dk, int dv, int n_kv, int block_size,
                   int64_t n_tokens);

/* RoPE (after the optional per-head RMSNorms) of q (dk, n_head, n) and k (dk, n_kv, n) in
 * place, and the store of k and v (dv, n_kv, n) into the caches at slot[t], in one launch. */
void cuda_rope_kv_store(struct cuda_ctx *ctx, float *q, float *k, const float *v, void *kc, void *vc,
                        uint32_t cache_type, const int32_t *pos, const int32_t *slot, int dk, int dv,
                        int n_head, int n_kv, int block_size, int64_t n_tokens,
                        const struct cuda_rope *r, const float *q_norm, const float *k_norm,
                        float eps);

/* ---- cuda_attn.cu ---- */

/* Which attention kernel runs (cuda_attn_plan; docs/cuda-backend.md, "Attention"). */
enum cuda_attn_kernel {
    CUDA_ATTN_AUTO = 0,    /* let the plan choose (the backend's setting) */
    CUDA_ATTN_GENERIC = 1, /* block per (query head, row, split): any head_dim <= 256 */
    CUDA_ATTN_DECODE = 2,  /* block per (row, KV head, split), all G heads of the group */
    CUDA_ATTN_HYBRID = 3,  /* tensor-core prefill for row groups > 4 rows, decode for the rest */
    CUDA_ATTN_PREFILL = 4, /* tensor-core prefill for every row group (tests) */
};

struct cuda_attn_args {
    float *dst;            /* (dv, n_head, n_tokens) */
    const float *q;        /* (dk, n_head, n_tokens) */
    const void *kc, *vc;   /* caches (d, block_size, n_kv, n_blocks) */
    uint32_t cache_type;   /* QT_F16, QT_BF16 or QT_F32 */
    const int32_t *pos, *seq, *blocks; /* blocks: (max_blocks, n_seqs) */
    int max_blocks, block_size, n_seqs;
    int dk, dv, n_head, n_kv;
    int64_t n_tokens;
    float scale, softcap;
    int window;
    const float *sinks;    /* (n_head) or NULL: attention sinks (backend.h's attn_params.sinks),
                            * one more logit per head in the softmax, with no value */
    int max_keys;          /* upper bound of keys any row sees (sizes the split) */
    int kernel;            /* enum cuda_attn_kernel: AUTO, or one forced (tests, benchmarks);
                            * a kernel that cannot run the shape falls back (see the plan) */
    int split;             /* > 0: this many key splits at most for the decode and generic
                            * kernels (tests, benchmarks; capped at 64); 0: the plan's */
    int split_keys;        /* > 0: fewest keys per split of the decode kernel; 0: one stage */
    int dec_threads;       /* 128 or 256: the decode kernel's block (tests, benchmarks); 0: the plan's */
    int dec_sub;           /* > 0: query-head subsets per KV head in the decode kernel (a block
                            * each; tests, benchmarks); 0: the plan's */
    void *scratch;         /* cuda_attn_scratch_bytes(this) bytes of device memory */
    /* RoPE and the KV store fused into the decode kernel (rope.freq != NULL): q holds the
     * raw queries, k_new / v_new the step's raw K (dk, n_kv, n_tokens) and V rows, slot[t]
     * their cache slots, q_norm / k_norm the optional per-head RMSNorm weights (eps
     * norm_eps). Every row must be the only row of its sequence in the step (its new key is
     * its last one). The kernel rotates q in shared memory; the block whose split holds a
     * row's last key rotates its K head, stores K and V in the caches and uses them in
     * place of the cache's slot (never read back). q and k_new are left as they were. Any
     * plan but DECODE runs cuda_rope_kv_store first (rotating q and k_new in place). */
    struct cuda_rope rope;
    const float *k_new, *v_new, *q_norm, *k_norm;
    const int32_t *slot;
    float norm_eps;
    void *q_out;           /* NULL, or cuda_mmv_scratch_bytes(dv * n_head, n_tokens) bytes of
                            * device memory that also get dst in cuda_mmv_quantize's int8
                            * layout (cuda_mmv_scratch_parts), so the product that consumes
                            * dst needs no quantize launch. Fused into the decode kernel;
                            * other plans quantize in a separate launch. Ignored unless
                            * n_tokens <= 8 (CUDA_MMV_MAX_N) and dv * n_head % 32 == 0. */
};

/* What cuda_attention will launch for a (the plan is a function of the shape fields only:
 * n_tokens, n_seqs, heads, dims, cache type, max_keys, kernel, split, split_keys). Falls
 * back from a forced kernel: head_dim not 64/128/256, dk != dv or more than 16 query heads
 * per KV head run GENERIC; F32 caches run DECODE instead of HYBRID/PREFILL.
 * The decode kernel's dec_split is the most splits a row may use: a row of n keys uses
 * min(dec_split, ceil(n / dec_min_keys)) (decided on the device, so a graph replays
 * correctly at any depth), and the last of its splits to finish merges them. */
struct cuda_attn_plan {
    int kernel;                  /* enum cuda_attn_kernel, never AUTO */
    int dec_slots, dec_split;    /* decode/generic: row slots in the grid, key splits */
    int dec_min_keys;            /* decode: fewest keys per split */
    int dec_threads;             /* decode: threads per block (128, or 256 for small grids) */
    int dec_sub;                 /* decode: blocks per (row, KV head, split), each taking
                                  * ceil(G / dec_sub) of the group's G query heads */
    int pf_slots, pf_split;      /* hybrid/prefill: row-group slots, key splits */
    int short_max;               /* hybrid: groups of <= this many rows go to decode */
    uint64_t dec_partial_bytes, pf_partial_bytes, list_bytes; /* scratch, in this order */
};
/* The grid sizes follow ctx's SM count (a context without a device: an H200's 132). */
void cuda_attn_plan(const struct cuda_ctx *ctx, const struct cuda_attn_args *a,
                    struct cuda_attn_plan *p);
/* Device scratch the call needs (0 when none). */
uint64_t cuda_attn_scratch_bytes(const struct cuda_ctx *ctx, const struct cuda_attn_args *a);
/* Enqueues the attention (programmatic dependent launches: see cuda_common.cuh). The decode
 * kernel counts its split blocks in ctx's counters: one call at a time per context (its
 * stream orders them). Launch errors are left for cudaGetLastError. */
void cuda_attention(struct cuda_ctx *ctx, const struct cuda_attn_args *a);
/* Tests: synchronizes the device and returns how many of ctx's decode split counters are
 * not zero (they must all be zero between calls), or -1 on a CUDA error. */
int cuda_attn_counters_busy(const struct cuda_ctx *ctx);

/* ---- cuda_ssm.cu ---- */

/* bk_ssm_conv (backend.h) on x, dst (channels, n_tokens), w (d_conv, channels), the conv
 * states cs ((d_conv - 1) * channels, n_slots) and the state words seqs (STATE_SEQ_WORDS,
 * n_seqs). */
void cuda_ssm_conv(struct cuda_ctx *ctx, float *dst, const float *x, const float *w, float *cs,
                   const int32_t *seqs, int64_t channels, int d_conv, int64_t n_tokens, int n_seqs,
                   int silu);

#define CUDA_GDN_MAX_HEAD_K 256

/* bk_gated_delta_net's operands (backend.h): every pointer device memory. */
struct cuda_gdn_args {
    float *dst;          /* (head_v, n_v_head, n_tokens) */
    const float *qkv;    /* (2 * n_k_head * head_k + n_v_head * head_v, n_tokens) */
    const float *a, *bl; /* (n_v_head, n_tokens) */
    const float *ssm_a, *dt_bias; /* (n_v_head) */
    float *ss;           /* (n_v_head * head_v * head_k, n_slots) */
    const int32_t *seqs; /* (STATE_SEQ_WORDS, n_seqs) */
    int64_t n_tokens;
    int n_seqs, n_k_head, head_k, n_v_head, head_v, grouped;
    float eps;
    int chunked;         /* 1: the chunkwise (WY) form, chunks of CUDA_GDN_CHUNK rows; 0: the
                          * recurrence token by token */
    void *scratch;       /* cuda_gdn_scratch_bytes(n_tokens, n_k_head, head_k, n_v_head,
                          * head_v, chunked) */
};
#define CUDA_GDN_CHUNK 64
/* Whether the kernels take this key head size (a multiple of 4 up to CUDA_GDN_MAX_HEAD_K). */
int cuda_gdn_supported(int head_k);
uint64_t cuda_gdn_scratch_bytes(int64_t n_tokens, int n_k_head, int head_k, int n_v_head, int head_v,
                                int chunked);
/* Two launches (the norms and gates of every row, then the recurrence per (value head, tile
 * of state rows, sequence)), or three when chunked (the norms and gates, the chunks' WY
 * factors per (chunk, value head, sequence), then the chunks of each sequence in order per
 * (value head, tile of state rows, sequence)). */
void cuda_gated_delta_net(struct cuda_ctx *ctx, const struct cuda_gdn_args *a);

/* bk_deltanet at decode (every sequence one row), two launches: the conv and the norms and
 * gates of q and k (the conv state shifted in place), then the recurrence per (value head,
 * tile of state rows, sequence) with the gated RMSNorm of each head's outputs by its last
 * tile block (and z's int8 form when xq is set). The same bits as cuda_ssm_conv,
 * cuda_gated_delta_net (not chunked) and cuda_norm_gate. */
struct cuda_deltanet_args {
    struct cuda_gdn_args g; /* g.qkv: the projections before the conv; g.dst: the delta rule's
                             * output o; g.chunked 0; g.scratch: cuda_deltanet_scratch_bytes */
    const float *conv_w;    /* (d_conv, channels) */
    float *cs;              /* ((d_conv - 1) * channels, n_slots) */
    int d_conv;
    float *z;               /* (n_v_head * head_v, n_tokens): the gate in, the output out */
    const float *norm_w;    /* (head_v) */
    float norm_eps;
    int8_t *xq;             /* z's int8 form (cuda_mmv_quantize's layout), or NULL */
    void *xd;
    unsigned *cnt;          /* n_seqs * n_v_head counters, zero between launches */
};
/* Whether cuda_deltanet_decode takes these sizes. */
int cuda_deltanet_decode_ok(int head_k, int head_v, int d_conv);
uint64_t cuda_deltanet_scratch_bytes(int64_t n_tokens, int n_k_head, int head_k, int n_v_head, int head_v);
void cuda_deltanet_decode(struct cuda_ctx *ctx, const struct cuda_deltanet_args *a);

/* ---- cuda_sample.cu ---- */

/* The logits_topk op (backend.h, backend/topk.h): row summaries for sampling. */
struct cuda_topk_args {
    const float *logits; /* (n_vocab, n_rows), rows ld floats apart */
    int64_t ld;
    int n_vocab, n_rows;
    const void *rows;    /* struct topk_row (n_rows) */
    const void *adj;     /* struct logit_adj (adj_cap) */
    int adj_cap;
    const void *mask;    /* uint32 (mask_ld, n_rows): the token masks of TOPK_MASK rows, or
                          * NULL (no row has one) */
    int64_t mask_ld;     /* words from one row's mask to the next */
    void *out;           /* topk_out_words(n_rows, adj_cap) int32 words */
    void *scratch;       /* cuda_topk_scratch_bytes(n_rows, n_vocab) */
};
uint64_t cuda_topk_scratch_bytes(const struct cuda_ctx *ctx, int n_rows, int n_vocab);
/* The merge counts the split blocks of each row in ctx's counters: one call at a time per
 * context. */
void cuda_logits_topk(struct cuda_ctx *ctx, const struct cuda_topk_args *a);
/* Tests: synchronizes the device and returns how many of ctx's per-row merge counters are
 * not zero (they must all be zero between calls), or -1 on a CUDA error. */
int cuda_topk_counters_busy(const struct cuda_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
