/* Scalar matmul kernels: the reference twin of the SIMD paths and the path for CPUs
 * without AVX2. Integer math per block exactly as the SIMD kernels do it (same integer
 * sums, one f32 multiply-add per block), so paths differ only in f32 summation order.
 *
 * Each dot_* computes one weight row · one activation row over k elements; the tile
 * function loops nr × nc of them. Formats: quant/blocks.h (weights), cpu_kernels.h
 * (activations).
 */
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "util/half.h"

/* ---- plain types against f32 activations ---- */

static float dot_f32(int64_t k, const void *w, const void *x) {
    const float *a = w, *b = x;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += a[i + j] * b[i + j];
    for (; i < k; i++)
        s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static float dot_f16(int64_t k, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += f16_to_f32(a[i + j]) * b[i + j];
    for (; i < k; i++)
        s[0] += f16_to_f32(a[i]) * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static float dot_bf16(int64_t k, const void *w, const void *x) {
    const uint16_t *a = w;
    const float *b = x;
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += bf16_to_f32(a[i + j]) * b[i + j];
    for (; i < k; i++)
        s[0] += bf16_to_f32(a[i]) * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* ---- legacy 32-blocks against Q8_32 ---- */

static float dot_q8_0(int64_t k, const void *w, const void *x) {
    const struct block_q8_0 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 32; i++) {
        int isum = 0;
        for (int j = 0; j < 32; j++)
            isum += b[i].qs[j] * xq[32 * i + j];
        sum += f16_to_f32(b[i].d) * xd[i] * (float)isum;
    }
    return sum;
}

static float dot_q4_0(int64_t k, const void *w, const void *x) {
    const struct block_q4_0 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *xs = cpu_act_s32(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 32; i++) {
        const int8_t *q = xq + 32 * i;
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += (b[i].qs[j] & 15) * q[j] + (b[i].qs[j] >> 4) * q[j + 16];
        sum += f16_to_f32(b[i].d) * xd[i] * (float)(isum - 8 * xs[i]);
    }
    return sum;
}

static float dot_q4_1(int64_t k, const void *w, const void *x) {
    const struct block_q4_1 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *xs = cpu_act_s32(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 32; i++) {
        const int8_t *q = xq + 32 * i;
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += (b[i].qs[j] & 15) * q[j] + (b[i].qs[j] >> 4) * q[j + 16];
        sum += xd[i] * (f16_to_f32(b[i].d) * (float)isum + f16_to_f32(b[i].m) * (float)xs[i]);
    }
    return sum;
}

static inline int q5_isum(const uint8_t *qs, const uint8_t *qh4, const int8_t *q) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    int isum = 0;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        isum += lo * q[j] + hi * q[j + 16];
    }
    return isum;
}

static float dot_q5_0(int64_t k, const void *w, const void *x) {
    const struct block_q5_0 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *xs = cpu_act_s32(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 32; i++) {
        int isum = q5_isum(b[i].qs, b[i].qh, xq + 32 * i);
        sum += f16_to_f32(b[i].d) * xd[i] * (float)(isum - 16 * xs[i]);
    }
    return sum;
}

static float dot_q5_1(int64_t k, const void *w, const void *x) {
    const struct block_q5_1 *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *xs = cpu_act_s32(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 32; i++) {
        int isum = q5_isum(b[i].qs, b[i].qh, xq + 32 * i);
        sum += xd[i] * (f16_to_f32(b[i].d) * (float)isum + f16_to_f32(b[i].m) * (float)xs[i]);
    }
    return sum;
}

/* Codebook blocks of 32 (IQ4_NL: f16 d then 16 bytes of nibbles; MXFP4: the E8M0 exponent
 * then the nibbles): the nibble of element j < 16 is the low half of byte j, j + 16 the
 * high half. */
static float dot_lut(int64_t k, const uint8_t *w, size_t bs, const int8_t kv[16], bool e8m0,
                     const void *x) {
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 32; i++, w += bs) {
        const int8_t *q = xq + 32 * i;
        const uint8_t *qs = w + (e8m0 ? 1 : 2);
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += kv[qs[j] & 15] * q[j] + kv[qs[j] >> 4] * q[j + 16];
        uint16_t h;
        memcpy(&h, w, 2);
        sum += (e8m0 ? cpu_e8m0_half(w[0]) : f16_to_f32(h)) * xd[i] * (float)isum;
    }
    return sum;
}

