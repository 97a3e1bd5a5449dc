/* CPU recurrent-state ops: the short causal convolution with its state (bk_ssm_conv), the
 * gated delta rule of Gated DeltaNet (bk_gated_delta_net), and the strided copy (bk_copy)
 * that deinterleaves projections and moves state slots.
 *
 * Gated delta rule, per value head, with S (head_v x head_k) the state:
 *   S_t = e^{g_t} S_{t-1};  u_t = beta_t (v_t - S_t k_t);  S_t += u_t k_t^T;  o_t = S_t q_t
 * - A decode row (a sequence with one row in the step) runs this recurrence directly:
 *   one pass over S scales it and dots it with k, a second adds u k^T and dots with q.
 * - Prefill rows run the chunkwise (WY) form, 64 rows at a time, so a prompt costs O(T):
 *   with gam_t the cumulative log decay inside the chunk and S0 the incoming state,
 *     (I + A) W = diag(beta) V,  (I + A) Kc = diag(beta e^{gam}) K,
 *       A[s][r] = beta_s e^{gam_s - gam_r} k_s.k_r  (r < s; forward substitution)
 *     U = W - Kc S0^T                                  (the corrected values u_t)
 *     o_t = e^{gam_t} S0 q_t + sum_{s<=t} e^{gam_t - gam_s} (q_t.k_s) u_s
 *     S_C = e^{gam_C} S0 + sum_s e^{gam_C - gam_s} u_s k_s^T
 *   (the same algebra as transformers' torch_chunk_gated_delta_rule; derivation in
 *   docs/forward.md). Every exponent is <= 0, so nothing overflows. A snapshot inside
 *   the rows splits the chunks there, so the state at the snapshot is materialized.
 * Work items are (sequence, value head) pairs: each owns its state rows, so the threads
 * never share a write, and a row's result depends only on its own sequence's rows. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"

#define GDN_CHUNK 64

static inline const int32_t *seq_words(const struct tensor *seqs, int64_t s) {
    return (const int32_t *)seqs->data + s * STATE_SEQ_WORDS;
}

/* ---- copy ---- */

static inline float *row3(const struct tensor *t, int64_t r) {
    return tensor_row(t, r % t->ne[1], (r / t->ne[1]) % t->ne[2], r / (t->ne[1] * t->ne[2]));
}

struct copy_ctx {
    struct tensor *dst;
    const struct tensor *src;
};

static void copy_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    (void)ith;
    struct copy_ctx *c = vctx;
    size_t n = (size_t)c->src->ne[0] * sizeof(float);
    for (int64_t r = i0; r < i1; r++)
        memcpy(row3(c->dst, r), row3(c->src, r), n);
}

void cpu_op_copy(struct backend *b, struct tensor *dst, const struct tensor *src) {
    struct copy_ctx c = {dst, src};
    cpu_parallel(cpu_of(b), copy_range, &c, tensor_nrows(src), 16);
}

/* ---- ssm_conv ---- */

struct conv_ctx {
    struct tensor *dst;
    const struct tensor *x, *w, *seqs;
    struct tensor *cs;
    bool silu;
};

/* Input row i of a sequence (i < 0 reaches back into the conv state of d - 1 rows). */
static inline float conv_in(const struct conv_ctx *c, const float *state, bool fresh, int64_t r0,
                            int64_t i, int64_t ch, int64_t d) {
    int64_t C = c->x->ne[0];
    if (i >= 0) return ((const float *)c->x->data)[(r0 + i) * C + ch];
    if (fresh) return 0.0f;
    return state[(d - 1 + i) * C + ch];
}

