/* Quantized matrix x 2..64 token rows on the tensor cores. See cuda_mmb.h; the bytes and
 * instructions per weight, the ceilings and why f16 rather than int8 MMA are in
 * docs/cuda-backend.md ("Small-batch tensor-core matmul").
 *
 * Work split. A block is 4 warps over 64 weight rows (a warp: one 16-row m16 tile) and one
 * range of K super-blocks; the grid is (row tiles) x (K splits), the split count chosen from
 * (rows, k, SMs) only, so that about 4 blocks per SM run whatever n is, with at most 8
 * super-blocks a block. Each warp keeps its 16 rows x 8*NT tokens of f32 accumulators in
 * registers over its whole K range. A block that shares its row tile with other K splits
 * writes its partial tile (fragment order, coalesced float4) to the scratch and counts
 * itself in the context's counters; the last to arrive adds the partials in split order (the
 * same bits whoever is last), stores y and zeroes the counter again, so a captured graph
 * replays.
 *
 * Activations. Up to 8 token rows (NT = 1) the block converts its whole K range of x (f32)
 * itself into shared memory (at most 8 x 4 KB; four super-blocks' loads in flight at a
 * time), one barrier, and the warps then run their range without another: one launch a
 * product. Above 8 rows a conversion launch writes the
 * f16 activations (fragment order) once and each block stages them super-block by
 * super-block (cp.async, two stages, a barrier each). Each warp keeps two super-blocks of
 * weights in flight (even and odd ones in two register sets, each refilled right after its
 * math).
 *
 * Weights: lane (g, t) of a warp (g = lane >> 2, t = lane & 3) owns rows g and g + 8 of the
 * warp's tile. Per 256-wide K slice ("super-block", eight blocks of the 32-wide types) it
 * loads its 16-byte pieces of both rows with ld.global.v4 (the four lanes of a row take
 * complementary pieces, so a warp instruction reads whole 32-byte sectors of 8 rows: 64
 * contiguous bytes a row, or Q6_K's bytes 0-31 and 64-95), plus the scale words the pieces
 * need (one instruction reads 8 rows x 16 contiguous bytes, or less); the next super-block's loads are issued before the
 * current one's math, and the first ones before griddepcontrol.wait. Nothing goes through
 * shared memory but the activations. Per type (mmb_fmt<T>; layouts: cuda_mmv.cu,
 * cuda_qtypes.cuh), with loads per lane per row and super-block:
 *   Q4_K  128 B nibbles (byte 32c + i, i < 32: K 64c + i low, 64c + 32 + i high): pieces t
 *         and 4 + t; the 16-byte scale record. 2 x 16 B + 16 B.
 *   Q5_K  Q4_K's nibbles and pieces, and the words of fifth bits for them (word P: bit i =
 *         byte i's low nibble, 16 + i its high one): words t, 4 + t; scale-pair words t >> 1
 *         and 2 + (t >> 1); {d, dmin}. 2 x 16 B + 5 x 4 B.
 *   Q6_K  ql[128], qh[64] as GGUF: ql pieces 4a + h and 4a + h + 2 (a = t >> 1, h = t & 1;
 *         K 128a + 32L + 16h + i low nibble, + 64 high) and qh piece t, which holds exactly
 *         their 2-bit fields (bits 2L, 4 + 2L); 8 of the 16 int8 scales (8a..8a+7); d.
 *         3 x 16 B + 8 B + 2 B.
 *   Q8_0  256 int8: pieces 4L + t (L = 0..3, K 64L + 16t + i); the 8 f16 scales.
 *         4 x 16 B + 16 B.
 *   Q4_0  eight 16-byte blocks (byte j: K j low nibble, j + 16 high): blocks t and 4 + t;
 *         the 8 f16 scales. 2 x 16 B + 16 B.
 *
 * Fragments (PTX ISA, mma.m16n8k16, f16): A a0 = row g, k {2t, 2t+1}; a1 = row g+8, same k;
 * a2 = row g, k {2t+8, 2t+9}; a3 = row g+8, same k. B b0 = k {2t, 2t+1}, token g; b1 = k
 * {2t+8, 2t+9}. The sum over k does not care how the 16 mma k slots map to real K
 * positions, as long as A and B agree, so the kernel picks the map its loads make cheap.
 * In every type a 32-bit word of a lane's piece holds four consecutive K positions kb..kb+3
 * (in its bytes, or in their low nibbles, the high nibbles holding another run); one LOP3
 * (0x000f000f, 0x00f000f0) or PRMT turns bytes 0 and 2 into an f16x2 and the word shifted by
 * 8 gives bytes 1 and 3, so slots {2t, 2t+1} stand for K {kb, kb+2} and {2t+8, 2t+9} for
 * {kb+1, kb+3}. Step st (0..15) of a super-block, lane t, its word's kb (mmb_fmt<T>::kb):
 *   Q4_K, Q5_K  st = 8L + 2wd + h:  kb = 64(2L + (t >> 1)) + 32h + 16(t & 1) + 4wd
 *   Q6_K        st = 8L + 2wd + h:  kb = 128(t >> 1) + 64h + 32L + 16(t & 1) + 4wd
 *   Q4_0        st = 8L + 2wd + h:  kb = 32(4L + t) + 16h + 4wd
 *   Q8_0        st = 4L + wd:       kb = 64L + 16t + 4wd
 * (L: the lane's piece, wd: the word in it, h: low or high nibbles.) The conversion kernel
 * writes the f16 activations in exactly that order (per token, per super-block, per step:
 * 16 values in slot order), so ldmatrix.x4 hands each lane its B fragments of two steps
 * (2sp, 2sp + 1) at once: the two nibbles of one word, or (Q8_0) two words of one piece.
 *
 * Dequantization (cuda_mma.cuh's dq_* helpers and Q4_K's own lines; mmq's operations where it
 * has the type): the integer reaches f16 exactly through the magic number 1024 (a nibble in
 * bits 4..7 gives 1024 + 16q, and v/16 - 64 is exact), then one f16 operation with the f16
 * scale, so each weight is rounded once: Q4_K, Q5_K q * f16(d*sc) - f16(dmin*m) (one FMA);
 * Q6_K (q - 32) * f16(d*sc); Q8_0 q * d; Q4_0 (q - 8) * d. Q6_K's and Q8_0's are cuda_mmq's
 * values to the bit (the same operations); Q5_K and Q4_0 have no mmq kernel. Q5_K's fifth
 * bits go into place by a multiply: (bits & 15) * 0x00040010 puts bits 0 and 2 at 4 and 20.
 *
 * Shared memory: per super-block 8*NT tokens x 528 B (256 f16 + 16 B pad: the 8 rows of an
 * ldmatrix matrix fall in distinct banks); the block's whole range (NT = 1) or 2 stages.
 *
 * Measurement switches (1-8 rows; written 2026-12-08 and run only on the CUDA emulator, no GPU
 * being lent: docs/cuda-backend.md, thirtieth session; the next GPU session measures them,
 * makes the winner the only path and deletes the rest): SMELT_MMB_R=N, N row tiles a block
 * sharing one conversion of x; SMELT_MMB_ITEMS=N, K ranges of N super-blocks over a
 * persistent grid of SMELT_MMB_BPS (default 4) blocks an SM; SMELT_MMB_PF=N, each tile's
 * weights asked of L2 (cp.async.bulk.prefetch) N super-blocks ahead. Any of them runs
 * mmb1_kernel; unset, the launches are those of mmb_kernel alone. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_glu.cuh"
#include "backend/cuda/cuda_mma.cuh"

extern "C" {
#include "backend/cuda/cuda_mmb.h"
#include "quant/quant.h"
}

#define MMB_THREADS 128
#define MMB_BM 64           /* weight rows per block: 4 warps x 16 */
#define MMB_XS 528          /* shared bytes per token per stage */
#define MMB_BLOCKS_PER_SM 4 /* the K split aims at this many blocks per SM */
#define MMB_KR_MAX 8        /* super-blocks a block takes at most (shared memory at 1..8 rows) */

