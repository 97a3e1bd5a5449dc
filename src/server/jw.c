/* JSON output buffer: see jw.h. */
#include "server/jw.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"
#include "util/utf8.h"

void jw_free(struct jw *w) {
    free(w->p);
    w->p = NULL;
    w->n = w->cap = 0;
    w->oom = false;
}

bool jw_reserve(struct jw *w, size_t extra) {
    if (w->oom) return false;
    if (extra > ((size_t)1 << 40) || !array_grow((void **)&w->p, &w->cap, w->n + extra + 1, 1)) {
        w->oom = true;
        return false;
    }
    return true;
}

void jw_raw(struct jw *w, const char *s, size_t n) {
    if (!jw_reserve(w, n)) return;
    memcpy(w->p + w->n, s, n);
    w->n += n;
    w->p[w->n] = 0;
}

void jw_str(struct jw *w, const char *s) { jw_raw(w, s, strlen(s)); }

void jw_printf(struct jw *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) {
        jw_raw(w, tmp, (size_t)k);
        return;
    }
    if (!jw_reserve(w, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf(w->p + w->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    w->n += (size_t)k;
}

void jw_json_str(struct jw *w, const char *s, size_t n) {
    jw_raw(w, "\"", 1);
    jw_json_chars(w, s, n);
    jw_raw(w, "\"", 1);
}

void jw_json_chars(struct jw *w, const char *s, size_t n) {
    /* worst case: every byte becomes \u00XX (6) or U+FFFD (3) */
    if (!jw_reserve(w, n * 6)) return;
    char *o = w->p + w->n;
    static const char hex[] = "0123456789abcdef";
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        uint8_t c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *o++ = (char)c;
            i++;
            continue;
        }
        if (c < 0x80) {
            *o++ = '\\';
            switch (c) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            default:
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = utf8_decode(u + i, n - i, &cp);
        if (k == 0) {
            memcpy(o, UTF8_REPLACEMENT_STR, 3);
            o += 3;
            i++;
        } else {
            memcpy(o, u + i, k);
            o += k;
            i += k;
        }
    }
    *o = 0;
    w->n = (size_t)(o - w->p);
}

void jw_int(struct jw *w, int64_t v) { jw_printf(w, "%lld", (long long)v); }

void jw_float(struct jw *w, double v) {
    if (isnan(v)) {
        jw_raw(w, "null", 4);
        return;
    }
    if (isinf(v)) v = v < 0 ? -9999.0 : 9999.0;
    char tmp[32];
    int k = snprintf(tmp, sizeof tmp, "%.9g", v);
    /* keep it a JSON number with a fraction or exponent, as Python prints floats */
    if (!strpbrk(tmp, ".eE") && k + 2 < (int)sizeof tmp) {
        tmp[k++] = '.';
        tmp[k++] = '0';
        tmp[k] = 0;
    }
    jw_raw(w, tmp, (size_t)k);
}

void jw_bytes_array(struct jw *w, const char *s, size_t n) {
    if (!jw_reserve(w, n * 5 + 2)) return;
    jw_raw(w, "[", 1);
    for (size_t i = 0; i < n; i++) {
        if (i) jw_raw(w, ", ", 2);
        jw_int(w, (uint8_t)s[i]);
    }
    jw_raw(w, "]", 1);
}

void jw_base64(struct jw *w, const void *data, size_t n) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint8_t *p = data;
    if (!jw_reserve(w, (n + 2) / 3 * 4 + 2)) return;
    char *o = w->p + w->n;
    *o++ = '"';
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = b64[x >> 18];
        *o++ = b64[x >> 12 & 63];
        *o++ = b64[x >> 6 & 63];
        *o++ = b64[x & 63];
    }
    if (i < n) { /* one or two bytes left: padded */
        uint32_t x = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0);
        *o++ = b64[x >> 18];
        *o++ = b64[x >> 12 & 63];
        *o++ = i + 1 < n ? b64[x >> 6 & 63] : '=';
        *o++ = '=';
    }
    *o++ = '"';
    w->n = (size_t)(o - w->p);
    w->p[w->n] = 0;
}
