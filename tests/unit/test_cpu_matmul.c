/* CPU matmul against an independent double-precision reference.
 *
 * Weights are random bytes (every bit pattern a block can hold, e.g. Q8_0's -128) with
 * their scale fields replaced by sane random halves; the reference is quant/'s reference
 * dequantize of those bytes (itself checked against gguf-py). For every weight type ×
 * every ISA this machine has, at ragged shapes, two checks per output y[c][r]:
 *
 *  1. Tight: against sum_i w[r][i] * xq[c][i] in double, where xq is X after the 15-bit
 *     activation quantization, computed here from its definition (cpu_kernels.h: one scale
 *     per row, D = amax/16256, v = round-half-even(x * 16256/amax)). The kernels' integer
 *     math is exact, so only f32 scale products and summation order differ:
 *     tol = 2e-5 * sum_i |w||xq| (+1e-30).
 *  2. Bound: against the exact f32 X. The activation rounding moves each x_i by at most
 *     D/2 = amax/32512, so |err| <= amax/32512 * sum_i |w_i| (times 1.0001) plus the
 *     tolerance of check 1. For F32/F16/BF16 and the dequantize-fallback types X is not
 *     quantized and only check 1 applies (with xq = x).
 *
 * Also: SIMD quantizers produce the same bytes as the scalar ones, SIMD and scalar
 * matmuls agree to 2e-5 * sum |w||x|, every integer type gives each X row the same bits
 * alone as in the batch, and bad arguments give the documented errors.
 */
#include <stdint.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_pool.h"
#include "quant/quant.h"
#include "t.h"
#include "util/arena.h"
#include "util/half.h"

/* Activation group of the integer kernel for a type (0: f32 activations). */
static int act_group(uint32_t t) {
    switch (t) {
    case QT_Q4_0:
    case QT_Q4_1:
    case QT_Q5_0:
    case QT_Q5_1:
    case QT_Q8_0:
    case QT_IQ4_NL:
    case QT_MXFP4:
    case QT_NVFP4:
    case QT_Q1_0:
        return 32;
    case QT_IQ2_XXS:
    case QT_IQ2_XS:
    case QT_IQ2_S:
    case QT_IQ3_XXS:
    case QT_IQ3_S:
    case QT_IQ1_S:
    case QT_IQ1_M:
    case QT_TQ1_0:
    case QT_TQ2_0:
    case QT_Q2_K:
    case QT_Q3_K:
    case QT_Q4_K:
    case QT_Q5_K:
    case QT_Q6_K:
    case QT_IQ4_XS:
        return 256;
    default:
        return 0;
    }
}

static void put_f16(uint8_t *p, float v) {
    uint16_t h = f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* A random half in ±[0.5, 1.5] * scale. */
static float rnd_scale(unsigned long long *s, float scale) {
    float m = 1.0f + 0.5f * t_rand_f(s);
    return (t_rand_u64(s) & 1 ? -m : m) * scale;
}

/* Overwrites the scale fields of one block of type t with sane values (magnitudes chosen
 * so dequantized weights are O(0.01..1)). */
static void sanitize_block(uint32_t t, uint8_t *b, unsigned long long *s) {
    switch (t) {
    case QT_Q4_0:
    case QT_Q5_0:
    case QT_Q8_0:
    case QT_IQ4_NL:
        put_f16(b, rnd_scale(s, t == QT_Q8_0 ? 0.01f : t == QT_IQ4_NL ? 0.01f : 0.1f));
        break;
    case QT_Q4_1:
    case QT_Q5_1:
        put_f16(b, rnd_scale(s, 0.1f));
        put_f16(b + 2, rnd_scale(s, 0.5f));
        break;
    case QT_Q8_1:
        put_f16(b, rnd_scale(s, 0.01f));
        put_f16(b + 2, 1.0f);
        break;
    case QT_Q2_K:
        put_f16(b + 80, rnd_scale(s, 0.05f));
        put_f16(b + 82, rnd_scale(s, 0.05f));
        break;
    case QT_Q3_K:
        put_f16(b + 108, rnd_scale(s, 0.02f));
        break;
    case QT_Q4_K:
    case QT_Q5_K:
        put_f16(b, rnd_scale(s, 0.005f));
        put_f16(b + 2, rnd_scale(s, 0.01f));
        break;
    case QT_Q6_K:
        put_f16(b + 208, rnd_scale(s, 0.0005f));
        break;
    case QT_Q8_K: {
        float d = rnd_scale(s, 0.01f);
        memcpy(b, &d, 4);
        break;
    }
    case QT_IQ4_XS:
    case QT_IQ2_XXS:
    case QT_IQ2_XS:
    case QT_IQ2_S:
    case QT_IQ3_XXS:
    case QT_IQ3_S:
    case QT_IQ1_S:
    case QT_Q1_0:
        put_f16(b, rnd_scale(s, 0.01f));
        break;
    case QT_IQ1_M: { /* f16 super-scale spread over the top nibbles of 4 words at 48 */
        uint16_t h = f32_to_f16(rnd_scale(s, 0.01f)), sc[4];
        memcpy(sc, b + 48, 8);
        for (int i = 0; i < 4; i++)
            sc[i] = (uint16_t)((sc[i] & 0x0fff) | ((h >> (4 * i)) & 15) << 12);
        memcpy(b + 48, sc, 8);
        break;
    }
    case QT_TQ1_0:
        put_f16(b + 52, rnd_scale(s, 0.1f));
        break;
    case QT_TQ2_0:
        put_f16(b + 64, rnd_scale(s, 0.1f));
        break;
    case QT_MXFP4: /* now and then e = 0 or 1: the scale is an f32 denormal */
        b[0] = t_rand_u64(s) % 8 ? (uint8_t)(120 + t_rand_u64(s) % 8) : (uint8_t)(t_rand_u64(s) % 2);
        break;
    default:
        break;
    }
}

/* Random weights of type t: rows × k. Plain types get random normal values. */
static void *make_weights(uint32_t t, int64_t rows, int64_t k, unsigned long long *s) {
    const struct qtype_info *qi = qtype_get(t);
    size_t rb = (size_t)qtype_row_size(t, k), nbytes = rb * (size_t)rows;
    uint8_t *w = malloc(nbytes + 1);
    if (t == QT_F32 || t == QT_F16 || t == QT_BF16) {
        for (int64_t i = 0; i < rows * k; i++) {
            float v = 0.1f * t_randn(s);
            if (t == QT_F32)
                memcpy(w + 4 * i, &v, 4);
            else {
                uint16_t h = t == QT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
                memcpy(w + 2 * i, &h, 2);
            }
        }
        return w;
    }
    for (size_t i = 0; i < nbytes; i++)
        w[i] = (uint8_t)(t_rand_u64(s) >> 56);
    for (size_t b = 0; b < nbytes / qi->type_size; b++)
        sanitize_block(t, w + b * qi->type_size, s);
    return w;
}

/* X: normal values with a few outliers and one all-zero 32-group per row. */
static float *make_x(int64_t n, int64_t k, unsigned long long *s) {
    float *x = malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++) {
        x[i] = t_randn(s);
        if ((t_rand_u64(s) & 63) == 0) x[i] *= 8.0f;
    }
    for (int64_t c = 0; c < n; c++) {
        int64_t g = (int64_t)(t_rand_u64(s) % (uint64_t)(k / 32));
        memset(x + c * k + 32 * g, 0, 32 * sizeof(float));
    }
    return x;
}

