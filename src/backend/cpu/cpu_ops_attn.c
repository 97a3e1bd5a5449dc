/* CPU paged-KV ops: storing a step's K/V rows into cache blocks, and causal (or, for
 * encoders, bidirectional) attention over each row's sequence.
 *
 * Cache layout (one K and one V tensor per layer): (head_dim, block_size, n_kv_head,
 * n_blocks), i.e. [block][kv head][token in block][dim] in memory. A (block, head) tile
 * of block_size rows is contiguous, so attention streams keys head by head.
 *
 * Attention works on one (row, KV head) item at a time: the G = n_head / n_kv_head
 * query heads that share a KV head are scored together, so every key and value row is
 * read (and converted from F16) once per item, not once per query head. Scores for the
 * whole visible range are kept (G x n_keys floats per thread), softmaxed exactly (max
 * subtracted; an attention sink, gpt-oss's per-head logit with no value, joins the max and
 * the sum), then the values are summed. Visible keys are positions
 * [max(0, pos - window + 1), pos] of the row's own sequence; nothing past pos is read.
 * Bidirectional (non-causal) attention sees [0, n_keys[seq]) instead, every key of the
 * sequence (the model checked that all of them are in this step, stored before). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops_vec.h"
#include "util/half.h"

/* ---- kv_store ---- */

static void f32_to_cache_row(uint32_t type, const float *src, void *dst, int64_t n) {
    switch (type) {
    case QT_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case QT_F16:
        cpu_vec_get()->to_f16(src, dst, n);
        return;
    case QT_BF16: {
        uint16_t *h = dst;
        for (int64_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]);
        return;
    }
    default:
        qtype_get(type)->quantize(src, dst, n); /* checked when the cache was made */
        return;
    }
}

struct store_ctx {
    struct tensor *kc, *vc;
    const struct tensor *k, *v;
    const int32_t *slot;
    int32_t block_size;
};

static void store_range(void *vctx, int ith, int64_t t0, int64_t t1) {
    struct store_ctx *c = vctx;
    for (int64_t t = t0; t < t1; t++) {
        int64_t s = c->slot[t], blk = s / c->block_size, off = s % c->block_size;
        for (int64_t h = 0; h < c->k->ne[1]; h++) {
            f32_to_cache_row(c->kc->type, tensor_row(c->k, h, t, 0), tensor_row(c->kc, off, h, blk),
                             c->k->ne[0]);
            f32_to_cache_row(c->vc->type, tensor_row(c->v, h, t, 0), tensor_row(c->vc, off, h, blk),
                             c->v->ne[0]);
        }
    }
}

void cpu_op_kv_store(struct backend *b, struct tensor *kc, struct tensor *vc,
                     const struct tensor *k, const struct tensor *v, const struct attn_meta *m) {
    struct store_ctx c = {kc, vc, k, v, m->slot->data, m->block_size};
    cpu_parallel(cpu_of(b), store_range, &c, k->ne[2], 4);
}

/* ---- attention ---- */

struct attn_ctx {
    struct tensor *dst;
    const struct tensor *q, *kc, *vc, *blocks;
    const int32_t *pos, *seq;
    const int32_t *n_keys; /* non-causal: keys per sequence; NULL: causal */
    const float *sinks; /* (n_head) or NULL */
    int32_t block_size;
    struct attn_params p;
    const struct cpu_vec *vec;
    int64_t max_keys;   /* most keys any row sees */
    float *buf;         /* per thread: G * max_keys scores, then head_dim_k + head_dim_v */
    size_t buf_per_thread;
};

