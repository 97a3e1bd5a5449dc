/* Mixture-of-experts kernels: the router (norm, logits, top-k, weights in one launch), the
 * grouping of a step's (row, slot) pairs by expert, the experts' input rows (norm and int8
 * form, gathered in the grouped order), and the weighted sum of the experts' outputs fused
 * with the residual add. See cuda_moe.h; CPU twin: cpu_ops_moe.c; how the backend chains them
 * with the mmv kernels' expert mode: cuda_ops_moe.c.
 *
 * Batch invariance: the router and the combine give each row one block whose arithmetic
 * depends on that row alone (fixed reduction trees, no atomics); the grouping places rows by
 * atomics, but every grouped row is computed alone by the products, so its bits do not
 * depend on where it lands. */
#include "backend/cuda/cuda_mmq.cuh" /* mmq's f16 form of the prefill experts' inputs */
#include "backend/cuda/cuda_mmv.cuh" /* quant16: the int8 form of the experts' inputs */

extern "C" {
#include "backend/cuda/cuda_moe.h"
}

#define ROUTE_WARPS 8 /* experts per block of route_logits_kernel, a warp each (256 threads: the
                        * norm sums as gather_kernel's, so router and experts see one x') */
#define MOE_ROWS_THREADS 256
#define ROUTE_ROWS_WHOLE 128 /* rows from which a block computes all of a row's logits */
static_assert(ROUTE_WARPS * 32 == MOE_ROWS_THREADS, "the router's norm sums as the gather's");

/* ---------------------------------------------------------------- kernels ---- */

/* Block-wide sum (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
template <class T> static __device__ __forceinline__ T block_sum(T v, T *part) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* part may still be read from a previous call */
    if (lane == 0) part[warp] = v;
    __syncthreads();
    T t = lane < nw ? part[lane] : (T)0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

/* Row r's x' (rms_norm(x_r) * pre_w when has_pre, else x_r) into xs (n_embd floats, shared),
 * by a block of ROUTE_WARPS warps: the norm's sum of squares in double, as cpu_op_rms_norm,
 * through one fixed tree, so that the router, the experts' input rows (gather_kernel) and the
 * fused decode router all see the same bits. Ends with a barrier. */
static __device__ __forceinline__ void route_norm(const float *xr, int n_embd, int has_pre, const float *pre_w,
                                                  float eps, float *xs, double *dpart) {
    /* x is read once (one trip to L2, not two): each thread scales the values it stored */
    double ss = 0;
    for (int i = threadIdx.x; i < n_embd; i += blockDim.x) {
        const float v = xr[i];
        xs[i] = v;
        ss += (double)v * v;
    }
    if (has_pre) {
        ss = block_sum(ss, dpart);
        const float inv = (float)(1.0 / sqrt(ss / (double)n_embd + (double)eps));
        for (int i = threadIdx.x; i < n_embd; i += blockDim.x)
            xs[i] = pre_w ? xs[i] * inv * pre_w[i] : xs[i] * inv;
    }
    __syncthreads();
}

/* The first PF of a lane's 16-byte pieces of router row w (n_embd % 4 == 0), loaded ahead:
 * the fused router issues them before its PDL wait (weights only), so they stream while the
 * previous kernel finishes. */
