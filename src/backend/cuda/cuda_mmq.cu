/* Quantized matrix x many token rows on the int8 tensor cores. See cuda_mmq.h.
 *
 * Tiling. A thread block (4 warps, 2 x 2) computes BM = 32*RT weight rows x BN = 16*NT
 * token rows of y. K is walked in stages of 256 (one K-quant super-block, eight Q8_0
 * blocks); each stage's weight bits, weight scales, int8 activations and activation scales
 * are copied to shared memory with cp.async while the previous stage is being multiplied
 * (two buffers). Warp (wm, wn) owns rows wm*16*RT + [0, 16*RT) and tokens wn*8*NT + [0, 8*NT)
 * of the tile: RT x NT mma tiles of 16 rows x 8 tokens.
 *
 * Per 32-wide K block j of a stage, a warp unpacks its A fragments (weights) once from the
 * raw bits in shared memory, then for each 8-token tile loads the B fragment (int8
 * activations) and runs the mma of every row tile. The int32 result c of a block is folded
 * into the f32 accumulators right away:
 *   Q8_0: acc += dw[r] * dx[t] * c
 *   Q4_K: acc += d*sc[r] * dx[t] * c - dmin*m[r] * (dx * sum xq)[t]      (x = d*sc*q - dmin*m)
 *   Q6_K: acc += dx[t] * (d*sc_lo[r] * c_lo + d*sc_hi[r] * c_hi)      (two m16n8k16: the
 *         scale changes every 16 values; q - 32 fits int8, so no activation sums)
 * c is exact in int32 and below 2^22 in magnitude for every type here (<= 32 * 128 * 127), so
 * it converts to f32 with an add and a subtract (i2f) instead of the quarter-rate I2F.
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32" / "mma.m16n8k16 with
 * integer type"), with groupID g = lane >> 2 and threadID_in_group t = lane & 3; "low to
 * high" means byte 0 of a register holds the lowest index:
 *   m16n8k32 A (16 x 32 s8, row): a[0] = row g,   cols 4t..4t+3     a[1] = row g+8, cols 4t..4t+3
 *                                 a[2] = row g,   cols 16+4t..+3    a[3] = row g+8, cols 16+4t..+3
 *   m16n8k32 B (32 x 8 s8, col):  b[0] = rows(k) 4t..4t+3, col(n) g  b[1] = rows 16+4t..+3, col g
 *   m16n8k16 A (16 x 16 s8):      a[0] = row g, cols 4t..4t+3        a[1] = row g+8, cols 4t..4t+3
 *   m16n8k16 B (16 x 8 s8):       b[0] = rows 4t..4t+3, col g
 *   C/D (16 x 8 s32, both):       c[0] = (g, 2t)    c[1] = (g, 2t+1)
 *                                 c[2] = (g+8, 2t)  c[3] = (g+8, 2t+1)
 * Here A's rows are weight rows and B's columns are tokens; with weights and activations both
 * stored K-contiguous, every fragment register is one aligned 32-bit shared load. Shared row
 * strides are 16 B past a multiple of 128 (144, 208, 272) so the 32 lanes of a fragment load
 * (8 rows g x 4 words t) hit 32 different banks.
 *
 * Bytes and ops per call: see docs/cuda-backend.md ("Tensor-core matmul").
 */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_mmq.h"
#include "quant/quant.h"
}

#define MMQ_THREADS 128
#define MMQ_KB 8          /* 32-wide K blocks per stage (256 values) */
#define MMQ_XQ_STRIDE 272 /* shared bytes per token: 256 int8 activations + 16 pad */
#define MMQ_XD_STRIDE 80  /* shared bytes per token: 8 x {d, d*sum} + 16 pad */
#define MMQ_XD_F2 (MMQ_XD_STRIDE / 8)

/* ---------------------------------------------------------------- helpers ---- */

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

static __device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}

/* Copies src_bytes (<= 4) from an aligned word and zero-fills the rest of it. */
static __device__ __forceinline__ void cp_async4_part(void *smem, const void *gmem,
                                                      unsigned src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}

