/* CPU backend ops against naive double-precision references written here from the
 * math (not from the op code): fresh random inputs, ragged sizes, never zeros. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops_vec.h"
#include "t.h"
#include "util/half.h"

static struct backend *bk;
static unsigned long long rng = 0x5eed1234abcdULL;

static struct tensor *rand_f32(int64_t ne0, int64_t ne1, int64_t ne2) {
    struct tensor *t = bk_new(bk, QT_F32, ne0, ne1, ne2);
    float *d = t->data;
    for (int64_t i = 0; i < tensor_nelem(t); i++) d[i] = t_randn(&rng);
    return t;
}

static struct tensor *i32(const int32_t *v, int64_t n) {
    struct tensor *t = bk_new(bk, QT_I32, n, 1, 1);
    memcpy(t->data, v, (size_t)n * 4);
    return t;
}

/* max |a - b| / max(1, max |b|) over n */
static double max_err(const float *a, const double *b, int64_t n) {
    double m = 0, mb = 1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (d > m) m = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return m / mb;
}

static void test_rms_norm(void) {
    bk_step_begin(bk);
    int64_t n = 77, rows = 5;
    struct tensor *x = rand_f32(n, rows, 1), *w = rand_f32(n, 1, 1);
    struct tensor *y = bk_new(bk, QT_F32, n, rows, 1);
    bk_rms_norm(bk, y, x, w, 1e-5f);
    double ref[77];
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = (float *)x->data + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        for (int64_t i = 0; i < n; i++)
            ref[i] = xr[i] / sqrt(ss / n + 1e-5) * ((float *)w->data)[i];
        T_CHECK(max_err((float *)y->data + r * n, ref, n) < 1e-6);
    }
    /* in place, no weight, per-head view (head_dim 7 of 11 heads) */
    struct tensor *h = bk_reshape(bk, x, 7, 11, rows);
    float first[7];
    memcpy(first, x->data, sizeof first);
    bk_rms_norm(bk, h, h, NULL, 1e-6f);
    double ss = 0;
    for (int i = 0; i < 7; i++) ss += (double)first[i] * first[i];
    for (int i = 0; i < 7; i++) ref[i] = first[i] / sqrt(ss / 7 + 1e-6);
    T_CHECK(max_err(x->data, ref, 7) < 1e-6);
    T_CHECK(bk_sync(bk, NULL) == SMELT_OK);
}

/* LayerNorm (torch's: biased variance) with and without weight and bias, in place too, on
 * rows with a large mean (a one-pass variance would cancel there). */
static void test_layer_norm(void) {
    bk_step_begin(bk);
    int64_t n = 83, rows = 6;
    struct tensor *x = rand_f32(n, rows, 1), *w = rand_f32(n, 1, 1), *b = rand_f32(n, 1, 1);
    for (int64_t i = 0; i < n * rows; i++) ((float *)x->data)[i] = ((float *)x->data)[i] * 3 + 250;
    struct tensor *y = bk_new(bk, QT_F32, n, rows, 1);
    double ref[83], worst = 0;
    for (int mode = 0; mode < 3; mode++) {
        const struct tensor *ww = mode == 2 ? NULL : w, *bb = mode == 0 ? b : NULL;
        bk_layer_norm(bk, y, x, ww, bb, 1e-12f);
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = (float *)x->data + r * n;
            double mean = 0, var = 0;
            for (int64_t i = 0; i < n; i++) mean += xr[i];
            mean /= (double)n;
            for (int64_t i = 0; i < n; i++) var += (xr[i] - mean) * (xr[i] - mean);
            var /= (double)n;
            for (int64_t i = 0; i < n; i++) {
                ref[i] = (xr[i] - mean) / sqrt(var + 1e-12);
                if (ww) ref[i] *= ((float *)w->data)[i];
                if (bb) ref[i] += ((float *)b->data)[i];
            }
            double e = max_err((float *)y->data + r * n, ref, n);
            if (e > worst) worst = e;
        }
    }
    T_CHECKF(worst < 2e-6, "layer_norm: err %g", worst);
    /* in place */
    float first[83];
    memcpy(first, x->data, sizeof first);
    bk_layer_norm(bk, x, x, w, b, 1e-5f);
    double mean = 0, var = 0;
    for (int i = 0; i < 83; i++) mean += first[i];
    mean /= 83;
    for (int i = 0; i < 83; i++) var += (first[i] - mean) * (first[i] - mean);
    for (int i = 0; i < 83; i++)
        ref[i] = (first[i] - mean) / sqrt(var / 83 + 1e-5) * ((float *)w->data)[i] +
                 ((float *)b->data)[i];
    T_CHECK(max_err(x->data, ref, 83) < 2e-6);
    T_CHECK(bk_sync(bk, NULL) == SMELT_OK);
}

