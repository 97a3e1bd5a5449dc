/* The CUDA backend's matrix products: y (+)= W x for any number of token rows, by one of
 * three paths (mmv in chunks of 8 rows, the tensor-core kernel with one of its tiles, F16
 * dequantization + cuBLAS), the path measured on this GPU per weight shape and token-row
 * bucket at first use and recorded in the backend's table (mm_tune.h). The section comment
 * below ("the paths and the choice between them") gives the rules and the contract with
 * the step graphs; docs/cuda-backend.md ("Choosing the path by measurement") the figures. */
#include "backend/cuda/cuda_backend_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/log.h"

/* ---- matrix products ---- */

const struct cuda_qweight *cu_qw_of(struct cuda_backend *cb, const struct tensor *w) {
    if (!w->extra) bk_fail(&cb->base, SMELT_ERR_INTERNAL, "tensor %s: not a bound GPU weight",
                           w->name ? w->name : "?");
    return w->extra;
}

/* ---- matrix products: the paths and the choice between them ----
 *
 * Three paths compute y (rows, n) (+)= W x: the mmv kernels in chunks of 8 token rows
 * ("mmv"), the tensor-core kernel with one of its fixed tiles ("mmq", cuda_mmq.h), and
 * F16 dequantization in row tiles + cuBLAS ("gemm"). A choice (mm_tune.h) names one:
 * MMTUNE_MMV, MMTUNE_GEMM, a tile >= 0, or MMTUNE_MMQ_AUTO (mmq, static tile per shape).
 *
 * Path choice by measurement (issue #6: "the switch points are measured per GPU").
 * Up to 8 rows are always mmv. Above, for the types mmq has, the first call of each key
 * (weight type, rows, k, token-row bucket: mm_tune.c gives the buckets and why) that
 * happens outside stream capture times every candidate on the real weights and
 * activations: each mmq tile that fits the device (and is not mostly padding for n),
 * gemm, and below 33 rows repeated mmv; 1 warm-up + MMTUNE_RUNS timed runs each, bracketed
 * by events, an L2-sized memset before each so the weights come from HBM as in a real
 * step; the median counts. The candidates write to y when the call overwrites it anyway
 * (!acc) and to scratch otherwise; then the fastest runs once more for the real output.
 * The winner is recorded in cb->tune and every later call of the key in any bucket-mate
 * shape uses it. Cost: sum over candidates of 4 x (its time + the flush, ~35 us on an
 * H200) per key, a few dozen keys per model: docs/cuda-backend.md gives the estimate, and
 * the backend logs the table and the time spent when it is freed.
 *
 * Contract with the step graphs (cu_graph_*):
 *   1. The table is write-once: a key's recorded choice never changes for the backend's
 *      lifetime, so a graph captured with it runs what every later eager call runs.
 *   2. Timing (events, a sync) happens only while the stream is not capturing (our own
 *      capture, cb->capturing, or anyone's: cudaStreamIsCapturing). A key first seen
 *      during capture gets the static choice for that call and is not recorded; the key's
 *      next eager call measures it.
 *   3. model_forward runs the first step of every graph key eagerly and captures only a
 *      later step of the same key, which presents the same matmul shapes: so every key a
 *      captured step contains was recorded in that eager step, and (1) makes the capture
 *      use the same kernels. Case (2) arises only for a caller capturing shapes it never
 *      ran eagerly; its graph keeps the static kernel (a correct product, possibly slower)
 *      and a later measured choice does not touch it. Results of two choices differ by
 *      float rounding only (order of the K sum).
 *   4. Tuning allocates scratch inside the call (released before it returns); a stack that
 *      grows invalidates every graph as any growing step does (stack_reset), so a graph
 *      never points into memory a tuning run moved.
 *   5. Failure to measure (out of scratch, event errors, every candidate failing) records
 *      the static choice, so the key stays stable; a failed candidate is skipped.
 * Overrides (read at creation): SMELT_NO_TUNE=1 static choices only; SMELT_MMQ_TILE=N
 * static choices with tile N wherever they use mmq; SMELT_MMQ_MAX_ROWS=N fixes the
 * mmq/gemm switch at N rows (0 = no mmq) and leaves only the tile to measure;
 * SMELT_GEMM_MIN_ROWS=N moves the mmv/gemm switch (tests: plain-float weights on mmv keep F32
 * activations, where cuBLAS rounds them to F16). Static choice: mmq with cuda_mmq's heuristic
 * tile for 9..MMQ_MAX_ROWS rows, mmv below GEMM_MIN_ROWS, else gemm. */

_Static_assert(MMTUNE_MMQ_AUTO == CUDA_MMQ_TILE_AUTO, "a choice is passed to cuda_mmq_pre as its tile");

