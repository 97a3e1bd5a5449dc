/* The CUDA backend's private header: its struct, the helpers its files share, and the op
 * table's entries (the file map is in cuda_backend.c's header). */
#ifndef SMELT_CUDA_BACKEND_INT_H
#define SMELT_CUDA_BACKEND_INT_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ctx.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmb.h"
#include "backend/cuda/cuda_mmq.h"
#include "backend/cuda/cuda_mmv.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/mm_tune.h"

#define GEMM_MIN_ROWS 33                 /* token rows from which cuBLAS beats repeated mmv */
/* Token rows from CUDA_MMV_MAX_N + 1 up to MMQ_MAX_ROWS use the tensor-core kernel
 * (cuda_mmq.cu: quantized weights dequantized in registers, f16 MMA) for the types it has
 * (Q4_K, Q6_K, Q8_0); above, cuBLAS on dequantized weights. 64 was measured on the H200
 * (2026-11-29, 8B Q4_K_M) with the earlier int8 kernel: mmq won at 16-64 rows (batched
 * decode x32 786 -> 2,624 tok/s, x64 2,860 -> 3,317), cuBLAS at 512 (pp512 13.3k vs 7.3k).
 * test_cuda_mmq's SMELT_BENCH=1 summary lines give the switch point for the current one.
 * This is the static switch (SMELT_NO_TUNE=1, capture, failure to measure); the backend
 * measures the real one per shape at first use. SMELT_MMQ_MAX_ROWS=N fixes the switch at
 * N rows when the backend is created (0 = off) and leaves only the tile to measure. */
#define MMQ_MAX_ROWS 64
#define GDN_CHUNK_MIN 0 /* rows a step from which the delta rule runs chunked: 0, never (H200,
                         * 2026-12-03: the CUDA-core chunked form is 3x slower than the recurrence
                         * on Qwen3.5-9B pp512/pp4096; SMELT_GDN_CHUNK_MIN=N turns it on) */
#define GEMM_TILE_BYTES ((size_t)64 << 20) /* F16 weight tile for the GEMM path */
#define SCRATCH_ALIGN 256
#define MOE_CNT_MAX 131072 /* counters of the MoE decode epilogues (512 KiB), then the router's */
#define PREP_MAX_K 65536 /* widest residual stream the decode epilogue prepares */
#define ATT_Q_MAX_K 32768 /* widest attention / GLU output given an int8 form (att_q) */
#define CUDA_GRAPHS 64

struct dchunk {
    unsigned char *base;
    size_t cap, used;
};

struct pending_dl {
    void *dst;
    size_t off, n;
};

