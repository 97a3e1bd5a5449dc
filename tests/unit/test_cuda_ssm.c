/* The CUDA recurrent-state ops against their CPU twins, on fresh random data at ragged
 * sizes: bk_ssm_conv and bk_gated_delta_net (cuda_ssm.cu; cpu_ops_ssm.c), bk_copy of
 * strided views and state slots, and bk_glu's sigmoid and one-gate-per-row forms
 * (cuda_elem.cu; cpu_ops_elem.c, cpu_ops_ssm.c), the decode GLU's int8 output form (att_q,
 * against cuda_mmv_quantize's bytes), and bk_norm_gate (cuda_norm.cu) against its CPU twin
 * and the two ops it fuses; bk_deltanet's fused decode form (conv, delta rule and gated norm
 * in two launches) bit for bit against the three ops and near the CPU.
 *
 * Each recurrent case runs three steps on both backends from the same random state slots:
 * sequences with 0, 1 (decode), a few, 70 and 130 rows (the CPU's chunked form, one and
 * three chunks of 64, against the GPU's recurrence), fresh starts and continued states,
 * snapshots at 0, inside and at the end of a sequence's rows, slots in no order and slots
 * the step does not touch (which must keep their bytes). Every step's output and, after
 * the last, every slot (live and snapshot) must match the CPU's within 1e-5 (conv: the same
 * arithmetic) or 2e-4 (the delta rule: recurrence against the chunkwise form) of the
 * largest magnitude. The delta rule runs key heads of 16 (the fixtures'), 12 and 36 (masked
 * columns), 128 (the real models') and 256, value heads of 7..128 (masked rows), tiled and
 * grouped (qwen3next) value heads. A key head size the kernels do not take is refused as a
 * sticky error naming it. The GPU's chunkwise form (a second backend with
 * SMELT_GDN_CHUNK_MIN=1: every step chunked, decode rows too) must match both the GPU's
 * recurrence and the CPU within the same 2e-4, outputs and every slot. Copies must be
 * exact; GLU within 1e-6. */
#ifndef SMELT_HAVE_CUDA
#include <stdio.h>

int main(void) {
    printf("SKIP test_cuda_ssm: built without CUDA (nvcc not found at configure time)\n");
    return 77;
}
#else

#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_int.h" /* att_q: the int8 form an op leaves for the next product */

static struct backend *cpu, *gpu, *gpu_chunk; /* SMELT_GDN_CHUNK_MIN=0 (never chunked), =1 (always) */
static unsigned long long rs = 0x55a1c0deULL;

