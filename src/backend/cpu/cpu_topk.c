/* The logits_topk op on the CPU (contract in backend.h and backend/topk.h): each row's
 * summary by topk_summarize_row (backend/topk.c), the rows split over the thread pool. */
#include "backend/cpu/cpu_backend.h"

struct topk_ctx {
    const struct tensor *logits;
    const struct topk_row *rows;
    const struct logit_adj *adj;
    const uint32_t *mask; /* (words, n_rows) or NULL */
    int64_t adj_cap, n_rows, words;
    int32_t *out;
};

static void topk_range(void *vctx, int ith, int64_t r0, int64_t r1) {
    struct topk_ctx *c = vctx;
    struct topk_summary *sums = (struct topk_summary *)c->out;
    struct topk_cand *cands = (struct topk_cand *)(c->out + topk_cand_word(c->n_rows));
    float *raw = (float *)(c->out + topk_raw_word(c->n_rows));
    for (int64_t r = r0; r < r1; r++) {
        struct topk_row q = c->rows[r];
        /* a range outside the list is a caller bug: the row then runs unadjusted */
        if (q.adj_off < 0 || q.adj_n < 0 || q.adj_off > c->adj_cap || q.adj_n > c->adj_cap - q.adj_off)
            q.adj_off = q.adj_n = 0;
        const uint32_t *mask = c->mask ? c->mask + r * c->words : NULL;
        topk_summarize_row(tensor_row(c->logits, r, 0, 0), (int32_t)c->logits->ne[0], &q,
                           c->adj + q.adj_off, mask, &sums[r], cands + r * TOPK_MAX,
                           raw + q.adj_off);
    }
}

void cpu_op_logits_topk(struct backend *b, struct tensor *dst, const struct tensor *logits,
                        const struct tensor *rows, const struct tensor *adj,
                        const struct tensor *mask) {
    struct topk_ctx c = {logits,
                         rows->data,
                         adj->data,
                         mask ? mask->data : NULL,
                         adj->ne[1],
                         logits->ne[1],
                         topk_mask_words(logits->ne[0]),
                         dst->data};
    cpu_parallel(cpu_of(b), topk_range, &c, c.n_rows, 1);
}
