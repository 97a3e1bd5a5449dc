/* Quantized matrix x many token rows on the tensor cores. See cuda_mmq.h; the bytes, ops and
 * ceilings per call, and why f16 rather than int8 MMA, are in docs/cuda-backend.md
 * ("Tensor-core matmul").
 *
 * Work split ("stream-K"). A tile is BM weight rows x BN tokens; a unit is one tile's
 * 256-wide K slice (one K-quant super-block, eight Q8_0 blocks). Units are numbered tile
 * by tile (token tile fastest, so the blocks that share a weight tile run side by side),
 * K slice by K slice, and the grid of P blocks (one wave: SMs x blocks per SM) takes
 * equal contiguous ranges: block b owns units [b*U/P, (b+1)*U/P). A block walks its range
 * through one cp.async pipeline (NS stages in flight; crossing a tile boundary does not
 * drain it), accumulating in registers, and at the end of each tile segment either
 * stores y (it had the whole tile) or writes its partial tile to the work area. The
 * contributors of a split tile count themselves in a counter (indexed by the first
 * contributor, which owns no other split tile's first unit); the last to arrive adds the
 * partials, its own included, in block order (so the result does not depend on timing) and stores y. No
 * block ever waits for another; the counters are zeroed by cuda_mmq_quantize and reset by
 * their last user, so a captured graph replays.
 *
 * Block: 8 warps as WM x WN, warp tile 16*RT rows x 8*NT tokens. Per unit:
 *   1. __syncthreads (the unit's copies landed; every warp is done with the previous one);
 *   2. the block turns the unit's raw scales into f16x2 pairs in a shared table, once per
 *      (row, sub-block): Q4_K {d*sc, d*sc}, {-dmin*m, -dmin*m}; Q6_K {d*sc, d*sc} per 16;
 *      Q8_0 {d, d}; then issues the copies of unit u + NS - 1; __syncthreads;
 *   3. each warp, per 16-wide K chunk: dequantizes its A fragments from the raw bits
 *      (32-bit shared loads, magic-number f16 conversion, one f16x2 FMA per pair of
 *      weights), loads the B fragments of two token tiles per ldmatrix.x4 and runs
 *      RT x NT mma.sync.m16n8k16 (f16 in, f32 accumulators).
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
 * type"; g = lane >> 2, t = lane & 3, registers hold two f16, the lower index in the low
 * half):  A (16 x 16): a0 = row g, k {2t, 2t+1};  a1 = row g+8, k {2t, 2t+1};
 *                      a2 = row g, k {2t+8, 2t+9}; a3 = row g+8, k {2t+8, 2t+9}
 *         B (16 x 8):  b0 = k {2t, 2t+1}, col g;  b1 = k {2t+8, 2t+9}, col g
 *         C (16 x 8 f32): c0 = (g, 2t), c1 = (g, 2t+1), c2 = (g+8, 2t), c3 = (g+8, 2t+1)
 * The sum over k does not care how k is numbered, as long as A and B agree. A lane's
 * 32-bit load of packed weights holds four consecutive K positions 4t..4t+3 of a chunk,
 * and the cheap conversions give the pairs (4t, 4t+2) and (4t+1, 4t+3). So mma index
 * {2t, 2t+1} stands for K positions {4t, 4t+2} of the chunk and {2t+8, 2t+9} for
 * {4t+1, 4t+3}: the f16 activations are stored with each 16-group reordered as its 8
 * even positions then its 8 odd ones, and ldmatrix (lanes 8i..8i+7 address the 8 rows of
 * matrix i, lane l receives word l & 3 of row l >> 2 of each matrix) then hands lane
 * (g, t) exactly x[4t], x[4t+2] from the "even" 16 bytes of token g and x[4t+1], x[4t+3]
 * from the "odd" 16 bytes.
 *
 * Shared strides: weight rows 144 / 208 / 272 B and token rows 528 B are 16 B past a
 * multiple of 128, so the 8 rows x 4 words of a fragment load, and the 8 rows of an
 * ldmatrix matrix, hit distinct banks; the scale table's rows are 72 (36) B apart.
 *
 * wgmma tiles (sm_90a, cuda_ctx.wgmma). With mma.sync each dequantized A fragment feeds
 * NT products of 8 tokens from B fragments every warp loads itself; wgmma.m64n128k16 takes
 * A from the registers of a warpgroup's four warps (the same fragment layout, warp w rows
 * 16w..16w+15) and B, all 128 tokens, from shared memory through the tensor cores' own path,
 * so one fragment feeds a 16 x 128 x 16 product and no warp spends issue slots on B. The
 * stage's activations are stored K-major with wgmma's 128-byte swizzle (cuda_mma.cuh): four
 * atom columns of 64 K values, each BN token rows of 128 B whose 16-byte units are permuted
 * by the token's low 3 bits, in the same evens-then-odds order within each 16-group, so the
 * dequantization is the mma.sync tiles' own. (The unswizzled layout of 8-token "core
 * matrices" made each quarter warp's copy touch 8 tokens, so every 32-byte sector crossed
 * L2 twice, half used each time: ncu counted twice the ideal L2 sectors, L2 72% busy.) Per
 * chunk: dequantize, wgmma.fence, one wgmma per 64-row block, commit, wait for all but this
 * group (the previous chunk's registers are then free while this one runs); per
 * unit, a wait for all before the barrier that lets the stage be refilled. The copies land
 * through the generic proxy and wgmma reads through the async one: fence.proxy.async
 * before the barrier. The accumulators are mma.sync's C fragments tile after tile, so the
 * partial tiles, the fixup and the stores are shared.
 */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_glu.cuh" /* glu_val: the GLU products' store */

extern "C" {
#include "backend/cuda/cuda_mmq.h"
#include "quant/quant.h"
}

#define MMQ_THREADS 256
#define MMQ_XS 528          /* shared bytes per token per stage: 256 f16 + 16 pad */

#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_mmq.cuh" /* the f16 activations' layout, the counters */
static_assert(MMQ_CNT_BYTES == CUDA_MMQ_XH_OFFSET, "cuda_mmq.h's view of the scratch");
#include "backend/cuda/cuda_qtypes.cuh" /* MXFP4's layout: tq_mx4, tq_mx_s */

/* ---------------------------------------------------------- configuration ---- */

/* The fixed tiles {WM, WN, RT, NT, blocks per SM, wgmma}: 8 warps as WM x WN, each 16*RT
 * weight rows x 8*NT tokens. The first, narrow one runs two blocks per SM (16 warps); the
 * others one, with their shared memory spent on deeper pipelines. With WN = 2 each weight is
 * dequantized by two warps, with WM = 4 each activation fragment is loaded by four: the
 * 128-row tiles trade the first for the second.
 *
 * The wgmma tiles (sm_90a; see "wgmma tiles" below) are two warpgroups (WM = 2) of 64*RT
 * weight rows each, all 8*NT tokens: warp w of a warpgroup dequantizes rows 16w.. of each of
 * its RT 64-row blocks, and one wgmma.m64n128k16 per block and 16-wide K chunk multiplies
 * them by the whole token tile, read by the tensor cores straight from shared memory. */
static constexpr int tiles[][6] = {
    {8, 1, 1, 2, 2, 0},  /* 128 x 16 */
    {8, 1, 2, 2, 1, 0},  /* 256 x 16 */
    {8, 1, 1, 4, 1, 0},  /* 128 x 32 */
    {8, 1, 2, 4, 1, 0},  /* 256 x 32 */
    {8, 1, 2, 8, 1, 0},  /* 256 x 64 */
    {4, 2, 2, 8, 1, 0},  /* 128 x 128 */
    {4, 2, 2, 4, 1, 0},  /* 128 x 64 */
    {2, 1, 1, 16, 1, 1}, /* 128 x 128, wgmma */
    {2, 1, 2, 16, 1, 1}, /* 256 x 128, wgmma (Q4_K and MXFP4: the others' stages do not fit) */
    {2, 1, 1, 8, 1, 1},  /* 128 x 64, wgmma (m64n64k16: batched decode and short chunks) */
    {2, 1, 2, 8, 1, 1},  /* 256 x 64, wgmma */
};
#define N_TILES ((int)(sizeof tiles / sizeof tiles[0]))

static constexpr int tile_bm(int t) {
    return tiles[t][0] * (tiles[t][5] ? 64 : 16) * tiles[t][2];
}
static constexpr int tile_bn(int t) {
    return tiles[t][1] * 8 * tiles[t][3];
}


/* Per weight row per unit: raw bits at a padded stride, and the scale table's stride. */
template <uint32_t T> struct mmq_fmt;
template <> struct mmq_fmt<QT_Q4_K> {
    static constexpr int q_bytes = 128, q_stride = 144, d_bytes = 0, sb_stride = 72;
};
template <> struct mmq_fmt<QT_Q6_K> {
    static constexpr int q_bytes = 192, q_stride = 208, d_bytes = 4, sb_stride = 72;
};
template <> struct mmq_fmt<QT_Q8_0> {
    static constexpr int q_bytes = 256, q_stride = 272, d_bytes = 0, sb_stride = 36;
};
template <> struct mmq_fmt<QT_MXFP4> {
    static constexpr int q_bytes = 128, q_stride = 144, d_bytes = 0, sb_stride = 36;
};

