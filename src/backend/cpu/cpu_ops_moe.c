/* CPU mixture-of-experts ops: the router (bk_moe_route) and the expert FFN (bk_moe_ffn).
 *
 * Router: rows in parallel; each row is normed as cpu_op_rms_norm does, dotted with every
 * router row by the vector kernel's f32 dot (one fixed order per row, so a row's logits,
 * hence its experts, are the same bits whatever else shares the step), then the k largest
 * logits and their weights (in double).
 *
 * Expert FFN: the ids are in host memory, so the step's (row, slot) pairs are grouped by
 * expert here (a counting sort). The rows routed to each active expert are gathered into
 * one block, and a group of experts runs as two cpu_matmul_batch calls (the int8-
 * activation kernels; the reference matmul under cpu_backend_set_exact): gate and up of
 * every expert in one fork-join, then down. An expert's weights therefore stream once
 * per step however many rows chose it: a grouped matmul in a prefill chunk, a
 * matrix-vector product over the selected experts only for a decode row. An expert's
 * biases (gpt-oss) are added to its gate/up and down outputs. Each row's expert outputs are
 * accumulated, times their weights, into a zeroed buffer in increasing expert id (the order
 * transformers sums in), then written to dst or added to it. A row's arithmetic depends
 * on the other rows only through the row count each expert's matmuls see (the kernels
 * are bitwise row-count invariant for the legacy types and on the scalar path; see
 * docs/forward.md for the K-quant prefill/decode kernels). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_matmul.h"

/* ---- router ---- */

struct route_ctx {
    struct tensor *ids, *weights;
    const struct tensor *x, *router, *bias;
    const struct prenorm *pre;
    enum moe_gating gating;
    float *buf; /* per thread: n_embd + n_expert floats */
    const struct cpu_vec *vec;
};

static void route_range(void *vctx, int ith, int64_t r0, int64_t r1) {
    struct route_ctx *c = vctx;
    const int64_t n_embd = c->x->ne[0], n_exp = c->router->ne[1], k = c->ids->ne[0];
    float *h = c->buf + (size_t)ith * (size_t)(n_embd + n_exp), *lg = h + n_embd;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = tensor_row(c->x, r, 0, 0);
        if (c->pre) { /* as cpu_op_rms_norm computes it */
            const float inv = cpu_rms_inv(x, n_embd, c->pre->eps);
            const float *w = c->pre->w ? c->pre->w->data : NULL;
            for (int64_t i = 0; i < n_embd; i++)
                h[i] = w ? x[i] * inv * w[i] : x[i] * inv;
            x = h;
        }
        for (int64_t e = 0; e < n_exp; e++) {
            lg[e] = c->vec->dot_f32(tensor_row(c->router, e, 0, 0), x, n_embd);
            if (c->bias) lg[e] += ((const float *)c->bias->data)[e];
        }
        /* the k largest, largest first, ties to the lower id (a NaN logit loses to any
         * number); the ones taken are those already in ids */
        int32_t *id = tensor_row(c->ids, r, 0, 0);
        float *wt = tensor_row(c->weights, r, 0, 0);
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < n_exp; e++) {
                bool taken = false;
                for (int64_t q = 0; q < j && !taken; q++)
                    taken = id[q] == e;
                if (!taken && (best < 0 || lg[e] > lg[best] || (isnan(lg[best]) && !isnan(lg[e]))))
                    best = e;
            }
            id[j] = (int32_t)best;
        }
        /* weights: exp(l - max) over all (MOE_SOFTMAX) or over the k (MOE_SOFTMAX_TOPK) */
        double mx = lg[id[0]], z = 0;
        if (c->gating == MOE_SOFTMAX) {
            for (int64_t e = 0; e < n_exp; e++)
                mx = lg[e] > mx ? lg[e] : mx;
            for (int64_t e = 0; e < n_exp; e++)
                z += exp((double)lg[e] - mx);
        } else {
            for (int64_t j = 0; j < k; j++)
                z += exp((double)lg[id[j]] - mx);
        }
        for (int64_t j = 0; j < k; j++)
            wt[j] = (float)(exp((double)lg[id[j]] - mx) / z);
    }
}

