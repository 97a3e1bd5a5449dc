/* Attention over the paged KV cache: q (d, n_head, n_tokens) F32 against each row's
 * sequence in the caches (d, block_size, n_kv, n_blocks) of F16, BF16 or F32, out
 * (d, n_head, n_tokens) F32. CPU twin: src/backend/cpu/cpu_ops_attn.c. Every launch
 * configuration depends on the step's shape only (rows, heads, sequences, block-table
 * width), never on positions, so a captured graph replays correctly.
 *
 * Three kernels; cuda_attn_plan picks one per call (docs/cuda-backend.md, "Attention"):
 *
 * - decode (GQA-grouped flash-decoding, CUDA cores): a block per (row, KV head, key
 *   split, query-head subset) scores its subset of the G = n_head / n_kv query heads of
 *   the group, so each K/V element is read from HBM once per row, not G times (subsets,
 *   while the grid is small, re-read it from L2: shorter serial chains per block). Keys
 *   stream through shared memory in
 *   stages of 8 KB of K + 8 KB of V (16-byte cp.async, double-buffered); scores,
 *   online softmax and P.V in f32. The key range is split across blocks to fill the GPU;
 *   the grid has the plan's (shape-only) split count, but a row uses only as many splits
 *   as its real length needs (>= dec_min_keys keys each), so a short row is one block per
 *   KV head whatever the table width. The last split block of a (row, KV head) to finish
 *   merges the partials (a counter per (row, KV head), as the mmv epilogue does): decode
 *   is one launch. It can also write the output's int8 form for the next product
 *   (cuda_attn_args.q_out). Used for decode batches, F32 caches, and the short row groups
 *   (<= PF_SHORT rows of one sequence) of a prefill batch.
 * - prefill (FlashAttention-2 style, tensor cores, F16/BF16 caches): a block per (tile
 *   of <= 64 consecutive rows of one sequence, query head, key split); 4 warps of 16
 *   rows. Q (converted to the cache type) and K/V tiles of BN keys sit in shared memory
 *   (K/V by cp.async from the paged cache, the V load overlapping S = Q K^T and the next
 *   K load overlapping O += P V); S and O accumulate in f32 registers via
 *   mma.sync.m16n8k16; the online softmax runs on the S fragments; causality, sliding
 *   window and soft-capping are applied per element from each row's own position; a warp
 *   skips K tiles that none of its rows can see. Tiles are built on the device per call
 *   (attn_tiles_kernel) since a batch mixes sequences and their boundaries are data.
 * - generic (the first kernel, CUDA cores): a block per (query head, row, key split).
 *   Kept for shapes the others do not cover (head_dim not 64/128/256, dk != dv, more
 *   than 16 query heads per KV head) and as the benchmark baseline.
 *
 * Keys past a row's position are never used, keys past every row's position are never
 * read, and smem slots of keys outside a range are zero-filled (a recycled block's stale
 * contents, even NaN bit patterns, cannot leak in through 0 * NaN).
 *
 * Every kernel is launched with klaunch (programmatic dependent launch on sm_90+) and
 * starts with pdl_wait(): q, positions, block tables, row lists and the caches are all
 * written by earlier kernels or copies of the step, so nothing is read before it, and none
 * of it goes through the read-only path (no __restrict__ const pointers, no __ldg). */
#include <limits.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_rope.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmv.h"
#include "quant/quant.h"
}

/* ------------------------------------------------------------------------------------
 * Shared device helpers
 * ------------------------------------------------------------------------------------ */

/* First visible key position for a query at pos. */
static __device__ __forceinline__ int first_key(int pos, int window) {
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

static __device__ __forceinline__ int warp_min_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ int warp_max_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte global -> shared copy; src_bytes < 16 zero-fills the rest (0: all zeros, src
 * not read). sm_80+. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
                 "l"(__cvta_generic_to_global(src)), "r"(src_bytes)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <typename T>
static __device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

/* One 16-byte chunk of cache elements -> floats (8 for F16/BF16, 4 for F32). */
template <typename T>
struct chunk_cvt;
template <>
struct chunk_cvt<__half> {
    static constexpr int N = 8;
    static __device__ __forceinline__ void run(const uint4 &u, float *f) {
        const __half2 *h = reinterpret_cast<const __half2 *>(&u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 x = __half22float2(h[i]);
            f[2 * i] = x.x;
            f[2 * i + 1] = x.y;
        }
    }
};
template <>
struct chunk_cvt<__nv_bfloat16> {
    static constexpr int N = 8;
    static __device__ __forceinline__ void run(const uint4 &u, float *f) {
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 x = __bfloat1622float2(h[i]);
            f[2 * i] = x.x;
            f[2 * i + 1] = x.y;
        }
    }
};
template <>
struct chunk_cvt<float> {
    static constexpr int N = 4;
    static __device__ __forceinline__ void run(const uint4 &u, float *f) {
        f[0] = __uint_as_float(u.x);
        f[1] = __uint_as_float(u.y);
        f[2] = __uint_as_float(u.z);
        f[3] = __uint_as_float(u.w);
    }
};

/* Two adjacent cache elements -> float2. */
template <typename T>
static __device__ __forceinline__ float2 load_pair(const T *p);
template <>
__device__ __forceinline__ float2 load_pair<__half>(const __half *p) {
    return __half22float2(*reinterpret_cast<const __half2 *>(p));
}
template <>
__device__ __forceinline__ float2 load_pair<__nv_bfloat16>(const __nv_bfloat16 *p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}
template <>
__device__ __forceinline__ float2 load_pair<float>(const float *p) {
    return *reinterpret_cast<const float2 *>(p);
}

/* ------------------------------------------------------------------------------------
 * Generic kernel (any head_dim <= 256, dk != dv): a block per (query head, row, split)
 * ------------------------------------------------------------------------------------
 * Grid (n_head, n_tokens, n_split); 4 warps per block. A block takes one query head of
 * one row and one contiguous slice of that row's visible keys; its warps take keys
 * round-robin. Each lane holds head_dim/32 elements of q and of the output accumulator;
 * a key costs one coalesced row read of K and V and one warp reduction. Softmax is online
 * (running max and sum per warp), merged across warps in shared memory, and across splits
 * by attn_merge_kernel. Prefill rows repeat the K/V reads per query head. */

#define GEN_WARPS 4
#define GEN_MAX_D 256
#define GEN_PER_LANE (GEN_MAX_D / 32)

template <typename T>
static __global__ void __launch_bounds__(GEN_WARPS * 32)
    attn_generic_kernel(const struct cuda_attn_args a, const T *kc, const T *vc, float *partial, int n_split) {
    pdl_wait(); /* every input is the step's data (cuda_common.cuh) */
    pdl_trigger();
    const int h = blockIdx.x, split = blockIdx.z;
    const int64_t t = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = h / (a.n_head / a.n_kv);
    const int pos = a.pos[t];
    const int j0 = first_key(pos, a.window);
    const int n_keys = pos - j0 + 1;
    const int chunk = (n_keys + n_split - 1) / n_split;
    const int k_begin = j0 + split * chunk;
    const int k_end = min(k_begin + chunk, pos + 1);
    const int32_t *table = a.blocks + (int64_t)a.seq[t] * a.max_blocks;

    float q[GEN_PER_LANE], o[GEN_PER_LANE];
    const float *qr = a.q + (t * a.n_head + h) * (int64_t)a.dk;
#pragma unroll
    for (int c = 0; c < GEN_PER_LANE; c++) {
        const int i = lane + 32 * c;
        q[c] = i < a.dk ? qr[i] * a.scale : 0.0f;
        o[c] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = k_begin + warp; j < k_end; j += GEN_WARPS) {
        const int64_t blk = table[j / a.block_size], off = j % a.block_size;
        const int64_t base = (blk * a.n_kv + g) * a.block_size + off;
        const T *kr = kc + base * a.dk;
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < GEN_PER_LANE; c++) {
            const int i = lane + 32 * c;
            if (i < a.dk) s += q[c] * to_f32<T>(kr[i]);
        }
        s = warp_sum(s);
        if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        const T *vr = vc + base * a.dv;
#pragma unroll
        for (int c = 0; c < GEN_PER_LANE; c++) {
            const int i = lane + 32 * c;
            o[c] = o[c] * corr + (i < a.dv ? p * to_f32<T>(vr[i]) : 0.0f);
        }
        m = m_new;
    }
    /* merge the warps */
    __shared__ float sm[GEN_WARPS], sl[GEN_WARPS], so[GEN_WARPS][GEN_MAX_D];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < GEN_PER_LANE; c++) {
        const int i = lane + 32 * c;
        if (i < a.dv) so[warp][i] = o[c];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < GEN_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f, f[GEN_WARPS];
    for (int w = 0; w < GEN_WARPS; w++) {
        f[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);
        L += sl[w] * f[w];
    }
    if (n_split == 1) {
        if (a.sinks && M != -INFINITY) L += expf(a.sinks[h] - M); /* the sink's share */
        float *dr = a.dst + (t * a.n_head + h) * (int64_t)a.dv;
        for (int i = threadIdx.x; i < a.dv; i += blockDim.x) {
            float acc = 0.0f;
            for (int w = 0; w < GEN_WARPS; w++) acc += so[w][i] * f[w];
            dr[i] = acc / L;
        }
    } else {
        float *pr = partial + ((t * a.n_head + h) * n_split + split) * (int64_t)(a.dv + 2);
        if (threadIdx.x == 0) {
            pr[0] = M;
            pr[1] = L;
        }
        for (int i = threadIdx.x; i < a.dv; i += blockDim.x) {
            float acc = 0.0f;
            for (int w = 0; w < GEN_WARPS; w++) acc += so[w][i] * f[w];
            pr[2 + i] = acc;
        }
    }
}