static float *rand_buf(size_t n, float scale) {
    float *p = malloc(n * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = scale * t_rand_f(&rs);
    return p;
}


/* One sequence of a step: rows, slot, fresh, snapshot slot and point (-1: none). */
struct sq {
    int n, slot, fresh, snap_slot, snap_at;
};

#define MAX_SEQS 6
#define STEPS 3
#define SLOTS 10

/* The steps every recurrent case runs (slots 0..9; 8 and 9 never touched). */
static const struct sq plan[STEPS][MAX_SEQS] = {
    {{1, 3, 1, -1, -1}, {70, 0, 1, 5, 64}, {5, 6, 0, 1, 0}, {0, 2, 0, -1, -1}, {130, 4, 1, -1, -1}, {3, 7, 0, -1, -1}},
    {{1, 3, 0, 2, 1}, {130, 0, 0, 5, 130}, {1, 6, 0, -1, -1}, {0, 2, 0, -1, -1}, {2, 4, 0, 1, 1}, {64, 7, 0, -1, -1}},
    {{1, 3, 0, -1, -1}, {1, 0, 0, -1, -1}, {1, 6, 0, 1, 0}, {1, 2, 1, -1, -1}, {1, 4, 0, 5, 1}, {1, 7, 0, -1, -1}},
};

/* A step's state words (its sequences: row, a plan's step) and its total rows. */
static int words(const struct sq *row, int32_t *w) {
    int r0 = 0;
    for (int s = 0; s < MAX_SEQS; s++) {
        const struct sq *q = &row[s];
        int32_t *x = w + s * STATE_SEQ_WORDS;
        x[STATE_ROW0] = r0;
        x[STATE_NROWS] = q->n;
        x[STATE_SLOT] = q->slot;
        x[STATE_FRESH] = q->fresh;
        x[STATE_SNAP_SLOT] = q->snap_slot;
        x[STATE_SNAP_AT] = q->snap_at;
        r0 += q->n;
    }
    return r0;
}

/* A backend tensor of host data (step scratch). */
static struct tensor *put(struct backend *b, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2, const void *src) {
    struct tensor *t = bk_new(b, type, ne0, ne1, ne2);
    bk_upload(b, t, src, tensor_nbytes(t));
    return t;
}

/* ---- conv ---- */

struct conv_case {
    int64_t C;
    int d;
    bool silu;
};

/* The steps on backend b from state cs0; outs[step] (C, rows) and the final slots. */
static bool conv_run(struct backend *b, const struct conv_case *k, float *const *x, const float *w, const float *cs0,
                     float **outs, float *cs_out) {
    struct err e;
    struct tensor cs;
    tensor_init(&cs, QT_F32, (k->d - 1) * k->C, SLOTS, 1, 1);
    if (bk_buffer_alloc(b, &cs, &e) != SMELT_OK) return fprintf(stderr, "%s\n", e.msg), false;
    bk_step_begin(b);
    bk_upload(b, &cs, cs0, tensor_nbytes(&cs));
    bool ok = bk_sync(b, &e) == SMELT_OK;
    for (int s = 0; ok && s < STEPS; s++) {
        int32_t wd[MAX_SEQS * STATE_SEQ_WORDS];
        int n = words(plan[s], wd);
        bk_step_begin(b);
        struct tensor *tx = put(b, QT_F32, k->C, n, 1, x[s]), *tw = put(b, QT_F32, k->d, k->C, 1, w);
        struct tensor *seqs = put(b, QT_I32, STATE_SEQ_WORDS, MAX_SEQS, 1, wd);
        struct tensor *dst = bk_new(b, QT_F32, k->C, n, 1);
        bk_ssm_conv(b, dst, tx, tw, &cs, seqs, k->silu);
        bk_download(b, outs[s], dst, tensor_nbytes(dst));
        ok = bk_sync(b, &e) == SMELT_OK;
    }
    if (ok) {
        bk_step_begin(b);
        bk_download(b, cs_out, &cs, tensor_nbytes(&cs));
        ok = bk_sync(b, &e) == SMELT_OK;
    }
    if (!ok) fprintf(stderr, "conv on %s: %s\n", b->ops->name, e.msg);
    bk_buffer_free(b, &cs);
    return ok;
}

static void test_conv(void) {
    const struct conv_case cases[] = {{160, 4, true}, {37, 4, false}, {300, 2, true}, {65, 7, true}, {1000, 4, true}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const struct conv_case *k = &cases[ci];
        float *x[STEPS], *oc[STEPS], *og[STEPS];
        for (int s = 0; s < STEPS; s++) {
            int32_t wd[MAX_SEQS * STATE_SEQ_WORDS];
            size_t n = (size_t)words(plan[s], wd) * (size_t)k->C;
            x[s] = rand_buf(n, 2.0f);
            oc[s] = calloc(n, sizeof(float));
            og[s] = calloc(n, sizeof(float));
        }
        size_t slot_n = (size_t)(k->d - 1) * (size_t)k->C * SLOTS;
        float *w = rand_buf((size_t)k->d * (size_t)k->C, 0.5f), *cs0 = rand_buf(slot_n, 1.0f);
        float *csc = calloc(slot_n, sizeof(float)), *csg = calloc(slot_n, sizeof(float));
        bool ok = conv_run(cpu, k, x, w, cs0, oc, csc) && conv_run(gpu, k, x, w, cs0, og, csg);
        T_CHECKF(ok, "conv case %zu ran", ci);
        double worst = 0;
        for (int s = 0; ok && s < STEPS; s++) {
            int32_t wd[MAX_SEQS * STATE_SEQ_WORDS];
            size_t n = (size_t)words(plan[s], wd) * (size_t)k->C;
            double r = t_rel_err(og[s], oc[s], n);
            worst = fmax(worst, r);
            T_CHECKF(r < 1e-5, "conv C %lld d %d step %d: outputs rel err %.3g", (long long)k->C, k->d, s, r);
        }
        if (ok) {
            double r = t_rel_err(csg, csc, slot_n);
            worst = fmax(worst, r);
            T_CHECKF(r < 1e-5, "conv C %lld d %d: states rel err %.3g", (long long)k->C, k->d, r);
            size_t per = slot_n / SLOTS; /* slots 8 and 9: untouched */
            T_CHECKF(!memcmp(csg + 8 * per, cs0 + 8 * per, 2 * per * sizeof(float)), "conv: an idle slot changed");
        }
        printf("conv C %-5lld d %d silu %d: max rel err %.2e\n", (long long)k->C, k->d, k->silu, worst);
        for (int s = 0; s < STEPS; s++) free(x[s]), free(oc[s]), free(og[s]);
        free(w), free(cs0), free(csc), free(csg);
    }
}

/* ---- gated delta rule ---- */

/* The steps on backend b from state ss0; outs[step] (hv, nv, rows) and the final slots.
 * Returns the backend's status (the error in e). */
static smelt_status gdn_run(struct backend *b, const struct gdn_params *p, float *const *qkv, float *const *av,
                            float *const *bv, const float *ssm_a, const float *dt, const float *ss0, float **outs,
                            float *ss_out, struct err *e) {
    const int64_t ch = 2 * (int64_t)p->n_k_head * p->head_k + (int64_t)p->n_v_head * p->head_v;
    struct tensor ss;
    tensor_init(&ss, QT_F32, (int64_t)p->n_v_head * p->head_v * p->head_k, SLOTS, 1, 1);
    smelt_status st = bk_buffer_alloc(b, &ss, e);
    if (st != SMELT_OK) return st;
    bk_step_begin(b);
    bk_upload(b, &ss, ss0, tensor_nbytes(&ss));
    st = bk_sync(b, e);
    for (int s = 0; st == SMELT_OK && s < STEPS; s++) {
        int32_t wd[MAX_SEQS * STATE_SEQ_WORDS];
        int n = words(plan[s], wd);
        bk_step_begin(b);
        struct tensor *tq = put(b, QT_F32, ch, n, 1, qkv[s]);
        struct tensor *ta = put(b, QT_F32, p->n_v_head, n, 1, av[s]), *tb = put(b, QT_F32, p->n_v_head, n, 1, bv[s]);
        struct tensor *tsa = put(b, QT_F32, p->n_v_head, 1, 1, ssm_a), *tdt = put(b, QT_F32, p->n_v_head, 1, 1, dt);
        struct tensor *seqs = put(b, QT_I32, STATE_SEQ_WORDS, MAX_SEQS, 1, wd);
        struct tensor *dst = bk_new(b, QT_F32, p->head_v, p->n_v_head, n);
        bk_gated_delta_net(b, dst, tq, ta, tb, tsa, tdt, &ss, seqs, p);
        bk_download(b, outs[s], dst, tensor_nbytes(dst));
        st = bk_sync(b, e);
    }
    if (st == SMELT_OK) {
        bk_step_begin(b);
        bk_download(b, ss_out, &ss, tensor_nbytes(&ss));
        st = bk_sync(b, e);
    }
    bk_buffer_free(b, &ss);
    return st;
}

static void gdn_case(int nk, int hk, int nv, int hv, bool grouped) {
    const struct gdn_params p = {nk, hk, nv, hv, 1e-6f, grouped};
    const size_t ch = 2 * (size_t)nk * hk + (size_t)nv * hv, slot_n = (size_t)nv * hv * hk * SLOTS;
    float *qkv[STEPS], *av[STEPS], *bv[STEPS], *oc[STEPS], *og[STEPS];
    size_t rows[STEPS];
    for (int s = 0; s < STEPS; s++) {
        int32_t wd[MAX_SEQS * STATE_SEQ_WORDS];
        rows[s] = (size_t)words(plan[s], wd);
        qkv[s] = rand_buf(rows[s] * ch, 1.0f);
        av[s] = rand_buf(rows[s] * nv, 3.0f);
        bv[s] = rand_buf(rows[s] * nv, 3.0f);
        oc[s] = calloc(rows[s] * nv * hv, sizeof(float));
        og[s] = calloc(rows[s] * nv * hv, sizeof(float));
    }
    float *ssm_a = rand_buf((size_t)nv, 1.0f), *dt = rand_buf((size_t)nv, 1.0f);
    for (int h = 0; h < nv; h++) ssm_a[h] = -expf(ssm_a[h]); /* -exp(A_log) */
    float *ss0 = rand_buf(slot_n, 0.3f), *ssc = calloc(slot_n, sizeof(float)), *ssg = calloc(slot_n, sizeof(float));
    struct err e;
    smelt_status sc = gdn_run(cpu, &p, qkv, av, bv, ssm_a, dt, ss0, oc, ssc, &e);
    T_CHECKF(sc == SMELT_OK, "cpu: %s", e.msg);
    smelt_status sg = gdn_run(gpu, &p, qkv, av, bv, ssm_a, dt, ss0, og, ssg, &e);
    T_CHECKF(sg == SMELT_OK, "gpu: %s", e.msg);
    /* the chunkwise form (every step, decode rows included) against the GPU's recurrence
     * and the CPU: the same bound (F32 state; rounding only) */
    double worst_ch = 0;
    if (gpu_chunk) {
        float *oh[STEPS], *ssh = calloc(slot_n, sizeof(float));
        for (int s = 0; s < STEPS; s++) oh[s] = calloc(rows[s] * nv * hv, sizeof(float));
        smelt_status sh = gdn_run(gpu_chunk, &p, qkv, av, bv, ssm_a, dt, ss0, oh, ssh, &e);
        T_CHECKF(sh == SMELT_OK, "gpu chunked: %s", e.msg);
        for (int s = 0; sh == SMELT_OK && sg == SMELT_OK && sc == SMELT_OK && s < STEPS; s++) {
            double r = fmax(t_rel_err(oh[s], og[s], rows[s] * nv * hv), t_rel_err(oh[s], oc[s], rows[s] * nv * hv));
            worst_ch = fmax(worst_ch, r);
            T_CHECKF(r < 2e-4, "gdn chunked nk %d hk %d nv %d hv %d%s step %d: outputs rel err %.3g", nk, hk, nv,
                     hv, grouped ? " grouped" : "", s, r);
        }
        if (sh == SMELT_OK && sg == SMELT_OK && sc == SMELT_OK) {
            const size_t per = slot_n / SLOTS;
            for (int sl = 0; sl < 8; sl++) {
                const float *h = ssh + sl * per;
                double r = fmax(t_rel_err(h, ssg + sl * per, per), t_rel_err(h, ssc + sl * per, per));
                worst_ch = fmax(worst_ch, r);
                T_CHECKF(r < 2e-4, "gdn chunked nk %d hk %d nv %d hv %d%s: slot %d rel err %.3g", nk, hk, nv, hv,
                         grouped ? " grouped" : "", sl, r);
            }
            T_CHECKF(!memcmp(ssh + 8 * per, ss0 + 8 * per, 2 * per * sizeof(float)),
                     "gdn chunked: an idle slot changed");
        }
        for (int s = 0; s < STEPS; s++) free(oh[s]);
        free(ssh);
    }
    double worst = 0, worst_st = 0;
    for (int s = 0; sc == SMELT_OK && sg == SMELT_OK && s < STEPS; s++) {
        double r = t_rel_err(og[s], oc[s], rows[s] * nv * hv);
        worst = fmax(worst, r);
        T_CHECKF(r < 2e-4, "gdn nk %d hk %d nv %d hv %d%s step %d: outputs rel err %.3g", nk, hk, nv, hv,
                 grouped ? " grouped" : "", s, r);
    }
    if (sc == SMELT_OK && sg == SMELT_OK) {
        const size_t per = slot_n / SLOTS;
        for (int sl = 0; sl < 8; sl++) {
            double r = t_rel_err(ssg + sl * per, ssc + sl * per, per);
            worst_st = fmax(worst_st, r);
            T_CHECKF(r < 2e-4, "gdn nk %d hk %d nv %d hv %d%s: slot %d rel err %.3g", nk, hk, nv, hv,
                     grouped ? " grouped" : "", sl, r);
        }
        T_CHECKF(!memcmp(ssg + 8 * per, ss0 + 8 * per, 2 * per * sizeof(float)), "gdn: an idle slot changed");
    }
    printf("gdn nk %d hk %-3d nv %d hv %-3d %-7s: max rel err outputs %.2e, states %.2e; chunked vs both %.2e\n",
           nk, hk, nv, hv, grouped ? "grouped" : "tiled", worst, worst_st, worst_ch);
    for (int s = 0; s < STEPS; s++) free(qkv[s]), free(av[s]), free(bv[s]), free(oc[s]), free(og[s]);
    free(ssm_a), free(dt), free(ss0), free(ssc), free(ssg);
}

static void test_gdn(void) {
    gdn_case(2, 16, 4, 24, false); /* the fixtures' heads */
    gdn_case(2, 16, 4, 24, true);
    gdn_case(1, 12, 3, 20, false);
    gdn_case(2, 36, 6, 7, true);
    gdn_case(2, 128, 4, 128, false); /* the real models' head sizes */
    gdn_case(1, 256, 2, 40, false);
}

/* A key head size the kernels do not take: a sticky error naming it, not a wrong result. */
static void test_gdn_refused(void) {
    const struct gdn_params p = {1, 18, 1, 8, 1e-6f, false};
    struct err e;
    bk_step_begin(gpu);
    struct tensor *q = bk_new(gpu, QT_F32, 2 * 18 + 8, 1, 1), *a = bk_new(gpu, QT_F32, 1, 1, 1);
    struct tensor *seqs = bk_new(gpu, QT_I32, STATE_SEQ_WORDS, 1, 1), *dst = bk_new(gpu, QT_F32, 8, 1, 1);
    struct tensor ss;
    tensor_init(&ss, QT_F32, 8 * 18, 1, 1, 1);
    T_EQ_INT(bk_buffer_alloc(gpu, &ss, &e), SMELT_OK);
    bk_gated_delta_net(gpu, dst, q, a, a, a, a, &ss, seqs, &p);
    T_EQ_INT(bk_sync(gpu, &e), SMELT_ERR_UNSUPPORTED);
    T_CHECKF(strstr(e.msg, "state_size) 18"), "%s", e.msg);
    bk_buffer_free(gpu, &ss);
}

/* ---- copy and GLU ---- */

/* Deinterleaves [q | gate] heads (qwen35's attention) with 3-D views, and copies a state
 * slot onto another, on both backends: the bytes must be the same. */
static void test_copy(void) {
    const int64_t hd = 40, nh = 3, n = 37, L = 1531, slots = 4;
    const size_t f = sizeof(float);
    float *qg = rand_buf((size_t)(2 * hd * nh * n), 1.0f), *st = rand_buf((size_t)(L * slots), 1.0f);
    float *out[2][3];
    struct backend *bs[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++) {
        struct backend *b = bs[k];
        struct err e;
        bk_step_begin(b);
        struct tensor *src = put(b, QT_F32, 2 * hd * nh, n, 1, qg), *sl = put(b, QT_F32, L, slots, 1, st);
        struct tensor *q = bk_new(b, QT_F32, hd, nh, n), *g = bk_new(b, QT_F32, hd * nh, n, 1);
        bk_copy(b, q, bk_view_3d(b, src, hd, nh, n, 2 * hd * f, 2 * hd * nh * f, 0));
        bk_copy(b, bk_reshape(b, g, hd, nh, n), bk_view_3d(b, src, hd, nh, n, 2 * hd * f, 2 * hd * nh * f, hd * f));
        bk_copy(b, bk_view_2d(b, sl, L, 1, sl->nb[1], 3 * sl->nb[1]), bk_view_2d(b, sl, L, 1, sl->nb[1], 1 * sl->nb[1]));
        for (int i = 0; i < 3; i++) out[k][i] = malloc((size_t)(L * slots > 2 * hd * nh * n ? L * slots : 2 * hd * nh * n) * f);
        bk_download(b, out[k][0], q, tensor_nbytes(q));
        bk_download(b, out[k][1], g, tensor_nbytes(g));
        bk_download(b, out[k][2], sl, tensor_nbytes(sl));
        T_EQ_INT(bk_sync(b, &e), SMELT_OK);
    }
    T_CHECK(!memcmp(out[0][0], out[1][0], (size_t)(hd * nh * n) * f));
    T_CHECK(!memcmp(out[0][1], out[1][1], (size_t)(hd * nh * n) * f));
    T_CHECK(!memcmp(out[0][2], out[1][2], (size_t)(L * slots) * f));
    T_CHECK(!memcmp(out[1][2] + 3 * L, st + L, (size_t)L * f)); /* and it is the copy asked for */
    T_CHECK(out[1][0][hd] == qg[2 * hd] && out[1][1][0] == qg[hd]);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) free(out[k][i]);
    free(qg), free(st);
}

