/* Row summaries for sampling: the data of the logits_topk op (backend.h, bk_logits_topk).
 *
 * Instead of copying each output row's n_vocab logits (152k-262k floats) to the host, a
 * step reduces every row on the device to what a sampler needs (docs/sampling.md):
 *   - its k best candidates (token, adjusted logit), sorted by logit descending, ties
 *     by token ascending;
 *   - the largest adjusted logit and sum_i exp((adj_i - max) * inv_t) (nucleus checks,
 *     and whether a temperature draw falls among the candidates);
 *   - the largest raw logit and the log-sum-exp of the raw logits (logprobs);
 *   - how many tokens have a finite adjusted logit (whether the candidates are all).
 * "Adjusted" logits are the raw ones with the row's sparse adjustments applied (the
 * penalties over the token history and the logit bias: a few hundred tokens at most),
 * which the host builds from the sampler's state and uploads with the step.
 *
 * A row may also have a token mask (TOPK_MASK: structured output, docs/structured-output.md):
 * a bitmask of the allowed tokens, bit (i % 32) of word i / 32 for token i. A token whose bit
 * is clear counts as a logit of -inf before anything else, raw and adjusted alike: the
 * summary, the sums and the raw log-sum-exp (logprobs) are those of the masked row, as vLLM
 * applies a grammar's bitmask to the logits before its sampler.
 *
 * Plain C structs of 4-byte fields, shared by the host, the CPU backend and the CUDA
 * kernels (cuda_sample.cu); layouts must not change without both sides. One row's
 * summary in host memory is topk_summarize_row (topk.c), the reference of every
 * backend's op. */
#ifndef SMELT_BACKEND_TOPK_H
#define SMELT_BACKEND_TOPK_H

#include <math.h>
#include <stdint.h>

#define TOPK_MAX 256 /* candidates per row at most */

/* Flags of struct topk_row. */
#define TOPK_SUM 1 /* compute sum_adj */
#define TOPK_RAW 2 /* compute max_raw and lse_raw */
#define TOPK_MASK 4 /* apply the row's token mask (the mask tensor's row of this row) */

/* What one output row needs (the op's per-row input, TOPK_ROW_WORDS words). */
struct topk_row {
    int32_t k;       /* candidates wanted: 0 = skip the row (its summary is unspecified),
                      * 1..TOPK_MAX */
    int32_t flags;   /* TOPK_SUM | TOPK_RAW | TOPK_MASK */
    float inv_t;     /* 1 / temperature for sum_adj (> 0; 1 when unused) */
    int32_t adj_off; /* this row's adjustments: adj[adj_off .. adj_off + adj_n), sorted by */
    int32_t adj_n;   /*   token (entries of one token adjacent, applied in list order) */
    int32_t pad;
};
#define TOPK_ROW_WORDS 6

/* A sparse change to one logit l. Applied in list order, each entry does:
 *   if (rep != 1) l = l > 0 ? l / rep : l * rep;   repetition penalty
 *   l = l - sub;                                   presence + frequency penalties
 *   l = add == -inf ? -inf : l + add;              logit bias, or a ban
 * every operation rounded on its own (no fused multiply-add), so the host and every
 * device get the same adjusted logit bit for bit. */
struct logit_adj {
    int32_t token;
    float rep, sub, add;
};
#define TOPK_ADJ_WORDS 4

/* Words of a token mask over n_vocab tokens (uint32: bit i % 32 of word i / 32 = token i,
 * set = allowed; xgrammar's and vLLM's layout, the grammar engine's gram_mask_words). */
static inline int64_t topk_mask_words(int64_t n_vocab) {
    return (n_vocab + 31) / 32;
}
/* Whether token i is allowed by mask (NULL: every token is). */
static inline int topk_allowed(const uint32_t *mask, int32_t i) {
    return !mask || (mask[i >> 5] >> (i & 31)) & 1u;
}

/* One entry applied on the host. Separate statements, and the files that call it are
 * built for baseline x86-64 (no FMA to contract into), so each step rounds on its own
 * like the device's __f*_rn intrinsics. */
static inline float topk_adj_apply(float l, const struct logit_adj *a) {
    if (a->rep != 1.0f) l = l > 0.0f ? l / a->rep : l * a->rep;
    l = l - a->sub;
    return a->add == -INFINITY ? -INFINITY : l + a->add;
}

