/* The mmv family's shared device code (decode products, 1..8 token rows): the int8 form of
 * the activations (quant16), the launch's stacked matrices (mmv_mats), the per-warp
 * accumulators with their stores and epilogues (mmv_acc), and the work-split knobs. Included
 * by the family's two files: cuda_mmv.cu (F16/BF16/F32, Q8_0, Q4_K, Q6_K, the launchers)
 * and cuda_mmv_tq.cu (the other quantized types), whose launch, repack and type test it
 * declares. Design note and measurements: cuda_mmv.h, docs/cuda-backend.md. */
#ifndef SMELT_CUDA_MMV_CUH
#define SMELT_CUDA_MMV_CUH

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/backend.h" /* GLU_OAI_ALPHA, GLU_OAI_LIMIT */
#include "backend/cuda/cuda_mmv.h"
}

#define MMV_WARPS 4

/* The int8 form of the activations (every decode product's input): xq[i] = round(x[i] / d)
 * with one scale per 16 values, d = max|x| / 127 over the group, and xd[i / 16] = {d, d *
 * sum(q)} (the sum serves the weights with an offset or a min). One scale per 16, not 32:
 * each halving of the group halves the activations' share of the logits' error, and per 32
 * left a real AWQ checkpoint at cosine 0.99899 against the CPU (docs/cuda-backend.md).
 *
 * quant16: one value v per lane, for element o; the 16 lanes of each half-warp hold the 16
 * values of one group (o % 16 == lane % 16). Called by the whole warp (full-mask
 * shuffles); only lanes with `store` write. */