/* ------------------------------------------------------------------------------------
 * Decode kernel: a block per (row, KV head, key split), all G query heads of the group
 * ------------------------------------------------------------------------------------
 * Per stage of NK keys (8 KB of K and 8 KB of V in shared memory, next stage loading):
 *   A. scores: thread (key j = tid / P, part = tid % P) dots 4 chunks of 16 bytes of K
 *      row j with the G scaled queries (f32, in smem), then the P parts of a key reduce
 *      with shuffles (they are adjacent lanes). Chunk c of a row goes to the part with
 *      c = part * (8/P) + i%(8/P) + 8*(i/(8/P)) (P < 8) or part + P*i (P >= 8), and rows
 *      are padded by 16 bytes: the 8 lanes of each 16-byte shared-memory phase then hit
 *      8 different bank groups.
 *   B. online softmax: a warp per query head updates its running max m and sum l, turns
 *      the stage's scores into probabilities and leaves the rescale factor for C.
 *   C. O += P V: thread owns the output pair d = 2 * (tid % (D/2)) for the heads
 *      h = tid / (D/2) + HG * k; V pairs are read as 4 (or 8) consecutive bytes per lane.
 * Probabilities stay f32 (unlike the prefill kernel's f16/bf16 P). */

/* The fused RoPE prologue's shared floats: cos/sin per pair (D), the new K and V rows (2D),
 * the per-head RMSNorm factors (GMAX query heads + K, padded to keep 16-byte alignment). */
#define DEC_ROPE_FLOATS(D, GMAX) (3 * (D) + (GMAX) + 4)

/* TH threads per block: 128, or 256 where the grid has fewer blocks than the GPU has SMs
 * (short contexts, few KV heads): a block's phases are serial chains of dependent
 * instructions there, and twice the threads halve each thread's share of them. */
template <typename T, int D, int TH>
struct dec_cfg {
    static constexpr int CE = 16 / (int)sizeof(T);             /* elements per 16-byte chunk */
    static constexpr int NC = D / CE;                           /* chunks per cache row */
    static constexpr int NK = 8192 / (D * (int)sizeof(T));      /* keys per stage */
    static constexpr int P = TH / NK;                           /* threads per key in A */
    static constexpr int CPT = NC / P;                          /* chunks per scoring thread */
    static constexpr int LD = D + CE;                           /* smem row stride, elements */
    static constexpr int HG = TH / (D / 2);                     /* head groups in C */
    static_assert(CPT == 4 || CPT == 2, "each scoring thread takes 4 (128 threads) or 2 chunks");
    static_assert(P <= 32 && (32 % P) == 0, "a key's threads share a warp");
};

template <typename T, int D, int GMAX>
static constexpr size_t dec_smem_bytes() {
    using C = dec_cfg<T, D, 128>; /* NK and LD do not depend on the threads */
    return (size_t)(GMAX * D + GMAX * C::NK + 3 * GMAX + DEC_ROPE_FLOATS(D, GMAX)) * sizeof(float) +
           (size_t)4 * C::NK * C::LD * sizeof(T);
}

/* Chunk index of scoring part `part`'s i-th chunk (see the comment above). */
template <int P>
static __device__ __forceinline__ int dec_chunk(int part, int i) {
    if (P >= 8) return part + P * i;
    constexpr int S = P >= 8 ? 1 : 8 / P;
    return part * S + (i % S) + 8 * (i / S);
}

/* K and V rows [kb, kb + NK) of a stage into dst ([K, V][NK][LD]); keys >= ke zeroed; key
 * `skip` (the new key, which the block writes itself; -1: none) is left alone. The caches
 * and the table are written by earlier kernels / copies of the step: plain pointers
 * (cp.async.cg reads through L2; see cuda_common.cuh on the read-only path). */
template <typename T, int D, int TH>
static __device__ __forceinline__ void dec_load(T *dst, const T *kc, const T *vc, const int32_t *table, int kb,
                                                int ke, int skip, int bs, int n_kv, int g, int tid) {
    using C = dec_cfg<T, D, TH>;
    constexpr int NK = C::NK, NC = C::NC, LD = C::LD, CE = C::CE;
    for (int idx = tid; idx < 2 * NK * NC; idx += TH) {
        const int which = idx / (NK * NC), rem = idx % (NK * NC);
        const int r = rem / NC, c = rem % NC, key = kb + r;
        if (key == skip) continue;
        const T *base = which ? vc : kc;
        const T *src = base;
        int bytes = 0;
        if (key < ke) {
            const int64_t blk = table[key / bs];
            const int off = key % bs;
            src = base + ((blk * n_kv + g) * bs + off) * D + c * CE;
            bytes = 16;
        }
        cp_async16(dst + (size_t)which * NK * LD + r * LD + c * CE, src, bytes);
    }
}

/* Split counters of the decode kernel (attn_cnt, the launch context's): one per (row slot,
 * KV head, query-head subset) of a call with more than one split, zero between calls (the
 * block that merges a row resets its counter), so one call at a time per context. ATTN_CNT
 * bounds slots x n_kv x n_sub of a split plan; the plan only splits while slots x n_kv < 4
 * blocks per SM, far below it, and takes subsets only while the whole grid is within one
 * block per SM. */
#define ATTN_CNT CUDA_ATTN_COUNTERS

/* The int8 form of the output (cuda_mmv_quantize's layout: xq int8 per value, xd {d, d *
 * sum} per 16 values), or both NULL. */
struct attn_qout {
    int8_t *xq;
    float2 *xd;
};

/* Stores the output pair (v0, v1) at element o (even) of dst and, when q.xq is set,
 * quantizes it as quantize_act_kernel (cuda_mmv.cu) does: the 16-value group of o is held
 * by 8 consecutive lanes (2 values each, an aligned group of 8), which all call this
 * together, so the same f32 values give the same bytes. Called by the whole warp
 * (full-mask shuffles). */