struct cuda_backend {
    struct backend base;
    struct cuda_ctx ctx; /* the device, the stream, and the kernels' launch state (cuda_ctx.h) */
    cublasHandle_t cublas;
    /* device scratch stack */
    struct dchunk *chunks;
    int n_chunks, cap_chunks, cur;
    size_t peak; /* bk_scratch_peak: highest end of use, as if the chunks were one block */
    /* pinned staging */
    unsigned char *pin;
    size_t pin_cap, pin_used;
    /* A step's input uploads (between step_begin and its first op) are gathered into one
     * copy: a run of ascending destinations in one scratch chunk whose staging bytes
     * mirror their device offsets, gaps included (scratch no kernel has written yet this
     * step). Uploads to other memory (buffers, weights) are copied alone, in order. */
    struct {
        bool defer;          /* in the step's input phase */
        unsigned char *dev0; /* the run's first destination; NULL: no run */
        unsigned char *lim;  /* the end of its scratch chunk */
        size_t off0, span;   /* its staging offset and length */
    } up;
    struct pending_dl *dl;
    int n_dl, cap_dl;
    /* weights */
    void **dev; /* plain device allocations (vectors) */
    int n_dev, cap_dev;
    struct cuda_qweight **qws; /* repacked matrices */
    int n_qws, cap_qws;
    uint64_t weight_bytes;
    uint32_t warned_types[4]; /* bit per type id already logged as "via F16" */
    /* step graphs: a shape's ops run eagerly the first time (scratch grows to its size),
     * are captured the second time, and replayed after that */
    struct graph_ent {
        uint64_t key, last_use;
        int seen;
        cudaGraphExec_t exec;
    } graphs[CUDA_GRAPHS];
    uint64_t clock;
    int capturing; /* index of the entry being captured, or -1 */
    bool no_graph; /* SMELT_NO_GRAPH=1 */
    int64_t mmq_max_rows; /* MMQ_MAX_ROWS or SMELT_MMQ_MAX_ROWS */
    int64_t gemm_min_rows; /* GEMM_MIN_ROWS or SMELT_GEMM_MIN_ROWS: products of fewer rows that mmq
                            * does not take stay on mmv (F32 activations for plain-float weights) */
    int moe_group_ch;     /* SMELT_MOE_GROUP_CH: decode steps of 2..CUDA_MMV_MAX_N rows group the
                           * (row, slot) pairs by expert in chunks of this many rows (each expert's
                           * weights read once a step); 0: a chunk per pair; -1 (unset): by the
                           * experts' type (moe_group_rows in cuda_ops_moe.c) */
    int moe_path;         /* SMELT_MOE_PATH: 0 by rows (mmq by id above CUDA_MMV_MAX_N where it takes the
                           * experts), 1 "mmv", 2 "mmq" */
    int64_t gdn_chunk_min; /* bk_gated_delta_net: steps of at least this many token rows take
                            * the chunkwise form (0: never); GDN_CHUNK_MIN or SMELT_GDN_CHUNK_MIN */
    bool mmq_rows_fixed;  /* SMELT_MMQ_MAX_ROWS given: the mmq/gemm switch is not measured */
    int mm_path;          /* SMELT_MM_PATH: 0 measured, 1 "mmb" (forced, 2..64 rows where it has
                           * a kernel), -1 "legacy" (never mmb) */
    /* matmul paths measured on this device ("matrix products: the paths and the choice") */
    struct mmtune tune;
    struct mmtune_env tune_env; /* SMELT_NO_TUNE, SMELT_MMQ_TILE */
    cudaEvent_t tune_ev[2 * (MMTUNE_RUNS + 1)];
    int tune_ev_n;       /* events created, -1 = cannot time */
    uint64_t tune_flush; /* bytes written between timed runs (2 x L2, capped), 0 = none */
    bool tuning;         /* candidate runs in progress (profile labels) */
    bool tune_full_logged;
    /* The residual stream prepared for its next norm by a decode matmul_acc epilogue
     * (cuda_mmv_epi.post_*): the int8 form of w * x and per-32 sums of squares of x, valid
     * until any other op runs. Fixed device buffers (graph replays see fixed addresses). */
    struct {
        void *buf;     /* cuda_mmv_scratch_bytes(PREP_MAX_K, CUDA_MMV_MAX_N) */
        float *ss;     /* (CUDA_MMV_MAX_N, PREP_MAX_K / 32) */
        unsigned *cnt; /* PREP_MAX_K / 32 counters, zero between launches */
        const void *x, *w;
        int64_t n, k;
        float eps;
        bool valid;
    } prep;
    /* The decode epilogues' counters, MOE_CNT_MAX, zero between launches: the MoE products'
     * (cuda_mmv_ids' post_cnt and cmb_cnt) and the DeltaNet scan's gated norm (cu_deltanet;
     * a launch at a time uses them); NULL (SMELT_MOE_FUSED=0, or no memory) = the separate
     * h-quantize and combine launches, and the DeltaNet's four decode launches. */
    unsigned *moe_cnt;
    /* Decode steps of at most this many rows take cu_deltanet's two launches, wider ones the
     * three ops (CU_DELTANET_FUSED_ROWS; the same bits either way, so tests widen it to reach
     * the fused form with any plan). */
    int deltanet_fused_rows;
#define CU_DELTANET_FUSED_ROWS 2
    /* The experts' input rows that the decode router (cuda_moe_route_fused) wrote with the
     * ids, for the moe_ffn that runs right after it on the same x (op_seq one higher): its
     * gather launch is spared. Fixed device buffers (graphs), allocated with moe_cnt (whose
     * last CUDA_MOE_FUSED_ROUTE_ROWS counters are the router's); NULL = the router's two
     * launches and the gather. */
    struct {
        void *buf; /* cuda_mmv_scratch_bytes(PREP_MAX_K, CUDA_MOE_FUSED_ROUTE_ROWS) */
        float *xf; /* (PREP_MAX_K, CUDA_MOE_FUSED_ROUTE_ROWS) */
        const void *x, *pre_w;
        int64_t n, k;
        float eps;
        int has_pre;
        uint64_t seq; /* op_seq of the router that wrote them */
    } moe_xin;
    uint64_t op_seq; /* entries into the op table (cu_enter) */
    /* att_q: the int8 form of the last attention output (cuda_attn_args.q_out, written by
     * the attention launch itself), of a small GLU's output (cu_ffn_glu's epilogue, cu_glu's
     * kernel) or of a gated RMSNorm's (cu_norm_gate), for the product that consumes it next
     * (W_o, W_down or ssm_out in cu_matmul_acc), sparing its quantize launch. Valid for the
     * op right after the one that wrote it only (seq): an op between them may change x in
     * place (qwen35's output gate on the attention output, which now writes its own). */
    struct {
        void *buf;     /* cuda_mmv_scratch_bytes(ATT_Q_MAX_K, CUDA_MMV_MAX_N), fixed (graphs) */
        const void *x; /* the output (k, n) it is the int8 form of */
        int64_t n, k;
        uint64_t seq; /* op_seq of the op that wrote it */
    } att_q;
    /* SMELT_PROFILE=1: an event after each kernel (graphs off), times summed per name */
    bool prof;
    cudaEvent_t prof_start;
    volatile int *gate_h; /* host-mapped flag that opens the step's gate */
    int *gate_d;
    struct prof_ev {
        cudaEvent_t ev;
        char name[48];
        uint64_t bytes;
    } *pev;
    int n_pev, cap_pev;
    struct prof_row {
        char name[48];
        uint64_t calls, bytes;
        double ms;
    } *prow;
    int n_prow, cap_prow;
    /* RoPE speed tables (cuda_rope.freq), one per parameter set seen (Gemma 3: two per
     * model). Keyed by the parameters and the freq_factors pointer: weights stay bound
     * until the backend is freed, so a pointer never comes back with other contents. */
    struct rope_tab {
        struct cuda_rope key;
        double *freq;
    } *rope_tab;
    int n_rope_tab, cap_rope_tab;
};

