/* Models: hyper-parameters from GGUF metadata, weights bound by tensor name, and the
 * batched forward pass written against the op interface (backend/backend.h).
 *
 * model.c holds what every architecture shares (metadata, weight binding with shape
 * checks, the layers' memory (KV blocks and recurrent state slots), the step's inputs,
 * embedding, attention block, the FFN (dense or mixture of experts), logits). Each
 * architecture family has one file (model_llama.c: llama, qwen2, qwen3, qwen3moe;
 * model_gemma3.c; model_qwen35.c: qwen35, qwen35moe, qwen3next; model_gpt_oss.c;
 * model_bert.c) that binds its own per-layer weights and writes its forward pass as a
 * readable sequence of ops. See docs/forward.md for how to add one, and for the memory kinds.
 *
 * Lifetimes: the gguf_file outlives the model (weights are views into its mapping on the
 * CPU). A kv_store belongs to one model and one backend.
 */
#ifndef SMELT_MODEL_H
#define SMELT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "format/gguf.h"
#include "model/batch.h"
#include "util/arena.h"

#define MODEL_ARCH_NAME_MAX 32

/* How an embedding model makes one vector of a sequence's final hidden states, as
 * llama.cpp's converter writes {arch}.pooling_type from sentence-transformers' Pooling
 * module (the values are GGUF's). The model returns the rows (model_step_hidden); the
 * engine pools them. Rerankers (4, rank) are refused at load. */
enum model_pooling {
    POOL_NONE = 0, /* not an embedding model */
    POOL_MEAN = 1, /* the mean of every row */
    POOL_CLS = 2,  /* the first row (position 0: BERT's [CLS]) */
    POOL_LAST = 3, /* the last row (decoder embedding models: Qwen3-Embedding) */
};

/* Hyper-parameters common to the supported architectures. Per-layer attention shapes
 * (which may differ between layers) are in struct layer_attn. */
struct model_hparams {
    char arch[MODEL_ARCH_NAME_MAX]; /* general.architecture */
    int32_t n_vocab;      /* ids taken and scored: the tokens, else token_embd rows */
    int32_t n_ctx_train;  /* {arch}.context_length */
    int32_t n_embd;       /* {arch}.embedding_length */
    int32_t n_layer;      /* {arch}.block_count */
    int32_t n_ff;         /* {arch}.feed_forward_length */
    int32_t n_head;       /* {arch}.attention.head_count */
    int32_t n_head_kv;    /* {arch}.attention.head_count_kv (default n_head) */
    int32_t head_dim_k;   /* {arch}.attention.key_length (default n_embd / n_head) */
    int32_t head_dim_v;   /* {arch}.attention.value_length (default head_dim_k) */
    float norm_eps;       /* {arch}.attention.layer_norm_rms_epsilon */
    float embd_scale;     /* input embeddings are multiplied by this (gemma: sqrt(n_embd)) */
    float final_softcap;  /* {arch}.final_logit_softcapping; 0 = none */
    bool tied_output;     /* no output.weight: logits use token_embd */
    /* mixture of experts (architectures with FFN_MOE; 0 for dense ones) */
    int32_t n_expert;      /* {arch}.expert_count */
    int32_t n_expert_used; /* {arch}.expert_used_count: experts per token */
    int32_t n_ff_exp;      /* {arch}.expert_feed_forward_length (default n_ff / n_expert_used) */
    int32_t n_ff_shexp;    /* {arch}.expert_shared_feed_forward_length (default n_ff): the
                            * shared expert's width, where the layers have one */
    enum moe_gating gating; /* how router logits become expert weights (the arch sets it) */
    /* embedding models */
    enum model_pooling pooling; /* {arch}.pooling_type: POOL_NONE for a generative model */
    bool causal;          /* {arch}.attention.causal (default true; encoders: false) */
};

/* What a layer remembers between steps (docs/forward.md, "Memory kinds"):
 *   MEM_KV     paged K/V, one entry per position (attention);
 *   MEM_STATE  a fixed-size recurrent state per sequence, in a slot: a rolling window of
 *              the last inputs (conv_len floats: a short convolution's d_conv - 1 rows,
 *              RWKV's token shift) and a state proper (ssm_len floats: the DeltaNet
 *              matrices, Mamba's SSM state), both F32;
 *   MEM_NONE   nothing (a layer that sees only its own row). */