/* One matrix of a launch: its split-layout weights (cuda_qweight q, s, d). */
struct mmb_w {
    const unsigned char *q, *s, *d;
};

/* A launch: CUDA_MMB_MATS matrices at most, of one type and row length, on one input; the row
 * tiles of matrix i are tile0[i] .. tile0[i + 1] - 1 of the grid's (unused matrices: empty
 * ranges at the end). */
struct mmb_args {
    mmb_w w[CUDA_MMB_MATS];
    float *y[CUDA_MMB_MATS];   /* (n, rows[i]) */
    int rows[CUDA_MMB_MATS];
    int tile0[CUDA_MMB_MATS + 1];
    const float *x;            /* (n, k) f32 activations (the conversion's input) */
    const __half *xp;          /* (8 NT, k) f16 activations, fragment order (more than 8 rows) */
    float *part;               /* partial tiles: (row tile, split, thread, NT float4) */
    int *cnt;                  /* one counter per row tile (the context's, zero between calls) */
    int k, n, nsb, kr, ks, accumulate;
    /* measurement switches (mmb1_kernel, file comment): the launch's row tiles; row tiles a
     * block; 1: a persistent grid of item ranges; super-blocks of weights asked of L2 ahead */
    int tiles, rt, items, pf;
    int glu; /* gate and up (matrices 0 and 1): 1 + enum glu_act, y[0] = act(gate) * up; 0: plain */
};

/* The matrix of row tile bx, and the selection of a per-matrix argument by constant indices
 * (a dynamic index would copy the arguments to local memory). */
static_assert(CUDA_MMB_MATS == 3, "mmb_mat and mmb_pick select among 3");
static __device__ __forceinline__ int mmb_mat(const mmb_args &a, int bx) {
    return (bx >= a.tile0[1]) + (bx >= a.tile0[2]);
}
template <class T, int N> static __device__ __forceinline__ T mmb_pick(const T (&v)[N], int m) {
    static_assert(N >= CUDA_MMB_MATS, "one entry per matrix");
    return m == 0 ? v[0] : m == 1 ? v[1] : v[2];
}

/* ------------------------------------------------------------ weight types ---- */

/* Per type (file comment): kb(st, t), the first of the K positions {kb, kb+1, kb+2, kb+3}
 * that lane t's word of step st holds (slots {2t, 2t+1} = K {kb, kb+2}, {2t+8, 2t+9} =
 * K {kb+1, kb+3}); src, the lane's row pointers, and raw, its registers of one
 * super-block (rows a = g and b = g + 8); load, the next super-block's loads; compute, the
 * super-block's 8 step pairs of dequantization and mma. */
template <uint32_t T> struct mmb_fmt;

static __device__ __forceinline__ uint32_t word_of(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* The B fragments of steps 2sp and 2sp + 1 of the super-block for the NT token tiles, one
 * ldmatrix.x4 each (xs: the lane's address of tile 0, step 2sp), and the mma of step 2sp + h
 * with A fragment f. A type dequantizes step 2sp's fragment, runs its mma, then step 2sp + 1's
 * (one fragment live at a time: Q4_K 79 registers at NT = 1 rather than 86; Q6_K makes both
 * first, as the other order spilled at NT = 2). */
template <int NT> static __device__ __forceinline__ void ldsm_pair(uint32_t (&b)[NT][4], uint32_t xs) {
#pragma unroll
    for (int j = 0; j < NT; j++)
        ldsm_x4(b[j], xs + j * 8 * MMB_XS);
}

template <int NT>
static __device__ __forceinline__ void mma_step(float (&acc)[NT][4], const uint32_t (&f)[4], const uint32_t (&b)[NT][4],
                                                int h) {
#pragma unroll
    for (int j = 0; j < NT; j++)
        mma_f16(acc[j], f, b[j][2 * h], b[j][2 * h + 1]);
}

/* Q4_K / Q5_K: the f16x2 {d*sc, d*sc} and {-dmin*m, -dmin*m} of sub-blocks 2c + h, c = 2L +
 * (t >> 1), from {d, dmin} and the 24-bit fields of pairs c (L = 0, 1): one rounding each,
 * as cuda_mmq's scale table. */
static __device__ __forceinline__ void kq_scales(uint32_t dmin_d, const uint32_t (&pl)[2], uint32_t (&sc)[2][2],
                                                 uint32_t (&mn)[2][2]) {
    const uint32_t dm = dmin_d ^ 0x80000000u; /* {d, -dmin} */
#pragma unroll
    for (int L = 0; L < 2; L++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t f = pl[L] >> (12 * h);                                /* sub-block 2c + h */
            const uint32_t sm = (f & 0x3fu) | ((f << 10) & 0x003f0000u) | MAGIC; /* 1024 + {sc, m} */
            const uint32_t r2 = h2_mul(h2_sub(sm, H_1024), dm);                 /* {d*sc, -dmin*m} */
            sc[L][h] = __byte_perm(r2, r2, 0x1010);
            mn[L][h] = __byte_perm(r2, r2, 0x3232);
        }
}

/* Q4_K: q = 128 B of nibbles per super-block (byte 32c + i: K 64c + i low, 64c + 32 + i
 * high), s = 16 B: {d, dmin}, then the 6-bit scale/min pairs (cuda_mmv.cu's repack). Lane t
 * loads pieces t and 4 + t of each row (c = 2L + (t >> 1), i = 16 (t & 1) + 4 wd + j). */
template <> struct mmb_fmt<QT_Q4_K> {
    static constexpr int QB = 128;
    static __device__ __forceinline__ int kb(int st, int t) {
        const int L = st >> 3, wd = (st >> 1) & 3, h = st & 1;
        return 64 * (2 * L + (t >> 1)) + 32 * h + 16 * (t & 1) + 4 * wd;
    }
    struct src {
        const uint4 *q[2], *s[2];
    };
    struct raw {
        uint4 q[2][2], s[2]; /* [row][piece L], [row] */
    };
    static __device__ __forceinline__ src init(const mmb_args &a, const mmb_w &w, const long long (&r)[2], int t) {
        src p;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            p.q[i] = (const uint4 *)w.q + r[i] * a.nsb * 8 + t;
            p.s[i] = (const uint4 *)w.s + r[i] * a.nsb;
        }
        return p;
    }
    static __device__ __forceinline__ void load(raw &w, const src &p, int s) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            w.q[i][0] = p.q[i][s * 8];
            w.q[i][1] = p.q[i][s * 8 + 4];
            w.s[i] = p.s[i][s];
        }
    }
    template <int NT>
    static __device__ __forceinline__ void compute(float (&acc)[NT][4], const raw &w, uint32_t xa, int t) {
        uint32_t sc[2][2][2], mn[2][2][2]; /* [row][L][h] */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            /* words 1..3 = pairs 0..2 in their low 24 bits, pair 3 in their top bytes */
            const uint4 v = w.s[i];
            const uint32_t p3 = (v.y >> 24) | ((v.z >> 24) << 8) | ((v.w >> 24) << 16);
            const uint32_t pl[2] = {(t >> 1) ? v.z : v.y, (t >> 1) ? p3 : v.w};
            kq_scales(v.x, pl, sc[i], mn[i]);
        }
#pragma unroll
        for (int L = 0; L < 2; L++)
