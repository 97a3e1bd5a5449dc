/* CUDA tensor-core matmul (cuda_mmq) against its CPU twin.
 *
 * Weights: Gaussian values quantized with the reference quantizer (src/quant), rows of
 * different magnitude. Two references, both in double precision:
 *   - y_h: the weights as the kernel turns them into f16, decoded here from the GGUF bytes
 *     (not from the split layout): Q4_K f16(q * f16(d*sc) - f16(dmin*m)), Q6_K
 *     f16((q - 32) * f16(d*sc)), Q8_0 f16(q * d), each rounded once to nearest even,
 *     against x rounded to f16 (clamped to +-65504). The GPU adds exact f16 products in
 *     f32, so it must match to float rounding, |y - y_h| <= 2e-5 * sum|w x| + 1e-6: this
 *     proves the layouts, fragments, scales, pipeline and the split-tile sums;
 *   - y: the library's dequantized W against the exact x: the difference is the f16
 *     rounding, reported and bounded (relative RMS < 2e-3).
 * Every tile and the automatic one, on ragged shapes (row counts that are not multiples of
 * the tile, Q8_0 rows whose length is not a multiple of 256) and n = 9 .. 512 token rows;
 * small shapes give one unit of work per block (every tile split between blocks), large
 * ones split unevenly. Outputs are poisoned with NaN (every output must be written) and
 * followed by a guard band (nothing past the end may be). For large shapes the CPU
 * reference checks a sample of rows (every token of each). Also: two runs give the same
 * bits (the split tiles are summed in a fixed order); one conversion shared by two
 * products, captured in a CUDA graph and replayed, gives the eager results each time (the
 * split counters reset themselves); activations beyond the f16 range clamp.
 *
 * The backend's measured path choice (test_mmq_tuned): through bk_matmul / bk_matmul_acc /
 * step graphs, a measuring backend and one with SMELT_MMQ_TILE=0 both match the references
 * with the tolerance of the path each took; the choice is recorded (with a time) at the
 * first eager call and reused bit for bit; a key first seen inside a capture takes the
 * static path and is measured at its next eager call.
 *
 * SMELT_BENCH=1 adds, for 4096x4096, 14336x4096, 4096x14336 and 1024x4096 Q4_K/Q6_K/Q8_0
 * and 8..512 token rows, microseconds per product of mmq (the automatic tile and each tile), of the
 * 8-row mmv repeated as the backend does below 33 rows, and of F16 dequantization + cuBLAS
 * as the backend's gemm() does; each timed as replays of a CUDA graph of many products,
 * weights rotating through > 1 GiB of copies so they come from HBM. One summary line per
 * (type, shape, n), then the MMQ_MAX_ROWS the figures suggest. Then (SMELT_BENCH=tune:
 * only this part) the backend's own measurement on 4096x4096, 6144x4096, 14336x4096,
 * 28672x4096 and 4096x14336 at n = 16, 32, .., 512, 1024: every candidate's time, the
 * winner, the static choice, and the switch points per shape ("bench tune" lines).
 * SMELT_BENCH_TYPE=Q4_K limits both to one type. SMELT_BENCH=one: one product alone, for a
 * profiler (bench_one).
 */
#ifndef SMELT_HAVE_CUDA
#include <stdio.h>

int main(void) {
    printf("SKIP test_cuda_mmq: built without CUDA (nvcc not found at configure time)\n");
    return 77;
}
#else

#include "t.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmq.h"
#include "backend/cuda/cuda_mmv.h"
#include "backend/cuda/mm_tune.h"
#include "quant/quant.h"
#include "util/half.h"

static unsigned long long g_seed = 0x3a9;
/* The launch context of the direct kernel calls: device 0, the default stream (main). */
static struct cuda_ctx g_ctx;

#define GUARD 4096 /* floats after y that must stay untouched */
#define SENTINEL 12345.0f

#include "qref16.h"


#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t rc_ = (call);                                                                  \
        if (rc_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(rc_));                           \
            T_CHECK(0);                                                                            \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Rows the CPU reference checks: all of them when the product is small, else a stride
 * plus the first and last 8 (the ragged edge). */
static int row_checked(int64_t r, int64_t rows, int64_t stride) {
    return r < 8 || r >= rows - 8 || r % stride == 0;
}

/* Compares y (n x rows) with the references; prints one line; returns the mismatches. */
static int compare(const char *what, uint32_t type, int64_t rows, int64_t k, int n, int bm, int bn,
                   int grid, const float *y, const double *yq, const double *mag, const double *yx,
                   int64_t stride, double y0_mod) {
    int bad = 0, unwritten = 0, guard = 0;
    long long first_t = -1, first_r = -1;
    double worst = 0, err2 = 0, ref2 = 0;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            const double g = y[t * rows + r];
            if (!isfinite(g)) {
                if (unwritten++ == 0 && first_t < 0) first_t = t, first_r = r;
                continue;
            }
            if (!row_checked(r, rows, stride)) continue;
            const int64_t i = t * rows + r;
            const double y0 = y0_mod > 0 ? (double)(i % (int64_t)y0_mod) - 6.0 : 0.0;
            const double ref = yq[i] + y0, m = mag[i];
            const double dev = fabs(g - ref) / (m + 1e-30);
            if (dev > worst) worst = dev;
            if (!(fabs(g - ref) <= 2e-5 * m + 1e-6)) {
                if (bad++ == 0 && first_t < 0) first_t = t, first_r = r;
                if (bad <= 3)
                    fprintf(stderr, "  %s %s %lldx%lld n=%d tile %dx%d: y[%d][%lld] = %.7g, ref %.7g (mag %.3g)\n",
                            what, qtype_name(type), (long long)rows, (long long)k, n, bm, bn, t,
                            (long long)r, g, ref, m);
            }
            err2 += (g - y0 - yx[i]) * (g - y0 - yx[i]);
            ref2 += yx[i] * yx[i];
        }
    for (int i = 0; i < GUARD; i++)
        guard += y[n * rows + i] != SENTINEL;
    const double rel = ref2 > 0 ? sqrt(err2 / ref2) : 0;
    printf("mmq %-5s %5lldx%-5lld n=%-3d %-10s tile %3dx%-3d grid %4d: %s  max |err|/mag %.1e  rel RMS "
           "vs exact %.2e",
           qtype_name(type), (long long)rows, (long long)k, n, what, bm, bn, grid,
           bad || unwritten || guard ? "MISMATCH" : "ok", worst, rel);
    if (first_t >= 0) printf("  first bad y[%lld][%lld]", first_t, first_r);
    printf("\n");
    T_CHECKF(bad == 0, "%d outputs off", bad);
    T_CHECKF(unwritten == 0, "%d outputs not written (NaN)", unwritten);
    T_CHECKF(guard == 0, "%d floats written past the end of y", guard);
    T_CHECKF(rel < 2e-3, "relative RMS %.3g", rel);
    return bad + unwritten + guard;
}

/* One weight (type, rows x k) against each n in ns, with every tile and the automatic one;
 * big_x: some activations beyond the f16 range. */
/* SMELT_TEST_SMALL=1 (compute-sanitizer's racecheck, under which one 4096x4096 case takes
 * minutes): weights above 4M values are skipped, and say so. The kernels and tiles are the
 * same at the smaller shapes. */
static bool skip_big(uint32_t type, int64_t rows, int64_t k) {
    const char *s = getenv("SMELT_TEST_SMALL");
    if (!s || strcmp(s, "1") || rows * k <= ((int64_t)4 << 20)) return false;
    printf("skipped: %s %lldx%lld (SMELT_TEST_SMALL=1: weights above 4M values)\n", qtype_name(type),
           (long long)rows, (long long)k);
    return true;
}

static void check_weight(uint32_t type, int64_t rows, int64_t k, const int *ns, int n_ns, int big_x) {
    if (skip_big(type, rows, k)) return;
    float *w16 = malloc(sizeof(float) * (size_t)(rows * k));
    float *deq = malloc(sizeof(float) * (size_t)(rows * k));
    if (!w16 || !deq) abort();
    void *w = make_weights(type, rows, k, w16, deq, &g_seed);
    struct cuda_qweight qw;
    struct err e;
    memset(&qw, 0, sizeof qw);
    smelt_status up = cuda_qweight_upload(&g_ctx, &qw, type, w, rows, k, &e);
    T_CHECKF(up == SMELT_OK, "upload: %s", e.msg);
    int nmax = 0;
    for (int i = 0; i < n_ns; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    float *x = malloc(sizeof(float) * (size_t)(nmax * k));
    float *y = malloc(sizeof(float) * (size_t)(nmax * rows + GUARD)),
          *y2 = malloc(sizeof(float) * (size_t)(nmax * rows + GUARD));
    double *yq = malloc(sizeof(double) * (size_t)(nmax * rows)),
           *yx = malloc(sizeof(double) * (size_t)(nmax * rows));
    double *mag = malloc(sizeof(double) * (size_t)(nmax * rows));
    float *dx = NULL, *dy = NULL;
    void *scratch = NULL;
    uint64_t sbytes = 0;
    if (!x || !y || !y2 || !yq || !yx || !mag) abort();
    if (up != SMELT_OK) goto out;
    T_EQ_INT(cuda_mmq_scratch_bytes(&g_ctx, rows, k, nmax, &sbytes, &e), SMELT_OK);
    CK(cudaMalloc((void **)&dx, sizeof(float) * nmax * k));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (nmax * rows + GUARD)));
    CK(cudaMalloc(&scratch, sbytes));
    for (int ni = 0; ni < n_ns; ni++) {
        const int n = ns[ni];
        for (int64_t i = 0; i < n * k; i++)
            x[i] = t_randn(&g_seed);
        if (big_x) { /* past the f16 range: clamped to +-65504 */
            x[3] = 1e6f;
            x[n * k - 5] = -70000.0f;
            x[7] = 65519.0f; /* rounds to 65504 */
            x[8] = 65520.0f; /* would round to infinity: clamped */
        }
        int64_t stride = (int64_t)((double)rows * k * n / 3e7);
        if (stride < 1) stride = 1;
        for (int64_t r = 0; r < rows; r++) {
            if (!row_checked(r, rows, stride)) continue;
            const float *wr = w16 + r * k, *dr = deq + r * k;
            for (int t = 0; t < n; t++) {
                double a = 0, b = 0, m = 0;
                const float *xt = x + t * k;
                for (int64_t i = 0; i < k; i++) {
                    const double p = (double)wr[i] * x16(xt[i]);
                    a += p;
                    m += fabs(p);
                    b += (double)dr[i] * xt[i];
                }
                yq[t * rows + r] = a;
                yx[t * rows + r] = big_x ? a : b; /* the clamp is not an f16 rounding */
                mag[t * rows + r] = m;
            }
        }
        CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
        int auto_done = 0;
        for (int tile = CUDA_MMQ_TILE_AUTO; tile < cuda_mmq_tile_count(); tile++) {
            int bm = 0, bn = 0;
            const int tl = tile == CUDA_MMQ_TILE_AUTO ? cuda_mmq_tile_auto(&g_ctx, &qw, n) : tile;
            T_CHECK(tl >= 0 && tl < cuda_mmq_tile_count());
            if (tl < 0) continue;
            cuda_mmq_tile_shape(tl, &bm, &bn);
            for (int64_t i = 0; i < n * rows; i++)
                y[i] = NAN; /* poison: every output is written */
            for (int i = 0; i < GUARD; i++)
                y[n * rows + i] = SENTINEL;
            CK(cudaMemcpy(dy, y, sizeof(float) * (n * rows + GUARD), cudaMemcpyHostToDevice));
            smelt_status st = cuda_mmq_quantize(&g_ctx, dx, k, n, scratch, &e);
            if (st == SMELT_OK) st = cuda_mmq_pre(&g_ctx, &qw, n, dy, scratch, sbytes, 0, tile, &e);
            if (st == SMELT_ERR_UNSUPPORTED && tile != CUDA_MMQ_TILE_AUTO) { /* too much smem here */
                printf("mmq %-5s %5lldx%-5lld n=%-3d tile %3dx%-3d: not on this device (%s)\n",
                       qtype_name(type), (long long)rows, (long long)k, n, bm, bn, e.msg);
                continue;
            }
            T_CHECKF(st == SMELT_OK, "%s", e.msg);
            if (st != SMELT_OK) continue;
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y, dy, sizeof(float) * (n * rows + GUARD), cudaMemcpyDeviceToHost));
            char tn[32];
            cuda_mmq_tile_name(tl, tn, sizeof tn);
            compare(tile == CUDA_MMQ_TILE_AUTO ? "auto" : strstr(tn, "wgmma") ? "wgmma" : "", type, rows, k, n, bm, bn,
                    cuda_mmq_grid(&g_ctx, &qw, n, tile), y, yq, mag, yx, stride, 0);
            if (tile == CUDA_MMQ_TILE_AUTO) { /* again: the same bits */
                for (int64_t i = 0; i < n * rows; i++)
                    y2[i] = NAN;
                CK(cudaMemcpy(dy, y2, sizeof(float) * n * rows, cudaMemcpyHostToDevice));
                T_EQ_INT(cuda_mmq(&g_ctx, &qw, dx, n, dy, scratch, sbytes, 0, &e), SMELT_OK);
                CK(cudaMemcpy(y2, dy, sizeof(float) * n * rows, cudaMemcpyDeviceToHost));
                int diff = 0;
                for (int64_t i = 0; i < n * rows; i++)
                    diff += memcmp(&y[i], &y2[i], sizeof(float)) != 0;
                T_CHECKF(diff == 0, "%s n=%d: %d outputs differ between two runs", qtype_name(type),
                         n, diff);
                auto_done = 1;
            }
        }
        T_CHECK(auto_done);
        /* accumulate: y = y0 + W x, with the automatic tile */
        for (int64_t i = 0; i < n * rows; i++)
            y[i] = (float)(i % 13) - 6.0f;
        for (int i = 0; i < GUARD; i++)
            y[n * rows + i] = SENTINEL;
        CK(cudaMemcpy(dy, y, sizeof(float) * (n * rows + GUARD), cudaMemcpyHostToDevice));
        T_EQ_INT(cuda_mmq(&g_ctx, &qw, dx, n, dy, scratch, sbytes, 1, &e), SMELT_OK);
        CK(cudaMemcpy(y, dy, sizeof(float) * (n * rows + GUARD), cudaMemcpyDeviceToHost));
        {
            int bm, bn;
            cuda_mmq_tile_shape(cuda_mmq_tile_auto(&g_ctx, &qw, n), &bm, &bn);
            compare("accumulate", type, rows, k, n, bm, bn, cuda_mmq_grid(&g_ctx, &qw, n, -1), y, yq, mag,
                    yx, stride, 13);
        }
    }
