/* CUDA matrix x small-batch product against its CPU twin.
 *
 * Weights: Gaussian values quantized with the reference quantizer (src/quant), so block
 * scales are realistic. Two references, both in double precision:
 *   - y_q: the reference dequantized W against x quantized exactly as the GPU does
 *     (int8 per 16 values, round-to-nearest-even): the GPU must match it to float
 *     rounding (tolerance 2e-5 of sum|w||x|), which proves the integer math and layout;
 *   - y:   the same W against the exact x: the difference is the activation quantization
 *     error, reported and bounded (relative RMS < 1.5% for 8-bit activations).
 * F16 weights use f32 activations: tolerance 1e-5 of sum|w||x|.
 *
 * SMELT_BENCH=1 adds a bandwidth run on Llama-3-8B decode shapes (weights rotated through
 * more than 4x the L2 so every read comes from HBM; 200 products replayed as one graph, the
 * activations quantized once; ffn_up runs as the fused gate+up GLU launch).
 * SMELT_BENCH_ID=1 (2: with the launch shapes swept) times the one-token expert products of
 * three MoE models as a decode step runs them (bench_id); T_ONLY=none skips the tests first.
 */
#ifndef SMELT_HAVE_CUDA
#include <stdio.h>

int main(void) {
    printf("SKIP test_cuda_mmv: built without CUDA (nvcc not found at configure time)\n");
    return 77;
}
#else

#include "t.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmv.h"
#include "backend/cuda/cuda_moe.h"
#include "quant/quant.h"
#include "util/half.h"

static unsigned long long g_seed = 0x5eed;
/* The launch context of every call: device 0, the default stream (main makes it). */
static struct cuda_ctx g_ctx;

static void *make_weights(uint32_t type, int64_t rows, int64_t k, float *deq) {
    const struct qtype_info *qi = qtype_get(type);
    uint64_t rb = qtype_row_size(type, k);
    uint8_t *w = malloc(rb * (uint64_t)rows);
    float *row = malloc(sizeof(float) * (size_t)k);
    for (int64_t r = 0; r < rows; r++) {
        float scale = 0.02f * (1.0f + (float)(r % 7)); /* rows of different magnitude */
        for (int64_t i = 0; i < k; i++) row[i] = scale * t_randn(&g_seed);
        qi->quantize(row, w + rb * r, k);
        qi->dequantize(w + rb * r, deq + k * r, k);
    }
    free(row);
    return w;
}

/* The GPU's activation quantization (one scale per 16 values), on the CPU. */
static void quantize_like_gpu(const float *x, int64_t nk, float *xhat) {
    for (int64_t b = 0; b < nk; b += 16) {
        float amax = 0;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / 127.0f;
        for (int i = 0; i < 16; i++) xhat[b + i] = d > 0 ? rintf(x[b + i] / d) * d : 0.0f;
    }
}

/* Tolerance of a GPU output against y_q, as a fraction of sum|w||x| (float accumulation of
 * exact integer dots; the K-quants with a min subtract two sums that may each exceed the
 * result, so they get twice the room). */
static double mmv_tol(uint32_t type) {
    switch (type) {
    case QT_F16: return 1e-5;
    case QT_Q2_K:
    case QT_Q3_K:
    case QT_Q5_K: return 4e-5;
    default: return 2e-5;
    }
}

/* The types with kernels in cuda_mmv_tq.cu, and whether their block is 256 wide. */
static const uint32_t new_types[] = {QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_IQ4_NL,
                                     QT_IQ4_XS, QT_MXFP4, QT_Q2_K, QT_Q3_K, QT_Q5_K};
#define N_NEW_TYPES (sizeof new_types / sizeof new_types[0])
static int is_k256(uint32_t type) { return qtype_get(type)->blck_size == 256; }

#define CK(call)                                                                               \
    do {                                                                                       \
        cudaError_t rc_ = (call);                                                              \
        if (rc_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(rc_));                       \
            T_CHECK(0);                                                                        \
            return;                                                                            \
        }                                                                                      \
    } while (0)

static void check_case(uint32_t type, int64_t rows, int64_t k, int n) {
    float *deq = malloc(sizeof(float) * (size_t)(rows * k));
    void *w = make_weights(type, rows, k, deq);
    float *x = malloc(sizeof(float) * (size_t)(n * k)), *xh = malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++) x[i] = t_randn(&g_seed);
    quantize_like_gpu(x, n * k, xh);
    struct cuda_qweight qw;
    struct err e;
    T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw, type, w, rows, k, &e), SMELT_OK);
    float *dx, *dy;
    void *scratch;
    float *y = malloc(sizeof(float) * (size_t)(n * rows));
    CK(cudaMalloc((void **)&dx, sizeof(float) * n * k));
    CK(cudaMalloc((void **)&dy, sizeof(float) * n * rows));
    CK(cudaMalloc(&scratch, cuda_mmv_scratch_bytes(k, n)));
    CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xff, sizeof(float) * n * rows)); /* poison: NaN if a row is unwritten */
    T_EQ_INT(cuda_mmv(&g_ctx, &qw, dx, n, dy, scratch, &e), SMELT_OK);
    CK(cudaMemcpy(y, dy, sizeof(float) * n * rows, cudaMemcpyDeviceToHost));
    int bad = 0;
    double err2 = 0, ref2 = 0, worst = 0;
    const float *xa = type == QT_F16 ? x : xh;
    double tol_rel = mmv_tol(type);
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double yq = 0, yx = 0, mag = 0;
            for (int64_t i = 0; i < k; i++) {
                yq += (double)deq[r * k + i] * xa[t * k + i];
                yx += (double)deq[r * k + i] * x[t * k + i];
                mag += fabs((double)deq[r * k + i] * xa[t * k + i]);
            }
            double g = y[t * rows + r];
            double ratio = fabs(g - yq) / (mag + 1e-30);
            if (!(ratio <= worst)) worst = ratio; /* NaN sticks */
            if (!(fabs(g - yq) <= tol_rel * mag + 1e-6)) {
                if (bad++ < 5)
                    fprintf(stderr, "  %s %lldx%lld n=%d: y[%d][%lld] = %.7g, ref %.7g (mag %.3g)%s\n",
                            qtype_name(type), (long long)rows, (long long)k, n, t, (long long)r, g, yq, mag,
                            bad == 1 ? " <- first bad" : "");
            }
            err2 += (g - yx) * (g - yx);
            ref2 += yx * yx;
        }
    double rel = sqrt(err2 / ref2);
    printf("mmv %-6s %5lldx%-5lld n=%d: %s, max |err|/sum|w||x| %.1e (tol %.0e), relative RMS vs exact activations "
           "%.2e\n",
           qtype_name(type), (long long)rows, (long long)k, n, bad ? "MISMATCH" : "ok", worst, tol_rel, rel);
    T_CHECKF(bad == 0, "%d outputs off", bad);
    T_CHECK(rel < (type == QT_F16 ? 1e-5 : 1.5e-2));
    cuda_qweight_free(&qw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(scratch);
    free(deq);
    free(w);
    free(x);
    free(xh);
    free(y);
}

static void test_mmv_types(void) {
    const uint32_t types[] = {QT_F16, QT_Q8_0, QT_Q4_K, QT_Q6_K};
    const int ns[] = {1, 3, 8};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
            check_case(types[i], 67, 768, ns[j]);
            check_case(types[i], 301, 2560, ns[j]);
        }
}

/* Q, K and V stacked in one launch (cuda_mmv_multi, with biases and accumulation) give
 * exactly what three separate launches give: each row's sum runs in the same order. */
