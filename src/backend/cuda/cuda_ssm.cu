/* The recurrent-state kernels of the CUDA backend (the Gated DeltaNet layers of qwen35,
 * qwen35moe and qwen3next): the short causal conv1d with its state (bk_ssm_conv) and the
 * gated delta rule (bk_gated_delta_net). CPU twins: cpu_op_ssm_conv and
 * cpu_op_gated_delta_net (src/backend/cpu/cpu_ops_ssm.c); test: tests/unit/test_cuda_ssm.c.
 *
 * Both read their per-sequence rows, slots, fresh flags and snapshot points from the step's
 * state words (backend.h, STATE_*): device data, so a decode step replays as a graph. Grids
 * depend on the step's shape only (token rows, sequences).
 *
 * conv: a block per (tile of channels, sequence); threads own channels, and row lanes
 *   stride over the sequence's rows. A block is the only one touching its channels of its
 *   sequence's slot, so it reads the old state straight from the slot for the rows that
 *   reach back, and overwrites the slot after a __syncthreads.
 *
 * gated delta rule, S (head_v x head_k) per value head:
 *   S_t = e^{g_t} S_{t-1} + u_t k_t^T,  u_t = beta_t (v_t - e^{g_t} S_{t-1} k_t),  o_t = S_t q_t
 *   - gdn_prep (blocks of a token row, a warp a vector): q and k of every key head L2-normalized (q also
 *     scaled by 1/sqrt(head_k)), and e^g and beta of every value head, into scratch;
 *   - gdn_scan: a block per (value head, tile of state rows, sequence). Each state row is
 *     held by GDN_P threads in registers (row i of S: the dot products with k and q are
 *     row-local, two shuffles each), for the whole of the sequence's rows: the state is read
 *     from its slot once and written back once per step, whatever the row count. Decode (one
 *     row) and prefill run the same kernel.
 *   Prefill runs the recurrence token by token, not the CPU's chunk-64 WY form: the
 *   sequential part is one short dependency chain per token (q_t and k_t from shared
 *   memory, where the block stages them a round of rows ahead; two dots, each reduced
 *   over the row's GDN_P threads by shuffles), the work per token is 4 head_v head_k FMAs spread over (value
 *   heads x head_v / 32 or / 16) blocks per sequence, and it needs no scratch beyond the
 *   normalized q and k. The chunked form on tensor cores (the issue's aim for long
 *   prompts) would replace gdn_scan for rows > 1; docs/cuda-backend.md ("Recurrent
 *   layers") has the cost. Results differ from the CPU's chunked form only by rounding. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_glu.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_mmv.cuh" /* quant16 */
#include "backend/cuda/cuda_norm.cuh"

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
}

#define GDN_P 8 /* threads per state row (a power of two, at most 32) */
#define GDN_PREP_VECS 4 /* q or k vectors a gdn_prep block normalizes (a warp each) */