void cpu_op_moe_route(struct backend *b, struct tensor *ids, struct tensor *weights,
                      const struct tensor *x, const struct tensor *router,
                      const struct tensor *bias, enum moe_gating gating,
                      const struct prenorm *pre, const struct tensor *sh_gate_inp,
                      struct tensor *sh_logit) {
    struct cpu_backend *cb = cpu_of(b);
    if (sh_gate_inp) bk_matmul_group(b, 1, &sh_logit, &sh_gate_inp, NULL, x, pre);
    const int64_t per = x->ne[0] + router->ne[1];
    struct route_ctx c = {ids, weights, x, router, bias, pre, gating, NULL, cb->vec};
    size_t mark = bk_scratch_mark(b);
    c.buf = cpu_scratch(cb, (size_t)cb->n_threads * (size_t)per * sizeof(float));
    if (c.buf) cpu_parallel(cb, route_range, &c, x->ne[1], 4);
    bk_scratch_release(b, mark);
}

/* ---- expert FFN ---- */

/* Moves rows between the step's rows and an expert's block of c rows. Gather: row i of
 * the block = row[i] of src (parallel over block rows). Scatter: row[i] of dst +=
 * weight[i] * row i of the block, for i in order (parallel over columns, so a row listed
 * twice is still summed in order and no two threads write one element). */
struct move_ctx {
    const int32_t *row;
    const float *weight;
    const float *src;
    float *dst;
    int64_t n_embd, c;
};

static void gather_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct move_ctx *m = vctx;
    (void)ith;
    const size_t n = (size_t)m->n_embd;
    for (int64_t i = i0; i < i1; i++)
        memcpy(m->dst + (size_t)i * n, m->src + (size_t)m->row[i] * n, n * sizeof(float));
}

static void scatter_range(void *vctx, int ith, int64_t d0, int64_t d1) {
    struct move_ctx *m = vctx;
    (void)ith;
    const size_t n = (size_t)m->n_embd;
    for (int64_t i = 0; i < m->c; i++) {
        float *y = m->dst + (size_t)m->row[i] * n;
        const float *s = m->src + (size_t)i * n, w = m->weight[i];
        for (int64_t d = d0; d < d1; d++)
            y[d] += w * s[d];
    }
}

/* Per-expert biases (gpt-oss): row i of a block of rows gets bias row expert[i] of each of
 * up to two bias tensors (parallel over block rows). */
struct bias_ctx {
    const int32_t *expert; /* the expert of each block row */
    float *y[2];
    const struct tensor *b[2];
    int64_t width;
};

static void bias_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct bias_ctx *c = vctx;
    (void)ith;
    for (int j = 0; j < 2 && c->b[j]; j++)
        for (int64_t i = i0; i < i1; i++) {
            float *y = c->y[j] + (size_t)(i * c->width);
            const float *bias = tensor_row(c->b[j], c->expert[i], 0, 0);
            for (int64_t d = 0; d < c->width; d++)
                y[d] += bias[d];
        }
}

/* Items per thread worth waking the pool for: about 64K floats moved. */
static int64_t move_chunk(int64_t floats_per_item) {
    return 65536 / (floats_per_item > 0 ? floats_per_item : 1) + 1;
}

/* An F32 (ne0, ne1) tensor over host memory. */
static struct tensor f32_view(float *data, int64_t ne0, int64_t ne1) {
    struct tensor t;
    tensor_init(&t, QT_F32, ne0, ne1, 1, 1);
    t.data = data;
    return t;
}

/* Runs the products: one cpu_matmul_batch (one fork-join for all of them), or under
 * cpu_backend_set_exact the reference matmul on each. */
