/* CUDA small-batch tensor-core matmul (cuda_mmb) against its CPU twin, for every type it has
 * (Q4_K, Q6_K, Q8_0, Q5_K, Q4_0).
 *
 * Weights: Gaussian values quantized with the reference quantizer (rows of different
 * magnitude); references in double (qref16.h, shared with test_cuda_mmq): y_h, the f16
 * weights the kernel makes decoded from the GGUF bytes, against x rounded to f16: every
 * output within 2e-5 * sum|w x| + 1e-6 (test_cuda_mmq's bound); y, the library's
 * dequantized W against exact x: relative RMS < 2e-3.
 *
 * The f16 weights to the bit: one-hot activations read every weight of a 130x768 matrix
 * back through the kernel, compared with qref16.h's (cuda_mmq's values for Q6_K and Q8_0).
 * Q4_K at every token-row count 1..64 on ragged shapes (rows not a multiple of 64, one to 16
 * super-blocks per K split, a split count that does not divide the super-blocks), plus
 * the same with the K splits of a one-SM device (long K ranges per block); the other types
 * at n = 1, 2, 7, 8, 9, 16, 33, 64 on two of those shapes, both contexts; the
 * Llama-3-8B K/V and 4096x4096 shapes at a few counts (sampled rows), every type. Outputs
 * poisoned with NaN and followed by a guard band; accumulate mode; two runs the same bits.
 * Batch invariance: token row t's outputs at n rows are bitwise those at 64 rows (the
 * kernel's K split never depends on n, and no row's sums see another row's values).
 * SMELT_TEST_MMB_TYPES=Q6_K,Q8_0 (say) keeps the listed types; SMELT_TEST_SMALL=1 leaves out
 * the model shapes (the CPU emulator).
 *
 * SMELT_BENCH=1 adds, per type and shape (4096x4096, 14336x4096, 4096x14336, 1024x4096) and
 * n = 1, 2, 4, 8, 16, 32, 64: microseconds per product of mmb, of the mmv kernel (n <= 8:
 * one launch; above, 8-row chunks as the backend runs it) and of mmq (its automatic tile;
 * -1: no kernel for the type), each as replays of a CUDA graph of products whose weights
 * rotate through > 1 GiB of copies (from HBM, as in a decode step), with GB/s against
 * 4.38 TB/s of the device bytes ("bench mmb" lines). SMELT_BENCH_N=8 keeps one row count;
 * SMELT_BENCH_ONLY=1 runs the bench without the tests. */
#ifndef SMELT_HAVE_CUDA
#include <stdio.h>

int main(void) {
    printf("SKIP test_cuda_mmb: built without CUDA (nvcc not found at configure time)\n");
    return 77;
}
#else

#include "t.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_ctx.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmb.h"
#include "backend/cuda/cuda_mmq.h"
#include "backend/cuda/cuda_mmv.h"
#include "quant/quant.h"
#include "util/half.h"

#include "qref16.h"

static unsigned long long g_seed = 0x5eed;
static struct cuda_ctx g_ctx;

#define GUARD 1024
#define SENTINEL 12345.0f
#define NMAX CUDA_MMB_MAX_ROWS

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t rc_ = (call);                                                                  \
        if (rc_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(rc_));                           \
            T_CHECK(0);                                                                            \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static bool small_only(void) {
    const char *s = getenv("SMELT_TEST_SMALL");
    return s && !strcmp(s, "1");
}

/* Rows the CPU checks: all, or a stride plus both ends. */
static bool checked(int64_t r, int64_t rows, int64_t stride) {
    return r < 8 || r >= rows - 8 || r % stride == 0;
}

/* One weight against every n of ns (ascending, the last one NMAX): correctness per n,
 * accumulate at the largest, determinism and batch invariance against the NMAX run. */
