/* Matmul driver: picks the kernel for (weight type, ISA), quantizes X once, and hands
 * chunks of the output to the pool's threads. See cpu_matmul.h for the contract and
 * cpu_kernels.h for the kernel interface.
 *
 * Partition. The output Y[n][rows] is cut into chunks of RB weight rows (all n X rows).
 * Threads take chunks from an atomic counter (dynamic: on a shared machine one thread may
 * be descheduled, and static splits then wait for it). With the packed path a thread first
 * unpacks its chunk's rows once into its own buffer (RB is capped so that buffer stays
 * ~256 KiB, in L2), then runs the tiles over the X rows CB at a time (as many as fit in
 * ~512 KiB of quantized X, so an X chunk stays in L2 while the chunk's rows sweep it):
 * the weights are unpacked once per matmul, and X chunks come from L3 once per row chunk.
 * (Until 2026-12-02 the column chunks were the outer loop and the rows were unpacked again
 * for each: up to 7x for k = 8192 at n = 128, a quarter of a Q8_0 prefill matmul.) Inside
 * a chunk, 4 weight rows at a time are dotted against CB X rows. RB is a multiple of 16
 * rows so two threads never write the same 64-byte line of Y (apart from Y's own
 * misalignment). Decode on repacked weights takes chunks of whole groups (gemv kernels).
 * A batch (cpu_matmul_batch) runs several products' chunks from one counter: one fork-join.
 */
#include "backend/cpu/cpu_matmul.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/cpu_kernels.h"
#include "quant/quant.h"

static struct cpu_kernel g_tab[CPU_ISA_COUNT][QT_COUNT];
static cpu_quant_fn g_quant[CPU_ISA_COUNT][CPU_ACT_COUNT]; /* [isa][activation format] */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
    memset(g_tab, 0, sizeof g_tab);
    cpu_kernels_scalar(g_tab[CPU_ISA_SCALAR]);
    g_quant[CPU_ISA_SCALAR][CPU_ACT_Q8_32] = cpu_quantize_q8_32_scalar;
    g_quant[CPU_ISA_SCALAR][CPU_ACT_Q8_K] = cpu_quantize_q8_K_scalar;
    g_quant[CPU_ISA_SCALAR][CPU_ACT_X2_32] = cpu_quantize_x2_32_scalar;
    g_quant[CPU_ISA_SCALAR][CPU_ACT_X16_32] = cpu_quantize_x16_32_scalar;
    g_quant[CPU_ISA_SCALAR][CPU_ACT_X16_64] = cpu_quantize_x16_64_scalar;
    g_quant[CPU_ISA_SCALAR][CPU_ACT_XK] = cpu_quantize_xk_scalar;
    g_quant[CPU_ISA_SCALAR][CPU_ACT_X16_K] = cpu_quantize_x16_k_scalar;
    for (int i = 1; i < CPU_ISA_COUNT; i++) {
        memcpy(g_tab[i], g_tab[CPU_ISA_SCALAR], sizeof g_tab[0]);
        memcpy(g_quant[i], g_quant[CPU_ISA_SCALAR], sizeof g_quant[0]);
    }