static __device__ __forceinline__ void dec_store(float *dst, const attn_qout &q, int64_t o, float v0, float v1) {
    *reinterpret_cast<float2 *>(dst + o) = make_float2(v0, v1);
    if (!q.xq) return;
    float amax = fmaxf(fabsf(v0), fabsf(v1));
#pragma unroll
    for (int m = 1; m < 8; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float d = amax / 127.0f;
    const int q0 = d > 0.0f ? __float2int_rn(v0 / d) : 0, q1 = d > 0.0f ? __float2int_rn(v1 / d) : 0;
    int s16 = q0 + q1;
#pragma unroll
    for (int m = 1; m < 8; m <<= 1) s16 += __shfl_xor_sync(0xffffffffu, s16, m);
    char2 c;
    c.x = (signed char)q0;
    c.y = (signed char)q1;
    *reinterpret_cast<char2 *>(q.xq + o) = c;
    if ((o & 15) == 0) q.xd[o / 16] = make_float2(d, d * (float)s16);
}

/* rows: NULL (row = slot, slots 0..n_tokens-1) or a list {count, row...} (a prefill
 * batch's short row groups). Grid (slots x n_kv x n_sub, n_split): blockIdx.x is (slot,
 * subset, KV head) from the outside in; a block takes query heads [sub x GS, + GS) of its
 * group (GS = ceil(G / n_sub), the last subset may be smaller) and, when the list holds
 * more rows than the grid has slots, moves on by gridDim.x / (n_kv x n_sub). Only subset
 * 0 stores the new K/V in the cache (fused RoPE); every subset rotates it for its own
 * stage. A row of n keys uses ns = min(n_split, ceil(n / min_keys))
 * splits (blocks of higher splits skip it): with one, the block writes the output itself;
 * otherwise each split writes its partial {m, l, o[GS][D]} (slot-indexed) and the last of
 * the ns blocks to count itself in attn_cnt (per row, KV head and subset) merges them,
 * writes the output and resets the counter. qo: the output's int8 form too (see dec_store), or all NULL. */
template <typename T, int D, int GMAX, int TH>
static __global__ void __launch_bounds__(TH)
    attn_decode_kernel(const struct cuda_attn_args a, const T *kc, const T *vc, const int *rows, float *partial,
                       int n_split, int min_keys, int n_sub, const attn_qout qo, unsigned *attn_cnt) {
    using C = dec_cfg<T, D, TH>;
    constexpr int NK = C::NK, P = C::P, LD = C::LD, CE = C::CE, HG = C::HG;
    constexpr int GPT = (GMAX + HG - 1) / HG; /* heads per thread in C */
    constexpr int MAXS = 64;       /* splits the merge handles (the plan's cap) */
    extern __shared__ __align__(16) unsigned char dsm[];
    float *sq = reinterpret_cast<float *>(dsm); /* (D, GMAX) scaled queries */
    float *ss = sq + GMAX * D;                  /* (NK, GMAX) scores -> probabilities */
    float *s_m = ss + GMAX * NK, *s_l = s_m + GMAX, *s_c = s_l + GMAX;
    float *s_cs = s_c + GMAX, *s_kn = s_cs + D, *s_vn = s_kn + D, *s_inv = s_vn + D; /* fused RoPE */
    T *skv = reinterpret_cast<T *>(s_c + GMAX + DEC_ROPE_FLOATS(D, GMAX)); /* [stage][K, V][NK][LD] */
    float *s_w = reinterpret_cast<float *>(skv); /* merge: (MAXS, GMAX) split weights, after the stages */
    static_assert((size_t)MAXS * GMAX * sizeof(float) <= (size_t)4 * NK * LD * sizeof(T), "merge weights fit");
    __shared__ int s_last;

    /* q, the row lists and (unfused) the new keys in the caches are written by earlier
     * kernels of the step: nothing is read before the previous kernel is done
     * (cuda_common.cuh). With RoPE fused (a decode step, no row list), the positions and
     * block tables (and slots) are the step's host-copied inputs, complete before its first
     * kernel ran, the RoPE table was made by a kernel launched without PDL after it
     * (cuda_ctx.pdl_fence), and the only cache slot this step writes is each row's new key,
     * which this kernel substitutes from shared memory and never copies: the first stage's
     * loads and the RoPE angles go out before the wait, overlapping the previous kernel's
     * tail. Block (slot 0, split 0) always waits, so the
     * grid completes after its predecessor. */
    bool waited = !(a.rope.freq != NULL && rows == NULL);
    if (waited) pdl_wait();
    pdl_trigger();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* the block's query heads: subset `sub` of KV head g's group, [h0, h0 + Gb) */
    const int G = a.n_head / a.n_kv, GS = (G + n_sub - 1) / n_sub;
    const int g = blockIdx.x % a.n_kv, sub = blockIdx.x / a.n_kv % n_sub, split = blockIdx.y;
    const int h0 = sub * GS, Gb = min(GS, G - h0); /* >= 1: the plan makes n_sub = ceil(G / GS) */
    const int per_slot = a.n_kv * n_sub, n_slots = gridDim.x / per_slot;
    const int count = rows ? rows[0] : (int)a.n_tokens;
    const int dp = tid % (D / 2), hg = tid / (D / 2); /* phase C ownership; hg is warp-uniform */
    /* Phase C with few heads (2 Gb <= HG): the HG head groups become KP key parts of HQ
     * head slots each (HQ the power of two >= Gb); the parts' sums meet at the end. */
    int HQ = 1;
    while (HQ < Gb) HQ <<= 1;
    const int KP = 2 * Gb <= HG ? HG / HQ : 1;
    const int kpart = KP > 1 ? hg / HQ : 0;
    /* the block-local head of thread's k-th output pair, or -1 */
    auto head_of = [&](int k) -> int {
        if (KP > 1) return k == 0 && hg % HQ < Gb ? hg % HQ : -1;
        const int h = hg + HG * k;
        return h < Gb ? h : -1;
    };

    if (a.q_norm) l2_prefetch(a.q_norm, D * sizeof(float)); /* weights, read after the heads' sums */
    if (a.k_norm) l2_prefetch(a.k_norm, D * sizeof(float));
    for (int slot = blockIdx.x / per_slot; slot < count; slot += n_slots) {
        const int64_t t = rows ? rows[1 + slot] : slot;
        const int pos = a.pos[t];
        const int seq = a.seq[t]; /* loaded with pos: the table's address waits on both */
        const int j0 = first_key(pos, a.window);
        const int n_keys = pos - j0 + 1;
        const int ns = n_split > 1 ? min(n_split, max(1, (n_keys + min_keys - 1) / min_keys)) : 1;
        if (split >= ns) continue; /* block-uniform: this row needs fewer splits */
        const int chunk = (n_keys + ns - 1) / ns;
        const int kb0 = j0 + split * chunk;          /* this split's keys: [kb0, ke) */
        const int ke = min(kb0 + chunk, pos + 1);
        const int n_st = ke > kb0 ? (ke - kb0 + NK - 1) / NK : 0;
        const int32_t *table = a.blocks + (int64_t)seq * a.max_blocks;
        const bool fused = a.rope.freq != NULL;
        const bool owner = fused && kb0 <= pos && pos < ke; /* this split holds the new key */
        const int64_t new_slot = owner ? a.slot[t] : 0;     /* a host input: read early */
        const int skip = owner ? pos : -1; /* the new key's stage row: written from smem */

        /* the first stage's copies go out before q is read: q's load latency overlaps them */
        const int bs = a.block_size, n_kv = a.n_kv;
        if (n_st > 0) dec_load<T, D, TH>(skv, kc, vc, table, kb0, ke, skip, bs, n_kv, g, tid);
        cp_async_commit();
        const int half = a.rope.n_rot / 2;
        if (fused) /* RoPE's cos/sin: from the position and the step's constant table */
            for (int i = tid; i < half; i += TH) {
                const float2 cs = rope_cs(a.rope, (double)pos, i);
                s_cs[i] = cs.x;
                s_cs[half + i] = cs.y;
            }
        if (!waited) {
            pdl_wait();
            waited = true;
        }
        const float *qg = a.q + (t * a.n_head + (int64_t)g * G + h0) * D; /* the block's Gb heads */
        if (!fused) {
            for (int i = tid; i < Gb * D; i += TH) sq[i] = qg[i] * a.scale;
        } else {
            /* RMSNorm and RoPE of the raw query heads (and, in the owner, K head g) in
             * shared memory, as rope_kv_kernel would do them in place */
            const int nh = Gb + (owner ? 1 : 0); /* head Gb = the new K row */
            const bool norms = a.q_norm || a.k_norm;
            for (int i = tid; i < Gb * D; i += TH) sq[i] = qg[i];
            if (owner) {
                const int64_t o = (t * a.n_kv + g) * (int64_t)D;
                for (int i = tid; i < D; i += TH) {
                    s_kn[i] = a.k_new[o + i];
                    s_vn[i] = a.v_new[o + i];
                }
            }
            __syncthreads();
            if (norms) { /* block-uniform */
                for (int h = warp; h < nh; h += TH / 32) {
                    const float *x = h < Gb ? sq + h * D : s_kn;
                    const float *w = h < Gb ? a.q_norm : a.k_norm;
                    float sum = 0.0f;
                    if (w)
                        for (int i = lane; i < D; i += 32) sum += x[i] * x[i];
                    sum = warp_sum(sum);
                    if (lane == 0) s_inv[h] = w ? rsqrtf(sum / (float)D + a.norm_eps) : 1.0f;
                }
                __syncthreads();
            }
            for (int idx = tid; idx < nh * (D / 2); idx += TH) {
                const int h = idx / (D / 2), i = idx % (D / 2);
                float *x = h < Gb ? sq + h * D : s_kn;
                const float *w = h < Gb ? a.q_norm : a.k_norm;
                const float inv = norms ? s_inv[h] : 1.0f, sc = h < Gb ? a.scale : 1.0f;
                /* pairs below n_rot rotate; the elements above it pass through */
                const int2 e = i < half ? rope_pair(a.rope.mode, half, i)
                                        : make_int2(a.rope.n_rot + 2 * (i - half), a.rope.n_rot + 2 * (i - half) + 1);
                const float x0 = x[e.x] * inv * (w ? w[e.x] : 1.0f), x1 = x[e.y] * inv * (w ? w[e.y] : 1.0f);
                if (i < half) {
                    const float c = s_cs[i], sn = s_cs[half + i];
                    x[e.x] = (x0 * c - x1 * sn) * sc;
                    x[e.y] = (x0 * sn + x1 * c) * sc;
                } else {
                    x[e.x] = x0 * sc;
                    x[e.y] = x1 * sc;
                }
            }
        }
        if (tid < GMAX) {
            s_m[tid] = -INFINITY;
            s_l[tid] = 0.0f;
        }
        float o[GPT][2];
#pragma unroll
        for (int k = 0; k < GPT; k++) o[k][0] = o[k][1] = 0.0f;
        __syncthreads(); /* sq, s_m, s_l; the rotated new K in s_kn */
        if (owner && sub == 0) { /* the new K and V into the cache, for later steps (this block reads s_kn) */
            const int64_t blk = new_slot / bs, off = new_slot % bs;
            T *kd = (T *)kc + ((blk * n_kv + g) * bs + off) * D, *vd = (T *)vc + ((blk * n_kv + g) * bs + off) * D;
            for (int i = tid; i < D; i += TH) {
                kd[i] = from_f32<T>(s_kn[i]);
                vd[i] = from_f32<T>(s_vn[i]);
            }
        }

        for (int it = 0; it < n_st; it++) {
            const int st = it & 1, kb = kb0 + it * NK;
            if (it + 1 < n_st)
                dec_load<T, D, TH>(skv + (size_t)(st ^ 1) * 2 * NK * LD, kc, vc, table, kb + NK, ke, skip, bs, n_kv, g, tid);
            cp_async_commit();
            if (owner && pos - kb < NK) { /* the new key's row (not copied: see skip) from s_kn / s_vn */
                T *nk = skv + (size_t)st * 2 * NK * LD + (pos - kb) * LD;
                for (int i = tid; i < D; i += TH) {
                    nk[i] = from_f32<T>(s_kn[i]);
                    nk[NK * LD + i] = from_f32<T>(s_vn[i]);
                }
            }
            cp_async_wait<1>(); /* this stage's group is complete */
            __syncthreads();
            const T *sk = skv + (size_t)st * 2 * NK * LD, *sv = sk + NK * LD;
            const int nj = min(NK, ke - kb); /* the stage's keys; the rest score -inf */

            { /* A: scores */
                const int j = tid / P, part = tid % P;
                float acc[GMAX];
#pragma unroll
                for (int h = 0; h < GMAX; h++) acc[h] = 0.0f;
#pragma unroll
                for (int i = 0; i < C::CPT; i++) {
                    const int c = dec_chunk<P>(part, i);
                    float kf[CE];
                    chunk_cvt<T>::run(*reinterpret_cast<const uint4 *>(sk + j * LD + c * CE), kf);
#pragma unroll
                    for (int h = 0; h < GMAX; h++) {
                        if (h < Gb) {
                            const float4 *qp = reinterpret_cast<const float4 *>(sq + h * D + c * CE);
#pragma unroll
                            for (int e = 0; e < CE / 4; e++) {
                                const float4 qq = qp[e];
                                acc[h] += qq.x * kf[4 * e] + qq.y * kf[4 * e + 1] + qq.z * kf[4 * e + 2] +
                                          qq.w * kf[4 * e + 3];
                            }
                        }
                    }
                }
#pragma unroll
                for (int off = 1; off < P; off <<= 1)
#pragma unroll
                    for (int h = 0; h < GMAX; h++) acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], off);
                const bool vis = kb + j < ke; /* kb + j >= kb0 >= j0 always */
#pragma unroll
                for (int h = 0; h < GMAX; h++) {
                    if (h < Gb && h % P == part) {
                        float s = acc[h];
                        if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
                        ss[h * NK + j] = vis ? s : -INFINITY;
                    }
                }
            }
            __syncthreads();
            /* B: online softmax, a warp per head */
            for (int h = warp; h < Gb; h += TH / 32) {
                const float x0 = lane < NK ? ss[h * NK + lane] : -INFINITY;
                const float x1 = lane + 32 < NK ? ss[h * NK + lane + 32] : -INFINITY;
                const float mx = warp_max(fmaxf(x0, x1));
                const float m_old = s_m[h], m_new = fmaxf(m_old, mx);
                const float mu = m_new == -INFINITY ? 0.0f : m_new;
                const float p0 = __expf(x0 - mu), p1 = __expf(x1 - mu);
                if (lane < NK) ss[h * NK + lane] = p0;
                if (lane + 32 < NK) ss[h * NK + lane + 32] = p1;
                const float sum = warp_sum(p0 + p1);
                __syncwarp(); /* every lane has read s_m[h] before lane 0 writes it */
                if (lane == 0) {
                    const float c = __expf(m_old - mu);
                    s_c[h] = c;
                    s_l[h] = s_l[h] * c + sum;
                    s_m[h] = m_new;
                }
            }
            __syncthreads();
            /* C: O += P V */
#pragma unroll
            for (int k = 0; k < GPT; k++) {
                const int h = head_of(k);
                if (h >= 0) {
                    const float c = s_c[h];
                    o[k][0] *= c;
                    o[k][1] *= c;
                }
            }
            /* Two loops, not one with a stride of KP: the shared loop (runtime stride, head_of
             * per key) cost the 0.5B shape @64 / 128 keys 3.89 / 5.80 -> 4.52 / 6.50 us and
             * tg128 1,524 -> 1,471 tok/s (H200, 2026-12-02). */
            if (KP > 1) { /* one head, every KP-th key */
                const int h = head_of(0);
                if (h >= 0) {
                    const float *ph = ss + h * NK;
#pragma unroll 4
                    for (int j = kpart; j < nj; j += KP) {
                        const float2 v = load_pair<T>(sv + j * LD + 2 * dp);
                        const float p = ph[j];
                        o[0][0] += p * v.x;
                        o[0][1] += p * v.y;
                    }
                }
            } else {
#pragma unroll 4
                for (int j = 0; j < nj; j++) {
                    const float2 v = load_pair<T>(sv + j * LD + 2 * dp);
#pragma unroll
                    for (int k = 0; k < GPT; k++) {
                        const int h = hg + HG * k;
                        if (h < Gb) {
                            const float p = ss[h * NK + j];
                            o[k][0] += p * v.x;
                            o[k][1] += p * v.y;
                        }
                    }
                }
            }
            __syncthreads(); /* the stage's buffers and ss are reused */
        }
        /* no cp.async group is pending here: the last stage waited for all but an empty one */
        if (KP > 1) { /* the key parts' sums, through the (now idle) stage buffers */
            float *red = reinterpret_cast<float *>(skv); /* (KP, HQ, D) */
            const int h = head_of(0);
            if (h >= 0 && kpart > 0)
                *reinterpret_cast<float2 *>(red + ((kpart * HQ + h) * D + 2 * dp)) = make_float2(o[0][0], o[0][1]);
            __syncthreads();
            if (h >= 0 && kpart == 0)
                for (int pp = 1; pp < KP; pp++) {
                    const float2 r = *reinterpret_cast<const float2 *>(red + ((pp * HQ + h) * D + 2 * dp));
                    o[0][0] += r.x;
                    o[0][1] += r.y;
                }
            __syncthreads(); /* red is the merge's s_w below */
        }

        const int64_t head0 = (int64_t)g * G + h0; /* the block's first head in the row */
        if (ns == 1) {
#pragma unroll
            for (int k = 0; k < GPT; k++) {
                const int h = kpart == 0 ? head_of(k) : -1;
                if (h >= 0) { /* warp-uniform */
                    const float m = s_m[h];
                    const float l = s_l[h] + (a.sinks && m != -INFINITY ? expf(a.sinks[head0 + h] - m) : 0.0f);
                    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
                    dec_store(a.dst, qo, (t * a.n_head + head0 + h) * D + 2 * dp, o[k][0] * inv, o[k][1] * inv);
                }
            }
        } else {
            /* partial[((slot * n_head + head) * n_split + split) * (D + 2)] = {m, l, o[D]} */
            const int64_t pbase = ((int64_t)slot * a.n_head + head0) * n_split;
#pragma unroll
            for (int k = 0; k < GPT; k++) {
                const int h = kpart == 0 ? head_of(k) : -1;
                if (h >= 0) {
                    float *pr = partial + (pbase + (int64_t)h * n_split + split) * (D + 2);
                    if (dp == 0) {
                        pr[0] = s_m[h];
                        pr[1] = s_l[h];
                    }
                    *reinterpret_cast<float2 *>(pr + 2 + 2 * dp) = make_float2(o[k][0], o[k][1]);
                }
            }
            unsigned *cnt = &attn_cnt[(slot * n_kv + g) * n_sub + sub];
            __threadfence(); /* this block's partials, before it counts itself */
            __syncthreads();
            if (tid == 0) s_last = atomicAdd(cnt, 1u) == (unsigned)(ns - 1);
            __syncthreads();
            if (s_last) {
                __threadfence();
                /* weights of the splits per head: exp(m_s - M) / L; other blocks' partials
                 * are read from L2 (__ldcg), never from this SM's L1 */
                for (int h = warp; h < Gb; h += TH / 32) {
                    const float *pb = partial + (pbase + (int64_t)h * n_split) * (D + 2);
                    const float m0 = lane < ns ? __ldcg(pb + lane * (D + 2)) : -INFINITY;
                    const float l0 = lane < ns ? __ldcg(pb + lane * (D + 2) + 1) : 0.0f;
                    const float m1 = lane + 32 < ns ? __ldcg(pb + (lane + 32) * (D + 2)) : -INFINITY;
                    const float l1 = lane + 32 < ns ? __ldcg(pb + (lane + 32) * (D + 2) + 1) : 0.0f;
                    const float M = warp_max(fmaxf(m0, m1));
                    const float e0 = m0 == -INFINITY ? 0.0f : expf(m0 - M);
                    const float e1 = m1 == -INFINITY ? 0.0f : expf(m1 - M);
                    const float L = warp_sum(l0 * e0 + l1 * e1) +
                                    (a.sinks && M != -INFINITY ? expf(a.sinks[head0 + h] - M) : 0.0f);
                    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
                    if (lane < ns) s_w[h * MAXS + lane] = e0 * inv;
                    if (lane + 32 < ns) s_w[h * MAXS + lane + 32] = e1 * inv;
                }
                __syncthreads();
#pragma unroll
                for (int k = 0; k < GPT; k++) {
                    const int h = hg + HG * k;
                    if (h < Gb) { /* warp-uniform */
                        const float *pb = partial + (pbase + (int64_t)h * n_split) * (D + 2) + 2 + 2 * dp;
                        float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll 8
                        for (int sp = 0; sp < ns; sp++) {
                            const float w = s_w[h * MAXS + sp];
                            const float2 v = __ldcg(reinterpret_cast<const float2 *>(pb + sp * (D + 2)));
                            acc0 += w * v.x;
                            acc1 += w * v.y;
                        }
                        dec_store(a.dst, qo, (t * a.n_head + head0 + h) * D + 2 * dp, acc0, acc1);
                    }
                }
                if (tid == 0) *cnt = 0; /* every split has counted: ready for the next call */
            }
        }
        __syncthreads(); /* s_m, s_l, sq, s_w and s_last are rewritten for the next slot */
    }
}