static void check_weight(struct cuda_ctx *ctx, uint32_t type, int64_t rows, int64_t k, const int *ns, int n_ns) {
    const char *tn = qtype_name(type);
    float *w16 = malloc(sizeof(float) * (size_t)(rows * k)), *deq = malloc(sizeof(float) * (size_t)(rows * k));
    float *x = malloc(sizeof(float) * (size_t)(NMAX * k));
    float *y = malloc(sizeof(float) * (size_t)(NMAX * rows + GUARD));
    float *y64 = malloc(sizeof(float) * (size_t)(NMAX * rows));
    double *yq = malloc(sizeof(double) * (size_t)(NMAX * rows)), *yx = malloc(sizeof(double) * (size_t)(NMAX * rows));
    double *mag = malloc(sizeof(double) * (size_t)(NMAX * rows));
    if (!w16 || !deq || !x || !y || !y64 || !yq || !yx || !mag) abort();
    void *hw = make_weights(type, rows, k, w16, deq, &g_seed);
    struct cuda_qweight qw;
    struct err e;
    memset(&qw, 0, sizeof qw);
    float *dx = NULL, *dy = NULL;
    void *sc = NULL;
    uint64_t sbytes = 0;
    int64_t stride = (int64_t)((double)rows * k * NMAX / 2e7);
    if (stride < 1) stride = 1;
    T_EQ_INT(cuda_qweight_upload(ctx, &qw, type, hw, rows, k, &e), SMELT_OK);
    T_EQ_INT(cuda_mmb_scratch_bytes(ctx, rows, k, NMAX, &sbytes, &e), SMELT_OK);
    CK(cudaMalloc((void **)&dx, sizeof(float) * NMAX * k));
    CK(cudaMalloc((void **)&dy, sizeof(float) * (NMAX * rows + GUARD)));
    CK(cudaMalloc(&sc, sbytes));
    for (int64_t i = 0; i < NMAX * k; i++)
        x[i] = t_randn(&g_seed) * (1.0f + (float)(i % 5));
    x[5] = 1e6f; /* beyond f16: clamped to 65504 */
    for (int64_t r = 0; r < rows; r++) {
        if (!checked(r, rows, stride)) continue;
        for (int t = 0; t < NMAX; t++) {
            double a = 0, b = 0, m = 0;
            for (int64_t i = 0; i < k; i++) {
                const double p = (double)w16[r * k + i] * x16(x[t * k + i]);
                a += p;
                m += fabs(p);
                b += (double)deq[r * k + i] * (t == 0 && i == 5 ? 65504.0f : x[t * k + i]);
            }
            yq[t * rows + r] = a, yx[t * rows + r] = b, mag[t * rows + r] = m;
        }
    }
    CK(cudaMemcpy(dx, x, sizeof(float) * NMAX * k, cudaMemcpyHostToDevice));
    /* the NMAX run first: the others are compared with it bit for bit */
    for (int pass = 0; pass < 2; pass++)
        for (int ni = pass ? 0 : n_ns - 1; ni < (pass ? n_ns : n_ns); ni++) {
            const int n = ns[ni];
            for (int64_t i = 0; i < n * rows; i++) y[i] = NAN;
            for (int i = 0; i < GUARD; i++) y[n * rows + i] = SENTINEL;
            CK(cudaMemcpy(dy, y, sizeof(float) * (n * rows + GUARD), cudaMemcpyHostToDevice));
            smelt_status st = cuda_mmb(ctx, &qw, dx, n, dy, sc, sbytes, 0, &e);
            T_CHECKF(st == SMELT_OK, "%s", e.msg);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y, dy, sizeof(float) * (n * rows + GUARD), cudaMemcpyDeviceToHost));
            int bad = 0, nan = 0, guard = 0, diff = 0;
            double worst = 0, err2 = 0, ref2 = 0;
            for (int t = 0; t < n; t++)
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t i = t * rows + r;
                    if (!isfinite(y[i])) {
                        nan++;
                        continue;
                    }
                    if (pass) diff += memcmp(&y[i], &y64[i], sizeof(float)) != 0;
                    if (!checked(r, rows, stride)) continue;
                    const double dev = fabs(y[i] - yq[i]);
                    if (dev / (mag[i] + 1e-30) > worst) worst = dev / (mag[i] + 1e-30);
                    if (!(dev <= 2e-5 * mag[i] + 1e-6) && bad++ < 3)
                        fprintf(stderr, "  mmb %s %lldx%lld n=%d: y[%d][%lld] = %.7g, ref %.7g (mag %.3g)\n", tn,
                                (long long)rows, (long long)k, n, t, (long long)r, y[i], yq[i], mag[i]);
                    err2 += (y[i] - yx[i]) * (y[i] - yx[i]);
                    ref2 += yx[i] * yx[i];
                }
            for (int i = 0; i < GUARD; i++) guard += y[n * rows + i] != SENTINEL;
            const double rel = ref2 > 0 ? sqrt(err2 / ref2) : 0;
            if (pass == 0 || ni == 0 || ni == n_ns - 1 || bad || nan || guard || diff)
                printf("mmb %-4s %5lldx%-5lld n=%-2d splits %2d: %s  max |err|/mag %.1e  rel RMS vs exact %.2e%s\n",
                       tn, (long long)rows, (long long)k, n, cuda_mmb_splits(ctx, rows, k),
                       bad || nan || guard || diff ? "MISMATCH" : "ok", worst, rel,
                       pass ? "  (bitwise = its rows at 64)" : "");
            T_CHECKF(bad == 0, "n=%d: %d outputs off", n, bad);
            T_CHECKF(nan == 0, "n=%d: %d outputs not written (NaN)", n, nan);
            T_CHECKF(guard == 0, "n=%d: %d floats written past the end of y", n, guard);
            T_CHECKF(rel < 2e-3, "n=%d: relative RMS %.3g", n, rel);
            T_CHECKF(diff == 0, "n=%d: %d outputs differ from the same token rows at n=%d (batch invariance)", n,
                     diff, NMAX);
            if (pass == 0) memcpy(y64, y, sizeof(float) * (size_t)(NMAX * rows));
            if (pass == 0) { /* again: the same bits; then accumulate onto y0 */
                T_EQ_INT(cuda_mmb(ctx, &qw, dx, n, dy, sc, sbytes, 0, &e), SMELT_OK);
                CK(cudaMemcpy(y, dy, sizeof(float) * n * rows, cudaMemcpyDeviceToHost));
                T_CHECK(memcmp(y, y64, sizeof(float) * (size_t)(n * rows)) == 0);
                for (int64_t i = 0; i < n * rows; i++) y[i] = (float)(i % 13) - 6.0f;
                CK(cudaMemcpy(dy, y, sizeof(float) * n * rows, cudaMemcpyHostToDevice));
                T_EQ_INT(cuda_mmb(ctx, &qw, dx, n, dy, sc, sbytes, 1, &e), SMELT_OK);
                CK(cudaMemcpy(y, dy, sizeof(float) * n * rows, cudaMemcpyDeviceToHost));
                int acc_bad = 0;
                for (int64_t i = 0; i < n * rows; i++)
                    if (checked(i % rows, rows, stride))
                        acc_bad += !(fabs(y[i] - ((double)(i % 13) - 6.0) - yq[i]) <= 2e-5 * mag[i] + 1e-5);
                T_CHECKF(acc_bad == 0, "accumulate: %d outputs off", acc_bad);
            }
        }