enum mem_kind { MEM_NONE = 0, MEM_KV = 1, MEM_STATE = 2 };

struct layer_mem {
    enum mem_kind kind;
    int64_t conv_len, ssm_len; /* MEM_STATE: floats per slot in each part (0: no part) */
};

/* One layer's attention configuration: fixed at load, read by the forward pass. */
struct layer_attn {
    int32_t n_head, n_head_kv, head_dim_k, head_dim_v;
    struct rope_params rope;
    struct attn_params attn; /* scale, soft-cap, sliding window */
};

/* The attention weights most architectures share. Shapes (ne0, ne1): a matmul weight
 * (n_in, n_out) maps n_in -> n_out. NULL means absent. */
struct attn_weights {
    const struct tensor *wq;     /* (n_embd, n_head * head_dim_k) */
    const struct tensor *wk;     /* (n_embd, n_head_kv * head_dim_k) */
    const struct tensor *wv;     /* (n_embd, n_head_kv * head_dim_v) */
    const struct tensor *wo;     /* (n_head * head_dim_v, n_embd) */
    const struct tensor *bq;     /* (n_head * head_dim_k) or NULL (qwen2 has biases) */
    const struct tensor *bk;     /* (n_head_kv * head_dim_k) or NULL */
    const struct tensor *bv;     /* (n_head_kv * head_dim_v) or NULL */
    const struct tensor *q_norm; /* (head_dim_k) or NULL (qwen3, gemma3: RMSNorm per head) */
    const struct tensor *k_norm; /* (head_dim_k) or NULL */
};

/* One layer's FFN on rms_norm(x) * norm: dense, or a mixture of experts (router set),
 * optionally with a shared expert: a dense FFN every row runs beside its routed experts
 * (qwen35moe, qwen3next; qwen2moe and deepseek have one too), its output scaled by
 * sigmoid(sh_gate_inp . x') when that gate is present. */
struct ffn_weights {
    const struct tensor *norm;   /* (n_embd) */
    const struct tensor *router; /* MoE: F32 (n_embd, n_expert); NULL: dense */
    const struct tensor *gate;   /* dense (n_embd, n_ff); MoE (n_embd, n_ff_exp, n_expert) */
    const struct tensor *up;     /* as gate */
    const struct tensor *down;   /* dense (n_ff, n_embd); MoE (n_ff_exp, n_embd, n_expert) */
    /* MoE biases (gpt-oss), F32, or NULL */
    const struct tensor *router_b;       /* (n_expert) */
    const struct tensor *gate_b, *up_b;  /* (n_ff_exp, n_expert): all three or none */
    const struct tensor *down_b;         /* (n_embd, n_expert) */
    const struct tensor *sh_gate, *sh_up; /* shared expert (n_embd, n_ff_shexp) or NULL */
    const struct tensor *sh_down;         /* (n_ff_shexp, n_embd) */
    const struct tensor *sh_gate_inp;     /* F32 (n_embd, 1) or NULL: no gate */
};

/* What an architecture's FFN layers are. */
enum ffn_kind {
    FFN_DENSE = 0, /* gate/up/down matrices */
    FFN_MOE = 1,   /* a router and n_expert stacked experts per layer; needs a backend with
                    * the MoE ops (bk_has_moe), else the load is refused */
};

struct model;
struct step;

/* An architecture: binds its weights, then runs its forward pass for one step. */
struct arch_def {
    const char *name; /* general.architecture */
    /* Reads arch-specific metadata, fills m->layer[] and binds the layer weights
     * (m->arch_layers). Common hyper-parameters and the embedding/output tensors are
     * already loaded. */
    smelt_status (*load)(struct model *m, const struct gguf_file *f, struct err *e);
    /* Returns the hidden state (n_embd, n_tokens) after the last block, before the final
     * norm. Ops only: errors are sticky in the backend. */
    struct tensor *(*forward)(struct model *m, struct step *s);
    enum ffn_kind ffn; /* FFN_MOE: the loader reads the expert keys first */
    uint32_t needs;    /* enum bk_feature bits the forward uses: a backend without one of
                        * them is refused before anything is bound */
    bool encoder;      /* an encoder (bert): LayerNorm's epsilon key, bidirectional attention,
                        * no output norm and no output head (hidden states only, for
                        * embeddings), pooling MEAN when the file names none */
    /* Makes head (zeroed, its bk, hp and host arena set) the model's multi-token-prediction
     * head (model_mtp_new), or NULL: the architecture has none. */
    smelt_status (*mtp)(const struct model *m, struct model *head, struct err *e);
    bool reads_hidden; /* the forward reads struct step.hidden (model_step_mtp's hidden_in) */
};