static void conv_range(void *vctx, int ith, int64_t c0, int64_t c1) {
    (void)ith;
    struct conv_ctx *c = vctx;
    int64_t C = c->x->ne[0], d = c->w->ne[0];
    const float *w = c->w->data;
    float *cs = c->cs->data;
    float *out = c->dst->data;
    for (int64_t s = 0; s < c->seqs->ne[1]; s++) {
        const int32_t *q = seq_words(c->seqs, s);
        int64_t r0 = q[STATE_ROW0], n = q[STATE_NROWS];
        if (n <= 0) continue;
        bool fresh = q[STATE_FRESH] != 0;
        float *st = cs + (size_t)q[STATE_SLOT] * (size_t)((d - 1) * C);
        for (int64_t t = 0; t < n; t++) {
            float *y = out + (r0 + t) * C;
            for (int64_t ch = c0; ch < c1; ch++) {
                const float *wc = w + ch * d;
                float acc = 0.0f;
                for (int64_t j = 0; j < d; j++)
                    acc += wc[j] * conv_in(c, st, fresh, r0, t - (d - 1) + j, ch, d);
                y[ch] = c->silu ? acc / (1.0f + expf(-acc)) : acc;
            }
        }
        /* the snapshot first: it may read state rows the live update overwrites */
        int64_t at = q[STATE_SNAP_AT];
        if (at >= 0) {
            float *sn = cs + (size_t)q[STATE_SNAP_SLOT] * (size_t)((d - 1) * C);
            for (int64_t i = 0; i < d - 1; i++)
                for (int64_t ch = c0; ch < c1; ch++)
                    sn[i * C + ch] = conv_in(c, st, fresh, r0, at - (d - 1) + i, ch, d);
        }
        /* new state row i is input n - (d - 1) + i: an old state row i + n > i when
         * negative, so writing in increasing i never clobbers a row still to be read */
        for (int64_t i = 0; i < d - 1; i++)
            for (int64_t ch = c0; ch < c1; ch++)
                st[i * C + ch] = conv_in(c, st, fresh, r0, n - (d - 1) + i, ch, d);
    }
}

void cpu_op_ssm_conv(struct backend *b, struct tensor *dst, const struct tensor *x,
                     const struct tensor *w, struct tensor *cs, const struct tensor *seqs,
                     bool silu) {
    struct conv_ctx c = {dst, x, w, seqs, cs, silu};
    cpu_parallel(cpu_of(b), conv_range, &c, x->ne[0], 64);
}

/* ---- gated delta rule ---- */

struct gdn_ctx {
    struct tensor *dst;
    const struct tensor *qkv, *a, *bl, *ssm_a, *dt_bias, *seqs;
    struct tensor *ss;
    struct gdn_params p;
    float *buf; /* per thread: gdn_buf_floats */
    size_t buf_floats;
    const struct cpu_vec *vec;
};

static size_t gdn_buf_floats(const struct gdn_params *p) {
    size_t C = GDN_CHUNK, hk = (size_t)p->head_k, hv = (size_t)p->head_v;
    return 4 * C * hk + 3 * C * hv + C * C + 2 * C + hk + hk;
}

static inline float softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* Row r's normalized (and, for q, scaled) key-head vectors, its value, gate and beta. */
static void gdn_load(const struct gdn_ctx *c, int64_t r, int64_t h, float *q, float *k,
                     const float **v, float *g, float *beta) {
    const struct gdn_params *p = &c->p;
    int64_t hk = p->head_k,
            kh = p->grouped ? h / (p->n_v_head / p->n_k_head) : h % p->n_k_head;
    const float *row = (const float *)c->qkv->data + r * c->qkv->ne[0];
    const float *qs = row + kh * hk, *ks = row + (int64_t)p->n_k_head * hk + kh * hk;
    float qq = c->vec->dot_f32(qs, qs, hk), kk = c->vec->dot_f32(ks, ks, hk);
    float qi = 1.0f / sqrtf(qq + p->eps) / sqrtf((float)hk), ki = 1.0f / sqrtf(kk + p->eps);
    for (int64_t j = 0; j < hk; j++) {
        q[j] = qs[j] * qi;
        k[j] = ks[j] * ki;
    }
    *v = row + 2 * (int64_t)p->n_k_head * hk + h * p->head_v;
    float av = ((const float *)c->a->data)[r * p->n_v_head + h];
    float bv = ((const float *)c->bl->data)[r * p->n_v_head + h];
    *g = ((const float *)c->ssm_a->data)[h] * softplus(av + ((const float *)c->dt_bias->data)[h]);
    *beta = 1.0f / (1.0f + expf(-bv));
}