static void run_products(struct backend *b, const struct cpu_mm *mm, int n, const char *name) {
    struct cpu_backend *cb = cpu_of(b);
    if (!cb->exact) {
        struct err e;
        smelt_status st = cpu_matmul_batch(cb->pool, mm, n, &cb->mm_scratch, &e);
        arena_reset(&cb->mm_scratch);
        if (st != SMELT_OK) bk_fail(b, st, "%s: %s", name, e.msg);
        return;
    }
    for (int i = 0; i < n && b->status == SMELT_OK; i++) {
        struct tensor w, x = f32_view((float *)mm[i].x, mm[i].k, mm[i].n),
                         y = f32_view(mm[i].y, mm[i].rows, mm[i].n);
        tensor_init(&w, mm[i].wtype, mm[i].k, mm[i].rows, 1, 1);
        w.data = (void *)mm[i].w;
        size_t mark = bk_scratch_mark(b); /* the reference's row buffers */
        cpu_op_matmul_ref(b, &y, &w, &x);
        bk_scratch_release(b, mark);
    }
}

/* (row, expert) pairs a group of experts runs at once (more when one expert has more
 * rows): the products of a group share one fork-join; the cap bounds the scratch
 * (pairs x (2 n_embd + 2 n_ff) floats) of a long prefill. */
#define GROUP_ROWS 1024