static inline struct cuda_backend *cu_of(struct backend *b) { return (struct cuda_backend *)b; }

#define CU_FAIL(cb, rc, what)                                                                  \
    bk_fail(&(cb)->base, SMELT_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(rc))

/* Every entry point of the op table that touches the device starts here: the backend's
 * device becomes the calling thread's current one (CUDA's current device is per thread;
 * a new thread starts on device 0), so backends on several GPUs work from one thread or
 * several. One cudaGetDevice when it already is (the usual case); a failure is sticky. */
static inline struct cuda_backend *cu_enter(struct backend *b) {
    struct cuda_backend *cb = cu_of(b);
    cb->op_seq++;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev != cb->ctx.device) {
        cudaError_t rc = cudaSetDevice(cb->ctx.device);
        if (rc != cudaSuccess) CU_FAIL(cb, rc, "making the backend's GPU current");
    }
    return cb;
}
/* ---- shared helpers ----
 * The op table's entries (cu_weight_bind .. cu_graph_end below) keep the contracts of
 * backend.h's struct backend_ops; these are the helpers between the files. */

/* cuda_prof.c (SMELT_PROFILE=1; all three do nothing when it is off). Closes the interval
 * of the kernel(s) just enqueued, named fmt, which read `bytes` (0: unknown). */