/* X after the activation quantization, from its definition (one scale per row). */
static void quantize_ref(const float *x, float *xq, int64_t k) {
    float amax = 0;
    for (int64_t i = 0; i < k; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float id = amax > 0 ? (float)CPU_ACT_VMAX / amax : 0.0f, d = amax / (float)CPU_ACT_VMAX;
    for (int64_t i = 0; i < k; i++)
        xq[i] = nearbyintf(x[i] * id) * d;
}

struct shape {
    int64_t rows, k, n;
};

static int n_checked;
static int g_extreme; /* check_type: make_extreme's weights and X instead of random ones */

static int n_repacked;

/* Where (t, isa) has a repacked decode path: the repacked layout round-trips and the SIMD
 * repack equals the generic one; the repacked matmul gives y (the file-layout result at
 * this level) bit for bit, at n and row by row (n = 1, the decode kernel): the batch
 * invariance the forward pass relies on. */
static void check_repacked(uint32_t t, struct cpu_pool *pool, struct arena *ar, enum cpu_isa isa,
                           const void *w, int64_t rows, int64_t k, const float *x, int64_t n,
                           const float *y) {
    const struct cpu_kernel *kn = cpu_matmul_kernel(t, isa);
    if (!kn || !kn->gemv) return;
    const char *name = qtype_name(t);
    struct err e = {0};
    struct cpu_rweight *rw = NULL;
    T_EQ_INT(cpu_matmul_repack(pool, isa, t, w, rows, k, &rw, &e), SMELT_OK);
    T_CHECKF(rw != NULL, "%s %s: not repacked", name, cpu_isa_name(isa));
    if (!rw) return;
    /* layout: SIMD repack of the first group == generic; unrepack restores the rows */
    size_t rb = (size_t)qtype_row_size(t, k), gb = (size_t)kn->G * rb;
    int nr = rows < kn->G ? (int)rows : kn->G;
    char *g1 = malloc(gb), *g2 = malloc(gb), *back = malloc(gb);
    memset(g1, 0x55, gb);
    memset(g2, 0xaa, gb);
    kn->repack(t, k, w, rb, nr, g1);
    cpu_rp_pack_any(kn->G, t, k, w, rb, nr, g2);
    T_CHECKF(!memcmp(g1, g2, gb), "%s %s: SIMD repack differs from the generic one", name,
             cpu_isa_name(isa));
    kn->unrepack(t, g1, nr, 0, k / qtype_get(t)->blck_size, back, rb);
    T_CHECKF(!memcmp(back, w, (size_t)nr * rb), "%s %s: unrepack does not restore the rows", name,
             cpu_isa_name(isa));
    memset(back, 0, gb);
    cpu_rp_unpack_any(kn->G, t, k, g1, nr, back, rb);
    T_CHECK(!memcmp(back, w, (size_t)nr * rb));
    /* a range of blocks (the prefill unpacks a few at a time): those blocks, nothing else */
    const int64_t nb = k / qtype_get(t)->blck_size;
    const size_t bb = qtype_get(t)->type_size;
    if (nb >= 3) {
        memset(back, 0x5a, gb);
        kn->unrepack(t, g1, nr, 1, nb - 1, back, rb);
        int stray = 0, wrong = 0;
        for (int r = 0; r < nr; r++)
            for (size_t o = 0; o < rb; o++) {
                const unsigned char got = (unsigned char)back[r * rb + o];
                if (o < bb || o >= (size_t)(nb - 1) * bb) stray += got != 0x5a;
                else wrong += got != ((const unsigned char *)w)[r * rb + o];
            }
        T_CHECKF(stray == 0 && wrong == 0, "%s %s: unrepack of blocks 1..%lld: %d bytes outside, %d inside wrong",
                 name, cpu_isa_name(isa), (long long)nb - 2, stray, wrong);
    }
    free(g1);
    free(g2);
    free(back);

    float *yr = malloc(sizeof(float) * (size_t)(n * rows));
    float *y1 = malloc(sizeof(float) * (size_t)rows);
    T_EQ_INT(cpu_matmul_rw(pool, rw, x, n, yr, ar, &e), SMELT_OK);
    int bad = 0, bad1 = 0;
    for (int64_t i = 0; i < n * rows; i++)
        if (memcmp(&yr[i], &y[i], 4)) bad++;
    for (int64_t c = 0; c < n; c++) {
        T_EQ_INT(cpu_matmul_rw(pool, rw, x + c * k, 1, y1, ar, &e), SMELT_OK);
        for (int64_t r = 0; r < rows; r++)
            if (memcmp(&y1[r], &y[c * rows + r], 4)) {
                if (bad1++ < 3)
                    fprintf(stderr, "  %s %s rows=%lld k=%lld n=%lld: y[%lld][%lld] alone %.9g, "
                                    "in the batch %.9g\n",
                            name, cpu_isa_name(isa), (long long)rows, (long long)k, (long long)n,
                            (long long)c, (long long)r, y1[r], y[c * rows + r]);
            }
    }
    T_CHECKF(bad == 0, "%s %s: repacked differs from the file layout on %d outputs", name,
             cpu_isa_name(isa), bad);
    T_CHECKF(bad1 == 0, "%s %s: %d outputs differ between n = 1 and the batch", name,
             cpu_isa_name(isa), bad1);
    free(yr);
    free(y1);
    cpu_rweight_free(rw);
    n_repacked++;
}

/* The K-quants' and IQ4_XS's largest integer sums: every weight at the magnitude its block
 * allows (Q4_K/Q5_K/Q2_K scale, min and quant all ones; Q6_K q = 0 (−32) with scale −128;
 * Q3_K −4 with scale −32; IQ4_XS scale −32 and value −127), against X rows that are
 * constant at +amax (hi 127, lo 0), or at ±16192/16256 of amax (hi ±127/−126, lo −64)
 * with one element at ±amax: the per-chunk int32 of the AVX2 kernels reaches 2^31 − 2^24
 * (Q6_K) and the decode's int16 sums their bounds (cpu_gemv_avx2.c). */
static void make_extreme(uint32_t t, uint8_t *w, int64_t rows, int64_t k, float *x, int64_t n,
                         unsigned long long *s) {
    const struct qtype_info *qi = qtype_get(t);
    size_t nb = (size_t)qtype_row_size(t, k) * (size_t)rows / qi->type_size;
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * qi->type_size;
        switch (t) {
        case QT_Q4_K:
        case QT_Q5_K:
            memset(p + 4, 0xff, qi->type_size - 4);
            break;
        case QT_Q6_K:
            memset(p, 0, 192);
            memset(p + 192, 0x80, 16);
            break;
        case QT_Q3_K:
            memset(p, 0, 108);
            break;
        case QT_Q2_K:
            memset(p, 0xff, 80);
            break;
        case QT_IQ4_XS:
            memset(p + 2, 0, qi->type_size - 2);
            break;
        default:
            break;
        }
        sanitize_block(t, p, s);
    }
    for (int64_t c = 0; c < n; c++) {
        float *xc = x + c * k, sg = c % 2 ? -1.0f : 1.0f;
        for (int64_t i = 0; i < k; i++)
            xc[i] = c % 3 == 0 ? sg : sg * (16192.0f / 16256.0f);
        xc[0] = sg;
    }
}

