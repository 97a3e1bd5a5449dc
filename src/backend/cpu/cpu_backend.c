/* The CPU backend: host memory, a per-step scratch stack, and the op vtable.
 *
 * Weights stay where the GGUF mapping put them (weight_bind only checks the type); a
 * matrix gets a repacked copy for the decode kernels at its first matmul (cpu_repacked).
 * Scratch tensors come from a stack (util/arena.h) that is emptied at each step_begin
 * and rewound per layer (mark/release), so a step costs no malloc once the stack has
 * grown to the step's peak. Ops run synchronously; sync only reports the sticky error. */
#include "backend/cpu/cpu_backend.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_matmul.h"
#include "util/array.h"
#include "util/half.h"

/* ---- threads ---- */

struct par_job {
    cpu_range_fn fn;
    void *ctx;
    int64_t n, nt; /* items, threads used */
};

static void par_task(void *vctx, int ith, int nth) {
    struct par_job *j = vctx;
    (void)nth;
    if (ith >= j->nt) return;
    int64_t i0 = j->n * ith / j->nt, i1 = j->n * (ith + 1) / j->nt;
    if (i1 > i0) j->fn(j->ctx, ith, i0, i1);
}

/* Static split into equal ranges: every op's items cost about the same (rows of a norm,
 * tokens of RoPE, (row, KV head) pairs of attention at similar lengths). Work too small
 * to share runs on the caller without waking the pool. */
void cpu_parallel(struct cpu_backend *cb, cpu_range_fn fn, void *ctx, int64_t n,
                  int64_t min_chunk) {
    if (n <= 0) return;
    if (min_chunk < 1) min_chunk = 1;
    int64_t nt = (n + min_chunk - 1) / min_chunk;
    if (nt > cb->n_threads) nt = cb->n_threads;
    if (nt <= 1) {
        fn(ctx, 0, 0, n);
        return;
    }
    struct par_job j = {fn, ctx, n, nt};
    cpu_pool_run(cb->pool, par_task, &j);
}

/* ---- scratch ---- */

void *cpu_scratch(struct cpu_backend *cb, size_t nbytes) {
    void *p = arena_alloc(&cb->scratch, nbytes);
    if (!p) bk_fail(&cb->base, SMELT_ERR_NOMEM, "CPU scratch: out of memory (%zu bytes)", nbytes);
    return p;
}

/* ---- small kernels shared by the op files ---- */

void cpu_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n) {
    switch (type) {
    case QT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case QT_F16:
        cpu_vec_get()->from_f16(src, dst, n);
        return;
    case QT_BF16: {
        const uint16_t *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(h[i]);
        return;
    }
    default: {
        const struct qtype_info *qi = qtype_get(type);
        qi->dequantize(src, dst, n); /* presence checked at bind time */
        return;
    }
    }
}

/* ---- reference matmul ---- */

struct mm_ctx {
    struct cpu_backend *cb;
    struct tensor *dst;
    const struct tensor *w, *x;
    float *rowbuf; /* (n_in) per thread, for dequantized weight rows */
};

static void mm_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct mm_ctx *c = vctx;
    const struct tensor *w = c->w, *x = c->x;
    int64_t n_in = w->ne[0], n = x->ne[1];
    float *row = w->type == QT_F32 ? NULL : c->rowbuf + (size_t)ith * (size_t)n_in;
    for (int64_t o = i0; o < i1; o++) {
        const void *wr = tensor_row(w, o, 0, 0);
        const float *wf = wr;
        if (row) {
            cpu_row_to_f32(w->type, wr, row, n_in);
            wf = row;
        }
        for (int64_t j = 0; j < n; j++) {
            const float *xr = tensor_row(x, j, 0, 0);
            float *dr = tensor_row(c->dst, j, 0, 0);
            dr[o] = c->cb->vec->dot_f32(wf, xr, n_in);
        }
    }
}

void cpu_op_matmul_ref(struct backend *b, struct tensor *dst, const struct tensor *w,
                       const struct tensor *x) {
    struct mm_ctx c = {cpu_of(b), dst, w, x, NULL};
    c.rowbuf = cpu_scratch(c.cb, (size_t)c.cb->n_threads * (size_t)w->ne[0] * sizeof(float));
    if (!c.rowbuf) return;
    cpu_parallel(c.cb, mm_range, &c, w->ne[1], 16);
}

/* What t->extra of a weight holds once the CPU backend has run a matmul on it: the
 * repacked copies (cpu_matmul.h) of its matrices, one per expert of a 3D tensor; n = 0 when
 * there are none (no repacked kernel for the type, or no memory: the file layout runs,
 * with the same results). */