#pragma unroll
            for (int wd = 0; wd < 4; wd++) {
                uint32_t b[NT][4];
                ldsm_pair<NT>(b, xa + (4 * L + wd) * 64);
                const uint32_t A = word_of(w.q[0][L], wd), A8 = A >> 8, B = word_of(w.q[1][L], wd), B8 = B >> 8;
                uint32_t f[4];
                /* low nibbles: 1024 + q, q exact, then one rounding of q * d*sc - dmin*m */
                f[0] = h2_fma(h2_sub(and_or<0x000f000fu>(A, MAGIC), H_1024), sc[0][L][0], mn[0][L][0]);
                f[1] = h2_fma(h2_sub(and_or<0x000f000fu>(B, MAGIC), H_1024), sc[1][L][0], mn[1][L][0]);
                f[2] = h2_fma(h2_sub(and_or<0x000f000fu>(A8, MAGIC), H_1024), sc[0][L][0], mn[0][L][0]);
                f[3] = h2_fma(h2_sub(and_or<0x000f000fu>(B8, MAGIC), H_1024), sc[1][L][0], mn[1][L][0]);
                mma_step<NT>(acc, f, b, 0);
                /* high nibbles: 1024 + 16 q, q = v / 16 - 64 exactly */
                f[0] = h2_fma(h2_fma(and_or<0x00f000f0u>(A, MAGIC), H_SIXTEENTH, H_M64), sc[0][L][1], mn[0][L][1]);
                f[1] = h2_fma(h2_fma(and_or<0x00f000f0u>(B, MAGIC), H_SIXTEENTH, H_M64), sc[1][L][1], mn[1][L][1]);
                f[2] = h2_fma(h2_fma(and_or<0x00f000f0u>(A8, MAGIC), H_SIXTEENTH, H_M64), sc[0][L][1], mn[0][L][1]);
                f[3] = h2_fma(h2_fma(and_or<0x00f000f0u>(B8, MAGIC), H_SIXTEENTH, H_M64), sc[1][L][1], mn[1][L][1]);
                mma_step<NT>(acc, f, b, 1);
            }
    }
};

/* Q5_K: q = 160 B per super-block: Q4_K's 128 B of nibbles, then 8 words of fifth bits
 * (word P for nibble piece P: bit i for its low nibbles' byte i, bit 16 + i for the high
 * ones'); s = 4 words, word c = the 24-bit field of sub-block pair c; d = {d, dmin}
 * (cuda_qtypes.cuh). Q4_K's pieces and K order; per row also words t and 4 + t of the
 * fifth bits, pairs t >> 1 and 2 + (t >> 1) of the scales, and d. */
template <> struct mmb_fmt<QT_Q5_K> {
    static constexpr int QB = 160;
    static __device__ __forceinline__ int kb(int st, int t) { return mmb_fmt<QT_Q4_K>::kb(st, t); }
    struct src {
        const uint4 *q[2];
        const uint32_t *h[2], *s[2], *d[2];
    };
    struct raw {
        uint4 q[2][2];
        uint32_t h[2][2], s[2][2], d[2];
    };
    static __device__ __forceinline__ src init(const mmb_args &a, const mmb_w &w, const long long (&r)[2], int t) {
        src p;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            p.q[i] = (const uint4 *)w.q + r[i] * a.nsb * 10 + t;
            p.h[i] = (const uint32_t *)w.q + r[i] * a.nsb * 40 + 32 + t;
            p.s[i] = (const uint32_t *)w.s + r[i] * a.nsb * 4 + (t >> 1);
            p.d[i] = (const uint32_t *)w.d + r[i] * a.nsb;
        }
        return p;
    }
    static __device__ __forceinline__ void load(raw &w, const src &p, int s) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            w.q[i][0] = p.q[i][s * 10];
            w.q[i][1] = p.q[i][s * 10 + 4];
            w.h[i][0] = p.h[i][s * 40];
            w.h[i][1] = p.h[i][s * 40 + 4];
            w.s[i][0] = p.s[i][s * 4];
            w.s[i][1] = p.s[i][s * 4 + 2];
            w.d[i] = p.d[i][s];
        }
    }
    template <int NT>
    static __device__ __forceinline__ void compute(float (&acc)[NT][4], const raw &w, uint32_t xa, int) {
        uint32_t sc[2][2][2], mn[2][2][2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t pl[2] = {w.s[i][0], w.s[i][1]};
            kq_scales(w.d[i], pl, sc[i], mn[i]);
        }
#pragma unroll
        for (int L = 0; L < 2; L++)
#pragma unroll
            for (int wd = 0; wd < 4; wd++) {
                uint32_t b[NT][4], f[4], hi[2][2];
                ldsm_pair<NT>(b, xa + (4 * L + wd) * 64);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    uint32_t lo[2];
                    dq_q5_k(word_of(w.q[i][L], wd), w.h[i][L] >> (4 * wd), lo, hi[i]);
                    f[i] = h2_fma(lo[0], sc[i][L][0], mn[i][L][0]);
                    f[2 + i] = h2_fma(lo[1], sc[i][L][0], mn[i][L][0]);
                }
                mma_step<NT>(acc, f, b, 0);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    f[i] = h2_fma(hi[i][0], sc[i][L][1], mn[i][L][1]);
                    f[2 + i] = h2_fma(hi[i][1], sc[i][L][1], mn[i][L][1]);
                }
                mma_step<NT>(acc, f, b, 1);
            }
    }
};

/* Q6_K: q = 192 B per super-block, ql[128] then qh[64] as GGUF (ql byte 64a + 32L + i: K
 * 128a + 32L + i low nibble, + 64 high; their top 2 bits: qh byte 32a + i, bits 2L and
 * 4 + 2L), s = 16 int8 scales (one per 16 K), d = f16 per super-block. Lane t (a = t >> 1,
 * h = t & 1) loads ql pieces 4a + h + 2L (L = 0, 1) and qh piece t, which holds exactly
 * their top bits, 8 scale bytes 8a.. and d. */
template <> struct mmb_fmt<QT_Q6_K> {
    static constexpr int QB = 192;
    static __device__ __forceinline__ int kb(int st, int t) {
        const int L = st >> 3, wd = (st >> 1) & 3, h = st & 1;
        return 128 * (t >> 1) + 64 * h + 32 * L + 16 * (t & 1) + 4 * wd;
    }
    struct src {
        const uint4 *q[2];
        const uint2 *s[2];
        const unsigned short *d[2];
        int oh; /* qh piece 8 + t relative to the first ql piece */
    };
    struct raw {
        uint4 ql[2][2], qh[2];
        uint2 s[2];
        uint32_t d[2];
    };
    static __device__ __forceinline__ src init(const mmb_args &a, const mmb_w &w, const long long (&r)[2], int t) {
        src p;
        const int pl = 4 * (t >> 1) + (t & 1);
        p.oh = 8 + t - pl;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            p.q[i] = (const uint4 *)w.q + r[i] * a.nsb * 12 + pl;
            p.s[i] = (const uint2 *)w.s + r[i] * a.nsb * 2 + (t >> 1);
            p.d[i] = (const unsigned short *)w.d + r[i] * a.nsb;
        }
        return p;
    }
    static __device__ __forceinline__ void load(raw &w, const src &p, int s) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            w.ql[i][0] = p.q[i][s * 12];
            w.ql[i][1] = p.q[i][s * 12 + 2];
            w.qh[i] = p.q[i][s * 12 + p.oh];
            w.s[i] = p.s[i][s * 2];
            w.d[i] = p.d[i][s];
        }
    }
    template <int NT>
    static __device__ __forceinline__ void compute(float (&acc)[NT][4], const raw &w, uint32_t xa, int t) {
        /* scale of step (L, wd, h'): byte h + 2L + 4h' of the 8 (16-chunk 8a + h + 2L + 4h');
         * {sc of L = 0, L = 1} of a word in one f16x2: int8 -> f16 1152 + sc -> sc, times d */
        const uint32_t sel = (t & 1) ? 0x4341u : 0x4240u;
        uint32_t sc[2][2][2]; /* [row][L][h'] */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t d2 = __byte_perm(w.d[i], 0, 0x1010);
#pragma unroll
            for (int hp = 0; hp < 2; hp++) {
                const uint32_t v = __byte_perm((hp ? w.s[i].y : w.s[i].x) ^ 0x80808080u, 0x64u, sel);
                const uint32_t r2 = h2_mul(h2_sub(v, H_1152), d2);
                sc[i][0][hp] = __byte_perm(r2, r2, 0x1010);
                sc[i][1][hp] = __byte_perm(r2, r2, 0x3232);
            }
        }
#pragma unroll
        for (int L = 0; L < 2; L++)