out:
    cuda_qweight_free(&qw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(sc);
    free(hw);
    free(w16);
    free(deq);
    free(x);
    free(y);
    free(y64);
    free(yq);
    free(yx);
    free(mag);
}

/* The types of the kernel; SMELT_TEST_MMB_TYPES (e.g. "Q6_K,Q8_0") keeps the listed ones
 * (the emulator runs one or two at a time). */
static const uint32_t all_types[] = {QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_Q5_K, QT_Q4_0};
#define N_TYPES ((int)(sizeof all_types / sizeof all_types[0]))

static bool type_on(uint32_t type) {
    const char *s = getenv("SMELT_TEST_MMB_TYPES");
    if (!s || !*s) return true;
    const char *name = qtype_name(type);
    const size_t len = strlen(name);
    for (const char *p = s; (p = strstr(p, name)) != NULL; p += len)
        if ((p == s || p[-1] == ',') && (p[len] == ',' || p[len] == 0)) return true;
    return false;
}

static void test_mmb_all_rows(void) {
    if (!type_on(QT_Q4_K)) {
        printf("skipped: Q4_K at every n (SMELT_TEST_MMB_TYPES)\n");
        return;
    }
    int ns[NMAX];
    for (int i = 0; i < NMAX; i++) ns[i] = i + 1;
    /* the device's K splits (on a big GPU: one or two super-blocks a block), then those of a
     * one-SM device (long K ranges through the double-buffered pipeline, uneven splits) */
    struct cuda_ctx one = g_ctx;
    one.n_sm = 1;
    for (int pass = 0; pass < 2; pass++) {
        struct cuda_ctx *c = pass ? &one : &g_ctx;
        check_weight(c, QT_Q4_K, 67, 768, ns, NMAX);   /* ragged rows; 3 super-blocks */
        check_weight(c, QT_Q4_K, 301, 2560, ns, NMAX); /* 5 row tiles, the last ragged; 10 super-blocks */
        check_weight(c, QT_Q4_K, 130, 4352, ns, NMAX); /* 17 super-blocks */
    }
}

/* Every type on ragged shapes with several row tiles and K splits (the device's and a
 * one-SM context's), at token-row counts around the kernel's 8-row tiles. */
static void test_mmb_types(void) {
    const int ns[] = {1, 2, 7, 8, 9, 16, 33, 64};
    const int n_ns = (int)(sizeof ns / sizeof ns[0]);
    struct cuda_ctx one = g_ctx;
    one.n_sm = 1;
    for (int ti = 1; ti < N_TYPES; ti++) {
        const uint32_t type = all_types[ti];
        if (!type_on(type)) continue;
        for (int pass = 0; pass < 2; pass++) {
            struct cuda_ctx *c = pass ? &one : &g_ctx;
            check_weight(c, type, 301, 2560, ns, n_ns); /* 5 row tiles, the last ragged; 10 super-blocks */
            check_weight(c, type, 130, 4352, ns, n_ns); /* 17 super-blocks */
        }
    }
}

/* cuda_mmb_multi: three matrices of one type (5, 1 and 3 row tiles, ragged) and a pair in one
 * launch on one x, each against the CPU's product of its f16 weights, every n bitwise equal
 * to its rows at NMAX (the set's K split is the same at every n), and the rows around each
 * matrix's end not written past (sentinels). */
