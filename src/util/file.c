#include "util/file.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"

smelt_status file_read_all(const char *path, char **out, size_t *len, struct err *e) {
    *out = NULL;
    *len = 0;
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) return err_set(e, SMELT_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    smelt_status st = SMELT_OK;
    for (;;) {
        /* room for at least 64 KiB more and the NUL */
        if (!array_grow((void **)&buf, &cap, n + (1 << 16) + 1, 1)) {
            st = err_set(e, SMELT_ERR_NOMEM, "%s: out of memory after %zu bytes", path, n);
            break;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) st = err_set(e, SMELT_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
    }
    if (is_stdin)
        clearerr(f);
    else
        fclose(f);
    if (st != SMELT_OK) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return SMELT_OK;
}