static void check_type(uint32_t t, struct cpu_pool *pool, struct arena *ar, const struct shape *sh,
                       unsigned long long seed) {
    const struct qtype_info *qi = qtype_get(t);
    unsigned long long s = seed;
    int64_t rows = sh->rows, k = sh->k, n = sh->n;
    void *w = make_weights(t, rows, k, &s);
    float *x = make_x(n, k, &s);
    if (g_extreme) make_extreme(t, w, rows, k, x, n, &s);
    float *wd = malloc(sizeof(float) * (size_t)(rows * k));
    size_t rb = (size_t)qtype_row_size(t, k);
    for (int64_t r = 0; r < rows; r++)
        qi->dequantize((const char *)w + r * rb, wd + r * k, k);
    float *xq = malloc(sizeof(float) * (size_t)(n * k));
    float *y = malloc(sizeof(float) * (size_t)(n * rows));
    float *y0 = malloc(sizeof(float) * (size_t)(n * rows));
    double *tight = malloc(sizeof(double) * (size_t)(n * rows));
    double *bound = malloc(sizeof(double) * (size_t)(n * rows));
    double *ref = malloc(sizeof(double) * (size_t)(n * rows));
    double *refq = malloc(sizeof(double) * (size_t)(n * rows));

    int isa_max = cpu_isa_supported();
    for (int isa = 0; isa <= isa_max; isa++) {
        int g = cpu_matmul_has_kernel(t, (enum cpu_isa)isa) ? act_group(t) : 0;
        for (int64_t c = 0; c < n; c++) {
            if (g)
                quantize_ref(x + c * k, xq + c * k, k);
            else
                memcpy(xq + c * k, x + c * k, sizeof(float) * (size_t)k);
        }
        for (int64_t c = 0; c < n; c++)
            for (int64_t r = 0; r < rows; r++) {
                const float *wr = wd + r * k, *xc = x + c * k, *qc = xq + c * k;
                double sr = 0, sq = 0, aq = 0, bnd = 0;
                for (int64_t i = 0; i < k; i++) {
                    sr += (double)wr[i] * xc[i];
                    sq += (double)wr[i] * qc[i];
                    aq += fabs((double)wr[i] * qc[i]) + fabs((double)wr[i] * xc[i]);
                }
                if (g) {
                    double amax = 0, aw = 0;
                    for (int64_t i = 0; i < k; i++) {
                        amax = fmax(amax, fabs(xc[i]));
                        aw += fabs(wr[i]);
                    }
                    bnd = amax / (2.0 * CPU_ACT_VMAX) * aw;
                }
                ref[c * rows + r] = sr;
                refq[c * rows + r] = sq;
                tight[c * rows + r] = 2e-5 * aq + 1e-30;
                bound[c * rows + r] = bnd * 1.0001 + tight[c * rows + r];
            }
        struct err e = {0};
        for (int i = 0; i < n * rows; i++)
            y[i] = NAN;
        smelt_status st = cpu_matmul_isa(pool, (enum cpu_isa)isa, t, w, rows, k, x, n, y, ar, &e);
        T_CHECKF(st == SMELT_OK, "%s %s: %s", qi->name, cpu_isa_name(isa), e.msg);
        if (st != SMELT_OK) break;
        int bad_t = 0, bad_b = 0;
        double worst = 0;
        for (int64_t i = 0; i < n * rows; i++) {
            double et = fabs(y[i] - refq[i]), eb = fabs(y[i] - ref[i]);
            if (!(et <= tight[i])) {
                if (bad_t++ < 3)
                    fprintf(stderr,
                            "  %s %s rows=%lld k=%lld n=%lld: y[%lld][%lld]=%.9g ref(xq)=%.9g "
                            "tol=%.3g\n",
                            qi->name, cpu_isa_name(isa), (long long)rows, (long long)k,
                            (long long)n, (long long)(i / rows), (long long)(i % rows), y[i],
                            refq[i], tight[i]);
            }
            if (!(eb <= bound[i])) bad_b++;
            if (bound[i] > 0 && eb / bound[i] > worst) worst = eb / bound[i];
        }
        T_CHECKF(bad_t == 0, "%s %s: %d outputs off the quantized-X reference", qi->name,
                 cpu_isa_name(isa), bad_t);
        T_CHECKF(bad_b == 0, "%s %s: %d outputs beyond the activation-rounding bound (worst %.2f)",
                 qi->name, cpu_isa_name(isa), bad_b, worst);
        check_repacked(t, pool, ar, (enum cpu_isa)isa, w, rows, k, x, n, y);
        /* batch invariance on the file layout: each X row alone gives its outputs' bits */
        if (g && n > 1) {
            float *y1 = malloc(sizeof(float) * (size_t)rows);
            int bad1 = 0;
            for (int64_t c = 0; c < n; c++) {
                T_EQ_INT(cpu_matmul_isa(pool, (enum cpu_isa)isa, t, w, rows, k, x + c * k, 1, y1,
                                        ar, &e),
                         SMELT_OK);
                for (int64_t r = 0; r < rows; r++)
                    if (memcmp(&y1[r], &y[c * rows + r], 4)) bad1++;
            }
            T_CHECKF(bad1 == 0, "%s %s: %d outputs differ between n = 1 and n = %lld", qi->name,
                     cpu_isa_name(isa), bad1, (long long)n);
            free(y1);
        }
        if (isa == 0)
            memcpy(y0, y, sizeof(float) * (size_t)(n * rows));
        else {
            int bad = 0;
            for (int64_t i = 0; i < n * rows; i++)
                if (!(fabs(y[i] - y0[i]) <= tight[i])) bad++;
            T_CHECKF(bad == 0, "%s: %s and scalar disagree on %d outputs", qi->name,
                     cpu_isa_name(isa), bad);
        }
        n_checked++;
        arena_reset(ar);
    }
    free(w);
    free(x);
    free(wd);
    free(xq);
    free(y);
    free(y0);
    free(tight);
    free(bound);
    free(ref);
    free(refq);
}