void cu_prof_mark(struct cuda_backend *cb, uint64_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* After the stream's sync: folds the step's intervals into the table. */
void cu_prof_collect(struct cuda_backend *cb);
/* At free: the table to stderr. */
void cu_prof_print(struct cuda_backend *cb);

/* cuda_backend.c. After a launch: its error (sticky), the profile mark `what`, and the
 * end of the decode fusions' validity (any op may have written their tensors). */
void cu_check_launch(struct cuda_backend *cb, const char *what);

/* cuda_mem.c. n bytes of the step's scratch stack (grown by a device allocation when it
 * must), or NULL; cu_scratch also fails the backend (sticky) on NULL. Released by
 * cu_scratch_release(mark). */
void *cu_stack_alloc(struct cuda_backend *cb, size_t n);
void *cu_scratch(struct cuda_backend *cb, size_t n);
/* Ends the step's input phase: the gathered input uploads go out as one copy. */
void cu_up_flush(struct cuda_backend *cb);

/* cuda_matmul.c. The repacked weight of a bound tensor, or NULL (the backend failed). */
const struct cuda_qweight *cu_qw_of(struct cuda_backend *cb, const struct tensor *w);
/* y (rows, n) (+)= W x for any n by the chosen path (measured at a key's first eager call:
 * the section comment in cuda_matmul.c); xq: x's int8 form when n <= 8 and a matmul group
 * made it, else NULL. Errors are sticky. */
/* True when a 2..8-row product of qw takes mmb (forced, or measured faster than mmv: the
 * measurement runs here at the key's first eager call); the decode ops then leave their fused
 * mmv path for cu_mm. x: the product's input (timing only). */
bool cu_mm_small_batch(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n);
void cu_mm(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n, float *y, bool acc,
           const void *xq);
/* y[i] = W_i x for count products on one input; neighbours of one type whose chosen path is
 * the small-batch kernel share one launch (cuda_matmul.c). */
void cu_mm_group(struct cuda_backend *cb, int count, const struct cuda_qweight *const *qw, const float *x, int64_t n,
                 float *const *y);
/* dst = act(W_gate x) * (W_up x) in one launch, the activation in its store, when the shapes
 * and types agree and the products' chosen path is the small-batch kernel or an mmq tile
 * (cuda_mmq_glu_pre, with the gate's tile); false (nothing done) otherwise. act: enum
 * glu_act, 0..3. */
bool cu_mm_glu(struct cuda_backend *cb, const struct cuda_qweight *gate, const struct cuda_qweight *up, int act,
               const float *x, int64_t n, float *dst);
/* An mmq product's input as the caller holds it: n rows of k floats at x, `stride` floats
 * apart, RMS-normed on the way (by w, may be NULL, and eps) when norm; else the rows are
 * contiguous. The f16 activations are made from it in one launch (cuda_rms_norm_h16 or
 * cuda_mmq_quantize). */
struct mm_src {
    const float *x;
    int64_t stride;
    bool norm;
    const float *w;
    float eps;
};
/* y[i] = W_i x' for count (<= 8) products of one row length on one input, when every one's
 * path is an mmq tile known without measuring at this call and n > CUDA_MMV_MAX_N: one f16
 * form of x' for all of them (the norm's own launch writes it), then the products, neighbours
 * of one type stacked in one launch (cuda_mmq_stack_pre: a layer's Q, K and V); false
 * (nothing done) otherwise. */
bool cu_mm_group_mmq(struct cuda_backend *cb, int count, const struct cuda_qweight *const *qw,
                     const struct mm_src *src, int64_t n, float *const *y);
/* The dense FFN's products at rows the tensor cores take (cu_ffn): cu_mm_ffn_plan is true when
 * the gate's and the down's paths are mmq tiles known without measuring at this call (the
 * composed ops measure them), n > CUDA_MMV_MAX_N and n_ff a multiple of 16, with choice[] the
 * two tiles; cu_mm_ffn then runs gate and up in one GLU launch whose store writes h = act(G x) *
 * (U x) as the down product's f16 activations (cuda_mmq_glu_pre's h16) and dst (+)= W_down h
 * over them: no f32 h in memory and no conversion launch. act: enum glu_act, 0..3. */
bool cu_mm_ffn_plan(struct cuda_backend *cb, const struct cuda_qweight *gate, const struct cuda_qweight *up,
                    const struct cuda_qweight *down, int64_t n, int choice[2]);
void cu_mm_ffn(struct cuda_backend *cb, const struct cuda_qweight *gate, const struct cuda_qweight *up,
               const struct cuda_qweight *down, int act, const struct mm_src *src, int64_t n, float *dst, bool acc,
               const int choice[2]);
/* At free: the measured path table, at debug level. */
void cu_tune_report(struct cuda_backend *cb);

/* cuda_graph.c. Drops every recorded step graph (their scratch addresses are gone). */
void cu_graphs_clear(struct cuda_backend *cb);

/* ---- the op table's entries (cuda_backend.c's cuda_ops) ---- */

/* cuda_mem.c */
smelt_status cu_weight_bind(struct backend *b, struct tensor *t, struct err *e);
smelt_status cu_buffer_alloc(struct backend *b, struct tensor *t, struct err *e);
void cu_buffer_free(struct backend *b, struct tensor *t);
void cu_step_begin(struct backend *b);
void *cu_scratch_alloc(struct backend *b, size_t nbytes);
size_t cu_scratch_mark(struct backend *b);
void cu_scratch_release(struct backend *b, size_t mark);
void cu_upload(struct backend *b, struct tensor *dst, const void *src, size_t nbytes);
void cu_download(struct backend *b, void *dst, const struct tensor *src, size_t nbytes);
smelt_status cu_sync(struct backend *b, struct err *e);
bool cu_mem_info(struct backend *b, uint64_t *free_b, uint64_t *total_b);
uint64_t cu_weight_bytes(struct backend *b, uint32_t type, const int64_t ne[TENSOR_MAX_DIMS]);
size_t cu_scratch_peak(struct backend *b);
smelt_status cu_scratch_reserve(struct backend *b, size_t nbytes, struct err *e);

/* cuda_ops.c */
void cu_get_rows(struct backend *b, struct tensor *dst, const struct tensor *src, const struct tensor *ids);
void cu_rms_norm(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w, float eps);
void cu_layer_norm(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w,
                   const struct tensor *bias, float eps);
void cu_act(struct backend *b, struct tensor *dst, const struct tensor *x, enum glu_act act);
void cu_rope(struct backend *b, struct tensor *x, const struct tensor *pos, const struct rope_params *p);
void cu_matmul(struct backend *b, struct tensor *dst, const struct tensor *w, const struct tensor *x);
void cu_matmul_acc(struct backend *b, struct tensor *dst, const struct tensor *w, const struct tensor *bias,
                   const struct tensor *x, const struct prenorm *next);
void cu_add(struct backend *b, struct tensor *dst, const struct tensor *a, const struct tensor *c);
void cu_scale(struct backend *b, struct tensor *dst, const struct tensor *x, float s);
void cu_glu(struct backend *b, struct tensor *dst, const struct tensor *gate, const struct tensor *up,
            enum glu_act act);
void cu_norm_gate(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w,
                  const struct tensor *gate, float eps, enum glu_act act);
void cu_softcap(struct backend *b, struct tensor *x, float cap);
void cu_softmax(struct backend *b, struct tensor *x);
void cu_kv_store(struct backend *b, struct tensor *kc, struct tensor *vc, const struct tensor *k,
                 const struct tensor *v, const struct attn_meta *m);
void cu_attention(struct backend *b, struct tensor *dst, const struct tensor *q, const struct tensor *kc,
                  const struct tensor *vc, const struct attn_meta *m, const struct attn_params *p);
void cu_logits_topk(struct backend *b, struct tensor *dst, const struct tensor *logits, const struct tensor *rows,
                    const struct tensor *adj, const struct tensor *mask);
void cu_matmul_group(struct backend *b, int n, struct tensor *const *dst, const struct tensor *const *w,
                     const struct tensor *const *bias, const struct tensor *x, const struct prenorm *pre);
void cu_ffn_glu(struct backend *b, struct tensor *dst, const struct tensor *w_gate, const struct tensor *w_up,
                const struct tensor *x, enum glu_act act, const struct prenorm *pre);
bool cu_ffn(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w_gate,
            const struct tensor *w_up, const struct tensor *w_down, enum glu_act act, const struct prenorm *pre,
            bool acc);
void cu_rope_kv_store(struct backend *b, struct tensor *q, struct tensor *k, const struct tensor *v, struct tensor *kc,
                      struct tensor *vc, const struct attn_meta *m, const struct qk_prep *p);
void cu_rope_attention(struct backend *b, struct tensor *dst, struct tensor *q, struct tensor *k,
                       const struct tensor *v, struct tensor *kc, struct tensor *vc, const struct attn_meta *m,
                       const struct qk_prep *qp, const struct attn_params *ap);

/* cuda_ops_ssm.c */
void cu_ssm_conv(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w,
                 struct tensor *cs, const struct tensor *seqs, bool silu);
void cu_gated_delta_net(struct backend *b, struct tensor *dst, const struct tensor *qkv, const struct tensor *a,
                        const struct tensor *bl, const struct tensor *ssm_a, const struct tensor *dt_bias,
                        struct tensor *ss, const struct tensor *seqs, const struct gdn_params *p);
void cu_copy(struct backend *b, struct tensor *dst, const struct tensor *src);
bool cu_deltanet(struct backend *b, struct tensor *z, const struct tensor *qkv, const struct tensor *a,
                 const struct tensor *bl, const struct deltanet_w *w, struct tensor *cs, struct tensor *ss,
                 const struct tensor *seqs, const struct gdn_params *p);
/* True when an op's output of rows x width (contiguous) gets its int8 form into att_q in
 * the same launch, for the product right after it: decode rows, whole 32-groups. */
bool cu_att_q_fits(const struct cuda_backend *cb, const struct tensor *dst, int64_t width, int64_t rows);
/* The op that just launched wrote dst's int8 form into att_q: the next op's product may use it. */
void cu_att_q_set(struct cuda_backend *cb, const void *dst, int64_t width, int64_t rows);
/* cuda_ops_moe.c */
void cu_moe_route(struct backend *b, struct tensor *ids, struct tensor *weights, const struct tensor *x,
                  const struct tensor *router, const struct tensor *bias, enum moe_gating gating,
                  const struct prenorm *pre,
                  const struct tensor *sh_gate_inp, struct tensor *sh_logit);
void cu_moe_ffn(struct backend *b, struct tensor *dst, const struct tensor *x, const struct moe_experts *w,
                const struct tensor *ids, const struct tensor *weights, const struct prenorm *pre, bool acc,
                const struct prenorm *next);

/* cuda_graph.c */
bool cu_graph_replay(struct backend *b, uint64_t key);
void cu_graph_begin(struct backend *b, uint64_t key);
void cu_graph_end(struct backend *b);

/* The fused mmv GLU kernels' activation number (cuda_mmv_glu, cuda_mmv_glu_id): 0 SiLU,
 * 1 tanh-GELU, 2 gpt-oss's clamped SwiGLU (cuda_glu takes enum glu_act's value itself). */
static inline int cu_glu_code(enum glu_act act) {
    return act == GLU_SILU ? 0 : act == GLU_GELU_TANH ? 1 : 2;
}

/* Every op asks this before its first launch: the pending input copy goes out first. */
static inline bool cu_ok(struct cuda_backend *cb) {
    if (cb->up.defer) cu_up_flush(cb);
    return cb->base.status == SMELT_OK;
}

#endif