/* The sum of v over the GDN_P threads of a state row (lanes differing in their low bits). */
static __device__ __forceinline__ float row_sum(float v) {
#pragma unroll
    for (int o = 1; o < GDN_P; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---------------------------------------------------------------- kernels ---- */

/* Input row i of the sequence for channel c (i < 0 reaches back into the old conv state,
 * zeros when fresh). */
static __device__ __forceinline__ float conv_in(const float *x, const float *st, bool fresh, int64_t r0,
                                                int64_t i, int64_t c, int64_t C, int d) {
    if (i >= 0) return x[(r0 + i) * C + c];
    return fresh ? 0.0f : st[(d - 1 + i) * C + c];
}

static __device__ __forceinline__ float conv_silu(float acc) { return acc / (1.0f + expf(-acc)); }

/* grid (channel tiles, sequences), block (channels, row lanes). */
static __global__ void ssm_conv_kernel(float *dst, const float *x, const float *__restrict__ w, float *cs,
                                       const int32_t *seqs, int64_t C, int d, int silu) {
    pdl_wait();
    pdl_trigger();
    const int32_t *q = seqs + (int64_t)blockIdx.y * STATE_SEQ_WORDS;
    const int n = q[STATE_NROWS];
    if (n <= 0) return; /* the whole block */
    const int64_t r0 = q[STATE_ROW0], c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool fresh = q[STATE_FRESH] != 0, live = c < C;
    const int at = q[STATE_SNAP_AT];
    const int64_t slot_floats = (int64_t)(d - 1) * C;
    float *st = cs + q[STATE_SLOT] * slot_floats;
    if (live) {
        const float *wc = w + c * d;
        for (int t = threadIdx.y; t < n; t += blockDim.y) {
            float acc = 0.0f;
            for (int j = 0; j < d; j++) acc += wc[j] * conv_in(x, st, fresh, r0, t - (d - 1) + j, c, C, d);
            dst[(r0 + t) * C + c] = silu ? conv_silu(acc) : acc;
        }
        if (at >= 0) { /* another slot: written while the old state is still readable */
            float *sn = cs + q[STATE_SNAP_SLOT] * slot_floats;
            for (int i = threadIdx.y; i < d - 1; i += blockDim.y)
                sn[i * C + c] = conv_in(x, st, fresh, r0, at - (d - 1) + i, c, C, d);
        }
    }
    /* every read of this block's old state rows is done: row lane 0 writes the new ones,
     * the last d - 1 inputs, in increasing order (with fewer rows than d - 1, row i comes
     * from old row i + n, never one already overwritten) */
    __syncthreads();
    if (!live || threadIdx.y != 0) return;
    for (int i = 0; i < d - 1; i++) st[i * C + c] = conv_in(x, st, fresh, r0, n - (d - 1) + i, c, C, d);
}

static __device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The scale of a q (isq) or k vector of head_k values whose squares sum to ss: the L2 norm's
 * inverse, times 1/sqrt(head_k) for q. */
static __device__ __forceinline__ float qk_inv(float ss, float eps, bool isq, int hk) {
    return isq ? 1.0f / sqrtf(ss + eps) * (1.0f / sqrtf((float)hk)) : 1.0f / sqrtf(ss + eps);
}

/* Value head h of token row t: its log decay g = ssm_a * softplus(a + dt_bias) into *g, and
 * (e^g, beta = sigmoid(b)). */
static __device__ __forceinline__ float2 decay_beta(const float *a, const float *bl, const float *__restrict__ ssm_a,
                                                    const float *__restrict__ dt_bias, int64_t t, int nv, int h,
                                                    float *g) {
    *g = ssm_a[h] * softplus(a[t * nv + h] + dt_bias[h]);
    return make_float2(expf(*g), 1.0f / (1.0f + expf(-bl[t * nv + h])));
}

/* Block (t, y) of grid (token rows, GDN_PREP_VECS-vector groups): qn, kn (head_k, n_k_head,
 * n) the normalized q (times 1/sqrt(head_k)) and k of key heads, a warp per vector (vectors
 * y * GDN_PREP_VECS.. of the row's 2 n_k_head, q heads then k heads); gb (n_v_head, n) the
 * decay e^g and beta of every value head, spread over the row's blocks. Spread so that a
 * decode row is not one block's chain of 2 n_k_head dependent load rounds (H200, ncu: 9.5 us
 * a layer on Qwen3.5-35B-A3B's shape at one row with one block of 4 warps). */
static __global__ void gdn_prep_kernel(float *qn, float *kn, float2 *gb, const float *qkv, const float *a,
                                       const float *bl, const float *__restrict__ ssm_a,
                                       const float *__restrict__ dt_bias, float *graw, int nk, int hk, int nv,
                                       int64_t row_len, float eps) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.x;
    const float *row = qkv + t * row_len; /* q heads, then k heads, then v heads */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int v = blockIdx.y * nw + warp; v < 2 * nk; v += gridDim.y * nw) {
        const float *src = row + (int64_t)v * hk;
        float ss = 0.0f;
        for (int j = lane; j < hk; j += 32) ss += src[j] * src[j];
        ss = warp_sum(ss);
        const bool isq = v < nk;
        const float inv = qk_inv(ss, eps, isq, hk);
        float *d = (isq ? qn : kn) + (t * nk + (isq ? v : v - nk)) * (int64_t)hk;
        for (int j = lane; j < hk; j += 32) d[j] = src[j] * inv;
    }
    for (int h = blockIdx.y * blockDim.x + threadIdx.x; h < nv; h += gridDim.y * blockDim.x) {
        float g;
        gb[t * nv + h] = decay_beta(a, bl, ssm_a, dt_bias, t, nv, h, &g);
        if (graw) graw[t * nv + h] = g; /* the chunked form sums the logs (e^g may underflow) */
    }
}

/* The decode form of conv + gdn_prep (cuda_deltanet_decode: every sequence has one row),
 * one launch: grid (warp groups, sequences), a warp per unit of the sequence's row. Units
 * [0, 2 n_k_head): a q or k head, its hk channels convolved (ssm_conv_kernel's
 * arithmetic, SiLU), their conv state shifted in place (each channel has one owner: no
 * other block reads it), then L2-normalized into qn / kn (gdn_prep_kernel's arithmetic on
 * the same values, so the same bits as the two launches); the next units: 32 * DEC_VPL
 * value channels each, convolved into xc for the scan. The first block's threads also write
 * (e^g, beta) of every value head. */
#define DEC_KPL (CUDA_GDN_MAX_HEAD_K / 32) /* channels a lane holds of a q or k head */
#define DEC_VPL 4                          /* value channels a lane convolves */
/* The conv width D (d_conv) is a template argument so that old[] stays in registers (with a
 * runtime width ptxas put it in a 32-byte stack frame); 4 in every released model. */
#define DEC_MAX_D 4 /* the widest conv it takes */
template <int D>
static __device__ __forceinline__ float dec_conv(const float *x, const float *__restrict__ w, float *st, float *sn,
                                                 bool fresh, int at, int64_t r0, int64_t c, int64_t C) {
    float old[D - 1];
#pragma unroll
    for (int i = 0; i < D - 1; i++) old[i] = fresh ? 0.0f : st[i * C + c];
    const float xv = x[r0 * C + c], *wc = w + c * D;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < D; j++) acc += wc[j] * (j < D - 1 ? old[j] : xv);
    if (at == 0)
#pragma unroll
        for (int i = 0; i < D - 1; i++) sn[i * C + c] = old[i];
#pragma unroll
    for (int i = 0; i < D - 1; i++) {
        const float v = i + 1 < D - 1 ? old[i + 1] : xv;
        st[i * C + c] = v;
        if (at == 1) sn[i * C + c] = v;
    }
    return conv_silu(acc);
}