static void test_mmv_multi(void) {
    /* QT_COUNT: Q4_K_M's mix, Q4_K Q and K with a Q6_K V (mmv_q4k_q6k) */
    const uint32_t types[] = {QT_F16,  QT_Q8_0,   QT_Q4_K,   QT_Q6_K, QT_Q4_0, QT_Q4_1, QT_Q5_0,
                              QT_Q5_1, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4, QT_Q2_K, QT_Q3_K, QT_Q5_K, QT_COUNT};
    const int64_t k = 768;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int n = 1; n <= 3; n += 2) {
            const int mix = types[ti] == QT_COUNT;
            const uint32_t mt[3] = {mix ? QT_Q4_K : types[ti], mix ? QT_Q4_K : types[ti], mix ? QT_Q6_K : types[ti]};
            /* the Q6_K rows of a mix start on a block of 8 rows */
            const int64_t rows[3] = {mix ? 60 : 67, mix ? 36 : 33, 301};
            struct cuda_qweight qw[3];
            const struct cuda_qweight *qp[3];
            float *dy[3], *dy1[3], *db[3];
            const float *bp[3];
            float *dx;
            void *scratch;
            struct err e;
            float *x = malloc(sizeof(float) * (size_t)(n * k));
            for (int64_t i = 0; i < n * k; i++) x[i] = t_randn(&g_seed);
            CK(cudaMalloc((void **)&dx, sizeof(float) * n * k));
            CK(cudaMalloc(&scratch, cuda_mmv_scratch_bytes(k, n)));
            CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
            T_EQ_INT(cuda_mmv_quantize(&g_ctx, dx, k, n, scratch, &e), SMELT_OK);
            for (int m = 0; m < 3; m++) {
                float *deq = malloc(sizeof(float) * (size_t)(rows[m] * k));
                void *w = make_weights(mt[m], rows[m], k, deq);
                T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw[m], mt[m], w, rows[m], k, &e), SMELT_OK);
                qp[m] = &qw[m];
                float *bh = malloc(sizeof(float) * (size_t)rows[m]), *y0 = malloc(sizeof(float) * (size_t)(n * rows[m]));
                for (int64_t i = 0; i < rows[m]; i++) bh[i] = t_randn(&g_seed);
                for (int64_t i = 0; i < n * rows[m]; i++) y0[i] = t_randn(&g_seed);
                CK(cudaMalloc((void **)&db[m], sizeof(float) * rows[m]));
                CK(cudaMalloc((void **)&dy[m], sizeof(float) * n * rows[m]));
                CK(cudaMalloc((void **)&dy1[m], sizeof(float) * n * rows[m]));
                CK(cudaMemcpy(db[m], bh, sizeof(float) * rows[m], cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dy[m], y0, sizeof(float) * n * rows[m], cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dy1[m], y0, sizeof(float) * n * rows[m], cudaMemcpyHostToDevice));
                bp[m] = m == 1 ? NULL : db[m]; /* K without a bias */
                free(deq);
                free(w);
                free(bh);
                free(y0);
            }
            /* one launch: y += W x + b; separately: y += W x, then the bias on the host copy */
            T_CHECK(cuda_mmv_stackable(qp, 3));
            T_EQ_INT(cuda_mmv_multi(&g_ctx, qp, dy, bp, 3, dx, n, scratch, 1, NULL, &e), SMELT_OK);
            if (mix) { /* K without V: one type; Q6_K rows off a block boundary: refused */
                const struct cuda_qweight *odd[2] = {qp[1], qp[2]};
                T_CHECK(cuda_mmv_stackable(qp, 2));
                T_CHECK(!cuda_mmv_stackable(odd, 2)); /* 36 rows of Q4_K, then Q6_K */
                T_CHECK(cuda_mmv_multi(&g_ctx, odd, dy, bp, 2, dx, n, scratch, 1, NULL, &e) == SMELT_ERR_INVALID);
            }
            int bad = 0;
            for (int m = 0; m < 3; m++) {
                T_EQ_INT(cuda_mmv_pre(&g_ctx, &qw[m], dx, n, dy1[m], scratch, 1, &e), SMELT_OK);
                float *a = malloc(sizeof(float) * (size_t)(n * rows[m])), *b = malloc(sizeof(float) * (size_t)(n * rows[m]));
                float *bh = malloc(sizeof(float) * (size_t)rows[m]);
                CK(cudaMemcpy(a, dy[m], sizeof(float) * n * rows[m], cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(b, dy1[m], sizeof(float) * n * rows[m], cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(bh, db[m], sizeof(float) * rows[m], cudaMemcpyDeviceToHost));
                for (int t = 0; t < n; t++)
                    for (int64_t r = 0; r < rows[m]; r++) {
                        float want = b[t * rows[m] + r] + (bp[m] ? bh[r] : 0.0f);
                        float got = a[t * rows[m] + r];
                        if (!(fabsf(got - want) <= 1e-6f * (1.0f + fabsf(want))) && bad++ < 5)
                            fprintf(stderr, "  multi %s n=%d mat %d row %lld: %.8g vs %.8g\n", qtype_name(mt[m]), n, m,
                                    (long long)r, got, want);
                    }
                free(a);
                free(b);
                free(bh);
                cuda_qweight_free(&qw[m]);
                cudaFree(dy[m]);
                cudaFree(dy1[m]);
                cudaFree(db[m]);
            }
            printf("mmv multi %-9s 3 matrices n=%d: %s\n", mix ? "Q4_K+Q6_K" : qtype_name(types[ti]), n,
                   bad ? "MISMATCH" : "ok");
            T_CHECKF(bad == 0, "%d outputs off", bad);
            cudaFree(dx);
            cudaFree(scratch);
            free(x);
        }
}

/* RMSNorm + quantize in one launch: its f32 rows match the CPU's RMSNorm, and a product
 * from its int8 form equals the product from quantizing those rows separately. */
static void test_norm_quantize(void) {
    const int64_t ks[] = {768, 4096, 896};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        const int64_t k = ks[ki], rows = 45;
        const int n = 3;
        struct err e;
        float *x = malloc(sizeof(float) * (size_t)(n * k)), *w = malloc(sizeof(float) * (size_t)k);
        float *xn = malloc(sizeof(float) * (size_t)(n * k));
        for (int64_t i = 0; i < n * k; i++) x[i] = 3.0f * t_randn(&g_seed);
        for (int64_t i = 0; i < k; i++) w[i] = 1.0f + 0.3f * t_randn(&g_seed);
        float *dx, *dw, *dxn, *dy1, *dy2;
        void *s1, *s2;
        CK(cudaMalloc((void **)&dx, sizeof(float) * n * k));
        CK(cudaMalloc((void **)&dw, sizeof(float) * k));
        CK(cudaMalloc((void **)&dxn, sizeof(float) * n * k));
        CK(cudaMalloc((void **)&dy1, sizeof(float) * n * rows));
        CK(cudaMalloc((void **)&dy2, sizeof(float) * n * rows));
        CK(cudaMalloc(&s1, cuda_mmv_scratch_bytes(k, n)));
        CK(cudaMalloc(&s2, cuda_mmv_scratch_bytes(k, n)));
        CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, w, sizeof(float) * k, cudaMemcpyHostToDevice));
        T_EQ_INT(cuda_mmv_norm_quantize(&g_ctx, dx, k, dw, 1e-6f, k, n, s1, dxn, &e), SMELT_OK);
        CK(cudaMemcpy(xn, dxn, sizeof(float) * n * k, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int t = 0; t < n; t++) {
            double ss = 0;
            for (int64_t i = 0; i < k; i++) ss += (double)x[t * k + i] * x[t * k + i];
            double inv = 1.0 / sqrt(ss / (double)k + 1e-6);
            for (int64_t i = 0; i < k; i++) {
                double ref = x[t * k + i] * inv * w[i];
                double d = fabs(xn[t * k + i] - ref) / (fabs(ref) + 1e-3);
                if (d > worst) worst = d;
            }
        }
        float *deq = malloc(sizeof(float) * (size_t)(rows * k));
        void *wq = make_weights(QT_Q8_0, rows, k, deq);
        struct cuda_qweight qw;
        T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw, QT_Q8_0, wq, rows, k, &e), SMELT_OK);
        T_EQ_INT(cuda_mmv_pre(&g_ctx, &qw, dxn, n, dy1, s1, 0, &e), SMELT_OK); /* from the fused int8 form */
        T_EQ_INT(cuda_mmv(&g_ctx, &qw, dxn, n, dy2, s2, &e), SMELT_OK);        /* quantized separately */
        float *y1 = malloc(sizeof(float) * (size_t)(n * rows)), *y2 = malloc(sizeof(float) * (size_t)(n * rows));
        CK(cudaMemcpy(y1, dy1, sizeof(float) * n * rows, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(y2, dy2, sizeof(float) * n * rows, cudaMemcpyDeviceToHost));
        int same = memcmp(y1, y2, sizeof(float) * (size_t)(n * rows)) == 0;
        printf("norm+quantize k=%lld: max rel error %.2e vs the CPU RMSNorm, product %s\n", (long long)k, worst,
               same ? "identical" : "DIFFERS");
        T_CHECK(worst < 1e-5);
        T_CHECK(same);
        cuda_qweight_free(&qw);
        cudaFree(dx);
        cudaFree(dw);
        cudaFree(dxn);
        cudaFree(dy1);
        cudaFree(dy2);
        cudaFree(s1);
        cudaFree(s2);
        free(x);
        free(w);
        free(xn);
        free(deq);
        free(wq);
        free(y1);
        free(y2);
    }
}

