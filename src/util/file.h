/* Reading a whole file into memory: templates, conversations, prompts, test data. */
#ifndef SMELT_UTIL_FILE_H
#define SMELT_UTIL_FILE_H

#include <stddef.h>

#include "util/err.h"

/* Reads all of the file at path ("-": standard input, to its end) into *out: malloc'd,
 * NUL-terminated (so text can be used as a C string), *len bytes before the NUL (the
 * file may hold NULs of its own). The caller frees *out. Errors name the path:
 * SMELT_ERR_IO (cannot open, read error: strerror's reason), SMELT_ERR_NOMEM; on error
 * *out is NULL and *len 0. Works on pipes and files whose size changes while read. */
smelt_status file_read_all(const char *path, char **out, size_t *len, struct err *e);

#endif
