/* The mixture-of-experts ops (bk_moe_route, bk_moe_ffn) on the CPU backend against naive
 * double-precision references written here from the math: fresh random inputs at ragged
 * sizes, every gating mode, float and quantized experts (the int8-activation kernels and
 * the reference path of cpu_backend_set_exact), accumulate and in-place forms, and
 * gpt-oss's experts (biases, the clamped SwiGLU past its limits, MXFP4 weights).
 * Batch invariance: a row's experts and weights are the same bits whether it is routed
 * alone or among others, and so is its FFN output where the matmul kernels are row-count
 * invariant (legacy types; every type on the scalar path). Runs once per CPU kernel level
 * (ctest test_moe, test_moe_avx2, test_moe_scalar). A CUDA implementation is checked
 * against this CPU one. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "quant/quant.h"
#include "t.h"
#include "moe_ref.h"

static struct backend *bk;
static unsigned long long rng = 0x6d6f65ULL;

static struct tensor *rand_f32(int64_t ne0, int64_t ne1, float scale) {
    struct tensor *t = bk_new(bk, QT_F32, ne0, ne1, 1);
    float *d = t->data;
    for (int64_t i = 0; i < tensor_nelem(t); i++)
        d[i] = scale * t_randn(&rng);
    return t;
}

/* ---- router ---- */

static void check_route(const struct route_case *rc) {
    bk_step_begin(bk);
    const int64_t E = rc->n_embd, X = rc->n_expert, k = rc->k, n = rc->n;
    struct tensor *x = rand_f32(E, n, 1.0f), *router = rand_f32(E, X, 1.0f / sqrtf((float)E));
    struct tensor *bias = rc->bias ? rand_f32(X, 1, 0.3f) : NULL;
    struct tensor *nw = rand_f32(E, 1, 0.2f);
    for (int64_t i = 0; i < E; i++)
        ((float *)nw->data)[i] += 1.0f;
    struct prenorm pre = {nw, 1e-6f};
    /* two experts with the same router row: a tie, which the lower id must win */
    memcpy(tensor_row(router, X - 1, 0, 0), tensor_row(router, 1, 0, 0), (size_t)E * 4);
    struct tensor *ids = bk_new(bk, QT_I32, k, n, 1), *wt = bk_new(bk, QT_F32, k, n, 1);
    bk_moe_route(bk, ids, wt, x, router, bias, rc->gating, rc->pre ? &pre : NULL, NULL, NULL);
    struct err e;
    T_CHECK(bk_sync(bk, &e) == SMELT_OK);

    double *h = malloc(sizeof(double) * (size_t)E), *lg = malloc(sizeof(double) * (size_t)X);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)k);
    int checked = 0;
    double werr = 0;
    for (int64_t r = 0; r < n; r++) {
        const float *xr = tensor_row(x, r, 0, 0);
        if (rc->pre)
            norm_ref(xr, nw->data, E, 1e-6f, h);
        else
            for (int64_t i = 0; i < E; i++)
                h[i] = xr[i];
        for (int64_t q = 0; q < X; q++) {
            const float *wr = tensor_row(router, q, 0, 0);
            double s = bias ? ((float *)bias->data)[q] : 0;
            for (int64_t i = 0; i < E; i++)
                s += wr[i] * h[i];
            lg[q] = s;
        }
        /* selection by repeated argmax (ties: lower id), then the gating's weights */
        for (int64_t j = 0; j < k; j++) {
            int32_t best = -1;
            for (int32_t q = 0; q < X; q++) {
                bool taken = false;
                for (int64_t p = 0; p < j; p++)
                    taken |= want[p] == q;
                if (!taken && (best < 0 || lg[q] > lg[best])) best = q;
            }
            want[j] = best;
        }
        /* the reference's selection is trusted only where no other logit is within 1e-5
         * of the k-th (float rounding could order those either way) */
        bool clear = true;
        for (int64_t q = 0; q < X; q++) {
            bool in = false;
            for (int64_t j = 0; j < k; j++)
                in |= want[j] == q;
            if (!in && fabs(lg[q] - lg[want[k - 1]]) < 1e-5 && q != X - 1) clear = false;
        }
        const int32_t *got = tensor_row(ids, r, 0, 0);
        const float *gw = tensor_row(wt, r, 0, 0);
        for (int64_t j = 0; j < k && !bias; j++) /* the tie: 1 first, X - 1 right after */
            T_CHECKF(got[j] != X - 1 || (j > 0 && got[j - 1] == 1),
                     "row %lld: expert %lld (tied with 1) taken without 1 just before it",
                     (long long)r, (long long)(X - 1));
        if (!clear) continue;
        checked++;
        for (int64_t j = 0; j < k; j++)
            T_EQ_INT(got[j], want[j]);
        double mx = lg[want[0]], z = 0;
        if (rc->gating == MOE_SOFTMAX)
            for (int64_t q = 0; q < X; q++)
                z += exp(lg[q] - mx);
        else
            for (int64_t j = 0; j < k; j++)
                z += exp(lg[want[j]] - mx);
        for (int64_t j = 0; j < k; j++)
            werr = fmax(werr, fabs(gw[j] - exp(lg[want[j]] - mx) / z));
    }
    T_CHECKF(checked >= n - 1, "only %d of %lld rows had a clear selection", checked, (long long)n);
    T_CHECKF(werr < 2e-6, "weights: max error %g", werr);

    /* batch invariance: each row routed alone gets the same bits */
    for (int64_t r = 0; r < n; r++) {
        struct tensor *x1 = bk_view_2d(bk, x, E, 1, x->nb[1], (size_t)r * x->nb[1]);
        struct tensor *i1 = bk_new(bk, QT_I32, k, 1, 1), *w1 = bk_new(bk, QT_F32, k, 1, 1);
        bk_moe_route(bk, i1, w1, x1, router, bias, rc->gating, rc->pre ? &pre : NULL, NULL, NULL);
        T_CHECK(memcmp(i1->data, tensor_row(ids, r, 0, 0), (size_t)k * 4) == 0);
        T_CHECK(memcmp(w1->data, tensor_row(wt, r, 0, 0), (size_t)k * 4) == 0);
    }
    free(h);
    free(lg);
    free(want);
}

