/* CUDA int8 tensor-core matmul (cuda_mmq) against its CPU twin.
 *
 * Weights: Gaussian values quantized with the reference quantizer (src/quant), rows of
 * different magnitude. Two references, both in double precision:
 *   - y_q: the reference dequantized W against x quantized exactly as the GPU does (int8
 *     per 32 values, d = amax/127, round-to-nearest-even): the GPU must match it to float
 *     rounding, |y - y_q| <= 2e-5 * sum|w||x| + 1e-6, which proves the integer math, the
 *     fragment layouts and the weight layouts;
 *   - y: the same W against the exact x: the difference is the activation quantization
 *     error, reported and bounded (relative RMS < 1.5%).
 * Every tile shape is run on every case (and the automatic choice), on ragged shapes (row
 * counts that are not multiples of the tile, Q8_0 rows whose length is not a multiple of
 * 256) and n = 9 .. 512 token rows. Outputs are poisoned with NaN before each run (every
 * output must be written) and followed by a guard band (nothing past the end may be).
 * For large shapes the CPU reference checks a sample of rows (every token of each).
 *
 * SMELT_BENCH=1 adds the figures for the dispatch switch points: for 4096x4096,
 * 14336x4096 and 4096x14336 Q4_K/Q6_K/Q8_0 and 8..512 token rows, microseconds per call of
 * mmq (each tile and the automatic choice), of the 8-row mmv repeated as the backend does,
 * and of F16 dequantization + cuBLAS as the backend's GEMM path does, with TOP/s and the
 * weight GB/s. Weights rotate through > 1 GiB of copies so reads come from HBM.
 * SMELT_BENCH_TYPE=Q4_K limits it to one type.
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

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmq.h"
#include "backend/cuda/cuda_mmv.h"
#include "quant/quant.h"

static unsigned long long g_seed = 0x3a9;

#define GUARD 4096 /* floats after y that must stay untouched */
#define SENTINEL 12345.0f

static void *make_weights(uint32_t type, int64_t rows, int64_t k, float *deq) {
    const struct qtype_info *qi = qtype_get(type);
    uint64_t rb = qtype_row_size(type, k);
    uint8_t *w = malloc(rb * (uint64_t)rows);
    float *row = malloc(sizeof(float) * (size_t)k);
    if (!w || !row) abort();
    for (int64_t r = 0; r < rows; r++) {
        float scale = 0.02f * (1.0f + (float)(r % 7)); /* rows of different magnitude */
        for (int64_t i = 0; i < k; i++)
            row[i] = scale * t_randn(&g_seed);
        qi->quantize(row, w + rb * r, k);
        qi->dequantize(w + rb * r, deq + k * r, k);
    }
    free(row);
    return w;
}

/* The GPU's activation quantization, on the CPU. */
static void quantize_like_gpu(const float *x, int64_t nk, float *xhat) {
    for (int64_t b = 0; b < nk; b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / 127.0f;
        for (int i = 0; i < 32; i++)
            xhat[b + i] = d > 0 ? rintf(x[b + i] / d) * d : 0.0f;
    }
}

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