template <int D>
static __global__ void gdn_dec_prep_kernel(float *qn, float *kn, float2 *gb, float *xc, const float *qkv,
                                           const float *__restrict__ cw, float *cs, const float *a,
                                           const float *bl, const float *__restrict__ ssm_a,
                                           const float *__restrict__ dt_bias, const int32_t *seqs, int nk,
                                           int hk, int nv, int64_t C, float eps) {
    pdl_wait();
    pdl_trigger();
    const int32_t *q = seqs + (int64_t)blockIdx.y * STATE_SEQ_WORDS;
    if (q[STATE_NROWS] <= 0) return; /* the whole block */
    const int64_t t = q[STATE_ROW0];
    const bool fresh = q[STATE_FRESH] != 0;
    const int at = q[STATE_SNAP_AT];
    const int64_t slot_floats = (int64_t)(D - 1) * C;
    float *st = cs + q[STATE_SLOT] * slot_floats, *sn = at >= 0 ? cs + q[STATE_SNAP_SLOT] * slot_floats : NULL;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int u = blockIdx.x * (blockDim.x >> 5) + warp;
    if (u < 2 * nk) {
        float v[DEC_KPL];
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < DEC_KPL; e++) {
            const int j = lane + 32 * e;
            v[e] = j < hk ? dec_conv<D>(qkv, cw, st, sn, fresh, at, t, (int64_t)u * hk + j, C) : 0.0f;
            if (j < hk) ss += v[e] * v[e];
        }
        ss = warp_sum(ss);
        const bool isq = u < nk;
        const float inv = qk_inv(ss, eps, isq, hk);
        float *dd = (isq ? qn : kn) + (t * nk + (isq ? u : u - nk)) * (int64_t)hk;
#pragma unroll
        for (int e = 0; e < DEC_KPL; e++)
            if (lane + 32 * e < hk) dd[lane + 32 * e] = v[e] * inv;
    } else {
        const int64_t c0 = 2 * (int64_t)nk * hk + (int64_t)(u - 2 * nk) * 32 * DEC_VPL;
#pragma unroll
        for (int e = 0; e < DEC_VPL; e++) {
            const int64_t c = c0 + lane + 32 * e;
            if (c < C) xc[t * C + c] = dec_conv<D>(qkv, cw, st, sn, fresh, at, t, c, C);
        }
    }
    if (blockIdx.x == 0)
        for (int h = threadIdx.x; h < nv; h += blockDim.x) {
            float g;
            gb[t * nv + h] = decay_beta(a, bl, ssm_a, dt_bias, t, nv, h, &g);
        }
}

/* Columns of a state row: thread p of the row's GDN_P holds the float4 groups c * GDN_P + p,
 * c < KPT / 4, so the row's threads read 16 * GDN_P contiguous bytes per group. */
