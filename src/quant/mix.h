/* Quantization mixes: which type each tensor of a model gets when a file is converted
 * to a llama.cpp "file type" such as Q4_K_M.
 *
 * The rules are llama.cpp's (src/llama-quant.cpp: tensor_allows_quantization,
 * llama_tensor_get_type_impl, tensor_type_fallback), implemented from their published
 * behaviour for dense and MoE decoder models without an importance matrix; the subset
 * and the exact rules are listed in docs/quant.md. Pure logic: no I/O, no allocation.
 *
 * Use: quant_mix_find("Q4_K_M"), then quant_mix_begin with the model facts, then call
 * quant_mix_next for every tensor in llama.cpp's order (quant_mix_order_cmp: by layer
 * number, then by name) because some rules count tensors in that order.
 */
#ifndef SMELT_QUANT_MIX_H
#define SMELT_QUANT_MIX_H

#include <stdbool.h>
#include <stdint.h>

#include "quant/quant.h"
#include "util/err.h"

/* llama.cpp's llama_ftype values, written as general.file_type. */
enum quant_ftype {
    QF_ALL_F32 = 0,
    QF_F16 = 1,
    QF_Q4_0 = 2,
    QF_Q4_1 = 3,
    QF_Q8_0 = 7,
    QF_Q5_0 = 8,
    QF_Q5_1 = 9,
    QF_Q2_K = 10,
    QF_Q3_K_S = 11,
    QF_Q3_K_M = 12,
    QF_Q3_K_L = 13,
    QF_Q4_K_S = 14,
    QF_Q4_K_M = 15,
    QF_Q5_K_S = 16,
    QF_Q5_K_M = 17,
    QF_Q6_K = 18,
    QF_IQ4_NL = 25,
    QF_IQ4_XS = 30,
    QF_BF16 = 32,
    QF_TQ1_0 = 36,
    QF_TQ2_0 = 37,
    QF_MXFP4_MOE = 38,
    QF_NVFP4 = 39,
    QF_Q1_0 = 40,
};

struct quant_mix {
    const char *name;      /* canonical name, e.g. "Q4_K_M" */
    enum quant_ftype ftype;
    enum qtype base;       /* the default tensor type */
    bool pure;             /* every quantizable tensor gets `base` (llama-quantize --pure) */
};

/* Finds a mix by name, case-insensitive: the llama-quantize names above, plus its aliases
 * Q3_K, Q4_K, Q5_K (= the _M mixes) and MXFP4 (= MXFP4_MOE). Fails with a message that
 * lists the accepted names, or says why a known type cannot be a target (activation
 * formats, codebook types without a quantizer). */
smelt_status quant_mix_find(const char *name, struct quant_mix *out, struct err *e);
/* Comma-separated list of the accepted names, for usage text. */
const char *quant_mix_names(void);

/* Model facts the rules use. */
struct quant_mix_model {
    int n_layer;     /* {arch}.block_count */
    int n_head;      /* attention.head_count of layer 0 (0 when unknown) */
    int n_head_kv;   /* attention.head_count_kv of layer 0 (0 when unknown) */
    int n_expert;    /* {arch}.expert_count, 0 for dense */
    bool falcon;     /* general.architecture == "falcon" (its own rules) */
    bool is_70b;     /* llama with 80 layers and GQA (llama.cpp's LLM_TYPE_70B rule) */
    bool has_output; /* an output.weight tensor exists (else the embedding is tied) */
    int n_attn_v;    /* tensors named *attn_v.weight, *attn_qkv.weight, *attn_kv_b.weight */
};

/* Call for every tensor name before quant_mix_begin to fill has_output and n_attn_v. */
void quant_mix_model_count(struct quant_mix_model *m, const char *tensor_name);

struct quant_mix_state {
    struct quant_mix mix;
    struct quant_mix_model model;
    int i_attn_v, i_ffn_down, i_ffn_gate, i_ffn_up;
    int n_fallback;
};

void quant_mix_begin(struct quant_mix_state *s, const struct quant_mix *mix,
                     const struct quant_mix_model *model);

/* Whether llama.cpp would quantize this tensor at all (2-D or more, a *weight that is not
 * a norm, not a router, not one of the small special tensors). */
bool quant_mix_allows(const char *name, uint32_t n_dims);

/* The type for the next tensor (in quant_mix_order_cmp order), n_dims its stored
 * dimensions (trailing dimensions of 1 are not counted, as ggml_n_dims does). cur_type is
 * its type in the input; tensors that are not quantized keep it. *why (may be NULL) gets a short
 * static note when a rule or a fallback changed the type ("attn_v more bits",
 * "row 896 % 256: fallback"), else NULL. Fails (SMELT_ERR_UNSUPPORTED) when the row
 * length fits no type the rules allow. */
smelt_status quant_mix_next(struct quant_mix_state *s, const char *name, uint32_t n_dims,
                            const int64_t *ne, uint32_t cur_type, uint32_t *out_type,
                            const char **why, struct err *e);

/* llama.cpp's tensor order (layer number parsed from "blk.N.", -1 for others, then
 * strcmp); a qsort-style comparator on names. */
int quant_mix_order_cmp(const char *a, const char *b);

#endif