static __device__ __forceinline__ void cp_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> static __device__ __forceinline__ void cp_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static __device__ __forceinline__ uint32_t lds32(const unsigned char *p) {
    return *(const uint32_t *)p;
}

/* Exact for |c| < 2^22: 1.5 * 2^23 + c is a float whose mantissa field is 0x400000 + c. */
static __device__ __forceinline__ float i2f(int c) {
    return __int_as_float(c + 0x4B400000) - 12582912.0f;
}

/* D = A B (+ 0), layouts in the file comment. */
static __device__ __forceinline__ void mma_k32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "cuda_mmq needs sm_80 or newer (int8 mma.sync m16n8k32)"
#endif
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

static __device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

/* Four Q6_K quants (low nibbles from ql >> shl, 2 high bits from qh >> shh) as int8 q - 32.
 * q is in [0, 63]; q - 32 keeps bits 0..4 and sets bits 5..7 exactly when bit 5 of q is
 * clear (0x20 * 7 = 0xE0 stays inside its byte, so the multiply cannot carry). */
static __device__ __forceinline__ uint32_t q6_unpack(uint32_t ql, uint32_t qh, int shl, int shh) {
    const uint32_t q = ((ql >> shl) & 0x0f0f0f0fu) | (((qh >> shh) & 0x03030303u) << 4);
    return (q & 0x1f1f1f1fu) | ((~q & 0x20202020u) * 7u);
}

/* ------------------------------------------------------------ smem layout ---- */

/* Per weight row per stage: quant bits (padded row stride), 16 B of scales, and for Q6_K
 * the 4-byte word holding its f16 super-block scale. */
template <uint32_t T> struct mmq_fmt;
template <> struct mmq_fmt<QT_Q4_K> {
    static constexpr int q_stride = 144, d_bytes = 0; /* 128 B nibbles */
};
template <> struct mmq_fmt<QT_Q6_K> {
    static constexpr int q_stride = 208, d_bytes = 4; /* 128 B ql + 64 B qh */
};
template <> struct mmq_fmt<QT_Q8_0> {
    static constexpr int q_stride = 272, d_bytes = 0; /* 256 B int8 */
};

/* Byte offsets inside one stage buffer; every offset is a multiple of 16. */
template <uint32_t T, int BM, int BN> struct mmq_smem {
    static constexpr int ws = BM * mmq_fmt<T>::q_stride;
    static constexpr int wd = ws + BM * 16;
    static constexpr int xq = wd + BM * mmq_fmt<T>::d_bytes;
    static constexpr int xd = xq + BN * MMQ_XQ_STRIDE;
    static constexpr int stage = xd + BN * MMQ_XD_STRIDE;
};

struct mmq_args {
    const unsigned char *wq, *ws, *wd; /* split-layout weight arrays (cuda_qweight q, s, d) */
    const int8_t *xq;                  /* (n, k) int8 activations */
    const float2 *xd;                  /* (n, k/32) {d, d * sum(q)} */
    float *y;                          /* (n, rows) */
    int rows, k, n, accumulate;
};

/* ------------------------------------------------------------------ kernels ---- */

/* x (total f32, total % 32 == 0) -> xq int8, xd[i/32] = {d, d * sum(q)}; one warp per 32
 * values, d = amax / 127, q = round-to-nearest-even(x / d): the rounding cuda_mmv uses. */
static __global__ void mmq_quantize_kernel(const float *__restrict__ x, int8_t *__restrict__ xq,
                                           float2 *__restrict__ xd, int64_t total) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float v = i < total ? x[i] : 0.0f;
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = d > 0.0f ? __float2int_rn(v / d) : 0;
    int s = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (i < total) {
        xq[i] = (int8_t)q;
        if ((threadIdx.x & 31) == 0) xd[i >> 5] = make_float2(d, d * (float)s);
    }
}

/* Issues the cp.async copies of stage s (K blocks 8s .. 8s+nbv-1) into buffer st. Rows past
 * the matrix and tokens past n are clamped to the last one (their results are not stored). */
template <uint32_t T, int BM, int BN>
static __device__ __forceinline__ void load_stage(const mmq_args &a, unsigned char *st, int s,
                                                  int row0, int tok0, int tid) {
    using L = mmq_smem<T, BM, BN>;
    const int nblk = a.k >> 5, kb0 = s * MMQ_KB, nbv = min(MMQ_KB, nblk - kb0);
#pragma unroll
    for (int i = tid; i < BN * 16; i += MMQ_THREADS) { /* int8 activations: 16 x 16 B per token */
        const int r = i >> 4, c = i & 15;
        if (c < 2 * nbv) {
            const int64_t gt = min(tok0 + r, a.n - 1);
            cp_async16(st + L::xq + r * MMQ_XQ_STRIDE + c * 16,
                       a.xq + gt * a.k + kb0 * 32 + c * 16);
        }
    }
#pragma unroll
    for (int i = tid; i < BN * 4; i += MMQ_THREADS) { /* {d, d*sum}: 4 x 16 B per token */
        const int r = i >> 2, c = i & 3;
        if (2 * c < nbv) {
            const int64_t gt = min(tok0 + r, a.n - 1);
            cp_async16(st + L::xd + r * MMQ_XD_STRIDE + c * 16,
                       (const unsigned char *)a.xd + (gt * nblk + kb0) * 8 + c * 16);
        }
    }
    if constexpr (T == QT_Q4_K) {
        const int64_t nsb = a.k >> 8;
#pragma unroll
        for (int i = tid; i < BM * 8; i += MMQ_THREADS) {
            const int r = i >> 3, c = i & 7;
            const int64_t gr = min(row0 + r, a.rows - 1);
            cp_async16(st + r * mmq_fmt<T>::q_stride + c * 16,
                       a.wq + (gr * nsb + s) * 128 + c * 16);
        }
#pragma unroll
        for (int i = tid; i < BM; i += MMQ_THREADS) {
            const int64_t gr = min(row0 + i, a.rows - 1);
            cp_async16(st + L::ws + i * 16, a.ws + (gr * nsb + s) * 16);
        }
    } else if constexpr (T == QT_Q6_K) {
        const int64_t nsb = a.k >> 8;
#pragma unroll
        for (int i = tid; i < BM * 12; i += MMQ_THREADS) {
            const int r = i / 12, c = i - r * 12;
            const int64_t gr = min(row0 + r, a.rows - 1);
            cp_async16(st + r * mmq_fmt<T>::q_stride + c * 16,
                       a.wq + (gr * nsb + s) * 192 + c * 16);
        }
#pragma unroll
        for (int i = tid; i < BM; i += MMQ_THREADS) {
            const int64_t gr = min(row0 + i, a.rows - 1), blk = gr * nsb + s;
            cp_async16(st + L::ws + i * 16, a.ws + blk * 16);
            /* d is an f16 in a 2-byte array: copy the aligned word holding it, only its
             * first half when d is the word's low half (the array may end there) */
            cp_async4_part(st + L::wd + i * 4, a.wd + ((blk * 2) & ~(int64_t)3),
                           (blk & 1) ? 4u : 2u);
        }
    } else { /* Q8_0 */
#pragma unroll
        for (int i = tid; i < BM * 16; i += MMQ_THREADS) {
            const int r = i >> 4, c = i & 15;
            if (c < 2 * nbv) {
                const int64_t gr = min(row0 + r, a.rows - 1);
                cp_async16(st + r * mmq_fmt<T>::q_stride + c * 16,
                           a.wq + gr * a.k + kb0 * 32 + c * 16);
            }
        }
#pragma unroll
        for (int i = tid; i < BM * 4;
             i += MMQ_THREADS) { /* 8 f16 scales = 4 words (k/32 is even) */
            const int r = i >> 2, c = i & 3;
            if (2 * c < nbv) {
                const int64_t gr = min(row0 + r, a.rows - 1);
                cp_async4(st + L::ws + r * 16 + c * 4, a.ws + (gr * nblk + kb0) * 2 + c * 4);
            }
        }
    }
}

/* Multiplies one stage held in st into acc. nbv: valid 32-blocks in the stage (< 8 only
 * in Q8_0's last stage). */
