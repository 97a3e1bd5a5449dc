/* CPU backend internals shared by its op files (cpu_ops_*.c). Not a public header.
 *
 * Every op is split into row ranges: the op packs its arguments into a context struct
 * and calls cpu_parallel(cb, fn, ctx, n), which runs fn(ctx, ith, i0, i1) over disjoint
 * ranges covering [0, n) on the worker threads (ith < cb->n_threads is the worker's
 * index). Ops never malloc: per-thread buffers (n_threads of them, indexed by ith) come
 * from the step scratch (cpu_scratch) before the parallel region. */
#ifndef SMELT_CPU_BACKEND_H
#define SMELT_CPU_BACKEND_H

#include "backend/backend.h"
#include "backend/cpu/cpu_ops_vec.h"
#include "backend/cpu/cpu_pool.h"

struct cpu_backend {
    struct backend base;     /* first: a struct backend * points here */
    struct arena scratch;    /* per step (util/arena.h): reset at step_begin, rewound per layer */
    struct arena mm_scratch; /* cpu_matmul's quantized activations, reset after each call */
    struct cpu_pool *pool;
    int n_threads;           /* cpu_pool_size(pool) */
    const struct cpu_vec *vec; /* vector kernels for the best ISA */
    bool exact;              /* reference matmuls (cpu_backend_set_exact) */
    struct cpu_repacked **rws; /* the weights' repacked copies (cpu_repacked), freed with it */
    size_t n_rws, cap_rws;
    /* RoPE's cos / sin per token of the last two (params, positions) seen (cpu_ops_rope.c):
     * a step's q and k of every layer share them (two: Gemma 3 alternates two bases) */
    struct cpu_rope_memo {
        struct rope_params p;
        int64_t n;      /* tokens; 0: empty */
        int32_t *pos;   /* (n) */
        float *tab;     /* (n, n_rot): cos of the n_rot / 2 pairs, then sin */
        float *ff;      /* a copy of p.freq_factors' n_rot / 2 values (the pointer alone could
                         * be a freed tensor's, reused) */
        size_t cap_pos, cap_tab, cap_ff; /* elements allocated */
    } rope[2];
    int rope_next;      /* the entry the next miss overwrites */
};

static inline struct cpu_backend *cpu_of(struct backend *b) { return (struct cpu_backend *)b; }

typedef void (*cpu_range_fn)(void *ctx, int ith, int64_t i0, int64_t i1);

/* Runs fn over [0, n) split into contiguous ranges of at least min_chunk items. */
void cpu_parallel(struct cpu_backend *cb, cpu_range_fn fn, void *ctx, int64_t n,
                  int64_t min_chunk);
/* Step scratch (64-byte aligned); records SMELT_ERR_NOMEM and returns NULL on failure. */
void *cpu_scratch(struct cpu_backend *cb, size_t nbytes);

/* Converts n elements of a row of type (F32, F16, BF16 or a block format) to F32. */
void cpu_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n);

/* Ops (contracts in backend.h; shapes already checked by the bk_ wrappers). */
void cpu_op_get_rows(struct backend *b, struct tensor *dst, const struct tensor *src,
                     const struct tensor *ids);
/* 1 / sqrt(mean(x^2) + eps) over a row of n, in cpu_op_rms_norm's fixed order: any op that
 * norms as rms_norm does calls it, so the bits agree. */
float cpu_rms_inv(const float *x, int64_t n, float eps);
void cpu_op_rms_norm(struct backend *b, struct tensor *dst, const struct tensor *x,
                     const struct tensor *w, float eps);
void cpu_op_layer_norm(struct backend *b, struct tensor *dst, const struct tensor *x,
                       const struct tensor *w, const struct tensor *bias, float eps);
void cpu_op_act(struct backend *b, struct tensor *dst, const struct tensor *x, enum glu_act act);
void cpu_op_add(struct backend *b, struct tensor *dst, const struct tensor *a,
                const struct tensor *c);