template <int KPT>
static __device__ __forceinline__ void row_load(float (&r)[KPT], const float *src, int p, int hk, bool ok) {
#pragma unroll
    for (int c = 0; c < KPT / 4; c++) {
        const int j = (c * GDN_P + p) * 4;
        const float4 v = ok && j < hk ? *(const float4 *)(src + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        r[4 * c] = v.x, r[4 * c + 1] = v.y, r[4 * c + 2] = v.z, r[4 * c + 3] = v.w;
    }
}

template <int KPT>
static __device__ __forceinline__ void row_store(float *dst, const float (&r)[KPT], int p, int hk, bool ok) {
#pragma unroll
    for (int c = 0; c < KPT / 4; c++) {
        const int j = (c * GDN_P + p) * 4;
        if (ok && j < hk) *(float4 *)(dst + j) = make_float4(r[4 * c], r[4 * c + 1], r[4 * c + 2], r[4 * c + 3]);
    }
}

/* Token rows staged in shared memory per round of the scan (below): 16 up to 128 columns,
 * fewer past that, so that two rounds of k and q fit in 32 KB. */
template <int KPT> struct gdn_stage {
    static constexpr int HK = KPT * GDN_P, T = HK <= 128 ? 16 : 2048 / HK, RB = 32;
};

/* The scan's inputs for token rows [t0, t0 + cnt) of one (value head, row tile): k and q of
 * the key head, (e^g, beta) and the tile's v entries, copied into shared memory by cp.async
 * (one commit group). Rows of the tile past head_v get v = 0. */
template <int KPT>
static __device__ __forceinline__ void gdn_stage_rows(float (*sk)[gdn_stage<KPT>::HK], float (*sq)[gdn_stage<KPT>::HK],
                                                      float2 *sg, float (*sv)[gdn_stage<KPT>::RB], const float *qn,
                                                      const float *kn, const float2 *gb, const float *qkv,
                                                      int64_t r0, int cnt, int nk, int kh, int hk, int nv, int h,
                                                      int hv, int i0, int rb, int64_t row_len, int64_t v_off) {
    const int tid = threadIdx.x, nt = blockDim.x, per = hk / 4; /* float4 pieces of a k or q row */
    for (int idx = tid; idx < 2 * cnt * per; idx += nt) {
        const int which = idx / (cnt * per), rem = idx % (cnt * per), tt = rem / per, j = (rem % per) * 4;
        const int64_t src = ((r0 + tt) * nk + kh) * hk + j;
        cp_async16(which ? &sq[tt][j] : &sk[tt][j], (which ? qn : kn) + src);
    }
    for (int idx = tid; idx < cnt * rb; idx += nt) {
        const int tt = idx / rb, ii = idx % rb;
        if (i0 + ii < hv) cp_async4(&sv[tt][ii], qkv + (r0 + tt) * row_len + v_off + ii);
        else sv[tt][ii] = 0.0f;
    }
    for (int idx = tid; idx < 2 * cnt; idx += nt) {
        const int tt = idx >> 1;
        cp_async4((float *)&sg[tt] + (idx & 1), (const float *)&gb[(r0 + tt) * nv + h] + (idx & 1));
    }
    cp_commit();
}

/* The scan's optional epilogue, the gated RMSNorm of each head's outputs (bk_norm_gate
 * with SiLU: z = silu(z) * rms_norm(o) * w per value head, and z's int8 form), for decode
 * (one row a sequence): the last of a head's tile blocks to finish (a counter per
 * (sequence, value head), zero between launches, reset by that block) reads the head's
 * outputs from L2 and runs norm_gate_kernel's arithmetic on rms_threads(head_v) threads. */
struct gdn_ng {
    float *z;            /* NULL: no epilogue */
    const float *w;      /* (head_v) */
    int8_t *xq;          /* z's int8 form (quant16), or NULL */
    float2 *xd;
    unsigned *cnt;       /* (n_v_head, n_seqs) */
    float eps;
};

/* grid (value heads x row tiles, sequences), block blockDim.x = rows per tile x GDN_P (at
 * most 32 rows). Thread (row i of the tile, part p) holds columns of S[i, :] in registers
 * across the sequence's rows; rows past head_v compute on zeros (their lanes take part in
 * the shuffles) and write nothing. The token rows' inputs come through shared memory in
 * rounds of gdn_stage::T, the next round's copies in flight while this one computes: the
 * chain from one token to the next is then shared-memory reads, two dots and their
 * shuffle reductions, not a global load (a prompt of 512 rows took ~1.8 us a token with the loads in
 * the chain, docs/cuda-backend.md). Each dot sums four interleaved partial sums (a chain
 * of KPT / 4 FMAs). */
template <int KPT>
static __global__ void gdn_scan_kernel(float *dst, const float *qn, const float *kn, const float2 *gb,
                                       const float *qkv, float *ss, const int32_t *seqs, int nk, int hk, int nv,
                                       int hv, int64_t row_len, int grouped, const gdn_ng ng) {
    using S = gdn_stage<KPT>;
    __shared__ __align__(16) float sk[2][S::T][S::HK];
    __shared__ __align__(16) float sq[2][S::T][S::HK];
    __shared__ __align__(16) float sv[2][S::T][S::RB];
    __shared__ __align__(16) float2 sg[2][S::T];
    pdl_wait();
    pdl_trigger();
    const int rb = blockDim.x / GDN_P, tiles = (hv + rb - 1) / rb;
    const int h = blockIdx.x / tiles, p = threadIdx.x % GDN_P, ii = threadIdx.x / GDN_P;
    const int i0 = (blockIdx.x % tiles) * rb, i = i0 + ii; /* the state row */
    const int32_t *q = seqs + (int64_t)blockIdx.y * STATE_SEQ_WORDS;
    const int n = q[STATE_NROWS];
    if (n <= 0) return; /* the whole block */
    const int64_t r0 = q[STATE_ROW0];
    const int at = q[STATE_SNAP_AT];
    const bool ok = i < hv;
    const int kh = grouped ? h / (nv / nk) : h % nk;
    const int64_t hd = (int64_t)hv * hk, slot_floats = (int64_t)nv * hd, off = h * hd + (int64_t)i * hk;
    const int64_t v_off = 2 * (int64_t)nk * hk + (int64_t)h * hv + i0;
    float *srow = ss + q[STATE_SLOT] * slot_floats + off;
    const int rounds = (n + S::T - 1) / S::T;
    gdn_stage_rows<KPT>(sk[0], sq[0], sg[0], sv[0], qn, kn, gb, qkv, r0, min(S::T, n), nk, kh, hk, nv, h, hv, i0,
                        rb, row_len, v_off);
    float s[KPT];
    row_load(s, srow, p, hk, ok && !q[STATE_FRESH]);
    for (int c = 0; c < rounds; c++) {
        const int b = c & 1, t0 = c * S::T, cnt = min(S::T, n - t0);
        if (c + 1 < rounds) { /* the buffer consumed in round c - 1 (the barrier at its end) */
            gdn_stage_rows<KPT>(sk[b ^ 1], sq[b ^ 1], sg[b ^ 1], sv[b ^ 1], qn, kn, gb, qkv, r0 + t0 + S::T,
                                min(S::T, n - t0 - S::T), nk, kh, hk, nv, h, hv, i0, rb, row_len, v_off);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        for (int tt = 0; tt < cnt; tt++) {
            const int t = t0 + tt;
            if (t == at) row_store(ss + q[STATE_SNAP_SLOT] * slot_floats + off, s, p, hk, ok);
            float kk[KPT], qq[KPT];
            row_load(kk, sk[b][tt], p, hk, true);
            row_load(qq, sq[b][tt], p, hk, true);
            const float2 g = sg[b][tt]; /* (decay, beta) */
            const float v = sv[b][tt][ii];
            float a4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int e = 0; e < KPT; e++) a4[e & 3] += s[e] * kk[e];
            const float sk_ = row_sum((a4[0] + a4[1]) + (a4[2] + a4[3]));
            const float u = g.y * (v - g.x * sk_);
            float o4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int e = 0; e < KPT; e++) {
                s[e] = g.x * s[e] + u * kk[e];
                o4[e & 3] += s[e] * qq[e];
            }
            const float o = row_sum((o4[0] + o4[1]) + (o4[2] + o4[3]));
            if (ok && p == 0) dst[((r0 + t) * nv + h) * hv + i] = o;
        }
        __syncthreads(); /* round c's buffer is free for round c + 2's copies */
    }
    if (at == n) row_store(ss + q[STATE_SNAP_SLOT] * slot_floats + off, s, p, hk, ok);
    row_store(srow, s, p, hk, ok);
    if (!ng.z) return;
    __threadfence(); /* this block's outputs, before its count */
    __syncthreads();
    __shared__ unsigned last;
    unsigned *cnt = ng.cnt + (int64_t)blockIdx.y * nv + h;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (unsigned)tiles - 1;
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) *cnt = 0;
    __threadfence();
    norm_gate_group<true>(ng.z, dst, ng.w, ng.z, GLU_SILU, (r0 * nv + h) * (int64_t)hv, hv, ng.eps, ng.xq, ng.xd,
                          rms_threads(hv));
}

