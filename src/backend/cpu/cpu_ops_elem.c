/* CPU row-wise and element-wise ops: embedding/row gather, RMSNorm, LayerNorm, add, scale,
 * GLU, the gated RMSNorm (norm_gate) and plain activations, soft-capping, softmax. All
 * parallel over rows; none is a bottleneck next to the matmuls (each touches n_embd or n_ff
 * floats per row once). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

/* ---- get_rows ---- */

struct rows_ctx {
    struct tensor *dst;
    const struct tensor *src, *ids;
};

static void get_rows_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct rows_ctx *c = vctx;
    const int32_t *ids = c->ids->data;
    for (int64_t i = i0; i < i1; i++)
        cpu_row_to_f32(c->src->type, tensor_row(c->src, ids[i], 0, 0), tensor_row(c->dst, i, 0, 0),
                       c->src->ne[0]);
}

void cpu_op_get_rows(struct backend *b, struct tensor *dst, const struct tensor *src,
                     const struct tensor *ids) {
    struct rows_ctx c = {dst, src, ids};
    cpu_parallel(cpu_of(b), get_rows_range, &c, ids->ne[0], 4);
}

/* ---- rms_norm ---- */

struct norm_ctx {
    struct tensor *dst;
    const struct tensor *x, *w;
    float eps;
};

/* Row r of a (ne0, ne1, ne2) tensor. */
static inline float *row_at(const struct tensor *t, int64_t r) {
    return tensor_row(t, r % t->ne[1], (r / t->ne[1]) % t->ne[2], r / (t->ne[1] * t->ne[2]));
}

/* 1 / sqrt(mean(x^2) + eps) over n: eight independent double sums (one chain of dependent
 * adds was ~4 cycles per element: 3% of a Gemma 3 prefill, with its per-head q/k norms), in
 * a fixed order. Shared by rms_norm, norm_gate and the MoE router's norm, so they agree to
 * the bit. */
float cpu_rms_inv(const float *x, int64_t n, float eps) {
    double s8[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s8[j] += (double)x[i + j] * x[i + j];
    for (; i < n; i++) s8[0] += (double)x[i] * x[i];
    double ss = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
    return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}

static void rms_norm_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct norm_ctx *c = vctx;
    int64_t n = c->x->ne[0];
    const float *w = c->w ? c->w->data : NULL;
    for (int64_t r = i0; r < i1; r++) {
        const float *x = row_at(c->x, r);
        float *y = row_at(c->dst, r);
        const float inv = cpu_rms_inv(x, n, c->eps);
        if (w)
            for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
        else
            for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv;
    }
}

void cpu_op_rms_norm(struct backend *b, struct tensor *dst, const struct tensor *x,
                     const struct tensor *w, float eps) {
    struct norm_ctx c = {dst, x, w, eps};
    cpu_parallel(cpu_of(b), rms_norm_range, &c, tensor_nrows(x), 8);
}

/* ---- layer_norm ---- */

struct lnorm_ctx {
    struct tensor *dst;
    const struct tensor *x, *w, *b;
    float eps;
};

/* Mean and biased variance in double, two passes (no cancellation for large means). */
static void layer_norm_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct lnorm_ctx *c = vctx;
    int64_t n = c->x->ne[0];
    const float *w = c->w ? c->w->data : NULL, *bias = c->b ? c->b->data : NULL;
    for (int64_t r = i0; r < i1; r++) {
        const float *x = row_at(c->x, r);
        float *y = row_at(c->dst, r);
        double s = 0, ss = 0;
        for (int64_t i = 0; i < n; i++) s += x[i];
        const double mean = s / (double)n;
        for (int64_t i = 0; i < n; i++) ss += ((double)x[i] - mean) * ((double)x[i] - mean);
        const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)c->eps)), m = (float)mean;
        for (int64_t i = 0; i < n; i++) {
            float v = (x[i] - m) * inv;
            if (w) v *= w[i];
            if (bias) v += bias[i];
            y[i] = v;
        }
    }
}

void cpu_op_layer_norm(struct backend *b, struct tensor *dst, const struct tensor *x,
                       const struct tensor *w, const struct tensor *bias, float eps) {
    struct lnorm_ctx c = {dst, x, w, bias, eps};
    cpu_parallel(cpu_of(b), layer_norm_range, &c, tensor_nrows(x), 8);
}

/* ---- add, scale ---- */

struct bin_ctx {
    struct tensor *dst;
    const struct tensor *a, *c;
    float s;
    enum glu_act act;
    const struct cpu_vec *vec;
};