template <int PF>
static __device__ __forceinline__ void route_prefetch(const float *w, int n_embd, int lane, float4 *pf) {
    const float4 *w4 = (const float4 *)w;
#pragma unroll
    for (int j = 0; j < PF; j++) {
        const int i = lane + 32 * j;
        pf[j] = i < n_embd / 4 ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* One logit, by one warp: router row w . x' (+ bias), the first PF pieces from pf (as
 * route_prefetch loaded them). Its arithmetic depends on the row and the expert only: the
 * same terms in the same order (lane stride 32, one sum a lane, a fixed warp tree) whatever
 * PF is, so both routers give the same bits. */
template <int PF>
static __device__ __forceinline__ float route_dot(const float *w, const float4 *pf, const float *xs, int n_embd,
                                                  int lane) {
    float s = 0.0f;
    const float4 *w4 = (const float4 *)w, *x4 = (const float4 *)xs;
    const int n4 = n_embd / 4;
#pragma unroll
    for (int j = 0; j < PF; j++) {
        const int i = lane + 32 * j;
        if (i < n4) {
            const float4 a = pf[j], c = x4[i];
            s += a.x * c.x + a.y * c.y + a.z * c.z + a.w * c.w;
        }
    }
#pragma unroll 8
    for (int i = lane + 32 * PF; i < n4; i += 32) { /* 16-byte loads, all in flight at once */
        const float4 a = w4[i], c = x4[i];
        s += a.x * c.x + a.y * c.y + a.z * c.z + a.w * c.w;
    }
    return warp_sum(s);
}
#define ROUTE_PF 16 /* pieces the fused router loads ahead: 2048-wide rows whole, 2880 70% */

/* The logits: block (r, c) computes experts c per_block .. + per_block - 1 of row r (warp w
 * those = w mod ROUTE_WARPS) from x' (the norm) in shared memory; lg is (n, n_exp). Fewer
 * than ROUTE_ROWS_WHOLE rows spread over n_exp / ROUTE_WARPS blocks a row, so that one
 * token's router (Qwen3-30B-A3B: 128 x 2048 F32, 1 MB) is read by 16 multiprocessors, not
 * one (one block a row read it at ~21 GB/s: 48 us a layer, 28% of decode's GPU time on the
 * H200, 2026-12-03). A logit's arithmetic depends on its row and expert only, whatever n and
 * per_block are. Shared: n_embd floats. */
static __global__ void __launch_bounds__(ROUTE_WARPS * 32)
    route_logits_kernel(const float *x, int n_embd, const float *router, const float *bias,
                        int n_exp, int per_block, int has_pre, const float *pre_w, float eps,
                        float *lg) {
    pdl_wait();
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char smem[];
    float *xs = (float *)smem;
    __shared__ double dpart[32];
    const int64_t r = blockIdx.x;
    const int lane = threadIdx.x & 31, e0 = blockIdx.y * per_block,
              e1 = min(e0 + per_block, n_exp);
    route_norm(x + r * n_embd, n_embd, has_pre, pre_w, eps, xs, dpart);
    for (int ex = e0 + (threadIdx.x >> 5); ex < e1; ex += ROUTE_WARPS) {
        const float s = route_dot<0>(router + (int64_t)ex * n_embd, NULL, xs, n_embd, lane);
        if (lane == 0) lg[r * n_exp + ex] = bias ? s + bias[ex] : s;
    }
}

/* The router's order (the CPU's rule: larger first, ties to the lower id, NaN after any
 * number) as one unsigned comparison: the key of logit (v, id) is the value's bits made
 * monotone (NaN below every number, -0 as +0: the float compare has them equal) over
 * 0xffffffff - id (a lower id first on equal values). Keys are distinct, and every key is
 * above 0, which stands for "none". */
static __device__ __forceinline__ unsigned long long rank_key(float v, int id) {
    unsigned u = __float_as_uint(v);
    if (u == 0x80000000u) u = 0u;
    u = isnan(v) ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (0xffffffffu - (unsigned)id);
}

/* The lane's best key among logits lane, lane + 32, ... of lg that rank after `after` (a
 * key; ~0 for all), 0 when none. */
static __device__ __forceinline__ unsigned long long lane_best(const float *lg, int n_exp, int lane,
                                                               unsigned long long after) {
    unsigned long long b = 0;
    for (int i = lane; i < n_exp; i += 32) {
        const unsigned long long key = rank_key(lg[i], i);
        if (key < after && key > b) b = key;
    }
    return b;
}

/* The warp's largest key, in every lane: the values' halves, then the ids' among the lanes
 * holding that value (two REDUX instructions). */
static __device__ __forceinline__ unsigned long long warp_max_key(unsigned long long key) {
    const unsigned hi = __reduce_max_sync(0xffffffffu, (unsigned)(key >> 32));
    const unsigned lo = __reduce_max_sync(0xffffffffu, (unsigned)(key >> 32) == hi ? (unsigned)key : 0u);
    return ((unsigned long long)hi << 32) | lo;
}

/* The k best of row r's logits lgs[0, n_exp) (largest first; ties to the lower id) and their
 * weights into ids, wt (k each), by one warp (every lane calls it). lg (n_exp floats): shared.
 * The logits are read from L2 (__ldcg): in the fused router other blocks wrote them. Round r
 * takes the largest of the lanes' best keys; only the lane that held it looks again (for
 * its best below the pick), so a round is two REDUX and one lane's pass over n_exp / 32
 * logits, with no barrier. (A block-wide arg-best, k rounds of shuffle trees and two
 * barriers, made the fused router's last block ~12 us of its ~23 on Qwen3-30B-A3B's shape,
 * ncu on the H100, 2026-12-05; before it, each logit's rank by counting was a chain of 256
 * dependent shared loads: ~35 us at 256 experts.) The weights in double, in a fixed order:
 * lane j holds pick j. */
static __device__ __forceinline__ void route_pick(const float *lgs, int n_exp, int k, int gating, float *lg,
                                                  int32_t *ids, float *wt) {
    const int lane = threadIdx.x & 31;
    for (int i = lane; i < n_exp; i += 32)
        lg[i] = __ldcg(lgs + i);
    __syncwarp();
    unsigned long long best = lane_best(lg, n_exp, lane, ~0ull);
    int mine = -1, top = 0; /* lane j: pick j */
    for (int r = 0; r < k; r++) {
        const unsigned long long w = warp_max_key(best);
        const int wi = (int)(0xffffffffu - (unsigned)w);
        if (r == 0) top = wi;
        if (lane == r) mine = wi;
        if ((wi & 31) == lane) best = lane_best(lg, n_exp, lane, w);
    }
    if (lane < k) ids[lane] = mine;
    /* weights: exp(l - max) over all (gating 0) or over the k (gating 1), in double; the
     * largest logit is the first pick (NaN ranks last, so a number when there is one) */
    const double mx = lg[top];
    double z = 0;
    if (gating == 0) {
        for (int ex = lane; ex < n_exp; ex += 32)
            z += exp((double)lg[ex] - mx);
    } else if (lane < k) {
        z = exp((double)lg[mine] - mx);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        z += __shfl_xor_sync(0xffffffffu, z, o);
    if (lane < k) wt[lane] = (float)(exp((double)lg[mine] - mx) / z);
}

#define ROUTE_PICK_THREADS 32 /* route_pick_kernel's block: the pick is one warp's */

/* A block per row: the pick of route_pick. Shared: n_exp floats. */
static __global__ void __launch_bounds__(ROUTE_PICK_THREADS)
    route_pick_kernel(const float *lgs, int n_exp, int k, int gating, int32_t *ids, float *wts) {
    pdl_wait();
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char smem[];
    const int64_t r = blockIdx.x;
    float *lg = (float *)smem;
    route_pick(lgs + r * n_exp, n_exp, k, gating, lg, ids + r * k, wts + r * k);
}

/* Decode's router in one launch (route_logits_kernel, route_pick_kernel and gather_kernel's
 * work for rows that are not regrouped): block (r, c) of (n, nb) computes x' of row r,
 * experts c per_block .. of its logits, and its share of the experts' input row (groups of 32
 * c ROUTE_WARPS + w, stepping by nb ROUTE_WARPS: f32 into xf, int8 as quant16); the last of
 * the row's blocks to finish (cnt[r], back to zero after) picks. Every value is computed as
 * by the three kernels (same functions, same trees), so the results are bitwise theirs. Shared:
 * max(n_embd floats, n_exp floats). */
static __global__ void __launch_bounds__(ROUTE_WARPS * 32)
    route_fused_kernel(const float *x, int n_embd, const float *router, const float *bias, int n_exp,
                       int per_block, int k, int gating, int has_pre, const float *pre_w, float eps,
                       float *lg, unsigned *cnt, int32_t *ids, float *wts, int8_t *xq, float2 *xd,
                       float *xf, const float *sh_w, float *sh_lg) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = blockIdx.y, nb = gridDim.y;
    /* rows: the n_exp experts', then the shared expert's gate (sh_w) when given */
    const int n_rows = n_exp + (sh_w ? 1 : 0);
    const int e0 = c * per_block, e1 = min(e0 + per_block, n_rows), ex = e0 + warp; /* per_block <= warps */
    const float *wr = ex < n_exp ? router + (int64_t)ex * n_embd : sh_w;
    float4 pf[ROUTE_PF];
    if (ex < e1) route_prefetch<ROUTE_PF>(wr, n_embd, lane, pf);
    if (has_pre && pre_w) l2_prefetch(pre_w, (size_t)n_embd * sizeof(float)); /* read after the sum of squares */
    pdl_wait();
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char smem[];
    float *xs = (float *)smem;
    __shared__ double dpart[32];
    __shared__ int last;
    const int64_t r = blockIdx.x;
    route_norm(x + r * n_embd, n_embd, has_pre, pre_w, eps, xs, dpart);
    if (ex < e1) {
        const float s = route_dot<ROUTE_PF>(wr, pf, xs, n_embd, lane);
        if (lane == 0 && ex < n_exp) lg[r * n_exp + ex] = bias ? s + bias[ex] : s;
        else if (lane == 0) sh_lg[r] = s;
    }
    for (int g = c * ROUTE_WARPS + warp; g < n_embd / 32; g += nb * ROUTE_WARPS) {
        const int64_t o = r * n_embd + g * 32 + lane;
        const float v = xs[g * 32 + lane];
        if (xf) xf[o] = v;
        quant16(v, xq, xd, o, true);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&cnt[r], 1u) == (unsigned)nb - 1;
    __syncthreads();
    if (!last || warp != 0) return;
    __threadfence();
    if (lane == 0) cnt[r] = 0;
    route_pick(lg + r * n_exp, n_exp, k, gating, xs, ids + r * k, wts + r * k);
}

/* One block: counts per expert, padded offsets (chunks of ch rows), the chunk table, then
 * every pair's place. Shared: 2 x n_exp ints. */
static __global__ void __launch_bounds__(1024)
    group_kernel(const int32_t *ids, int64_t n_pairs, int k, int n_exp, int ch, int64_t n_chunks,
                 int32_t *chunk_eid, int32_t *pos, int32_t *src) {
    pdl_wait();
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char smem[];
    int *cnt = (int *)smem, *off = cnt + n_exp;
    const int64_t n_rows = n_chunks * ch;
    for (int i = threadIdx.x; i < n_exp; i += blockDim.x)
        cnt[i] = 0;
    for (int64_t i = threadIdx.x; i < n_rows; i += blockDim.x)
        src[i] = -1;
    for (int64_t i = threadIdx.x; i < n_chunks; i += blockDim.x)
        chunk_eid[i] = -1;
    __syncthreads();
    for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const int ex = ids[p];
        if (ex >= 0 && ex < n_exp) atomicAdd(&cnt[ex], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* exclusive scan of the padded counts: lane l owns a run of experts */
        const int lane = threadIdx.x, per = (n_exp + 31) / 32, e0 = lane * per,
                  e1 = min(e0 + per, n_exp);
        int run = 0;
        for (int ex = e0; ex < e1; ex++)
            run += (cnt[ex] + ch - 1) / ch * ch;
        int incl = run;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        int at = incl - run;
        for (int ex = e0; ex < e1; ex++) {
            off[ex] = at;
            at += (cnt[ex] + ch - 1) / ch * ch;
        }
    }
    __syncthreads();
    for (int ex = threadIdx.x; ex < n_exp; ex += blockDim.x) {
        const int c0 = off[ex] / ch, c1 = (off[ex] + cnt[ex] + ch - 1) / ch;
        for (int c = c0; c < c1; c++)
            chunk_eid[c] = ex;
        cnt[ex] = 0; /* now the fill counter (only this thread read it) */
    }
    __syncthreads();
    for (int64_t p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const int ex = ids[p];
        if (ex < 0 || ex >= n_exp) {
            pos[p] = -1;
            continue;
        }
        const int at = off[ex] + atomicAdd(&cnt[ex], 1);
        pos[p] = at;
        src[at] = (int32_t)(p / k);
    }
}

/* One block per output row: x' of its source row (norm as route_logits_kernel's, zeros for padding),
 * stored as f32 (xf), in the int8 form (xq: quant16 per 16 values; warp w quantizes groups
 * of 32 w, w + warps, ...) and in mmq's f16 form (mcnt: the mmq scratch's counters, zeroed,
 * and its activations), each when not NULL. */
static __global__ void __launch_bounds__(MOE_ROWS_THREADS)
    gather_kernel(const float *x, int n_embd, const int32_t *src, int has_pre, const float *pre_w,
                  float eps, int8_t *xq, float2 *xd, float *xf, int *mcnt, __half *mxh) {
    pdl_wait();
    pdl_trigger();
    if (mcnt) mmq_zero_cnt(mcnt);
    __shared__ double dpart[32];
    const int64_t i = blockIdx.x;
    const int64_t row = src ? src[i] : i;
    const float *xr = x + (row < 0 ? 0 : row) * n_embd;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float inv = 1.0f;
    if (has_pre && row >= 0) {
        double ss = 0;
        for (int j = threadIdx.x; j < n_embd; j += blockDim.x)
            ss += (double)xr[j] * xr[j];
        ss = block_sum(ss, dpart);
        inv = (float)(1.0 / sqrt(ss / (double)n_embd + (double)eps));
    }
    for (int g = warp; g < n_embd / 32; g += nw) {
        const int j = g * 32 + lane;
        const int64_t o = i * n_embd + j;
        float v = 0.0f;
        if (row >= 0) v = has_pre ? (pre_w ? xr[j] * inv * pre_w[j] : xr[j] * inv) : xr[j];
        if (xf) xf[o] = v;
        if (xq) quant16(v, xq, xd, o, true);
        if (mxh) mxh[i * n_embd + mmq_pos(j)] = mmq_f16(v);
    }
}

/* Block (r, c) takes row r's columns c T, c T + 1, ... (T threads a block, gridDim.y blocks a
 * row): each thread sums its columns over the row's slots in increasing expert id, then
 * writes or adds into dst. A column's arithmetic is the same whatever the grid. */
static __global__ void __launch_bounds__(MOE_ROWS_THREADS)
    combine_kernel(float *dst, const float *y, const int32_t *pos, const int32_t *ids,
                   const float *wts, const float *down_b, int n_embd, int k, int n_exp, int acc,
                   const float *post_w, int8_t *post_xq, float2 *post_xd, float *post_ss, int sh,
                   const float *sh_logit) {
    if (post_w) l2_prefetch(post_w, (size_t)n_embd * sizeof(float));
    pdl_wait();
    pdl_trigger();
    __shared__ int order[32];
    const int64_t r = blockIdx.x;
    const int32_t *id = ids + r * k;
    if (threadIdx.x < k) { /* slot j's rank by (id, slot) */
        const int j = threadIdx.x, ej = id[j];
        int rank = 0;
        for (int q = 0; q < k; q++)
            rank += id[q] < ej || (id[q] == ej && q < j);
        order[rank] = j;
    }
    __syncthreads();
    const int sl = k + sh; /* without pos: slots a row (the shared one last) */
    for (int d = blockIdx.y * blockDim.x + threadIdx.x; d < n_embd; d += gridDim.y * blockDim.x) {
        float s = moe_slot_sum([&](int64_t p) { return __ldcg(y + p * n_embd + d); }, n_embd, d,
                               [&](int j) { return pos ? (int64_t)pos[r * k + j] : r * sl + j; },
                               order, id, wts + r * k, down_b, k, n_exp);
        if (sh) { /* the shared expert, as the fused down launch adds it */
            const float v = y[(r * sl + k) * n_embd + d];
            const float g = sh_logit ? 1.0f / (1.0f + expf(-sh_logit[r])) : 1.0f;
            s += g * v;
        }
        float *o = dst + r * n_embd + d;
        const float v = acc ? *o + s : s;
        *o = v;
        if (post_xq) /* n_embd % 32 == 0: whole warps here */
            post_prep(v, post_w ? post_w[d] : 1.0f, post_xq, post_xd, r * n_embd + d,
                      post_ss ? post_ss + r * (n_embd / 32) + d / 32 : NULL);
    }
}

/* --------------------------------------------------------------- launchers ---- */

extern "C" size_t cuda_moe_route_scratch_bytes(int64_t n, int n_exp) {
    return (size_t)n * (size_t)n_exp * sizeof(float);
}

extern "C" smelt_status cuda_moe_route(struct cuda_ctx *ctx, const float *x, int64_t n_embd,
                                       int64_t n, const float *router, const float *bias, int n_exp,
                                       int k, int gating, int has_pre, const float *pre_w,
                                       float eps, int32_t *ids, float *weights, float *lg_scratch,
                                       struct err *e) {
    const size_t smem = (size_t)n_embd * sizeof(float), smem_pick = (size_t)n_exp * sizeof(float);
    if (k < 1 || k > 32 || k > n_exp || n < 1 || n > INT32_MAX || n_exp > 65535 * ROUTE_WARPS || n_embd > INT32_MAX ||
        n_embd % 4 != 0 ||
        smem > 200 * 1024 || smem_pick > 200 * 1024)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda moe route: %lld rows of %lld, top %d of %d experts", (long long)n,
                       (long long)n_embd, k, n_exp);
    if (smem > 48 * 1024) smem_optin_once(ctx, (const void *)route_logits_kernel, smem);
    if (smem_pick > 48 * 1024) smem_optin_once(ctx, (const void *)route_pick_kernel, smem_pick);
    /* enough rows fill the GPU with a block a row (no norm done twice); fewer spread a row */
    const int per_block = n >= ROUTE_ROWS_WHOLE ? n_exp : ROUTE_WARPS;
    CUDA_TRY(klaunch(route_logits_kernel, dim3((unsigned)n, (unsigned)((n_exp + per_block - 1) / per_block)),
                     dim3(ROUTE_WARPS * 32), smem, ctx, x, (int)n_embd, router, bias, n_exp,
                     per_block, has_pre, pre_w, eps, lg_scratch),
             e);
    CUDA_TRY(klaunch(route_pick_kernel, dim3((unsigned)n), dim3(ROUTE_PICK_THREADS), smem_pick, ctx,
                     (const float *)lg_scratch, n_exp, k, gating, ids, weights),
             e);
    return SMELT_OK;
}