/* NVFP4 keeps random scale bytes: every E4M3 pattern, 0x7f (zero) and subnormals. */
static const uint32_t kernel_types[] = {
    QT_F32,   QT_F16,  QT_BF16,   QT_Q4_0,  QT_Q4_1,    QT_Q5_0,   QT_Q5_1,   QT_Q8_0,
    QT_IQ4_NL, QT_MXFP4, QT_NVFP4, QT_Q1_0,  QT_Q2_K,    QT_Q3_K,   QT_Q4_K,   QT_Q5_K,
    QT_Q6_K,  QT_IQ4_XS, QT_IQ2_XXS, QT_IQ2_XS, QT_IQ2_S, QT_IQ3_XXS, QT_IQ3_S, QT_IQ1_S,
    QT_IQ1_M, QT_TQ1_0, QT_TQ2_0};
static const uint32_t fallback_types[] = {QT_Q8_K, QT_Q8_1};

static void test_matmul_kernel_types(void) {
    struct cpu_pool *pool = NULL;
    struct err e = {0};
    T_EQ_INT(cpu_pool_new(&pool, 3, &e), SMELT_OK);
    struct arena ar;
    arena_init(&ar);
    /* Ragged shapes: rows not a multiple of 4/16/threads, several n, k several blocks. The
     * two with ~800 and ~1800 rows give the decode chunks (~8 per thread) several groups
     * each, with a partial last group. {13, 2560, 37}: the AVX2 K-quant product's slices of
     * 4 super-blocks (past 8) and column blocks of 32, each with a ragged last one. */
    const struct shape shapes[] = {
        {1, 256, 1},   {37, 512, 1},   {69, 768, 3},   {5, 256, 17},    {150, 512, 5},
        {21, 1024, 36}, {13, 2560, 37}, {803, 512, 2}, {1811, 256, 1},
        /* around the AVX2 gemv's row limits (cpu_gemv_avx2.c: 4 or 6) */
        {24, 512, 4},   {40, 768, 6},   {33, 256, 7},
    };
    for (size_t ti = 0; ti < sizeof kernel_types / sizeof kernel_types[0]; ti++) {
        uint32_t t = kernel_types[ti];
        T_CHECKF(cpu_matmul_has_kernel(t, CPU_ISA_SCALAR), "%s has no scalar kernel",
                 qtype_name(t));
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            check_type(t, pool, &ar, &shapes[si], 0x9e3779b97f4a7c15ULL * (ti * 16 + si + 1));
    }
    /* Legacy 32-blocks at a k that is not a multiple of 256, and plain types at odd k. */
    /* (n >= 8 takes the packed prefill path where a type has one; 96 = 3 blocks leaves an
     * odd tail block for the two-blocks-per-register kernels.) */
    const struct shape odd32 = {19, 96, 5}, odd32p = {19, 96, 9}, odd1 = {9, 97, 3};
    for (size_t ti = 0; ti < sizeof kernel_types / sizeof kernel_types[0]; ti++) {
        uint32_t t = kernel_types[ti];
        if (qtype_get(t)->blck_size == 32) check_type(t, pool, &ar, &odd32, 77 + ti);
        if (qtype_get(t)->blck_size == 32) check_type(t, pool, &ar, &odd32p, 177 + ti);
        if (qtype_get(t)->blck_size == 1) check_type(t, pool, &ar, &odd1, 99 + ti);
    }
    arena_free(&ar);
    cpu_pool_free(pool);
    printf("checked %d type x isa x shape combinations (isa up to %s), %d of them repacked\n",
           n_checked, cpu_isa_name(cpu_isa_supported()), n_repacked);
}