static void add_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct bin_ctx *c = vctx;
    int64_t n = c->a->ne[0];
    bool bcast = tensor_nrows(c->c) == 1;
    for (int64_t r = i0; r < i1; r++) {
        const float *a = row_at(c->a, r);
        const float *v = bcast ? (const float *)c->c->data : row_at(c->c, r);
        float *y = row_at(c->dst, r);
        for (int64_t i = 0; i < n; i++) y[i] = a[i] + v[i];
    }
}

void cpu_op_add(struct backend *b, struct tensor *dst, const struct tensor *a,
                const struct tensor *c) {
    struct bin_ctx ctx = {.dst = dst, .a = a, .c = c};
    cpu_parallel(cpu_of(b), add_range, &ctx, tensor_nrows(a), 16);
}

static void scale_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct bin_ctx *c = vctx;
    int64_t n = c->a->ne[0];
    for (int64_t r = i0; r < i1; r++) {
        const float *a = row_at(c->a, r);
        float *y = row_at(c->dst, r);
        for (int64_t i = 0; i < n; i++) y[i] = a[i] * c->s;
    }
}

void cpu_op_scale(struct backend *b, struct tensor *dst, const struct tensor *x, float s) {
    struct bin_ctx ctx = {.dst = dst, .a = x, .s = s};
    cpu_parallel(cpu_of(b), scale_range, &ctx, tensor_nrows(x), 16);
}

/* ---- GLU ---- */

/* gpt-oss's clamped SwiGLU through the SiLU kernel: g sigmoid(A g) (u + 1) = silu(A g) (u +
 * 1) / A, with g and u clamped first (a comparison that keeps NaN, as torch.clamp does),
 * in chunks that fit the stack. */
static void swiglu_oai_mul(const struct cpu_vec *v, float *y, const float *g, const float *u,
                           int64_t n) {
    enum { CHUNK = 256 };
    const float a = GLU_OAI_ALPHA, lim = GLU_OAI_LIMIT, inv_a = 1.0f / GLU_OAI_ALPHA;
    float gs[CHUNK], us[CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        const int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        for (int64_t i = 0; i < m; i++) {
            const float x = g[i0 + i], w = u[i0 + i];
            gs[i] = a * (x > lim ? lim : x);
            us[i] = ((w > lim ? lim : w < -lim ? -lim : w) + 1.0f) * inv_a;
        }
        v->silu_mul(y + i0, gs, us, m);
    }
}

/* y = act(g) * u over a row of n (a gate per element) with the vector kernels
 * (cpu_ops_vec.h): SIMD GELU/SiLU through a polynomial exp instead of libm's tanhf/expf per
 * element (libm's tanhf was ~15% of a Gemma 3 prefill). Shared by glu and norm_gate. */
static void glu_row(const struct cpu_vec *v, enum glu_act act, float *y, const float *g,
                    const float *u, int64_t n) {
    if (act == GLU_SILU)
        v->silu_mul(y, g, u, n);
    else if (act == GLU_GELU_TANH)
        v->gelu_mul(y, g, u, n);
    else if (act == GLU_SWIGLU_OAI)
        swiglu_oai_mul(v, y, g, u, n);
    else /* GLU_SIGMOID: an output gate, once per attention row; scalar is enough */
        for (int64_t i = 0; i < n; i++) y[i] = u[i] / (1.0f + expf(-g[i]));
}

static void glu_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct bin_ctx *c = vctx; /* a = gate, c = up */
    int64_t n = c->c->ne[0];
    const struct cpu_vec *v = c->vec;
    for (int64_t r = i0; r < i1; r++) {
        const float *g = row_at(c->a, r);
        const float *u = row_at(c->c, r);
        float *y = row_at(c->dst, r);
        if (c->a->ne[0] == 1 && n > 1) { /* one gate for the row: act(g) * up */
            float s, one = 1.0f;
            if (c->act == GLU_SILU) v->silu_mul(&s, g, &one, 1);
            else if (c->act == GLU_GELU_TANH) v->gelu_mul(&s, g, &one, 1);
            else s = 1.0f / (1.0f + expf(-*g));
            for (int64_t i = 0; i < n; i++) y[i] = s * u[i];
        } else
            glu_row(v, c->act, y, g, u, n);
    }
}

