/* The CUDA mixture-of-experts ops (cuda_ops_moe.c: cuda_moe.cu and the mmv kernels' expert
 * mode) against their CPU twin (cpu_ops_moe.c), on fresh random data at ragged sizes:
 *   - router: rows of 1..37 and 150, 7..40 experts, k 1..8, both gatings, with and without the
 *     norm and a bias, two experts with the same router row (a tie the lower id must win):
 *     ids equal to a double reference wherever no other logit is within 1e-5 of the k-th,
 *     weights within 1e-5; every row routed alone gets the same bits as in the batch;
 *   - expert FFN, decode (n <= 8: one chunk per (row, slot); MXFP4 experts at 2..8 rows
 *     grouped by expert in chunks of 2) and grouped (n > 8: rows grouped by expert on the
 *     device) against the CPU's exact path (dequantized weights,
 *     f32 activations) on the GPU's own routing: F32/F16/BF16 experts within 1e-4 of the
 *     largest output, the int8-activation types (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q5_1,
 *     IQ4_NL, ...; MXFP4 runs as F16) within 3e-2 and cosine >= 0.999 per row; gpt-oss's
 *     experts (biases, the clamped SwiGLU past its limits); accumulate and in place;
 *   - batch invariance: a decode row alone equals its row in a decode batch bit for bit, a
 *     grouped row equals its row in another grouped batch bit for bit, and decode and
 *     grouped forms of a row agree to cosine 0.99999 (0.9999 where the grouped form is mmq:
 *     f16 against int8 activations; 0.99993 seen on the emulator);
 *   - an id outside [0, n_expert) is skipped (no out-of-bounds read, the rest unchanged);
 *   - decode's fused epilogues (h's int8 form in the gate/up launch, the weighted sum in the
 *     down launch, the default) give the same bits as the separate launches (SMELT_MOE_FUSED=0);
 *   - with the next norm given, the product after the FFN (on the prepared form the weighted
 *     sum writes) matches fused against separate bit for bit, and the same product on dst
 *     without the prepared form to cosine 0.9999;
 *   - the grouped path on both kinds of products (a second backend made with
 *     SMELT_MOE_PATH=mmv runs the mmv-by-id kernels for the types mmq also takes), and on
 *     given routings (9..512 rows; uniform, every row's first slot on expert 0 with the rest
 *     on a few experts so that most have none, all slots on the same experts, odd shapes):
 *     against the CPU twin, and every row of a batch bitwise equal to the same row in a
 *     smaller batch with other rows' experts (mmq rows differ from mmv rows in bits: f16
 *     against int8 activations; compared by cosine).
 * Skips (77) without a GPU. */
#ifndef SMELT_HAVE_CUDA
#include <stdio.h>

int main(void) {
    printf("SKIP test_cuda_moe: built without CUDA (nvcc not found at configure time)\n");
    return 77;
}
#else

#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "quant/quant.h"
#include "moe_ref.h"

static struct backend *cpu, *gpu, *gpu_mmq, *gpu_mmv;
static struct backend *gpu_unf; /* the defaults: decode's separate quantize and combine */
static unsigned long long rng = 0x6375646d6f65ULL;

static float *randv(int64_t n, float scale) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[i] = scale * t_randn(&rng);
    return v;
}

/* A weight bound to the GPU from host bytes (the host copy is the caller's), named (the
 * binding treats a few names apart: ffn_gate_inp_shexp) or not. */
static struct tensor *gpu_weight_named(uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2, void *host,
                                       const char *name) {
    struct tensor *t = calloc(1, sizeof *t);
    struct err e;
    tensor_init(t, type, ne0, ne1, ne2, 1);
    t->data = host;
    t->name = name;
    if (bk_weight_bind(gpu, t, &e) != SMELT_OK) {
        fprintf(stderr, "bind: %s\n", e.msg);
        T_CHECK(0);
    }
    return t;
}

static struct tensor *gpu_weight(uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2, void *host) {
    return gpu_weight_named(type, ne0, ne1, ne2, host, NULL);
}

/* A CPU scratch tensor holding a copy of host data. */
static struct tensor *cpu_tensor(uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                                 const void *host) {
    struct tensor *t = bk_new(cpu, type, ne0, ne1, ne2);
    memcpy(t->data, host, tensor_nbytes(t));
    return t;
}

/* A GPU scratch tensor holding a copy of host data (uploaded). */
static struct tensor *gpu_tensor(uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                                 const void *host) {
    struct tensor *t = bk_new(gpu, type, ne0, ne1, ne2);
    if (host) bk_upload(gpu, t, host, tensor_nbytes(t));
    return t;
}

static bool gpu_sync(void) {
    struct err e;
    if (bk_sync(gpu, &e) != SMELT_OK) {
        fprintf(stderr, "gpu: %s\n", e.msg);
        return false;
    }
    return true;
}


/* The GPU's route of x (E, n): ids, weights to host. */
static bool gpu_route(const struct route_case *rc, const float *x, int64_t n,
                      const struct tensor *router, const struct tensor *bias,
                      const struct tensor *nw, const struct tensor *sg, int32_t *ids, float *wt,
                      float *sl) {
    bk_step_begin(gpu);
    struct tensor *gx = gpu_tensor(QT_F32, rc->n_embd, n, 1, x);
    struct tensor *gi = gpu_tensor(QT_I32, rc->k, n, 1, NULL),
                  *gw = gpu_tensor(QT_F32, rc->k, n, 1, NULL), *gl = gpu_tensor(QT_F32, 1, n, 1, NULL);
    struct prenorm pre = {nw, 1e-6f};
    bk_moe_route(gpu, gi, gw, gx, router, bias, rc->gating, rc->pre ? &pre : NULL, sg, gl);
    bk_download(gpu, ids, gi, (size_t)(rc->k * n) * 4);
    bk_download(gpu, wt, gw, (size_t)(rc->k * n) * 4);
    bk_download(gpu, sl, gl, (size_t)n * 4);
    return gpu_sync();
}

