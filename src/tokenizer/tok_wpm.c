/* WordPiece: BERT's tokenizer (tokenizer.ggml.model "bert"), as Hugging Face's
 * BertTokenizerFast runs it on a text segment (added tokens are cut out before, by
 * tok_encode):
 *  1. BertNormalizer: clean_text (NUL, U+FFFD and control / format / private-use
 *     characters dropped, whitespace to ' '), handle_chinese_chars (' ' around each CJK
 *     ideograph), strip_accents (NFD, then nonspacing marks dropped) and lowercase
 *     (Rust's char::to_lowercase, one to three characters), in that order; the last two
 *     as the vocab says (tok_vocab.c);
 *  2. BertPreTokenizer: words split at spaces, each punctuation character a word;
 *  3. WordPiece per word: a word of more than 100 characters is [UNK]; otherwise from its
 *     start the longest vocabulary piece, then the longest "##" continuation from where it
 *     ended, and so on; a word with a position no piece starts at is [UNK] as a whole.
 * The character classes are HF's own, probed code point by code point
 * (scripts/gen-wpm-tables.py -> tok_wpm_data.h); NFD is tok_nfc.c's (HF's data too).
 * Pieces are looked up in llama.cpp's spelling of the vocabulary: "▁" + a word's first
 * piece, a continuation as it is (its "##" dropped). A continuation cannot start with "▁"
 * (that spelling is a word's first piece; HF's vocabularies have no "##▁").
 */
#include <stdlib.h>

#include "tokenizer/tok_int.h"
#include "util/array.h"
#include "util/utf8.h"

#include "tokenizer/tok_wpm_data.h"

#define WPM_MAX_WORD 100 /* HF's max_input_chars_per_word */

static bool in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

#define IN(table, cp) in_ranges(table, sizeof table / sizeof table[0], cp)

/* The lowercase of cp: its code points (1 to 3) in out; returns how many. */
static size_t lower_of(uint32_t cp, uint32_t *out) {
    size_t lo = 0, hi = sizeof wpm_lower / sizeof wpm_lower[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < wpm_lower[mid][0])
            hi = mid;
        else if (cp > wpm_lower[mid][0])
            lo = mid + 1;
        else {
            size_t n = 0;
            for (int k = 1; k < 4 && wpm_lower[mid][k]; k++) out[n++] = wpm_lower[mid][k];
            return n;
        }
    }
    out[0] = cp;
    return 1;
}

static smelt_status grow_u32(uint32_t **p, size_t *cap, size_t n, struct err *e) {
    return array_grow((void **)p, cap, n ? n : 1, sizeof **p)
               ? SMELT_OK
               : err_set(e, SMELT_ERR_NOMEM, "WordPiece scratch (%zu code points)", n);
}

/* BertNormalizer over s[0..n) into c->cps; returns the length, or (size_t)-1 (e set). */
static size_t normalize(struct tok_ctx *c, const uint8_t *s, size_t n, struct err *e) {
    const struct tok *t = c->t;
    /* clean_text and handle_chinese_chars: at most 3 code points per input byte */
    if (grow_u32(&c->cps2, &c->cps2_cap, 3 * n, e) != SMELT_OK) return (size_t)-1;
    uint32_t *a = c->cps2;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = utf8_decode(s + i, n - i, &cp);
        if (!k) k = 1, cp = UTF8_REPLACEMENT; /* (not expected: the text was repaired) */
        i += k;
        if (cp < 0x80) { /* ASCII: the common case, decided here */
            if (cp == '\t' || cp == '\n' || cp == '\r' || cp == ' ') a[m++] = ' ';
            else if (cp >= 0x20 && cp != 0x7F) a[m++] = cp;
            continue;
        }
        if (IN(wpm_drop, cp)) continue;
        if (IN(wpm_space, cp)) {
            a[m++] = ' ';
        } else if (IN(wpm_cjk, cp)) {
            a[m++] = ' ';
            a[m++] = cp;
            a[m++] = ' ';
        } else {
            a[m++] = cp;
        }
    }
    if (t->wpm_strip) { /* NFD, then the nonspacing marks go */
        if (grow_u32(&c->cps, &c->cps_cap, 4 * m, e) != SMELT_OK) return (size_t)-1;
        size_t d = tok_nfd(a, m, c->cps), w = 0;
        for (size_t i = 0; i < d; i++)
            if (c->cps[i] < 0x300 || !IN(wpm_mn, c->cps[i])) c->cps[w++] = c->cps[i];
        /* back into a for the lowercase stage */
        if (grow_u32(&c->cps2, &c->cps2_cap, w, e) != SMELT_OK) return (size_t)-1;
        a = c->cps2;
        memcpy(a, c->cps, w * sizeof *a);
        m = w;
    }
    if (grow_u32(&c->cps, &c->cps_cap, 3 * m, e) != SMELT_OK) return (size_t)-1;
    size_t w = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t cp = a[i];
        if (!t->wpm_lower) c->cps[w++] = cp;
        else if (cp < 0x80) c->cps[w++] = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
        else w += lower_of(cp, c->cps + w);
    }
    return w;
}