/* After the op that wrote dst (width, rows) on gpu: when `want`, att_q must hold dst's int8
 * form for the next op, the bytes cuda_mmv_quantize writes for dst (values and {d, d*sum}
 * per 16); else att_q must not be offered. */
static void check_att_q(const struct tensor *dst, int64_t width, int64_t rows, bool want, const char *what) {
    struct cuda_backend *cb = cu_of(gpu);
    const bool offered = cb->att_q.x && cb->att_q.seq == cb->op_seq;
    T_CHECKF(offered == want, "%s: att_q %s", what, offered ? "offered" : "missing");
    if (!offered || !want) return;
    T_CHECKF(cb->att_q.x == dst->data && cb->att_q.n == rows && cb->att_q.k == width, "%s: att_q of %lldx%lld",
             what, (long long)cb->att_q.k, (long long)cb->att_q.n);
    const size_t nq = (size_t)(width * rows), nd = nq / 16 * 8, sb = cuda_mmv_scratch_bytes(width, (int)rows);
    void *ref = NULL;
    unsigned char *h[2][2] = {{malloc(nq), malloc(nd)}, {malloc(nq), malloc(nd)}};
    struct err e;
    cudaError_t rc = cudaMalloc(&ref, sb);
    if (rc == cudaSuccess) rc = cuda_mmv_quantize(&cb->ctx, dst->data, width, (int)rows, ref, &e) == SMELT_OK
                                    ? cudaDeviceSynchronize()
                                    : cudaErrorUnknown;
    void *bufs[2] = {cb->att_q.buf, ref};
    for (int k = 0; k < 2 && rc == cudaSuccess; k++) {
        int8_t *xq;
        void *xd;
        cuda_mmv_scratch_parts(bufs[k], width, (int)rows, &xq, &xd);
        rc = cudaMemcpy(h[k][0], xq, nq, cudaMemcpyDeviceToHost);
        if (rc == cudaSuccess) rc = cudaMemcpy(h[k][1], xd, nd, cudaMemcpyDeviceToHost);
    }
    T_CHECKF(rc == cudaSuccess, "%s: %s", what, cudaGetErrorString(rc));
    if (rc == cudaSuccess) {
        T_CHECKF(!memcmp(h[0][0], h[1][0], nq), "%s: int8 values differ from cuda_mmv_quantize's", what);
        T_CHECKF(!memcmp(h[0][1], h[1][1], nd), "%s: scales differ from cuda_mmv_quantize's", what);
    }
    cudaFree(ref);
    for (int k = 0; k < 2; k++) free(h[k][0]), free(h[k][1]);
}