static __device__ __forceinline__ void quant16(float v, int8_t *xq, float2 *xd, int64_t o, bool store) {
    float amax = fabsf(v);
#pragma unroll
    for (int m = 8; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float d = amax / 127.0f;
    const int q = d > 0.0f ? __float2int_rn(v / d) : 0;
    int s = q;
#pragma unroll
    for (int m = 8; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    if (!store) return;
    xq[o] = (int8_t)q;
    if ((o & 15) == 0) xd[o >> 4] = make_float2(d, d * (float)s);
}

/* The next norm's input prepared from a product's output, one value y a lane, the warp
 * holding one group of 32 consecutive outputs (element o): the int8 form of w * y (quant16)
 * and the group's sum of squares of y into *ss (lane 0; ss may be NULL), which the next
 * product's pre_ss turns into the norm's factor. Every epilogue that prepares it (the mmv
 * store's, the experts' weighted sums) goes through here, so they agree to the bit. */
static __device__ __forceinline__ void post_prep(float y, float w, int8_t *xq, float2 *xd, int64_t o, float *ss) {
    quant16(y * w, xq, xd, o, true);
    const float s = warp_sum(y * y);
    if ((threadIdx.x & 31) == 0 && ss) *ss = s;
}

/* One output column's weighted sum over a token's k expert slots, in increasing (expert id,
 * slot) order (order[q]: the q-th slot), as every combine (combine_group below, cuda_moe.cu's
 * combine_kernel) computes it: slot j adds w[j] * (yat(pos(j)) + b[ex * ld + col]) when its
 * expert ex = id[j] is in [0, n_exp) and pos(j) >= 0, yat(p) being the column's value in the
 * output row of slot position p (from L2 or from shared memory). Eight slots' loads go out
 * before their adds: a slot at a time made the sum a chain of k dependent trips to L2. */
template <class Y, class P>
static __device__ __forceinline__ float moe_slot_sum(Y yat, int64_t ld, int64_t col, P pos, const int *order,
                                                     const int32_t *id, const float *w, const float *b, int k,
                                                     int n_exp) {
    float s = 0.0f;
    for (int q0 = 0; q0 < k; q0 += 8) {
        float v[8], wt[8];
        bool live[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int j = order[min(q0 + i, k - 1)], ex = id[j];
            const int64_t p = pos(j);
            live[i] = q0 + i < k && p >= 0 && ex >= 0 && ex < n_exp;
            v[i] = live[i] ? yat(p) : 0.0f;
            if (live[i] && b) v[i] += b[(int64_t)ex * ld + col];
            wt[i] = live[i] ? w[j] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (live[i]) s += wt[i] * v[i];
    }
    return s;
}


static __device__ __forceinline__ int dot16(uint4 a, uint4 b) {
    int s = dp4a((int)a.x, (int)b.x, 0);
    s = dp4a((int)a.y, (int)b.y, s);
    s = dp4a((int)a.z, (int)b.z, s);
    return dp4a((int)a.w, (int)b.w, s);
}

/* The units loop of the quantized mmv kernels: a lane's units first, first + step, ... in
 * rounds of U (every stride units), each round's U loads issued (load(i, u), units past the
 * end clamped to the last) before its math (math(i, u), real units only), the first round's
 * loads before the PDL wait (once: `waited`), so the weights stream while the kernel before
 * finishes. The lambdas share the round's arrays (the caller's, indexed by i). */
template <int U, class L, class M>
static __device__ __forceinline__ void mmv_units(int first, int step, int stride, int n_units, bool &waited, L &&load,
                                                 M &&math) {
    for (int u0 = first; u0 < n_units; u0 += stride) {
#pragma unroll
        for (int i = 0; i < U; i++) load(i, min(u0 + step * i, n_units - 1));
        if (!waited) {
            pdl_wait();
            waited = true;
        }
#pragma unroll
        for (int i = 0; i < U; i++) {
            const int u = u0 + step * i;
            if (u >= n_units) break;
            math(i, u);
        }
    }
}

/* Every kernel: R rows per warp (the activations loaded for a unit are reused across the R
 * rows: L1 traffic for activations is the limit otherwise), MMV_WARPS warps per block.
 * Lane l takes units l, l+32, ... of 16 B of quant bits; consecutive lanes read
 * consecutive 16 B of weights, and their activation slices fall in whole 32 B sectors. */
#ifndef MMV_R
#define MMV_R 2
#endif
/* Minimum resident blocks per SM asked of the compiler (caps registers); 1 = no cap. */
#ifndef MMV_MINB
#define MMV_MINB 1
#endif
/* Units of 16 B each lane loads before computing (bytes in flight per warp). */
#ifndef MMV_U
#define MMV_U 4
#endif

/* The weights a launch reads: up to MMV_MATS matrices of one type and row length whose
 * rows are stacked (Q, K and V in one launch: output row r belongs to the first matrix i
 * with r < end[i], and goes to y[i] with that matrix's optional bias b[i] added), or
 * (GLU != 0) a gate and an up matrix of the same shape, whose rows are computed together
 * (R = 2: row r of the warp is matrix r) and combined into act(gate) * up in y[0]. */
#define MMV_MATS 3
struct mmv_mats {
    const void *q[MMV_MATS], *s[MMV_MATS], *d[MMV_MATS];
    float *y[MMV_MATS];
    const float *b[MMV_MATS];
    int end[MMV_MATS];
    int n;
    int mix_row; /* mmv_q4k_q6k: the first Q6_K row (0: one type) */
    struct cuda_mmv_epi epi; /* see cuda_mmv.h; zero = plain product */
    int k;
    /* Expert mode ("mmv by id", cuda_mmv_id / cuda_mmv_glu_id; eid NULL = off): block row
     * blockIdx.y is chunk c of N token rows, run against expert e = eid[c] of a weight of
     * n_exp stacked matrices of end[0] rows each (rows e * end[0] + ...); its activations are
     * chunk c / x_div's (x_div = k slots per token when every slot of a token reads that
     * token's row), its output rows go to y + c * N * end[0]. A chunk whose e is outside
     * [0, n_exp) (unused, or a bad id) does nothing. GLU: bias[0] / bias[1] (may be NULL)
     * are the experts' gate / up biases, (end[0], n_exp). id_early, id_signal_late: see
     * cuda_mmv_ids. */
    const int32_t *eid;
    int n_chunks, x_div, n_exp, id_early, id_signal_late;
    const float *bias[2];
    /* Expert mode with a shared expert (cuda_mmv_ids.sh_k): id_k = k expert slots a token,
     * then the shared slot, whose expert number is n_exp and whose matrices are sh_* (GLU:
     * [0] gate, [1] up), 2-D, with end[0] rows each; 0 = none. */
    int id_k;
    const void *sh_q[2], *sh_s[2], *sh_d[2];
    /* Expert mode, one token row a chunk (N = 1), chunks (token, slot) in slot order:
     * the weighted sum of the k slots' outputs (cuda_moe_combine's, with pos NULL) fused
     * into the store (cmb.dst NULL = off). The block that completes a group of 32 rows of
     * a token over its live slots (counted in cnt[token * rows / 32 + group], which it
     * resets) writes dst (+)= sum over the slots in increasing expert id of w * (y + b[e])
     * for the group, and with post_xq (NULL = off) the next norm's input as the
     * cu_matmul_acc epilogue does (post_quantize): the int8 form of post_w * dst and the
     * group's sum of squares of dst. */
    struct {
        float *dst;
        const int32_t *ids;
        const float *w, *b;
        unsigned *cnt;
        int k, acc;
        const float *post_w;
        int8_t *post_xq;
        float2 *post_xd;
        float *post_ss;
        const float *sh_logit; /* with id_k: the shared slot's gate logit per token, or NULL */
    } cmb;
};

/* Expert mode: chunk c's expert (0 when off; n_exp for a shared slot, and -1 for a routed
 * id of n_exp there, so that a bad id never reads the shared weights); early ids (read
 * before the PDL wait) from L2. mmv_expert: the block's (chunk blockIdx.y). */
static __device__ __forceinline__ int64_t mmv_expert_at(const mmv_mats &m, int64_t c) {
    if (!m.eid) return 0;
    if (m.id_k) {
        const int64_t t = c / (m.id_k + 1), j = c - t * (m.id_k + 1);
        if (j == m.id_k) return m.n_exp;
        c = t * m.id_k + j;
    }
    const int64_t e = m.id_early ? __ldcg(m.eid + c) : m.eid[c];
    return m.id_k && e == m.n_exp ? -1 : e;
}
static __device__ __forceinline__ int64_t mmv_expert(const mmv_mats &m) {
    return mmv_expert_at(m, blockIdx.y);
}

/* First thing in every mmv kernel (mmv_id_live; mmv_id_enter without the liveness, for
 * kernels whose block spans several chunks): signals the PDL dependents and, in expert mode,
 * says whether the block has work. The signal comes first (the next kernel launches early and
 * streams its weights while this one runs), except with id_signal_late: then only after the
 * block's wait, so that a kernel after this one starts only once the kernel before it (the
 * ids' writer) has completed, which lets that kernel take its ids early. Expert mode: the ids
 * come from an earlier kernel, by default the one just before, so the block waits before it
 * reads them (and before any weight: they depend on the id); with id_early the block reads
 * its id from L2 at once and its first weights go out before its wait (the body's). */
static __device__ __forceinline__ void mmv_id_enter(const mmv_mats &m) {
    if (!m.id_signal_late) pdl_trigger();
    if (!m.eid) return;
    if (!m.id_early) pdl_wait();
    if (m.id_signal_late) pdl_trigger();
}
/* Expert mode: whether expert e (mmv_expert_at's) has work: a routed expert or the shared slot. */
static __device__ __forceinline__ bool mmv_expert_live(const mmv_mats &m, int64_t e) {
    return e >= 0 && (e < m.n_exp || (m.id_k && e == m.n_exp));
}
static __device__ __forceinline__ bool mmv_id_live(const mmv_mats &m) {
    mmv_id_enter(m);
    return !m.eid || mmv_expert_live(m, mmv_expert(m));
}

/* Expert mode: the block's activations (per_row elements a token row) within x. */
template <int N, class T>
static __device__ __forceinline__ const T *mmv_id_x(const mmv_mats &m, const T *x, int64_t per_row) {
    return m.eid ? x + (int64_t)(blockIdx.y / m.x_div) * N * per_row : x;
}

/* The r-th row of a warp whose first row is row0: which matrix, and the row within it. */
struct mrow_ref {
    const void *q, *s, *d;
    int64_t row; /* within its matrix */
    int mat;
};

template <int GLU>
static __device__ __forceinline__ mrow_ref mref(const mmv_mats &m, int row0, int r, int64_t e) {
    mrow_ref o;
    if (GLU) {
        o.mat = r;
        o.row = row0;
    } else {
        const int total = m.end[m.n - 1];
        const int row = min(row0 + r, total - 1);
        o.mat = row < m.end[0] ? 0 : row < m.end[1] ? 1 : 2;
        o.row = row - (o.mat == 0 ? 0 : o.mat == 1 ? m.end[0] : m.end[1]);
    }
    if (m.id_k && e == m.n_exp) { /* expert mode: the shared slot's own matrices */
        o.q = o.mat == 0 ? m.sh_q[0] : m.sh_q[1];
        o.s = o.mat == 0 ? m.sh_s[0] : m.sh_s[1];
        o.d = o.mat == 0 ? m.sh_d[0] : m.sh_d[1];
        return o;
    }
    o.row += e * m.end[0]; /* expert mode: the expert's rows */
    o.q = o.mat == 0 ? m.q[0] : o.mat == 1 ? m.q[1] : m.q[2];
    o.s = o.mat == 0 ? m.s[0] : o.mat == 1 ? m.s[1] : m.s[2];
    o.d = o.mat == 0 ? m.d[0] : o.mat == 1 ? m.d[1] : m.d[2];
    return o;
}

/* The R rows of a warp whose first row is row0 (the block's expert looked up once). */
template <int GLU, int R>
static __device__ __forceinline__ void mrefs(const mmv_mats &m, int row0, mrow_ref *rr) {
    const int64_t e = mmv_expert(m);
#pragma unroll
    for (int r = 0; r < R; r++) rr[r] = mref<GLU>(m, row0, r, e);
}

static __device__ __forceinline__ float glu_act(int glu, float g) {
    if (glu == 1) return g / (1.0f + expf(-g));
    if (glu == 3) { /* gpt-oss's clamped SwiGLU (the up half is clamped in store_glu); NaN stays */
        g = g > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : g;
        return g / (1.0f + expf(-GLU_OAI_ALPHA * g));
    }
    const float c = 0.7978845608028654f; /* GELU, tanh form */
    return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g)));
}