#if defined(__x86_64__)
    /* A level's table functions are compiled with its flags and may use its instructions
     * themselves (gcc fills the table with EVEX stores in cpu_kernels_avx512): call them
     * only where the CPU has the level. Levels above stay copies of the one below, which
     * clamp_isa never hands out. */
    if (cpu_isa_supported() < CPU_ISA_AVX2) return;
    cpu_kernels_avx2(g_tab[CPU_ISA_AVX2]);
    cpu_gemv_avx2(g_tab[CPU_ISA_AVX2]);
    g_quant[CPU_ISA_AVX2][CPU_ACT_XK] = cpu_quantize_xk_avx2;
    g_quant[CPU_ISA_AVX2][CPU_ACT_Q8_32] = cpu_quantize_q8_32_avx2;
    g_quant[CPU_ISA_AVX2][CPU_ACT_Q8_K] = cpu_quantize_q8_K_avx2;
    g_quant[CPU_ISA_AVX2][CPU_ACT_X2_32] = cpu_quantize_x2_32_avx2;
    g_quant[CPU_ISA_AVX2][CPU_ACT_X16_32] = cpu_quantize_x16_32_avx2;
    g_quant[CPU_ISA_AVX2][CPU_ACT_X16_K] = cpu_quantize_x16_k_avx2;
    memcpy(g_tab[CPU_ISA_AVX512], g_tab[CPU_ISA_AVX2], sizeof g_tab[0]);
    memcpy(g_quant[CPU_ISA_AVX512], g_quant[CPU_ISA_AVX2], sizeof g_quant[0]);
    if (cpu_isa_supported() < CPU_ISA_AVX512) return;
    cpu_kernels_avx512(g_tab[CPU_ISA_AVX512]);
    cpu_gemv_avx512(g_tab[CPU_ISA_AVX512]);
    g_quant[CPU_ISA_AVX512][CPU_ACT_X16_64] = cpu_quantize_x16_64_avx512;
    g_quant[CPU_ISA_AVX512][CPU_ACT_XK] = cpu_quantize_xk_avx512;
#endif
}

static enum cpu_isa clamp_isa(enum cpu_isa isa) {
    enum cpu_isa sup = cpu_isa_supported();
    if ((int)isa < 0) return CPU_ISA_SCALAR;
    return isa > sup ? sup : isa;
}

bool cpu_matmul_has_kernel(uint32_t wtype, enum cpu_isa isa) {
    pthread_once(&g_once, init_tables);
    if (wtype >= QT_COUNT) return false;
    const struct cpu_kernel *kn = &g_tab[clamp_isa(isa)][wtype];
    return kn->gemm != NULL || kn->gemm_packed != NULL;
}

const struct cpu_kernel *cpu_matmul_kernel(uint32_t wtype, enum cpu_isa isa) {
    pthread_once(&g_once, init_tables);
    return wtype < QT_COUNT ? &g_tab[clamp_isa(isa)][wtype] : NULL;
}

bool cpu_matmul_supports(uint32_t wtype) {
    if (cpu_matmul_has_kernel(wtype, CPU_ISA_SCALAR)) return true;
    const struct qtype_info *qi = qtype_get(wtype);
    return qi && qi->dequantize;
}

struct cpu_rweight {
    uint32_t type;
    enum cpu_isa isa;
    int G;
    int64_t rows, k, ngroups;
    size_t group_bytes; /* G rows: k / block × G × block bytes */
    char *data;
};

struct mm_job {
    const struct cpu_kernel *kern;
    const struct cpu_rweight *rw; /* repacked weights (NULL: w in the file layout) */
    bool gemv;                    /* decode on rw: chunks of rb groups, the gemv kernel */
    cpu_gemm_fn gemm;   /* the tile kernel (F32 kernel for the dequantize fallback) */
    cpu_quant_fn quant; /* activation quantizer (NULL: X used as is) */
    void (*dequant)(const void *src, float *dst, int64_t n); /* fallback only */
    const char *w;
    size_t wstride;
    int64_t rows, k, n, nb; /* nb: blocks per row */
    const float *x;
    char *xq;       /* quantized X (or X itself) */
    size_t xstride; /* bytes between X rows in xq (all planes of a row) */
    size_t pstride; /* bytes between the kernel's activation rows (planes) */
    int planes;     /* activation rows per X row (cpu_act_planes) */
    float *y;
    cpu_pack_fn pack; /* packed prefill path (NULL: off) */
    size_t packed_row;
    int64_t rb, cb, n_chunks;
    /* per-thread work area (at tbuf + ith * tstride, shared by the jobs of a batch: a
     * thread runs one chunk at a time): the fallback's dequantized row (k floats), or the
     * packed rows (rb * packed_row bytes, then G unrepacked rows with rw), then at ptmp_off,
     * with two planes, 2·cb·CPU_MR floats of per-plane results */
    size_t tbytes, ptmp_off;
};

/* A batch: its jobs, the chunk counter over all of them (job i owns chunks
 * [first[i], first[i + 1])), the shared per-thread areas. */