/* bk_glu for sigmoid, SiLU and tanh-GELU (a gate per element, in place on up as qwen35's
 * output gate, or one per row as a shared expert's) at 1..9 rows: within 1e-6 of the CPU, and at 1..8 rows of a width % 32
 * == 0 the int8 form left in att_q equals cuda_mmv_quantize's bytes; none at 9 rows or a
 * ragged width. */
static void test_glu_att_q(void) {
    const int64_t widths[2] = {320, 333}, nrows[5] = {1, 3, 7, 8, 9};
    const enum glu_act acts[3] = {GLU_SIGMOID, GLU_SILU, GLU_GELU_TANH};
    for (int wi = 0; wi < 2; wi++)
        for (int ri = 0; ri < 5; ri++)
            for (int a = 0; a < 3; a++)
            for (int row_gate = 0; row_gate < 2; row_gate++) {
                const int64_t n = widths[wi], rows = nrows[ri];
                char what[64];
                snprintf(what, sizeof what, "glu %lldx%lld act %d row gate %d", (long long)n, (long long)rows,
                         (int)acts[a], row_gate);
                float *gate = rand_buf((size_t)(n * rows), 4.0f), *up = rand_buf((size_t)(n * rows), 2.0f);
                float *res[2];
                struct backend *bs[2] = {cpu, gpu};
                for (int k = 0; k < 2; k++) {
                    struct err e;
                    struct backend *b = bs[k];
                    bk_step_begin(b);
                    struct tensor *g = put(b, QT_F32, row_gate ? 1 : n, rows, 1, gate),
                                  *u = put(b, QT_F32, n, rows, 1, up);
                    bk_glu(b, u, g, u, acts[a]);
                    if (b == gpu) check_att_q(u, n, rows, n % 32 == 0 && rows <= 8, what);
                    res[k] = malloc((size_t)(n * rows) * sizeof(float));
                    bk_download(b, res[k], u, tensor_nbytes(u));
                    T_EQ_INT(bk_sync(b, &e), SMELT_OK);
                }
                double r = t_rel_err(res[1], res[0], (size_t)(n * rows));
                T_CHECKF(r < 1e-6, "%s: rel err %.3g", what, r);
                free(res[0]), free(res[1]), free(gate), free(up);
            }
}