/* ---- the chunkwise (WY) form, chunks of CUDA_GDN_CHUNK rows (the CPU's gdn_chunk) ----
 * Per value head, with gam_t the cumulative log decay inside the chunk and S0 its incoming
 * state:
 *   (I + A) W = diag(beta) V,  (I + A) Kc = diag(beta e^{gam}) K,
 *     A[s][r] = beta_s e^{gam_s - gam_r} k_s.k_r  (r < s; forward substitution)
 *   u_s = w_s - S0 kc_s
 *   o_t = e^{gam_t} S0 q_t + sum_{s<=t} e^{gam_t - gam_s} (q_t.k_s) u_s
 *   S_C = e^{gam_C} S0 + sum_s e^{gam_C - gam_s} u_s k_s^T
 * gdn_wy (a block per (chunk, value head, sequence), all chunks at once): gam, A, the
 * output weights P[t][s] = e^{gam_t - gam_s} q_t.k_s (s <= t), and W, Kc by forward
 * substitution, a thread per column. gdn_chunk_scan (the scan's grid and register state):
 * for each chunk of the sequence in order, u and the state part of o (dots with S0 of
 * independent rows: no chain from token to token), then S_C, then the intra-chunk part of
 * o from u in shared memory. A snapshot point splits the chunks there (as on the CPU). */

/* Chunk c of a sequence's rows: [0, cut) then [cut, n) in chunks of CUDA_GDN_CHUNK, cut the
 * snapshot point (n without one). False past the last. */
static __device__ __forceinline__ bool chunk_of(const int32_t *q, int c, int *t0, int *len) {
    const int n = q[STATE_NROWS], at = q[STATE_SNAP_AT];
    const int cut = at >= 0 && at <= n ? at : n, c1 = (cut + CUDA_GDN_CHUNK - 1) / CUDA_GDN_CHUNK;
    if (c < c1) {
        *t0 = c * CUDA_GDN_CHUNK;
        *len = min(CUDA_GDN_CHUNK, cut - *t0);
        return true;
    }
    *t0 = cut + (c - c1) * CUDA_GDN_CHUNK;
    *len = min(CUDA_GDN_CHUNK, n - *t0);
    return *t0 < n;
}

/* grid (chunks, value heads, sequences), block 128. Per token row r and value head h:
 * gam[r nv + h]; W (hv), Kc (hk) and P (CUDA_GDN_CHUNK: row t's weights of the chunk's rows
 * s <= t) at row (r nv + h). */