struct mm_batch {
    struct mm_job *job;
    int n_job;
    int64_t *first;
    char *tbuf;
    size_t tstride;
    _Alignas(64) atomic_llong next;
};

static void quant_task(void *arg, int ith, int nth) {
    struct mm_batch *b = arg;
    for (int q = 0; q < b->n_job; q++) {
        struct mm_job *j = &b->job[q];
        if (!j->quant) continue;
        int64_t per = (j->n + nth - 1) / nth;
        int64_t c0 = per * ith, c1 = c0 + per > j->n ? j->n : c0 + per;
        for (int64_t c = c0; c < c1; c++)
            j->quant(j->x + c * j->k, j->xq + c * j->xstride, j->k);
    }
}

/* Packs rows r0..r1-1 into the thread's area (from the repacked groups or the file). */
static void pack_rows(const struct mm_job *j, char *buf, int64_t r0, int64_t r1) {
    if (!j->rw) {
        j->pack(j->k, j->w + r0 * j->wstride, j->wstride, (int)(r1 - r0), 0, j->nb, buf);
        return;
    }
    /* a few blocks of one group at a time back to the file layout (in L1), then packed;
     * the next blocks' bytes are prefetched while these are packed */
    const struct cpu_rweight *rw = j->rw;
    char *tmp = buf + (size_t)j->rb * j->packed_row;
    const int64_t nb = j->nb;
    const size_t tile = (size_t)rw->G * (j->wstride / (size_t)nb);
    int64_t step = (int64_t)(8192 / tile) & ~(int64_t)1;
    if (step < 2) step = 2;
    for (int64_t r = r0; r < r1; r += rw->G) {
        int nr = r1 - r < rw->G ? (int)(r1 - r) : rw->G;
        const char *grp = rw->data + (r / rw->G) * rw->group_bytes;
        for (int64_t b0 = 0; b0 < nb; b0 += step) {
            int64_t b1 = b0 + step < nb ? b0 + step : nb;
            const char *nx = grp + (size_t)b1 * tile;
            for (size_t o = 0; b1 < nb && o < (size_t)step * tile; o += 64)
                __builtin_prefetch(nx + o);
            if (j->kern->pack_grp) { /* the kernel is the group layout's level's */
                j->kern->pack_grp(j->k, grp, nr, b0, b1, buf + (r - r0) * j->packed_row);
                continue;
            }
            j->kern->unrepack(rw->type, grp, nr, b0, b1, tmp, j->wstride);
            j->pack(j->k, tmp, j->wstride, nr, b0, b1, buf + (r - r0) * j->packed_row);
        }
    }
}

/* Chunk i of job j on a thread whose work area is `area`: RB weight rows against all n X
 * rows, CB X rows at a time (the packed rows are made once and reused for every X chunk);
 * or, decoding on repacked weights, rb groups through the gemv kernel. */
