/* The logits_topk op on the GPU: each output row of logits reduced to its sampling
 * summary (contract: backend/topk.h; CPU twin: src/backend/cpu/cpu_topk.c, which these
 * kernels must match candidate for candidate).
 *
 * One launch per step (two above TK_CNT rows), graph-capturable (every per-step value is
 * data in device buffers; the grid depends only on the step's shape and the GPU):
 *
 * 1. topk_partial, grid (n_split, n_rows), 256 threads. Block (s, r) owns the slice
 *    [s * slice, (s + 1) * slice) of row r (slice <= 64K tokens, chosen so that a step
 *    has about two blocks per SM). It streams its slice once: each thread loads 4 floats
 *    per round (coalesced; the next round's loads are issued before the current round
 *    is processed), so the only pass over the logits is this one.
 *    - Token mask (TOPK_MASK rows: structured output): a token whose bit is clear is a
 *      logit of -inf, raw and adjusted, before anything else (its adjustments are not
 *      applied, its raw logit for adj_raw is -inf); 32 threads of a warp read one word.
 *    - Adjustments: the row's entries whose token falls in the slice (found by binary
 *      search in the row's sorted list) set bits in a shared bitmap of the slice and
 *      have their raw logit copied out; a marked token finds its entries by binary
 *      search and applies them in list order with __f*_rn intrinsics (no FMA), so the
 *      adjusted value is the host's bit for bit.
 *    - Sums: per-thread online (max, sum of exp) pairs for the raw logits (TOPK_RAW)
 *      and the adjusted ones scaled by inv_t (TOPK_SUM), merged across the block.
 *    - Candidates: 64-bit keys (orderable logit bits, then ~token: larger logit first,
 *      lower token on ties; exactly the CPU twin's order). A k = 1 row keeps the largest
 *      key (a block max). Otherwise a shared buffer of 2048 keys admits keys above a
 *      running threshold (warp-aggregated appends); when fewer than a round's worth of
 *      slots remain, a radix select (8-bit digits from the top, stopping as soon as
 *      the digit's bucket is exactly what is needed; 64-bit keys are unique) finds the
 *      k-th largest key, the k best stay and the threshold rises. After the first two
 *      rounds most tokens are one compare.
 *    Out: per (row, split) the stats and at most k keys (unsorted) in scratch.
 * 2. The merge (merge_row), by the last of a row's blocks to finish (a counter per row,
 *    as the attention's split merge: __threadfence, atomicAdd, reset by the merging block),
 *    or above TK_CNT rows by its own kernel (topk_merge, a block per row): merges the
 *    splits' stats and streams their keys through the same buffer; the final <= k keys
 *    are sorted (bitonic) and written as the row's candidates with its summary.
 *
 * Bytes per step: n_rows * n_vocab * 4 read once (152k vocabulary: 594 KB a row), plus
 * the adjusted tokens' logits once more, plus n_rows * n_split * (32 + 8k) of scratch
 * written and read back (k = 256, n_split = 37: 76 KB for one row). Rows with k = 0 are
 * skipped by both kernels. The summaries, not the rows, are what the host downloads. */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
#include "backend/topk.h"
}

#define TK_THREADS 256
#define TK_WARPS (TK_THREADS / 32)
#define TK_PER 4                          /* elements per thread per round */
#define TK_ROUND (TK_THREADS * TK_PER)    /* 1024 */
#define TK_CAP 2048                       /* candidate buffer (keys) */
#define TK_REG (TK_CAP / TK_THREADS)      /* buffer keys per thread in a select */
#define TK_SLICE_MAX 65536                /* tokens per block at most (the bitmap's size) */
#define TK_SLICE_MIN 4096                 /* tokens per block at least (4 rounds) */
#define TK_BITS (TK_SLICE_MAX / 32)

#define TK_CNT CUDA_TOPK_COUNTERS          /* rows merged by their last block (counters) */

static_assert(TK_THREADS == 256, "the radix select has one histogram bin per thread");
static_assert(TK_CAP - TK_ROUND >= TOPK_MAX, "a round must fit after a select");
static_assert(TK_CAP % TK_THREADS == 0, "select registers");