template <uint32_t T, int RT, int NT>
static __device__ __forceinline__ void compute_stage(const mmq_args &a, const unsigned char *st,
                                                     float (&acc)[RT][NT][4], int s, int nbv,
                                                     int row0, int wm, int wn, int g, int t) {
    constexpr int BM = 32 * RT, BN = 16 * NT, QS = mmq_fmt<T>::q_stride;
    using L = mmq_smem<T, BM, BN>;
    const unsigned char *xq = st + L::xq;
    const float2 *xd = (const float2 *)(st + L::xd);
    const int wrow = wm * 16 * RT + g; /* + rt*16 + 8h: this lane's weight rows in the tile */
    const int wtok = wn * 8 * NT;      /* + nt*8: this warp's token tiles */

    if constexpr (T == QT_Q4_K) {
        float2 dm[RT][2]; /* {d, dmin} of each row */
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                dm[rt][h] =
                    __half22float2(*(const __half2 *)(st + L::ws + (wrow + rt * 16 + 8 * h) * 16));
#pragma unroll 1
        for (int p = 0; p < 4; p++) { /* sub-blocks 2p (low nibbles) and 2p+1 (high) share bytes */
            uint32_t wl[RT][2], wh[RT][2], pk[RT][2];
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wrow + rt * 16 + 8 * h;
                    const unsigned char *wr = st + r * QS + 32 * p + 4 * t;
                    wl[rt][h] = lds32(wr);      /* cols 4t..4t+3 of the sub-block */
                    wh[rt][h] = lds32(wr + 16); /* cols 16+4t..16+4t+3 */
                    /* {sc_a, m_a, sc_b, m_b} x 6 bits of sub-blocks 2p, 2p+1 (cuda_mmv.cu, Q4_K) */
                    const uint32_t *sw = (const uint32_t *)(st + L::ws + r * 16);
                    pk[rt][h] = p < 3
                                    ? sw[1 + p]
                                    : (sw[1] >> 24) | ((sw[2] >> 24) << 8) | ((sw[3] >> 24) << 16);
                }
#pragma unroll
            for (int tt = 0; tt < 2; tt++) {
                const int j = 2 * p + tt; /* 32-block of the stage = sub-block of the super-block */
                uint32_t af[RT][4];
                float sa[RT][2], sm[RT][2]; /* d * sc and dmin * m of rows g, g+8 */
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    af[rt][0] = (wl[rt][0] >> (4 * tt)) & 0x0f0f0f0fu;
                    af[rt][1] = (wl[rt][1] >> (4 * tt)) & 0x0f0f0f0fu;
                    af[rt][2] = (wh[rt][0] >> (4 * tt)) & 0x0f0f0f0fu;
                    af[rt][3] = (wh[rt][1] >> (4 * tt)) & 0x0f0f0f0fu;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint32_t f = pk[rt][h] >> (12 * tt);
                        sa[rt][h] = dm[rt][h].x * (float)(f & 63);
                        sm[rt][h] = dm[rt][h].y * (float)((f >> 6) & 63);
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int tb = wtok + nt * 8;
                    const unsigned char *xb = xq + (tb + g) * MMQ_XQ_STRIDE + 32 * j + 4 * t;
                    const uint32_t b0 = lds32(xb), b1 = lds32(xb + 16);
                    const float2 x0 = xd[(tb + 2 * t) * MMQ_XD_F2 + j],
                                 x1 = xd[(tb + 2 * t + 1) * MMQ_XD_F2 + j];
#pragma unroll
                    for (int rt = 0; rt < RT; rt++) {
                        int c[4];
                        mma_k32(c, af[rt], b0, b1);
                        acc[rt][nt][0] += sa[rt][0] * x0.x * i2f(c[0]) - sm[rt][0] * x0.y;
                        acc[rt][nt][1] += sa[rt][0] * x1.x * i2f(c[1]) - sm[rt][0] * x1.y;
                        acc[rt][nt][2] += sa[rt][1] * x0.x * i2f(c[2]) - sm[rt][1] * x0.y;
                        acc[rt][nt][3] += sa[rt][1] * x1.x * i2f(c[3]) - sm[rt][1] * x1.y;
                    }
                }
            }
        }
    } else if constexpr (T == QT_Q6_K) {
        float dsb[RT][2]; /* the super-block scale d of each row */
        const int64_t nsb = a.k >> 8;
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = wrow + rt * 16 + 8 * h;
                const int64_t gr = min(row0 + r, a.rows - 1);
                const uint32_t w = *(const uint32_t *)(st + L::wd + r * 4);
                const unsigned short bits =
                    (unsigned short)(((gr * nsb + s) & 1) ? w >> 16 : w & 0xffffu);
                dsb[rt][h] = __half2float(__ushort_as_half(bits));
            }