/* ------------------------------------------------------------------------------------
 * Prefill kernel: FlashAttention-2 on mma.sync.m16n8k16 (F16/BF16 in, f32 accumulate)
 * ------------------------------------------------------------------------------------
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
 * type"), with groupID = lane >> 2 and tig = lane % 4 ("threadID_in_group"):
 *   A (16x16, row-major, .f16/.bf16): four 32-bit registers a0a1, a2a3, a4a5, a6a7
 *       (elements low to high); row = groupID for a0,a1,a4,a5 and groupID + 8 for
 *       a2,a3,a6,a7; col = tig*2 + (i & 1) for a0..a3, tig*2 + (i & 1) + 8 for a4..a7.
 *   B (16x8, "col": element (k, n)): two registers b0b1, b2b3; row k = tig*2 + (i & 1)
 *       for b0,b1 and tig*2 + (i & 1) + 8 for b2,b3; col n = groupID.
 *   C/D (16x8, f32): c0..c3; row = groupID for c0,c1 and groupID + 8 for c2,c3;
 *       col = tig*2 + (i & 1).
 * ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "Warp-level matrix load
 * instruction: ldmatrix"): lanes 8i..8i+7 give the addresses of rows 0..7 of matrix i,
 * each row 16 contiguous bytes; register i of a lane receives matrix i's elements
 * (row groupID, cols 2*tig, 2*tig+1), or with .trans (rows 2*tig, 2*tig+1, col groupID).
 *
 * Uses in this kernel (sQ, sK, sV row-major [row][d] in smem, rows padded by 16 bytes so
 * the 8 rows of an 8x8 ldmatrix land in 8 different bank groups):
 *   Q as A (rows x d): matrices {rows 0-7, d 0-7}, {rows 8-15, d 0-7}, {rows 0-7, d 8-15},
 *       {rows 8-15, d 8-15} -> a0a1, a2a3, a4a5, a6a7: lane address row
 *       (lane & 7) + 8*((lane >> 3) & 1), col 8*(lane >> 4).
 *   K as B of S = Q K^T (k = d, n = key; element (d, key) = K[key][d], so b0b1 =
 *       K[key groupID][d 2tig..2tig+1]: the plain layout): matrices {keys 0-7, d 0-7},
 *       {keys 0-7, d 8-15}, {keys 8-15, d 0-7}, {keys 8-15, d 8-15} -> b0b1 and b2b3 of
 *       n-tile 0, then of n-tile 1: lane address key (lane & 7) + 8*(lane >> 4), col
 *       8*((lane >> 3) & 1).
 *   V as B of O = P V (k = key, n = d; b0b1 = V[keys 2tig, 2tig+1][d groupID]: the
 *       .trans layout): matrices {keys 0-7, d 0-7}, {keys 8-15, d 0-7}, {keys 0-7, d 8-15},
 *       {keys 8-15, d 8-15} -> b0b1, b2b3 of d-tile 0, then of d-tile 1: lane address key
 *       (lane & 7) + 8*((lane >> 3) & 1), col 8*(lane >> 4).
 *   P as A of O = P V: the S accumulators of key n-tiles 2kc and 2kc+1 are, element for
 *       element, the A fragment of key chunk kc: a0a1 = S[2kc].c0c1, a2a3 = S[2kc].c2c3,
 *       a4a5 = S[2kc+1].c0c1, a6a7 = S[2kc+1].c2c3 (packed to f16/bf16 pairs, low element
 *       in the low half).
 * Each thread owns rows groupID ("A") and groupID + 8 ("B") of its warp's 16; the four
 * lanes of a quad share those rows, so row max and row sum reduce over xor 1 and 2. */