/* Per-row counters of finished split blocks (tk_cnt, the launch context's topk_cnt): zero
 * between calls (the merging block resets its row's), so one call at a time per context. */

/* One (row, split)'s result. */
struct tk_part {
    float max_raw, sum_raw; /* sum of exp(raw - max_raw) */
    float max_adj, sum_adj; /* sum of exp((adj - max_adj) * inv_t) */
    int n_finite, n_keys, pad0, pad1;
};

/* Shared state of the candidate buffer. */
struct tk_shared {
    int count;          /* keys in the buffer */
    unsigned long long thr; /* keys must be > thr to enter */
    int hist[256];
    int sel_digit, sel_above, sel_cnt;
    float red_m[2][TK_WARPS], red_s[2][TK_WARPS];
    int red_n[TK_WARPS];
    unsigned long long red_k[TK_WARPS];
    int last; /* this block merges its row */
};

/* ---------------------------------------------------------------- helpers ---- */

static __device__ __forceinline__ unsigned long long dkey(float v, int32_t token) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) == 0) u = 0; /* -0 ranks as +0 */
    const uint32_t o = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)o << 32) | (uint32_t)~(uint32_t)token;
}

static __device__ __forceinline__ float key_logit(unsigned long long k) {
    const uint32_t o = (uint32_t)(k >> 32);
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

static __device__ __forceinline__ int32_t key_token(unsigned long long k) {
    return (int32_t)~(uint32_t)k;
}

/* One adjustment entry (see struct logit_adj), each step rounded on its own. */
static __device__ __forceinline__ float adj_apply(float l, const struct logit_adj &a) {
    if (a.rep != 1.0f) l = l > 0.0f ? __fdiv_rn(l, a.rep) : __fmul_rn(l, a.rep);
    l = __fsub_rn(l, a.sub);
    return a.add == -INFINITY ? -INFINITY : __fadd_rn(l, a.add);
}

/* First index in [lo, hi) of list a whose token is >= t (hi when none). */
static __device__ __forceinline__ int lower_bound(const struct logit_adj *a, int lo, int hi, int t) {
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (a[mid].token < t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Online (max, sum of exp((x - max) * scale)) with one more value v > -inf. */
static __device__ __forceinline__ void ms_add(float &m, float &s, float v, float scale) {
    if (v > m) {
        s = s * expf((m - v) * scale) + 1.0f; /* m = -inf the first time: 0 * 0 + 1 */
        m = v;
    } else {
        s += expf((v - m) * scale);
    }
}

static __device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2, float scale) {
    const float mm = fmaxf(m, m2);
    if (mm == -INFINITY) {
        m = -INFINITY;
        s = 0.0f;
        return;
    }
    const float a = m == -INFINITY ? 0.0f : s * expf((m - mm) * scale);
    const float b = m2 == -INFINITY ? 0.0f : s2 * expf((m2 - mm) * scale);
    m = mm;
    s = a + b;
}

/* Block-wide merge of two (max, sum) pairs and a count; every thread gets the result. */
static __device__ void block_stats(float &m0, float &s0, float sc0, float &m1, float &s1, float sc1,
                                   int &n, struct tk_shared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float am = __shfl_xor_sync(0xffffffffu, m0, o), as = __shfl_xor_sync(0xffffffffu, s0, o);
        const float bm = __shfl_xor_sync(0xffffffffu, m1, o), bs = __shfl_xor_sync(0xffffffffu, s1, o);
        ms_merge(m0, s0, am, as, sc0);
        ms_merge(m1, s1, bm, bs, sc1);
        n += __shfl_xor_sync(0xffffffffu, n, o);
    }
    if (lane == 0) {
        sh.red_m[0][warp] = m0;
        sh.red_s[0][warp] = s0;
        sh.red_m[1][warp] = m1;
        sh.red_s[1][warp] = s1;
        sh.red_n[warp] = n;
    }
    __syncthreads();
    m0 = sh.red_m[0][0];
    s0 = sh.red_s[0][0];
    m1 = sh.red_m[1][0];
    s1 = sh.red_s[1][0];
    n = sh.red_n[0];
    for (int w = 1; w < TK_WARPS; w++) { /* the same order in every thread */
        ms_merge(m0, s0, sh.red_m[0][w], sh.red_s[0][w], sc0);
        ms_merge(m1, s1, sh.red_m[1][w], sh.red_s[1][w], sc1);
        n += sh.red_n[w];
    }
    __syncthreads();
}

/* Block-wide max of a key; every thread gets it. */
static __device__ unsigned long long block_max_key(unsigned long long k, struct tk_shared &sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long v = __shfl_xor_sync(0xffffffffu, k, o);
        k = v > k ? v : k;
    }
    if ((threadIdx.x & 31) == 0) sh.red_k[threadIdx.x >> 5] = k;
    __syncthreads();
    k = sh.red_k[0];
    for (int w = 1; w < TK_WARPS; w++) k = sh.red_k[w] > k ? sh.red_k[w] : k;
    __syncthreads();
    return k;
}

