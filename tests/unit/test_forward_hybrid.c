/* The hybrid forwards on the CPU (Gated DeltaNet + gated attention, recurrent state
 * slots) against transformers' logits (tests/data/ref-hybrid, made by
 * scripts/make-hybrid-fixtures.py from Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM and
 * Qwen3NextForCausalLM): every file of the manifest (qwen35: F32 and F16, the layer pattern
 * given by full_attention_interval in one, attention.recurrent_layers in the other;
 * qwen35moe: F16; qwen3next: F16 as today's converter writes it and as older files pack
 * the projections, ssm_in) through the scenarios of hybrid_check.h (a long prefill,
 * prefill then decode, a batch, a prefix-cache hit, preemption, a rollback), within 1e-4
 * of transformers, and a batch's rows equal, bit for bit, each prompt run alone (batch
 * invariance: for the MoE models, a row's experts do not depend on the rows beside it).
 * Bad files are refused naming the tensor, and a backend without a feature the MoE
 * variants need refuses them naming it. test_cuda_forward runs the same scenarios on the
 * GPU. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "hybrid_check.h"
#include "model/model.h"
#include "ref_util.h"
#include "t.h"

static struct backend *bk;
static json_t *manifest;

/* On the CPU: within 1e-4 of transformers, a batch bit for bit. */
static void check_file(const char *name, const char *variant) {
    const struct hy_opts o = {bk, manifest, QT_F32, {1e-4, 1e-4}, {0, 0}, false};
    hy_check_file(&o, name, variant);
}

static void test_qwen35(void) {
    check_file("qwen35", "f32");
    check_file("qwen35", "f16");
}
static void test_qwen35moe(void) {
    check_file("qwen35moe", "f16");
}
static void test_qwen3next(void) {
    check_file("qwen3next", "f16");
    check_file("qwen3next", "f16-ssm_in");
}

#define DROP UINT32_MAX

/* The key/value pairs of f into w, but the key `drop` (NULL: none). */
static void copy_kvs(struct gguf_writer *w, const struct gguf_file *f, const char *drop) {
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        char name[128];
        gguf_str_copy(kv->key, name, sizeof name);
        if (!(drop && !strcmp(name, drop))) gguf_set_value(w, name, &kv->val);
    }
}

/* w written to a temporary file (w is freed) and loaded: the load must fail with want_st
 * (SMELT_OK: any error) and an error containing want. */
static void expect_written_refused(struct gguf_writer *w, smelt_status want_st, const char *want) {
    struct err e;
    struct gguf_file *g = NULL;
    struct model *m = NULL;
    char tmp[] = "/tmp/smelt-hybrid-XXXXXX";
    int fd = mkstemp(tmp);
    T_CHECK(fd >= 0);
    close(fd);
    T_CHECK(gguf_writer_write(w, tmp, NULL, NULL, &e) == SMELT_OK);
    gguf_writer_free(w);
    T_CHECK(gguf_open(&g, tmp, &e) == SMELT_OK);
    smelt_status st = g ? model_load(&m, g, bk, &e) : SMELT_ERR_IO;
    T_CHECKF(st != SMELT_OK && (want_st == SMELT_OK || st == want_st) && strstr(e.msg, want),
             "want '%s', got: %s", want, st == SMELT_OK ? "loaded" : e.msg);
    model_free(m);
    gguf_close(g);
    unlink(tmp);
}

/* Fixture `file` rewritten with one key set (a u32, a u32 array of n_arr entries when
 * n_arr > 0, or left out when val is DROP) and one tensor left out; loaded; the error
 * must contain want. */
static void expect_refused(const char *file, const char *key, uint32_t val, int n_arr,
                           const char *skip, const char *want) {
    struct err e;
    struct gguf_file *f = NULL;
    struct gguf_writer *w = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REF_DIR, file);
    T_CHECK(gguf_open(&f, path, &e) == SMELT_OK);
    T_CHECK(gguf_writer_new(&w, &e) == SMELT_OK);
    copy_kvs(w, f, key && val == DROP ? key : NULL);
    if (key && val == DROP) {
    } else if (key && n_arr > 0) {
        uint8_t flags[64] = {0};
        gguf_set_arr(w, key, GGUF_T_BOOL, flags, (uint64_t)n_arr);
    } else if (key) {
        gguf_set_u32(w, key, val);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        gguf_str_copy(t->name, name, sizeof name);
        if (skip && !strcmp(name, skip)) continue;
        gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    expect_written_refused(w, SMELT_OK, want);
    gguf_close(f);
}

/* The MoE fixture with every layer's ffn_gate_exps and ffn_up_exps fused into one
 * ffn_gate_up_exps (n_embd, 2 n_ff_exp, n_expert: per expert the gate rows, then the up
 * rows), as llama.cpp's converter writes it with --fuse-gate-up-exps: refused, naming it. */
