/* Scalar matmul kernels of the codebook i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S), the ternary types (TQ1_0, TQ2_0), NVFP4 and Q1_0: the reference twins
 * of cpu_matmul_iq_avx2.c and, without AVX2, the path itself.
 *
 * Every type's value is an integer times a float scale, so each kernel sums exact int32
 * products per sub-block, as the K-quant kernels do (cpu_matmul_scalar.c); the dequantizers
 * (quant/quant_iq.c, quant_lowbit.c) are the spec, written here with the fractions folded
 * into the integers:
 *   IQ2_*:   d·(0.5 + s)·0.25·g = d/8 · (2s+1)·g        (g a grid magnitude with its sign)
 *   IQ3_XXS: d·(0.5 + s)·0.5·g  = d/4 · (2s+1)·g
 *   IQ3_S:   d·(1 + 2s)·g
 *   IQ1_*:   d·(2s+1)·(g ± 1/8)  = d/8 · (2s+1)·(8g ± 1),  g in {-1, 0, 1}
 *   TQ*:     d·(t - 1), t in {0, 1, 2}: the -1 through the activation sums
 *   NVFP4:   e4m3/2 · kv (doubled E2M1 values) per 16;  Q1_0: ±d = d·(2b - 1).
 * IQ and TQ types read Q8_K activations (one plane per call; the driver adds hi and lo),
 * NVFP4 and Q1_0 Q8_32 ones. Bounds: |q| <= 127, so the largest int32 sum (IQ1_M,
 * 256·9·31·127) stays far below 2^31.
 */
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "quant/iq_tables.h"
#include "util/half.h"

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* sum_j g_j·σ_j·q_j over 8 elements: g the bytes of a grid row (magnitudes), σ_j = -1 where
 * bit j of signs is set. */
static int dot8_signed(uint64_t row, uint8_t signs, const int8_t *q) {
    int s = 0;
    for (int j = 0; j < 8; j++) {
        int g = (uint8_t)(row >> (8 * j));
        s += ((signs >> j) & 1 ? -g : g) * q[j];
    }
    return s;
}

static float dot_iq2_xxs(int64_t k, const void *w, const void *x) {
    const struct block_iq2_xxs *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const uint8_t *qs = (const uint8_t *)b[i].qs;
        const int8_t *q = xq + 256 * i;
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t a = rd32(qs + 8 * ib), sg = rd32(qs + 8 * ib + 4);
            int part = 0;
            for (int g = 0; g < 4; g++)
                part += dot8_signed(quant_iq2xxs_grid[(a >> (8 * g)) & 255],
                                    quant_ksigns_iq2xs[(sg >> (7 * g)) & 127], q + 32 * ib + 8 * g);
            isum += (2 * (int)(sg >> 28) + 1) * part;
        }
        sum += xd[i] * f16_to_f32(b[i].d) * 0.125f * (float)isum;
    }
    return sum;
}

static float dot_iq2_xs(int64_t k, const void *w, const void *x) {
    const struct block_iq2_xs *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0;
        for (int s = 0; s < 16; s++) { /* scale nibble s: 16 elements, two grid rows */
            int part = 0;
            for (int g = 2 * s; g < 2 * s + 2; g++) {
                uint16_t v = b[i].qs[g];
                part +=
                    dot8_signed(quant_iq2xs_grid[v & 511], quant_ksigns_iq2xs[v >> 9], q + 8 * g);
            }
            isum += (2 * ((b[i].scales[s / 2] >> (4 * (s % 2))) & 15) + 1) * part;
        }
        sum += xd[i] * f16_to_f32(b[i].d) * 0.125f * (float)isum;
    }
    return sum;
}

static float dot_iq2_s(int64_t k, const void *w, const void *x) {
    const struct block_iq2_s *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        const uint8_t *signs = b[i].qs + 32;
        int isum = 0;
        for (int s = 0; s < 16; s++) {
            int part = 0;
            for (int g = 2 * s; g < 2 * s + 2; g++) {
                int idx = b[i].qs[g] | ((b[i].qh[g / 4] >> (2 * (g % 4))) & 3) << 8;
                part += dot8_signed(quant_iq2s_grid[idx], signs[g], q + 8 * g);
            }
            isum += (2 * ((b[i].scales[s / 2] >> (4 * (s % 2))) & 15) + 1) * part;
        }
        sum += xd[i] * f16_to_f32(b[i].d) * 0.125f * (float)isum;
    }
    return sum;
}

