/* The CUDA backend: the op interface (backend.h) on one GPU.
 *
 * Memory:
 *   - Weights: matrices are uploaded once into the mmv kernels' repacked layouts
 *     (cuda_mmv.h; t->extra points at the descriptor, t->data at its quant bits): F16,
 *     BF16, F32, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS. Types without a
 *     GPU kernel yet (IQ1/IQ2/IQ3, TQ, MXFP4, ...) are dequantized on the host to F16 at
 *     upload (correct, 3-8x the bytes; logged once per type). The mmq kernel covers only
 *     Q4_K/Q6_K/Q8_0: the other quantized types repeat mmv up to GEMM_MIN_ROWS - 1 token
 *     rows, then take cuBLAS on F16 tiles (cuda_dequant_f16 reads every repacked layout).
 *     Vectors (norms, biases) are plain F32 copies.
 *   - Scratch: a device stack emptied at step_begin and rewound per layer (mark/release),
 *     grown in chunks; a step with the same shape sees the same addresses.
 *   - Host<->device: uploads go through a pinned staging buffer (asynchronous copies);
 *     downloads land in pinned memory and are copied out at sync.
 * Ops are enqueued on one stream; the first error is sticky (bk_fail) and bk_sync
 * reports it. Matrix products with <= 8 token rows use the mmv kernels; above, for the
 * types the tensor-core kernel (cuda_mmq.h) has, the path (its tile, or F16 dequantization
 * + cuBLAS, or repeated mmv) is measured on this GPU per weight shape and token-row bucket
 * at first use ("matrix products: the paths and the choice between them"); without a
 * measurement, up to MMQ_MAX_ROWS rows the tensor-core kernel, more rows cuBLAS (F32
 * weights: FP32 GEMM). */
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmq.h"
#include "backend/cuda/cuda_mmv.h"
#include "backend/mm_tune.h"
#include "util/half.h"
#include "util/log.h"

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
#define GEMM_TILE_BYTES ((size_t)64 << 20) /* F16 weight tile for the GEMM path */
#define SCRATCH_ALIGN 256
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
    int device;
    cudaStream_t stream;
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
    bool mmq_rows_fixed;  /* SMELT_MMQ_MAX_ROWS given: the mmq/gemm switch is not measured */
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
    /* att_q: the int8 form of the last attention output (cuda_attn_args.q_out, written by
     * the attention launch itself) or of a small GLU's output (its epilogue), for the
     * product that consumes it next (W_o or W_down in cu_matmul_acc), sparing its quantize
     * launch. Valid until any other op runs. */
    struct {
        void *buf;     /* cuda_mmv_scratch_bytes(ATT_Q_MAX_K, CUDA_MMV_MAX_N), fixed (graphs) */
        const void *x; /* the attention output (dv * n_head, n) it is the int8 form of */
        int64_t n, k;
        bool valid;
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

static struct cuda_backend *cu_of(struct backend *b) { return (struct cuda_backend *)b; }

#define CU_FAIL(cb, rc, what)                                                                  \
    bk_fail(&(cb)->base, SMELT_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(rc))

static void up_flush(struct cuda_backend *cb);

/* Every op asks this before its first launch: the pending input copy goes out first. */
static bool ok(struct cuda_backend *cb) {
    if (cb->up.defer) up_flush(cb);
    return cb->base.status == SMELT_OK;
}

/* ---- profile (SMELT_PROFILE=1) ----
 * Kernels run eagerly on one stream; an event recorded after each kernel (or small group
 * of kernels) of name `name` closes its interval, which starts at the previous event. At
 * each sync the intervals are summed per name; cu_free prints the table (time share, time
 * per call and, where the caller gave the bytes a kernel reads, GB/s). So that intervals
 * measure the GPU and not the host's enqueueing, each step starts with a gate kernel that
 * holds the stream until the host has enqueued the whole step (sync opens it; it also
 * opens by itself after 2 s, so a queue that fills up cannot deadlock). The events between
 * kernels stop programmatic launch overlap: the figures are per-kernel times in sequence. */
static void prof_mark(struct cuda_backend *cb, uint64_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void prof_mark(struct cuda_backend *cb, uint64_t bytes, const char *fmt, ...) {
    if (!cb->prof || !ok(cb)) return;
    if (cb->n_pev == cb->cap_pev) {
        int nc = cb->cap_pev ? cb->cap_pev * 2 : 1024;
        struct prof_ev *a = realloc(cb->pev, (size_t)nc * sizeof *a);
        if (!a) return;
        for (int i = cb->cap_pev; i < nc; i++)
            if (cudaEventCreate(&a[i].ev) != cudaSuccess) {
                cudaGetLastError();
                cb->pev = a;
                cb->cap_pev = i;
                return;
            }
        cb->pev = a;
        cb->cap_pev = nc;
    }
    struct prof_ev *p = &cb->pev[cb->n_pev++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->bytes = bytes;
    cudaEventRecord(p->ev, cb->stream);
}

/* After cudaStreamSynchronize: folds this step's intervals into the table. */
static void prof_collect(struct cuda_backend *cb) {
    cudaEvent_t prev = cb->prof_start;
    for (int i = 0; i < cb->n_pev; i++) {
        struct prof_ev *p = &cb->pev[i];
        float ms = 0;
        if (cudaEventElapsedTime(&ms, prev, p->ev) != cudaSuccess) {
            cudaGetLastError();
            ms = 0;
        }
        prev = p->ev;
        int j = 0;
        while (j < cb->n_prow && strcmp(cb->prow[j].name, p->name) != 0) j++;
        if (j == cb->n_prow) {
            if (cb->n_prow == cb->cap_prow) {
                int nc = cb->cap_prow ? cb->cap_prow * 2 : 64;
                struct prof_row *a = realloc(cb->prow, (size_t)nc * sizeof *a);
                if (!a) continue;
                cb->prow = a;
                cb->cap_prow = nc;
            }
            memset(&cb->prow[j], 0, sizeof cb->prow[j]);
            memcpy(cb->prow[j].name, p->name, sizeof p->name);
            cb->n_prow++;
        }
        cb->prow[j].calls++;
        cb->prow[j].bytes += p->bytes;
        cb->prow[j].ms += ms;
    }
    cb->n_pev = 0;
}

static int prof_cmp(const void *a, const void *b) {
    double x = ((const struct prof_row *)a)->ms, y = ((const struct prof_row *)b)->ms;
    return (x < y) - (x > y);
}

static void prof_print(struct cuda_backend *cb) {
    if (!cb->prof || !cb->n_prow) return;
    qsort(cb->prow, (size_t)cb->n_prow, sizeof *cb->prow, prof_cmp);
    double total = 0;
    for (int i = 0; i < cb->n_prow; i++) total += cb->prow[i].ms;
    fprintf(stderr, "SMELT_PROFILE: %.3f ms of GPU time over all steps (events after each kernel)\n", total);
    fprintf(stderr, "%-48s %9s %10s %7s %9s %8s\n", "kernel", "calls", "ms", "share", "us/call", "GB/s");
    for (int i = 0; i < cb->n_prow; i++) {
        const struct prof_row *r = &cb->prow[i];
        fprintf(stderr, "%-48s %9llu %10.3f %6.1f%% %9.2f", r->name, (unsigned long long)r->calls, r->ms,
                total > 0 ? 100.0 * r->ms / total : 0.0, r->calls ? 1e3 * r->ms / (double)r->calls : 0.0);
        if (r->bytes && r->ms > 0) fprintf(stderr, " %8.0f", (double)r->bytes / (r->ms * 1e6));
        fputc('\n', stderr);
    }
}

static void check_launch(struct cuda_backend *cb, const char *what) {
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) CU_FAIL(cb, rc, what);
    prof_mark(cb, 0, "%s", what);
    cb->prep.valid = false; /* any other op may have written the prepared tensor */
    cb->att_q.valid = false;
}

/* ---- bookkeeping of weight allocations ---- */

/* Appends p to a growable pointer array; false when out of memory. */
static bool push_ptr(void ***arr, int *n, int *cap, void *p) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 256;
        void **a = realloc(*arr, (size_t)nc * sizeof *a);
        if (!a) return false;
        *arr = a;
        *cap = nc;
    }
    (*arr)[(*n)++] = p;
    return true;
}

/* ---- scratch stack (device) ---- */

#define MARK_SHIFT 48

static void note_peak(struct cuda_backend *cb) {
    size_t at = cb->chunks[cb->cur].used;
    for (int i = 0; i < cb->cur; i++) at += cb->chunks[i].cap;
    if (at > cb->peak) cb->peak = at;
}

