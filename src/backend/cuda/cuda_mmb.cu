/* Quantized matrix x 2..64 token rows on the tensor cores. See cuda_mmb.h; the bytes and
 * instructions per weight, the ceilings and why f16 rather than int8 MMA are in
 * docs/cuda-backend.md ("Small-batch tensor-core matmul").
 *
 * Work split. A block is 4 warps over 64 weight rows (a warp: one 16-row m16 tile) and one
 * range of K super-blocks; the grid is (row tiles) x (K splits), the split count chosen from
 * (rows, k, SMs) only, so that about 4 blocks per SM run whatever n is. Each warp keeps its
 * 16 rows x 8*NT tokens of f32 accumulators in registers over its whole K range. A block
 * that shares its row tile with other K splits writes its partial tile (fragment order,
 * coalesced float4) to the scratch and counts itself; the last to arrive adds the partials
 * in split order (the same bits whoever is last) and stores y. Counters are zeroed by the
 * conversion and reset by their last user, so a captured graph replays.
 *
 * Weights: lane (g, t) of a warp (g = lane >> 2, t = lane & 3) owns rows g and g + 8 of the
 * warp's tile. Of each row's 128 quant bytes per super-block (split layout: byte 32c + i,
 * i < 32, holds K 64c + i in its low nibble, K 64c + 32 + i in its high one) it loads the
 * 16-byte pieces t and 4 + t with one ld.global.v4 each (a warp instruction reads 8 rows x
 * 64 contiguous bytes), plus the row's 16-byte scale record; the next super-block's loads
 * are issued before the current one's math, and the first ones before griddepcontrol.wait.
 * Nothing goes through shared memory but the activations.
 *
 * Fragments (PTX ISA, mma.m16n8k16, f16): A a0 = row g, k {2t, 2t+1}; a1 = row g+8, same k;
 * a2 = row g, k {2t+8, 2t+9}; a3 = row g+8, same k. B b0 = k {2t, 2t+1}, token g; b1 = k
 * {2t+8, 2t+9}. The sum over k does not care how the 16 mma k slots map to real K
 * positions, as long as A and B agree, so the kernel picks the map its loads make cheap:
 * word wd (bytes 4wd..4wd+3) of piece L (0, 1) of lane t holds, with c = 2L + (t >> 1) and
 * kb = 64c + 16(t & 1) + 4wd, the low nibbles of K kb..kb+3 and the high nibbles of
 * K kb+32..kb+35. One LOP3 with 0x000f000f (0x00f000f0) turns bytes 0 and 2 into an f16x2
 * of K (kb, kb+2) (+32), the word shifted by 8 gives (kb+1, kb+3). So step st = 8L + 2wd +
 * h (h = 0 low nibbles, 1 high) of a super-block maps mma slots {2t, 2t+1} to K {kb', kb'+2}
 * and {2t+8, 2t+9} to {kb'+1, kb'+3}, kb' = kb + 32h. The conversion kernel writes the f16
 * activations in exactly that order (per token, per super-block, per step: 16 values in
 * slot order), so ldmatrix.x4 hands each lane its B fragments of two steps at once.
 * Dequantization is mmq's (cuda_mma.cuh): 1024 + q exact in f16, q recovered exactly, then
 * one f16 FMA q * f16(d*sc) - f16(dmin*m): the same f16 weights as mmq, one rounding each.
 *
 * Shared memory: 2 stages x 8*NT tokens x 528 B (256 f16 + 16 B pad: the 8 rows of an
 * ldmatrix matrix fall in distinct banks). */
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"

extern "C" {
#include "backend/cuda/cuda_mmb.h"
#include "quant/quant.h"
}

#define MMB_THREADS 128
#define MMB_BM 64           /* weight rows per block: 4 warps x 16 */
#define MMB_XS 528          /* shared bytes per token per stage */
#define MMB_BLOCKS_PER_SM 4 /* the K split aims at this many blocks per SM */