static void test_kquant_extremes(void) {
    struct cpu_pool *pool = NULL;
    struct err e = {0};
    T_EQ_INT(cpu_pool_new(&pool, 2, &e), SMELT_OK);
    struct arena ar;
    arena_init(&ar);
    const uint32_t types[] = {QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS};
    const struct shape shapes[] = {{9, 512, 3}, {5, 256, 12}};
    g_extreme = 1;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            check_type(types[ti], pool, &ar, &shapes[si], 0xe47ULL * (ti * 4 + si + 1));
    g_extreme = 0;
    arena_free(&ar);
    cpu_pool_free(pool);
}

static void test_matmul_fallback_types(void) {
    struct arena ar;
    arena_init(&ar);
    struct cpu_pool *pool = NULL;
    struct err e = {0};
    T_EQ_INT(cpu_pool_new(&pool, 2, &e), SMELT_OK);
    const struct shape sh = {23, 512, 3};
    int ran = 0;
    for (size_t ti = 0; ti < sizeof fallback_types / sizeof fallback_types[0]; ti++) {
        uint32_t t = fallback_types[ti];
        const struct qtype_info *qi = qtype_get(t);
        if (!qi || !qi->dequantize) continue;
        T_CHECK(cpu_matmul_supports(t));
        check_type(t, pool, &ar, &sh, 1234 + ti);
        ran++;
    }
    T_CHECK(ran >= 2);
    arena_free(&ar);
    cpu_pool_free(pool);
}

/* Several column chunks (large k makes the L2-sized X chunk small) and no arena. */
static void test_matmul_large_n(void) {
    struct cpu_pool *pool = NULL;
    struct err e = {0};
    T_EQ_INT(cpu_pool_new(&pool, 2, &e), SMELT_OK);
    const struct shape sh = {20, 8192, 131};
    const uint32_t types[] = {QT_Q4_K, QT_Q8_0, QT_F16};
    unsigned long long s = 5;
    for (size_t ti = 0; ti < 3; ti++) {
        uint32_t t = types[ti];
        void *w = make_weights(t, sh.rows, sh.k, &s);
        float *x = make_x(sh.n, sh.k, &s);
        float *y1 = malloc(sizeof(float) * (size_t)(sh.n * sh.rows));
        float *y2 = malloc(sizeof(float) * (size_t)(sh.n * sh.rows));
        /* Reference: one X row at a time (a single column chunk each). */
        for (int64_t c = 0; c < sh.n; c++)
            T_EQ_INT(
                cpu_matmul(pool, t, w, sh.rows, sh.k, x + c * sh.k, 1, y1 + c * sh.rows, NULL, &e),
                SMELT_OK);
        T_EQ_INT(cpu_matmul(pool, t, w, sh.rows, sh.k, x, sh.n, y2, NULL, &e), SMELT_OK);
        int bad = 0;
        for (int64_t i = 0; i < sh.n * sh.rows; i++)
            if (!(fabsf(y1[i] - y2[i]) <= 1e-4f * (fabsf(y1[i]) + 1.0f))) bad++;
        T_CHECKF(bad == 0, "%s: batched and row-at-a-time differ on %d outputs", qtype_name(t),
                 bad);
        free(w);
        free(x);
        free(y1);
        free(y2);
    }
    cpu_pool_free(pool);
}

