/* Type-id table of the GGML block formats (names and block geometry only).
 *
 * Written by the GGUF helper so the reader can validate tensor types before the quant
 * layer lands; the quant layer owns this file and fills in dequantize/quantize.
 * Geometry follows ggml's block structs (Q8_1 is 36 bytes: half2 ds + 32 int8; gguf-py
 * 0.19 still says 40, from an older layout; no file stores Q8_1 anyway).
 */
#include "quant/quant.h"

#include <stddef.h>
#include <strings.h>

static const struct qtype_info table[QT_COUNT] = {
    [QT_F32] = {"F32", 1, 4, NULL, NULL},
    [QT_F16] = {"F16", 1, 2, NULL, NULL},
    [QT_Q4_0] = {"Q4_0", 32, 18, NULL, NULL},
    [QT_Q4_1] = {"Q4_1", 32, 20, NULL, NULL},
    [QT_Q5_0] = {"Q5_0", 32, 22, NULL, NULL},
    [QT_Q5_1] = {"Q5_1", 32, 24, NULL, NULL},
    [QT_Q8_0] = {"Q8_0", 32, 34, NULL, NULL},
    [QT_Q8_1] = {"Q8_1", 32, 36, NULL, NULL},
    [QT_Q2_K] = {"Q2_K", 256, 84, NULL, NULL},
    [QT_Q3_K] = {"Q3_K", 256, 110, NULL, NULL},
    [QT_Q4_K] = {"Q4_K", 256, 144, NULL, NULL},
    [QT_Q5_K] = {"Q5_K", 256, 176, NULL, NULL},
    [QT_Q6_K] = {"Q6_K", 256, 210, NULL, NULL},
    [QT_Q8_K] = {"Q8_K", 256, 292, NULL, NULL},
    [QT_IQ2_XXS] = {"IQ2_XXS", 256, 66, NULL, NULL},
    [QT_IQ2_XS] = {"IQ2_XS", 256, 74, NULL, NULL},
    [QT_IQ3_XXS] = {"IQ3_XXS", 256, 98, NULL, NULL},
    [QT_IQ1_S] = {"IQ1_S", 256, 50, NULL, NULL},
    [QT_IQ4_NL] = {"IQ4_NL", 32, 18, NULL, NULL},
    [QT_IQ3_S] = {"IQ3_S", 256, 110, NULL, NULL},
    [QT_IQ2_S] = {"IQ2_S", 256, 82, NULL, NULL},
    [QT_IQ4_XS] = {"IQ4_XS", 256, 136, NULL, NULL},
    [QT_I8] = {"I8", 1, 1, NULL, NULL},
    [QT_I16] = {"I16", 1, 2, NULL, NULL},
    [QT_I32] = {"I32", 1, 4, NULL, NULL},
    [QT_I64] = {"I64", 1, 8, NULL, NULL},
    [QT_F64] = {"F64", 1, 8, NULL, NULL},
    [QT_IQ1_M] = {"IQ1_M", 256, 56, NULL, NULL},
    [QT_BF16] = {"BF16", 1, 2, NULL, NULL},
    [QT_TQ1_0] = {"TQ1_0", 256, 54, NULL, NULL},
    [QT_TQ2_0] = {"TQ2_0", 256, 66, NULL, NULL},
    [QT_MXFP4] = {"MXFP4", 32, 17, NULL, NULL},
};

const struct qtype_info *qtype_get(uint32_t type) {
    if (type >= QT_COUNT || !table[type].name) return NULL;
    return &table[type];
}

const char *qtype_name(uint32_t type) {
    const struct qtype_info *q = qtype_get(type);
    return q ? q->name : "?";
}

bool qtype_from_name(const char *name, enum qtype *out) {
    if (!name) return false;
    for (uint32_t t = 0; t < QT_COUNT; t++) {
        if (table[t].name && !strcasecmp(table[t].name, name)) {
            *out = (enum qtype)t;
            return true;
        }
    }
    return false;
}

uint64_t qtype_row_size(uint32_t type, int64_t ne0) {
    const struct qtype_info *q = qtype_get(type);
    if (!q || ne0 < 0 || ne0 % q->blck_size) return 0;
    return (uint64_t)(ne0 / q->blck_size) * q->type_size;
}
