/* Block layouts of the GGML weight formats, byte for byte as they sit in a GGUF file.
 *
 * Every struct is packed (alignment 1: blocks of 17, 18 or 110 bytes follow each other
 * in a tensor row with no padding), little-endian, and its size is checked against the
 * GGML type size with a static_assert. Fields named `d`, `m`, `dmin`, `s` of type
 * uint16_t are IEEE half floats (read them with f16_to_f32 from util/half.h). Do not take
 * the address of a multi-byte field of a packed struct; read it by value or memcpy.
 *
 * Element order is the subtle part of each format; it is written above each struct as
 * "x[i] comes from ...". QK_K = 256 elements per super-block. The decoding formulas
 * given here are exactly what quant/quant_*.c implement (and what gguf-py computes);
 * all arithmetic is f32 after the f16 scales are widened.
 *
 * This header is shared by the reference (de)quantizers, the CPU kernels and the CUDA
 * kernels; it has no dependencies beyond <stdint.h> and compiles as C17, C++ and CUDA.
 */
#ifndef SMELT_QUANT_BLOCKS_H
#define SMELT_QUANT_BLOCKS_H

#include <assert.h>
#include <stdint.h>

#define QK_K 256
#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK4_NL 32
#define QK_MXFP4 32
#define QK_NVFP4 64
#define QK_NVFP4_SUB 16
#define QK1_0 128

#if defined(__GNUC__) || defined(__clang__)
#define QBLOCK_PACKED __attribute__((packed))
#else
#error "blocks.h needs a compiler with __attribute__((packed))"
#endif

/* ---- Legacy 32-element blocks ---- */

/* Q4_0, 4.5 bpw. x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8), j < 16. */
struct QBLOCK_PACKED block_q4_0 {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
};
static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 size");

/* Q4_1, 5 bpw. x[j] = d * (qs[j] & 15) + m, x[j+16] = d * (qs[j] >> 4) + m. */
struct QBLOCK_PACKED block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 size");

/* Q5_0, 5.5 bpw. qh is a little-endian uint32: bit j is bit 4 of quant j.
 * q[j] = (qs[j] & 15) | bit(qh, j) << 4, q[j+16] = (qs[j] >> 4) | bit(qh, j+16) << 4;
 * x[i] = d * (q[i] - 16). */
struct QBLOCK_PACKED block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
};
static_assert(sizeof(struct block_q5_0) == 22, "block_q5_0 size");

/* Q5_1, 6 bpw. Quants as Q5_0; x[i] = d * q[i] + m. */
struct QBLOCK_PACKED block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
static_assert(sizeof(struct block_q5_1) == 24, "block_q5_1 size");

/* Q8_0, 8.5 bpw. x[i] = d * qs[i]. */
struct QBLOCK_PACKED block_q8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 size");

/* Q8_1, 9 bpw: an activation format (the partner of Q4_1/Q5_1 in dot products).
 * x[i] = d * qs[i]; s = f16(d * sum(qs)). ggml's layout (two halves, 36 bytes);
 * gguf-py's size table still says 40 (an older layout with f32 d and s). */
struct QBLOCK_PACKED block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[QK8_1];
};
static_assert(sizeof(struct block_q8_1) == 36, "block_q8_1 size");

/* ---- K-quants: 256-element super-blocks ---- */

/* Q2_K, 2.625 bpw. 16 sub-blocks of 16; scales[k] = scale (low nibble) | min (high nibble).
 * For half h (0,1), shift s (0..3), l < 32: the element n = 128h + 32s + l has
 * q = (qs[32h + l] >> 2s) & 3 and sub-block k = n / 16;
 * x[n] = d * (scales[k] & 15) * q - dmin * (scales[k] >> 4). */