extern "C" smelt_status cuda_moe_route_fused(struct cuda_ctx *ctx, const float *x, int64_t n_embd, int64_t n,
                                             const float *router, const float *bias, int n_exp, int k,
                                             int gating, int has_pre, const float *pre_w, float eps,
                                             int32_t *ids, float *weights, float *lg_scratch, unsigned *cnt,
                                             void *xq_scratch, float *xf, const float *sh_w, float *sh_logit,
                                             struct err *e) {
    const size_t smem_norm = (size_t)n_embd * sizeof(float), smem_pick = (size_t)n_exp * sizeof(float);
    const size_t smem = smem_norm > smem_pick ? smem_norm : smem_pick;
    if (k < 1 || k > 32 || k > n_exp || n < 1 || n > CUDA_MOE_FUSED_ROUTE_ROWS || n_exp > 65535 ||
        n_embd > INT32_MAX || n_embd % 32 != 0 || smem > 200 * 1024 || !sh_w != !sh_logit)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda moe route (fused): %lld rows of %lld, top %d of %d experts", (long long)n,
                       (long long)n_embd, k, n_exp);
    if (smem > 48 * 1024) smem_optin_once(ctx, (const void *)route_fused_kernel, smem);
    /* about 32 blocks a row: a warp a logit, at most ROUTE_WARPS logits a block (the kernel
     * gives warp w expert c per_block + w only) */
    const int n_rows = n_exp + (sh_w ? 1 : 0); /* the shared gate's row last */
    int per_block = (n_rows + 31) / 32;
    if (per_block > ROUTE_WARPS) per_block = ROUTE_WARPS;
    const int nb = (n_rows + per_block - 1) / per_block;
    int8_t *xq;
    void *xd;
    cuda_mmv_scratch_parts(xq_scratch, n_embd, (int)n, &xq, &xd);
    CUDA_TRY(klaunch(route_fused_kernel, dim3((unsigned)n, (unsigned)nb), dim3(ROUTE_WARPS * 32), smem, ctx, x,
                     (int)n_embd, router, bias, n_exp, per_block, k, gating, has_pre, pre_w, eps, lg_scratch, cnt,
                     ids, weights, xq, (float2 *)xd, xf, sh_w, sh_logit),
             e);
    return SMELT_OK;
}

