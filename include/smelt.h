/* smelt — public C API (libsmelt).
 *
 * Opaque handles, explicit enum values that only ever grow, one line per function.
 * Every call that can fail returns a smelt_status; smelt_last_error() then gives its
 * message, which names what was wrong and where. Errors are per thread: a failure on one
 * thread never changes the message another thread reads.
 */
#ifndef SMELT_H
#define SMELT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SMELT_VERSION "0.1.0"

/* Status codes. Values are stable: new codes are appended, never renumbered. */
typedef enum smelt_status {
    SMELT_OK = 0,
    SMELT_ERR_IO = 1,          /* open/read/mmap failed */
    SMELT_ERR_FORMAT = 2,      /* a file or message is malformed */
    SMELT_ERR_NOMEM = 3,       /* allocation failed */
    SMELT_ERR_INVALID = 4,     /* a bad argument or value */
    SMELT_ERR_UNSUPPORTED = 5, /* valid but not implemented (type, architecture, construct) */
    SMELT_ERR_NOT_FOUND = 6,   /* a key, tensor, file or model is absent */
    SMELT_ERR_RANGE = 7,       /* a value or size is out of range (context too long, ...) */
    SMELT_ERR_DEVICE = 8,      /* a GPU runtime error */
    SMELT_ERR_NETWORK = 9,     /* a transfer failed */
    SMELT_ERR_INTERNAL = 10,   /* a bug: please report */
    SMELT_ERR_CANCELLED = 11,  /* the caller cancelled the operation */
} smelt_status;

/* Version string of the library. */
const char *smelt_version(void);

/* Human-readable name of a status code ("format error", ...). */
const char *smelt_status_str(smelt_status s);

/* The message of the last call on this thread that failed ("" if none has); a call that
 * succeeds leaves it as it was. Valid until the next failing call on this thread. */
const char *smelt_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
