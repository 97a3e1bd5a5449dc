/* The CUDA backend's memory (see cuda_backend.c for the map of the backend's files):
 *   - weights: cu_weight_bind uploads a matrix into the mmv kernels' repacked layout
 *     (cuda_mmv.h; t->extra points at the descriptor) or, for a type without a GPU kernel,
 *     dequantized to F16 on the host (logged once per type); vectors as F32 copies. The
 *     backend keeps every allocation to free it, and their bytes (cuda_backend_weight_bytes);
 *   - buffers (the KV caches): plain zeroed allocations;
 *   - the scratch stack: per-step device memory, emptied at step_begin and rewound per
 *     layer (mark/release), grown in chunks, merged into one chunk (dropping the recorded
 *     graphs) when it grew; a step of the same shape sees the same addresses;
 *   - pinned staging and transfers: uploads go through pinned memory as asynchronous
 *     copies, a step's input uploads gathered into one copy; downloads land in pinned
 *     memory and are copied out at sync;
 *   - memory planning (engine/memplan.h): free/total memory, the weights' device bytes
 *     before the upload, the scratch high-water mark and its reservation. */
#include "backend/cuda/cuda_backend_int.h"

#include <stdlib.h>
#include <string.h>

#include "util/half.h"
#include "util/log.h"

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