out:
    cuda_qweight_free(&qw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(scratch);
    free(w16);
    free(deq);
    free(w);
    free(x);
    free(y);
    free(y2);
    free(yq);
    free(yx);
    free(mag);
}

static void test_mmq_q4_k(void) {
    const int ns[] = {9, 16, 33, 64, 100, 512};
    check_weight(QT_Q4_K, 40, 256, ns, 3, 0); /* a single unit per tile */
    check_weight(QT_Q4_K, 67, 768, ns, 6, 0);
    check_weight(QT_Q4_K, 301, 2560, ns, 6, 0);
    check_weight(QT_Q4_K, 4096, 4096, ns, 6, 0);
}

static void test_mmq_q6_k(void) {
    const int ns[] = {9, 16, 33, 64, 100, 512};
    check_weight(QT_Q6_K, 40, 256, ns, 3, 0);
    check_weight(QT_Q6_K, 67, 768, ns, 6, 0);
    check_weight(QT_Q6_K, 301, 2560, ns, 6, 0);
    check_weight(QT_Q6_K, 4096, 4096, ns, 6, 0);
}

static void test_mmq_q8_0(void) {
    const int ns[] = {9, 16, 33, 64, 100, 512};
    check_weight(QT_Q8_0, 40, 64, ns, 3, 0); /* a single partial unit */
    check_weight(QT_Q8_0, 67, 768, ns, 6, 0);
    check_weight(QT_Q8_0, 301, 2560, ns, 6, 0);
    check_weight(QT_Q8_0, 131, 896, ns, 6, 0); /* 3.5 units: the partial last one */
    check_weight(QT_Q8_0, 4096, 4096, ns, 6, 0);
}

/* gpt-oss's experts: 2880-wide rows are 90 blocks, 11 whole units and a partial one, and
 * their scale rows are padded (cuda_qtypes.cuh) */
static void test_mmq_mxfp4(void) {
    const int ns[] = {9, 16, 33, 64, 100, 512};
    check_weight(QT_MXFP4, 40, 64, ns, 3, 0); /* a single partial unit */
    check_weight(QT_MXFP4, 67, 768, ns, 6, 0);
    check_weight(QT_MXFP4, 131, 2880, ns, 6, 0);
    check_weight(QT_MXFP4, 2880, 2880, ns, 6, 0);
}

static void test_mmq_big_x(void) {
    const int ns[] = {12, 40};
    check_weight(QT_Q4_K, 300, 1024, ns, 2, 1);
}

/* count matrices of one type stacked in one launch (cuda_mmq_stack_pre), rows[i] x k each:
 * one weight of their summed rows is quantized and its row ranges uploaded as separate
 * matrices, so each output is checked against its rows of one reference, at every tile; every
 * output written, nothing past any of them; the refusals of mismatched stacks. */
static void check_stack(uint32_t type, const int64_t *rows, int count, int64_t k, const int *ns, int n_ns) {
    int64_t total = 0, off[CUDA_MMQ_STACK + 1] = {0};
    for (int i = 0; i < count; i++)
        off[i + 1] = total += rows[i];
    if (skip_big(type, total, k)) return;
    float *w16 = malloc(sizeof(float) * (size_t)(total * k)), *deq = malloc(sizeof(float) * (size_t)(total * k));
    if (!w16 || !deq) abort();
    unsigned char *hw = make_weights(type, total, k, w16, deq, &g_seed);
    const uint64_t rb = qtype_row_size(type, k);
    struct cuda_qweight qw[CUDA_MMQ_STACK];
    const struct cuda_qweight *qp[CUDA_MMQ_STACK];
    struct err e;
    memset(qw, 0, sizeof qw);
    int nmax = 0;
    int64_t rmax = 0;
    for (int i = 0; i < n_ns; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    for (int i = 0; i < count; i++)
        rmax = rows[i] > rmax ? rows[i] : rmax;
    float *x = malloc(sizeof(float) * (size_t)(nmax * k)), *y = malloc(sizeof(float) * (size_t)(nmax * rmax + GUARD));
    double *yq = malloc(sizeof(double) * (size_t)(nmax * total)), *yx = malloc(sizeof(double) * (size_t)(nmax * total)),
           *mag = malloc(sizeof(double) * (size_t)(nmax * total));
    float *dx = NULL, *dy[CUDA_MMQ_STACK] = {NULL};
    void *scratch = NULL;
    uint64_t sbytes = 0;
    if (!x || !y || !yq || !yx || !mag) abort();
    for (int i = 0; i < count; i++) {
        T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw[i], type, hw + off[i] * rb, rows[i], k, &e), SMELT_OK);
        qp[i] = &qw[i];
        CK(cudaMalloc((void **)&dy[i], sizeof(float) * (nmax * rows[i] + GUARD)));
    }
    T_EQ_INT(cuda_mmq_scratch_bytes(&g_ctx, total, k, nmax, &sbytes, &e), SMELT_OK);
    CK(cudaMalloc((void **)&dx, sizeof(float) * nmax * k));
    CK(cudaMalloc(&scratch, sbytes));
    for (int ni = 0; ni < n_ns; ni++) {
        const int n = ns[ni];
        int64_t stride = (int64_t)((double)total * k * n / 3e7);
        if (stride < 1) stride = 1;
        for (int64_t i = 0; i < n * k; i++)
            x[i] = t_randn(&g_seed);
        for (int m = 0; m < count; m++) /* each matrix's references, (n, rows[m]) from yq + n off[m] */
            for (int64_t r = 0; r < rows[m]; r++) {
                if (!row_checked(r, rows[m], stride)) continue;
                const float *wr = w16 + (off[m] + r) * k, *dr = deq + (off[m] + r) * k;
                for (int t = 0; t < n; t++) {
                    double a = 0, b = 0, mg = 0;
                    for (int64_t i = 0; i < k; i++) {
                        const double p = (double)wr[i] * x16(x[t * k + i]);
                        a += p;
                        mg += fabs(p);
                        b += (double)dr[i] * x[t * k + i];
                    }
                    const int64_t o = n * off[m] + t * rows[m] + r;
                    yq[o] = a;
                    yx[o] = b;
                    mag[o] = mg;
                }
            }
        CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
        for (int tile = CUDA_MMQ_TILE_AUTO; tile < cuda_mmq_tile_count(); tile++) {
            for (int m = 0; m < count; m++) {
                for (int64_t i = 0; i < n * rows[m]; i++)
                    y[i] = NAN;
                for (int i = 0; i < GUARD; i++)
                    y[n * rows[m] + i] = SENTINEL;
                CK(cudaMemcpy(dy[m], y, sizeof(float) * (n * rows[m] + GUARD), cudaMemcpyHostToDevice));
            }
            smelt_status st = cuda_mmq_quantize(&g_ctx, dx, k, n, scratch, &e);
            if (st == SMELT_OK) st = cuda_mmq_stack_pre(&g_ctx, qp, count, n, dy, scratch, sbytes, tile, &e);
            if (st == SMELT_ERR_UNSUPPORTED && tile != CUDA_MMQ_TILE_AUTO) continue; /* too much smem here */
            T_CHECKF(st == SMELT_OK, "%s", e.msg);
            if (st != SMELT_OK) continue;
            CK(cudaDeviceSynchronize());
            struct cuda_qweight whole = qw[0]; /* the launch's shape: its tile and grid */
            whole.rows = total;
            int bm = 0, bn = 0;
            cuda_mmq_tile_shape(tile == CUDA_MMQ_TILE_AUTO ? cuda_mmq_tile_auto(&g_ctx, &whole, n) : tile, &bm, &bn);
            for (int m = 0; m < count; m++) {
                CK(cudaMemcpy(y, dy[m], sizeof(float) * (n * rows[m] + GUARD), cudaMemcpyDeviceToHost));
                char what[32];
                snprintf(what, sizeof what, "stack %d/%d", m + 1, count);
                compare(what, type, rows[m], k, n, bm, bn, cuda_mmq_grid(&g_ctx, &whole, n, tile), y, yq + n * off[m],
                        mag + n * off[m],
                        yx + n * off[m], stride, 0);
            }
        }
    }
    if (count > 1) { /* refused: another type or row length in the stack, no matrices, too many */
        struct cuda_qweight q2 = qw[1];
        const struct cuda_qweight *bad[CUDA_MMQ_STACK + 1] = {&qw[0], &q2, &qw[0], &qw[0]};
        q2.k = k + 256;
        T_EQ_INT(cuda_mmq_stack_pre(&g_ctx, bad, 2, 16, dy, scratch, sbytes, CUDA_MMQ_TILE_AUTO, &e),
                 SMELT_ERR_INVALID);
        q2.k = k;
        q2.type = type == QT_Q4_K ? QT_Q6_K : QT_Q4_K;
        T_EQ_INT(cuda_mmq_stack_pre(&g_ctx, bad, 2, 16, dy, scratch, sbytes, CUDA_MMQ_TILE_AUTO, &e),
                 SMELT_ERR_INVALID);
        T_EQ_INT(cuda_mmq_stack_pre(&g_ctx, bad, 0, 16, dy, scratch, sbytes, CUDA_MMQ_TILE_AUTO, &e),
                 SMELT_ERR_INVALID);
        T_EQ_INT(cuda_mmq_stack_pre(&g_ctx, bad, CUDA_MMQ_STACK + 1, 16, dy, scratch, sbytes, CUDA_MMQ_TILE_AUTO, &e),
                 SMELT_ERR_INVALID);
    }