#pragma unroll
            for (int wd = 0; wd < 4; wd++) {
                /* both steps' fragments first (ptxas spilled 4 bytes at NT = 2 the other way) */
                uint32_t b[NT][4], f0[4], f1[4];
                ldsm_pair<NT>(b, xa + (4 * L + wd) * 64);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    uint32_t lo[2], hi[2];
                    const uint32_t ql = word_of(w.ql[i][L], wd), qh = word_of(w.qh[i], wd);
                    if (L) dq_q6_k<1>(ql, qh, lo, hi);
                    else dq_q6_k<0>(ql, qh, lo, hi);
                    f0[i] = h2_mul(lo[0], sc[i][L][0]);
                    f0[2 + i] = h2_mul(lo[1], sc[i][L][0]);
                    f1[i] = h2_mul(hi[0], sc[i][L][1]);
                    f1[2 + i] = h2_mul(hi[1], sc[i][L][1]);
                }
                mma_step<NT>(acc, f0, b, 0);
                mma_step<NT>(acc, f1, b, 1);
            }
    }
};

/* Q8_0: q = the int8 weights row-major, s = f16 d per 32 (a super-block's 8 in 16 B). Lane
 * t loads pieces 4L + t (L = 0..3: K 64L + 16t.., block 2L + (t >> 1)) and the 8 scales. */
template <> struct mmb_fmt<QT_Q8_0> {
    static constexpr int QB = 256;
    static __device__ __forceinline__ int kb(int st, int t) { return 64 * (st >> 2) + 16 * t + 4 * (st & 3); }
    struct src {
        const uint4 *q[2], *s[2];
    };
    struct raw {
        uint4 q[2][4], s[2];
    };
    static __device__ __forceinline__ src init(const mmb_args &a, const mmb_w &w, const long long (&r)[2], int t) {
        src p;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            p.q[i] = (const uint4 *)w.q + r[i] * a.nsb * 16 + t;
            p.s[i] = (const uint4 *)w.s + r[i] * a.nsb;
        }
        return p;
    }
    static __device__ __forceinline__ void load(raw &w, const src &p, int s) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
#pragma unroll
            for (int L = 0; L < 4; L++)
                w.q[i][L] = p.q[i][s * 16 + 4 * L];
            w.s[i] = p.s[i][s];
        }
    }
    template <int NT>
    static __device__ __forceinline__ void compute(float (&acc)[NT][4], const raw &w, uint32_t xa, int t) {
        const uint32_t sel = (t >> 1) ? 0x3232u : 0x1010u; /* block 2L + (t >> 1): half of word L */
#pragma unroll
        for (int L = 0; L < 4; L++) {
            const uint32_t d2[2] = {__byte_perm(word_of(w.s[0], L), 0, sel), __byte_perm(word_of(w.s[1], L), 0, sel)};
#pragma unroll
            for (int p = 0; p < 2; p++) {
                uint32_t b[NT][4], f[4];
                ldsm_pair<NT>(b, xa + (2 * L + p) * 64);
#pragma unroll
                for (int h = 0; h < 2; h++) { /* step 4L + 2p + h: word 2p + h */
#pragma unroll
                    for (int i = 0; i < 2; i++)
                        dq_q8_0(word_of(w.q[i][L], 2 * p + h), d2[i], f[i], f[2 + i]);
                    mma_step<NT>(acc, f, b, h);
                }
            }
        }
    }
};

/* Q4_0: q = 16 B per 32-block as GGUF (byte j: K j low nibble, j + 16 high), s = f16 d per
 * block (a super-block's 8 in 16 B). Lane t loads blocks t and 4 + t (Q4_K's pieces) and the
 * 8 scales. */
template <> struct mmb_fmt<QT_Q4_0> {
    static constexpr int QB = 128;
    static __device__ __forceinline__ int kb(int st, int t) {
        const int L = st >> 3, wd = (st >> 1) & 3, h = st & 1;
        return 32 * (4 * L + t) + 16 * h + 4 * wd;
    }
    using src = mmb_fmt<QT_Q4_K>::src;
    using raw = mmb_fmt<QT_Q4_K>::raw;
    static __device__ __forceinline__ src init(const mmb_args &a, const mmb_w &w, const long long (&r)[2], int t) {
        return mmb_fmt<QT_Q4_K>::init(a, w, r, t);
    }
    static __device__ __forceinline__ void load(raw &w, const src &p, int s) { mmb_fmt<QT_Q4_K>::load(w, p, s); }
    template <int NT>
    static __device__ __forceinline__ void compute(float (&acc)[NT][4], const raw &w, uint32_t xa, int t) {
        const uint32_t sel = (t & 1) ? 0x3232u : 0x1010u; /* block 4L + t: half t & 1 of word 2L + (t >> 1) */
#pragma unroll
        for (int L = 0; L < 2; L++) {
            uint32_t d2[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                d2[i] = __byte_perm(L ? ((t >> 1) ? w.s[i].w : w.s[i].z) : ((t >> 1) ? w.s[i].y : w.s[i].x), 0, sel);
#pragma unroll
            for (int wd = 0; wd < 4; wd++) {
                uint32_t b[NT][4], f[4];
                ldsm_pair<NT>(b, xa + (4 * L + wd) * 64);
#pragma unroll
                for (int i = 0; i < 2; i++)
                    dq_q4_0<0>(word_of(w.q[i][L], wd), d2[i], f[i], f[2 + i]);
                mma_step<NT>(acc, f, b, 0);
#pragma unroll
                for (int i = 0; i < 2; i++)
                    dq_q4_0<1>(word_of(w.q[i][L], wd), d2[i], f[i], f[2 + i]);
                mma_step<NT>(acc, f, b, 1);
            }
        }
    }
};

/* ------------------------------------------------------------------ kernels ---- */

static __device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    lo = fabsf(lo) > 65504.0f ? copysignf(65504.0f, lo) : lo; /* clamp; NaN stays NaN */
    hi = fabsf(hi) > 65504.0f ? copysignf(65504.0f, hi) : hi;
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | ((uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16);
}

/* The 16 f32 activations of step st of super-block s for token row tok of x (n, k) (zeros
 * past row n), in type T's fragment order (file comment): v[t] = K kb(st, t) .. + 3. */
template <uint32_t T>
static __device__ __forceinline__ void load_step(const float *x, int k, int n, int tok, int s, int st, float4 (&v)[4]) {
    const float *src = x + (long long)tok * k + s * 256;
#pragma unroll
    for (int t = 0; t < 4; t++)
        v[t] = tok < n ? *(const float4 *)(src + mmb_fmt<T>::kb(st, t)) : make_float4(0.f, 0.f, 0.f, 0.f);
}

/* load_step's values as f16, slots 2t, 2t+1 (K kb, kb+2) then 2t+8, 2t+9 (K kb+1, kb+3). */
static __device__ __forceinline__ void pack_step(const float4 (&v)[4], uint4 &lo, uint4 &hi) {
    lo = make_uint4(pack_h2(v[0].x, v[0].z), pack_h2(v[1].x, v[1].z), pack_h2(v[2].x, v[2].z), pack_h2(v[3].x, v[3].z));
    hi = make_uint4(pack_h2(v[0].y, v[0].w), pack_h2(v[1].y, v[1].w), pack_h2(v[2].y, v[2].w), pack_h2(v[3].y, v[3].w));
}

/* More than 8 token rows: x (n, k) f32 -> xp (npad, k) f16 in type T's fragment order, rows
 * n..npad-1 zero, for the blocks to stage. One thread per (token, super-block, step). */
template <uint32_t T>
static __global__ void mmb_convert_kernel(const float *x, __half *xp, int k, int n, long long items) {
    pdl_wait();
    pdl_trigger();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= items) return;
    const int nsb = k >> 8, st = (int)(i & 15);
    const long long ts = i >> 4;
    const int tok = (int)(ts / nsb), s = (int)(ts - (long long)tok * nsb);
    uint4 *dst = (uint4 *)(xp + (long long)tok * k + s * 256 + st * 16);
    float4 v[4];
    load_step<T>(x, k, n, tok, s, st, v);
    pack_step(v, dst[0], dst[1]);
}

