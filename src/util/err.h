/* Error context: library code returns a smelt_status and fills a struct err with a
 * message that names what was wrong and where ("tensor blk.3.attn_q.weight: offset ...
 * past end of file"). Only src/cli/ turns a status into an exit code. */
#ifndef SMELT_UTIL_ERR_H
#define SMELT_UTIL_ERR_H

#include <stdarg.h>

#include "smelt.h"

#define ERR_MSG_MAX 512

struct err {
    smelt_status code;
    char msg[ERR_MSG_MAX];
};

/* Sets e (may be NULL) to code + formatted message; returns code, so callers write
 * `return err_set(e, SMELT_ERR_FORMAT, "...", ...);`. */
smelt_status err_set(struct err *e, smelt_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* err_set with a va_list (for callers that format their own messages). */
smelt_status err_vset(struct err *e, smelt_status code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Prepends "prefix: " to the existing message (for adding context on the way up);
 * returns e->code. */
smelt_status err_prefix(struct err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears e to SMELT_OK and an empty message. */
void err_clear(struct err *e);

/* Makes e's message this thread's smelt_last_error() (include/smelt.h) and returns
 * e->code: a public API function that fails ends with `return err_publish(&e);`. e NULL:
 * SMELT_ERR_INTERNAL with the message "no error context". */
smelt_status err_publish(const struct err *e);

#endif