static float dot_iq4_nl(int64_t k, const void *w, const void *x) {
    return dot_lut(k, w, sizeof(struct block_iq4_nl), cpu_kvalues_iq4nl, false, x);
}

static float dot_mxfp4(int64_t k, const void *w, const void *x) {
    return dot_lut(k, w, sizeof(struct block_mxfp4), cpu_kvalues_mxfp4, true, x);
}

/* ---- K-quants (256-blocks) against Q8_K ---- */

static float dot_q2_K(int64_t k, const void *w, const void *x) {
    const struct block_q2_K *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *bs = cpu_act_sK(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0, msum = 0;
        for (int g = 0; g < 16; g++)
            msum += (b[i].scales[g] >> 4) * bs[16 * i + g];
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++) {
                int n0 = 128 * h + 32 * s;
                for (int half = 0; half < 2; half++) {
                    int g = (n0 >> 4) + half, part = 0;
                    for (int l = 16 * half; l < 16 * half + 16; l++)
                        part += ((b[i].qs[32 * h + l] >> (2 * s)) & 3) * q[n0 + l];
                    isum += (b[i].scales[g] & 15) * part;
                }
            }
        float dx = xd[i];
        sum += dx * (f16_to_f32(b[i].d) * (float)isum - f16_to_f32(b[i].dmin) * (float)msum);
    }
    return sum;
}

static float dot_q3_K(int64_t k, const void *w, const void *x) {
    const struct block_q3_K *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *bs = cpu_act_sK(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int8_t sc[16];
        cpu_q3k_scales(b[i].scales, sc);
        int isum = 0;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++) {
                int n0 = 128 * h + 32 * s;
                for (int half = 0; half < 2; half++) {
                    int g = (n0 >> 4) + half, part = 0;
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        int lo = (b[i].qs[32 * h + l] >> (2 * s)) & 3;
                        int hb = (b[i].hmask[l] >> (4 * h + s)) & 1;
                        part += (lo + 4 * hb) * q[n0 + l]; /* q + 4, unsigned 0..7 */
                    }
                    isum += sc[g] * (part - 4 * bs[16 * i + g]);
                }
            }
        sum += xd[i] * f16_to_f32(b[i].d) * (float)isum;
    }
    return sum;
}

static float dot_q4_K(int64_t k, const void *w, const void *x) {
    const struct block_q4_K *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *bs = cpu_act_sK(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0, msum = 0;
        for (int p = 0; p < 4; p++)
            for (int t = 0; t < 2; t++) {
                int j = 2 * p + t;
                uint8_t sc, m;
                cpu_q4k_scale_min(b[i].scales, j, &sc, &m);
                int part = 0;
                for (int l = 0; l < 32; l++)
                    part += ((b[i].qs[32 * p + l] >> (4 * t)) & 15) * q[32 * j + l];
                isum += sc * part;
                msum += m * (bs[16 * i + 2 * j] + bs[16 * i + 2 * j + 1]);
            }
        sum += xd[i] * (f16_to_f32(b[i].d) * (float)isum - f16_to_f32(b[i].dmin) * (float)msum);
    }
    return sum;
}

static float dot_q5_K(int64_t k, const void *w, const void *x) {
    const struct block_q5_K *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *bs = cpu_act_sK(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0, msum = 0;
        for (int p = 0; p < 4; p++)
            for (int t = 0; t < 2; t++) {
                int j = 2 * p + t;
                uint8_t sc, m;
                cpu_q4k_scale_min(b[i].scales, j, &sc, &m);
                int part = 0;
                for (int l = 0; l < 32; l++) {
                    int v = ((b[i].qs[32 * p + l] >> (4 * t)) & 15) | ((b[i].qh[l] >> j) & 1) << 4;
                    part += v * q[32 * j + l];
                }
                isum += sc * part;
                msum += m * (bs[16 * i + 2 * j] + bs[16 * i + 2 * j + 1]);
            }
        sum += xd[i] * (f16_to_f32(b[i].d) * (float)isum - f16_to_f32(b[i].dmin) * (float)msum);
    }
    return sum;
}