static void *stack_alloc(struct cuda_backend *cb, size_t n) {
    size_t need = (n + SCRATCH_ALIGN - 1) & ~(size_t)(SCRATCH_ALIGN - 1);
    if (need < n || need >= ((size_t)1 << MARK_SHIFT)) return NULL;
    while (cb->cur < cb->n_chunks) {
        struct dchunk *c = &cb->chunks[cb->cur];
        if (c->cap - c->used >= need) {
            void *p = c->base + c->used;
            c->used += need;
            note_peak(cb);
            return p;
        }
        if (cb->cur + 1 >= cb->n_chunks) break;
        cb->cur++;
        cb->chunks[cb->cur].used = 0;
    }
    size_t total = 0;
    for (int i = 0; i < cb->n_chunks; i++) total += cb->chunks[i].cap;
    size_t cap = need > total ? need : total;
    if (cap < ((size_t)16 << 20)) cap = (size_t)16 << 20;
    if (cb->n_chunks == cb->cap_chunks) {
        int nc = cb->cap_chunks ? cb->cap_chunks * 2 : 8;
        struct dchunk *ch = realloc(cb->chunks, (size_t)nc * sizeof *ch);
        if (!ch) return NULL;
        cb->chunks = ch;
        cb->cap_chunks = nc;
    }
    void *base = NULL;
    if (cudaMalloc(&base, cap) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    int at = cb->n_chunks ? cb->cur + 1 : 0;
    memmove(&cb->chunks[at + 1], &cb->chunks[at], (size_t)(cb->n_chunks - at) * sizeof cb->chunks[0]);
    cb->chunks[at] = (struct dchunk){base, cap, need};
    cb->n_chunks++;
    cb->cur = at;
    note_peak(cb);
    return base;
}

static void graphs_clear(struct cuda_backend *cb);

static void stack_reset(struct cuda_backend *cb) {
    if (cb->n_chunks > 1) { /* merge into one chunk of the total size */
        graphs_clear(cb); /* recorded steps point into the chunks being freed */
        size_t total = 0;
        for (int i = 0; i < cb->n_chunks; i++) total += cb->chunks[i].cap;
        cudaStreamSynchronize(cb->stream);
        for (int i = 0; i < cb->n_chunks; i++) cudaFree(cb->chunks[i].base);
        void *base = NULL;
        if (cudaMalloc(&base, total) == cudaSuccess) {
            cb->chunks[0] = (struct dchunk){base, total, 0};
            cb->n_chunks = 1;
        } else {
            cudaGetLastError();
            cb->n_chunks = 0;
        }
    }
    cb->cur = 0;
    if (cb->n_chunks) cb->chunks[0].used = 0;
}

static void *scratch(struct cuda_backend *cb, size_t n) {
    void *p = stack_alloc(cb, n ? n : 1);
    if (!p) bk_fail(&cb->base, SMELT_ERR_NOMEM, "GPU scratch: out of device memory (%zu bytes)", n);
    return p;
}

/* ---- pinned staging ---- */

static unsigned char *pin_take(struct cuda_backend *cb, size_t n, size_t *off) {
    size_t need = (n + 63) & ~(size_t)63;
    if (cb->pin_used + need > cb->pin_cap) {
        /* Grow: wait for the copies in flight from the old buffer, finish pending downloads. */
        if (cb->prof) *cb->gate_h = 1;
        cudaStreamSynchronize(cb->stream);
        for (int i = 0; i < cb->n_dl; i++) memcpy(cb->dl[i].dst, cb->pin + cb->dl[i].off, cb->dl[i].n);
        cb->n_dl = 0;
        size_t cap = cb->pin_cap * 2;
        if (cap < need * 2) cap = need * 2;
        if (cap < ((size_t)1 << 20)) cap = (size_t)1 << 20;
        unsigned char *np = NULL;
        if (cudaMallocHost((void **)&np, cap) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        cudaFreeHost(cb->pin);
        cb->pin = np;
        cb->pin_cap = cap;
        cb->pin_used = 0;
    }
    *off = cb->pin_used;
    cb->pin_used += need;
    return cb->pin + *off;
}

/* ---- weights ---- */

static bool warned(struct cuda_backend *cb, uint32_t type) {
    if (type >= 128) return true;
    uint32_t bit = 1u << (type % 32);
    bool was = cb->warned_types[type / 32] & bit;
    cb->warned_types[type / 32] |= bit;
    return was;
}

/* Dequantizes a host tensor to F16 (rows of ne0), for types the GPU kernels lack. */
static uint16_t *host_to_f16(const struct tensor *t) {
    const struct qtype_info *qi = qtype_get(t->type);
    int64_t k = t->ne[0], rows = tensor_nrows(t);
    uint16_t *out = malloc((size_t)(k * rows) * sizeof *out);
    float *row = malloc((size_t)k * sizeof *row);
    if (!out || !row || !qi || !qi->dequantize) {
        free(out);
        free(row);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        qi->dequantize((const char *)t->data + (size_t)r * t->nb[1], row, k);
        for (int64_t i = 0; i < k; i++) out[r * k + i] = f32_to_f16(row[i]);
    }
    free(row);
    return out;
}

static smelt_status cu_weight_bind(struct backend *b, struct tensor *t, struct err *e) {
    struct cuda_backend *cb = cu_of(b);
    const char *name = t->name ? t->name : "?";
    if (!tensor_is_contiguous(t))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "tensor %s: not contiguous", name);
    if (t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1) {
        /* vectors: plain copies (the loader already made them F32) */
        size_t n = tensor_nbytes(t);
        void *p = NULL;
        cudaError_t rc = cudaMalloc(&p, n);
        if (rc == cudaSuccess) rc = cudaMemcpy(p, t->data, n, cudaMemcpyHostToDevice);
        if (rc != cudaSuccess)
            return err_set(e, SMELT_ERR_DEVICE, "tensor %s: uploading %zu bytes: %s", name, n,
                           cudaGetErrorString(rc));
        if (!push_ptr(&cb->dev, &cb->n_dev, &cb->cap_dev, p)) {
            cudaFree(p);
            return err_set(e, SMELT_ERR_NOMEM, "out of memory");
        }
        t->data = p;
        t->backend = b;
        cb->weight_bytes += n;
        return SMELT_OK;
    }
    struct cuda_qweight *qw = calloc(1, sizeof *qw);
    if (!qw) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    int64_t k = t->ne[0], rows = tensor_nrows(t);
    smelt_status st;
    if (cuda_mmv_supported(t->type, k)) {
        st = cuda_qweight_upload(qw, t->type, t->data, rows, k, cb->stream, e);
    } else {
        uint16_t *h = host_to_f16(t);
        if (!h) {
            free(qw);
            return err_set(e, SMELT_ERR_UNSUPPORTED, "tensor %s: type %s cannot be read",
                           name, qtype_name(t->type));
        }
        if (!warned(cb, t->type))
            log_warn("cuda: no GPU kernel for %s weights yet: they run as F16 (more memory, "
                     "slower)", qtype_name(t->type));
        st = cuda_qweight_upload(qw, QT_F16, h, rows, k, cb->stream, e);
        free(h);
    }
    if (st != SMELT_OK) {
        free(qw);
        return err_prefix(e, "tensor %s", name);
    }
    if (!push_ptr((void ***)&cb->qws, &cb->n_qws, &cb->cap_qws, qw)) {
        cuda_qweight_free(qw);
        free(qw);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    cb->weight_bytes += qw->bytes;
    t->extra = qw;
    t->data = qw->q;
    t->backend = b;
    return SMELT_OK;
}

static smelt_status cu_buffer_alloc(struct backend *b, struct tensor *t, struct err *e) {
    size_t n = tensor_nbytes(t);
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, n ? n : 1);
    if (rc == cudaSuccess) rc = cudaMemset(p, 0, n);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return err_set(e, SMELT_ERR_NOMEM, "GPU buffer of %zu bytes: %s", n, cudaGetErrorString(rc));
    }
    t->data = p;
    t->backend = b;
    return SMELT_OK;
}

static void cu_buffer_free(struct backend *b, struct tensor *t) {
    (void)b;
    cudaFree(t->data);
    t->data = NULL;
}

/* ---- step, scratch, transfers ---- */

static void cu_step_begin(struct backend *b) {
    struct cuda_backend *cb = cu_of(b);
    stack_reset(cb);
    cb->prep.valid = false;
    cb->att_q.valid = false;
    cb->pin_used = 0;
    cb->n_dl = 0;
    cb->up.defer = true;
    cb->up.dev0 = NULL;
    if (cb->prof) {
        cb->n_pev = 0;
        *cb->gate_h = 0;
        cuda_gate(cb->gate_d, 2000000000ull, cb->stream);
        cudaEventRecord(cb->prof_start, cb->stream);
    }
}

static void *cu_scratch_alloc(struct backend *b, size_t nbytes) { return stack_alloc(cu_of(b), nbytes ? nbytes : 1); }

static size_t cu_scratch_mark(struct backend *b) {
    struct cuda_backend *cb = cu_of(b);
    if (!cb->n_chunks) return 0;
    return ((size_t)cb->cur << MARK_SHIFT) | cb->chunks[cb->cur].used;
}

static void cu_scratch_release(struct backend *b, size_t mark) {
    struct cuda_backend *cb = cu_of(b);
    if (!cb->n_chunks) return;
    int cur = (int)(mark >> MARK_SHIFT);
    size_t used = mark & (((size_t)1 << MARK_SHIFT) - 1);
    if (cur > cb->cur || (cur == cb->cur && used > cb->chunks[cur].used)) return;
    cb->cur = cur;
    cb->chunks[cur].used = used;
}

/* The pending run of input uploads, as one copy. */
static void up_run_flush(struct cuda_backend *cb) {
    if (!cb->up.dev0) return;
    cudaError_t rc = cudaMemcpyAsync(cb->up.dev0, cb->pin + cb->up.off0, cb->up.span, cudaMemcpyHostToDevice,
                                     cb->stream);
    if (rc != cudaSuccess) CU_FAIL(cb, rc, "upload");
    cuda_pdl_fence = 1;
    cb->up.dev0 = NULL;
}

/* The end of the input phase: the run goes out, later uploads are copied at once. */
static void up_flush(struct cuda_backend *cb) {
    cb->up.defer = false;
    up_run_flush(cb);
}

#define UP_GAP_MAX 4096 /* device bytes between two inputs that one copy still spans */

/* The end of the scratch chunk holding [p, p + n), or NULL when it is not scratch. */
static unsigned char *scratch_lim(const struct cuda_backend *cb, const unsigned char *p, size_t n) {
    for (int i = 0; i < cb->n_chunks; i++) {
        unsigned char *base = cb->chunks[i].base;
        if (p >= base && p + n <= base + cb->chunks[i].cap) return base + cb->chunks[i].cap;
    }
    return NULL;
}

static void cu_upload(struct backend *b, struct tensor *dst, const void *src, size_t nbytes) {
    struct cuda_backend *cb = cu_of(b);
    unsigned char *d = dst->data;
    size_t off;
    unsigned char *lim = cb->up.defer ? scratch_lim(cb, d, nbytes) : NULL;
    if (cb->up.defer && cb->up.dev0) {
        /* extend the run when d lies a little past it in its chunk and the mirrored staging
         * offset is still free; the staging must not grow (that syncs and moves the buffer) */
        const unsigned char *end = cb->up.dev0 + cb->up.span;
        const size_t at = cb->up.off0 + (size_t)(d - cb->up.dev0);
        if (lim == cb->up.lim && d >= end && (size_t)(d - end) <= UP_GAP_MAX && at >= cb->pin_used &&
            at + nbytes <= cb->pin_cap) {
            memset(cb->pin + cb->pin_used, 0, at - cb->pin_used);
            memcpy(cb->pin + at, src, nbytes);
            cb->pin_used = (at + nbytes + 63) & ~(size_t)63;
            cb->up.span = (size_t)(d - cb->up.dev0) + nbytes;
            return;
        }
        up_run_flush(cb);
    }
    unsigned char *p = pin_take(cb, nbytes, &off);
    if (!p) {
        bk_fail(b, SMELT_ERR_NOMEM, "pinned staging: out of memory (%zu bytes)", nbytes);
        return;
    }
    memcpy(p, src, nbytes);
    if (lim) { /* a new run */
        cb->up.dev0 = d;
        cb->up.lim = lim;
        cb->up.off0 = off;
        cb->up.span = nbytes;
        return;
    }
    cudaError_t rc = cudaMemcpyAsync(d, p, nbytes, cudaMemcpyHostToDevice, cb->stream);
    if (rc != cudaSuccess) CU_FAIL(cb, rc, "upload");
    cuda_pdl_fence = 1;
}

