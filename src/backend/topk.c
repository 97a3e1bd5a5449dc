/* One logits row's summary on the host (contract in topk.h): the reference every
 * backend's logits_topk op is checked against, the CPU backend's op (cpu_topk.c runs it
 * per row on the thread pool), and what model_step and the sampler run on rows they hold
 * in host memory.
 *
 * One row, in at most two passes over its n_vocab logits:
 *   pass 1: adjusted value of every token (the adjustments are sorted by token, so one
 *           pointer walks them beside the row), count of finite ones, both maxima, and a
 *           min-heap of the k best keys (a token is keyed only when its logit reaches the
 *           heap's smallest one, so after the first few thousand tokens most are one
 *           compare);
 *   pass 2: only for TOPK_SUM / TOPK_RAW: the sums of exponentials, in chunks of 1024
 *           through the vector exp of cpu_ops_vec (AVX2/AVX-512 when present).
 * A row that needs only its argmax (k = 1, no adjustments, sums or mask) is one vectorized
 * pass (cpu_argmax). A masked row visits only its allowed tokens, 32 at a time by the
 * mask's words (structured output's masks are mostly all-or-nothing words). Host code runs on the
 * CPU whatever the backend, so this file uses the CPU backend's two vector kernels; it needs
 * nothing else of it (no pool, no struct cpu_backend). */
#include "backend/topk.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_argmax.h"
#include "backend/cpu/cpu_ops_vec.h"

#define CHUNK 1024

static int key_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* Sum of exp over a row's values produced by fill(): chunks through the vector exp. */
struct sum_src {
    const float *x;
    const struct logit_adj *adj, *adj_end; /* NULL: raw values */
    const uint32_t *mask;                  /* NULL: every token */
    float max, scale;
};

static double exp_sum_row(const struct sum_src *s, int32_t nv) {
    const struct cpu_vec *V = cpu_vec_get();
    float buf[CHUNK];
    double total = 0;
    const struct logit_adj *ap = s->adj;
    for (int32_t c0 = 0; c0 < nv; c0 += CHUNK) {
        int32_t n = nv - c0 < CHUNK ? nv - c0 : CHUNK;
        for (int32_t j = 0; j < n; j++) {
            float v = s->x[c0 + j];
            if (ap) {
                int32_t i = c0 + j;
                while (ap < s->adj_end && ap->token == i) v = topk_adj_apply(v, ap++);
            }
            buf[j] = v > -INFINITY ? (v - s->max) * s->scale : -INFINITY;
        }
        for (int32_t j = 0; s->mask && j < n; j++)
            if (!topk_allowed(s->mask, c0 + j)) buf[j] = -INFINITY;
        total += (double)V->exp_sum(buf, n, 0.0f);
    }
    return total;
}

/* Pass 1's work on token i of raw logit r (its adjustments are the next ones at *ap):
 * both maxima, the count of finite adjusted logits, the min-heap of the k best keys (a
 * token is keyed only when its logit reaches the heap's smallest, thr). Inlined into both
 * loops with its state in the caller's locals. */
static inline __attribute__((always_inline)) void
visit(int32_t i, float r, const struct logit_adj **ap, const struct logit_adj *aend, float *mr,
      float *ma, int32_t *nf, uint64_t *heap, int *nh, int k, float *thr) {
    float a = r;
    while (*ap < aend && (*ap)->token == i)
        a = topk_adj_apply(a, (*ap)++);
    if (r > *mr) *mr = r;
    if (!(a > -INFINITY)) return; /* -inf, NaN */
    (*nf)++;
    if (a > *ma) *ma = a;
    if (*nh < k) {
        heap[*nh] = topk_key(a, i);
        topk_heap_up(heap, (*nh)++);
        if (*nh == k) *thr = topk_key_logit(heap[0]);
    } else if (a >= *thr) {
        uint64_t key = topk_key(a, i);
        if (key > heap[0]) {
            heap[0] = key;
            topk_heap_down(heap, *nh, 0);
            *thr = topk_key_logit(heap[0]);
        }
    }
}