/* The plain activations (bk_act) against libm in double, over [-12, 12] and beyond. */
static void test_act(void) {
    bk_step_begin(bk);
    int64_t n = 1001, rows = 3;
    struct tensor *x = rand_f32(n, rows, 1), *y = bk_new(bk, QT_F32, n, rows, 1);
    float *xd = x->data;
    for (int64_t i = 0; i < n * rows; i++) xd[i] *= 4.0f;
    xd[0] = -40.0f, xd[1] = 40.0f, xd[2] = 0.0f;
    static const enum glu_act acts[3] = {GLU_GELU_ERF, GLU_GELU_TANH, GLU_SILU};
    for (int a = 0; a < 3; a++) {
        bk_act(bk, y, x, acts[a]);
        double worst = 0;
        for (int64_t i = 0; i < n * rows; i++) {
            double v = xd[i], r;
            if (acts[a] == GLU_GELU_ERF) r = 0.5 * v * (1 + erf(v / sqrt(2.0)));
            else if (acts[a] == GLU_GELU_TANH)
                r = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
            else r = v / (1 + exp(-v));
            double e = fabs(((float *)y->data)[i] - r) / (fabs(r) > 1 ? fabs(r) : 1);
            if (e > worst) worst = e;
        }
        T_CHECKF(worst < 2e-6, "act %d: err %g", (int)acts[a], worst);
    }
    bk_act(bk, x, x, GLU_GELU_ERF); /* in place */
    T_CHECK(fabsf(xd[1] - 40.0f) < 1e-5f && fabsf(xd[0]) < 1e-5f);
    T_CHECK(bk_sync(bk, NULL) == SMELT_OK);
}

/* Reference RoPE: rotation of pairs as complex multiplication by e^{i theta}, with HF's
 * arrangement of YaRN (blend inverse frequencies, scale cos/sin). */
static void rope_ref(const float *x, double *y, int64_t head_dim, const struct rope_params *p,
                     int pos) {
    int half = p->n_rot / 2;
    for (int64_t i = 0; i < head_dim; i++) y[i] = x[i];
    double mscale = p->attn_factor;
    double lo = 0, hi = 0;
    if (p->ext_factor != 0) {
        double d = p->n_rot, b = p->freq_base;
        lo = d * log(p->n_ctx_orig / (p->beta_fast * 2 * M_PI)) / (2 * log(b));
        hi = d * log(p->n_ctx_orig / (p->beta_slow * 2 * M_PI)) / (2 * log(b));
        if (!p->yarn_unrounded) { /* HF truncate = True */
            lo = floor(lo);
            hi = ceil(hi);
        }
        lo = fmax(lo, 0);
        hi = fmin(hi, d - 1);
        if (lo == hi) hi += 0.001;
        mscale *= 0.1 * log(1 / p->freq_scale) + 1;
    }
    for (int i = 0; i < half; i++) {
        double extrap = 1.0 / pow(p->freq_base, (2.0 * i) / p->n_rot);
        if (p->freq_factors) extrap /= ((float *)p->freq_factors->data)[i];
        double interp = extrap * p->freq_scale, inv = interp;
        if (p->ext_factor != 0) {
            double ramp = fmin(1, fmax(0, (i - lo) / (hi - lo)));
            double ext_w = (1 - ramp) * p->ext_factor;
            inv = interp * (1 - ext_w) + extrap * ext_w;
        }
        double th = pos * inv, c = cos(th) * mscale, s = sin(th) * mscale;
        int a = p->mode == ROPE_NEOX ? i : 2 * i, b = p->mode == ROPE_NEOX ? i + half : 2 * i + 1;
        y[a] = x[a] * c - x[b] * s;
        y[b] = x[a] * s + x[b] * c;
    }
}

static void check_rope(const struct rope_params *p, int64_t head_dim) {
    bk_step_begin(bk);
    int64_t n_head = 3, n_tok = 4;
    int32_t pos[4] = {0, 5, 123, 4097};
    struct tensor *x = rand_f32(head_dim, n_head, n_tok);
    float *orig = malloc((size_t)tensor_nelem(x) * 4);
    memcpy(orig, x->data, (size_t)tensor_nelem(x) * 4);
    bk_rope(bk, x, i32(pos, n_tok), p);
    double ref[256];
    double worst = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t h = 0; h < n_head; h++) {
            int64_t off = (t * n_head + h) * head_dim;
            rope_ref(orig + off, ref, head_dim, p, pos[t]);
            double e = max_err((float *)x->data + off, ref, head_dim);
            if (e > worst) worst = e;
        }
    T_CHECKF(worst < 2e-6, "mode %d n_rot %d: err %g", p->mode, p->n_rot, worst);
    free(orig);
}

static void test_rope(void) {
    struct rope_params p = {.mode = ROPE_NEOX, .n_rot = 64, .freq_base = 10000, .freq_scale = 1,
                            .attn_factor = 1, .beta_fast = 32, .beta_slow = 1, .n_ctx_orig = 4096};
    check_rope(&p, 64);
    p.mode = ROPE_NORM;
    check_rope(&p, 64);
    p.n_rot = 32; /* partial rotation: the tail passes through */
    check_rope(&p, 48);
    p.mode = ROPE_NEOX;
    check_rope(&p, 48);
    p.n_rot = 128;
    p.freq_base = 1e6f;
    p.freq_scale = 0.125f; /* linear scaling, factor 8 */
    check_rope(&p, 128);
    p.ext_factor = 1; /* YaRN, factor 4 over 2048 */
    p.freq_scale = 0.25f;
    p.n_ctx_orig = 2048;
    p.freq_base = 10000;
    check_rope(&p, 128);
    /* gpt-oss-20b's YaRN: factor 32 over 4096, base 150000, head_dim 64, the correction
     * range unrounded (8.09..17.40 instead of 8..18) */
    p.n_rot = 64;
    p.freq_base = 150000;
    p.freq_scale = 1.0f / 32;
    p.n_ctx_orig = 4096;
    p.yarn_unrounded = true;
    check_rope(&p, 64);
    /* Llama-3 frequency factors */
    bk_step_begin(bk);
    struct rope_params q = {.mode = ROPE_NORM, .n_rot = 16, .freq_base = 500000, .freq_scale = 1,
                            .attn_factor = 1, .n_ctx_orig = 8192};
    struct tensor *ff = bk_new(bk, QT_F32, 8, 1, 1);
    for (int i = 0; i < 8; i++) ((float *)ff->data)[i] = 1.0f + (float)i * 0.7f;
    q.freq_factors = ff;
    /* check_rope starts a new step; keep ff alive by building the check inline */
    int64_t head_dim = 16;
    struct tensor *x = rand_f32(head_dim, 2, 1);
    float orig[32];
    memcpy(orig, x->data, sizeof orig);
    int32_t pos = 777;
    bk_rope(bk, x, i32(&pos, 1), &q);
    double ref[16];
    for (int h = 0; h < 2; h++) {
        rope_ref(orig + h * 16, ref, 16, &q, pos);
        T_CHECK(max_err((float *)x->data + h * 16, ref, 16) < 2e-6);
    }
}

