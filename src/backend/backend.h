/* The op interface: typed tensors and the operations an architecture's forward pass is
 * written against. One implementation per device (cpu/, later cuda/).
 *
 * Design:
 * - A tensor is {type, ne[], nb[], data, backend}: ggml's layout convention (ne[0] is the
 *   row length, fastest-varying; nb[] are byte strides, nb[0] the bytes of one block).
 * - Weights are bound once (bk_weight_bind): the CPU keeps the view into the GGUF
 *   mapping, a GPU backend copies (and may repack) them into device memory.
 * - Everything else a step needs comes from the backend's per-step scratch (bk_new),
 *   released all at once by bk_step_begin. A step allocates the same sizes in the same
 *   order every time it sees the same batch shape, so a GPU backend can capture a step
 *   as a graph and replay it: the addresses (kernel arguments) do not change.
 * - Everything that changes from step to step (token ids, positions, block tables, KV
 *   slots, which rows want logits) is *data* in backend tensors written by bk_upload
 *   before the ops run (struct attn_meta), never a kernel argument.
 * - Ops are enqueued; they return nothing. Shapes are checked here (a mismatch is a
 *   programmer bug: assert). A failure that can happen at run time (scratch exhausted,
 *   a device error) is sticky: the backend records it, later ops become no-ops, and
 *   bk_sync returns it. That keeps the forward pass free of per-op error plumbing.
 * - Fused ops (matmul group, GLU FFN, RoPE + KV store) are part of the interface: a
 *   backend that profits implements them; when its vtable entry is NULL, the wrapper
 *   here composes them from the basic ops.
 *
 * Shapes in comments are written (ne0, ne1, ...). Activations are F32, rows contiguous.
 */
#ifndef SMELT_BACKEND_H
#define SMELT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/topk.h"
#include "quant/quant.h"
#include "util/arena.h"
#include "util/err.h"

#define TENSOR_MAX_DIMS 4

struct backend;

struct tensor {
    uint32_t type;               /* enum qtype */
    int64_t ne[TENSOR_MAX_DIMS]; /* elements per dimension; unused dimensions are 1 */
    size_t nb[TENSOR_MAX_DIMS];  /* byte strides; nb[0] = bytes of one block */
    void *data;                  /* backend memory (host memory on the CPU backend) */
    struct backend *backend;     /* who owns data's memory space; NULL: plain host memory */
    const char *name;            /* for messages; may be NULL */
    void *extra;                 /* backend-private (a repacked weight's descriptor); NULL */
};

/* Fills t as a contiguous tensor of type (no data). ne1..ne3 may be 1. Returns false when
 * ne0 is not a multiple of the type's block size or the type is unknown. */
bool tensor_init(struct tensor *t, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                 int64_t ne3);
/* Number of elements. */
int64_t tensor_nelem(const struct tensor *t);
/* Number of rows (ne1 * ne2 * ne3). */
int64_t tensor_nrows(const struct tensor *t);
/* Bytes spanned by a contiguous tensor (nb[3] * ne[3]). */
size_t tensor_nbytes(const struct tensor *t);
/* True when rows are packed with no gaps. */
bool tensor_is_contiguous(const struct tensor *t);
/* Same ne in every dimension. */
bool tensor_same_shape(const struct tensor *a, const struct tensor *b);
/* Pointer to row (i1, i2, i3). Host-addressable backends only. */
static inline void *tensor_row(const struct tensor *t, int64_t i1, int64_t i2, int64_t i3) {
    return (char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}
/* Formats "(a, b, c)" with trailing 1-dimensions dropped; returns buf. */
const char *tensor_shape_str(const struct tensor *t, char *buf, size_t n);

/* ---- op parameters ---- */

enum rope_mode {
    ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): llama, mistral */
    ROPE_NEOX = 2, /* rotate (x[i], x[i + n_rot/2]): qwen2, qwen3, gemma3 */
};

/* RoPE for one layer. theta_i = pos * freq_scale * freq_base^(-2i/n_rot) / freq_factors[i],
 * blended with the unscaled angle by YaRN's ramp when ext_factor != 0; cos and sin are
 * multiplied by attn_factor (and YaRN's magnitude correction). */
struct rope_params {
    enum rope_mode mode;
    int32_t n_rot;       /* rotated dimensions (<= head_dim); the rest pass through */
    float freq_base;
    float freq_scale;    /* 1 / linear (or YaRN) scaling factor; 1 = none */
    float ext_factor;    /* YaRN extrapolation mix; 0 = off */
    float attn_factor;   /* 1 = none */
    float beta_fast, beta_slow; /* YaRN correction range (rotations) */
    int32_t n_ctx_orig;  /* YaRN: the context length the model was trained at */
    const struct tensor *freq_factors; /* F32 (n_rot/2) divisors (Llama-3 rope_freqs) or NULL */
    bool yarn_unrounded; /* YaRN's correction range [lo, hi] kept fractional (HF truncate =
                          * False: gpt-oss, as OpenAI's reference); false: lo floored, hi
                          * ceiled (HF's default, llama.cpp). Needs BK_FEAT_YARN_UNROUNDED. */
};

enum glu_act {
    GLU_SILU = 0,      /* SwiGLU: silu(gate) * up */
    GLU_GELU_TANH = 1, /* GeGLU with the tanh-approximated GELU (HF gelu_pytorch_tanh) */
    GLU_SIGMOID = 2,   /* sigmoid(gate) * up: qwen35's attention output gate (CPU only so far) */
    GLU_SWIGLU_OAI = 3, /* gpt-oss's clamped SwiGLU: with g = min(gate, L), u = clamp(up, -L,
                         * L): g * sigmoid(A g) * (u + 1), A = GLU_OAI_ALPHA, L =
                         * GLU_OAI_LIMIT. Needs BK_FEAT_SWIGLU_OAI. */
    GLU_GELU_ERF = 4,   /* the exact GELU, x * (1 + erf(x / sqrt 2)) / 2 (HF "gelu"): bert's
                         * non-gated FFN, through bk_act only */
};