static float dot_iq3_xxs(int64_t k, const void *w, const void *x) {
    const struct block_iq3_xxs *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const uint8_t *qs = b[i].qs;
        const int8_t *q = xq + 256 * i;
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t sg = rd32(qs + 64 + 4 * ib);
            int part = 0;
            for (int g = 0; g < 4; g++) {
                uint64_t row = quant_iq3xxs_grid[qs[8 * ib + 2 * g]] |
                               (uint64_t)quant_iq3xxs_grid[qs[8 * ib + 2 * g + 1]] << 32;
                part += dot8_signed(row, quant_ksigns_iq2xs[(sg >> (7 * g)) & 127],
                                    q + 32 * ib + 8 * g);
            }
            isum += (2 * (int)(sg >> 28) + 1) * part;
        }
        sum += xd[i] * f16_to_f32(b[i].d) * 0.25f * (float)isum;
    }
    return sum;
}

static float dot_iq3_s(int64_t k, const void *w, const void *x) {
    const struct block_iq3_s *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0;
        for (int s = 0; s < 8; s++) { /* scale nibble s: 32 elements, 8 grid rows of 4 */
            int part = 0;
            for (int g = 4 * s; g < 4 * s + 4; g++) { /* 8 elements: grid rows 2g, 2g + 1 */
                int i0 = b[i].qs[2 * g] | ((b[i].qh[g / 4] >> ((2 * g) % 8)) & 1) << 8;
                int i1 = b[i].qs[2 * g + 1] | ((b[i].qh[g / 4] >> ((2 * g + 1) % 8)) & 1) << 8;
                uint64_t row = quant_iq3s_grid[i0] | (uint64_t)quant_iq3s_grid[i1] << 32;
                part += dot8_signed(row, b[i].signs[g], q + 8 * g);
            }
            isum += (2 * ((b[i].scales[s / 2] >> (4 * (s % 2))) & 15) + 1) * part;
        }
        sum += xd[i] * f16_to_f32(b[i].d) * (float)isum;
    }
    return sum;
}

/* sum_j g_j·q_j over 8 elements of an IQ1 grid row (int8 bytes in {-1, 0, 1}). */
static int dot8_iq1(uint64_t row, const int8_t *q) {
    int s = 0;
    for (int j = 0; j < 8; j++)
        s += (int8_t)(uint8_t)(row >> (8 * j)) * q[j];
    return s;
}

static int sum8(const int8_t *q) {
    int s = 0;
    for (int j = 0; j < 8; j++)
        s += q[j];
    return s;
}

static float dot_iq1_s(int64_t k, const void *w, const void *x) {
    const struct block_iq1_s *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *bs = cpu_act_sK(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint16_t qh = b[i].qh[ib];
            int gdot = 0;
            for (int g = 0; g < 4; g++)
                gdot += dot8_iq1(quant_iq1s_grid[b[i].qs[4 * ib + g] | ((qh >> (3 * g)) & 7) << 8],
                                 q + 32 * ib + 8 * g);
            int qsum = bs[16 * i + 2 * ib] + bs[16 * i + 2 * ib + 1];
            int part = 8 * gdot + (qh & 0x8000 ? -qsum : qsum);
            isum += (2 * ((qh >> 12) & 7) + 1) * part;
        }
        sum += xd[i] * f16_to_f32(b[i].d) * 0.125f * (float)isum;
    }
    return sum;
}

/* IQ1_M's f16 super-scale from the top nibbles of its 4 scale words. */
static uint16_t iq1m_d(const uint8_t *scales) {
    uint16_t sc[4];
    memcpy(sc, scales, 8);
    return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                      (sc[3] & 0xf000));
}

static float dot_iq1_m(int64_t k, const void *w, const void *x) {
    const struct block_iq1_m *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        uint16_t sc[4];
        memcpy(sc, b[i].scales, 8);
        int isum = 0;
        for (int p = 0; p < 16; p++) { /* 3-bit scale p: 16 elements, grid rows 2p, 2p + 1 */
            int part = 0;
            for (int g = 2 * p; g < 2 * p + 2; g++) {
                int h = (b[i].qh[g / 2] >> (4 * (g % 2))) & 15;
                int qsum = sum8(q + 8 * g);
                part += 8 * dot8_iq1(quant_iq1s_grid[b[i].qs[g] | (h & 7) << 8], q + 8 * g) +
                        (h & 8 ? -qsum : qsum);
            }
            isum += (2 * ((sc[p / 4] >> (3 * (p % 4))) & 7) + 1) * part;
        }
        sum += xd[i] * f16_to_f32(iq1m_d(b[i].scales)) * 0.125f * (float)isum;
    }
    return sum;
}