extern "C" int64_t cuda_moe_chunks(int64_t n_pairs, int n_exp, int ch) {
    const int64_t active = n_pairs < n_exp ? n_pairs : n_exp;
    return (n_pairs + active * (ch - 1)) / ch;
}

extern "C" smelt_status cuda_moe_group(struct cuda_ctx *ctx, const int32_t *ids, int64_t n, int k,
                                       int n_exp, int ch, int64_t n_chunks, int32_t *chunk_eid,
                                       int32_t *pos, int32_t *src, struct err *e) {
    if (n_exp < 1 || n_exp > CUDA_MOE_MAX_EXPERTS || ch < 1 || k < 1 || n < 1 ||
        n_chunks != cuda_moe_chunks(n * k, n_exp, ch) || n_chunks * ch > INT32_MAX)
        return err_set(e, SMELT_ERR_INVALID,
                       "cuda moe group: %lld rows x %d slots over %d experts, %lld chunks of %d",
                       (long long)n, k, n_exp, (long long)n_chunks, ch);
    const size_t smem = (size_t)2 * n_exp * sizeof(int);
    if (smem > 48 * 1024) smem_optin_once(ctx, (const void *)group_kernel, smem);
    CUDA_TRY(klaunch(group_kernel, dim3(1), dim3(1024), smem, ctx, ids, n * k, k, n_exp, ch,
                     n_chunks, chunk_eid, pos, src),
             e);
    return SMELT_OK;
}