/* One weight (type, rows x k) against each n in ns, with every tile and the automatic one. */
static void check_weight(uint32_t type, int64_t rows, int64_t k, const int *ns, int n_ns) {
    float *deq = malloc(sizeof(float) * (size_t)(rows * k));
    if (!deq) abort();
    void *w = make_weights(type, rows, k, deq);
    struct cuda_qweight qw;
    struct err e;
    memset(&qw, 0, sizeof qw);
    smelt_status up = cuda_qweight_upload(&qw, type, w, rows, k, NULL, &e);
    T_CHECKF(up == SMELT_OK, "upload: %s", e.msg);
    int nmax = 0;
    for (int i = 0; i < n_ns; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    float *x = malloc(sizeof(float) * (size_t)(nmax * k)),
          *xh = malloc(sizeof(float) * (size_t)(nmax * k));
    float *y = malloc(sizeof(float) * (size_t)(nmax * rows + GUARD));
    double *yq = malloc(sizeof(double) * (size_t)(nmax * rows)),
           *yx = malloc(sizeof(double) * (size_t)(nmax * rows));
    double *mag = malloc(sizeof(double) * (size_t)(nmax * rows));
    float *dx = NULL, *dy = NULL;
    void *scratch = NULL;
    if (!x || !xh || !y || !yq || !yx || !mag) abort();
    if (up != SMELT_OK) goto out;
    CK(cudaMalloc((void **)&dx, sizeof(float) * nmax * k));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (nmax * rows + GUARD)));
    CK(cudaMalloc(&scratch, cuda_mmq_scratch_bytes(k, nmax)));
    for (int ni = 0; ni < n_ns; ni++) {
        const int n = ns[ni];
        for (int64_t i = 0; i < n * k; i++)
            x[i] = t_randn(&g_seed);
        quantize_like_gpu(x, n * k, xh);
        int64_t stride = (int64_t)((double)rows * k * n / 3e7);
        if (stride < 1) stride = 1;
        for (int64_t r = 0; r < rows; r++) {
            if (!row_checked(r, rows, stride)) continue;
            const float *wr = deq + r * k;
            for (int t = 0; t < n; t++) {
                double a = 0, b = 0, m = 0;
                const float *xt = x + t * k, *ht = xh + t * k;
                for (int64_t i = 0; i < k; i++) {
                    a += (double)wr[i] * ht[i];
                    b += (double)wr[i] * xt[i];
                    m += fabs((double)wr[i] * ht[i]);
                }
                yq[t * rows + r] = a;
                yx[t * rows + r] = b;
                mag[t * rows + r] = m;
            }
        }
        CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
        for (int tile = CUDA_MMQ_TILE_AUTO; tile < cuda_mmq_tile_count(); tile++) {
            int bm = 0, bn = 0;
            if (tile == CUDA_MMQ_TILE_AUTO) {
                int at = cuda_mmq_tile_auto(&qw, n);
                T_CHECK(at >= 0 && at < cuda_mmq_tile_count());
                cuda_mmq_tile_shape(at, &bm, &bn);
            } else {
                cuda_mmq_tile_shape(tile, &bm, &bn);
            }
            for (int64_t i = 0; i < n * rows; i++)
                y[i] = NAN; /* poison: every output is written */
            for (int i = 0; i < GUARD; i++)
                y[n * rows + i] = SENTINEL;
            CK(cudaMemcpy(dy, y, sizeof(float) * (n * rows + GUARD), cudaMemcpyHostToDevice));
            smelt_status st = cuda_mmq_quantize(dx, k, n, scratch, NULL, &e);
            if (st == SMELT_OK) st = cuda_mmq_pre(&qw, n, dy, scratch, 0, tile, NULL, &e);
            if (st == SMELT_ERR_UNSUPPORTED &&
                tile != CUDA_MMQ_TILE_AUTO) { /* too much smem here */
                printf("mmq %-5s %5lldx%-5lld n=%-3d tile %3dx%-3d: not on this device (%s)\n",
                       qtype_name(type), (long long)rows, (long long)k, n, bm, bn, e.msg);
                continue;
            }
            T_CHECKF(st == SMELT_OK, "%s", e.msg);
            if (st != SMELT_OK) continue;
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y, dy, sizeof(float) * (n * rows + GUARD), cudaMemcpyDeviceToHost));
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
                    const double ref = yq[t * rows + r], m = mag[t * rows + r];
                    const double dev = fabs(g - ref) / (m + 1e-30);
                    if (dev > worst) worst = dev;
                    if (!(fabs(g - ref) <= 2e-5 * m + 1e-6)) {
                        if (bad++ == 0 && first_t < 0) first_t = t, first_r = r;
                        if (bad <= 3)
                            fprintf(stderr,
                                    "  %s %lldx%lld n=%d tile %dx%d: y[%d][%lld] = %.7g, ref %.7g "
                                    "(mag %.3g)\n",
                                    qtype_name(type), (long long)rows, (long long)k, n, bm, bn, t,
                                    (long long)r, g, ref, m);
                    }
                    err2 += (g - yx[t * rows + r]) * (g - yx[t * rows + r]);
                    ref2 += yx[t * rows + r] * yx[t * rows + r];
                }
            for (int i = 0; i < GUARD; i++)
                guard += y[n * rows + i] != SENTINEL;
            const double rel = ref2 > 0 ? sqrt(err2 / ref2) : 0;
            printf("mmq %-5s %5lldx%-5lld n=%-3d tile %3dx%-3d%s: %s  max |err|/mag %.1e  rel RMS "
                   "vs exact x %.2e",
                   qtype_name(type), (long long)rows, (long long)k, n, bm, bn,
                   tile == CUDA_MMQ_TILE_AUTO ? " auto" : "",
                   bad || unwritten || guard ? "MISMATCH" : "ok", worst, rel);
            if (first_t >= 0) printf("  first bad y[%lld][%lld]", first_t, first_r);
            printf("\n");
            T_CHECKF(bad == 0, "%d outputs off", bad);
            T_CHECKF(unwritten == 0, "%d outputs not written (NaN)", unwritten);
            T_CHECKF(guard == 0, "%d floats written past the end of y", guard);
            T_CHECKF(rel < 1.5e-2, "relative RMS %.3g", rel);
        }
        /* accumulate: y = y0 + W x, with the automatic tile */
        for (int64_t i = 0; i < n * rows; i++)
            y[i] = (float)(i % 13) - 6.0f;
        CK(cudaMemcpy(dy, y, sizeof(float) * n * rows, cudaMemcpyHostToDevice));
        T_EQ_INT(cuda_mmq(&qw, dx, n, dy, scratch, 1, NULL, &e), SMELT_OK);
        CK(cudaMemcpy(y, dy, sizeof(float) * n * rows, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++) {
                if (!row_checked(r, rows, stride)) continue;
                const int64_t i = t * rows + r;
                const double want = (double)(i % 13) - 6.0 + yq[i];
                if (!(fabs(y[i] - want) <= 2e-5 * mag[i] + 1e-5)) {
                    if (bad++ < 3)
                        fprintf(stderr, "  accumulate %s n=%d: y[%d][%lld] = %.7g, want %.7g\n",
                                qtype_name(type), n, t, (long long)r, y[i], want);
                }
            }
        T_CHECKF(bad == 0, "accumulate: %d outputs off", bad);
    }