template <uint32_t T, int I> struct mmq_cfg {
    static constexpr int WM = tiles[I][0], WN = tiles[I][1], RT = tiles[I][2], NT = tiles[I][3];
    static constexpr int MINB = tiles[I][4];
    static constexpr bool WG = tiles[I][5] != 0;
    static constexpr int BM = tile_bm(I), BN = tile_bn(I);
    static constexpr int RS = WG ? 64 : 16;  /* weight rows between a warp's fragments */
    static constexpr int XS = WG ? 512 : MMQ_XS; /* shared bytes per token per stage */
    static constexpr int NACC = RT * NT * 4; /* f32 accumulators per thread */
    using F = mmq_fmt<T>;
    /* one stage: W (BM x q_stride), S (BM x 16 raw scales), D (BM x d_bytes), X (BN x XS) */
    static constexpr int S = BM * F::q_stride;
    static constexpr int D = S + BM * 16;
    /* the wgmma tiles' X is 128-byte-swizzled atoms: 1,024-byte aligned, as are their stages */
    static constexpr int AL = WG ? 1024 : 16;
    static constexpr int X = (D + BM * F::d_bytes + AL - 1) / AL * AL;
    static constexpr int STAGE = (X + BN * XS + AL - 1) / AL * AL;
    static constexpr int SB_BYTES = BM * F::sb_stride;
    static constexpr int BUDGET = MINB == 2 ? 113 * 1024 : 227 * 1024;
    static constexpr int NS_FIT = (BUDGET - SB_BYTES - 16) / STAGE;
    /* a type whose two stages do not fit the tile: compiled empty, its SMEM over every
     * device's limit, so the occupancy query never offers it */
    static constexpr bool FITS = NS_FIT >= 2;
    static constexpr int NS = NS_FIT > 4 ? 4 : NS_FIT < 2 ? 2 : NS_FIT;
    static constexpr int SB = NS * STAGE; /* the scale table, then 16 B of control */
    static constexpr int CTRL = SB + SB_BYTES;
    static constexpr int SMEM = CTRL + 16;
    static_assert((WG ? 4 * WM : WM) * WN * 32 == MMQ_THREADS, "8 warps");
    static_assert(NT % 2 == 0, "ldmatrix.x4 loads two token tiles");
    static_assert(!WG || (WM == 2 && WN == 1 && (NT == 16 || NT == 8)), "wgmma: two warpgroups x 128 or 64 tokens");
    static_assert(STAGE % 16 == 0 && S % 16 == 0 && D % 16 == 0 && X % 16 == 0 && SB % 16 == 0,
                  "16-byte aligned regions");
    static_assert(BM * BN == MMQ_THREADS * NACC, "a partial tile is NACC floats per thread");
};

struct mmq_args {
    const unsigned char *wq, *ws, *wd; /* split-layout weight arrays (cuda_qweight q, s, d) */
    /* a GLU product (glu = 1 + act, cuda_glu.cuh's code; 0: y = W x): w* are the gate's
     * arrays, w*2 the up's, and the launch's rows interleave them (wrow_of) */
    const unsigned char *wq2, *ws2, *wd2;
    int glu;
    /* a stacked launch (cuda_mmq_stack_pre; glu 0): launch rows [0, r1) are matrix 0's (w*,
     * y), [r1, r2) matrix 1's (w*2, y2), [r2, rows) matrix 2's (w*3, y3), each output (n, its
     * rows); every other launch has r1 = r2 = rows */
    const unsigned char *wq3, *ws3, *wd3;
    float *y2, *y3;
    int r1, r2;
    const __half *xh;                  /* (n, k) f16 activations, 16-groups reordered */
    float *y;                          /* (n, rows) */
    /* a GLU product's output as the next product's f16 activations (NULL: y): that product's
     * scratch, (n, rows / 2) at mmq_xh in xh's layout, its split-tile counters (mmq_cnt)
     * zeroed by block 0 */
    void *h16;
    float *work;                       /* 2 partial tiles per block (part_of) */
    int *cnt;                          /* split-tile counters, MMQ_MAX_BLOCKS */
    long long units;                   /* tiles * nsb */
    int rows, k, n, accumulate;
    int nsb;     /* units per tile: ceil(k / 256) */
    int tiles_n; /* token tiles */
    int grid;    /* P */
    /* by expert id (cuda_mmq_id_pre; NULL: a plain product): token tile tn multiplies expert
     * tile_eid[tn] (rows: rows per expert); the used tiles are the prefix of the n_tiles_max
     * entries that are >= 0, counted by each block; whole tiles per block (no K split) */
    const int *tile_eid;
    int n_tiles_max;
};

/* First unit of block b, and the block that owns unit u. */
static __device__ __forceinline__ long long unit_begin(const mmq_args &a, long long b) {
    if (a.tile_eid) return b * (a.units / a.nsb) / a.grid * a.nsb; /* whole tiles */
    return b * a.units / a.grid;
}
static __device__ __forceinline__ long long unit_owner(const mmq_args &a, long long u) {
    return ((u + 1) * a.grid - 1) / a.units;
}

/* A unit's place: K slice s of token tile tn of row tile rt (tile = rt * tiles_n + tn).
 * Advanced one unit at a time, so the per-unit path has no 64-bit division. */
struct upos {
    int s, tn, rt, e; /* e: the expert of token tile tn (by id), else 0 */
};

static __device__ __forceinline__ upos pos_of(const mmq_args &a, long long u) {
    const long long tile = u / a.nsb;
    upos p;
    p.s = (int)(u - tile * a.nsb);
    p.rt = (int)(tile / a.tiles_n);
    p.tn = (int)(tile - (long long)p.rt * a.tiles_n);
    p.e = a.tile_eid && p.tn < a.n_tiles_max ? a.tile_eid[p.tn] : 0;
    return p;
}

static __device__ __forceinline__ void pos_next(const mmq_args &a, upos &p) {
    if (++p.s == a.nsb) {
        p.s = 0;
        if (++p.tn == a.tiles_n) {
            p.tn = 0;
            p.rt++;
        }
        if (a.tile_eid && p.tn < a.n_tiles_max) p.e = a.tile_eid[p.tn];
    }
}

/* Weight row gr of the launch: the arrays holding it and its row there. A GLU product runs
 * 2 x n_ff rows interleaved in eights, 16 j + i being gate row 8 j + i for i < 8 and up row
 * 8 j + i - 8 for i >= 8: a thread's C fragment holds rows g and g + 8 of a 16-row block,
 * so it holds a gate sum and the up sum of the same output, and the store applies the
 * activation in registers (store_y). */
struct wrow {
    const unsigned char *q, *s, *d;
    long long r;
};
static __device__ __forceinline__ wrow wrow_of(const mmq_args &a, int gr) {
    if (!a.glu) {
        if (gr < a.r1) return {a.wq, a.ws, a.wd, gr};
        if (gr < a.r2) return {a.wq2, a.ws2, a.wd2, gr - a.r1};
        return {a.wq3, a.ws3, a.wd3, gr - a.r2};
    }
    const bool up = gr & 8;
    return {up ? a.wq2 : a.wq, up ? a.ws2 : a.ws, up ? a.wd2 : a.wd, (long long)(((gr >> 4) << 3) | (gr & 7))};
}

/* ------------------------------------------------------------------ kernels ---- */

/* x (n, k) f32 -> xh (n, k) f16, each 16-group stored as x[0], x[2], .., x[14], x[1], x[3],
 * .., x[15] (see the file comment); values beyond the f16 range clamp to +-65504 (NaN stays
 * NaN). One thread per 16 values; block 0 also zeroes the split-tile counters. */
template <bool VEC>
static __global__ void mmq_convert_kernel(const float *__restrict__ x, __half *__restrict__ xh,
                                          int *__restrict__ cnt, long long groups) {
    mmq_zero_cnt(cnt);
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= groups) return;
    float v[16];
    if (VEC) {
        const float4 *src = (const float4 *)(x + i * 16);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float4 f = src[j];
            v[4 * j] = f.x;
            v[4 * j + 1] = f.y;
            v[4 * j + 2] = f.z;
            v[4 * j + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++)
            v[j] = x[i * 16 + j];
    }
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 8; j++) { /* o[0..3]: even positions, o[4..7]: odd */
        const int e = j < 4 ? 4 * j : 4 * (j - 4) + 1;
        o[j] = (uint32_t)__half_as_ushort(mmq_f16(v[e])) | ((uint32_t)__half_as_ushort(mmq_f16(v[e + 2])) << 16);
    }
    uint4 *dst = (uint4 *)(xh + i * 16);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

/* Valid 32-blocks in K slice s (< 8 only in a Q8_0 or MXFP4 row's last slice). */
static __device__ __forceinline__ int slice_blocks(const mmq_args &a, int s) {
    return min(8, (a.k >> 5) - s * 8);
}

/* Issues the cp.async copies of the unit at p into stage buffer st. Rows past the matrix
 * and tokens past n are clamped to the last one (their results are never stored); the
 * 32-blocks of a partial Q8_0 slice that lie past k are not copied (and never read). Thread
 * tid copies the same 16-byte column of rows tid / CH + it * (256 / CH), each row's source
 * found by wrow_of (a GLU launch's rows come from two matrices). */