/* gpt-oss's SwiGLU constants (transformers' swiglu_alpha / swiglu_limit defaults; GGUF has
 * no key for them, llama.cpp fixes them too). */
#define GLU_OAI_ALPHA 1.702f
#define GLU_OAI_LIMIT 7.0f

/* Mixture of experts: how a row's router logits become the weights of its k experts. The
 * k experts are always the k largest logits (ties: the lower id first), listed in that
 * order; the modes differ only in the weights. */
enum moe_gating {
    MOE_SOFTMAX = 0,      /* softmax over all n_expert logits; each expert keeps its
                           * probability (qwen2moe, olmoe: no renormalization) */
    MOE_SOFTMAX_TOPK = 1, /* softmax over the k selected logits only: gpt-oss's "top-k, then
                           * softmax", and, in exact arithmetic, qwen3moe's and mixtral's
                           * "softmax over all, top-k, renormalize to sum 1" */
};

/* The experts of an MoE layer: ne2 = n_expert stacked matrices per projection (expert e's
 * matrix is the slice at e * nb[2], laid out like a 2-D weight). */
struct moe_experts {
    const struct tensor *gate; /* (n_embd, n_ff, n_expert) */
    const struct tensor *up;   /* (n_embd, n_ff, n_expert) */
    const struct tensor *down; /* (n_ff, n_embd, n_expert) */
    enum glu_act act;          /* h = act(gate x + gate_b, up x + up_b) */
    /* Per-expert biases (gpt-oss), F32, or all three NULL; expert e's is row e. Needs
     * BK_FEAT_MOE_BIAS. */
    const struct tensor *gate_b; /* (n_ff, n_expert) */
    const struct tensor *up_b;   /* (n_ff, n_expert) */
    const struct tensor *down_b; /* (n_embd, n_expert): y_e = down h + down_b */
    /* The shared expert every row also runs (Qwen3.5/3.6-MoE, Qwen3-Next), or all three
     * NULL: 2-D weights gate, up (n_embd, n_ff_sh) and down (n_ff_sh, n_embd), the act
     * above. sh_logit: this step's (1, n) F32 logits of its gate (bk_moe_route writes
     * them), its output scaled by sigmoid(logit) per row; NULL: ungated. */
    const struct tensor *sh_gate, *sh_up, *sh_down, *sh_logit;
};

/* Per-step inputs of the KV store and attention ops. All are backend tensors written by
 * bk_upload before the step, so a replayed graph sees new values with the same
 * arguments. A row's keys are the positions 0..pos[row] of its sequence, read from that
 * sequence's block table: position p lives in slot blocks[p / block_size] * block_size +
 * p % block_size. Causality (within a prefill chunk too) follows from the position
 * bound alone; nothing beyond pos[row] is ever read, so a recycled block's old contents
 * are unreachable. */
struct attn_meta {
    const struct tensor *pos;    /* I32 (n_tokens): position of each row in its sequence */
    const struct tensor *seq;    /* I32 (n_tokens): row -> sequence index (row of blocks) */
    const struct tensor *slot;   /* I32 (n_tokens): cache slot this row's K and V go to */
    const struct tensor *blocks; /* I32 (max_blocks, n_seqs): block table per sequence */
    int32_t block_size;          /* tokens per KV block */
    bool one_per_seq;            /* every sequence has exactly one row in the step (a decode
                                  * step): each row's new key is its last key. Part of the
                                  * step's shape (graph key). */
    const struct tensor *n_keys; /* I32 (n_seqs): with non-causal attention, the keys each
                                  * sequence's rows see, positions [0, n_keys[seq]) (all of
                                  * them stored before attention runs); NULL otherwise */
};

struct attn_params {
    float scale;     /* multiplies q.k (1/sqrt(head_dim) usually) */
    float softcap;   /* > 0: scores become softcap * tanh(score / softcap) */
    int32_t window;  /* > 0: key hidden when pos_q - pos_k >= window (sliding window) */
    /* Attention sinks (gpt-oss): F32 (n_head) or NULL. Head h's softmax gets one more
     * logit, sinks[h] (not scaled, not soft-capped), that takes probability but has no
     * value: p_j = exp(s_j) / (sum_i exp(s_i) + exp(sinks[h])). Needs BK_FEAT_ATTN_SINKS. */
    const struct tensor *sinks;
    /* Bidirectional attention (encoders: bert): a row sees every key of its sequence,
     * positions [0, attn_meta.n_keys[seq]), later ones too; no window, no sinks. Needs
     * BK_FEAT_NON_CAUSAL. */
    bool non_causal;
};

/* What a backend implements beyond the basic op contracts (bits of backend_ops.features).
 * A model whose architecture needs one the backend lacks is refused at load, naming it
 * (arch_def.needs); the bk_ wrappers assert that an op is not asked for one it lacks. */
enum bk_feature {
    BK_FEAT_ATTN_SINKS = 1u << 0,     /* attn_params.sinks (attention, rope_attention) */
    BK_FEAT_SWIGLU_OAI = 1u << 1,     /* GLU_SWIGLU_OAI (glu, ffn_glu, moe_ffn) */
    BK_FEAT_MOE_BIAS = 1u << 2,       /* moe_experts.gate_b / up_b / down_b */
    BK_FEAT_YARN_UNROUNDED = 1u << 3, /* rope_params.yarn_unrounded (rope and the fused
                                       * ops that rotate) */
    BK_FEAT_GLU_ROW_GATE = 1u << 4,   /* glu with one gate per row (a shared expert's) */
    BK_FEAT_LAYER_NORM = 1u << 5,     /* bk_layer_norm */
    BK_FEAT_ACT = 1u << 6,            /* bk_act (a non-gated FFN's activation) */
    BK_FEAT_NON_CAUSAL = 1u << 7,     /* attn_params.non_causal (attention, rope_attention) */
};