/* One row's summary (TOPK_SUM_WORDS words). NaN logits count as -inf everywhere. */
struct topk_summary {
    int32_t n_cand;    /* candidates written: min(k, n_finite) */
    int32_t n_finite;  /* tokens whose adjusted logit is > -inf */
    float max_adj;     /* the largest adjusted logit; -inf when n_finite = 0 */
    float sum_adj;     /* TOPK_SUM: sum over finite tokens of exp((adj - max_adj) * inv_t) */
    float max_raw;     /* TOPK_RAW: the largest raw logit */
    float lse_raw;     /* TOPK_RAW: log(sum exp(raw)); -inf when no raw logit is finite */
    int32_t top_token; /* candidate 0: the adjusted argmax (lowest id on ties); -1 if none */
    float top_logit;   /* its adjusted logit */
};
#define TOPK_SUM_WORDS 8

/* A candidate: token and adjusted logit. */
struct topk_cand {
    int32_t token;
    float logit;
};

/* The op's output for n_rows rows and an adjustment list of adj_cap entries, as one
 * I32 tensor of topk_out_words() words:
 *   [n_rows summaries][n_rows x TOPK_MAX candidates][adj_cap raw logits]
 * Row r's candidates start at candidate r * TOPK_MAX. The raw-logit section holds, for
 * every adjustment entry a row references, the raw logit of its token (the host needs
 * them for logprobs of adjusted tokens). */
static inline int64_t topk_out_words(int64_t n_rows, int64_t adj_cap) {
    return n_rows * TOPK_SUM_WORDS + n_rows * TOPK_MAX * 2 + adj_cap;
}
static inline int64_t topk_cand_word(int64_t n_rows) { return n_rows * TOPK_SUM_WORDS; }
static inline int64_t topk_raw_word(int64_t n_rows) {
    return n_rows * TOPK_SUM_WORDS + n_rows * TOPK_MAX * 2;
}

/* Order-preserving 64-bit key of (logit, token): a larger key ranks first (larger logit,
 * then smaller token). -0 is taken as +0. Key 0 never belongs to a finite logit. */
static inline uint64_t topk_key(float v, int32_t token) {
    union {
        float f;
        uint32_t u;
    } c;
    c.f = v == 0.0f ? 0.0f : v;
    uint32_t o = (c.u & 0x80000000u) ? ~c.u : (c.u | 0x80000000u);
    return ((uint64_t)o << 32) | (uint32_t)~(uint32_t)token;
}

/* The logit and token of a key. */
static inline float topk_key_logit(uint64_t key) {
    uint32_t o = (uint32_t)(key >> 32);
    union {
        uint32_t u;
        float f;
    } c;
    c.u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
    return c.f;
}
static inline int32_t topk_key_token(uint64_t key) { return (int32_t)~(uint32_t)key; }

/* Min-heap of keys (h[0] the smallest kept), to keep the k largest of a stream: the host
 * summary (topk.c) and the sampler's fallback over a full row (engine/sample.c). */
static inline void topk_heap_down(uint64_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l] < h[m]) m = l;
        if (r < n && h[r] < h[m]) m = r;
        if (m == i) return;
        uint64_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static inline void topk_heap_up(uint64_t *h, int64_t i) {
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (h[p] <= h[i]) return;
        uint64_t t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* One row's summary in host memory (topk.c): the reference every backend's logits_topk
 * op is checked against, the CPU backend's op, and the host path of model_step and the
 * sampler. logits: the row's n_vocab raw logits; adj: the row's req->adj_n entries (sorted
 * by token) or NULL; mask: the row's token mask (topk_mask_words(n_vocab) words), applied
 * when req->flags has TOPK_MASK, or NULL (no mask); cand: room for req->k candidates;
 * adj_raw: req->adj_n floats or NULL (a masked token's raw logit is -inf). Fields the
 * request did not ask for (sum_adj without TOPK_SUM, max_raw and lse_raw without TOPK_RAW)
 * are unspecified. Nothing is written when req->k <= 0. */
#ifdef __cplusplus
extern "C"
#endif
    void
    topk_summarize_row(const float *logits, int32_t n_vocab, const struct topk_row *req,
                       const struct logit_adj *adj, const uint32_t *mask, struct topk_summary *sum,
                       struct topk_cand *cand, float *adj_raw);

#endif