#define ALIGN_UP(v) (((uint64_t)(v) + SCRATCH_ALIGN - 1) & ~(uint64_t)(SCRATCH_ALIGN - 1))
#define TUNE_FLUSH_MAX ((uint64_t)256 << 20) /* L2 flush buffer cap (2 x the L2 size) */

static int64_t gemm_tile_rows(const struct cuda_qweight *qw) {
    int64_t tile = (int64_t)(GEMM_TILE_BYTES / ((size_t)qw->k * 2));
    if (tile < 64) tile = 64;
    if (tile > qw->rows) tile = qw->rows;
    return tile;
}

/* Scratch bytes path `choice` needs (one region; path_run carves it). */
static smelt_status path_scratch(struct cuda_backend *cb, const struct cuda_qweight *qw, int choice, int64_t n,
                                 const void *xq, uint64_t *bytes, struct err *e) {
    *bytes = 0;
    if (choice == MMTUNE_GEMM) {
        if (qw->type != QT_F32)
            *bytes = ALIGN_UP(qw->k * n * 2) + (qw->type == QT_F16 ? 0 : ALIGN_UP(gemm_tile_rows(qw) * qw->k * 2));
        return SMELT_OK;
    }
    if (choice == MMTUNE_MMB) return cuda_mmb_scratch_bytes(&cb->ctx, qw->rows, qw->k, n, bytes, e);
    if (choice == MMTUNE_MMV) {
        if (cuda_mmv_needs_quant(qw->type) && (!xq || n > CUDA_MMV_MAX_N))
            *bytes = cuda_mmv_scratch_bytes(qw->k, CUDA_MMV_MAX_N);
        return SMELT_OK;
    }
    return cuda_mmq_scratch_bytes(&cb->ctx, qw->rows, qw->k, n, bytes, e);
}

/* y (rows, n) (+)= W x through cuBLAS: x to F16 at sc, W dequantized to F16 in row tiles
 * after it (F32 weights go straight to an FP32 GEMM; F16 ones need no tile copy). */
static smelt_status gemm_run(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n,
                             float *y, bool acc, void *sc, struct err *e) {
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    int64_t k = qw->k, rows = qw->rows;
    cublasStatus_t cs;
    if (qw->type == QT_F32) {
        cs = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)k, &alpha, qw->q,
                          CUDA_R_32F, (int)k, x, CUDA_R_32F, (int)k, &beta, y, CUDA_R_32F, (int)rows,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cu_prof_mark(cb, qw->bytes, "%scublas f32 gemm n=%lld k=%lld", cb->tuning ? "tune " : "", (long long)n,
                  (long long)k);
    } else {
        void *xh = sc;
        void *wh = (unsigned char *)sc + ALIGN_UP(k * n * 2);
        int64_t tile = gemm_tile_rows(qw);
        cuda_f32_to_f16(&cb->ctx, xh, x, k * n);
        cu_prof_mark(cb, 0, "%sact f32->f16", cb->tuning ? "tune " : "");
        cs = CUBLAS_STATUS_SUCCESS;
        if (qw->type == QT_F16) { /* F16 weights are already what cuBLAS reads: no tile copy */
            cs = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)k, &alpha, qw->q,
                              CUDA_R_16F, (int)k, xh, CUDA_R_16F, (int)k, &beta, y, CUDA_R_32F, (int)rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            cu_prof_mark(cb, qw->bytes, "%scublas f16 gemm n=%lld k=%lld", cb->tuning ? "tune " : "", (long long)n,
                      (long long)k);
        }
        for (int64_t r0 = qw->type == QT_F16 ? rows : 0; r0 < rows && cs == CUBLAS_STATUS_SUCCESS; r0 += tile) {
            int64_t nr = rows - r0 < tile ? rows - r0 : tile;
            cuda_dequant_f16(&cb->ctx, wh, qw, r0, nr);
            cu_prof_mark(cb, qw->bytes * (uint64_t)nr / (uint64_t)rows, "%sdequant %s->f16", cb->tuning ? "tune " : "",
                      qtype_name(qw->type));
            cs = cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n, (int)k, &alpha, wh,
                              CUDA_R_16F, (int)k, xh, CUDA_R_16F, (int)k, &beta, y + r0, CUDA_R_32F,
                              (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            cu_prof_mark(cb, (uint64_t)(nr * k) * 2, "%scublas f16 gemm n=%lld k=%lld", cb->tuning ? "tune " : "",
                      (long long)n, (long long)k);
        }
    }
    if (cs != CUBLAS_STATUS_SUCCESS)
        return err_set(e, SMELT_ERR_DEVICE, "cuBLAS GEMM failed (status %d), %s %lldx%lld, %lld rows", (int)cs,
                       qtype_name(qw->type), (long long)rows, (long long)k, (long long)n);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) return err_set(e, SMELT_ERR_DEVICE, "GEMM: %s", cudaGetErrorString(rc));
    return SMELT_OK;
}