out:
    cuda_qweight_free(&qw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(scratch);
    free(deq);
    free(w);
    free(x);
    free(xh);
    free(y);
    free(yq);
    free(yx);
    free(mag);
}

static void test_mmq_q4_k(void) {
    const int ns[] = {9, 16, 33, 64, 100, 512};
    check_weight(QT_Q4_K, 40, 256, ns, 3); /* a single stage */
    check_weight(QT_Q4_K, 67, 768, ns, 6);
    check_weight(QT_Q4_K, 301, 2560, ns, 6);
    check_weight(QT_Q4_K, 4096, 4096, ns, 6);
}

static void test_mmq_q6_k(void) {
    const int ns[] = {9, 16, 33, 64, 100, 512};
    check_weight(QT_Q6_K, 40, 256, ns, 3);
    check_weight(QT_Q6_K, 67, 768, ns, 6);
    check_weight(QT_Q6_K, 301, 2560, ns, 6);
    check_weight(QT_Q6_K, 4096, 4096, ns, 6);
}

static void test_mmq_q8_0(void) {
    const int ns[] = {9, 16, 33, 64, 100, 512};
    check_weight(QT_Q8_0, 40, 64, ns, 3); /* a single partial stage */
    check_weight(QT_Q8_0, 67, 768, ns, 6);
    check_weight(QT_Q8_0, 301, 2560, ns, 6);
    check_weight(QT_Q8_0, 131, 896, ns, 6); /* 3.5 stages: the partial last stage */
    check_weight(QT_Q8_0, 4096, 4096, ns, 6);
}

static void test_mmq_rejects(void) {
    T_CHECK(cuda_mmq_supported(QT_Q4_K, 4096));
    T_CHECK(!cuda_mmq_supported(QT_Q4_K, 896));
    T_CHECK(cuda_mmq_supported(QT_Q8_0, 896));
    T_CHECK(!cuda_mmq_supported(QT_Q8_0, 800)); /* k/32 odd */
    T_CHECK(!cuda_mmq_supported(QT_F16, 4096));
    T_CHECK(!cuda_mmq_supported(QT_Q5_0, 4096));
    struct cuda_qweight qw;
    struct err e;
    memset(&qw, 0, sizeof qw);
    qw.type = QT_F16;
    qw.rows = 16;
    qw.k = 256;
    T_EQ_INT(cuda_mmq_pre(&qw, 16, NULL, NULL, 0, CUDA_MMQ_TILE_AUTO, NULL, &e),
             SMELT_ERR_UNSUPPORTED);
    T_CHECK(strstr(e.msg, "F16") != NULL);
    qw.type = QT_Q8_0;
    T_EQ_INT(cuda_mmq_pre(&qw, 0, NULL, NULL, 0, CUDA_MMQ_TILE_AUTO, NULL, &e), SMELT_ERR_INVALID);
    T_EQ_INT(cuda_mmq_pre(&qw, 16, NULL, NULL, 0, 99, NULL, &e), SMELT_ERR_INVALID);
}

/* ---- bench ---- */

struct timer {
    cudaEvent_t a, b;
};

static double elapsed_us(struct timer *tm, int reps) {
    float ms = 0;
    cudaEventSynchronize(tm->b);
    cudaEventElapsedTime(&ms, tm->a, tm->b);
    return ms * 1e3 / reps;
}

