/* Unit tests of the type table and the reference (de)quantizers. The bit-exact checks
 * against gguf-py live in tests/py/test_quant_ref.py; these check the table, hand-made
 * blocks, and round-trip error on Gaussian data with the C harness alone. */
#include <math.h>
#include <stdint.h>

#include "quant/blocks.h"
#include "quant/mix.h"
#include "quant/quant.h"
#include "quant/quant_impl.h"
#include "t.h"
#include "util/half.h"

static void test_table(void) {
    int known = 0;
    for (uint32_t t = 0; t < QT_COUNT + 10; t++) {
        const struct qtype_info *q = qtype_get(t);
        if (!q) continue;
        known++;
        T_CHECK(q->blck_size >= 1 && q->type_size >= 1);
        enum qtype back;
        T_CHECK(qtype_from_name(q->name, &back) && back == (enum qtype)t);
        T_EQ_STR(qtype_name(t), q->name);
        T_EQ_INT(qtype_row_size(t, (int64_t)q->blck_size * 3), q->type_size * 3);
        if (q->blck_size > 1) T_EQ_INT(qtype_row_size(t, q->blck_size + 1), 0);
    }
    T_EQ_INT(known, 34);
    uint32_t removed[] = {4, 5, 31, 32, 33, 36, 37, 38, QT_COUNT};
    for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++) {
        T_CHECK(qtype_get(removed[i]) == NULL);
        T_EQ_STR(qtype_name(removed[i]), "?");
    }
    enum qtype t;
    T_CHECK(qtype_from_name("q4_k", &t) && t == QT_Q4_K);
    T_CHECK(qtype_from_name("bf16", &t) && t == QT_BF16);
    T_CHECK(!qtype_from_name("Q4_K_M", &t));
    T_CHECK(!qtype_from_name(NULL, &t));
    T_EQ_INT(qtype_get(QT_Q4_K)->type_size, sizeof(struct block_q4_K));
    T_EQ_INT(qtype_get(QT_Q8_1)->type_size, 36);
    T_EQ_INT(qtype_row_size(QT_Q4_K, 4096), 4096 / 256 * 144);
    T_EQ_INT(qtype_row_size(QT_F32, INT64_MAX), 0); /* overflow */
    T_EQ_INT(qtype_row_size(QT_F16, -32), 0);
    /* Codebook types dequantize but do not quantize. */
    T_CHECK(qtype_get(QT_IQ2_XXS)->dequantize && !qtype_get(QT_IQ2_XXS)->quantize);
    T_CHECK(qtype_get(QT_I32)->dequantize == NULL);
}

/* A Q4_0 block built by hand: d = 0.5, nibbles 0..15 then 15..0. */
static void test_q4_0_by_hand(void) {
    struct block_q4_0 b;
    b.d = f32_to_f16(0.5f);
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    qtype_get(QT_Q4_0)->dequantize(&b, y, 32);
    for (int j = 0; j < 16; j++) {
        T_CHECK(y[j] == 0.5f * (float)(j - 8));
        T_CHECK(y[j + 16] == 0.5f * (float)(7 - j));
    }
}

/* Q4_K element order: sub-block k uses the nibble (k%2) of bytes 32*(k/2)... */
static void test_q4_K_layout(void) {
    struct block_q4_K b;
    memset(&b, 0, sizeof b);
    b.d = f32_to_f16(1.0f);
    b.dmin = f32_to_f16(0.0f);
    /* scales sc[k] = k + 1 (6-bit packing as documented in blocks.h) */
    for (int k = 0; k < 4; k++) b.scales[k] = (uint8_t)(k + 1);
    for (int k = 4; k < 8; k++) b.scales[k + 4] = (uint8_t)((k + 1) & 15);
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) b.qs[32 * p + l] = (uint8_t)(1 | 2 << 4);
    float y[256];
    qtype_get(QT_Q4_K)->dequantize(&b, y, 256);
    for (int k = 0; k < 8; k++)
        for (int l = 0; l < 32; l++) T_CHECK(y[32 * k + l] == (float)((k + 1) * (k % 2 ? 2 : 1)));
}