/* y (+)= W x by the mmv kernels in chunks of CUDA_MMV_MAX_N rows; xq: x's quantized form
 * when n <= 8 and a matmul group already made it, else sc (path_scratch bytes) takes it. */
static smelt_status mmv_run(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n,
                            float *y, bool acc, const void *xq, void *sc, struct err *e) {
    const bool quant = cuda_mmv_needs_quant(qw->type);
    const void *xs = quant && (!xq || n > CUDA_MMV_MAX_N) ? sc : xq;
    for (int64_t t0 = 0; t0 < n; t0 += CUDA_MMV_MAX_N) {
        int nt = (int)(n - t0 < CUDA_MMV_MAX_N ? n - t0 : CUDA_MMV_MAX_N);
        const float *xt = x + t0 * qw->k;
        smelt_status st = SMELT_OK;
        if (quant && xs != xq) {
            st = cuda_mmv_quantize(&cb->ctx, xt, qw->k, nt, (void *)xs, e);
            cu_prof_mark(cb, 0, "%squantize act", cb->tuning ? "tune " : "");
        }
        if (st == SMELT_OK) st = cuda_mmv_pre(&cb->ctx, qw, xt, nt, y + t0 * qw->rows, xs, acc, e);
        cu_prof_mark(cb, qw->bytes, "%smmv %s %lldx%lld n=%d", cb->tuning ? "tune " : "", qtype_name(qw->type),
                  (long long)qw->rows, (long long)qw->k, nt);
        if (st != SMELT_OK) return st;
    }
    return SMELT_OK;
}

/* y (+)= W x by path `choice`, scratch sc of sc_bytes (path_scratch). Enqueues only (no
 * sync: capturable); errors are argument, launch and cuBLAS errors. */
static smelt_status path_run(struct cuda_backend *cb, const struct cuda_qweight *qw, int choice, const float *x,
                             int64_t n, float *y, bool acc, const void *xq, void *sc, uint64_t sc_bytes,
                             struct err *e) {
    if (choice == MMTUNE_GEMM) return gemm_run(cb, qw, x, n, y, acc, sc, e);
    if (choice == MMTUNE_MMV) return mmv_run(cb, qw, x, n, y, acc, xq, sc, e);
    if (choice == MMTUNE_MMB) {
        smelt_status st = cuda_mmb(&cb->ctx, qw, x, n, y, sc, sc_bytes, acc, e);
        cu_prof_mark(cb, qw->bytes, "%smmb %s %lldx%lld n=%lld", cb->tuning ? "tune " : "", qtype_name(qw->type),
                     (long long)qw->rows, (long long)qw->k, (long long)n);
        return st;
    }
    smelt_status st = cuda_mmq_quantize(&cb->ctx, x, qw->k, n, sc, e);
    if (st == SMELT_OK) st = cuda_mmq_pre(&cb->ctx, qw, n, y, sc, sc_bytes, acc, choice, e);
    cu_prof_mark(cb, qw->bytes, "%smmq %s %lldx%lld n=%lld", cb->tuning ? "tune " : "", qtype_name(qw->type),
              (long long)qw->rows, (long long)qw->k, (long long)n);
    return st;
}

/* The choice without measuring (SMELT_NO_TUNE=1, capture, failure). */
/* mmb may serve this product: its type, 2..64 rows, a counter per 64 weight rows, not
 * SMELT_MM_PATH=legacy. */
static bool mmb_ok(const struct cuda_backend *cb, const struct cuda_qweight *qw, int64_t n) {
    return cb->mm_path >= 0 && n >= 2 && n <= CUDA_MMB_MAX_ROWS && cuda_mmb_supported(qw->type, qw->k) &&
           qw->rows <= (int64_t)CUDA_MMB_COUNTERS * 64;
}

static int static_choice(const struct cuda_backend *cb, const struct cuda_qweight *qw, int64_t n) {
    if (cb->mm_path > 0 && mmb_ok(cb, qw, n)) return MMTUNE_MMB;
    if (n > CUDA_MMV_MAX_N && n <= cb->mmq_max_rows && cuda_mmq_supported(qw->type, qw->k)) return cb->tune_env.tile;
    return n >= cb->gemm_min_rows ? MMTUNE_GEMM : MMTUNE_MMV;
}

static bool stream_capturing(struct cuda_backend *cb) {
    if (cb->capturing >= 0) return true;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(cb->ctx.stream, &cs) != cudaSuccess) {
        cudaGetLastError();
        return true; /* unknown: do not sync */
    }
    return cs != cudaStreamCaptureStatusNone;
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Median us of MMTUNE_RUNS timed runs of `choice` after one warm-up, each after an L2
 * flush (flush may be NULL); -1 when the candidate failed (its error is logged at debug
 * level). A device fault is sticky: it fails the backend (CU_FAIL). */