static void run_chunk(const struct mm_job *j, int64_t i, char *area) {
    if (j->gemv) {
        const struct cpu_rweight *rw = j->rw;
        int64_t g0 = i * j->rb, g1 = g0 + j->rb > rw->ngroups ? rw->ngroups : g0 + j->rb;
        for (int64_t g = g0; g < g1; g++) {
            int64_t r = g * rw->G;
            int nr = rw->rows - r < rw->G ? (int)(rw->rows - r) : rw->G;
            j->kern->gemv(j->k, rw->data + g * rw->group_bytes, j->xq, j->xstride, j->y + r,
                          (size_t)rw->rows, nr, (int)j->n);
        }
        return;
    }
    int64_t r0 = i * j->rb, r1 = r0 + j->rb > j->rows ? j->rows : r0 + j->rb;
    if (j->dequant) {
        float *buf = (float *)area;
        for (int64_t r = r0; r < r1; r++) {
            j->dequant(j->w + r * j->wstride, buf, j->k);
            j->gemm(j->k, buf, 0, j->xq, j->xstride, j->y + r, (size_t)j->rows, 1, (int)j->n);
        }
        return;
    }
    const char *wbase = j->w;
    size_t wstride = j->wstride;
    int64_t rbase = 0;
    if (j->pack) {
        pack_rows(j, area, r0, r1);
        wbase = area;
        wstride = j->packed_row;
        rbase = r0;
    }
    for (int64_t c0 = 0; c0 < j->n; c0 += j->cb) {
        int64_t nc = c0 + j->cb > j->n ? j->n - c0 : j->cb;
        const char *xc = j->xq + c0 * j->xstride;
        float *yc = j->y + c0 * j->rows;
        if (j->planes == 2) { /* hi and lo rows interleaved: 2·nc kernel columns */
            float *t = (float *)(area + j->ptmp_off);
            for (int64_t r = r0; r < r1; r += CPU_MR) {
                int nr = r1 - r < CPU_MR ? (int)(r1 - r) : CPU_MR;
                j->gemm(j->k, wbase + (r - rbase) * wstride, wstride, xc, j->pstride, t, CPU_MR,
                        nr, (int)(2 * nc));
                for (int64_t c = 0; c < nc; c++)
                    for (int q = 0; q < nr; q++)
                        yc[c * j->rows + r + q] = t[2 * c * CPU_MR + q] + t[(2 * c + 1) * CPU_MR + q];
            }
            continue;
        }
        for (int64_t r = r0; r < r1; r += CPU_MR) {
            int nr = r1 - r < CPU_MR ? (int)(r1 - r) : CPU_MR;
            j->gemm(j->k, wbase + (r - rbase) * wstride, wstride, xc, j->pstride, yc + r,
                    (size_t)j->rows, nr, (int)nc);
        }
    }
}

static void gemm_task(void *arg, int ith, int nth) {
    struct mm_batch *b = arg;
    (void)nth;
    char *area = b->tbuf ? b->tbuf + (size_t)ith * b->tstride : NULL; /* NULL: none needed */
    int q = 0;
    for (;;) {
        long long i = atomic_fetch_add_explicit(&b->next, 1, memory_order_relaxed);
        if (i >= b->first[b->n_job]) break;
        while (i >= b->first[q + 1]) q++; /* chunks are taken in increasing order */
        run_chunk(&b->job[q], i - b->first[q], area);
    }
}

/* Chooses RB x CB chunks: enough chunks for balance, big enough to amortize the counter. */
static void plan(struct mm_job *j, int nth) {
    int64_t rows = j->rows, n = j->n;
    if (j->gemv) { /* chunks of whole groups: ~8 per thread */
        int64_t per = (j->rw->ngroups + 8 * nth - 1) / (8 * nth);
        j->rb = per < 1 ? 1 : per;
        j->n_chunks = (j->rw->ngroups + j->rb - 1) / j->rb;
        return;
    }
    /* Column chunk: X rows whose quantized bytes fit comfortably in L2 (~512 KiB). */
    int64_t cb = (int64_t)((512 * 1024) / (j->xstride ? j->xstride : 1));
    if (cb < 4) cb = 4;
    if (cb > n) cb = n;
    /* Row chunk: at least 16 rows; aim for >= 4 chunks per thread (8 for decode, where
     * chunks are cheap and balance matters most). */
    int64_t want = (int64_t)nth * (n == 1 ? 8 : 4);
    int64_t rb = (rows + want - 1) / want;
    rb = (rb + 15) & ~(int64_t)15;
    if (rb < 16) rb = 16;
    if (n > 1 && rb > 256) rb = 256; /* weights of a chunk stay near L2 */
    if (j->pack) { /* the packed rows of a chunk: ~256 KiB per thread, in L2 beside X */
        int64_t cap = (int64_t)((256 * 1024) / j->packed_row) & ~(int64_t)15;
        if (cap < 16) cap = 16;
        if (rb > cap) rb = cap;
    }
    j->rb = rb;
    j->cb = cb;
    j->n_chunks = (rows + rb - 1) / rb;
}

/* Decode on repacked weights runs the gemv kernels up to the level's gemv_max_n X rows for
 * the type, 3 where the level does not say (the results are the same bits either way: the
 * kernels do the packed path's arithmetic). */
