#include "util/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/utf8.h"

/* -1 = not yet read from the environment. */
static atomic_int g_level = -1;

static int level_from_env(void) {
    const char *s = getenv("SMELT_LOG");
    if (!s) return LOG_INFO;
    if (!strcmp(s, "error")) return LOG_ERROR;
    if (!strcmp(s, "warn")) return LOG_WARN;
    if (!strcmp(s, "debug")) return LOG_DEBUG;
    return LOG_INFO;
}

enum log_level log_get_level(void) {
    int l = atomic_load(&g_level);
    if (l < 0) {
        l = level_from_env();
        atomic_store(&g_level, l);
    }
    return (enum log_level)l;
}

void log_set_level(enum log_level lvl) { atomic_store(&g_level, (int)lvl); }

size_t log_escape(char *out, size_t cap, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const uint8_t *u = (const uint8_t *)s;
    size_t o = 0, i = 0;
    while (i < n) {
        uint32_t cp = 0;
        size_t k = utf8_decode(u + i, n - i, &cp);
        bool esc = k == 0 || cp < 0x20 || (cp >= 0x7F && cp <= 0x9F);
        if (k == 0) k = 1; /* one byte of an ill-formed sequence */
        size_t need = esc ? 4 * k : k;
        if (o + need + 1 > cap) break;
        for (size_t j = 0; j < k; j++) {
            if (!esc) {
                out[o++] = (char)u[i + j];
                continue;
            }
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[u[i + j] >> 4];
            out[o++] = hex[u[i + j] & 15];
        }
        i += k;
    }
    out[o] = 0;
    return o;
}

void log_msg(enum log_level lvl, const char *fmt, ...) {
    if ((int)lvl > (int)log_get_level()) return;
    static const char *tag[] = {"error", "warn", "info", "debug"};
    char buf[2048], esc[4 * sizeof buf];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    size_t n = k < 0 ? 0 : (size_t)k < sizeof buf ? (size_t)k : sizeof buf - 1;
    /* a cut message: drop the start of a character the cut split */
    if (k >= (int)sizeof buf) n -= utf8_tail_len((const uint8_t *)buf, n);
    log_escape(esc, sizeof esc, buf, n);
    fprintf(stderr, "smelt: %s: %s\n", tag[lvl], esc);
}