#define PF_BM 64
#define PF_THREADS 128
#define PF_SHORT 4 /* row groups of at most this many rows go to the decode kernel */

/* Shared memory: Q, then NS stages of K and NS of V. Two stages (the next key tile loads
 * while this one is computed): 46 / 87 / 101 KB at d = 64 / 128 / 256; one (V's load
 * overlaps S, the next K's overlaps P V) on devices that cannot give a block two, such as
 * sm_86 / sm_89's 99 KB at d = 256: 27 / 52 / 68 KB. */
template <int D, int NS>
struct pf_cfg {
    static constexpr int BN = D <= 128 ? 64 : 32; /* keys per K/V tile */
    static constexpr int LD = D + 8;              /* smem row stride (elements) */
    static constexpr size_t SMEM = (size_t)(PF_BM + 2 * NS * BN) * LD * 2;
    static constexpr size_t STATIC = 2 * PF_BM * sizeof(int); /* s_pos, s_j0 */
};

template <typename T>
struct mma_op;
template <>
struct mma_op<__half> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        const __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&h);
    }
};
template <>
struct mma_op<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&h);
    }
};

static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

/* tiles: {count, (row0, nrows) x count}: row groups of <= PF_BM consecutive rows of one
 * sequence. Grid (n_head, tile slots, n_split); a block walks tiles blockIdx.y,
 * blockIdx.y + gridDim.y, ... from the last (longest key range under causality) down. */
template <typename T, int D, int NS>
static __global__ void __launch_bounds__(PF_THREADS)
    attn_prefill_kernel(const struct cuda_attn_args a, const T *kc, const T *vc, const int *tiles, float *partial,
                        int n_split) {
    constexpr int BN = pf_cfg<D, NS>::BN, LD = pf_cfg<D, NS>::LD, NC = D / 8;
    extern __shared__ __align__(16) unsigned char psm[];
    T *sQ = reinterpret_cast<T *>(psm); /* [PF_BM][LD] */
    T *sK = sQ + PF_BM * LD;            /* [NS][BN][LD] */
    T *sV = sK + NS * BN * LD;          /* [NS][BN][LD] */
    __shared__ int s_pos[PF_BM], s_j0[PF_BM]; /* pf_cfg::STATIC */

    pdl_wait(); /* tiles, q, positions, caches: the step's data */
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int h = blockIdx.x, split = blockIdx.z;
    const int kvh = h / (a.n_head / a.n_kv);
    const int n_tiles = tiles[0];

    for (int it = blockIdx.y; it < n_tiles; it += gridDim.y) {
        const int tile = n_tiles - 1 - it;
        const int row0 = tiles[1 + 2 * tile], nrows = tiles[2 + 2 * tile];
        if (tid < PF_BM) {
            const int p = tid < nrows ? a.pos[row0 + tid] : -1;
            s_pos[tid] = p;
            s_j0[tid] = p >= 0 ? first_key(p, a.window) : INT_MAX;
        }
        /* Q rows -> sQ in the cache type (rows past nrows zero) */
        for (int idx = tid; idx < PF_BM * (D / 4); idx += PF_THREADS) {
            const int r = idx / (D / 4), c4 = idx % (D / 4);
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < nrows)
                v = *reinterpret_cast<const float4 *>(a.q + ((int64_t)(row0 + r) * a.n_head + h) * D + c4 * 4);
            uint2 u;
            u.x = mma_op<T>::pack(v.x, v.y);
            u.y = mma_op<T>::pack(v.z, v.w);
            *reinterpret_cast<uint2 *>(sQ + r * LD + c4 * 4) = u;
        }
        __syncthreads();
        /* key range of the tile (every warp computes it), of the warp, of the thread's rows */
        const int kmin = warp_min_i(min(s_j0[lane], s_j0[lane + 32]));
        const int kmax = warp_max_i(max(s_pos[lane], s_pos[lane + 32]));
        const int wj0 = warp_min_i(s_j0[warp * 16 + (lane & 15)]);
        const int wpos = warp_max_i(s_pos[warp * 16 + (lane & 15)]);
        /* a key tile inside [wj0max, wposmin] is visible to every row of the warp (a row past
         * nrows has j0 = INT_MAX and pos = -1, so its warp never takes the unmasked path) */
        const int wj0max = warp_max_i(s_j0[warp * 16 + (lane & 15)]);
        const int wposmin = warp_min_i(s_pos[warp * 16 + (lane & 15)]);
        const int rA = warp * 16 + gid, rB = rA + 8;
        const int posA = s_pos[rA], posB = s_pos[rB], j0A = s_j0[rA], j0B = s_j0[rB];
        const int n_kt = (kmax - kmin + BN) / BN; /* nrows >= 1: kmin <= kmax */
        const int per = (n_kt + n_split - 1) / n_split;
        const int kt0 = split * per, kt1 = min(n_kt, kt0 + per);
        const int32_t *table = a.blocks + (int64_t)a.seq[row0] * a.max_blocks;
        const int bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __ffs(a.block_size) - 1 : -1;
        const int64_t blk_stride = (int64_t)a.n_kv * a.block_size * D, head_off = (int64_t)kvh * a.block_size * D;

        /* K and/or V rows [kb, kb + BN) into stage st; keys past kmax zeroed. A thread copies
         * the same 16-byte column c of rows r0, r0 + RS, ...; a power-of-two block size (every
         * cache smelt makes) takes a shift instead of the division. A key past kmax reads
         * kmax's address and copies no bytes, so no branch separates a row's block-table read
         * from its use and the BN / RS reads of a thread are in flight together. */
        constexpr int RS = PF_THREADS / NC;
        static_assert(PF_THREADS % NC == 0 && BN % RS == 0, "prefill tile copy");
        const int r0 = tid / NC, cc = (tid % NC) * 8;
        auto load = [&](int st, int kb, bool k, bool v) {
            T *dk = sK + st * BN * LD + r0 * LD + cc, *dv = sV + st * BN * LD + r0 * LD + cc;
#pragma unroll
            for (int i = 0; i < BN / RS; i++) {
                const int key = kb + r0 + i * RS, kcl = min(key, kmax);
                const int bi = bs_shift >= 0 ? kcl >> bs_shift : kcl / a.block_size;
                const int off = kcl - bi * a.block_size;
                const int64_t o = (int64_t)table[bi] * blk_stride + head_off + off * D + cc;
                const int bytes = key <= kmax ? 16 : 0;
                if (k) cp_async16(dk + i * RS * LD, kc + o, bytes);
                if (v) cp_async16(dv + i * RS * LD, vc + o, bytes);
            }
        };

        float o[D / 8][4];
#pragma unroll
        for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
        float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;

        /* S = Q K^T of key tile kb with the online softmax (s: the tile's P, o rescaled) */
        float s[BN / 8][4];
        auto scores = [&](const T *cK, int kb) {
            const bool full = kb >= wj0max && kb + BN - 1 <= wposmin; /* warp-uniform: no mask */
#pragma unroll
            for (int i = 0; i < BN / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t qa[4];
                ldsm_x4(qa, sQ + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int np = 0; np < BN / 16; np++) {
                    uint32_t kf[4];
                    ldsm_x4(kf, cK + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
                    mma_op<T>::run(s[2 * np], qa, kf[0], kf[1]);
                    mma_op<T>::run(s[2 * np + 1], qa, kf[2], kf[3]);
                }
            }
            /* scale, soft-cap, mask; row maxima */
            float mxA = -INFINITY, mxB = -INFINITY;
            if (full && !(a.softcap > 0.0f)) {
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++) {
                    s[nt][0] *= a.scale;
                    s[nt][1] *= a.scale;
                    s[nt][2] *= a.scale;
                    s[nt][3] *= a.scale;
                    mxA = fmaxf(mxA, fmaxf(s[nt][0], s[nt][1]));
                    mxB = fmaxf(mxB, fmaxf(s[nt][2], s[nt][3]));
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = kb + nt * 8 + 2 * tig + (e & 1);
                        float x = s[nt][e] * a.scale;
                        if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
                        const bool vis = e < 2 ? key >= j0A && key <= posA : key >= j0B && key <= posB;
                        x = vis ? x : -INFINITY;
                        s[nt][e] = x;
                        if (e < 2) mxA = fmaxf(mxA, x);
                        else mxB = fmaxf(mxB, x);
                    }
                }
            }
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
            const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
            const float uA = nA == -INFINITY ? 0.0f : nA, uB = nB == -INFINITY ? 0.0f : nB;
            const float cA = __expf(mA - uA), cB = __expf(mB - uB);
            float sumA = 0.0f, sumB = 0.0f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                s[nt][0] = __expf(s[nt][0] - uA);
                s[nt][1] = __expf(s[nt][1] - uA);
                s[nt][2] = __expf(s[nt][2] - uB);
                s[nt][3] = __expf(s[nt][3] - uB);
                sumA += s[nt][0] + s[nt][1];
                sumB += s[nt][2] + s[nt][3];
            }
            lA = lA * cA + sumA; /* the quad's partial sums; reduced at the end */
            lB = lB * cB + sumB;
            mA = nA;
            mB = nB;
            /* once the row maxima settle, cA = cB = exp(0) = 1 exactly: skipping the
             * multiplications then changes no bit */
            if (__ballot_sync(0xffffffffu, cA != 1.0f || cB != 1.0f)) {
#pragma unroll
                for (int i = 0; i < D / 8; i++) {
                    o[i][0] *= cA;
                    o[i][1] *= cA;
                    o[i][2] *= cB;
                    o[i][3] *= cB;
                }
            }
        };
        /* O += P V */
        auto accumulate = [&](const T *cV) {
#pragma unroll
            for (int kc2 = 0; kc2 < BN / 16; kc2++) {
                uint32_t pa[4];
                pa[0] = mma_op<T>::pack(s[2 * kc2][0], s[2 * kc2][1]);
                pa[1] = mma_op<T>::pack(s[2 * kc2][2], s[2 * kc2][3]);
                pa[2] = mma_op<T>::pack(s[2 * kc2 + 1][0], s[2 * kc2 + 1][1]);
                pa[3] = mma_op<T>::pack(s[2 * kc2 + 1][2], s[2 * kc2 + 1][3]);
#pragma unroll
                for (int dp = 0; dp < D / 16; dp++) {
                    uint32_t vf[4];
                    ldsm_x4_trans(vf, cV + (kc2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
                    mma_op<T>::run(o[2 * dp], pa, vf[0], vf[1]);
                    mma_op<T>::run(o[2 * dp + 1], pa, vf[2], vf[3]);
                }
            }
        };
        auto active = [&](int kb) { return kb <= wpos && kb + BN - 1 >= wj0; }; /* warp-uniform */
        if constexpr (NS == 2) {
            /* tile kt + 1's K and V load while tile kt is computed; one barrier a tile (it
             * also frees the stage that the next load overwrites) */
            if (kt0 < kt1) load(0, kmin + kt0 * BN, true, true);
            cp_async_commit();
            for (int kt = kt0; kt < kt1; kt++) {
                const int kb = kmin + kt * BN, st = (kt - kt0) & 1;
                cp_async_wait<0>(); /* tile kt has landed (this thread's copies) */
                __syncthreads();    /* ... every thread's, and every warp is done with tile kt - 1 */
                if (kt + 1 < kt1) load(st ^ 1, kb + BN, true, true);
                cp_async_commit();
                if (!active(kb)) continue;
                scores(sK + st * BN * LD, kb);
                accumulate(sV + st * BN * LD);
            }
        } else {
            /* one stage: V's load overlaps S, the next K's overlaps P V */
            if (kt0 < kt1) load(0, kmin + kt0 * BN, true, false);
            cp_async_commit();
            for (int kt = kt0; kt < kt1; kt++) {
                const int kb = kmin + kt * BN;
                load(0, kb, false, true);
                cp_async_commit();
                cp_async_wait<1>(); /* K tile kt has landed; V may be in flight */
                __syncthreads();
                const bool act = active(kb);
                if (act) scores(sK, kb);
                cp_async_wait<0>(); /* V tile kt has landed */
                __syncthreads();    /* ... and every warp is done with sK */
                if (kt + 1 < kt1) load(0, kb + BN, true, false);
                cp_async_commit();
                if (act) accumulate(sV);
                __syncthreads(); /* every warp is done with sV */
            }
        }

        lA += __shfl_xor_sync(0xffffffffu, lA, 1);
        lA += __shfl_xor_sync(0xffffffffu, lA, 2);
        lB += __shfl_xor_sync(0xffffffffu, lB, 1);
        lB += __shfl_xor_sync(0xffffffffu, lB, 2);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = half ? rB : rA;
            if (r >= nrows) continue;
            const int64_t t = row0 + r;
            const float m = half ? mB : mA, l = half ? lB : lA;
            if (n_split == 1) {
                const float ls = l + (a.sinks && m != -INFINITY ? expf(a.sinks[h] - m) : 0.0f);
                const float inv = ls > 0.0f ? 1.0f / ls : 0.0f;
                float *dr = a.dst + (t * a.n_head + h) * D + 2 * tig;
#pragma unroll
                for (int i = 0; i < D / 8; i++)
                    *reinterpret_cast<float2 *>(dr + i * 8) = make_float2(o[i][2 * half] * inv, o[i][2 * half + 1] * inv);
            } else {
                float *pr = partial + ((t * a.n_head + h) * n_split + split) * (D + 2);
                if (tig == 0) {
                    pr[0] = m;
                    pr[1] = l;
                }
#pragma unroll
                for (int i = 0; i < D / 8; i++)
                    *reinterpret_cast<float2 *>(pr + 2 + i * 8 + 2 * tig) = make_float2(o[i][2 * half], o[i][2 * half + 1]);
            }
        }
        __syncthreads(); /* s_pos, s_j0, sQ are rewritten for the next tile */
    }
}