/* Where a step shape's logits were left (see model_forward and bk_graph_replay). */
#define MODEL_GRAPHS 64
struct step_graph {
    bool used;
    uint64_t key;
    void *logits;
};

/* Row summaries a step returns instead of full logit rows (backend/topk.h, sampling in
 * engine/sample.h): the caller says per output row what it needs; the backend reduces
 * each row where the logits are and only the summaries come back. */
struct model_sample {
    int32_t n_rows;                /* must equal the step's output rows */
    const struct topk_row *rows;   /* (n_rows) requests; adj_off indexes adj */
    const struct logit_adj *adj;   /* adjustment entries (each row's range sorted by token) */
    int32_t n_adj;                 /* <= model_adj_cap(n_rows) */
    struct topk_summary *sum;      /* out: (n_rows) */
    struct topk_cand *cand;        /* out: (n_rows, TOPK_MAX); filled only for rows with
                                    * k > 1 (a k = 1 row's candidate is in its summary) */
    float *adj_raw;                /* out: (n_adj) raw logit of each entry's token; may be
                                    * NULL */
    /* Token masks (structured output): row r's allowed tokens at mask + r * words
     * (words = topk_mask_words(n_vocab)), read for the rows whose request has TOPK_MASK;
     * NULL when none has. */
    const uint32_t *mask;
    /* NULL, or called once per step that has masked rows, after the forward's ops are
     * issued and before the summaries are made: it writes the masks. On a backend that runs
     * asynchronously (CUDA) the device computes the forward meanwhile, so the host's mask
     * work overlaps it. It cannot fail the step: a row whose mask could not be made is the
     * caller's to handle (it still gets a summary of whatever its mask row holds). */
    void (*fill_masks)(void *ctx);
    void *fill_ctx;
};

struct model {
    const struct arch_def *arch;
    struct model_hparams hp;
    struct backend *bk;
    /* --n-cpu-moe: the experts of layers 0..n_cpu_moe-1 are bound to host_bk (a CPU
     * backend the model owns) and run there; bk_moe_ffn moves the rows across (backend.c).
     * Steps then run without graphs (the crossing waits for the device). NULL / 0: none. */
    struct backend *host_bk;
    int32_t n_cpu_moe;
    struct layer_attn *layer;         /* (n_layer) */
    struct layer_mem *mem;            /* (n_layer) each layer's memory kind: MEM_KV unless
                                       * the architecture says otherwise */
    const struct tensor *tok_embd;    /* (n_embd, n_vocab) */
    const struct tensor *output_norm; /* (n_embd) */
    const struct tensor *output;      /* (n_embd, n_vocab); == tok_embd when tied; NULL for
                                       * an encoder (no logits) */
    int32_t n_pos;                    /* absolute position embeddings: positions stay below
                                       * it (0: no bound) */
    const struct tensor *rope_freqs;  /* (n_rot / 2) or NULL: Llama-3 frequency factors */
    void *arch_layers;                /* the architecture's per-layer weight structs */

    /* Storage owned by the loader: bound tensor structs and F32 copies of small
     * tensors stored in another type. Freed with the model. */
    struct tensor *tensors;
    int64_t n_tensors, cap_tensors;
    void **owned;
    int64_t n_owned;
    size_t cap_owned;

    struct arena host; /* host scratch for building a step's inputs (one step at a time) */
    struct step_graph graphs[MODEL_GRAPHS];
    int next_graph;
    /* the last step's logits (backend memory), for model_fetch_rows until the next step */
    void *last_logits;
    int32_t last_n_out;
    float *host_rows; /* a backend without logits_topk: the rows summarized on the host */
    size_t host_rows_cap;
};

/* The supported architectures (general.architecture values). */
extern const struct arch_def arch_llama, arch_qwen2, arch_qwen3, arch_qwen3moe, arch_gemma3,
    arch_qwen35, arch_qwen35moe, arch_qwen3next, arch_gpt_oss, arch_bert;