static void check_route(const struct route_case *rc) {
    const int64_t E = rc->n_embd, X = rc->n_expert, k = rc->k, n = rc->n;
    float *x = randv(E * n, 1.0f), *rw = randv(E * X, 1.0f / sqrtf((float)E));
    float *bv = randv(X, 0.3f), *nwv = randv(E, 0.2f);
    for (int64_t i = 0; i < E; i++)
        nwv[i] += 1.0f;
    memcpy(rw + (X - 1) * E, rw + 1 * E, (size_t)E * 4); /* a tie: expert X - 1 = expert 1 */
    struct tensor *router = gpu_weight(QT_F32, E, X, 1, rw),
                  *bias = rc->bias ? gpu_weight(QT_F32, X, 1, 1, bv) : NULL;
    struct tensor *nw = gpu_weight(QT_F32, E, 1, 1, nwv);
    /* the shared expert's gate row: its logit as one more row of the router */
    float *sgv = randv(E, 1.0f / sqrtf((float)E)), *sl = malloc(sizeof(float) * (size_t)n);
    struct tensor *sg = gpu_weight_named(QT_F32, E, 1, 1, sgv, "blk.0.ffn_gate_inp_shexp.weight");
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(k * n)),
            *want = malloc(sizeof(int32_t) * (size_t)k);
    float *wt = malloc(sizeof(float) * (size_t)(k * n));
    T_CHECK(gpu_route(rc, x, n, router, bias, nw, sg, ids, wt, sl));
    double *h = malloc(sizeof(double) * (size_t)E), *lg = malloc(sizeof(double) * (size_t)X),
           werr = 0, serr = 0;
    int checked = 0;
    for (int64_t r = 0; r < n; r++) {
        if (rc->pre)
            norm_ref(x + r * E, nwv, E, 1e-6f, h);
        else
            for (int64_t i = 0; i < E; i++)
                h[i] = x[r * E + i];
        for (int64_t q = 0; q < X; q++) {
            double s = rc->bias ? bv[q] : 0;
            for (int64_t i = 0; i < E; i++)
                s += rw[q * E + i] * h[i];
            lg[q] = s;
        }
        double gs = 0, ga = 0; /* the shared gate's logit, against sum |g| |x'| */
        for (int64_t i = 0; i < E; i++)
            gs += sgv[i] * h[i], ga += fabs(sgv[i] * h[i]);
        serr = fmax(serr, fabs(sl[r] - gs) / (ga + 1e-30));
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
        const int32_t *got = ids + r * k;
        const float *gw = wt + r * k;
        for (int64_t j = 0; j < k && !rc->bias; j++) /* the tie: 1 first, X - 1 right after */
            T_CHECKF(got[j] != X - 1 || (j > 0 && got[j - 1] == 1) || X - 1 == 1,
                     "row %lld: expert %lld (tied with 1) taken without 1 just before it",
                     (long long)r, (long long)(X - 1));
        bool clear = true; /* no other logit within 1e-5 of the k-th (rounding could order it) */
        for (int64_t q = 0; q < X; q++) {
            bool in = false;
            for (int64_t j = 0; j < k; j++)
                in |= want[j] == q;
            for (int64_t j = 0; j < k && !in; j++)
                if (fabs(lg[q] - lg[want[j]]) < 1e-5 && q != X - 1) clear = false;
        }
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
    T_CHECKF(werr < 1e-5, "weights: max error %g", werr);
    T_CHECKF(serr < 1e-5, "shared gate logits: max error %g of sum |g x'|", serr);
    /* batch invariance: each row routed alone gets the same bits (the shared gate's logit too
     * where both are decode steps, which compute it in the router's launch) */
    int32_t i1[64];
    float w1[64], s1;
    for (int64_t r = 0; r < n; r++) {
        T_CHECK(gpu_route(rc, x + r * E, 1, router, bias, nw, sg, i1, w1, &s1));
        T_CHECKF(!memcmp(i1, ids + r * k, (size_t)k * 4) && !memcmp(w1, wt + r * k, (size_t)k * 4),
                 "row %lld routed alone differs from the batch", (long long)r);
        T_CHECKF(n > 8 || !memcmp(&s1, sl + r, 4), "row %lld: shared gate logit alone %.9g, in the batch %.9g",
                 (long long)r, s1, sl[r]);
    }
    free(x), free(rw), free(bv), free(nwv), free(ids), free(want), free(wt), free(h), free(lg);
    free(sgv), free(sl);
}

