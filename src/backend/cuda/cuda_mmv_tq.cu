/* mmv kernels (decode: 1..8 token rows) for Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4,
 * Q2_K, Q3_K and Q5_K, their repacking at upload, and their launch (called by cuda_mmv.cu's launchers
 * through cuda_mmv.cuh). They use the family's mmv_mats / mrow_ref / mrefs / mmv_acc and MMV_*
 * knobs (cuda_mmv.cuh), so stacked matrices, the GLU mode and the pre_ss / post_* epilogues
 * work as for Q4_K.
 *
 * Device layouts: cuda_qtypes.cuh. One generic kernel (mmv_tq) walks each row in units of
 * 16 bytes of quant bits, lane l taking units l, l+32, ... (a warp reads 512 consecutive bytes
 * of quant bits per step; the small scale / high-bit arrays are read in step with them, 2..8 B
 * per lane, also coalesced). All loads of TT::U units x R rows are issued before any math (the
 * MMV_U pattern), and the loop bound is uniform over the warp so every lane reaches pdl_wait()
 * after its first weight loads and before its first activation read.
 *
 * Per unit (16 B of quant bits) and token row, against the int8 activations (xq, xds = {dx,
 * dx*sum} per 16 values: quant16 in cuda_mmv.cuh), with dot = __dp4a over one run of 16
 * weights and the sums over the two (or four) runs of 16 of the unit, each with its dx:
 *   Q4_0  32 weights: d * sum(dx * dot(q) - 8 * dx*sum)           (q = nibble, 0..15)
 *   Q4_1  32 weights: d * sum(dx * dot(q)) + m * sum(dx*sum)
 *   Q5_0  32 weights: d * sum(dx * dot(q) - 16 * dx*sum)          (q = nibble | qh bit << 4)
 *   Q5_1  32 weights: d * sum(dx * dot(q)) + m * sum(dx*sum)
 *   IQ4_NL/IQ4_XS 32 weights: dl * sum(dx * dot(kv[code]))        (codes mapped by tq_iq4)
 *   MXFP4 32 weights: e8m0/2 * sum(dx * dot(2 * fp4[code]))          (codes mapped by tq_mx4)
 *   Q5_K  32 weights (two runs of 16 in sub-blocks 2g, 2g+1, as Q4_K's units):
 *         d * sum(sc * dx * dot) - dmin * sum(m * dx*sum)
 *   Q2_K  64 weights (four runs of 16, shifts 0..3): d * sum(sc * dx * dot) - dmin * sum(m * dx*sum)
 *   Q3_K  64 weights (as Q2_K, q = low2 | hbit << 2 in 0..7): d * sum(sc * (dx * dot - 4 * dx*sum))
 */
#include "backend/cuda/cuda_mmv.cuh"
#include "backend/cuda/cuda_qtypes.cuh"

extern "C" {
#include "quant/quant.h"
}

static __device__ __forceinline__ uint4 tq_lo4(uint4 w) {
    return make_uint4(w.x & 0x0f0f0f0fu, w.y & 0x0f0f0f0fu, w.z & 0x0f0f0f0fu, w.w & 0x0f0f0f0fu);
}
static __device__ __forceinline__ uint4 tq_hi4(uint4 w) {
    return make_uint4((w.x >> 4) & 0x0f0f0f0fu, (w.y >> 4) & 0x0f0f0f0fu, (w.z >> 4) & 0x0f0f0f0fu,
                      (w.w >> 4) & 0x0f0f0f0fu);
}
/* 16 nibbles (in byte order) plus their 5th bits, bits 0..15 of h. */
static __device__ __forceinline__ uint4 tq_q5(uint4 nib, uint32_t h) {
    return make_uint4(nib.x | tq_spread4(h) << 4, nib.y | tq_spread4(h >> 4) << 4, nib.z | tq_spread4(h >> 8) << 4,
                      nib.w | tq_spread4(h >> 12) << 4);
}
/* Shift s's 2-bit quants of 16 bytes (Q2_K / Q3_K units). */
static __device__ __forceinline__ uint4 tq_q2(uint4 w, int s) {
    return make_uint4((w.x >> (2 * s)) & 0x03030303u, (w.y >> (2 * s)) & 0x03030303u, (w.z >> (2 * s)) & 0x03030303u,
                      (w.w >> (2 * s)) & 0x03030303u);
}
static __device__ __forceinline__ uint4 tq_x16(const int8_t *xq, int64_t e) { return *(const uint4 *)(xq + e); }