static float time_path(struct cuda_backend *cb, const struct cuda_qweight *qw, int choice, const float *x, int64_t n,
                       float *yc, const void *xq, void *sc, uint64_t sc_bytes, void *flush, uint64_t flush_bytes) {
    struct err e;
    cudaError_t rc = cudaSuccess;
    for (int r = 0; r <= MMTUNE_RUNS && rc == cudaSuccess; r++) {
        if (flush) {
            rc = cudaMemsetAsync(flush, r, flush_bytes, cb->ctx.stream);
            cb->ctx.pdl_fence = 1; /* the next kernel waits for the memset as for a copy */
            cu_prof_mark(cb, flush_bytes, "tune L2 flush");
        }
        if (rc == cudaSuccess) rc = cudaEventRecord(cb->tune_ev[2 * r], cb->ctx.stream);
        if (rc != cudaSuccess) break;
        if (path_run(cb, qw, choice, x, n, yc, false, xq, sc, sc_bytes, &e) != SMELT_OK) {
            char name[32];
            log_debug("cuda matmul tuning: %s on %s %lldx%lld, %lld rows failed: %s",
                      mmtune_choice_name(choice, cuda_mmq_tile_name, name, sizeof name), qtype_name(qw->type),
                      (long long)qw->rows, (long long)qw->k, (long long)n, e.msg);
            cudaGetLastError();
            return -1;
        }
        rc = cudaEventRecord(cb->tune_ev[2 * r + 1], cb->ctx.stream);
    }
    if (rc == cudaSuccess) rc = cudaEventSynchronize(cb->tune_ev[2 * MMTUNE_RUNS + 1]);
    if (rc != cudaSuccess) {
        CU_FAIL(cb, rc, "timing a matmul path");
        return -1;
    }
    float t[MMTUNE_RUNS];
    for (int r = 1; r <= MMTUNE_RUNS; r++) {
        float ms = -1;
        if (cudaEventElapsedTime(&ms, cb->tune_ev[2 * r], cb->tune_ev[2 * r + 1]) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
        t[r - 1] = ms * 1e3f;
    }
    return mmtune_median(t, MMTUNE_RUNS);
}

/* Events and the flush size, once; false if tuning cannot run here. */
static bool tune_ready(struct cuda_backend *cb) {
    if (cb->tune_ev_n == 2 * (MMTUNE_RUNS + 1)) return true;
    if (cb->tune_ev_n < 0) return false;
    while (cb->tune_ev_n < 2 * (MMTUNE_RUNS + 1)) {
        if (cudaEventCreate(&cb->tune_ev[cb->tune_ev_n]) != cudaSuccess) {
            cudaGetLastError();
            log_warn("cuda: matmul paths not measured (no CUDA events): static choices");
            for (int i = 0; i < cb->tune_ev_n; i++) cudaEventDestroy(cb->tune_ev[i]);
            cb->tune_ev_n = -1;
            return false;
        }
        cb->tune_ev_n++;
    }
    int l2 = 0;
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, cb->ctx.device) != cudaSuccess) {
        cudaGetLastError();
        l2 = 0;
    }
    cb->tune_flush = 2 * (uint64_t)(l2 > 0 ? l2 : 0);
    if (cb->tune_flush > TUNE_FLUSH_MAX) cb->tune_flush = TUNE_FLUSH_MAX;
    return true;
}

/* Measures the candidates of key for this call's product and records the winner (the
 * static choice `st` when nothing could be measured). Returns the recorded choice. y is
 * written only when !acc (the caller's run overwrites it). */