static void test_route(void) {
    const struct route_case cases[] = {
        /* n_embd: a multiple of 32, as every GPU weight's row */
        {96, 19, 5, 13, MOE_SOFTMAX_TOPK, false, true},
        {96, 19, 5, 13, MOE_SOFTMAX, true, true},
        {64, 16, 4, 9, MOE_SOFTMAX_TOPK, true, false},
        {32, 7, 1, 6, MOE_SOFTMAX, false, false},
        {32, 7, 7, 6, MOE_SOFTMAX_TOPK, false, true},
        {288, 40, 8, 37, MOE_SOFTMAX_TOPK, false, true},
        {160, 32, 4, 1, MOE_SOFTMAX_TOPK, true, true},
        /* a block a row from ROUTE_ROWS_WHOLE (128) rows: each row alone takes the spread form */
        {160, 40, 8, 150, MOE_SOFTMAX_TOPK, true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_route(&cases[i]);
}

/* ---- expert FFN ---- */

struct ffn_case {
    uint32_t type;
    int64_t n_embd, n_ff, n_expert, k;
    enum glu_act act;
    bool bias;
    float gain; /* gate/up scale x 1/sqrt(n_embd) (0: 1): large enough for the OAI clamps */
    int shared; /* a shared expert of the experts' type and shape: 1 gated, 2 ungated, 0 none */
};

/* Host bytes of a random (ne0, ne1, ne2) weight stored as type. */
static void *rand_weight(uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2, float scale) {
    const int64_t nel = ne0 * ne1 * ne2;
    float *v = randv(nel, scale);
    struct tensor t;
    tensor_init(&t, type, ne0, ne1, ne2, 1);
    void *q = malloc(tensor_nbytes(&t));
    if (type == QT_F32)
        memcpy(q, v, (size_t)nel * 4);
    else
        qtype_get(type)->quantize(v, q, nel);
    free(v);
    return q;
}

struct ffn_setup {
    const struct ffn_case *fc;
    void *hw[6];           /* host bytes of gate, up, down; the shared expert's (or NULL) */
    float *hb[3];          /* host biases or NULL */
    float *nwv, *rw;       /* norm weight, router */
    float *sl;             /* the shared expert's gate logits, SHARED_ROWS (or NULL) */
    struct moe_experts gw; /* bound to the GPU */
    struct tensor *g_nw, *g_router;
};

static void bind_ffn(struct ffn_setup *s);
#define SHARED_ROWS 64 /* rows a shared-expert case runs at most */

static void setup_ffn(struct ffn_setup *s, const struct ffn_case *fc) {
    memset(s, 0, sizeof *s);
    s->fc = fc;
    const int64_t E = fc->n_embd, F = fc->n_ff, X = fc->n_expert;
    const float ws = 1.0f / sqrtf((float)E), gs = ws * (fc->gain > 0 ? fc->gain : 1.0f);
    s->hw[0] = rand_weight(fc->type, E, F, X, gs);
    s->hw[1] = rand_weight(fc->type, E, F, X, gs);
    s->hw[2] = rand_weight(fc->type, F, E, X, 1.0f / sqrtf((float)F));
    if (fc->bias)
        s->hb[0] = randv(F * X, 0.5f), s->hb[1] = randv(F * X, 0.5f), s->hb[2] = randv(E * X, 0.5f);
    s->nwv = randv(E, 0.2f);
    for (int64_t i = 0; i < E; i++)
        s->nwv[i] += 1.0f;
    s->rw = randv(E * X, ws);
    if (fc->shared) {
        s->hw[3] = rand_weight(fc->type, E, F, 1, gs);
        s->hw[4] = rand_weight(fc->type, E, F, 1, gs);
        s->hw[5] = rand_weight(fc->type, F, E, 1, 1.0f / sqrtf((float)F));
        s->sl = randv(SHARED_ROWS, 2.0f);
    }
    bind_ffn(s);
}

/* s's host weights bound to gpu (the current one). */
static void bind_ffn(struct ffn_setup *s) {
    const struct ffn_case *fc = s->fc;
    const int64_t E = fc->n_embd, F = fc->n_ff, X = fc->n_expert;
    s->gw.gate = gpu_weight(fc->type, E, F, X, s->hw[0]);
    s->gw.up = gpu_weight(fc->type, E, F, X, s->hw[1]);
    s->gw.down = gpu_weight(fc->type, F, E, X, s->hw[2]);
    s->gw.act = fc->act;
    if (fc->bias) {
        s->gw.gate_b = gpu_weight(QT_F32, F, X, 1, s->hb[0]);
        s->gw.up_b = gpu_weight(QT_F32, F, X, 1, s->hb[1]);
        s->gw.down_b = gpu_weight(QT_F32, E, X, 1, s->hb[2]);
    }
    s->g_nw = gpu_weight(QT_F32, E, 1, 1, s->nwv);
    s->g_router = gpu_weight(QT_F32, E, X, 1, s->rw);
    if (fc->shared) {
        s->gw.sh_gate = gpu_weight(fc->type, E, F, 1, s->hw[3]);
        s->gw.sh_up = gpu_weight(fc->type, E, F, 1, s->hw[4]);
        s->gw.sh_down = gpu_weight(fc->type, F, E, 1, s->hw[5]);
    }
}

static void free_ffn(struct ffn_setup *s) {
    for (int i = 0; i < 3; i++)
        free(s->hw[i]), free(s->hb[i]), free(s->hw[3 + i]);
    free(s->nwv), free(s->rw), free(s->sl);
    /* bound tensors stay with the backend until it is freed */
}

/* The GPU's route + FFN of x (E, n): y (E, n), ids/weights (k, n) to host. acc: y starts as
 * y_in and gets the FFN added; in_place: dst is x itself. bad: ids[bad] is replaced by an
 * out-of-range id before the FFN (-1: none). */
static bool gpu_ffn(struct ffn_setup *s, const float *x, int64_t n, float *y, int32_t *ids,
                    float *wt, bool acc, bool in_place, int bad) {
    const struct ffn_case *fc = s->fc;
    const int64_t E = fc->n_embd, k = fc->k;
    bk_step_begin(gpu);
    struct tensor *gx = gpu_tensor(QT_F32, E, n, 1, x);
    struct tensor *gi = gpu_tensor(QT_I32, k, n, 1, NULL), *gwt = gpu_tensor(QT_F32, k, n, 1, NULL);
    struct prenorm pre = {s->g_nw, 1e-6f};
    bk_moe_route(gpu, gi, gwt, gx, s->g_router, NULL, MOE_SOFTMAX_TOPK, &pre, NULL, NULL);
    if (bad >= 0) {
        int32_t v = (int32_t)(fc->n_expert + 5);
        struct tensor *one = bk_view_2d(gpu, gi, 1, 1, gi->nb[1], (size_t)bad * 4);
        bk_upload(gpu, one, &v, 4);
    }
    struct tensor *dst = in_place ? gx : gpu_tensor(QT_F32, E, n, 1, acc ? y : NULL);
    struct moe_experts w = s->gw;
    if (fc->shared == 1) w.sh_logit = gpu_tensor(QT_F32, 1, n, 1, s->sl);
    bk_moe_ffn(gpu, dst, gx, &w, gi, gwt, &pre, acc, NULL);
    bk_download(gpu, y, dst, (size_t)(E * n) * 4);
    bk_download(gpu, ids, gi, (size_t)(k * n) * 4);
    bk_download(gpu, wt, gwt, (size_t)(k * n) * 4);
    return gpu_sync();
}

/* The CPU twin (exact path) on the given routing: y (E, n). */
static bool cpu_ffn(struct ffn_setup *s, const float *x, int64_t n, const int32_t *ids,
                    const float *wt, float *y) {
    const struct ffn_case *fc = s->fc;
    const int64_t E = fc->n_embd, F = fc->n_ff, X = fc->n_expert, k = fc->k;
    bk_step_begin(cpu);
    cpu_backend_set_exact(cpu, true);
    struct moe_experts w = {cpu_tensor(fc->type, E, F, X, s->hw[0]),
                            cpu_tensor(fc->type, E, F, X, s->hw[1]),
                            cpu_tensor(fc->type, F, E, X, s->hw[2]),
                            fc->act,
                            NULL,
                            NULL,
                            NULL,
                            NULL,
                            NULL,
                            NULL,
                            NULL};
    if (fc->shared) {
        w.sh_gate = cpu_tensor(fc->type, E, F, 1, s->hw[3]);
        w.sh_up = cpu_tensor(fc->type, E, F, 1, s->hw[4]);
        w.sh_down = cpu_tensor(fc->type, F, E, 1, s->hw[5]);
        if (fc->shared == 1) w.sh_logit = cpu_tensor(QT_F32, 1, n, 1, s->sl);
    }
    if (fc->bias) {
        w.gate_b = cpu_tensor(QT_F32, F, X, 1, s->hb[0]);
        w.up_b = cpu_tensor(QT_F32, F, X, 1, s->hb[1]);
        w.down_b = cpu_tensor(QT_F32, E, X, 1, s->hb[2]);
    }
    struct prenorm pre = {cpu_tensor(QT_F32, E, 1, 1, s->nwv), 1e-6f};
    struct tensor *cx = cpu_tensor(QT_F32, E, n, 1, x), *dst = bk_new(cpu, QT_F32, E, n, 1);
    bk_moe_ffn(cpu, dst, cx, &w, cpu_tensor(QT_I32, k, n, 1, ids), cpu_tensor(QT_F32, k, n, 1, wt),
               &pre, false, NULL);
    struct err e;
    if (bk_sync(cpu, &e) != SMELT_OK) {
        fprintf(stderr, "cpu: %s\n", e.msg);
        return false;
    }
    memcpy(y, dst->data, (size_t)(E * n) * 4);
    return true;
}

static double cosine(const float *a, const float *b, int64_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++)
        ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / (sqrt(aa * bb) + 1e-30);
}

static bool float_type(uint32_t t) {
    return t == QT_F32 || t == QT_F16 || t == QT_BF16;
}

/* The grouped rows of this case run on mmq by id (cuda_ops_moe.c's condition). */
static bool mmq_type(const struct ffn_case *fc) {
    const bool t = fc->type == QT_Q4_K || fc->type == QT_Q6_K || fc->type == QT_Q8_0 || fc->type == QT_MXFP4;
    const int64_t m = fc->type == QT_Q8_0 ? 64 : fc->type == QT_MXFP4 ? 32 : 256;
    return t && fc->n_embd % m == 0 && fc->n_ff % m == 0;
}

static void check_ffn(const struct ffn_case *fc) {
    if (!float_type(fc->type) && !qtype_get(fc->type)->quantize) return;
    struct ffn_setup s;
    setup_ffn(&s, fc);
    const int64_t E = fc->n_embd, k = fc->k, NMAX = 29;
    const int64_t ns[] = {1, 3, 8, 13, NMAX};
    float *x = randv(E * NMAX, 1.0f), *y = malloc(sizeof(float) * (size_t)(E * NMAX));
    float *yc = malloc(sizeof(float) * (size_t)(E * NMAX)),
          *wt = malloc(sizeof(float) * (size_t)(k * NMAX));
    float *y1 = malloc(sizeof(float) * (size_t)(E * NMAX));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(k * NMAX));
    const double tol = float_type(fc->type) ? 1e-4 : 3e-2;
    double worst_err = 0, worst_cos = 1;
    for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
        const int64_t n = ns[in];
        T_CHECK(gpu_ffn(&s, x, n, y, ids, wt, false, false, -1) && cpu_ffn(&s, x, n, ids, wt, yc));
        double mx = 1e-6, d = 0;
        for (int64_t i = 0; i < E * n; i++)
            mx = fmax(mx, fabs(yc[i])), d = fmax(d, fabs(y[i] - yc[i]));
        worst_err = fmax(worst_err, d / mx);
        for (int64_t r = 0; r < n; r++)
            worst_cos = fmin(worst_cos, cosine(y + r * E, yc + r * E, E));
        /* batch invariance: the first rows of this batch against the same rows in the batch
         * of the same form before (decode: 1 <- 3 <- 8; grouped: 13 <- 29), bitwise; across
         * forms (8 -> 13) to cosine 0.99999. Grouped rows on mmq are not bitwise: its
         * stream-K grid (SMs x resident blocks, and the bound of the batch's tiles) decides
         * which K slices of a tile one block sums in its registers, so they are held to
         * f32 rounding (under compute-sanitizer, whose instrumented kernels fit fewer blocks
         * an SM, 13 and 29 rows split differently) */
        if (in > 0) {
            const int64_t m = ns[in - 1];
            const bool same_form = (n <= 8) == (m <= 8);
            for (int64_t r = 0; r < m; r++) {
                if (same_form && n > 8 && mmq_type(fc))
                    T_CHECKF(cosine(y + r * E, y1 + r * E, E) >= 0.9999999,
                             "%s: row %lld, %lld vs %lld grouped rows on mmq: cosine %.9f", qtype_name(fc->type),
                             (long long)r, (long long)n, (long long)m, cosine(y + r * E, y1 + r * E, E));
                else if (same_form)
                    T_CHECKF(!memcmp(y + r * E, y1 + r * E, (size_t)E * 4),
                             "%s: row %lld in a batch of %lld differs from a batch of %lld",
                             qtype_name(fc->type), (long long)r, (long long)n, (long long)m);
                else /* mmq's grouped rows (f16 activations) against mmv's (int8): 0.9999 */
                    T_CHECKF(cosine(y + r * E, y1 + r * E, E) >= (mmq_type(fc) ? 0.9999 : 0.99999),
                             "%s: row %lld, %lld vs %lld rows: cosine %f", qtype_name(fc->type),
                             (long long)r, (long long)n, (long long)m,
                             cosine(y + r * E, y1 + r * E, E));
            }
        }
        memcpy(y1, y, sizeof(float) * (size_t)(E * n));
    }
    printf("moe ffn %-6s %lldx%lld x%lld experts top %lld%s%s%s: max err %.2e of the largest output, "
           "worst row cosine "
           "%.6f\n",
           qtype_name(fc->type), (long long)E, (long long)fc->n_ff, (long long)fc->n_expert,
           (long long)k, fc->bias ? " biases" : "", fc->act == GLU_SWIGLU_OAI ? " oai" : "",
           fc->shared == 1 ? " shared" : fc->shared == 2 ? " shared (ungated)" : "", worst_err, worst_cos);
    T_CHECKF(worst_err < tol, "%s: max error %g", qtype_name(fc->type), worst_err);
    T_CHECKF(worst_cos >= (float_type(fc->type) ? 0.999999 : 0.999), "%s: cosine %f",
             qtype_name(fc->type), worst_cos);

    /* accumulate and in place: y = y_in + FFN(x), x = x + FFN(x), on both forms */
    for (int form = 0; form < 2; form++) {
        const int64_t n = form ? 13 : 3;
        T_CHECK(gpu_ffn(&s, x, n, y1, ids, wt, false, false, -1)); /* FFN(x) */
        float *yin = randv(E * n, 1.0f);
        memcpy(y, yin, sizeof(float) * (size_t)(E * n));
        T_CHECK(gpu_ffn(&s, x, n, y, ids, wt, true, false, -1));
        double d = 0;
        for (int64_t i = 0; i < E * n; i++)
            d = fmax(d, fabs(y[i] - (yin[i] + y1[i])));
        T_CHECKF(d < 1e-5, "accumulate: %g", d);
        T_CHECK(gpu_ffn(&s, x, n, y, ids, wt, true, true, -1));
        d = 0;
        for (int64_t i = 0; i < E * n; i++)
            d = fmax(d, fabs(y[i] - (x[i] + y1[i])));
        T_CHECKF(d < 1e-5, "in place: %g", d);
        /* a bad id: skipped; the other rows unchanged */
        T_CHECK(gpu_ffn(&s, x, n, y, ids, wt, false, false, (int)k + 1)); /* row 1, slot 1 */
        bool rest = true, finite = true;
        for (int64_t i = 0; i < E * n; i++) {
            finite &= isfinite(y[i]) != 0;
            if (i / E != 1) rest &= y[i] == y1[i];
        }
        T_CHECKF(finite && rest, "bad id: finite %d, other rows unchanged %d", finite, rest);
        free(yin);
    }
    /* decode's fused epilogues (h's int8 form in the gate/up launch, the weighted sum in the
     * down launch) against the separate launches: the same bits, plain and accumulating (both
     * epilogues at one row; at 3 and 8 rows h's int8 form only, the sum at one row,
     * MOE_FUSED_MAX_ROWS) */
    if (gpu_unf) {
        struct ffn_setup s2 = s;
        struct backend *g0 = gpu;
        const int64_t dn[] = {1, 3, 8};
        float *yin = randv(E * 8, 1.0f), *y2 = malloc(sizeof(float) * (size_t)(E * 8));
        gpu = gpu_unf;
        bind_ffn(&s2);
        gpu = g0;
        for (int acc = 0; acc < 2; acc++)
            for (size_t in = 0; in < sizeof dn / sizeof dn[0]; in++) {
                const int64_t n = dn[in];
                memcpy(y, yin, sizeof(float) * (size_t)(E * n));
                memcpy(y2, yin, sizeof(float) * (size_t)(E * n));
                T_CHECK(gpu_ffn(&s, x, n, y, ids, wt, acc, false, -1));
                gpu = gpu_unf;
                T_CHECK(gpu_ffn(&s2, x, n, y2, ids, wt, acc, false, -1));
                gpu = g0;
                T_CHECKF(!memcmp(y, y2, sizeof(float) * (size_t)(E * n)),
                         "%s: fused and separate decode differ (%lld rows, acc %d)",
                         qtype_name(fc->type), (long long)n, acc);
            }
        free(yin), free(y2);
    }
    free(x), free(y), free(yc), free(wt), free(y1), free(ids);
    free_ffn(&s);
}