template <uint32_t T, int I>
static __device__ __forceinline__ void load_unit(const mmq_args &a, unsigned char *st, const upos &p,
                                                 int tid) {
    using C = mmq_cfg<T, I>;
    constexpr int BM = C::BM, BN = C::BN, QS = C::F::q_stride;
    const int s = p.s, row0 = p.rt * BM, tok0 = p.tn * BN;
    const int nbv = slice_blocks(a, s);
    { /* f16 activations: a warp copies one token's 512 contiguous bytes a pass (full 32-byte
       * sectors), 8 tokens a pass (warp w takes tokens w + 8 it). The 16-byte unit c of token
       * t lands at t * MMQ_XS + 16 c, or on the wgmma tiles in 128-byte-swizzled atoms
       * (cuda_mma.cuh): atom column c >> 3 (64 K values, BN x 128 B), token row t, unit
       * (c & 7) ^ (t & 7) = (c & 7) ^ w, each quarter warp one 128-byte row (all 32 banks) */
        const int w = tid >> 5, c = tid & 31;
        constexpr int step = C::WG ? 1024 : 8 * MMQ_XS; /* 8 tokens further */
        if ((T != QT_Q8_0 && T != QT_MXFP4) || c < 4 * nbv) {
            unsigned char *dst =
                st + C::X +
                (C::WG ? (c >> 3) * (BN * 128) + w * 128 + (((c & 7) ^ w) << 4) : w * MMQ_XS + c * 16);
            if (tok0 + BN <= a.n) {
                const __half *src = a.xh + (long long)(tok0 + w) * a.k + s * 256 + c * 8;
#pragma unroll
                for (int it = 0; it < BN / 8; it++)
                    cp_async16(dst + it * step, src + (long long)it * 8 * a.k);
            } else {
#pragma unroll
                for (int it = 0; it < BN / 8; it++) {
                    const long long gt = min(tok0 + w + it * 8, a.n - 1);
                    cp_async16(dst + it * step, a.xh + gt * a.k + s * 256 + c * 8);
                }
            }
        }
    }
    const bool full = row0 + BM <= a.rows;
    const long long eb = (long long)p.e * a.rows; /* the expert's first row (by id) */
    /* weight row r of the tile: rows past the matrix clamped to its last */
    auto src_row = [&](int r) { return wrow_of(a, full ? row0 + r : min(row0 + r, a.rows - 1)); };
    if constexpr (T == QT_Q4_K) { /* 8 x 16 B a row; 32 rows per pass */
        const int r = tid >> 3, c = tid & 7;
#pragma unroll
        for (int it = 0; it < BM / 32; it++) {
            const wrow w = src_row(r + it * 32);
            cp_async16(st + (r + it * 32) * QS + c * 16, w.q + ((eb + w.r) * a.nsb + s) * 128 + c * 16);
        }
    } else if constexpr (T == QT_Q6_K) { /* 12 x 16 B a row */
#pragma unroll
        for (int it = 0; it < BM * 12 / MMQ_THREADS; it++) {
            const int i = tid + it * MMQ_THREADS, r = i / 12, c = i - r * 12;
            const wrow w = src_row(r);
            cp_async16(st + r * QS + c * 16, w.q + ((eb + w.r) * a.nsb + s) * 192 + c * 16);
        }
    } else if constexpr (T == QT_MXFP4) { /* 16 B of codes a block, 8 a row; 32 rows per pass */
        const int r = tid >> 3, c = tid & 7;
        const long long nblk = a.k >> 5;
        if (c < nbv) {
#pragma unroll
            for (int it = 0; it < BM / 32; it++) {
                const wrow w = src_row(r + it * 32);
                cp_async16(st + (r + it * 32) * QS + c * 16, w.q + ((eb + w.r) * nblk + s * 8 + c) * 16);
            }
        }
    } else { /* Q8_0: q = k int8 per row, 16 x 16 B a row; 16 rows per pass */
        const int r = tid >> 4, c = tid & 15;
        if (c < 2 * nbv) {
#pragma unroll
            for (int it = 0; it < BM / 16; it++) {
                const wrow w = src_row(r + it * 16);
                cp_async16(st + (r + it * 16) * QS + c * 16, w.q + (eb + w.r) * a.k + s * 256 + c * 16);
            }
        }
    }
    if constexpr (T == QT_Q4_K || T == QT_Q6_K) { /* 16 B of scales a row (+ Q6_K's d) */
        if (tid < BM) {
            const wrow w = wrow_of(a, min(row0 + tid, a.rows - 1));
            const long long blk = (eb + w.r) * a.nsb + s;
            cp_async16(st + C::S + tid * 16, w.s + blk * 16);
            if constexpr (T == QT_Q6_K)
                /* d is an f16 in a 2-byte array padded to whole words (cuda_qweight_upload):
                 * copy the aligned word holding it */
                cp_async4(st + C::D + tid * 4, w.d + ((blk * 2) & ~3LL));
        }
    } else if constexpr (T == QT_MXFP4) { /* 8 E8M0 bytes a row, as 2 words (rows padded to 4) */
        const long long nblk = a.k >> 5;
        for (int i = tid; i < BM * 2; i += MMQ_THREADS) {
            const int r = i >> 1, c = i & 1;
            if (4 * c < nbv) {
                const wrow w = wrow_of(a, min(row0 + r, a.rows - 1));
                cp_async4(st + C::S + r * 16 + c * 4, w.s + tq_mx_s(eb + w.r, nblk, s * 8 + 4 * c));
            }
        }
    } else { /* Q8_0: 8 f16 scales a row, copied as 4 words (k/32 is even) */
        const long long nblk = a.k >> 5;
#pragma unroll
        for (int i = tid; i < BM * 4; i += MMQ_THREADS) {
            const int r = i >> 2, c = i & 3;
            if (2 * c < nbv) {
                const wrow w = wrow_of(a, min(row0 + r, a.rows - 1));
                cp_async4(st + C::S + r * 16 + c * 4, w.s + ((eb + w.r) * nblk + s * 8) * 2 + c * 4);
            }
        }
    }
}

/* The unit's f16x2 scale table (see the file comment), from the raw scales in st. */
template <uint32_t T, int I>
static __device__ __forceinline__ void prep_scales(const mmq_args &a, const unsigned char *st,
                                                   unsigned char *sb, const upos &p, int tid) {
    using C = mmq_cfg<T, I>;
    constexpr int BM = C::BM, SBS = C::F::sb_stride;
    /* the scales reach f16 exactly as integers (magic-number conversion) and are multiplied
     * by the f16 super-block scales in f16: one rounding each, off the slow I2F/F2F path.
     * Thread tid does row tid / TPR, sub-blocks (or 16-chunk pairs) j0 .. j0 + 8/TPR - 1. */
    constexpr int TPR = MMQ_THREADS / BM, SPT = 8 / TPR;
    static_assert(TPR * BM == MMQ_THREADS && SPT * TPR == 8, "one or two threads a row");
    const int r = tid / TPR, j0 = (tid % TPR) * SPT;
    const uint4 raw = *(const uint4 *)(st + C::S + r * 16);
    unsigned char *out = sb + r * SBS;
    if constexpr (T == QT_Q4_K) {
        /* word 0 = {d, dmin}; words 1..3 = {sc_a, m_a, sc_b, m_b} x 6 bits of sub-block
         * pairs 0..2 in their low 24 bits, pair 3 in their top bytes (cuda_mmv.cu) */
        const uint32_t pk[4] = {raw.y, raw.z, raw.w,
                                (raw.y >> 24) | ((raw.z >> 24) << 8) | ((raw.w >> 24) << 16)};
        const uint32_t dm = raw.x ^ 0x80000000u; /* {d, -dmin} */
#pragma unroll
        for (int jj = 0; jj < SPT; jj++) {
            const int j = j0 + jj; /* j0 is 0 or 4: word (j >> 1) without a dynamic index */
            const uint32_t f = (j0 ? pk[2 + (jj >> 1)] : pk[jj >> 1]) >> (12 * (jj & 1));
            const uint32_t sm = (f & 0x3fu) | ((f << 10) & 0x003f0000u) | MAGIC; /* 1024 + {sc, m} */
            const uint32_t r2 = h2_mul(h2_sub(sm, H_1024), dm); /* {d*sc, -dmin*m} */
            uint2 e;
            e.x = __byte_perm(r2, r2, 0x1010);
            e.y = __byte_perm(r2, r2, 0x3232);
            *(uint2 *)(out + 8 * j) = e;
        }
    } else if constexpr (T == QT_Q6_K) {
        const long long blk = ((long long)p.e * a.rows + wrow_of(a, min(p.rt * BM + r, a.rows - 1)).r) * a.nsb + p.s;
        const uint32_t dw = *(const uint32_t *)(st + C::D + r * 4);
        const uint32_t d2 = __byte_perm(dw, dw, (blk & 1) ? 0x3232 : 0x1010);
        const uint32_t w[4] = {raw.x ^ 0x80808080u, raw.y ^ 0x80808080u, raw.z ^ 0x80808080u,
                               raw.w ^ 0x80808080u}; /* int8 sc -> sc + 128 */
#pragma unroll
        for (int jj = 0; jj < SPT; jj++) { /* 16-chunks 2j, 2j+1 */
            const int j = j0 + jj;
            /* -> f16 1152 + sc -> sc, times d */
            const uint32_t v =
                __byte_perm(j0 ? w[2 + (jj >> 1)] : w[jj >> 1], 0x64u, (jj & 1) ? 0x4342 : 0x4140);
            const uint32_t r2 = h2_mul(h2_sub(v, H_1152), d2);
            uint2 e;
            e.x = __byte_perm(r2, r2, 0x1010);
            e.y = __byte_perm(r2, r2, 0x3232);
            *(uint2 *)(out + 8 * j) = e;
        }
    } else if constexpr (T == QT_MXFP4) {
        /* E8M0 e -> the f16 2^(e-128): exponent field e - 113 where normal, a mantissa bit
         * down to 2^-24, 0 below (|w| < 2^-21), the largest finite above (never in a real
         * file); both halves */
        const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
        for (int jj = 0; jj < SPT; jj++) {
            const int j = j0 + jj;
            const int ex = (int)((j0 ? w[1] >> (8 * jj) : w[jj >> 2] >> (8 * (jj & 3))) & 0xffu);
            const uint32_t h = ex >= 144 ? 0x7bffu : ex >= 114 ? (uint32_t)(ex - 113) << 10
                             : ex >= 104 ? 1u << (ex - 104) : 0u;
            *(uint32_t *)(out + 4 * j) = h | h << 16;
        }
    } else {
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int jj = 0; jj < SPT; jj++) {
            const int j = j0 + jj;
            *(uint32_t *)(out + 4 * j) =
                __byte_perm(j0 ? w[2 + (jj >> 1)] : w[jj >> 1], 0, (jj & 1) ? 0x3232 : 0x1010);
        }
    }
}

/* One 16-wide K chunk: B fragments of the warp's token tiles (two per ldmatrix.x4) times
 * the RT A fragments in af. xa: this lane's ldmatrix address for chunk 0, token pair 0. */
template <int RT, int NT>
static __device__ __forceinline__ void mma_chunk(float (&acc)[RT][NT][4], const uint32_t (&af)[RT][4],
                                                 uint32_t xa, int chunk) {
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        ldsm_x4(b, xa + np * 16 * MMQ_XS + chunk * 32);
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            mma_f16(acc[rt][2 * np], af[rt], b[0], b[1]);
            mma_f16(acc[rt][2 * np + 1], af[rt], b[2], b[3]);
        }
    }
}