out:
    for (int i = 0; i < count; i++) {
        cuda_qweight_free(&qw[i]);
        cudaFree(dy[i]);
    }
    cudaFree(dx);
    cudaFree(scratch);
    free(hw);
    free(w16);
    free(deq);
    free(x);
    free(y);
    free(yq);
    free(yx);
    free(mag);
}

static void test_mmq_stack(void) {
    const int ns[] = {9, 33, 64, 100, 512};
    const int64_t qkv[3] = {4096, 1024, 1024}, odd[3] = {67, 40, 21}, two[2] = {136, 40};
    check_stack(QT_Q4_K, odd, 3, 768, ns, 5); /* a tile holds rows of all three */
    check_stack(QT_Q4_K, qkv, 3, 4096, ns, 5); /* Llama-3-8B's Q, K and V */
    check_stack(QT_Q6_K, two, 2, 512, ns, 5);
    check_stack(QT_Q8_0, odd, 3, 896, ns, 5);
    check_stack(QT_MXFP4, two, 2, 2880, ns, 5);
}

/* act(g) * u in double, act as cuda_glu.cuh's glu_val. */
static double glu_ref(int act, double g, double u) {
    if (act == 3) {
        const double gc = g > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : g;
        const double uc = u > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : u < -GLU_OAI_LIMIT ? -GLU_OAI_LIMIT : u;
        return gc / (1.0 + exp(-(double)GLU_OAI_ALPHA * gc)) * (uc + 1.0);
    }
    if (act == 1) return 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    return (act == 0 ? g : 1.0) / (1.0 + exp(-g)) * u;
}

/* The GLU product (cuda_mmq_glu_pre): act(G x) * (U x) in one launch over the gate's and the
 * up's rows interleaved in eights, every tile and the automatic one, against act applied to
 * the two f16 references of check_weight. The tolerance is the spread of the reference when
 * each sum moves by the plain products' own bound (2e-5 of its sum |w x| + 1e-6), plus the
 * float evaluation of the activation (relative 1e-5, and 5e-7 |g u| for GELU's cancellation). Outputs poisoned with NaN, a guard band after y.
 * Where rows % 16 == 0, the same launch with the f16 output (h16, a down product's input) must
 * leave the bytes cuda_mmq_quantize makes of the f32 output, the zeroed counters included, in
 * a poisoned scratch, and nothing past them; elsewhere h16 is refused. */
static void check_glu(uint32_t type, int64_t rows, int64_t k, const int *ns, int n_ns, int act) {
    if (skip_big(type, 2 * rows, k)) return;
    float *w16 = malloc(sizeof(float) * (size_t)(2 * rows * k)), *deq = malloc(sizeof(float) * (size_t)(rows * k));
    if (!w16 || !deq) abort();
    void *hg = make_weights(type, rows, k, w16, deq, &g_seed);
    void *hu = make_weights(type, rows, k, w16 + rows * k, deq, &g_seed);
    struct cuda_qweight qg, qu;
    struct err e;
    memset(&qg, 0, sizeof qg);
    memset(&qu, 0, sizeof qu);
    int nmax = 0;
    for (int i = 0; i < n_ns; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    float *x = malloc(sizeof(float) * (size_t)(nmax * k)), *y = malloc(sizeof(float) * (size_t)(nmax * rows + GUARD));
    double *ref = malloc(sizeof(double) * (size_t)(nmax * rows)), *tol = malloc(sizeof(double) * (size_t)(nmax * rows));
    float *dx = NULL, *dy = NULL;
    void *scratch = NULL, *h16 = NULL, *h16_ref = NULL;
    uint64_t sbytes = 0;
    const size_t hb = CUDA_MMQ_XH_OFFSET + (size_t)nmax * (size_t)rows * 2; /* counters, f16 h */
    unsigned char *hh = malloc(2 * hb);
    if (!x || !y || !ref || !tol || !hh) abort();
    T_EQ_INT(cuda_qweight_upload(&g_ctx, &qg, type, hg, rows, k, &e), SMELT_OK);
    T_EQ_INT(cuda_qweight_upload(&g_ctx, &qu, type, hu, rows, k, &e), SMELT_OK);
    T_EQ_INT(cuda_mmq_scratch_bytes(&g_ctx, 2 * rows, k, nmax, &sbytes, &e), SMELT_OK);
    CK(cudaMalloc((void **)&dx, sizeof(float) * nmax * k));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (nmax * rows + GUARD)));
    CK(cudaMalloc(&scratch, sbytes));
    CK(cudaMalloc(&h16, hb));
    CK(cudaMalloc(&h16_ref, hb));
    for (int ni = 0; ni < n_ns; ni++) {
        const int n = ns[ni];
        for (int64_t i = 0; i < n * k; i++)
            x[i] = t_randn(&g_seed);
        for (int64_t r = 0; r < rows; r++)
            for (int t = 0; t < n; t++) {
                double s[2] = {0, 0}, m[2] = {0, 0};
                for (int h = 0; h < 2; h++) {
                    const float *wr = w16 + (h * rows + r) * k, *xt = x + t * k;
                    for (int64_t i = 0; i < k; i++) {
                        const double p = (double)wr[i] * x16(xt[i]);
                        s[h] += p;
                        m[h] += fabs(p);
                    }
                }
                const double v = glu_ref(act, s[0], s[1]), dg = 2e-5 * m[0] + 1e-6, du = 2e-5 * m[1] + 1e-6;
                double spread = 0;
                for (int sg = -1; sg <= 1; sg += 2)
                    for (int su = -1; su <= 1; su += 2) {
                        const double d = fabs(glu_ref(act, s[0] + sg * dg, s[1] + su * du) - v);
                        if (d > spread) spread = d;
                    }
                ref[t * rows + r] = v;
                /* the activation in float: a few ulps of |g| (GELU's 1 + tanh cancels) times |u| */
                tol[t * rows + r] = spread + 1e-5 * fabs(v) + 5e-7 * fabs(s[0] * s[1]) + 1e-6;
            }
        CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
        for (int tile = CUDA_MMQ_TILE_AUTO; tile < cuda_mmq_tile_count(); tile++) {
            for (int64_t i = 0; i < n * rows; i++)
                y[i] = NAN;
            for (int i = 0; i < GUARD; i++)
                y[n * rows + i] = SENTINEL;
            CK(cudaMemcpy(dy, y, sizeof(float) * (n * rows + GUARD), cudaMemcpyHostToDevice));
            smelt_status st = cuda_mmq_quantize(&g_ctx, dx, k, n, scratch, &e);
            if (st == SMELT_OK) st = cuda_mmq_glu_pre(&g_ctx, &qg, &qu, act, n, dy, NULL, scratch, sbytes, tile, &e);
            if (st == SMELT_ERR_UNSUPPORTED && tile != CUDA_MMQ_TILE_AUTO) continue; /* too much smem here */
            T_CHECKF(st == SMELT_OK, "%s", e.msg);
            if (st != SMELT_OK) continue;
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y, dy, sizeof(float) * (n * rows + GUARD), cudaMemcpyDeviceToHost));
            int bad = 0, unwritten = 0, guard = 0;
            double worst = 0;
            for (int64_t i = 0; i < n * rows; i++) {
                if (!isfinite(y[i])) {
                    unwritten++;
                    continue;
                }
                const double dev = fabs(y[i] - ref[i]) / tol[i];
                if (dev > worst) worst = dev;
                if (dev > 1 && bad++ < 3)
                    fprintf(stderr, "  glu %s %lldx%lld n=%d tile %d: y[%lld][%lld] = %.7g, ref %.7g (tol %.2g)\n",
                            qtype_name(type), (long long)rows, (long long)k, n, tile, (long long)(i / rows),
                            (long long)(i % rows), y[i], ref[i], tol[i]);
            }
            for (int i = 0; i < GUARD; i++)
                guard += y[n * rows + i] != SENTINEL;
            char tn[32] = "auto";
            if (tile != CUDA_MMQ_TILE_AUTO) cuda_mmq_tile_name(tile, tn, sizeof tn);
            printf("mmq glu %-5s act %d %5lldx%-5lld n=%-3d tile %-13s: %s  max |err|/tol %.2f\n", qtype_name(type), act,
                   (long long)rows, (long long)k, n, tn, bad || unwritten || guard ? "MISMATCH" : "ok", worst);
            T_CHECKF(bad == 0, "glu %s n=%d tile %d: %d outputs off", qtype_name(type), n, tile, bad);
            T_CHECKF(unwritten == 0, "glu %s n=%d tile %d: %d outputs not written", qtype_name(type), n, tile,
                     unwritten);
            T_CHECKF(guard == 0, "glu %s n=%d tile %d: %d floats written past y", qtype_name(type), n, tile, guard);
            if (rows % 16) {
                T_EQ_INT(cuda_mmq_glu_pre(&g_ctx, &qg, &qu, act, n, NULL, h16, scratch, sbytes, tile, &e),
                         SMELT_ERR_INVALID);
                continue;
            }
            const size_t used = CUDA_MMQ_XH_OFFSET + (size_t)n * (size_t)rows * 2;
            CK(cudaMemset(h16, 0x5a, hb));
            st = cuda_mmq_quantize(&g_ctx, dx, k, n, scratch, &e);
            if (st == SMELT_OK) st = cuda_mmq_glu_pre(&g_ctx, &qg, &qu, act, n, NULL, h16, scratch, sbytes, tile, &e);
            if (st == SMELT_OK) st = cuda_mmq_quantize(&g_ctx, dy, rows, n, h16_ref, &e);
            T_CHECKF(st == SMELT_OK, "%s", e.msg);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hh, h16, hb, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hh + hb, h16_ref, used, cudaMemcpyDeviceToHost));
            size_t diff = 0, past = 0;
            for (size_t i = 0; i < used; i++)
                diff += hh[i] != hh[hb + i];
            for (size_t i = used; i < hb; i++)
                past += hh[i] != 0x5a;
            printf("mmq glu %-5s act %d %5lldx%-5lld n=%-3d tile %-13s: f16 output %s\n", qtype_name(type), act,
                   (long long)rows, (long long)k, n, tn, diff || past ? "MISMATCH" : "ok (the conversion's bits)");
            T_CHECKF(diff == 0, "glu %s n=%d tile %d: %zu bytes of the f16 output differ from the conversion's",
                     qtype_name(type), n, tile, diff);
            T_CHECKF(past == 0, "glu %s n=%d tile %d: %zu bytes written past the f16 output", qtype_name(type), n,
                     tile, past);
        }
    }
    /* refused: rows not a multiple of 8, shapes that differ, accumulation has no GLU form */
    if (rows % 8 == 0 && rows > 8) {
        struct cuda_qweight q2 = qu;
        q2.rows = rows - 4;
        T_EQ_INT(cuda_mmq_glu_pre(&g_ctx, &qg, &q2, act, 16, dy, NULL, scratch, sbytes, CUDA_MMQ_TILE_AUTO, &e),
                 SMELT_ERR_INVALID);
        T_EQ_INT(cuda_mmq_glu_pre(&g_ctx, &q2, &q2, act, 16, dy, NULL, scratch, sbytes, CUDA_MMQ_TILE_AUTO, &e),
                 SMELT_ERR_INVALID);
        T_EQ_INT(cuda_mmq_glu_pre(&g_ctx, &qg, &qu, 4, 16, dy, NULL, scratch, sbytes, CUDA_MMQ_TILE_AUTO, &e),
                 SMELT_ERR_INVALID);
    }