/* First visible key position for a query at pos. */
static inline int64_t first_key(int64_t pos, int32_t window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

static void attn_range(void *vctx, int ith, int64_t i0, int64_t i1) {
    struct attn_ctx *c = vctx;
    const struct cpu_vec *V = c->vec;
    const int64_t n_kv = c->kc->ne[2], n_head = c->q->ne[1], G = n_head / n_kv;
    const int64_t dk = c->kc->ne[0], dv = c->vc->ne[0];
    const uint32_t kt = c->kc->type, vt = c->vc->type;
    float *scores = c->buf + (size_t)ith * c->buf_per_thread;
    float *kbuf = scores + (size_t)G * (size_t)c->max_keys, *vbuf = kbuf + dk;
    float inv_sum[64]; /* G <= 64 (checked by the caller) */

    for (int64_t item = i0; item < i1; item++) {
        int64_t t = item / n_kv, g = item % n_kv;
        int64_t pos = c->pos[t], j0 = first_key(pos, c->p.window), n = pos - j0 + 1;
        if (c->n_keys) j0 = 0, n = c->n_keys[c->seq[t]];
        const int32_t *table = tensor_row(c->blocks, c->seq[t], 0, 0);
        const float *q0 = tensor_row(c->q, g * G, t, 0); /* the group's G query heads */

        /* scores[qh][j] = scale * q . k_j */
        for (int64_t j = 0; j < n; j++) {
            int64_t kp = j0 + j;
            const void *kr = tensor_row(c->kc, kp % c->block_size, g, table[kp / c->block_size]);
            if (kt != QT_F32 && kt != QT_F16) {
                cpu_row_to_f32(kt, kr, kbuf, dk);
                kr = kbuf;
            }
            for (int64_t qh = 0; qh < G; qh++) {
                const float *q = q0 + qh * dk;
                float s = kt == QT_F16 ? V->dot_f16(q, kr, dk) : V->dot_f32(q, kr, dk);
                s *= c->p.scale;
                if (c->p.softcap > 0) s = c->p.softcap * tanhf(s / c->p.softcap);
                scores[qh * n + j] = s;
            }
        }
        /* softmax numerators per query head; the 1/sum is applied to the output. A sink
         * is one more logit in the max and the sum, with no value. */
        for (int64_t qh = 0; qh < G; qh++) {
            float *sc = scores + qh * n, mx = -INFINITY;
            for (int64_t j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
            const float sink = c->sinks ? c->sinks[g * G + qh] : -INFINITY;
            if (sink > mx) mx = sink;
            float sum = V->exp_sum(sc, n, mx);
            if (c->sinks) sum += expf(sink - mx);
            inv_sum[qh] = 1.0f / sum;
            memset(tensor_row(c->dst, g * G + qh, t, 0), 0, (size_t)dv * sizeof(float));
        }
        /* out[qh] = sum_j p[qh][j] v_j / sum */
        for (int64_t j = 0; j < n; j++) {
            int64_t kp = j0 + j;
            const void *vr = tensor_row(c->vc, kp % c->block_size, g, table[kp / c->block_size]);
            if (vt != QT_F32 && vt != QT_F16) {
                cpu_row_to_f32(vt, vr, vbuf, dv);
                vr = vbuf;
            }
            for (int64_t qh = 0; qh < G; qh++) {
                float *o = tensor_row(c->dst, g * G + qh, t, 0);
                if (vt == QT_F16) V->axpy_f16(o, scores[qh * n + j], vr, dv);
                else V->axpy_f32(o, scores[qh * n + j], vr, dv);
            }
        }
        for (int64_t qh = 0; qh < G; qh++) {
            float *o = tensor_row(c->dst, g * G + qh, t, 0);
            for (int64_t d = 0; d < dv; d++) o[d] *= inv_sum[qh];
        }
    }
}

void cpu_op_attention(struct backend *b, struct tensor *dst, const struct tensor *q,
                      const struct tensor *kc, const struct tensor *vc,
                      const struct attn_meta *m, const struct attn_params *p) {
    struct cpu_backend *cb = cpu_of(b);
    struct attn_ctx c = {dst, q, kc, vc, m->blocks, m->pos->data, m->seq->data,
                         p->non_causal ? m->n_keys->data : NULL, p->sinks ? p->sinks->data : NULL,
                         m->block_size, *p, cb->vec, 0, NULL, 0};
    int64_t n_tokens = q->ne[2], G = q->ne[1] / kc->ne[2];
    if (G > 64) {
        bk_fail(b, SMELT_ERR_UNSUPPORTED, "attention: %lld query heads per KV head (max 64)",
                (long long)G);
        return;
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        int64_t n = c.n_keys ? c.n_keys[c.seq[t]] : c.pos[t] - first_key(c.pos[t], p->window) + 1;
        if (n > c.max_keys) c.max_keys = n;
    }
    c.buf_per_thread = (size_t)(G * c.max_keys + kc->ne[0] + vc->ne[0] + 16) & ~(size_t)15;
    c.buf = cpu_scratch(cb, (size_t)cb->n_threads * c.buf_per_thread * sizeof(float));
    if (!c.buf) return;
    cpu_parallel(cb, attn_range, &c, n_tokens * kc->ne[2], 1);
}