struct mmb_args {
    const unsigned char *wq, *ws; /* split-layout Q4_K: quant bits, 16-byte scale records */
    const __half *xp;             /* (8 NT, k) f16 activations, fragment order */
    float *y;                     /* (n, rows) */
    float *part;                  /* partial tiles: (row tile, split, thread, NT float4) */
    int *cnt;                     /* one counter per row tile */
    int rows, k, n, nsb, kr, ks, accumulate;
};

/* ------------------------------------------------------------------ kernels ---- */

static __device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    lo = fabsf(lo) > 65504.0f ? copysignf(65504.0f, lo) : lo; /* clamp; NaN stays NaN */
    hi = fabsf(hi) > 65504.0f ? copysignf(65504.0f, hi) : hi;
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | ((uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16);
}

/* x (n, k) f32 -> xp (npad, k) f16 in fragment order (file comment), rows n..npad-1 zero;
 * also zeroes n_cnt counters. One thread per (token, super-block, step): 16 values. */
static __global__ void mmb_convert_kernel(const float *x, __half *xp, int *cnt, int n_cnt, int k, int n,
                                          long long items) {
    pdl_wait();
    pdl_trigger();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_cnt) cnt[i] = 0;
    if (i >= items) return;
    const int nsb = k >> 8, st = (int)(i & 15);
    const long long ts = i >> 4;
    const int tok = (int)(ts / nsb), s = (int)(ts - (long long)tok * nsb);
    const int L = st >> 3, wd = (st >> 1) & 3, h = st & 1;
    uint32_t o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (tok < n) {
        const float *src = x + (long long)tok * k + s * 256;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const int kb = 64 * (2 * L + (t >> 1)) + 32 * h + 16 * (t & 1) + 4 * wd;
            const float4 v = *(const float4 *)(src + kb);
            o[t] = pack_h2(v.x, v.z);     /* slots 2t, 2t+1: K kb, kb+2 */
            o[4 + t] = pack_h2(v.y, v.w); /* slots 2t+8, 2t+9: K kb+1, kb+3 */
        }
    }
    uint4 *dst = (uint4 *)(xp + (long long)tok * k + s * 256 + st * 16);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