static void test_get_rows(void) {
    bk_step_begin(bk);
    int64_t ne0 = 40, nr = 9;
    struct tensor *src = rand_f32(ne0, nr, 1);
    struct tensor *h = bk_new(bk, QT_F16, ne0, nr, 1);
    uint16_t *hd = h->data;
    for (int64_t i = 0; i < ne0 * nr; i++) hd[i] = f32_to_f16(((float *)src->data)[i]);
    int32_t ids[4] = {8, 0, 3, 3};
    struct tensor *dst = bk_new(bk, QT_F32, ne0, 4, 1), *dh = bk_new(bk, QT_F32, ne0, 4, 1);
    bk_get_rows(bk, dst, src, i32(ids, 4));
    bk_get_rows(bk, dh, h, i32(ids, 4));
    for (int r = 0; r < 4; r++)
        for (int64_t i = 0; i < ne0; i++) {
            float want = ((float *)src->data)[ids[r] * ne0 + i];
            T_CHECK(((float *)dst->data)[r * ne0 + i] == want);
            T_CHECK(((float *)dh->data)[r * ne0 + i] == f16_to_f32(f32_to_f16(want)));
        }
}

static void test_elementwise(void) {
    bk_step_begin(bk);
    int64_t n = 53, rows = 3;
    struct tensor *a = rand_f32(n, rows, 1), *c = rand_f32(n, rows, 1), *bias = rand_f32(n, 1, 1);
    struct tensor *y = bk_new(bk, QT_F32, n, rows, 1);
    const float *A = a->data, *C = c->data, *B = bias->data;
    bk_add(bk, y, a, c);
    for (int64_t i = 0; i < n * rows; i++) T_CHECK(((float *)y->data)[i] == A[i] + C[i]);
    bk_add(bk, y, a, bias);
    for (int64_t i = 0; i < n * rows; i++) T_CHECK(((float *)y->data)[i] == A[i] + B[i % n]);
    bk_scale(bk, y, a, 0.375f);
    for (int64_t i = 0; i < n * rows; i++) T_CHECK(((float *)y->data)[i] == A[i] * 0.375f);

    double ref[53 * 3];
    bk_glu(bk, y, a, c, GLU_SILU);
    for (int64_t i = 0; i < n * rows; i++) ref[i] = A[i] / (1 + exp(-(double)A[i])) * C[i];
    T_CHECK(max_err(y->data, ref, n * rows) < 1e-6);
    bk_glu(bk, y, a, c, GLU_GELU_TANH);
    for (int64_t i = 0; i < n * rows; i++) {
        double x = A[i];
        ref[i] = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * C[i];
    }
    T_CHECK(max_err(y->data, ref, n * rows) < 1e-6);
    /* gpt-oss's clamped SwiGLU, on inputs that cross both clamps (|x| up to ~12) */
    struct tensor *g8 = bk_new(bk, QT_F32, n, rows, 1), *u8 = bk_new(bk, QT_F32, n, rows, 1);
    for (int64_t i = 0; i < n * rows; i++) {
        ((float *)g8->data)[i] = 4.0f * A[i];
        ((float *)u8->data)[i] = 4.0f * C[i];
    }
    bk_glu(bk, y, g8, u8, GLU_SWIGLU_OAI);
    int clamped = 0;
    for (int64_t i = 0; i < n * rows; i++) {
        double g = 4.0f * A[i], u = 4.0f * C[i];
        clamped += g > 7 || fabs(u) > 7;
        g = fmin(g, 7.0);
        u = fmax(-7.0, fmin(u, 7.0));
        ref[i] = g / (1 + exp(-1.702 * g)) * (u + 1);
    }
    T_CHECKF(max_err(y->data, ref, n * rows) < 2e-6 && clamped > 8, "swiglu_oai: err %g, %d clamped",
             max_err(y->data, ref, n * rows), clamped);
    bk_glu(bk, g8, g8, u8, GLU_SWIGLU_OAI); /* in place */
    T_CHECK(memcmp(g8->data, y->data, (size_t)(n * rows) * 4) == 0);
    bk_glu(bk, y, a, c, GLU_SIGMOID);
    for (int64_t i = 0; i < n * rows; i++) ref[i] = C[i] / (1 + exp(-(double)A[i]));
    T_CHECK(max_err(y->data, ref, n * rows) < 1e-6);
    /* one gate per row (a shared expert's), every activation; in place on up */
    struct tensor *g1 = rand_f32(1, rows, 1);
    const float *G = g1->data;
    for (int act = GLU_SILU; act <= GLU_SIGMOID; act++) {
        memcpy(y->data, C, (size_t)(n * rows) * 4);
        bk_glu(bk, y, g1, y, (enum glu_act)act);
        for (int64_t i = 0; i < n * rows; i++) {
            double x = G[i / n];
            double f = act == GLU_SILU        ? x / (1 + exp(-x))
                       : act == GLU_SIGMOID ? 1 / (1 + exp(-x))
                                            : 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
            ref[i] = f * C[i];
        }
        T_CHECKF(max_err(y->data, ref, n * rows) < 1e-6, "row gate, act %d", act);
    }

    memcpy(y->data, A, (size_t)(n * rows) * 4);
    bk_softcap(bk, y, 3.0f);
    for (int64_t i = 0; i < n * rows; i++) ref[i] = 3.0 * tanh(A[i] / 3.0);
    T_CHECK(max_err(y->data, ref, n * rows) < 1e-6);

    memcpy(y->data, A, (size_t)(n * rows) * 4);
    bk_softmax(bk, y);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += exp(A[r * n + i]);
        for (int64_t i = 0; i < n; i++) ref[r * n + i] = exp(A[r * n + i]) / s;
    }
    T_CHECK(max_err(y->data, ref, n * rows) < 1e-6);
}

