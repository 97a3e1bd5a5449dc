/* IEEE half and bfloat16 <-> float conversions (scalar, exact, NaN/Inf/denormal-safe). */
#ifndef SMELT_UTIL_HALF_H
#define SMELT_UTIL_HALF_H

#include <stdint.h>
#include <string.h>

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* f16 -> f32, exact for every input including denormals, Inf and NaN (payload kept). */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* denormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000 | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return f32_from_bits(u);
}

/* f32 -> f16, round to nearest even, overflow to Inf, NaN stays NaN. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff)); /* NaN */
    if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00);                        /* Inf */
    if (ax < 0x38800000) { /* result is denormal or zero */
        if (ax < 0x33000000) return (uint16_t)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* f32 -> bf16, round to nearest even; NaN is quieted (as numpy/torch do). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif
