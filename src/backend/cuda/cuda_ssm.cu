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
 *   - gdn_prep (a block per token row): q and k of every key head L2-normalized (q also
 *     scaled by 1/sqrt(head_k)), and e^g and beta of every value head, into scratch;
 *   - gdn_scan: a block per (value head, tile of state rows, sequence). Each state row is
 *     held by GDN_P threads in registers (row i of S: the dot products with k and q are
 *     row-local, two shuffles each), for the whole of the sequence's rows: the state is read
 *     from its slot once and written back once per step, whatever the row count. Decode (one
 *     row) and prefill run the same kernel.
 *   Prefill runs the recurrence token by token, not the CPU's chunk-64 WY form: the
 *   sequential part costs about one short dependency chain per token (loads of q_t, k_t,
 *   two 2-step shuffle reductions), the work per token is 4 head_v head_k FMAs spread over
 *   (value heads x head_v / 32) blocks per sequence, and it needs no scratch beyond the
 *   normalized q and k. The chunked form on tensor cores (the issue's aim for long
 *   prompts) would replace gdn_scan for rows > 1; docs/cuda-backend.md ("Recurrent
 *   layers") has the cost. Results differ from the CPU's chunked form only by rounding. */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"
}

#define GDN_P 4 /* threads per state row */

/* ---------------------------------------------------------------- kernels ---- */

/* Input row i of the sequence for channel c (i < 0 reaches back into the old conv state,
 * zeros when fresh). */
static __device__ __forceinline__ float conv_in(const float *x, const float *st, bool fresh, int64_t r0,
                                                int64_t i, int64_t c, int64_t C, int d) {
    if (i >= 0) return x[(r0 + i) * C + c];
    return fresh ? 0.0f : st[(d - 1 + i) * C + c];
}

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
            dst[(r0 + t) * C + c] = silu ? acc / (1.0f + expf(-acc)) : acc;
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

/* A block per token row t: qn, kn (head_k, n_k_head, n) the normalized q (times
 * 1/sqrt(head_k)) and k of every key head, a warp per vector; gb (n_v_head, n) the decay
 * e^g and beta of every value head. */
