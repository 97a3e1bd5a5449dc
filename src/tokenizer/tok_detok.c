/* Detokenization: whole-sequence decode and the incremental detokenizer for streaming.
 *
 * Each token contributes its piece bytes (tok_piece; control / unknown tokens only with
 * TOK_DECODE_SPECIAL). The bytes go through a small UTF-8 state machine: complete
 * characters pass, up to 3 bytes of an unfinished one are held, and bytes that cannot
 * continue what is held turn it into U+FFFD:
 *  - BPE vocabs: one U+FFFD per maximal invalid subpart, which is what HF's ByteLevel
 *    decoder gets from String::from_utf8_lossy over the whole byte string;
 *  - SPM vocabs: one U+FFFD per invalid byte, as HF's ByteFallback decoder replaces
 *    each byte of a run of <0xNN> tokens that is not valid UTF-8. (HF replaces every
 *    byte of such a run, valid characters in it included; a stream cannot take back
 *    what it already emitted, so we replace only the invalid bytes.)
 * Because the machine only ever looks at bytes it has, the output of pushes + flush is
 * the same whatever the chunking, and equals tok_decode.
 *
 * TOK_DECODE_STRIP drops the first output byte when it is a space and the vocab adds a
 * space prefix (HF's Strip(" ", 1, 0) decoder on Llama-style vocabs).
 */
#include <stdlib.h>

#include "tokenizer/tok_int.h"
#include "util/array.h"
#include "util/utf8.h"

static smelt_status reserve(struct tok_buf *b, size_t extra) {
    return array_grow((void **)&b->p, &b->cap, b->n + extra + 1, 1) ? SMELT_OK : SMELT_ERR_NOMEM;
}

static void put(struct tok_buf *b, const void *s, size_t n) {
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* Replaces the held bytes (room reserved by the caller). */
static void drop_held(struct tok_detok *d, struct tok_buf *out) {
    if (!d->n_held) return;
    size_t k = d->t->model == TOK_MODEL_SPM ? d->n_held : 1;
    for (size_t i = 0; i < k; i++)
        put(out, UTF8_REPLACEMENT_STR, 3);
    d->n_held = 0;
}

static void feed(struct tok_detok *d, uint8_t b, struct tok_buf *out) {
    for (;;) {
        if (d->n_held == 0) {
            if (b < 0x80) {
                out->p[out->n++] = (char)b;
            } else if (b >= 0xC2 && b <= 0xF4) {
                d->held[d->n_held++] = b;
            } else {
                put(out, UTF8_REPLACEMENT_STR, 3);
            }
            return;
        }
        uint8_t tmp[4];
        memcpy(tmp, d->held, d->n_held);
        tmp[d->n_held] = b;
        size_t n = d->n_held + 1u;
        uint32_t cp;
        if (utf8_decode(tmp, n, &cp) == n) {
            put(out, tmp, n);
            d->n_held = 0;
            return;
        }
        if (utf8_incomplete_len(tmp, n) == n) {
            d->held[d->n_held++] = b;
            return;
        }
        drop_held(d, out); /* b cannot continue it: replace, then b starts afresh */
    }
}

void tok_detok_init(struct tok_detok *d, const struct tok *t, unsigned flags) {
    memset(d, 0, sizeof *d);
    d->t = t;
    d->flags = flags;
}

smelt_status tok_detok_push(struct tok_detok *d, int32_t id, struct tok_buf *out, struct err *e) {
    const struct tok *t = d->t;
    if (id < 0 || id >= t->n_vocab)
        return err_set(e, SMELT_ERR_RANGE, "token id %d is outside the vocab (0..%d)", id,
                       t->n_vocab - 1);
    uint8_t ty = t->type[id];
    if ((ty == TOK_T_CONTROL || ty == TOK_T_UNKNOWN) && !(d->flags & TOK_DECODE_SPECIAL))
        return SMELT_OK;
    size_t n;
    const uint8_t *p = (const uint8_t *)tok_piece(t, id, &n);
    if (n == 0) return SMELT_OK;
    if (!d->started) {
        d->started = true;
        if ((d->flags & TOK_DECODE_STRIP) && t->add_space_prefix && p[0] == ' ') {
            p++;
            n--;
        }
    }
    /* Worst case: every byte, and each held one, becomes U+FFFD. */
    if (reserve(out, 3 * (n + 4)) != SMELT_OK)
        return err_set(e, SMELT_ERR_NOMEM, "detokenizer output (%zu bytes)", out->n + 3 * n);
    for (size_t i = 0; i < n; i++)
        feed(d, p[i], out);
    out->p[out->n] = 0;
    return SMELT_OK;
}

smelt_status tok_detok_flush(struct tok_detok *d, struct tok_buf *out, struct err *e) {
    if (reserve(out, 12) != SMELT_OK) return err_set(e, SMELT_ERR_NOMEM, "detokenizer output");
    drop_held(d, out);
    out->p[out->n] = 0;
    tok_detok_init(d, d->t, d->flags);
    return SMELT_OK;
}

smelt_status tok_decode(const struct tok *t, const int32_t *ids, size_t n, unsigned flags,
                        struct tok_buf *out, struct err *e) {
    struct tok_detok d;
    tok_detok_init(&d, t, flags);
    size_t n0 = out->n;
    for (size_t i = 0; i < n; i++) {
        smelt_status st = tok_detok_push(&d, ids[i], out, e);
        if (st != SMELT_OK) {
            if (out->p) out->p[out->n = n0] = 0;
            return err_prefix(e, "ids[%zu]", i);
        }
    }
    smelt_status st = tok_detok_flush(&d, out, e);
    if (st != SMELT_OK && out->p) out->p[out->n = n0] = 0;
    return st;
}