/* ---- the next norm's input (bk_moe_ffn's next) ---- */

/* Route + FFN of x (E, n) into dst = x + FFN(x) with the next norm given, then the product
 * a decode step runs next through that norm (a Q5_0 (E, 64) matrix, as a QKV; a type the
 * 2-64-row kernel does not take, whose use is chosen by timing: H200 2026-12-04, a Q8_0 one
 * took it in one backend and not in the other under compute-sanitizer): q (64, n) to host. fresh: the product runs in a step of its own on dst's downloaded values, so no
 * prepared form exists and it norms and quantizes dst itself. */
static bool gpu_ffn_next(struct ffn_setup *s, const float *x, int64_t n, struct tensor *nw2,
                         struct tensor *wq, float *q, bool fresh) {
    const struct ffn_case *fc = s->fc;
    const int64_t E = fc->n_embd, k = fc->k;
    bk_step_begin(gpu);
    struct tensor *gx = gpu_tensor(QT_F32, E, n, 1, x);
    struct tensor *gi = gpu_tensor(QT_I32, k, n, 1, NULL), *gwt = gpu_tensor(QT_F32, k, n, 1, NULL);
    struct prenorm pre = {s->g_nw, 1e-6f}, next = {nw2, 1e-5f};
    struct tensor *dst = gpu_tensor(QT_F32, E, n, 1, x);
    bk_moe_route(gpu, gi, gwt, gx, s->g_router, NULL, MOE_SOFTMAX_TOPK, &pre, NULL, NULL);
    struct moe_experts w = s->gw;
    if (fc->shared == 1) w.sh_logit = gpu_tensor(QT_F32, 1, n, 1, s->sl);
    bk_moe_ffn(gpu, dst, gx, &w, gi, gwt, &pre, true, &next);
    struct tensor *gq = gpu_tensor(QT_F32, 64, n, 1, NULL);
    if (fresh) {
        float *h = malloc(sizeof(float) * (size_t)(E * n));
        bk_download(gpu, h, dst, (size_t)(E * n) * 4);
        bool ok = gpu_sync();
        bk_step_begin(gpu);
        dst = gpu_tensor(QT_F32, E, n, 1, h);
        gq = gpu_tensor(QT_F32, 64, n, 1, NULL);
        free(h);
        if (!ok) return false;
    }
    bk_matmul_group(gpu, 1, &gq, (const struct tensor *const *)&wq, NULL, dst, &next);
    bk_download(gpu, q, gq, (size_t)(64 * n) * 4);
    return gpu_sync();
}