static __global__ void __launch_bounds__(128) gdn_wy_kernel(float *W, float *Kc, float *P, float *gam_out,
                                                            const float *qn, const float *kn, const float2 *gb,
                                                            const float *graw, const float *qkv, const int32_t *seqs,
                                                            int nk, int hk, int nv, int hv, int64_t row_len,
                                                            int grouped) {
    pdl_wait();
    pdl_trigger();
    __shared__ float A[CUDA_GDN_CHUNK][CUDA_GDN_CHUNK + 1];
    __shared__ float gam[CUDA_GDN_CHUNK], beta[CUDA_GDN_CHUNK];
    const int32_t *q = seqs + (int64_t)blockIdx.z * STATE_SEQ_WORDS;
    if (q[STATE_NROWS] <= 0) return;
    int t0, len;
    if (!chunk_of(q, blockIdx.x, &t0, &len)) return; /* the whole block */
    const int h = blockIdx.y, kh = grouped ? h / (nv / nk) : h % nk;
    const int64_t r0 = q[STATE_ROW0] + t0;
    if (threadIdx.x == 0) {
        float c = 0.0f;
        for (int t = 0; t < len; t++) {
            c += graw[(r0 + t) * nv + h];
            gam[t] = c;
            beta[t] = gb[(r0 + t) * nv + h].y;
        }
    }
    __syncthreads();
    if (threadIdx.x < len) gam_out[(r0 + threadIdx.x) * nv + h] = gam[threadIdx.x];
    for (int idx = threadIdx.x; idx < len * len; idx += blockDim.x) {
        const int s = idx / len, r = idx % len;
        if (r > s) continue;
        const float *ks = kn + ((r0 + s) * nk + kh) * hk, *kr = kn + ((r0 + r) * nk + kh) * hk,
                    *qs = qn + ((r0 + s) * nk + kh) * hk;
        float dk = 0.0f, dq = 0.0f;
        for (int j = 0; j < hk; j++) {
            dk += ks[j] * kr[j];
            dq += qs[j] * kr[j];
        }
        const float e = expf(gam[s] - gam[r]);
        if (r < s) A[s][r] = beta[s] * e * dk;
        P[((r0 + s) * nv + h) * CUDA_GDN_CHUNK + r] = e * dq;
    }
    __syncthreads();
    const int64_t v_off = 2 * (int64_t)nk * hk + (int64_t)h * hv;
    for (int j = threadIdx.x; j < hv + hk; j += blockDim.x) { /* column j of [W | Kc]: this thread's own */
        const bool isv = j < hv;
        const int jj = isv ? j : j - hv, w = isv ? hv : hk;
        float *X = isv ? W : Kc;
        for (int s = 0; s < len; s++) {
            const int64_t r = r0 + s;
            float val = isv ? beta[s] * qkv[r * row_len + v_off + jj]
                            : beta[s] * expf(gam[s]) * kn[(r * nk + kh) * hk + jj];
            for (int p = 0; p < s; p++) val -= A[s][p] * X[((r0 + p) * nv + h) * w + jj];
            X[(r * nv + h) * w + jj] = val;
        }
    }
}

/* grid (value heads x row tiles, sequences), block rows per tile (<= 32) x GDN_P: the
 * scan's layout (state row i of the tile in the registers of GDN_P threads). */
template <int KPT>
static __global__ void gdn_chunk_scan_kernel(float *dst, const float *qn, const float *kn, const float *W,
                                             const float *Kc, const float *P, const float *gam, float *ss,
                                             const int32_t *seqs, int nk, int hk, int nv, int hv, int grouped) {
    pdl_wait();
    pdl_trigger();
    __shared__ float U[CUDA_GDN_CHUNK][32], O[CUDA_GDN_CHUNK][32];
    const int rb = blockDim.x / GDN_P, tiles = (hv + rb - 1) / rb;
    const int h = blockIdx.x / tiles, p = threadIdx.x % GDN_P, ri = threadIdx.x / GDN_P;
    const int i = (blockIdx.x % tiles) * rb + ri; /* the state row */
    const int32_t *q = seqs + (int64_t)blockIdx.y * STATE_SEQ_WORDS;
    const int n = q[STATE_NROWS];
    if (n <= 0) return; /* the whole block */
    const int64_t r0 = q[STATE_ROW0];
    const int at = q[STATE_SNAP_AT];
    const bool ok = i < hv;
    const int kh = grouped ? h / (nv / nk) : h % nk;
    const int64_t hd = (int64_t)hv * hk, slot_floats = (int64_t)nv * hd, off = h * hd + (int64_t)i * hk;
    float *srow = ss + q[STATE_SLOT] * slot_floats + off;
    float s[KPT];
    row_load(s, srow, p, hk, ok && !q[STATE_FRESH]);
    int t0, len;
    for (int c = 0; chunk_of(q, c, &t0, &len); c++) {
        if (t0 == at) row_store(ss + q[STATE_SNAP_SLOT] * slot_floats + off, s, p, hk, ok);
        const int64_t rc = r0 + t0;
        /* u_t = w_t - S0 kc_t and e^{gam_t} S0 q_t: independent rows */
        for (int t = 0; t < len; t++) {
            const int64_t r = rc + t;
            float kk[KPT], qq[KPT];
            row_load(kk, Kc + (r * nv + h) * hk, p, hk, true);
            row_load(qq, qn + (r * nk + kh) * hk, p, hk, true);
            float sk = 0.0f, sq = 0.0f;
#pragma unroll
            for (int e = 0; e < KPT; e++) {
                sk += s[e] * kk[e];
                sq += s[e] * qq[e];
            }
            sk = row_sum(sk);
            sq = row_sum(sq);
            if (p == 0) {
                U[t][ri] = ok ? W[(r * nv + h) * hv + i] - sk : 0.0f;
                O[t][ri] = expf(gam[r * nv + h]) * sq;
            }
        }
        __syncthreads();
        /* S_C = e^{gam_C} S0 + sum_t e^{gam_C - gam_t} u_t k_t^T */
        const float gl = gam[(rc + len - 1) * nv + h], el = expf(gl);
#pragma unroll
        for (int e = 0; e < KPT; e++) s[e] *= el;
        for (int t = 0; t < len; t++) {
            const int64_t r = rc + t;
            float kk[KPT];
            row_load(kk, kn + (r * nk + kh) * hk, p, hk, true);
            const float f = expf(gl - gam[r * nv + h]) * U[t][ri];
#pragma unroll
            for (int e = 0; e < KPT; e++) s[e] += f * kk[e];
        }
        /* o_t += sum_{s<=t} P[t][s] u_s: the row's GDN_P threads take every GDN_P-th t */
        for (int t = p; t < len; t += GDN_P) {
            const int64_t r = rc + t;
            const float *pr = P + (r * nv + h) * CUDA_GDN_CHUNK;
            float o = O[t][ri];
            for (int u = 0; u <= t; u++) o += pr[u] * U[u][ri];
            if (ok) dst[(r * nv + h) * hv + i] = o;
        }
        __syncthreads(); /* U and O are the next chunk's */
    }
    if (at == n) row_store(ss + q[STATE_SNAP_SLOT] * slot_floats + off, s, p, hk, ok);
    row_store(srow, s, p, hk, ok);
}

