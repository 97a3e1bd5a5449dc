/* SentencePiece BPE ("llama" vocabs: Llama 2, Mistral, Gemma, Phi-3) on one text segment.
 *
 * The segment is normalized the SentencePiece way: a "▁" prefix when the vocab adds one
 * (first segment, and each segment after a special token, as HF's Prepend normalizer
 * does per segment), and every space becomes "▁" (U+2581). Then each UTF-8 character is a
 * symbol and, while some adjacent pair concatenates to a piece in the vocab, the pair
 * whose piece has the highest score is merged (the leftmost among equal scores).
 * Only normal and user-defined pieces take part: control, byte and unused pieces are
 * never produced from text. A symbol left that is not a piece (a character outside the
 * vocab) becomes its UTF-8 bytes as <0xNN> tokens, or the unknown token when the vocab
 * has no byte tokens (consecutive unknowns fused into one, like HF's fuse_unk).
 *
 * The merge loop is a linked list of symbols and a max-heap of candidate pairs; a popped
 * pair is stale when either side was merged since (its byte length no longer adds up).
 * Symbols index into the normalized text, so a pair's piece is one contiguous span and
 * is looked up without copying.
 */
#include <stdlib.h>

#include "tokenizer/tok_int.h"
#include "util/ckd.h"
#include "util/utf8.h"

struct spm_sym {
    uint32_t start, len; /* bytes of the normalized text; len 0 = merged away */
    int32_t prev, next;
};

struct spm_pair {
    float score;
    int32_t left, right;
    uint32_t len; /* the merged piece's length when pushed */
    int32_t id;
};

static bool pair_before(const struct spm_pair *x, const struct spm_pair *y) {
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static void pq_push(struct spm_pair *h, size_t *n, struct spm_pair it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pair_before(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static struct spm_pair pq_pop(struct spm_pair *h, size_t *n) {
    struct spm_pair top = h[0], last = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= m) break;
        size_t r = l + 1, k = (r < m && pair_before(&h[r], &h[l])) ? r : l;
        if (!pair_before(&h[k], &last)) break;
        h[i] = h[k];
        i = k;
    }
    if (m) h[i] = last;
    return top;
}

/* The mergeable piece spelled text[0..n), or -1. */
static int32_t piece_id(const struct tok *t, const uint8_t *text, size_t n) {
    int32_t id = tok_map_find(t, text, n);
    return id >= 0 && (t->attr[id] & TOK_A_MERGEABLE) ? id : -1;
}

static void try_pair(const struct tok *t, const uint8_t *text, const struct spm_sym *s, int32_t l,
                     int32_t r, struct spm_pair *h, size_t *hn) {
    if (l < 0 || r < 0) return;
    uint32_t len = s[l].len + s[r].len;
    int32_t id = piece_id(t, text + s[l].start, len);
    if (id < 0) return;
    pq_push(h, hn, (struct spm_pair){t->score[id], l, r, len, id});
}

smelt_status tok_spm_segment(struct tok_ctx *c, const uint8_t *s, size_t n, bool prefix,
                             struct err *e) {
    const struct tok *t = c->t;
    if (n == 0) return SMELT_OK; /* HF's Prepend skips empty text */
    /* Normalize: "▁" prefix, spaces -> "▁". At most 3 bytes per input byte, plus 3. */
    size_t need;
    if (ckd_mul_size(&need, n, 3) || ckd_add_size(&need, need, 3) || need > UINT32_MAX)
        return err_set(e, SMELT_ERR_RANGE, "SentencePiece segment of %zu bytes is too long", n);
    if (tok_ctx_buf(c, need) != SMELT_OK)
        return err_set(e, SMELT_ERR_NOMEM, "SentencePiece scratch (%zu bytes)", need);
    uint8_t *text = c->buf;
    size_t tn = 0;
    if (prefix) {
        memcpy(text, "\xE2\x96\x81", 3);
        tn = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(text + tn, "\xE2\x96\x81", 3);
            tn += 3;
        } else {
            text[tn++] = s[i];
        }
    }

    /* Symbols: one per character. */
    size_t nsym_max = tn;
    struct spm_sym *sym = malloc(nsym_max * sizeof *sym);
    struct spm_pair *h = malloc((3 * nsym_max + 1) * sizeof *h);
    if (!sym || !h) {
        free(sym);
        free(h);
        return err_set(e, SMELT_ERR_NOMEM, "SentencePiece symbols (%zu)", nsym_max);
    }
    int32_t ns = 0;
    for (size_t i = 0; i < tn;) {
        uint32_t cp;
        size_t k = utf8_decode(text + i, tn - i, &cp);
        if (!k) k = 1; /* not expected: input is repaired before */
        sym[ns] = (struct spm_sym){(uint32_t)i, (uint32_t)k, ns - 1, -1};
        if (ns > 0) sym[ns - 1].next = ns;
        ns++;
        i += k;
    }
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        try_pair(t, text, sym, i, i + 1, h, &hn);
    while (hn) {
        struct spm_pair p = pq_pop(h, &hn);
        struct spm_sym *L = &sym[p.left], *R = &sym[p.right];
        if (L->len == 0 || R->len == 0 || L->next != p.right || L->len + R->len != p.len)
            continue; /* stale */
        L->len += R->len;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0) sym[R->next].prev = p.left;
        try_pair(t, text, sym, L->prev, p.left, h, &hn);
        try_pair(t, text, sym, p.left, L->next, h, &hn);
    }
    free(h);

    smelt_status st = SMELT_OK;
    bool last_unk = false;
    for (int32_t i = 0; i >= 0 && st == SMELT_OK; i = sym[i].next) {
        int32_t id = piece_id(t, text + sym[i].start, sym[i].len);
        if (id >= 0) {
            st = tok_ids_push(c->out, id);
            last_unk = false;
            continue;
        }
        if (t->has_byte_fallback) {
            for (uint32_t j = 0; j < sym[i].len && st == SMELT_OK; j++)
                st = tok_ids_push(c->out, t->byte_id[text[sym[i].start + j]]);
            last_unk = false;
        } else if (t->sp.unk >= 0) {
            if (!last_unk) st = tok_ids_push(c->out, t->sp.unk);
            last_unk = true;
        }
    }
    free(sym);
    if (st != SMELT_OK) return err_set(e, st, "token ids");
    return SMELT_OK;
}