static void cu_download(struct backend *b, void *dst, const struct tensor *src, size_t nbytes) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    size_t off;
    unsigned char *p = pin_take(cb, nbytes, &off);
    if (!p) {
        bk_fail(b, SMELT_ERR_NOMEM, "pinned staging: out of memory (%zu bytes)", nbytes);
        return;
    }
    cudaError_t rc = cudaMemcpyAsync(p, src->data, nbytes, cudaMemcpyDeviceToHost, cb->stream);
    cuda_pdl_fence = 1;
    if (rc != cudaSuccess) {
        CU_FAIL(cb, rc, "download");
        return;
    }
    if (cb->n_dl == cb->cap_dl) {
        int nc = cb->cap_dl ? cb->cap_dl * 2 : 8;
        struct pending_dl *d = realloc(cb->dl, (size_t)nc * sizeof *d);
        if (!d) {
            bk_fail(b, SMELT_ERR_NOMEM, "out of memory");
            return;
        }
        cb->dl = d;
        cb->cap_dl = nc;
    }
    cb->dl[cb->n_dl++] = (struct pending_dl){dst, off, nbytes};
    prof_mark(cb, nbytes, "download");
}

static smelt_status cu_sync(struct backend *b, struct err *e) {
    struct cuda_backend *cb = cu_of(b);
    up_flush(cb);
    if (cb->prof) *cb->gate_h = 1;
    cudaError_t rc = cudaStreamSynchronize(cb->stream);
    if (rc != cudaSuccess) CU_FAIL(cb, rc, "GPU step");
    if (cb->prof && ok(cb)) prof_collect(cb);
    if (ok(cb))
        for (int i = 0; i < cb->n_dl; i++) memcpy(cb->dl[i].dst, cb->pin + cb->dl[i].off, cb->dl[i].n);
    cb->n_dl = 0;
    (void)e;
    return SMELT_OK; /* bk_sync turns the sticky status into the return value */
}

/* ---- matrix products ---- */

static const struct cuda_qweight *qw_of(struct cuda_backend *cb, const struct tensor *w) {
    if (!w->extra) bk_fail(&cb->base, SMELT_ERR_INTERNAL, "tensor %s: not a bound GPU weight",
                           w->name ? w->name : "?");
    return w->extra;
}

/* ---- matrix products: the paths and the choice between them ----
 *
 * Three paths compute y (rows, n) (+)= W x: the mmv kernels in chunks of 8 token rows
 * ("mmv"), the tensor-core kernel with one of its fixed tiles ("mmq", cuda_mmq.h), and
 * F16 dequantization in row tiles + cuBLAS ("gemm"). A choice (mm_tune.h) names one:
 * MMTUNE_MMV, MMTUNE_GEMM, a tile >= 0, or MMTUNE_MMQ_AUTO (mmq, static tile per shape).
 *
 * Path choice by measurement (issue #6: "the switch points are measured per GPU").
 * Up to 8 rows are always mmv. Above, for the types mmq has, the first call of each key
 * (weight type, rows, k, token-row bucket: mm_tune.c gives the buckets and why) that
 * happens outside stream capture times every candidate on the real weights and
 * activations: each mmq tile that fits the device (and is not mostly padding for n),
 * gemm, and below 33 rows repeated mmv; 1 warm-up + MMTUNE_RUNS timed runs each, bracketed
 * by events, an L2-sized memset before each so the weights come from HBM as in a real
 * step; the median counts. The candidates write to y when the call overwrites it anyway
 * (!acc) and to scratch otherwise; then the fastest runs once more for the real output.
 * The winner is recorded in cb->tune and every later call of the key in any bucket-mate
 * shape uses it. Cost: sum over candidates of 4 x (its time + the flush, ~35 us on an
 * H200) per key, a few dozen keys per model: docs/cuda-backend.md gives the estimate, and
 * the backend logs the table and the time spent when it is freed.
 *
 * Contract with the step graphs (cu_graph_*):
 *   1. The table is write-once: a key's recorded choice never changes for the backend's
 *      lifetime, so a graph captured with it runs what every later eager call runs.
 *   2. Timing (events, a sync) happens only while the stream is not capturing (our own
 *      capture, cb->capturing, or anyone's: cudaStreamIsCapturing). A key first seen
 *      during capture gets the static choice for that call and is not recorded; the key's
 *      next eager call measures it.
 *   3. model_forward runs the first step of every graph key eagerly and captures only a
 *      later step of the same key, which presents the same matmul shapes: so every key a
 *      captured step contains was recorded in that eager step, and (1) makes the capture
 *      use the same kernels. Case (2) arises only for a caller capturing shapes it never
 *      ran eagerly; its graph keeps the static kernel (a correct product, possibly slower)
 *      and a later measured choice does not touch it. Results of two choices differ by
 *      float rounding only (order of the K sum).
 *   4. Tuning allocates scratch inside the call (released before it returns); a stack that
 *      grows invalidates every graph as any growing step does (stack_reset), so a graph
 *      never points into memory a tuning run moved.
 *   5. Failure to measure (out of scratch, event errors, every candidate failing) records
 *      the static choice, so the key stays stable; a failed candidate is skipped.
 * Overrides (read at creation): SMELT_NO_TUNE=1 static choices only; SMELT_MMQ_TILE=N
 * static choices with tile N wherever they use mmq; SMELT_MMQ_MAX_ROWS=N fixes the
 * mmq/gemm switch at N rows (0 = no mmq) and leaves only the tile to measure. Static
 * choice: mmq with cuda_mmq's heuristic tile for 9..MMQ_MAX_ROWS rows, mmv below
 * GEMM_MIN_ROWS, else gemm. */

_Static_assert(MMTUNE_MMQ_AUTO == CUDA_MMQ_TILE_AUTO, "a choice is passed to cuda_mmq_pre as its tile");

#define ALIGN_UP(v) (((uint64_t)(v) + SCRATCH_ALIGN - 1) & ~(uint64_t)(SCRATCH_ALIGN - 1))
#define TUNE_FLUSH_MAX ((uint64_t)256 << 20) /* L2 flush buffer cap (2 x the L2 size) */

static int64_t gemm_tile_rows(const struct cuda_qweight *qw) {
    int64_t tile = (int64_t)(GEMM_TILE_BYTES / ((size_t)qw->k * 2));
    if (tile < 64) tile = 64;
    if (tile > qw->rows) tile = qw->rows;
    return tile;
}

/* Scratch bytes path `choice` needs (one region; path_run carves it). */
static smelt_status path_scratch(const struct cuda_qweight *qw, int choice, int64_t n, const void *xq,
                                 uint64_t *bytes, struct err *e) {
    *bytes = 0;
    if (choice == MMTUNE_GEMM) {
        if (qw->type != QT_F32)
            *bytes = ALIGN_UP(qw->k * n * 2) + (qw->type == QT_F16 ? 0 : ALIGN_UP(gemm_tile_rows(qw) * qw->k * 2));
        return SMELT_OK;
    }
    if (choice == MMTUNE_MMV) {
        if (cuda_mmv_needs_quant(qw->type) && (!xq || n > CUDA_MMV_MAX_N))
            *bytes = cuda_mmv_scratch_bytes(qw->k, CUDA_MMV_MAX_N);
        return SMELT_OK;
    }
    return cuda_mmq_scratch_bytes(qw->rows, qw->k, n, bytes, e);
}

/* y (rows, n) (+)= W x through cuBLAS: x to F16 at sc, W dequantized to F16 in row tiles
 * after it (F32 weights go straight to an FP32 GEMM; F16 ones need no tile copy). */
static smelt_status gemm_run(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n,
                             float *y, bool acc, void *sc, struct err *e) {
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    int64_t k = qw->k, rows = qw->rows;
    cublasStatus_t cs;
    if (qw->type == QT_F32) {
        cs = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)k, &alpha, qw->q,
                          CUDA_R_32F, (int)k, x, CUDA_R_32F, (int)k, &beta, y, CUDA_R_32F, (int)rows,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        prof_mark(cb, qw->bytes, "%scublas f32 gemm n=%lld k=%lld", cb->tuning ? "tune " : "", (long long)n,
                  (long long)k);
    } else {
        void *xh = sc;
        void *wh = (unsigned char *)sc + ALIGN_UP(k * n * 2);
        int64_t tile = gemm_tile_rows(qw);
        cuda_f32_to_f16(xh, x, k * n, cb->stream);
        prof_mark(cb, 0, "%sact f32->f16", cb->tuning ? "tune " : "");
        cs = CUBLAS_STATUS_SUCCESS;
        if (qw->type == QT_F16) { /* F16 weights are already what cuBLAS reads: no tile copy */
            cs = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)k, &alpha, qw->q,
                              CUDA_R_16F, (int)k, xh, CUDA_R_16F, (int)k, &beta, y, CUDA_R_32F, (int)rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            prof_mark(cb, qw->bytes, "%scublas f16 gemm n=%lld k=%lld", cb->tuning ? "tune " : "", (long long)n,
                      (long long)k);
        }
        for (int64_t r0 = qw->type == QT_F16 ? rows : 0; r0 < rows && cs == CUBLAS_STATUS_SUCCESS; r0 += tile) {
            int64_t nr = rows - r0 < tile ? rows - r0 : tile;
            cuda_dequant_f16(wh, qw, r0, nr, cb->stream);
            prof_mark(cb, qw->bytes * (uint64_t)nr / (uint64_t)rows, "%sdequant %s->f16", cb->tuning ? "tune " : "",
                      qtype_name(qw->type));
            cs = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n, (int)k, &alpha, wh,
                              CUDA_R_16F, (int)k, xh, CUDA_R_16F, (int)k, &beta, y + r0, CUDA_R_32F,
                              (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            prof_mark(cb, (uint64_t)(nr * k) * 2, "%scublas f16 gemm n=%lld k=%lld", cb->tuning ? "tune " : "",
                      (long long)n, (long long)k);
        }
    }
    if (cs != CUBLAS_STATUS_SUCCESS)
        return err_set(e, SMELT_ERR_DEVICE, "cuBLAS GEMM failed (status %d), %s %lldx%lld, %lld rows", (int)cs,
                       qtype_name(qw->type), (long long)rows, (long long)k, (long long)n);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) return err_set(e, SMELT_ERR_DEVICE, "GEMM: %s", cudaGetErrorString(rc));
    return SMELT_OK;
}

/* y (+)= W x by the mmv kernels in chunks of CUDA_MMV_MAX_N rows; xq: x's quantized form
 * when n <= 8 and a matmul group already made it, else sc (path_scratch bytes) takes it. */
static smelt_status mmv_run(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n,
                            float *y, bool acc, const void *xq, void *sc, struct err *e) {
    const bool quant = cuda_mmv_needs_quant(qw->type);
    const void *xs = quant && (!xq || n > CUDA_MMV_MAX_N) ? sc : xq;
    for (int64_t t0 = 0; t0 < n; t0 += CUDA_MMV_MAX_N) {
        int nt = (int)(n - t0 < CUDA_MMV_MAX_N ? n - t0 : CUDA_MMV_MAX_N);
        const float *xt = x + t0 * qw->k;
        smelt_status st = SMELT_OK;
        if (quant && xs != xq) {
            st = cuda_mmv_quantize(xt, qw->k, nt, (void *)xs, cb->stream, e);
            prof_mark(cb, 0, "%squantize act", cb->tuning ? "tune " : "");
        }
        if (st == SMELT_OK) st = cuda_mmv_pre(qw, xt, nt, y + t0 * qw->rows, xs, acc, cb->stream, e);
        prof_mark(cb, qw->bytes, "%smmv %s %lldx%lld n=%d", cb->tuning ? "tune " : "", qtype_name(qw->type),
                  (long long)qw->rows, (long long)qw->k, nt);
        if (st != SMELT_OK) return st;
    }
    return SMELT_OK;
}