static void print_row(const char *what, const char *shape, uint32_t type, int n, double us,
                      double ops, double bytes, double best_us) {
    printf("bench %-5s %-20s n=%-3d %-16s %9.2f us %7.1f TOP/s %7.1f GB/s%s\n", qtype_name(type),
           shape, n, what, us, ops / us / 1e6, bytes / us / 1e3,
           us <= best_us * 1.0001 ? "  <- best" : "");
}

static void bench(void) {
    struct shape {
        const char *name;
        int64_t rows, k;
    } shapes[] = {
        {"4096x4096", 4096, 4096}, {"14336x4096", 14336, 4096}, {"4096x14336", 4096, 14336}};
    const uint32_t types[] = {QT_Q4_K, QT_Q6_K, QT_Q8_0};
    const int ns[] = {8, 16, 32, 64, 128, 256, 512};
    const int reps = 20;
    struct err e;
    const char *only = getenv("SMELT_BENCH_TYPE");
    cublasHandle_t cublas;
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) {
        printf("bench: cublasCreate failed\n");
        return;
    }
    struct timer tm;
    cudaEventCreate(&tm.a);
    cudaEventCreate(&tm.b);
    printf("bench: us per call (activation quantization included; GEMM path: x to F16, weight "
           "dequantized to F16 in "
           "64 MB tiles, cublasGemmEx). Ceilings: 4380 GB/s HBM read, ~1400 TOP/s int8 dense "
           "(H200)\n");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const uint32_t type = types[ti];
            if (only && strcmp(only, qtype_name(type)) != 0) continue;
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
            for (int c = 0; c < copies && ok; c++)
                ok = cuda_qweight_upload(&qw[c], type, host, rows, k, NULL, &e) == SMELT_OK;
            const int nmax = ns[sizeof ns / sizeof ns[0] - 1];
            float *dx = NULL, *dy = NULL;
            void *sq = NULL, *sv = NULL, *xh = NULL, *wh = NULL;
            int64_t tile_rows = (int64_t)(((size_t)64 << 20) / ((size_t)k * 2));
            if (tile_rows > rows) tile_rows = rows;
            ok = ok && cudaMalloc((void **)&dx, sizeof(float) * nmax * k) == cudaSuccess &&
                 cudaMalloc((void **)&dy, sizeof(float) * nmax * rows) == cudaSuccess &&
                 cudaMalloc(&sq, cuda_mmq_scratch_bytes(k, nmax)) == cudaSuccess &&
                 cudaMalloc(&sv, cuda_mmv_scratch_bytes(k, CUDA_MMV_MAX_N)) == cudaSuccess &&
                 cudaMalloc(&xh, (size_t)nmax * k * 2) == cudaSuccess &&
                 cudaMalloc(&wh, (size_t)tile_rows * k * 2) == cudaSuccess;
            if (!ok)
                printf("bench %s %s: setup failed (%s)\n", qtype_name(type), shapes[si].name,
                       e.msg);
            if (ok) { /* activations: Gaussian */
                float *hx = malloc(sizeof(float) * nmax * k);
                for (int64_t i = 0; i < (int64_t)nmax * k; i++)
                    hx[i] = t_randn(&g_seed);
                cudaMemcpy(dx, hx, sizeof(float) * nmax * k, cudaMemcpyHostToDevice);
                free(hx);
            }
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0] && ok; ni++) {
                const int n = ns[ni];
                const double ops = 2.0 * rows * k * n;
                double us_tile[16], us_auto = -1, us_mmv, us_gemm;
                const int n_tiles = cuda_mmq_tile_count();
                /* mmq, each tile then auto (tile -1 last) */
                for (int tile = 0; tile <= n_tiles; tile++) {
                    const int tl = tile == n_tiles ? CUDA_MMQ_TILE_AUTO : tile;
                    smelt_status st = SMELT_OK;
                    for (int c = 0; c < 2 && st == SMELT_OK; c++) {
                        st = cuda_mmq_quantize(dx, k, n, sq, NULL, &e);
                        if (st == SMELT_OK)
                            st = cuda_mmq_pre(&qw[c % copies], n, dy, sq, 0, tl, NULL, &e);
                    }
                    double us = -1;
                    if (st == SMELT_OK) {
                        cudaEventRecord(tm.a, 0);
                        for (int i = 0; i < reps; i++) {
                            cuda_mmq_quantize(dx, k, n, sq, NULL, &e);
                            cuda_mmq_pre(&qw[i % copies], n, dy, sq, 0, tl, NULL, &e);
                        }
                        cudaEventRecord(tm.b, 0);
                        us = elapsed_us(&tm, reps);
                    }
                    if (tile == n_tiles)
                        us_auto = us;
                    else
                        us_tile[tile] = us;
                }
                /* repeated mmv, as the backend's matmul does for n <= 32 */
                cudaEventRecord(tm.a, 0);
                for (int i = 0; i < reps; i++)
                    for (int t0 = 0; t0 < n; t0 += CUDA_MMV_MAX_N) {
                        const int nt = n - t0 < CUDA_MMV_MAX_N ? n - t0 : CUDA_MMV_MAX_N;
                        cuda_mmv_quantize(dx + (int64_t)t0 * k, k, nt, sv, NULL, &e);
                        cuda_mmv_pre(&qw[i % copies], dx + (int64_t)t0 * k, nt,
                                     dy + (int64_t)t0 * rows, sv, 0, NULL, &e);
                    }
                cudaEventRecord(tm.b, 0);
                us_mmv = elapsed_us(&tm, reps);
                /* dequantize + cuBLAS, as the backend's gemm() */
                const float alpha = 1.0f, beta = 0.0f;
                cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
                cudaEventRecord(tm.a, 0);
                for (int i = 0; i < reps && cs == CUBLAS_STATUS_SUCCESS; i++) {
                    const struct cuda_qweight *w = &qw[i % copies];
                    cuda_f32_to_f16(xh, dx, k * n, NULL);
                    for (int64_t r0 = 0; r0 < rows && cs == CUBLAS_STATUS_SUCCESS;
                         r0 += tile_rows) {
                        const int64_t nr = rows - r0 < tile_rows ? rows - r0 : tile_rows;
                        cuda_dequant_f16(wh, w, r0, nr, NULL);
                        cs = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, (int)k,
                                          &alpha, wh, CUDA_R_16F, (int)k, xh, CUDA_R_16F, (int)k,
                                          &beta, dy + r0, CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT);
                    }
                }
                cudaEventRecord(tm.b, 0);
                us_gemm = cs == CUBLAS_STATUS_SUCCESS ? elapsed_us(&tm, reps) : -1;
                cudaError_t ce = cudaDeviceSynchronize();
                if (ce != cudaSuccess) {
                    printf("bench %s %s n=%d: %s\n", qtype_name(type), shapes[si].name, n,
                           cudaGetErrorString(ce));
                    ok = 0;
                    break;
                }
                double best = us_auto > 0 ? us_auto : 1e30;
                for (int tile = 0; tile < n_tiles; tile++)
                    if (us_tile[tile] > 0 && us_tile[tile] < best) best = us_tile[tile];
                if (us_mmv < best) best = us_mmv;
                if (us_gemm > 0 && us_gemm < best) best = us_gemm;
                for (int tile = 0; tile < n_tiles; tile++) {
                    int bm, bn;
                    char what[32];
                    cuda_mmq_tile_shape(tile, &bm, &bn);
                    snprintf(what, sizeof what, "mmq %dx%d", bm, bn);
                    if (us_tile[tile] > 0)
                        print_row(what, shapes[si].name, type, n, us_tile[tile], ops, bytes, best);
                }
                {
                    int bm, bn;
                    char what[32];
                    cuda_mmq_tile_shape(cuda_mmq_tile_auto(&qw[0], n), &bm, &bn);
                    snprintf(what, sizeof what, "mmq auto %dx%d", bm, bn);
                    print_row(what, shapes[si].name, type, n, us_auto, ops, bytes, best);
                }
                print_row("mmv x8 repeated", shapes[si].name, type, n, us_mmv, ops, bytes, best);
                if (us_gemm > 0)
                    print_row("dequant+cuBLAS", shapes[si].name, type, n, us_gemm, ops, bytes,
                              best);
                printf("bench %-5s %-20s n=%-3d summary: mmq auto %.2f us, mmv %.2f us, cuBLAS "
                       "%.2f us\n",
                       qtype_name(type), shapes[si].name, n, us_auto, us_mmv, us_gemm);
            }
            for (int c = 0; c < copies && qw; c++)
                cuda_qweight_free(&qw[c]);
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
    cudaEventDestroy(tm.a);
    cudaEventDestroy(tm.b);
    cublasDestroy(cublas);
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
    T_RUN(test_mmq_rejects);
    T_RUN(test_mmq_q4_k);
    T_RUN(test_mmq_q6_k);
    T_RUN(test_mmq_q8_0);
    if (getenv("SMELT_BENCH")) bench();
    return t_done();
}
#endif