/* This lane's weights of super-block s: pieces t and 4 + t of rows a and b, their scales. */
static __device__ __forceinline__ void load_w(uint4 (&w)[6], const uint4 *qa, const uint4 *qb, const uint4 *sa,
                                              const uint4 *sb, int s) {
    w[0] = *(qa + s * 8);
    w[1] = *(qa + s * 8 + 4);
    w[2] = *(qb + s * 8);
    w[3] = *(qb + s * 8 + 4);
    w[4] = *(sa + s);
    w[5] = *(sb + s);
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

/* One super-block: the lane's scale pairs, then 16 steps of RT = 1 x NT mma. xa: the lane's
 * ldmatrix address of token tile 0, steps 0 and 1, in the stage. */
template <int NT>
static __device__ __forceinline__ void compute_sb(float (&acc)[NT][4], const uint4 (&w)[6], uint32_t xa, int t) {
    uint32_t sc[2][2][2], mn[2][2][2]; /* [row a, b][piece L][nibble h]: {d*sc} x2, {-dmin*m} x2 */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        /* word 0 = {d, dmin}; words 1..3 = {sc, m} x 6 bits of sub-block pairs 0..2 in their
         * low 24 bits, pair 3 in their top bytes (cuda_mmv.cu's repack) */
        const uint4 raw = w[4 + r];
        const uint32_t dm = raw.x ^ 0x80000000u; /* {d, -dmin} */
        const uint32_t p3 = (raw.y >> 24) | ((raw.z >> 24) << 8) | ((raw.w >> 24) << 16);
        const uint32_t pl[2] = {(t >> 1) ? raw.z : raw.y, (t >> 1) ? p3 : raw.w}; /* pair 2L + (t >> 1) */
#pragma unroll
        for (int L = 0; L < 2; L++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t f = pl[L] >> (12 * h); /* sub-block 2c + h */
                const uint32_t sm = (f & 0x3fu) | ((f << 10) & 0x003f0000u) | MAGIC; /* 1024 + {sc, m} */
                const uint32_t r2 = h2_mul(h2_sub(sm, H_1024), dm);                 /* {d*sc, -dmin*m} */
                sc[r][L][h] = __byte_perm(r2, r2, 0x1010);
                mn[r][L][h] = __byte_perm(r2, r2, 0x3232);
            }
    }
#pragma unroll
    for (int L = 0; L < 2; L++) {
        const uint32_t wa[4] = {w[L].x, w[L].y, w[L].z, w[L].w};
        const uint32_t wb[4] = {w[2 + L].x, w[2 + L].y, w[2 + L].z, w[2 + L].w};
#pragma unroll
        for (int wd = 0; wd < 4; wd++) {
            uint32_t b[NT][4];
#pragma unroll
            for (int j = 0; j < NT; j++)
                ldsm_x4(b[j], xa + j * 8 * MMB_XS + (8 * L + 2 * wd) * 32);
            const uint32_t A = wa[wd], A8 = A >> 8, B = wb[wd], B8 = B >> 8;
            uint32_t f[4];
            /* h = 0: low nibbles, q exact, then one rounding of q * d*sc - dmin*m */
            f[0] = h2_fma(h2_sub(and_or<0x000f000fu>(A, MAGIC), H_1024), sc[0][L][0], mn[0][L][0]);
            f[1] = h2_fma(h2_sub(and_or<0x000f000fu>(B, MAGIC), H_1024), sc[1][L][0], mn[1][L][0]);
            f[2] = h2_fma(h2_sub(and_or<0x000f000fu>(A8, MAGIC), H_1024), sc[0][L][0], mn[0][L][0]);
            f[3] = h2_fma(h2_sub(and_or<0x000f000fu>(B8, MAGIC), H_1024), sc[1][L][0], mn[1][L][0]);
#pragma unroll
            for (int j = 0; j < NT; j++)
                mma_f16(acc[j], f, b[j][0], b[j][1]);
            /* h = 1: high nibbles, 1024 + 16 q, q = v / 16 - 64 exactly */
            f[0] = h2_fma(h2_fma(and_or<0x00f000f0u>(A, MAGIC), H_SIXTEENTH, H_M64), sc[0][L][1], mn[0][L][1]);
            f[1] = h2_fma(h2_fma(and_or<0x00f000f0u>(B, MAGIC), H_SIXTEENTH, H_M64), sc[1][L][1], mn[1][L][1]);
            f[2] = h2_fma(h2_fma(and_or<0x00f000f0u>(A8, MAGIC), H_SIXTEENTH, H_M64), sc[0][L][1], mn[0][L][1]);
            f[3] = h2_fma(h2_fma(and_or<0x00f000f0u>(B8, MAGIC), H_SIXTEENTH, H_M64), sc[1][L][1], mn[1][L][1]);
#pragma unroll
            for (int j = 0; j < NT; j++)
                mma_f16(acc[j], f, b[j][2], b[j][3]);
        }
    }
}

/* y = (or +=) v for this lane's outputs: rows row and row + 8, tokens 8j + 2t (+1). */
template <int NT>
static __device__ __forceinline__ void store_y(const mmb_args &a, const float (&v)[NT][4], int row, int t) {
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = row + 8 * (i >> 1), tok = 8 * j + 2 * t + (i & 1);
            if (r < a.rows && tok < a.n) {
                float *o = a.y + (long long)tok * a.rows + r;
                *o = a.accumulate ? *o + v[j][i] : v[j][i];
            }
        }
}