/* Bytes of both planes that carry data (the row padding is not written). */
static int planes_equal(const uint8_t *a, const uint8_t *b, enum cpu_act act, int64_t k) {
    size_t row = cpu_act_row_bytes(act, k);
    size_t used = act == CPU_ACT_Q8_32 ? (size_t)(k + 6 * (k / 32))
                                       : (size_t)(k + 4 * (k / 256) + 2 * (k / 16));
    return !memcmp(a, b, used) && !memcmp(a + row, b + row, used);
}

static void test_quantizers_identical(void) {
    unsigned long long s = 42;
    const int64_t k = 1024;
    float *x = make_x(1, k, &s);
    x[5] = 1e-30f; /* tiny and exact-tie values */
    x[6] = 0.5f;
    static _Alignas(64) uint8_t a[8192], b[8192];
    int isa_max = cpu_isa_supported();
    if (isa_max == CPU_ISA_SCALAR) {
        t_skip("no SIMD quantizer on this CPU");
        free(x);
        return;
    }
    /* The planes hold v = 128·hi + lo, |lo| <= 64, with v from the definition. */
    cpu_quantize_q8_32_scalar(x, a, k);
    {
        const int8_t *hi = (const int8_t *)a, *lo = hi + cpu_act_row_bytes(CPU_ACT_Q8_32, k);
        float amax = 0;
        for (int64_t i = 0; i < k; i++) amax = fmaxf(amax, fabsf(x[i]));
        int bad = 0;
        for (int64_t i = 0; i < k; i++) {
            int v = (int)nearbyintf(x[i] * ((float)CPU_ACT_VMAX / amax));
            if (128 * hi[i] + lo[i] != v || lo[i] < -64 || lo[i] > 63) bad++;
        }
        T_CHECKF(bad == 0, "%d values off the definition", bad);
        const float *d = (const float *)(hi + k);
        T_CHECK(d[0] == 128.0f * (amax / (float)CPU_ACT_VMAX));
    }
#if defined(__x86_64__)
    cpu_quantize_q8_32_avx2(x, b, k);
    T_CHECK(planes_equal(a, b, CPU_ACT_Q8_32, k));
    cpu_quantize_q8_K_scalar(x, a, k);
    cpu_quantize_q8_K_avx2(x, b, k);
    T_CHECK(planes_equal(a, b, CPU_ACT_Q8_K, k));
    /* the fused-kernel formats: same values, same bytes */
    {
        size_t kp = cpu_x2_kp(k);
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        cpu_quantize_x2_32_scalar(x, a, k);
        cpu_quantize_x2_32_avx2(x, b, k);
        T_CHECK(memcmp(a, b, 3 * kp + 4 * (size_t)(k / 32) + 4) == 0);
        const int8_t *hi = cpu_x2_hi(a), *lo = cpu_x2_lo(a, k);
        const int32_t *neg = cpu_x2_neg(a, k);
        int bad = 0;
        for (int64_t l = 0; l < k / 4; l++) {
            int sum = 0;
            for (int e = 0; e < 4; e++)
                sum += 128 * hi[4 * l + e] + lo[4 * l + e];
            if (neg[l] != -sum) bad++;
        }
        T_CHECKF(bad == 0, "%d X2_32 lane sums wrong", bad);
        int v_nat[1024];
        for (int64_t i = 0; i < k; i++)
            v_nat[i] = 128 * hi[i] + lo[i];
        /* X16_32 / X16_64: v in quad-pair order per chunk, sums per 16 natural elements */
        for (int W = 32; W <= 64; W += 32) {
            memset(a, 0, sizeof a);
            memset(b, 0, sizeof b);
            if (W == 32) {
                cpu_quantize_x16_32_scalar(x, a, k);
                cpu_quantize_x16_32_avx2(x, b, k);
            } else {
                cpu_quantize_x16_64_scalar(x, a, k);
                if (isa_max >= CPU_ISA_AVX512)
                    cpu_quantize_x16_64_avx512(x, b, k);
                else
                    memcpy(b, a, sizeof a);
            }
            T_CHECKF(memcmp(a, b, 2 * (size_t)k + 4 * (size_t)(k / 16) + 4) == 0, "X16_%d", W);
            const int16_t *v16 = (const int16_t *)a;
            int badp = 0;
            for (int64_t i = 0; i < k; i++) {
                int64_t c = i / W, r = i % W, l = r / 4, h = (r % 4) / 2, e2 = r % 2;
                if (v16[c * W + W / 2 * h + 2 * l + e2] != v_nat[i]) badp++;
            }
            T_CHECKF(badp == 0, "X16_%d: %d values out of quad-pair order", W, badp);
            float sv0 = 0;
            for (int i = 0; i < 16; i++)
                sv0 += (float)v_nat[i];
            T_CHECK(cpu_x16_sv(a, k)[0] == sv0);
        }
        /* X16_64 at k % 64 == 32 (the AVX-512 legacy prefill's odd last block): the last
         * chunk of 32 in X16_32's order, its two sums per 16 */
        {
            const int64_t k2 = k - 32;
            memset(a, 0, sizeof a);
            memset(b, 0, sizeof b);
            cpu_quantize_x16_64_scalar(x, a, k2);
            if (isa_max >= CPU_ISA_AVX512)
                cpu_quantize_x16_64_avx512(x, b, k2);
            else
                memcpy(b, a, sizeof a);
            T_CHECKF(memcmp(a, b, 2 * (size_t)k2 + 4 * (size_t)(k2 / 16) + 4) == 0, "X16_64 at k %% 64 == 32");
            const int16_t *v16 = (const int16_t *)a;
            const float *sv = cpu_x16_sv(a, k2);
            int badp = 0;
            for (int64_t i = 0; i < k2; i++) {
                const int64_t W = i < k2 / 64 * 64 ? 64 : 32, c = i / 64, r = i % 64, l = r / 4, h = (r % 4) / 2,
                              e2 = r % 2;
                if (v16[c * 64 + W / 2 * h + 2 * l + e2] != v_nat[i]) badp++;
            }
            float svl = 0;
            for (int64_t i = k2 - 16; i < k2; i++)
                svl += (float)v_nat[i];
            T_CHECKF(badp == 0 && sv[k2 / 16 - 1] == svl, "X16_64 at k %% 64 == 32: %d values out of order", badp);
        }
        /* X16_K: v in chunk-lane order per super-block, sums per 16 even groups first */
        {
            memset(a, 0, sizeof a);
            memset(b, 0, sizeof b);
            cpu_quantize_x16_k_scalar(x, a, k);
            cpu_quantize_x16_k_avx2(x, b, k);
            T_CHECKF(memcmp(a, b, 2 * (size_t)k + 4 * (size_t)(k / 16) + 4) == 0, "X16_K bytes");
            const int16_t *v16 = (const int16_t *)a;
            int badc = 0;
            for (int64_t i = 0; i < k; i++) {
                int64_t sb = i / 256, n = i % 256, l = n / 32, j = (n % 32) / 2, e2 = n % 2;
                if (v16[256 * sb + 16 * j + 2 * l + e2] != v_nat[i]) badc++;
            }
            for (int64_t g = 0; g < k / 16; g++) {
                int sum = 0;
                for (int i = 0; i < 16; i++)
                    sum += v_nat[16 * g + i];
                int64_t sb = g / 16, gl = g % 16;
                if (cpu_x16_sv(a, k)[16 * sb + 8 * (gl % 2) + gl / 2] != (float)sum) badc++;
            }
            T_CHECK(cpu_x16_D(a, k) == cpu_x16_D(b, k) && cpu_x16_D(a, k) > 0);
            T_CHECKF(badc == 0, "X16_K: %d values out of chunk-lane order", badc);
        }
        /* XK: the planes, pair sums of v and sums per 16 */
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        cpu_quantize_xk_scalar(x, a, k);
        cpu_quantize_xk_avx2(x, b, k);
        T_CHECK(memcmp(a, b, 2 * kp + (size_t)k + 4 * (size_t)(k / 16) + 4) == 0);
        if (isa_max >= CPU_ISA_AVX512) {
            memset(b, 0, sizeof b);
            cpu_quantize_xk_avx512(x, b, k);
            T_CHECK(memcmp(a, b, 2 * kp + (size_t)k + 4 * (size_t)(k / 16) + 4) == 0);
        }
        {
            const int8_t *xh = cpu_x2_hi(a), *xl = cpu_x2_lo(a, k);
            const int16_t *p2 = cpu_xk_p2(a, k);
            int badk = 0;
            for (int64_t i = 0; i < k; i++)
                if (128 * xh[i] + xl[i] != v_nat[i]) badk++;
            for (int64_t i = 0; i < k / 2; i++)
                if (p2[i] != v_nat[2 * i] + v_nat[2 * i + 1]) badk++;
            for (int64_t g = 0; g < k / 16; g++) {
                int sum = 0;
                for (int i = 0; i < 16; i++)
                    sum += v_nat[16 * g + i];
                if (cpu_xk_sv(a, k)[g] != (float)sum) badk++;
            }
            /* c32 (AVX2 level only): 32 × the slot sums of each plane per group */
            const int16_t *c32 = cpu_xk_c32(a, k);
            for (int64_t g = 0; g < k / 16; g++)
                for (int pl = 0; pl < 2; pl++)
                    for (int sl = 0; sl < 2; sl++) {
                        int sum = 0;
                        for (int m = 0; m < 4; m++)
                            for (int e2 = 0; e2 < 2; e2++)
                                sum += (pl ? xl : xh)[16 * g + 4 * m + 2 * sl + e2];
                        if (c32[4 * g + 2 * pl + sl] != 32 * sum) badk++;
                    }
            memset(b, 0, sizeof b);
            cpu_quantize_xk_avx2(x, b, k);
            if (memcmp(c32, cpu_xk_c32(b, k), (size_t)k / 2)) badk++;
            T_CHECKF(badk == 0, "XK: %d values off", badk);
        }
    }
#endif
    free(x);
}