/* Up to 8 token rows: the block converts its whole K range s0..s1-1 of x itself, straight
 * into shared memory (super-block i of the range at stage i), one thread per (token, step):
 * 128 = 8 x 16. Four super-blocks' loads are issued before their stores (a store would
 * otherwise hold back the next load: one L2 round trip per super-block). */
template <uint32_t T, int R>
static __device__ __forceinline__ void convert_range(const mmb_args &a, unsigned char *smem, int s0, int s1, int tid) {
    const int tok = tid >> 4, st = tid & 15;
    unsigned char *dst = smem + tok * MMB_XS + st * 32;
    for (int s = s0; s < s1; s += R) {
        float4 v[R][4];
#pragma unroll
        for (int r = 0; r < R; r++)
            if (s + r < s1) load_step<T>(a.x, a.k, a.n, tok, s + r, st, v[r]);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (s + r < s1) {
                uint4 *d = (uint4 *)(dst + (s + r - s0) * 8 * MMB_XS);
                pack_step(v[r], d[0], d[1]);
            }
    }
}

/* Copies super-block s of the 8 NT tokens' f16 activations into a stage. */
template <int NT>
static __device__ __forceinline__ void copy_x(const mmb_args &a, unsigned char *dst, int s, int tid) {
#pragma unroll
    for (int c = tid; c < 8 * NT * 32; c += MMB_THREADS) {
        const int tok = c >> 5, u = c & 31;
        cp_async16(dst + tok * MMB_XS + u * 16, a.xp + (long long)tok * a.k + s * 256 + u * 8);
    }
}

/* y = (or +=) v for this lane's outputs: rows row and row + 8 of matrix m, tokens 8j + 2t
 * (+1). With a.glu, warps 2 and 3 hold up's sums where warps 0 and 1 hold gate's for the same
 * rows and lanes: they hand them over through shared memory (after a barrier: the
 * activations there are no longer read) and warps 0 and 1 store act(gate) * up. Every thread
 * of the block calls it. */
template <int NT, bool GLU>
static __device__ __forceinline__ void store_y(const mmb_args &a, int m, const float (&v)[NT][4], int row, int t,
                                               unsigned char *xbuf, int tid) {
    const int rows = mmb_pick(a.rows, m);
    float *y = mmb_pick(a.y, m);
    float4 *xch = (float4 *)xbuf + (tid & 63) * NT;
    if (GLU) {
        __syncthreads();
        if (tid >= 64)
#pragma unroll
            for (int j = 0; j < NT; j++)
                xch[j] = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
        __syncthreads();
        if (tid >= 64) return;
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float u[4] = {0, 0, 0, 0};
        if (GLU) {
            const float4 p = xch[j];
            u[0] = p.x;
            u[1] = p.y;
            u[2] = p.z;
            u[3] = p.w;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = row + 8 * (i >> 1), tok = 8 * j + 2 * t + (i & 1);
            if (r < rows && tok < a.n) {
                float *o = y + (long long)tok * rows + r;
                const float val = GLU ? glu_val(a.glu - 1, v[j][i], u[i]) : v[j][i];
                *o = a.accumulate ? *o + val : val;
            }
        }
    }
}

/* Blocks per SM the compiler must leave room for: 3 at 33-64 rows (two super-blocks in
 * flight took up to 222 registers, 2 blocks, without it; with it at most 32 bytes spill);
 * at 1-8 rows the blocks the split aims at (convert_range's four super-blocks of loads took
 * 125-147 registers, 3 blocks, without it; with 4 at most 128, and Q8_0's, Q6_K's and
 * Q5_K's GLU kernels spill 4-16 bytes). */
template <int NT> constexpr int mmb_min_blocks() {
    return NT == 8 ? 3 : NT == 1 ? MMB_BLOCKS_PER_SM : 1;
}

/* The matrix, its row count and this lane's first row for row tile tile. */
template <bool GLU>
static __device__ __forceinline__ void tile_geo(const mmb_args &a, int tile, int warp, int lane, int &m, int &row) {
    m = GLU ? warp >> 1 : mmb_mat(a, tile);
    row = GLU ? tile * 32 + (warp & 1) * 16 + (lane >> 2) : (tile - mmb_pick(a.tile0, m)) * MMB_BM + warp * 16 + (lane >> 2);
}

/* Asks L2 for super-blocks sA..sB-1 of row tile tile's weights (q and s; d, at most 4 bytes a
 * row and super-block, comes with the loads), one bulk prefetch a thread: thread tid takes the
 * tile's row tid & 63 (GLU: gate's 32, then up's), q for tid < 64, s for the others. */
template <uint32_t T, bool GLU>
static __device__ __forceinline__ void prefetch_tile(const mmb_args &a, int tile, int sA, int sB, int tid) {
    if (sA >= sB) return;
    const int pr = tid & 63;
    const int m = GLU ? pr >> 5 : mmb_mat(a, tile);
    const int row = GLU ? tile * 32 + (pr & 31) : (tile - mmb_pick(a.tile0, m)) * MMB_BM + pr;
    if (row >= mmb_pick(a.rows, m)) return;
    const mmb_w &w = mmb_pick(a.w, m);
    const long long first = (long long)row * a.nsb + sA;
    if (tid < 64) bulk_prefetch_l2(w.q + first * mmb_fmt<T>::QB, (uint32_t)(sB - sA) * mmb_fmt<T>::QB);
    else bulk_prefetch_l2(w.s + first * 16, (uint32_t)(sB - sA) * 16);
}

/* GLU: a.glu's launch (a template flag: its store's registers would otherwise spill in every
 * 33-64-row kernel). */