#pragma unroll
        for (int j = 0; j < MMQ_KB; j++) {
            /* 32-block j = elements 128h + 32s4 + [0, 32): low nibbles from
             * ql[64h + 32(s4&1) + l] >> 4(s4>>1), high bits from qh[32h + l] >> 2s4 */
            const int hh = j >> 2, s4 = j & 3;
            const int offl = 64 * hh + 32 * (s4 & 1) + 4 * t, offh = 128 + 32 * hh + 4 * t;
            const int shl = 4 * (s4 >> 1), shh = 2 * s4;
            uint32_t alo[RT][2], ahi[RT][2]; /* [rt][row g / g+8]: cols 4t.. and 16+4t.. */
            float slo[RT][2], shi[RT][2];
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wrow + rt * 16 + 8 * h;
                    const unsigned char *wr = st + r * QS;
                    alo[rt][h] = q6_unpack(lds32(wr + offl), lds32(wr + offh), shl, shh);
                    ahi[rt][h] = q6_unpack(lds32(wr + offl + 16), lds32(wr + offh + 16), shl, shh);
                    const int8_t *sc = (const int8_t *)(st + L::ws + r * 16);
                    slo[rt][h] = dsb[rt][h] * (float)sc[2 * j]; /* sub-block 2j: cols 0..15 */
                    shi[rt][h] =
                        dsb[rt][h] * (float)sc[2 * j + 1]; /* sub-block 2j+1: cols 16..31 */
                }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int tb = wtok + nt * 8;
                const unsigned char *xb = xq + (tb + g) * MMQ_XQ_STRIDE + 32 * j + 4 * t;
                const uint32_t b0 = lds32(xb), b1 = lds32(xb + 16);
                const float x0 = xd[(tb + 2 * t) * MMQ_XD_F2 + j].x,
                            x1 = xd[(tb + 2 * t + 1) * MMQ_XD_F2 + j].x;
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    int cl[4], ch[4];
                    mma_k16(cl, alo[rt][0], alo[rt][1], b0);
                    mma_k16(ch, ahi[rt][0], ahi[rt][1], b1);
                    acc[rt][nt][0] += x0 * (slo[rt][0] * i2f(cl[0]) + shi[rt][0] * i2f(ch[0]));
                    acc[rt][nt][1] += x1 * (slo[rt][0] * i2f(cl[1]) + shi[rt][0] * i2f(ch[1]));
                    acc[rt][nt][2] += x0 * (slo[rt][1] * i2f(cl[2]) + shi[rt][1] * i2f(ch[2]));
                    acc[rt][nt][3] += x1 * (slo[rt][1] * i2f(cl[3]) + shi[rt][1] * i2f(ch[3]));
                }
            }
        }
    } else { /* Q8_0 */
#pragma unroll
        for (int j = 0; j < MMQ_KB; j++) {
            if (j >= nbv) break;
            uint32_t af[RT][4];
            float dw[RT][2];
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wrow + rt * 16 + 8 * h;
                    const unsigned char *wr = st + r * QS + 32 * j + 4 * t;
                    af[rt][h] = lds32(wr);          /* a[0] / a[1]: row g / g+8, cols 4t.. */
                    af[rt][2 + h] = lds32(wr + 16); /* a[2] / a[3]: cols 16+4t.. */
                    dw[rt][h] = __half2float(*(const __half *)(st + L::ws + r * 16 + 2 * j));
                }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int tb = wtok + nt * 8;
                const unsigned char *xb = xq + (tb + g) * MMQ_XQ_STRIDE + 32 * j + 4 * t;
                const uint32_t b0 = lds32(xb), b1 = lds32(xb + 16);
                const float x0 = xd[(tb + 2 * t) * MMQ_XD_F2 + j].x,
                            x1 = xd[(tb + 2 * t + 1) * MMQ_XD_F2 + j].x;
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    int c[4];
                    mma_k32(c, af[rt], b0, b1);
                    acc[rt][nt][0] += dw[rt][0] * x0 * i2f(c[0]);
                    acc[rt][nt][1] += dw[rt][0] * x1 * i2f(c[1]);
                    acc[rt][nt][2] += dw[rt][1] * x0 * i2f(c[2]);
                    acc[rt][nt][3] += dw[rt][1] * x1 * i2f(c[3]);
                }
            }
        }
    }
}