/* --------------------------------------------------------------- launchers ---- */

extern "C" void cuda_ssm_conv(struct cuda_ctx *ctx, float *dst, const float *x, const float *w, float *cs,
                              const int32_t *seqs, int64_t channels, int d_conv, int64_t n_tokens, int n_seqs,
                              int silu) {
    /* decode (a row per sequence): wide channel tiles; prefill: 8 row lanes */
    const int lanes = n_tokens > n_seqs ? 8 : 1, ct = 256 / lanes;
    klaunch(ssm_conv_kernel, dim3(nblocks(channels, ct), (unsigned)n_seqs), dim3(ct, lanes), 0, ctx, dst, x, w, cs,
            seqs, channels, d_conv, silu);
}

#define GDN_ALIGN 64 /* floats */
static float *galign(float *p) {
    return (float *)(((uintptr_t)p + GDN_ALIGN * sizeof(float) - 1) & ~(uintptr_t)(GDN_ALIGN * sizeof(float) - 1));
}

/* qn, kn (head_k, n_k_head, n), gb (float2: n_v_head, n); chunked: also graw and gam
 * (n_v_head, n), W (head_v, n_v_head, n), Kc (head_k, n_v_head, n), P (CUDA_GDN_CHUNK,
 * n_v_head, n). */
extern "C" uint64_t cuda_gdn_scratch_bytes(int64_t n_tokens, int n_k_head, int head_k, int n_v_head, int head_v,
                                           int chunked) {
    uint64_t per = 2 * (uint64_t)n_k_head * head_k + 2 * (uint64_t)n_v_head;
    if (!chunked) return (uint64_t)n_tokens * per * sizeof(float);
    per += (uint64_t)n_v_head * (2 + (uint64_t)head_v + (uint64_t)head_k + CUDA_GDN_CHUNK);
    return ((uint64_t)n_tokens * per + 5 * GDN_ALIGN) * sizeof(float); /* each region aligned */
}

extern "C" int cuda_gdn_supported(int head_k) { return head_k > 0 && head_k % 4 == 0 && head_k <= CUDA_GDN_MAX_HEAD_K; }

/* The launch whose threads hold KPT columns of a state row: the fewest of 4, 8, 16 and
 * CUDA_GDN_MAX_HEAD_K / GDN_P that cover head_k (at 8 threads a row: 32, 64, 128, 256 columns). */
static_assert(CUDA_GDN_MAX_HEAD_K / GDN_P >= 32, "the last launch covers what the others do not");
#define GDN_KPT_DISPATCH(hk, launch, ...)                                                            \
    do {                                                                                             \
        if ((hk) <= 4 * GDN_P) launch<4>(__VA_ARGS__);                                               \
        else if ((hk) <= 8 * GDN_P) launch<8>(__VA_ARGS__);                                          \
        else if ((hk) <= 16 * GDN_P) launch<16>(__VA_ARGS__);                                        \
        else launch<CUDA_GDN_MAX_HEAD_K / GDN_P>(__VA_ARGS__);                                       \
    } while (0)

template <int KPT>
static void scan_launch(struct cuda_ctx *ctx, const struct cuda_gdn_args *a, const float *qn, const float *kn,
                        const float2 *gb, const float *v, int rb, gdn_ng ng) {
    const int tiles = (a->head_v + rb - 1) / rb;
    klaunch(gdn_scan_kernel<KPT>, dim3((unsigned)(a->n_v_head * tiles), (unsigned)a->n_seqs), dim3(rb * GDN_P), 0,
            ctx, a->dst, qn, kn, gb, v, a->ss, a->seqs, a->n_k_head, a->head_k, a->n_v_head, a->head_v,
            (int64_t)(2 * a->n_k_head * a->head_k + a->n_v_head * a->head_v), a->grouped, ng);
}

template <int KPT>
static void chunk_scan_launch(struct cuda_ctx *ctx, const struct cuda_gdn_args *a, const float *qn, const float *kn,
                              const float *W, const float *Kc, const float *P, const float *gam, int rb) {
    const int tiles = (a->head_v + rb - 1) / rb;
    klaunch(gdn_chunk_scan_kernel<KPT>, dim3((unsigned)(a->n_v_head * tiles), (unsigned)a->n_seqs),
            dim3(rb * GDN_P), 0, ctx, a->dst, qn, kn, W, Kc, P, gam, a->ss, a->seqs, a->n_k_head, a->head_k,
            a->n_v_head, a->head_v, a->grouped);
}