#define GEMV_MAX_N_DEFAULT 3

/* Checks one product and fills its job (kernel, activation format, plan, the sizes of its
 * per-thread area); *xbytes gets the bytes of its quantized X (0: X is used as is). */
static smelt_status job_init(struct mm_job *j, enum cpu_isa isa, const struct cpu_mm *m, int nth,
                             size_t *xbytes, struct err *e) {
    const struct cpu_rweight *rw = m->rw;
    const uint32_t wtype = rw ? rw->type : m->wtype;
    const int64_t rows = rw ? rw->rows : m->rows, k = rw ? rw->k : m->k;
    if (rw) isa = rw->isa; /* the layout is the level's it was repacked for */
    const struct qtype_info *qi = qtype_get(wtype);
    if (!qi) return err_set(e, SMELT_ERR_UNSUPPORTED, "matmul: unknown weight type id %u", wtype);
    if (rows < 0 || m->n < 0 || k <= 0)
        return err_set(e, SMELT_ERR_INVALID, "matmul %s: bad shape rows=%lld k=%lld n=%lld",
                       qi->name, (long long)rows, (long long)k, (long long)m->n);
    if (k % qi->blck_size)
        return err_set(e, SMELT_ERR_INVALID,
                       "matmul %s: row length %lld is not a multiple of the block size %u",
                       qi->name, (long long)k, qi->blck_size);
    memset(j, 0, sizeof *j);
    *xbytes = 0;
    const struct cpu_kernel *kern = &g_tab[isa][wtype];
    enum cpu_act act = kern->act;
    j->kern = kern;
    j->rw = rw;
    j->gemv = rw && m->n <= (kern->gemv_max_n ? kern->gemv_max_n : GEMV_MAX_N_DEFAULT);
    j->gemm = kern->gemm;
    if (!j->gemm && !kern->gemm_packed) {
        if (!qi->dequantize)
            return err_set(e, SMELT_ERR_UNSUPPORTED, "matmul: no CPU kernel for weight type %s",
                           qi->name);
        j->dequant = qi->dequantize;
        j->gemm = g_tab[isa][QT_F32].gemm;
        act = CPU_ACT_F32;
    }
    j->w = m->w;
    j->wstride = (size_t)qtype_row_size(wtype, k);
    j->rows = rows;
    j->k = k;
    j->nb = k / qi->blck_size;
    j->n = m->n;
    j->x = m->x;
    j->y = m->y;
    j->planes = 1;
    /* The packed path at every n where the level has a repacked decode kernel (or no
     * other kernel), so that a row gets the same bits whatever the path. */
    if (j->gemv) {
        act = kern->act_gemv;
    } else if (kern->pack && !j->dequant && (m->n >= CPU_PACK_MIN_N || !kern->gemm || kern->gemv)) {
        j->pack = kern->pack;
        j->gemm = kern->gemm_packed;
        j->packed_row = kern->packed_row_bytes(k);
        if (kern->act_packed != CPU_ACT_NONE) act = kern->act_packed;
    }
    if (act == CPU_ACT_F32) {
        j->xq = (char *)m->x;
        j->xstride = j->pstride = (size_t)k * sizeof(float);
    } else {
        j->quant = g_quant[isa][act];
        j->planes = cpu_act_planes(act);
        j->pstride = cpu_act_row_bytes(act, k);
        j->xstride = j->pstride * (size_t)j->planes;
        *xbytes = j->xstride * (size_t)m->n;
    }
    if (rows == 0 || m->n == 0) {
        j->n_chunks = 0;
        return SMELT_OK;
    }
    plan(j, nth);
    size_t a = 0;
    if (j->dequant) a = (size_t)k * sizeof(float);
    if (j->pack) a = (size_t)j->rb * j->packed_row + (rw ? (size_t)rw->G * j->wstride : 0);
    j->ptmp_off = (a + 63) & ~(size_t)63;
    j->tbytes = j->ptmp_off;
    if (j->planes == 2) j->tbytes += (size_t)(2 * j->cb * CPU_MR) * sizeof(float);
    return SMELT_OK;
}