out:
    cuda_qweight_free(&qg);
    cuda_qweight_free(&qu);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(h16);
    cudaFree(h16_ref);
    free(hh);
    cudaFree(scratch);
    free(hg);
    free(hu);
    free(w16);
    free(deq);
    free(x);
    free(y);
    free(ref);
    free(tol);
}

static void test_mmq_glu(void) {
    const int ns[] = {9, 33, 100, 512};
    check_glu(QT_Q4_K, 40, 256, ns, 2, 0); /* one unit per tile, a partial row tile */
    check_glu(QT_Q4_K, 1368, 2048, ns, 4, 0);
    check_glu(QT_Q6_K, 208, 768, ns, 4, 1); /* n_ff % 16 == 0: the f16 output too */
    check_glu(QT_Q8_0, 144, 896, ns, 4, 2);
    check_glu(QT_MXFP4, 368, 2880, ns, 4, 3);
}

/* One conversion shared by two products (split tiles on both), captured in a graph and
 * replayed: every replay gives the eager results, bit for bit. */
static void test_mmq_graph(void) {
    const int64_t k = 4096, r1 = 1024, r2 = 1536;
    const int n = 24;
    float *w16 = malloc(sizeof(float) * (size_t)(r2 * k)), *deq = malloc(sizeof(float) * (size_t)(r2 * k));
    if (!w16 || !deq) abort();
    void *h1 = make_weights(QT_Q4_K, r1, k, w16, deq, &g_seed), *h2 = make_weights(QT_Q6_K, r2, k, w16, deq, &g_seed);
    struct cuda_qweight q1, q2;
    struct err e;
    memset(&q1, 0, sizeof q1);
    memset(&q2, 0, sizeof q2);
    float *x = malloc(sizeof(float) * n * k), *ya = malloc(sizeof(float) * n * (r1 + r2)),
          *yb = malloc(sizeof(float) * n * (r1 + r2));
    float *dx = NULL, *dy = NULL;
    void *scratch = NULL;
    uint64_t sbytes = 0;
    cudaStream_t st = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (!x || !ya || !yb) abort();
    T_EQ_INT(cuda_qweight_upload(&g_ctx, &q1, QT_Q4_K, h1, r1, k, &e), SMELT_OK);
    T_EQ_INT(cuda_qweight_upload(&g_ctx, &q2, QT_Q6_K, h2, r2, k, &e), SMELT_OK);
    T_EQ_INT(cuda_mmq_scratch_bytes(&g_ctx, r2, k, n, &sbytes, &e), SMELT_OK);
    for (int64_t i = 0; i < n * k; i++)
        x[i] = t_randn(&g_seed);
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    struct cuda_ctx sctx = g_ctx; /* g_ctx on st (its counters shared, not freed) */
    sctx.stream = st;
    CK(cudaMalloc((void **)&dx, sizeof(float) * n * k));
    CK(cudaMalloc((void **)&dy, sizeof(float) * n * (r1 + r2)));
    CK(cudaMalloc(&scratch, sbytes));
    CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
    printf("mmq graph: grids of %d and %d blocks\n", cuda_mmq_grid(&g_ctx, &q1, n, -1),
           cuda_mmq_grid(&g_ctx, &q2, n, -1));
    /* eager */
    T_EQ_INT(cuda_mmq_quantize(&sctx, dx, k, n, scratch, &e), SMELT_OK);
    T_EQ_INT(cuda_mmq_pre(&sctx, &q1, n, dy, scratch, sbytes, 0, CUDA_MMQ_TILE_AUTO, &e), SMELT_OK);
    T_EQ_INT(cuda_mmq_pre(&sctx, &q2, n, dy + n * r1, scratch, sbytes, 0, CUDA_MMQ_TILE_AUTO, &e),
             SMELT_OK);
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(ya, dy, sizeof(float) * n * (r1 + r2), cudaMemcpyDeviceToHost));
    /* captured */
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    smelt_status s1 = cuda_mmq_quantize(&sctx, dx, k, n, scratch, &e);
    if (s1 == SMELT_OK) s1 = cuda_mmq_pre(&sctx, &q1, n, dy, scratch, sbytes, 0, CUDA_MMQ_TILE_AUTO, &e);
    if (s1 == SMELT_OK)
        s1 = cuda_mmq_pre(&sctx, &q2, n, dy + n * r1, scratch, sbytes, 0, CUDA_MMQ_TILE_AUTO, &e);
    cudaError_t ce = cudaStreamEndCapture(st, &graph);
    T_CHECKF(s1 == SMELT_OK, "%s", e.msg);
    CK(ce);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; rep++) {
        CK(cudaMemsetAsync(dy, 0xff, sizeof(float) * n * (r1 + r2), st)); /* NaN */
        CK(cudaGraphLaunch(exec, st));
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(yb, dy, sizeof(float) * n * (r1 + r2), cudaMemcpyDeviceToHost));
        int diff = 0;
        for (int64_t i = 0; i < n * (r1 + r2); i++)
            diff += memcmp(&ya[i], &yb[i], sizeof(float)) != 0;
        printf("mmq graph replay %d: %d of %lld outputs differ from the eager run\n", rep, diff,
               (long long)(n * (r1 + r2)));
        T_CHECKF(diff == 0, "replay %d: %d outputs differ", rep, diff);
    }
out:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (st) cudaStreamDestroy(st);
    cuda_qweight_free(&q1);
    cuda_qweight_free(&q2);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(scratch);
    free(h1);
    free(h2);
    free(w16);
    free(deq);
    free(x);
    free(ya);
    free(yb);
}

/* ---- the backend's measured path choice (cuda_backend.c, "matrix products") ----
 * Through the backend's ops (bk_matmul, bk_matmul_acc, step graphs), on one backend that
 * measures its paths and one with SMELT_MMQ_TILE=0 (a forced tile, no measuring): both
 * against the references of check_weight, with the tolerance of the path each took (mmq:
 * 2e-5 of sum|w x| against the f16 reference; cuBLAS: relative RMS 2e-3 against the exact
 * product, its weights being rounded to f16 once; repeated mmv: 1.5e-2, int8 activations).
 * Also: the path is recorded after the first call (with a time); a second call gives the
 * same bits (write-once); accumulate mode, also as a key's first (measuring) call, whose
 * candidates must run on scratch and leave y0 + W x applied exactly once; a step
 * captured into a graph with a key never run eagerly takes the static path, records
 * nothing, is correct, and the key is measured at its next eager call. */

struct saved_env {
    char *v[3];
};
static const char *const tune_env_names[3] = {"SMELT_NO_TUNE", "SMELT_MMQ_TILE", "SMELT_MMQ_MAX_ROWS"};

static void env_save(struct saved_env *s) {
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(tune_env_names[i]);
        s->v[i] = v ? strdup(v) : NULL;
    }
}

static void env_restore(struct saved_env *s) {
    for (int i = 0; i < 3; i++) {
        if (s->v[i]) setenv(tune_env_names[i], s->v[i], 1);
        else unsetenv(tune_env_names[i]);
        free(s->v[i]);
        s->v[i] = NULL;
    }
}

/* A backend with measuring on (tile NULL) or the tile forced. */
static struct backend *tuned_backend(const char *tile) {
    struct backend *b = NULL;
    struct err e;
    unsetenv("SMELT_NO_TUNE");
    unsetenv("SMELT_MMQ_MAX_ROWS");
    if (tile) setenv("SMELT_MMQ_TILE", tile, 1);
    else unsetenv("SMELT_MMQ_TILE");
    smelt_status st = cuda_backend_new(&b, 0, &e);
    T_CHECKF(st == SMELT_OK, "cuda_backend_new: %s", e.msg);
    return st == SMELT_OK ? b : NULL;
}

/* One step: y = W x (y0 != NULL: y = y0 + W x) for n token rows; graph_key != 0 wraps the
 * op in the step-graph calls (replayed when a recording exists). */
static smelt_status bk_product(struct backend *b, struct tensor *w, const float *x, int64_t k, int n, int64_t rows,
                               const float *y0, float *y, uint64_t graph_key, struct err *e) {
    bk_step_begin(b);
    struct tensor *xt = bk_new(b, QT_F32, k, n, 1), *yt = bk_new(b, QT_F32, rows, n, 1);
    bk_upload(b, xt, x, sizeof(float) * (size_t)(k * n));
    if (y0) bk_upload(b, yt, y0, sizeof(float) * (size_t)(rows * n));
    if (!graph_key || !bk_graph_replay(b, graph_key)) {
        if (graph_key) bk_graph_begin(b, graph_key);
        if (y0) bk_matmul_acc(b, yt, w, NULL, xt, NULL);
        else bk_matmul(b, yt, w, xt);
        if (graph_key) bk_graph_end(b);
    }
    bk_download(b, y, yt, sizeof(float) * (size_t)(rows * n));
    return bk_sync(b, e);
}

/* Checks y against the references with the tolerance of path `choice`. */
static void check_path(const char *what, int choice, uint32_t type, int64_t rows, int64_t k, int n, const float *y,
                       const double *yq, const double *mag, const double *yx, int64_t stride, double y0_mod) {
    if (choice >= 0 || choice == MMTUNE_MMQ_AUTO) {
        int bm = 0, bn = 0;
        cuda_mmq_tile_shape(choice >= 0 ? choice : 0, &bm, &bn);
        compare(what, type, rows, k, n, bm, bn, 0, y, yq, mag, yx, stride, y0_mod);
        return;
    }
    const double tol = choice == MMTUNE_GEMM ? 2e-3 : 1.5e-2;
    double err2 = 0, ref2 = 0;
    int bad = 0;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t i = t * rows + r;
            if (!isfinite(y[i])) bad++;
            if (!row_checked(r, rows, stride)) continue;
            const double y0 = y0_mod > 0 ? (double)(i % (int64_t)y0_mod) - 6.0 : 0.0;
            err2 += (y[i] - y0 - yx[i]) * (y[i] - y0 - yx[i]);
            ref2 += yx[i] * yx[i];
        }
    const double rel = ref2 > 0 ? sqrt(err2 / ref2) : 0;
    printf("mmq tuned %-5s %5lldx%-5lld n=%-3d %-22s %-7s rel RMS vs exact %.2e (bound %.1e)%s\n", qtype_name(type),
           (long long)rows, (long long)k, n, what, choice == MMTUNE_GEMM ? "cuBLAS" : "mmv x8", rel, tol,
           bad ? "  NON-FINITE OUTPUTS" : "");
    T_CHECKF(bad == 0, "%s n=%d: %d outputs not finite", what, n, bad);
    T_CHECKF(rel < tol, "%s n=%d: relative RMS %.3g", what, n, rel);
}