static double rel_rmse(enum qtype t, const float *x, int64_t n, float *y, void *buf) {
    const struct qtype_info *q = qtype_get(t);
    q->quantize(x, buf, n);
    q->dequantize(buf, y, n);
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += (double)(y[i] - x[i]) * (y[i] - x[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

static void test_round_trip(void) {
    enum { N = 256 * 64 };
    static float x[N], y[N];
    static uint8_t buf[N * 4];
    unsigned long long seed = 42;
    for (int i = 0; i < N; i++) x[i] = t_randn(&seed);
    struct {
        enum qtype t;
        double bound;
    } cases[] = {
        {QT_F32, 0},        {QT_F16, 1e-3},     {QT_BF16, 5e-3},    {QT_Q4_0, 0.12},
        {QT_Q4_1, 0.11},    {QT_Q5_0, 0.06},    {QT_Q5_1, 0.05},    {QT_Q8_0, 0.01},
        {QT_Q8_1, 0.01},    {QT_Q2_K, 0.35},    {QT_Q3_K, 0.18},    {QT_Q4_K, 0.08},
        {QT_Q5_K, 0.04},    {QT_Q6_K, 0.02},    {QT_Q8_K, 0.01},    {QT_IQ4_NL, 0.085},
        {QT_IQ4_XS, 0.085}, {QT_TQ1_0, 0.85},   {QT_TQ2_0, 0.85},   {QT_MXFP4, 0.15},
        {QT_NVFP4, 0.11},   {QT_Q1_0, 0.65},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double r = rel_rmse(cases[c].t, x, N, y, buf);
        T_CHECKF(r <= cases[c].bound, "%s: relative RMSE %.5f > %.5f", qtype_name(cases[c].t), r,
                 cases[c].bound);
        /* all-zero input decodes to zeros */
        static float z[N];
        qtype_get(cases[c].t)->quantize(z, buf, 1024);
        qtype_get(cases[c].t)->dequantize(buf, y, 1024);
        for (int i = 0; i < 1024; i++) T_CHECK(y[i] == 0.0f);
    }
}

/* Non-finite input must not crash (UBSan build checks for undefined behaviour too). */
static void test_nonfinite_input(void) {
    static float x[1024], y[1024];
    static uint8_t buf[1024 * 4];
    for (int i = 0; i < 1024; i++) x[i] = (float)(i % 7) - 3.0f;
    x[3] = NAN;
    x[300] = INFINITY;
    x[700] = -INFINITY;
    x[900] = 1e38f;
    for (uint32_t t = 0; t < QT_COUNT; t++) {
        const struct qtype_info *q = qtype_get(t);
        if (!q || !q->quantize) continue;
        q->quantize(x, buf, 1024);
        q->dequantize(buf, y, 1024);
    }
    T_CHECK(1);
}

/* The vectorized K-quant fits must give the scalar (ggml-order) bytes exactly. */
static void test_k_vector_equals_scalar(void) {
    enum { ROWS = 48, N = 256 * 4 };
    static float x[ROWS][N];
    static uint8_t a[N * 2], b[N * 2];
    unsigned long long seed = 7;
    for (int r = 0; r < ROWS; r++) {
        const float sc = powf(10.f, (float)(r % 9) - 6.f);
        for (int i = 0; i < N; i++) {
            float v = t_randn(&seed) * sc;
            switch (r % 8) {
            case 1: v = (i % 64 < 32) ? 0.f : v; break;          /* zero sub-blocks */
            case 2: v = -0.5f * sc; break;                       /* flat negative */
            case 3: v = (float)((i % 7) - 3) * 0.25f; break;     /* ties */
            case 4: v = (i % 32 == 5) ? 100.f * sc : v * 0.01f; break; /* outliers */
            case 5: v = fabsf(v); break;                          /* all positive */
            case 6: v = (i % 16 == 0) ? v : 0.f; break;           /* sparse */
            default: break;
            }
            x[r][i] = v;
        }
    }
    x[7][3] = NAN;
    x[15][300] = INFINITY;
    struct {
        const char *name;
        void (*vec)(const float *, void *, int64_t);
        void (*ref)(const float *, void *, int64_t);
        size_t bs;
    } fns[] = {
        {"Q2_K", quant_to_q2_K, quant_to_q2_K_scalar, sizeof(struct block_q2_K)},
        {"Q4_K", quant_to_q4_K, quant_to_q4_K_scalar, sizeof(struct block_q4_K)},
        {"Q5_K", quant_to_q5_K, quant_to_q5_K_scalar, sizeof(struct block_q5_K)},
        {"Q6_K", quant_to_q6_K, quant_to_q6_K_scalar, sizeof(struct block_q6_K)},
    };
    for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
        for (int r = 0; r < ROWS; r++) {
            fns[f].vec(x[r], a, N);
            fns[f].ref(x[r], b, N);
            T_CHECKF(!memcmp(a, b, N / 256 * fns[f].bs), "%s row %d differs", fns[f].name, r);
        }
    }
}

static void test_mix_names(void) {
    struct quant_mix m;
    struct err e = {0};
    T_EQ_INT(quant_mix_find("q4_k_m", &m, &e), SMELT_OK);
    T_EQ_STR(m.name, "Q4_K_M");
    T_EQ_INT(m.ftype, 15);
    T_EQ_INT(m.base, QT_Q4_K);
    T_EQ_INT(quant_mix_find("Q5_K", &m, &e), SMELT_OK); /* llama-quantize alias */
    T_EQ_STR(m.name, "Q5_K_M");
    T_EQ_INT(quant_mix_find("Q8_0", &m, &e), SMELT_OK);
    T_EQ_INT(m.ftype, 7);
    T_EQ_INT(quant_mix_find("IQ3_XXS", &m, &e), SMELT_ERR_UNSUPPORTED);
    T_CHECK(strstr(e.msg, "importance matrix") != NULL);
    T_EQ_INT(quant_mix_find("Q8_1", &m, &e), SMELT_ERR_UNSUPPORTED);
    T_EQ_INT(quant_mix_find("bogus", &m, &e), SMELT_ERR_INVALID);
    T_CHECK(quant_mix_allows("blk.0.attn_q.weight", 2));
    T_CHECK(!quant_mix_allows("blk.0.attn_q.weight", 1));
    T_CHECK(!quant_mix_allows("blk.0.attn_norm.weight", 2));
    T_CHECK(!quant_mix_allows("blk.0.attn_q.bias", 2));
    T_CHECK(!quant_mix_allows("blk.0.ffn_gate_inp.weight", 2));
    T_CHECK(quant_mix_order_cmp("blk.2.x", "blk.10.x") < 0);
    T_CHECK(quant_mix_order_cmp("output.weight", "blk.0.x") < 0);
}

/* Row lengths that do not fit a K-quant block fall back as llama.cpp does. */
static void test_mix_fallback(void) {
    struct quant_mix m;
    struct quant_mix_model model = {.n_layer = 24, .n_head = 14, .n_head_kv = 2};
    struct quant_mix_state st;
    struct err e = {0};
    uint32_t t;
    const char *why;
    quant_mix_find("Q4_K_M", &m, &e);
    quant_mix_model_count(&model, "blk.0.attn_v.weight");
    quant_mix_begin(&st, &m, &model);
    int64_t ne896[2] = {896, 896}, ne4864[2] = {4864, 896}, ne40[2] = {40, 8}, ne4096[2] = {4096, 8};
    T_EQ_INT(quant_mix_next(&st, "token_embd.weight", 2, ne896, QT_F16, &t, &why, &e), SMELT_OK);
    T_EQ_INT(t, QT_Q8_0); /* tied output: 896 % 256 != 0 */
    T_EQ_INT(quant_mix_next(&st, "blk.0.attn_q.weight", 2, ne896, QT_F16, &t, &why, &e), SMELT_OK);
    T_EQ_INT(t, QT_Q5_0);
    T_CHECK(why != NULL);
    T_EQ_INT(quant_mix_next(&st, "blk.0.ffn_down.weight", 2, ne4864, QT_F16, &t, &why, &e), SMELT_OK);
    T_EQ_INT(t, QT_Q6_K); /* layer 0 < 24/8: more bits, and 4864 = 19 * 256 fits */
    T_EQ_INT(quant_mix_next(&st, "blk.0.ffn_up.weight", 2, ne40, QT_F16, &t, &why, &e), SMELT_OK);
    T_EQ_INT(t, QT_F16); /* 40 fits neither Q4_K nor Q5_0 */
    T_EQ_INT(quant_mix_next(&st, "blk.0.attn_norm.weight", 1, ne896, QT_F32, &t, &why, &e), SMELT_OK);
    T_EQ_INT(t, QT_F32);
    quant_mix_find("Q1_0", &m, &e);
    quant_mix_begin(&st, &m, &model);
    T_EQ_INT(quant_mix_next(&st, "blk.0.ffn_up.weight", 2, ne40, QT_F16, &t, &why, &e),
             SMELT_ERR_UNSUPPORTED);
    T_EQ_INT(quant_mix_next(&st, "blk.0.ffn_up.weight", 2, ne4096, QT_F16, &t, &why, &e), SMELT_OK);
    T_EQ_INT(t, QT_Q1_0);
}

int main(void) {
    T_RUN(test_table);
    T_RUN(test_q4_0_by_hand);
    T_RUN(test_q4_K_layout);
    T_RUN(test_round_trip);
    T_RUN(test_nonfinite_input);
    T_RUN(test_k_vector_equals_scalar);
    T_RUN(test_mix_names);
    T_RUN(test_mix_fallback);
    return t_done();
}
