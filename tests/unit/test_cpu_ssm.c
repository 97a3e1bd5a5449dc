/* The recurrent-state ops of the CPU backend (bk_ssm_conv, bk_gated_delta_net, bk_copy of
 * state slots) against a double-precision reference written here from the math: the
 * convolution over each sequence's whole history, and the gated delta rule run token by
 * token (the recurrence transformers' torch_recurrent_gated_delta_rule computes).
 *
 * Ragged sizes (head_k 24, head_v 20, 2 key heads shared by 4 value heads), three
 * sequences fed over several steps in mixed batches: fresh starts, single decode rows
 * (the fused recurrent path), chunks of 1..130 rows (the chunkwise path, several chunks
 * of 64), snapshots at the start, inside and at the end of a sequence's rows, and a
 * restore: a snapshot copied into a new slot continues as its own sequence. Outputs,
 * live states and snapshots are all compared. All of it twice: value heads tiled over the
 * key heads (qwen35's GGUF order, value head h reads key head h % 2) and grouped
 * (qwen3next's, h / 2). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "t.h"

#define NK 2
#define NV 4
#define HK 24
#define HV 20
#define DC 4
#define CH (2 * NK * HK + NV * HV)
#define SLOTS 8
#define MAXT 400
#define SS (NV * HV * HK)
#define CS ((DC - 1) * CH)

static struct backend *bk;
static unsigned long long rng = 0x55d1e17aULL;
static bool grouped; /* the head layout under test (gdn_params.grouped) */

/* The weights, fixed for the whole test. */
static float w_conv[CH * DC], ssm_a[NV], dt_bias[NV];

/* One sequence's history: raw conv inputs, conv outputs (as the op computed them: the
 * delta rule's reference input), a, beta logits; and the reference outputs. */
struct hist {
    int n;
    float x[MAXT][CH], xc[MAXT][CH], a[MAXT][NV], b[MAXT][NV];
    double conv_ref[MAXT][CH];
};

static struct hist H[4];

/* The conv state after the first `at` inputs (d - 1 rows, oldest first) */
static void ref_conv_state(const struct hist *h, int at, double *out) {
    for (int i = 0; i < DC - 1; i++) {
        int t = at - (DC - 1) + i;
        for (int c = 0; c < CH; c++)
            out[i * CH + c] = t >= 0 ? h->x[t][c] : 0.0;
    }
}

static void ref_conv(struct hist *h, int t) {
    for (int c = 0; c < CH; c++) {
        double acc = 0;
        for (int j = 0; j < DC; j++) {
            int i = t - (DC - 1) + j;
            if (i >= 0) acc += (double)w_conv[c * DC + j] * h->x[i][c];
        }
        h->conv_ref[t][c] = acc / (1.0 + exp(-acc));
    }
}

/* The delta rule over the first `upto` rows: the state after them (S[h][v][k]) and, when
 * out is not NULL, the output of row upto - 1. */
static void ref_gdn(const struct hist *h, int upto, double *S, double *out) {
    memset(S, 0, sizeof(double) * SS);
    for (int t = 0; t < upto; t++) {
        for (int hh = 0; hh < NV; hh++) {
            int kh = grouped ? hh / (NV / NK) : hh % NK;
            const float *row = h->xc[t];
            double q[HK], k[HK], qq = 0, kk = 0;
            for (int j = 0; j < HK; j++) {
                q[j] = row[kh * HK + j];
                k[j] = row[NK * HK + kh * HK + j];
                qq += q[j] * q[j];
                kk += k[j] * k[j];
            }
            for (int j = 0; j < HK; j++) {
                q[j] /= sqrt(qq + 1e-6) * sqrt((double)HK);
                k[j] /= sqrt(kk + 1e-6);
            }
            const float *v = row + 2 * NK * HK + hh * HV;
            double x = (double)h->a[t][hh] + dt_bias[hh];
            double g = ssm_a[hh] * (x > 20 ? x : log1p(exp(x)));
            double beta = 1 / (1 + exp(-(double)h->b[t][hh]));
            double *Sh = S + hh * HV * HK;
            for (int i = 0; i < HV; i++) {
                double *Si = Sh + i * HK, sk = 0, so = 0;
                for (int j = 0; j < HK; j++)
                    Si[j] *= exp(g), sk += Si[j] * k[j];
                double u = beta * (v[i] - sk);
                for (int j = 0; j < HK; j++)
                    Si[j] += u * k[j], so += Si[j] * q[j];
                if (out && t == upto - 1) out[hh * HV + i] = so;
            }
        }
    }
}

