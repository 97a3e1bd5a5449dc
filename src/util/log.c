#include "util/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void log_msg(enum log_level lvl, const char *fmt, ...) {
    if ((int)lvl > (int)log_get_level()) return;
    static const char *tag[] = {"error", "warn", "info", "debug"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "smelt: %s: %s\n", tag[lvl], buf);
}