struct QBLOCK_PACKED block_q2_K {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
static_assert(sizeof(struct block_q2_K) == 84, "block_q2_K size");

/* Q3_K, 3.4375 bpw. 16 sub-blocks of 16 with signed 6-bit scales packed in 12 bytes:
 * for k < 16, low 4 bits = (k < 8 ? scales[k] & 15 : scales[k-8] >> 4),
 * high 2 bits = (scales[8 + k%4] >> 2*(k/4)) & 3; sc[k] = that 6-bit value - 32.
 * Element n = 128h + 32s + l (h < 2, s < 4, l < 32): low 2 bits from
 * (qs[32h + l] >> 2s) & 3, high bit from hmask[l] bit (4h + s);
 * q = low - (high bit set ? 0 : 4); x[n] = d * sc[n/16] * q. */
struct QBLOCK_PACKED block_q3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
static_assert(sizeof(struct block_q3_K) == 110, "block_q3_K size");

/* Q4_K, 4.5 bpw. 8 sub-blocks of 32 with 6-bit scale sc[k] and min m[k] in 12 bytes:
 * k < 4: sc = scales[k] & 63, m = scales[k+4] & 63;
 * k >= 4: sc = (scales[k+4] & 15) | (scales[k-4] >> 6) << 4,
 *         m  = (scales[k+4] >> 4) | (scales[k] >> 6) << 4.
 * Element n = 64p + 32t + l (p < 4, t < 2, l < 32): q = (qs[32p + l] >> 4t) & 15,
 * k = 2p + t; x[n] = d * sc[k] * q - dmin * m[k]. */
struct QBLOCK_PACKED block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(struct block_q4_K) == 144, "block_q4_K size");

/* Q5_K, 5.5 bpw. Scales as Q4_K. Element n = 64p + 32t + l: low 4 bits as Q4_K,
 * bit 4 = qh[l] bit (2p + t); x[n] = d * sc[k] * q - dmin * m[k], k = 2p + t. */
struct QBLOCK_PACKED block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(struct block_q5_K) == 176, "block_q5_K size");

/* Q6_K, 6.5625 bpw. 16 sub-blocks of 16 with int8 scales.
 * Element n = 128h + 32s + l (h < 2, s < 4, l < 32):
 * low 4 bits = (ql[64h + 32(s&1) + l] >> 4(s>>1)) & 15, high 2 bits = (qh[32h + l] >> 2s) & 3;
 * x[n] = d * scales[n/16] * (q - 32). */
struct QBLOCK_PACKED block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
static_assert(sizeof(struct block_q6_K) == 210, "block_q6_K size");

/* Q8_K, 9.125 bpw: the activation format paired with K-quants and IQ types.
 * d is an f32 (may be negative); x[i] = d * qs[i]; bsums[k] = sum of qs[16k .. 16k+15]. */
struct QBLOCK_PACKED block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
static_assert(sizeof(struct block_q8_K) == 292, "block_q8_K size");

/* ---- IQ codebook types (grids and sign tables in quant/iq_tables.h) ---- */

/* IQ2_XXS, 2.0625 bpw. 8 sub-blocks of 32; qs holds, per sub-block ib, 4 little-endian
 * uint16 = two uint32 words a = qs[4ib..4ib+1], b = qs[4ib+2..4ib+3]. Group g (< 4) of
 * 8 elements: grid row iq2xxs_grid[byte g of a], signs ksigns_iq2xs[(b >> 7g) & 127]
 * (bit j set: negate element j); db = d * (0.5 + (b >> 28)) * 0.25; x = db * grid * sign. */
struct QBLOCK_PACKED block_iq2_xxs {
    uint16_t d;
    uint16_t qs[QK_K / 8];
};
static_assert(sizeof(struct block_iq2_xxs) == 66, "block_iq2_xxs size");

/* IQ2_XS, 2.3125 bpw. qs[i] (i < 32, one per 8 elements): grid iq2xs_grid[qs & 511],
 * signs ksigns_iq2xs[qs >> 9]. Scale nibble k (scales[k/2] >> 4(k%2)) covers 16 elements;
 * db = d * (0.5 + nibble) * 0.25. */