static float dot_q6_K(int64_t k, const void *w, const void *x) {
    const struct block_q6_K *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    const int16_t *bs = cpu_act_sK(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++) {
                int n0 = 128 * h + 32 * s;
                for (int half = 0; half < 2; half++) {
                    int g = (n0 >> 4) + half, part = 0;
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        int lo = (b[i].ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15;
                        int hi = (b[i].qh[32 * h + l] >> (2 * s)) & 3;
                        part += (lo | hi << 4) * q[n0 + l]; /* q + 32, unsigned 0..63 */
                    }
                    isum += b[i].scales[g] * (part - 32 * bs[16 * i + g]);
                }
            }
        sum += xd[i] * f16_to_f32(b[i].d) * (float)isum;
    }
    return sum;
}

static float dot_iq4_xs(int64_t k, const void *w, const void *x) {
    const struct block_iq4_xs *b = w;
    const int8_t *xq = x;
    const float *xd = cpu_act_d(x, k);
    float sum = 0;
    for (int64_t i = 0; i < k / 256; i++) {
        const int8_t *q = xq + 256 * i;
        int isum = 0;
        for (int j = 0; j < 8; j++) {
            int ls = ((b[i].scales_l[j / 2] >> (4 * (j % 2))) & 15) |
                     ((b[i].scales_h >> (2 * j)) & 3) << 4;
            int part = 0;
            for (int l = 0; l < 16; l++) {
                uint8_t v = b[i].qs[16 * j + l];
                part += cpu_kvalues_iq4nl[v & 15] * q[32 * j + l] +
                        cpu_kvalues_iq4nl[v >> 4] * q[32 * j + 16 + l];
            }
            isum += (ls - 32) * part;
        }
        sum += xd[i] * f16_to_f32(b[i].d) * (float)isum;
    }
    return sum;
}

/* ---- tiles ---- */

CPU_SCALAR_TILE(f32)
CPU_SCALAR_TILE(f16)
CPU_SCALAR_TILE(bf16)
CPU_SCALAR_TILE(q8_0)
CPU_SCALAR_TILE(q4_0)
CPU_SCALAR_TILE(q4_1)
CPU_SCALAR_TILE(q5_0)
CPU_SCALAR_TILE(q5_1)
CPU_SCALAR_TILE(iq4_nl)
CPU_SCALAR_TILE(mxfp4)
CPU_SCALAR_TILE(q2_K)
CPU_SCALAR_TILE(q3_K)
CPU_SCALAR_TILE(q4_K)
CPU_SCALAR_TILE(q5_K)
CPU_SCALAR_TILE(q6_K)
CPU_SCALAR_TILE(iq4_xs)

void cpu_kernels_scalar(struct cpu_kernel tab[QT_COUNT]) {
    tab[QT_F32] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_f32};
    tab[QT_F16] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_f16};
    tab[QT_BF16] = (struct cpu_kernel){.act = CPU_ACT_F32, .gemm = gemm_bf16};
    tab[QT_Q8_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_q8_0};
    tab[QT_Q4_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_q4_0};
    tab[QT_Q4_1] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_q4_1};
    tab[QT_Q5_0] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_q5_0};
    tab[QT_Q5_1] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_q5_1};
    tab[QT_IQ4_NL] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_iq4_nl};
    tab[QT_MXFP4] = (struct cpu_kernel){.act = CPU_ACT_Q8_32, .gemm = gemm_mxfp4};
    tab[QT_Q2_K] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_q2_K};
    tab[QT_Q3_K] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_q3_K};
    tab[QT_Q4_K] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_q4_K};
    tab[QT_Q5_K] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_q5_K};
    tab[QT_Q6_K] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_q6_K};
    tab[QT_IQ4_XS] = (struct cpu_kernel){.act = CPU_ACT_Q8_K, .gemm = gemm_iq4_xs};
    cpu_kernels_iq_scalar(tab);
}