/* NS: stages in flight (shared buffers); NS - 1 are being copied while one is multiplied. */
template <uint32_t T, int RT, int NT, int NS>
static __global__ void __launch_bounds__(MMQ_THREADS) mmq_kernel(const mmq_args a) {
    constexpr int BM = 32 * RT, BN = 16 * NT;
    using L = mmq_smem<T, BM, BN>;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3, wm = warp & 1, wn = warp >> 1;
    const int tok0 = blockIdx.x * BN, row0 = blockIdx.y * BM;
    const int nblk = a.k >> 5, nstage = (nblk + MMQ_KB - 1) / MMQ_KB;

    float acc[RT][NT][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[rt][nt][i] = 0.0f;

#pragma unroll
    for (int s = 0; s < NS - 1; s++) { /* fill the pipeline; one commit group per stage */
        if (s < nstage) load_stage<T, BM, BN>(a, smem + s * L::stage, s, row0, tok0, tid);
        cp_commit();
    }
    for (int s = 0; s < nstage; s++) {
        cp_wait<NS - 2>();         /* stage s has landed (this thread's copies) ... */
        __syncthreads();           /* ... every thread's; and every warp is done with stage s - 1 */
        const int sp = s + NS - 1; /* refill the buffer stage s - 1 used */
        if (sp < nstage) load_stage<T, BM, BN>(a, smem + (sp % NS) * L::stage, sp, row0, tok0, tid);
        cp_commit();
        compute_stage<T, RT, NT>(a, smem + (s % NS) * L::stage, acc, s,
                                 min(MMQ_KB, nblk - s * MMQ_KB), row0, wm, wn, g, t);
    }

#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + wm * 16 * RT + rt * 16 + g + 8 * (i >> 1);
                const int tok = tok0 + wn * 8 * NT + nt * 8 + 2 * t + (i & 1);
                if (row < a.rows && tok < a.n) {
                    float *o = a.y + (int64_t)tok * a.rows + row;
                    *o = a.accumulate ? *o + acc[rt][nt][i] : acc[rt][nt][i];
                }
            }
}

/* --------------------------------------------------------------- launchers ---- */

/* The fixed tiles {RT, NT, NS}: BM = 32*RT weight rows x BN = 16*NT tokens, NS stages.
 * The narrow tiles serve small n, where few blocks stream long rows: deeper pipelines keep
 * more bytes in flight per SM. */
static constexpr int tiles[][3] = {{1, 1, 4}, {1, 2, 3}, {2, 2, 3}, {2, 4, 2}, {2, 8, 2}};
#define N_TILES ((int)(sizeof tiles / sizeof tiles[0]))

template <uint32_t T, int I> static constexpr int smem_total(void) {
    return tiles[I][2] * mmq_smem<T, 32 * tiles[I][0], 16 * tiles[I][1]>::stage;
}

template <uint32_t T> static int smem_bytes(int tile) {
    static_assert(N_TILES == 5, "one case per tile below");
    switch (tile) {
    case 0:
        return smem_total<T, 0>();
    case 1:
        return smem_total<T, 1>();
    case 2:
        return smem_total<T, 2>();
    case 3:
        return smem_total<T, 3>();
    default:
        return smem_total<T, 4>();
    }
}