/* One row, recurrently (S: head_v rows of head_k), with the vector kernels: per state row a
 * decay, a dot with k, an update along k and a dot with q. */
static void gdn_step(const struct gdn_ctx *c, int64_t r, int64_t h, float *S, float *tmp) {
    const struct cpu_vec *vec = c->vec;
    int64_t hk = c->p.head_k, hv = c->p.head_v;
    float *q = tmp, *k = tmp + hk, g, beta;
    const float *v;
    gdn_load(c, r, h, q, k, &v, &g, &beta);
    float decay = expf(g);
    float *o = (float *)c->dst->data + (r * c->p.n_v_head + h) * hv;
    for (int64_t i = 0; i < hv; i++) {
        float *Si = S + i * hk;
        for (int64_t j = 0; j < hk; j++)
            Si[j] *= decay;
        const float u = beta * (v[i] - vec->dot_f32(Si, k, hk));
        vec->axpy_f32(Si, u, k, hk);
        o[i] = vec->dot_f32(Si, q, hk);
    }
}

/* Rows [r0, r0 + n), n <= GDN_CHUNK, in the chunkwise form (see the file comment): the
 * chunk's products (K K^T, Kc S0^T, Q S0^T, Q K^T, U^T K) through the vector table's
 * gemm_nt, the forward substitution and the intra-chunk sums as axpys. */
static void gdn_chunk(const struct gdn_ctx *c, int64_t r0, int64_t n, int64_t h, float *S,
                      float *buf) {
    const struct cpu_vec *vec = c->vec;
    const int64_t C = GDN_CHUNK, hk = c->p.head_k, hv = c->p.head_v;
    float *Q = buf, *K = Q + C * hk, *Kc = K + C * hk, *KT = Kc + C * hk, *W = KT + C * hk, *U = W + C * hv,
          *UT = U + C * hv, *A = UT + C * hv, *beta = A + C * C, *gam = beta + C;
    float cum = 0.0f;
    for (int64_t t = 0; t < n; t++) { /* W starts as diag(beta) V */
        const float *v;
        float g;
        gdn_load(c, r0 + t, h, Q + t * hk, K + t * hk, &v, &g, &beta[t]);
        for (int64_t i = 0; i < hv; i++)
            W[t * hv + i] = beta[t] * v[i];
        cum += g;
        gam[t] = cum;
    }
    /* A (strictly lower), then forward substitution for W and Kc */
    vec->gemm_nt(A, C, K, hk, K, hk, n, n, hk, 0);
    for (int64_t s = 0; s < n; s++) {
        for (int64_t r = 0; r < s; r++)
            A[s * C + r] *= beta[s] * expf(gam[s] - gam[r]);
        float *ws = W + s * hv, *kcs = Kc + s * hk;
        float eg = beta[s] * expf(gam[s]);
        for (int64_t j = 0; j < hk; j++)
            kcs[j] = eg * K[s * hk + j];
        for (int64_t r = 0; r < s; r++) {
            vec->axpy_f32(ws, -A[s * C + r], W + r * hv, hv);
            vec->axpy_f32(kcs, -A[s * C + r], Kc + r * hk, hk);
        }
    }
    /* U = W - Kc S0^T, and the outputs' state part e^{gam_t} S0 q_t (S0 still intact) */
    const int64_t ldo = (int64_t)c->p.n_v_head * hv;
    float *o0 = (float *)c->dst->data + (r0 * c->p.n_v_head + h) * hv;
    vec->gemm_nt(U, hv, Kc, hk, S, hk, n, hv, hk, 0);
    vec->gemm_nt(o0, ldo, Q, hk, S, hk, n, hv, hk, 0);
    for (int64_t s = 0; s < n; s++) {
        float eg = expf(gam[s]), *o = o0 + s * ldo;
        for (int64_t i = 0; i < hv; i++) {
            U[s * hv + i] = W[s * hv + i] - U[s * hv + i];
            o[i] *= eg;
        }
    }
    /* the intra-chunk part: o_t += sum_{s<=t} e^{gam_t - gam_s} (q_t.k_s) u_s (A reused) */
    vec->gemm_nt(A, C, Q, hk, K, hk, n, n, hk, 0);
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s <= t; s++)
            vec->axpy_f32(o0 + t * ldo, expf(gam[t] - gam[s]) * A[t * C + s], U + s * hv, hv);
    /* S = e^{gam_n} S0 + sum_s e^{gam_n - gam_s} u_s k_s^T: U and the rescaled K transposed
     * (the sum over s contiguous), then S += U^T K */
    float gl = gam[n - 1], el = expf(gl);
    for (int64_t s = 0; s < n; s++) {
        float f = expf(gl - gam[s]);
        for (int64_t j = 0; j < hk; j++)
            KT[j * n + s] = K[s * hk + j] * f;
        for (int64_t i = 0; i < hv; i++)
            UT[i * n + s] = U[s * hv + i];
    }
    for (int64_t i = 0; i < hv * hk; i++)
        S[i] *= el;
    vec->gemm_nt(S, hk, UT, n, KT, n, hv, hk, n, 1);
}