/* cmb (see mmv_mats): token r's weighted sum over its slots for group grp of 32 output rows,
 * by one warp (lane = row), the slots' outputs read through yat(slot position, row); then
 * dst (+)= it and, with post_xq, the next norm's input from it. The combining epilogue's
 * last block (mmv_acc::combine, from L2) and mmv_sum_body (from shared memory) both end
 * here, so they agree to the bit. */
template <class Y>
static __device__ __forceinline__ void combine_group(const mmv_mats &m, int r, int grp, Y yat) {
    const int rows = m.end[0], k = m.cmb.k, sl = k + (m.id_k ? 1 : 0);
    const int32_t *id = m.cmb.ids + (int64_t)r * k;
    __shared__ int order[32];
    const int lane = threadIdx.x;
    if (lane < k) { /* slot j's rank by (id, slot), as combine_kernel */
        const int ej = id[lane];
        int rank = 0;
        for (int q = 0; q < k; q++) rank += id[q] < ej || (id[q] == ej && q < lane);
        order[rank] = lane;
    }
    __syncwarp();
    const int row = grp * 32 + lane;
    float s = moe_slot_sum([&](int64_t p) { return yat(p, row); }, rows, row,
                           [&](int j) { return (int64_t)r * sl + j; }, order, id, m.cmb.w + (int64_t)r * k, m.cmb.b,
                           k, m.n_exp);
    if (m.id_k) { /* the shared expert, last: its gate as the weight */
        const float v = yat((int64_t)r * sl + k, row);
        const float g = m.cmb.sh_logit ? 1.0f / (1.0f + expf(-m.cmb.sh_logit[r])) : 1.0f;
        s += g * v;
    }
    const int64_t o = (int64_t)r * rows + row;
    const float y = m.cmb.acc ? m.cmb.dst[o] + s : s;
    m.cmb.dst[o] = y;
    /* the next norm's input (the warp holds the token's whole group) */
    if (m.cmb.post_xq)
        post_prep(y, m.cmb.post_w ? m.cmb.post_w[row] : 1.0f, m.cmb.post_xq, m.cmb.post_xd, o,
                  m.cmb.post_ss ? m.cmb.post_ss + (int64_t)r * (rows / 32) + grp : NULL);
}