static int tune(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n, float *y, bool acc,
                const void *xq, int st, const struct mmtune_key *key) {
    const double t0 = mono_ms();
    int bn[MMTUNE_MAX_CAND], fits[MMTUNE_MAX_CAND];
    int n_tiles = cuda_mmq_tile_count();
    if (n_tiles > MMTUNE_MAX_CAND) n_tiles = MMTUNE_MAX_CAND;
    for (int t = 0; t < n_tiles; t++) {
        int bm = 0;
        cuda_mmq_tile_shape(t, &bm, &bn[t]);
        fits[t] = cuda_mmq_tile_fits(&cb->ctx, qw->type, t) == 1;
    }
    const struct mmtune_space sp = {.n_tiles = n_tiles, .tile_bn = bn, .tile_fits = fits, .mmq = true,
                                    .mmq_max_rows = cb->mmq_rows_fixed ? cb->mmq_max_rows : INT64_MAX,
                                    .gemm = !cb->mmq_rows_fixed, .mmv = !cb->mmq_rows_fixed || n <= CUDA_MMV_MAX_N,
                                    .mmb = mmb_ok(cb, qw, n)};
    int cand[MMTUNE_MAX_CAND];
    float us[MMTUNE_MAX_CAND];
    const int nc = mmtune_candidates(n, &sp, cand, MMTUNE_MAX_CAND);
    for (int i = 0; i < MMTUNE_MAX_CAND; i++) us[i] = -1;
    struct mmtune_ent ent = {.key = *key, .choice = st, .n = n, .static_choice = st};
    struct err e;
    const char *why = nc ? NULL : "one candidate";
    if (nc && tune_ready(cb)) {
        const size_t mark = cu_scratch_mark(&cb->base);
        uint64_t need = 0;
        for (int i = 0; i < nc && !why; i++) {
            uint64_t b = 0;
            if (path_scratch(cb, qw, cand[i], n, xq, &b, &e) != SMELT_OK) why = e.msg;
            if (b > need) need = b;
        }
        float *yc = acc ? cu_stack_alloc(cb, (size_t)(qw->rows * n) * sizeof(float)) : y;
        void *sc = why ? NULL : cu_stack_alloc(cb, need ? need : 1);
        void *flush = cb->tune_flush ? cu_stack_alloc(cb, cb->tune_flush) : NULL;
        if (!why && (!yc || !sc)) why = "out of device scratch";
        if (!why) {
            if (cb->prof) *cb->gate_h = 1; /* the profile's gate would hold the sync for 2 s */
            cb->tuning = true;
            for (int i = 0; i < nc && cu_ok(cb); i++)
                us[i] = time_path(cb, qw, cand[i], x, n, yc, xq, sc, need, flush, flush ? cb->tune_flush : 0);
            cb->tuning = false;
            const int w = cu_ok(cb) ? mmtune_fastest(us, nc) : -1;
            ent.n_cand = nc;
            ent.static_choice = st == MMTUNE_MMQ_AUTO ? cuda_mmq_tile_auto(&cb->ctx, qw, n) : st;
            for (int i = 0; i < nc; i++) {
                ent.cand[i] = cand[i];
                ent.cand_us[i] = us[i];
                if (cand[i] == ent.static_choice) ent.static_us = us[i];
            }
            if (w >= 0) {
                ent.choice = cand[w];
                ent.us = us[w];
            } else why = "every candidate failed";
        }
        cu_scratch_release(&cb->base, mark);
    } else if (nc) why = "no CUDA events";
    if (!cu_ok(cb)) return st;
    const struct mmtune_ent *got = NULL;
    if (mmtune_put(&cb->tune, &ent, &got, &e) != SMELT_OK) {
        if (!cb->tune_full_logged) log_warn("cuda: %s: further matmul shapes keep static choices", e.msg);
        cb->tune_full_logged = true;
        return st;
    }
    cb->tune.tune_ms += mono_ms() - t0;
    if (log_get_level() >= LOG_DEBUG) {
        char line[1024], name[32];
        size_t at = 0;
        int64_t lo, hi;
        mmtune_bucket_range(key->bucket, &lo, &hi);
        char range[48];
        if (hi == INT64_MAX) snprintf(range, sizeof range, "> %lld", (long long)lo - 1);
        else snprintf(range, sizeof range, "%lld-%lld", (long long)lo, (long long)hi);
        at += (size_t)snprintf(line, sizeof line, "%s %lldx%lld, %lld rows (bucket %s):", qtype_name(qw->type),
                               (long long)qw->rows, (long long)qw->k, (long long)n, range);
        for (int i = 0; i < nc && !why && at < sizeof line; i++)
            at += (size_t)snprintf(line + at, sizeof line - at, " %s %.1f us%s",
                                   mmtune_choice_name(cand[i], cuda_mmq_tile_name, name, sizeof name), us[i],
                                   i + 1 < nc ? "," : "");
        if (at < sizeof line)
            snprintf(line + at, sizeof line - at, " -> %s%s%s",
                     mmtune_choice_name(got->choice, cuda_mmq_tile_name, name, sizeof name), why ? ", static: " : "",
                     why ? why : "");
        log_debug("cuda matmul tuning: %s", line);
    }
    return got->choice;
}

/* The path for this call when it needs no measuring now: *choice the recorded or static one,
 * true. False when this call would measure it: *choice the static one, *key the key to
 * measure. */
static bool choice_known(struct cuda_backend *cb, const struct cuda_qweight *qw, int64_t n, int *choice,
                         struct mmtune_key *key) {
    const int st = static_choice(cb, qw, n);
    *choice = st;
    int bucket = mmtune_bucket(n);
    if (bucket < 0 && mmb_ok(cb, qw, n)) bucket = mmtune_bucket_small(n); /* mmb against mmv */
    if (cb->mm_path > 0 || !cb->tune_env.tune || bucket < 0 || !cuda_mmq_supported(qw->type, qw->k)) return true;
    if (cb->mmq_rows_fixed && st < MMTUNE_MMQ_AUTO) return true; /* the switch is fixed: tiles only */
    *key = (struct mmtune_key){qw->type, qw->rows, qw->k, bucket};
    const struct mmtune_ent *ent = mmtune_find(&cb->tune, key);
    if (ent) *choice = ent->choice;
    return ent || stream_capturing(cb); /* a capture: measured at the key's next eager call */
}