/* The decode chain without norm launches: W1's launch accumulates into the residual y and
 * prepares y for the next RMSNorm (epilogue), W2's and the GLU's launches take that form
 * (prologue). Against the plain chain (mmv, then norm+quantize, then mmv): y identical,
 * the products within 1e-3 relative RMS (an int8 rounding may land differently), and
 * counters left at zero. */
static void test_mmv_epilogue(void) {
    const uint32_t types[] = {QT_Q8_0, QT_Q4_K,   QT_Q6_K,   QT_Q4_0, QT_Q4_1, QT_Q5_0,
                              QT_Q5_1, QT_IQ4_NL, QT_IQ4_XS, QT_MXFP4, QT_Q2_K, QT_Q3_K, QT_Q5_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int n = 1; n <= 5; n += 4) {
            const uint32_t type = types[ti];
            const int64_t k1 = 768, r1 = 512, r2 = 96; /* W1 (r1 x k1), W2 / gate / up (r2 x r1) */
            struct err e;
            struct cuda_qweight w1, w2, wg, wu;
            float *deq = malloc(sizeof(float) * (size_t)(r1 * k1));
            void *h1 = make_weights(type, r1, k1, deq);
            void *h2 = make_weights(type, r2, r1, deq);
            void *hg = make_weights(type, r2, r1, deq);
            void *hu = make_weights(type, r2, r1, deq);
            T_EQ_INT(cuda_qweight_upload(&g_ctx, &w1, type, h1, r1, k1, &e), SMELT_OK);
            T_EQ_INT(cuda_qweight_upload(&g_ctx, &w2, type, h2, r2, r1, &e), SMELT_OK);
            T_EQ_INT(cuda_qweight_upload(&g_ctx, &wg, type, hg, r2, r1, &e), SMELT_OK);
            T_EQ_INT(cuda_qweight_upload(&g_ctx, &wu, type, hu, r2, r1, &e), SMELT_OK);
            float *x = malloc(sizeof(float) * (size_t)(n * k1)), *y0 = malloc(sizeof(float) * (size_t)(n * r1));
            float *nw = malloc(sizeof(float) * (size_t)r1);
            for (int64_t i = 0; i < n * k1; i++) x[i] = t_randn(&g_seed);
            for (int64_t i = 0; i < n * r1; i++) y0[i] = 4.0f * t_randn(&g_seed);
            for (int64_t i = 0; i < r1; i++) nw[i] = 1.0f + 0.2f * t_randn(&g_seed);
            float *dx, *dya, *dyb, *dnw, *dss, *dza, *dzb, *dga, *dgb;
            void *sx, *sa, *sb;
            unsigned *cnt;
            CK(cudaMalloc((void **)&dx, sizeof(float) * n * k1));
            CK(cudaMalloc((void **)&dya, sizeof(float) * n * r1));
            CK(cudaMalloc((void **)&dyb, sizeof(float) * n * r1));
            CK(cudaMalloc((void **)&dnw, sizeof(float) * r1));
            CK(cudaMalloc((void **)&dss, sizeof(float) * n * (r1 / 32)));
            CK(cudaMalloc((void **)&dza, sizeof(float) * n * r2));
            CK(cudaMalloc((void **)&dzb, sizeof(float) * n * r2));
            CK(cudaMalloc((void **)&dga, sizeof(float) * n * r2));
            CK(cudaMalloc((void **)&dgb, sizeof(float) * n * r2));
            CK(cudaMalloc(&sx, cuda_mmv_scratch_bytes(k1, n)));
            CK(cudaMalloc(&sa, cuda_mmv_scratch_bytes(r1, n)));
            CK(cudaMalloc(&sb, cuda_mmv_scratch_bytes(r1, n)));
            CK(cudaMalloc((void **)&cnt, sizeof(unsigned) * (r1 / 32)));
            CK(cudaMemset(cnt, 0, sizeof(unsigned) * (r1 / 32)));
            CK(cudaMemcpy(dx, x, sizeof(float) * n * k1, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dya, y0, sizeof(float) * n * r1, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dyb, y0, sizeof(float) * n * r1, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dnw, nw, sizeof(float) * r1, cudaMemcpyHostToDevice));
            T_EQ_INT(cuda_mmv_quantize(&g_ctx, dx, k1, n, sx, &e), SMELT_OK);
            /* fused chain */
            struct cuda_mmv_epi post = {0};
            post.post_w = dnw;
            cuda_mmv_scratch_parts(sa, r1, n, &post.post_xq, &post.post_xd);
            post.post_ss = dss;
            post.post_cnt = cnt;
            const struct cuda_qweight *p1 = &w1, *p2 = &w2;
            T_EQ_INT(cuda_mmv_multi(&g_ctx, &p1, &dya, NULL, 1, dx, n, sx, 1, &post, &e), SMELT_OK);
            struct cuda_mmv_epi pre = {0};
            pre.pre_ss = dss;
            pre.pre_eps = 1e-5f;
            T_EQ_INT(cuda_mmv_multi(&g_ctx, &p2, &dza, NULL, 1, NULL, n, sa, 0, &pre, &e), SMELT_OK);
            struct cuda_mmv_epi glu_epi = pre; /* the GLU output's int8 form too (small GLUs) */
            void *sg, *sq;
            CK(cudaMalloc(&sg, cuda_mmv_scratch_bytes(r2, n)));
            CK(cudaMalloc(&sq, cuda_mmv_scratch_bytes(r2, n)));
            cuda_mmv_scratch_parts(sg, r2, n, &glu_epi.post_xq, &glu_epi.post_xd);
            glu_epi.post_cnt = cnt;
            T_EQ_INT(cuda_mmv_glu(&g_ctx, &wg, &wu, 0, NULL, n, dga, sa, &glu_epi, &e), SMELT_OK);
            T_EQ_INT(cuda_mmv_quantize(&g_ctx, dga, r2, n, sq, &e), SMELT_OK);
            int qsame = 1;
            {
                int8_t *gq[2];
                void *gd[2];
                cuda_mmv_scratch_parts(sg, r2, n, &gq[0], &gd[0]);
                cuda_mmv_scratch_parts(sq, r2, n, &gq[1], &gd[1]);
                const size_t part[2] = {(size_t)(n * r2), (size_t)(n * r2 / 16) * 8};
                const void *pa[2] = {gq[0], gd[0]}, *pb[2] = {gq[1], gd[1]};
                for (int i = 0; i < 2; i++) {
                    uint8_t *ha = malloc(part[i]), *hb = malloc(part[i]);
                    CK(cudaMemcpy(ha, pa[i], part[i], cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(hb, pb[i], part[i], cudaMemcpyDeviceToHost));
                    qsame &= memcmp(ha, hb, part[i]) == 0;
                    free(ha);
                    free(hb);
                }
            }
            cudaFree(sg);
            cudaFree(sq);
            /* plain chain */
            T_EQ_INT(cuda_mmv_pre(&g_ctx, &w1, dx, n, dyb, sx, 1, &e), SMELT_OK);
            T_EQ_INT(cuda_mmv_norm_quantize(&g_ctx, dyb, r1, dnw, 1e-5f, r1, n, sb, NULL, &e), SMELT_OK);
            T_EQ_INT(cuda_mmv_pre(&g_ctx, &w2, NULL, n, dzb, sb, 0, &e), SMELT_OK);
            T_EQ_INT(cuda_mmv_glu(&g_ctx, &wg, &wu, 0, NULL, n, dgb, sb, NULL, &e), SMELT_OK);
            float *ya = malloc(sizeof(float) * (size_t)(n * r1)), *yb = malloc(sizeof(float) * (size_t)(n * r1));
            float *za = malloc(sizeof(float) * (size_t)(n * r2)), *zb = malloc(sizeof(float) * (size_t)(n * r2));
            float *ga = malloc(sizeof(float) * (size_t)(n * r2)), *gb = malloc(sizeof(float) * (size_t)(n * r2));
            unsigned *hc = malloc(sizeof(unsigned) * (size_t)(r1 / 32));
            CK(cudaMemcpy(ya, dya, sizeof(float) * n * r1, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(yb, dyb, sizeof(float) * n * r1, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(za, dza, sizeof(float) * n * r2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(zb, dzb, sizeof(float) * n * r2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(ga, dga, sizeof(float) * n * r2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(gb, dgb, sizeof(float) * n * r2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hc, cnt, sizeof(unsigned) * (r1 / 32), cudaMemcpyDeviceToHost));
            int ysame = memcmp(ya, yb, sizeof(float) * (size_t)(n * r1)) == 0, czero = 1;
            for (int64_t i = 0; i < r1 / 32; i++) czero &= hc[i] == 0;
            double ez = 0, rz = 0, eg = 0, rg = 0;
            for (int64_t i = 0; i < n * r2; i++) {
                ez += (double)(za[i] - zb[i]) * (za[i] - zb[i]);
                rz += (double)zb[i] * zb[i];
                eg += (double)(ga[i] - gb[i]) * (ga[i] - gb[i]);
                rg += (double)gb[i] * gb[i];
            }
            double relz = sqrt(ez / (rz + 1e-30)), relg = sqrt(eg / (rg + 1e-30));
            printf("mmv epilogue %-5s n=%d: residual %s, product rel RMS %.2e, glu %.2e (int8 form %s), counters %s\n",
                   qtype_name(type), n, ysame ? "identical" : "DIFFERS", relz, relg, qsame ? "identical" : "DIFFERS",
                   czero ? "zero" : "LEFT SET");
            T_CHECK(ysame);
            T_CHECK(qsame);
            T_CHECK(czero);
            T_CHECK(relz < 1e-3);
            T_CHECK(relg < 1e-3);
            cuda_qweight_free(&w1);
            cuda_qweight_free(&w2);
            cuda_qweight_free(&wg);
            cuda_qweight_free(&wu);
            cudaFree(dx); cudaFree(dya); cudaFree(dyb); cudaFree(dnw); cudaFree(dss); cudaFree(dza);
            cudaFree(dzb); cudaFree(dga); cudaFree(dgb); cudaFree(sx); cudaFree(sa); cudaFree(sb); cudaFree(cnt);
            free(deq); free(h1); free(h2); free(hg); free(hu); free(x); free(y0); free(nw);
            free(ya); free(yb); free(za); free(zb); free(ga); free(gb); free(hc);
        }
}

/* The types of cuda_mmv_tq.cu against the CPU twin: every n from 1 to 8; ragged row
 * counts; widths that are block multiples but not powers of two, one below a warp's 32
 * units (896: lanes idle), and one past a step's units in flight (4608: a second pass). */
static void test_mmv_new_types(void) {
    for (size_t i = 0; i < N_NEW_TYPES; i++) {
        const uint32_t type = new_types[i];
        const int64_t shapes[][2] = {{67, 768}, {301, 2560}, {37, 4608}, {45, 896}, {29, 800}};
        const size_t n_shapes = is_k256(type) ? 3 : 5;
        for (size_t si = 0; si < n_shapes; si++)
            for (int n = 1; n <= CUDA_MMV_MAX_N; n++) check_case(type, shapes[si][0], shapes[si][1], n);
    }
}

/* The repacked layouts read back: cuda_dequant_f16 (the GEMM path's tiles, rows [5, 34)) and
 * cuda_get_rows_q (embedding rows) against the reference dequantizer. F16 tiles within one
 * f16 rounding, f32 rows within float rounding of the terms (an FMA may round differently). */
static void test_dequant_types(void) {
    const uint32_t old_types[] = {QT_Q8_0, QT_Q4_K, QT_Q6_K};
    for (size_t ti = 0; ti < N_NEW_TYPES + 3; ti++) {
        const uint32_t type = ti < N_NEW_TYPES ? new_types[ti] : old_types[ti - N_NEW_TYPES];
        const int64_t rows = 37, k = is_k256(type) ? 2304 : 864, r0 = 5, nr = 29;
        const int32_t ids[4] = {3, 0, 36, 17};
        struct err e;
        float *deq = malloc(sizeof(float) * (size_t)(rows * k));
        void *w = make_weights(type, rows, k, deq);
        struct cuda_qweight qw;
        T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw, type, w, rows, k, &e), SMELT_OK);
        void *dh;
        float *dr;
        int32_t *dids;
        CK(cudaMalloc(&dh, 2 * (size_t)(nr * k)));
        CK(cudaMalloc((void **)&dr, sizeof(float) * (size_t)(4 * k)));
        CK(cudaMalloc((void **)&dids, sizeof ids));
        CK(cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice));
        cuda_dequant_f16(&g_ctx, dh, &qw, r0, nr);
        cuda_get_rows_q(&g_ctx, dr, &qw, dids, 4);
        CK(cudaGetLastError());
        uint16_t *h = malloc(2 * (size_t)(nr * k));
        float *g = malloc(sizeof(float) * (size_t)(4 * k));
        CK(cudaMemcpy(h, dh, 2 * (size_t)(nr * k), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(g, dr, sizeof(float) * (size_t)(4 * k), cudaMemcpyDeviceToHost));
        int bad = 0;
        double worst = 0;
        for (int64_t i = 0; i < nr * k; i++) {
            const double ref = deq[r0 * k + i], got = f16_to_f32(h[i]);
            const double d = fabs(got - ref) / (fabs(ref) + 1e-6);
            if (!(d <= worst)) worst = d;
            if (!(fabs(got - ref) <= fabs(ref) / 1024.0 + 1e-7) && bad++ < 5)
                fprintf(stderr, "  dequant_f16 %s: row %lld [%lld] = %.6g, ref %.6g%s\n", qtype_name(type),
                        (long long)(r0 + i / k), (long long)(i % k), got, ref, bad == 1 ? " <- first bad" : "");
        }
        int bad_rows = 0;
        for (int t = 0; t < 4; t++) {
            const float *ref = deq + (int64_t)ids[t] * k;
            double amax = 0;
            for (int64_t i = 0; i < k; i++) amax = fmax(amax, fabs(ref[i]));
            for (int64_t i = 0; i < k; i++)
                if (!(fabs(g[t * k + i] - ref[i]) <= 2e-6 * (fabs(ref[i]) + amax)) && bad_rows++ < 5)
                    fprintf(stderr, "  get_rows %s: row %d [%lld] = %.8g, ref %.8g%s\n", qtype_name(type), ids[t],
                            (long long)i, g[t * k + i], ref[i], bad_rows == 1 ? " <- first bad" : "");
        }
        printf("dequant %-6s %lldx%lld: f16 tile %s (max rel %.1e), get_rows %s\n", qtype_name(type), (long long)rows,
               (long long)k, bad ? "MISMATCH" : "ok", worst, bad_rows ? "MISMATCH" : "ok");
        T_CHECKF(bad == 0, "%d f16 weights off", bad);
        T_CHECKF(bad_rows == 0, "%d gathered weights off", bad_rows);
        cuda_qweight_free(&qw);
        cudaFree(dh);
        cudaFree(dr);
        cudaFree(dids);
        free(deq);
        free(w);
        free(h);
        free(g);
    }
}

/* GLU (gate and up in one launch, SiLU and tanh-GELU) for the new types against the CPU:
 * act(W_g x^) * (W_u x^) in double, x^ quantized as the GPU does. The bound follows the
 * error of each product (mmv_tol of its sum|w||x|) through act (|act'| < 1.2). */
static void test_mmv_glu_types(void) {
    for (size_t ti = 0; ti < N_NEW_TYPES; ti++)
        for (int act = 0; act < 2; act++)
            for (int n = 1; n <= CUDA_MMV_MAX_N; n += 3 + act) {
                const uint32_t type = new_types[ti];
                const int64_t rows = 83, k = is_k256(type) ? 1280 : 1120;
                struct err e;
                float *dg = malloc(sizeof(float) * (size_t)(rows * k)), *du = malloc(sizeof(float) * (size_t)(rows * k));
                void *hg = make_weights(type, rows, k, dg), *hu = make_weights(type, rows, k, du);
                float *x = malloc(sizeof(float) * (size_t)(n * k)), *xh = malloc(sizeof(float) * (size_t)(n * k));
                for (int64_t i = 0; i < n * k; i++) x[i] = 2.0f * t_randn(&g_seed);
                quantize_like_gpu(x, n * k, xh);
                struct cuda_qweight wg, wu;
                T_EQ_INT(cuda_qweight_upload(&g_ctx, &wg, type, hg, rows, k, &e), SMELT_OK);
                T_EQ_INT(cuda_qweight_upload(&g_ctx, &wu, type, hu, rows, k, &e), SMELT_OK);
                float *dx, *dy;
                void *scratch;
                CK(cudaMalloc((void **)&dx, sizeof(float) * n * k));
                CK(cudaMalloc((void **)&dy, sizeof(float) * n * rows));
                CK(cudaMalloc(&scratch, cuda_mmv_scratch_bytes(k, n)));
                CK(cudaMemcpy(dx, x, sizeof(float) * n * k, cudaMemcpyHostToDevice));
                CK(cudaMemset(dy, 0xff, sizeof(float) * n * rows));
                T_EQ_INT(cuda_mmv_quantize(&g_ctx, dx, k, n, scratch, &e), SMELT_OK);
                T_EQ_INT(cuda_mmv_glu(&g_ctx, &wg, &wu, act, dx, n, dy, scratch, NULL, &e), SMELT_OK);
                float *y = malloc(sizeof(float) * (size_t)(n * rows));
                CK(cudaMemcpy(y, dy, sizeof(float) * n * rows, cudaMemcpyDeviceToHost));
                const double tol = mmv_tol(type);
                int bad = 0;
                double worst = 0;
                for (int t = 0; t < n; t++)
                    for (int64_t r = 0; r < rows; r++) {
                        double g = 0, u = 0, mg = 0, mu = 0;
                        for (int64_t i = 0; i < k; i++) {
                            g += (double)dg[r * k + i] * xh[t * k + i];
                            u += (double)du[r * k + i] * xh[t * k + i];
                            mg += fabs((double)dg[r * k + i] * xh[t * k + i]);
                            mu += fabs((double)du[r * k + i] * xh[t * k + i]);
                        }
                        const double a = act == 0 ? g / (1.0 + exp(-g))
                                                  : 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
                        const double ref = a * u, got = y[t * rows + r];
                        const double bound = tol * (1.2 * mg * fabs(u) + mu * fabs(a)) + 1e-5 * fabs(ref) + 1e-6;
                        if (!(fabs(got - ref) / bound <= worst)) worst = fabs(got - ref) / bound;
                        if (!(fabs(got - ref) <= bound) && bad++ < 5)
                            fprintf(stderr, "  glu %s act=%d n=%d: y[%d][%lld] = %.7g, ref %.7g (bound %.2g)%s\n",
                                    qtype_name(type), act, n, t, (long long)r, got, ref, bound,
                                    bad == 1 ? " <- first bad" : "");
                    }
                printf("mmv glu %-6s %s n=%d: %s (max err/bound %.2f)\n", qtype_name(type), act ? "gelu" : "silu", n,
                       bad ? "MISMATCH" : "ok", worst);
                T_CHECKF(bad == 0, "%d outputs off", bad);
                cuda_qweight_free(&wg);
                cuda_qweight_free(&wu);
                cudaFree(dx);
                cudaFree(dy);
                cudaFree(scratch);
                free(dg);
                free(du);
                free(hg);
                free(hu);
                free(x);
                free(xh);
                free(y);
            }
}

static void test_mmv_rejects(void) {
    struct cuda_qweight qw;
    struct err e;
    uint8_t junk[144] = {0};
    T_EQ_INT(cuda_qweight_upload(&g_ctx, &qw, QT_Q4_K, junk, 1, 100, &e), SMELT_ERR_UNSUPPORTED);
    T_CHECK(strstr(e.msg, "Q4_K") != NULL);
}

/* us per product of an instantiated graph of reps products on st: one warm-up replay, then
 * one timed between two events. */
static double graph_us(cudaGraphExec_t ge, cudaStream_t st, int reps) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaGraphLaunch(ge, st); /* warm-up */
    cudaEventRecord(a, st);
    cudaGraphLaunch(ge, st);
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms * 1e3 / reps;
}

/* Bandwidth on decode shapes: bytes of weights read per product / time (median of reps). */
static void bench(void) {
    struct shape {
        const char *name;
        int64_t rows, k;
        int glu; /* gate+up as one GLU launch, 2x the bytes */
    } shapes[] = {{"attn_q 4096x4096", 4096, 4096, 0},
                  {"ffn_up 14336x4096", 14336, 4096, 1},
                  {"ffn_down 4096x14336", 4096, 14336, 0},
                  {"attn_v 1024x4096", 1024, 4096, 0},
                  {"output 128256x4096", 128256, 4096, 0},
                  {"0.5B attn_o 896x896", 896, 896, 0},
                  {"0.5B ffn_up 4864x896", 4864, 896, 1},
                  {"0.5B ffn_down 896x4864", 896, 4864, 0},
                  {"30B-A3B attn_o 2048x4096", 2048, 4096, 0},
                  {"30B-A3B attn_qkv 5120x2048", 5120, 2048, 0},
                  {"gpt-oss attn_o 2880x4096", 2880, 4096, 0}};
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const uint32_t types[] = {QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_F16};
    struct err e;
    const char *only = getenv("SMELT_BENCH_TYPE"); /* e.g. Q4_K */
    const char *shape = getenv("SMELT_BENCH_SHAPE"); /* a part of the shapes' names, e.g. 30B */
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t si = 0; si < n_shapes; si++) {
            uint32_t type = types[ti];
            if (only && strcmp(only, qtype_name(type)) != 0) continue;
            if (shape && !strstr(shapes[si].name, shape)) continue;
            int64_t rows = shapes[si].rows, k = shapes[si].k;
            if (!cuda_mmv_supported(type, k)) continue; /* e.g. K-quants need k % 256 == 0 */
            uint64_t rb = qtype_row_size(type, k);
            uint64_t bytes = rb * rows;
            int copies = (int)((1ull << 30) / bytes) + 1; /* > 1 GiB in rotation */
            if (copies > 64) copies = 64;
            uint8_t *host = malloc(bytes);
            for (uint64_t i = 0; i < bytes; i++) host[i] = (uint8_t)t_rand_u64(&g_seed);
            /* sane scales: quantize one row of real values and replicate it */
            float *row = malloc(sizeof(float) * k);
            for (int64_t i = 0; i < k; i++) row[i] = 0.02f * t_randn(&g_seed);
            qtype_get(type)->quantize(row, host, k);
            for (int64_t r = 1; r < rows; r++) memcpy(host + rb * r, host, rb);
            struct cuda_qweight *qw = calloc((size_t)copies, sizeof *qw);
            int ok = 1;
            for (int c = 0; c < copies && ok; c++) ok = cuda_qweight_upload(&g_ctx, &qw[c], type, host, rows, k, &e) == SMELT_OK;
            float *dx, *dy;
            void *scratch;
            cudaMalloc((void **)&dx, sizeof(float) * 8 * k);
            cudaMalloc((void **)&dy, sizeof(float) * 8 * rows);
            cudaMalloc(&scratch, cuda_mmv_scratch_bytes(k, 8));
            cudaMemset(dx, 0, sizeof(float) * 8 * k);
            for (int n = 1; n <= (g_ctx.mmv_variant ? 1 : 8) && ok; n *= 2) {
                /* 200 products in one graph (as the decode step replays them), the activations
                 * quantized once: the time per product includes the graph's launch gap */
                cudaStream_t st;
                cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
                struct cuda_ctx sctx = g_ctx; /* g_ctx on this stream (its counters shared, not freed) */
                sctx.stream = st;
                cuda_mmv_quantize(&sctx, dx, k, n, scratch, &e);
                const int reps = 200;
                cudaGraph_t g = NULL;
                cudaGraphExec_t ge = NULL;
                int glu = type != QT_F16 && shapes[si].glu;
                cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed);
                for (int i = 0; i < reps; i++) {
                    if (glu) cuda_mmv_glu(&sctx, &qw[(2 * i) % copies], &qw[(2 * i + 1) % copies], 0, dx, n, dy, scratch, NULL, &e);
                    else cuda_mmv_pre(&sctx, &qw[i % copies], dx, n, dy, scratch, 0, &e);
                }
                cudaStreamEndCapture(st, &g);
                if (!g || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
                    printf("bench: graph capture failed\n");
                    break;
                }
                double us = graph_us(ge, st, reps);
                double by = (double)bytes * (glu ? 2 : 1);
                printf("bench mmv %-5s %-22s%s n=%d: %8.2f us  %7.1f GB/s (%4.1f%% of 4380)\n", qtype_name(type),
                       shapes[si].name, glu ? " glu" : "", n, us, by / us / 1e3, by / us / 1e3 / 4380 * 100);
                cudaGraphExecDestroy(ge);
                cudaGraphDestroy(g);
                cudaStreamDestroy(st);
            }
            for (int c = 0; c < copies; c++) cuda_qweight_free(&qw[c]);
            free(qw);
            free(host);
            free(row);
            cudaFree(dx);
            cudaFree(dy);
            cudaFree(scratch);
        }
}

/* The types of cuda_mmv_tq.cu: one product of a 4096x4096 and of a 14336x4096 matrix at
 * n = 1 (weights rotated through > 1 GiB, 200 products replayed as one graph). GB/s counts
 * the bytes held on the device (qw.bytes, a few % above GGUF's for Q3_K and Q5_K). */
static void bench_new_types(void) {
    struct err e;
    const char *only = getenv("SMELT_BENCH_TYPE");
    const int64_t shapes[2][2] = {{4096, 4096}, {14336, 4096}};
    for (size_t ti = 0; ti < N_NEW_TYPES; ti++)
        for (int si = 0; si < 2; si++) {
            const uint32_t type = new_types[ti];
            if (only && strcmp(only, qtype_name(type)) != 0) continue;
            const int64_t rows = shapes[si][0], k = shapes[si][1];
            const uint64_t rb = qtype_row_size(type, k), bytes = rb * rows;
            int copies = (int)((1ull << 30) / bytes) + 1;
            if (copies > 64) copies = 64;
            uint8_t *host = malloc(bytes);
            float *row = malloc(sizeof(float) * k);
            for (int64_t r = 0; r < rows; r++) { /* 16 distinct rows, repeated */
                if (r < 16) {
                    for (int64_t i = 0; i < k; i++) row[i] = 0.02f * t_randn(&g_seed);
                    qtype_get(type)->quantize(row, host + rb * r, k);
                } else {
                    memcpy(host + rb * r, host + rb * (r % 16), rb);
                }
            }
            struct cuda_qweight *qw = calloc((size_t)copies, sizeof *qw);
            int ok = 1;
            for (int c = 0; c < copies && ok; c++) ok = cuda_qweight_upload(&g_ctx, &qw[c], type, host, rows, k, &e) == SMELT_OK;
            float *dx, *dy;
            void *scratch;
            cudaMalloc((void **)&dx, sizeof(float) * k);
            cudaMalloc((void **)&dy, sizeof(float) * rows);
            cudaMalloc(&scratch, cuda_mmv_scratch_bytes(k, 1));
            cudaMemset(dx, 0, sizeof(float) * k);
            cudaStream_t st;
            cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
            struct cuda_ctx sctx = g_ctx; /* g_ctx on this stream (its counters shared, not freed) */
            sctx.stream = st;
            cudaGraph_t g = NULL;
            cudaGraphExec_t ge = NULL;
            const int reps = 200;
            if (ok) {
                cuda_mmv_quantize(&sctx, dx, k, 1, scratch, &e);
                cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed);
                for (int i = 0; i < reps; i++) cuda_mmv_pre(&sctx, &qw[i % copies], dx, 1, dy, scratch, 0, &e);
                cudaStreamEndCapture(st, &g);
            }
            if (!ok || !g || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
                printf("bench mmv %s: upload or graph capture failed\n", qtype_name(type));
            } else {
                const double us = graph_us(ge, st, reps), by = (double)qw[0].bytes;
                printf("bench mmv %-6s %5lldx%lld n=1: %8.2f us  %7.1f GB/s (%4.1f%% of 4380), %.4f B/weight on the "
                       "device (GGUF %.4f)\n",
                       qtype_name(type), (long long)rows, (long long)k, us, by / us / 1e3, by / us / 1e3 / 4380 * 100,
                       by / (double)(rows * k), (double)bytes / (double)(rows * k));
                cudaGraphExecDestroy(ge);
            }
            if (g) cudaGraphDestroy(g);
            cudaStreamDestroy(st);
            for (int c = 0; c < copies; c++) cuda_qweight_free(&qw[c]);
            free(qw);
            free(host);
            free(row);
            cudaFree(dx);
            cudaFree(dy);
            cudaFree(scratch);
        }
}