/* ------------------------------------------------------------------------------------
 * Row groups of a prefill batch (one block of 1024 threads)
 * ------------------------------------------------------------------------------------
 * A group starts at row 0, at every multiple of PF_BM and wherever the sequence changes,
 * so a group is <= PF_BM consecutive rows of one sequence. Groups of more than `short_max`
 * rows go to the prefill kernel's list {count, (row0, nrows)...}; the rows of the others
 * to the decode kernel's list {count, row...} (at most short_cap rows, the decode grid's
 * slots); kind[row] says which (0 prefill, 1 decode). starts: scratch of n + 1 ints. */
static __device__ int block_excl_scan(int v, int *total, int *warp_tot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? warp_tot[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        warp_tot[lane] = w; /* inclusive over warps */
    }
    __syncthreads();
    const int excl = x - v + (warp ? warp_tot[warp - 1] : 0);
    *total = warp_tot[nw - 1];
    __syncthreads(); /* warp_tot is reused by the next scan */
    return excl;
}

static __global__ void __launch_bounds__(1024)
    attn_tiles_kernel(const int32_t *seq, int n, int short_max, int short_cap, int *starts, int *tiles,
                      int *short_rows, int *kind) {
    __shared__ int warp_tot[32];
    pdl_wait();
    pdl_trigger();
    const int tid = threadIdx.x;
    int n_groups = 0;
    for (int c0 = 0; c0 < n; c0 += blockDim.x) {
        const int i = c0 + tid;
        const int f = i < n && (i == 0 || i % PF_BM == 0 || seq[i] != seq[i - 1]);
        int total;
        const int excl = block_excl_scan(f, &total, warp_tot);
        if (f) starts[n_groups + excl] = i;
        n_groups += total;
    }
    if (tid == 0) starts[n_groups] = n;
    __syncthreads(); /* starts[] is visible to the block */
    int n_long = 0, n_short = 0;
    for (int c0 = 0; c0 < n_groups; c0 += blockDim.x) {
        const int k = c0 + tid;
        const int row0 = k < n_groups ? starts[k] : 0;
        const int nrows = k < n_groups ? starts[k + 1] - row0 : 0;
        /* a short candidate goes to the decode list while the list has room (rows of a
         * sequence split into many groups could outgrow it), else to the prefill list */
        const int cand = k < n_groups && nrows <= short_max ? nrows : 0;
        int tot_cand, tot_long, tot_short;
        const int ec = block_excl_scan(cand, &tot_cand, warp_tot);
        const int is_short = cand > 0 && n_short + ec + nrows <= short_cap;
        const int is_long = k < n_groups && !is_short;
        const int es = block_excl_scan(is_short ? nrows : 0, &tot_short, warp_tot);
        const int el = block_excl_scan(is_long, &tot_long, warp_tot);
        if (k < n_groups) {
            if (is_long) {
                tiles[1 + 2 * (n_long + el)] = row0;
                tiles[2 + 2 * (n_long + el)] = nrows;
            } else {
                for (int r = 0; r < nrows; r++) short_rows[1 + n_short + es + r] = row0 + r;
            }
            for (int r = 0; r < nrows; r++) kind[row0 + r] = is_long ? 0 : 1;
        }
        n_long += tot_long;
        n_short += tot_short;
    }
    if (tid == 0) {
        tiles[0] = n_long;
        short_rows[0] = n_short;
    }
}

/* ------------------------------------------------------------------------------------
 * Merging the key splits of the generic and prefill kernels (the decode kernel merges its own)
 * ------------------------------------------------------------------------------------
 * partial[(slot * n_head + h) * n_split + s] = {m, l, o[dv]} (o unnormalized). A block
 * per (slot, head); slot -> row through `rows` ({count, row...}) when given, else
 * row = slot; rows with kind[row] != 0 are skipped when kind is given. */