static void test_mmb_multi(void) {
    const int ns[] = {2, 8, 9, 33, NMAX};
    const int n_ns = (int)(sizeof ns / sizeof ns[0]);
    const int64_t k = 1024, rows[3] = {301, 64, 130};
    const uint32_t types[2] = {QT_Q4_K, QT_Q6_K};
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = types[ti];
        if (!type_on(type)) continue;
        for (int count = 3; count >= 2; count--) {
            struct cuda_qweight qw[3];
            const struct cuda_qweight *qp[3] = {&qw[0], &qw[1], &qw[2]};
            float *w16[3] = {NULL}, *deq[3] = {NULL}, *dy[3] = {NULL}, *y64[3] = {NULL}, *hy = NULL, *x = NULL,
                  *dx = NULL;
            void *hw[3] = {NULL}, *sc = NULL;
            struct err e;
            memset(qw, 0, sizeof qw);
            x = malloc(sizeof(float) * (size_t)(NMAX * k));
            hy = malloc(sizeof(float) * (size_t)(NMAX * 301 + GUARD));
            if (!x || !hy) abort();
            for (int i = 0; i < count; i++) {
                w16[i] = malloc(sizeof(float) * (size_t)(rows[i] * k));
                deq[i] = malloc(sizeof(float) * (size_t)(rows[i] * k));
                y64[i] = malloc(sizeof(float) * (size_t)(NMAX * rows[i]));
                if (!w16[i] || !deq[i] || !y64[i]) abort();
                hw[i] = make_weights(type, rows[i], k, w16[i], deq[i], &g_seed);
                T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw[i], type, hw[i], rows[i], k, &e), SMELT_OK);
                CK(cudaMalloc((void **)&dy[i], sizeof(float) * (size_t)(NMAX * rows[i] + GUARD)));
            }
            for (int64_t i = 0; i < NMAX * k; i++)
                x[i] = t_randn(&g_seed);
            uint64_t sbytes = 0;
            T_EQ_INT(cuda_mmb_multi_scratch_bytes(&g_ctx, qp, count, NMAX, &sbytes, &e), SMELT_OK);
            CK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(NMAX * k)));
            CK(cudaMalloc(&sc, sbytes));
            CK(cudaMemcpy(dx, x, sizeof(float) * (size_t)(NMAX * k), cudaMemcpyHostToDevice));
            for (int ni = n_ns - 1; ni >= 0; ni--) { /* NMAX first: the others are compared with it */
                const int n = ns[ni];
                for (int i = 0; i < count; i++) {
                    for (int64_t j = 0; j < n * rows[i] + GUARD; j++) hy[j] = j < n * rows[i] ? NAN : SENTINEL;
                    CK(cudaMemcpy(dy[i], hy, sizeof(float) * (size_t)(n * rows[i] + GUARD), cudaMemcpyHostToDevice));
                }
                T_CHECKF(cuda_mmb_multi(&g_ctx, qp, count, dx, n, dy, sc, sbytes, 0, &e) == SMELT_OK, "%s", e.msg);
                CK(cudaDeviceSynchronize());
                int bad = 0, diff = 0, guard = 0;
                for (int i = 0; i < count; i++) {
                    CK(cudaMemcpy(hy, dy[i], sizeof(float) * (size_t)(n * rows[i] + GUARD), cudaMemcpyDeviceToHost));
                    for (int t = 0; t < n; t++)
                        for (int64_t r = 0; r < rows[i]; r++) {
                            const float v = hy[t * rows[i] + r];
                            double a = 0, m = 0;
                            for (int64_t j = 0; j < k; j++) {
                                const double p = (double)w16[i][r * k + j] * x16(x[t * k + j]);
                                a += p;
                                m += fabs(p);
                            }
                            if (!(fabs(v - a) <= 2e-5 * m + 1e-6) && bad++ < 3)
                                fprintf(stderr, "  multi %s x%d n=%d: y%d[%d][%lld] = %.7g, ref %.7g\n",
                                        qtype_name(type), count, n, i, t, (long long)r, v, a);
                            if (n == NMAX) y64[i][t * rows[i] + r] = v;
                            else diff += memcmp(&v, &y64[i][t * rows[i] + r], sizeof v) != 0;
                        }
                    for (int j = 0; j < GUARD; j++) guard += hy[n * rows[i] + j] != SENTINEL;
                }
                printf("mmb multi %-4s x%d (301, 64, 130)x%lld n=%-2d: %s\n", qtype_name(type), count, (long long)k,
                       n, bad || diff || guard ? "MISMATCH" : "ok (bitwise = its rows at 64)");
                T_CHECKF(bad == 0, "multi n=%d: %d outputs off", n, bad);
                T_CHECKF(diff == 0, "multi n=%d: %d outputs differ from the same rows at n=%d", n, diff, NMAX);
                T_CHECKF(guard == 0, "multi n=%d: %d floats written past a matrix's y", n, guard);
            }
        out:
            for (int i = 0; i < count; i++) {
                cuda_qweight_free(&qw[i]);
                cudaFree(dy[i]);
                free(hw[i]);
                free(w16[i]);
                free(deq[i]);
                free(y64[i]);
            }
            cudaFree(dx);
            cudaFree(sc);
            free(x);
            free(hy);
        }
    }
}

static double glu_ref(int act, double g, double u) {
    if (act == 3) {
        const double gc = g > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : g;
        const double uc = u > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : u < -GLU_OAI_LIMIT ? -GLU_OAI_LIMIT : u;
        return gc / (1.0 + exp(-GLU_OAI_ALPHA * gc)) * (uc + 1.0);
    }
    const double a = act == 0   ? g / (1.0 + exp(-g))
                     : act == 1 ? 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
                                : 1.0 / (1.0 + exp(-g));
    return a * u;
}

/* cuda_mmb_glu: gate and up of 128 rows (whole 64-row tiles: the two-matrix launch's split,
 * so dst must be the bits of cuda_mmb_multi + cuda_glu) and of 130 (a ragged last tile: its
 * own split), each activation, against act(g) * u of the multi launch's g and u in double;
 * every n bitwise equal to its rows at 64; nothing written past dst. */