/* ---- per-type units: ld = what a lane loads for one unit of one row, dot = its math ---- */

/* Q4_0 / Q4_1 / Q5_0 / Q5_1: unit = one 32-weight block; F5 = 5-bit, MIN = {d, m} scales. */
template <int F5, int MIN>
struct tq_legacy {
    static constexpr int W = 32, U = MMV_U;
    struct ld {
        uint4 q;
        uint32_t s; /* half d, or half2 {d, m} */
        uint32_t h; /* 5th bits (F5) */
    };
    static __device__ __forceinline__ ld load(const mrow_ref &rr, int u, int upr) {
        const int64_t b = rr.row * upr + u;
        ld v;
        v.q = ((const uint4 *)rr.q)[b];
        v.s = MIN ? ((const uint32_t *)rr.s)[b] : (uint32_t)((const unsigned short *)rr.s)[b];
        v.h = F5 ? ((const uint32_t *)rr.d)[b] : 0u;
        return v;
    }
    template <int N, int R>
    static __device__ __forceinline__ void dot(mmv_acc<N, R> &acc, const ld *v, const int8_t *xq, const float2 *xds, int u, int k) {
        uint4 wa[R], wb[R];
        float2 dm[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            wa[r] = tq_lo4(v[r].q);
            wb[r] = tq_hi4(v[r].q);
            if (F5) {
                wa[r] = tq_q5(wa[r], v[r].h);
                wb[r] = tq_q5(wb[r], v[r].h >> 16);
            }
            if (MIN) dm[r] = __half22float2(*(const __half2 *)&v[r].s);
            else dm[r] = make_float2(__half2float(__ushort_as_half((unsigned short)v[r].s)), 0.0f);
        }
        const float off = MIN ? 0.0f : F5 ? 16.0f : 8.0f;
#pragma unroll
        for (int t = 0; t < N; t++) {
            const int64_t e = (int64_t)t * k + (int64_t)u * 32;
            const uint4 xa = tq_x16(xq, e), xb = tq_x16(xq, e + 16);
            const float2 da = xds[e >> 4], db = xds[(e >> 4) + 1];
            const float xsum = da.y + db.y;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float dot = da.x * (float)dot16(wa[r], xa) + db.x * (float)dot16(wb[r], xb);
                if (MIN) acc.v[r][t] += dm[r].x * dot + dm[r].y * xsum;
                else acc.v[r][t] += dm[r].x * (dot - off * xsum);
            }
        }
    }
};

/* IQ4_NL (F = 0: unit = block, half d), IQ4_XS (F = 1: unit = sub-block u % 8 of
 * super-block u / 8, scale from the 8-byte header) and MXFP4 (F = 2: unit = block, E8M0
 * byte, kvalues_mxfp4). */
template <int F>
struct tq_iq4x {
    static constexpr int XS = F == 1, MX = F == 2;
    static constexpr int W = 32, U = MMV_U;
    struct ld {
        uint4 q;
        uint32_t a, b; /* NL: a = half d; XS: the header words */
    };
    static __device__ __forceinline__ ld load(const mrow_ref &rr, int u, int upr) {
        const int64_t b = rr.row * upr + u;
        ld v;
        v.q = ((const uint4 *)rr.q)[b];
        if (XS) {
            const uint2 h = ((const uint2 *)rr.s)[b >> 3];
            v.a = h.x;
            v.b = h.y;
        } else {
            v.a = MX ? ((const uint8_t *)rr.s)[tq_mx_s(rr.row, upr, u)] : ((const unsigned short *)rr.s)[b];
            v.b = 0;
        }
        return v;
    }
    template <int N, int R>
    static __device__ __forceinline__ void dot(mmv_acc<N, R> &acc, const ld *v, const int8_t *xq, const float2 *xds, int u, int k) {
        uint4 wa[R], wb[R];
        float dl[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 q = v[r].q;
            if (MX) {
                wa[r] = make_uint4(tq_mx4(q.x), tq_mx4(q.x >> 16), tq_mx4(q.y), tq_mx4(q.y >> 16));
                wb[r] = make_uint4(tq_mx4(q.z), tq_mx4(q.z >> 16), tq_mx4(q.w), tq_mx4(q.w >> 16));
                dl[r] = tq_e8m0_half(v[r].a);
            } else {
                wa[r] = make_uint4(tq_iq4(q.x), tq_iq4(q.x >> 16), tq_iq4(q.y), tq_iq4(q.y >> 16));
                wb[r] = make_uint4(tq_iq4(q.z), tq_iq4(q.z >> 16), tq_iq4(q.w), tq_iq4(q.w >> 16));
                dl[r] = __half2float(__ushort_as_half((unsigned short)(v[r].a & 0xffff)));
            }
            if (XS) {
                const int sub = u & 7;
                const int ls = (int)((v[r].b >> (4 * sub)) & 15) | (int)((v[r].a >> (16 + 2 * sub)) & 3) << 4;
                dl[r] *= (float)(ls - 32);
            }
        }
#pragma unroll
        for (int t = 0; t < N; t++) {
            const int64_t e = (int64_t)t * k + (int64_t)u * 32;
            const uint4 xa = tq_x16(xq, e), xb = tq_x16(xq, e + 16);
            const float dxa = xds[e >> 4].x, dxb = xds[(e >> 4) + 1].x;
#pragma unroll
            for (int r = 0; r < R; r++)
                acc.v[r][t] += dl[r] * (dxa * (float)dot16(wa[r], xa) + dxb * (float)dot16(wb[r], xb));
        }
    }
};