/* y (+)= W x by path `choice`, scratch sc of sc_bytes (path_scratch). Enqueues only (no
 * sync: capturable); errors are argument, launch and cuBLAS errors. */
static smelt_status path_run(struct cuda_backend *cb, const struct cuda_qweight *qw, int choice, const float *x,
                             int64_t n, float *y, bool acc, const void *xq, void *sc, uint64_t sc_bytes,
                             struct err *e) {
    if (choice == MMTUNE_GEMM) return gemm_run(cb, qw, x, n, y, acc, sc, e);
    if (choice == MMTUNE_MMV) return mmv_run(cb, qw, x, n, y, acc, xq, sc, e);
    smelt_status st = cuda_mmq_quantize(x, qw->k, n, sc, cb->stream, e);
    if (st == SMELT_OK) st = cuda_mmq_pre(qw, n, y, sc, sc_bytes, acc, choice, cb->stream, e);
    prof_mark(cb, qw->bytes, "%smmq %s %lldx%lld n=%lld", cb->tuning ? "tune " : "", qtype_name(qw->type),
              (long long)qw->rows, (long long)qw->k, (long long)n);
    return st;
}

/* The choice without measuring (SMELT_NO_TUNE=1, capture, failure). */
static int static_choice(const struct cuda_backend *cb, const struct cuda_qweight *qw, int64_t n) {
    if (n > CUDA_MMV_MAX_N && n <= cb->mmq_max_rows && cuda_mmq_supported(qw->type, qw->k)) return cb->tune_env.tile;
    return n >= GEMM_MIN_ROWS ? MMTUNE_GEMM : MMTUNE_MMV;
}

static bool stream_capturing(struct cuda_backend *cb) {
    if (cb->capturing >= 0) return true;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(cb->stream, &cs) != cudaSuccess) {
        cudaGetLastError();
        return true; /* unknown: do not sync */
    }
    return cs != cudaStreamCaptureStatusNone;
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Median us of MMTUNE_RUNS timed runs of `choice` after one warm-up, each after an L2
 * flush (flush may be NULL); -1 when the candidate failed (its error is logged at debug
 * level). A device fault is sticky: it fails the backend (CU_FAIL). */
static float time_path(struct cuda_backend *cb, const struct cuda_qweight *qw, int choice, const float *x, int64_t n,
                       float *yc, const void *xq, void *sc, uint64_t sc_bytes, void *flush, uint64_t flush_bytes) {
    struct err e;
    cudaError_t rc = cudaSuccess;
    for (int r = 0; r <= MMTUNE_RUNS && rc == cudaSuccess; r++) {
        if (flush) {
            rc = cudaMemsetAsync(flush, r, flush_bytes, cb->stream);
            cuda_pdl_fence = 1; /* the next kernel waits for the memset as for a copy */
            prof_mark(cb, flush_bytes, "tune L2 flush");
        }
        if (rc == cudaSuccess) rc = cudaEventRecord(cb->tune_ev[2 * r], cb->stream);
        if (rc != cudaSuccess) break;
        if (path_run(cb, qw, choice, x, n, yc, false, xq, sc, sc_bytes, &e) != SMELT_OK) {
            char name[32];
            log_debug("cuda matmul tuning: %s on %s %lldx%lld, %lld rows failed: %s",
                      mmtune_choice_name(choice, cuda_mmq_tile_shape, name, sizeof name), qtype_name(qw->type),
                      (long long)qw->rows, (long long)qw->k, (long long)n, e.msg);
            cudaGetLastError();
            return -1;
        }
        rc = cudaEventRecord(cb->tune_ev[2 * r + 1], cb->stream);
    }
    if (rc == cudaSuccess) rc = cudaEventSynchronize(cb->tune_ev[2 * MMTUNE_RUNS + 1]);
    if (rc != cudaSuccess) {
        CU_FAIL(cb, rc, "timing a matmul path");
        return -1;
    }
    float t[MMTUNE_RUNS];
    for (int r = 1; r <= MMTUNE_RUNS; r++) {
        float ms = -1;
        if (cudaEventElapsedTime(&ms, cb->tune_ev[2 * r], cb->tune_ev[2 * r + 1]) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
        t[r - 1] = ms * 1e3f;
    }
    return mmtune_median(t, MMTUNE_RUNS);
}

/* Events and the flush size, once; false if tuning cannot run here. */
static bool tune_ready(struct cuda_backend *cb) {
    if (cb->tune_ev_n == 2 * (MMTUNE_RUNS + 1)) return true;
    if (cb->tune_ev_n < 0) return false;
    while (cb->tune_ev_n < 2 * (MMTUNE_RUNS + 1)) {
        if (cudaEventCreate(&cb->tune_ev[cb->tune_ev_n]) != cudaSuccess) {
            cudaGetLastError();
            log_warn("cuda: matmul paths not measured (no CUDA events): static choices");
            for (int i = 0; i < cb->tune_ev_n; i++) cudaEventDestroy(cb->tune_ev[i]);
            cb->tune_ev_n = -1;
            return false;
        }
        cb->tune_ev_n++;
    }
    int l2 = 0;
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, cb->device) != cudaSuccess) {
        cudaGetLastError();
        l2 = 0;
    }
    cb->tune_flush = 2 * (uint64_t)(l2 > 0 ? l2 : 0);
    if (cb->tune_flush > TUNE_FLUSH_MAX) cb->tune_flush = TUNE_FLUSH_MAX;
    return true;
}

/* Measures the candidates of key for this call's product and records the winner (the
 * static choice `st` when nothing could be measured). Returns the recorded choice. y is
 * written only when !acc (the caller's run overwrites it). */
static int tune(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n, float *y, bool acc,
                const void *xq, int st, const struct mmtune_key *key) {
    const double t0 = mono_ms();
    int bn[MMTUNE_MAX_CAND], fits[MMTUNE_MAX_CAND];
    int n_tiles = cuda_mmq_tile_count();
    if (n_tiles > MMTUNE_MAX_CAND) n_tiles = MMTUNE_MAX_CAND;
    for (int t = 0; t < n_tiles; t++) {
        int bm = 0;
        cuda_mmq_tile_shape(t, &bm, &bn[t]);
        fits[t] = cuda_mmq_tile_fits(qw->type, t) == 1;
    }
    const struct mmtune_space sp = {.n_tiles = n_tiles, .tile_bn = bn, .tile_fits = fits, .mmq = true,
                                    .mmq_max_rows = cb->mmq_rows_fixed ? cb->mmq_max_rows : INT64_MAX,
                                    .gemm = !cb->mmq_rows_fixed, .mmv = !cb->mmq_rows_fixed};
    int cand[MMTUNE_MAX_CAND];
    float us[MMTUNE_MAX_CAND];
    const int nc = mmtune_candidates(n, &sp, cand, MMTUNE_MAX_CAND);
    for (int i = 0; i < MMTUNE_MAX_CAND; i++) us[i] = -1;
    struct mmtune_ent ent = {.key = *key, .choice = st, .n = n, .static_choice = st};
    struct err e;
    const char *why = nc ? NULL : "one candidate";
    if (nc && tune_ready(cb)) {
        const size_t mark = cu_scratch_mark(&cb->base);
        uint64_t need = 0;
        for (int i = 0; i < nc && !why; i++) {
            uint64_t b = 0;
            if (path_scratch(qw, cand[i], n, xq, &b, &e) != SMELT_OK) why = e.msg;
            if (b > need) need = b;
        }
        float *yc = acc ? stack_alloc(cb, (size_t)(qw->rows * n) * sizeof(float)) : y;
        void *sc = why ? NULL : stack_alloc(cb, need ? need : 1);
        void *flush = cb->tune_flush ? stack_alloc(cb, cb->tune_flush) : NULL;
        if (!why && (!yc || !sc)) why = "out of device scratch";
        if (!why) {
            if (cb->prof) *cb->gate_h = 1; /* the profile's gate would hold the sync for 2 s */
            cb->tuning = true;
            for (int i = 0; i < nc && ok(cb); i++)
                us[i] = time_path(cb, qw, cand[i], x, n, yc, xq, sc, need, flush, flush ? cb->tune_flush : 0);
            cb->tuning = false;
            const int w = ok(cb) ? mmtune_fastest(us, nc) : -1;
            ent.n_cand = nc;
            ent.static_choice = st == MMTUNE_MMQ_AUTO ? cuda_mmq_tile_auto(qw, n) : st;
            for (int i = 0; i < nc; i++) {
                ent.cand[i] = cand[i];
                ent.cand_us[i] = us[i];
                if (cand[i] == ent.static_choice) ent.static_us = us[i];
            }
            if (w >= 0) {
                ent.choice = cand[w];
                ent.us = us[w];
            } else why = "every candidate failed";
        }
        cu_scratch_release(&cb->base, mark);
    } else if (nc) why = "no CUDA events";
    if (!ok(cb)) return st;
    const struct mmtune_ent *got = NULL;
    if (mmtune_put(&cb->tune, &ent, &got, &e) != SMELT_OK) {
        if (!cb->tune_full_logged) log_warn("cuda: %s: further matmul shapes keep static choices", e.msg);
        cb->tune_full_logged = true;
        return st;
    }
    cb->tune.tune_ms += mono_ms() - t0;
    if (log_get_level() >= LOG_DEBUG) {
        char line[1024], name[32];
        size_t at = 0;
        int64_t lo, hi;
        mmtune_bucket_range(key->bucket, &lo, &hi);
        char range[48];
        if (hi == INT64_MAX) snprintf(range, sizeof range, "> %lld", (long long)lo - 1);
        else snprintf(range, sizeof range, "%lld-%lld", (long long)lo, (long long)hi);
        at += (size_t)snprintf(line, sizeof line, "%s %lldx%lld, %lld rows (bucket %s):", qtype_name(qw->type),
                               (long long)qw->rows, (long long)qw->k, (long long)n, range);
        for (int i = 0; i < nc && !why && at < sizeof line; i++)
            at += (size_t)snprintf(line + at, sizeof line - at, " %s %.1f us%s",
                                   mmtune_choice_name(cand[i], cuda_mmq_tile_shape, name, sizeof name), us[i],
                                   i + 1 < nc ? "," : "");
        if (at < sizeof line)
            snprintf(line + at, sizeof line - at, " -> %s%s%s",
                     mmtune_choice_name(got->choice, cuda_mmq_tile_shape, name, sizeof name), why ? ", static: " : "",
                     why ? why : "");
        log_debug("cuda matmul tuning: %s", line);
    }
    return got->choice;
}