static void test_mmb_glu(void) {
    const int ns[] = {2, 8, 9, 33, NMAX};
    const int n_ns = (int)(sizeof ns / sizeof ns[0]);
    const int64_t k = 1024, rows_of[2] = {128, 130};
    const uint32_t types[2] = {QT_Q4_K, QT_Q6_K};
    for (int ti = 0; ti < 2; ti++) {
        const uint32_t type = types[ti];
        if (!type_on(type)) continue;
        for (int ri = 0; ri < 2; ri++) {
            const int64_t rows = rows_of[ri];
            struct cuda_qweight qw[2];
            const struct cuda_qweight *qp[2] = {&qw[0], &qw[1]};
            float *w16[2], *deq[2], *dgu[2] = {NULL, NULL}, *dy = NULL, *dref = NULL, *dx = NULL;
            void *hw[2], *sc = NULL;
            struct err e;
            memset(qw, 0, sizeof qw);
            float *x = malloc(sizeof(float) * (size_t)(NMAX * k)), *hy = malloc(sizeof(float) * (size_t)(NMAX * rows + GUARD));
            float *hg = malloc(sizeof(float) * (size_t)(NMAX * rows)), *hu = malloc(sizeof(float) * (size_t)(NMAX * rows));
            float *href = malloc(sizeof(float) * (size_t)(NMAX * rows)), *y64 = malloc(sizeof(float) * (size_t)(NMAX * rows));
            if (!x || !hy || !hg || !hu || !href || !y64) abort();
            for (int i = 0; i < 2; i++) {
                w16[i] = malloc(sizeof(float) * (size_t)(rows * k));
                deq[i] = malloc(sizeof(float) * (size_t)(rows * k));
                if (!w16[i] || !deq[i]) abort();
                hw[i] = make_weights(type, rows, k, w16[i], deq[i], &g_seed);
                T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw[i], type, hw[i], rows, k, &e), SMELT_OK);
                CK(cudaMalloc((void **)&dgu[i], sizeof(float) * (size_t)(NMAX * rows)));
            }
            for (int64_t i = 0; i < NMAX * k; i++)
                x[i] = 2.0f * t_randn(&g_seed); /* gate values over the activations' curved range */
            uint64_t sbytes = 0, mbytes = 0;
            T_EQ_INT(cuda_mmb_glu_scratch_bytes(&g_ctx, qp[0], qp[1], NMAX, &sbytes, &e), SMELT_OK);
            T_EQ_INT(cuda_mmb_multi_scratch_bytes(&g_ctx, qp, 2, NMAX, &mbytes, &e), SMELT_OK);
            if (mbytes > sbytes) sbytes = mbytes;
            CK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(NMAX * k)));
            CK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(NMAX * rows + GUARD)));
            CK(cudaMalloc((void **)&dref, sizeof(float) * (size_t)(NMAX * rows)));
            CK(cudaMalloc(&sc, sbytes));
            CK(cudaMemcpy(dx, x, sizeof(float) * (size_t)(NMAX * k), cudaMemcpyHostToDevice));
            for (int ni = n_ns - 1; ni >= 0; ni--) { /* NMAX first: the others are compared with it */
                const int n = ns[ni];
                for (int act = 0; act < 4; act++) {
                    const int64_t cnt = n * rows;
                    for (int64_t j = 0; j < cnt + GUARD; j++) hy[j] = j < cnt ? NAN : SENTINEL;
                    CK(cudaMemcpy(dy, hy, sizeof(float) * (size_t)(cnt + GUARD), cudaMemcpyHostToDevice));
                    T_CHECKF(cuda_mmb_glu(&g_ctx, qp[0], qp[1], act, dx, n, dy, sc, sbytes, &e) == SMELT_OK, "%s", e.msg);
                    T_CHECKF(cuda_mmb_multi(&g_ctx, qp, 2, dx, n, dgu, sc, sbytes, 0, &e) == SMELT_OK, "%s", e.msg);
                    cuda_glu(&g_ctx, dref, dgu[0], dgu[1], act, cnt);
                    CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(hy, dy, sizeof(float) * (size_t)(cnt + GUARD), cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(hg, dgu[0], sizeof(float) * (size_t)cnt, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(hu, dgu[1], sizeof(float) * (size_t)cnt, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(href, dref, sizeof(float) * (size_t)cnt, cudaMemcpyDeviceToHost));
                    double scale = 0;
                    for (int64_t j = 0; j < cnt; j++) scale += fabs(glu_ref(act, hg[j], hu[j]));
                    scale /= (double)cnt;
                    int bad = 0, bits = 0, diff = 0, guard = 0;
                    for (int64_t j = 0; j < cnt; j++) {
                        const double ref = glu_ref(act, hg[j], hu[j]);
                        /* whole tiles: the multi launch's sums, so float math differs from the
                         * double reference only; a ragged tile's own split moves g and u by
                         * the products' rounding (test_mmb_multi's bound) */
                        const double tol = rows % 64 ? 2e-3 * (fabs(ref) + scale) : 1e-5 * (fabs(ref) + scale);
                        if (!(fabs(hy[j] - ref) <= tol) && bad++ < 3)
                            fprintf(stderr, "  glu %s %lld rows act %d n=%d: [%lld] = %.7g, ref %.7g (g %.5g, u %.5g)\n",
                                    qtype_name(type), (long long)rows, act, n, (long long)j, hy[j], ref, hg[j], hu[j]);
                        if (rows % 64 == 0) bits += memcmp(&hy[j], &href[j], sizeof(float)) != 0;
                        if (act == 1) {
                            if (n == NMAX) y64[j] = hy[j];
                            else diff += memcmp(&hy[j], &y64[j], sizeof(float)) != 0;
                        }
                    }
                    for (int j = 0; j < GUARD; j++) guard += hy[cnt + j] != SENTINEL;
                    if (act == 1 || bad || bits || diff || guard)
                        printf("mmb glu %-4s 2x%lldx%lld act %d n=%-2d: %s\n", qtype_name(type), (long long)rows,
                               (long long)k, act, n, bad || bits || diff || guard ? "MISMATCH" : "ok");
                    T_CHECKF(bad == 0, "glu act %d n=%d: %d outputs off", act, n, bad);
                    T_CHECKF(bits == 0, "glu act %d n=%d: %d outputs not the bits of multi + glu", act, n, bits);
                    T_CHECKF(diff == 0, "glu n=%d: %d outputs differ from the same rows at n=%d", n, diff, NMAX);
                    T_CHECKF(guard == 0, "glu act %d n=%d: %d floats written past dst", act, n, guard);
                }
            }
        out:
            for (int i = 0; i < 2; i++) {
                cuda_qweight_free(&qw[i]);
                cudaFree(dgu[i]);
                free(hw[i]);
                free(w16[i]);
                free(deq[i]);
            }
            cudaFree(dx);
            cudaFree(dy);
            cudaFree(dref);
            cudaFree(sc);
            free(x);
            free(hy);
            free(hg);
            free(hu);
            free(href);
            free(y64);
        }
    }
}