/* Decode with the next norm given: the weighted sum also writes dst's prepared form for the
 * next product (cb->prep). That product gives the same bits with the fused launches (one
 * row) and the separate ones, and cosine >= 0.9999 per row against the same product on dst
 * without a prepared form. (Not bitwise across row counts: the dense one-row and multi-row
 * products may round differently, docs/cuda-backend.md; dst itself is, check_ffn.) */
static void check_next(const struct ffn_case *fc) {
    if (fc->n_embd % 32 != 0 || (!float_type(fc->type) && !qtype_get(fc->type)->quantize)) return;
    const int64_t E = fc->n_embd, dn[] = {1, 3, 8};
    struct ffn_setup s, s2;
    setup_ffn(&s, fc);
    float *x = randv(E * 8, 1.0f), *nv = randv(E, 0.2f);
    for (int64_t i = 0; i < E; i++)
        nv[i] += 1.0f;
    void *hq = rand_weight(QT_Q5_0, E, 64, 1, 1.0f / sqrtf((float)E));
    struct tensor *nw = gpu_weight(QT_F32, E, 1, 1, nv), *wq = gpu_weight(QT_Q5_0, E, 64, 1, hq);
    struct backend *g0 = gpu;
    gpu = gpu_unf;
    s2 = s;
    bind_ffn(&s2);
    struct tensor *nw_u = gpu_weight(QT_F32, E, 1, 1, nv), *wq_u = gpu_weight(QT_Q5_0, E, 64, 1, hq);
    gpu = g0;
    float q[64 * 8], qu[64 * 8], qf[64 * 8];
    double worst = 1;
    for (size_t in = 0; in < sizeof dn / sizeof dn[0]; in++) {
        const int64_t n = dn[in];
        T_CHECK(gpu_ffn_next(&s, x, n, nw, wq, q, false) && gpu_ffn_next(&s, x, n, nw, wq, qf, true));
        gpu = gpu_unf;
        T_CHECK(gpu_ffn_next(&s2, x, n, nw_u, wq_u, qu, false));
        gpu = g0;
        T_CHECKF(!memcmp(q, qu, sizeof(float) * (size_t)(64 * n)),
                 "%s: next-norm product, fused and separate differ (%lld rows)", qtype_name(fc->type),
                 (long long)n);
        for (int64_t r = 0; r < n; r++)
            worst = fmin(worst, cosine(q + r * 64, qf + r * 64, 64));
    }
    printf("moe ffn %-6s next norm prepared: worst row cosine %.6f against a fresh norm\n",
           qtype_name(fc->type), worst);
    T_CHECKF(worst >= 0.9999, "%s: prepared next norm, cosine %f", qtype_name(fc->type), worst);
    free(x), free(nv), free(hq);
    free_ffn(&s);
}