template <int N, int R>
struct mmv_acc {
    float v[R][N];
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < N; t++) v[r][t] = 0.0f;
    }
    /* The RMSNorm factor of each token row when the input is the raw residual's int8 form
     * (epi.pre_ss: per-32 sums of squares): rsqrt(mean(x^2) + eps); else 1. */
    __device__ __forceinline__ void pre_scale(const mmv_mats &m, int lane, float *sc) {
#pragma unroll
        for (int t = 0; t < N; t++) sc[t] = 1.0f;
        if (!m.epi.pre_ss) return;
        const int groups = m.k / 32;
#pragma unroll
        for (int t = 0; t < N; t++) {
            float ss = 0.0f;
            for (int j = lane; j < groups; j += 32) ss += m.epi.pre_ss[(int64_t)t * groups + j];
            sc[t] = rsqrtf(warp_sum(ss) / (float)m.k + m.epi.pre_eps);
        }
    }
    /* Split-K (KS warps of a block share its rows, each over its own slice of k): the
     * warps' partial sums meet in warp 0, lane 0 holding each total and the other lanes 0,
     * so the stores' warp_sum keeps it. True for the warp that stores. */
    template <int KS>
    __device__ __forceinline__ bool ks_reduce(int lane) {
        if constexpr (KS == 1) {
            return true;
        } else {
            __shared__ float part[KS][R][N];
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < N; t++) {
                    const float sum = warp_sum(v[r][t]);
                    if (lane == 0) part[threadIdx.y][r][t] = sum;
                }
            __syncthreads();
            if (threadIdx.y != 0) return false;
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < N; t++) {
                    float tot = 0.0f;
#pragma unroll
                    for (int w = 0; w < KS; w++) tot += part[w][r][t];
                    v[r][t] = lane == 0 ? tot : 0.0f;
                }
            return true;
        }
    }
    /* GLU: v[0] is the gate, v[1] the up projection of row row0 (rows = the matrices').
     * Only `writer` stores; per_block: output rows per block (the epilogue's grouping). */
    __device__ __forceinline__ void store_glu(const mmv_mats &m, int row0, int lane, int glu, bool writer = true,
                                              int per_block = MMV_WARPS) {
        const int rows = m.end[0];
        float sc[N];
        pre_scale(m, lane, sc);
        /* expert mode: the chunk's rows of y */
        float *y = m.y[0] + (int64_t)blockIdx.y * N * rows;
        const int64_t e = mmv_expert(m);
#pragma unroll
        for (int t = 0; t < N; t++) {
            const float yv = glu_value(m, row0, e, glu, t, sc);
            if (lane == 0 && writer) y[(int64_t)t * rows + row0] = yv;
        }
        if (m.epi.post_cnt) post_quantize(m, per_block);
    }
    /* GLU: token row t's act(gate) * up of row row0 (expert e's biases in expert mode), in
     * every lane; sc: pre_scale's factors. */
    __device__ __forceinline__ float glu_value(const mmv_mats &m, int row0, int64_t e, int glu, int t,
                                               const float *sc) {
        const int rows = m.end[0];
        const bool eb = e < m.n_exp; /* the shared slot has none */
        const float bg = m.bias[0] && eb ? m.bias[0][e * rows + row0] : 0.0f;
        const float bu = m.bias[1] && eb ? m.bias[1][e * rows + row0] : 0.0f;
        const float g = warp_sum(v[0][t]) * sc[t] + bg, u = warp_sum(v[R - 1][t]) * sc[t] + bu;
        const float uu = glu == 3 ? (u > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : u < -GLU_OAI_LIMIT ? -GLU_OAI_LIMIT : u) + 1.0f
                                  : u;
        return glu_act(glu, g) * uu;
    }
    /* Only `writer` stores; per_block: output rows per block (the epilogue's grouping). */
    __device__ __forceinline__ void store(const mmv_mats &m, int row0, int lane, int accumulate, bool writer = true,
                                          int per_block = MMV_WARPS * R) {
        const int total = m.end[m.n - 1];
        float sc[N];
        pre_scale(m, lane, sc);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = row0 + r;
            const int mat = row < m.end[0] ? 0 : row < m.end[1] ? 1 : 2;
            const int start = mat == 0 ? 0 : mat == 1 ? m.end[0] : m.end[1];
            const int rows = (mat == 0 ? m.end[0] : mat == 1 ? m.end[1] : m.end[2]) - start;
            float *y = (mat == 0 ? m.y[0] : mat == 1 ? m.y[1] : m.y[2]) + (int64_t)blockIdx.y * N * rows;
            const float *b = mat == 0 ? m.b[0] : mat == 1 ? m.b[1] : m.b[2];
#pragma unroll
            for (int t = 0; t < N; t++) {
                const float s = warp_sum(v[r][t]) * sc[t];
                if (lane == 0 && writer && row < total) {
                    float *o = y + (int64_t)t * rows + (row - start);
                    /* the bias joins the product before the residual add: o + (W x + b) */
                    const float sb = b ? s + b[row - start] : s;
                    *o = accumulate ? *o + sb : sb;
                }
            }
        }
        if (m.epi.post_cnt) post_quantize(m, per_block);
        if (m.cmb.dst) combine(m, per_block);
    }
    /* cmb.dst (see mmv_mats): the block that completes a token's group of 32 rows over
     * every live slot sums the slots for the group (a lane a row) and, with post_xq,
     * prepares the next norm's input from its own sums: one count and one reload from L2
     * after the product (a count per block's rows, then one per group, cost the decode step
     * ~6.7 us a MoE layer on the H200). per_block divides 32 (rows % 32 == 0). */
    __device__ __forceinline__ void combine(const mmv_mats &m, int per_block) {
        /* sl: slots a token, the k experts' and the shared one (id_k) */
        const int rows = m.end[0], k = m.cmb.k, sl = k + (m.id_k ? 1 : 0), r = blockIdx.y / sl,
                  grp = blockIdx.x * per_block / 32;
        const int32_t *id = m.cmb.ids + (int64_t)r * k;
        __shared__ int last;
        if (m.cmb.post_w && threadIdx.y == 0) l2_prefetch(m.cmb.post_w + grp * 32, 128); /* the last block's */
        if (threadIdx.x == 0) __threadfence(); /* lane 0 stored y: visible before the count */
        __syncthreads();
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            int live = m.id_k ? 1 : 0;
            for (int j = 0; j < k; j++) live += id[j] >= 0 && id[j] < m.n_exp;
            unsigned *cn = m.cmb.cnt + (int64_t)r * (rows / 32) + grp;
            last = atomicAdd(cn, 1u) == (unsigned)(live * (32 / per_block) - 1);
            if (last) *cn = 0u; /* every block of every live slot has counted */
        }
        __syncthreads();
        if (!last || threadIdx.y != 0) return;
        __threadfence();
        /* other blocks' outputs: from L2 */
        combine_group(m, r, grp, [&](int64_t p, int row) { return __ldcg(m.y[0] + p * rows + row); });
    }
    /* epi.post_cnt: the block that completes a group of 32 output rows (counted in
     * epi.post_cnt, which it resets) quantizes post_w * y (y alone without post_w) over the
     * group, as cuda_mmv_quantize would, and stores the group's sum of squares of y when
     * post_ss is given: the next product's input prepared without a launch. One output
     * matrix (GLU: its one output), rows % 32 == 0, so every warp of every block is live
     * here. per_block: output rows per block. */
    __device__ __forceinline__ void post_quantize(const mmv_mats &m, int per_block) {
        const int rows = m.end[0], grp = blockIdx.x * per_block / 32;
        /* expert mode: chunk c's counters, y rows and int8 rows (post_ss unused) */
        const int64_t c = m.eid ? blockIdx.y : 0;
        unsigned *cnt = m.epi.post_cnt + c * (rows / 32);
        __shared__ int last;
        if (m.epi.post_w && threadIdx.y == 0) l2_prefetch(m.epi.post_w + grp * 32, 128); /* the last block's */
        if (threadIdx.x == 0) __threadfence(); /* lane 0 stored y: visible before the count */
        __syncthreads();
        if (threadIdx.x == 0 && threadIdx.y == 0)
            last = atomicAdd(&cnt[grp], 1u) == (unsigned)(32 / per_block - 1);
        __syncthreads();
        if (!last || threadIdx.y != 0) return;
        __threadfence();
        const int lane = threadIdx.x, row = grp * 32 + lane;
        const float w = m.epi.post_w ? m.epi.post_w[row] : 1.0f;
#pragma unroll
        for (int t = 0; t < N; t++) {
            const int64_t o = (c * N + t) * rows + row;
            const float y = __ldcg(m.y[0] + o); /* other blocks' stores: from L2 */
            post_prep(y, w, m.epi.post_xq, (float2 *)m.epi.post_xd, o,
                      m.epi.post_ss ? m.epi.post_ss + (int64_t)t * (rows / 32) + grp : NULL);
        }
        if (lane == 0) cnt[grp] = 0;
    }
};

