/* Quantized matrix x small-batch product (decode path). See cuda_mmv.h.
 *
 * Work split: one warp per output row, 4 warps (rows) per block. A warp walks its row in
 * "units" of 16 bytes of quant bits (32 weights for 4-bit and 6-bit types, 16 for Q8_0, 8
 * for F16); lane l takes units l, l+32, ... so each iteration the warp reads 512
 * consecutive bytes. Every unit's weights are loaded once and dotted against each of the
 * n <= 8 token rows (the activations are tiny and stay in L1/L2).
 *
 * Bytes per product: rows * row_bytes (weights) + n*k*(1 + 8/16) (activations) + n*rows*4.
 */
#include <string.h>

#include "backend/cuda/cuda_mmv.cuh"

#include <stdint.h>

extern "C" {
#include "backend/cuda/cuda_mmv.h"
#include "quant/quant.h"
}

#define QK_K 256

/* ---------------------------------------------------------------- kernels ---- */

/* x[n*k] f32 -> its int8 form (quant16); total is a multiple of 32. */
static __global__ void quantize_act_kernel(const float *x, int8_t *__restrict__ xq, float2 *__restrict__ xd,
                                           int64_t total) {
    pdl_wait();
    pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    quant16(i < total ? x[i] : 0.0f, xq, xd, i, i < total);
}

/* RMSNorm of each token row (x * rsqrt(mean(x^2) + eps) * w) followed by the quantization
 * of quantize_act_kernel, one block per row; xn (optional) gets the normalized f32 row.
 * k is a multiple of 32; warp w quantizes the 32-groups w, w + warps, ... */
static __global__ void __launch_bounds__(1024)
    norm_quant_kernel(const float *x, int64_t xstride, const float *__restrict__ w, float eps, int k,
                      int8_t *__restrict__ xq, float2 *__restrict__ xd, float *__restrict__ xn) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.x;
    const float *xr = x + t * xstride;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __shared__ float part[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    float tot = lane < nw ? part[lane] : 0.0f;
    tot = warp_sum(tot);
    const float inv = rsqrtf(tot / (float)k + eps);
    for (int g = warp; g < k / 32; g += nw) {
        const int i = g * 32 + lane;
        const int64_t o = t * k + i;
        const float v = xr[i] * inv * (w ? w[i] : 1.0f);
        if (xn) xn[o] = v;
        quant16(v, xq, xd, o, true);
    }
}

/* Q4_K: {d, dmin} and the 24-bit scale/min field of unit u's sub-block pair from the four
 * words of its super-block's repacked scales (layout below). */
static __device__ __forceinline__ void q4k_scales(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int u,
                                                  float2 *dm, uint32_t *pk) {
    const int g = (u & 7) >> 1;
    *dm = __half22float2(*(const __half2 *)&w0);
    *pk = g == 0 ? w1 : g == 1 ? w2 : g == 2 ? w3 : (w1 >> 24) | ((w2 >> 24) << 8) | ((w3 >> 24) << 16);
}

/* Token row t's activations at two 16-value runs ea, eb (K-quant units): the int8 values,
 * their scales and scaled sums (one group each: ea, eb are multiples of 16). */
struct xpair {
    uint4 a, b;
    float da, db, sa, sb;
};

static __device__ __forceinline__ xpair x_pair(const int8_t *xq, const float2 *xds, int t, int k,
                                               int ea, int eb) {
    const int64_t o = (int64_t)t * k;
    xpair x;
    x.a = *(const uint4 *)(xq + o + ea);
    x.b = *(const uint4 *)(xq + o + eb);
    const float2 pa = xds[(o + ea) >> 4], pb = xds[(o + eb) >> 4];
    x.da = pa.x;
    x.db = pb.x;
    x.sa = pa.y;
    x.sb = pb.y;
    return x;
}

/* Q4_K: unit u (16 B of nibbles, R rows) against the N token rows' int8 activations. */
template <int N, int R>
static __device__ __forceinline__ void q4k_unit(mmv_acc<N, R> &acc, const uint4 *qv, const float2 *dm,
                                                const uint32_t *pk, const int8_t *xq, const float2 *xds, int u, int k) {
    const int sb = u >> 3, g = (u & 7) >> 1, hf = u & 1;
    const int ea = sb * QK_K + g * 64 + hf * 16, eb = ea + 32;
#pragma unroll
    for (int t = 0; t < N; t++) {
        const xpair x = x_pair(xq, xds, t, k, ea, eb);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 w = qv[r];
            const uint4 lo = make_uint4(w.x & 0x0f0f0f0fu, w.y & 0x0f0f0f0fu, w.z & 0x0f0f0f0fu, w.w & 0x0f0f0f0fu);
            const uint4 hi = make_uint4((w.x >> 4) & 0x0f0f0f0fu, (w.y >> 4) & 0x0f0f0f0fu, (w.z >> 4) & 0x0f0f0f0fu,
                                        (w.w >> 4) & 0x0f0f0f0fu);
            const int da = dot16(lo, x.a), db = dot16(hi, x.b);
            acc.v[r][t] += dm[r].x * ((float)(pk[r] & 63) * x.da * (float)da + (float)((pk[r] >> 12) & 63) * x.db * (float)db) -
                           dm[r].y * ((float)((pk[r] >> 6) & 63) * x.sa + (float)((pk[r] >> 18) & 63) * x.sb);
        }
    }
}

/* Q4_K split layout: q = 128 B of nibbles per super-block; s = 16 B per super-block:
 * word 0 = {d, dmin} (half2), words 1..3 = the 6-bit scales and mins re-packed at upload
 * so that pair g of sub-blocks (2g, 2g+1) is one 24-bit field {sc_a, m_a, sc_b, m_b}:
 * pairs 0..2 in the low 24 bits of words 1..3, pair 3 in their top bytes.
 * Unit u of a super-block (0..7): g = u/2, hf = u%2; its 16 B hold weights
 * 64g + 16hf + [0,16) (low nibbles, sub-block 2g) and the same + 32 (high, 2g+1). */
/* The first output row of this warp: KS > 1 (split-K) gives the block's warps the same
 * rows, each over its own slice of k (warp w: units from 32 U w on, stride 32 U KS). */
template <int R, int GLU, int KS>
static __device__ __forceinline__ int mmv_row0() {
    return (KS > 1 ? blockIdx.x : blockIdx.x * MMV_WARPS + threadIdx.y) * (GLU ? 1 : R);
}

/* One token row against one warp's Q4_K rows rr[0..R) (split-K slice ws of KS) into acc:
 * each lane loads the 16 B of scales of its unit's super-block; U units x R rows in flight
 * before any math, the first before the PDL wait (once, `waited`). */
template <int R, int U, int KS>
static __device__ __forceinline__ void q4k_rows1(mmv_acc<1, R> &acc, const mrow_ref *rr, const int8_t *xq,
                                                 const float2 *xds, int k, int ws, bool &waited) {
    const int lane = threadIdx.x, nsb = k / QK_K, n_units = nsb * 8;
    uint4 qv[U][R], sv[U][R];
    mmv_units<U>(
        lane + 32 * U * ws, 32, 32 * U * KS, n_units, waited,
        [&](int i, int u) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                qv[i][r] = ((const uint4 *)rr[r].q)[(rr[r].row * nsb) * 8 + u];
                sv[i][r] = ((const uint4 *)rr[r].s)[rr[r].row * nsb + (u >> 3)];
            }
        },
        [&](int i, int u) {
            float2 dm[R];
            uint32_t pk[R];
#pragma unroll
            for (int r = 0; r < R; r++) q4k_scales(sv[i][r].x, sv[i][r].y, sv[i][r].z, sv[i][r].w, u, &dm[r], &pk[r]);
            q4k_unit<1, R>(acc, qv[i], dm, pk, xq, xds, u, k);
        });
}