/* Loads hyper-parameters and binds weights of the GGUF's architecture. f must outlive the
 * model. Fails with a message naming the missing or inconsistent key or tensor. */
smelt_status model_load(struct model **out, const struct gguf_file *f, struct backend *bk,
                        struct err *e);
/* Where a model's weights go besides bk (model_load_placed). */
struct model_place {
    struct backend *host_bk; /* taken over by the model (freed by model_free, also when the
                              * load fails); NULL: everything on bk */
    int32_t n_cpu_moe;       /* the experts of the first n_cpu_moe layers go to host_bk */
};
/* model_load with some experts kept on a host backend (--n-cpu-moe). A model without
 * experts, or n_cpu_moe 0, loads as model_load does (host_bk is freed unused). */
smelt_status model_load_placed(struct model **out, const struct gguf_file *f, struct backend *bk,
                               const struct model_place *place, struct err *e);
void model_free(struct model *m);
/* True when GGUF tensor `name` is an expert tensor (blk.N.ffn_*_exps.*) of a layer N <
 * n_cpu_moe: the tensors --n-cpu-moe keeps on the host. */
bool model_expert_on_host(const char *name, int32_t n_cpu_moe);
/* True when GGUF tensor `name` is a matrix the loader widens to F32 whatever its file type
 * (ld_matrix_f32: the conv taps blk.N.ssm_conv1d.weight, bert's token_types.weight): the
 * memory plan counts it as F32. */
bool model_tensor_widened(const char *name);

/* The memory of the model's layers (docs/forward.md, "Memory kinds"):
 * - MEM_KV layers: one K and one V tensor each, (head_dim, block_size, n_head_kv, n_blocks)
 *   of element type `type` (F32, F16, BF16). Block ids index the last dimension.
 * - MEM_STATE layers: conv and ssm tensors, F32 (conv_len or ssm_len, n_slots). Slot ids
 *   index the rows: a running sequence's live state, or a snapshot.
 * A layer's tensors of the other kind have no data. Which blocks and slots a sequence
 * owns is the engine's business (engine/kv.h). */
struct kv_store {
    uint32_t type;
    int32_t n_layer, block_size, n_blocks, n_slots;
    struct tensor *k, *v;       /* (n_layer) */
    struct tensor *conv, *ssm;  /* (n_layer) */
    int32_t *slot_pos; /* (n_slots) positions each slot's state covers ([0, slot_pos)), -1
                        * unknown: checks that a step continues the state it reads */
    uint64_t id;       /* unique in the process (a step graph's key: an address can be reused) */
};

/* Allocates the memory of m's layers: n_blocks KV blocks of block_size positions, and
 * n_slots state slots (0 for a model without recurrent layers; >= 1 otherwise). */
smelt_status model_kv_new(struct model *m, uint32_t type, int32_t block_size, int32_t n_blocks,
                          int32_t n_slots, struct kv_store **out, struct err *e);
void model_kv_free(struct model *m, struct kv_store *kv);
/* Bytes of cache one block takes over all layers (K and V). */
uint64_t model_kv_block_bytes(const struct model *m, uint32_t type, int32_t block_size);
/* Bytes one state slot takes over all layers (0: no recurrent layer). */
uint64_t model_state_slot_bytes(const struct model *m);
/* True when every row sees only the positions before it (not an encoder): the K/V of a
 * position depend on the tokens up to it alone, so a cached prefix can be reused. */
bool model_is_causal(const struct model *m);
/* True when some layer keeps a recurrent state (MEM_STATE). */
bool model_is_recurrent(const struct model *m);
/* Copies state slot src to slot dst in every recurrent layer (restoring a snapshot into a
 * sequence's live slot, or taking one). Runs on the backend as a step of its own: the
 * previous step's logits are gone afterwards. SMELT_ERR_RANGE for a bad slot. */
smelt_status model_state_copy(struct model *m, struct kv_store *kv, int32_t dst, int32_t src,
                              struct err *e);

/* Runs one step. Writes the K/V of every row into kv. For the rows that asked for logits
 * (the output rows, in row order):
 *   - logits_out (host, (n_vocab) floats per row), when not NULL, gets their full logits;
 *   - smp, when not NULL, gets their summaries (struct model_sample), computed by the
 *     backend's logits_topk op where the logits are, so only summaries are copied;
 * and the logits stay on the backend until the next step for model_fetch_rows. *n_out
 * (may be NULL) gets the number of output rows. */
