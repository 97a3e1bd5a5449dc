/* The type table: one row per GGML type id, with geometry and the reference functions.
 * Sizes are the GGML ones (ggml-common.h static_asserts; also gguf-py's GGML_QUANT_SIZES,
 * except Q8_1 where gguf-py still lists an old 40-byte layout: ggml's is 36). */
#include "quant/quant.h"

#include <strings.h>

#include "quant/quant_impl.h"

#define Q(id, nm, bs, ts, fn)                                                                  \
    [id] = {nm, bs, ts, quant_from_##fn, quant_to_##fn}
#define QD(id, nm, bs, ts, fn) [id] = {nm, bs, ts, quant_from_##fn, NULL}
#define QN(id, nm, bs, ts) [id] = {nm, bs, ts, NULL, NULL}

static const struct qtype_info table[QT_COUNT] = {
    Q(QT_F32, "F32", 1, 4, f32),
    Q(QT_F16, "F16", 1, 2, f16),
    Q(QT_Q4_0, "Q4_0", QK4_0, sizeof(struct block_q4_0), q4_0),
    Q(QT_Q4_1, "Q4_1", QK4_1, sizeof(struct block_q4_1), q4_1),
    Q(QT_Q5_0, "Q5_0", QK5_0, sizeof(struct block_q5_0), q5_0),
    Q(QT_Q5_1, "Q5_1", QK5_1, sizeof(struct block_q5_1), q5_1),
    Q(QT_Q8_0, "Q8_0", QK8_0, sizeof(struct block_q8_0), q8_0),
    Q(QT_Q8_1, "Q8_1", QK8_1, sizeof(struct block_q8_1), q8_1),
    Q(QT_Q2_K, "Q2_K", QK_K, sizeof(struct block_q2_K), q2_K),
    Q(QT_Q3_K, "Q3_K", QK_K, sizeof(struct block_q3_K), q3_K),
    Q(QT_Q4_K, "Q4_K", QK_K, sizeof(struct block_q4_K), q4_K),
    Q(QT_Q5_K, "Q5_K", QK_K, sizeof(struct block_q5_K), q5_K),
    Q(QT_Q6_K, "Q6_K", QK_K, sizeof(struct block_q6_K), q6_K),
    Q(QT_Q8_K, "Q8_K", QK_K, sizeof(struct block_q8_K), q8_K),
    QD(QT_IQ2_XXS, "IQ2_XXS", QK_K, sizeof(struct block_iq2_xxs), iq2_xxs),
    QD(QT_IQ2_XS, "IQ2_XS", QK_K, sizeof(struct block_iq2_xs), iq2_xs),
    QD(QT_IQ3_XXS, "IQ3_XXS", QK_K, sizeof(struct block_iq3_xxs), iq3_xxs),
    QD(QT_IQ1_S, "IQ1_S", QK_K, sizeof(struct block_iq1_s), iq1_s),
    Q(QT_IQ4_NL, "IQ4_NL", QK4_NL, sizeof(struct block_iq4_nl), iq4_nl),
    QD(QT_IQ3_S, "IQ3_S", QK_K, sizeof(struct block_iq3_s), iq3_s),
    QD(QT_IQ2_S, "IQ2_S", QK_K, sizeof(struct block_iq2_s), iq2_s),
    Q(QT_IQ4_XS, "IQ4_XS", QK_K, sizeof(struct block_iq4_xs), iq4_xs),
    QN(QT_I8, "I8", 1, 1),
    QN(QT_I16, "I16", 1, 2),
    QN(QT_I32, "I32", 1, 4),
    QN(QT_I64, "I64", 1, 8),
    QN(QT_F64, "F64", 1, 8),
    QD(QT_IQ1_M, "IQ1_M", QK_K, sizeof(struct block_iq1_m), iq1_m),
    Q(QT_BF16, "BF16", 1, 2, bf16),
    Q(QT_TQ1_0, "TQ1_0", QK_K, sizeof(struct block_tq1_0), tq1_0),
    Q(QT_TQ2_0, "TQ2_0", QK_K, sizeof(struct block_tq2_0), tq2_0),
    Q(QT_MXFP4, "MXFP4", QK_MXFP4, sizeof(struct block_mxfp4), mxfp4),
    Q(QT_NVFP4, "NVFP4", QK_NVFP4, sizeof(struct block_nvfp4), nvfp4),
    Q(QT_Q1_0, "Q1_0", QK1_0, sizeof(struct block_q1_0), q1_0),
};

const struct qtype_info *qtype_get(uint32_t type) {
    if (type >= QT_COUNT || !table[type].name) return NULL;
    return &table[type];
}

const char *qtype_name(uint32_t type) {
    const struct qtype_info *t = qtype_get(type);
    return t ? t->name : "?";
}

bool qtype_from_name(const char *name, enum qtype *out) {
    if (!name) return false;
    for (uint32_t i = 0; i < QT_COUNT; i++) {
        if (table[i].name && !strcasecmp(table[i].name, name)) {
            *out = (enum qtype)i;
            return true;
        }
    }
    return false;
}

uint64_t qtype_row_size(uint32_t type, int64_t ne0) {
    const struct qtype_info *t = qtype_get(type);
    if (!t || ne0 < 0 || ne0 % t->blck_size) return 0;
    uint64_t nb = (uint64_t)ne0 / t->blck_size, r;
    if (__builtin_mul_overflow(nb, (uint64_t)t->type_size, &r)) return 0;
    return r;
}