/* Appends the keys of kk[] that pass (> thr) to the buffer, one atomic per warp and key
 * slot. All threads of the block call it (full warps). */
static __device__ __forceinline__ void collect(const unsigned long long *kk, int n, unsigned long long thr,
                                               unsigned long long *sk, struct tk_shared &sh) {
    const int lane = threadIdx.x & 31;
    for (int j = 0; j < n; j++) {
        const bool pass = kk[j] > thr;
        const unsigned m = __ballot_sync(0xffffffffu, pass);
        if (!m) continue;
        const int leader = __ffs(m) - 1;
        int pos = 0;
        if (lane == leader) pos = atomicAdd(&sh.count, __popc(m));
        pos = __shfl_sync(0xffffffffu, pos, leader);
        if (pass) sk[pos + __popc(m & ((1u << lane) - 1u))] = kk[j];
    }
}

/* Keeps the k largest of the c > k keys in sk[0..c) (unsorted) and raises the threshold.
 * Called by every thread after a barrier, with the same c; ends with a barrier. */
static __device__ void select_top(unsigned long long *sk, struct tk_shared &sh, int c, int k) {
    const int tid = threadIdx.x;
    unsigned long long v[TK_REG];
#pragma unroll
    for (int j = 0; j < TK_REG; j++) {
        const int i = j * TK_THREADS + tid;
        v[j] = i < c ? sk[i] : 0ull;
    }
    unsigned long long prefix = 0, mask = 0;
    int need = k; /* keys still to take among those matching prefix on mask */
    for (int shift = 56; shift >= 0; shift -= 8) {
        sh.hist[tid] = 0;
        __syncthreads(); /* every thread has read c and its keys: the count can be reused */
        if (shift == 56 && tid == 0) sh.count = 0;
#pragma unroll
        for (int j = 0; j < TK_REG; j++)
            if (v[j] != 0ull && (v[j] & mask) == prefix) atomicAdd(&sh.hist[(int)(v[j] >> shift) & 255], 1);
        __syncthreads();
        if (tid < 32) {
            /* lane l owns digits 255 - 8l down to 248 - 8l: a prefix sum over lanes is a
             * count of the keys with a larger digit */
            int cnts[8], tot = 0;
#pragma unroll
            for (int b = 0; b < 8; b++) {
                cnts[b] = sh.hist[255 - tid * 8 - b];
                tot += cnts[b];
            }
            int incl = tot;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int t = __shfl_up_sync(0xffffffffu, incl, o);
                if (tid >= o) incl += t;
            }
            int acc = incl - tot;
            if (acc < need && need <= incl) { /* exactly one lane */
                for (int b = 0; b < 8; b++) {
                    if (acc + cnts[b] >= need) {
                        sh.sel_digit = 255 - tid * 8 - b;
                        sh.sel_above = acc;
                        sh.sel_cnt = cnts[b];
                        break;
                    }
                    acc += cnts[b];
                }
            }
        }
        __syncthreads();
        const int d = sh.sel_digit, above = sh.sel_above, cnt = sh.sel_cnt;
        need -= above;
        prefix |= (unsigned long long)d << shift;
        mask |= 255ull << shift;
        if (cnt == need) break; /* every key of this prefix is in: they are the keys >= prefix */
    }
    /* prefix: the low bits below the last digit are 0, so the k kept keys are those >= it */
    unsigned long long keep[TK_REG];