static void test_fused_gate_up_refused(void) {
    struct err e;
    struct gguf_file *f = NULL;
    struct gguf_writer *w = NULL;
    T_CHECK(gguf_open(&f, REF_DIR "/qwen35moe-f16.gguf", &e) == SMELT_OK);
    T_CHECK(gguf_writer_new(&w, &e) == SMELT_OK);
    copy_kvs(w, f, NULL);
    void *bufs[64];
    int n_bufs = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128], up[128];
        int il;
        gguf_str_copy(t->name, name, sizeof name);
        if (strstr(name, ".ffn_up_exps.weight")) continue;
        if (!strstr(name, ".ffn_gate_exps.weight") || sscanf(name, "blk.%d.", &il) != 1) {
            gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
            continue;
        }
        snprintf(up, sizeof up, "blk.%d.ffn_up_exps.weight", il);
        const struct gguf_tensor *u = gguf_find_tensor(f, up);
        T_CHECK(u && u->nbytes == t->nbytes && n_bufs < 64);
        const size_t per = (size_t)(t->nbytes / (uint64_t)t->ne[2]);
        char *buf = malloc(2 * (size_t)t->nbytes);
        for (int64_t x = 0; x < t->ne[2]; x++) {
            memcpy(buf + (size_t)(2 * x) * per, (const char *)t->data + (size_t)x * per, per);
            memcpy(buf + (size_t)(2 * x + 1) * per, (const char *)u->data + (size_t)x * per, per);
        }
        bufs[n_bufs++] = buf;
        const int64_t ne[4] = {t->ne[0], 2 * t->ne[1], t->ne[2], 1};
        snprintf(name, sizeof name, "blk.%d.ffn_gate_up_exps.weight", il);
        gguf_add_tensor(w, name, t->type, 3, ne, buf);
    }
    expect_written_refused(w, SMELT_ERR_UNSUPPORTED,
                           "tensor blk.0.ffn_gate_up_exps.weight: fused expert gate and up");
    for (int i = 0; i < n_bufs; i++) free(bufs[i]);
    gguf_close(f);
}

static void test_bad_files(void) {
    const char *Q35 = "qwen35-f32.gguf", *MOE = "qwen35moe-f16.gguf", *NXT = "qwen3next-f16.gguf";
    /* recurrent tensors that disagree with the ssm_* hyper-parameters */
    expect_refused(Q35, "qwen35.ssm.state_size", 8, 0, NULL,
                   "tensor blk.0.attn_qkv.weight: shape");
    expect_refused(Q35, "qwen35.ssm.conv_kernel", 3, 0, NULL,
                   "tensor blk.0.ssm_conv1d.weight: shape");
    expect_refused(Q35, "qwen35.ssm.inner_size", 48, 0, NULL, "tensor blk.0.attn_qkv.weight: shape");
    expect_refused(Q35, "qwen35.ssm.time_step_rank", 3, 0, NULL, "group_count 2 must divide");
    expect_refused(Q35, NULL, 0, 0, "blk.4.ssm_a", "tensor blk.4.ssm_a is missing");
    /* layer patterns that disagree with the file */
    expect_refused(Q35, "qwen35.full_attention_interval", 2, 0, NULL,
                   "layer 1 is full attention by the layer pattern, but tensor blk.1.ssm_a");
    expect_refused(Q35, "qwen35.full_attention_interval", 9, 0, NULL, "full_attention_interval: 9");
    expect_refused(Q35, "qwen35.attention.recurrent_layers", 0, 5, NULL,
                   "recurrent_layers has 5 entries, the model 7 layers");
    expect_refused(Q35, "qwen35.nextn_predict_layers", 0, 0, "blk.6.nextn.eh_proj.weight",
                   "layer 6 is recurrent by the layer pattern, but tensor blk.6.attn_k.weight");
    /* the MoE variants: the shared expert is required, whole and of the keys' width */
    expect_refused(MOE, NULL, 0, 0, "blk.1.ffn_up_shexp.weight",
                   "tensor blk.1.ffn_up_shexp.weight is missing");
    expect_refused(MOE, NULL, 0, 0, "blk.6.ffn_gate_inp_shexp.weight",
                   "qwen35moe: tensor blk.6.ffn_gate_inp_shexp.weight is missing");
    expect_refused(MOE, "qwen35moe.expert_shared_feed_forward_length", 20, 0, NULL,
                   "tensor blk.0.ffn_gate_shexp.weight: shape (64, 24), but the "
                   "hyper-parameters say (64, 20)");
    expect_refused(MOE, "qwen35moe.expert_shared_feed_forward_length", DROP, 0, NULL,
                   "qwen35moe.expert_shared_feed_forward_length is absent and "
                   "qwen35moe.feed_forward_length is 0");
    expect_refused(MOE, "qwen35moe.expert_feed_forward_length", DROP, 0, NULL,
                   "qwen35moe.expert_feed_forward_length is absent");
    expect_refused(MOE, "qwen35moe.expert_count", 17, 0, NULL,
                   "tensor blk.0.ffn_gate_inp.weight: shape (64, 16), but the hyper-parameters "
                   "say (64, 17)");
    /* qwen3next's packed projections */
    expect_refused(NXT, NULL, 0, 0, "blk.3.ssm_ba.weight", "tensor blk.3.ssm_ba.weight is missing");
    /* a backend with the recurrent and MoE ops but without the per-row GLU gate */
    const struct backend_ops *ops = bk->ops;
    struct backend_ops no_gate = *ops;
    no_gate.name = "test";
    no_gate.features &= ~(uint32_t)BK_FEAT_GLU_ROW_GATE;
    bk->ops = &no_gate;
    expect_refused(MOE, NULL, 0, 0, NULL,
                   "qwen35moe needs a per-row GLU gate (shared experts), which the test backend");
    expect_refused(NXT, NULL, 0, 0, NULL, "qwen3next needs a per-row GLU gate");
    bk->ops = ops;
    expect_refused("qwen3next-f16-ssm_in.gguf", "qwen3next.ssm.inner_size", 48, 0, NULL,
                   "tensor blk.0.ssm_in.weight: shape (64, 192), but the hyper-parameters say "
                   "(64, 160)");
}