extern "C" smelt_status cuda_moe_gather(struct cuda_ctx *ctx, const float *x, int64_t n_embd,
                                        const int32_t *src, int64_t n_rows, int has_pre,
                                        const float *pre_w, float eps, void *xq_scratch, float *xf,
                                        void *mmq_scratch, struct err *e) {
    if (n_embd % 32 != 0 || n_embd > INT32_MAX || n_rows < 1 || n_rows > INT32_MAX)
        return err_set(e, SMELT_ERR_INVALID, "cuda moe gather: %lld rows of %lld",
                       (long long)n_rows, (long long)n_embd);
    int8_t *xq = NULL;
    void *xd = NULL;
    if (xq_scratch) cuda_mmv_scratch_parts(xq_scratch, n_embd, (int)n_rows, &xq, &xd);
    CUDA_TRY(klaunch(gather_kernel, dim3((unsigned)n_rows), dim3(MOE_ROWS_THREADS), 0, ctx, x,
                     (int)n_embd, src, has_pre, pre_w, eps, xq, (float2 *)xd, xf,
                     mmq_scratch ? mmq_cnt(mmq_scratch) : NULL, mmq_scratch ? mmq_xh(mmq_scratch) : NULL),
             e);
    return SMELT_OK;
}

extern "C" smelt_status cuda_moe_combine(struct cuda_ctx *ctx, float *dst, const float *y,
                                         const int32_t *pos, const int32_t *ids,
                                         const float *weights, const float *down_b, int64_t n_embd,
                                         int64_t n, int k, int n_exp, int acc,
                                         const struct cuda_moe_post *post,
                                         const struct cuda_moe_shared *sh, struct err *e) {
    if (k < 1 || k > 32 || n < 1 || n > INT32_MAX || n_embd > INT32_MAX || (post && n_embd % 32 != 0) ||
        (sh && pos))
        return err_set(e, SMELT_ERR_INVALID, "cuda moe combine: %lld rows of %lld, %d slots",
                       (long long)n, (long long)n_embd, k);
    /* a block per row and MOE_ROWS_THREADS columns: at 8 decode rows a block a row was 8
     * blocks for 512 KB of expert outputs */
    const unsigned per_row = (unsigned)((n_embd + MOE_ROWS_THREADS - 1) / MOE_ROWS_THREADS);
    CUDA_TRY(klaunch(combine_kernel, dim3((unsigned)n, per_row < 65535 ? per_row : 65535),
                     dim3(MOE_ROWS_THREADS), 0, ctx, dst, y, pos,
                     ids, weights, down_b, (int)n_embd, k, n_exp, acc, post ? post->w : NULL,
                     post ? post->xq : NULL, post ? (float2 *)post->xd : NULL, post ? post->ss : NULL,
                     sh ? 1 : 0, sh ? sh->logit : NULL),
             e);
    return SMELT_OK;
}