/* bk_norm_gate against bk_rms_norm per group then bk_glu (bit for bit, every activation;
 * in place on the gate too; a 3-D shape; the composed fallback of a backend without the op)
 * and, for SiLU, against the math in double. Groups of 13 and 40 (vector tails). */
static void test_norm_gate(void) {
    const enum glu_act acts[4] = {GLU_SILU, GLU_GELU_TANH, GLU_SIGMOID, GLU_SWIGLU_OAI};
    const int64_t shapes[3][4] = {
        {13, 5, 4, 1}, {40, 3, 2, 3}, {128, 4, 1, 1}}; /* group, groups, ne1, ne2 */
    for (int sh = 0; sh < 3; sh++) {
        bk_step_begin(bk);
        const int64_t gn = shapes[sh][0], ne0 = gn * shapes[sh][1], ne1 = shapes[sh][2],
                      ne2 = shapes[sh][3];
        const int64_t n = ne0 * ne1 * ne2;
        struct tensor *x = rand_f32(ne0, ne1, ne2), *g = rand_f32(ne0, ne1, ne2),
                      *w = rand_f32(gn, 1, 1);
        struct tensor *x0 = bk_new(bk, QT_F32, ne0, ne1, ne2),
                      *t = bk_new(bk, QT_F32, ne0, ne1, ne2);
        struct tensor *ref = bk_new(bk, QT_F32, ne0, ne1, ne2),
                      *y = bk_new(bk, QT_F32, ne0, ne1, ne2);
        memcpy(x0->data, x->data, (size_t)n * 4);
        for (int a = 0; a < 4; a++) {
            memcpy(t->data, x->data, (size_t)n * 4);
            struct tensor *th = bk_reshape(bk, t, gn, n / gn, 1);
            bk_rms_norm(bk, th, th, w, 1e-6f);
            bk_glu(bk, ref, g, t, acts[a]);
            bk_norm_gate(bk, y, x, w, g, 1e-6f, acts[a]);
            T_CHECKF(memcmp(y->data, ref->data, (size_t)n * 4) == 0, "group %lld act %d",
                     (long long)gn, a);
            memcpy(t->data, g->data, (size_t)n * 4); /* in place on the gate */
            bk_norm_gate(bk, t, x, w, t, 1e-6f, acts[a]);
            T_CHECKF(memcmp(t->data, ref->data, (size_t)n * 4) == 0, "in place, group %lld act %d",
                     (long long)gn, a);
            /* a backend without the op: the wrapper composes it from the two */
            const struct backend_ops *ops = bk->ops;
            struct backend_ops no_op = *ops;
            no_op.norm_gate = NULL;
            bk->ops = &no_op;
            bk_norm_gate(bk, y, x, w, g, 1e-6f, acts[a]);
            bk->ops = ops;
            T_CHECKF(memcmp(y->data, ref->data, (size_t)n * 4) == 0, "composed, group %lld act %d",
                     (long long)gn, a);
        }
        T_CHECK(memcmp(x->data, x0->data, (size_t)n * 4) == 0); /* x is not modified */
        /* SiLU from the math */
        bk_norm_gate(bk, y, x, w, g, 1e-6f, GLU_SILU);
        double *d = malloc((size_t)n * sizeof *d);
        const float *X = x->data, *G = g->data, *W = w->data;
        for (int64_t g0 = 0; g0 < n; g0 += gn) {
            double ss = 0;
            for (int64_t i = 0; i < gn; i++)
                ss += (double)X[g0 + i] * X[g0 + i];
            for (int64_t i = 0; i < gn; i++) {
                const double gv = G[g0 + i];
                d[g0 + i] = gv / (1 + exp(-gv)) * (X[g0 + i] / sqrt(ss / gn + 1e-6) * W[i]);
            }
        }
        T_CHECKF(max_err(y->data, d, n) < 2e-6, "group %lld: err %g", (long long)gn,
                 max_err(y->data, d, n));
        free(d);
        T_CHECK(bk_sync(bk, NULL) == SMELT_OK);
    }
}