/* Rows [r0, r0 + n) of one head: a single row recurrently, more in chunks. */
static void gdn_rows(const struct gdn_ctx *c, int64_t r0, int64_t n, int64_t h, float *S,
                     float *buf) {
    if (n == 1) {
        gdn_step(c, r0, h, S, buf);
        return;
    }
    for (int64_t t = 0; t < n; t += GDN_CHUNK)
        gdn_chunk(c, r0 + t, n - t < GDN_CHUNK ? n - t : GDN_CHUNK, h, S, buf);
}

static void gdn_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct gdn_ctx *c = vctx;
    float *buf = c->buf + (size_t)ith * c->buf_floats;
    int64_t nv = c->p.n_v_head, hd = (int64_t)c->p.head_v * c->p.head_k;
    size_t slot_floats = (size_t)(nv * hd);
    for (int64_t it = i0; it < i1; it++) {
        int64_t s = it / nv, h = it % nv;
        const int32_t *q = seq_words(c->seqs, s);
        int64_t r0 = q[STATE_ROW0], n = q[STATE_NROWS], at = q[STATE_SNAP_AT];
        if (n <= 0) continue;
        float *S = (float *)c->ss->data + (size_t)q[STATE_SLOT] * slot_floats + (size_t)(h * hd);
        if (q[STATE_FRESH]) memset(S, 0, (size_t)hd * sizeof(float));
        float *snap = at >= 0 ? (float *)c->ss->data + (size_t)q[STATE_SNAP_SLOT] * slot_floats +
                                    (size_t)(h * hd)
                              : NULL;
        int64_t cut = snap ? at : n;
        if (cut > 0) gdn_rows(c, r0, cut, h, S, buf);
        if (snap) memcpy(snap, S, (size_t)hd * sizeof(float));
        if (cut < n) gdn_rows(c, r0 + cut, n - cut, h, S, buf);
    }
}

void cpu_op_gated_delta_net(struct backend *b, struct tensor *dst, const struct tensor *qkv,
                            const struct tensor *a, const struct tensor *bl,
                            const struct tensor *ssm_a, const struct tensor *dt_bias,
                            struct tensor *ss, const struct tensor *seqs,
                            const struct gdn_params *p) {
    struct cpu_backend *cb = cpu_of(b);
    struct gdn_ctx c = {dst, qkv, a, bl, ssm_a, dt_bias, seqs, ss, *p, NULL, gdn_buf_floats(p), cb->vec};
    c.buf = cpu_scratch(cb, (size_t)cb->n_threads * c.buf_floats * sizeof(float));
    if (!c.buf) return;
    cpu_parallel(cb, gdn_range, &c, seqs->ne[1] * p->n_v_head, 1);
}