/* bk_norm_gate (qwen35's deltanet output: rms_norm per value head times silu(z), in place
 * on z) against the CPU twin (within 2e-6) and against the GPU's own rms_norm then glu
 * (within 1e-6; the count of values whose bits differ is printed), at groups of 128 (the
 * models'), 64, 256 and ragged ones (40; 48: width % 32 == 0 but not the group), at 1, 3,
 * 8 and 9 rows, the int8 form checked as bk_glu's. */
static void test_norm_gate(void) {
    const int64_t shapes[5][2] = {{128, 5}, {64, 3}, {256, 2}, {40, 3}, {48, 2}}; /* group, groups */
    const int64_t nrows[4] = {1, 3, 8, 9};
    const enum glu_act acts[2] = {GLU_SILU, GLU_SIGMOID};
    double worst_cpu = 0, worst_gpu = 0;
    long differ = 0, total = 0;
    for (int si = 0; si < 5; si++)
        for (int ri = 0; ri < 4; ri++)
            for (int a = 0; a < 2; a++) {
                const int64_t gn = shapes[si][0], n = gn * shapes[si][1], rows = nrows[ri], ne = n * rows;
                float *x = rand_buf((size_t)ne, 3.0f), *z = rand_buf((size_t)ne, 4.0f), *w = rand_buf((size_t)gn, 1.5f);
                float *res[3];
                struct backend *bs[3] = {cpu, gpu, gpu};
                for (int k = 0; k < 3; k++) {
                    struct err e;
                    struct backend *b = bs[k];
                    bk_step_begin(b);
                    struct tensor *tx = put(b, QT_F32, n, rows, 1, x), *tz = put(b, QT_F32, n, rows, 1, z);
                    struct tensor *tw = put(b, QT_F32, gn, 1, 1, w);
                    if (k < 2) {
                        bk_norm_gate(b, tz, tx, tw, tz, 1e-6f, acts[a]);
                        char what[64];
                        snprintf(what, sizeof what, "norm_gate %lldx%lld/%lld act %d", (long long)n, (long long)rows,
                                 (long long)gn, (int)acts[a]);
                        if (b == gpu) check_att_q(tz, n, rows, gn % 32 == 0 && rows <= 8, what);
                    } else { /* the two ops it replaces */
                        struct tensor *th = bk_reshape(b, tx, gn, ne / gn, 1);
                        bk_rms_norm(b, th, th, tw, 1e-6f);
                        bk_glu(b, tz, tz, tx, acts[a]);
                    }
                    res[k] = malloc((size_t)ne * sizeof(float));
                    bk_download(b, res[k], tz, tensor_nbytes(tz));
                    T_EQ_INT(bk_sync(b, &e), SMELT_OK);
                }
                const double rc = t_rel_err(res[1], res[0], (size_t)ne), rg = t_rel_err(res[1], res[2], (size_t)ne);
                T_CHECKF(rc < 2e-6 && rg < 1e-6, "norm_gate %lldx%lld/%lld act %d: rel err %.3g vs cpu, %.3g vs unfused",
                         (long long)n, (long long)rows, (long long)gn, (int)acts[a], rc, rg);
                worst_cpu = fmax(worst_cpu, rc);
                worst_gpu = fmax(worst_gpu, rg);
                differ += memcmp(res[1], res[2], (size_t)ne * sizeof(float)) != 0;
                total++;
                for (int k = 0; k < 3; k++) free(res[k]);
                free(x), free(z), free(w);
            }
    printf("norm_gate: max rel err %.3g vs the CPU, %.3g vs rms_norm + glu on the GPU (%ld of %ld cases not bit for "
           "bit)\n",
           worst_cpu, worst_gpu, differ, total);
}