struct QBLOCK_PACKED block_iq2_xs {
    uint16_t d;
    uint16_t qs[QK_K / 8];
    uint8_t scales[QK_K / 32];
};
static_assert(sizeof(struct block_iq2_xs) == 74, "block_iq2_xs size");

/* IQ2_S, 2.5625 bpw. Group i (< 32) of 8 elements: grid iq2s_grid[qs[i] | ((qh[i/4] >> 2(i%4)) & 3) << 8];
 * element n's sign is bit n%8 of signs[n/8] (qs[32 + n/8]); scale nibble k covers
 * 16 elements, db = d * (0.5 + nibble) * 0.25. The first 32 bytes of qs are grid indices,
 * the next 32 the sign bits. */
struct QBLOCK_PACKED block_iq2_s {
    uint16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
};
static_assert(sizeof(struct block_iq2_s) == 82, "block_iq2_s size");

/* IQ3_XXS, 3.0625 bpw. qs[0..63]: grid indices into iq3xxs_grid (4 values each); then 8
 * little-endian uint32 words w[ib] (bytes 64..95), one per 32-element sub-block.
 * Group g (< 4) of 8 elements in sub-block ib: grid rows qs[8ib + 2g], qs[8ib + 2g + 1],
 * signs ksigns_iq2xs[(w >> 7g) & 127]; db = d * (0.5 + (w >> 28)) * 0.5. */
struct QBLOCK_PACKED block_iq3_xxs {
    uint16_t d;
    uint8_t qs[3 * QK_K / 8];
};
static_assert(sizeof(struct block_iq3_xxs) == 98, "block_iq3_xxs size");

/* IQ3_S, 3.4375 bpw. Grid index i (< 64, 4 values each): qs[i] | ((qh[i/8] >> i%8) & 1) << 8
 * into iq3s_grid; element n's sign is bit n%8 of signs[n/8]; scale nibble k (< 8,
 * scales[k/2] >> 4(k%2)) covers 32 elements, db = d * (1 + 2*nibble). */
struct QBLOCK_PACKED block_iq3_s {
    uint16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
};
static_assert(sizeof(struct block_iq3_s) == 110, "block_iq3_s size");

/* IQ1_S, 1.5625 bpw. 8 sub-blocks of 32; qh[ib] (uint16): bits 3k..3k+2 = high bits of
 * group k's grid index, bits 12..14 = scale s, bit 15 = sign of delta.
 * Group k (< 4): grid iq1s_grid[qs[4ib + k] | ((qh >> 3k) & 7) << 8] with values -1/0/+1;
 * dl = d * (2s + 1); delta = (bit 15 ? -1 : 1) * 0.125; x = dl * (grid + delta). */
struct QBLOCK_PACKED block_iq1_s {
    uint16_t d;
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32];
};
static_assert(sizeof(struct block_iq1_s) == 50, "block_iq1_s size");

/* IQ1_M, 1.75 bpw. No separate d: the f16 super-scale is the top nibbles of the 4
 * little-endian uint16 words sc[] = scales: d bits = sc[0] >> 12 | (sc[1] >> 8 & 0xf0) |
 * (sc[2] >> 4 & 0xf00) | (sc[3] & 0xf000). Group g (< 32) of 8 elements: nibble
 * h = qh[g/2] >> 4(g%2); grid iq1s_grid[qs[g] | (h & 7) << 8]; delta = (h & 8 ? -1 : 1) * 0.125;
 * 3-bit scale s = (sc[g/8] >> 3((g/2)%4)) & 7 covers 16 elements; x = d*(2s+1) * (grid + delta). */
struct QBLOCK_PACKED block_iq1_m {
    uint8_t qs[QK_K / 8];
    uint8_t qh[QK_K / 16];
    uint8_t scales[QK_K / 32];
};
static_assert(sizeof(struct block_iq1_m) == 56, "block_iq1_m size");