/* The path for this call: recorded, measured now, or static (see the section comment). */
static int choose(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n, float *y,
                  bool acc, const void *xq) {
    const int st = static_choice(cb, qw, n);
    const int bucket = mmtune_bucket(n);
    if (!cb->tune_env.tune || bucket < 0 || !cuda_mmq_supported(qw->type, qw->k)) return st;
    if (cb->mmq_rows_fixed && st < MMTUNE_MMQ_AUTO) return st; /* the switch is fixed: tiles only */
    const struct mmtune_key key = {qw->type, qw->rows, qw->k, bucket};
    const struct mmtune_ent *ent = mmtune_find(&cb->tune, &key);
    if (ent) return ent->choice;
    if (stream_capturing(cb)) return st; /* measured at the key's next eager call */
    return tune(cb, qw, x, n, y, acc, xq, st, &key);
}

/* At cu_free: the measured table, once (info level: which path won where on this GPU). */
static void tune_report(struct cuda_backend *cb) {
    /* debug level: `smelt run` would otherwise end every answer with the table */
    if (!cb->tune.n || log_get_level() < LOG_DEBUG) return;
    size_t cap = (size_t)cb->tune.n * 96 + 256;
    char *buf = malloc(cap);
    if (!buf) return;
    mmtune_format(&cb->tune, cuda_mmq_tile_shape, buf, cap);
    log_debug("cuda: matmul paths measured on this GPU (%d shape x token-row buckets in %.1f ms; "
              "SMELT_NO_TUNE=1 turns measuring off):",
              cb->tune.n_tuned, cb->tune.tune_ms);
    for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) { /* one line per weight shape */
        nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        log_debug("  %s", line);
    }
    free(buf);
}

/* y (rows, n) (+)= W x for any n, by the chosen path. xq: x's quantized form when n <= 8
 * and a matmul group already made it. */
static void matmul(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n, float *y,
                   bool acc, const void *xq) {
    if (!ok(cb)) return;
    const int choice = choose(cb, qw, x, n, y, acc, xq);
    if (!ok(cb)) return;
    struct err e;
    uint64_t bytes = 0;
    if (path_scratch(qw, choice, n, xq, &bytes, &e) != SMELT_OK) {
        bk_fail(&cb->base, e.code, "%s", e.msg);
        return;
    }
    size_t mark = cu_scratch_mark(&cb->base);
    void *sc = NULL;
    if (bytes && !(sc = scratch(cb, bytes))) return;
    if (path_run(cb, qw, choice, x, n, y, acc, xq, sc, bytes, &e) != SMELT_OK) {
        bk_fail(&cb->base, e.code, "%s", e.msg);
        return;
    }
    cu_scratch_release(&cb->base, mark);
}

/* ---- ops ---- */

static void cu_get_rows(struct backend *b, struct tensor *dst, const struct tensor *src, const struct tensor *ids) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    if (src->extra) cuda_get_rows_q(dst->data, src->extra, ids->data, ids->ne[0], cb->stream);
    else cuda_get_rows_plain(dst->data, src->data, src->type, (int64_t)src->nb[1], ids->data, src->ne[0], ids->ne[0],
                             cb->stream);
    check_launch(cb, "get_rows");
}

static void cu_rms_norm(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w,
                        float eps) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    cuda_rms_norm(dst->data, x->data, w ? w->data : NULL, x->ne[0], tensor_nrows(x), (int64_t)(x->nb[1] / 4),
                  (int64_t)(dst->nb[1] / 4), eps, cb->stream);
    check_launch(cb, "rms_norm");
}

static bool rope_args(struct cuda_backend *cb, const struct rope_params *p, struct cuda_rope *r) {
    memset(r, 0, sizeof *r);
    r->mode = p->mode;
    r->n_rot = p->n_rot;
    r->freq_base = p->freq_base;
    r->freq_scale = p->freq_scale;
    r->ext_factor = p->ext_factor;
    r->attn_factor = p->attn_factor;
    r->mscale = p->attn_factor;
    r->freq_factors = p->freq_factors ? p->freq_factors->data : NULL;
    if (p->ext_factor != 0) {
        /* the dimension index at which a frequency makes n turns over n_ctx_orig */
        double base = p->freq_base, nr = p->n_rot, n0 = p->n_ctx_orig;
        double lo = floor(nr * log(n0 / (p->beta_fast * 2 * M_PI)) / (2 * log(base)));
        double hi = ceil(nr * log(n0 / (p->beta_slow * 2 * M_PI)) / (2 * log(base)));
        if (lo < 0) lo = 0;
        if (hi > nr - 1) hi = nr - 1;
        r->corr_lo = (float)lo;
        r->corr_hi = (float)hi;
        r->mscale = (float)(p->attn_factor * (1.0 + 0.1 * log(1.0 / p->freq_scale)));
    }
    /* the speed table of this parameter set: made at its first use (an eager step; were it
     * captured, the fill would replay with the graph, harmlessly) */
    for (int i = 0; i < cb->n_rope_tab; i++) {
        const struct cuda_rope *k = &cb->rope_tab[i].key;
        if (k->n_rot == r->n_rot && k->freq_base == r->freq_base && k->freq_scale == r->freq_scale &&
            k->ext_factor == r->ext_factor && k->corr_lo == r->corr_lo && k->corr_hi == r->corr_hi &&
            k->freq_factors == r->freq_factors) {
            r->freq = cb->rope_tab[i].freq;
            return true;
        }
    }
    if (cb->n_rope_tab == cb->cap_rope_tab) {
        int cap = cb->cap_rope_tab ? 2 * cb->cap_rope_tab : 4;
        struct rope_tab *t = realloc(cb->rope_tab, sizeof *t * (size_t)cap);
        if (!t) {
            bk_fail(&cb->base, SMELT_ERR_NOMEM, "out of memory (RoPE tables)");
            return false;
        }
        cb->rope_tab = t;
        cb->cap_rope_tab = cap;
    }
    double *f = NULL;
    cudaError_t ce = cudaMalloc((void **)&f, (size_t)(p->n_rot / 2 + 1) * sizeof(double));
    if (ce != cudaSuccess) {
        bk_fail(&cb->base, SMELT_ERR_DEVICE, "cuda rope table: %s", cudaGetErrorString(ce));
        return false;
    }
    cuda_rope_freq_fill(f, r, cb->stream);
    check_launch(cb, "rope table");
    cuda_pdl_fence = 1; /* the fused decode attention reads the table before its PDL wait */
    cb->rope_tab[cb->n_rope_tab].key = *r;
    cb->rope_tab[cb->n_rope_tab++].freq = f;
    r->freq = f;
    return ok(cb);
}

static void cu_rope(struct backend *b, struct tensor *x, const struct tensor *pos, const struct rope_params *p) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    struct cuda_rope r;
    if (!rope_args(cb, p, &r)) return;
    cuda_rope_inplace(x->data, pos->data, (int)x->ne[0], (int)x->ne[1], x->ne[2], &r, NULL, 0, cb->stream);
    check_launch(cb, "rope");
}

static void cu_matmul(struct backend *b, struct tensor *dst, const struct tensor *w, const struct tensor *x) {
    struct cuda_backend *cb = cu_of(b);
    cb->prep.valid = false;
    cb->att_q.valid = false;
    const struct cuda_qweight *qw = qw_of(cb, w);
    if (qw) matmul(cb, qw, x->data, x->ne[1], dst->data, false, NULL);
}

static const void *quantized(struct cuda_backend *cb, const float *x, int64_t k, int64_t n, uint32_t type);

/* The prepared form of x for a norm of weight pre->w, if the last op made it. */
static bool prep_matches(struct cuda_backend *cb, const struct tensor *x, const struct prenorm *pre) {
    return cb->prep.valid && pre && pre->w && cb->prep.x == x->data && cb->prep.w == pre->w->data &&
           cb->prep.n == x->ne[1] && cb->prep.k == x->ne[0] && cb->prep.eps == pre->eps;
}

/* att_q.buf when the last op was the attention that wrote x and its int8 form fits qw. */
static const void *att_q_for(struct cuda_backend *cb, const struct tensor *x, const struct cuda_qweight *qw) {
    return cb->att_q.valid && qw && cb->att_q.x == x->data && cb->att_q.n == x->ne[1] && cb->att_q.k == x->ne[0] &&
                   qw->k == x->ne[0] && cuda_mmv_needs_quant(qw->type)
               ? cb->att_q.buf
               : NULL;
}

/* dst += W x. In decode, with `next` given, the same launch also prepares dst for the norm
 * the caller applies next (cb->prep), sparing the next product its norm+quantize launch. */
static void cu_matmul_acc(struct backend *b, struct tensor *dst, const struct tensor *w, const struct tensor *x,
                          const struct prenorm *next) {
    struct cuda_backend *cb = cu_of(b);
    const struct cuda_qweight *qw = qw_of(cb, w);
    const void *att_xq = att_q_for(cb, x, qw); /* x's int8 form, if the attention made it */
    cb->prep.valid = false;
    cb->att_q.valid = false;
    if (!qw || !ok(cb)) return;
    const int64_t n = x->ne[1];
    if (!(next && next->w && cb->prep.buf && n <= CUDA_MMV_MAX_N && cuda_mmv_needs_quant(qw->type) &&
          qw->rows % 32 == 0 && qw->rows <= PREP_MAX_K && dst->nb[1] == (size_t)qw->rows * sizeof(float))) {
        matmul(cb, qw, x->data, n, dst->data, true, att_xq);
        return;
    }
    size_t mark = cu_scratch_mark(b);
    const void *xq = att_xq ? att_xq : quantized(cb, x->data, qw->k, n, qw->type);
    if (!xq) return;
    struct cuda_mmv_epi epi = {0};
    epi.post_w = next->w->data;
    cuda_mmv_scratch_parts(cb->prep.buf, qw->rows, (int)n, &epi.post_xq, &epi.post_xd);
    epi.post_ss = cb->prep.ss;
    epi.post_cnt = cb->prep.cnt;
    float *y = dst->data;
    struct err e;
    if (cuda_mmv_multi(&qw, &y, NULL, 1, x->data, (int)n, xq, 1, &epi, cb->stream, &e) != SMELT_OK) {
        bk_fail(b, e.code, "%s", e.msg);
        return;
    }
    prof_mark(cb, qw->bytes, "mmv+prep %s %lldx%lld n=%d", qtype_name(qw->type), (long long)qw->rows,
              (long long)qw->k, (int)n);
    cb->prep = (typeof(cb->prep)){cb->prep.buf, cb->prep.ss, cb->prep.cnt, dst->data, next->w->data, n, qw->rows,
                                  next->eps, true};
    cu_scratch_release(b, mark);
}


static void cu_add(struct backend *b, struct tensor *dst, const struct tensor *a, const struct tensor *c) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    cuda_add(dst->data, a->data, c->data, a->ne[0], tensor_nrows(a), tensor_nrows(c), cb->stream);
    check_launch(cb, "add");
}