/* Q5_K: unit c = u % 8 of super-block u / 8 (Q4_K's units): 16 B of nibbles (weights 64g +
 * 16hf + [0,16) low, + 32 high) and its u32 of 5th bits, pair g's scales word, {d, dmin}. */
struct tq_q5_k {
    static constexpr int W = 32, U = MMV_U;
    struct ld {
        uint4 q;
        uint32_t h, pk, dm;
    };
    static __device__ __forceinline__ ld load(const mrow_ref &rr, int u, int upr) {
        const int64_t sb = (rr.row * upr + u) >> 3;
        const int c = u & 7;
        ld v;
        v.q = ((const uint4 *)rr.q)[sb * 10 + c];
        v.h = ((const uint32_t *)rr.q)[sb * 40 + 32 + c];
        v.pk = ((const uint32_t *)rr.s)[sb * 4 + (c >> 1)];
        v.dm = ((const uint32_t *)rr.d)[sb];
        return v;
    }
    template <int N, int R>
    static __device__ __forceinline__ void dot(mmv_acc<N, R> &acc, const ld *v, const int8_t *xq, const float2 *xds, int u, int k) {
        const int c = u & 7;
        const int ea = (u >> 3) * TQ_QK + (c >> 1) * 64 + (c & 1) * 16, eb = ea + 32;
        uint4 wa[R], wb[R];
        float2 dm[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            wa[r] = tq_q5(tq_lo4(v[r].q), v[r].h);
            wb[r] = tq_q5(tq_hi4(v[r].q), v[r].h >> 16);
            dm[r] = __half22float2(*(const __half2 *)&v[r].dm);
        }
#pragma unroll
        for (int t = 0; t < N; t++) {
            const int64_t ta = (int64_t)t * k + ea, tb = (int64_t)t * k + eb;
            const uint4 xa = tq_x16(xq, ta), xb = tq_x16(xq, tb);
            const float2 pa = xds[ta >> 4], pb = xds[tb >> 4];
            const float dxa = pa.x, dxb = pb.x, sxa = pa.y, sxb = pb.y;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint32_t pk = v[r].pk;
                acc.v[r][t] += dm[r].x * ((float)(pk & 63) * dxa * (float)dot16(wa[r], xa) +
                                          (float)((pk >> 12) & 63) * dxb * (float)dot16(wb[r], xb)) -
                               dm[r].y * ((float)((pk >> 6) & 63) * sxa + (float)((pk >> 18) & 63) * sxb);
            }
        }
    }
};

/* Q2_K (Q3 = 0) and Q3_K (Q3 = 1): unit c4 = u % 4 of super-block u / 4, 64 weights: shift s
 * (0..3) of its 16 bytes holds elements 128h + 32s + 16c + [0,16), h = c4/2, c = c4%2. */
