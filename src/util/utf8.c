/* UTF-8 decoding and repair (see utf8.h). The second byte's allowed range depends on
 * the lead byte (Unicode Table 3-7): that is what excludes overlongs, surrogates and
 * code points past U+10FFFF, and it is also what bounds a maximal subpart. */
#include "util/utf8.h"

#include <string.h>

/* Scans the sequence at s[0..n), n >= 1. Returns its length when well-formed (and sets
 * *cp); else returns 0 and sets *part to the length of the maximal subpart (>= 1): the
 * lead byte plus the continuation bytes that were still acceptable. */
static size_t scan(const uint8_t *s, size_t n, uint32_t *cp, size_t *part) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* range of the second byte */
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
        c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *part = 1;
        return 0;
    }
    size_t i = 1;
    for (; i < need && i < n; i++) {
        uint8_t x = s[i];
        if (i == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) break;
        c = (c << 6) | (x & 0x3F);
    }
    if (i == need) {
        *cp = c;
        return need;
    }
    *part = i;
    return 0;
}

size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    size_t part;
    uint32_t c = 0;
    size_t k = scan(s, n, &c, &part);
    if (k) *cp = c;
    return k;
}

size_t utf8_incomplete_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    size_t part;
    uint32_t c;
    if (scan(s, n, &c, &part)) return 0; /* complete */
    /* An incomplete-but-promising prefix is one that ran out of input. */
    return part == n && s[0] >= 0xC2 && s[0] <= 0xF4 ? part : 0;
}

size_t utf8_tail_len(const uint8_t *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        uint8_t b = s[n - k];
        if (b < 0x80) return 0;
        if (b >= 0xC0) return utf8_incomplete_len(s + n - k, k) == k ? k : 0;
    }
    return 0;
}

size_t utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t utf8_validate(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t part;
        uint32_t c;
        size_t k = scan(s + i, n - i, &c, &part);
        if (!k) return i;
        i += k;
    }
    return n;
}

size_t utf8_repaired_len(const uint8_t *s, size_t n) {
    size_t i = 0, out = 0;
    while (i < n) {
        size_t part;
        uint32_t c;
        size_t k = scan(s + i, n - i, &c, &part);
        if (k) {
            i += k;
            out += k;
        } else {
            i += part;
            out += 3;
        }
    }
    return out;
}

size_t utf8_repair(const uint8_t *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t part;
        uint32_t c;
        size_t k = scan(s + i, n - i, &c, &part);
        if (k) {
            memcpy(out + o, s + i, k);
            i += k;
            o += k;
        } else {
            memcpy(out + o, UTF8_REPLACEMENT_STR, 3);
            i += part;
            o += 3;
        }
    }
    return o;
}