smelt_status cpu_matmul_batch_isa(struct cpu_pool *p, enum cpu_isa isa, const struct cpu_mm *mm,
                                  int n_mm, struct arena *scratch, struct err *e) {
    pthread_once(&g_once, init_tables);
    isa = clamp_isa(isa);
    if (n_mm <= 0) return SMELT_OK;
    const int nth = cpu_pool_size(p);
    /* the jobs, their chunk offsets, each one's quantized X, the shared per-thread areas */
    size_t head = (size_t)n_mm * sizeof(struct mm_job) + (size_t)(n_mm + 1) * sizeof(int64_t);
    void *heap = NULL;
    char *mem = scratch ? arena_alloc(scratch, head) : (heap = malloc(head));
    if (!mem) return err_set(e, SMELT_ERR_NOMEM, "matmul: out of memory for %d products", n_mm);
    struct mm_batch b = {.job = (struct mm_job *)mem, .n_job = n_mm};
    b.first = (int64_t *)(mem + (size_t)n_mm * sizeof(struct mm_job));
    size_t xtotal = 0, tstride = 0;
    smelt_status st = SMELT_OK;
    b.first[0] = 0;
    for (int q = 0; q < n_mm && st == SMELT_OK; q++) {
        size_t xb = 0;
        st = job_init(&b.job[q], isa, &mm[q], nth, &xb, e);
        xtotal += (xb + 63) & ~(size_t)63;
        if (b.job[q].tbytes > tstride) tstride = b.job[q].tbytes;
        b.first[q + 1] = b.first[q] + b.job[q].n_chunks;
    }
    void *heap2 = NULL;
    tstride = (tstride + 63) & ~(size_t)63;
    size_t all = xtotal + tstride * (size_t)nth;
    char *buf = NULL;
    if (st == SMELT_OK && all) {
        buf = scratch ? arena_alloc(scratch, all) : (heap2 = aligned_alloc(64, all));
        if (!buf)
            st = err_set(e, SMELT_ERR_NOMEM, "matmul: out of memory for %zu scratch bytes", all);
    }
    if (st == SMELT_OK && b.first[n_mm] > 0) {
        bool any_quant = false;
        int64_t n_max = 0;
        for (int q = 0; q < n_mm; q++) {
            struct mm_job *j = &b.job[q];
            if (j->quant) {
                j->xq = buf;
                buf += (j->xstride * (size_t)j->n + 63) & ~(size_t)63;
                any_quant = true;
            }
            if (j->n > n_max) n_max = j->n;
        }
        b.tbuf = buf;
        b.tstride = tstride;
        if (any_quant) {
            if (n_max < 4 || nth == 1) quant_task(&b, 0, 1);
            else cpu_pool_run(p, quant_task, &b);
        }
        atomic_init(&b.next, 0);
        if (nth == 1 || b.first[n_mm] == 1) gemm_task(&b, 0, 1);
        else cpu_pool_run(p, gemm_task, &b);
    }
    free(heap2);
    free(heap);
    return st;
}

smelt_status cpu_matmul_isa(struct cpu_pool *p, enum cpu_isa isa, uint32_t wtype, const void *w,
                            int64_t rows, int64_t k, const float *x, int64_t n, float *y,
                            struct arena *scratch, struct err *e) {
    const struct cpu_mm m = {wtype, w, rows, k, x, n, y, NULL};
    return cpu_matmul_batch_isa(p, isa, &m, 1, scratch, e);
}

smelt_status cpu_matmul(struct cpu_pool *p, uint32_t wtype, const void *w, int64_t rows, int64_t k,
                        const float *x, int64_t n, float *y, struct arena *scratch, struct err *e) {
    return cpu_matmul_isa(p, cpu_isa_best(), wtype, w, rows, k, x, n, y, scratch, e);
}

smelt_status cpu_matmul_batch(struct cpu_pool *p, const struct cpu_mm *mm, int n_mm,
                              struct arena *scratch, struct err *e) {
    return cpu_matmul_batch_isa(p, cpu_isa_best(), mm, n_mm, scratch, e);
}

