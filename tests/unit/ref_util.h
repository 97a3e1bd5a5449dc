/* Helpers of the tests that compare the forward pass with transformers' recorded logits
 * (test_forward_ref, test_forward_hybrid). */
#ifndef SMELT_TEST_REF_UTIL_H
#define SMELT_TEST_REF_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* n little-endian floats from dir/name (malloc'd), or NULL when absent or short. */
static inline float *ref_read_f32(const char *dir, const char *name, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    float *v = malloc(n * sizeof(float));
    size_t got = v ? fread(v, sizeof(float), n, fp) : 0;
    fclose(fp);
    if (got != n) {
        free(v);
        return NULL;
    }
    return v;
}

static inline int ref_argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

#endif