static void cu_scale(struct backend *b, struct tensor *dst, const struct tensor *x, float s) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    cuda_scale(dst->data, x->data, s, tensor_nelem(x), cb->stream);
    check_launch(cb, "scale");
}

static void cu_glu(struct backend *b, struct tensor *dst, const struct tensor *gate, const struct tensor *up,
                   enum glu_act act) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    cuda_glu(dst->data, gate->data, up->data, act == GLU_SILU ? 0 : 1, tensor_nelem(gate), cb->stream);
    check_launch(cb, "glu");
}

static void cu_softcap(struct backend *b, struct tensor *x, float cap) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    cuda_softcap(x->data, cap, tensor_nelem(x), cb->stream);
    check_launch(cb, "softcap");
}

static void cu_softmax(struct backend *b, struct tensor *x) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    cuda_softmax(x->data, x->ne[0], tensor_nrows(x), cb->stream);
    check_launch(cb, "softmax");
}

static void cu_kv_store(struct backend *b, struct tensor *kc, struct tensor *vc, const struct tensor *k,
                        const struct tensor *v, const struct attn_meta *m) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    cuda_kv_store(kc->data, vc->data, kc->type, k->data, v->data, m->slot->data, (int)k->ne[0], (int)v->ne[0],
                  (int)k->ne[1], m->block_size, k->ne[2], cb->stream);
    check_launch(cb, "kv_store");
}

/* The attention call's arguments for the step's shape (no RoPE fused). */
static bool attn_args(struct cuda_backend *cb, struct cuda_attn_args *out, struct tensor *dst, const struct tensor *q,
                      const struct tensor *kc, const struct tensor *vc, const struct attn_meta *m,
                      const struct attn_params *p) {
    if (kc->ne[0] > 256 || vc->ne[0] > 256) {
        bk_fail(&cb->base, SMELT_ERR_UNSUPPORTED, "cuda attention: head_dim %lld > 256", (long long)kc->ne[0]);
        return false;
    }
    struct cuda_attn_args a = {
        .dst = dst->data, .q = q->data, .kc = kc->data, .vc = vc->data, .cache_type = kc->type,
        .pos = m->pos->data, .seq = m->seq->data, .blocks = m->blocks->data,
        .max_blocks = (int)m->blocks->ne[0], .block_size = m->block_size, .n_seqs = (int)m->blocks->ne[1],
        .dk = (int)kc->ne[0], .dv = (int)vc->ne[0], .n_head = (int)q->ne[1], .n_kv = (int)kc->ne[2],
        .n_tokens = q->ne[2], .scale = p->scale, .softcap = p->softcap, .window = p->window,
        .kernel = CUDA_ATTN_AUTO};
    a.max_keys = (int)(m->blocks->ne[0] * m->block_size);
    if (p->window > 0 && a.max_keys > p->window) a.max_keys = p->window;
    *out = a;
    return true;
}

/* Enqueues attention a (its dst, q_out and scratch filled in here). */
static void attention_run(struct cuda_backend *cb, struct cuda_attn_args a) {
    struct backend *b = &cb->base;
    /* decode: the output's int8 form too, for W_o's product (att_q) */
    const int64_t width = (int64_t)a.dv * a.n_head;
    const bool want_q = cb->att_q.buf && a.n_tokens <= CUDA_MMV_MAX_N && width % 32 == 0 && width <= ATT_Q_MAX_K;
    if (want_q) a.q_out = cb->att_q.buf;
    size_t mark = cu_scratch_mark(b);
    /* the kernel and its scratch follow from the step's shape only (graph replay) */
    uint64_t need = cuda_attn_scratch_bytes(&a);
    if (need) {
        a.scratch = scratch(cb, need);
        if (!a.scratch) return;
    }
    cuda_attention(&a, cb->stream);
    check_launch(cb, a.rope.freq ? "rope+attention" : "attention");
    if (want_q && ok(cb)) cb->att_q = (typeof(cb->att_q)){cb->att_q.buf, a.dst, a.n_tokens, width, true};
    cu_scratch_release(b, mark);
}

static void cu_attention(struct backend *b, struct tensor *dst, const struct tensor *q, const struct tensor *kc,
                         const struct tensor *vc, const struct attn_meta *m, const struct attn_params *p) {
    struct cuda_backend *cb = cu_of(b);
    struct cuda_attn_args a;
    if (ok(cb) && attn_args(cb, &a, dst, q, kc, vc, m, p)) attention_run(cb, a);
}

/* ---- sampling summaries (cuda_sample.cu) ---- */

static void cu_logits_topk(struct backend *b, struct tensor *dst, const struct tensor *logits,
                           const struct tensor *rows, const struct tensor *adj) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    int n_rows = (int)logits->ne[1], nv = (int)logits->ne[0];
    size_t mark = cu_scratch_mark(b);
    void *sc = scratch(cb, cuda_topk_scratch_bytes(n_rows, nv));
    if (!sc) return;
    struct cuda_topk_args a = {.logits = logits->data, .ld = (int64_t)(logits->nb[1] / sizeof(float)),
                               .n_vocab = nv, .n_rows = n_rows, .rows = rows->data, .adj = adj->data,
                               .adj_cap = (int)adj->ne[1], .out = dst->data, .scratch = sc};
    cuda_logits_topk(&a, cb->stream);
    check_launch(cb, "logits_topk");
    cu_scratch_release(b, mark);
}

/* ---- fused ops ---- */

/* x' = rms_norm(x) * pre->w in scratch (or x itself when pre is NULL). */
static const float *prenormed(struct cuda_backend *cb, const struct tensor *x, const struct prenorm *pre) {
    if (!pre) return x->data;
    float *xn = scratch(cb, (size_t)tensor_nelem(x) * sizeof(float));
    if (!xn) return NULL;
    cuda_rms_norm(xn, x->data, pre->w ? pre->w->data : NULL, x->ne[0], x->ne[1], (int64_t)(x->nb[1] / 4), x->ne[0],
                  pre->eps, cb->stream);
    check_launch(cb, "rms_norm");
    return xn;
}

/* The quantized form of x for n <= 8 rows, shared by several weights of the same width. */
static const void *quantized(struct cuda_backend *cb, const float *x, int64_t k, int64_t n, uint32_t type) {
    if (n > CUDA_MMV_MAX_N || !cuda_mmv_needs_quant(type)) return NULL;
    void *sc = scratch(cb, cuda_mmv_scratch_bytes(k, (int)n));
    struct err e;
    if (sc && cuda_mmv_quantize(x, k, (int)n, sc, cb->stream, &e) != SMELT_OK) {
        bk_fail(&cb->base, e.code, "%s", e.msg);
        return NULL;
    }
    prof_mark(cb, 0, "quantize act");
    return sc;
}

/* The normalized input of a decode matmul group in its int8 form (scratch), and in f32 (xn)
 * when float-typed weights need it: one RMSNorm+quantize launch. */
static const void *norm_quantized(struct cuda_backend *cb, const struct tensor *x, const struct prenorm *pre,
                                  float **xn) {
    const int64_t k = x->ne[0];
    const int n = (int)x->ne[1];
    void *sc = scratch(cb, cuda_mmv_scratch_bytes(k, n));
    if (!sc) return NULL;
    if (xn) {
        *xn = scratch(cb, (size_t)(k * n) * sizeof(float));
        if (!*xn) return NULL;
    }
    struct err e;
    if (cuda_mmv_norm_quantize(x->data, (int64_t)(x->nb[1] / 4), pre->w ? pre->w->data : NULL, pre->eps, k, n, sc,
                               xn ? *xn : NULL, cb->stream, &e) != SMELT_OK) {
        bk_fail(&cb->base, e.code, "%s", e.msg);
        return NULL;
    }
    prof_mark(cb, 0, "rms_norm+quantize");
    return sc;
}

/* Decode (<= 8 rows): one RMSNorm+quantize launch, then one mmv launch per run of weights
 * that stack (Q, K and V of one type, or Q4_K_M's Q4_K Q and K with a Q6_K V), biases
 * added in the same launch. */
static void matmul_group_mmv(struct cuda_backend *cb, int n, struct tensor *const *dst, const struct tensor *const *w,
                             const struct tensor *const *bias, const struct tensor *x, const struct prenorm *pre) {
    const struct cuda_qweight *qw[3];
    bool any_float = false, any_quant = false;
    for (int i = 0; i < n; i++) {
        if (!(qw[i] = qw_of(cb, w[i]))) return;
        if (cuda_mmv_needs_quant(qw[i]->type)) any_quant = true;
        else any_float = true;
    }
    const float *xf = x->data;
    const void *xq = NULL;
    struct cuda_mmv_epi epi = {0};
    if (any_quant && prep_matches(cb, x, pre)) {
        /* the previous product left x's int8 form: only float weights need a norm launch */
        xq = cb->prep.buf;
        epi.pre_ss = cb->prep.ss;
        epi.pre_eps = pre->eps;
        if (any_float && !(xf = prenormed(cb, x, pre))) return;
    } else if (pre && any_quant) {
        float *xn = NULL;
        xq = norm_quantized(cb, x, pre, any_float ? &xn : NULL);
        if (!xq) return;
        if (any_float) xf = xn;
    } else {
        if (!(xf = prenormed(cb, x, pre))) return;
        uint32_t qt = qw[0]->type;
        for (int i = 0; i < n; i++)
            if (cuda_mmv_needs_quant(qw[i]->type)) qt = qw[i]->type;
        if (any_quant && !(xq = quantized(cb, xf, x->ne[0], x->ne[1], qt))) return;
    }
    for (int i = 0; i < n && ok(cb);) {
        int j = i + 1;
        while (j < n && cuda_mmv_stackable(&qw[i], j + 1 - i)) j++;
        float *y[3];
        const float *b[3];
        for (int t = i; t < j; t++) {
            y[t - i] = dst[t]->data;
            b[t - i] = bias && bias[t] ? bias[t]->data : NULL;
        }
        struct err e;
        bool q = cuda_mmv_needs_quant(qw[i]->type);
        if (cuda_mmv_multi(&qw[i], y, b, j - i, xf, (int)x->ne[1], q ? xq : NULL, 0, q && epi.pre_ss ? &epi : NULL,
                           cb->stream, &e) != SMELT_OK) {
            bk_fail(&cb->base, e.code, "%s", e.msg);
            return;
        }
        uint64_t bytes = 0;
        for (int t = i; t < j; t++) bytes += qw[t]->bytes;
        prof_mark(cb, bytes, "mmv %s%s%s x%d %lldx%lld n=%d", qtype_name(qw[i]->type),
                  qw[j - 1]->type != qw[i]->type ? "+" : "",
                  qw[j - 1]->type != qw[i]->type ? qtype_name(qw[j - 1]->type) : "", j - i,
                  (long long)(qw[i]->rows), (long long)qw[i]->k, (int)x->ne[1]);
        i = j;
    }
}