/* ---- repacked weights ---- */

struct rp_job {
    struct cpu_rweight *rw;
    const struct cpu_kernel *kern;
    const char *w;
    size_t wstride;
};

static void repack_task(void *arg, int ith, int nth) {
    struct rp_job *j = arg;
    struct cpu_rweight *rw = j->rw;
    for (int64_t g = ith; g < rw->ngroups; g += nth) {
        int64_t r = g * rw->G;
        int nr = rw->rows - r < rw->G ? (int)(rw->rows - r) : rw->G;
        j->kern->repack(rw->type, rw->k, j->w + r * j->wstride, j->wstride, nr,
                        rw->data + g * rw->group_bytes);
    }
}

smelt_status cpu_matmul_repack(struct cpu_pool *p, enum cpu_isa isa, uint32_t wtype, const void *w,
                               int64_t rows, int64_t k, struct cpu_rweight **out, struct err *e) {
    pthread_once(&g_once, init_tables);
    *out = NULL;
    isa = clamp_isa(isa);
    const struct qtype_info *qi = qtype_get(wtype);
    if (!qi || wtype >= QT_COUNT || !g_tab[isa][wtype].gemv) return SMELT_OK;
    if (rows <= 0 || k <= 0 || k % qi->blck_size)
        return err_set(e, SMELT_ERR_INVALID, "repack %s: bad shape rows=%lld k=%lld", qi->name,
                       (long long)rows, (long long)k);
    const struct cpu_kernel *kern = &g_tab[isa][wtype];
    struct cpu_rweight *rw = calloc(1, sizeof *rw);
    if (!rw) return err_set(e, SMELT_ERR_NOMEM, "repack %s: out of memory", qi->name);
    rw->type = wtype;
    rw->isa = isa;
    rw->G = kern->G;
    rw->rows = rows;
    rw->k = k;
    rw->ngroups = (rows + rw->G - 1) / rw->G;
    rw->group_bytes = (size_t)(k / qi->blck_size) * (size_t)rw->G * qi->type_size;
    size_t bytes = rw->group_bytes * (size_t)rw->ngroups;
    rw->data = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    /* the copy on 2 MiB pages where the kernel gives them (transparent huge pages in madvise
     * mode), the aligned interior of the allocation: a decode step streams every byte once,
     * and each 4 KiB page would be a TLB miss (a two-level walk in a virtual machine) */
    const uintptr_t huge = (uintptr_t)2 << 20, at = (uintptr_t)rw->data;
    const uintptr_t h0 = (at + huge - 1) & ~(huge - 1), h1 = (at + bytes) & ~(huge - 1);
    if (rw->data && h1 > h0) madvise((void *)h0, h1 - h0, MADV_HUGEPAGE);
    if (!rw->data) {
        free(rw);
        return err_set(e, SMELT_ERR_NOMEM, "repack %s: out of memory for %zu bytes (%lld x %lld)",
                       qi->name, bytes, (long long)rows, (long long)k);
    }
    struct rp_job j = {rw, kern, w, (size_t)qtype_row_size(wtype, k)};
    if (cpu_pool_size(p) > 1 && rw->ngroups > 1)
        cpu_pool_run(p, repack_task, &j);
    else
        repack_task(&j, 0, 1);
    *out = rw;
    return SMELT_OK;
}

void cpu_rweight_free(struct cpu_rweight *rw) {
    if (!rw) return;
    free(rw->data);
    free(rw);
}

size_t cpu_rweight_bytes(const struct cpu_rweight *rw) {
    return rw ? rw->group_bytes * (size_t)rw->ngroups : 0;
}

smelt_status cpu_matmul_rw(struct cpu_pool *p, const struct cpu_rweight *rw, const float *x,
                           int64_t n, float *y, struct arena *scratch, struct err *e) {
    const struct cpu_mm m = {rw->type, NULL, rw->rows, rw->k, x, n, y, rw};
    return cpu_matmul_batch_isa(p, rw->isa, &m, 1, scratch, e);
}