void *cu_stack_alloc(struct cuda_backend *cb, size_t n) {
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

static void stack_reset(struct cuda_backend *cb) {
    if (cb->n_chunks > 1) { /* merge into one chunk of the total size */
        cu_graphs_clear(cb); /* recorded steps point into the chunks being freed */
        size_t total = 0;
        for (int i = 0; i < cb->n_chunks; i++) total += cb->chunks[i].cap;
        cudaStreamSynchronize(cb->ctx.stream);
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

void *cu_scratch(struct cuda_backend *cb, size_t n) {
    void *p = cu_stack_alloc(cb, n ? n : 1);
    if (!p) bk_fail(&cb->base, SMELT_ERR_NOMEM, "GPU scratch: out of device memory (%zu bytes)", n);
    return p;
}

/* ---- pinned staging ---- */

static unsigned char *pin_take(struct cuda_backend *cb, size_t n, size_t *off) {
    size_t need = (n + 63) & ~(size_t)63;
    if (cb->pin_used + need > cb->pin_cap) {
        /* Grow: wait for the copies in flight from the old buffer, finish pending downloads. */
        if (cb->prof) *cb->gate_h = 1;
        cudaStreamSynchronize(cb->ctx.stream);
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

/* *out = a plain device copy of t's bytes, recorded for cu_free. */
static smelt_status plain_copy(struct cuda_backend *cb, const struct tensor *t, const char *name, void **out,
                               struct err *e) {
    size_t n = tensor_nbytes(t);
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, n);
    if (rc == cudaSuccess) rc = cudaMemcpy(p, t->data, n, cudaMemcpyHostToDevice);
    if (rc != cudaSuccess) {
        cudaFree(p);
        return err_set(e, SMELT_ERR_DEVICE, "tensor %s: uploading %zu bytes: %s", name, n, cudaGetErrorString(rc));
    }
    if (!push_ptr(&cb->dev, &cb->n_dev, &cb->cap_dev, p)) {
        cudaFree(p);
        return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    cb->weight_bytes += n;
    *out = p;
    return SMELT_OK;
}

smelt_status cu_weight_bind(struct backend *b, struct tensor *t, struct err *e) {
    struct cuda_backend *cb = cu_enter(b);
    const char *name = t->name ? t->name : "?";
    if (!tensor_is_contiguous(t))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "tensor %s: not contiguous", name);
    /* Vectors (the loader already made them F32), and F32 matrices with rows no product
     * kernel takes (the conv taps, (d_conv, C), read by bk_ssm_conv): plain copies. Such a
     * matrix given to a product fails there, naming it (cu_qw_of). The shared expert's gate
     * ffn_gate_inp_shexp ((n_embd) or (n_embd, 1), a one-row product in qwen35moe /
     * qwen3next) is bound as a one-row F32 weight instead: the same plain bytes at t->data,
     * and a product may take it. Only that tensor, until the one-row-weight binding of every
     * vector has run on a GPU (2026-12-03: emulator only). */
    const bool vec = t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1;
    const bool as_weight = vec && t->type == QT_F32 && cuda_mmv_supported(QT_F32, t->ne[0]) &&
                           t->name && strstr(t->name, "ffn_gate_inp_shexp");
    if ((vec && !as_weight) ||
        (t->type == QT_F32 && !cuda_mmv_supported(QT_F32, t->ne[0]))) {
        void *p = NULL;
        smelt_status st = plain_copy(cb, t, name, &p, e);
        if (st != SMELT_OK) return st;
        t->data = p;
        t->backend = b;
        return SMELT_OK;
    }
    struct cuda_qweight *qw = calloc(1, sizeof *qw);
    if (!qw) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    int64_t k = t->ne[0], rows = tensor_nrows(t);
    smelt_status st;
    if (cuda_mmv_supported(t->type, k)) {
        st = cuda_qweight_upload(&cb->ctx, qw, t->type, t->data, rows, k, e);
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
        st = cuda_qweight_upload(&cb->ctx, qw, QT_F16, h, rows, k, e);
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

smelt_status cu_buffer_alloc(struct backend *b, struct tensor *t, struct err *e) {
    cu_enter(b);
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

void cu_buffer_free(struct backend *b, struct tensor *t) {
    cu_enter(b);
    cudaFree(t->data);
    t->data = NULL;
}

/* ---- step, scratch, transfers ---- */

void cu_step_begin(struct backend *b) {
    struct cuda_backend *cb = cu_enter(b);
    stack_reset(cb);
    cb->prep.valid = false;
    cb->pin_used = 0;
    cb->n_dl = 0;
    cb->up.defer = true;
    cb->up.dev0 = NULL;
    if (cb->prof) {
        cb->n_pev = 0;
        *cb->gate_h = 0;
        cuda_gate(&cb->ctx, cb->gate_d, 2000000000ull);
        cudaEventRecord(cb->prof_start, cb->ctx.stream);
    }
}

void *cu_scratch_alloc(struct backend *b, size_t nbytes) { return cu_stack_alloc(cu_enter(b), nbytes ? nbytes : 1); }

size_t cu_scratch_mark(struct backend *b) {
    struct cuda_backend *cb = cu_of(b);
    if (!cb->n_chunks) return 0;
    return ((size_t)cb->cur << MARK_SHIFT) | cb->chunks[cb->cur].used;
}

void cu_scratch_release(struct backend *b, size_t mark) {
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
                                     cb->ctx.stream);
    if (rc != cudaSuccess) CU_FAIL(cb, rc, "upload");
    cb->ctx.pdl_fence = 1;
    cb->up.dev0 = NULL;
}

/* The end of the input phase: the run goes out, later uploads are copied at once. */
void cu_up_flush(struct cuda_backend *cb) {
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

void cu_upload(struct backend *b, struct tensor *dst, const void *src, size_t nbytes) {
    struct cuda_backend *cb = cu_enter(b);
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
    cudaError_t rc = cudaMemcpyAsync(d, p, nbytes, cudaMemcpyHostToDevice, cb->ctx.stream);
    if (rc != cudaSuccess) CU_FAIL(cb, rc, "upload");
    cb->ctx.pdl_fence = 1;
}

void cu_download(struct backend *b, void *dst, const struct tensor *src, size_t nbytes) {
    struct cuda_backend *cb = cu_enter(b);
    if (!cu_ok(cb)) return;
    size_t off;
    unsigned char *p = pin_take(cb, nbytes, &off);
    if (!p) {
        bk_fail(b, SMELT_ERR_NOMEM, "pinned staging: out of memory (%zu bytes)", nbytes);
        return;
    }
    cudaError_t rc = cudaMemcpyAsync(p, src->data, nbytes, cudaMemcpyDeviceToHost, cb->ctx.stream);
    cb->ctx.pdl_fence = 1;
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
    cu_prof_mark(cb, nbytes, "download");
}

smelt_status cu_sync(struct backend *b, struct err *e) {
    struct cuda_backend *cb = cu_enter(b);
    cu_up_flush(cb);
    if (cb->prof) *cb->gate_h = 1;
    cudaError_t rc = cudaStreamSynchronize(cb->ctx.stream);
    if (rc != cudaSuccess) CU_FAIL(cb, rc, "GPU step");
    if (cb->prof && cu_ok(cb)) cu_prof_collect(cb);
    if (cu_ok(cb))
        for (int i = 0; i < cb->n_dl; i++) memcpy(cb->dl[i].dst, cb->pin + cb->dl[i].off, cb->dl[i].n);
    cb->n_dl = 0;
    (void)e;
    return SMELT_OK; /* bk_sync turns the sticky status into the return value */
}
/* ---- memory planning (bk_mem_info, engine/memplan.h) ---- */

bool cu_mem_info(struct backend *b, uint64_t *free_b, uint64_t *total_b) {
    size_t f = 0, t = 0;
    if (cudaSetDevice(cu_of(b)->ctx.device) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
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
uint64_t cu_weight_bytes(struct backend *b, uint32_t type, const int64_t ne[TENSOR_MAX_DIMS]) {
    (void)b;
    uint64_t rows = (uint64_t)ne[1] * (uint64_t)ne[2] * (uint64_t)ne[3];
    if (rows == 1) return (uint64_t)ne[0] * sizeof(float);
    if (!cuda_mmv_supported(type, ne[0])) /* F16; F32 rows as they are (cu_weight_bind) */
        return (uint64_t)ne[0] * rows * (type == QT_F32 ? 4 : 2);
    uint64_t bytes = qtype_row_size(type, ne[0]) * rows;
    const struct qtype_info *qi = qtype_get(type);
    if (type != QT_F32 && type != QT_F16 && type != QT_BF16 && qi && qi->type_size)
        bytes += bytes / qi->type_size * 4;
    return bytes;
}

size_t cu_scratch_peak(struct backend *b) { return cu_of(b)->peak; }

/* One chunk of at least nbytes (and of at least what the stack holds now). */
smelt_status cu_scratch_reserve(struct backend *b, size_t nbytes, struct err *e) {
    struct cuda_backend *cb = cu_enter(b);
    size_t total = 0;
    for (int i = 0; i < cb->n_chunks; i++) total += cb->chunks[i].cap;
    size_t cap = total > nbytes ? total : nbytes;
    cap = (cap + SCRATCH_ALIGN - 1) & ~(size_t)(SCRATCH_ALIGN - 1);
    if (cap == 0) cap = SCRATCH_ALIGN;
    cudaStreamSynchronize(cb->ctx.stream);
    cu_graphs_clear(cb); /* recorded steps may point at the old chunks or at freed buffers */
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
uint64_t cuda_backend_weight_bytes(const struct backend *b) {
    return ((const struct cuda_backend *)b)->weight_bytes;
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