static int smem_bytes_of(uint32_t type, int tile) {
    switch (type) {
    case QT_Q4_K:
        return smem_bytes<QT_Q4_K>(tile);
    case QT_Q6_K:
        return smem_bytes<QT_Q6_K>(tile);
    default:
        return smem_bytes<QT_Q8_0>(tile);
    }
}

template <uint32_t T, int I> static cudaError_t launch_tile(const mmq_args &a, cudaStream_t st) {
    constexpr int RT = tiles[I][0], NT = tiles[I][1], NS = tiles[I][2];
    constexpr int BM = 32 * RT, BN = 16 * NT, bytes = smem_total<T, I>();
    if (bytes > 48 * 1024) { /* above the default limit: opt in (idempotent, per device) */
        cudaError_t ce = cudaFuncSetAttribute(mmq_kernel<T, RT, NT, NS>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (ce != cudaSuccess) return ce;
    }
    const dim3 grid((unsigned)((a.n + BN - 1) / BN), (unsigned)((a.rows + BM - 1) / BM));
    mmq_kernel<T, RT, NT, NS><<<grid, MMQ_THREADS, bytes, st>>>(a);
    return cudaGetLastError();
}

template <uint32_t T> static cudaError_t launch_type(const mmq_args &a, int tile, cudaStream_t st) {
    switch (tile) {
    case 0:
        return launch_tile<T, 0>(a, st);
    case 1:
        return launch_tile<T, 1>(a, st);
    case 2:
        return launch_tile<T, 2>(a, st);
    case 3:
        return launch_tile<T, 3>(a, st);
    default:
        return launch_tile<T, 4>(a, st);
    }
}

extern "C" int cuda_mmq_tile_count(void) {
    return N_TILES;
}

extern "C" void cuda_mmq_tile_shape(int tile, int *rows, int *tokens) {
    if (tile < 0 || tile >= N_TILES) tile = 0;
    *rows = 32 * tiles[tile][0];
    *tokens = 16 * tiles[tile][1];
}

extern "C" int cuda_mmq_supported(uint32_t type, int64_t k) {
    if (k <= 0 || k > (1 << 30)) return 0;
    switch (type) {
    case QT_Q4_K:
    case QT_Q6_K:
        return k % 256 == 0;
    case QT_Q8_0:
        return k % 64 == 0; /* the scale copies are 4-byte pairs of blocks */
    default:
        return 0;
    }
}

/* Largest tile that still gives every SM a block; when none does, the smallest (most
 * blocks). Tiles whose token width is twice n or more are skipped (half their work would
 * be padding). */
static int pick_tile(uint32_t type, int64_t rows, int64_t n, int n_sm, int smem_max) {
    for (int i = N_TILES - 1; i > 0; i--) {
        const int bm = 32 * tiles[i][0], bn = 16 * tiles[i][1];
        if (smem_bytes_of(type, i) > smem_max || (bn > 16 && bn / 2 >= n)) continue;
        if (((rows + bm - 1) / bm) * ((n + bn - 1) / bn) >= n_sm) return i;
    }
    return 0;
}

static cudaError_t device_limits(int *n_sm, int *smem_max) {
    int dev = 0;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce == cudaSuccess) ce = cudaDeviceGetAttribute(n_sm, cudaDevAttrMultiProcessorCount, dev);
    if (ce == cudaSuccess)
        ce = cudaDeviceGetAttribute(smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return ce;
}

extern "C" int cuda_mmq_tile_auto(const struct cuda_qweight *w, int64_t n) {
    int n_sm = 0, smem_max = 0;
    if (device_limits(&n_sm, &smem_max) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return pick_tile(w->type, w->rows, n, n_sm, smem_max);
}

/* Scratch: xq (n*k int8, padded to 256 B), then xd (n*k/32 float2). */
extern "C" uint64_t cuda_mmq_scratch_bytes(int64_t k, int64_t n) {
    const uint64_t nk = (uint64_t)k * (uint64_t)n;
    return ((nk + 255) & ~255ull) + nk / 32 * 8;
}

static void scratch_parts(const void *scratch, int64_t k, int64_t n, int8_t **xq, float2 **xd) {
    const uint64_t nk = (uint64_t)k * (uint64_t)n;
    *xq = (int8_t *)scratch;
    *xd = (float2 *)((unsigned char *)scratch + ((nk + 255) & ~255ull));
}

extern "C" smelt_status cuda_mmq_quantize(const float *x, int64_t k, int64_t n, void *scratch,
                                          void *stream, struct err *e) {
    if (k <= 0 || k % 32 != 0 || n < 1)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmq: quantizing %lld x %lld activations (k %% 32 != 0?)", (long long)n,
                       (long long)k);
    int8_t *xq;
    float2 *xd;
    scratch_parts(scratch, k, n, &xq, &xd);
    const int64_t total = k * n;
    const int tb = 256;
    mmq_quantize_kernel<<<(unsigned)((total + tb - 1) / tb), tb, 0, (cudaStream_t)stream>>>(
        x, xq, xd, total);
    CUDA_TRY_LAUNCH(e);
    return SMELT_OK;
}

extern "C" smelt_status cuda_mmq_pre(const struct cuda_qweight *w, int64_t n, float *y,
                                     const void *scratch, int accumulate, int tile, void *stream,
                                     struct err *e) {
    if (!cuda_mmq_supported(w->type, w->k))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmq: type %s with row length %lld",
                       qtype_name(w->type), (long long)w->k);
    if (n < 1 || n > (1 << 24) || w->rows < 1 || w->rows > 65535LL * 32) /* grid.y <= 65535 */
        return err_set(e, SMELT_ERR_INVALID, "cuda mmq: %lld token rows x %lld weight rows",
                       (long long)n, (long long)w->rows);
    int n_sm = 0, smem_max = 0;
    CUDA_TRY(device_limits(&n_sm, &smem_max), e);
    if (tile == CUDA_MMQ_TILE_AUTO) tile = pick_tile(w->type, w->rows, n, n_sm, smem_max);
    if (tile < 0 || tile >= N_TILES)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmq: tile %d (0..%d)", tile, N_TILES - 1);
    if (smem_bytes_of(w->type, tile) > smem_max)
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "cuda mmq: tile %d needs %d B of shared memory, the device has %d", tile,
                       smem_bytes_of(w->type, tile), smem_max);
    int8_t *xq;
    float2 *xd;
    scratch_parts(scratch, w->k, n, &xq, &xd);
    mmq_args a;
    a.wq = (const unsigned char *)w->q;
    a.ws = (const unsigned char *)w->s;
    a.wd = (const unsigned char *)w->d;
    a.xq = xq;
    a.xd = xd;
    a.y = y;
    a.rows = (int)w->rows;
    a.k = (int)w->k;
    a.n = (int)n;
    a.accumulate = accumulate != 0;
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t ce;
    switch (w->type) {
    case QT_Q4_K:
        ce = launch_type<QT_Q4_K>(a, tile, st);
        break;
    case QT_Q6_K:
        ce = launch_type<QT_Q6_K>(a, tile, st);
        break;
    default:
        ce = launch_type<QT_Q8_0>(a, tile, st);
        break;
    }
    if (ce != cudaSuccess)
        return err_set(e, SMELT_ERR_DEVICE, "cuda mmq: %s %lld x %lld, %lld tokens, tile %d: %s",
                       qtype_name(w->type), (long long)w->rows, (long long)w->k, (long long)n, tile,
                       cudaGetErrorString(ce));
    return SMELT_OK;
}

extern "C" smelt_status cuda_mmq(const struct cuda_qweight *w, const float *x, int64_t n, float *y,
                                 void *scratch, int accumulate, void *stream, struct err *e) {
    if (!cuda_mmq_supported(w->type, w->k))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmq: type %s with row length %lld",
                       qtype_name(w->type), (long long)w->k);
    smelt_status st = cuda_mmq_quantize(x, w->k, n, scratch, stream, e);
    if (st) return st;
    return cuda_mmq_pre(w, n, y, scratch, accumulate, CUDA_MMQ_TILE_AUTO, stream, e);
}