void cpu_op_scale(struct backend *b, struct tensor *dst, const struct tensor *x, float s);
void cpu_op_glu(struct backend *b, struct tensor *dst, const struct tensor *gate,
                const struct tensor *up, enum glu_act act);
void cpu_op_norm_gate(struct backend *b, struct tensor *dst, const struct tensor *x,
                      const struct tensor *w, const struct tensor *gate, float eps,
                      enum glu_act act);
void cpu_op_softcap(struct backend *b, struct tensor *x, float cap);
void cpu_op_softmax(struct backend *b, struct tensor *x);
void cpu_op_rope(struct backend *b, struct tensor *x, const struct tensor *pos,
                 const struct rope_params *p);
void cpu_op_kv_store(struct backend *b, struct tensor *kc, struct tensor *vc,
                     const struct tensor *k, const struct tensor *v, const struct attn_meta *m);
void cpu_op_attention(struct backend *b, struct tensor *dst, const struct tensor *q,
                      const struct tensor *kc, const struct tensor *vc,
                      const struct attn_meta *m, const struct attn_params *p);
/* Mixture of experts (cpu_ops_moe.c). */
void cpu_op_moe_route(struct backend *b, struct tensor *ids, struct tensor *weights,
                      const struct tensor *x, const struct tensor *router,
                      const struct tensor *bias, enum moe_gating gating,
                      const struct prenorm *pre,
                      const struct tensor *sh_gate_inp, struct tensor *sh_logit);
void cpu_op_moe_ffn(struct backend *b, struct tensor *dst, const struct tensor *x,
                    const struct moe_experts *w, const struct tensor *ids,
                    const struct tensor *weights, const struct prenorm *pre, bool acc,
                    const struct prenorm *next);
/* Recurrent-state ops and the strided copy (cpu_ops_ssm.c). */
void cpu_op_copy(struct backend *b, struct tensor *dst, const struct tensor *src);
void cpu_op_ssm_conv(struct backend *b, struct tensor *dst, const struct tensor *x,
                     const struct tensor *w, struct tensor *cs, const struct tensor *seqs,
                     bool silu);
void cpu_op_gated_delta_net(struct backend *b, struct tensor *dst, const struct tensor *qkv,
                            const struct tensor *a, const struct tensor *bl,
                            const struct tensor *ssm_a, const struct tensor *dt_bias,
                            struct tensor *ss, const struct tensor *seqs,
                            const struct gdn_params *p);
/* Row summaries for sampling (cpu_topk.c). */
void cpu_op_logits_topk(struct backend *b, struct tensor *dst, const struct tensor *logits,
                        const struct tensor *rows, const struct tensor *adj,
                        const struct tensor *mask);
/* Matmul: cpu_matmul (quantized activations, SIMD, the pool) for contiguous operands,
 * else the reference below. */
void cpu_op_matmul(struct backend *b, struct tensor *dst, const struct tensor *w,
                   const struct tensor *x);
/* Matrix e of weight w (an expert of a 3D tensor, 0 for a matrix) repacked for the decode
 * kernels (cpu_matmul.h), made at the weight's first use and kept in w->extra until the
 * backend is freed; NULL when the type has none at this level (or memory ran out): use the
 * file layout, which gives the same results. */
const struct cpu_rweight *cpu_repacked(struct cpu_backend *cb, const struct tensor *w, int64_t e);
/* Reference matmul: dequantizes each weight row once per call and dots it with every
 * input column. Exact for F32 (f32 products, f32 sums); the fast quantized kernels
 * (cpu_matmul.h) are checked against it. */
void cpu_op_matmul_ref(struct backend *b, struct tensor *dst, const struct tensor *w,
                       const struct tensor *x);

/* RoPE angle helpers shared with tests: fills cos/sin (n_rot/2 each) for position pos. */
void cpu_rope_cache(const struct rope_params *p, int32_t pos, float *cos_out, float *sin_out);

#endif