smelt_status model_step(struct model *m, struct kv_store *kv, const struct batch *batch,
                        float *logits_out, struct model_sample *smp, int32_t *n_out,
                        struct err *e);
/* model_step with hidden states, for a multi-token-prediction head and its trunk:
 *   hidden_in  (host, (n_embd, n_tokens)) or NULL: row i's input hidden state, for a model
 *              that reads one (an MTP head: the trunk's hidden state at the row's position);
 *   hidden_out (host, (n_embd, n_tokens)) or NULL: every row's final hidden state, the input
 *              of the logits (rms_norm(x) * output_norm), is written there; every row then
 *              runs the whole last layer.
 * A step with either is never a step graph. */
smelt_status model_step_mtp(struct model *m, struct kv_store *kv, const struct batch *batch,
                               float *logits_out, struct model_sample *smp, int32_t *n_out,
                               const float *hidden_in, float *hidden_out, struct err *e);
/* The model's multi-token-prediction head (Qwen3.5's nextn layer) as a model of its own: one
 * row (token t at position p, the trunk's final hidden state h at p - 1 as hidden_in) gives
 * the logits of the token after t, and its own final hidden state (hidden_out) stands in for
 * the trunk's at p in the next row. Its memory is one attention layer (model_kv_new on it).
 * It shares m's weights and backend: m outlives it; free it with model_free.
 * SMELT_ERR_UNSUPPORTED when the file has no MTP layer (the message names the key). */
smelt_status model_mtp_new(const struct model *m, struct model **out, struct err *e);
/* model_step with full logits only (tests, prompt scoring, tools). */
smelt_status model_forward(struct model *m, struct kv_store *kv, const struct batch *batch,
                           float *logits_out, int32_t *n_out, struct err *e);
/* model_step for an embedding model: the output rows (batch.logits) get their final hidden
 * states instead of logits, after the output norm (an encoder's last LayerNorm is its
 * output), into hidden (host, (n_embd) floats per output row, in row order), for the
 * caller to pool (hp.pooling). With bidirectional attention (!hp.causal) each sequence of
 * the batch must be whole: its rows are positions 0, 1, ... in order, and it has none in
 * the cache from before (an error names the row). *n_out (may be NULL): output rows. */
smelt_status model_step_hidden(struct model *m, struct kv_store *kv, const struct batch *batch,
                               float *hidden, int32_t *n_out, struct err *e);
/* Copies output rows [first, first + count) of the last step's logits to dst (host,
 * (n_vocab) floats per row). Valid until the next step. */
smelt_status model_fetch_rows(struct model *m, int32_t first, int32_t count, float *dst,
                              struct err *e);
/* Adjustment entries a step with n_rows output rows takes at most: a fixed function of
 * the step's shape, so the list has a fixed address in a replayed step graph. */
int32_t model_adj_cap(int32_t n_rows);

/* ---- for architecture files ---- */

/* One forward step in progress: the step's inputs as backend tensors. */
struct step {
    struct backend *bk;
    struct kv_store *kv;
    int32_t n_tokens, n_out;
    struct tensor *token;    /* I32 (n_tokens) */
    struct tensor *out_rows; /* I32 (n_out): rows whose logits are wanted */
    bool out_gathered;       /* the forward already reduced x to the n_out rows */
    struct attn_meta meta;   /* positions, sequences, slots, block tables */
    struct tensor *state_seqs; /* I32 (STATE_SEQ_WORDS, n_seqs): recurrent layers' rows and
                                * slots per sequence (NULL without recurrent layers) */
    struct tensor *hidden;     /* F32 (n_embd, n_tokens): model_step_mtp's hidden_in, or
                                * NULL */
    bool keep_all;             /* every row runs the last layer (fwd_keep_out_rows: no-op) */
};

/* Weight binding with shape checks. Errors are sticky: after the first one, calls return
 * NULL and the loader's status says what went wrong. */
struct loader {
    struct model *m;
    const struct gguf_file *f;
    struct err *e;
    smelt_status st;
};

/* Binds tensor `name` (printf-formatted) checking its shape is (ne0, ne1) (ne1 = 1 for a
 * vector). A missing tensor is an error unless optional (then NULL). Matmul weights keep
 * their stored type; vectors (norms, biases) are converted to F32 when stored otherwise. */