/* State rows a scan block holds: 32; 16 when that leaves fewer blocks than two per SM. */
static int scan_rows(const struct cuda_ctx *ctx, const struct cuda_gdn_args *a) {
    const int sms = ctx->n_sm > 0 ? ctx->n_sm : 132;
    return (int64_t)a->n_v_head * ((a->head_v + 31) / 32) * a->n_seqs < 2 * sms ? 16 : 32;
}

extern "C" void cuda_gated_delta_net(struct cuda_ctx *ctx, const struct cuda_gdn_args *a) {
    const int nk = a->n_k_head, hk = a->head_k, nv = a->n_v_head, hv = a->head_v;
    const int64_t n = a->n_tokens;
    float *qn = (float *)a->scratch, *kn = qn + n * nk * hk;
    float2 *gb = (float2 *)(kn + n * nk * hk);
    /* chunked only, past the scan's scratch: regions of GDN_ALIGN floats (Kc rows are read
     * as float4) */
    float *graw = galign((float *)(gb + n * nv)), *gam = galign(graw + n * nv), *W = galign(gam + n * nv),
          *Kc = galign(W + n * nv * hv), *P = galign(Kc + n * nv * hk);
    const int64_t row_len = 2 * (int64_t)nk * hk + (int64_t)nv * hv;
    klaunch(gdn_prep_kernel, dim3((unsigned)n, (unsigned)((2 * nk + GDN_PREP_VECS - 1) / GDN_PREP_VECS)),
            dim3(32 * GDN_PREP_VECS), 0, ctx, qn, kn, gb, a->qkv, a->a, a->bl, a->ssm_a,
            a->dt_bias, a->chunked ? graw : NULL, nk, hk, nv, row_len, a->eps);
    const int rb = scan_rows(ctx, a);
    if (a->chunked) {
        /* a sequence has at most n rows, split once more by its snapshot point */
        const unsigned chunks = (unsigned)((n + CUDA_GDN_CHUNK - 1) / CUDA_GDN_CHUNK + 1);
        klaunch(gdn_wy_kernel, dim3(chunks, (unsigned)nv, (unsigned)a->n_seqs), dim3(128), 0, ctx, W, Kc, P, gam,
                (const float *)qn, (const float *)kn, (const float2 *)gb, (const float *)graw, a->qkv, a->seqs, nk,
                hk, nv, hv, row_len, a->grouped);
        GDN_KPT_DISPATCH(hk, chunk_scan_launch, ctx, a, qn, kn, W, Kc, P, gam, rb);
        return;
    }
    GDN_KPT_DISPATCH(hk, scan_launch, ctx, a, qn, kn, gb, a->qkv, rb, gdn_ng{});
}

extern "C" int cuda_deltanet_decode_ok(int head_k, int head_v, int d_conv) {
    /* the epilogue's rms_threads(head_v) within the smallest scan block (16 rows x GDN_P),
     * whole 32-groups for the int8 form */
    return cuda_gdn_supported(head_k) && head_v % 32 == 0 && rms_threads(head_v) <= 16 * GDN_P && d_conv >= 2 &&
           d_conv <= DEC_MAX_D;
}

extern "C" uint64_t cuda_deltanet_scratch_bytes(int64_t n_tokens, int n_k_head, int head_k, int n_v_head,
                                                int head_v) {
    return cuda_gdn_scratch_bytes(n_tokens, n_k_head, head_k, n_v_head, head_v, 0) +
           ((uint64_t)n_tokens * (2 * (uint64_t)n_k_head * head_k + (uint64_t)n_v_head * head_v) + GDN_ALIGN) *
               sizeof(float);
}

extern "C" void cuda_deltanet_decode(struct cuda_ctx *ctx, const struct cuda_deltanet_args *d) {
    const struct cuda_gdn_args *a = &d->g;
    const int nk = a->n_k_head, hk = a->head_k, nv = a->n_v_head, hv = a->head_v;
    const int64_t n = a->n_tokens, C = 2 * (int64_t)nk * hk + (int64_t)nv * hv;
    float *qn = (float *)a->scratch, *kn = qn + n * nk * hk;
    float2 *gb = (float2 *)(kn + n * nk * hk);
    float *xc = galign((float *)(gb + n * nv)); /* the value channels after the conv (C wide rows) */
    const int units = 2 * nk + (int)((nv * (int64_t)hv + 32 * DEC_VPL - 1) / (32 * DEC_VPL)), wpb = 4;
    const dim3 grid((unsigned)((units + wpb - 1) / wpb), (unsigned)a->n_seqs), block(32 * wpb);
#define DEC_PREP(D)                                                                                                  \
    klaunch(gdn_dec_prep_kernel<D>, grid, block, 0, ctx, qn, kn, gb, xc, a->qkv, d->conv_w, d->cs, a->a, a->bl,      \
            a->ssm_a, a->dt_bias, a->seqs, nk, hk, nv, C, a->eps)
    switch (d->d_conv) { /* cuda_deltanet_decode_ok: 2 <= d_conv <= DEC_MAX_D */
    case 2: DEC_PREP(2); break;
    case 3: DEC_PREP(3); break;
    default: DEC_PREP(4); break;
    }
#undef DEC_PREP
    const gdn_ng ng = {d->z, d->norm_w, d->xq, (float2 *)d->xd, d->cnt, d->norm_eps};
    GDN_KPT_DISPATCH(hk, scan_launch, ctx, a, qn, kn, gb, xc, scan_rows(ctx, a), ng);
}
