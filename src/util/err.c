#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

smelt_status err_vset(struct err *e, smelt_status code, const char *fmt, va_list ap) {
    if (!e) return code;
    e->code = code;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    return code;
}

smelt_status err_set(struct err *e, smelt_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    err_vset(e, code, fmt, ap);
    va_end(ap);
    return code;
}

smelt_status err_prefix(struct err *e, const char *fmt, ...) {
    if (!e) return SMELT_ERR_INTERNAL;
    char pre[ERR_MSG_MAX], old[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(pre);
    if (n > sizeof e->msg - 3) n = sizeof e->msg - 3;
    memcpy(e->msg, pre, n);
    memcpy(e->msg + n, ": ", 2);
    size_t room = sizeof e->msg - n - 2;
    size_t m = strnlen(old, room - 1);
    memcpy(e->msg + n + 2, old, m);
    e->msg[n + 2 + m] = 0;
    return e->code;
}

void err_clear(struct err *e) {
    if (!e) return;
    e->code = SMELT_OK;
    e->msg[0] = 0;
}

/* The public API's last error, per thread (smelt_last_error). */
static _Thread_local char last_error[ERR_MSG_MAX];

smelt_status err_publish(const struct err *e) {
    if (!e) {
        snprintf(last_error, sizeof last_error, "no error context");
        return SMELT_ERR_INTERNAL;
    }
    snprintf(last_error, sizeof last_error, "%s", e->msg);
    return e->code;
}

const char *smelt_last_error(void) { return last_error; }

const char *smelt_status_str(smelt_status s) {
    switch (s) {
    case SMELT_OK: return "ok";
    case SMELT_ERR_IO: return "I/O error";
    case SMELT_ERR_FORMAT: return "format error";
    case SMELT_ERR_NOMEM: return "out of memory";
    case SMELT_ERR_INVALID: return "invalid argument";
    case SMELT_ERR_UNSUPPORTED: return "unsupported";
    case SMELT_ERR_NOT_FOUND: return "not found";
    case SMELT_ERR_RANGE: return "out of range";
    case SMELT_ERR_DEVICE: return "device error";
    case SMELT_ERR_NETWORK: return "network error";
    case SMELT_ERR_INTERNAL: return "internal error";
    case SMELT_ERR_CANCELLED: return "cancelled";
    }
    return "unknown status";
}

const char *smelt_version(void) { return SMELT_VERSION; }