const struct tensor *ld_matrix(struct loader *l, bool optional, int64_t ne0, int64_t ne1,
                               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
const struct tensor *ld_vector(struct loader *l, bool optional, int64_t ne0, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Binds a stack of ne2 matrices (ne0, ne1) as one 3-D tensor (the experts of an MoE
 * layer, (n_in, n_out, n_expert)), checking all three dimensions. */
const struct tensor *ld_matrices(struct loader *l, bool optional, int64_t ne0, int64_t ne1,
                                 int64_t ne2, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Allocation owned by the model (freed with it); NULL on failure (sets l->st). */
void *ld_alloc(struct loader *l, size_t nbytes);
/* Binds the shared attention weights of layer il (biases and Q/K norms optional). */
void ld_attn_weights(struct loader *l, int il, struct attn_weights *w);
/* Binds the FFN of layer il as the architecture declares it (arch_def.ffn): its norm
 * blk.{il}.{norm}.weight ("ffn_norm"; qwen35 and gpt-oss: "post_attention_norm"), then
 * dense ffn_{gate,up,down} (n_ff), or the router ffn_gate_inp (converted to F32) and the
 * experts ffn_{gate,up,down}_exps (n_ff_exp, n_expert), with their biases when the file has
 * them (ffn_gate_inp.bias; ffn_{gate,up,down}_exps.bias, all three or none; F32), and the
 * shared expert when the file has one: ffn_{gate,up,down}_shexp (n_ff_shexp; all three or
 * none) and its gate ffn_gate_inp_shexp (n_embd, optional, converted to F32). */
void ld_ffn_weights(struct loader *l, int il, const char *norm, struct ffn_weights *w);
/* ld_matrix for a small matrix the ops read as F32 (a conv kernel): converted when stored
 * in another type. */
const struct tensor *ld_matrix_f32(struct loader *l, bool optional, int64_t ne0, int64_t ne1,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Reads "{arch}.<suffix>" into out; absent: keeps *out when optional, else an error naming
 * the key. */
smelt_status ld_u32(struct loader *l, const char *suffix, bool optional, uint32_t *out);
/* A positive integer key bounded by max (an error names the key and the range); when
 * optional and absent, *out is kept as it is. */
void ld_dim(struct loader *l, const char *suffix, bool optional, int32_t *out, uint32_t max);
smelt_status ld_f32(struct loader *l, const char *suffix, bool optional, float *out);

/* Forward building blocks. Each returns a new scratch tensor. */
/* x (n_embd, n_tokens) = token embeddings * embd_scale. */
struct tensor *fwd_embed(struct model *m, struct step *s);
/* The attention of layer il, before the output projection, on rms_norm(x) * norm: Q/K/V
 * projections (+ bias), per-head Q/K norm, RoPE, KV store, paged attention. Returns
 * (n_head * head_dim_v, n_tokens): the input of W_o. */
struct tensor *fwd_attention(struct model *m, struct step *s, int il, const struct attn_weights *w,
                             const struct tensor *x, const struct tensor *norm);
/* In the last layer, after attention (every row's K/V is stored by then): keeps only the
 * rows whose logits are wanted, in x (n_embd, n_tokens) and att (.., n_tokens), so the
 * rest of the layer runs on n_out rows. The caller must not release the layer's scratch
 * afterwards (x now lives in it). No-op when every row (or none) wants logits. */
void fwd_keep_out_rows(struct model *m, struct step *s, struct tensor **x, struct tensor **att);
/* The FFN of a layer, dense or MoE, on x' = rms_norm(x) * w->norm:
 *   dense  W_down (act(W_gate x') * (W_up x'))
 *   MoE    the router picks each row's experts (bk_moe_route), bk_moe_ffn sums them,
 *          plus the shared expert's dense FFN (times sigmoid(sh_gate_inp . x') if gated)
 * into dst (n_embd, rows of x): dst = FFN, or dst += FFN when acc (the residual add; dst
 * may be x). next: bk_matmul_acc's hint (the norm the caller applies to dst next; may be
 * NULL). */
void fwd_ffn(struct model *m, struct step *s, const struct ffn_weights *w, enum glu_act act,
             const struct tensor *x, struct tensor *dst, bool acc, const struct prenorm *next);

#endif