template <int Q3>
struct tq_q23_k {
    static constexpr int W = 64, U = MMV_U > 2 ? MMV_U / 2 : MMV_U;
    struct ld {
        uint4 q;
        uint2 hm;    /* Q3: high bits, shifts 0,1 in .x, 2,3 in .y */
        uint32_t sc; /* scale bytes of the unit's four sub-blocks */
        uint32_t dm; /* Q2: half2 {d, dmin}; Q3: half d */
    };
    static __device__ __forceinline__ ld load(const mrow_ref &rr, int u, int upr) {
        const int64_t b = rr.row * upr + u, sb = b >> 2;
        const int c4 = u & 3;
        ld v;
        if (Q3) {
            v.q = ((const uint4 *)rr.q)[sb * 6 + c4];
            v.hm = ((const uint2 *)rr.q)[sb * 12 + 8 + c4];
            v.dm = ((const unsigned short *)rr.d)[sb];
        } else {
            v.q = ((const uint4 *)rr.q)[b];
            v.hm = make_uint2(0, 0);
            v.dm = ((const uint32_t *)rr.d)[sb];
        }
        v.sc = ((const uint32_t *)rr.s)[b];
        return v;
    }
    template <int N, int R>
    static __device__ __forceinline__ void dot(mmv_acc<N, R> &acc, const ld *v, const int8_t *xq, const float2 *xds, int u, int k) {
        const int c4 = u & 3;
        const int e0 = (u >> 2) * TQ_QK + (c4 >> 1) * 128 + (c4 & 1) * 16;
        float2 dm[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (Q3) dm[r] = make_float2(__half2float(__ushort_as_half((unsigned short)v[r].dm)), 0.0f);
            else dm[r] = __half22float2(*(const __half2 *)&v[r].dm);
        }
#pragma unroll
        for (int t = 0; t < N; t++) {
            float fs[R], ms[R];
#pragma unroll
            for (int r = 0; r < R; r++) fs[r] = ms[r] = 0.0f;
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const int64_t e = (int64_t)t * k + e0 + 32 * s;
                const uint4 x = tq_x16(xq, e);
                const float2 p = xds[e >> 4];
                const float dx = p.x, sx = p.y;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    uint4 w = tq_q2(v[r].q, s);
                    const uint32_t sb = (v[r].sc >> (8 * s)) & 0xffu;
                    if (Q3) {
                        const uint32_t h = (s < 2 ? v[r].hm.x : v[r].hm.y) >> (16 * (s & 1));
                        w.x |= tq_spread4(h) << 2;
                        w.y |= tq_spread4(h >> 4) << 2;
                        w.z |= tq_spread4(h >> 8) << 2;
                        w.w |= tq_spread4(h >> 12) << 2;
                        /* q = low2 | hbit << 2 is the value + 4 */
                        fs[r] += (float)(int8_t)sb * (dx * (float)dot16(w, x) - 4.0f * sx);
                    } else {
                        fs[r] += (float)(sb & 15) * dx * (float)dot16(w, x);
                        ms[r] += (float)(sb >> 4) * sx;
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) acc.v[r][t] += dm[r].x * fs[r] - dm[r].y * ms[r];
        }
    }
};

/* One warp's rows row0 .. (rr: their matrices) against activations xq, xds into acc: TT::U
 * units of 16 B per lane in flight; the first weights go out before the PDL wait (once,
 * `waited`). */
template <class TT, int N, int R, int U>
static __device__ __forceinline__ void tq_rows(mmv_acc<N, R> &acc, const mrow_ref *rr, const int8_t *xq,
                                               const float2 *xds, int k, bool &waited) {
    const int lane = threadIdx.x;
    const int upr = k / TT::W; /* units per row */
    for (int base = 0; base < upr; base += 32 * U) {
        typename TT::ld v[U][R];
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int u = min(base + lane + 32 * i, upr - 1);
#pragma unroll
            for (int r = 0; r < R; r++) v[i][r] = TT::load(rr[r], u, upr);
        }
        if (!waited) { /* every lane: the first weights are in flight; activations next */
            pdl_wait();
            waited = true;
        }
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int u = base + lane + 32 * i;
            if (u < upr) TT::template dot<N, R>(acc, v[i], xq, xds, u, k);
        }
    }
}

/* y (+)= W x for a type TT above: R rows per warp (GLU: gate and up of one row), MMV_WARPS
 * warps per block, TT::U units of 16 B per lane in flight. */