template <int NT>
static __global__ void __launch_bounds__(MMB_THREADS) mmb_q4k_kernel(const mmb_args a) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int last;
    constexpr int STAGE = 8 * NT * MMB_XS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const int s0 = blockIdx.y * a.kr, s1 = min(s0 + a.kr, a.nsb);
    const int row = blockIdx.x * MMB_BM + warp * 16 + (lane >> 2);
    /* rows past the matrix read the last one (their results are never stored) */
    const long long ra = min(row, a.rows - 1), rb = min(row + 8, a.rows - 1);
    const uint4 *qa = (const uint4 *)a.wq + ra * a.nsb * 8 + t, *qb = (const uint4 *)a.wq + rb * a.nsb * 8 + t;
    const uint4 *sa = (const uint4 *)a.ws + ra * a.nsb, *sb = (const uint4 *)a.ws + rb * a.nsb;
    uint4 cur[6], nxt[6];
    load_w(cur, qa, qb, sa, sb, s0); /* weights only: before the wait (cuda_common.cuh) */
    pdl_wait();
    pdl_trigger();
    copy_x<NT>(a, smem, s0, tid);
    cp_commit();
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[j][i] = 0.0f;
    /* ldmatrix: lane 8i + r8 gives row (token) r8 of matrix i = {step 2wd + (i >> 1)} x {slots
     * 0-7, 8-15 (i & 1)} */
    const int mi = lane >> 3;
    const uint32_t xa = smem_u32(smem) + (lane & 7) * MMB_XS + (mi >> 1) * 32 + (mi & 1) * 16;
#pragma unroll
    for (int j = 0; j < 6; j++)
        nxt[j] = cur[j];
    for (int s = s0; s < s1; s++) {
        const int i = s - s0;
        if (s + 1 < s1) load_w(nxt, qa, qb, sa, sb, s + 1);
        cp_wait<0>();    /* super-block s's activations landed (this thread's copies) ... */
        __syncthreads(); /* ... everyone's; every warp is done with the other stage */
        if (s + 1 < s1) copy_x<NT>(a, smem + ((i + 1) & 1) * STAGE, s + 1, tid);
        cp_commit();
        compute_sb<NT>(acc, cur, xa + (i & 1) * STAGE, t);
#pragma unroll
        for (int j = 0; j < 6; j++)
            cur[j] = nxt[j];
    }
    if (a.ks == 1) {
        store_y<NT>(a, acc, row, t);
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
    store_y<NT>(a, sum, row, t);
}

/* --------------------------------------------------------------- launchers ---- */

/* The launch shape of a product. */
struct mmb_plan {
    int rtiles, nsb, kr, ks, nt;
    uint64_t xp_bytes, cnt_bytes, part_bytes;
};

static uint64_t align256(uint64_t v) {
    return (v + 255) & ~255ull;
}

/* Token tiles of 8: 1, 2, 4 or 8 (the kernel's template). */
static int nt_of(int64_t n) {
    return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
}

static mmb_plan plan_of(const struct cuda_ctx *c, int64_t rows, int64_t k, int64_t n) {
    mmb_plan p;
    p.nsb = (int)(k / 256);
    p.rtiles = (int)((rows + MMB_BM - 1) / MMB_BM);
    const long long n_sm = c->n_sm > 0 ? c->n_sm : 132;
    long long want = (MMB_BLOCKS_PER_SM * n_sm + p.rtiles - 1) / p.rtiles;
    if (want > p.nsb) want = p.nsb;
    if (want < 1) want = 1;
    p.kr = (int)((p.nsb + want - 1) / want);
    p.ks = (p.nsb + p.kr - 1) / p.kr;
    p.nt = nt_of(n);
    p.xp_bytes = align256((uint64_t)(8 * p.nt) * (uint64_t)k * 2);
    p.cnt_bytes = align256((uint64_t)p.rtiles * 4);
    p.part_bytes = p.ks > 1 ? (uint64_t)p.rtiles * p.ks * MMB_THREADS * p.nt * 16 : 0;
    return p;
}

extern "C" int cuda_mmb_supported(uint32_t type, int64_t k) {
    return type == QT_Q4_K && k > 0 && k % 256 == 0 && k <= (1 << 30);
}

extern "C" int cuda_mmb_splits(const struct cuda_ctx *ctx, int64_t rows, int64_t k) {
    if (rows < 1 || k < 256) return 1;
    return plan_of(ctx, rows, k, 1).ks;
}