/* Per-step inputs of the recurrent-state ops (bk_ssm_conv, bk_gated_delta_net). A
 * recurrent layer keeps, per sequence, a fixed-size state in a *slot*: row `slot` of the
 * layer's state tensors (F32, (state_len, n_slots)). The step says per sequence, as data
 * in one I32 tensor (STATE_SEQ_WORDS, n_seqs) uploaded before the ops (so a replayed
 * graph sees new slots with the same arguments):
 *   STATE_ROW0, STATE_NROWS  its rows in the step: contiguous, in position order;
 *   STATE_SLOT               the slot its state is read from and written back to;
 *   STATE_FRESH              1: its first row is position 0, the state starts at zero
 *                            (the slot's old contents are ignored);
 *   STATE_SNAP_SLOT, STATE_SNAP_AT  when SNAP_AT >= 0, the state after its first SNAP_AT
 *                            rows of the step (0 <= SNAP_AT <= NROWS; 0 = the state it
 *                            came in with) is also written to slot SNAP_SLOT (a snapshot
 *                            for the prefix cache or a rollback). */
enum {
    STATE_ROW0 = 0,
    STATE_NROWS = 1,
    STATE_SLOT = 2,
    STATE_FRESH = 3,
    STATE_SNAP_SLOT = 4,
    STATE_SNAP_AT = 5,
    STATE_SEQ_WORDS = 6,
};

/* The Gated DeltaNet's head layout (Qwen3-Next / Qwen3.5 linear attention). q and k have
 * n_k_head heads of head_k, v has n_v_head heads of head_v; n_v_head is a multiple of
 * n_k_head, and value head h reads key head h % n_k_head (the tiled order: llama.cpp's
 * converter reorders Qwen3.5's value heads so), or h / (n_v_head / n_k_head) when grouped
 * (HF's order, which Qwen3-Next GGUFs keep). */
struct gdn_params {
    int32_t n_k_head, head_k, n_v_head, head_v;
    float eps;    /* L2 norm: x / sqrt(sum(x^2) + eps) (1e-6 in transformers and FLA) */
    bool grouped; /* value heads grouped by key head (qwen3next) rather than tiled */
};

/* A Gated DeltaNet mixer's weights after its input projections (bk_deltanet). */
struct deltanet_w {
    const struct tensor *conv;    /* F32 (d_conv, channels): the short conv's taps */
    const struct tensor *ssm_a;   /* F32 (n_v_head): -exp(A_log) */
    const struct tensor *dt_bias; /* F32 (n_v_head) */
    const struct tensor *norm;    /* F32 (head_v): the output's RMSNorm weight */
    float norm_eps;
};

/* An RMSNorm applied to an op's input before it is used (dst = W rms_norm(x) * w): lets a
 * backend fuse the norm with quantizing the activations for the matmul. */
struct prenorm {
    const struct tensor *w; /* F32 (n_in) or NULL (no weight) */
    float eps;
};

/* What happens to Q and K between the projections and the cache: optional per-head
 * RMSNorm (qwen3, gemma3), then RoPE; then K and V are stored. One fused kernel on a GPU. */
struct qk_prep {
    const struct tensor *q_norm, *k_norm; /* F32 (head_dim_k) or NULL */
    float eps;
    const struct rope_params *rope;
};

/* ---- the implementation's vtable ---- */

struct backend_ops {
    const char *name;
    uint32_t features; /* enum bk_feature bits this backend implements */
    void (*free)(struct backend *b);

    /* Memory. */
    smelt_status (*weight_bind)(struct backend *b, struct tensor *t, struct err *e);
    smelt_status (*buffer_alloc)(struct backend *b, struct tensor *t, struct err *e);
    void (*buffer_free)(struct backend *b, struct tensor *t);
    void (*step_begin)(struct backend *b);
    void *(*scratch_alloc)(struct backend *b, size_t nbytes);
    size_t (*scratch_mark)(struct backend *b);
    void (*scratch_release)(struct backend *b, size_t mark);
    void (*upload)(struct backend *b, struct tensor *dst, const void *src, size_t nbytes);
    void (*download)(struct backend *b, void *dst, const struct tensor *src, size_t nbytes);
    smelt_status (*sync)(struct backend *b, struct err *e);

    /* Basic ops (see the bk_ wrappers below for contracts). */
    void (*get_rows)(struct backend *b, struct tensor *dst, const struct tensor *src,
                     const struct tensor *ids);
    void (*rms_norm)(struct backend *b, struct tensor *dst, const struct tensor *x,
                     const struct tensor *w, float eps);
    /* Optional, with their feature bits (BK_FEAT_LAYER_NORM, BK_FEAT_ACT): encoders' ops. */
    void (*layer_norm)(struct backend *b, struct tensor *dst, const struct tensor *x,
                       const struct tensor *w, const struct tensor *bias, float eps);
    void (*act)(struct backend *b, struct tensor *dst, const struct tensor *x, enum glu_act act);
    void (*rope)(struct backend *b, struct tensor *x, const struct tensor *pos,
                 const struct rope_params *p);
    void (*matmul)(struct backend *b, struct tensor *dst, const struct tensor *w,
                   const struct tensor *x);
    void (*add)(struct backend *b, struct tensor *dst, const struct tensor *a,
                const struct tensor *c);
    void (*scale)(struct backend *b, struct tensor *dst, const struct tensor *x, float s);
    void (*glu)(struct backend *b, struct tensor *dst, const struct tensor *gate,
                const struct tensor *up, enum glu_act act);
    void (*softcap)(struct backend *b, struct tensor *x, float cap);
    void (*softmax)(struct backend *b, struct tensor *x);
    void (*kv_store)(struct backend *b, struct tensor *kc, struct tensor *vc,
                     const struct tensor *k, const struct tensor *v,
                     const struct attn_meta *m);
    void (*attention)(struct backend *b, struct tensor *dst, const struct tensor *q,
                      const struct tensor *kc, const struct tensor *vc,
                      const struct attn_meta *m, const struct attn_params *p);