template <class TT, int N, int R, int GLU, int U = TT::U>
static __global__ void __launch_bounds__(MMV_WARPS * 32, MMV_MINB)
    mmv_tq(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k, int accumulate) {
    if (!mmv_id_live(m)) return; /* the PDL trigger too */
    xq = mmv_id_x<N>(m, xq, k);
    xds = mmv_id_x<N>(m, xds, k / 16);
    const int row0 = (blockIdx.x * MMV_WARPS + threadIdx.y) * (GLU ? 1 : R);
    if (row0 >= m.end[GLU ? 0 : m.n - 1]) return;
    mmv_acc<N, R> acc;
    acc.zero();
    mrow_ref rr[R];
    mrefs<GLU, R>(m, row0, rr);
    bool waited = false;
    tq_rows<TT, N, R, U>(acc, rr, xq, xds, k, waited);
    if (GLU) acc.store_glu(m, row0, threadIdx.x, accumulate); /* accumulate carries the act */
    else acc.store(m, row0, threadIdx.x, accumulate);
}

/* mmv_sum_body's item for these types: R rows as mmv_tq<TT, 1, R, 0, U> stores them (the
 * stores' warp sums; no bias in expert mode, no norm factor). */
template <class TT, int R, int U> struct tq_item {
    static constexpr int ROWS = R;
    static __device__ __forceinline__ void run(const mmv_mats &m, int row0, int64_t e, const int8_t *xq,
                                               const float2 *xds, int k, bool &waited, float *out) {
        mmv_acc<1, R> acc;
        acc.zero();
        mrow_ref rr[R];
#pragma unroll
        for (int r = 0; r < R; r++) rr[r] = mref<0>(m, row0, r, e);
        tq_rows<TT, 1, R, U>(acc, rr, xq, xds, k, waited);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float s = warp_sum(acc.v[r][0]);
            if (threadIdx.x == 0) out[r] = s;
        }
    }
};

/* mmv_glu_q_body's item for these types: a row's gate and up as mmv_tq<TT, 1, 2, GLU, U>. */
template <class TT, int U> struct tq_glu_item {
    static __device__ __forceinline__ float run(const mmv_mats &m, int row, int64_t e, const int8_t *xq,
                                                const float2 *xds, int k, int glu, bool &waited) {
        return glu_row(m, row, e, glu,
                       [&](mmv_acc<1, 2> &acc, const mrow_ref *rr) { tq_rows<TT, 1, 2, U>(acc, rr, xq, xds, k, waited); });
    }
};

template <class TT, int U, int W>
static __global__ void __launch_bounds__(W * 32, 1024 / (W * 32))
    mmv_tq_glu_q(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k, int glu) {
    mmv_glu_q_body<tq_glu_item<TT, U>, W>(m, xq, xds, k, glu);
}

template <class TT, int R, int U>
static __global__ void __launch_bounds__(MMV_SUM_WARPS * 32, 1)
    mmv_tq_sum(const struct mmv_mats m, const int8_t *xq, const float2 *xds, int k) {
    mmv_sum_body<tq_item<TT, R, U>>(m, xq, xds, k);
}

/* ---- upload ---- */

static __device__ __forceinline__ void tq_put32(uint8_t *p, uint32_t v) { *(uint32_t *)p = v; }
static __device__ __forceinline__ uint32_t tq_get16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static __device__ __forceinline__ uint32_t tq_get32(const uint8_t *p) { return tq_get16(p) | tq_get16(p + 2) << 16; }

/* 16 bytes of GGUF IQ4 codes (byte j: element j low nibble, j + 16 high) in element order. */
static __device__ __forceinline__ void tq_iq4_order(const uint8_t *src, uint8_t *dst) {
    for (int j = 0; j < 16; j++) {
        const int e0 = 2 * j, e1 = 2 * j + 1;
        const int c0 = e0 < 16 ? src[e0] & 15 : src[e0 - 16] >> 4, c1 = e1 < 16 ? src[e1] & 15 : src[e1 - 16] >> 4;
        dst[j] = (uint8_t)(c0 | c1 << 4);
    }
}

/* One thread per GGUF block of src (a temporary device copy) into the layouts of
 * cuda_qtypes.cuh. */