static void cu_matmul_group(struct backend *b, int n, struct tensor *const *dst, const struct tensor *const *w,
                            const struct tensor *const *bias, const struct tensor *x, const struct prenorm *pre) {
    struct cuda_backend *cb = cu_of(b);
    cb->att_q.valid = false; /* only the op right after the attention may use it */
    if (!ok(cb)) return;
    size_t mark = cu_scratch_mark(b);
    if (x->ne[1] <= CUDA_MMV_MAX_N && n <= 3) {
        matmul_group_mmv(cb, n, dst, w, bias, x, pre);
        cu_scratch_release(b, mark);
        return;
    }
    const float *xn = prenormed(cb, x, pre);
    if (!xn) return;
    for (int i = 0; i < n && ok(cb); i++) {
        const struct cuda_qweight *qw = qw_of(cb, w[i]);
        if (!qw) return;
        matmul(cb, qw, xn, x->ne[1], dst[i]->data, false, NULL);
        if (bias && bias[i]) {
            cuda_add(dst[i]->data, dst[i]->data, bias[i]->data, dst[i]->ne[0], tensor_nrows(dst[i]), 1, cb->stream);
            check_launch(cb, "bias");
        }
    }
    cu_scratch_release(b, mark);
}

static void cu_ffn_glu(struct backend *b, struct tensor *dst, const struct tensor *w_gate, const struct tensor *w_up,
                       const struct tensor *x, enum glu_act act, const struct prenorm *pre) {
    struct cuda_backend *cb = cu_of(b);
    cb->att_q.valid = false; /* only the op right after the attention may use it */
    if (!ok(cb)) return;
    const struct cuda_qweight *qg = qw_of(cb, w_gate), *qu = qw_of(cb, w_up);
    if (!qg || !qu) return;
    size_t mark = cu_scratch_mark(b);
    int64_t n = x->ne[1];
    if (n <= CUDA_MMV_MAX_N && qg->type == qu->type && qg->rows == qu->rows) {
        /* decode: gate, up and the activation in one kernel (one read of x's int8 form) */
        struct err e;
        const float *xn = x->data;
        const void *sc = NULL;
        struct cuda_mmv_epi epi = {0};
        if (cuda_mmv_needs_quant(qg->type) && prep_matches(cb, x, pre)) {
            sc = cb->prep.buf;
            epi.pre_ss = cb->prep.ss;
            epi.pre_eps = pre->eps;
        } else if (cuda_mmv_needs_quant(qg->type)) {
            if (pre) sc = norm_quantized(cb, x, pre, NULL);
            else sc = quantized(cb, xn, x->ne[0], n, qg->type);
            if (!sc) return;
        } else if (pre) {
            xn = prenormed(cb, x, pre);
            if (!xn) return;
        }
        /* The output's int8 form for the down product (att_q), made by the block that
         * completes each 32-row group instead of a quantize launch, for one token row of a
         * small GLU only (H200): Qwen2.5-0.5B Q8_0 (4864x896) tg128 +2.3%, but x8 batched
         * 4,446 -> 3,883 tok/s (the group's last block quantizes 8 rows alone); Llama-3-8B
         * Q4_K_M (14336x4096, 3,584 blocks) tg128 394 -> 358, there the launch is cheaper. */
        const bool qout = sc && n == 1 && cb->att_q.buf && qg->rows % 32 == 0 && qg->rows <= ATT_Q_MAX_K &&
                          qg->rows * qg->k <= ((int64_t)16 << 20) && dst->nb[1] == (size_t)qg->rows * sizeof(float);
        if (qout) {
            epi.post_cnt = cb->prep.cnt;
            cuda_mmv_scratch_parts(cb->att_q.buf, qg->rows, (int)n, &epi.post_xq, &epi.post_xd);
        }
        if (cuda_mmv_glu(qg, qu, act == GLU_SILU ? 0 : 1, xn, (int)n, dst->data, sc,
                         epi.pre_ss || qout ? &epi : NULL, cb->stream, &e) != SMELT_OK)
            bk_fail(b, e.code, "%s", e.msg);
        prof_mark(cb, qg->bytes + qu->bytes, "mmv glu%s %s 2x%lldx%lld n=%d", qout ? "+quant" : "",
                  qtype_name(qg->type), (long long)qg->rows, (long long)qg->k, (int)n);
        if (qout && ok(cb)) cb->att_q = (typeof(cb->att_q)){cb->att_q.buf, dst->data, n, qg->rows, true};
        cu_scratch_release(b, mark);
        return;
    }
    const float *xn = prenormed(cb, x, pre);
    float *g = scratch(cb, (size_t)tensor_nelem(dst) * sizeof(float));
    if (!xn || !g) return;
    const void *xq = quantized(cb, xn, x->ne[0], x->ne[1], qg->type);
    matmul(cb, qg, xn, x->ne[1], g, false, xq);
    matmul(cb, qu, xn, x->ne[1], dst->data, false,
           cuda_mmv_needs_quant(qu->type) && qu->type == qg->type ? xq : NULL);
    cuda_glu(dst->data, g, dst->data, act == GLU_SILU ? 0 : 1, tensor_nelem(dst), cb->stream);
    check_launch(cb, "glu");
    cu_scratch_release(b, mark);
}

static void cu_rope_kv_store(struct backend *b, struct tensor *q, struct tensor *k, const struct tensor *v,
                             struct tensor *kc, struct tensor *vc, const struct attn_meta *m,
                             const struct qk_prep *p) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb)) return;
    struct cuda_rope r;
    if (!rope_args(cb, p->rope, &r)) return;
    cuda_rope_kv_store(q->data, k->data, v->data, kc->data, vc->data, kc->type, m->pos->data, m->slot->data,
                       (int)k->ne[0], (int)v->ne[0], (int)q->ne[1], (int)k->ne[1], m->block_size, k->ne[2], &r,
                       p->q_norm ? p->q_norm->data : NULL, p->k_norm ? p->k_norm->data : NULL, p->eps, cb->stream);
    check_launch(cb, "rope+kv_store");
}

/* A decode step (every sequence one row) whose attention runs the decode kernel: RoPE and
 * the KV store happen inside it (cuda_attn_args.rope); q and k stay raw. Else the two
 * launches. */
static void cu_rope_attention(struct backend *b, struct tensor *dst, struct tensor *q, struct tensor *k,
                              const struct tensor *v, struct tensor *kc, struct tensor *vc, const struct attn_meta *m,
                              const struct qk_prep *qp, const struct attn_params *ap) {
    struct cuda_backend *cb = cu_of(b);
    struct cuda_attn_args a;
    if (!ok(cb) || !attn_args(cb, &a, dst, q, kc, vc, m, ap)) return;
    struct cuda_attn_plan plan;
    cuda_attn_plan(&a, &plan);
    if (!m->one_per_seq || plan.kernel != CUDA_ATTN_DECODE || a.dk != a.dv) {
        cu_rope_kv_store(b, q, k, v, kc, vc, m, qp);
        if (ok(cb)) attention_run(cb, a);
        return;
    }
    if (!rope_args(cb, qp->rope, &a.rope)) return;
    a.k_new = k->data;
    a.v_new = v->data;
    a.slot = m->slot->data;
    a.q_norm = qp->q_norm ? qp->q_norm->data : NULL;
    a.k_norm = qp->k_norm ? qp->k_norm->data : NULL;
    a.norm_eps = qp->eps;
    attention_run(cb, a);
}

/* ---- step graphs ---- */

static void graphs_clear(struct cuda_backend *cb) {
    for (int i = 0; i < CUDA_GRAPHS; i++) {
        if (cb->graphs[i].exec) cudaGraphExecDestroy(cb->graphs[i].exec);
        memset(&cb->graphs[i], 0, sizeof cb->graphs[i]);
    }
}

static struct graph_ent *graph_find(struct cuda_backend *cb, uint64_t key) {
    for (int i = 0; i < CUDA_GRAPHS; i++)
        if (cb->graphs[i].seen && cb->graphs[i].key == key) return &cb->graphs[i];
    return NULL;
}

static bool cu_graph_replay(struct backend *b, uint64_t key) {
    struct cuda_backend *cb = cu_of(b);
    if (!ok(cb) || cb->no_graph) return false;
    struct graph_ent *g = graph_find(cb, key);
    if (!g || !g->exec) return false;
    g->last_use = ++cb->clock;
    cudaError_t rc = cudaGraphLaunch(g->exec, cb->stream);
    if (rc != cudaSuccess) {
        CU_FAIL(cb, rc, "graph launch");
        return true; /* the step failed; the sticky error reports it */
    }
    return true;
}

static void cu_graph_begin(struct backend *b, uint64_t key) {
    struct cuda_backend *cb = cu_of(b);
    cb->capturing = -1;
    if (cb->no_graph || !ok(cb)) return;
    struct graph_ent *g = graph_find(cb, key);
    if (!g) { /* a new shape: take a free or the least recently used entry */
        g = &cb->graphs[0];
        for (int i = 0; i < CUDA_GRAPHS; i++) {
            if (!cb->graphs[i].seen) {
                g = &cb->graphs[i];
                break;
            }
            if (cb->graphs[i].last_use < g->last_use) g = &cb->graphs[i];
        }
        if (g->exec) cudaGraphExecDestroy(g->exec);
        memset(g, 0, sizeof *g);
        g->key = key;
    }
    g->last_use = ++cb->clock;
    if (g->seen++ == 0 || g->exec) return; /* first time: run eagerly */
    cudaError_t rc = cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeRelaxed);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return; /* run eagerly */
    }
    cb->capturing = (int)(g - cb->graphs);
}

static void cu_graph_end(struct backend *b) {
    struct cuda_backend *cb = cu_of(b);
    if (cb->capturing < 0) return;
    struct graph_ent *g = &cb->graphs[cb->capturing];
    cb->capturing = -1;
    cudaGraph_t graph = NULL;
    cudaError_t rc = cudaStreamEndCapture(cb->stream, &graph);
    if (rc == cudaSuccess && ok(cb)) rc = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (rc != cudaSuccess) {
        g->exec = NULL;
        CU_FAIL(cb, rc, "capturing the step graph (SMELT_NO_GRAPH=1 turns graphs off)");
        return;
    }
    if (!ok(cb)) return;
    /* the captured ops have not run yet */
    rc = cudaGraphLaunch(g->exec, cb->stream);
    if (rc != cudaSuccess) CU_FAIL(cb, rc, "graph launch");
}

/* ---- memory planning (bk_mem_info, engine/memplan.h) ---- */