static void tuned_case(uint32_t type, int64_t rows, int64_t k, const int *ns, int n_ns) {
    if (skip_big(type, rows, k)) return;
    struct saved_env env;
    env_save(&env);
    int nmax = 200; /* the graph check's n */
    for (int i = 0; i < n_ns; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    float *w16 = malloc(sizeof(float) * (size_t)(rows * k)), *deq = malloc(sizeof(float) * (size_t)(rows * k));
    float *x = malloc(sizeof(float) * (size_t)(nmax * k));
    float *y = malloc(sizeof(float) * (size_t)(nmax * rows + GUARD)),
          *y2 = malloc(sizeof(float) * (size_t)(nmax * rows + GUARD)),
          *y0 = malloc(sizeof(float) * (size_t)(nmax * rows));
    double *yq = malloc(sizeof(double) * (size_t)(nmax * rows)), *yx = malloc(sizeof(double) * (size_t)(nmax * rows)),
           *mag = malloc(sizeof(double) * (size_t)(nmax * rows));
    if (!w16 || !deq || !x || !y || !y2 || !y0 || !yq || !yx || !mag) abort();
    void *hw = make_weights(type, rows, k, w16, deq, &g_seed);
    for (int64_t i = 0; i < nmax * k; i++)
        x[i] = t_randn(&g_seed);
    for (int64_t i = 0; i < nmax * rows; i++)
        y0[i] = (float)(i % 13) - 6.0f;
    /* references for all nmax tokens of the checked rows; a product of n rows is the
     * first n tokens (token-major: the same indices) */
    int64_t stride = (int64_t)((double)rows * k * nmax / 3e7);
    if (stride < 1) stride = 1;
    for (int64_t r = 0; r < rows; r++) {
        if (!row_checked(r, rows, stride)) continue;
        for (int t = 0; t < nmax; t++) {
            double a = 0, bsum = 0, m = 0;
            for (int64_t i = 0; i < k; i++) {
                const double p = (double)w16[r * k + i] * x16(x[t * k + i]);
                a += p;
                m += fabs(p);
                bsum += (double)deq[r * k + i] * x[t * k + i];
            }
            yq[t * rows + r] = a;
            yx[t * rows + r] = bsum;
            mag[t * rows + r] = m;
        }
    }
    /* compare() indexes the references by t * rows + r for the product's own n: with a
     * token-major layout that is the same element for every n */
    struct backend *bt = tuned_backend(NULL), *bf = tuned_backend("0");
    struct tensor wt_t, wt_f;
    struct err e;
    int ok = bt && bf;
    for (int which = 0; which < 2 && ok; which++) {
        struct tensor *wt = which ? &wt_f : &wt_t;
        tensor_init(wt, type, k, rows, 1, 1);
        wt->data = hw;
        wt->name = "w";
        smelt_status st = bk_weight_bind(which ? bf : bt, wt, &e);
        T_CHECKF(st == SMELT_OK, "bind: %s", e.msg);
        ok = st == SMELT_OK;
    }
    for (int ni = 0; ni < n_ns && ok; ni++) {
        const int n = ns[ni];
        for (int i = 0; i < GUARD; i++)
            y[n * rows + i] = y2[n * rows + i] = SENTINEL;
        /* measuring backend: the first call measures (every other n in accumulate mode,
         * whose candidates run on scratch), the later ones reuse the choice */
        const bool acc_first = ni % 2 == 1;
        smelt_status st = SMELT_OK;
        if (acc_first) {
            st = bk_product(bt, &wt_t, x, k, n, rows, y0, y2, 0, &e);
            T_CHECKF(st == SMELT_OK, "tuned acc n=%d: %s", n, e.msg);
        }
        if (st == SMELT_OK) st = bk_product(bt, &wt_t, x, k, n, rows, NULL, y, 0, &e);
        T_CHECKF(st == SMELT_OK, "tuned n=%d: %s", n, e.msg);
        if (st != SMELT_OK) break;
        const struct mmtune_ent *ent = cuda_backend_mm_entry(bt, type, rows, k, n);
        const bool rec = ent != NULL;
        int choice = rec ? ent->choice : MMTUNE_MMQ_AUTO;
        const float us = rec ? ent->us : 0;
        char name[32];
        printf("mmq tuned %-5s %5lldx%-5lld n=%-3d recorded %s (%.1f us)\n", qtype_name(type), (long long)rows,
               (long long)k, n, rec ? mmtune_choice_name(choice, cuda_mmq_tile_name, name, sizeof name) : "nothing",
               us);
        T_CHECKF(rec, "n=%d: no path recorded after an eager call", n);
        T_CHECKF(!rec || us > 0, "n=%d: the path was not measured (static fallback)", n);
        if (acc_first) check_path("tuned accumulate first", choice, type, rows, k, n, y2, yq, mag, yx, stride, 13);
        check_path("tuned", choice, type, rows, k, n, y, yq, mag, yx, stride, 0);
        st = bk_product(bt, &wt_t, x, k, n, rows, NULL, y2, 0, &e);
        T_CHECKF(st == SMELT_OK, "tuned again n=%d: %s", n, e.msg);
        int diff = 0;
        for (int64_t i = 0; i < n * rows; i++)
            diff += memcmp(&y[i], &y2[i], sizeof(float)) != 0;
        T_CHECKF(diff == 0, "n=%d: %d outputs differ between the measuring call and the next", n, diff);
        if (!acc_first) { /* accumulate with the recorded path */
            st = bk_product(bt, &wt_t, x, k, n, rows, y0, y2, 0, &e);
            T_CHECKF(st == SMELT_OK, "tuned acc n=%d: %s", n, e.msg);
            check_path("tuned accumulate", choice, type, rows, k, n, y2, yq, mag, yx, stride, 13);
        }
        /* forced tile 0: mmq up to MMQ_MAX_ROWS (64) rows, cuBLAS above */
        st = bk_product(bf, &wt_f, x, k, n, rows, NULL, y2, 0, &e);
        T_CHECKF(st == SMELT_OK, "forced n=%d: %s", n, e.msg);
        const int fchoice = n <= 64 ? 0 : MMTUNE_GEMM;
        T_CHECK(cuda_backend_mm_entry(bf, type, rows, k, n) == NULL); /* a forced tile measures nothing */
        check_path("SMELT_MMQ_TILE=0", fchoice, type, rows, k, n, y2, yq, mag, yx, stride, 0);
        double worst = 0;
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++)
                if (row_checked(r, rows, stride)) {
                    const double d = fabs((double)y[t * rows + r] - y2[t * rows + r]) / (mag[t * rows + r] + 1e-30);
                    worst = d > worst ? d : worst;
                }
        printf("mmq tuned %-5s %5lldx%-5lld n=%-3d tuned vs forced tile: max |diff|/mag %.1e\n", qtype_name(type),
               (long long)rows, (long long)k, n, worst);
    }
    /* graphs: a key first seen inside a capture */
    if (ok) {
        const uint64_t gkey = 0x7e0e;
        const int n1 = 24, n2 = 200; /* n2's bucket (129-256) is not used above */
        T_CHECK(cuda_backend_mm_entry(bt, type, rows, k, n2) == NULL);
        for (int i = 0; i < GUARD; i++)
            y[n2 * rows + i] = y2[n2 * rows + i] = SENTINEL;
        /* first measure n1 and grow the scratch past what the steps below need: a step
         * whose scratch grows invalidates every graph (stack_reset), which would turn
         * the capture below back into an eager run */
        smelt_status st = bk_product(bt, &wt_t, x, k, n1, rows, NULL, y, 0, &e);
        T_CHECKF(st == SMELT_OK, "n=%d: %s", n1, e.msg);
        bk_step_begin(bt);
        bk_new(bt, QT_F32, 64 << 20, 1, 1); /* 256 MB */
        T_EQ_INT(bk_sync(bt, &e), SMELT_OK);
        st = bk_product(bt, &wt_t, x, k, n1, rows, NULL, y, gkey, &e); /* eager (a graph key's first step) */
        T_CHECKF(st == SMELT_OK, "graph step 1: %s", e.msg);
        st = bk_product(bt, &wt_t, x, k, n2, rows, NULL, y, gkey, &e); /* captured with n2, then launched */
        T_CHECKF(st == SMELT_OK, "graph step 2 (captured): %s", e.msg);
        const bool rec = cuda_backend_mm_entry(bt, type, rows, k, n2) != NULL;
        printf("mmq tuned %-5s %5lldx%-5lld n=%-3d first seen in a capture: %s\n", qtype_name(type), (long long)rows,
               (long long)k, n2, rec ? "RECORDED (wrong)" : "static path, not recorded (right)");
        T_CHECK(!rec);
        check_path("captured, static", MMTUNE_GEMM, type, rows, k, n2, y, yq, mag, yx, stride, 0);
        st = bk_product(bt, &wt_t, x, k, n2, rows, NULL, y2, 0, &e); /* eager: now measured */
        T_CHECKF(st == SMELT_OK, "eager after capture: %s", e.msg);
        const struct mmtune_ent *e2 = cuda_backend_mm_entry(bt, type, rows, k, n2);
        T_CHECKF(e2 && e2->us > 0, "n=%d: not measured at its first eager call", n2);
        check_path("eager after capture", e2 ? e2->choice : MMTUNE_GEMM, type, rows, k, n2, y2, yq, mag, yx, stride,
                   0);
    }
    if (bt) bk_free(bt);
    if (bf) bk_free(bf);
    env_restore(&env);
    free(hw);
    free(w16);
    free(deq);
    free(x);
    free(y);
    free(y2);
    free(y0);
    free(yq);
    free(yx);
    free(mag);
}

static void test_mmq_tuned(void) {
    const int ns[] = {12, 40, 100, 300};
    tuned_case(QT_Q4_K, 2048, 4096, ns, 4);
    const int ns8[] = {20, 64};
    tuned_case(QT_Q8_0, 1000, 2048, ns8, 2);
}

/* ---- the dense FFN as one op (bk_ffn; cu_ffn), and a group's shared f16 input ----
 * Where it fuses (the GLU launch writes h as the down product's f16 input; the RMSNorm before
 * it writes the GLU's f16 input), the op must give the bits of the composed ops run by hand on
 * the same backend (bk_ffn_glu, then bk_matmul_acc or bk_matmul): h's f16 form is the
 * conversion's, the norm's values are rms_norm's, and the products take the same tiles. On a
 * backend with the tile forced (no measuring) the op fuses from its first call, with and
 * without accumulation and the norm; on a measuring backend the first call declines (its
 * products are not measured yet: the composed ops measure them), and a later one gives the
 * composed bits whichever paths the measuring chose. Likewise bk_matmul_group through a norm
 * (Q, K, V: one f16 input from the norm's launch for all three, stacked in one launch where
 * each path is a tile) against bk_rms_norm and bk_matmul_group on its output. */
static int ffn_step(struct backend *b, struct tensor *const w[3], const struct prenorm *pre, const float *x,
                    const float *y0, int64_t n_embd, int64_t n_ff, int n, bool acc, bool by_hand, float *y,
                    struct err *e) {
    bk_step_begin(b);
    struct tensor *xt = bk_new(b, QT_F32, n_embd, n, 1), *yt = bk_new(b, QT_F32, n_embd, n, 1);
    bk_upload(b, xt, x, sizeof(float) * (size_t)(n_embd * n));
    bk_upload(b, yt, y0, sizeof(float) * (size_t)(n_embd * n));
    int fused = -1;
    if (by_hand) {
        struct tensor *h = bk_new(b, QT_F32, n_ff, n, 1);
        bk_ffn_glu(b, h, w[0], w[1], xt, GLU_SILU, pre);
        if (acc) bk_matmul_acc(b, yt, w[2], NULL, h, NULL);
        else bk_matmul(b, yt, w[2], h);
    } else {
        fused = b->ops->ffn(b, yt, xt, w[0], w[1], w[2], GLU_SILU, pre, acc);
        if (!fused) bk_ffn(b, yt, xt, w[0], w[1], w[2], GLU_SILU, pre, acc, NULL);
    }
    bk_download(b, y, yt, sizeof(float) * (size_t)(n_embd * n));
    return bk_sync(b, e) == SMELT_OK ? fused : -2;
}