/* The f16 weights themselves, to the bit (up to the sign of a zero): token row t of a call is the one-hot vector of K
 * position k0 + t, so y[t][r] = w16[r][k0 + t] exactly (one product by 1, the rest adds
 * zeros), against qref16.h's weights (cuda_mmq's values for Q6_K and Q8_0). Every K
 * position of every row, 64 at a call. */
static void test_mmb_weights_exact(void) {
    const int64_t rows = 130, k = 768;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = all_types[ti];
        if (!type_on(type)) continue;
        float *w16 = malloc(sizeof(float) * (size_t)(rows * k)), *deq = malloc(sizeof(float) * (size_t)(rows * k));
        float *x = calloc((size_t)(NMAX * k), sizeof(float)), *y = malloc(sizeof(float) * (size_t)(NMAX * rows));
        if (!w16 || !deq || !x || !y) abort();
        void *hw = make_weights(type, rows, k, w16, deq, &g_seed);
        struct cuda_qweight qw;
        struct err e;
        memset(&qw, 0, sizeof qw);
        float *dx = NULL, *dy = NULL;
        void *sc = NULL;
        uint64_t sbytes = 0;
        int bad = 0;
        T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw, type, hw, rows, k, &e), SMELT_OK);
        T_EQ_INT(cuda_mmb_scratch_bytes(&g_ctx, rows, k, NMAX, &sbytes, &e), SMELT_OK);
        CK(cudaMalloc((void **)&dx, sizeof(float) * NMAX * k));
        CK(cudaMalloc((void **)&dy, sizeof(float) * NMAX * rows));
        CK(cudaMalloc(&sc, sbytes));
        for (int64_t k0 = 0; k0 < k; k0 += NMAX) {
            memset(x, 0, sizeof(float) * (size_t)(NMAX * k));
            for (int t = 0; t < NMAX; t++) x[t * k + k0 + t] = 1.0f;
            CK(cudaMemcpy(dx, x, sizeof(float) * NMAX * k, cudaMemcpyHostToDevice));
            T_EQ_INT(cuda_mmb(&g_ctx, &qw, dx, NMAX, dy, sc, sbytes, 0, &e), SMELT_OK);
            CK(cudaMemcpy(y, dy, sizeof(float) * NMAX * rows, cudaMemcpyDeviceToHost));
            for (int t = 0; t < NMAX; t++)
                for (int64_t r = 0; r < rows; r++)
                    if (!(y[t * rows + r] == w16[r * k + k0 + t]) && bad++ < 3) /* +0 for -0 allowed */
                        fprintf(stderr, "  mmb %s weight [%lld][%lld] = %.9g, reference f16 %.9g\n", qtype_name(type),
                                (long long)r, (long long)(k0 + t), y[t * rows + r], w16[r * k + k0 + t]);
        }
        printf("mmb %-4s %lldx%lld: every f16 weight %s\n", qtype_name(type), (long long)rows, (long long)k,
               bad ? "MISMATCH" : "bitwise = the reference's");
        T_CHECKF(bad == 0, "%s: %d weights differ from the reference f16", qtype_name(type), bad);
    out:
        cuda_qweight_free(&qw);
        cudaFree(dx);
        cudaFree(dy);
        cudaFree(sc);
        free(hw);
        free(w16);
        free(deq);
        free(x);
        free(y);
    }
}

static void test_mmb_model_shapes(void) {
    if (small_only()) {
        printf("skipped: 1024x4096 and 4096x4096 (SMELT_TEST_SMALL=1)\n");
        return;
    }
    const int ns[] = {1, 2, 3, 8, 9, 17, 33, 64};
    for (int ti = 0; ti < N_TYPES; ti++) {
        if (!type_on(all_types[ti])) continue;
        check_weight(&g_ctx, all_types[ti], 1024, 4096, ns, 8);
        check_weight(&g_ctx, all_types[ti], 4096, 4096, ns, 8);
    }
}