static __global__ void repack_tq(uint32_t type, const uint8_t *__restrict__ src, uint8_t *__restrict__ q,
                                 uint8_t *__restrict__ s, uint8_t *__restrict__ d, int64_t nblk, uint32_t bsize,
                                 int64_t upr) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblk) return;
    const uint8_t *p = src + b * bsize;
    switch (type) {
    case QT_Q4_0:
    case QT_IQ4_NL:
        s[2 * b] = p[0];
        s[2 * b + 1] = p[1];
        if (type == QT_IQ4_NL) tq_iq4_order(p + 2, q + 16 * b);
        else
            for (int i = 0; i < 16; i++) q[16 * b + i] = p[2 + i];
        break;
    case QT_Q4_1:
        tq_put32(s + 4 * b, tq_get32(p));
        for (int i = 0; i < 16; i++) q[16 * b + i] = p[4 + i];
        break;
    case QT_Q5_0:
        s[2 * b] = p[0];
        s[2 * b + 1] = p[1];
        tq_put32(d + 4 * b, tq_get32(p + 2));
        for (int i = 0; i < 16; i++) q[16 * b + i] = p[6 + i];
        break;
    case QT_Q5_1:
        tq_put32(s + 4 * b, tq_get32(p));
        tq_put32(d + 4 * b, tq_get32(p + 4));
        for (int i = 0; i < 16; i++) q[16 * b + i] = p[8 + i];
        break;
    case QT_MXFP4: /* e, qs[16]; upr: blocks a row */
        s[tq_mx_s(b / upr, upr, b % upr)] = p[0];
        tq_iq4_order(p + 1, q + 16 * b);
        break;
    case QT_IQ4_XS:
        for (int i = 0; i < 8; i++) s[8 * b + i] = p[i];
        for (int sub = 0; sub < 8; sub++) tq_iq4_order(p + 8 + 16 * sub, q + 128 * b + 16 * sub);
        break;
    case QT_Q5_K: { /* d, dmin, scales[12], qh[32], qs[128] */
        const uint8_t *sc = p + 4, *qh = p + 16;
        uint8_t *qo = q + 160 * b;
        for (int i = 0; i < 128; i++) qo[i] = p[48 + i];
        for (int c = 0; c < 8; c++) {
            const int g = c >> 1, hf = c & 1;
            uint32_t w = 0;
            for (int i = 0; i < 16; i++) {
                const uint32_t hb = qh[16 * hf + i];
                w |= ((hb >> (2 * g)) & 1u) << i | ((hb >> (2 * g + 1)) & 1u) << (16 + i);
            }
            tq_put32(qo + 128 + 4 * c, w);
        }
        for (int g = 0; g < 4; g++) {
            uint32_t f = 0;
            for (int h = 0; h < 2; h++) {
                const int j = 2 * g + h;
                uint32_t scj, mj;
                if (j < 4) {
                    scj = sc[j] & 63;
                    mj = sc[j + 4] & 63;
                } else {
                    scj = (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4);
                    mj = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
                }
                f |= (scj | mj << 6) << (12 * h);
            }
            tq_put32(s + 16 * b + 4 * g, f);
        }
        tq_put32(d + 4 * b, tq_get32(p));
        break;
    }
    case QT_Q2_K: /* scales[16], qs[64], d, dmin */
        for (int i = 0; i < 64; i++) q[64 * b + i] = p[16 + i];
        for (int c4 = 0; c4 < 4; c4++) {
            const int h = c4 >> 1, c = c4 & 1;
            uint32_t w = 0;
            for (int sh = 0; sh < 4; sh++) w |= (uint32_t)p[8 * h + 2 * sh + c] << (8 * sh);
            tq_put32(s + 16 * b + 4 * c4, w);
        }
        tq_put32(d + 4 * b, tq_get32(p + 80));
        break;
    case QT_Q3_K: { /* hmask[32], qs[64], scales[12], d */
        const uint8_t *hm = p, *sc = p + 96;
        uint8_t *qo = q + 96 * b;
        for (int i = 0; i < 64; i++) qo[i] = p[32 + i];
        for (int c4 = 0; c4 < 4; c4++) {
            const int h = c4 >> 1, c = c4 & 1;
            uint32_t w[2] = {0, 0}, sw = 0;
            for (int sh = 0; sh < 4; sh++) {
                for (int i = 0; i < 16; i++)
                    w[sh >> 1] |= (uint32_t)((hm[16 * c + i] >> (4 * h + sh)) & 1) << (16 * (sh & 1) + i);
                const int kk = 8 * h + 2 * sh + c; /* sub-block */
                const int lo = kk < 8 ? sc[kk] & 15 : sc[kk - 8] >> 4;
                const int hi = (sc[8 + kk % 4] >> (2 * (kk / 4))) & 3;
                sw |= (uint32_t)(uint8_t)(int8_t)((lo | hi << 4) - 32) << (8 * sh);
            }
            tq_put32(qo + 64 + 8 * c4, w[0]);
            tq_put32(qo + 64 + 8 * c4 + 4, w[1]);
            tq_put32(s + 16 * b + 4 * c4, sw);
        }
        d[2 * b] = p[108];
        d[2 * b + 1] = p[109];
        break;
    }
    }
}