/* Q, K and V of one normed input: bk_matmul_group through the norm, or on the input bk_rms_norm
 * made (by hand); y holds the three outputs. */
static smelt_status qkv_step(struct backend *b, struct tensor *const w[3], const struct prenorm *pre, const float *x,
                             const int64_t rows[3], int64_t k, int n, bool by_hand, float *y, struct err *e) {
    bk_step_begin(b);
    struct tensor *xt = bk_new(b, QT_F32, k, n, 1), *yt[3];
    for (int i = 0; i < 3; i++)
        yt[i] = bk_new(b, QT_F32, rows[i], n, 1);
    bk_upload(b, xt, x, sizeof(float) * (size_t)(k * n));
    const struct tensor *wc[3] = {w[0], w[1], w[2]}, *bias[3] = {NULL, NULL, NULL};
    if (by_hand) {
        struct tensor *h = bk_new(b, QT_F32, k, n, 1);
        bk_rms_norm(b, h, xt, pre->w, pre->eps);
        bk_matmul_group(b, 3, yt, wc, bias, h, NULL);
    } else {
        bk_matmul_group(b, 3, yt, wc, bias, xt, pre);
    }
    for (int i = 0, at = 0; i < 3; at += (int)rows[i] * n, i++)
        bk_download(b, y + at, yt[i], sizeof(float) * (size_t)(rows[i] * n));
    return bk_sync(b, e);
}

static void test_ffn_op(void) {
    const int64_t n_embd = 256, n_ff = 512;
    const int n = 40;
    struct saved_env env;
    env_save(&env);
    float *w16 = malloc(sizeof(float) * (size_t)(n_ff * n_embd)), *deq = malloc(sizeof(float) * (size_t)(n_ff * n_embd));
    float *x = malloc(sizeof(float) * (size_t)(n_embd * n)), *y0 = malloc(sizeof(float) * (size_t)(n_embd * n));
    float *ya = malloc(sizeof(float) * (size_t)(n_embd * n)), *yb = malloc(sizeof(float) * (size_t)(n_embd * n));
    if (!w16 || !deq || !x || !y0 || !ya || !yb) abort();
    void *hw[3] = {make_weights(QT_Q4_K, n_ff, n_embd, w16, deq, &g_seed),
                   make_weights(QT_Q4_K, n_ff, n_embd, w16, deq, &g_seed),
                   make_weights(QT_Q4_K, n_embd, n_ff, w16, deq, &g_seed)};
    float nw_h[256];
    for (int64_t i = 0; i < n_embd * n; i++) {
        x[i] = t_randn(&g_seed);
        y0[i] = (float)(i % 7) - 3.0f;
    }
    for (int i = 0; i < n_embd; i++)
        nw_h[i] = 0.5f + 0.01f * (float)(i % 97);
    for (int forced = 1; forced >= 0; forced--) {
        struct backend *b = tuned_backend(forced ? "0" : NULL);
        if (!b) break;
        struct tensor wt[3], *w[3] = {&wt[0], &wt[1], &wt[2]}, nw;
        struct err e;
        tensor_init(&nw, QT_F32, n_embd, 1, 1, 1);
        nw.data = nw_h;
        nw.name = "norm";
        bool ok = bk_weight_bind(b, &nw, &e) == SMELT_OK;
        const struct prenorm pre = {&nw, 1e-6f};
        for (int i = 0; i < 3 && ok; i++) {
            tensor_init(&wt[i], QT_Q4_K, i == 2 ? n_ff : n_embd, i == 2 ? n_embd : n_ff, 1, 1);
            wt[i].data = hw[i];
            wt[i].name = i == 0 ? "gate" : i == 1 ? "up" : "down";
            ok = bk_weight_bind(b, &wt[i], &e) == SMELT_OK;
            T_CHECKF(ok, "bind: %s", e.msg);
        }
        for (int c = 0; c < 4 && ok; c++) {
            const bool acc = c < 2; /* acc first: a measuring backend's first call */
            const struct prenorm *pp = c % 2 ? &pre : NULL;
            const int first = ffn_step(b, w, pp, x, y0, n_embd, n_ff, n, acc, false, ya, &e);
            T_CHECKF(first >= 0, "ffn op: %s", e.msg);
            if (forced) T_CHECKF(first == 1, "forced tile, acc %d: the op did not fuse", acc);
            else if (c == 0) T_CHECKF(first == 0, "measuring: the first call fused before measuring");
            const int again = ffn_step(b, w, pp, x, y0, n_embd, n_ff, n, acc, false, ya, &e);
            const int hand = ffn_step(b, w, pp, x, y0, n_embd, n_ff, n, acc, true, yb, &e);
            T_CHECKF(again >= 0 && hand == -1, "ffn op: %s", e.msg);
            int diff = 0, bad = 0;
            for (int64_t i = 0; i < n_embd * n; i++) {
                diff += memcmp(&ya[i], &yb[i], sizeof(float)) != 0;
                bad += !isfinite(ya[i]);
            }
            printf("ffn op %s, acc %d, norm %d: first call %s, next %s; %d of %lld outputs differ from the composed "
                   "ops'\n",
                   forced ? "tile 0 forced" : "measuring", acc, pp != NULL, first ? "fused" : "composed",
                   again ? "fused" : "composed", diff, (long long)(n_embd * n));
            T_CHECKF(diff == 0 && bad == 0, "ffn op acc %d norm %d: %d outputs differ, %d not finite", acc, pp != NULL,
                     diff, bad);
        }
        /* Q, K, V through the norm: gate, up and gate again (n_ff rows of n_embd) */
        struct tensor *qkv[3] = {w[0], w[1], w[0]};
        const int64_t rows[3] = {n_ff, n_ff, n_ff};
        float *ga = malloc(sizeof(float) * (size_t)(3 * n_ff * n)), *gb = malloc(sizeof(float) * (size_t)(3 * n_ff * n));
        if (!ga || !gb) abort();
        for (int r = 0; r < 2 && ok; r++) { /* a measuring backend measured these above */
            T_EQ_INT(qkv_step(b, qkv, &pre, x, rows, n_embd, n, false, ga, &e), SMELT_OK);
            T_EQ_INT(qkv_step(b, qkv, &pre, x, rows, n_embd, n, true, gb, &e), SMELT_OK);
            int diff = 0;
            for (int64_t i = 0; i < 3 * n_ff * n; i++)
                diff += memcmp(&ga[i], &gb[i], sizeof(float)) != 0;
            printf("matmul group %s through a norm: %d of %lld outputs differ from the norm's launch, then the group\n",
                   forced ? "tile 0 forced" : "measuring", diff, (long long)(3 * n_ff * n));
            T_CHECKF(diff == 0, "matmul group: %d outputs differ", diff);
        }
        free(ga);
        free(gb);
        bk_free(b);
    }
    env_restore(&env);
    for (int i = 0; i < 3; i++)
        free(hw[i]);
    free(w16);
    free(deq);
    free(x);
    free(y0);
    free(ya);
    free(yb);
}

static void test_mmq_rejects(void) {
    T_CHECK(cuda_mmq_supported(QT_Q4_K, 4096));
    T_CHECK(!cuda_mmq_supported(QT_Q4_K, 896));
    T_CHECK(cuda_mmq_supported(QT_Q8_0, 896));
    T_CHECK(!cuda_mmq_supported(QT_Q8_0, 800)); /* k/32 odd */
    T_CHECK(cuda_mmq_supported(QT_MXFP4, 2880));
    T_CHECK(!cuda_mmq_supported(QT_MXFP4, 2880 + 16));
    T_CHECK(!cuda_mmq_supported(QT_F16, 4096));
    T_CHECK(!cuda_mmq_supported(QT_Q5_0, 4096));
    struct cuda_qweight qw;
    struct err e;
    uint64_t bytes = 0;
    memset(&qw, 0, sizeof qw);
    qw.type = QT_F16;
    qw.rows = 16;
    qw.k = 256;
    T_EQ_INT(cuda_mmq_pre(&g_ctx, &qw, 16, NULL, NULL, 0, 0, CUDA_MMQ_TILE_AUTO, &e),
             SMELT_ERR_UNSUPPORTED);
    T_CHECK(strstr(e.msg, "F16") != NULL);
    qw.type = QT_Q8_0;
    T_EQ_INT(cuda_mmq_pre(&g_ctx, &qw, 0, NULL, NULL, 0, 0, CUDA_MMQ_TILE_AUTO, &e), SMELT_ERR_INVALID);
    T_EQ_INT(cuda_mmq_pre(&g_ctx, &qw, 16, NULL, NULL, 0, 0, 99, &e), SMELT_ERR_INVALID);
    T_EQ_INT(cuda_mmq_scratch_bytes(&g_ctx, 16, 256, 16, &bytes, &e), SMELT_OK);
    T_CHECK(bytes >= 16 * 256 * 2);
    /* scratch too small: refused before any launch (cuda_mmq_scratch_bytes is the most any
     * tile of the shape needs, so one byte less than it may still be enough for the tile the
     * call picks: ask with far too little) */
    T_EQ_INT(cuda_mmq_pre(&g_ctx, &qw, 16, NULL, NULL, 64, 0, CUDA_MMQ_TILE_AUTO, &e), SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "scratch") != NULL);
    T_EQ_INT(cuda_mmq_quantize(&g_ctx, NULL, 100, 4, NULL, &e), SMELT_ERR_INVALID);
}

/* ---- bench ---- */

enum bench_op { OP_MMQ, OP_MMV, OP_GEMM };

struct bench_ctx {
    const struct cuda_qweight *qw;
    int copies, n, tile;
    int64_t rows, k, tile_rows;
    const float *dx;
    float *dy;
    void *sq, *sv, *xh, *wh;
    uint64_t sq_bytes;
    cublasHandle_t cublas;
    cudaStream_t st;
    struct cuda_ctx lc; /* the launches' context: g_ctx on st */
    int gemm_ok;
};

/* Enqueues product i of the measured kind on ctx->st. */
static void bench_enqueue(struct bench_ctx *c, enum bench_op op, int i) {
    struct err e;
    const struct cuda_qweight *w = &c->qw[i % c->copies];
    const int64_t rows = c->rows, k = c->k;
    const int n = c->n;
    if (op == OP_MMQ) {
        if (cuda_mmq_quantize(&c->lc, c->dx, k, n, c->sq, &e) == SMELT_OK)
            cuda_mmq_pre(&c->lc, w, n, c->dy, c->sq, c->sq_bytes, 0, c->tile, &e);
    } else if (op == OP_MMV) { /* as the backend below GEMM_MIN_ROWS: 8-row chunks */
        for (int t0 = 0; t0 < n; t0 += CUDA_MMV_MAX_N) {
            const int nt = n - t0 < CUDA_MMV_MAX_N ? n - t0 : CUDA_MMV_MAX_N;
            cuda_mmv_quantize(&c->lc, c->dx + (int64_t)t0 * k, k, nt, c->sv, &e);
            cuda_mmv_pre(&c->lc, w, c->dx + (int64_t)t0 * k, nt, c->dy + (int64_t)t0 * rows, c->sv, 0, &e);
        }
    } else { /* as the backend's gemm(): x to F16, W to F16 in row tiles, cublasGemmEx */
        const float alpha = 1.0f, beta = 0.0f;
        cuda_f32_to_f16(&c->lc, c->xh, c->dx, k * n);
        for (int64_t r0 = 0; r0 < rows; r0 += c->tile_rows) {
            const int64_t nr = rows - r0 < c->tile_rows ? rows - r0 : c->tile_rows;
            cuda_dequant_f16(&c->lc, c->wh, w, r0, nr);
            if (cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, (int)k, &alpha, c->wh,
                             CUDA_R_16F, (int)k, c->xh, CUDA_R_16F, (int)k, &beta, c->dy + r0,
                             CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                c->gemm_ok = 0;
        }
    }
}

/* Microseconds per product: a graph of `reps` products (weights rotating), replayed; -1 on
 * failure. Falls back to timing the same products enqueued eagerly if capture fails. */
static double bench_time(struct bench_ctx *c, enum bench_op op, int reps) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    cudaEvent_t a, b;
    float ms = -1;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    bench_enqueue(c, op, 0); /* warm-up (first-use setup happens outside any capture) */
    if (cudaStreamSynchronize(c->st) != cudaSuccess) goto done;
    if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
        for (int i = 0; i < reps; i++)
            bench_enqueue(c, op, i);
        if (cudaStreamEndCapture(c->st, &g) != cudaSuccess ||
            cudaGraphInstantiate(&ex, g, 0) != cudaSuccess)
            ex = NULL;
    }
    cudaGetLastError();
    if (ex) {
        cudaGraphLaunch(ex, c->st);
        cudaEventRecord(a, c->st);
        for (int it = 0; it < 3; it++)
            cudaGraphLaunch(ex, c->st);
        cudaEventRecord(b, c->st);
    } else {
        printf("bench: capture failed, timing eagerly\n");
        for (int i = 0; i < reps; i++)
            bench_enqueue(c, op, i);
        cudaEventRecord(a, c->st);
        for (int it = 0; it < 3; it++)
            for (int i = 0; i < reps; i++)
                bench_enqueue(c, op, i);
        cudaEventRecord(b, c->st);
    }
    if (cudaEventSynchronize(b) == cudaSuccess) cudaEventElapsedTime(&ms, a, b);