/* One token's expert products and their weighted sum in one launch, with no count between
 * blocks (cmb set, one row a chunk, chunks (token, slot) in slot order; rows % 32 == 0):
 * block (g, t) holds group g of 32 output rows of token t for every slot. Its warps take the
 * items w, w + MMV_SUM_WARPS, ... of (slot, I::ROWS rows); I::run computes an item's rows
 * as the type's plain kernel would store them (the same bits) into shared memory, and one
 * warp sums the slots there as the combining epilogue's last block does (combine_group).
 * Where the plain kernel and the epilogue run rows / 32 x k blocks (and more), each fencing
 * and counting before the group's last one sums from L2, this runs rows / 32 blocks a
 * token and a barrier. H100, 2026-12-06 (test_cuda_mmv SMELT_BENCH_ID, the down launch in a
 * graph): Qwen3-30B-A3B 10.2 -> 6.7-7.0 us, gpt-oss-20b 18.1 -> 14.2 (the MXFP4 and Q6_K
 * items spill 32-44 bytes under the 64-register cap of 1,024 threads; the Q6_K down still
 * went 10.7 -> 8.1-8.7 us); tg128 387 -> 408 and 418 -> 435 tok/s. */
#define MMV_SUM_WARPS 32
template <class I>
static __device__ __forceinline__ void mmv_sum_body(const mmv_mats &m, const int8_t *xq, const float2 *xds, int k) {
    if (m.cmb.post_w && threadIdx.y == 0) l2_prefetch(m.cmb.post_w + blockIdx.x * 32, 128); /* read at the end */
    mmv_id_enter(m);
    bool waited = !m.id_early;
    constexpr int per = 32 / I::ROWS; /* items a slot */
    static_assert(per * I::ROWS == 32, "an item's rows divide the group");
    const int sl = m.cmb.k + (m.id_k ? 1 : 0), t = blockIdx.y, grp = blockIdx.x;
    __shared__ float ys[33][32]; /* a slot's 32 rows: k <= 32 slots and the shared one */
    for (int it = threadIdx.y; it < sl * per; it += MMV_SUM_WARPS) {
        const int j = it / per, r0 = (it % per) * I::ROWS;
        const int64_t c = (int64_t)t * sl + j, e = mmv_expert_at(m, c);
        if (!mmv_expert_live(m, e)) continue; /* a bad id: skipped */
        I::run(m, grp * 32 + r0, e, xq + c * k, xds + c * (k / 16), k, waited, &ys[j][r0]);
    }
    if (!waited) pdl_wait(); /* the weights and dst come from kernels before this one */
    __syncthreads();
    if (threadIdx.y != 0) return;
    const int64_t base = (int64_t)t * sl;
    combine_group(m, t, grp, [&](int64_t p, int) { return ys[p - base][threadIdx.x]; });
}
/* One token's GLU expert products with h's int8 form written in the block (post_cnt's
 * epilogue without its count; one row a chunk, rows % 32 == 0): block (g, c) holds group g
 * of 32 rows of chunk c, warp w its rows w, w + W, ...; I::run computes a row's act(gate) *
 * up as the type's plain kernel stores it (store_glu: the same bits), and after a barrier
 * one warp writes the group's h and its int8 form as post_quantize does: no fence, count or
 * reload from L2 (Q4_K and MXFP4 experts' gate/up at one row, the default since 2026-12-06:
 * Qwen3-30B-A3B tg128 405 -> 431 tok/s, gpt-oss-20b 436 -> 486 on an H100). */