/* ---- bk_deltanet: the fused decode form against the three ops ---- */

#define DSTEPS 4
/* Decode steps (at most one row a sequence): fresh starts, snapshots before (0) and after
 * (1) the row, a sequence with no row, slots 8 and 9 never touched. */
static const struct sq dplan[DSTEPS][MAX_SEQS] = {
    {{1, 3, 1, -1, -1}, {1, 0, 1, 5, 1}, {1, 6, 0, 1, 0}, {0, 2, 0, -1, -1}, {1, 4, 1, -1, -1}, {1, 7, 0, -1, -1}},
    {{1, 3, 0, 5, 1}, {1, 0, 0, 1, 0}, {1, 6, 0, -1, -1}, {1, 2, 1, -1, -1}, {0, 4, 0, -1, -1}, {1, 7, 0, -1, -1}},
    {{1, 3, 0, -1, -1}, {1, 0, 0, -1, -1}, {1, 6, 0, 1, 0}, {1, 2, 0, -1, -1}, {1, 4, 0, 5, 1}, {1, 7, 0, -1, -1}},
    {{1, 3, 0, -1, -1}, {1, 0, 0, -1, -1}, {1, 6, 0, -1, -1}, {1, 2, 0, -1, -1}, {1, 4, 0, -1, -1}, {1, 7, 0, -1, -1}},
};