static void test_mmb_rejects(void) {
    struct cuda_qweight qw;
    struct err e;
    uint64_t bytes = 0;
    memset(&qw, 0, sizeof qw);
    for (int ti = 0; ti < N_TYPES; ti++) {
        T_CHECK(cuda_mmb_supported(all_types[ti], 4096));
        T_CHECK(cuda_mmb_supported(all_types[ti], 14336));
        T_CHECK(!cuda_mmb_supported(all_types[ti], 896)); /* k % 256 != 0 (Qwen2.5-0.5B) */
    }
    T_CHECK(!cuda_mmb_supported(QT_Q8_0, 96));
    T_CHECK(!cuda_mmb_supported(QT_Q2_K, 4096));
    T_CHECK(!cuda_mmb_supported(QT_F16, 4096));
    qw.type = QT_Q3_K;
    qw.rows = 16;
    qw.k = 256;
    T_EQ_INT(cuda_mmb(&g_ctx, &qw, NULL, 4, NULL, NULL, 0, 0, &e), SMELT_ERR_UNSUPPORTED);
    T_CHECK(strstr(e.msg, "Q3_K") != NULL);
    qw.type = QT_Q4_K;
    T_EQ_INT(cuda_mmb(&g_ctx, &qw, NULL, 65, NULL, NULL, 0, 0, &e), SMELT_ERR_INVALID);
    T_EQ_INT(cuda_mmb_scratch_bytes(&g_ctx, 16, 256, 65, &bytes, &e), SMELT_ERR_INVALID);
    /* up to 8 rows without a K split: no scratch (the blocks convert x themselves) */
    T_EQ_INT(cuda_mmb_scratch_bytes(&g_ctx, 16, 256, 8, &bytes, &e), SMELT_OK);
    T_EQ_INT((int)bytes, 0);
    T_EQ_INT(cuda_mmb_scratch_bytes(&g_ctx, 16, 256, 16, &bytes, &e), SMELT_OK);
    T_CHECK(bytes >= 16 * 256 * 2);
    /* scratch too small: refused before any launch */
    T_EQ_INT(cuda_mmb(&g_ctx, &qw, (const float *)(uintptr_t)256, 16, (float *)(uintptr_t)256, (void *)(uintptr_t)256,
                      bytes - 1, 0, &e),
             SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "scratch") != NULL);
    /* the split never depends on n */
    T_CHECK(cuda_mmb_splits(&g_ctx, 4096, 4096) >= 1);
}

/* ---- bench ---- */

enum bop { B_MMB, B_MMV, B_MMQ };

struct bctx {
    struct cuda_qweight *qw;
    int copies, n;
    int64_t rows, k;
    float *dx, *dy;
    void *sc;
    uint64_t sc_bytes;
    struct cuda_ctx lc;
};

static void benq(struct bctx *c, enum bop op, int i) {
    struct err e;
    const struct cuda_qweight *w = &c->qw[i % c->copies];
    if (op == B_MMB) cuda_mmb(&c->lc, w, c->dx, c->n, c->dy, c->sc, c->sc_bytes, 0, &e);
    else if (op == B_MMQ) {
        if (cuda_mmq_quantize(&c->lc, c->dx, c->k, c->n, c->sc, &e) == SMELT_OK)
            cuda_mmq_pre(&c->lc, w, c->n, c->dy, c->sc, c->sc_bytes, 0, CUDA_MMQ_TILE_AUTO, &e);
    } else
        for (int t0 = 0; t0 < c->n; t0 += CUDA_MMV_MAX_N) {
            const int nt = c->n - t0 < CUDA_MMV_MAX_N ? c->n - t0 : CUDA_MMV_MAX_N;
            cuda_mmv_quantize(&c->lc, c->dx + t0 * c->k, c->k, nt, c->sc, &e);
            cuda_mmv_pre(&c->lc, w, c->dx + t0 * c->k, nt, c->dy + t0 * c->rows, c->sc, 0, &e);
        }
}

/* Microseconds per product: a graph of reps products replayed 3 times; -1 on failure. */
static double btime(struct bctx *c, enum bop op, int reps) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    cudaEvent_t a, b;
    float ms = -1;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    benq(c, op, 0);
    if (cudaStreamSynchronize(c->lc.stream) == cudaSuccess &&
        cudaStreamBeginCapture(c->lc.stream, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
        for (int i = 0; i < reps; i++) benq(c, op, i);
        if (cudaStreamEndCapture(c->lc.stream, &g) != cudaSuccess || cudaGraphInstantiate(&ex, g, 0) != cudaSuccess)
            ex = NULL;
    }
    if (ex) {
        cudaGraphLaunch(ex, c->lc.stream);
        cudaEventRecord(a, c->lc.stream);
        for (int it = 0; it < 3; it++) cudaGraphLaunch(ex, c->lc.stream);
        cudaEventRecord(b, c->lc.stream);
        if (cudaEventSynchronize(b) == cudaSuccess) cudaEventElapsedTime(&ms, a, b);
    }
    if (ex) cudaGraphExecDestroy(ex);
    if (g) cudaGraphDestroy(g);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (cudaGetLastError() != cudaSuccess || ms < 0) return -1;
    return ms * 1e3 / (3.0 * reps);
}