/* The products of one 16-wide K chunk: mma.sync (the B fragments loaded by ldmatrix from
 * xa), or on the wgmma tiles one wgmma per 64-row block, B the chunk's 32 bytes of each token
 * row at desc. A wgmma reads its A registers until it completes: the wait for all but the
 * latest group lets the next chunk's dequantization overlap this chunk's products while
 * the registers of the chunk before are free again (ptxas allocates around the wait). */
template <class C>
static __device__ __forceinline__ void chunk_mma(float (&acc)[C::RT][C::NT][4], const uint32_t (&af)[C::RT][4],
                                                 uint32_t xa, uint64_t desc, int chunk) {
    if constexpr (C::WG) {
        wg_fence();
#pragma unroll
        for (int rt = 0; rt < C::RT; rt++) {
            const uint64_t dc = desc + (uint64_t)(((chunk >> 2) * C::BN * 128 + (chunk & 3) * 32) >> 4);
            if constexpr (C::NT == 16) wgmma_n128(acc[rt], af[rt], dc);
            else wgmma_n64(acc[rt], af[rt], dc);
        }
        wg_commit();
        wg_wait<1>();
    } else {
        mma_chunk<C::RT, C::NT>(acc, af, xa, chunk);
    }
}

/* Multiplies the unit in st (scale table sb) into acc. nbv: valid 32-blocks (Q8_0). wrow0:
 * the warp's first weight row in the tile (its fragments RS rows apart), wtok0 its first
 * token. */
template <uint32_t T, int I>
static __device__ __forceinline__ void compute_unit(const unsigned char *st, const unsigned char *sb,
                                                    float (&acc)[mmq_cfg<T, I>::RT][mmq_cfg<T, I>::NT][4],
                                                    int nbv, int wrow0, int wtok0, int lane) {
    using C = mmq_cfg<T, I>;
    constexpr int RT = C::RT, QS = C::F::q_stride, SBS = C::F::sb_stride, RS = C::RS;
    const int g = lane >> 2, t = lane & 3;
    const int wrow = wrow0 + g; /* + RS rt (+ 8): this lane's weight rows */
    /* ldmatrix: lane 8i + r8 gives row r8 of matrix i = {token tile 2np + (i >> 1)} x {even,
     * odd half (i & 1)} of the chunk */
    const int mi = lane >> 3, r8 = lane & 7;
    const uint32_t xa = smem_u32(st + C::X) + (wtok0 + 8 * (mi >> 1) + r8) * C::XS + 16 * (mi & 1);
    /* wgmma: chunk c's 16 K values are bytes 32 (c & 3).. of the rows of atom column c >> 2
     * (chunk_mma moves the start there) */
    const uint64_t desc = C::WG ? wg_desc_sw128(smem_u32(st + C::X)) : 0;
    const unsigned char *wbase = st + wrow * QS + 4 * t;
    const unsigned char *sbase = sb + wrow * SBS;

    if constexpr (T == QT_Q4_K) {
        /* bytes 32p + i (i < 32) of a row: low nibble = K 64p + i, high = 64p + 32 + i;
         * the word at 32p + 16h + 4t gives chunk 4p + h (low) and 4p + 2 + h (high) */
#pragma unroll
        for (int p = 0; p < 4; p++) {
            uint32_t sl[RT][2], ml[RT][2], sh[RT][2], mh[RT][2]; /* rows g, g+8 */
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int h8 = 0; h8 < 2; h8++) {
                    const unsigned char *e = sbase + (RS * rt + 8 * h8) * SBS + 16 * p;
                    const uint2 lo = *(const uint2 *)e, hi = *(const uint2 *)(e + 8);
                    sl[rt][h8] = lo.x;
                    ml[rt][h8] = lo.y;
                    sh[rt][h8] = hi.x;
                    mh[rt][h8] = hi.y;
                }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t alo[RT][4], ahi[RT][4];
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
#pragma unroll
                    for (int h8 = 0; h8 < 2; h8++) {
                        const uint32_t w = lds32(wbase + (RS * rt + 8 * h8) * QS + 32 * p + 16 * h);
                        const uint32_t w8 = w >> 8;
                        /* pairs (B0, B2) -> a[h8], (B1, B3) -> a[2 + h8]; q exact, then one
                         * rounding of q * d*sc - dmin*m */
                        alo[rt][h8] = h2_fma(h2_sub(and_or<0x000f000fu>(w, MAGIC), H_1024),
                                             sl[rt][h8], ml[rt][h8]);
                        alo[rt][2 + h8] = h2_fma(h2_sub(and_or<0x000f000fu>(w8, MAGIC), H_1024),
                                                 sl[rt][h8], ml[rt][h8]);
                        ahi[rt][h8] = h2_fma(h2_fma(and_or<0x00f000f0u>(w, MAGIC), H_SIXTEENTH, H_M64),
                                             sh[rt][h8], mh[rt][h8]);
                        ahi[rt][2 + h8] =
                            h2_fma(h2_fma(and_or<0x00f000f0u>(w8, MAGIC), H_SIXTEENTH, H_M64),
                                   sh[rt][h8], mh[rt][h8]);
                    }
                chunk_mma<C>(acc, alo, xa, desc, 4 * p + h);
                chunk_mma<C>(acc, ahi, xa, desc, 4 * p + 2 + h);
            }
        }
    } else if constexpr (T == QT_Q6_K) {
        /* K 128hh + 32a + l (l < 32): low nibble of ql[64hh + 32a + l], 2 high bits from
         * qh[32hh + l] >> 2a; K 128hh + 64 + 32a + l: high nibble of the same ql byte, bits
         * qh >> (4 + 2a). The ql word at 64hh + 32a + 16h + 4t and the qh word at
         * 128 + 32hh + 16h + 4t give chunk 8hh + 2a + h (low) and 8hh + 4 + 2a + h (high). */
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int aa = 0; aa < 2; aa++) {
                    const int cl = 8 * hh + 2 * aa + h, ch = cl + 4;
                    uint32_t alo[RT][4], ahi[RT][4];
#pragma unroll
                    for (int rt = 0; rt < RT; rt++)
#pragma unroll
                        for (int h8 = 0; h8 < 2; h8++) {
                            const unsigned char *wr = wbase + (RS * rt + 8 * h8) * QS;
                            const uint32_t ql = lds32(wr + 64 * hh + 32 * aa + 16 * h);
                            const uint32_t qh = lds32(wr + 128 + 32 * hh + 16 * h);
                            const unsigned char *e = sbase + (RS * rt + 8 * h8) * SBS;
                            const uint32_t s_lo = *(const uint32_t *)(e + 4 * cl);
                            const uint32_t s_hi = *(const uint32_t *)(e + 4 * ch);
                            /* the 2 high bits of byte B0 / B2 (low chunk: bits 2aa.., high
                             * chunk: bits 4 + 2aa..) moved to bits 4..5 / 8..9 by one shift,
                             * of B1 / B3 by another; the low chunk's nibble in bits 0..3
                             * gives 1024 + q, the high chunk's in bits 4..7 1024 + 16 q */
                            const uint32_t q02 = aa ? qh << 2 : qh << 4;
                            const uint32_t q13 = qh >> (4 + 2 * aa);
                            const uint32_t ql8 = ql >> 8;
                            alo[rt][h8] = h2_mul(
                                h2_sub(and_or<0x000f000fu>(ql, and_or<0x00300030u>(q02, MAGIC)),
                                       H_1056),
                                s_lo);
                            alo[rt][2 + h8] = h2_mul(
                                h2_sub(and_or<0x000f000fu>(ql8, and_or<0x00300030u>(q13, MAGIC)),
                                       H_1056),
                                s_lo);
                            ahi[rt][h8] = h2_mul(
                                h2_fma(and_or<0x00f000f0u>(ql, and_or<0x03000300u>(q02, MAGIC)),
                                       H_SIXTEENTH, H_M96),
                                s_hi);
                            ahi[rt][2 + h8] = h2_mul(
                                h2_fma(and_or<0x00f000f0u>(ql8, and_or<0x03000300u>(q13, MAGIC)),
                                       H_SIXTEENTH, H_M96),
                                s_hi);
                        }
                    chunk_mma<C>(acc, alo, xa, desc, cl);
                    chunk_mma<C>(acc, ahi, xa, desc, ch);
                }
    } else if constexpr (T == QT_MXFP4) {
        /* 32-block j = chunks 2j, 2j+1 = bytes 16j .. 16j + 15 (cuda_qtypes.cuh: nibble m of
         * word w is element 8w + m): chunk 2j + c's K 4t..4t+3 are the codes in half t & 1 of
         * word 2c + (t >> 1); tq_mx4 maps them to int8, then as Q8_0 */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j >= nbv) break;
            uint32_t a0[RT][4], a1[RT][4];
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int h8 = 0; h8 < 2; h8++) {
                    const unsigned char *wr = wbase - 4 * t + (RS * rt + 8 * h8) * QS + 16 * j + 4 * (t >> 1);
                    const uint32_t d2 = *(const uint32_t *)(sbase + (RS * rt + 8 * h8) * SBS + 4 * j);
                    const int sh = 16 * (t & 1);
                    const uint32_t w0 = tq_mx4(lds32(wr) >> sh) ^ 0x80808080u;
                    const uint32_t w1 = tq_mx4(lds32(wr + 8) >> sh) ^ 0x80808080u;
                    a0[rt][h8] = h2_mul(h2_sub(__byte_perm(w0, 0x64u, 0x4240), H_1152), d2);
                    a0[rt][2 + h8] = h2_mul(h2_sub(__byte_perm(w0, 0x64u, 0x4341), H_1152), d2);
                    a1[rt][h8] = h2_mul(h2_sub(__byte_perm(w1, 0x64u, 0x4240), H_1152), d2);
                    a1[rt][2 + h8] = h2_mul(h2_sub(__byte_perm(w1, 0x64u, 0x4341), H_1152), d2);
                }
            chunk_mma<C>(acc, a0, xa, desc, 2 * j);
            chunk_mma<C>(acc, a1, xa, desc, 2 * j + 1);
        }
    } else { /* Q8_0: 32-block j = chunks 2j, 2j+1 = bytes 32j .. 32j + 31 */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j >= nbv) break;
            uint32_t a0[RT][4], a1[RT][4];
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int h8 = 0; h8 < 2; h8++) {
                    const unsigned char *wr = wbase + (RS * rt + 8 * h8) * QS + 32 * j;
                    const uint32_t d2 = *(const uint32_t *)(sbase + (RS * rt + 8 * h8) * SBS + 4 * j);
                    /* int8 q -> unsigned q + 128 -> f16 1024 + (q + 128) -> q, exactly */
                    const uint32_t w0 = lds32(wr) ^ 0x80808080u, w1 = lds32(wr + 16) ^ 0x80808080u;
                    a0[rt][h8] = h2_mul(h2_sub(__byte_perm(w0, 0x64u, 0x4240), H_1152), d2);
                    a0[rt][2 + h8] = h2_mul(h2_sub(__byte_perm(w0, 0x64u, 0x4341), H_1152), d2);
                    a1[rt][h8] = h2_mul(h2_sub(__byte_perm(w1, 0x64u, 0x4240), H_1152), d2);
                    a1[rt][2 + h8] = h2_mul(h2_sub(__byte_perm(w1, 0x64u, 0x4341), H_1152), d2);
                }
            chunk_mma<C>(acc, a0, xa, desc, 2 * j);
            chunk_mma<C>(acc, a1, xa, desc, 2 * j + 1);
        }
    }
}