static bool cu_mem_info(struct backend *b, uint64_t *free_b, uint64_t *total_b) {
    size_t f = 0, t = 0;
    if (cudaSetDevice(cu_of(b)->device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    *free_b = f;
    *total_b = t;
    return true;
}

/* What cu_weight_bind allocates: vectors as F32 copies; matrices in the mmv layout, or as
 * F16 for types without a kernel. The split layouts (cuda_qweight.bytes) hold the GGUF
 * bytes, plus at most 4 bytes a block where a super-scale is widened (Q3_K, Q5_K): counted
 * as 4 for every quantized block, an upper bound. The upload also holds one tensor's GGUF
 * bytes in a temporary buffer while it repacks; the caller adds the largest of those. */
static uint64_t cu_weight_bytes(struct backend *b, uint32_t type, const int64_t ne[TENSOR_MAX_DIMS]) {
    (void)b;
    uint64_t rows = (uint64_t)ne[1] * (uint64_t)ne[2] * (uint64_t)ne[3];
    if (rows == 1) return (uint64_t)ne[0] * sizeof(float);
    if (!cuda_mmv_supported(type, ne[0])) return (uint64_t)ne[0] * rows * 2;
    uint64_t bytes = qtype_row_size(type, ne[0]) * rows;
    const struct qtype_info *qi = qtype_get(type);
    if (type != QT_F32 && type != QT_F16 && type != QT_BF16 && qi && qi->type_size)
        bytes += bytes / qi->type_size * 4;
    return bytes;
}

static size_t cu_scratch_peak(struct backend *b) { return cu_of(b)->peak; }

/* One chunk of at least nbytes (and of at least what the stack holds now). */
static smelt_status cu_scratch_reserve(struct backend *b, size_t nbytes, struct err *e) {
    struct cuda_backend *cb = cu_of(b);
    size_t total = 0;
    for (int i = 0; i < cb->n_chunks; i++) total += cb->chunks[i].cap;
    size_t cap = total > nbytes ? total : nbytes;
    cap = (cap + SCRATCH_ALIGN - 1) & ~(size_t)(SCRATCH_ALIGN - 1);
    if (cap == 0) cap = SCRATCH_ALIGN;
    cudaStreamSynchronize(cb->stream);
    graphs_clear(cb); /* recorded steps may point at the old chunks or at freed buffers */
    if (cb->n_chunks == 1 && total >= cap) {
        cb->cur = 0;
        cb->chunks[0].used = 0;
        return SMELT_OK;
    }
    if (cb->cap_chunks == 0) {
        cb->chunks = malloc(8 * sizeof *cb->chunks);
        if (!cb->chunks) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
        cb->cap_chunks = 8;
    }
    for (int i = 0; i < cb->n_chunks; i++) cudaFree(cb->chunks[i].base);
    cb->n_chunks = 0;
    cb->cur = 0;
    void *base = NULL;
    cudaError_t rc = cudaMalloc(&base, cap);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return err_set(e, SMELT_ERR_NOMEM, "GPU scratch: cannot reserve %.1f MiB: %s",
                       (double)cap / 1048576.0, cudaGetErrorString(rc));
    }
    cb->chunks[0] = (struct dchunk){base, cap, 0};
    cb->n_chunks = 1;
    return SMELT_OK;
}

/* ---- lifecycle ---- */

static void cu_free(struct backend *b) {
    struct cuda_backend *cb = cu_of(b);
    cudaStreamSynchronize(cb->stream);
    prof_print(cb);
    tune_report(cb);
    for (int i = 0; i < cb->tune_ev_n; i++) cudaEventDestroy(cb->tune_ev[i]);
    mmtune_free(&cb->tune);
    for (int i = 0; i < cb->cap_pev; i++) cudaEventDestroy(cb->pev[i].ev);
    free(cb->pev);
    free(cb->prow);
    if (cb->prof) cudaEventDestroy(cb->prof_start);
    if (cb->gate_h) cudaFreeHost((void *)cb->gate_h);
    cudaFree(cb->prep.buf);
    cudaFree(cb->prep.ss);
    cudaFree(cb->prep.cnt);
    cudaFree(cb->att_q.buf);
    for (int i = 0; i < cb->n_rope_tab; i++) cudaFree(cb->rope_tab[i].freq);
    free(cb->rope_tab);
    for (int i = 0; i < cb->n_dev; i++) cudaFree(cb->dev[i]);
    free(cb->dev);
    for (int i = 0; i < cb->n_qws; i++) {
        cuda_qweight_free(cb->qws[i]);
        free(cb->qws[i]);
    }
    free(cb->qws);
    for (int i = 0; i < cb->n_chunks; i++) cudaFree(cb->chunks[i].base);
    free(cb->chunks);
    cudaFreeHost(cb->pin);
    free(cb->dl);
    graphs_clear(cb);
    cublasDestroy(cb->cublas);
    cudaStreamDestroy(cb->stream);
    bk_base_free(b);
    free(cb);
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .free = cu_free,
    .weight_bind = cu_weight_bind,
    .buffer_alloc = cu_buffer_alloc,
    .buffer_free = cu_buffer_free,
    .step_begin = cu_step_begin,
    .scratch_alloc = cu_scratch_alloc,
    .scratch_mark = cu_scratch_mark,
    .scratch_release = cu_scratch_release,
    .upload = cu_upload,
    .download = cu_download,
    .sync = cu_sync,
    .get_rows = cu_get_rows,
    .rms_norm = cu_rms_norm,
    .rope = cu_rope,
    .matmul = cu_matmul,
    .add = cu_add,
    .scale = cu_scale,
    .glu = cu_glu,
    .softcap = cu_softcap,
    .softmax = cu_softmax,
    .kv_store = cu_kv_store,
    .attention = cu_attention,
    .matmul_group = cu_matmul_group,
    .matmul_acc = cu_matmul_acc,
    .ffn_glu = cu_ffn_glu,
    .rope_kv_store = cu_rope_kv_store,
    .rope_attention = cu_rope_attention,
    .logits_topk = cu_logits_topk,
    .graph_replay = cu_graph_replay,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .mem_info = cu_mem_info,
    .weight_bytes = cu_weight_bytes,
    .scratch_peak = cu_scratch_peak,
    .scratch_reserve = cu_scratch_reserve,
};

int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

smelt_status cuda_backend_new(struct backend **out, int device, struct err *e) {
    *out = NULL;
    int n = cuda_device_count();
    if (n == 0) return err_set(e, SMELT_ERR_DEVICE, "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)");
    if (device < 0 || device >= n)
        return err_set(e, SMELT_ERR_INVALID, "CUDA device %d does not exist (%d visible)", device, n);
    cudaError_t rc = cudaSetDevice(device);
    if (rc != cudaSuccess) return err_set(e, SMELT_ERR_DEVICE, "cudaSetDevice(%d): %s", device, cudaGetErrorString(rc));
    struct cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    bk_base_init(&cb->base, &cuda_ops);
    cb->device = device;
    rc = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (rc != cudaSuccess) {
        bk_base_free(&cb->base);
        free(cb);
        return err_set(e, SMELT_ERR_DEVICE, "cudaStreamCreate: %s", cudaGetErrorString(rc));
    }
    if (cublasCreate(&cb->cublas) != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(cb->stream);
        bk_base_free(&cb->base);
        free(cb);
        return err_set(e, SMELT_ERR_DEVICE, "cublasCreate failed");
    }
    cublasSetStream(cb->cublas, cb->stream);
    /* the decode epilogue's buffers (small; without them decode takes the plain path) */
    if (cudaMalloc(&cb->prep.buf, cuda_mmv_scratch_bytes(PREP_MAX_K, CUDA_MMV_MAX_N)) != cudaSuccess ||
        cudaMalloc((void **)&cb->prep.ss, sizeof(float) * CUDA_MMV_MAX_N * (PREP_MAX_K / 32)) != cudaSuccess ||
        cudaMalloc((void **)&cb->prep.cnt, sizeof(unsigned) * (PREP_MAX_K / 32)) != cudaSuccess ||
        cudaMemset(cb->prep.cnt, 0, sizeof(unsigned) * (PREP_MAX_K / 32)) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(cb->prep.buf);
        cudaFree(cb->prep.ss);
        cudaFree(cb->prep.cnt);
        memset(&cb->prep, 0, sizeof cb->prep);
    }
    /* the attention output's int8 form (without it, W_o quantizes its input itself) */
    if (cudaMalloc(&cb->att_q.buf, cuda_mmv_scratch_bytes(ATT_Q_MAX_K, CUDA_MMV_MAX_N)) != cudaSuccess) {
        cudaGetLastError();
        cb->att_q.buf = NULL;
    }
    cudaDeviceSynchronize(); /* the counters' memsets, before any kernel on cb->stream */
    const char *ng = getenv("SMELT_NO_GRAPH");
    cb->no_graph = ng && *ng && strcmp(ng, "0") != 0;
    const char *mq = getenv("SMELT_MMQ_MAX_ROWS");
    cb->mmq_rows_fixed = mq && *mq;
    cb->mmq_max_rows = cb->mmq_rows_fixed ? strtoll(mq, NULL, 10) : MMQ_MAX_ROWS;
    bool bad_tile = false;
    mmtune_init(&cb->tune);
    mmtune_env_parse(getenv("SMELT_NO_TUNE"), getenv("SMELT_MMQ_TILE"), cuda_mmq_tile_count(), &cb->tune_env,
                     &bad_tile);
    if (bad_tile)
        log_warn("SMELT_MMQ_TILE=%s is not a tile number (0..%d): ignored", getenv("SMELT_MMQ_TILE"),
                 cuda_mmq_tile_count() - 1);
    int major = 0;
    const char *np = getenv("SMELT_NO_PDL");
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9 &&
        !(np && *np && strcmp(np, "0") != 0))
        cuda_pdl_on = 1;
    const char *pf = getenv("SMELT_PROFILE");
    void *gh = NULL;
    if (pf && *pf && strcmp(pf, "0") != 0 && cudaEventCreate(&cb->prof_start) == cudaSuccess &&
        cudaHostAlloc(&gh, sizeof(int), cudaHostAllocMapped) == cudaSuccess &&
        cudaHostGetDevicePointer((void **)&cb->gate_d, gh, 0) == cudaSuccess) {
        cb->gate_h = gh;
        *cb->gate_h = 1;
        cb->prof = true;
        cb->no_graph = true; /* events per kernel need eager launches */
    }
    cb->capturing = -1;
    *out = &cb->base;
    return SMELT_OK;
}

uint64_t cuda_backend_weight_bytes(const struct backend *b) {
    return ((const struct cuda_backend *)b)->weight_bytes;
}

const struct mmtune_ent *cuda_backend_mm_entry(const struct backend *b, uint32_t type, int64_t rows, int64_t k,
                                               int64_t n) {
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    const struct mmtune_key key = {type, rows, k, mmtune_bucket(n)};
    return key.bucket >= 0 ? mmtune_find(&cb->tune, &key) : NULL;
}

smelt_status cuda_mem_info(int device, uint64_t *free_b, uint64_t *total_b, struct err *e) {
    size_t f = 0, t = 0;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess) rc = cudaMemGetInfo(&f, &t);
    if (rc != cudaSuccess) return err_set(e, SMELT_ERR_DEVICE, "cudaMemGetInfo: %s", cudaGetErrorString(rc));
    *free_b = f;
    *total_b = t;
    return SMELT_OK;
}