/* One-token expert products ("mmv by id") as a decode step of an MoE layer runs them: the
 * gate/up GLU over the k picked experts with h's int8 form in its epilogue, then the down
 * product with the weighted sum (and the next norm's input) in its epilogue. The experts'
 * weights of several layers rotate (> 1 GiB, so reads come from HBM), each layer with its
 * own k distinct experts; 200 layers replayed as one graph. Rows: the pair, each launch
 * alone, the down launch without its fused sum, then (SMELT_BENCH_ID=2) the pair under each
 * launch shape of mmv_with_shape's numbering, one launch's shape at a time. GB/s counts the
 * picked experts' bytes on the device. SMELT_BENCH_ID=1 or 2; SMELT_BENCH_SHAPE filters. */
struct id_layer {
    struct cuda_qweight g, u, d;
    int32_t *ids;
};
/* SMELT_BENCH_ROWS=n (1..8): bench_id's token rows a step; above one, a decode step of n rows
 * as cuda_ops_moe.c runs it with a chunk per (row, slot): gate/up with h's int8 form in its
 * epilogue, down, and the weighted sum as its own launch */
static int g_id_rows = 1;

static double time_id_graph(int mode, struct id_layer *ly, int n_l, int n_exp, int kk, int64_t n_ff, int64_t d,
                            int act, const void *xs, float *h, void *hs, float *y, float *dst, const float *wt,
                            unsigned *gcnt, unsigned *ccnt, void *post, float *post_ss, const float *post_w) {
    struct err e;
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    struct cuda_ctx sctx = g_ctx;
    sctx.stream = st;
    const int reps = 200;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int8_t *hq, *pq;
    void *hd, *pd;
    const int nr = g_id_rows, np = nr * kk; /* rows, (row, slot) pairs */
    cuda_mmv_scratch_parts(hs, n_ff, np, &hq, &hd);
    cuda_mmv_scratch_parts(post, d, 1, &pq, &pd);
    /* as decode runs it (cuda_ops_moe.c): h's int8 form in the gate/up launch at every row
     * count, the weighted sum in the down launch at one row */
    const int one = nr == 1;
    int ok = 1;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed);
    for (int i = 0; i < reps && ok; i++) {
        struct id_layer *l = &ly[i % n_l];
        if (mode != 2 && mode != 3) { /* gate/up */
            struct cuda_mmv_ids id = {.eid = l->ids, .n_chunks = np, .x_div = kk, .n_exp = n_exp, .x_rows = nr,
                                      .signal_late = one, .post_cnt = gcnt, .post_xq = hq, .post_xd = hd};
            ok = cuda_mmv_glu_id(&sctx, &l->g, &l->u, act, &id, 1, NULL, h, xs, &e) == SMELT_OK;
        }
        if (mode != 1 && ok) { /* down */
            struct cuda_mmv_ids id = {.eid = l->ids, .n_chunks = np, .x_div = 1, .n_exp = n_exp, .x_rows = np,
                                      .ids_early = one};
            if (one && mode != 3) {
                id.cmb_dst = dst;
                id.cmb_ids = l->ids;
                id.cmb_w = wt;
                id.cmb_cnt = ccnt;
                id.cmb_k = kk;
                id.cmb_acc = 1;
                id.cmb_post_w = post_w;
                id.cmb_post_xq = pq;
                id.cmb_post_xd = pd;
                id.cmb_post_ss = post_ss;
            }
            ok = cuda_mmv_id(&sctx, &l->d, &id, 1, h, y, hs, &e) == SMELT_OK;
        }
        if (!one && mode == 0 && ok) /* the weighted sum */
            ok = cuda_moe_combine(&sctx, dst, y, NULL, l->ids, wt, NULL, d, nr, kk, n_exp, 1, NULL, NULL, &e) ==
                 SMELT_OK;
    }
    cudaStreamEndCapture(st, &g);
    double us = -1;
    if (!ok) printf("bench id: launch failed: %s\n", e.msg);
    if (ok && g && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess) {
        us = graph_us(ge, st, reps);
        cudaGraphExecDestroy(ge);
    }
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(st);
    const cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess) printf("bench id: %s\n", cudaGetErrorString(ce));
    return us;
}