struct cpu_repacked {
    int64_t n;
    struct cpu_rweight *m[];
};

/* Matrix e of w (an expert of a 3D tensor; 0 for a matrix), repacked. The copies are made
 * at the first matmul rather than at bind: a tensor bound as a matrix may only ever feed
 * get_rows (an untied token embedding), and copying it would be waste. t->extra is the
 * backend's own cache field, so it is set through the const pointer. NULL: none. */
const struct cpu_rweight *cpu_repacked(struct cpu_backend *cb, const struct tensor *w, int64_t e) {
    const struct cpu_repacked *rp = w->extra;
    if (!rp) {
        const struct cpu_kernel *kn = cpu_matmul_kernel(w->type, cpu_isa_best());
        const bool can = kn && kn->gemv && w->ne[3] == 1 && tensor_is_contiguous(w);
        int64_t n = can ? w->ne[2] : 0;
        struct cpu_repacked *h = calloc(1, sizeof *h + (size_t)n * sizeof h->m[0]);
        if (!h || !array_grow((void **)&cb->rws, &cb->cap_rws, cb->n_rws + 1, sizeof *cb->rws)) {
            free(h);
            return NULL;
        }
        cb->rws[cb->n_rws++] = h;
        for (int64_t i = 0; i < n; i++) {
            struct err er;
            if (cpu_matmul_repack(cb->pool, cpu_isa_best(), w->type,
                                  (const char *)w->data + i * w->nb[2], w->ne[1], w->ne[0],
                                  &h->m[i], &er) != SMELT_OK || !h->m[i]) {
                for (int64_t j = 0; j < i; j++) cpu_rweight_free(h->m[j]);
                n = 0;
                break;
            }
        }
        h->n = n;
        ((struct tensor *)w)->extra = h;
        rp = h;
    }
    return e < rp->n ? rp->m[e] : NULL;
}

void cpu_op_matmul(struct backend *b, struct tensor *dst, const struct tensor *w,
                   const struct tensor *x) {
    struct cpu_backend *cb = cpu_of(b);
    if (cb->exact || !tensor_is_contiguous(w) || !tensor_is_contiguous(x) ||
        !tensor_is_contiguous(dst)) {
        cpu_op_matmul_ref(b, dst, w, x);
        return;
    }
    struct err e;
    const struct cpu_rweight *rw = cpu_repacked(cb, w, 0);
    smelt_status st = rw ? cpu_matmul_rw(cb->pool, rw, x->data, x->ne[1], dst->data,
                                         &cb->mm_scratch, &e)
                         : cpu_matmul(cb->pool, w->type, w->data, w->ne[1], w->ne[0], x->data,
                                      x->ne[1], dst->data, &cb->mm_scratch, &e);
    arena_reset(&cb->mm_scratch);
    if (st != SMELT_OK) bk_fail(b, st, "%s: %s", w->name ? w->name : "matmul", e.msg);
}

/* ---- vtable ---- */

static void cpu_free(struct backend *b) {
    struct cpu_backend *cb = cpu_of(b);
    arena_free(&cb->scratch);
    arena_free(&cb->mm_scratch);
    for (size_t i = 0; i < cb->n_rws; i++) {
        for (int64_t j = 0; j < cb->rws[i]->n; j++) cpu_rweight_free(cb->rws[i]->m[j]);
        free(cb->rws[i]);
    }
    free(cb->rws);
    for (int i = 0; i < 2; i++) {
        free(cb->rope[i].pos);
        free(cb->rope[i].tab);
        free(cb->rope[i].ff);
    }
    cpu_pool_free(cb->pool);
    bk_base_free(b);
    free(cb);
}

static smelt_status cpu_weight_bind(struct backend *b, struct tensor *t, struct err *e) {
    const struct qtype_info *qi = qtype_get(t->type);
    if (!qi)
        return err_set(e, SMELT_ERR_UNSUPPORTED, "tensor %s: unknown type id %u",
                       t->name ? t->name : "?", t->type);
    if (!cpu_matmul_supports(t->type) || !qi->dequantize)
        return err_set(e, SMELT_ERR_UNSUPPORTED, "tensor %s: type %s is not supported on CPU",
                       t->name ? t->name : "?", qi->name);
    t->backend = b;
    return SMELT_OK;
}