template <uint32_t T, int NT, bool GLU>
static __global__ void __launch_bounds__(MMB_THREADS, mmb_min_blocks<NT>()) mmb_kernel(const mmb_args a) {
    using F = mmb_fmt<T>;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int last;
    constexpr int STAGE = 8 * NT * MMB_XS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const int s0 = blockIdx.y * a.kr, s1 = min(s0 + a.kr, a.nsb);
    /* matrix m and this lane's first row in it: a.glu: 32 rows a tile, gate's (warps 0, 1)
     * and up's (warps 2, 3) */
    const int m = GLU ? warp >> 1 : mmb_mat(a, blockIdx.x), rows = mmb_pick(a.rows, m);
    const int row = GLU ? (int)blockIdx.x * 32 + (warp & 1) * 16 + (lane >> 2)
                          : ((int)blockIdx.x - mmb_pick(a.tile0, m)) * MMB_BM + warp * 16 + (lane >> 2);
    /* rows past the matrix read the last one (their results are never stored) */
    const long long rr[2] = {min(row, rows - 1), min(row + 8, rows - 1)};
    const typename F::src src = F::init(a, mmb_pick(a.w, m), rr, t);
    /* PP: two super-blocks of weights in flight, w[0] holding the even ones of the range and
     * w[1] the odd ones, each refilled right after its math (no register copy waits on a
     * load): at 33-64 rows 4096x4096 Q4_K 46 -> 33 us (H200). It costs registers, and so
     * resident warps: up to 32 rows that lost more than the depth won (1-8 rows 14336x4096
     * 17.8 -> 19.8 us); there w[1] is the next super-block, copied into w[0]. */
    constexpr bool PP = NT == 8;
    typename F::raw w[2];
    F::load(w[0], src, s0); /* weights only: before the wait (cuda_common.cuh) */
    if (PP && s0 + 1 < s1) F::load(w[1], src, s0 + 1);
    if (!PP) w[1] = w[0];
    pdl_wait();
    pdl_trigger();
    if (NT == 1) {
        convert_range<T, 4>(a, smem, s0, s1, tid);
        __syncthreads();
    } else {
        copy_x<NT>(a, smem, s0, tid);
        cp_commit();
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[j][i] = 0.0f;
    /* ldmatrix: lane 8i + r8 gives row (token) r8 of matrix i = {step 2sp + (i >> 1)} x {slots
     * 0-7, 8-15 (i & 1)} */
    const int mi = lane >> 3;
    const uint32_t xa = smem_u32(smem) + (lane & 7) * MMB_XS + (mi >> 1) * 32 + (mi & 1) * 16;
    for (int s = s0; s < s1; s += PP ? 2 : 1) {
#pragma unroll
        for (int h = 0; h < (PP ? 2 : 1); h++) {
            const int sh = s + h, i = sh - s0;
            if (sh >= s1) break;
            if (!PP && sh + 1 < s1) F::load(w[1], src, sh + 1);
            uint32_t xs;
            if (NT == 1) {
                xs = xa + i * STAGE; /* the whole range is in place: no barrier */
            } else {
                cp_wait<0>();    /* super-block sh's activations landed (this thread's copies) ... */
                __syncthreads(); /* ... everyone's; every warp is done with the other stage */
                if (sh + 1 < s1) copy_x<NT>(a, smem + ((i + 1) & 1) * STAGE, sh + 1, tid);
                cp_commit();
                xs = xa + (i & 1) * STAGE;
            }
            F::template compute<NT>(acc, w[h], xs, t);
            if (!PP) w[0] = w[1];
            else if (sh + 2 < s1) F::load(w[h], src, sh + 2);
        }
    }
    if (a.ks == 1) {
        store_y<NT, GLU>(a, m, acc, row, t, smem, tid);
        return;
    }
    const long long tile = blockIdx.x;
    float4 *wp = (float4 *)a.part + ((tile * a.ks + blockIdx.y) * MMB_THREADS + tid) * NT;
#pragma unroll
    for (int j = 0; j < NT; j++)
        wp[j] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    __threadfence(); /* this thread's partial is visible before the count goes up */
    __syncthreads();
    if (tid == 0) {
        const int before = atomicAdd(&a.cnt[tile], 1);
        last = before == a.ks - 1;
        if (last) a.cnt[tile] = 0; /* every split has counted: reset for the next call */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float sum[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            sum[j][i] = 0.0f;
    for (int kk = 0; kk < a.ks; kk++) { /* split order: independent of timing */
        if (kk == (int)blockIdx.y) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    sum[j][i] += acc[j][i];
            continue;
        }
        const float4 *rp = (const float4 *)a.part + ((tile * a.ks + kk) * MMB_THREADS + tid) * NT;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const float4 p = __ldcg(rp + j); /* L2: another SM wrote it */
            sum[j][0] += p.x;
            sum[j][1] += p.y;
            sum[j][2] += p.z;
            sum[j][3] += p.w;
        }
    }
    store_y<NT, GLU>(a, m, sum, row, t, smem, tid);
}

/* The 1-8-row kernel under the measurement switches (file comment): mmb_kernel's NT = 1 path
 * (its text kept, NT and PP constant) with several row tiles a block (a.rt > 1: x converted
 * once for all of them, the next tile's first weights loaded before this one's store), or a
 * persistent grid (a.items: block b takes items [bN/G, (b+1)N/G) of the N = tiles x ks
 * (split, tile) pairs in split-major order, converting x again only when the split
 * changes), and the weights asked of L2 a.pf super-blocks ahead of their loads (a.pf > 0). */
template <uint32_t T, bool GLU>
static __global__ void __launch_bounds__(MMB_THREADS, mmb_min_blocks<1>()) mmb1_kernel(const mmb_args a) {
    constexpr int NT = 1;
    using F = mmb_fmt<T>;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int last;
    constexpr int STAGE = 8 * NT * MMB_XS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    /* the block's items (tile, split), more than one only at 1-8 rows, where the activations
     * in shared memory serve every tile of a split */
    int it0, it1;
    if (NT == 1 && a.items) {
        const long long N = (long long)a.tiles * a.ks;
        it0 = (int)(N * blockIdx.x / gridDim.x);
        it1 = (int)(N * (blockIdx.x + 1) / gridDim.x);
        if (it0 >= it1) return;
    } else {
        const int tile0 = (int)blockIdx.x * (NT == 1 ? a.rt : 1);
        it0 = blockIdx.y * a.tiles + tile0;
        it1 = blockIdx.y * a.tiles + (NT == 1 ? min(tile0 + a.rt, a.tiles) : tile0 + 1);
    }
    int item = it0, split = it0 / a.tiles, tile = it0 - split * a.tiles;
    int s0 = split * a.kr, s1 = min(s0 + a.kr, a.nsb);
    /* GLU's exchange: past the activations at 1-8 rows (they serve the next tile) */
    unsigned char *xbuf = NT == 1 ? smem + a.kr * STAGE : smem;
    int m, row;
    tile_geo<GLU>(a, tile, warp, lane, m, row);
    /* rows past the matrix read the last one (their results are never stored) */
    long long rr[2] = {min(row, mmb_pick(a.rows, m) - 1), min(row + 8, mmb_pick(a.rows, m) - 1)};
    typename F::src src = F::init(a, mmb_pick(a.w, m), rr, t);
    const int pf = a.pf;
    if (pf > 0) prefetch_tile<T, GLU>(a, tile, s0 + 1, min(s0 + 1 + pf, s1), tid);
    /* PP: two super-blocks of weights in flight, w[0] holding the even ones of the range and
     * w[1] the odd ones, each refilled right after its math (no register copy waits on a
     * load): at 33-64 rows 4096x4096 Q4_K 46 -> 33 us (H200). It costs registers, and so
     * resident warps: up to 32 rows that lost more than the depth won (1-8 rows 14336x4096
     * 17.8 -> 19.8 us); there w[1] is the next super-block, copied into w[0]. */
    constexpr bool PP = NT == 8;
    typename F::raw w[2];
    F::load(w[0], src, s0); /* weights only: before the wait (cuda_common.cuh) */
    if (PP && s0 + 1 < s1) F::load(w[1], src, s0 + 1);
    if (!PP) w[1] = w[0];
    pdl_wait();
    pdl_trigger();
    if (NT == 1) {
        convert_range<T, 4>(a, smem, s0, s1, tid);
        __syncthreads();
    } else {
        copy_x<NT>(a, smem, s0, tid);
        cp_commit();
    }
    /* ldmatrix: lane 8i + r8 gives row (token) r8 of matrix i = {step 2sp + (i >> 1)} x {slots
     * 0-7, 8-15 (i & 1)} */
    const int mi = lane >> 3;
    const uint32_t xa = smem_u32(smem) + (lane & 7) * MMB_XS + (mi >> 1) * 32 + (mi & 1) * 16;
    for (;;) {
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[j][i] = 0.0f;
        for (int s = s0; s < s1; s += PP ? 2 : 1) {
#pragma unroll
            for (int h = 0; h < (PP ? 2 : 1); h++) {
                const int sh = s + h, i = sh - s0;
                if (sh >= s1) break;
                if (pf > 0 && sh + 1 + pf < s1) prefetch_tile<T, GLU>(a, tile, sh + 1 + pf, sh + 2 + pf, tid);
                if (!PP && sh + 1 < s1) F::load(w[1], src, sh + 1);
                uint32_t xs;
                if (NT == 1) {
                    xs = xa + i * STAGE; /* the whole range is in place: no barrier */
                } else {
                    cp_wait<0>();    /* super-block sh's activations landed (this thread's copies) ... */
                    __syncthreads(); /* ... everyone's; every warp is done with the other stage */
                    if (sh + 1 < s1) copy_x<NT>(a, smem + ((i + 1) & 1) * STAGE, sh + 1, tid);
                    cp_commit();
                    xs = xa + (i & 1) * STAGE;
                }
                F::template compute<NT>(acc, w[h], xs, t);
                if (!PP) w[0] = w[1];
                else if (sh + 2 < s1) F::load(w[h], src, sh + 2);
            }
        }
        /* the next tile's first weights go out before this one's store */
        const bool more = NT == 1 && item + 1 < it1;
        const int cur = tile, mc = m, rc = row, sp = split;
        bool newx = false;
        if (more) {
            item++;
            split = item / a.tiles;
            tile = item - split * a.tiles;
            newx = split != sp;
            s0 = split * a.kr;
            s1 = min(s0 + a.kr, a.nsb);
            tile_geo<GLU>(a, tile, warp, lane, m, row);
            rr[0] = min(row, mmb_pick(a.rows, m) - 1);
            rr[1] = min(row + 8, mmb_pick(a.rows, m) - 1);
            src = F::init(a, mmb_pick(a.w, m), rr, t);
            if (pf > 0) prefetch_tile<T, GLU>(a, tile, s0 + 1, min(s0 + 1 + pf, s1), tid);
            F::load(w[0], src, s0);
            w[1] = w[0];
        }
        if (a.ks == 1) {
            store_y<NT, GLU>(a, mc, acc, rc, t, xbuf, tid);
        } else {
            float4 *wp = (float4 *)a.part + (((long long)cur * a.ks + sp) * MMB_THREADS + tid) * NT;
#pragma unroll
            for (int j = 0; j < NT; j++)
                wp[j] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
            __threadfence(); /* this thread's partial is visible before the count goes up */
            __syncthreads();
            if (tid == 0) {
                const int before = atomicAdd(&a.cnt[cur], 1);
                last = before == a.ks - 1;
                if (last) a.cnt[cur] = 0; /* every split has counted: reset for the next call */
            }
            __syncthreads();
            if (last) {
                __threadfence();
                float sum[NT][4];
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        sum[j][i] = 0.0f;
                for (int kk = 0; kk < a.ks; kk++) { /* split order: independent of timing */
                    if (kk == sp) {
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int i = 0; i < 4; i++)
                                sum[j][i] += acc[j][i];
                        continue;
                    }
                    const float4 *rp = (const float4 *)a.part + (((long long)cur * a.ks + kk) * MMB_THREADS + tid) * NT;
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        const float4 p = __ldcg(rp + j); /* L2: another SM wrote it */
                        sum[j][0] += p.x;
                        sum[j][1] += p.y;
                        sum[j][2] += p.z;
                        sum[j][3] += p.w;
                    }
                }
                store_y<NT, GLU>(a, mc, sum, rc, t, xbuf, tid);
            }
        }
        if (!more) break;
        if (NT == 1 && newx) { /* another K range: its activations replace these */
            __syncthreads();
            convert_range<T, 1>(a, smem, s0, s1, tid);
            __syncthreads();
        }
    }
}