done:
    if (ex) cudaGraphExecDestroy(ex);
    if (g) cudaGraphDestroy(g);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (cudaGetLastError() != cudaSuccess || ms < 0) return -1;
    return ms * 1e3 / (3.0 * reps);
}

static void bench_row(const char *what, const char *shape, uint32_t type, int n, double us,
                      double ops, double bytes) {
    if (us <= 0) {
        printf("bench %-5s %-10s n=%-3d %-16s failed\n", qtype_name(type), shape, n, what);
        return;
    }
    printf("bench %-5s %-10s n=%-3d %-16s %9.2f us %7.1f TFLOP/s %6.0f GB/s (%3.0f%% of 4.38 TB/s)\n",
           qtype_name(type), shape, n, what, us, ops / us / 1e6, bytes / us / 1e3,
           bytes / us / 1e3 / 4380 * 100);
}

#define BENCH_NS 7

static void bench(void) {
    struct shape {
        const char *name;
        int64_t rows, k;
    } shapes[] = {{"4096x4096", 4096, 4096},
                  {"14336x4096", 14336, 4096},
                  {"4096x14336", 4096, 14336},
                  {"1024x4096", 1024, 4096}}; /* Llama-3-8B K/V: every tile split ~16 ways */
    const uint32_t types[] = {QT_Q4_K, QT_Q6_K, QT_Q8_0};
    const int ns[BENCH_NS] = {8, 16, 32, 64, 128, 256, 512};
    /* win[type][n]: mmq beat the backend's other path on every shape at this n */
    int win[3][BENCH_NS], ran[3] = {0, 0, 0};
    struct err e;
    const char *only = getenv("SMELT_BENCH_TYPE");
    struct bench_ctx c;
    memset(&c, 0, sizeof c);
    void *cublas_ws = NULL;
    if (cublasCreate(&c.cublas) != CUBLAS_STATUS_SUCCESS ||
        cudaStreamCreateWithFlags(&c.st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&cublas_ws, 32 << 20) != cudaSuccess) {
        printf("bench: setup failed\n");
        return;
    }
    cublasSetStream(c.cublas, c.st);
    c.lc = g_ctx;
    c.lc.stream = c.st;
    cublasSetWorkspace(c.cublas, cublas_ws, 32 << 20); /* no allocation inside a capture */
    for (int ti = 0; ti < 3; ti++)
        for (int ni = 0; ni < BENCH_NS; ni++)
            win[ti][ni] = 1;
    printf("bench: us per product (x conversion included), CUDA graphs of many products, weights "
           "rotating through > 1 GiB; mmv = the 8-row kernel repeated ceil(n/8) times; cuBLAS = x "
           "to F16, W dequantized to F16 in 64 MB tiles, cublasGemmEx. Ceilings (H200): 4.38 TB/s "
           "HBM read; ~780 TFLOP/s dense f16/bf16 (cuBLAS 8192^3), less for mma.sync\n");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const uint32_t type = types[ti];
            if (only && strcmp(only, qtype_name(type)) != 0) continue;
            ran[ti] = 1;
            const int64_t rows = shapes[si].rows, k = shapes[si].k;
            const uint64_t rb = qtype_row_size(type, k), bytes = rb * rows;
            int copies = (int)((1ull << 30) / bytes) + 1;
            if (copies > 64) copies = 64;
            uint8_t *host = malloc(bytes);
            float *row = malloc(sizeof(float) * k);
            if (!host || !row) abort();
            for (int64_t r = 0; r < rows; r++) { /* real blocks (sane scales), varied rows */
                for (int64_t i = 0; i < k; i++)
                    row[i] = 0.02f * t_randn(&g_seed);
                if (r < 64)
                    qtype_get(type)->quantize(row, host + rb * r, k);
                else
                    memcpy(host + rb * r, host + rb * (r % 64), rb);
            }
            struct cuda_qweight *qw = calloc((size_t)copies, sizeof *qw);
            int ok = qw != NULL;
            for (int cc = 0; cc < copies && ok; cc++)
                ok = cuda_qweight_upload(&g_ctx, &qw[cc], type, host, rows, k, &e) == SMELT_OK;
            const int nmax = ns[BENCH_NS - 1];
            float *dx = NULL, *dy = NULL;
            void *sq = NULL, *sv = NULL, *xh = NULL, *wh = NULL;
            uint64_t sq_bytes = 0;
            int64_t tile_rows = (int64_t)(((size_t)64 << 20) / ((size_t)k * 2));
            if (tile_rows > rows) tile_rows = rows;
            ok = ok && cuda_mmq_scratch_bytes(&g_ctx, rows, k, nmax, &sq_bytes, &e) == SMELT_OK &&
                 cudaMalloc((void **)&dx, sizeof(float) * nmax * k) == cudaSuccess &&
                 cudaMalloc((void **)&dy, sizeof(float) * nmax * rows) == cudaSuccess &&
                 cudaMalloc(&sq, sq_bytes) == cudaSuccess &&
                 cudaMalloc(&sv, cuda_mmv_scratch_bytes(k, CUDA_MMV_MAX_N)) == cudaSuccess &&
                 cudaMalloc(&xh, (size_t)nmax * k * 2) == cudaSuccess &&
                 cudaMalloc(&wh, (size_t)tile_rows * k * 2) == cudaSuccess;
            if (!ok)
                printf("bench %s %s: setup failed (%s)\n", qtype_name(type), shapes[si].name, e.msg);
            if (ok) { /* activations: Gaussian */
                float *hx = malloc(sizeof(float) * nmax * k);
                if (!hx) abort();
                for (int64_t i = 0; i < (int64_t)nmax * k; i++)
                    hx[i] = t_randn(&g_seed);
                cudaMemcpy(dx, hx, sizeof(float) * nmax * k, cudaMemcpyHostToDevice);
                free(hx);
            }
            c.qw = qw;
            c.copies = copies;
            c.rows = rows;
            c.k = k;
            c.tile_rows = tile_rows;
            c.dx = dx;
            c.dy = dy;
            c.sq = sq;
            c.sq_bytes = sq_bytes;
            c.sv = sv;
            c.xh = xh;
            c.wh = wh;
            for (int ni = 0; ni < BENCH_NS && ok; ni++) {
                const int n = ns[ni];
                const double ops = 2.0 * rows * k * n;
                const int reps = copies < 32 ? (copies < 8 ? 8 : copies) : 32;
                char what[48];
                c.n = n;
                /* mmq: the automatic tile, then each tile */
                c.tile = CUDA_MMQ_TILE_AUTO;
                const int at = cuda_mmq_tile_auto(&g_ctx, &qw[0], n);
                const double us_auto = bench_time(&c, OP_MMQ, reps);
                int abm = 0, abn = 0, best_tile = -1;
                cuda_mmq_tile_shape(at, &abm, &abn);
                snprintf(what, sizeof what, "mmq auto %dx%d", abm, abn);
                bench_row(what, shapes[si].name, type, n, us_auto, ops, bytes);
                double best = 1e30;
                for (int tile = 0; tile < cuda_mmq_tile_count(); tile++) {
                    int bm, bn;
                    cuda_mmq_tile_shape(tile, &bm, &bn);
                    if (bn > 2 * n && bn > 16) continue; /* mostly padding */
                    c.tile = tile;
                    const double us = bench_time(&c, OP_MMQ, reps);
                    char tn[32];
                    cuda_mmq_tile_name(tile, tn, sizeof tn);
                    snprintf(what, sizeof what, "mmq %s g%d", tn, cuda_mmq_grid(&g_ctx, &qw[0], n, tile));
                    bench_row(what, shapes[si].name, type, n, us, ops, bytes);
                    if (us > 0 && us < best) best = us, best_tile = tile;
                }
                const double us_mmv = bench_time(&c, OP_MMV, reps);
                bench_row("mmv x8 repeated", shapes[si].name, type, n, us_mmv, ops, bytes);
                c.gemm_ok = 1;
                double us_gemm = bench_time(&c, OP_GEMM, reps);
                if (!c.gemm_ok) us_gemm = -1;
                bench_row("dequant+cuBLAS", shapes[si].name, type, n, us_gemm, ops, bytes);
                int bbm = 0, bbn = 0;
                cuda_mmq_tile_shape(best_tile, &bbm, &bbn);
                const char *winner = "mmq";
                double wus = us_auto;
                if (us_mmv > 0 && us_mmv < wus) winner = "mmv", wus = us_mmv;
                if (us_gemm > 0 && us_gemm < wus) winner = "cuBLAS", wus = us_gemm;
                printf("bench %-5s %-10s n=%-3d summary: mmq %.2f us (auto %dx%d, grid %d; best "
                       "tile %dx%d %.2f us) | mmv %.2f us | cuBLAS %.2f us | fastest %s | mmq "
                       "%.0f GB/s (%.0f%% of HBM), %.0f TFLOP/s\n",
                       qtype_name(type), shapes[si].name, n, us_auto, abm, abn,
                       cuda_mmq_grid(&g_ctx, &qw[0], n, -1), bbm, bbn, best, us_mmv, us_gemm, winner,
                       us_auto > 0 ? bytes / us_auto / 1e3 : 0,
                       us_auto > 0 ? bytes / us_auto / 1e3 / 4380 * 100 : 0,
                       us_auto > 0 ? ops / us_auto / 1e6 : 0);
                /* the backend's alternative: mmv chunks below 33 rows, cuBLAS above */
                const double alt = n < 33 ? us_mmv : us_gemm;
                if (!(us_auto > 0 && (alt <= 0 || us_auto <= alt))) win[ti][ni] = 0;
                if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
                    printf("bench %s %s n=%d: CUDA error, stopping this shape\n", qtype_name(type),
                           shapes[si].name, n);
                    ok = 0;
                }
            }
            for (int cc = 0; cc < copies && qw; cc++)
                cuda_qweight_free(&qw[cc]);
            free(qw);
            free(host);
            free(row);
            cudaFree(dx);
            cudaFree(dy);
            cudaFree(sq);
            cudaFree(sv);
            cudaFree(xh);
            cudaFree(wh);
        }
    /* the largest n of the list up to which mmq beats cuBLAS on every shape (n >= 16) */
    int suggest = -1;
    for (int ti = 0; ti < 3; ti++) {
        if (!ran[ti]) continue;
        int upto = 8;
        for (int ni = 1; ni < BENCH_NS && win[ti][ni]; ni++)
            upto = ns[ni];
        printf("bench suggestion %s: mmq beats the backend's other path (mmv below 33 rows, "
               "dequant+cuBLAS above) on all four shapes up to n = %d\n",
               qtype_name(types[ti]), upto);
        if (suggest < 0 || upto < suggest) suggest = upto;
    }
    if (suggest >= 0)
        printf("bench suggestion: MMQ_MAX_ROWS %d (the smallest over the types run; between two "
               "listed n the switch point is not measured)\n",
               suggest);
    cudaFree(cublas_ws);
    cudaStreamDestroy(c.st);
    cublasDestroy(c.cublas);
}