/* Batches a recurrent model refuses: rows of a sequence split, a position that does not
 * continue its slot's state, one slot for two sequences, a snapshot outside the rows. */
static void test_bad_batch(void) {
    struct err e;
    struct gguf_file *f = NULL;
    struct model *m = NULL;
    struct kv_store *kv = NULL;
    T_CHECK(gguf_open(&f, REF_DIR "/qwen35-f32.gguf", &e) == SMELT_OK);
    T_CHECK(model_load(&m, f, bk, &e) == SMELT_OK);
    T_CHECK(model_kv_new(m, QT_F32, BS, 4, 0, &kv, &e) == SMELT_ERR_INVALID);
    T_CHECK(model_kv_new(m, QT_F32, BS, 4, 4, &kv, &e) == SMELT_OK);
    int32_t blocks[2][1] = {{0}, {1}}, tok[4] = {5, 6, 7, 8}, pos[4] = {0, 0, 1, 2},
            seq[4] = {0, 1, 0, 1};
    struct batch_seq v[2] = {{.blocks = blocks[0], .n_blocks = 1, .slot = 0},
                             {.blocks = blocks[1], .n_blocks = 1, .slot = 1}};
    struct batch b = {4, tok, pos, seq, NULL, 2, v};
    T_CHECK(model_forward(m, kv, &b, NULL, NULL, &e) == SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "batch row 2: sequence 0's rows are not contiguous") != NULL);
    int32_t pos2[2] = {3, 4}, seq2[2] = {0, 0};
    struct batch b2 = {2, tok, pos2, seq2, NULL, 1, v};
    T_CHECK(model_forward(m, kv, &b2, NULL, NULL, &e) == SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "position 3 does not continue state slot 0") != NULL);
    int32_t pos3[2] = {0, 0}, seq3[2] = {0, 1};
    v[1].slot = 0;
    struct batch b3 = {2, tok, pos3, seq3, NULL, 2, v};
    T_CHECK(model_forward(m, kv, &b3, NULL, NULL, &e) == SMELT_ERR_RANGE);
    v[1].slot = 1;
    v[0].snap_slot = 2;
    v[0].snap_pos = 5;
    T_CHECK(model_forward(m, kv, &b3, NULL, NULL, &e) == SMELT_ERR_RANGE);
    T_CHECK(strstr(e.msg, "snapshot at position 5 is outside its rows [0, 1]") != NULL);
    v[0].snap_pos = 1; /* fine now, and slot 0 then covers [0, 1), slot 2 too */
    T_CHECK(model_forward(m, kv, &b3, NULL, NULL, &e) == SMELT_OK);
    T_EQ_INT(kv->slot_pos[0], 1);
    T_EQ_INT(kv->slot_pos[2], 1);
    model_kv_free(m, kv);
    model_free(m);
    gguf_close(f);
}

int main(void) {
    json_error_t je;
    manifest = json_load_file(REF_DIR "/manifest.json", 0, &je);
    struct err e;
    if (cpu_backend_new(&bk, 0, &e) != SMELT_OK) return 1;
    if (!manifest) {
        printf("SKIP: %s/manifest.json absent\n", REF_DIR);
        bk_free(bk);
        return 77;
    }
    T_RUN(test_qwen35);
    T_RUN(test_qwen35moe);
    T_RUN(test_qwen3next);
    T_RUN(test_bad_files);
    T_RUN(test_fused_gate_up_refused);
    T_RUN(test_bad_batch);
    json_decref(manifest);
    bk_free(bk);
    return t_done();
}
