/* Overflow-checked size arithmetic for parsing untrusted input. Each returns true on
 * overflow (like C23 ckd_*), leaving *r unspecified. */
#ifndef SMELT_UTIL_CKD_H
#define SMELT_UTIL_CKD_H

#include <stdbool.h>
#include <stdint.h>

static inline bool ckd_add_u64(uint64_t *r, uint64_t a, uint64_t b) {
    return __builtin_add_overflow(a, b, r);
}
static inline bool ckd_mul_u64(uint64_t *r, uint64_t a, uint64_t b) {
    return __builtin_mul_overflow(a, b, r);
}
static inline bool ckd_add_i64(int64_t *r, int64_t a, int64_t b) {
    return __builtin_add_overflow(a, b, r);
}
static inline bool ckd_mul_i64(int64_t *r, int64_t a, int64_t b) {
    return __builtin_mul_overflow(a, b, r);
}
static inline bool ckd_add_size(size_t *r, size_t a, size_t b) {
    return __builtin_add_overflow(a, b, r);
}
static inline bool ckd_mul_size(size_t *r, size_t a, size_t b) {
    return __builtin_mul_overflow(a, b, r);
}

#endif