struct dn_data {
    float *qkv[DSTEPS], *av[DSTEPS], *bv[DSTEPS], *z[DSTEPS], *cw, *ssm_a, *dt, *nw, *cs0, *ss0;
};

/* The decode steps on backend b through bk_deltanet (one_row as given); zs[step] the
 * outputs, cs_out / ss_out the final slots. On the GPU with one_row, att_q is checked
 * after each step's op (want: the fused form takes the sizes). */
static smelt_status dn_run(struct backend *b, const struct gdn_params *p, int d, const struct dn_data *x, bool one_row,
                           bool check_q, float **zs, float *cs_out, float *ss_out, struct err *e) {
    const int64_t ch = 2 * (int64_t)p->n_k_head * p->head_k + (int64_t)p->n_v_head * p->head_v,
                  vdim = (int64_t)p->n_v_head * p->head_v;
    struct tensor cs, ss;
    tensor_init(&cs, QT_F32, (d - 1) * ch, SLOTS, 1, 1);
    tensor_init(&ss, QT_F32, vdim * p->head_k, SLOTS, 1, 1);
    smelt_status st = bk_buffer_alloc(b, &cs, e);
    if (st == SMELT_OK) st = bk_buffer_alloc(b, &ss, e);
    if (st != SMELT_OK) return st;
    bk_step_begin(b);
    bk_upload(b, &cs, x->cs0, tensor_nbytes(&cs));
    bk_upload(b, &ss, x->ss0, tensor_nbytes(&ss));
    st = bk_sync(b, e);
    for (int s = 0; st == SMELT_OK && s < DSTEPS; s++) {
        int32_t wd[MAX_SEQS * STATE_SEQ_WORDS];
        int n = words(dplan[s], wd);
        bk_step_begin(b);
        struct tensor *tq = put(b, QT_F32, ch, n, 1, x->qkv[s]), *tz = put(b, QT_F32, vdim, n, 1, x->z[s]);
        struct tensor *ta = put(b, QT_F32, p->n_v_head, n, 1, x->av[s]), *tb = put(b, QT_F32, p->n_v_head, n, 1, x->bv[s]);
        const struct deltanet_w w = {put(b, QT_F32, d, ch, 1, x->cw), put(b, QT_F32, p->n_v_head, 1, 1, x->ssm_a),
                                     put(b, QT_F32, p->n_v_head, 1, 1, x->dt), put(b, QT_F32, p->head_v, 1, 1, x->nw),
                                     1e-6f};
        struct tensor *seqs = put(b, QT_I32, STATE_SEQ_WORDS, MAX_SEQS, 1, wd);
        bk_deltanet(b, tz, tq, ta, tb, &w, &cs, &ss, seqs, p, one_row);
        if (check_q) check_att_q(tz, vdim, n, p->head_v % 32 == 0, "deltanet");
        bk_download(b, zs[s], tz, tensor_nbytes(tz));
        st = bk_sync(b, e);
    }
    if (st == SMELT_OK) {
        bk_step_begin(b);
        bk_download(b, cs_out, &cs, tensor_nbytes(&cs));
        bk_download(b, ss_out, &ss, tensor_nbytes(&ss));
        st = bk_sync(b, e);
    }
    bk_buffer_free(b, &cs);
    bk_buffer_free(b, &ss);
    return st;
}

/* bk_deltanet at decode: the GPU's fused form (two launches) bit for bit against the GPU's
 * three ops (outputs, every conv and state slot, snapshots included, idle slots untouched)
 * and within 2e-4 of the CPU; a head_v the fused form does not take (not a multiple of 32)
 * runs the three ops. */