/* ---- the grouped path on given routings ---- */

/* ids (k, n) by pattern: 0 uniform (distinct per row), 1 slot 0 on expert 0 and the rest on
 * experts 1..k+1, 2 every row the same k experts (k-1 .. 0); weights random, normalized. */
static void make_routing(int pattern, int64_t n, int k, int n_exp, int32_t *ids, float *wt) {
    for (int64_t r = 0; r < n; r++) {
        const int base = (int)(t_rand_u64(&rng) % (unsigned)n_exp),
                  shift = (int)(t_rand_u64(&rng) % (unsigned)(k + 1));
        float z = 0;
        for (int j = 0; j < k; j++) {
            int e;
            if (pattern == 0) e = (base + j * 7) % n_exp; /* 7 coprime to the cases' n_exp */
            else if (pattern == 1) e = j == 0 ? 0 : 1 + (shift + j) % (k + 1);
            else e = k - 1 - j;
            ids[r * k + j] = e;
            wt[r * k + j] = 0.6f + 0.5f * t_rand_f(&rng);
            z += wt[r * k + j];
        }
        for (int j = 0; j < k; j++)
            wt[r * k + j] /= z;
    }
}

static bool gpu_ffn_ids(struct ffn_setup *s, const float *x, int64_t n, const int32_t *ids,
                        const float *wt, float *y) {
    const struct ffn_case *fc = s->fc;
    const int64_t E = fc->n_embd, k = fc->k;
    bk_step_begin(gpu);
    struct tensor *gx = gpu_tensor(QT_F32, E, n, 1, x);
    struct tensor *gi = gpu_tensor(QT_I32, k, n, 1, ids), *gwt = gpu_tensor(QT_F32, k, n, 1, wt);
    struct prenorm pre = {s->g_nw, 1e-6f};
    struct tensor *dst = gpu_tensor(QT_F32, E, n, 1, NULL);
    bk_moe_ffn(gpu, dst, gx, &s->gw, gi, gwt, &pre, false, NULL);
    bk_download(gpu, y, dst, (size_t)(E * n) * 4);
    return gpu_sync();
}