static void bench_type(uint32_t type) {
    const struct {
        const char *name;
        int64_t rows, k;
    } shapes[] = {{"4096x4096", 4096, 4096}, {"14336x4096", 14336, 4096}, {"4096x14336", 4096, 14336},
                  {"1024x4096", 1024, 4096}};
    const int ns[] = {1, 2, 4, 8, 16, 32, 64};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        struct bctx c;
        struct err e;
        memset(&c, 0, sizeof c);
        c.rows = shapes[si].rows;
        c.k = shapes[si].k;
        const uint64_t bytes = qtype_row_size(type, c.k) * (uint64_t)c.rows; /* GGUF bytes: copies */
        c.copies = (int)(((uint64_t)1 << 30) / bytes) + 1;
        c.qw = calloc((size_t)c.copies, sizeof *c.qw);
        float *w16 = malloc(sizeof(float) * (size_t)(c.rows * c.k)), *deq = malloc(sizeof(float) * (size_t)(c.rows * c.k));
        float *hx = malloc(sizeof(float) * (size_t)(NMAX * c.k));
        if (!c.qw || !w16 || !deq || !hx) abort();
        void *hw = make_weights(type, c.rows, c.k, w16, deq, &g_seed);
        int ok = 1;
        for (int i = 0; i < c.copies && ok; i++) ok = cuda_qweight_upload(&g_ctx, &c.qw[i], type, hw, c.rows, c.k, &e) == SMELT_OK;
        for (int64_t i = 0; i < NMAX * c.k; i++) hx[i] = t_randn(&g_seed);
        uint64_t sb = 0, t = 0;
        cuda_mmb_scratch_bytes(&g_ctx, c.rows, c.k, NMAX, &sb, &e);
        cuda_mmq_scratch_bytes(&g_ctx, c.rows, c.k, NMAX, &t, &e);
        if (t > sb) sb = t;
        if (cuda_mmv_scratch_bytes(c.k, CUDA_MMV_MAX_N) > sb) sb = cuda_mmv_scratch_bytes(c.k, CUDA_MMV_MAX_N);
        c.sc_bytes = sb;
        c.lc = g_ctx;
        ok = ok && cudaStreamCreate(&c.lc.stream) == cudaSuccess && cudaMalloc((void **)&c.dx, sizeof(float) * NMAX * c.k) == cudaSuccess &&
             cudaMalloc((void **)&c.dy, sizeof(float) * NMAX * c.rows) == cudaSuccess && cudaMalloc(&c.sc, sb) == cudaSuccess &&
             cudaMemcpy(c.dx, hx, sizeof(float) * NMAX * c.k, cudaMemcpyHostToDevice) == cudaSuccess;
        if (!ok) printf("bench mmb %s: setup failed (%s)\n", shapes[si].name, e.msg);
        const char *only_n = getenv("SMELT_BENCH_N");
        for (size_t ni = 0; ok && ni < sizeof ns / sizeof ns[0]; ni++) {
            c.n = ns[ni];
            if (only_n && *only_n && atoi(only_n) != c.n) continue;
            const int reps = 2 * c.copies < 32 ? 32 : 2 * c.copies;
            const double us[3] = {btime(&c, B_MMB, reps), btime(&c, B_MMV, reps), btime(&c, B_MMQ, reps)};
            const double hbm = (double)c.qw[0].bytes / 4.38e6; /* us at 4.38 TB/s, device bytes */
            printf("bench mmb %-4s %-10s n=%-2d  mmb %7.2f us (%3.0f%% of HBM)  mmv %7.2f us  mmq %7.2f us  -> %s\n",
                   qtype_name(type), shapes[si].name, c.n, us[0], us[0] > 0 ? 100 * hbm / us[0] : 0, us[1], us[2],
                   us[0] > 0 && (us[1] <= 0 || us[0] < us[1]) && (us[2] <= 0 || us[0] < us[2]) ? "mmb"
                   : us[1] > 0 && (us[2] <= 0 || us[1] < us[2])                                 ? "mmv"
                                                                                                 : "mmq");
        }
        for (int i = 0; i < c.copies; i++) cuda_qweight_free(&c.qw[i]);
        cudaFree(c.dx);
        cudaFree(c.dy);
        cudaFree(c.sc);
        if (c.lc.stream) cudaStreamDestroy(c.lc.stream);
        free(c.qw);
        free(w16);
        free(deq);
        free(hx);
        free(hw);
    }
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP test_cuda_mmb: no CUDA device on this machine\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major < 8) {
        printf("SKIP test_cuda_mmb: device %s is sm_%d%d; mmb needs sm_80 or newer\n", prop.name, prop.major,
               prop.minor);
        return 77;
    }
    struct err e;
    if (cuda_ctx_init(&g_ctx, 0, NULL, &e) != SMELT_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const char *bo = getenv("SMELT_BENCH_ONLY");
    if (!bo || !*bo) {
        T_RUN(test_mmb_rejects);
        T_RUN(test_mmb_weights_exact);
        T_RUN(test_mmb_all_rows);
        T_RUN(test_mmb_types);
        T_RUN(test_mmb_model_shapes);
        T_RUN(test_mmb_multi);
        T_RUN(test_mmb_glu);
    }
    if (getenv("SMELT_BENCH") || (bo && *bo))
        for (int ti = 0; ti < N_TYPES; ti++)
            if (type_on(all_types[ti])) bench_type(all_types[ti]);
    cuda_ctx_free(&g_ctx);
    return t_done();
}
#endif