template <class I, int W>
static __device__ __forceinline__ void mmv_glu_q_body(const mmv_mats &m, const int8_t *xq, const float2 *xds, int k,
                                                      int glu) {
    if (!mmv_id_live(m)) return; /* the PDL trigger, and the wait unless id_early */
    const int rows = m.end[0], grp = blockIdx.x;
    const int64_t c = blockIdx.y, e = mmv_expert(m);
    xq = mmv_id_x<1>(m, xq, k);
    xds = mmv_id_x<1>(m, xds, k / 16);
    __shared__ float ys[32];
    bool waited = !m.id_early;
    for (int r = threadIdx.y; r < 32; r += W) {
        const float v = I::run(m, grp * 32 + r, e, xq, xds, k, glu, waited);
        if (threadIdx.x == 0) ys[r] = v;
    }
    if (!waited) pdl_wait();
    __syncthreads();
    if (threadIdx.y != 0) return;
    const int row = grp * 32 + threadIdx.x;
    const int64_t o = c * rows + row;
    const float y = ys[threadIdx.x];
    m.y[0][o] = y;
    post_prep(y, m.epi.post_w ? m.epi.post_w[row] : 1.0f, m.epi.post_xq, (float2 *)m.epi.post_xd, o, NULL);
}
/* An mmv_glu_q_body item's value: row `row`'s gate and up (R = 2) of expert e summed by
 * rows(acc, rr) as the type's plain kernel sums them, then store_glu's arithmetic. */