/* Device bytes of q, s, d for nblk GGUF blocks of type, rows of k (0 where unused). */
static void tq_sizes(uint32_t type, int64_t nblk, int64_t k, uint64_t *qb, uint64_t *sb, uint64_t *db) {
    const uint64_t n = (uint64_t)nblk;
    *qb = *sb = *db = 0;
    switch (type) {
    case QT_Q4_0:
    case QT_IQ4_NL: *qb = 16 * n, *sb = 2 * n; break;
    case QT_Q4_1: *qb = 16 * n, *sb = 4 * n; break;
    case QT_Q5_0: *qb = 16 * n, *sb = 2 * n, *db = 4 * n; break;
    case QT_Q5_1: *qb = 16 * n, *sb = 4 * n, *db = 4 * n; break;
    case QT_IQ4_XS: *qb = 128 * n, *sb = 8 * n; break;
    case QT_MXFP4: *qb = 16 * n, *sb = (uint64_t)tq_mx_s(nblk / (k / 32), k / 32, 0); break;
    case QT_Q5_K: *qb = 160 * n, *sb = 16 * n, *db = 4 * n; break;
    case QT_Q2_K: *qb = 64 * n, *sb = 16 * n, *db = 4 * n; break;
    case QT_Q3_K: *qb = 96 * n, *sb = 16 * n, *db = 2 * n; break;
    }
}

extern "C" cudaError_t cuda_mmv_tq_upload(struct cuda_qweight *w, uint32_t type, const void *tmp, int64_t nblk,
                                          cudaStream_t st) {
    uint64_t qb, sb, db;
    tq_sizes(type, nblk, w->k, &qb, &sb, &db);
    if (!qb) return cudaErrorInvalidValue;
    cudaError_t ce = cudaMalloc(&w->q, qb);
    if (ce == cudaSuccess) ce = cudaMalloc(&w->s, sb);
    if (ce == cudaSuccess && type == QT_MXFP4) ce = cudaMemsetAsync(w->s, 0, sb, st); /* the padding */
    if (ce == cudaSuccess && db) ce = cudaMalloc(&w->d, db);
    if (ce != cudaSuccess) return ce;
    w->bytes = qb + sb + db;
    const int tb = 256;
    repack_tq<<<(unsigned)((nblk + tb - 1) / tb), tb, 0, st>>>(type, (const uint8_t *)tmp, (uint8_t *)w->q,
                                                               (uint8_t *)w->s, (uint8_t *)w->d, nblk,
                                                               qtype_get(type)->type_size, w->k / 32);
    return cudaGetLastError();
}

extern "C" int cuda_mmv_tq_supported(uint32_t type, int64_t k) {
    if (!tq_type(type)) return 0;
    return k % (type == QT_Q2_K || type == QT_Q3_K || type == QT_Q5_K || type == QT_IQ4_XS ? TQ_QK : 32) == 0;
}