/* f(v) for each of a thread's accumulators. */
template <int RT, int NT, class F>
static __device__ __forceinline__ void each_acc(float (&acc)[RT][NT][4], F f) {
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                f(acc[rt][nt][i]);
}

/* act(gate) * up for this thread's outputs of a GLU launch's tile (store_y): fragment rows g
 * (gate) and g + 8 (up) of each 16 are one output row (wrow_of), y being (n, rows / 2), or
 * with H16 yh, the same outputs as the f16 activations of the next product (mmq_pos, mmq_f16:
 * the bits cuda_mmq_quantize would make of y). ACT and H16 template arguments, so that each
 * output's code is its own alone: the store runs once per finished tile, unrolled over the
 * thread's outputs, from a cold instruction cache. */
template <int RT, int NT, int RS, int ACT, bool H16>
static __device__ __forceinline__ void store_glu(const mmq_args &a, const float (&v)[RT][NT][4],
                                                 int row0, int tok0, int wrow0, int wtok0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int row = row0 + wrow0 + rt * RS + g; /* the gate's row in the launch */
                const int tok = tok0 + wtok0 + nt * 8 + 2 * t + i;
                if (row < a.rows && tok < a.n) {
                    const long long o = (long long)tok * (a.rows >> 1) + (((row >> 4) << 3) | g);
                    const float h = glu_val(ACT, v[rt][nt][i], v[rt][nt][i + 2]);
                    if (H16) mmq_xh(a.h16)[mmq_pos(o)] = mmq_f16(h); /* (rows / 2 is a multiple of 16) */
                    else a.y[o] = h;
                }
            }
}

/* A stacked launch's outputs (store_y): each row to its matrix's y (mmq_args.r1, r2). */
template <int RT, int NT, int RS>
static __device__ __forceinline__ void store_stack(const mmq_args &a, const float (&v)[RT][NT][4],
                                                   int row0, int tok0, int wrow0, int wtok0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int i2 = 0; i2 < 2; i2++) {
            const int row = row0 + wrow0 + rt * RS + g + 8 * i2;
            if (row >= a.rows) continue;
            float *y = a.y;
            int ld = a.r1, r = row;
            if (row >= a.r2) y = a.y3, ld = a.rows - a.r2, r = row - a.r2;
            else if (row >= a.r1) y = a.y2, ld = a.r2 - a.r1, r = row - a.r1;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int tok = tok0 + wtok0 + nt * 8 + 2 * t + i;
                    if (tok < a.n) y[(long long)tok * ld + r] = v[rt][nt][2 * i2 + i];
                }
        }
}

/* y = (or +=) v for this thread's outputs of the tile at (row0, tok0); the warp's first row
 * and token in the tile wrow0, wtok0, its fragments RS rows apart; a GLU launch's through
 * store_glu, a stacked one's through store_stack. */
template <int RT, int NT, int RS>
static __device__ __forceinline__ void store_y(const mmq_args &a, const float (&v)[RT][NT][4],
                                               int row0, int tok0, int wrow0, int wtok0, int lane) {
    if (a.r1 < a.rows) return store_stack<RT, NT, RS>(a, v, row0, tok0, wrow0, wtok0, lane);
#define MMQ_GLU_STORE(act)                                                                \
    return a.h16 ? store_glu<RT, NT, RS, act, true>(a, v, row0, tok0, wrow0, wtok0, lane)  \
                : store_glu<RT, NT, RS, act, false>(a, v, row0, tok0, wrow0, wtok0, lane)
    switch (a.glu) {
    case 0: break;
    case 1: MMQ_GLU_STORE(0);
    case 2: MMQ_GLU_STORE(1);
    case 3: MMQ_GLU_STORE(2);
    default: MMQ_GLU_STORE(3);
    }
#undef MMQ_GLU_STORE
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + wrow0 + rt * RS + g + 8 * (i >> 1);
                const int tok = tok0 + wtok0 + nt * 8 + 2 * t + (i & 1);
                if (row < a.rows && tok < a.n) {
                    float *o = a.y + (long long)tok * a.rows + row;
                    *o = a.accumulate ? *o + v[rt][nt][i] : v[rt][nt][i];
                }
            }
}

/* Block b's partial tile in slot sl (0: its first tile, 1: its last), at thread tid: float4 j
 * of the thread at j * MMQ_THREADS, so a warp's stores and the fixup's loads are 512
 * contiguous bytes. */
static __device__ __forceinline__ float4 *part_of(const mmq_args &a, long long b, int sl, int tid,
                                                  int nacc) {
    return (float4 *)(a.work + (b * 2 + sl) * MMQ_THREADS * (long long)nacc) + tid;
}

/* finish_tile's split tile: this block's partial to the work area, counted; false unless
 * this block is the last contributor, whose acc then holds the sum of every part from zero in
 * block order (the same sum whichever block arrives last). */
template <uint32_t T, int I>
static __device__ __forceinline__ bool sum_parts(const mmq_args &a, unsigned char *smem,
                                                 float (&acc)[mmq_cfg<T, I>::RT][mmq_cfg<T, I>::NT][4],
                                                 long long b, long long u_begin, long long tile, long long t0,
                                                 int tid) {
    using C = mmq_cfg<T, I>;
    constexpr int RT = C::RT, NT = C::NT, NACC = C::NACC;
    float4 *wp = part_of(a, b, tile == u_begin / a.nsb ? 0 : 1, tid, NACC);
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            wp[(rt * NT + nt) * MMQ_THREADS] =
                make_float4(acc[rt][nt][0], acc[rt][nt][1], acc[rt][nt][2], acc[rt][nt][3]);
    __syncthreads(); /* every thread's partial is written before the count goes up ... */
    const long long b_lo = unit_owner(a, t0), b_hi = unit_owner(a, t0 + a.nsb - 1);
    int *flag = (int *)(smem + C::CTRL);
    if (tid == 0) {
        /* ... and visible to the last contributor, whose count acquires the others' */
        const int before = atomic_add_acq_rel(&a.cnt[b_lo], 1);
        const int last = before == (int)(b_hi - b_lo);
        if (last) a.cnt[b_lo] = 0; /* every contributor has counted: reset for the next call */
        *flag = last;
    }
    __syncthreads(); /* (the next write of the flag is two main-loop barriers away) */
    if (!*flag) return false;
    /* every contributor's partial, this block's too (written above), from zero in block
     * order: the same sum whichever block arrives last, and no second tile of registers */
    each_acc(acc, [](float &v) { v = 0.0f; });
    for (long long bb = b_lo; bb <= b_hi; bb++) {
        const float4 *rp = part_of(a, bb, tile == unit_begin(a, bb) / a.nsb ? 0 : 1, tid, NACC);
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                /* from L2 (another SM wrote it) */
                const float4 p = __ldcg(rp + (rt * NT + nt) * MMQ_THREADS);
                acc[rt][nt][0] += p.x;
                acc[rt][nt][1] += p.y;
                acc[rt][nt][2] += p.z;
                acc[rt][nt][3] += p.w;
            }
    }
    return true;
}

/* End of a tile segment [u_begin or the tile's start, u] of block b: store y, or hand the
 * partial over. */
template <uint32_t T, int I>
static __device__ __forceinline__ void finish_tile(const mmq_args &a, unsigned char *smem,
                                                   float (&acc)[mmq_cfg<T, I>::RT][mmq_cfg<T, I>::NT][4],
                                                   long long b, long long u, long long u_begin,
                                                   const upos &p, int tid, int wrow0, int wtok0, int lane) {
    using C = mmq_cfg<T, I>;
    constexpr int RT = C::RT, NT = C::NT;
    const long long tile = (long long)p.rt * a.tiles_n + p.tn, t0 = tile * a.nsb;
    const int row0 = p.rt * C::BM, tok0 = p.tn * C::BN;
    if (!(u_begin <= t0 && u == t0 + a.nsb - 1)) /* a part of the tile: hand it over */
        if (!sum_parts<T, I>(a, smem, acc, b, u_begin, tile, t0, tid)) return;
    /* the whole tile, or the last contributor with every part summed: one store (one copy
     * of its code in the kernel) */
    store_y<RT, NT, C::RS>(a, acc, row0, tok0, wrow0, wtok0, lane);
}