extern "C" smelt_status cuda_mmb_scratch_bytes(const struct cuda_ctx *ctx, int64_t rows, int64_t k, int64_t n,
                                               uint64_t *bytes, struct err *e) {
    if (rows < 1 || k < 256 || n < 1 || n > CUDA_MMB_MAX_ROWS)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: scratch for %lld x %lld, %lld tokens (1..%d)",
                       (long long)rows, (long long)k, (long long)n, CUDA_MMB_MAX_ROWS);
    const mmb_plan p = plan_of(ctx, rows, k, n);
    *bytes = p.xp_bytes + p.cnt_bytes + p.part_bytes;
    return SMELT_OK;
}

template <int NT> static cudaError_t launch_nt(struct cuda_ctx *ctx, const mmb_plan &p, const mmb_args &a) {
    const size_t smem = 2 * 8 * NT * MMB_XS;
    if (smem > 48 * 1024) smem_optin_once(ctx, (const void *)mmb_q4k_kernel<NT>, smem);
    return klaunch(mmb_q4k_kernel<NT>, dim3((unsigned)p.rtiles, (unsigned)p.ks), dim3(MMB_THREADS), smem, ctx, a);
}

extern "C" smelt_status cuda_mmb(struct cuda_ctx *ctx, const struct cuda_qweight *w, const float *x, int64_t n,
                                 float *y, void *scratch, uint64_t scratch_bytes, int accumulate, struct err *e) {
    if (!w || !cuda_mmb_supported(w->type, w->k) || w->rows < 1 || w->rows > (1 << 30))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmb: %s %lldx%lld has no kernel (Q4_K, k %% 256 == 0)",
                       w ? qtype_name(w->type) : "?", w ? (long long)w->rows : 0LL, w ? (long long)w->k : 0LL);
    if (n < 1 || n > CUDA_MMB_MAX_ROWS || !x || !y || !scratch || ((uintptr_t)x & 15) || ((uintptr_t)scratch & 15))
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmb: %lld token rows (1..%d), x %p and scratch %p (16-byte aligned), y %p",
                       (long long)n, CUDA_MMB_MAX_ROWS, (const void *)x, scratch, (void *)y);
    const mmb_plan p = plan_of(ctx, w->rows, w->k, n);
    const uint64_t need = p.xp_bytes + p.cnt_bytes + p.part_bytes;
    if (scratch_bytes < need)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmb: scratch of %llu bytes, %s %lldx%lld at %lld rows needs %llu",
                       (unsigned long long)scratch_bytes, qtype_name(w->type), (long long)w->rows, (long long)w->k,
                       (long long)n, (unsigned long long)need);
    mmb_args a;
    a.wq = (const unsigned char *)w->q;
    a.ws = (const unsigned char *)w->s;
    a.xp = (const __half *)scratch;
    a.cnt = (int *)((unsigned char *)scratch + p.xp_bytes);
    a.part = p.part_bytes ? (float *)((unsigned char *)scratch + p.xp_bytes + p.cnt_bytes) : NULL;
    a.y = y;
    a.rows = (int)w->rows;
    a.k = (int)w->k;
    a.n = (int)n;
    a.nsb = p.nsb;
    a.kr = p.kr;
    a.ks = p.ks;
    a.accumulate = accumulate != 0;
    const long long items = (long long)8 * p.nt * p.nsb * 16;
    const long long threads = items > p.rtiles ? items : p.rtiles;
    CUDA_TRY(klaunch(mmb_convert_kernel, dim3(nblocks(threads, 256)), dim3(256), 0, ctx, x, (__half *)a.xp, a.cnt,
                     p.rtiles, a.k, a.n, items),
             e);
    cudaError_t ce;
    switch (p.nt) {
    case 1: ce = launch_nt<1>(ctx, p, a); break;
    case 2: ce = launch_nt<2>(ctx, p, a); break;
    case 4: ce = launch_nt<4>(ctx, p, a); break;
    default: ce = launch_nt<8>(ctx, p, a); break;
    }
    CUDA_TRY(ce, e);
    return SMELT_OK;
}
