/* Unicode NFC, for the vocabs whose Hugging Face tokenizer has an NFC normalizer (Qwen2,
 * the gpt-neox family, Command-R). Text is nearly always NFC already, so the common path
 * is the quick check: a scan that finds no character which could change (tables in
 * tok_nfc_data.h; nothing below U+0300 can). Otherwise the whole segment goes through
 * the UAX #15 algorithm: full canonical decomposition (Hangul algorithmically),
 * canonical ordering of combining marks, then canonical composition.
 *
 * Tables are probed from HF's own normalizers (scripts/gen-nfc-tables.py): HF uses the
 * unicode-normalization-alignments crate, whose data is Unicode 9.0, so characters
 * assigned later neither decompose nor reorder there, and must not here either.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"
#include "util/array.h"
#include "util/utf8.h"

#include "tokenizer/tok_nfc_data.h"

#define SBASE 0xAC00u
#define LBASE 0x1100u
#define VBASE 0x1161u
#define TBASE 0x11A7u
#define LCOUNT 19u
#define VCOUNT 21u
#define TCOUNT 28u
#define NCOUNT (VCOUNT * TCOUNT)
#define SCOUNT (LCOUNT * NCOUNT)

static bool needs_check(uint32_t cp) {
    size_t lo = 0, hi = sizeof nfc_check / sizeof nfc_check[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_check[mid][0])
            hi = mid;
        else if (cp > nfc_check[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

static uint32_t ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = sizeof nfc_ccc / sizeof nfc_ccc[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_ccc[mid][0])
            hi = mid;
        else if (cp > nfc_ccc[mid][0])
            lo = mid + 1;
        else
            return nfc_ccc[mid][1];
    }
    return 0;
}

/* The full decomposition of cp: returns its length and points *d at it (or 0). */
static size_t decomp_of(uint32_t cp, const uint32_t **d) {
    size_t lo = 0, hi = sizeof nfc_decomp / sizeof nfc_decomp[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_decomp[mid][0])
            hi = mid;
        else if (cp > nfc_decomp[mid][0])
            lo = mid + 1;
        else {
            *d = &nfc_decomp_cps[nfc_decomp[mid][1]];
            return nfc_decomp[mid][2];
        }
    }
    return 0;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = sizeof nfc_comp / sizeof nfc_comp[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t x = nfc_comp[mid][0], y = nfc_comp[mid][1];
        if (a < x || (a == x && b < y))
            hi = mid;
        else if (a > x || (a == x && b > y))
            lo = mid + 1;
        else
            return nfc_comp[mid][2];
    }
    return 0;
}

bool tok_nfc_quick(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0xCC) { /* lead bytes below CC encode code points below U+0300 */
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = utf8_decode(s + i, n - i, &cp);
        if (!k) return false; /* not expected: input is repaired before */
        if (needs_check(cp)) return false;
        i += k;
    }
    return true;
}

static smelt_status grow(struct tok_ctx *c, size_t need, struct err *e) {
    if (!array_grow((void **)&c->nbuf, &c->nbuf_cap, need, 1))
        return err_set(e, SMELT_ERR_NOMEM, "NFC output (%zu bytes)", need);
    return SMELT_OK;
}

/* Canonical decomposition (Hangul algorithmically) and canonical ordering of in[0..n) into
 * out (room for 4 n code points: a canonical decomposition is at most 4 long); returns the
 * length. in and out must not overlap. */
static size_t decompose(const uint32_t *in, size_t n, uint32_t *out) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t x = in[i];
        if (x >= SBASE && x < SBASE + SCOUNT) {
            uint32_t si = x - SBASE;
            out[m++] = LBASE + si / NCOUNT;
            out[m++] = VBASE + (si % NCOUNT) / TCOUNT;
            if (si % TCOUNT) out[m++] = TBASE + si % TCOUNT;
            continue;
        }
        const uint32_t *d;
        size_t dn = x >= 0xC0 ? decomp_of(x, &d) : 0;
        if (dn) {
            for (size_t j = 0; j < dn; j++)
                out[m++] = d[j];
        } else {
            out[m++] = x;
        }
    }
    /* Canonical ordering: stable sort each run of non-starters by class (runs are short;
     * insertion sort). */
    for (size_t i = 1; i < m; i++) {
        uint32_t cc = ccc_of(out[i]);
        if (cc == 0) continue;
        size_t j = i;
        uint32_t x = out[i];
        while (j > 0) {
            uint32_t pc = ccc_of(out[j - 1]);
            if (pc == 0 || pc <= cc) break;
            out[j] = out[j - 1];
            j--;
        }
        out[j] = x;
    }
    return m;
}