static smelt_status cpu_buffer_alloc(struct backend *b, struct tensor *t, struct err *e) {
    size_t n = tensor_nbytes(t);
    size_t rounded = (n + 63) & ~(size_t)63;
    if (rounded < n) return err_set(e, SMELT_ERR_NOMEM, "buffer of %zu bytes", n);
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) return err_set(e, SMELT_ERR_NOMEM, "out of memory allocating %zu bytes", n);
    memset(p, 0, rounded);
    t->data = p;
    t->backend = b;
    return SMELT_OK;
}

static void cpu_buffer_free(struct backend *b, struct tensor *t) {
    (void)b;
    free(t->data);
}

static void cpu_step_begin(struct backend *b) { arena_reset(&cpu_of(b)->scratch); }

static void *cpu_scratch_alloc(struct backend *b, size_t nbytes) {
    return arena_alloc(&cpu_of(b)->scratch, nbytes);
}

static size_t cpu_scratch_mark(struct backend *b) { return arena_mark(&cpu_of(b)->scratch); }

static void cpu_scratch_release(struct backend *b, size_t mark) {
    arena_release(&cpu_of(b)->scratch, mark);
}

static size_t cpu_scratch_peak(struct backend *b) { return arena_peak(&cpu_of(b)->scratch); }

static smelt_status cpu_scratch_reserve(struct backend *b, size_t nbytes, struct err *e) {
    if (!arena_reserve(&cpu_of(b)->scratch, nbytes))
        return err_set(e, SMELT_ERR_NOMEM, "CPU scratch: cannot reserve %zu bytes", nbytes);
    return SMELT_OK;
}

static void cpu_upload(struct backend *b, struct tensor *dst, const void *src, size_t nbytes) {
    (void)b;
    memcpy(dst->data, src, nbytes);
}

static void cpu_download(struct backend *b, void *dst, const struct tensor *src, size_t nbytes) {
    (void)b;
    memcpy(dst, src->data, nbytes);
}

static smelt_status cpu_sync(struct backend *b, struct err *e) {
    (void)b;
    (void)e;
    return SMELT_OK;
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .features = BK_FEAT_ATTN_SINKS | BK_FEAT_SWIGLU_OAI | BK_FEAT_MOE_BIAS | BK_FEAT_YARN_UNROUNDED |
                BK_FEAT_GLU_ROW_GATE | BK_FEAT_LAYER_NORM | BK_FEAT_ACT | BK_FEAT_NON_CAUSAL,
    .weight_bind = cpu_weight_bind,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .step_begin = cpu_step_begin,
    .scratch_alloc = cpu_scratch_alloc,
    .scratch_mark = cpu_scratch_mark,
    .scratch_release = cpu_scratch_release,
    .upload = cpu_upload,
    .download = cpu_download,
    .sync = cpu_sync,
    .get_rows = cpu_op_get_rows,
    .rms_norm = cpu_op_rms_norm,
    .layer_norm = cpu_op_layer_norm,
    .act = cpu_op_act,
    .rope = cpu_op_rope,
    .matmul = cpu_op_matmul,
    .add = cpu_op_add,
    .scale = cpu_op_scale,
    .glu = cpu_op_glu,
    .norm_gate = cpu_op_norm_gate,
    .softcap = cpu_op_softcap,
    .softmax = cpu_op_softmax,
    .kv_store = cpu_op_kv_store,
    .attention = cpu_op_attention,
    .moe_route = cpu_op_moe_route,
    .moe_ffn = cpu_op_moe_ffn,
    .ssm_conv = cpu_op_ssm_conv,
    .gated_delta_net = cpu_op_gated_delta_net,
    .copy = cpu_op_copy,
    .logits_topk = cpu_op_logits_topk,
    .scratch_peak = cpu_scratch_peak,
    .scratch_reserve = cpu_scratch_reserve,
};

void cpu_backend_set_exact(struct backend *b, bool exact) { cpu_of(b)->exact = exact; }

smelt_status cpu_backend_new(struct backend **out, int n_threads, struct err *e) {
    *out = NULL;
    struct cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return err_set(e, SMELT_ERR_NOMEM, "CPU backend: out of memory");
    bk_base_init(&cb->base, &cpu_ops);
    arena_init(&cb->scratch);
    arena_init(&cb->mm_scratch);
    smelt_status st = cpu_pool_new(&cb->pool, n_threads, e);
    if (st != SMELT_OK) {
        bk_base_free(&cb->base);
        free(cb);
        return st;
    }
    cb->n_threads = cpu_pool_size(cb->pool);
    cb->vec = cpu_vec_get();
    *out = &cb->base;
    return SMELT_OK;
}