/* The path for this call: recorded, measured now, or static (see the section comment). */
static int choose(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n, float *y,
                  bool acc, const void *xq) {
    int st;
    struct mmtune_key key;
    if (choice_known(cb, qw, n, &st, &key)) return st;
    return tune(cb, qw, x, n, y, acc, xq, st, &key);
}

bool cu_mm_small_batch(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n) {
    if (!cu_ok(cb) || n > CUDA_MMV_MAX_N || !mmb_ok(cb, qw, n)) return false;
    return choose(cb, qw, x, n, NULL, true, NULL) == MMTUNE_MMB; /* acc: timing writes its own scratch */
}

/* At cu_free: the measured table, once (info level: which path won where on this GPU). */
void cu_tune_report(struct cuda_backend *cb) {
    /* debug level: `smelt run` would otherwise end every answer with the table */
    if (!cb->tune.n || log_get_level() < LOG_DEBUG) return;
    size_t cap = (size_t)cb->tune.n * 96 + 256;
    char *buf = malloc(cap);
    if (!buf) return;
    mmtune_format(&cb->tune, cuda_mmq_tile_name, buf, cap);
    log_debug("cuda: matmul paths measured on this GPU (%d shape x token-row buckets in %.1f ms; "
              "SMELT_NO_TUNE=1 turns measuring off):",
              cb->tune.n_tuned, cb->tune.tune_ms);
    for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) { /* one line per weight shape */
        nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        log_debug("  %s", line);
    }
    free(buf);
}

/* y (rows, n) (+)= W x for any n, by the chosen path. xq: x's quantized form when n <= 8
 * and a matmul group already made it. */
void cu_mm(struct cuda_backend *cb, const struct cuda_qweight *qw, const float *x, int64_t n, float *y,
                   bool acc, const void *xq) {
    if (!cu_ok(cb)) return;
    const int choice = choose(cb, qw, x, n, y, acc, xq);
    if (!cu_ok(cb)) return;
    struct err e;
    uint64_t bytes = 0;
    if (path_scratch(cb, qw, choice, n, xq, &bytes, &e) != SMELT_OK) {
        bk_fail(&cb->base, e.code, "%s", e.msg);
        return;
    }
    size_t mark = cu_scratch_mark(&cb->base);
    void *sc = NULL;
    if (bytes && !(sc = cu_scratch(cb, bytes))) return;
    if (path_run(cb, qw, choice, x, n, y, acc, xq, sc, bytes, &e) != SMELT_OK) {
        bk_fail(&cb->base, e.code, "%s", e.msg);
        return;
    }
    cu_scratch_release(&cb->base, mark);
}

/* y[i] = W_i x for count (<= CUDA_MMB_MATS) products on one input (a layer's Q, K and V, or
 * gate and up), each by its chosen path, except that a run of neighbours of one type and row
 * length whose paths are all mmb goes to one small-batch launch (cuda_mmb_multi: one
 * conversion and one product instead of two launches each). The choice is per product as
 * cu_mm's (its key's measured path), so a row count makes the same grouping every time. */
void cu_mm_group(struct cuda_backend *cb, int count, const struct cuda_qweight *const *qw, const float *x, int64_t n,
                 float *const *y) {
    for (int i = 0; i < count && cu_ok(cb);) {
        int j = i + 1;
        if (mmb_ok(cb, qw[i], n) && choose(cb, qw[i], x, n, y[i], false, NULL) == MMTUNE_MMB)
            while (j < count && j - i < CUDA_MMB_MATS && qw[j]->type == qw[i]->type && qw[j]->k == qw[i]->k &&
                   cu_ok(cb) && choose(cb, qw[j], x, n, y[j], false, NULL) == MMTUNE_MMB)
                j++;
        if (!cu_ok(cb)) return;
        if (j - i == 1) {
            cu_mm(cb, qw[i], x, n, y[i], false, NULL);
            i = j;
            continue;
        }
        struct err e;
        uint64_t bytes = 0;
        size_t mark = cu_scratch_mark(&cb->base);
        void *sc = NULL;
        if (cuda_mmb_multi_scratch_bytes(&cb->ctx, qw + i, j - i, n, &bytes, &e) != SMELT_OK ||
            cuda_mmb_multi(&cb->ctx, qw + i, j - i, x, n, y + i, (sc = cu_scratch(cb, bytes)), bytes, 0, &e) !=
                SMELT_OK) {
            if (cu_ok(cb)) bk_fail(&cb->base, e.code, "%s", e.msg);
            return;
        }
        uint64_t wb = 0;
        for (int t = i; t < j; t++) wb += qw[t]->bytes;
        cu_prof_mark(cb, wb, "mmb %s x%d %lldx%lld n=%lld", qtype_name(qw[i]->type), j - i, (long long)qw[i]->rows,
                     (long long)qw[i]->k, (long long)n);
        cu_scratch_release(&cb->base, mark);
        i = j;
    }
}