size_t tok_nfd(const uint32_t *in, size_t n, uint32_t *out) { return decompose(in, n, out); }

/* Appends NFC(s[0..n)) to c->nbuf at *o (room for 4 bytes per output code point is
 * made here). */
static smelt_status nfc_region(struct tok_ctx *c, const uint8_t *s, size_t n, size_t *o,
                               struct err *e) {
    /* The region's code points (at most n) go after the room for their decomposition (at
     * most 4 each: U+FDFA is compatibility only; the canonical maximum is 4). */
    size_t need = n * 5 + 4;
    if (!array_grow((void **)&c->cps, &c->cps_cap, need, sizeof *c->cps))
        return err_set(e, SMELT_ERR_NOMEM, "NFC scratch (%zu code points)", need);
    uint32_t *cp = c->cps, *raw = c->cps + 4 * n + 4;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t x;
        size_t len = utf8_decode(s + i, n - i, &x);
        if (!len) {
            x = UTF8_REPLACEMENT;
            len = 1;
        }
        i += len;
        raw[k++] = x;
    }
    size_t m = decompose(raw, k, cp);
    /* Canonical composition. */
    if (m > 0) {
        size_t starter = 0, w = 1;
        uint32_t last = ccc_of(cp[0]);
        if (last != 0) last = 256; /* a leading non-starter blocks everything */
        for (size_t r = 1; r < m; r++) {
            uint32_t ch = cp[r], cc = ccc_of(ch);
            uint32_t comp = compose(cp[starter], ch);
            if (comp && (last < cc || last == 0)) {
                cp[starter] = comp;
                continue;
            }
            if (cc == 0) starter = w;
            last = cc;
            cp[w++] = ch;
        }
        m = w;
    }
    if (grow(c, *o + m * 4 + 1, e) != SMELT_OK) return e->code;
    for (size_t i = 0; i < m; i++)
        *o += utf8_encode(cp[i], c->nbuf + *o);
    return SMELT_OK;
}

/* A code point that starts a normalization boundary: class 0, unchanged by NFC, and
 * unable to combine with what precedes it. */
static bool stable(uint32_t cp) {
    return cp < 0x300 || !needs_check(cp);
}

smelt_status tok_nfc(struct tok_ctx *c, const uint8_t *s, size_t n, const uint8_t **out,
                     size_t *out_n, struct err *e) {
    /* Only the regions around unstable characters change: from the last stable code point
     * before one to the next stable code point after it. The rest is copied. */
    size_t o = 0, copied = 0, last = 0, i = 0;
    if (grow(c, n + 1, e) != SMELT_OK) return e->code;
    while (i < n) {
        uint32_t cp;
        size_t k = utf8_decode(s + i, n - i, &cp);
        if (!k) k = 1, cp = UTF8_REPLACEMENT;
        if (stable(cp)) {
            last = i;
            i += k;
            continue;
        }
        size_t j = i + k;
        while (j < n) {
            size_t k2 = utf8_decode(s + j, n - j, &cp);
            if (!k2) k2 = 1, cp = UTF8_REPLACEMENT;
            if (stable(cp)) break;
            j += k2;
        }
        if (grow(c, o + (last - copied) + 1, e) != SMELT_OK) return e->code;
        memcpy(c->nbuf + o, s + copied, last - copied);
        o += last - copied;
        smelt_status st = nfc_region(c, s + last, j - last, &o, e);
        if (st != SMELT_OK) return st;
        copied = last = i = j;
    }
    if (grow(c, o + (n - copied) + 1, e) != SMELT_OK) return e->code;
    memcpy(c->nbuf + o, s + copied, n - copied);
    o += n - copied;
    *out = c->nbuf;
    *out_n = o;
    return SMELT_OK;
}