static void bench_id(int sweep) {
    const struct {
        const char *name;
        int n_exp, k;
        int64_t n_ff, d;
        uint32_t tg, td;
        int act;
    } shapes[] = {{"Qwen3-30B-A3B", 128, 8, 768, 2048, QT_Q4_K, QT_Q4_K, 0},
                  {"Qwen3-30B-A3B Q6_K-down", 128, 8, 768, 2048, QT_Q4_K, QT_Q6_K, 0},
                  {"Qwen3.5-35B-A3B", 256, 8, 512, 2048, QT_Q4_K, QT_Q4_K, 0},
                  {"Qwen3.5-35B-A3B Q6_K-down", 256, 8, 512, 2048, QT_Q4_K, QT_Q6_K, 0},
                  {"gpt-oss-20b", 32, 4, 2880, 2880, QT_MXFP4, QT_MXFP4, 2}};
    const char *only = getenv("SMELT_BENCH_SHAPE");
    struct err e;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n_exp = shapes[si].n_exp, kk = shapes[si].k;
        const int64_t n_ff = shapes[si].n_ff, d = shapes[si].d;
        const uint32_t tg = shapes[si].tg, td = shapes[si].td;
        if (only && !strstr(shapes[si].name, only)) continue;
        if (!cuda_mmv_supported(tg, d) || !cuda_mmv_supported(td, n_ff) || !qtype_get(tg)->quantize ||
            !qtype_get(td)->quantize) {
            printf("bench id %s: types not supported, skipped\n", shapes[si].name);
            continue;
        }
        const uint64_t rg = qtype_row_size(tg, d), rd = qtype_row_size(td, n_ff);
        const uint64_t layer = (uint64_t)n_exp * (2 * (uint64_t)n_ff * rg + (uint64_t)d * rd);
        int n_l = (int)((1ull << 30) / layer) + 2;
        if (n_l > 16) n_l = 16;
        /* one quantized row of real values per matrix, replicated (upload cost, not the math, matters) */
        uint8_t *hg = malloc(rg * n_exp * n_ff), *hd = malloc(rd * n_exp * d);
        float *row = malloc(sizeof(float) * (d > n_ff ? d : n_ff));
        for (int64_t i = 0; i < d; i++) row[i] = 0.02f * t_randn(&g_seed);
        qtype_get(tg)->quantize(row, hg, d);
        for (int64_t r = 1; r < n_exp * n_ff; r++) memcpy(hg + rg * r, hg, rg);
        for (int64_t i = 0; i < n_ff; i++) row[i] = 0.02f * t_randn(&g_seed);
        qtype_get(td)->quantize(row, hd, n_ff);
        for (int64_t r = 1; r < n_exp * d; r++) memcpy(hd + rd * r, hd, rd);
        struct id_layer *ly = calloc((size_t)n_l, sizeof *ly);
        int ok = 1, n_dist = kk;
        for (int l = 0; l < n_l && ok; l++) {
            ok = cuda_qweight_upload(&g_ctx, &ly[l].g, tg, hg, n_exp * n_ff, d, &e) == SMELT_OK &&
                 cuda_qweight_upload(&g_ctx, &ly[l].u, tg, hg, n_exp * n_ff, d, &e) == SMELT_OK &&
                 cuda_qweight_upload(&g_ctx, &ly[l].d, td, hd, n_exp * d, n_ff, &e) == SMELT_OK;
            int32_t ids[8 * 32];
            for (int t = 0; t < g_id_rows; t++)
                for (int j = 0; j < kk; j++) { /* k distinct experts a row */
                    int again;
                    do {
                        ids[t * kk + j] = (int32_t)(t_rand_u64(&g_seed) % (uint64_t)n_exp);
                        again = 0;
                        for (int q = 0; q < j; q++) again |= ids[t * kk + q] == ids[t * kk + j];
                    } while (again);
                }
            if (l == 0) { /* the experts a step reads */
                n_dist = 0;
                for (int q = 0; q < g_id_rows * kk; q++) {
                    int seen = 0;
                    for (int r = 0; r < q; r++) seen |= ids[r] == ids[q];
                    n_dist += !seen;
                }
            }
            cudaMalloc((void **)&ly[l].ids, sizeof(int32_t) * g_id_rows * kk);
            cudaMemcpy(ly[l].ids, ids, sizeof(int32_t) * g_id_rows * kk, cudaMemcpyHostToDevice);
        }
        free(hg);
        free(hd);
        free(row);
        float *dx, *h, *y, *dst, *wt, *post_ss, *post_w;
        void *xs, *hs, *post;
        unsigned *gcnt, *ccnt;
        const int nr = g_id_rows, np = nr * kk; /* token rows, (row, slot) pairs */
        cudaMalloc((void **)&dx, sizeof(float) * d * nr);
        cudaMalloc(&xs, cuda_mmv_scratch_bytes(d, nr));
        cudaMalloc((void **)&h, sizeof(float) * np * n_ff);
        cudaMalloc(&hs, cuda_mmv_scratch_bytes(n_ff, np));
        cudaMalloc((void **)&y, sizeof(float) * np * d);
        cudaMalloc((void **)&dst, sizeof(float) * d * nr);
        cudaMalloc((void **)&wt, sizeof(float) * np);
        cudaMalloc(&post, cuda_mmv_scratch_bytes(d, 1));
        cudaMalloc((void **)&post_ss, sizeof(float) * d / 32);
        cudaMalloc((void **)&post_w, sizeof(float) * d);
        cudaMalloc((void **)&gcnt, sizeof(unsigned) * np * n_ff / 32);
        cudaMalloc((void **)&ccnt, sizeof(unsigned) * (d / 32)); /* the weighted sum: one counter a 32-row group */
        cudaMemset(gcnt, 0, sizeof(unsigned) * np * n_ff / 32);
        cudaMemset(ccnt, 0, sizeof(unsigned) * (d / 32));
        cudaMemset(dst, 0, sizeof(float) * d * nr);
        cudaMemset(h, 0, sizeof(float) * np * n_ff);
        cudaMemset(hs, 0, cuda_mmv_scratch_bytes(n_ff, np));
        float *hx = malloc(sizeof(float) * d * nr);
        for (int64_t i = 0; i < d * nr; i++) hx[i] = t_randn(&g_seed);
        cudaMemcpy(dx, hx, sizeof(float) * d * nr, cudaMemcpyHostToDevice);
        for (int64_t i = 0; i < d; i++) hx[i] = 1.0f;
        cudaMemcpy(post_w, hx, sizeof(float) * d, cudaMemcpyHostToDevice);
        for (int j = 0; j < np; j++) hx[j] = 1.0f / (float)kk;
        cudaMemcpy(wt, hx, sizeof(float) * np, cudaMemcpyHostToDevice);
        free(hx);
        if (ok) ok = cuda_mmv_quantize(&g_ctx, dx, d, nr, xs, &e) == SMELT_OK;
        cudaDeviceSynchronize();
        /* the bytes a step must read: each distinct expert's rows once */
        const double bg = (double)n_dist * 2 * (double)n_ff * (double)ly[0].g.bytes / (double)(n_exp * n_ff),
                     bd = (double)n_dist * (double)d * (double)ly[0].d.bytes / (double)(n_exp * d);
        static const char *const modes[] = {"pair (as decode)", "gate/up alone", "down alone", "down, no sum"};
        if (nr > 1)
            printf("bench id %-26s %d rows: %d (row, slot) pairs over %d experts\n", shapes[si].name, nr, np, n_dist);
        for (int mode = 0; mode < (nr > 1 ? 3 : 4) && ok; mode++) {
            const double us = time_id_graph(mode, ly, n_l, n_exp, kk, n_ff, d, shapes[si].act, xs, h, hs, y, dst,
                                            wt, gcnt, ccnt, post, post_ss, post_w);
            const double by = mode == 0 ? bg + bd : mode == 1 ? bg : bd;
            printf("bench id %-26s %-17s: %7.2f us  %7.1f GB/s (%4.1f%% of 4380)\n", shapes[si].name,
                   nr > 1 && mode == 0 ? "step (as decode)" : modes[mode],
                   us, by / us / 1e3, by / us / 1e3 / 4380 * 100);
        }
        for (int which = 0; which < 2 && ok && sweep; which++)
            for (int v = 1; v <= MMV_LANES_SUM; v++) {
                g_ctx.mmv_id_variant[0] = which == 0 ? v : 0;
                g_ctx.mmv_id_variant[1] = which == 1 ? v : 0;
                /* the other launch: its default shape */
                const double us = time_id_graph(0, ly, n_l, n_exp, kk, n_ff, d, shapes[si].act, xs, h, hs, y, dst,
                                                wt, gcnt, ccnt, post, post_ss, post_w);
                printf("bench id %-26s pair, %s variant %2d: %7.2f us\n", shapes[si].name,
                       which == 0 ? "gate/up" : "down", v, us);
            }
        g_ctx.mmv_id_variant[0] = g_ctx.mmv_id_variant[1] = 0;
        for (int l = 0; l < n_l; l++) {
            cuda_qweight_free(&ly[l].g);
            cuda_qweight_free(&ly[l].u);
            cuda_qweight_free(&ly[l].d);
            cudaFree(ly[l].ids);
        }
        free(ly);
        void *bufs[] = {dx, xs, h, hs, y, dst, wt, post, post_ss, post_w, gcnt, ccnt};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    }
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP test_cuda_mmv: no CUDA device on this machine\n");
        return 77;
    }
    struct err e;
    if (cuda_ctx_init(&g_ctx, 0, NULL, &e) != SMELT_OK) { /* PDL as the backend launches */
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    const char *bo = getenv("SMELT_BENCH_ONLY"); /* the benches alone (profiler runs) */
    if (!(bo && *bo && strcmp(bo, "0"))) {
        T_RUN(test_mmv_types);
        T_RUN(test_mmv_new_types);
        T_RUN(test_dequant_types);
        T_RUN(test_mmv_glu_types);
        T_RUN(test_mmv_rejects);
        T_RUN(test_mmv_multi);
        T_RUN(test_norm_quantize);
        T_RUN(test_mmv_epilogue);
    } else {
        printf("test_cuda_mmv: SMELT_BENCH_ONLY set, the tests skipped\n");
    }
    if (getenv("SMELT_BENCH")) {
        bench();
        bench_new_types();
    }
    if (getenv("SMELT_BENCH_ROWS")) {
        g_id_rows = atoi(getenv("SMELT_BENCH_ROWS"));
        if (g_id_rows < 1 || g_id_rows > 8) g_id_rows = 1;
    }
    if (getenv("SMELT_BENCH_ID")) bench_id(atoi(getenv("SMELT_BENCH_ID")) >= 2);
    if (getenv("SMELT_BENCH_VARIANTS")) /* one-token Q4_K / Q6_K / Q8_0 kernel shapes (cuda_mmv.cu) */
        for (g_ctx.mmv_variant = 1; g_ctx.mmv_variant <= 10; g_ctx.mmv_variant++) {
            printf("variant %d\n", g_ctx.mmv_variant);
            T_RUN(test_mmv_types); /* the variant's results too (one-token Q4_K / Q6_K / Q8_0 only) */
            T_RUN(test_mmv_epilogue);
            bench();
        }
    g_ctx.mmv_variant = 0;
    cuda_ctx_free(&g_ctx);
    return t_done();
}
#endif