static smelt_status push(struct tok_ctx *c, int32_t id, struct err *e) {
    return tok_ids_push(c->out, id) == SMELT_OK ? SMELT_OK
                                                : err_set(e, SMELT_ERR_NOMEM, "token ids");
}

/* The pieces of one word (w[0..n) code points) appended to c->out. */
static smelt_status word(struct tok_ctx *c, const uint32_t *w, size_t n, struct err *e) {
    const struct tok *t = c->t;
    if (n > WPM_MAX_WORD) return push(c, t->sp.unk, e);
    /* "▁" + the word in UTF-8; offs[i]: where character i starts (after the "▁") */
    if (tok_ctx_buf(c, 3 + 4 * n + 1) != SMELT_OK ||
        grow_u32(&c->offs, &c->offs_cap, n + 1, e) != SMELT_OK)
        return err_set(e, SMELT_ERR_NOMEM, "WordPiece scratch");
    uint8_t *b = c->buf;
    memcpy(b, "\xE2\x96\x81", 3);
    size_t o = 3;
    for (size_t i = 0; i < n; i++) {
        c->offs[i] = (uint32_t)o;
        o += utf8_encode(w[i], b + o);
    }
    c->offs[n] = (uint32_t)o;
    size_t n0 = c->out->n;
    for (size_t start = 0; start < n;) {
        /* a piece's key: "▁" + text at the start, the text itself after it */
        size_t k0 = start == 0 ? 0 : c->offs[start];
        int32_t id = -1;
        size_t end = n;
        if (start > 0 && w[start] == 0x2581) end = start; /* no continuation spells so */
        for (; end > start; end--) {
            size_t len = c->offs[end] - k0;
            if (len > t->max_text) continue;
            if ((id = tok_map_find(t, b + k0, len)) >= 0) break;
        }
        if (id < 0) { /* a position no piece starts at: the word is unknown */
            c->out->n = n0;
            return push(c, t->sp.unk, e);
        }
        if (push(c, id, e) != SMELT_OK) return SMELT_ERR_NOMEM;
        start = end;
    }
    return SMELT_OK;
}

smelt_status tok_wpm_segment(struct tok_ctx *c, const uint8_t *s, size_t n, struct err *e) {
    size_t m = normalize(c, s, n, e);
    if (m == (size_t)-1) return e->code;
    const uint32_t *cp = c->cps;
    smelt_status st = SMELT_OK;
    size_t w0 = 0;
    for (size_t i = 0; i <= m && st == SMELT_OK; i++) {
        bool end = i == m, space = !end && (cp[i] == ' ' || IN(wpm_space, cp[i]));
        bool punct = !end && !space && tok_is_punct(cp[i]);
        if (!end && !space && !punct) continue;
        if (i > w0) st = word(c, cp + w0, i - w0, e);
        if (st == SMELT_OK && punct) st = word(c, cp + i, 1, e);
        w0 = i + 1;
    }
    return st;
}