/* SMELT_BENCH=1 (or =tune for this part only): the backend's own measurement, as a model
 * would trigger it, on the shapes of Llama-3-8B-class models: 4096x4096 (Q, O), 6144x4096
 * (Q, K, V merged), 14336x4096 (gate or up), 28672x4096 (gate and up merged), 4096x14336
 * (down); each token-row bucket at its largest n (512 -> 1024 for the last). One line per
 * (type, shape, n): every candidate's median time, the winner, and the static choice's time;
 * then one line per (type, shape) with the switch points. These are the figures
 * docs/cuda-backend.md records ("Choosing the path by measurement"). */
static void bench_tuned(void) {
    const struct {
        const char *name;
        int64_t rows, k;
    } shapes[] = {{"4096x4096", 4096, 4096},
                  {"6144x4096", 6144, 4096},
                  {"14336x4096", 14336, 4096},
                  {"28672x4096", 28672, 4096},
                  {"4096x14336", 4096, 14336}};
    const uint32_t types[] = {QT_Q4_K, QT_Q6_K, QT_Q8_0};
    const int ns[] = {16, 32, 48, 64, 128, 256, 512, 1024};
    const char *only = getenv("SMELT_BENCH_TYPE");
    struct saved_env env;
    env_save(&env);
    printf("bench tune: the backend's path measurement (1 warm-up + %d timed runs per candidate, median, "
           "L2 flushed before each; x conversion included)\n",
           MMTUNE_RUNS);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        if (only && strcmp(only, qtype_name(type)) != 0) continue;
        struct backend *b = tuned_backend(NULL);
        if (!b) break;
        double total_ms = 0;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t rows = shapes[si].rows, k = shapes[si].k;
            const uint64_t rb = qtype_row_size(type, k);
            uint8_t *host = malloc(rb * (uint64_t)rows);
            float *row = malloc(sizeof(float) * (size_t)k);
            float *x = malloc(sizeof(float) * (size_t)(1024 * k)), *y = malloc(sizeof(float) * (size_t)(1024 * rows));
            if (!host || !row || !x || !y) abort();
            for (int64_t r = 0; r < rows; r++) { /* real blocks (sane scales), varied rows */
                if (r < 64) {
                    for (int64_t i = 0; i < k; i++)
                        row[i] = 0.02f * t_randn(&g_seed);
                    qtype_get(type)->quantize(row, host + rb * r, k);
                } else {
                    memcpy(host + rb * r, host + rb * (r % 64), rb);
                }
            }
            for (int64_t i = 0; i < 1024 * k; i++)
                x[i] = t_randn(&g_seed);
            struct tensor wt;
            struct err e;
            tensor_init(&wt, type, k, rows, 1, 1);
            wt.data = host;
            wt.name = shapes[si].name;
            if (bk_weight_bind(b, &wt, &e) != SMELT_OK) {
                printf("bench tune %s %s: bind failed: %s\n", qtype_name(type), shapes[si].name, e.msg);
                free(host);
                free(row);
                free(x);
                free(y);
                continue;
            }
            char sw[512];
            size_t at = 0;
            int prev = -100;
            sw[0] = '\0';
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const int n = ns[ni];
                struct timespec ta, tb;
                clock_gettime(CLOCK_MONOTONIC, &ta);
                if (bk_product(b, &wt, x, k, n, rows, NULL, y, 0, &e) != SMELT_OK) {
                    printf("bench tune %s %s n=%d: failed: %s\n", qtype_name(type), shapes[si].name, n, e.msg);
                    break;
                }
                clock_gettime(CLOCK_MONOTONIC, &tb);
                total_ms += (double)(tb.tv_sec - ta.tv_sec) * 1e3 + (double)(tb.tv_nsec - ta.tv_nsec) * 1e-6;
                const struct mmtune_ent *ent = cuda_backend_mm_entry(b, type, rows, k, n);
                char line[1024], name[32];
                size_t la = 0;
                if (!ent) {
                    printf("bench tune %-5s %-10s n=%-4d nothing recorded\n", qtype_name(type), shapes[si].name, n);
                    continue;
                }
                for (int c = 0; c < ent->n_cand && la < sizeof line; c++)
                    la += (size_t)snprintf(line + la, sizeof line - la, "%s%s %.1f", c ? " | " : "",
                                           mmtune_choice_name(ent->cand[c], cuda_mmq_tile_name, name, sizeof name),
                                           ent->cand_us[c]);
                if (la >= sizeof line) line[sizeof line - 1] = '\0';
                char stat[32];
                mmtune_choice_name(ent->static_choice, cuda_mmq_tile_name, stat, sizeof stat);
                printf("bench tune %-5s %-10s n=%-4d %s -> %s %.1f us (static %s %.1f us, %.2fx)\n", qtype_name(type),
                       shapes[si].name, n, line, mmtune_choice_name(ent->choice, cuda_mmq_tile_name, name, sizeof name),
                       ent->us, stat, ent->static_us, ent->static_us > 0 && ent->us > 0 ? ent->static_us / ent->us : 0);
                const int kind = ent->choice >= 0 ? 0 : ent->choice; /* mmq (any tile), cuBLAS, mmv */
                if (kind != prev && at < sizeof sw)
                    at += (size_t)snprintf(sw + at, sizeof sw - at, "%s%s from n=%d", prev == -100 ? "" : ", ",
                                           kind == 0 ? "mmq" : kind == MMTUNE_GEMM ? "cuBLAS" : "mmv", n);
                prev = kind;
            }
            printf("bench tune %-5s %-10s switch points (bucket maxima): %s\n", qtype_name(type), shapes[si].name, sw);
            free(host);
            free(row);
            free(x);
            free(y);
        }
        printf("bench tune %s: %.0f ms wall time for these first calls (measuring included)\n", qtype_name(type),
               total_ms);
        bk_free(b); /* logs the table (SMELT_LOG=debug) */
    }
    env_restore(&env);
}

/* SMELT_BENCH=one: one product for a profiler (ncu -k regex:mmq_kernel --launch-skip 2
 * --launch-count 1): Q4_K SMELT_BENCH_ROWS (4096) x SMELT_BENCH_K (4096), SMELT_BENCH_N (512)
 * token rows, tile SMELT_MMQ_BENCH_TILE (the automatic one when unset); five launches, the
 * last three timed together. */
static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static void bench_one(void) {
    const int64_t rows = env_int("SMELT_BENCH_ROWS", 4096), k = env_int("SMELT_BENCH_K", 4096);
    const int n = env_int("SMELT_BENCH_N", 512), tile = env_int("SMELT_MMQ_BENCH_TILE", CUDA_MMQ_TILE_AUTO);
    float *w16 = malloc(sizeof(float) * (size_t)(rows * k)), *deq = malloc(sizeof(float) * (size_t)(rows * k));
    float *x = malloc(sizeof(float) * (size_t)(n * k));
    if (!w16 || !deq || !x) abort();
    void *w = make_weights(QT_Q4_K, rows, k, w16, deq, &g_seed);
    for (int64_t i = 0; i < n * k; i++)
        x[i] = t_randn(&g_seed);
    /* SMELT_BENCH_GLU=1: the same rows as a GLU product (cuda_mmq_glu_pre), gate and up the
     * two halves */
    const int glu = env_int("SMELT_BENCH_GLU", 0) && rows % 16 == 0;
    struct cuda_qweight qw, qu;
    struct err e;
    memset(&qw, 0, sizeof qw);
    memset(&qu, 0, sizeof qu);
    float *dx = NULL, *dy = NULL;
    void *scratch = NULL;
    uint64_t sbytes = 0;
    if (glu) {
        T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw, QT_Q4_K, w, rows / 2, k, &e), SMELT_OK);
        T_EQ_INT(cuda_qweight_upload(&g_ctx, &qu, QT_Q4_K, (char *)w + qtype_row_size(QT_Q4_K, k) * (rows / 2),
                                     rows / 2, k, &e),
                 SMELT_OK);
    } else T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw, QT_Q4_K, w, rows, k, &e), SMELT_OK);
    T_EQ_INT(cuda_mmq_scratch_bytes(&g_ctx, rows, k, n, &sbytes, &e), SMELT_OK);
    CK(cudaMalloc((void **)&dx, sizeof(float) * n * k));
    CK(cudaMalloc((void **)&dy, sizeof(float) * n * rows));
    CK(cudaMalloc(&scratch, sbytes));
    CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int i = 0; i < 5; i++) {
        if (i == 2) CK(cudaEventRecord(e0, 0));
        T_EQ_INT(cuda_mmq_quantize(&g_ctx, dx, k, n, scratch, &e), SMELT_OK);
        if (glu) T_EQ_INT(cuda_mmq_glu_pre(&g_ctx, &qw, &qu, 0, n, dy, NULL, scratch, sbytes, tile, &e), SMELT_OK);
        else T_EQ_INT(cuda_mmq_pre(&g_ctx, &qw, n, dy, scratch, sbytes, 0, tile, &e), SMELT_OK);
    }
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    char tn[32];
    cuda_mmq_tile_name(tile < 0 ? cuda_mmq_tile_auto(&g_ctx, &qw, n) : tile, tn, sizeof tn);
    printf("bench one Q4_K %lldx%lld%s n=%d tile %s: %.1f us a product (conversion included)\n",
           (long long)rows, (long long)k, glu ? " glu" : "", n, tn, ms * 1000 / 3);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
out:
    cuda_qweight_free(&qw);
    cuda_qweight_free(&qu);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(scratch);
    free(w16);
    free(deq);
    free(w);
    free(x);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP test_cuda_mmq: no CUDA device on this machine\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major < 8) {
        printf("SKIP test_cuda_mmq: device %s is sm_%d%d; mmq needs sm_80 or newer\n", prop.name,
               prop.major, prop.minor);
        return 77;
    }
    struct err e;
    if (cuda_ctx_init(&g_ctx, 0, NULL, &e) != SMELT_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const char *bm = getenv("SMELT_BENCH");
    if (bm && !strcmp(bm, "one")) {
        bench_one();
        cuda_ctx_free(&g_ctx);
        return t_done();
    }
    T_RUN(test_mmq_rejects);
    T_RUN(test_mmq_q4_k);
    T_RUN(test_mmq_q6_k);
    T_RUN(test_mmq_q8_0);
    T_RUN(test_mmq_mxfp4);
    T_RUN(test_mmq_glu);
    T_RUN(test_mmq_stack);
    T_RUN(test_mmq_big_x);
    T_RUN(test_mmq_graph);
    T_RUN(test_mmq_tuned);
    T_RUN(test_ffn_op);
    if (bm && strcmp(bm, "tune") != 0) bench();
    if (bm) bench_tuned();
    cuda_ctx_free(&g_ctx);
    return t_done();
}
#endif