template <uint32_t T, int I>
static __global__ void __launch_bounds__(MMQ_THREADS, mmq_cfg<T, I>::MINB) mmq_kernel(const mmq_args a_in) {
    using C = mmq_cfg<T, I>;
    constexpr int NS = C::NS, RT = C::RT, NT = C::NT;
    /* never launched: a type whose stages do not fit (its SMEM is over every device's
     * limit), a wgmma tile in an image built without wgmma (cuda_ctx.wgmma) */
    if constexpr (!C::FITS || (C::WG && !SMELT_WGMMA)) {
        return;
    } else {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* the swizzled atoms' addresses (wgmma XORs the address bits) need a 1,024-aligned base:
     * the kernel has no static shared memory, so the dynamic one starts its window */
    if constexpr (C::WG)
        if (smem_u32(smem) & 1023) __trap();
    /* the warp's first weight row and token in the tile: warps WM x WN, or two warpgroups
     * of 64 RT rows whose warp w takes rows 16 w of each 64 */
    const int wrow0 = C::WG ? (warp >> 2) * 64 * RT + (warp & 3) * 16 : (warp % C::WM) * 16 * RT;
    const int wtok0 = C::WG ? 0 : (warp / C::WM) * 8 * NT;
    mmq_args a = a_in;
    if (a.h16) mmq_zero_cnt(mmq_cnt(a.h16)); /* (the next product runs after this launch) */
    if (a.tile_eid) { /* by id: the used token tiles are a prefix; the work is known here only */
        int *used_s = (int *)(smem + C::CTRL) + 1; /* (the fixup's flag is word 0) */
        if (tid == 0) *used_s = 0;
        __syncthreads();
        int mine = 0;
        for (int i = tid; i < a.n_tiles_max; i += MMQ_THREADS)
            mine += a.tile_eid[i] >= 0;
        if (mine) atomicAdd(used_s, mine);
        __syncthreads();
        const int used = *used_s;
        a.tiles_n = used;
        a.units = (long long)((a.rows + C::BM - 1) / C::BM) * used * a.nsb;
        if (used == 0) return; /* (uniform) */
    }
    const long long b = blockIdx.x;
    const long long u_begin = unit_begin(a, b), u_end = unit_begin(a, b + 1);

    float acc[RT][NT][4];
    each_acc(acc, [](float &v) { v = 0.0f; });

    upos lp = pos_of(a, u_begin), cp = lp; /* the unit to load next, the unit to compute */
#pragma unroll
    for (int s = 0; s < NS - 1; s++) { /* fill the pipeline; one commit group per unit */
        if (u_begin + s < u_end) {
            load_unit<T, I>(a, smem + s * C::STAGE, lp, tid);
            pos_next(a, lp);
        }
        cp_commit();
    }
    for (long long u = u_begin; u < u_end; u++) {
        const int i = (int)(u - u_begin);
        unsigned char *st = smem + (i % NS) * C::STAGE;
        cp_wait<NS - 2>(); /* unit u has landed (this thread's copies) ... */
        if constexpr (C::WG) wg_fence_smem(); /* ... for the tensor cores' reads too ... */
        __syncthreads();   /* ... every thread's; every warp is done with unit u - 1 */
        prep_scales<T, I>(a, st, smem + C::SB, cp, tid);
        if (u + NS - 1 < u_end) {
            load_unit<T, I>(a, smem + ((i + NS - 1) % NS) * C::STAGE, lp, tid);
            pos_next(a, lp);
        }
        cp_commit();
        __syncthreads(); /* the scale table is written */
        compute_unit<T, I>(st, smem + C::SB, acc, slice_blocks(a, cp.s), wrow0, wtok0, lane);
        if constexpr (C::WG) {
            /* the unit's products complete before its stage is refilled (the next unit's
             * copies, after the barrier) and before acc is read */
            wg_wait<0>();
            each_acc(acc, [](float &v) { wg_pin(v); });
        }
        if (cp.s == a.nsb - 1 || u == u_end - 1) {
            finish_tile<T, I>(a, smem, acc, b, u, u_begin, cp, tid, wrow0, wtok0, lane);
            each_acc(acc, [](float &v) { v = 0.0f; });
        }
        pos_next(a, cp);
    }
    }
}

/* --------------------------------------------------------------- launchers ---- */

template <uint32_t T> static int smem_of(int tile) {
    static_assert(N_TILES == 11, "one case per tile below");
    switch (tile) {
    case 0: return mmq_cfg<T, 0>::SMEM;
    case 1: return mmq_cfg<T, 1>::SMEM;
    case 2: return mmq_cfg<T, 2>::SMEM;
    case 3: return mmq_cfg<T, 3>::SMEM;
    case 4: return mmq_cfg<T, 4>::SMEM;
    case 5: return mmq_cfg<T, 5>::SMEM;
    case 6: return mmq_cfg<T, 6>::SMEM;
    case 7: return mmq_cfg<T, 7>::SMEM;
    case 8: return mmq_cfg<T, 8>::SMEM;
    case 9: return mmq_cfg<T, 9>::SMEM;
    default: return mmq_cfg<T, 10>::SMEM;
    }
}

static int smem_bytes_of(uint32_t type, int tile) {
    switch (type) {
    case QT_Q4_K: return smem_of<QT_Q4_K>(tile);
    case QT_Q6_K: return smem_of<QT_Q6_K>(tile);
    case QT_MXFP4: return smem_of<QT_MXFP4>(tile);
    default: return smem_of<QT_Q8_0>(tile);
    }
}

static int type_index(uint32_t type) {
    return type == QT_Q4_K ? 0 : type == QT_Q6_K ? 1 : type == QT_MXFP4 ? 3 : 2;
}

/* Device facts, queried into the launch context at its first mmq call: the SM count
 * (cuda_ctx.n_sm), the opt-in shared memory per block (cuda_ctx.smem_optin, read at init) and, per type and tile,
 * the resident blocks per SM (mmq_occ; 0 where the tile does not fit, and for the wgmma tiles
 * where the kernels run without wgmma: cuda_ctx.wgmma). The query also raises each kernel's
 * dynamic shared-memory limit on the device. */
static_assert(N_TILES == CUDA_MMQ_TILES && 4 == CUDA_MMQ_TYPES, "cuda_ctx.mmq_occ's shape");