static __global__ void attn_merge_kernel(float *dst, const float *partial, int n_head, int dv, int n_split,
                                         const int *rows, const int *kind, const float *sinks) {
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.x % n_head;
    const int64_t slot = blockIdx.x / n_head;
    if (rows && slot >= rows[0]) return;
    const int64_t t = rows ? rows[1 + slot] : slot;
    if (kind && kind[t] != 0) return;
    const float *pr = partial + (slot * n_head + h) * n_split * (int64_t)(dv + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, pr[s * (dv + 2)]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float ms = pr[s * (dv + 2)];
        if (ms != -INFINITY) L += pr[s * (dv + 2) + 1] * expf(ms - M);
    }
    if (sinks && M != -INFINITY) L += expf(sinks[h] - M); /* the sink's share */
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float ms = pr[s * (dv + 2)];
            if (ms != -INFINITY) acc += pr[s * (dv + 2) + 2 + i] * expf(ms - M);
        }
        dst[(t * n_head + h) * (int64_t)dv + i] = acc * inv;
    }
}

/* ------------------------------------------------------------------------------------
 * Plan and launchers
 * ------------------------------------------------------------------------------------ */

/* The SM count the plan sizes grids for: the context's device, or an H200's 132 in a
 * context without one (the plan's tests on a machine without a GPU). */
static int sm_count(const struct cuda_ctx *ctx) { return ctx && ctx->n_sm > 0 ? ctx->n_sm : 132; }

/* Doubles the split while the blocks do not reach `target`, keeping at least min_keys
 * keys per split of the longest row; forced > 0 replaces the choice (capped at max_split). */
static int choose_split(int64_t units, int max_keys, int min_keys, int max_split, int64_t target, int forced) {
    if (forced > 0) return forced < max_split ? forced : max_split;
    int s = 1;
    while (s < max_split && units * s < target && max_keys / (2 * s) >= min_keys) s *= 2;
    return s;
}

static uint64_t align256(uint64_t n) { return (n + 255) & ~(uint64_t)255; }

/* The decode kernel's splits for `slots` row slots: its counters cover slots x n_kv. */
static void plan_decode(const struct cuda_ctx *ctx, const struct cuda_attn_args *a, struct cuda_attn_plan *p,
                        int64_t slots, int64_t target) {
    const int nk = 8192 / (a->dk * (a->cache_type == QT_F32 ? 4 : 2)); /* keys per stage */
    const uint64_t row_bytes = (uint64_t)a->n_head * (uint64_t)(a->dv + 2) * sizeof(float);
    p->dec_slots = (int)slots;
    /* one stage per split: measured on the H200 (graphs of 100 calls, 1 sequence) against
     * two stages: 8B shape @256 keys 9.3 vs 13.6 us, 0.5B shape @256 10.7 vs 14.6, equal at
     * 16 and 4096 keys */
    p->dec_min_keys = a->split_keys > 0 ? a->split_keys : nk;
    p->dec_split = choose_split(slots * a->n_kv, a->max_keys, p->dec_min_keys, 64, target, a->split);
    if (slots * a->n_kv > ATTN_CNT) p->dec_split = 1;
    /* Query-head subsets: more blocks per (row, KV head, split) while the grid stays within
     * one block per SM (counting every split the shape allows). A block then scores fewer
     * heads over the same keys (K/V re-read from L2), so the serial chains of its phases
     * shorten. Graph-replayed, one row (H200, 2026-12-01, test_cuda_attn's bench): the 0.5B
     * shape (G = 7, 8 blocks -> 7 subsets) @16 / 64 / 128 / 256 keys 4.47 / 5.09 / 7.01 /
     * 7.51 -> 3.75 / 3.89 / 5.80 / 6.39 us; 8B (G = 4, 64 blocks -> 2 subsets) @16 / 128
     * / 256 4.02 / 6.90 / 6.40 -> 3.92 / 6.55 / 6.27 us; tg128 0.5B Q8_0 1,452-1,468 ->
     * 1,505-1,514 tok/s, 8B Q4_K_M 464-466 -> 470. At 4096 keys the grids are already
     * full (0.5B: 128 blocks, 8B: 512) and subsets lost there (8B: 20.2 -> 28.6 us with 2). */
    const int G = a->n_head / a->n_kv;
    int sub = a->dec_sub > 0 ? a->dec_sub : 1;
    if (a->dec_sub <= 0)
        while (sub < G && slots * a->n_kv * p->dec_split * (sub + 1) <= sm_count(ctx)) sub++;
    if (sub > G) sub = G;
    if (p->dec_split > 1 && slots * a->n_kv * sub > ATTN_CNT) sub = 1; /* the split counters */
    const int gs = (G + sub - 1) / sub;
    p->dec_sub = (G + gs - 1) / gs; /* every subset non-empty */
    /* 256 threads while the grid is under half the SMs (F16/BF16 caches). Graph-replayed,
     * one row, H200: Qwen2.5-0.5B shape @16 / 256 keys 5.26 -> 4.47 / 9.67 -> 7.66 us,
     * Llama-3-8B @16 4.66 -> 4.11 (64 blocks: @256 7.61 -> 7.75); 0.5B @4096 (128 blocks)
     * 15.05 -> 15.39, so 128 threads there */
    p->dec_threads = a->cache_type != QT_F32 && slots * a->n_kv * p->dec_split < sm_count(ctx) / 2 ? 256 : 128;
    if (a->dec_threads == 128 || (a->dec_threads == 256 && a->cache_type != QT_F32)) p->dec_threads = a->dec_threads;
    if (p->dec_split > 1) p->dec_partial_bytes = align256((uint64_t)slots * p->dec_split * row_bytes);
}

extern "C" void cuda_attn_plan(const struct cuda_ctx *ctx, const struct cuda_attn_args *a, struct cuda_attn_plan *p) {
    memset(p, 0, sizeof *p);
    const int G = a->n_kv > 0 && a->n_head % a->n_kv == 0 ? a->n_head / a->n_kv : 0;
    const bool typed = a->cache_type == QT_F16 || a->cache_type == QT_BF16 || a->cache_type == QT_F32;
    const bool fast = typed && G >= 1 && G <= 16 && a->dk == a->dv && (a->dk == 64 || a->dk == 128 || a->dk == 256);
    const bool tc = fast && a->cache_type != QT_F32;
    const int64_t n = a->n_tokens;
    int k;
    if (!fast || a->kernel == CUDA_ATTN_GENERIC) k = CUDA_ATTN_GENERIC;
    else if (a->kernel == CUDA_ATTN_DECODE || !tc) k = CUDA_ATTN_DECODE;
    else if (a->kernel == CUDA_ATTN_HYBRID || a->kernel == CUDA_ATTN_PREFILL) k = a->kernel;
    else k = n <= a->n_seqs || n <= PF_SHORT ? CUDA_ATTN_DECODE : CUDA_ATTN_HYBRID;
    p->kernel = k;
    const uint64_t row_bytes = (uint64_t)a->n_head * (uint64_t)(a->dv + 2) * sizeof(float);
    const int64_t target = 4 * (int64_t)sm_count(ctx);
    if (k == CUDA_ATTN_GENERIC) {
        /* (rows x heads x splits) fills the GPU twice over, >= 128 keys per split */
        p->dec_slots = (int)n;
        p->dec_split = choose_split(n * a->n_head, a->max_keys, 128, 64, 2 * (int64_t)sm_count(ctx), a->split);
        if (p->dec_split > 1) p->dec_partial_bytes = align256((uint64_t)n * p->dec_split * row_bytes);
    } else if (k == CUDA_ATTN_DECODE) {
        /* 2 blocks per SM: at depth 4096 (8B shape, one sequence) 32 splits beat 64 (26.0 vs
         * 29.2 us per call, H200), the merge being the difference */
        plan_decode(ctx, a, p, n, 2 * (int64_t)sm_count(ctx));
    } else {
        const int bn = a->dk <= 128 ? 64 : 32;
        const int short_max = k == CUDA_ATTN_PREFILL ? 0 : PF_SHORT;
        int64_t groups = (n + PF_BM - 1) / PF_BM + a->n_seqs; /* with consecutive rows per sequence */
        if (groups > n) groups = n;
        p->short_max = short_max;
        p->pf_slots = (int)(groups < 65535 ? groups : 65535);
        p->pf_split = choose_split(((n + PF_BM - 1) / PF_BM) * a->n_head, a->max_keys, 4 * bn, 16, target / 2, 0);
        if (short_max > 0) {
            int64_t slots = (int64_t)a->n_seqs * 2 * short_max; /* a sequence's head and tail groups */
            if (slots > n) slots = n;
            plan_decode(ctx, a, p, slots, target);
        }
        if (p->pf_split > 1) p->pf_partial_bytes = align256((uint64_t)n * p->pf_split * row_bytes);
        /* starts (n + 1), tiles (1 + 2n), short rows (1 + n), kind (n) */
        p->list_bytes = align256((uint64_t)(5 * n + 4) * sizeof(int));
    }
}

extern "C" uint64_t cuda_attn_scratch_bytes(const struct cuda_ctx *ctx, const struct cuda_attn_args *a) {
    struct cuda_attn_plan p;
    cuda_attn_plan(ctx, a, &p);
    return p.dec_partial_bytes + p.pf_partial_bytes + p.list_bytes;
}

extern "C" int cuda_attn_counters_busy(const struct cuda_ctx *ctx) {
    return device_counters_busy(ctx->attn_cnt, ATTN_CNT);
}

/* Launch errors stay pending for the caller's cudaGetLastError (cuda_attention is void). */
template <typename T>
static void launch_generic(const struct cuda_attn_args *a, float *partial, int s, struct cuda_ctx *ctx) {
    dim3 grid((unsigned)a->n_head, (unsigned)a->n_tokens, (unsigned)s);
    (void)klaunch(attn_generic_kernel<T>, grid, dim3(GEN_WARPS * 32), 0, ctx, *a, (const T *)a->kc, (const T *)a->vc,
                  partial, s);
}

