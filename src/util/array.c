#include "util/array.h"

#include <stdint.h>
#include <stdlib.h>

bool array_grow_slow(void **p, size_t *cap, size_t need, size_t elem) {
    if (*p && need <= *cap) return true;
    size_t c = *cap > 16 ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    if (c > SIZE_MAX / elem) return false;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}