static void test_route(void) {
    const struct route_case cases[] = {
        {72, 19, 5, 13, MOE_SOFTMAX_TOPK, false, true}, {72, 19, 5, 13, MOE_SOFTMAX, true, true},
        {40, 16, 4, 9, MOE_SOFTMAX_TOPK, true, false},  {33, 7, 1, 6, MOE_SOFTMAX, false, false},
        {33, 7, 7, 6, MOE_SOFTMAX_TOPK, false, true}, /* every expert: weights sum to 1 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_route(&cases[i]);
}

/* The tie rule on its own: all logits equal gives ids 0..k-1 and equal weights. */
static void test_route_ties(void) {
    bk_step_begin(bk);
    struct tensor *x = rand_f32(8, 2, 1.0f), *router = bk_new(bk, QT_F32, 8, 6, 1);
    memset(router->data, 0, tensor_nbytes(router));
    struct tensor *ids = bk_new(bk, QT_I32, 3, 2, 1), *wt = bk_new(bk, QT_F32, 3, 2, 1);
    bk_moe_route(bk, ids, wt, x, router, NULL, MOE_SOFTMAX, NULL, NULL, NULL);
    const int32_t *id = ids->data;
    const float *w = wt->data;
    for (int i = 0; i < 6; i++) {
        T_EQ_INT(id[i], i % 3);
        T_NEAR(w[i], 1.0 / 6, 1e-7);
    }
}

/* ---- expert FFN ---- */

/* A (ne0, ne1, n_expert) stack of random matrices stored as type; deq gets the values the
 * stored ones dequantize to (what the reference multiplies). */
static struct tensor *rand_experts(uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                                   float scale, float **deq) {
    const int64_t nel = ne0 * ne1 * ne2;
    float *v = malloc(sizeof(float) * (size_t)nel);
    for (int64_t i = 0; i < nel; i++)
        v[i] = scale * t_randn(&rng);
    struct tensor *t = bk_new(bk, type, ne0, ne1, ne2);
    const struct qtype_info *qi = qtype_get(type);
    if (type == QT_F32)
        memcpy(t->data, v, sizeof(float) * (size_t)nel);
    else
        qi->quantize(v, t->data, nel);
    qi->dequantize(t->data, v, nel);
    *deq = v;
    return t;
}

struct ffn_case {
    uint32_t type;
    int64_t n_embd, n_ff, n_expert, k, n;
    enum glu_act act;
    bool bias;  /* expert biases (gpt-oss) */
    float gain; /* gate/up weights' scale times 1/sqrt(n_embd) (0: 1); large enough for
                 * GLU_SWIGLU_OAI's clamps to act */
};

/* act(g) * u in double. */
static double glu_ref(enum glu_act act, double g, double u) {
    if (act == GLU_SILU) return g / (1 + exp(-g)) * u;
    if (act == GLU_GELU_TANH)
        return 0.5 * g * (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    g = fmin(g, 7.0); /* gpt-oss: alpha 1.702, limit 7 */
    u = fmax(-7.0, fmin(u, 7.0));
    return g / (1 + exp(-1.702 * g)) * (u + 1);
}

/* y (n_embd, n) in double from dequantized weights, as bk_moe_ffn's contract says. bias:
 * the gate, up and down biases (rows of n_ff, n_ff, n_embd per expert) or NULL. */
static void ffn_ref(const struct ffn_case *fc, const float *x, const float *nw,
                    const float *const dq[3], const float *const *bias, const int32_t *ids,
                    const float *wt, double *y) {
    const int64_t E = fc->n_embd, F = fc->n_ff;
    double *h = malloc(sizeof(double) * (size_t)E), *a = malloc(sizeof(double) * (size_t)F);
    for (int64_t r = 0; r < fc->n; r++) {
        norm_ref(x + r * E, nw, E, 1e-6f, h);
        double *yr = y + r * E;
        for (int64_t d = 0; d < E; d++)
            yr[d] = 0;
        for (int64_t j = 0; j < fc->k; j++) {
            const int64_t e = ids[r * fc->k + j];
            for (int64_t f = 0; f < F; f++) {
                const float *gw = dq[0] + (e * F + f) * E, *uw = dq[1] + (e * F + f) * E;
                double g = bias ? bias[0][e * F + f] : 0, u = bias ? bias[1][e * F + f] : 0;
                for (int64_t i = 0; i < E; i++)
                    g += gw[i] * h[i], u += uw[i] * h[i];
                a[f] = glu_ref(fc->act, g, u);
            }
            for (int64_t d = 0; d < E; d++) {
                const float *dw = dq[2] + (e * E + d) * F;
                double s = bias ? bias[2][e * E + d] : 0;
                for (int64_t f = 0; f < F; f++)
                    s += dw[f] * a[f];
                yr[d] += wt[r * fc->k + j] * s;
            }
        }
    }
    free(h);
    free(a);
}

static double rel_err(const float *a, const double *b, int64_t n) {
    double m = 0, mb = 1e-6;
    for (int64_t i = 0; i < n; i++) {
        m = fmax(m, fabs(a[i] - b[i]));
        mb = fmax(mb, fabs(b[i]));
    }
    return m / mb;
}

/* Rows of each row alone equal to the batch: bitwise for every integer type at every level
 * (the decode kernels do the packed prefill's arithmetic, cpu-backend.md "Matmul design"
 * point 4); F32/F16 within f32 rounding (tile shapes differ). */
static double batch_tol(uint32_t type) {
    return type == QT_F32 || type == QT_F16 ? 1e-6 : 0;
}

static void check_ffn(const struct ffn_case *fc, bool exact) {
    bk_step_begin(bk);
    cpu_backend_set_exact(bk, exact);
    const int64_t E = fc->n_embd, F = fc->n_ff, X = fc->n_expert, k = fc->k, n = fc->n;
    const float ws = 1.0f / sqrtf((float)E), ds = 1.0f / sqrtf((float)F);
    const float gs = ws * (fc->gain > 0 ? fc->gain : 1.0f);
    float *dq[3];
    struct tensor *gate = rand_experts(fc->type, E, F, X, gs, &dq[0]);
    gate->name = "gate_exps";
    struct moe_experts w = {.gate = gate,
                            .up = rand_experts(fc->type, E, F, X, gs, &dq[1]),
                            .down = rand_experts(fc->type, F, E, X, ds, &dq[2]),
                            .act = fc->act};
    const float *bias[3] = {NULL, NULL, NULL};
    if (fc->bias) {
        struct tensor *gb = rand_f32(F, X, 0.5f), *ub = rand_f32(F, X, 0.5f),
                      *db = rand_f32(E, X, 0.5f);
        w.gate_b = gb;
        w.up_b = ub;
        w.down_b = db;
        bias[0] = gb->data;
        bias[1] = ub->data;
        bias[2] = db->data;
    }
    struct tensor *x = rand_f32(E, n, 1.0f), *router = rand_f32(E, X, ws);
    struct tensor *nw = rand_f32(E, 1, 0.2f);
    for (int64_t i = 0; i < E; i++)
        ((float *)nw->data)[i] += 1.0f;
    struct prenorm pre = {nw, 1e-6f};
    struct tensor *ids = bk_new(bk, QT_I32, k, n, 1), *wt = bk_new(bk, QT_F32, k, n, 1);
    bk_moe_route(bk, ids, wt, x, router, NULL, MOE_SOFTMAX_TOPK, &pre, NULL, NULL);
    /* every expert used by at least one row, most by several (a grouped matmul each) */
    int used = 0;
    for (int64_t e = 0; e < X; e++) {
        bool u = false;
        for (int64_t i = 0; i < n * k; i++)
            u |= ((int32_t *)ids->data)[i] == e;
        used += u;
    }

    struct tensor *y = bk_new(bk, QT_F32, E, n, 1);
    bk_moe_ffn(bk, y, x, &w, ids, wt, &pre, false, NULL);
    double *ref = malloc(sizeof(double) * (size_t)(E * n));
    ffn_ref(fc, x->data, nw->data, (const float *const *)dq, fc->bias ? bias : NULL, ids->data,
            wt->data, ref);
    /* exact: f32 arithmetic on the same weights; fast: 15-bit activations (K-quants and the
     * legacy types), f32 for F32/F16 weights */
    const bool f = fc->type == QT_F32 || fc->type == QT_F16;
    const double tol = exact || f ? 2e-5 : 3e-3;
    double err = rel_err(y->data, ref, E * n);
    T_CHECKF(err < tol, "%s %s: rel err %g (tol %g)", qtype_name(fc->type),
             exact ? "exact" : "fast", err, tol);

    /* accumulate: dst += y, and in place on x itself (the residual stream) */
    struct tensor *acc = rand_f32(E, n, 1.0f), *xc = bk_new(bk, QT_F32, E, n, 1);
    float *acc0 = malloc(tensor_nbytes(acc));
    memcpy(acc0, acc->data, tensor_nbytes(acc));
    memcpy(xc->data, x->data, tensor_nbytes(x));
    bk_moe_ffn(bk, acc, x, &w, ids, wt, &pre, true, NULL);
    bk_moe_ffn(bk, xc, xc, &w, ids, wt, &pre, true, NULL);
    double d_acc = 0, d_in = 0;
    for (int64_t i = 0; i < E * n; i++) {
        const float yi = ((float *)y->data)[i];
        d_acc = fmax(d_acc, fabs(((float *)acc->data)[i] - (acc0[i] + yi)));
        d_in = fmax(d_in, fabs(((float *)xc->data)[i] - (((float *)x->data)[i] + yi)));
    }
    T_CHECKF(d_acc == 0 && d_in == 0, "accumulate: %g, in place: %g", d_acc, d_in);

    /* each row alone */
    double bt = batch_tol(fc->type), worst = 0;
    for (int64_t r = 0; r < n; r++) {
        struct tensor *x1 = bk_view_2d(bk, x, E, 1, x->nb[1], (size_t)r * x->nb[1]);
        struct tensor *i1 = bk_view_2d(bk, ids, k, 1, ids->nb[1], (size_t)r * ids->nb[1]);
        struct tensor *w1 = bk_view_2d(bk, wt, k, 1, wt->nb[1], (size_t)r * wt->nb[1]);
        struct tensor *y1 = bk_new(bk, QT_F32, E, 1, 1);
        bk_moe_ffn(bk, y1, x1, &w, i1, w1, &pre, false, NULL);
        const float *a = y1->data, *b = tensor_row(y, r, 0, 0);
        double m = 0, mb = 1e-6;
        for (int64_t d = 0; d < E; d++)
            m = fmax(m, fabs(a[d] - b[d])), mb = fmax(mb, fabs(b[d]));
        worst = fmax(worst, m / mb);
    }
    T_CHECKF(worst <= bt, "%s %s: a row alone vs in the batch: rel %g (tol %g)",
             qtype_name(fc->type), exact ? "exact" : "fast", worst, bt);
    struct err e;
    T_CHECK(bk_sync(bk, &e) == SMELT_OK);
    printf(
        "moe_ffn %-5s %-5s %s%s n_embd %3lld n_ff %3lld experts %2lld (%d used) k %lld rows %2lld: "
        "rel err %.2e, row alone vs batch %.2e\n",
        qtype_name(fc->type), exact ? "exact" : "fast",
        fc->act == GLU_SWIGLU_OAI ? "oai"
        : fc->act == GLU_SILU     ? "silu"
                                  : "gelu",
        fc->bias ? "+bias" : "", (long long)E, (long long)F, (long long)X, used, (long long)k,
        (long long)n, err, worst);
    T_CHECK(used >= (X / 2 < n * k ? X / 2 : n * k));
    cpu_backend_set_exact(bk, false);
    free(ref);
    free(acc0);
    for (int i = 0; i < 3; i++)
        free(dq[i]);
}

static void test_ffn(void) {
    const struct ffn_case cases[] = {
        {QT_F32, 96, 40, 11, 3, 17, GLU_SILU, false, 0},
        {QT_F16, 72, 24, 6, 2, 5, GLU_GELU_TANH, false, 0},
        {QT_Q8_0, 96, 64, 11, 3, 17, GLU_SILU, false, 0},
        {QT_Q4_0, 64, 32, 9, 4, 12, GLU_SILU, false, 0},
        {QT_Q5_1, 96, 32, 5, 2, 3, GLU_GELU_TANH, false, 0},
        {QT_Q4_K, 256, 256, 8, 3, 21, GLU_SILU, false,
         0}, /* >= 8 rows on some experts: packed path */
        {QT_Q6_K, 256, 256, 6, 2, 4, GLU_SILU, false, 0},
        {QT_Q8_0, 64, 32, 8, 4, 300, GLU_SILU, false,
         0}, /* 1200 (row, expert) pairs: groups of experts */
        /* gpt-oss: expert biases, the clamped SwiGLU with gate/up values well past its
         * limits (gain 5: |gate| ~ 5), MXFP4 experts as the real checkpoints ship them */
        {QT_F32, 96, 40, 16, 4, 17, GLU_SWIGLU_OAI, true, 5.0f},
        {QT_MXFP4, 64, 96, 16, 4, 23, GLU_SWIGLU_OAI, true, 5.0f},
        {QT_MXFP4, 128, 64, 32, 4, 1, GLU_SWIGLU_OAI, true, 5.0f}, /* decode: one row */
        {QT_Q8_0, 64, 32, 16, 4, 300, GLU_SWIGLU_OAI, true, 5.0f}, /* several groups */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_ffn(&cases[i], false);
        check_ffn(&cases[i], true);
    }
}

/* An id outside the experts is a sticky error naming the tensor, not a wild read. */
static void test_bad_id(void) {
    bk_step_begin(bk);
    float *dq[3];
    struct tensor *gate = rand_experts(QT_F32, 32, 16, 4, 0.2f, &dq[0]);
    gate->name = "blk.3.ffn_gate_exps.weight";
    struct moe_experts w = {.gate = gate,
                            .up = rand_experts(QT_F32, 32, 16, 4, 0.2f, &dq[1]),
                            .down = rand_experts(QT_F32, 16, 32, 4, 0.2f, &dq[2]),
                            .act = GLU_SILU};
    struct tensor *x = rand_f32(32, 2, 1.0f), *y = bk_new(bk, QT_F32, 32, 2, 1);
    struct tensor *ids = bk_new(bk, QT_I32, 2, 2, 1), *wt = rand_f32(2, 2, 1.0f);
    const int32_t bad[4] = {0, 1, 3, 4};
    memcpy(ids->data, bad, sizeof bad);
    bk_moe_ffn(bk, y, x, &w, ids, wt, NULL, false, NULL);
    struct err e;
    T_CHECK(bk_sync(bk, &e) != SMELT_OK);
    T_CHECKF(strstr(e.msg, "blk.3.ffn_gate_exps.weight") && strstr(e.msg, "expert 4"), "%s", e.msg);
    /* a row listing an expert twice: harmless in a small step; where it would overflow
     * the rows an expert can have (600 rows, both slots expert 2), a sticky error */
    bk_step_begin(bk); /* clears the error, and the scratch the experts were in */
    for (int i = 0; i < 3; i++)
        free(dq[i]);
    w.gate = rand_experts(QT_F32, 32, 16, 4, 0.2f, &dq[0]);
    w.up = rand_experts(QT_F32, 32, 16, 4, 0.2f, &dq[1]);
    w.down = rand_experts(QT_F32, 16, 32, 4, 0.2f, &dq[2]);
    x = rand_f32(32, 600, 1.0f);
    y = bk_new(bk, QT_F32, 32, 600, 1);
    ids = bk_new(bk, QT_I32, 2, 600, 1);
    wt = rand_f32(2, 600, 1.0f);
    for (int i = 0; i < 1200; i++)
        ((int32_t *)ids->data)[i] = 2;
    bk_moe_ffn(bk, y, x, &w, ids, wt, NULL, false, NULL);
    T_CHECK(bk_sync(bk, &e) != SMELT_OK);
    T_CHECKF(strstr(e.msg, "expert 2 is listed twice"), "%s", e.msg);
    for (int i = 0; i < 3; i++)
        free(dq[i]);
}

/* A shared expert (struct moe_experts' sh_*): the op's result is, bit for bit, the experts
 * alone followed by the shared expert through the generic ops (bk_ffn_glu, the gate's
 * bk_glu, bk_matmul_acc), gated and ungated, plain, accumulating and in place. */
static void test_ffn_shared(void) {
    const int64_t E = 256, F = 256, X = 8, k = 2, n = 5;
    for (int gated = 0; gated < 2; gated++)
        for (int mode = 0; mode < 3; mode++) { /* plain, accumulate, in place */
            bk_step_begin(bk);
            float *dq[6];
            struct moe_experts w = {.gate = rand_experts(QT_Q4_K, E, F, X, 0.06f, &dq[0]),
                                    .up = rand_experts(QT_Q4_K, E, F, X, 0.06f, &dq[1]),
                                    .down = rand_experts(QT_Q6_K, F, E, X, 0.12f, &dq[2]),
                                    .act = GLU_SILU};
            struct moe_experts ws = w;
            ws.sh_gate = rand_experts(QT_Q4_K, E, F, 1, 0.06f, &dq[3]);
            ws.sh_up = rand_experts(QT_Q4_K, E, F, 1, 0.06f, &dq[4]);
            ws.sh_down = rand_experts(QT_Q6_K, F, E, 1, 0.12f, &dq[5]);
            ws.sh_logit = gated ? rand_f32(1, n, 2.0f) : NULL;
            struct tensor *x = rand_f32(E, n, 1.0f), *router = rand_f32(E, X, 0.06f);
            struct tensor *nw = rand_f32(E, 1, 0.2f);
            struct prenorm pre = {nw, 1e-6f};
            struct tensor *ids = bk_new(bk, QT_I32, k, n, 1), *wt = bk_new(bk, QT_F32, k, n, 1);
            bk_moe_route(bk, ids, wt, x, router, NULL, MOE_SOFTMAX_TOPK, &pre, NULL, NULL);
            struct tensor *y = rand_f32(E, n, 1.0f), *r = bk_new(bk, QT_F32, E, n, 1);
            if (mode == 2) memcpy(y->data, x->data, tensor_nbytes(x));
            memcpy(r->data, y->data, tensor_nbytes(y));
            /* the reference: the shared expert's hidden rows from x first (r may be x's copy) */
            struct tensor *h = bk_new(bk, QT_F32, F, n, 1);
            bk_ffn_glu(bk, h, ws.sh_gate, ws.sh_up, x, GLU_SILU, &pre);
            if (gated) bk_glu(bk, h, ws.sh_logit, h, GLU_SIGMOID);
            bk_moe_ffn(bk, r, mode == 2 ? r : x, &w, ids, wt, &pre, mode != 0, NULL);
            bk_matmul_acc(bk, r, ws.sh_down, NULL, h, NULL);
            bk_moe_ffn(bk, y, mode == 2 ? y : x, &ws, ids, wt, &pre, mode != 0, NULL);
            struct err e;
            T_CHECK(bk_sync(bk, &e) == SMELT_OK);
            T_CHECKF(!memcmp(y->data, r->data, tensor_nbytes(y)),
                     "shared expert (gated %d, mode %d): differs from the composed ops", gated, mode);
            /* the router's gate logits: bk_matmul_group's bits */
            struct tensor *gi = rand_f32(E, 1, 0.06f), *l1 = bk_new(bk, QT_F32, 1, n, 1),
                          *l2 = bk_new(bk, QT_F32, 1, n, 1);
            bk_moe_route(bk, ids, wt, x, router, NULL, MOE_SOFTMAX_TOPK, &pre, gi, l1);
            bk_matmul_group(bk, 1, &l2, (const struct tensor *const *)&gi, NULL, x, &pre);
            T_CHECK(bk_sync(bk, &e) == SMELT_OK);
            T_CHECK(!memcmp(l1->data, l2->data, tensor_nbytes(l1)));
            for (int i = 0; i < 6; i++)
                free(dq[i]);
        }
}

int main(void) {
    struct err e;
    if (cpu_backend_new(&bk, 0, &e) != SMELT_OK) return 1;
    T_CHECK(bk_has_moe(bk));
    T_RUN(test_route);
    T_RUN(test_route_ties);
    T_RUN(test_ffn);
    T_RUN(test_ffn_shared);
    T_RUN(test_bad_id);
    bk_free(bk);
    return t_done();
}