#pragma unroll
    for (int j = 0; j < TK_REG; j++) keep[j] = v[j] >= prefix ? v[j] : 0ull;
    collect(keep, TK_REG, 0ull, sk, sh);
    __syncthreads();
    if (tid == 0) {
        const unsigned long long t = prefix - 1ull; /* prefix >= 1: c > k keys are nonzero */
        if (t > sh.thr) sh.thr = t;
    }
    __syncthreads();
}

/* After a round's appends: makes room for the next round. Every thread calls it. */
static __device__ __forceinline__ void end_round(unsigned long long *sk, struct tk_shared &sh, int k) {
    __syncthreads();
    const int c = sh.count;
    __syncthreads(); /* no append before every thread has read the count */
    if (c > TK_CAP - TK_ROUND) select_top(sk, sh, c, k);
}

/* Ends a stream: the buffer holds at most k keys, sorted descending when `sort`. Returns
 * their count. */
static __device__ int finish_keys(unsigned long long *sk, struct tk_shared &sh, int k, bool sort) {
    __syncthreads();
    int c = sh.count;
    if (c > k) {
        select_top(sk, sh, c, k);
        c = k;
    }
    if (!sort || c <= 1) return c;
    int p = 1;
    while (p < c) p <<= 1;
    for (int i = c + (int)threadIdx.x; i < p; i += TK_THREADS) sk[i] = 0ull;
    __syncthreads();
    for (int size = 2; size <= p; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < p / 2; t += TK_THREADS) {
                const int i = 2 * t - (t & (stride - 1)), j = i + stride;
                const bool desc = (i & size) == 0;
                const unsigned long long a = sk[i], b = sk[j];
                if (desc ? a < b : a > b) {
                    sk[i] = b;
                    sk[j] = a;
                }
            }
            __syncthreads();
        }
    return c;
}

/* ---------------------------------------------------------------- kernels ---- */

static __device__ void merge_row(int r, int n_split, const struct topk_row *rows, const struct tk_part *parts,
                                 const unsigned long long *pkeys, struct topk_summary *__restrict__ sums,
                                 struct topk_cand *__restrict__ cands, unsigned long long *sk, struct tk_shared &sh);

/* Both kernels are launched with programmatic dependent launch (klaunch): they wait for
 * the kernel before them (the output layer, then topk_partial) before reading anything,
 * and every input is written or uploaded within the step, so none is read through the
 * read-only path (no const __restrict__ on them: cuda_common.cuh). */