/* One warp's Q4_K rows row0 .. row0 + R - 1 (split-K slice ws of KS), stored. */
template <int N, int R, int GLU, int U, int KS>
static __device__ __forceinline__ void q4k_body(const struct mmv_mats &m, int row0, int ws, const int8_t *xq,
                                                const float2 *xds, int k, int accumulate) {
    static_assert(KS == 1 || (KS == MMV_WARPS && N == 1), "split-K: one token row, every warp of the block");
    if (row0 >= m.end[GLU ? 0 : m.n - 1]) return;
    const int lane = threadIdx.x;
    const int nsb = k / QK_K;
    mmv_acc<N, R> acc;
    acc.zero();
    const int n_units = nsb * 8;
    mrow_ref rr[R];
    mrefs<GLU, R>(m, row0, rr);
    if constexpr (N == 1) {
        bool waited = false;
        q4k_rows1<R, U, KS>(acc, rr, xq, xds, k, ws, waited);
        if (!waited) pdl_wait(); /* no units here: stores still follow the predecessor */
    } else {
        /* Several token rows: the N accumulators need the registers, so the 16 B of scales
         * of a super-block (shared by its 8 units, i.e. 8 neighbouring lanes) are loaded one
         * word per lane (word j % 4 by lane j of each group of 8) and shared by shuffles: 4
         * registers per unit and row instead of 16. Measured on the H200, n = 8: GLU
         * 14336x4096 153 -> 105 us, batched decode x8 630 -> 826 tok/s; with one row the
         * 16-byte load above is faster (4096x4096 4.6 vs 4.9 us). Every lane runs every
         * iteration (uniform bound) so the shuffles see the whole warp; out-of-range units
         * run on clamped loads and are not accumulated. */
        const int gbase = lane & ~7;
        for (int base = 0; base < n_units; base += 32 * U) {
            uint4 qv[U][R];
            uint32_t sv[U][R];
#pragma unroll
            for (int i = 0; i < U; i++) {
                const int u = min(base + lane + 32 * i, n_units - 1);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    qv[i][r] = ((const uint4 *)rr[r].q)[(rr[r].row * nsb) * 8 + u];
                    sv[i][r] = ((const uint32_t *)rr[r].s)[(rr[r].row * nsb + (u >> 3)) * 4 + (lane & 3)];
                }
            }
            if (base == 0) pdl_wait();
#pragma unroll
            for (int i = 0; i < U; i++) {
                const int u = base + lane + 32 * i;
                float2 dm[R];
                uint32_t pk[R];
#pragma unroll
                for (int r = 0; r < R; r++)
                    q4k_scales(__shfl_sync(0xffffffffu, sv[i][r], gbase), __shfl_sync(0xffffffffu, sv[i][r], gbase + 1),
                               __shfl_sync(0xffffffffu, sv[i][r], gbase + 2),
                               __shfl_sync(0xffffffffu, sv[i][r], gbase + 3), u, &dm[r], &pk[r]);
                if (u < n_units) q4k_unit<N, R>(acc, qv[i], dm, pk, xq, xds, u, k);
            }
        }
    }
    const bool wr = acc.template ks_reduce<KS>(lane);
    if (GLU) acc.store_glu(m, row0, lane, accumulate, wr, KS > 1 ? 1 : MMV_WARPS); /* accumulate carries the act */
    else acc.store(m, row0, lane, accumulate, wr, KS > 1 ? R : MMV_WARPS * R);
}

template <int N, int R, int GLU, int U = MMV_U, int KS = 1>
static __global__ void __launch_bounds__(MMV_WARPS * 32, MMV_MINB)
    mmv_q4_k(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k, int accumulate) {
    if (!mmv_id_live(m)) return; /* the PDL trigger too */
    q4k_body<N, R, GLU, U, KS>(m, mmv_row0<R, GLU, KS>(), KS > 1 ? threadIdx.y : 0, mmv_id_x<N>(m, xq, k),
                               mmv_id_x<N>(m, xds, k / 16), k, accumulate);
}

/* Q6_K: unit u's 16 B of low bits, 16 B of high bits and its two sub-block scales. */
struct q6k_ld {
    uint4 ql, qh;
    float sclo, schi;
};

static __device__ __forceinline__ q6k_ld q6k_load(const mrow_ref &rr, int nsb, int u) {
    const int sb = u >> 3, c8 = u & 7, h = c8 >> 2, c = c8 & 3;
    const int wlo = h * 128 + (c >> 1) * 32 + (c & 1) * 16; /* element within the super-block */
    const int64_t blk = rr.row * nsb + sb;
    const uint4 *qb = (const uint4 *)rr.q + blk * 12; /* 192 B = 12 x 16 B */
    const int8_t *sc = (const int8_t *)rr.s;
    const float d = __half2float(((const __half *)rr.d)[blk]);
    q6k_ld v;
    v.ql = qb[h * 4 + c];
    v.qh = qb[8 + h * 2 + (c & 1)];
    v.sclo = d * (float)sc[blk * 16 + wlo / 16];
    v.schi = d * (float)sc[blk * 16 + wlo / 16 + 4];
    return v;
}

template <int N, int R>
static __device__ __forceinline__ void q6k_unit(mmv_acc<N, R> &acc, const q6k_ld *v, const int8_t *xq,
                                                const float2 *xds, int u, int k) {
    const int sb = u >> 3, c8 = u & 7, h = c8 >> 2, c = c8 & 3;
    const int jb = c >> 1;
    const int ea = sb * QK_K + h * 128 + jb * 32 + (c & 1) * 16, eb = ea + 64;
    const int sh = 2 * jb;
    uint4 lo[R], hi[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint4 ql = v[r].ql, qh = v[r].qh;
        lo[r].x = (ql.x & 0x0f0f0f0fu) | (((qh.x >> sh) & 0x03030303u) << 4);
        lo[r].y = (ql.y & 0x0f0f0f0fu) | (((qh.y >> sh) & 0x03030303u) << 4);
        lo[r].z = (ql.z & 0x0f0f0f0fu) | (((qh.z >> sh) & 0x03030303u) << 4);
        lo[r].w = (ql.w & 0x0f0f0f0fu) | (((qh.w >> sh) & 0x03030303u) << 4);
        hi[r].x = ((ql.x >> 4) & 0x0f0f0f0fu) | (((qh.x >> (sh + 4)) & 0x03030303u) << 4);
        hi[r].y = ((ql.y >> 4) & 0x0f0f0f0fu) | (((qh.y >> (sh + 4)) & 0x03030303u) << 4);
        hi[r].z = ((ql.z >> 4) & 0x0f0f0f0fu) | (((qh.z >> (sh + 4)) & 0x03030303u) << 4);
        hi[r].w = ((ql.w >> 4) & 0x0f0f0f0fu) | (((qh.w >> (sh + 4)) & 0x03030303u) << 4);
    }
#pragma unroll
    for (int t = 0; t < N; t++) {
        const xpair x = x_pair(xq, xds, t, k, ea, eb);
#pragma unroll
        for (int r = 0; r < R; r++) /* q is stored +32: dx * dot(q - 32, xq) = dx * dot(q, xq) - 32 * dx * sum(xq) */
            acc.v[r][t] += v[r].sclo * (x.da * (float)dot16(lo[r], x.a) - 32.0f * x.sa) +
                           v[r].schi * (x.db * (float)dot16(hi[r], x.b) - 32.0f * x.sb);
    }
}

/* Q6_K split layout: q = 192 B per super-block (ql[128] then qh[64]), s = 16 int8 scales,
 * d = one half per super-block. Unit c (0..7) of a super-block: half h = c/4, ql chunk
 * c%4 (16 B); its low nibbles are weights h*128 + (c%4/2)*32 + (c%2)*16 + [0,16), its high
 * nibbles the same + 64; both take their top 2 bits from qh[h*32 + (c%2)*16 + i].
 * U units x R rows are loaded before any math; KS as for Q4_K. */
template <int N, int R, int GLU, int U, int KS>
static __device__ __forceinline__ void q6k_body(const struct mmv_mats &m, int row0, int ws, const int8_t *xq,
                                                const float2 *xds, int k, int accumulate) {
    static_assert(KS == 1 || (KS == MMV_WARPS && N == 1), "split-K: one token row, every warp of the block");
    if (row0 >= m.end[GLU ? 0 : m.n - 1]) return;
    const int lane = threadIdx.x;
    const int nsb = k / QK_K, n_units = nsb * 8;
    mmv_acc<N, R> acc;
    acc.zero();
    mrow_ref rr[R];
    mrefs<GLU, R>(m, row0, rr);
    bool waited = false;
    q6k_ld v[U][R];
    mmv_units<U>(
        lane + 32 * U * ws, 32, 32 * U * KS, n_units, waited,
        [&](int i, int u) {
#pragma unroll
            for (int r = 0; r < R; r++) v[i][r] = q6k_load(rr[r], nsb, u);
        },
        [&](int i, int u) { q6k_unit<N, R>(acc, v[i], xq, xds, u, k); });
    if (!waited) pdl_wait(); /* no units here: stores still follow the predecessor */
    const bool wr = acc.template ks_reduce<KS>(lane);
    if (GLU) acc.store_glu(m, row0, lane, accumulate, wr, KS > 1 ? 1 : MMV_WARPS); /* accumulate carries the act */
    else acc.store(m, row0, lane, accumulate, wr, KS > 1 ? R : MMV_WARPS * R);
}