void cpu_op_moe_ffn(struct backend *b, struct tensor *dst, const struct tensor *x,
                    const struct moe_experts *w, const struct tensor *ids,
                    const struct tensor *weights, const struct prenorm *pre, bool acc,
                    const struct prenorm *next) {
    struct cpu_backend *cb = cpu_of(b);
    struct tensor *sh = bk_moe_shared_hidden(b, x, w, pre); /* before dst changes */
    const int64_t n_embd = x->ne[0], n = x->ne[1], k = ids->ne[0];
    const int64_t n_ff = w->gate->ne[1], n_exp = w->gate->ne[2], nk = n * k;
    const char *name = w->gate->name ? w->gate->name : "moe_ffn";
    const int32_t *id = ids->data;
    const float *wt = weights->data;
    size_t mark = bk_scratch_mark(b);
    /* the (row, slot) pairs grouped by expert (a counting sort: rows ascend in a group) */
    int64_t *start = cpu_scratch(cb, (size_t)(n_exp + 1) * sizeof(int64_t));
    int64_t *fill = cpu_scratch(cb, (size_t)n_exp * sizeof(int64_t));
    int32_t *row = cpu_scratch(cb, (size_t)nk * sizeof(int32_t));
    int32_t *pe = cpu_scratch(cb, (size_t)nk * sizeof(int32_t)); /* each pair's expert */
    float *rw = cpu_scratch(cb, (size_t)nk * sizeof(float));
    float *y = cpu_scratch(cb, (size_t)(n * n_embd) * sizeof(float));
    if (!start || !fill || !row || !pe || !rw || !y) goto done;
    memset(start, 0, (size_t)(n_exp + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < nk; i++) {
        if (id[i] < 0 || id[i] >= n_exp) {
            bk_fail(b, SMELT_ERR_INTERNAL, "%s: row %lld routed to expert %d of %lld", name,
                    (long long)(i / k), id[i], (long long)n_exp);
            goto done;
        }
        start[id[i] + 1]++;
    }
    /* rows a group of experts runs at once: shapes only (one expert has at most n rows:
     * a row's ids are distinct, as bk_moe_route writes them) */
    const int64_t cap = nk < GROUP_ROWS ? nk : n > GROUP_ROWS ? n : GROUP_ROWS;
    for (int64_t e = 0; e < n_exp; e++) {
        if (start[e + 1] > cap) {
            bk_fail(b, SMELT_ERR_INTERNAL, "%s: expert %lld is listed twice in a row", name,
                    (long long)e);
            goto done;
        }
        start[e + 1] += start[e];
        fill[e] = start[e];
    }
    for (int64_t i = 0; i < nk; i++) {
        int64_t at = fill[id[i]]++;
        row[at] = (int32_t)(i / k);
        pe[at] = id[i];
        rw[at] = wt[i];
    }

    /* x' (the norm of every row, once); the blocks of a group of experts, rows in the
     * grouped order: their inputs, gate and up outputs, down outputs */
    struct tensor xn = *x;
    if (pre) {
        float *h = cpu_scratch(cb, (size_t)(n * n_embd) * sizeof(float));
        if (!h) goto done;
        xn = f32_view(h, n_embd, n);
        cpu_op_rms_norm(b, &xn, x, pre->w, pre->eps);
    }
    float *xe = cpu_scratch(cb, (size_t)(cap * n_embd) * sizeof(float));
    float *g = cpu_scratch(cb, (size_t)(cap * n_ff) * sizeof(float));
    float *u = cpu_scratch(cb, (size_t)(cap * n_ff) * sizeof(float));
    float *ye = cpu_scratch(cb, (size_t)(cap * n_embd) * sizeof(float));
    struct cpu_mm *mm = cpu_scratch(cb, (size_t)(2 * n_exp) * sizeof *mm);
    if (!xe || !g || !u || !ye || !mm) goto done;
    memset(y, 0, (size_t)(n * n_embd) * sizeof(float));
    for (int64_t e0 = 0; e0 < n_exp && b->status == SMELT_OK;) {
        /* experts e0..e1-1: as many as fit in cap rows (at least one) */
        int64_t e1 = e0 + 1;
        while (e1 < n_exp && start[e1 + 1] - start[e0] <= cap)
            e1++;
        const int64_t base = start[e0], c = start[e1] - base;
        if (c == 0) {
            e0 = e1;
            continue;
        }
        struct move_ctx gather = {row + base, NULL, xn.data, xe, n_embd, c};
        cpu_parallel(cb, gather_range, &gather, c, move_chunk(n_embd));
        int n_mm = 0; /* gate and up of each active expert, then down */
        for (int64_t e = e0; e < e1; e++) {
            const int64_t r0 = start[e] - base, ce = start[e + 1] - start[e];
            if (ce == 0) continue;
            const float *xr = xe + r0 * n_embd;
            mm[n_mm++] = (struct cpu_mm){w->gate->type,
                                         (const char *)w->gate->data + e * w->gate->nb[2],
                                         n_ff,
                                         n_embd,
                                         xr,
                                         ce,
                                         g + r0 * n_ff,
                                         cpu_repacked(cb, w->gate, e)};
            mm[n_mm++] = (struct cpu_mm){w->up->type,
                                         (const char *)w->up->data + e * w->up->nb[2],
                                         n_ff,
                                         n_embd,
                                         xr,
                                         ce,
                                         u + r0 * n_ff,
                                         cpu_repacked(cb, w->up, e)};
        }
        run_products(b, mm, n_mm, name);
        if (w->gate_b) {
            struct bias_ctx bc = {pe + base, {g, u}, {w->gate_b, w->up_b}, n_ff};
            cpu_parallel(cb, bias_range, &bc, c, move_chunk(2 * n_ff));
        }
        struct tensor gt = f32_view(g, n_ff, c), ut = f32_view(u, n_ff, c);
        cpu_op_glu(b, &gt, &gt, &ut, w->act);
        n_mm = 0;
        for (int64_t e = e0; e < e1; e++) {
            const int64_t r0 = start[e] - base, ce = start[e + 1] - start[e];
            if (ce == 0) continue;
            mm[n_mm++] = (struct cpu_mm){w->down->type,
                                         (const char *)w->down->data + e * w->down->nb[2],
                                         n_embd,
                                         n_ff,
                                         g + r0 * n_ff,
                                         ce,
                                         ye + r0 * n_embd,
                                         cpu_repacked(cb, w->down, e)};
        }
        run_products(b, mm, n_mm, name);
        if (w->down_b) {
            struct bias_ctx bc = {pe + base, {ye, NULL}, {w->down_b, NULL}, n_embd};
            cpu_parallel(cb, bias_range, &bc, c, move_chunk(n_embd));
        }
        struct move_ctx scatter = {row + base, rw + base, ye, y, n_embd, c};
        cpu_parallel(cb, scatter_range, &scatter, n_embd, move_chunk(c));
        e0 = e1;
    }
    if (b->status != SMELT_OK) goto done;
    struct tensor yt = f32_view(y, n_embd, n);
    if (acc)
        cpu_op_add(b, dst, dst, &yt);
    else
        memcpy(dst->data, y, (size_t)(n * n_embd) * sizeof(float));
done:
    bk_scratch_release(b, mark);
    bk_moe_shared_down(b, dst, w, sh, next);
}