static __global__ void __launch_bounds__(TK_THREADS)
topk_partial_kernel(const float *logits, int64_t ld, int nv, int slice, int n_split, const struct topk_row *rows,
                    const struct logit_adj *adj, int adj_cap, const uint32_t *mask, int64_t mask_ld,
                    float *__restrict__ adj_raw, struct tk_part *parts,
                    unsigned long long *pkeys, int fused, struct topk_summary *__restrict__ sums,
                    struct topk_cand *__restrict__ cands, unsigned *tk_cnt) {
    pdl_wait();
    pdl_trigger();
    __shared__ unsigned long long sk[TK_CAP];
    __shared__ uint32_t sbits[TK_BITS];
    __shared__ struct tk_shared sh;
    const int r = blockIdx.y, sp = blockIdx.x, tid = threadIdx.x;
    const struct topk_row q = rows[r];
    struct tk_part *P = parts + (int64_t)r * n_split + sp;
    unsigned long long *PK = pkeys + ((int64_t)r * n_split + sp) * TOPK_MAX;
    const int k = q.k < TOPK_MAX ? q.k : TOPK_MAX;
    if (k <= 0) return; /* the merge skips the row too */
    const int lo = sp * slice, hi = min(nv, lo + slice);
    const float *x = logits + (int64_t)r * ld;
    const bool want_raw = q.flags & TOPK_RAW, want_sum = q.flags & TOPK_SUM;
    const float inv_t = q.inv_t > 0.0f ? q.inv_t : 1.0f;
    /* the row's token mask (NULL: every token allowed) */
    const uint32_t *M = (q.flags & TOPK_MASK) && mask ? mask + (int64_t)r * mask_ld : NULL;

    /* the row's adjustments of tokens in [lo, hi): entries [e0, e1) of A */
    int an = q.adj_n;
    if (q.adj_off < 0 || an < 0 || q.adj_off > adj_cap || an > adj_cap - q.adj_off) an = 0;
    const struct logit_adj *A = adj + (an > 0 ? q.adj_off : 0);
    const int e0 = an > 0 ? lower_bound(A, 0, an, lo) : 0;
    const int e1 = an > 0 ? lower_bound(A, e0, an, hi) : 0;
    const bool has_adj = e1 > e0; /* the same in every thread */
    if (has_adj) {
        const int words = (hi - lo + 31) >> 5;
        for (int w = tid; w < words; w += TK_THREADS) sbits[w] = 0u;
        __syncthreads();
        for (int e = e0 + tid; e < e1; e += TK_THREADS) {
            const int o = A[e].token - lo;
            atomicOr(&sbits[o >> 5], 1u << (o & 31));
            const int t = A[e].token;
            adj_raw[q.adj_off + e] = !M || ((M[t >> 5] >> (t & 31)) & 1u) ? x[t] : -INFINITY;
        }
    }
    if (tid == 0) {
        sh.count = 0;
        sh.thr = 0ull;
    }
    __syncthreads();

    float mr = -INFINITY, sr = 0.0f, ma = -INFINITY, sa = 0.0f;
    int cnt = 0;
    unsigned long long best = 0ull;
    const int nround = (hi - lo + TK_ROUND - 1) / TK_ROUND;
    float cur[TK_PER];
#pragma unroll
    for (int j = 0; j < TK_PER; j++) {
        const int i = lo + j * TK_THREADS + tid;
        cur[j] = i < hi ? x[i] : NAN; /* NaN: no token (never finite) */
    }
    for (int rd = 0; rd < nround; rd++) {
        const int base = lo + rd * TK_ROUND;
        float nxt[TK_PER];
#pragma unroll
        for (int j = 0; j < TK_PER; j++) {
            const int i = base + TK_ROUND + j * TK_THREADS + tid;
            nxt[j] = i < hi ? x[i] : NAN;
        }
        unsigned long long kk[TK_PER];
#pragma unroll
        for (int j = 0; j < TK_PER; j++) {
            const int i = base + j * TK_THREADS + tid;
            const bool off = M && i < hi && !((M[i >> 5] >> (i & 31)) & 1u); /* masked */
            const float rv = off ? -INFINITY : cur[j];
            float av = rv;
            if (has_adj && !off && i < hi && ((sbits[(i - lo) >> 5] >> ((i - lo) & 31)) & 1u))
                for (int e = lower_bound(A, e0, e1, i); e < e1 && A[e].token == i; e++) av = adj_apply(av, A[e]);
            if (want_raw && rv > -INFINITY) ms_add(mr, sr, rv, 1.0f);
            kk[j] = 0ull;
            if (av > -INFINITY) {
                cnt++;
                if (want_sum) ms_add(ma, sa, av, inv_t);
                else ma = fmaxf(ma, av);
                kk[j] = dkey(av, i);
            }
        }
        if (k == 1) {
#pragma unroll
            for (int j = 0; j < TK_PER; j++) best = kk[j] > best ? kk[j] : best;
        } else {
            collect(kk, TK_PER, sh.thr, sk, sh);
            end_round(sk, sh, k);
        }
#pragma unroll
        for (int j = 0; j < TK_PER; j++) cur[j] = nxt[j];
    }

    int n_keys;
    if (k == 1) {
        best = block_max_key(best, sh);
        n_keys = best != 0ull;
        if (tid == 0) PK[0] = best;
    } else {
        n_keys = finish_keys(sk, sh, k, false);
        for (int i = tid; i < n_keys; i += TK_THREADS) PK[i] = sk[i];
    }
    block_stats(mr, sr, 1.0f, ma, sa, inv_t, cnt, sh);
    if (tid == 0) {
        struct tk_part p;
        p.max_raw = mr;
        p.sum_raw = sr;
        p.max_adj = ma;
        p.sum_adj = sa;
        p.n_finite = cnt;
        p.n_keys = n_keys;
        p.pad0 = p.pad1 = 0;
        *P = p;
    }
    if (!fused) return;
    /* the last of the row's blocks merges (its parts and keys are in memory before it counts) */
    __threadfence();
    __syncthreads();
    if (tid == 0) sh.last = atomicAdd(&tk_cnt[r], 1u) == (unsigned)(n_split - 1);
    __syncthreads();
    if (!sh.last) return;
    __threadfence();
    merge_row(r, n_split, rows, parts, pkeys, sums, cands, sk, sh);
    if (tid == 0) tk_cnt[r] = 0; /* every split has counted: ready for the next call */
}