template <typename T, int D, int GMAX, int TH>
static void launch_decode_t(const struct cuda_attn_args *a, const int *rows, int slots, float *partial, int s,
                            int min_keys, int sub, const attn_qout &qo, struct cuda_ctx *ctx) {
    constexpr size_t smem = dec_smem_bytes<T, D, GMAX>();
    /* > 48 KB of dynamic smem needs the opt-in, once per kernel and context (the first call
     * runs eagerly, before any graph capture); a failure stays pending and the launch reports it */
    smem_optin_once(ctx, (const void *)attn_decode_kernel<T, D, GMAX, TH>, smem);
    dim3 grid((unsigned)((int64_t)slots * a->n_kv * sub), (unsigned)s);
    (void)klaunch(attn_decode_kernel<T, D, GMAX, TH>, grid, dim3(TH), smem, ctx, *a, (const T *)a->kc,
                  (const T *)a->vc, rows, partial, s, min_keys, sub, qo, ctx->attn_cnt);
}

template <typename T, int D, int GMAX>
static void launch_decode_g(const struct cuda_attn_args *a, const int *rows, int slots, float *partial, int s,
                            int min_keys, int threads, int sub, const attn_qout &qo, struct cuda_ctx *ctx) {
    if constexpr (sizeof(T) == 2) /* 256 threads: 16-bit caches only (F32 runs 4-chunk scoring) */
        if (threads == 256) return launch_decode_t<T, D, GMAX, 256>(a, rows, slots, partial, s, min_keys, sub, qo, ctx);
    launch_decode_t<T, D, GMAX, 128>(a, rows, slots, partial, s, min_keys, sub, qo, ctx);
}

template <typename T, int D>
static void launch_decode_d(const struct cuda_attn_args *a, const int *rows, int slots, float *partial, int s,
                            int min_keys, int threads, int sub, const attn_qout &qo, struct cuda_ctx *ctx) {
    const int G = a->n_head / a->n_kv, GS = (G + sub - 1) / sub; /* heads per block */
    if (GS <= 4) launch_decode_g<T, D, 4>(a, rows, slots, partial, s, min_keys, threads, sub, qo, ctx);
    else if (GS <= 8) launch_decode_g<T, D, 8>(a, rows, slots, partial, s, min_keys, threads, sub, qo, ctx);
    else launch_decode_g<T, D, 16>(a, rows, slots, partial, s, min_keys, threads, sub, qo, ctx);
}

template <typename T>
static void launch_decode(const struct cuda_attn_args *a, const int *rows, int slots, float *partial, int s,
                          int min_keys, int threads, int sub, const attn_qout &qo, struct cuda_ctx *ctx) {
    if (a->dk == 64) launch_decode_d<T, 64>(a, rows, slots, partial, s, min_keys, threads, sub, qo, ctx);
    else if (a->dk == 128) launch_decode_d<T, 128>(a, rows, slots, partial, s, min_keys, threads, sub, qo, ctx);
    else launch_decode_d<T, 256>(a, rows, slots, partial, s, min_keys, threads, sub, qo, ctx);
}

template <typename T, int D, int NS>
static void launch_prefill_ns(const struct cuda_attn_args *a, const int *tiles, int slots, float *partial, int s,
                              struct cuda_ctx *ctx) {
    constexpr size_t smem = pf_cfg<D, NS>::SMEM;
    smem_optin_once(ctx, (const void *)attn_prefill_kernel<T, D, NS>, smem); /* as in launch_decode_t */
    dim3 grid((unsigned)a->n_head, (unsigned)slots, (unsigned)s);
    (void)klaunch(attn_prefill_kernel<T, D, NS>, grid, dim3(PF_THREADS), smem, ctx, *a, (const T *)a->kc,
                  (const T *)a->vc, tiles, partial, s);
}

/* Two stages where the device gives a block their shared memory, else one. */
template <typename T, int D>
static void launch_prefill_d(const struct cuda_attn_args *a, const int *tiles, int slots, float *partial, int s,
                             struct cuda_ctx *ctx) {
    if (pf_cfg<D, 2>::SMEM + pf_cfg<D, 2>::STATIC <= (size_t)ctx->smem_optin)
        launch_prefill_ns<T, D, 2>(a, tiles, slots, partial, s, ctx);
    else launch_prefill_ns<T, D, 1>(a, tiles, slots, partial, s, ctx);
}

template <typename T>
static void launch_prefill(const struct cuda_attn_args *a, const int *tiles, int slots, float *partial, int s,
                           struct cuda_ctx *ctx) {
    if (a->dk == 64) launch_prefill_d<T, 64>(a, tiles, slots, partial, s, ctx);
    else if (a->dk == 128) launch_prefill_d<T, 128>(a, tiles, slots, partial, s, ctx);
    else launch_prefill_d<T, 256>(a, tiles, slots, partial, s, ctx);
}

static void launch_decode_any(const struct cuda_attn_args *a, const int *rows, const struct cuda_attn_plan &p,
                              float *partial, const attn_qout &qo, struct cuda_ctx *ctx) {
    const int s = p.dec_split, mk = p.dec_min_keys, th = p.dec_threads, sub = p.dec_sub;
    if (a->cache_type == QT_F16) launch_decode<__half>(a, rows, p.dec_slots, partial, s, mk, th, sub, qo, ctx);
    else if (a->cache_type == QT_BF16)
        launch_decode<__nv_bfloat16>(a, rows, p.dec_slots, partial, s, mk, th, sub, qo, ctx);
    else launch_decode<float>(a, rows, p.dec_slots, partial, s, mk, th, sub, qo, ctx);
}

static void launch_merge(const struct cuda_attn_args *a, const float *partial, int slots, int s, const int *rows,
                         const int *kind, struct cuda_ctx *ctx) {
    (void)klaunch(attn_merge_kernel, dim3((unsigned)((int64_t)slots * a->n_head)), dim3(128), 0, ctx, a->dst, partial,
                  a->n_head, a->dv, s, rows, kind, a->sinks);
}

extern "C" void cuda_attention(struct cuda_ctx *ctx, const struct cuda_attn_args *a_in) {
    struct cuda_attn_plan p;
    cuda_attn_plan(ctx, a_in, &p);
    struct cuda_attn_args unfused;
    const struct cuda_attn_args *a = a_in;
    if (a_in->rope.freq && p.kernel != CUDA_ATTN_DECODE) { /* only the decode kernel fuses RoPE */
        unfused = *a_in;
        unfused.rope.freq = NULL;
        cuda_rope_kv_store(ctx, (float *)a_in->q, (float *)a_in->k_new, a_in->v_new, (void *)a_in->kc, (void *)a_in->vc,
                           a_in->cache_type, a_in->pos, a_in->slot, a_in->dk, a_in->dv, a_in->n_head, a_in->n_kv,
                           a_in->block_size, a_in->n_tokens, &a_in->rope, a_in->q_norm, a_in->k_norm,
                           a_in->norm_eps);
        a = &unfused;
    }
    unsigned char *scr = (unsigned char *)a->scratch;
    float *dec_partial = p.dec_partial_bytes ? (float *)scr : NULL;
    float *pf_partial = p.pf_partial_bytes ? (float *)(scr + p.dec_partial_bytes) : NULL;
    int *lists = p.list_bytes ? (int *)(scr + p.dec_partial_bytes + p.pf_partial_bytes) : NULL;
    const int n = (int)a->n_tokens;
    if (n <= 0) return;
    /* the int8 form of the output: by the decode kernel itself, else one quantize launch */
    const int64_t width = (int64_t)a->dv * a->n_head;
    const bool want_q = a->q_out && n <= CUDA_MMV_MAX_N && width % 32 == 0;
    attn_qout qo = {NULL, NULL};
    if (want_q && p.kernel == CUDA_ATTN_DECODE) {
        void *xd;
        cuda_mmv_scratch_parts(a->q_out, width, n, &qo.xq, &xd);
        qo.xd = (float2 *)xd;
    }

    if (p.kernel == CUDA_ATTN_GENERIC) {
        if (a->cache_type == QT_F16) launch_generic<__half>(a, dec_partial, p.dec_split, ctx);
        else if (a->cache_type == QT_BF16) launch_generic<__nv_bfloat16>(a, dec_partial, p.dec_split, ctx);
        else launch_generic<float>(a, dec_partial, p.dec_split, ctx);
        if (p.dec_split > 1) launch_merge(a, dec_partial, n, p.dec_split, NULL, NULL, ctx);
    } else if (p.kernel == CUDA_ATTN_DECODE) {
        launch_decode_any(a, NULL, p, dec_partial, qo, ctx);
    } else {
        /* hybrid / prefill: lists laid out as starts (n + 1) | tiles (1 + 2n) | short (1 + n) | kind (n) */
        int *starts = lists, *tiles = starts + (n + 1), *short_rows = tiles + (1 + 2 * n), *kind = short_rows + (1 + n);
        (void)klaunch(attn_tiles_kernel, dim3(1), dim3(1024), 0, ctx, a->seq, n, p.short_max,
                      p.dec_slots, starts, tiles, short_rows, kind);
        if (a->cache_type == QT_F16) launch_prefill<__half>(a, tiles, p.pf_slots, pf_partial, p.pf_split, ctx);
        else launch_prefill<__nv_bfloat16>(a, tiles, p.pf_slots, pf_partial, p.pf_split, ctx);
        if (p.pf_split > 1) launch_merge(a, pf_partial, n, p.pf_split, NULL, kind, ctx);
        if (p.short_max > 0) launch_decode_any(a, short_rows, p, dec_partial, qo, ctx);
    }
    if (want_q && !qo.xq) {
        struct err e;
        (void)cuda_mmv_quantize(ctx, a->dst, width, n, a->q_out, &e); /* a launch error stays pending */
    }
}