template <int N, int R, int GLU, int U = 2, int KS = 1>
static __global__ void __launch_bounds__(MMV_WARPS * 32, MMV_MINB)
    mmv_q6_k(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k, int accumulate) {
    if (!mmv_id_live(m)) return; /* the PDL trigger too */
    q6k_body<N, R, GLU, U, KS>(m, mmv_row0<R, GLU, KS>(), KS > 1 ? threadIdx.y : 0, mmv_id_x<N>(m, xq, k),
                               mmv_id_x<N>(m, xds, k / 16), k, accumulate);
}

/* Short K-quant rows at one token row (the 30B-A3B experts' down product: 768 values, 24
 * units, where a lane a unit leaves 8 lanes of 32 idle in every warp): the warp's R rows
 * take G = 32 / R neighbouring lanes each, lane l row l / G and units l % G, + G, ... (U in
 * flight), so every lane works and a row's G lanes read 16 G contiguous bytes. A lane sums
 * its own row only and leaves the other rows' sums 0, so the stores' warp sums are the R
 * rows' sums (the same store and epilogues as the other shapes; the unit order of a row's
 * sum differs from theirs, so these are other bits than a lane a unit). One token row, a
 * plain product (not GLU, not split-K). */
template <int R, int U, int Q6>
static __device__ __forceinline__ float kq_lanes_dot(const struct mmv_mats &m, int row0, int64_t e, const int8_t *xq,
                                                     const float2 *xds, int k, bool &waited) {
    constexpr int G = 32 / R;
    static_assert(G * R == 32, "rows divide the warp");
    const int lane = threadIdx.x, r = lane / G;
    const int nsb = k / QK_K, n_units = nsb * 8;
    const mrow_ref rr = mref<0>(m, row0, r, e);
    mmv_acc<1, 1> a;
    a.zero();
    /* U units in flight before any math: Q6_K's loads, or Q4_K's bits and its super-block's
     * scales */
    q6k_ld v[Q6 ? U : 1];
    uint4 qv[U], sv[U];
    mmv_units<U>(
        lane % G, G, G * U, n_units, waited,
        [&](int i, int u) {
            if constexpr (Q6) {
                v[i] = q6k_load(rr, nsb, u);
            } else {
                qv[i] = ((const uint4 *)rr.q)[(rr.row * nsb) * 8 + u];
                sv[i] = ((const uint4 *)rr.s)[rr.row * nsb + (u >> 3)];
            }
        },
        [&](int i, int u) {
            if constexpr (Q6) {
                q6k_unit<1, 1>(a, &v[i], xq, xds, u, k);
            } else {
                float2 dm;
                uint32_t pk;
                q4k_scales(sv[i].x, sv[i].y, sv[i].z, sv[i].w, u, &dm, &pk);
                q4k_unit<1, 1>(a, &qv[i], &dm, &pk, xq, xds, u, k);
            }
        });
    return a.v[0][0];
}

template <int R, int U, int Q6>
static __device__ __forceinline__ void kq_body_lanes(const struct mmv_mats &m, int row0, const int8_t *xq,
                                                     const float2 *xds, int k, int accumulate) {
    if (row0 >= m.end[m.n - 1]) return;
    bool waited = false;
    const float a = kq_lanes_dot<R, U, Q6>(m, row0, mmv_expert(m), xq, xds, k, waited);
    if (!waited) pdl_wait(); /* no units here: stores still follow the predecessor */
    const int r = threadIdx.x / (32 / R);
    mmv_acc<1, R> acc;
#pragma unroll
    for (int q = 0; q < R; q++) acc.v[q][0] = q == r ? a : 0.0f;
    acc.store(m, row0, threadIdx.x, accumulate, true, MMV_WARPS * R);
}

template <int R, int U, int Q6>
static __global__ void __launch_bounds__(MMV_WARPS * 32, MMV_MINB)
    mmv_kq_lanes(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k, int accumulate) {
    if (!mmv_id_live(m)) return; /* the PDL trigger too */
    kq_body_lanes<R, U, Q6>(m, mmv_row0<R, 0, 1>(), mmv_id_x<1>(m, xq, k), mmv_id_x<1>(m, xds, k / 16), k,
                            accumulate);
}

/* mmv_sum_body's item for Q4_K / Q6_K (MMV_LANES_SUM, the default for their down products
 * with a combining epilogue): 8 rows as mmv_kq_lanes computes them (4 lanes a row, 3 units
 * in flight), the 4 lanes' sums added in warp_sum's order (its first three steps add zeros
 * there), so the same bits as its stored rows. */
template <int Q6> struct kq_lanes_item {
    static constexpr int ROWS = 8;
    static __device__ __forceinline__ void run(const mmv_mats &m, int row0, int64_t e, const int8_t *xq,
                                               const float2 *xds, int k, bool &waited, float *out) {
        float a = kq_lanes_dot<8, 3, Q6>(m, row0, e, xq, xds, k, waited);
        a += __shfl_xor_sync(0xffffffffu, a, 2);
        a += __shfl_xor_sync(0xffffffffu, a, 1);
        if ((threadIdx.x & 3) == 0) out[threadIdx.x / 4] = a;
    }
};

/* mmv_glu_q_body's item for Q4_K: a row's gate and up as mmv_q4_k<1, 2, GLU, U> computes
 * them (variant 1 of the expert launches for U = 1). */
template <int U> struct q4k_glu_item {
    static __device__ __forceinline__ float run(const mmv_mats &m, int row, int64_t e, const int8_t *xq,
                                                const float2 *xds, int k, int glu, bool &waited) {
        return glu_row(m, row, e, glu, [&](mmv_acc<1, 2> &acc, const mrow_ref *rr) {
            q4k_rows1<2, U, 1>(acc, rr, xq, xds, k, 0, waited);
        });
    }
};

template <int W>
static __global__ void __launch_bounds__(W * 32, 1024 / (W * 32))
    mmv_q4k_glu_q(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k, int glu) {
    mmv_glu_q_body<q4k_glu_item<1>, W>(m, xq, xds, k, glu);
}

template <int Q6>
static __global__ void __launch_bounds__(MMV_SUM_WARPS * 32, 1)
    mmv_kq_lanes_sum(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k) {
    mmv_sum_body<kq_lanes_item<Q6>>(m, xq, xds, k);
}

/* Q4_K matrices stacked with a Q6_K one after them (Q4_K_M's Q, K and V on most layers):
 * blocks below m.mix_row run the Q4_K body, the rest the Q6_K body, one launch. mix_row is
 * a multiple of the rows per block, so each block is one type. */
template <int N, int U4>
static __global__ void __launch_bounds__(MMV_WARPS * 32, MMV_MINB)
    mmv_q4k_q6k(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k,
                int accumulate) {
    pdl_trigger();
    const int row0 = mmv_row0<MMV_R, 0, 1>();
    if ((int)blockIdx.x * MMV_WARPS * MMV_R < m.mix_row) q4k_body<N, MMV_R, 0, U4, 1>(m, row0, 0, xq, xds, k, accumulate);
    else q6k_body<N, MMV_R, 0, 2, 1>(m, row0, 0, xq, xds, k, accumulate);
}