/* One split's stats, from L2: other blocks of this kernel wrote them (the fused merge). */
static __device__ __forceinline__ struct tk_part ld_part(const struct tk_part *p) {
    static_assert(sizeof(struct tk_part) == 32, "two 16-byte loads");
    union {
        int4 v[2];
        struct tk_part p;
    } u;
    u.v[0] = __ldcg(reinterpret_cast<const int4 *>(p));
    u.v[1] = __ldcg(reinterpret_cast<const int4 *>(p) + 1);
    return u.p;
}

/* Row r's merge over its n_split parts (the whole block; sk and sh are its shared buffers):
 * the summary and the sorted candidates. Parts and keys are read through L2 (__ldcg). */
static __device__ void merge_row(int r, int n_split, const struct topk_row *rows, const struct tk_part *parts,
                                 const unsigned long long *pkeys, struct topk_summary *__restrict__ sums,
                                 struct topk_cand *__restrict__ cands, unsigned long long *sk, struct tk_shared &sh) {
    const int tid = threadIdx.x;
    const struct topk_row q = rows[r];
    const int k = q.k < TOPK_MAX ? q.k : TOPK_MAX;
    const float inv_t = q.inv_t > 0.0f ? q.inv_t : 1.0f;
    const struct tk_part *P = parts + (int64_t)r * n_split;
    const unsigned long long *PK = pkeys + (int64_t)r * n_split * TOPK_MAX;

    float mr = -INFINITY, sr = 0.0f, ma = -INFINITY, sa = 0.0f;
    int cnt = 0;
    for (int s = tid; s < n_split; s += TK_THREADS) {
        const struct tk_part ps = ld_part(P + s);
        ms_merge(mr, sr, ps.max_raw, ps.sum_raw, 1.0f);
        ms_merge(ma, sa, ps.max_adj, ps.sum_adj, inv_t);
        cnt += ps.n_finite;
    }
    if (tid == 0) {
        sh.count = 0;
        sh.thr = 0ull;
    }
    block_stats(mr, sr, 1.0f, ma, sa, inv_t, cnt, sh); /* ends with a barrier */

    int n;
    if (k == 1) {
        unsigned long long best = 0ull;
        for (int s = tid; s < n_split; s += TK_THREADS)
            if (__ldcg(&P[s].n_keys) > 0) {
                const unsigned long long b = __ldcg(PK + (int64_t)s * TOPK_MAX);
                best = b > best ? b : best;
            }
        best = block_max_key(best, sh);
        if (tid == 0) sk[0] = best;
        __syncthreads();
        n = best != 0ull;
    } else {
        /* the splits' lists as one stream of n_split * k slots */
        const int total = n_split * k;
        for (int base = 0; base < total; base += TK_ROUND) {
            unsigned long long kk[TK_PER];
#pragma unroll
            for (int j = 0; j < TK_PER; j++) {
                const int f = base + j * TK_THREADS + tid;
                const int s = f / k, i = f - s * k;
                kk[j] = f < total && i < __ldcg(&P[s].n_keys) ? __ldcg(PK + (int64_t)s * TOPK_MAX + i) : 0ull;
            }
            collect(kk, TK_PER, sh.thr, sk, sh);
            end_round(sk, sh, k);
        }
        n = finish_keys(sk, sh, k, true);
    }

    struct topk_summary *sum = sums + r;
    struct topk_cand *cand = cands + (int64_t)r * TOPK_MAX;
    for (int i = tid; i < n; i += TK_THREADS) {
        struct topk_cand c;
        c.token = key_token(sk[i]);
        c.logit = key_logit(sk[i]);
        cand[i] = c;
    }
    if (tid == 0) {
        struct topk_summary o;
        o.n_cand = n;
        o.n_finite = cnt;
        o.max_adj = n ? key_logit(sk[0]) : -INFINITY;
        o.sum_adj = sa;
        o.max_raw = mr;
        o.lse_raw = mr > -INFINITY ? mr + logf(sr) : -INFINITY;
        o.top_token = n ? key_token(sk[0]) : -1;
        o.top_logit = o.max_adj;
        *sum = o;
    }
}