static void test_matmul(void) {
    bk_step_begin(bk);
    int64_t n_in = 67, n_out = 23, n = 5;
    struct tensor *w = rand_f32(n_in, n_out, 1), *x = rand_f32(n_in, n, 1);
    struct tensor *y = bk_new(bk, QT_F32, n_out, n, 1);
    bk_matmul(bk, y, w, x);
    double ref[23 * 5];
    for (int64_t j = 0; j < n; j++)
        for (int64_t o = 0; o < n_out; o++) {
            double s = 0;
            for (int64_t i = 0; i < n_in; i++)
                s += (double)((float *)w->data)[o * n_in + i] * ((float *)x->data)[j * n_in + i];
            ref[j * n_out + o] = s;
        }
    T_CHECK(max_err(y->data, ref, n_out * n) < 1e-5);
    /* F16 weights and the fused group / GLU paths */
    struct tensor *wh = bk_new(bk, QT_F16, n_in, n_out, 1);
    for (int64_t i = 0; i < n_in * n_out; i++)
        ((uint16_t *)wh->data)[i] = f32_to_f16(((float *)w->data)[i]);
    struct tensor *y2 = bk_new(bk, QT_F32, n_out, n, 1), *y3 = bk_new(bk, QT_F32, n_out, n, 1);
    struct tensor *outs[2] = {y2, y3};
    const struct tensor *ws[2] = {wh, w};
    bk_matmul_group(bk, 2, outs, ws, NULL, x, NULL);
    T_CHECK(max_err(y2->data, ref, n_out * n) < 2e-3);
    T_CHECK(memcmp(y3->data, y->data, (size_t)(n_out * n) * 4) == 0);
    struct tensor *g = bk_new(bk, QT_F32, n_out, n, 1);
    bk_ffn_glu(bk, g, w, w, x, GLU_SILU, NULL);
    for (int64_t i = 0; i < n_out * n; i++) ref[i] = ref[i] / (1 + exp(-ref[i])) * ref[i];
    T_CHECK(max_err(g->data, ref, n_out * n) < 1e-5);
}

/* Fused ops with their optional parts: pre-norm, bias, accumulate. */
static void test_fused(void) {
    bk_step_begin(bk);
    int64_t n_in = 40, n_out = 9, n = 3;
    struct tensor *w = rand_f32(n_in, n_out, 1), *x = rand_f32(n_in, n, 1);
    struct tensor *nw = rand_f32(n_in, 1, 1), *bias = rand_f32(n_out, 1, 1);
    struct tensor *y = bk_new(bk, QT_F32, n_out, n, 1), *acc = rand_f32(n_out, n, 1);
    float acc0[27], x0[120];
    memcpy(acc0, acc->data, sizeof acc0);
    memcpy(x0, x->data, sizeof x0);
    struct prenorm pre = {nw, 1e-5f};
    const struct tensor *ws[1] = {w}, *bs[1] = {bias};
    bk_matmul_group(bk, 1, &y, ws, bs, x, &pre);
    struct tensor *acc_b = bk_new(bk, QT_F32, n_out, n, 1); /* dst += W x + bias */
    memcpy(acc_b->data, acc0, sizeof acc0);
    bk_matmul_acc(bk, acc, w, NULL, x, NULL);
    bk_matmul_acc(bk, acc_b, w, bias, x, NULL);
    double ref[27], ref_acc[27], ref_acc_b[27];
    const float *X = x->data, *W = w->data, *NW = nw->data, *B = bias->data;
    for (int64_t j = 0; j < n; j++) {
        double ss = 0;
        for (int64_t i = 0; i < n_in; i++) ss += (double)X[j * n_in + i] * X[j * n_in + i];
        double inv = 1 / sqrt(ss / n_in + 1e-5);
        for (int64_t o = 0; o < n_out; o++) {
            double s = 0, sr = 0;
            for (int64_t i = 0; i < n_in; i++) {
                s += W[o * n_in + i] * X[j * n_in + i] * inv * NW[i];
                sr += W[o * n_in + i] * X[j * n_in + i];
            }
            ref[j * n_out + o] = s + B[o];
            ref_acc[j * n_out + o] = acc0[j * n_out + o] + sr;
            ref_acc_b[j * n_out + o] = acc0[j * n_out + o] + (sr + B[o]);
        }
    }
    T_CHECK(max_err(y->data, ref, n_out * n) < 1e-5);
    T_CHECK(max_err(acc->data, ref_acc, n_out * n) < 1e-5);
    T_CHECK(max_err(acc_b->data, ref_acc_b, n_out * n) < 1e-5);
    /* x untouched by the pre-norm */
    T_CHECK(memcmp(x0, x->data, sizeof x0) == 0);
}

/* Paged attention against a dense reference: three sequences with scattered block
 * tables, a prefill chunk beside decode rows, GQA, sliding window, soft-capping, F32 and
 * F16 caches, attention sinks. */