/* Q8_0 split layout: q = int8 weights row-major, s = one half scale per 32 weights. */
template <int N, int R, int GLU, int U = MMV_U, int KS = 1>
static __global__ void __launch_bounds__(MMV_WARPS * 32, MMV_MINB)
    mmv_q8_0(const struct mmv_mats m, const int8_t *xq, const float2 *xds,
             int k, int accumulate) {
    static_assert(KS == 1 || KS == MMV_WARPS, "split-K: every warp of the block");
    if (!mmv_id_live(m)) return; /* the PDL trigger too */
    xq = mmv_id_x<N>(m, xq, k);
    xds = mmv_id_x<N>(m, xds, k / 16);
    const int row0 = mmv_row0<R, GLU, KS>();
    const int ws = KS > 1 ? threadIdx.y : 0;
    if (row0 >= m.end[GLU ? 0 : m.n - 1]) return;
    const int lane = threadIdx.x;
    mmv_acc<N, R> acc;
    acc.zero();
    const int n_units = k / 16;
    mrow_ref rr[R];
    mrefs<GLU, R>(m, row0, rr);
    bool waited = false;
    for (int u0 = lane + 32 * U * ws; u0 < n_units; u0 += 32 * U * KS) {
        uint4 qv[U][R];
        float dw[U][R];
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int u = min(u0 + 32 * i, n_units - 1);
#pragma unroll
            for (int r = 0; r < R; r++) {
                qv[i][r] = ((const uint4 *)rr[r].q)[rr[r].row * n_units + u];
                dw[i][r] = __half2float(((const __half *)rr[r].s)[rr[r].row * (k / 32) + (u >> 1)]);
            }
        }
        if (!waited) { /* the first weights are in flight; activations next */
            pdl_wait();
            waited = true;
        }
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int u = u0 + 32 * i;
            if (u >= n_units) break;
#pragma unroll
            for (int t = 0; t < N; t++) {
                const uint4 xv = *(const uint4 *)(xq + (int64_t)t * k + u * 16);
                const float dx = xds[(int64_t)t * (k / 16) + u].x; /* unit u = group u */
#pragma unroll
                for (int r = 0; r < R; r++) acc.v[r][t] += dw[i][r] * dx * (float)dot16(qv[i][r], xv);
            }
        }
    }
    if (!waited) pdl_wait(); /* no units here: stores still follow the predecessor */
    const bool wr = acc.template ks_reduce<KS>(lane);
    if (GLU) acc.store_glu(m, row0, lane, accumulate, wr, KS > 1 ? 1 : MMV_WARPS); /* accumulate carries the act */
    else acc.store(m, row0, lane, accumulate, wr, KS > 1 ? R : MMV_WARPS * R);
}


/* 8 weights of a plain float type from 16 bytes (F16/BF16) or 32 bytes (F32). */
template <uint32_t T>
static __device__ __forceinline__ void load8(const void *w, int64_t idx8, float *o) {
    if (T == QT_F32) {
        const float4 a = ((const float4 *)w)[2 * idx8], b = ((const float4 *)w)[2 * idx8 + 1];
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
        const uint4 v = ((const uint4 *)w)[idx8];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f;
            if (T == QT_F16) f = __half22float2(*(const __half2 *)&u[i]);
            else f = __bfloat1622float2(*(const __nv_bfloat162 *)&u[i]);
            o[2 * i] = f.x;
            o[2 * i + 1] = f.y;
        }
    }
}

/* F16 / BF16 / F32 weights against f32 activations. */
template <int N, int R, uint32_t T, int GLU>
static __global__ void __launch_bounds__(MMV_WARPS * 32, MMV_MINB)
    mmv_float(const struct mmv_mats m, const float *x, int k, int accumulate) {
    if (!mmv_id_live(m)) return; /* the PDL trigger too */
    x = mmv_id_x<N>(m, x, k);
    const int row0 = (blockIdx.x * MMV_WARPS + threadIdx.y) * (GLU ? 1 : R);
    if (row0 >= m.end[GLU ? 0 : m.n - 1]) return;
    const int lane = threadIdx.x;
    mmv_acc<N, R> acc;
    acc.zero();
    mrow_ref rr[R];
    mrefs<GLU, R>(m, row0, rr);
#pragma unroll 4
    for (int u = lane; u < k / 8; u += 32) {
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) load8<T>(rr[r].q, rr[r].row * (k / 8) + u, wf[r]);
        if (u == lane) pdl_wait(); /* the first weights are in flight; activations next */
#pragma unroll
        for (int t = 0; t < N; t++) {
            const float4 xa = *(const float4 *)(x + (int64_t)t * k + u * 8);
            const float4 xb = *(const float4 *)(x + (int64_t)t * k + u * 8 + 4);
#pragma unroll
            for (int r = 0; r < R; r++)
                acc.v[r][t] += wf[r][0] * xa.x + wf[r][1] * xa.y + wf[r][2] * xa.z + wf[r][3] * xa.w +
                               wf[r][4] * xb.x + wf[r][5] * xb.y + wf[r][6] * xb.z + wf[r][7] * xb.w;
        }
    }
    if (GLU) acc.store_glu(m, row0, lane, accumulate); /* accumulate carries the act */
    else acc.store(m, row0, lane, accumulate);
}

/* ---- repack kernels: one thread per block, source GGUF blocks in a temporary buffer ---- */

static __global__ void repack_q8_0(const uint8_t *__restrict__ src, int8_t *__restrict__ q,
                                   __half *__restrict__ s, int64_t nblk) {
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblk) return;
    const uint8_t *p = src + b * 34;
    s[b] = __ushort_as_half((unsigned short)(p[0] | (p[1] << 8)));
    for (int i = 0; i < 32; i++) q[b * 32 + i] = (int8_t)p[2 + i];
}

static __global__ void repack_q4_k(const uint8_t *__restrict__ src, uint8_t *__restrict__ q,
                                   uint32_t *__restrict__ s, int64_t nblk) {
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblk) return;
    const uint8_t *p = src + b * 144;
    const uint8_t *sc = p + 4;
    uint32_t pair[4];
    for (int g = 0; g < 4; g++) {
        uint32_t v[4]; /* sc_a, m_a, sc_b, m_b */
        for (int h = 0; h < 2; h++) {
            int j = 2 * g + h;
            uint32_t scj, mj;
            if (j < 4) {
                scj = sc[j] & 63;
                mj = sc[j + 4] & 63;
            } else {
                scj = (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4);
                mj = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            }
            v[2 * h] = scj;
            v[2 * h + 1] = mj;
        }
        pair[g] = v[0] | (v[1] << 6) | (v[2] << 12) | (v[3] << 18);
    }
    s[b * 4 + 0] = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    s[b * 4 + 1] = pair[0] | ((pair[3] & 0xff) << 24);
    s[b * 4 + 2] = pair[1] | (((pair[3] >> 8) & 0xff) << 24);
    s[b * 4 + 3] = pair[2] | (((pair[3] >> 16) & 0xff) << 24);
    for (int i = 0; i < 128; i++) q[b * 128 + i] = p[16 + i];
}

static __global__ void repack_q6_k(const uint8_t *__restrict__ src, uint8_t *__restrict__ q,
                                   int8_t *__restrict__ s, __half *__restrict__ d, int64_t nblk) {
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblk) return;
    const uint8_t *p = src + b * 210;
    for (int i = 0; i < 192; i++) q[b * 192 + i] = p[i];
    for (int i = 0; i < 16; i++) s[b * 16 + i] = (int8_t)p[192 + i];
    d[b] = __ushort_as_half((unsigned short)(p[208] | (p[209] << 8)));
}

/* --------------------------------------------------------------- launchers ---- */

extern "C" int cuda_mmv_supported(uint32_t type, int64_t k) {
    switch (type) {
    /* plain floats: mmv_float reads units of 8 (x by float4 pairs), cuBLAS any width; 8
     * rather than 32 so that the tiny fixtures' 16- and 24-wide expert rows (qwen35moe,
     * qwen3next: n_ff_exp 16, n_ff_shexp 24) run on the GPU */
    case QT_F16:
    case QT_BF16:
    case QT_F32: return k > 0 && k % 8 == 0;
    case QT_Q8_0: return k % 32 == 0;
    case QT_Q4_K:
    case QT_Q6_K: return k % QK_K == 0;
    default: return cuda_mmv_tq_supported(type, k);
    }
}

extern "C" void cuda_qweight_free(struct cuda_qweight *w) {
    if (!w) return;
    cudaFree(w->q);
    cudaFree(w->s);
    cudaFree(w->d);
    w->q = w->s = w->d = NULL;
    w->bytes = 0;
}