/* TQ1_0's base-3 digit t of a stored byte (ceil(q·256/243) form): 0..2. */
static int trit(uint8_t v, int t) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    uint8_t m = (uint8_t)(v * pow3[t]);
    return (m * 3) >> 8;
}

static float dot_tq1_0(int64_t k, const void *w, const void *x) {
    const struct block_tq1_0 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *bs = cpu_act_sK(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0, qsum = 0;
        for (int t = 0; t < 5; t++)
            for (int m = 0; m < 32; m++)
                isum += trit(b[i].qs[m], t) * q[32 * t + m];
        for (int t = 0; t < 5; t++)
            for (int m = 0; m < 16; m++)
                isum += trit(b[i].qs[32 + m], t) * q[160 + 16 * t + m];
        for (int t = 0; t < 4; t++)
            for (int m = 0; m < 4; m++)
                isum += trit(b[i].qh[m], t) * q[240 + 4 * t + m];
        for (int g = 0; g < 16; g++)
            qsum += bs[16 * i + g];
        sum += xd[i] * f16_to_f32(b[i].d) * (float)(isum - qsum);
    }
    return sum;
}

static float dot_tq2_0(int64_t k, const void *w, const void *x) {
    const struct block_tq2_0 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *bs = cpu_act_sK(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0, qsum = 0;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++)
                    isum += ((b[i].qs[32 * h + l] >> (2 * s)) & 3) * q[128 * h + 32 * s + l];
        for (int g = 0; g < 16; g++)
            qsum += bs[16 * i + g];
        sum += xd[i] * f16_to_f32(b[i].d) * (float)(isum - qsum);
    }
    return sum;
}

static float dot_nvfp4(int64_t k, const void *w, const void *x) {
    const struct block_nvfp4 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 64; i++) {
        for (int s = 0; s < 4; s++) {
            const int8_t *q = xq + 64 * i + 16 * s;
            int part = 0;
            for (int j = 0; j < 8; j++) {
                uint8_t v = b[i].qs[8 * s + j];
                part += cpu_kvalues_mxfp4[v & 15] * q[j] + cpu_kvalues_mxfp4[v >> 4] * q[8 + j];
            }
            sum += cpu_ue4m3_half(b[i].d[s]) * xd[2 * i + s / 2] * (float)part;
        }
    }
    return sum;
}

static float dot_q1_0(int64_t k, const void *w, const void *x) {
    const struct block_q1_0 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *xs = cpu_act_s32(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 128; i++) {
        float d = f16_to_f32(b[i].d);
        for (int h = 0; h < 4; h++) { /* per 32: sum of ±q = 2·(sum over set bits) - sum */
            const int8_t *q = xq + 128 * i + 32 * h;
            int part = 0;
            for (int j = 0; j < 32; j++)
                part += (b[i].qs[4 * h + j / 8] >> (j % 8)) & 1 ? q[j] : 0;
            sum += d * xd[4 * i + h] * (float)(2 * part - xs[4 * i + h]);
        }
    }
    return sum;
}

CPU_SCALAR_TILE(iq2_xxs)
CPU_SCALAR_TILE(iq2_xs)
CPU_SCALAR_TILE(iq2_s)
CPU_SCALAR_TILE(iq3_xxs)
CPU_SCALAR_TILE(iq3_s)
CPU_SCALAR_TILE(iq1_s)
CPU_SCALAR_TILE(iq1_m)
CPU_SCALAR_TILE(tq1_0)
CPU_SCALAR_TILE(tq2_0)
CPU_SCALAR_TILE(nvfp4)
CPU_SCALAR_TILE(q1_0)

void cpu_kernels_iq_scalar(struct cpu_kernel tab[QT_COUNT]) {
    tab[QT_IQ2_XXS] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq2_xxs};
    tab[QT_IQ2_XS] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq2_xs};
    tab[QT_IQ2_S] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq2_s};
    tab[QT_IQ3_XXS] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq3_xxs};
    tab[QT_IQ3_S] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq3_s};
    tab[QT_IQ1_S] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq1_s};
    tab[QT_IQ1_M] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq1_m};
    tab[QT_TQ1_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_tq1_0};
    tab[QT_TQ2_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_tq2_0};
    tab[QT_NVFP4] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_nvfp4};
    tab[QT_Q1_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_q1_0};
}