/* nc: bidirectional (an encoder's): every query sees its whole sequence, later keys too. */
static void check_attention(uint32_t kv_type, int32_t window, float softcap, bool sinks, bool nc) {
    bk_step_begin(bk);
    const int64_t dk = 24, dv = 16, n_kv = 2, n_head = 6, bs = 4, n_blocks = 16;
    const int n_seq = 3;
    const int32_t seq_len[3] = {13, 6, 9}; /* tokens in each sequence after this step */
    const int32_t table[3][4] = {{7, 2, 11, 0}, {5, 9, 0, 0}, {14, 1, 3, 0}};
    /* rows of this step: seq 0 a prefill chunk (pos 8..12), seq 1 decode (pos 5), seq 2
     * decode (pos 8); earlier positions are stored by a previous "step" below. */
    struct tensor kc, vc;
    tensor_init(&kc, kv_type, dk, bs, n_kv, n_blocks);
    tensor_init(&vc, kv_type, dv, bs, n_kv, n_blocks);
    T_CHECK(bk_buffer_alloc(bk, &kc, NULL) == SMELT_OK);
    T_CHECK(bk_buffer_alloc(bk, &vc, NULL) == SMELT_OK);
    /* poison the caches: unreached slots must not matter */
    for (size_t i = 0; i < tensor_nbytes(&kc); i++) ((unsigned char *)kc.data)[i] = 0x7f;
    for (size_t i = 0; i < tensor_nbytes(&vc); i++) ((unsigned char *)vc.data)[i] = 0x7f;

    /* every position of every sequence: K, V */
    int total = 0;
    for (int s = 0; s < n_seq; s++) total += seq_len[s];
    int32_t *pos = malloc((size_t)total * 4), *seq = malloc((size_t)total * 4),
            *slot = malloc((size_t)total * 4);
    int r = 0;
    for (int s = 0; s < n_seq; s++)
        for (int p = 0; p < seq_len[s]; p++, r++) {
            pos[r] = p;
            seq[r] = s;
            slot[r] = table[s][p / bs] * (int32_t)bs + p % (int32_t)bs;
        }
    struct tensor *K = rand_f32(dk, n_kv, total), *V = rand_f32(dv, n_kv, total);
    int32_t flat[12];
    for (int s = 0; s < n_seq; s++) memcpy(flat + 4 * s, table[s], 16);
    struct attn_meta all = {i32(pos, total), i32(seq, total), i32(slot, total), NULL, (int32_t)bs, false, NULL};
    struct tensor *tb = bk_new(bk, QT_I32, 4, n_seq, 1);
    memcpy(tb->data, flat, sizeof flat);
    all.blocks = tb;
    bk_kv_store(bk, &kc, &vc, K, V, &all);

    /* queries: the last 5 rows of seq 0, the last of seq 1, the last of seq 2 */
    int32_t qrow[7] = {8, 9, 10, 11, 12, 13 + 5, 13 + 6 + 8};
    int32_t qpos[7], qseq[7], qslot[7];
    for (int i = 0; i < 7; i++) {
        qpos[i] = pos[qrow[i]];
        qseq[i] = seq[qrow[i]];
        qslot[i] = slot[qrow[i]];
    }
    struct attn_meta m = {i32(qpos, 7), i32(qseq, 7), i32(qslot, 7), tb, (int32_t)bs, false, NULL};
    struct tensor *q = rand_f32(dk, n_head, 7), *out = bk_new(bk, QT_F32, dv, n_head, 7);
    struct attn_params ap = {.scale = 0.3f, .softcap = softcap, .window = window};
    /* per-head sinks around the scores' scale, one far above them (takes most of the mass) */
    struct tensor *sk = rand_f32(n_head, 1, 1);
    ((float *)sk->data)[1] = 6.0f;
    if (sinks) ap.sinks = sk;
    if (nc) {
        ap.non_causal = true;
        m.n_keys = i32(seq_len, n_seq);
    }
    bk_attention(bk, out, q, &kc, &vc, &m, &ap);
    T_CHECK(bk_sync(bk, NULL) == SMELT_OK);

    double worst = 0;
    for (int i = 0; i < 7; i++)
        for (int h = 0; h < n_head; h++) {
            int g = h / (int)(n_head / n_kv);
            const float *qv = (float *)q->data + (i * n_head + h) * dk;
            double sc[16], mx = -1e300, sum = 0, ref[16] = {0};
            int base = qrow[i] - qpos[i]; /* row of position 0 of this sequence */
            int n = 0;
            for (int p = 0; p < (nc ? seq_len[qseq[i]] : qpos[i] + 1); p++) {
                double s = -INFINITY;
                if (!(window > 0 && qpos[i] - p >= window)) {
                    s = 0;
                    const float *kv = (float *)K->data + ((base + p) * n_kv + g) * dk;
                    for (int d = 0; d < dk; d++) {
                        double kd = kv_type == QT_F16 ? f16_to_f32(f32_to_f16(kv[d])) : kv[d];
                        s += qv[d] * kd;
                    }
                    s *= 0.3;
                    if (softcap > 0) s = softcap * tanh(s / softcap);
                }
                sc[n++] = s;
                if (s > mx) mx = s;
            }
            const double sink = sinks ? ((float *)sk->data)[h] : -INFINITY;
            if (sink > mx) mx = sink;
            for (int p = 0; p < n; p++) sum += sc[p] = exp(sc[p] - mx);
            sum += exp(sink - mx);
            for (int p = 0; p < n; p++) {
                const float *vv = (float *)V->data + ((base + p) * n_kv + g) * dv;
                for (int d = 0; d < dv; d++) {
                    double vd = kv_type == QT_F16 ? f16_to_f32(f32_to_f16(vv[d])) : vv[d];
                    ref[d] += sc[p] / sum * vd;
                }
            }
            double e = max_err((float *)out->data + (i * n_head + h) * dv, ref, dv);
            if (e > worst) worst = e;
        }
    T_CHECKF(worst < 1e-5, "type %s window %d softcap %g sinks %d non-causal %d: err %g",
             qtype_name(kv_type), window, (double)softcap, sinks, nc, worst);
    free(pos);
    free(seq);
    free(slot);
    bk_buffer_free(bk, &kc);
    bk_buffer_free(bk, &vc);
}