/* --------------------------------------------------------------- launchers ---- */

/* The launch shape of a product. */
struct mmb_plan {
    int rtiles, nsb, kr, ks, nt, rt, groups, pf, items;
    uint64_t xp_bytes, part_bytes;
};

static uint64_t align256(uint64_t v) {
    return (v + 255) & ~255ull;
}

static int64_t tiles_of(int64_t rows) {
    return (rows + MMB_BM - 1) / MMB_BM;
}

/* Token tiles of 8: 1, 2, 4 or 8 (the kernel's template). */
static int nt_of(int64_t n) {
    return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
}

/* rtiles: the launch's row tiles, every matrix's together. */
static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

static mmb_plan plan_of(const struct cuda_ctx *c, int64_t rtiles, int64_t k, int64_t n) {
    static const int env_rt = env_int("SMELT_MMB_R", 1), env_pf = env_int("SMELT_MMB_PF", 0),
                     env_bps = env_int("SMELT_MMB_BPS", MMB_BLOCKS_PER_SM), env_items = env_int("SMELT_MMB_ITEMS", 0);
    mmb_plan p;
    p.nsb = (int)(k / 256);
    p.rtiles = (int)rtiles;
    p.nt = nt_of(n);
    /* the split (kr, ks) from the 1-8-row grouping for every n, so that a switch keeps batch
     * invariance (test_cuda_mmb checks it under each) */
    const int rt = env_rt > 1 ? env_rt : 1;
    const int groups1 = (p.rtiles + rt - 1) / rt;
    p.pf = env_pf;
    const long long n_sm = c->n_sm > 0 ? c->n_sm : 132;
    long long want = (env_bps * n_sm + groups1 - 1) / groups1;
    if (want > p.nsb) want = p.nsb;
    if (want < (p.nsb + MMB_KR_MAX - 1) / MMB_KR_MAX) want = (p.nsb + MMB_KR_MAX - 1) / MMB_KR_MAX;
    if (want < 1) want = 1;
    p.kr = (int)((p.nsb + want - 1) / want);
    if (env_items > 0) p.kr = env_items < p.nsb ? env_items : p.nsb;
    p.ks = (p.nsb + p.kr - 1) / p.kr;
    p.items = p.nt == 1 && env_items > 0;
    p.rt = p.nt == 1 && !p.items ? rt : 1;
    p.groups = (p.rtiles + p.rt - 1) / p.rt;
    if (p.items) {
        const long long g = env_bps * n_sm, nitems = (long long)p.rtiles * p.ks;
        p.groups = (int)(g < nitems ? g : nitems);
    }
    p.xp_bytes = p.nt > 1 ? align256((uint64_t)(8 * p.nt) * (uint64_t)k * 2) : 0;
    p.part_bytes = p.ks > 1 ? (uint64_t)p.rtiles * p.ks * MMB_THREADS * p.nt * 16 : 0;
    return p;
}

extern "C" int cuda_mmb_supported(uint32_t type, int64_t k) {
    const bool typed = type == QT_Q4_K || type == QT_Q5_K || type == QT_Q6_K || type == QT_Q8_0 || type == QT_Q4_0;
    return typed && k > 0 && k % 256 == 0 && k <= (1 << 30);
}

extern "C" int cuda_mmb_splits(const struct cuda_ctx *ctx, int64_t rows, int64_t k) {
    if (rows < 1 || k < 256) return 1;
    return plan_of(ctx, tiles_of(rows), k, 1).ks;
}

extern "C" smelt_status cuda_mmb_scratch_bytes(const struct cuda_ctx *ctx, int64_t rows, int64_t k, int64_t n,
                                               uint64_t *bytes, struct err *e) {
    if (rows < 1 || k < 256 || n < 1 || n > CUDA_MMB_MAX_ROWS)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: scratch for %lld x %lld, %lld tokens (1..%d)",
                       (long long)rows, (long long)k, (long long)n, CUDA_MMB_MAX_ROWS);
    const mmb_plan p = plan_of(ctx, tiles_of(rows), k, n);
    *bytes = p.xp_bytes + p.part_bytes;
    return SMELT_OK;
}

/* The row tiles of a launch over count matrices: every matrix's together, or with glu
 * (gate and up of one shape) 32 rows of each a tile; -1 when they cannot share a launch. */
static int64_t launch_tiles(const struct cuda_qweight *const *w, int count, bool glu) {
    if (count < 1 || count > CUDA_MMB_MATS || (glu && count != 2) || !w[0]) return -1;
    int64_t tiles = 0;
    for (int i = 0; i < count; i++) {
        if (!w[i] || w[i]->type != w[0]->type || w[i]->k != w[0]->k || w[i]->rows < 1 || w[i]->rows > (1 << 30) ||
            (glu && w[i]->rows != w[0]->rows))
            return -1;
        tiles += tiles_of(w[i]->rows);
    }
    if (glu) tiles = (w[0]->rows + 31) / 32;
    return tiles <= CUDA_MMB_COUNTERS ? tiles : -1;
}

static smelt_status launch_scratch(const struct cuda_ctx *ctx, const struct cuda_qweight *const *w, int count,
                                   bool glu, int64_t n, uint64_t *bytes, struct err *e) {
    const int64_t tiles = launch_tiles(w, count, glu);
    if (tiles < 0)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: %d matrices in one launch (%s, one type and row length)",
                       count, glu ? "gate and up of one shape" : "1..3");
    if (n < 1 || n > CUDA_MMB_MAX_ROWS || w[0]->k < 256)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: scratch for k %lld, %lld tokens (1..%d)", (long long)w[0]->k,
                       (long long)n, CUDA_MMB_MAX_ROWS);
    const mmb_plan p = plan_of(ctx, tiles, w[0]->k, n);
    *bytes = p.xp_bytes + p.part_bytes;
    return SMELT_OK;
}

extern "C" smelt_status cuda_mmb_multi_scratch_bytes(const struct cuda_ctx *ctx, const struct cuda_qweight *const *w,
                                                     int count, int64_t n, uint64_t *bytes, struct err *e) {
    return launch_scratch(ctx, w, count, false, n, bytes, e);
}