/* The merge as its own kernel (above TK_CNT rows): a block per row. */
static __global__ void __launch_bounds__(TK_THREADS)
topk_merge_kernel(int n_split, const struct topk_row *rows, const struct tk_part *parts,
                  const unsigned long long *pkeys, struct topk_summary *__restrict__ sums,
                  struct topk_cand *__restrict__ cands) {
    pdl_wait();
    pdl_trigger();
    __shared__ unsigned long long sk[TK_CAP];
    __shared__ struct tk_shared sh;
    if (rows[blockIdx.x].k <= 0) return;
    merge_row((int)blockIdx.x, n_split, rows, parts, pkeys, sums, cands, sk, sh);
}

/* ---------------------------------------------------------------- launchers ---- */

/* Slices: about two blocks per SM over the step, 4K..64K tokens each, multiples of 32
 * (whole bitmap words), no empty block. */
static void plan(const struct cuda_ctx *ctx, int n_rows, int nv, int *n_split, int *slice) {
    const int sms = ctx->n_sm > 0 ? ctx->n_sm : 132;
    const int want = (2 * sms + n_rows - 1) / n_rows;
    const int most = (nv + TK_SLICE_MIN - 1) / TK_SLICE_MIN;
    const int least = (nv + TK_SLICE_MAX - 1) / TK_SLICE_MAX;
    int ns = want < most ? want : most;
    if (ns < least) ns = least;
    if (ns < 1) ns = 1;
    int sl = (nv + ns - 1) / ns;
    sl = (sl + 31) / 32 * 32;
    *slice = sl;
    *n_split = (nv + sl - 1) / sl;
}

extern "C" uint64_t cuda_topk_scratch_bytes(const struct cuda_ctx *ctx, int n_rows, int n_vocab) {
    int ns, sl;
    plan(ctx, n_rows, n_vocab, &ns, &sl);
    return (uint64_t)n_rows * ns * (sizeof(struct tk_part) + TOPK_MAX * sizeof(unsigned long long));
}

extern "C" void cuda_logits_topk(struct cuda_ctx *ctx, const struct cuda_topk_args *a) {
    if (a->n_rows <= 0 || a->n_vocab <= 0) return;
    int ns, sl;
    plan(ctx, a->n_rows, a->n_vocab, &ns, &sl);
    struct tk_part *parts = (struct tk_part *)a->scratch;
    unsigned long long *pkeys = (unsigned long long *)(parts + (int64_t)a->n_rows * ns);
    int32_t *out = (int32_t *)a->out;
    float *adj_raw = (float *)(out + topk_raw_word(a->n_rows));
    struct topk_summary *sums = (struct topk_summary *)out;
    struct topk_cand *cands = (struct topk_cand *)(out + topk_cand_word(a->n_rows));
    const int fused = a->n_rows <= TK_CNT;
    (void)klaunch(topk_partial_kernel, dim3((unsigned)ns, (unsigned)a->n_rows), dim3(TK_THREADS), 0, ctx,
                  (const float *)a->logits, a->ld, a->n_vocab, sl, ns, (const struct topk_row *)a->rows,
                  (const struct logit_adj *)a->adj, a->adj_cap, (const uint32_t *)a->mask, a->mask_ld, adj_raw,
                  parts, pkeys, fused, sums, cands,
                  ctx->topk_cnt);
    if (!fused)
        (void)klaunch(topk_merge_kernel, dim3((unsigned)a->n_rows), dim3(TK_THREADS), 0, ctx, ns,
                      (const struct topk_row *)a->rows, (const struct tk_part *)parts,
                      (const unsigned long long *)pkeys, sums, cands);
}

extern "C" int cuda_topk_counters_busy(const struct cuda_ctx *ctx) {
    return device_counters_busy(ctx->topk_cnt, TK_CNT);
}