static void test_attention(void) {
    check_attention(QT_F32, 0, 0, false, false);
    check_attention(QT_F32, 3, 0, false, false);
    check_attention(QT_F32, 0, 2.5f, false, false);
    check_attention(QT_F16, 5, 0, false, false);
    check_attention(QT_F32, 0, 0, true, false); /* gpt-oss: sinks, with and without the window */
    check_attention(QT_F16, 3, 0, true, false);
    check_attention(QT_F32, 0, 0, false, true); /* bert: bidirectional */
    check_attention(QT_F16, 0, 0, false, true);
}

/* Every ISA's vector kernels against double references at ragged lengths. */
static void test_vec(void) {
    const int64_t lens[] = {1, 7, 8, 15, 16, 31, 33, 100, 257};
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (isa > (int)cpu_isa_supported()) break;
        const struct cpu_vec *v = cpu_vec_for((enum cpu_isa)isa);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            float a[257], b[257], y[257], y2[257], e[257];
            uint16_t h[257], h2[257];
            double ref[257], dot = 0, doth = 0, esum = 0;
            for (int64_t i = 0; i < n; i++) {
                a[i] = t_randn(&rng);
                b[i] = t_randn(&rng);
                h[i] = f32_to_f16(b[i]);
                y[i] = y2[i] = t_randn(&rng);
                e[i] = -fabsf(t_randn(&rng)) * 30; /* exp of [-~100, 0] */
                dot += (double)a[i] * b[i];
                doth += (double)a[i] * f16_to_f32(h[i]);
            }
            T_CHECKF(fabs(v->dot_f32(a, b, n) - dot) < 1e-5 * (1 + fabs(dot)), "isa %d n %lld", isa, (long long)n);
            T_CHECKF(fabs(v->dot_f16(a, h, n) - doth) < 1e-5 * (1 + fabs(doth)), "isa %d n %lld", isa, (long long)n);
            v->axpy_f32(y, 0.75f, b, n);
            v->axpy_f16(y2, 0.75f, h, n);
            for (int64_t i = 0; i < n; i++) {
                T_CHECK(fabsf(y[i] - (y2[i] - 0.75f * f16_to_f32(h[i])) - 0.75f * b[i]) < 1e-5f);
            }
            for (int64_t i = 0; i < n; i++) ref[i] = exp((double)e[i] + 2.0), esum += ref[i];
            float s = v->exp_sum(e, n, -2.0f);
            T_CHECKF(fabs(s - esum) < 1e-6 * esum, "isa %d n %lld exp_sum", isa, (long long)n);
            for (int64_t i = 0; i < n; i++) T_CHECK(fabs(e[i] - ref[i]) <= 3e-7 * ref[i] + 1e-37);
            v->to_f16(b, h2, n);
            v->from_f16(h2, y, n);
            for (int64_t i = 0; i < n; i++) {
                T_CHECK(h2[i] == h[i]);
                T_CHECK(y[i] == f16_to_f32(h[i]));
            }
        }
    }
}

/* gemm_nt of every ISA against a double reference: ragged m, n, k (the 2 x 4 blocks, their
 * k tails and the leftover rows and columns), strided rows, overwrite and accumulate. */
static void test_vec_gemm_nt(void) {
    const int64_t dims[][3] = {{1, 1, 1}, {2, 4, 8}, {3, 5, 7}, {7, 9, 24}, {64, 128, 128}, {37, 20, 61}, {5, 64, 37}};
    for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
        if (isa > (int)cpu_isa_supported()) break;
        const struct cpu_vec *v = cpu_vec_for((enum cpu_isa)isa);
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const int64_t m = dims[di][0], n = dims[di][1], k = dims[di][2];
            const int64_t lda = k + 3, ldb = k + 1, ldc = n + 2;
            float *a = malloc(sizeof(float) * (size_t)(m * lda)), *b = malloc(sizeof(float) * (size_t)(n * ldb));
            float *c = malloc(sizeof(float) * (size_t)(m * ldc)), *c0 = malloc(sizeof(float) * (size_t)(m * ldc));
            for (int64_t i = 0; i < m * lda; i++) a[i] = t_randn(&rng);
            for (int64_t i = 0; i < n * ldb; i++) b[i] = t_randn(&rng);
            for (int64_t i = 0; i < m * ldc; i++) c0[i] = t_randn(&rng);
            for (int acc = 0; acc < 2; acc++) {
                memcpy(c, c0, sizeof(float) * (size_t)(m * ldc));
                v->gemm_nt(c, ldc, a, lda, b, ldb, m, n, k, acc);
                int bad = 0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < ldc; j++) {
                        const float got = c[i * ldc + j];
                        if (j >= n) { /* the stride's gap: untouched */
                            bad += got != c0[i * ldc + j];
                            continue;
                        }
                        double ref = acc ? c0[i * ldc + j] : 0.0, mag = fabs(ref);
                        for (int64_t l = 0; l < k; l++) {
                            ref += (double)a[i * lda + l] * b[j * ldb + l];
                            mag += fabs((double)a[i * lda + l] * b[j * ldb + l]);
                        }
                        bad += !(fabs(got - ref) <= 1e-6 * mag + 1e-30);
                    }
                T_CHECKF(bad == 0, "isa %d gemm_nt %lldx%lldx%lld acc %d: %d outputs off", isa, (long long)m,
                         (long long)n, (long long)k, acc, bad);
            }
            free(a);
            free(b);
            free(c);
            free(c0);
        }
    }
}