static double rel_err(const float *a, const double *b, int n) {
    double m = 0, mb = 1;
    for (int i = 0; i < n; i++) {
        if (fabs(a[i] - b[i]) > m) m = fabs(a[i] - b[i]);
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return m / mb;
}

static struct tensor cs_t, ss_t; /* the state tensors (persistent) */
static struct tensor wc_t, sa_t, dt_t;
static double worst_out, worst_state;

/* One part of a step: sequence `seq` (history index) gets n rows in slot `slot`, with an
 * optional snapshot after `snap_at` rows into snap_slot. */
struct part {
    int seq, n, slot, snap_slot, snap_at;
};

static void run_step(const struct part *parts, int np) {
    int n = 0;
    for (int i = 0; i < np; i++)
        n += parts[i].n;
    bk_step_begin(bk);
    struct tensor *x = bk_new(bk, QT_F32, CH, n, 1), *xc = bk_new(bk, QT_F32, CH, n, 1);
    struct tensor *a = bk_new(bk, QT_F32, NV, n, 1), *bl = bk_new(bk, QT_F32, NV, n, 1);
    struct tensor *o = bk_new(bk, QT_F32, HV, NV, n);
    struct tensor *seqs = bk_new(bk, QT_I32, STATE_SEQ_WORDS, np, 1);
    int32_t *sw = seqs->data;
    int r = 0;
    for (int i = 0; i < np; i++) {
        struct hist *h = &H[parts[i].seq];
        int32_t w[STATE_SEQ_WORDS] = {0};
        w[STATE_ROW0] = r;
        w[STATE_NROWS] = parts[i].n;
        w[STATE_SLOT] = parts[i].slot;
        w[STATE_FRESH] = h->n == 0;
        w[STATE_SNAP_SLOT] = parts[i].snap_slot;
        w[STATE_SNAP_AT] = parts[i].snap_at;
        memcpy(sw + i * STATE_SEQ_WORDS, w, sizeof w);
        for (int t = 0; t < parts[i].n; t++, r++) {
            float *xr = (float *)x->data + (size_t)r * CH;
            for (int c = 0; c < CH; c++)
                xr[c] = h->x[h->n + t][c] = t_randn(&rng);
            for (int j = 0; j < NV; j++) {
                ((float *)a->data)[r * NV + j] = h->a[h->n + t][j] = t_randn(&rng);
                ((float *)bl->data)[r * NV + j] = h->b[h->n + t][j] = t_randn(&rng);
            }
        }
    }
    bk_ssm_conv(bk, xc, x, &wc_t, &cs_t, seqs, true);
    struct gdn_params p = {NK, HK, NV, HV, 1e-6f, grouped};
    bk_gated_delta_net(bk, o, xc, a, bl, &sa_t, &dt_t, &ss_t, seqs, &p);
    struct err e;
    T_CHECK(bk_sync(bk, &e) == SMELT_OK);
    r = 0;
    double S[SS], ref_o[NV * HV], cst[CS];
    for (int i = 0; i < np; i++) {
        const struct part *pt = &parts[i];
        struct hist *h = &H[pt->seq];
        int n0 = h->n;
        for (int t = 0; t < pt->n; t++, r++) {
            memcpy(h->xc[n0 + t], (float *)xc->data + (size_t)r * CH, sizeof h->xc[0]);
            ref_conv(h, n0 + t);
            double ec = rel_err((float *)xc->data + (size_t)r * CH, h->conv_ref[n0 + t], CH);
            T_CHECKF(ec < 1e-5, "conv seq %d row %d: %g", pt->seq, n0 + t, ec);
        }
        h->n = n0 + pt->n;
        for (int t = 0; t < pt->n; t++) { /* outputs */
            ref_gdn(h, n0 + t + 1, S, ref_o);
            double eo =
                rel_err((float *)o->data + (size_t)(r - pt->n + t) * NV * HV, ref_o, NV * HV);
            if (eo > worst_out) worst_out = eo;
            T_CHECKF(eo < 2e-5, "gdn seq %d row %d (%d rows this step): %g", pt->seq, n0 + t, pt->n,
                     eo);
        }
        /* the live state and the snapshot */
        ref_gdn(h, h->n, S, NULL);
        double es = rel_err((float *)ss_t.data + (size_t)pt->slot * SS, S, SS);
        if (es > worst_state) worst_state = es;
        T_CHECKF(es < 2e-5, "state seq %d after %d rows: %g", pt->seq, h->n, es);
        ref_conv_state(h, h->n, cst);
        T_CHECK(rel_err((float *)cs_t.data + (size_t)pt->slot * CS, cst, CS) == 0);
        if (pt->snap_at >= 0) {
            ref_gdn(h, n0 + pt->snap_at, S, NULL);
            T_CHECKF(rel_err((float *)ss_t.data + (size_t)pt->snap_slot * SS, S, SS) < 2e-5,
                     "snapshot seq %d at %d", pt->seq, n0 + pt->snap_at);
            ref_conv_state(h, n0 + pt->snap_at, cst);
            T_CHECK(rel_err((float *)cs_t.data + (size_t)pt->snap_slot * CS, cst, CS) == 0);
        }
    }
}

/* Copies slot src into dst in both state tensors (what a restore does). */
static void copy_slot(int dst, int src) {
    bk_step_begin(bk);
    struct tensor *ts[2] = {&cs_t, &ss_t};
    for (int i = 0; i < 2; i++) {
        struct tensor *t = ts[i];
        bk_copy(bk, bk_view_2d(bk, t, t->ne[0], 1, t->nb[1], (size_t)dst * t->nb[1]),
                bk_view_2d(bk, t, t->ne[0], 1, t->nb[1], (size_t)src * t->nb[1]));
    }
    struct err e;
    T_CHECK(bk_sync(bk, &e) == SMELT_OK);
}

static void ssm_ops(bool grouped_heads) {
    grouped = grouped_heads;
    memset(H, 0, sizeof H);
    worst_out = worst_state = 0;
    for (int i = 0; i < CH * DC; i++)
        w_conv[i] = t_randn(&rng) * 0.5f;
    for (int i = 0; i < NV; i++) {
        ssm_a[i] = -expf(t_randn(&rng)); /* -exp(A_log) */
        dt_bias[i] = t_randn(&rng);
    }
    struct err e;
    tensor_init(&cs_t, QT_F32, CS, SLOTS, 1, 1);
    tensor_init(&ss_t, QT_F32, SS, SLOTS, 1, 1);
    T_CHECK(bk_buffer_alloc(bk, &cs_t, &e) == SMELT_OK &&
            bk_buffer_alloc(bk, &ss_t, &e) == SMELT_OK);
    /* garbage in every slot: a fresh sequence must not read it */
    for (int64_t i = 0; i < tensor_nelem(&cs_t); i++)
        ((float *)cs_t.data)[i] = 1e3f;
    for (int64_t i = 0; i < tensor_nelem(&ss_t); i++)
        ((float *)ss_t.data)[i] = -1e3f;
    tensor_init(&wc_t, QT_F32, DC, CH, 1, 1);
    wc_t.data = w_conv;
    tensor_init(&sa_t, QT_F32, NV, 1, 1, 1);
    sa_t.data = ssm_a;
    tensor_init(&dt_t, QT_F32, NV, 1, 1, 1);
    dt_t.data = dt_bias;

    /* step 1: A 70 rows fresh (chunks 64 + 6, snapshot inside at 33), B one row, C 2 rows */
    run_step((struct part[]){{0, 70, 0, 4, 33}, {1, 1, 1, -1, -1}, {2, 2, 2, 5, 2}}, 3);
    /* step 2: decode rows; B snapshots the state it came in with */
    run_step((struct part[]){{1, 1, 1, 6, 0}, {0, 1, 0, -1, -1}, {2, 1, 2, -1, -1}}, 3);
    /* step 3: A 130 rows (3 chunks), C 64 exactly, B 3 with a snapshot at its end */
    run_step((struct part[]){{2, 64, 2, -1, -1}, {0, 130, 0, 7, 130}, {1, 3, 1, 5, 3}}, 3);
    /* restore: A's snapshot at 33 (slot 4) continues as sequence 3 in slot 3 */
    copy_slot(3, 4);
    memcpy(&H[3], &H[0], sizeof H[3]);
    H[3].n = 33;
    run_step((struct part[]){{3, 1, 3, -1, -1}, {0, 1, 0, -1, -1}}, 2);
    run_step((struct part[]){{3, 40, 3, 6, 17}, {1, 1, 1, -1, -1}}, 2);
    printf("%s: max rel err: outputs %.2e, states %.2e\n", grouped ? "grouped" : "tiled",
           worst_out, worst_state);
    bk_buffer_free(bk, &cs_t);
    bk_buffer_free(bk, &ss_t);
}

static void test_ssm_ops_tiled(void) {
    ssm_ops(false);
}
static void test_ssm_ops_grouped(void) {
    ssm_ops(true);
}

int main(void) {
    struct err e;
    if (cpu_backend_new(&bk, 2, &e) != SMELT_OK) return 1;
    T_RUN(test_ssm_ops_tiled);
    T_RUN(test_ssm_ops_grouped);
    bk_free(bk);
    return t_done();
}