template <uint32_t T, int I> static cudaError_t query_occ(int *occ, int smem_max, int wgmma) {
    constexpr int bytes = mmq_cfg<T, I>::SMEM;
    *occ = 0;
    if (bytes > smem_max || (mmq_cfg<T, I>::WG && !wgmma)) return cudaSuccess;
    cudaError_t ce = cudaFuncSetAttribute(mmq_kernel<T, I>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (ce == cudaSuccess)
        ce = cudaOccupancyMaxActiveBlocksPerMultiprocessor(occ, mmq_kernel<T, I>, MMQ_THREADS,
                                                           bytes);
    return ce;
}

template <uint32_t T> static cudaError_t query_type(int *occ, int smem_max, int wgmma) {
    cudaError_t ce = query_occ<T, 0>(&occ[0], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 1>(&occ[1], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 2>(&occ[2], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 3>(&occ[3], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 4>(&occ[4], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 5>(&occ[5], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 6>(&occ[6], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 7>(&occ[7], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 8>(&occ[8], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 9>(&occ[9], smem_max, wgmma);
    if (ce == cudaSuccess) ce = query_occ<T, 10>(&occ[10], smem_max, wgmma);
    return ce;
}

static cudaError_t device_facts(struct cuda_ctx *ctx, const struct cuda_ctx **out) {
    if (!ctx->mmq_ready) {
        const int smem_max = ctx->smem_optin;
        int occ[CUDA_MMQ_TYPES][N_TILES] = {{0}};
        cudaError_t ce = query_type<QT_Q4_K>(occ[0], smem_max, ctx->wgmma);
        if (ce == cudaSuccess) ce = query_type<QT_Q6_K>(occ[1], smem_max, ctx->wgmma);
        if (ce == cudaSuccess) ce = query_type<QT_Q8_0>(occ[2], smem_max, ctx->wgmma);
        if (ce == cudaSuccess) ce = query_type<QT_MXFP4>(occ[3], smem_max, ctx->wgmma);
        if (ce != cudaSuccess) return ce;
        memcpy(ctx->mmq_occ, occ, sizeof occ);
        ctx->mmq_ready = 1;
    }
    *out = ctx;
    return cudaSuccess;
}

/* The launch shape of a product: grid, units, and the work bytes its split tiles need. */
struct mmq_plan {
    long long units;
    int nsb, tiles_n, grid;
    uint64_t work_bytes;
};

static mmq_plan plan_of(const struct cuda_ctx *d, uint32_t type, int64_t rows, int64_t k, int64_t n,
                        int tile) {
    const int bm = tile_bm(tile), bn = tile_bn(tile);
    mmq_plan p;
    p.nsb = (int)((k + 255) / 256);
    p.tiles_n = (int)((n + bn - 1) / bn);
    p.units = (long long)((rows + bm - 1) / bm) * p.tiles_n * p.nsb;
    long long grid = (long long)d->n_sm * d->mmq_occ[type_index(type)][tile];
    if (grid > MMQ_MAX_BLOCKS) grid = MMQ_MAX_BLOCKS;
    if (grid > p.units) grid = p.units;
    if (grid < 1) grid = 1;
    p.grid = (int)grid;
    p.work_bytes = (uint64_t)p.grid * 2 * bm * bn * sizeof(float);
    return p;
}

/* Heuristic (the static choice: SMELT_NO_TUNE=1, and the fallback of the backend's
 * measured choice, cuda_matmul.c): the token width is the smallest tile width >= n (at
 * most 64; wider n takes several token tiles); 256 weight rows where that leaves at least
 * 4 units per block (the activations are re-read once per row tile, so taller tiles read
 * less of them; but a tile split between many blocks costs its last block the sum of all
 * their partials), else 128 (4096-row matrices at n <= 128, K/V projections: measured on
 * the H200, 128-row tiles were up to 2x faster there). Tiles that do not fit the device
 * are skipped. */
static int pick_tile(const struct cuda_ctx *d, uint32_t type, int64_t rows, int64_t k, int64_t n) {
    const int ti = type_index(type);
    int want[2];
    if (n <= 16) want[0] = 1, want[1] = 0;
    else if (n <= 32) want[0] = 3, want[1] = 2;
    else want[0] = 4, want[1] = 6;
    for (int c = 0; c < 2; c++) {
        const int t = want[c];
        if (!d->mmq_occ[ti][t]) continue;
        const mmq_plan p = plan_of(d, type, rows, k, n, t);
        if (c == 1 || p.units >= 4LL * p.grid) return t;
    }
    for (int t = 0; t < N_TILES; t++) /* anything that fits */
        if (d->mmq_occ[ti][t]) return t;
    return 0;
}

template <uint32_t T, int I> static cudaError_t launch_tile(const mmq_args &a, cudaStream_t st) {
    mmq_kernel<T, I><<<a.grid, MMQ_THREADS, mmq_cfg<T, I>::SMEM, st>>>(a);
    return cudaGetLastError();
}

template <uint32_t T> static cudaError_t launch_type(const mmq_args &a, int tile, cudaStream_t st) {
    switch (tile) {
    case 0: return launch_tile<T, 0>(a, st);
    case 1: return launch_tile<T, 1>(a, st);
    case 2: return launch_tile<T, 2>(a, st);
    case 3: return launch_tile<T, 3>(a, st);
    case 4: return launch_tile<T, 4>(a, st);
    case 5: return launch_tile<T, 5>(a, st);
    case 6: return launch_tile<T, 6>(a, st);
    case 7: return launch_tile<T, 7>(a, st);
    case 8: return launch_tile<T, 8>(a, st);
    case 9: return launch_tile<T, 9>(a, st);
    default: return launch_tile<T, 10>(a, st);
    }
}

extern "C" int cuda_mmq_tile_count(void) {
    return N_TILES;
}

extern "C" void cuda_mmq_tile_shape(int tile, int *rows, int *tokens) {
    if (tile < 0 || tile >= N_TILES) tile = 0;
    *rows = tile_bm(tile);
    *tokens = tile_bn(tile);
}

extern "C" void cuda_mmq_tile_name(int tile, char *buf, size_t size) {
    if (tile < 0 || tile >= N_TILES) tile = 0;
    snprintf(buf, size, "%dx%d%s", tile_bm(tile), tile_bn(tile), tiles[tile][5] ? " wgmma" : "");
}

extern "C" int cuda_mmq_supported(uint32_t type, int64_t k) {
    if (k <= 0 || k > (1 << 30)) return 0;
    switch (type) {
    case QT_Q4_K:
    case QT_Q6_K: return k % 256 == 0;
    case QT_Q8_0: return k % 64 == 0; /* the scale copies are 4-byte pairs of blocks */
    case QT_MXFP4: return k % 32 == 0;
    default: return 0;
    }
}

extern "C" int cuda_mmq_tile_auto(struct cuda_ctx *ctx, const struct cuda_qweight *w, int64_t n) {
    const struct cuda_ctx *d;
    if (device_facts(ctx, &d) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return pick_tile(d, w->type, w->rows, w->k, n);
}

extern "C" int cuda_mmq_tile_fits(struct cuda_ctx *ctx, uint32_t type, int tile) {
    if (tile < 0 || tile >= N_TILES || !cuda_mmq_supported(type, type == QT_Q8_0 ? 64 : 256)) return 0;
    const struct cuda_ctx *d;
    if (device_facts(ctx, &d) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return d->mmq_occ[type_index(type)][tile] > 0;
}

extern "C" int cuda_mmq_grid(struct cuda_ctx *ctx, const struct cuda_qweight *w, int64_t n, int tile) {
    const struct cuda_ctx *d;
    if (device_facts(ctx, &d) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (tile == CUDA_MMQ_TILE_AUTO) tile = pick_tile(d, w->type, w->rows, w->k, n);
    if (tile < 0 || tile >= N_TILES || !cuda_mmq_supported(w->type, w->k)) return -1;
    return plan_of(d, w->type, w->rows, w->k, n, tile).grid;
}

/* Scratch: counters (MMQ_CNT_BYTES), xh (n*k f16, padded to 256 B), then the work area. */
static uint64_t xh_bytes(int64_t k, int64_t n) {
    return ((uint64_t)k * (uint64_t)n * 2 + 255) & ~255ull;
}

extern "C" smelt_status cuda_mmq_scratch_bytes(struct cuda_ctx *ctx, int64_t rows, int64_t k, int64_t n,
                                               uint64_t *bytes, struct err *e) {
    if (rows < 1 || k < 1 || n < 1)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmq: scratch for %lld x %lld, %lld tokens",
                       (long long)rows, (long long)k, (long long)n);
    const struct cuda_ctx *d;
    CUDA_TRY(device_facts(ctx, &d), e);
    uint64_t work = 0;
    const uint32_t types[CUDA_MMQ_TYPES] = {QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_MXFP4};
    for (int ti = 0; ti < CUDA_MMQ_TYPES; ti++)
        for (int t = 0; t < N_TILES; t++)
            if (d->mmq_occ[ti][t]) {
                const mmq_plan p = plan_of(d, types[ti], rows, k, n, t);
                if (p.work_bytes > work) work = p.work_bytes;
            }
    *bytes = MMQ_CNT_BYTES + xh_bytes(k, n) + work;
    return SMELT_OK;
}

extern "C" smelt_status cuda_mmq_quantize(struct cuda_ctx *ctx, const float *x, int64_t k,
                                          int64_t n, void *scratch, struct err *e) {
    if (k <= 0 || k % 16 != 0 || n < 1)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmq: converting %lld x %lld activations (k %% 16 != 0?)", (long long)n,
                       (long long)k);
    int *cnt = mmq_cnt(scratch);
    __half *xh = mmq_xh(scratch);
    const long long groups = (long long)(k / 16) * n;
    const int tb = 256;
    const unsigned blocks = (unsigned)((groups + tb - 1) / tb);
    if (((uintptr_t)x & 15) == 0)
        mmq_convert_kernel<true><<<blocks, tb, 0, ctx->stream>>>(x, xh, cnt, groups);
    else
        mmq_convert_kernel<false><<<blocks, tb, 0, ctx->stream>>>(x, xh, cnt, groups);
    CUDA_TRY_LAUNCH(e);
    return SMELT_OK;
}

/* cuda_mmq_pre, cuda_mmq_glu_pre and cuda_mmq_stack_pre: y = (or +=) W x; act(G x) * (U x)
 * with glu = 1 + act (w[0] the gate, w[1] the up, nw = 2); or nw matrices stacked, y[i] =
 * W_i x (glu 0). */
static smelt_status launch_plain(struct cuda_ctx *ctx, const struct cuda_qweight *const *w, int nw, int glu,
                                 int64_t n, float *const *y, void *h16, void *scratch, uint64_t scratch_bytes,
                                 int accumulate, int tile, struct err *e) {
    const struct cuda_qweight *w0 = w[0], *up = glu ? w[1] : NULL;
    if (!cuda_mmq_supported(w0->type, w0->k))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmq: type %s with row length %lld",
                       qtype_name(w0->type), (long long)w0->k);
    const int nm = glu ? 1 : nw; /* matrices whose rows stack (a GLU's gate and up interleave instead) */
    int64_t end[CUDA_MMQ_STACK], rows = 0; /* the launch row after each stacked matrix's last */
    for (int i = 0; i < nm; i++) {
        if (w[i]->type != w0->type || w[i]->k != w0->k || (nm > 1 && w[i]->rows < 1))
            return err_set(e, SMELT_ERR_INVALID,
                           "cuda mmq stack: matrix %d is %s %lld x %lld, matrix 0 %s %lld x %lld (one type and "
                           "row length)",
                           i, qtype_name(w[i]->type), (long long)w[i]->rows, (long long)w[i]->k,
                           qtype_name(w0->type), (long long)w0->rows, (long long)w0->k);
        end[i] = rows += w[i]->rows;
    }
    if (up) rows = 2 * w0->rows;
    if (n < 1 || n > (1 << 24) || rows < 1 || rows > (1 << 28))
        return err_set(e, SMELT_ERR_INVALID, "cuda mmq: %lld token rows x %lld weight rows",
                       (long long)n, (long long)rows);
    if (up && (up->type != w0->type || up->k != w0->k || up->rows != w0->rows || w0->rows % 8 || glu < 1 ||
               glu > 4 || accumulate))
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmq glu: gate %s %lld x %lld and up %s %lld x %lld (same shapes and type, rows a "
                       "multiple of 8, act %d of 0..3, no accumulation)",
                       qtype_name(w0->type), (long long)w0->rows, (long long)w0->k, qtype_name(up->type),
                       (long long)up->rows, (long long)up->k, glu - 1);
    if (h16 && w0->rows % 16)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmq glu: f16 output of %lld rows (the activations' layout needs a multiple of 16)",
                       (long long)w0->rows);
    const struct cuda_ctx *d;
    CUDA_TRY(device_facts(ctx, &d), e);
    if (tile == CUDA_MMQ_TILE_AUTO) tile = pick_tile(d, w0->type, rows, w0->k, n);
    if (tile < 0 || tile >= N_TILES)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmq: tile %d (0..%d)", tile, N_TILES - 1);
    if (!d->mmq_occ[type_index(w0->type)][tile])
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "cuda mmq: tile %d needs %d B of shared memory, the device has %d", tile,
                       smem_bytes_of(w0->type, tile), d->smem_optin);
    const mmq_plan p = plan_of(d, w0->type, rows, w0->k, n, tile);
    const uint64_t need = MMQ_CNT_BYTES + xh_bytes(w0->k, n) + p.work_bytes;
    if (scratch_bytes < need)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmq: scratch of %llu B, %s %lld x %lld with %lld tokens needs %llu",
                       (unsigned long long)scratch_bytes, qtype_name(w0->type), (long long)rows,
                       (long long)w0->k, (long long)n, (unsigned long long)need);
    for (int i = 0; i < (h16 ? 0 : nm); i++)
        if (!y[i]) return err_set(e, SMELT_ERR_INVALID, "cuda mmq: no output");
    const struct cuda_qweight *w1 = nw > 1 ? w[1] : NULL, *w2 = nw > 2 ? w[2] : NULL;
    unsigned char *sc = (unsigned char *)scratch;
    mmq_args a;
    a.wq = (const unsigned char *)w0->q;
    a.ws = (const unsigned char *)w0->s;
    a.wd = (const unsigned char *)w0->d;
    a.wq2 = w1 ? (const unsigned char *)w1->q : NULL;
    a.ws2 = w1 ? (const unsigned char *)w1->s : NULL;
    a.wd2 = w1 ? (const unsigned char *)w1->d : NULL;
    a.wq3 = w2 ? (const unsigned char *)w2->q : NULL;
    a.ws3 = w2 ? (const unsigned char *)w2->s : NULL;
    a.wd3 = w2 ? (const unsigned char *)w2->d : NULL;
    a.glu = glu;
    a.cnt = (int *)sc;
    a.xh = (const __half *)(sc + MMQ_CNT_BYTES);
    a.work = (float *)(sc + MMQ_CNT_BYTES + xh_bytes(w0->k, n));
    a.y = h16 ? NULL : y[0];
    a.y2 = nm > 1 ? y[1] : NULL;
    a.y3 = nm > 2 ? y[2] : NULL;
    a.r1 = (int)(nm > 1 ? end[0] : rows);
    a.r2 = (int)(nm > 2 ? end[1] : rows);
    a.h16 = h16;
    a.units = p.units;
    a.rows = (int)rows;
    a.k = (int)w0->k;
    a.n = (int)n;
    a.accumulate = accumulate != 0;
    a.nsb = p.nsb;
    a.tiles_n = p.tiles_n;
    a.grid = p.grid;
    a.tile_eid = NULL;
    a.n_tiles_max = 0;
    cudaStream_t st = ctx->stream;
    cudaError_t ce;
    switch (w0->type) {
    case QT_Q4_K: ce = launch_type<QT_Q4_K>(a, tile, st); break;
    case QT_Q6_K: ce = launch_type<QT_Q6_K>(a, tile, st); break;
    case QT_MXFP4: ce = launch_type<QT_MXFP4>(a, tile, st); break;
    default: ce = launch_type<QT_Q8_0>(a, tile, st); break;
    }
    if (ce != cudaSuccess)
        return err_set(e, SMELT_ERR_DEVICE, "cuda mmq%s: %s %lld x %lld, %lld tokens, tile %d: %s",
                       up ? " glu" : nm > 1 ? " stack" : "", qtype_name(w0->type), (long long)rows, (long long)w0->k,
                       (long long)n, tile, cudaGetErrorString(ce));
    return SMELT_OK;
}

extern "C" smelt_status cuda_mmq_pre(struct cuda_ctx *ctx, const struct cuda_qweight *w, int64_t n, float *y,
                                     void *scratch, uint64_t scratch_bytes, int accumulate,
                                     int tile, struct err *e) {
    return launch_plain(ctx, &w, 1, 0, n, &y, NULL, scratch, scratch_bytes, accumulate, tile, e);
}

extern "C" smelt_status cuda_mmq_glu_pre(struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                                         const struct cuda_qweight *up, int act, int64_t n, float *y,
                                         void *h16, void *scratch, uint64_t scratch_bytes, int tile,
                                         struct err *e) {
    const struct cuda_qweight *w[2] = {gate, up};
    return launch_plain(ctx, w, 2, act + 1, n, &y, h16, scratch, scratch_bytes, 0, tile, e);
}

extern "C" smelt_status cuda_mmq_stack_pre(struct cuda_ctx *ctx, const struct cuda_qweight *const *w, int count,
                                           int64_t n, float *const *y, void *scratch, uint64_t scratch_bytes,
                                           int tile, struct err *e) {
    if (count < 1 || count > CUDA_MMQ_STACK || !w || !y)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmq stack: %d matrices (1..%d)", count, CUDA_MMQ_STACK);
    return launch_plain(ctx, w, count, 0, n, y, NULL, scratch, scratch_bytes, 0, tile, e);
}

extern "C" smelt_status cuda_mmq(struct cuda_ctx *ctx, const struct cuda_qweight *w, const float *x,
                                 int64_t n, float *y, void *scratch, uint64_t scratch_bytes,
                                 int accumulate, struct err *e) {
    if (!cuda_mmq_supported(w->type, w->k))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmq: type %s with row length %lld",
                       qtype_name(w->type), (long long)w->k);
    smelt_status st = cuda_mmq_quantize(ctx, x, w->k, n, scratch, e);
    if (st) return st;
    return cuda_mmq_pre(ctx, w, n, y, scratch, scratch_bytes, accumulate, CUDA_MMQ_TILE_AUTO, e);
}

extern "C" int cuda_mmq_id_tile(struct cuda_ctx *ctx, uint32_t type, int64_t rows_e, int64_t k,
                                int64_t n_pairs, int tokens) {
    const struct cuda_ctx *d;
    if (device_facts(ctx, &d) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (!cuda_mmq_supported(type, k)) return -1;
    const int ti = type_index(type);
    /* the 256-row tile where every block gets 2 tiles or more of the expected work, else 128 */
    const int tall = tokens == 16 ? 1 : tokens == 32 ? 3 : tokens == 64 ? 4 : -1;
    const int low = tokens == 16 ? 0 : tokens == 32 ? 2 : tokens == 64 ? 6 : -1;
    if (tall < 0) return -1;
    const long long tiles =
        (long long)((rows_e + 255) / 256) * ((n_pairs + tokens - 1) / tokens);
    const bool tall_ok = d->mmq_occ[ti][tall] > 0, low_ok = d->mmq_occ[ti][low] > 0;
    if (tall_ok && (!low_ok || tiles >= 2LL * d->n_sm * d->mmq_occ[ti][tall])) return tall;
    return low_ok ? low : -1;
}

extern "C" smelt_status cuda_mmq_id_pre(struct cuda_ctx *ctx, const struct cuda_qweight *w,
                                        int64_t rows_e, int n_exp, const int32_t *tile_eid,
                                        int64_t n_tiles, int64_t n, float *y, void *scratch,
                                        uint64_t scratch_bytes, int tile, struct err *e) {
    if (!cuda_mmq_supported(w->type, w->k))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmq by id: type %s with row length %lld",
                       qtype_name(w->type), (long long)w->k);
    const struct cuda_ctx *d;
    CUDA_TRY(device_facts(ctx, &d), e);
    int bm = 0, bn = 0;
    if (tile >= 0 && tile < N_TILES) cuda_mmq_tile_shape(tile, &bm, &bn);
    if (n_exp < 1 || rows_e < 1 || rows_e * n_exp != w->rows || rows_e > (1 << 28) || n < 1 ||
        n > (1 << 24) || tile < 0 || tile >= N_TILES || n_tiles < 1 || n_tiles * bn != n)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmq by id: %lld rows x %d experts of %lld, %lld tiles of %d tokens, "
                       "%lld tokens, tile %d",
                       (long long)rows_e, n_exp, (long long)w->rows, (long long)n_tiles, bn,
                       (long long)n, tile);
    if (!d->mmq_occ[type_index(w->type)][tile])
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "cuda mmq by id: tile %d needs %d B of shared memory, the device has %d",
                       tile, smem_bytes_of(w->type, tile), d->smem_optin);
    /* the grid as for the bound (every tile used); the blocks split the used tiles */
    const mmq_plan p = plan_of(d, w->type, rows_e, w->k, n, tile);
    const uint64_t need = MMQ_CNT_BYTES + xh_bytes(w->k, n) + p.work_bytes;
    if (scratch_bytes < need)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmq by id: scratch of %llu B, needs %llu",
                       (unsigned long long)scratch_bytes, (unsigned long long)need);
    unsigned char *sc = (unsigned char *)scratch;
    mmq_args a;
    a.wq = (const unsigned char *)w->q;
    a.ws = (const unsigned char *)w->s;
    a.wd = (const unsigned char *)w->d;
    a.wq2 = a.ws2 = a.wd2 = a.wq3 = a.ws3 = a.wd3 = NULL;
    a.glu = 0; /* (a GLU product by id would need the expert stride of rows_e / 2 in wrow_of) */
    a.y2 = a.y3 = NULL;
    a.r1 = a.r2 = (int)rows_e;
    a.cnt = (int *)sc;
    a.xh = (const __half *)(sc + MMQ_CNT_BYTES);
    a.work = (float *)(sc + MMQ_CNT_BYTES + xh_bytes(w->k, n));
    a.y = y;
    a.h16 = NULL;
    a.units = p.units;
    a.rows = (int)rows_e;
    a.k = (int)w->k;
    a.n = (int)n;
    a.accumulate = 0;
    a.nsb = p.nsb;
    a.tiles_n = p.tiles_n;
    a.grid = p.grid;
    a.tile_eid = tile_eid;
    a.n_tiles_max = (int)n_tiles;
    cudaStream_t st = ctx->stream;
    cudaError_t ce;
    switch (w->type) {
    case QT_Q4_K: ce = launch_type<QT_Q4_K>(a, tile, st); break;
    case QT_Q6_K: ce = launch_type<QT_Q6_K>(a, tile, st); break;
    case QT_MXFP4: ce = launch_type<QT_MXFP4>(a, tile, st); break;
    default: ce = launch_type<QT_Q8_0>(a, tile, st); break;
    }
    if (ce != cudaSuccess)
        return err_set(e, SMELT_ERR_DEVICE, "cuda mmq by id: %s %lld x %lld, %lld tokens: %s",
                       qtype_name(w->type), (long long)rows_e, (long long)w->k, (long long)n,
                       cudaGetErrorString(ce));
    return SMELT_OK;
}