extern "C" smelt_status cuda_mmb_glu_scratch_bytes(const struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                                                   const struct cuda_qweight *up, int64_t n, uint64_t *bytes,
                                                   struct err *e) {
    const struct cuda_qweight *w[2] = {gate, up};
    return launch_scratch(ctx, w, 2, true, n, bytes, e);
}

/* stages: super-blocks of activations in shared memory (NT = 1: the block's whole range) */
static cudaError_t launch_k(struct cuda_ctx *ctx, const mmb_plan &p, const mmb_args &a, void (*k)(const mmb_args),
                            int stages, int nt, size_t extra = 0) {
    const size_t smem = (size_t)stages * 8 * nt * MMB_XS + extra;
    if (smem > 48 * 1024) smem_optin_once(ctx, (const void *)k, smem);
    return klaunch(k, dim3((unsigned)p.groups, p.items ? 1u : (unsigned)p.ks), dim3(MMB_THREADS), smem, ctx, a);
}

template <uint32_t T, int NT>
static cudaError_t launch_nt(struct cuda_ctx *ctx, const mmb_plan &p, const mmb_args &a) {
    if (NT == 1 && (a.rt > 1 || a.items || a.pf > 0)) { /* a measurement switch is on */
        if (a.glu) return launch_k(ctx, p, a, mmb1_kernel<T, true>, p.kr, 1, 64 * 16); /* GLU's exchange */
        return launch_k(ctx, p, a, mmb1_kernel<T, false>, p.kr, 1);
    }
    if (a.glu) return launch_k(ctx, p, a, mmb_kernel<T, NT, true>, NT == 1 ? p.kr : 2, NT);
    return launch_k(ctx, p, a, mmb_kernel<T, NT, false>, NT == 1 ? p.kr : 2, NT);
}

/* The product of type T, after the conversion above 8 rows. */
template <uint32_t T> static cudaError_t launch_type(struct cuda_ctx *ctx, const mmb_plan &p, const mmb_args &a) {
    if (p.nt == 1) return launch_nt<T, 1>(ctx, p, a);
    const long long items = (long long)8 * p.nt * p.nsb * 16;
    cudaError_t ce = klaunch(mmb_convert_kernel<T>, dim3(nblocks(items, 256)), dim3(256), 0, ctx, a.x, (__half *)a.xp,
                             a.k, a.n, items);
    if (ce != cudaSuccess) return ce;
    switch (p.nt) {
    case 2: return launch_nt<T, 2>(ctx, p, a);
    case 4: return launch_nt<T, 4>(ctx, p, a);
    default: return launch_nt<T, 8>(ctx, p, a);
    }
}

/* cuda_mmb_multi, or with glu (1 + enum glu_act) cuda_mmb_glu: y[0] only. */
static smelt_status mmb_run(struct cuda_ctx *ctx, const struct cuda_qweight *const *w, int count, int glu,
                            const float *x, int64_t n, float *const *y, void *scratch, uint64_t scratch_bytes,
                            int accumulate, struct err *e) {
    const int64_t tiles = launch_tiles(w, count, glu != 0);
    if (tiles < 0)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: %d matrices in one launch (%s, one type and row length)",
                       count, glu ? "gate and up of one shape" : "1..3");
    if (!cuda_mmb_supported(w[0]->type, w[0]->k))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmb: %s %lldx%lld has no kernel (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0; k %% 256 == 0)",
                       qtype_name(w[0]->type), (long long)w[0]->rows, (long long)w[0]->k);
    bool ys = true;
    for (int i = 0; i < (glu ? 1 : count); i++) ys = ys && y[i];
    if (n < 1 || n > CUDA_MMB_MAX_ROWS || !x || !ys || ((uintptr_t)x & 15) || ((uintptr_t)scratch & 15))
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmb: %lld token rows (1..%d), x %p and scratch %p (16-byte aligned), every y given",
                       (long long)n, CUDA_MMB_MAX_ROWS, (const void *)x, scratch);
    const mmb_plan p = plan_of(ctx, tiles, w[0]->k, n);
    const uint64_t need = p.xp_bytes + p.part_bytes;
    if (need && !scratch)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: no scratch, %llu bytes needed", (unsigned long long)need);
    if (scratch_bytes < need)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: scratch of %llu bytes, %s %lldx%lld at %lld rows needs %llu",
                       (unsigned long long)scratch_bytes, qtype_name(w[0]->type), (long long)w[0]->rows,
                       (long long)w[0]->k, (long long)n, (unsigned long long)need);
    mmb_args a;
    memset(&a, 0, sizeof a);
    int tile = 0;
    for (int i = 0; i < CUDA_MMB_MATS; i++) {
        const struct cuda_qweight *wi = w[i < count ? i : count - 1]; /* unused: an empty range */
        a.w[i] = mmb_w{(const unsigned char *)wi->q, (const unsigned char *)wi->s, (const unsigned char *)wi->d};
        a.y[i] = y[glu ? 0 : i < count ? i : count - 1];
        a.rows[i] = (int)wi->rows;
        a.tile0[i] = tile;
        if (i < count) tile += (int)tiles_of(wi->rows);
    }
    a.tile0[CUDA_MMB_MATS] = tile;
    a.x = x;
    a.xp = p.xp_bytes ? (const __half *)scratch : NULL;
    a.cnt = ctx->mmb_cnt;
    a.part = p.part_bytes ? (float *)((unsigned char *)scratch + p.xp_bytes) : NULL;
    a.k = (int)w[0]->k;
    a.n = (int)n;
    a.nsb = p.nsb;
    a.kr = p.kr;
    a.ks = p.ks;
    a.tiles = p.rtiles;
    a.rt = p.rt;
    a.pf = p.pf;
    a.items = p.items;
    a.accumulate = accumulate != 0;
    a.glu = glu;
    cudaError_t ce;
    switch (w[0]->type) {
    case QT_Q4_K: ce = launch_type<QT_Q4_K>(ctx, p, a); break;
    case QT_Q5_K: ce = launch_type<QT_Q5_K>(ctx, p, a); break;
    case QT_Q6_K: ce = launch_type<QT_Q6_K>(ctx, p, a); break;
    case QT_Q8_0: ce = launch_type<QT_Q8_0>(ctx, p, a); break;
    default: ce = launch_type<QT_Q4_0>(ctx, p, a); break;
    }
    CUDA_TRY(ce, e);
    return SMELT_OK;
}

extern "C" smelt_status cuda_mmb(struct cuda_ctx *ctx, const struct cuda_qweight *w, const float *x, int64_t n,
                                 float *y, void *scratch, uint64_t scratch_bytes, int accumulate, struct err *e) {
    if (!w || !cuda_mmb_supported(w->type, w->k) || w->rows < 1 || w->rows > (1 << 30))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmb: %s %lldx%lld has no kernel (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0; k %% 256 == 0)",
                       w ? qtype_name(w->type) : "?", w ? (long long)w->rows : 0LL, w ? (long long)w->k : 0LL);
    return mmb_run(ctx, &w, 1, 0, x, n, &y, scratch, scratch_bytes, accumulate, e);
}

extern "C" smelt_status cuda_mmb_multi(struct cuda_ctx *ctx, const struct cuda_qweight *const *w, int count,
                                       const float *x, int64_t n, float *const *y, void *scratch,
                                       uint64_t scratch_bytes, int accumulate, struct err *e) {
    return mmb_run(ctx, w, count, 0, x, n, y, scratch, scratch_bytes, accumulate, e);
}

extern "C" smelt_status cuda_mmb_glu(struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                                     const struct cuda_qweight *up, int act, const float *x, int64_t n, float *dst,
                                     void *scratch, uint64_t scratch_bytes, struct err *e) {
    if (act < 0 || act > 3)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: GLU activation %d (0..3)", act);
    const struct cuda_qweight *w[2] = {gate, up};
    return mmb_run(ctx, w, 2, 1 + act, x, n, &dst, scratch, scratch_bytes, 0, e);
}