static void test_matmul_errors(void) {
    struct err e = {0};
    float x[64] = {0}, y[4];
    uint8_t w[256] = {0};
    T_EQ_INT(cpu_matmul(NULL, QT_I8, w, 1, 32, x, 1, y, NULL, &e), SMELT_ERR_UNSUPPORTED);
    T_CHECKF(strstr(e.msg, "I8") != NULL, "message: %s", e.msg);
    T_EQ_INT(cpu_matmul(NULL, 4, w, 1, 32, x, 1, y, NULL, &e), SMELT_ERR_UNSUPPORTED);
    T_EQ_INT(cpu_matmul(NULL, QT_Q4_K, w, 1, 32, x, 1, y, NULL, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "Q4_K") != NULL && strstr(e.msg, "256") != NULL, "message: %s", e.msg);
    T_EQ_INT(cpu_matmul(NULL, QT_Q8_0, w, -1, 32, x, 1, y, NULL, &e), SMELT_ERR_INVALID);
    T_EQ_INT(cpu_matmul(NULL, QT_Q8_0, w, 0, 32, x, 1, y, NULL, &e), SMELT_OK);
    T_CHECK(!cpu_matmul_supports(QT_I32));
    T_CHECK(cpu_matmul_supports(QT_Q4_K));
}

