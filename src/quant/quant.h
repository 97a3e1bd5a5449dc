/* Weight block formats: the GGML type ids used in GGUF files, their block geometry,
 * and reference (scalar, exact) dequantize / quantize.
 *
 * Type ids are those written in GGUF tensor infos; they never change. A tensor row of
 * ne0 elements is ne0/blck_size blocks of type_size bytes. Block layouts (byte for byte)
 * are in quant/blocks.h; the IQ codebooks in quant/iq_tables.h.
 *
 * Dequantize is bit-exact against gguf-py's numpy implementation for every type it has
 * (NaN/Inf/denormal scales included). Quantize follows ggml's reference algorithms
 * (what llama-quantize runs without an importance matrix); it is bit-exact against
 * gguf-py where gguf-py implements quantize. See docs/quant.md for the per-type table.
 * The functions are pure and thread-safe; they never fail (any float input, NaN included,
 * produces some block).
 */
#ifndef SMELT_QUANT_H
#define SMELT_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum qtype {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    /* 4, 5: removed Q4_2/Q4_3, never valid */
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q8_1 = 9,
    QT_Q2_K = 10,
    QT_Q3_K = 11,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_Q8_K = 15,
    QT_IQ2_XXS = 16,
    QT_IQ2_XS = 17,
    QT_IQ3_XXS = 18,
    QT_IQ1_S = 19,
    QT_IQ4_NL = 20,
    QT_IQ3_S = 21,
    QT_IQ2_S = 22,
    QT_IQ4_XS = 23,
    QT_I8 = 24,
    QT_I16 = 25,
    QT_I32 = 26,
    QT_I64 = 27,
    QT_F64 = 28,
    QT_IQ1_M = 29,
    QT_BF16 = 30,
    /* 31..33: removed Q4_0_4_4 etc. */
    QT_TQ1_0 = 34,
    QT_TQ2_0 = 35,
    /* 36..38: removed */
    QT_MXFP4 = 39,
    QT_NVFP4 = 40,
    QT_Q1_0 = 41,
    QT_COUNT = 42
};

struct qtype_info {
    const char *name;   /* "Q4_K", as llama.cpp and gguf-py print it; NULL for unknown ids */
    uint32_t blck_size; /* elements per block (1 for plain types) */
    uint32_t type_size; /* bytes per block */
    /* Reference dequantize of n elements (n a multiple of blck_size); NULL if unsupported. */
    void (*dequantize)(const void *src, float *dst, int64_t n);
    /* Reference quantize of n elements (n a multiple of blck_size); NULL if unsupported. */
    void (*quantize)(const float *src, void *dst, int64_t n);
};

/* Info for a type id, or NULL when the id is not a known GGML type (4, 5, 31..33 and
 * 36..38 are removed types and are unknown). */
const struct qtype_info *qtype_get(uint32_t type);
/* Name of a type id, "?" when unknown. */
const char *qtype_name(uint32_t type);
/* Parses a type name, case-insensitive ("q4_k", "F16"); returns false when unknown. */
bool qtype_from_name(const char *name, enum qtype *out);
/* Bytes of a row of ne0 elements, or 0 when ne0 is not a multiple of the block size
 * or the type is unknown. */
uint64_t qtype_row_size(uint32_t type, int64_t ne0);

#endif