template <class F>
static __device__ __forceinline__ float glu_row(const mmv_mats &m, int row, int64_t e, int glu, F rows) {
    mmv_acc<1, 2> acc;
    acc.zero();
    const mrow_ref rr[2] = {mref<1>(m, row, 0, e), mref<1>(m, row, 1, e)};
    rows(acc, rr);
    float sc[1];
    acc.pre_scale(m, threadIdx.x, sc);
    return acc.glu_value(m, row, e, glu, 0, sc);
}
static inline dim3 mmv_glu_q_grid(const mmv_mats &m, int rows) {
    return dim3((unsigned)(rows / 32), (unsigned)m.n_chunks);
}
/* An mmv_glu_q_body launch, k32 / k16 its kernel at 32 / 16 warps a block (both held to 64
 * registers a thread, so 1,024 threads is one block an SM, 512 two): 32 warps where the grid
 * fits the SMs at one block each, else 16,
 * as measured (H100, 2026-12-06, test_cuda_mmv SMELT_BENCH_ID=2, the decode pair in a graph,
 * us; 32 / 16 warps): Qwen3.5-35B-A3B's 16 x 8 blocks 13.8 / 15.3, Qwen3-30B-A3B's 24 x 8
 * 19.6 / 17.8, gpt-oss-20b's 90 x 4 40.2 / 39.2 (variant 1 with the counted epilogue: 16.2,
 * 20.1, 47.1). */