/* A batch of products (mixed types, shapes, row counts: a packed prefill one, decode ones,
 * an empty one, a dequantize fallback) gives every product the bits cpu_matmul gives it
 * alone, on every ISA level and with 1 or 2 threads, on the file layout and with the
 * repacked copies mixed in; a bad product fails the batch. */
static void test_matmul_batch(void) {
    unsigned long long s = 0xba7c4ULL;
    enum { NB = 7 };
    const uint32_t type[NB] = {QT_Q4_K, QT_Q8_0, QT_F16, QT_Q6_K, QT_Q5_0, QT_Q8_K, QT_Q4_0};
    const int64_t rows[NB] = {70, 33, 17, 48, 64, 20, 16}, k[NB] = {512, 96, 40, 256, 64, 256, 64};
    const int64_t n[NB] = {19, 1, 3, 1, 9, 2, 0};
    void *w[NB];
    float *x[NB], *y[NB], *y1[NB];
    struct cpu_mm mm[NB];
    for (int i = 0; i < NB; i++) {
        w[i] = make_weights(type[i], rows[i], k[i], &s);
        x[i] = make_x(n[i] ? n[i] : 1, k[i], &s);
        y[i] = malloc(sizeof(float) * (size_t)(rows[i] * (n[i] ? n[i] : 1)));
        y1[i] = malloc(sizeof(float) * (size_t)(rows[i] * (n[i] ? n[i] : 1)));
        mm[i] = (struct cpu_mm){type[i], w[i], rows[i], k[i], x[i], n[i], y[i], NULL};
    }
    struct arena ar;
    arena_init(&ar);
    for (int nt = 1; nt <= 2; nt++) {
        struct cpu_pool *pool;
        struct err e;
        T_CHECK(cpu_pool_new(&pool, nt, &e) == SMELT_OK);
        for (int isa = 0; isa <= (int)cpu_isa_supported(); isa++) {
            T_CHECK(cpu_matmul_batch_isa(pool, (enum cpu_isa)isa, mm, NB, &ar, &e) == SMELT_OK);
            arena_reset(&ar);
            for (int i = 0; i < NB; i++) {
                T_CHECK(cpu_matmul_isa(pool, (enum cpu_isa)isa, type[i], w[i], rows[i], k[i], x[i], n[i],
                                       y1[i], NULL, &e) == SMELT_OK);
                T_CHECKF(memcmp(y[i], y1[i], sizeof(float) * (size_t)(rows[i] * n[i])) == 0,
                         "product %d (%s) on %s, %d threads: batch != alone", i,
                         qtype_name(type[i]), cpu_isa_name((enum cpu_isa)isa), nt);
            }
            /* the same batch with every product that has a repacked kernel at this level
             * on its repacked copy (gemv at a few rows, the packed path above): same bits */
            struct cpu_mm mr[NB];
            struct cpu_rweight *rws[NB] = {0};
            for (int i = 0; i < NB; i++) {
                mr[i] = mm[i];
                T_CHECK(cpu_matmul_repack(pool, (enum cpu_isa)isa, type[i], w[i], rows[i], k[i],
                                          &rws[i], &e) == SMELT_OK);
                mr[i].rw = rws[i];
                memset(y[i], 0, sizeof(float) * (size_t)(rows[i] * n[i]));
            }
            T_CHECK(cpu_matmul_batch_isa(pool, (enum cpu_isa)isa, mr, NB, &ar, &e) == SMELT_OK);
            arena_reset(&ar);
            for (int i = 0; i < NB; i++) {
                T_CHECKF(memcmp(y[i], y1[i], sizeof(float) * (size_t)(rows[i] * n[i])) == 0,
                         "product %d (%s%s) on %s, %d threads: repacked batch != alone", i,
                         qtype_name(type[i]), rws[i] ? ", repacked" : "",
                         cpu_isa_name((enum cpu_isa)isa), nt);
                cpu_rweight_free(rws[i]);
            }
        }
        struct cpu_mm bad[2] = {mm[0], mm[1]};
        bad[1].k = 100; /* not a multiple of Q8_0's 32 */
        T_EQ_INT(cpu_matmul_batch(pool, bad, 2, NULL, &e), SMELT_ERR_INVALID);
        T_CHECKF(strstr(e.msg, "Q8_0") != NULL, "%s", e.msg);
        cpu_pool_free(pool);
    }
    arena_free(&ar);
    for (int i = 0; i < NB; i++) free(w[i]), free(x[i]), free(y[i]), free(y1[i]);
}

static void test_features(void) {
    char buf[256];
    cpu_features_describe(buf, sizeof buf);
    printf("cpu: %s; %s\n", cpu_features_get()->model, buf);
    T_CHECK(cpu_isa_best() <= cpu_isa_supported());
    T_EQ_STR(cpu_isa_name(CPU_ISA_AVX2), "avx2");
#if defined(__x86_64__)
    /* Every x86-64 CI machine this project targets has AVX2. */
    T_CHECK(cpu_isa_supported() >= CPU_ISA_AVX2 || !cpu_features_get()->avx2);
#endif
}

int main(void) {
    T_RUN(test_features);
    T_RUN(test_quantizers_identical);
    T_RUN(test_matmul_errors);
    T_RUN(test_matmul_kernel_types);
    T_RUN(test_kquant_extremes);
    T_RUN(test_matmul_fallback_types);
    T_RUN(test_matmul_large_n);
    T_RUN(test_matmul_batch);
    return t_done();
}