static void dn_case(int nk, int hk, int nv, int hv, bool grouped, int d) {
    const struct gdn_params p = {nk, hk, nv, hv, 1e-6f, grouped};
    const size_t ch = 2 * (size_t)nk * hk + (size_t)nv * hv, vdim = (size_t)nv * hv;
    const size_t cs_n = (size_t)(d - 1) * ch * SLOTS, ss_n = vdim * hk * SLOTS;
    struct dn_data x;
    size_t rows[DSTEPS];
    float *zo[3][DSTEPS];
    for (int s = 0; s < DSTEPS; s++) {
        int32_t wd[MAX_SEQS * STATE_SEQ_WORDS];
        rows[s] = (size_t)words(dplan[s], wd);
        x.qkv[s] = rand_buf(rows[s] * ch, 1.0f);
        x.av[s] = rand_buf(rows[s] * nv, 3.0f);
        x.bv[s] = rand_buf(rows[s] * nv, 3.0f);
        x.z[s] = rand_buf(rows[s] * vdim, 3.0f);
        for (int k = 0; k < 3; k++) zo[k][s] = calloc(rows[s] * vdim, sizeof(float));
    }
    x.cw = rand_buf((size_t)d * ch, 0.5f);
    x.ssm_a = rand_buf((size_t)nv, 1.0f);
    for (int h = 0; h < nv; h++) x.ssm_a[h] = -expf(x.ssm_a[h]);
    x.dt = rand_buf((size_t)nv, 1.0f);
    x.nw = rand_buf((size_t)hv, 1.5f);
    x.cs0 = rand_buf(cs_n, 1.0f);
    x.ss0 = rand_buf(ss_n, 0.3f);
    float *cso[3], *sso[3];
    struct err e;
    struct backend *bs[3] = {gpu, gpu, cpu};
    const bool one[3] = {true, false, true};
    smelt_status st[3];
    /* the fused form at every row count of the plans (by default it takes <= 2 rows) */
    const int fused_rows = cu_of(gpu)->deltanet_fused_rows;
    cu_of(gpu)->deltanet_fused_rows = MAX_SEQS;
    for (int k = 0; k < 3; k++) {
        cso[k] = calloc(cs_n, sizeof(float));
        sso[k] = calloc(ss_n, sizeof(float));
        st[k] = dn_run(bs[k], &p, d, &x, one[k], k == 0, zo[k], cso[k], sso[k], &e);
        T_CHECKF(st[k] == SMELT_OK, "deltanet run %d: %s", k, e.msg);
    }
    cu_of(gpu)->deltanet_fused_rows = fused_rows;
    double worst = 0;
    if (st[0] == SMELT_OK && st[1] == SMELT_OK && st[2] == SMELT_OK) {
        for (int s = 0; s < DSTEPS; s++) {
            const size_t ne = rows[s] * vdim;
            T_CHECKF(!memcmp(zo[0][s], zo[1][s], ne * sizeof(float)),
                     "deltanet nk %d hk %d nv %d hv %d d %d step %d: fused output differs from the three ops", nk, hk,
                     nv, hv, d, s);
            const double r = t_rel_err(zo[0][s], zo[2][s], ne);
            worst = fmax(worst, r);
            T_CHECKF(r < 2e-4, "deltanet nk %d hk %d nv %d hv %d step %d: rel err %.3g vs the CPU", nk, hk, nv, hv, s, r);
        }
        T_CHECKF(!memcmp(cso[0], cso[1], cs_n * sizeof(float)), "deltanet hv %d d %d: conv slots differ", hv, d);
        T_CHECKF(!memcmp(sso[0], sso[1], ss_n * sizeof(float)), "deltanet hv %d d %d: state slots differ", hv, d);
        T_CHECKF(!memcmp(cso[0] + 8 * cs_n / SLOTS, x.cs0 + 8 * cs_n / SLOTS, 2 * cs_n / SLOTS * sizeof(float)) &&
                     !memcmp(sso[0] + 8 * ss_n / SLOTS, x.ss0 + 8 * ss_n / SLOTS, 2 * ss_n / SLOTS * sizeof(float)),
                 "deltanet: an idle slot changed");
        const double rc = t_rel_err(cso[0], cso[2], cs_n), rs_ = t_rel_err(sso[0], sso[2], ss_n);
        T_CHECKF(rc < 1e-6 && rs_ < 2e-4, "deltanet hv %d: slots rel err %.3g (conv) %.3g (state) vs the CPU", hv, rc,
                 rs_);
        worst = fmax(worst, rs_);
    }
    printf("deltanet nk %d hk %-3d nv %d hv %-3d d %d %-7s: fused = three ops bit for bit; max rel err vs the CPU %.2e\n",
           nk, hk, nv, hv, d, grouped ? "grouped" : "tiled", worst);
    for (int s = 0; s < DSTEPS; s++) {
        free(x.qkv[s]), free(x.av[s]), free(x.bv[s]), free(x.z[s]);
        for (int k = 0; k < 3; k++) free(zo[k][s]);
    }
    for (int k = 0; k < 3; k++) free(cso[k]), free(sso[k]);
    free(x.cw), free(x.ssm_a), free(x.dt), free(x.nw), free(x.cs0), free(x.ss0);
}

static void test_deltanet(void) {
    dn_case(2, 16, 4, 32, false, 4);
    dn_case(2, 16, 4, 64, true, 4);
    dn_case(2, 36, 6, 32, true, 3);
    dn_case(4, 128, 8, 128, false, 4); /* the real models' head sizes */
    dn_case(1, 256, 2, 128, false, 4);
    dn_case(2, 16, 4, 24, false, 4); /* head_v 24: the three ops */
    dn_case(2, 16, 4, 32, true, 2);  /* the narrowest conv the fused form takes */
    dn_case(2, 16, 4, 32, false, 5); /* d_conv 5: wider than the fused form's, the three ops */
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("SKIP test_cuda_ssm: no CUDA device on this machine\n");
        return 77;
    }
    struct err e;
    setenv("SMELT_GDN_CHUNK_MIN", "0", 1); /* gpu: the recurrence on every step */
    if (cpu_backend_new(&cpu, 2, &e) != SMELT_OK || cuda_backend_new(&gpu, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    cpu_backend_set_exact(cpu, true);
    setenv("SMELT_GDN_CHUNK_MIN", "1", 1); /* read when a backend is created */
    if (cuda_backend_new(&gpu_chunk, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    unsetenv("SMELT_GDN_CHUNK_MIN");
    T_RUN(test_conv);
    T_RUN(test_gdn);
    T_RUN(test_gdn_refused);
    T_RUN(test_copy);
    T_RUN(test_glu_att_q);
    T_RUN(test_norm_gate);
    T_RUN(test_deltanet);
    bk_free(cpu);
    bk_free(gpu);
    bk_free(gpu_chunk);
    return t_done();
}
#endif