static void check_grouped(const struct ffn_case *fc) {
    const int64_t E = fc->n_embd, NMAX = 512;
    const int k = (int)fc->k, X = (int)fc->n_expert;
    const int64_t ns[] = {9, 40, 131, NMAX};
    float *x = randv(E * NMAX, 1.0f), *wt = malloc(sizeof(float) * (size_t)(k * NMAX));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(k * NMAX));
    float *ym = malloc(sizeof(float) * (size_t)(E * NMAX)),
          *yv = malloc(sizeof(float) * (size_t)(E * NMAX)),
          *yc = malloc(sizeof(float) * (size_t)(E * NMAX)),
          *ys = malloc(sizeof(float) * (size_t)(E * NMAX));
    struct ffn_setup sm, sv;
    gpu = gpu_mmq;
    setup_ffn(&sm, fc);
    gpu = gpu_mmv;
    setup_ffn(&sv, fc);
    free(sv.hw[0]), free(sv.hw[1]), free(sv.hw[2]); /* the same weights on both backends */
    gpu = gpu_mmv;
    sv.gw.gate = gpu_weight(fc->type, E, fc->n_ff, X, sm.hw[0]);
    sv.gw.up = gpu_weight(fc->type, E, fc->n_ff, X, sm.hw[1]);
    sv.gw.down = gpu_weight(fc->type, fc->n_ff, E, X, sm.hw[2]);
    sv.g_nw = gpu_weight(QT_F32, E, 1, 1, sm.nwv);
    if (fc->bias) { /* and the same biases */
        sv.gw.gate_b = gpu_weight(QT_F32, fc->n_ff, X, 1, sm.hb[0]);
        sv.gw.up_b = gpu_weight(QT_F32, fc->n_ff, X, 1, sm.hb[1]);
        sv.gw.down_b = gpu_weight(QT_F32, E, X, 1, sm.hb[2]);
    }
    sv.hw[0] = sv.hw[1] = sv.hw[2] = NULL;
    double worst[2] = {0, 0}, worst_cos[2] = {1, 1}, mm_cos = 1;
    for (int pat = 0; pat < 3; pat++) {
        make_routing(pat, NMAX, k, X, ids, wt);
        for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
            const int64_t n = ns[in];
            gpu = gpu_mmq;
            T_CHECK(gpu_ffn_ids(&sm, x, n, ids, wt, ym));
            gpu = gpu_mmv;
            T_CHECK(gpu_ffn_ids(&sv, x, n, ids, wt, yv));
            T_CHECK(cpu_ffn(&sm, x, n, ids, wt, yc));
            for (int path = 0; path < 2; path++) {
                const float *y = path ? yv : ym;
                double mx = 1e-6, d = 0;
                for (int64_t i = 0; i < E * n; i++)
                    mx = fmax(mx, fabs(yc[i])), d = fmax(d, fabs(y[i] - yc[i]));
                worst[path] = fmax(worst[path], d / mx);
                for (int64_t r = 0; r < n; r++)
                    worst_cos[path] = fmin(worst_cos[path], cosine(y + r * E, yc + r * E, E));
            }
            for (int64_t r = 0; r < n; r++)
                mm_cos = fmin(mm_cos, cosine(ym + r * E, yv + r * E, E));
            /* batch invariance: these rows in the batch of the smaller row count before
             * (other rows, other experts' loads, another chunk width) are the same bits */
            if (in > 0)
                for (int64_t r = 0; r < ns[in - 1]; r++)
                    T_CHECKF(!memcmp(ym + r * E, ys + r * E, (size_t)E * 4),
                             "%s mmq: pattern %d row %lld in %lld rows differs from %lld rows",
                             qtype_name(fc->type), pat, (long long)r, (long long)n,
                             (long long)ns[in - 1]);
            memcpy(ys, ym, sizeof(float) * (size_t)(E * n));
        }
    }
    printf("moe grouped %-6s %lldx%lld x%d experts top %d, 9..512 rows: mmq max err %.2e cosine "
           "%.6f, mmv max err %.2e cosine %.6f, mmq vs mmv cosine %.6f\n",
           qtype_name(fc->type), (long long)E, (long long)fc->n_ff, X, k, worst[0], worst_cos[0],
           worst[1], worst_cos[1], mm_cos);
    for (int path = 0; path < 2; path++) {
        T_CHECKF(worst[path] < 3e-2, "%s %s: max error %g", qtype_name(fc->type),
                 path ? "mmv" : "mmq", worst[path]);
        T_CHECKF(worst_cos[path] >= 0.999, "%s %s: cosine %f", qtype_name(fc->type),
                 path ? "mmv" : "mmq", worst_cos[path]);
    }
    gpu = gpu_mmq;
    free(x), free(wt), free(ids), free(ym), free(yv), free(yc), free(ys);
    free_ffn(&sm);
    free(sv.nwv), free(sv.rw);
}