void cpu_op_glu(struct backend *b, struct tensor *dst, const struct tensor *gate,
                const struct tensor *up, enum glu_act act) {
    struct bin_ctx ctx = {.dst = dst, .a = gate, .c = up, .act = act, .vec = cpu_of(b)->vec};
    /* a thread per 16K elements at least: the few rows of an MoE expert block (8 rows of
     * 768 at decode) are not worth waking the pool for */
    cpu_parallel(cpu_of(b), glu_range, &ctx, tensor_nrows(up), 16384 / up->ne[0] + 1);
}

/* ---- norm_gate (the Gated DeltaNet's output) ---- */

struct norm_gate_ctx {
    struct tensor *dst;
    const struct tensor *x, *w, *gate;
    float eps;
    enum glu_act act;
    const struct cpu_vec *vec;
    float *buf; /* a row of x's ne0 per thread */
};

/* rms_norm_range over each group of the row into the thread's buffer, then glu_row on the
 * whole row: the same arithmetic as the two ops, so the same bits. */
static void norm_gate_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct norm_gate_ctx *c = vctx;
    const int64_t n = c->x->ne[0], gn = c->w->ne[0];
    const float *w = c->w->data;
    float *t = c->buf + (size_t)ith * (size_t)n;
    for (int64_t r = i0; r < i1; r++) {
        const float *x = row_at(c->x, r);
        for (int64_t g0 = 0; g0 < n; g0 += gn) {
            const float inv = cpu_rms_inv(x + g0, gn, c->eps);
            for (int64_t i = 0; i < gn; i++) t[g0 + i] = x[g0 + i] * inv * w[i];
        }
        glu_row(c->vec, c->act, row_at(c->dst, r), row_at(c->gate, r), t, n);
    }
}

void cpu_op_norm_gate(struct backend *b, struct tensor *dst, const struct tensor *x,
                      const struct tensor *w, const struct tensor *gate, float eps,
                      enum glu_act act) {
    struct cpu_backend *cb = cpu_of(b);
    struct norm_gate_ctx c = {dst, x, w, gate, eps, act, cb->vec, NULL};
    c.buf = cpu_scratch(cb, (size_t)cb->n_threads * (size_t)x->ne[0] * sizeof(float));
    if (!c.buf) return;
    cpu_parallel(cb, norm_gate_range, &c, tensor_nrows(x), 16384 / x->ne[0] + 1);
}

/* ---- plain activations (a non-gated FFN) ---- */

/* Scalar libm: bert's FFN is one activation per n_ff element of each row, small next to
 * its two matmuls. */
static void act_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct bin_ctx *c = vctx;
    int64_t n = c->a->ne[0];
    for (int64_t r = i0; r < i1; r++) {
        const float *x = row_at(c->a, r);
        float *y = row_at(c->dst, r);
        for (int64_t i = 0; i < n; i++) {
            const float v = x[i];
            if (c->act == GLU_GELU_ERF)
                y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
            else if (c->act == GLU_GELU_TANH)
                y[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
            else /* GLU_SILU */
                y[i] = v / (1.0f + expf(-v));
        }
    }
}

void cpu_op_act(struct backend *b, struct tensor *dst, const struct tensor *x, enum glu_act act) {
    struct bin_ctx ctx = {.dst = dst, .a = x, .act = act};
    cpu_parallel(cpu_of(b), act_range, &ctx, tensor_nrows(x), 16384 / x->ne[0] + 1);
}

/* ---- softcap, softmax ---- */

static void softcap_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct bin_ctx *c = vctx;
    int64_t n = c->a->ne[0];
    for (int64_t r = i0; r < i1; r++) {
        float *y = row_at(c->a, r);
        for (int64_t i = 0; i < n; i++) y[i] = c->s * tanhf(y[i] / c->s);
    }
}

void cpu_op_softcap(struct backend *b, struct tensor *x, float cap) {
    struct bin_ctx ctx = {.a = x, .s = cap};
    cpu_parallel(cpu_of(b), softcap_range, &ctx, tensor_nrows(x), 1);
}

static void softmax_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct bin_ctx *c = vctx;
    int64_t n = c->a->ne[0];
    for (int64_t r = i0; r < i1; r++) {
        float *y = row_at(c->a, r);
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) mx = y[i] > mx ? y[i] : mx;
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            y[i] = expf(y[i] - mx);
            sum += y[i];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++) y[i] *= inv;
    }
}

void cpu_op_softmax(struct backend *b, struct tensor *x) {
    struct bin_ctx ctx = {.a = x};
    cpu_parallel(cpu_of(b), softmax_range, &ctx, tensor_nrows(x), 1);
}