/* A choice that runs an mmq tile (recorded or static, only ever for a type and k that
 * cuda_mmq_supported takes). */
static bool is_mmq(int choice) {
    return choice >= 0 || choice == MMTUNE_MMQ_AUTO;
}

bool cu_mm_glu(struct cuda_backend *cb, const struct cuda_qweight *gate, const struct cuda_qweight *up, int act,
               const float *x, int64_t n, float *dst) {
    if (!cu_ok(cb) || act < 0 || act > 3 || gate->type != up->type || gate->k != up->k || gate->rows != up->rows ||
        n < 2 || (!cuda_mmq_supported(gate->type, gate->k) && !mmb_ok(cb, gate, n)))
        return false;
    /* gate and up have one key (type, rows, k, bucket): one choice serves both */
    const int choice = choose(cb, gate, x, n, dst, false, NULL);
    if (!cu_ok(cb)) return true; /* the backend failed while measuring */
    /* (a bucket-mate's recorded mmb may meet a row count mmb does not take; an mmq tile is
     * recorded only for a type and k that cuda_mmq_supported takes, both in the key) */
    const bool mmb = choice == MMTUNE_MMB && mmb_ok(cb, gate, n);
    const bool mmq = is_mmq(choice) && gate->rows % 8 == 0;
    if (!mmb && !mmq) return false;
    struct err e;
    uint64_t bytes = 0;
    size_t mark = cu_scratch_mark(&cb->base);
    void *sc = NULL;
    smelt_status st;
    if (mmb) {
        st = cuda_mmb_glu_scratch_bytes(&cb->ctx, gate, up, n, &bytes, &e);
        if (st == SMELT_OK && !(sc = cu_scratch(cb, bytes))) return true; /* cu_scratch failed the backend */
        if (st == SMELT_OK) st = cuda_mmb_glu(&cb->ctx, gate, up, act, x, n, dst, sc, bytes, &e);
    } else {
        st = cuda_mmq_scratch_bytes(&cb->ctx, 2 * gate->rows, gate->k, n, &bytes, &e);
        if (st == SMELT_OK && !(sc = cu_scratch(cb, bytes))) return true;
        if (st == SMELT_OK) st = cuda_mmq_quantize(&cb->ctx, x, gate->k, n, sc, &e);
        if (st == SMELT_OK) st = cuda_mmq_glu_pre(&cb->ctx, gate, up, act, n, dst, NULL, sc, bytes, choice, &e);
    }
    if (st != SMELT_OK) {
        if (cu_ok(cb)) bk_fail(&cb->base, e.code, "%s", e.msg);
        return true;
    }
    cu_prof_mark(cb, gate->bytes + up->bytes, "%s glu %s 2x%lldx%lld n=%lld", mmb ? "mmb" : "mmq",
                 qtype_name(gate->type), (long long)gate->rows, (long long)gate->k, (long long)n);
    cu_scratch_release(&cb->base, mark);
    return true;
}

/* x' into scratch sc as the mmq products' f16 activations (struct mm_src). */
static smelt_status mmq_input(struct cuda_backend *cb, const struct mm_src *src, int64_t k, int64_t n, void *sc,
                              struct err *e) {
    if (!src->norm) return cuda_mmq_quantize(&cb->ctx, src->x, k, n, sc, e);
    cuda_rms_norm_h16(&cb->ctx, sc, src->x, src->w, k, n, src->stride, src->eps);
    cu_check_launch(cb, "rms_norm->f16"); /* (its profile mark too) */
    return SMELT_OK;
}