static __global__ void gdn_prep_kernel(float *qn, float *kn, float2 *gb, const float *qkv, const float *a,
                                       const float *bl, const float *__restrict__ ssm_a,
                                       const float *__restrict__ dt_bias, int nk, int hk, int nv, int64_t row_len,
                                       float eps) {
    pdl_wait();
    pdl_trigger();
    const int64_t t = blockIdx.x;
    const float *row = qkv + t * row_len; /* q heads, then k heads, then v heads */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const float qscale = 1.0f / sqrtf((float)hk);
    for (int v = warp; v < 2 * nk; v += nw) {
        const float *src = row + (int64_t)v * hk;
        float ss = 0.0f;
        for (int j = lane; j < hk; j += 32) ss += src[j] * src[j];
        ss = warp_sum(ss);
        const bool isq = v < nk;
        const float inv = isq ? 1.0f / sqrtf(ss + eps) * qscale : 1.0f / sqrtf(ss + eps);
        float *d = (isq ? qn : kn) + (t * nk + (isq ? v : v - nk)) * (int64_t)hk;
        for (int j = lane; j < hk; j += 32) d[j] = src[j] * inv;
    }
    for (int h = threadIdx.x; h < nv; h += blockDim.x) {
        const float g = ssm_a[h] * softplus(a[t * nv + h] + dt_bias[h]);
        gb[t * nv + h] = make_float2(expf(g), 1.0f / (1.0f + expf(-bl[t * nv + h])));
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

/* grid (value heads x row tiles, sequences), block blockDim.x = rows per tile x GDN_P. Thread
 * (row i of the tile, part p) holds columns of S[i, :] in registers across the sequence's
 * rows; rows past head_v compute on zeros (their lanes take part in the shuffles) and write
 * nothing. */
template <int KPT>
static __global__ void gdn_scan_kernel(float *dst, const float *qn, const float *kn, const float2 *gb,
                                       const float *qkv, float *ss, const int32_t *seqs, int nk, int hk, int nv,
                                       int hv, int64_t row_len, int grouped) {
    pdl_wait();
    pdl_trigger();
    const int rb = blockDim.x / GDN_P, tiles = (hv + rb - 1) / rb;
    const int h = blockIdx.x / tiles, p = threadIdx.x % GDN_P;
    const int i = (blockIdx.x % tiles) * rb + threadIdx.x / GDN_P; /* the state row */
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
    const int64_t v_off = 2 * (int64_t)nk * hk + (int64_t)h * hv + i;
    for (int t = 0; t < n; t++) {
        if (t == at) row_store(ss + q[STATE_SNAP_SLOT] * slot_floats + off, s, p, hk, ok);
        const int64_t r = r0 + t;
        float kk[KPT], qq[KPT];
        row_load(kk, kn + (r * nk + kh) * hk, p, hk, true);
        row_load(qq, qn + (r * nk + kh) * hk, p, hk, true);
        const float2 g = gb[r * nv + h]; /* (decay, beta) */
        const float v = ok ? qkv[r * row_len + v_off] : 0.0f;
        float sk = 0.0f;
#pragma unroll
        for (int e = 0; e < KPT; e++) sk += s[e] * kk[e];
        sk += __shfl_xor_sync(0xffffffffu, sk, 1);
        sk += __shfl_xor_sync(0xffffffffu, sk, 2);
        const float u = g.y * (v - g.x * sk);
        float o = 0.0f;
#pragma unroll
        for (int e = 0; e < KPT; e++) {
            s[e] = g.x * s[e] + u * kk[e];
            o += s[e] * qq[e];
        }
        o += __shfl_xor_sync(0xffffffffu, o, 1);
        o += __shfl_xor_sync(0xffffffffu, o, 2);
        if (ok && p == 0) dst[(r * nv + h) * hv + i] = o;
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

extern "C" uint64_t cuda_gdn_scratch_bytes(int64_t n_tokens, int n_k_head, int head_k, int n_v_head) {
    return (uint64_t)n_tokens * (2 * (uint64_t)n_k_head * head_k + 2 * (uint64_t)n_v_head) * sizeof(float);
}

extern "C" int cuda_gdn_supported(int head_k) { return head_k > 0 && head_k % 4 == 0 && head_k <= CUDA_GDN_MAX_HEAD_K; }

template <int KPT>
static void scan_launch(struct cuda_ctx *ctx, const struct cuda_gdn_args *a, const float *qn, const float *kn,
                        const float2 *gb, int rb) {
    const int tiles = (a->head_v + rb - 1) / rb;
    klaunch(gdn_scan_kernel<KPT>, dim3((unsigned)(a->n_v_head * tiles), (unsigned)a->n_seqs), dim3(rb * GDN_P), 0,
            ctx, a->dst, qn, kn, gb, a->qkv, a->ss, a->seqs, a->n_k_head, a->head_k, a->n_v_head, a->head_v,
            (int64_t)(2 * a->n_k_head * a->head_k + a->n_v_head * a->head_v), a->grouped);
}

extern "C" void cuda_gated_delta_net(struct cuda_ctx *ctx, const struct cuda_gdn_args *a) {
    const int nk = a->n_k_head, hk = a->head_k, nv = a->n_v_head;
    float *qn = (float *)a->scratch, *kn = qn + a->n_tokens * nk * hk;
    float2 *gb = (float2 *)(kn + a->n_tokens * nk * hk);
    const int64_t row_len = 2 * (int64_t)nk * hk + (int64_t)nv * a->head_v;
    klaunch(gdn_prep_kernel, dim3((unsigned)a->n_tokens), dim3(128), 0, ctx, qn, kn, gb, a->qkv, a->a, a->bl,
            a->ssm_a, a->dt_bias, nk, hk, nv, row_len, a->eps);
    /* 32 state rows a block; 16 when that leaves fewer blocks than two per SM */
    const int sms = ctx->n_sm > 0 ? ctx->n_sm : 132;
    const int rb = (int64_t)nv * ((a->head_v + 31) / 32) * a->n_seqs < 2 * sms ? 16 : 32;
    if (hk <= 16) scan_launch<4>(ctx, a, qn, kn, gb, rb);
    else if (hk <= 32) scan_launch<8>(ctx, a, qn, kn, gb, rb);
    else if (hk <= 64) scan_launch<16>(ctx, a, qn, kn, gb, rb);
    else if (hk <= 128) scan_launch<32>(ctx, a, qn, kn, gb, rb);
    else scan_launch<64>(ctx, a, qn, kn, gb, rb);
}