void topk_summarize_row(const float *x, int32_t nv, const struct topk_row *req,
                        const struct logit_adj *adj, const uint32_t *mask, struct topk_summary *sum,
                        struct topk_cand *cand, float *adj_raw) {
    if (req->k <= 0) return;
    int k = req->k > TOPK_MAX ? TOPK_MAX : req->k;
    int32_t n_adj = adj && req->adj_n > 0 ? req->adj_n : 0;
    bool want_sum = req->flags & TOPK_SUM, want_raw = req->flags & TOPK_RAW;
    const uint32_t *mk = req->flags & TOPK_MASK ? mask : NULL;
    memset(sum, 0, sizeof *sum);
    for (int32_t e = 0; adj_raw && e < n_adj; e++) {
        int32_t t = adj[e].token;
        adj_raw[e] = t >= 0 && t < nv ? (topk_allowed(mk, t) ? x[t] : -INFINITY) : NAN;
    }
    /* entries of tokens below 0 can never match a row index (the list is sorted) */
    const struct logit_adj *a0 = n_adj ? adj : NULL, *aend = n_adj ? adj + n_adj : NULL;
    while (a0 < aend && a0->token < 0) a0++;

    if (k == 1 && a0 == aend && !want_sum && !want_raw && !mk) {
        int32_t nf = 0, best = cpu_argmax(x, nv, &nf);
        sum->n_finite = nf;
        sum->n_cand = best >= 0;
        sum->max_adj = -INFINITY;
        sum->top_token = -1;
        sum->top_logit = -INFINITY;
        if (best >= 0) {
            uint64_t key = topk_key(x[best], best);
            cand[0] = (struct topk_cand){best, topk_key_logit(key)};
            sum->max_adj = sum->top_logit = cand[0].logit;
            sum->top_token = best;
        }
        return;
    }

    uint64_t heap[TOPK_MAX];
    int nh = 0;
    float thr = -INFINITY; /* logit of heap[0] once the heap is full */
    float mr = -INFINITY, ma = -INFINITY;
    int32_t nf = 0;
    const struct logit_adj *ap = a0;
    if (!mk) {
        for (int32_t i = 0; i < nv; i++)
            visit(i, x[i], &ap, aend, &mr, &ma, &nf, heap, &nh, k, &thr);
    } else {
        /* a masked token is -inf: not visited. A word of 32 refused tokens is one test
         * (a grammar's masks are mostly very sparse or very dense). */
        for (int32_t w0 = 0; w0 < nv; w0 += 32) {
            uint32_t bits = mk[w0 >> 5];
            int32_t end = nv - w0 < 32 ? nv : w0 + 32;
            for (; bits; bits &= bits - 1) {
                int32_t i = w0 + __builtin_ctz(bits);
                if (i >= end) break;
                while (ap < aend && ap->token < i)
                    ap++; /* of masked tokens */
                visit(i, x[i], &ap, aend, &mr, &ma, &nf, heap, &nh, k, &thr);
            }
        }
    }
    qsort(heap, (size_t)nh, sizeof heap[0], key_desc);
    for (int j = 0; j < nh; j++)
        cand[j] = (struct topk_cand){topk_key_token(heap[j]), topk_key_logit(heap[j])};
    sum->n_cand = nh;
    sum->n_finite = nf;
    sum->max_adj = nh ? cand[0].logit : -INFINITY;
    sum->top_token = nh ? cand[0].token : -1;
    sum->top_logit = nh ? cand[0].logit : -INFINITY;
    if (want_sum) {
        float inv_t = req->inv_t > 0.0f ? req->inv_t : 1.0f;
        struct sum_src s = {x, a0, aend, mk, ma, inv_t};
        sum->sum_adj = ma > -INFINITY ? (float)exp_sum_row(&s, nv) : 0.0f;
    }
    if (want_raw) {
        sum->max_raw = mr;
        if (mr > -INFINITY) {
            struct sum_src s = {x, NULL, NULL, mk, mr, 1.0f};
            sum->lse_raw = mr + (float)log(exp_sum_row(&s, nv));
        } else {
            sum->lse_raw = -INFINITY;
        }
    }
}