bool cu_mm_group_mmq(struct cuda_backend *cb, int count, const struct cuda_qweight *const *qw,
                     const struct mm_src *src, int64_t n, float *const *y) {
    int choice[8];
    struct mmtune_key key;
    struct err e;
    uint64_t need = 0;
    if (!cu_ok(cb) || n <= CUDA_MMV_MAX_N || count < 1 || count > 8) return false;
    for (int i = 0; i < count; i++)
        if (qw[i]->k != qw[0]->k || !choice_known(cb, qw[i], n, &choice[i], &key) || !is_mmq(choice[i]))
            return false;
    /* runs of neighbours of one type stack into one launch (cuda_mmq_stack_pre), on the tile
     * measured for the run's first (a layer's Q: the largest) */
    int end[8];
    for (int i = 0; i < count;) {
        int j = i + 1;
        int64_t rows = qw[i]->rows;
        while (j < count && j - i < CUDA_MMQ_STACK && qw[j]->type == qw[i]->type)
            rows += qw[j++]->rows;
        uint64_t b = 0;
        if (cuda_mmq_scratch_bytes(&cb->ctx, rows, qw[i]->k, n, &b, &e) != SMELT_OK) return false;
        if (b > need) need = b;
        end[i] = j;
        i = j;
    }
    size_t mark = cu_scratch_mark(&cb->base);
    void *sc = cu_scratch(cb, need);
    if (!sc) return true; /* cu_scratch failed the backend */
    smelt_status st = mmq_input(cb, src, qw[0]->k, n, sc, &e);
    for (int i = 0; i < count && st == SMELT_OK; i = end[i]) { /* one f16 form serves them all */
        const int c = end[i] - i;
        uint64_t wb = 0;
        for (int t = i; t < end[i]; t++) wb += qw[t]->bytes;
        st = c == 1 ? cuda_mmq_pre(&cb->ctx, qw[i], n, y[i], sc, need, 0, choice[i], &e)
                    : cuda_mmq_stack_pre(&cb->ctx, qw + i, c, n, y + i, sc, need, choice[i], &e);
        cu_prof_mark(cb, wb, "mmq %s x%d %lldx%lld n=%lld (shared f16 input)", qtype_name(qw[i]->type), c,
                     (long long)qw[i]->rows, (long long)qw[i]->k, (long long)n);
    }
    if (st != SMELT_OK) {
        if (cu_ok(cb)) bk_fail(&cb->base, e.code, "%s", e.msg);
        return true;
    }
    cu_scratch_release(&cb->base, mark);
    return true;
}

bool cu_mm_ffn_plan(struct cuda_backend *cb, const struct cuda_qweight *gate, const struct cuda_qweight *up,
                    const struct cuda_qweight *down, int64_t n, int choice[2]) {
    struct mmtune_key key;
    return cu_ok(cb) && n > CUDA_MMV_MAX_N && gate->type == up->type && gate->k == up->k && gate->rows == up->rows &&
           gate->rows % 16 == 0 && down->k == gate->rows && choice_known(cb, gate, n, &choice[0], &key) &&
           choice_known(cb, down, n, &choice[1], &key) && is_mmq(choice[0]) && is_mmq(choice[1]);
}

void cu_mm_ffn(struct cuda_backend *cb, const struct cuda_qweight *gate, const struct cuda_qweight *up,
               const struct cuda_qweight *down, int act, const struct mm_src *src, int64_t n, float *dst, bool acc,
               const int choice[2]) {
    if (!cu_ok(cb)) return;
    struct err e;
    uint64_t bg = 0, bd = 0;
    size_t mark = cu_scratch_mark(&cb->base);
    void *sg = NULL, *sd = NULL;
    smelt_status st = cuda_mmq_scratch_bytes(&cb->ctx, 2 * gate->rows, gate->k, n, &bg, &e);
    if (st == SMELT_OK) st = cuda_mmq_scratch_bytes(&cb->ctx, down->rows, down->k, n, &bd, &e);
    if (st == SMELT_OK && (!(sg = cu_scratch(cb, bg)) || !(sd = cu_scratch(cb, bd)))) return; /* failed the backend */
    if (st == SMELT_OK) st = mmq_input(cb, src, gate->k, n, sg, &e);
    if (st == SMELT_OK) st = cuda_mmq_glu_pre(&cb->ctx, gate, up, act, n, NULL, sd, sg, bg, choice[0], &e);
    cu_prof_mark(cb, gate->bytes + up->bytes, "mmq glu->f16 %s 2x%lldx%lld n=%lld", qtype_name(gate->type),
                 (long long)gate->rows, (long long)gate->k, (long long)n);
    if (st == SMELT_OK) st = cuda_mmq_pre(&cb->ctx, down, n, dst, sd, bd, acc, choice[1], &e);
    cu_prof_mark(cb, down->bytes, "mmq %s %lldx%lld n=%lld (f16 from the glu)", qtype_name(down->type),
                 (long long)down->rows, (long long)down->k, (long long)n);
    if (st != SMELT_OK) {
        if (cu_ok(cb)) bk_fail(&cb->base, e.code, "%s", e.msg);
        return;
    }
    cu_scratch_release(&cb->base, mark);
}

const struct mmtune_ent *cuda_backend_mm_entry(const struct backend *b, uint32_t type, int64_t rows, int64_t k,
                                               int64_t n) {
    const struct cuda_backend *cb = (const struct cuda_backend *)b;
    struct mmtune_key key = {type, rows, k, mmtune_bucket(n)};
    if (key.bucket < 0) key.bucket = mmtune_bucket_small(n); /* mmb against mmv, if measured */
    return key.bucket >= 0 ? mmtune_find(&cb->tune, &key) : NULL;
}