extern "C" smelt_status cuda_qweight_upload(struct cuda_ctx *ctx, struct cuda_qweight *w,
                                            uint32_t type, const void *host, int64_t rows,
                                            int64_t k, struct err *e) {
    memset(w, 0, sizeof *w);
    if (!cuda_mmv_supported(type, k))
        return err_set(e, SMELT_ERR_UNSUPPORTED, "cuda mmv: type %s with row length %lld has no GPU "
                       "kernel (run the model with --backend cpu)", qtype_name(type), (long long)k);
    cudaStream_t st = ctx->stream;
    uint64_t row_bytes = qtype_row_size(type, k);
    uint64_t total = row_bytes * (uint64_t)rows;
    w->type = type;
    w->rows = rows;
    w->k = k;
    if (type == QT_F16 || type == QT_BF16 || type == QT_F32) {
        CUDA_TRY(cudaMalloc(&w->q, total), e);
        w->bytes = total;
        CUDA_TRY(cudaMemcpyAsync(w->q, host, total, cudaMemcpyHostToDevice, st), e);
        CUDA_TRY(cudaStreamSynchronize(st), e);
        return SMELT_OK;
    }
    int64_t nblk = (int64_t)(total / qtype_get(type)->type_size);
    void *tmp = NULL;
    CUDA_TRY(cudaMalloc(&tmp, total), e);
    smelt_status rc = SMELT_OK;
    const int tb = 256;
    const unsigned grid = (unsigned)((nblk + tb - 1) / tb);
    cudaError_t ce = cudaMemcpyAsync(tmp, host, total, cudaMemcpyHostToDevice, st);
    if (ce == cudaSuccess) {
        switch (type) {
        case QT_Q8_0:
            ce = cudaMalloc(&w->q, nblk * 32);
            if (ce == cudaSuccess) ce = cudaMalloc(&w->s, nblk * 2);
            if (ce == cudaSuccess)
                repack_q8_0<<<grid, tb, 0, st>>>((const uint8_t *)tmp, (int8_t *)w->q, (__half *)w->s, nblk);
            w->bytes = nblk * 34;
            break;
        case QT_Q4_K:
            ce = cudaMalloc(&w->q, nblk * 128);
            if (ce == cudaSuccess) ce = cudaMalloc(&w->s, nblk * 16);
            if (ce == cudaSuccess)
                repack_q4_k<<<grid, tb, 0, st>>>((const uint8_t *)tmp, (uint8_t *)w->q, (uint32_t *)w->s, nblk);
            w->bytes = nblk * 144;
            break;
        case QT_Q6_K: {
            /* d padded to whole 4-byte words (zeroed): the tensor-core kernel copies the
             * aligned word that holds a block's d (compute-sanitizer's memcheck flagged the
             * last word's 2 bytes past an odd-length array, 2026-12-02) */
            const size_t d_bytes = (size_t)((nblk + 1) & ~(int64_t)1) * 2;
            ce = cudaMalloc(&w->q, nblk * 192);
            if (ce == cudaSuccess) ce = cudaMalloc(&w->s, nblk * 16);
            if (ce == cudaSuccess) ce = cudaMalloc(&w->d, d_bytes);
            if (ce == cudaSuccess) ce = cudaMemsetAsync(w->d, 0, d_bytes, st);
            if (ce == cudaSuccess)
                repack_q6_k<<<grid, tb, 0, st>>>((const uint8_t *)tmp, (uint8_t *)w->q, (int8_t *)w->s,
                                                 (__half *)w->d, nblk);
            w->bytes = nblk * 210;
            break;
        }
        default: ce = cuda_mmv_tq_upload(w, type, tmp, nblk, st); break;
        }
        if (ce == cudaSuccess) ce = cudaGetLastError();
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(st);
    }
    cudaFree(tmp);
    if (ce != cudaSuccess) {
        cuda_qweight_free(w);
        rc = err_set(e, SMELT_ERR_DEVICE, "cuda mmv: uploading %lld x %lld %s: %s", (long long)rows,
                     (long long)k, qtype_name(type), cudaGetErrorString(ce));
    }
    return rc;
}

extern "C" uint64_t cuda_mmv_scratch_bytes(int64_t k, int n) {
    uint64_t nk = (uint64_t)k * (uint64_t)n;
    return ((nk + 255) & ~255ull) + nk / 16 * 8;
}

/* The one-token Q4_K, Q6_K and Q8_0 kernels in shape (R, U, KS) (mmv_shape). */
template <int GLU, int R, int U, int KS = 1>
static cudaError_t launch_var(uint32_t type, const struct mmv_mats &m, int rows, int k, const int8_t *xq,
                              const float2 *xd, int acc, struct cuda_ctx *ctx) {
    const dim3 grid = mmv_grid(m, rows, GLU, R, KS), block(32, MMV_WARPS);
    if (type == QT_Q8_0) return klaunch(mmv_q8_0<1, GLU ? 2 : R, GLU, U, KS>, grid, block, 0, ctx, m, xq, xd, k, acc);
    if (type == QT_Q6_K)
        return klaunch(mmv_q6_k<1, GLU ? 2 : R, GLU, U, KS>, grid, block, 0, ctx, m, xq, xd, k, acc);
    return klaunch(mmv_q4_k<1, GLU ? 2 : R, GLU, U, KS>, grid, block, 0, ctx, m, xq, xd, k, acc);
}

/* Tuning runs' shapes (mmv_with_shape's numbering; 0 is never passed here). */
template <int GLU>
static cudaError_t launch_variant(int v, uint32_t type, const struct mmv_mats &m, int rows, int k, const int8_t *xq,
                                  const float2 *xd, int acc, struct cuda_ctx *ctx) {
    return mmv_with_shape(v, [&](auto s) {
        using S = decltype(s);
        return launch_var<GLU, S::R, S::U, S::KS>(type, m, rows, k, xq, xd, acc, ctx);
    });
}

/* act: 0 = plain product (y = or += W x per `acc`, over the stacked matrices of m);
 * 1 = SiLU, 2 = tanh-GELU: y = act(W x) * (W2 x), m holding W and W2 of one shape. */