static void test_grouped(void) {
    const struct ffn_case cases[] = {
        {QT_Q4_K, 256, 512, 12, 4, GLU_SILU, false, 0, 0},
        {QT_Q6_K, 256, 256, 9, 3, GLU_SILU, false, 0, 0},
        {QT_Q8_0, 192, 320, 10, 4, GLU_GELU_TANH, false, 0, 0}, /* partial row tiles */
        /* gpt-oss's: MXFP4 (partial K slices: 5 and 3 blocks), biases, the clamped SwiGLU */
        {QT_MXFP4, 160, 96, 16, 4, GLU_SWIGLU_OAI, true, 12, 0},
        {QT_Q8_0, 192, 320, 10, 4, GLU_SWIGLU_OAI, true, 12, 0},
    };
    /* SMELT_TEST_SMALL=1 (the CUDA emulator, ~4 min a case): the MXFP4 case only */
    const char *small = getenv("SMELT_TEST_SMALL");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!(small && *small && strcmp(small, "0")) || cases[i].type == QT_MXFP4)
            check_grouped(&cases[i]);
}

static void test_ffn(void) {
    const struct ffn_case cases[] = {
        {QT_Q4_K, 256, 512, 12, 4, GLU_SILU, false, 0, 0},
        {QT_Q6_K, 256, 256, 9, 4, GLU_SILU, false, 0, 0},
        {QT_Q8_0, 96, 160, 9, 3, GLU_SILU, false, 0, 0},
        {QT_Q5_K, 256, 256, 10, 4, GLU_GELU_TANH, false, 0, 0},
        {QT_Q4_0, 64, 96, 16, 4, GLU_SILU, false, 0, 0},
        {QT_Q5_1, 64, 96, 16, 4, GLU_SILU, false, 0, 0},
        {QT_IQ4_NL, 64, 96, 16, 4, GLU_SILU, false, 0, 0},
        {QT_F16, 64, 96, 16, 4, GLU_SILU, false, 0, 0},
        {QT_F32, 96, 64, 7, 2, GLU_SILU, false, 0, 0},
        {QT_BF16, 64, 96, 16, 4, GLU_SILU, false, 0, 0},
        /* the tiny qwen35moe / qwen3next fixtures' experts: rows of 16 (down) and 24 */
        {QT_F16, 64, 16, 16, 4, GLU_SILU, false, 0, 0},
        {QT_F32, 64, 24, 7, 2, GLU_SILU, false, 0, 0},
        /* gpt-oss's experts: biases, the clamped SwiGLU pushed past both clamps */
        {QT_Q8_0, 96, 64, 16, 4, GLU_SWIGLU_OAI, true, 12, 0},
        {QT_MXFP4, 96, 64, 16, 4, GLU_SWIGLU_OAI, true, 12, 0},
        {QT_F32, 64, 96, 16, 4, GLU_SWIGLU_OAI, true, 12, 0},
        /* a shared expert (Qwen3.5/3.6-MoE, Qwen3-Next): a ninth slot in decode, its own
         * launches in the grouped rows; gated and ungated */
        {QT_Q4_K, 256, 512, 12, 8, GLU_SILU, false, 0, 1},
        {QT_Q4_0, 64, 96, 16, 4, GLU_SILU, false, 0, 1},
        {QT_Q6_K, 256, 256, 9, 4, GLU_SILU, false, 0, 2},
        {QT_F16, 64, 16, 16, 4, GLU_SILU, false, 0, 1},
    };
    /* SMELT_TEST_SMALL=1 (the CUDA emulator): Q4_0 and gpt-oss's Q8_0 / MXFP4 cases only */
    const char *small = getenv("SMELT_TEST_SMALL");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!(small && *small && strcmp(small, "0")) || cases[i].type == QT_Q4_0 ||
            cases[i].act == GLU_SWIGLU_OAI)
            check_ffn(&cases[i]);
    check_next(&cases[0]); /* Q4_K */
    check_next(&cases[4]); /* Q4_0 */
    check_next(&cases[13]); /* MXFP4, biases */
    check_next(&cases[15]); /* Q4_K, a shared expert */
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("SKIP test_cuda_moe: no CUDA device on this machine\n");
        return 77;
    }
    struct err e;
    unsetenv("SMELT_MOE_FUSED"); /* read when a backend is created: fused by default */
    setenv("SMELT_MOE_PATH", "mmv", 1);
    if (cpu_backend_new(&cpu, 1, &e) != SMELT_OK ||
        cuda_backend_new(&gpu_mmv, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    setenv("SMELT_MOE_PATH", "mmq", 1);
    if (cuda_backend_new(&gpu_mmq, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    gpu = gpu_mmq;
    unsetenv("SMELT_MOE_PATH");
    setenv("SMELT_MOE_FUSED", "0", 1);
    if (cuda_backend_new(&gpu_unf, 0, &e) != SMELT_OK) { /* the separate launches */
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    const char *small = getenv("SMELT_TEST_SMALL");
    if (!(small && *small && strcmp(small, "0"))) T_RUN(test_route);
    T_RUN(test_ffn);
    T_RUN(test_grouped);
    bk_free(gpu_unf);
    bk_free(gpu_mmq);
    bk_free(gpu_mmv);
    bk_free(cpu);
    return t_done();
}
#endif