    /* Recurrent-state ops: optional (NULL: the backend cannot run recurrent layers; a
     * model that has them is refused at load, see bk_has_recurrent). */
    void (*ssm_conv)(struct backend *b, struct tensor *dst, const struct tensor *x,
                     const struct tensor *w, struct tensor *cs, const struct tensor *seqs,
                     bool silu);
    void (*gated_delta_net)(struct backend *b, struct tensor *dst, const struct tensor *qkv,
                            const struct tensor *a, const struct tensor *bl,
                            const struct tensor *ssm_a, const struct tensor *dt_bias,
                            struct tensor *ss, const struct tensor *seqs,
                            const struct gdn_params *p);
    void (*copy)(struct backend *b, struct tensor *dst, const struct tensor *src);

    /* Fused ops: optional (NULL = composed from the basic ops by backend.c). */
    void (*matmul_group)(struct backend *b, int n, struct tensor *const *dst,
                         const struct tensor *const *w, const struct tensor *const *bias,
                         const struct tensor *x, const struct prenorm *pre);
    void (*matmul_acc)(struct backend *b, struct tensor *dst, const struct tensor *w,
                       const struct tensor *bias, const struct tensor *x,
                       const struct prenorm *next);
    void (*ffn_glu)(struct backend *b, struct tensor *dst, const struct tensor *w_gate,
                    const struct tensor *w_up, const struct tensor *x, enum glu_act act,
                    const struct prenorm *pre);
    /* bk_ffn where the backend keeps the hidden activations its own way; false: not for
     * these sizes (the composed ops run). */
    bool (*ffn)(struct backend *b, struct tensor *dst, const struct tensor *x,
                const struct tensor *w_gate, const struct tensor *w_up, const struct tensor *w_down,
                enum glu_act act, const struct prenorm *pre, bool acc);
    void (*rope_kv_store)(struct backend *b, struct tensor *q, struct tensor *k,
                          const struct tensor *v, struct tensor *kc, struct tensor *vc,
                          const struct attn_meta *m, const struct qk_prep *p);
    void (*rope_attention)(struct backend *b, struct tensor *dst, struct tensor *q,
                           struct tensor *k, const struct tensor *v, struct tensor *kc,
                           struct tensor *vc, const struct attn_meta *m,
                           const struct qk_prep *qp, const struct attn_params *ap);
    void (*norm_gate)(struct backend *b, struct tensor *dst, const struct tensor *x,
                      const struct tensor *w, const struct tensor *gate, float eps,
                      enum glu_act act);
    /* bk_deltanet at a decode step (one row a sequence); false: not for these sizes (the
     * composed ops run). */
    bool (*deltanet)(struct backend *b, struct tensor *z, const struct tensor *qkv,
                     const struct tensor *a, const struct tensor *bl, const struct deltanet_w *w,
                     struct tensor *cs, struct tensor *ss, const struct tensor *seqs,
                     const struct gdn_params *p);

    /* Mixture of experts: optional as a pair (NULL: the backend cannot run MoE models, and
     * the loader refuses them). See bk_moe_route, bk_moe_ffn. */
    void (*moe_route)(struct backend *b, struct tensor *ids, struct tensor *weights,
                      const struct tensor *x, const struct tensor *router,
                      const struct tensor *bias, enum moe_gating gating,
                      const struct prenorm *pre, const struct tensor *sh_gate_inp,
                      struct tensor *sh_logit);
    void (*moe_ffn)(struct backend *b, struct tensor *dst, const struct tensor *x,
                    const struct moe_experts *w, const struct tensor *ids,
                    const struct tensor *weights, const struct prenorm *pre, bool acc,
                    const struct prenorm *next);

    /* Row summaries for sampling: optional (NULL: model_step brings the rows to the host
     * and summarizes them there). See bk_logits_topk. */
    void (*logits_topk)(struct backend *b, struct tensor *dst, const struct tensor *logits,
                        const struct tensor *rows, const struct tensor *adj,
                        const struct tensor *mask);

    /* Step graphs: optional (NULL: ops always run one by one). See bk_graph_replay. */
    bool (*graph_replay)(struct backend *b, uint64_t key);
    void (*graph_begin)(struct backend *b, uint64_t key);
    void (*graph_end)(struct backend *b);

    /* Memory planning: optional (NULL: host memory, nothing to plan). See bk_mem_info. */
    bool (*mem_info)(struct backend *b, uint64_t *free_b, uint64_t *total_b);
    uint64_t (*weight_bytes)(struct backend *b, uint32_t type, const int64_t ne[TENSOR_MAX_DIMS]);
    size_t (*scratch_peak)(struct backend *b);
    smelt_status (*scratch_reserve)(struct backend *b, size_t nbytes, struct err *e);
};

/* Every backend starts with this header (implementations embed it first and call
 * bk_base_init / bk_base_free). */
struct backend {
    const struct backend_ops *ops;
    /* Sticky step error: the first failure of a step; ops are skipped once it is set. */
    smelt_status status;
    char msg[ERR_MSG_MAX];
    /* Host scratch for the step's tensor structs (the data may be device memory). */
    struct arena meta;
};