/* IQ4_NL, 4.5 bpw. Like Q4_0 but the nibble indexes the non-linear table kvalues_iq4nl:
 * x[j] = d * kv[qs[j] & 15], x[j+16] = d * kv[qs[j] >> 4]. */
struct QBLOCK_PACKED block_iq4_nl {
    uint16_t d;
    uint8_t qs[QK4_NL / 2];
};
static_assert(sizeof(struct block_iq4_nl) == 18, "block_iq4_nl size");

/* IQ4_XS, 4.25 bpw. 8 sub-blocks of 32 with 6-bit scales:
 * ls[k] = ((scales_l[k/2] >> 4(k%2)) & 15) | ((scales_h >> 2k) & 3) << 4; dl = d * (ls - 32).
 * Sub-block k: x[32k + j] = dl * kv[qs[16k + j] & 15], x[32k + 16 + j] = dl * kv[qs[16k + j] >> 4]. */
struct QBLOCK_PACKED block_iq4_xs {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(struct block_iq4_xs) == 136, "block_iq4_xs size");

/* ---- Ternary and FP4 ---- */

/* TQ1_0, 1.6875 bpw. Base-3 digits packed 5 per byte (4 in qh), stored as
 * ceil(v * 256 / 243) so digit t is ((uint8)(byte * 3^t) * 3) >> 8.
 * Elements 0..159: byte qs[m] (m < 32) holds digits t = 0..4 of elements 32t + m;
 * 160..239: qs[32 + m] (m < 16), elements 160 + 16t + m; 240..255: qh[m] (m < 4),
 * digits t = 0..3 of elements 240 + 4t + m. x = d * (digit - 1). */
struct QBLOCK_PACKED block_tq1_0 {
    uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];
    uint8_t qh[QK_K / 64];
    uint16_t d;
};
static_assert(sizeof(struct block_tq1_0) == 54, "block_tq1_0 size");

/* TQ2_0, 2.0625 bpw. Element n = 128h + 32s + l: q = (qs[32h + l] >> 2s) & 3;
 * x = d * (q - 1). */
struct QBLOCK_PACKED block_tq2_0 {
    uint8_t qs[QK_K / 4];
    uint16_t d;
};
static_assert(sizeof(struct block_tq2_0) == 66, "block_tq2_0 size");

/* MXFP4, 4.25 bpw (OCP microscaling). e is an E8M0 exponent; d = 2^(e-128) (half of
 * 2^(e-127), because kvalues_mxfp4 are the E2M1 values doubled), computed bitwise:
 * e < 2 ? f32 bits 0x00200000 << e : (e - 1) << 23.
 * x[j] = d * kv[qs[j] & 15], x[j+16] = d * kv[qs[j] >> 4]. */
struct QBLOCK_PACKED block_mxfp4 {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];
};
static_assert(sizeof(struct block_mxfp4) == 17, "block_mxfp4 size");

/* NVFP4, 4.5 bpw. 4 sub-blocks of 16, each with an unsigned E4M3 scale d[s] (halved,
 * 0x00 and 0x7f decode to 0). Sub-block s: x[16s + j] = d * kv[qs[8s + j] & 15],
 * x[16s + 8 + j] = d * kv[qs[8s + j] >> 4], kv = kvalues_mxfp4. */
struct QBLOCK_PACKED block_nvfp4 {
    uint8_t d[QK_NVFP4 / QK_NVFP4_SUB];
    uint8_t qs[QK_NVFP4 / 2];
};
static_assert(sizeof(struct block_nvfp4) == 36, "block_nvfp4 size");

/* Q1_0, 1.125 bpw. 128 elements; x[j] = (qs[j/8] >> j%8) & 1 ? d : -d. */
struct QBLOCK_PACKED block_q1_0 {
    uint16_t d;
    uint8_t qs[QK1_0 / 8];
};
static_assert(sizeof(struct block_q1_0) == 18, "block_q1_0 size");

#endif