/* The GLU activations of every ISA over a wide input range (a fine grid of [-40, 40], the
 * tails out to +-1e4 and random values), against double precision and against the scalar
 * table (libm tanhf / expf). Prints the largest errors. */
static void test_vec_glu(void) {
    enum { N = 16384 + 3 };
    static float g[N], u[N], y[N], ys[N];
    for (int i = 0; i < N; i++) {
        if (i < 8001) g[i] = -40.0f + 0.01f * (float)i;                 /* grid */
        else if (i < 12001) g[i] = (i % 2 ? 1 : -1) * powf(10.0f, 1.6f + 2.4f * (float)(i - 8001) / 4000);
        else g[i] = 6.0f * t_randn(&rng);
        u[i] = i % 7 == 0 ? 1.0f : t_randn(&rng);
    }
    const struct cpu_vec *sc = cpu_vec_for(CPU_ISA_SCALAR);
    for (int act = 0; act < 2; act++) {
        if (act == 0) sc->gelu_mul(ys, g, u, N);
        else sc->silu_mul(ys, g, u, N);
        for (int isa = 0; isa < CPU_ISA_COUNT; isa++) {
            if (isa > (int)cpu_isa_supported()) break;
            const struct cpu_vec *v = cpu_vec_for((enum cpu_isa)isa);
            /* odd lengths and offsets exercise the tails */
            for (int64_t off = 0; off < 3; off++) {
                if (act == 0) v->gelu_mul(y + off, g + off, u + off, N - 2 * off);
                else v->silu_mul(y + off, g + off, u + off, N - 2 * off);
            }
            double worst_ref = 0, worst_sc = 0, worst_rel = 0;
            for (int i = 0; i < N; i++) {
                double x = g[i], a;
                if (act == 0) a = x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
                else a = x / (1 + exp(-x));
                if (!isfinite(a)) a = x > 0 ? x : 0; /* exp overflowed in double: the limit */
                double want = a * u[i];
                double e = fabs(y[i] - want), es = fabs((double)y[i] - ys[i]);
                if (fabs(x) <= 40 && e > worst_ref) worst_ref = e;
                if (es > worst_sc) worst_sc = es;
                if (fabs(want) > 1e-30 && e / fabs(want) > worst_rel && fabs(x) < 100)
                    worst_rel = e / fabs(want);
                /* relative 1e-5: the f32 rounding of the exp argument (|t| up to 88) is
                 * amplified by |t| in exp(t); absolute 1e-6 |u|: the scalar tanh form loses
                 * digits to cancellation in 1 + tanh(t) where gelu(x) ~ 0 */
                T_CHECKF(e <= 1e-5 * fabs(want) + 1e-6 * fabs(u[i]), "%s isa %d x %g: %g vs %g",
                         act ? "silu" : "gelu", isa, x, y[i], want);
                T_CHECKF(es <= 1e-5 * fabs(want) + 1e-6 * fabs(u[i]), "%s isa %d x %g: %g vs scalar %g",
                         act ? "silu" : "gelu", isa, x, y[i], ys[i]);
            }
            printf("%s isa %d: max abs err vs double (|x| <= 40) %.2e, vs the scalar twin (all x) "
                   "%.2e, max rel err vs double (|x| < 100) %.2e\n", act ? "silu" : "gelu", isa, worst_ref, worst_sc, worst_rel);
        }
    }
}

static void test_scratch_mark(void) {
    bk_step_begin(bk);
    struct tensor *a = bk_new(bk, QT_F32, 1000, 1, 1);
    size_t mark = bk_scratch_mark(bk);
    struct tensor *b = bk_new(bk, QT_F32, 1 << 20, 1, 1); /* forces a second chunk */
    void *bdata = b->data;
    bk_scratch_release(bk, mark);
    struct tensor *c = bk_new(bk, QT_F32, 1 << 20, 1, 1);
    T_CHECK(c->data == bdata); /* released memory is reused */
    T_CHECK((char *)c->data != (char *)a->data);
    bk_step_begin(bk); /* merges chunks: the same step now fits in one */
    a = bk_new(bk, QT_F32, 1000, 1, 1);
    c = bk_new(bk, QT_F32, 1 << 20, 1, 1);
    T_CHECK((char *)c->data > (char *)a->data &&
            (char *)c->data - (char *)a->data < (ptrdiff_t)(1 << 16));
    T_CHECK(bk_sync(bk, NULL) == SMELT_OK);
}

int main(void) {
    struct err e;
    if (cpu_backend_new(&bk, 1, &e) != SMELT_OK) return 1;
    T_RUN(test_rms_norm);
    T_RUN(test_layer_norm);
    T_RUN(test_act);
    T_RUN(test_rope);
    T_RUN(test_get_rows);
    T_RUN(test_elementwise);
    T_RUN(test_norm_gate);
    T_RUN(test_matmul);
    T_RUN(test_fused);
    T_RUN(test_attention);
    T_RUN(test_vec);
    T_RUN(test_vec_gemm_nt);
    T_RUN(test_vec_glu);
    T_RUN(test_scratch_mark);
    bk_free(bk);
    return t_done();
}