template <int N, int GLU>
static cudaError_t launch_g(const struct mmv_mats &m, uint32_t type, int k, const float *x, const int8_t *xq,
                            const float2 *xd, int acc, struct cuda_ctx *ctx) {
    const dim3 block(32, MMV_WARPS);
    const int per_block = MMV_WARPS * (GLU ? 1 : MMV_R);
    const int rows = m.end[GLU ? 0 : m.n - 1];
    const dim3 grid((unsigned)((rows + per_block - 1) / per_block), m.eid ? m.n_chunks : 1);
    /* The one-token expert (by id) launches' shape: ctx->mmv_id_variant when set (tuning
     * runs, SMELT_MMV_ID_VARIANT), else by type, as measured end to end (H200, 2026-12-04,
     * tg128, the expert products' shapes swept one at a time then together):
     *   - gate/up one unit in flight (variant 1): Qwen3-30B-A3B Q4_K 303 -> 310 tok/s,
     *     gpt-oss-20b MXFP4 419 -> 441 (its rows are short: 64 and 90 units, so U > 1 mostly
     *     loads clamped copies and costs registers);
     *   - down, Q4_K / Q6_K 4 rows a warp, one unit (variant 5): the 30B's 768-wide rows
     *     (24 units a row) 303 -> 329; MXFP4 two rows, two units (variant 3): 2880-wide, +1%.
     * Together: 30B 303 -> 331, gpt-oss 419 -> 434. Q8_0 and the other types: unmeasured,
     * the dense rules. Since 2026-12-06 the Q4_K / Q6_K down launch spreads 8 rows a warp
     * over lane groups (MMV_LANES, mmv_kq_lanes: 4 lanes a row, 3 units in flight; H100,
     * test_cuda_mmv SMELT_BENCH_ID=2, the decode pair in a graph: Qwen3-30B-A3B 25.2 ->
     * 23.6 us, Qwen3.5-35B-A3B 22.5 -> 20.1; the lane-group form at 4 rows a warp 25.4 and
     * 22.0, dropped; end to end Qwen3-30B-A3B tg128 372 -> 382 tok/s, 8 sequences 1,020 ->
     * 1,095). With a combining epilogue the down launch is mmv_sum_body's (MMV_LANES_SUM: the
     * same rows, summed in one block a group; H100, 2026-12-06: the pair 22.8 -> 20.2 us,
     * tg128 387 -> 408 tok/s), and the Q4_K / MXFP4 gate/up launch with h's int8 form is
     * mmv_glu_q_body's (MMV_LANES_SUM: variant 1's rows, quantized in one block a group;
     * same day: the pair 20.1 -> 17.8 us, tg128 405 -> 431; gpt-oss-20b 47.1 -> 39.2 us,
     * 436 -> 486). */
    int idv = m.eid && N == 1 ? ctx->mmv_id_variant[GLU ? 0 : 1] : 0;
    if (m.eid && N == 1 && !idv) {
        if (type == QT_Q4_K) idv = GLU && !m.epi.post_cnt ? 1 : MMV_LANES_SUM;
        else if (type == QT_Q6_K) idv = GLU ? 1 : MMV_LANES_SUM;
        else if (type == QT_MXFP4) idv = GLU ? (m.epi.post_cnt ? MMV_LANES_SUM : 1) : m.cmb.dst ? MMV_LANES_SUM : 3;
    }
    if (GLU && idv == MMV_LANES_SUM && m.epi.post_cnt && type == QT_Q4_K) {
        return mmv_glu_q_launch(ctx, m, rows, mmv_q4k_glu_q<32>, mmv_q4k_glu_q<16>, xq, xd, k, acc);
    }
    if (!GLU && idv == MMV_LANES_SUM && m.cmb.dst && (type == QT_Q4_K || type == QT_Q6_K)) {
        const dim3 g = mmv_sum_grid(m, rows), blk(32, MMV_SUM_WARPS);
        return type == QT_Q6_K ? klaunch(mmv_kq_lanes_sum<1>, g, blk, 0, ctx, m, xq, xd, k)
                               : klaunch(mmv_kq_lanes_sum<0>, g, blk, 0, ctx, m, xq, xd, k);
    }
    if (!GLU && (idv == MMV_LANES || idv == MMV_LANES_SUM) && (type == QT_Q4_K || type == QT_Q6_K)) {
        const dim3 g = mmv_grid(m, rows, 0, 8, 1), blk(32, MMV_WARPS);
        return type == QT_Q6_K ? klaunch(mmv_kq_lanes<8, 3, 1>, g, blk, 0, ctx, m, xq, xd, k, acc)
                               : klaunch(mmv_kq_lanes<8, 3, 0>, g, blk, 0, ctx, m, xq, xd, k, acc);
    }
    if (idv > 0 && idv < MMV_LANES && (type == QT_Q8_0 || type == QT_Q4_K || type == QT_Q6_K))
        return launch_variant<GLU>(idv, type, m, rows, k, xq, xd, acc, ctx);
    if (idv > 0) {
        const cudaError_t rc = cuda_mmv_tq_variant(idv, GLU, type, rows, ctx, m, xq, xd, k, acc);
        if (rc != cudaErrorNotSupported) return rc;
    }
    if (!GLU && m.mix_row) /* Q4_K rows, then Q6_K rows */
        return klaunch(mmv_q4k_q6k<N, N == 1 ? 2 : MMV_U>, grid, block, 0, ctx, m, xq, xd, k, acc);
    switch (type) {
    case QT_F32: return klaunch(mmv_float<N, MMV_R, QT_F32, GLU>, grid, block, 0, ctx, m, x, k, acc);
    case QT_F16: return klaunch(mmv_float<N, MMV_R, QT_F16, GLU>, grid, block, 0, ctx, m, x, k, acc);
    case QT_BF16: return klaunch(mmv_float<N, MMV_R, QT_BF16, GLU>, grid, block, 0, ctx, m, x, k, acc);
    case QT_Q8_0:
        if (N == 1 && ctx->mmv_variant > 0)
            return launch_variant<GLU>(ctx->mmv_variant, type, m, rows, k, xq, xd, acc, ctx);
        /* one token (H200, graph-replayed, test_cuda_mmv SMELT_BENCH_VARIANTS): long rows
         * split k over the block's 4 warps (4096x14336: 24.4 us -> 17.1 with 4 rows a warp
         * and one unit in flight; Qwen2.5-0.5B's 896x4864: 4.5 -> 2.8 with 2 rows); short
         * rows take one row a warp (896x896: 1.50 -> 1.26 us); a large GLU one unit in
         * flight (14336x4096: 30.9 -> 30.4 us), a small one 4 (4864x896: 4.4 vs 4.7);
         * 4096x4096 and the 128k-row output keep 2 rows and 4 units (6.2 us, vs 6.3-8.9; 126
         * us, vs 124-193) */
        if (N == 1 && !GLU && k >= 8192 && rows <= 65536)
            return launch_var<0, 4, 1, MMV_WARPS>(type, m, rows, k, xq, xd, acc, ctx);
        if (N == 1 && !GLU && k >= 4096 && rows < 2048)
            return launch_var<0, 2, 1, MMV_WARPS>(type, m, rows, k, xq, xd, acc, ctx);
        /* short rows of a vocabulary-sized matrix (Qwen2.5-0.5B's 151936x896 output): 2 rows
         * a warp, 2 units (half the blocks of the rule below): tg128 1,433 -> 1,456 tok/s
         * end to end (R2 U1 1,428, R4 U1 1,421, R2 U4 1,429; H200, 2026-12-01) */
        if (N == 1 && !GLU && k < 2048 && rows > 65536) return launch_var<0, 2, 2>(type, m, rows, k, xq, xd, acc, ctx);
        if (N == 1 && !GLU && k < 2048) return launch_var<0, 1, 2>(type, m, rows, k, xq, xd, acc, ctx);
        if (N == 1 && GLU && (int64_t)rows * k >= ((int64_t)16 << 20))
            return launch_var<GLU, 2, 1>(type, m, rows, k, xq, xd, acc, ctx);
        return klaunch(mmv_q8_0<N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_Q4_K:
        if (N == 1 && ctx->mmv_variant > 0)
            return launch_variant<GLU>(ctx->mmv_variant, type, m, rows, k, xq, xd, acc, ctx);
        /* one token (same bench): 2 units of 16 B in flight per row beat 4 (fewer registers,
         * more warps: 14336x4096 GLU 21.3 -> 20.4 us, 4096x14336 13.4 -> 11.7 us); the
         * 128k-row output matrix runs best with one (91.8 -> 84.1 us) */
        if (N == 1 && rows > 65536) return launch_var<GLU, 2, 1>(type, m, rows, k, xq, xd, acc, ctx);
        /* short and long rows (0.5B's 896x4864): split k over the block's warps, 4.31 -> 2.29 us */
        if (N == 1 && !GLU && k >= 4096 && rows < 2048)
            return launch_var<0, 2, 2, MMV_WARPS>(type, m, rows, k, xq, xd, acc, ctx);
        /* Qwen3-30B-A3B's attention (H200, 2026-12-04, test_cuda_mmv SMELT_BENCH_VARIANTS, us
         * per product in a graph): W_o 2048x4096 3.74 -> 3.20 split over the block's warps,
         * 4 rows and one unit each (R2 U4 3.40, R1 U2 3.54, R2 U2 split 4.68); the stacked
         * QKV 5120x2048 4.50 -> 3.36 with one unit in flight (R4 U1 4.16, the rest 4.5-11) */
        if (N == 1 && !GLU && k >= 4096 && rows < 4096)
            return launch_var<0, 4, 1, MMV_WARPS>(type, m, rows, k, xq, xd, acc, ctx);
        if (N == 1 && !GLU && k <= 2048 && rows >= 4096)
            return launch_var<0, 2, 1>(type, m, rows, k, xq, xd, acc, ctx);
        if (N == 1) return klaunch(mmv_q4_k<1, MMV_R, GLU, 2>, grid, block, 0, ctx, m, xq, xd, k, acc);
        return klaunch(mmv_q4_k<N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_Q6_K:
        if (N == 1 && ctx->mmv_variant > 0)
            return launch_variant<GLU>(ctx->mmv_variant, type, m, rows, k, xq, xd, acc, ctx);
        /* one token (same bench, 2026-12-01): short and long rows (0.5B's 896x4864) split k
         * over the block's warps, 5.0 -> 2.2 us. 4096x14336 (Q4_K_M's Q6_K down layers)
         * measured 17.6 -> 14.3 us alone with 4 rows, one unit and split-K, but 8B Q4_K_M
         * tg128 fell 456 -> 452 tok/s with it (behind its next-norm epilogue): not taken.
         * GLU, 4096x4096 and the output matrix: 2 rows, 2 units (within 1% of the best). */
        if (N == 1 && !GLU && k >= 4096 && rows < 2048)
            return launch_var<0, 2, 2, MMV_WARPS>(type, m, rows, k, xq, xd, acc, ctx);
        return klaunch(mmv_q6_k<N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    default: return cuda_mmv_tq_launch(N, GLU, type, grid, block, ctx, m, xq, xd, k, acc);
    }
    return cudaErrorInvalidValue;
}

template <int N>
static cudaError_t launch(const struct mmv_mats &m, uint32_t type, int k, const float *x, const int8_t *xq,
                          const float2 *xd, int acc, int act, struct cuda_ctx *ctx) {
    if (act) return launch_g<N, 1>(m, type, k, x, xq, xd, act, ctx);
    return launch_g<N, 0>(m, type, k, x, xq, xd, acc, ctx);
}

/* int8 values (nk, padded to 256 B), then {d, d * sum} per 16 values. */
static void scratch_parts(const void *scratch, int64_t k, int n, int8_t **xq, float2 **xd) {
    uint64_t nk = (uint64_t)k * (uint64_t)n;
    *xq = (int8_t *)scratch;
    *xd = (float2 *)((uint8_t *)scratch + ((nk + 255) & ~255ull));
}

extern "C" void cuda_mmv_scratch_parts(void *scratch, int64_t k, int n, int8_t **xq, void **xd) {
    float2 *d;
    scratch_parts(scratch, k, n, xq, &d);
    *xd = d;
}

extern "C" int cuda_mmv_needs_quant(uint32_t type) {
    return type != QT_F16 && type != QT_BF16 && type != QT_F32;
}

extern "C" smelt_status cuda_mmv_quantize(struct cuda_ctx *ctx, const float *x, int64_t k, int n, void *scratch,
                                          struct err *e) {
    int8_t *xq;
    float2 *xd;
    scratch_parts(scratch, k, n, &xq, &xd);
    const int64_t nk = k * n;
    const int tb = 256;
    CUDA_TRY(klaunch(quantize_act_kernel, dim3((unsigned)((nk + tb - 1) / tb)), dim3(tb), 0, ctx,
                     x, xq, xd, nk),
             e);
    return SMELT_OK;
}

/* xrows: the token rows of x's int8 form in scratch (n, or an expert launch's total). */
static smelt_status mmv_dispatch(struct cuda_ctx *ctx, const struct mmv_mats &m, uint32_t type, int64_t k,
                                 const float *x, int n, int64_t xrows, const void *scratch, int accumulate, int act,
                                 struct err *e) {
    if (n < 1 || n > CUDA_MMV_MAX_N)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmv: %d token rows (1..%d)", n, CUDA_MMV_MAX_N);
    int8_t *xq;
    float2 *xd;
    scratch_parts(scratch, k, (int)xrows, &xq, &xd);
    cudaError_t rc = cudaErrorInvalidValue;
    switch (n) {
    case 1: rc = launch<1>(m, type, (int)k, x, xq, xd, accumulate, act, ctx); break;
    case 2: rc = launch<2>(m, type, (int)k, x, xq, xd, accumulate, act, ctx); break;
    case 3: rc = launch<3>(m, type, (int)k, x, xq, xd, accumulate, act, ctx); break;
    case 4: rc = launch<4>(m, type, (int)k, x, xq, xd, accumulate, act, ctx); break;
    case 5: rc = launch<5>(m, type, (int)k, x, xq, xd, accumulate, act, ctx); break;
    case 6: rc = launch<6>(m, type, (int)k, x, xq, xd, accumulate, act, ctx); break;
    case 7: rc = launch<7>(m, type, (int)k, x, xq, xd, accumulate, act, ctx); break;
    case 8: rc = launch<8>(m, type, (int)k, x, xq, xd, accumulate, act, ctx); break;
    }
    if (rc != cudaSuccess)
        return err_set(e, SMELT_ERR_DEVICE, "cuda mmv launch (%s, %lld wide, %d rows): %s", qtype_name(type),
                       (long long)k, n, cudaGetErrorString(rc));
    return SMELT_OK;
}

static void mats_add(struct mmv_mats *m, const struct cuda_qweight *w, float *y, const float *b) {
    const int i = m->n++;
    m->q[i] = w->q;
    m->s[i] = w->s;
    m->d[i] = w->d;
    m->y[i] = y;
    m->b[i] = b;
    m->end[i] = (i ? m->end[i - 1] : 0) + (int)w->rows;
}

extern "C" int cuda_mmv_stackable(const struct cuda_qweight *const *w, int count) {
    if (count < 1 || count > MMV_MATS) return 0;
    int64_t rows = 0;
    for (int i = 0; i < count; i++) {
        if (w[i]->k != w[0]->k) return 0;
        if (w[i]->type != w[0]->type) {
            /* Q4_K matrices, then one Q6_K whose first row starts a block of the launch */
            if (i != count - 1 || w[0]->type != QT_Q4_K || w[i]->type != QT_Q6_K ||
                rows % (MMV_WARPS * MMV_R) != 0)
                return 0;
            for (int j = 1; j < i; j++)
                if (w[j]->type != QT_Q4_K) return 0;
        }
        rows += w[i]->rows;
    }
    return 1;
}

extern "C" smelt_status cuda_mmv_multi(struct cuda_ctx *ctx, const struct cuda_qweight *const *w,
                                       float *const *y, const float *const *b, int count,
                                       const float *x, int n, const void *scratch, int accumulate,
                                       const struct cuda_mmv_epi *epi, struct err *e) {
    if (count < 1 || count > MMV_MATS)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmv: %d matrices in one launch (1..%d)", count, MMV_MATS);
    if (!cuda_mmv_stackable(w, count))
        return err_set(e, SMELT_ERR_INVALID, "cuda mmv: stacked matrices differ in type or row length");
    struct mmv_mats m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < count; i++) {
        if ((int64_t)(i ? m.end[i - 1] : 0) + w[i]->rows > INT32_MAX)
            return err_set(e, SMELT_ERR_INVALID, "cuda mmv: too many rows in one launch");
        mats_add(&m, w[i], y[i], b ? b[i] : NULL);
    }
    for (int i = count; i < MMV_MATS; i++) m.end[i] = m.end[count - 1];
    m.k = (int)w[0]->k;
    if (w[count - 1]->type != w[0]->type) m.mix_row = m.end[count - 2]; /* Q4_K, then Q6_K */
    if (epi) {
        if (epi->post_cnt && (count != 1 || w[0]->rows % 32 != 0 || !cuda_mmv_needs_quant(w[0]->type) ||
                            32 % (MMV_WARPS * MMV_R) != 0))
            return err_set(e, SMELT_ERR_INVALID, "cuda mmv: a quantizing epilogue needs one quantized matrix "
                                                 "with rows a multiple of 32");
        if (epi->pre_ss && !cuda_mmv_needs_quant(w[0]->type))
            return err_set(e, SMELT_ERR_INVALID, "cuda mmv: a raw-residual input needs a quantized weight");
        m.epi = *epi;
    }
    return mmv_dispatch(ctx, m, w[0]->type, w[0]->k, x, n, n, scratch, accumulate, 0, e);
}

extern "C" smelt_status cuda_mmv_pre(struct cuda_ctx *ctx, const struct cuda_qweight *w,
                                     const float *x, int n, float *y, const void *scratch,
                                     int accumulate, struct err *e) {
    return cuda_mmv_multi(ctx, &w, &y, NULL, 1, x, n, scratch, accumulate, NULL, e);
}

extern "C" smelt_status cuda_mmv_glu(struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                                     const struct cuda_qweight *up, int act, const float *x, int n,
                                     float *y, const void *scratch, const struct cuda_mmv_epi *epi,
                                     struct err *e) {
    if (gate->type != up->type || gate->rows != up->rows || gate->k != up->k)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmv glu: gate and up differ in type or shape");
    struct mmv_mats m;
    memset(&m, 0, sizeof m);
    mats_add(&m, gate, y, NULL);
    mats_add(&m, up, y, NULL);
    m.end[1] = m.end[2] = m.end[0]; /* both matrices span the same rows */
    m.k = (int)gate->k;
    if (epi) {
        if (!cuda_mmv_needs_quant(gate->type) || (epi->post_cnt && gate->rows % 32 != 0))
            return err_set(e, SMELT_ERR_INVALID, "cuda mmv glu: unsupported epilogue");
        m.epi = *epi;
    }
    return mmv_dispatch(ctx, m, gate->type, gate->k, x, n, n, scratch, 0, act + 1, e);
}

/* Expert mode's mats: w's experts of rows / n_exp rows each (see struct mmv_mats). */
static smelt_status id_mats(struct mmv_mats *m, const struct cuda_qweight *w, const struct cuda_mmv_ids *id, int n,
                            struct err *e) {
    if (!id->eid || id->n_exp < 1 || w->rows % id->n_exp != 0 || id->n_chunks < 1 || id->n_chunks > 65535 ||
        id->x_div < 1 || id->x_rows < (int64_t)((id->n_chunks - 1) / id->x_div + 1) * n)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda mmv by id: %lld rows over %d experts, %d chunks of %d rows, x_div %d, %lld input rows",
                       (long long)w->rows, id->n_exp, id->n_chunks, n, id->x_div, (long long)id->x_rows);
    m->end[0] = m->end[1] = m->end[2] = (int)(w->rows / id->n_exp);
    m->eid = id->eid;
    m->n_chunks = id->n_chunks;
    m->x_div = id->x_div;
    m->n_exp = id->n_exp;
    m->id_early = id->ids_early;
    m->id_signal_late = id->signal_late;
    if (id->sh_k) { /* the shared slot: one expert's shape and type, one row a chunk */
        const int mats = m->n; /* GLU: gate and up */
        if (id->sh_k < 1 || n != 1 || id->n_chunks % (id->sh_k + 1) != 0)
            return err_set(e, SMELT_ERR_INVALID, "cuda mmv by id: a shared slot needs one row a chunk and "
                                                 "%d slots a token", id->sh_k + 1);
        for (int i = 0; i < mats; i++) {
            const struct cuda_qweight *s = id->sh_w[i];
            if (!s || s->type != w->type || s->rows != m->end[0] || s->k != w->k)
                return err_set(e, SMELT_ERR_INVALID, "cuda mmv by id: the shared expert differs from the "
                                                     "experts in type or shape");
            m->sh_q[i] = s->q;
            m->sh_s[i] = s->s;
            m->sh_d[i] = s->d;
        }
        m->id_k = id->sh_k;
    }
    return SMELT_OK;
}

/* Expert mode's fused epilogues (see struct cuda_mmv_ids). */
static smelt_status id_epi(struct mmv_mats *m, const struct cuda_qweight *w, const struct cuda_mmv_ids *id, int n,
                           int glu, struct err *e) {
    const int rows = m->end[0];
    if (id->post_cnt) {
        if (!glu || !cuda_mmv_needs_quant(w->type) || rows % 32 != 0 || !id->post_xq || !id->post_xd)
            return err_set(e, SMELT_ERR_INVALID, "cuda mmv by id: a quantizing epilogue needs a quantized GLU "
                                                 "with rows a multiple of 32");
        m->epi.post_cnt = id->post_cnt;
        m->epi.post_xq = id->post_xq;
        m->epi.post_xd = id->post_xd;
    }
    if (id->cmb_dst) {
        const int sl = id->cmb_k + (id->sh_k ? 1 : 0); /* slots a token */
        if (glu || n != 1 || id->x_div != 1 || rows % 32 != 0 || id->cmb_k < 1 || id->cmb_k > 32 ||
            (id->sh_k && id->sh_k != id->cmb_k) || id->n_chunks % sl != 0 || !id->cmb_ids || !id->cmb_w ||
            !id->cmb_cnt)
            return err_set(e, SMELT_ERR_INVALID, "cuda mmv by id: a combining epilogue needs one row a chunk, %d "
                                                 "slots a token and rows a multiple of 32", id->cmb_k);
        m->cmb.dst = id->cmb_dst;
        m->cmb.ids = id->cmb_ids;
        m->cmb.w = id->cmb_w;
        m->cmb.b = id->cmb_b;
        m->cmb.cnt = id->cmb_cnt;
        m->cmb.k = id->cmb_k;
        m->cmb.acc = id->cmb_acc;
        m->cmb.sh_logit = id->sh_k ? id->cmb_sh_logit : NULL;
        if (id->cmb_post_xq) {
            m->cmb.post_w = id->cmb_post_w;
            m->cmb.post_xq = id->cmb_post_xq;
            m->cmb.post_xd = (float2 *)id->cmb_post_xd;
            m->cmb.post_ss = id->cmb_post_ss;
        }
    }
    return SMELT_OK;
}

extern "C" smelt_status cuda_mmv_id(struct cuda_ctx *ctx, const struct cuda_qweight *w, const struct cuda_mmv_ids *id,
                                    int n, const float *x, float *y, const void *scratch, struct err *e) {
    struct mmv_mats m;
    memset(&m, 0, sizeof m);
    mats_add(&m, w, y, NULL);
    m.k = (int)w->k;
    smelt_status st = id_mats(&m, w, id, n, e);
    if (st == SMELT_OK) st = id_epi(&m, w, id, n, 0, e);
    if (st != SMELT_OK) return st;
    return mmv_dispatch(ctx, m, w->type, w->k, x, n, id->x_rows, scratch, 0, 0, e);
}

extern "C" smelt_status cuda_mmv_glu_id(struct cuda_ctx *ctx, const struct cuda_qweight *gate,
                                        const struct cuda_qweight *up, int act, const struct cuda_mmv_ids *id, int n,
                                        const float *x, float *y, const void *scratch, struct err *e) {
    if (gate->type != up->type || gate->rows != up->rows || gate->k != up->k)
        return err_set(e, SMELT_ERR_INVALID, "cuda mmv glu by id: gate and up differ in type or shape");
    struct mmv_mats m;
    memset(&m, 0, sizeof m);
    mats_add(&m, gate, y, NULL);
    mats_add(&m, up, y, NULL);
    m.k = (int)gate->k;
    m.bias[0] = id->gate_b;
    m.bias[1] = id->up_b;
    smelt_status st = id_mats(&m, gate, id, n, e);
    if (st == SMELT_OK) st = id_epi(&m, gate, id, n, 1, e);
    if (st != SMELT_OK) return st;
    return mmv_dispatch(ctx, m, gate->type, gate->k, x, n, id->x_rows, scratch, 0, act + 1, e);
}

extern "C" smelt_status cuda_mmv_norm_quantize(struct cuda_ctx *ctx, const float *x,
                                               int64_t x_stride, const float *w, float eps,
                                               int64_t k, int n, void *scratch, float *xn,
                                               struct err *e) {
    if (k % 32 != 0 || k > INT32_MAX)
        return err_set(e, SMELT_ERR_INVALID, "cuda norm+quantize: row length %lld", (long long)k);
    int8_t *xq;
    float2 *xd;
    scratch_parts(scratch, k, n, &xq, &xd);
    const int tb = k >= 8192 ? 1024 : k >= 2048 ? 512 : 256;
    cudaError_t rc = klaunch(norm_quant_kernel, dim3((unsigned)n), dim3(tb), 0, ctx, x, x_stride,
                             w, eps, (int)k, xq, xd, xn);
    if (rc != cudaSuccess)
        return err_set(e, SMELT_ERR_DEVICE, "cuda norm+quantize launch: %s", cudaGetErrorString(rc));
    return SMELT_OK;
}

extern "C" smelt_status cuda_mmv(struct cuda_ctx *ctx, const struct cuda_qweight *w, const float *x, int n, float *y,
                                 void *scratch, struct err *e) {
    if (cuda_mmv_needs_quant(w->type)) {
        smelt_status st = cuda_mmv_quantize(ctx, x, w->k, n, scratch, e);
        if (st) return st;
    }
    return cuda_mmv_pre(ctx, w, x, n, y, scratch, 0, e);
}