template <int N, int GLU>
static cudaError_t tq_launch(uint32_t type, dim3 grid, dim3 block, struct cuda_ctx *ctx, const struct mmv_mats &m,
                             const int8_t *xq, const float2 *xd, int k, int acc) {
    switch (type) {
    case QT_Q4_0: return klaunch(mmv_tq<tq_legacy<0, 0>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_Q4_1: return klaunch(mmv_tq<tq_legacy<0, 1>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_Q5_0: return klaunch(mmv_tq<tq_legacy<1, 0>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_Q5_1: return klaunch(mmv_tq<tq_legacy<1, 1>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_IQ4_NL: return klaunch(mmv_tq<tq_iq4x<0>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_IQ4_XS: return klaunch(mmv_tq<tq_iq4x<1>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_MXFP4: return klaunch(mmv_tq<tq_iq4x<2>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_Q5_K: return klaunch(mmv_tq<tq_q5_k, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_Q2_K: return klaunch(mmv_tq<tq_q23_k<0>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    case QT_Q3_K: return klaunch(mmv_tq<tq_q23_k<1>, N, MMV_R, GLU>, grid, block, 0, ctx, m, xq, xd, k, acc);
    }
    return cudaErrorInvalidValue;
}

template <int GLU>
static cudaError_t tq_launch_n(int n, uint32_t type, dim3 grid, dim3 block, struct cuda_ctx *ctx,
                               const struct mmv_mats &m, const int8_t *xq, const float2 *xd, int k,
                               int acc) {
    switch (n) {
    case 1: return tq_launch<1, GLU>(type, grid, block, ctx, m, xq, xd, k, acc);
    case 2: return tq_launch<2, GLU>(type, grid, block, ctx, m, xq, xd, k, acc);
    case 3: return tq_launch<3, GLU>(type, grid, block, ctx, m, xq, xd, k, acc);
    case 4: return tq_launch<4, GLU>(type, grid, block, ctx, m, xq, xd, k, acc);
    case 5: return tq_launch<5, GLU>(type, grid, block, ctx, m, xq, xd, k, acc);
    case 6: return tq_launch<6, GLU>(type, grid, block, ctx, m, xq, xd, k, acc);
    case 7: return tq_launch<7, GLU>(type, grid, block, ctx, m, xq, xd, k, acc);
    case 8: return tq_launch<8, GLU>(type, grid, block, ctx, m, xq, xd, k, acc);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t cuda_mmv_tq_launch(int n, int glu, uint32_t type, dim3 grid, dim3 block, struct cuda_ctx *ctx,
                                          const struct mmv_mats &m, const int8_t *xq, const float2 *xd, int k,
                                          int acc) {
    if (glu) return tq_launch_n<1>(n, type, grid, block, ctx, m, xq, xd, k, acc);
    return tq_launch_n<0>(n, type, grid, block, ctx, m, xq, xd, k, acc);
}

/* Benchmarks (cuda_ctx.mmv_id_variant): MXFP4's one-token kernel in the shapes 1..6 of
 * mmv_with_shape (no split-K here). cudaErrorNotSupported: no such variant here (the caller
 * launches the default). */
template <int GLU>
static cudaError_t tq_variant(int v, const struct mmv_mats &m, int rows, struct cuda_ctx *ctx, const int8_t *xq,
                              const float2 *xd, int k, int acc) {
    if (v < 1 || v > 6) return cudaErrorNotSupported;
    return mmv_with_shape(v, [&](auto s) {
        using S = decltype(s);
        if constexpr (S::KS > 1)
            return cudaErrorNotSupported;
        else
            return klaunch(mmv_tq<tq_iq4x<2>, 1, GLU ? 2 : S::R, GLU, S::U>, mmv_grid(m, rows, GLU, S::R, 1),
                           dim3(32, MMV_WARPS), 0, ctx, m, xq, xd, k, acc);
    });
}

extern "C" cudaError_t cuda_mmv_tq_variant(int v, int glu, uint32_t type, int rows, struct cuda_ctx *ctx,
                                           const struct mmv_mats &m, const int8_t *xq, const float2 *xd, int k,
                                           int acc) {
    if (type != QT_MXFP4) return cudaErrorNotSupported;
    if (v == MMV_LANES_SUM && glu && m.epi.post_cnt) { /* variant 1's rows (R2 U1), h quantized in the block */
        return mmv_glu_q_launch(ctx, m, rows, mmv_tq_glu_q<tq_iq4x<2>, 1, 32>, mmv_tq_glu_q<tq_iq4x<2>, 1, 16>, xq, xd,
                                k, acc);
    }
    if (v == MMV_LANES_SUM && !glu && m.cmb.dst) /* the default shape (3: R2 U2), summed in the block */
        return klaunch(mmv_tq_sum<tq_iq4x<2>, 2, 2>, mmv_sum_grid(m, rows), dim3(32, MMV_SUM_WARPS), 0, ctx, m, xq,
                       xd, k);
    return glu ? tq_variant<1>(v, m, rows, ctx, xq, xd, k, acc) : tq_variant<0>(v, m, rows, ctx, xq, xd, k, acc);
}
