/* Internal to src/quant: the per-type reference functions behind the qtype table, and
 * the small numeric helpers they share. Other layers use quant.h (qtype_get) instead.
 *
 * quant_from_X(src, dst, n): dequantize n elements (n a multiple of the block size).
 * quant_to_X(src, dst, n):   quantize n elements.
 *
 * Exactness: every function does its float arithmetic in f32, one IEEE operation at a
 * time in the order gguf-py / ggml do it. The build never enables FMA contraction for
 * these files (baseline x86-64 has no FMA; keep it that way: do not rename them *_avx2.c).
 */
#ifndef SMELT_QUANT_IMPL_H
#define SMELT_QUANT_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"
#include "util/half.h"

#define QUANT_DECL(t)                                                                          \
    void quant_from_##t(const void *src, float *dst, int64_t n);                               \
    void quant_to_##t(const float *src, void *dst, int64_t n);

QUANT_DECL(f32)
QUANT_DECL(f16)
QUANT_DECL(bf16)
QUANT_DECL(q4_0)
QUANT_DECL(q4_1)
QUANT_DECL(q5_0)
QUANT_DECL(q5_1)
QUANT_DECL(q8_0)
QUANT_DECL(q8_1)
QUANT_DECL(q2_K)
QUANT_DECL(q3_K)
QUANT_DECL(q4_K)
QUANT_DECL(q5_K)
QUANT_DECL(q6_K)
QUANT_DECL(q8_K)
QUANT_DECL(iq4_nl)
QUANT_DECL(iq4_xs)
QUANT_DECL(tq1_0)
QUANT_DECL(tq2_0)
QUANT_DECL(mxfp4)
QUANT_DECL(nvfp4)
QUANT_DECL(q1_0)
#undef QUANT_DECL

/* The scalar forms of the K-quant quantizers (one sub-block at a time, exactly ggml's
 * loops). quant_to_q*_K run 8 sub-blocks per vector instead and must give identical
 * bytes; the unit test compares them. */
void quant_to_q2_K_scalar(const float *src, void *dst, int64_t n);
void quant_to_q4_K_scalar(const float *src, void *dst, int64_t n);
void quant_to_q5_K_scalar(const float *src, void *dst, int64_t n);
void quant_to_q6_K_scalar(const float *src, void *dst, int64_t n);

/* Codebook types: dequantize only (their quantizers need an importance matrix and a
 * grid search; not implemented). */
void quant_from_iq2_xxs(const void *src, float *dst, int64_t n);
void quant_from_iq2_xs(const void *src, float *dst, int64_t n);
void quant_from_iq2_s(const void *src, float *dst, int64_t n);
void quant_from_iq3_xxs(const void *src, float *dst, int64_t n);
void quant_from_iq3_s(const void *src, float *dst, int64_t n);
void quant_from_iq1_s(const void *src, float *dst, int64_t n);
void quant_from_iq1_m(const void *src, float *dst, int64_t n);

/* Round to nearest, ties to even, by the 1.5*2^23 trick ggml uses (valid for
 * |x| <= 2^22; other inputs give a defined but meaningless value, never UB). */
static inline int quant_nearest_int(float x) {
    float v = x + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* f16 scale stored in a block field (unaligned-safe: blocks are packed). */
static inline float quant_h(uint16_t h) { return f16_to_f32(h); }

#endif