void bk_base_init(struct backend *b, const struct backend_ops *ops);
void bk_base_free(struct backend *b);
/* Records a run-time failure (first one wins) and returns it. For implementations. */
smelt_status bk_fail(struct backend *b, smelt_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void bk_free(struct backend *b);

/* ---- memory ---- */

/* Makes a host tensor (a view into a GGUF mapping) usable by ops. May replace t->data
 * (a device copy, a repacked layout); the host view must outlive the call only. */
smelt_status bk_weight_bind(struct backend *b, struct tensor *t, struct err *e);
/* Allocates persistent memory for t (shape/type already set, contiguous), zero-filled.
 * For the KV cache. Freed by bk_buffer_free. */
smelt_status bk_buffer_alloc(struct backend *b, struct tensor *t, struct err *e);
void bk_buffer_free(struct backend *b, struct tensor *t);

/* Starts a step: releases the previous step's scratch and clears the sticky error. */
void bk_step_begin(struct backend *b);
/* A new contiguous scratch tensor, valid until the next bk_step_begin. Contents are
 * undefined. On exhaustion: records SMELT_ERR_NOMEM and returns a tensor with data NULL
 * (later ops are skipped, bk_sync reports it). The tensor struct itself lives in host
 * scratch. */
struct tensor *bk_new(struct backend *b, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2);
/* Scratch is a stack within a step: everything allocated after a mark is released by
 * bk_scratch_release(mark) (a layer's temporaries, so a step's scratch is one layer's
 * worth plus what lives across layers). Tensors allocated after the mark must not be
 * used afterwards. Deterministic, so replayed graphs see the same addresses. */
size_t bk_scratch_mark(struct backend *b);
void bk_scratch_release(struct backend *b, size_t mark);
/* A view of t with a new shape (same bytes, t contiguous, same element count). */
struct tensor *bk_reshape(struct backend *b, const struct tensor *t, int64_t ne0, int64_t ne1,
                          int64_t ne2);
/* A 2-D view: ne0 x ne1 elements starting offset bytes into t, rows nb1 bytes apart. */
struct tensor *bk_view_2d(struct backend *b, const struct tensor *t, int64_t ne0, int64_t ne1,
                          size_t nb1, size_t offset);
/* A 3-D view: ne0 x ne1 x ne2 elements starting offset bytes into t, nb1 / nb2 bytes
 * between rows / planes (e.g. every other head of a projection). */
struct tensor *bk_view_3d(struct backend *b, const struct tensor *t, int64_t ne0, int64_t ne1,
                          int64_t ne2, size_t nb1, size_t nb2, size_t offset);
/* Copies nbytes of host memory into the start of dst / of src into host memory. */
void bk_upload(struct backend *b, struct tensor *dst, const void *src, size_t nbytes);
void bk_download(struct backend *b, void *dst, const struct tensor *src, size_t nbytes);
/* Waits for the enqueued ops; returns the step's sticky error (message in e). */
smelt_status bk_sync(struct backend *b, struct err *e);

/* ---- memory planning (engine/memplan.h) ----
 * A device backend says how much memory it has and what loading and running a model will
 * take, so the caller can size the KV pool from what is left. The CPU backend has no
 * device: bk_mem_info returns false and weights cost nothing (they stay in the mapping). */

/* Free and total bytes of the backend's device; false when it runs from host memory. */
bool bk_mem_info(struct backend *b, uint64_t *free_b, uint64_t *total_b);
/* Device bytes bk_weight_bind will allocate for a GGUF tensor of this type and shape (after
 * any repacking; vectors as the F32 the loader converts them to). 0 on a host backend. */
uint64_t bk_weight_bytes(struct backend *b, uint32_t type, const int64_t ne[TENSOR_MAX_DIMS]);
/* The most scratch a step has used since the backend was created, in bytes, counted as if
 * the scratch were one block (0 when the backend does not track it). */
size_t bk_scratch_peak(struct backend *b);
/* Makes the scratch one block of at least nbytes now, so later steps up to that size never
 * grow it (growing mid-serving costs an allocation and drops every recorded step graph).
 * Drops the recorded step graphs itself: they may refer to buffers freed since (a warm-up's
 * temporary KV cache). No-op on a backend without it. */
smelt_status bk_scratch_reserve(struct backend *b, size_t nbytes, struct err *e);

/* ---- ops ----
 * dst may alias an input where noted ("in place ok"). */

/* dst (ne0, n) F32 = rows ids[0..n) of src (ne0, n_rows), dequantized. src may be any
 * type with a dequantizer (F32, F16, BF16, Q8_0, Q4_K, Q6_K, ...): token embeddings, and
 * gathering the rows that want logits. ids I32 (n); each id < n_rows (caller checked). */
void bk_get_rows(struct backend *b, struct tensor *dst, const struct tensor *src,
                 const struct tensor *ids);
/* RMSNorm over ne0 of every row: dst = x / sqrt(mean(x^2) + eps) * w. w F32 (ne0) or
 * NULL. Works per head too: view q as (head_dim, n_head * n_tokens). In place ok. */
void bk_rms_norm(struct backend *b, struct tensor *dst, const struct tensor *x,
                 const struct tensor *w, float eps);
/* LayerNorm over ne0 of every row: dst = (x - mean(x)) / sqrt(var(x) + eps) * w + bias
 * (var the biased variance, as torch's LayerNorm). w, bias F32 (ne0) or NULL. In place ok.
 * Needs BK_FEAT_LAYER_NORM. */
void bk_layer_norm(struct backend *b, struct tensor *dst, const struct tensor *x,
                   const struct tensor *w, const struct tensor *bias, float eps);
/* dst = act(x) element-wise, no gate (a non-gated FFN: bert's GELU): act GLU_SILU (silu x),
 * GLU_GELU_TANH or GLU_GELU_ERF. Same shapes; in place ok. Needs BK_FEAT_ACT. */
void bk_act(struct backend *b, struct tensor *dst, const struct tensor *x, enum glu_act act);
/* In place on x (head_dim, n_head, n_tokens) with pos I32 (n_tokens). */
void bk_rope(struct backend *b, struct tensor *x, const struct tensor *pos,
             const struct rope_params *p);
/* dst (n_out, n) F32 = W x: w (n_in, n_out) of any weight type, x (n_in, n) F32. */
void bk_matmul(struct backend *b, struct tensor *dst, const struct tensor *w,
               const struct tensor *x);
/* dst = a + c. c has a's shape, or ne1 == 1 and is broadcast over a's rows (a bias).
 * In place ok (dst == a). */
void bk_add(struct backend *b, struct tensor *dst, const struct tensor *a,
            const struct tensor *c);
/* dst = x * s. In place ok. */
void bk_scale(struct backend *b, struct tensor *dst, const struct tensor *x, float s);
/* dst = act(gate) * up, all the same shape; or gate (1, rows of up): one gate per row,
 * dst[:, r] = act(gate[r]) * up[:, r] (a shared expert's sigmoid gate; not with
 * GLU_SWIGLU_OAI; needs BK_FEAT_GLU_ROW_GATE). In place ok (dst == gate or up). */
void bk_glu(struct backend *b, struct tensor *dst, const struct tensor *gate,
            const struct tensor *up, enum glu_act act);
/* Fused gated RMSNorm (the Gated DeltaNet's output): dst = act(gate) * (rms_norm(x) * w),
 * the norm over each group of w->ne0 consecutive elements of a row (a value head), exactly
 * bk_rms_norm on x viewed as (w->ne0, rows * groups) followed by bk_glu(dst, gate, that).
 * x, gate and dst contiguous F32 of one shape, ne0 a multiple of w->ne0; w F32 (one
 * group), not NULL; act as bk_glu's (full-shape gate). x is not modified; in place ok on
 * gate (dst == gate). */
void bk_norm_gate(struct backend *b, struct tensor *dst, const struct tensor *x,
                  const struct tensor *w, const struct tensor *gate, float eps, enum glu_act act);
/* x = cap * tanh(x / cap), in place (final-logit soft-capping). */
void bk_softcap(struct backend *b, struct tensor *x, float cap);
/* Softmax over ne0 of each row, in place. */
void bk_softmax(struct backend *b, struct tensor *x);
/* Writes each row's K (head_dim_k, n_kv_head, n_tokens) and V (head_dim_v, n_kv_head,
 * n_tokens) into the caches kc (head_dim_k, block_size, n_kv_head, n_blocks) and vc
 * (head_dim_v, block_size, n_kv_head, n_blocks) at slot m->slot[row], converting to the
 * cache's element type (F32, F16; later quantized). */
void bk_kv_store(struct backend *b, struct tensor *kc, struct tensor *vc,
                 const struct tensor *k, const struct tensor *v, const struct attn_meta *m);
/* Causal attention of q (head_dim_k, n_head, n_tokens) over each row's sequence in the
 * paged caches (see struct attn_meta), or bidirectional with p->non_causal (over the
 * sequence's m->n_keys keys); GQA when n_head is a multiple of the caches'
 * n_kv_head (query head h reads KV head h / (n_head / n_kv_head)).
 * dst (head_dim_v, n_head, n_tokens) F32. */
void bk_attention(struct backend *b, struct tensor *dst, const struct tensor *q,
                  const struct tensor *kc, const struct tensor *vc, const struct attn_meta *m,
                  const struct attn_params *p);

/* dst = src, element by element: src F32 with any row strides (a view), dst F32 of the
 * same shape (contiguous or a view). Deinterleaves, and copies state slots. */
void bk_copy(struct backend *b, struct tensor *dst, const struct tensor *src);

/* ---- recurrent-state ops (the state layout and struct state seqs: see STATE_*) ---- */

/* True when the backend runs bk_ssm_conv and bk_gated_delta_net. */
bool bk_has_recurrent(const struct backend *b);
/* Causal depthwise conv1d over each sequence's rows, with its state: for channel c and
 * row t, dst[c, t] = sum_j w[j, c] * in[c, t - (d_conv - 1) + j], where in[] before the
 * sequence's first row of the step comes from the conv state (zeros when FRESH); then
 * SiLU when silu. x, dst F32 (C, n_tokens) (dst may not alias x); w F32 (d_conv, C) (row
 * c's taps in ne0, oldest input first); cs F32 ((d_conv - 1) * C, n_slots): a slot holds
 * the last d_conv - 1 input rows, oldest first, each C wide; it is updated to the inputs
 * ending at the sequence's last row (and its snapshot, when asked, to those ending at
 * SNAP_AT). seqs I32 (STATE_SEQ_WORDS, n_seqs). */
void bk_ssm_conv(struct backend *b, struct tensor *dst, const struct tensor *x,
                 const struct tensor *w, struct tensor *cs, const struct tensor *seqs, bool silu);
/* The gated delta rule (Gated DeltaNet) over each sequence's rows, with its state. Per
 * row t and value head h (key head kh = h % n_k_head):
 *   q = l2norm(q_kh) / sqrt(head_k), k = l2norm(k_kh), v = v_h
 *   g = ssm_a[h] * softplus(a[h] + dt_bias[h])   (log decay, ssm_a = -exp(A_log) <= 0)
 *   beta = sigmoid(bl[h])
 *   S = exp(g) S;  S += beta (v - S k) k^T;  dst[:, h, t] = S q
 * with S (head_v x head_k) the head's state. qkv F32 (2 * n_k_head * head_k + n_v_head *
 * head_v, n_tokens): q heads, k heads, v heads in a row (the conv's output); a, bl F32
 * (n_v_head, n_tokens); ssm_a, dt_bias F32 (n_v_head); ss F32 (n_v_head * head_v *
 * head_k, n_slots): slot = n_v_head states of head_v rows of head_k (row v holds S[v, :]);
 * dst F32 (head_v, n_v_head, n_tokens). kh = h / (n_v_head / n_k_head) when p->grouped.
 * The state is updated (and snapshotted) as in
 * bk_ssm_conv. A backend may run a chunked form for prefill rows (same math, other
 * rounding). */
void bk_gated_delta_net(struct backend *b, struct tensor *dst, const struct tensor *qkv,
                        const struct tensor *a, const struct tensor *bl, const struct tensor *ssm_a,
                        const struct tensor *dt_bias, struct tensor *ss, const struct tensor *seqs,
                        const struct gdn_params *p);
/* A Gated DeltaNet mixer after its projections, as one op: xc = silu(conv(qkv)) with the
 * conv state cs (bk_ssm_conv), o = the delta rule on xc, a and bl with the state ss
 * (bk_gated_delta_net), then z = silu(z) * rms_norm(o per value head) * w->norm in place
 * (bk_norm_gate, eps w->norm_eps). qkv is not changed; z F32 (n_v_head * head_v, n_tokens)
 * is the gate in and the output out. one_row: no sequence has more than one row in the step
 * (a decode step, attn_meta.one_per_seq), where a backend may fuse the three (the CUDA
 * backend: two launches, the same bits); otherwise, or without the fused op, the three ops
 * run. */
void bk_deltanet(struct backend *b, struct tensor *z, const struct tensor *qkv, const struct tensor *a,
                 const struct tensor *bl, const struct deltanet_w *w, struct tensor *cs,
                 struct tensor *ss, const struct tensor *seqs, const struct gdn_params *p,
                 bool one_row);

/* Fused: dst[i] = W[i] x' (+ bias[i]) for i < n, one shared input x' = x, or
 * rms_norm(x) * pre->w when pre is not NULL (norm + quantize + QKV in one pass). bias may
 * be NULL, or n entries each NULL or F32 (dst[i]->ne0). x is not modified. */
void bk_matmul_group(struct backend *b, int n, struct tensor *const *dst,
                     const struct tensor *const *w, const struct tensor *const *bias,
                     const struct tensor *x, const struct prenorm *pre);
/* Fused: dst += W x (+ bias), as dst + (W x + bias) (transformers' order: the projection
 * with its bias, then the residual add), in one pass. bias may be NULL or F32 (dst->ne0).
 * next (may be NULL) is a hint: the caller's next use of dst is a bk_matmul_group or
 * bk_ffn_glu through this norm, for which a backend may prepare dst in the same pass. */
void bk_matmul_acc(struct backend *b, struct tensor *dst, const struct tensor *w,
                   const struct tensor *bias, const struct tensor *x, const struct prenorm *next);
/* Fused: dst (n_ff, n) = act(W_gate x') * (W_up x'), x' as in bk_matmul_group. */
void bk_ffn_glu(struct backend *b, struct tensor *dst, const struct tensor *w_gate,
                const struct tensor *w_up, const struct tensor *x, enum glu_act act,
                const struct prenorm *pre);
/* Fused: the dense GLU FFN, h = act(W_gate x') * (W_up x') (x' as in bk_ffn_glu), then dst
 * += W_down h (acc; next as bk_matmul_acc's) or dst = W_down h. h is the backend's own (no
 * tensor of the step holds it: the CUDA backend keeps it as the down product's f16 input). */
void bk_ffn(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w_gate,
            const struct tensor *w_up, const struct tensor *w_down, enum glu_act act,
            const struct prenorm *pre, bool acc, const struct prenorm *next);
/* Fused: per-head RMSNorm of q and k (when given), RoPE on both, in place; then
 * bk_kv_store of k and v. */
void bk_rope_kv_store(struct backend *b, struct tensor *q, struct tensor *k,
                      const struct tensor *v, struct tensor *kc, struct tensor *vc,
                      const struct attn_meta *m, const struct qk_prep *p);
/* Fused: bk_rope_kv_store then bk_attention of q into dst. q and k hold unspecified
 * values afterwards (rotated in place, or left raw by a backend that rotates them on the
 * fly, e.g. for a decode step: m->one_per_seq). */
void bk_rope_attention(struct backend *b, struct tensor *dst, struct tensor *q, struct tensor *k,
                       const struct tensor *v, struct tensor *kc, struct tensor *vc,
                       const struct attn_meta *m, const struct qk_prep *qp,
                       const struct attn_params *ap);

/* Mixture-of-experts router, for each row r of x (n_embd, n):
 *   logits = router x'_r (+ bias), x'_r = x_r, or rms_norm(x_r) * pre->w when pre is given;
 *   ids[., r] = the k experts with the largest logits, largest first (ties: lower id first);
 *   weights[., r] = their weights by `gating` (enum moe_gating).
 * ids I32 (k, n) and weights F32 (k, n) with k = ids->ne[0] <= n_expert; router F32
 * (n_embd, n_expert); bias F32 (n_expert) or NULL. Everything a row gets depends on that
 * row alone, bit for bit: the logits are computed with one fixed arithmetic per row
 * whatever n is, so which experts a row gets never depends on the other rows of the step
 * (batch invariance; no capacity limit, no token dropping). The ids stay where the backend
 * wrote them (device memory on a GPU): bk_moe_ffn reads them there, no host round trip. */
void bk_moe_route(struct backend *b, struct tensor *ids, struct tensor *weights,
                  const struct tensor *x, const struct tensor *router, const struct tensor *bias,
                  enum moe_gating gating, const struct prenorm *pre,
                  const struct tensor *sh_gate_inp, struct tensor *sh_logit);
/* (bk_moe_route, continued) With sh_gate_inp (F32, n_embd values) the router also writes
 * sh_logit (F32 (1, n)) = sh_gate_inp . x'_r per row, the shared expert's gate logits for
 * bk_moe_ffn (struct moe_experts.sh_logit); both NULL: none. The CPU computes them as
 * bk_matmul_group would; a GPU decode router in its own launch. */
/* Mixture-of-experts FFN: for each row r of x (n_embd, n), with x' as in bk_moe_route,
 *   y_r = sum over j < k of weights[j, r] * W_down[e] (act(W_gate[e] x'_r) * (W_up[e] x'_r)),
 *         e = ids[j, r],
 * summed in an order fixed by the row's own ids (the CPU: increasing expert id, as
 * transformers sums); then
 * dst (n_embd, n) = y, or dst += y when acc (the residual add); then, with a shared expert,
 * dst += s_r W_down_sh (act(W_gate_sh x'_r) * (W_up_sh x'_r)), s_r = sigmoid(sh_logit[r])
 * or 1 (the CPU: in that order, through bk_moe_shared_hidden and bk_moe_shared_down; a
 * backend may sum the shared expert with the experts instead, s_r as its weight, last). dst may be x: x is read
 * whole before dst is written. Shapes: struct moe_experts; ids and weights as
 * bk_moe_route writes them. A backend groups the step's rows by expert, so each active
 * expert's weights are read once per step (a grouped matmul over the rows routed to it;
 * with one row, a matrix-vector product over the selected experts only): its result for a
 * row differs from running that row alone only as its matmuls differ between row counts.
 * The scratch it takes depends on the shapes (n, k, n_expert) only, never on the routing,
 * so a replayed step graph finds it at the same addresses. An id outside [0, n_expert)
 * never reads out of bounds (the CPU reports it as a sticky error). next (may be NULL) is
 * bk_matmul_acc's hint: the norm through which the caller uses dst next. */
void bk_moe_ffn(struct backend *b, struct tensor *dst, const struct tensor *x,
                const struct moe_experts *w, const struct tensor *ids,
                const struct tensor *weights, const struct prenorm *pre, bool acc,
                const struct prenorm *next);
/* For a backend's moe_ffn, the shared expert by the generic ops, as the CPU runs it:
 * bk_moe_shared_hidden returns h (n_ff_sh, n) = act(W_gate_sh x') * (W_up_sh x') scaled per
 * row by sigmoid(sh_logit) (bk_ffn_glu, bk_glu), in b's step scratch, or NULL without a
 * shared expert; call it before dst changes (dst may be x). bk_moe_shared_down then adds
 * W_down_sh h to dst (bk_matmul_acc, next its hint). */
struct tensor *bk_moe_shared_hidden(struct backend *b, const struct tensor *x,
                                    const struct moe_experts *w, const struct prenorm *pre);
void bk_moe_shared_down(struct backend *b, struct tensor *dst, const struct moe_experts *w,
                        const struct tensor *h, const struct prenorm *next);
/* True when the backend implements the two MoE ops (else the loader refuses MoE models). */
bool bk_has_moe(const struct backend *b);
/* The bits of `features` (enum bk_feature) the backend does not implement (0: all of
 * them). */
uint32_t bk_missing_features(const struct backend *b, uint32_t features);
/* Names the enum bk_feature bits of `features` in buf ("attention sinks, ..."); returns
 * buf. */
const char *bk_feature_names(uint32_t features, char *buf, size_t n);

/* Row summaries for sampling (backend/topk.h, docs/sampling.md): for each row r of logits
 * F32 (n_vocab, n_rows), with rows I32 (TOPK_ROW_WORDS, n_rows) holding struct topk_row
 * and adj I32 (TOPK_ADJ_WORDS, adj_cap) the adjustment entries the rows reference (each
 * row's range inside [0, adj_cap), sorted by token), writes into dst I32
 * (topk_out_words(n_rows, adj_cap)) the row's summary, its k best candidates by adjusted
 * logit and the raw logits of its adjustments' tokens. A row with k = 0 is skipped. mask
 * I32 (topk_mask_words(n_vocab), n_rows), or NULL when no row has TOPK_MASK: row r's
 * allowed tokens, read for rows whose flags have TOPK_MASK (the others' mask rows may hold
 * anything). Graph-friendly: everything per step is data in the tensors. */
void bk_logits_topk(struct backend *b, struct tensor *dst, const struct tensor *logits,
                    const struct tensor *rows, const struct tensor *adj, const struct tensor *mask);
/* True when the backend implements bk_logits_topk (else the caller summarizes on the
 * host with topk_summarize_row, backend/topk.h). */
bool bk_has_logits_topk(const struct backend *b);

/* ---- step graphs ----
 * A step's ops depend only on its shape (token rows, output rows, sequences, block-table
 * width) and on the model; everything else is data in tensors uploaded before the ops.
 * So a backend may record the ops of a step once and replay them for every later step of
 * the same shape, the key; the key also names the model and its KV caches, by an id that
 * is never reused (a recording holds their addresses). The caller (model_forward) does,
 * after its uploads:
 *     if (!bk_graph_replay(b, key)) { bk_graph_begin(b, key); ...ops...; bk_graph_end(b); }
 * bk_graph_replay returns true when it launched a recording of key: the caller then skips
 * the ops (their outputs appear at the same scratch addresses as when recorded, because
 * a step of the same shape allocates the same sizes in the same order). Backends without
 * graphs return false and ignore begin/end. SMELT_NO_GRAPH=1 turns graphs off. */
bool bk_graph_replay(struct backend *b, uint64_t key);
void bk_graph_begin(struct backend *b, uint64_t key);
void bk_graph_end(struct backend *b);

/* ---- implementations ---- */

/* The CPU backend with n_threads workers (0: one per core). */
smelt_status cpu_backend_new(struct backend **out, int n_threads, struct err *e);
/* STREAM-like read bandwidth of this machine in GB/s (*gbs): n_threads threads (<= 0: all
 * CPUs) summing a buffer of `bytes` (at least 1 MiB), best of `passes` timed passes after
 * one untimed one. What a memory-bound CPU decode step reading that many bytes can reach
 * (smelt bench --bw measure). Errors: NOMEM, or the pool's. */
smelt_status cpu_read_bandwidth(int n_threads, uint64_t bytes, int passes, double *gbs,
                                struct err *e);
/* Reference matmuls on a CPU backend: weights dequantized to F32 and dotted with F32
 * activations (slow; for checking the forward pass without 8-bit activation noise). */
void cpu_backend_set_exact(struct backend *b, bool exact);

#endif