static inline cudaError_t mmv_glu_q_launch(struct cuda_ctx *ctx, const mmv_mats &m, int rows,
                                           void (*k32)(mmv_mats, const int8_t *, const float2 *, int, int),
                                           void (*k16)(mmv_mats, const int8_t *, const float2 *, int, int),
                                           const int8_t *xq, const float2 *xd, int k, int glu) {
    const dim3 g = mmv_glu_q_grid(m, rows);
    if (ctx->n_sm > 0 && (int64_t)g.x * g.y <= ctx->n_sm) return klaunch(k32, g, dim3(32, 32), 0, ctx, m, xq, xd, k, glu);
    return klaunch(k16, g, dim3(32, 16), 0, ctx, m, xq, xd, k, glu);
}
static inline dim3 mmv_sum_grid(const mmv_mats &m, int rows) {
    return dim3((unsigned)(rows / 32), (unsigned)(m.n_chunks / (m.cmb.k + (m.id_k ? 1 : 0))));
}

/* The one-token launch shapes that tuning runs number (cuda_ctx.mmv_variant, mmv_id_variant;
 * tests/unit/test_cuda_mmv.c, SMELT_MMV_ID_VARIANT): R rows a warp (a GLU warp: one row's
 * gate and up), U units in flight, KS warps splitting k. mmv_with_shape(v, f) returns
 * f(mmv_shape<R, U, KS>{}) for variant v: 1 R2 U1, 2 R1 U2, 3 R2 U2, 4 R2 U3, 5 R4 U1,
 * 6 R2 U4, 7-9 split-K R2 U2 / R2 U1 / R1 U2, anything else split-K R4 U1. */
template <int R_, int U_, int KS_ = 1> struct mmv_shape {
    static constexpr int R = R_, U = U_, KS = KS_;
};
template <class F> static cudaError_t mmv_with_shape(int v, F &&f) {
    switch (v) {
    case 1: return f(mmv_shape<2, 1>{});
    case 2: return f(mmv_shape<1, 2>{});
    case 3: return f(mmv_shape<2, 2>{});
    case 4: return f(mmv_shape<2, 3>{});
    case 5: return f(mmv_shape<4, 1>{});
    case 6: return f(mmv_shape<2, 4>{});
    case 7: return f(mmv_shape<2, 2, MMV_WARPS>{});
    case 8: return f(mmv_shape<2, 1, MMV_WARPS>{});
    case 9: return f(mmv_shape<1, 2, MMV_WARPS>{});
    default: return f(mmv_shape<4, 1, MMV_WARPS>{});
    }
}
/* The grid of such a launch: a block is MMV_WARPS warps of R rows (GLU: one), or with split-K
 * one warp's rows; block row y is chunk y in expert mode. */
static inline dim3 mmv_grid(const mmv_mats &m, int rows, int glu, int r, int ks) {
    const int per_block = (ks > 1 ? 1 : MMV_WARPS) * (glu ? 1 : r);
    return dim3((unsigned)((rows + per_block - 1) / per_block), m.eid ? m.n_chunks : 1);
}

/* ---- cuda_mmv_tq.cu: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4, Q2_K, Q3_K, Q5_K ---- */

/* Whether those kernels handle type with row length k. */
extern "C" int cuda_mmv_tq_supported(uint32_t type, int64_t k);
/* cuda_qweight_upload's part for those types: allocates w's arrays and enqueues the repack
 * of the nblk GGUF blocks at tmp (device). */
extern "C" cudaError_t cuda_mmv_tq_upload(struct cuda_qweight *w, uint32_t type, const void *tmp, int64_t nblk,
                                          cudaStream_t st);
/* launch_g's part for those types: n token rows (1..8), glu as launch_g's GLU. */
extern "C" cudaError_t cuda_mmv_tq_launch(int n, int glu, uint32_t type, dim3 grid, dim3 block, struct cuda_ctx *ctx,
                                          const struct mmv_mats &m, const int8_t *xq, const float2 *xd, int k,
                                          int acc);
extern "C" cudaError_t cuda_mmv_tq_variant(int v, int glu, uint32_t type, int rows, struct cuda_ctx *ctx,
                                           const struct mmv_mats &m, const int8_t *xq, const float2 *xd, int k,
                                           int acc);

#endif
