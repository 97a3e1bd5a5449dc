/* The hybrid forwards on the CPU (Gated DeltaNet + gated attention, recurrent state
 * slots) against transformers' logits (tests/data/ref-hybrid, made by
 * scripts/make-hybrid-fixtures.py from Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM and
 * Qwen3NextForCausalLM), driving the memory bookkeeping (engine/kv.h: blocks, state
 * slots, snapshots, prefix cache) as the engine and `smelt run` do. For every file of the
 * manifest (qwen35: F32 and F16, the layer pattern given by full_attention_interval in
 * one, attention.recurrent_layers in the other; qwen35moe: F16; qwen3next: F16 as
 * today's converter writes it and as older files pack the projections, ssm_in):
 *   - a long prefill: the 150-token prompt in one step (three 64-token chunks);
 *   - prefill then decode: 75 tokens, then one per step;
 *   - a batch of the three prompts (1, 7, 150 tokens) as three sequences in one step, whose
 *     rows must also equal, bit for bit, each prompt run alone in one step (batch
 *     invariance: for the MoE models, a row's experts do not depend on the rows beside
 *     it);
 *   - a prefix-cache hit: a second sequence takes the first's cached blocks up to its
 *     last snapshot, restores the snapshot and computes only the rest;
 *   - preemption: a sequence decoding token by token is released at 130 and resumed
 *     from the cache (its trailing snapshot at 128);
 *   - a rollback: 10 wrong tokens at 120..129 are rolled back to 120 (the state comes
 *     from the snapshot at 112, positions 112..119 are fed again), then the right ones.
 * Every logits row must have the same argmax as transformers' and a max relative error
 * (max |d logit| / max |logit|) under 1e-4. Bad files are refused naming the tensor, and
 * a backend without a feature the MoE variants need refuses them naming it. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "model/model.h"
#include "ref_util.h"
#include "t.h"

#define REF_DIR SMELT_SOURCE_DIR "/tests/data/ref-hybrid"
#define TOL 1e-4
#define BS 16
#define NB 64
#define SLOTS 12

static struct backend *bk;
static json_t *manifest;

struct prompt {
    int32_t *ids;
    int n;
    float *ref; /* (n, n_vocab) */
};

struct fx {
    struct gguf_file *f;
    struct model *m;
    struct kv_store *kv;
    struct kv_pool pool;
    int nv;
    struct prompt p[3];
    float *solo[3]; /* each prompt's logits alone in one step */
    double worst, batch_diff;
    int flips;
    const char *name, *label;
};

/* Rows got[0..count) against prompt pi's reference rows from position p0. */
static void compare(struct fx *x, int pi, int p0, int count, const float *got) {
    const struct prompt *pr = &x->p[pi];
    double max_ref = 0;
    for (size_t i = 0; i < (size_t)pr->n * x->nv; i++)
        if (fabs(pr->ref[i]) > max_ref) max_ref = fabs(pr->ref[i]);
    for (int t = 0; t < count; t++) {
        const float *a = got + (size_t)t * x->nv, *r = pr->ref + (size_t)(p0 + t) * x->nv;
        double d = 0;
        for (int i = 0; i < x->nv; i++)
            if (fabs((double)a[i] - r[i]) > d) d = fabs((double)a[i] - r[i]);
        if (d / max_ref > x->worst) x->worst = d / max_ref;
        T_CHECKF(d / max_ref < TOL, "%s %s: prompt %d position %d: rel err %g", x->name, x->label,
                 pi, p0 + t, d / max_ref);
        if (ref_argmax(a, x->nv) != ref_argmax(r, x->nv)) x->flips++;
    }
}

/* Feeds prompt pi's positions [p0, p1) of sequence q in one step (snapshotting the last
 * block boundary as kv_seq_step decides; `ids` overrides the tokens when not NULL), and
 * compares the logits with the reference unless ids is given; keep (may be NULL) gets
 * them. */
static bool feed_keep(struct fx *x, struct kv_seq *q, int pi, int p0, int p1,
                      const int32_t *ids, float *keep) {
    struct err e;
    if (kv_seq_reserve(&x->pool, q, p1, &e) != SMELT_OK) {
        T_CHECKF(0, "reserve: %s", e.msg);
        return false;
    }
    if (q->restore >= 0) {
        T_CHECK(model_state_copy(x->m, x->kv, q->slot, q->restore, &e) == SMELT_OK);
        q->restore = -1;
    }
    int n = p1 - p0;
    int32_t *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4);
    uint8_t *want = malloc((size_t)n);
    float *out = malloc((size_t)n * x->nv * sizeof(float));
    for (int i = 0; i < n; i++)
        pos[i] = p0 + i, want[i] = 1;
    struct batch_seq view = kv_seq_step(&x->pool, q, p0, p1, false);
    struct batch b = {n, ids ? ids : x->p[pi].ids + p0, pos, seq, want, 1, &view};
    int32_t n_out = 0;
    bool ok = model_forward(x->m, x->kv, &b, out, &n_out, &e) == SMELT_OK && n_out == n;
    T_CHECKF(ok, "%s %s: forward [%d, %d): %s", x->name, x->label, p0, p1, e.msg);
    if (ok && !ids) compare(x, pi, p0, n, out);
    if (ok && keep) memcpy(keep, out, (size_t)n * x->nv * sizeof(float));
    free(pos);
    free(seq);
    free(want);
    free(out);
    return ok;
}

static bool feed(struct fx *x, struct kv_seq *q, int pi, int p0, int p1, const int32_t *ids) {
    return feed_keep(x, q, pi, p0, p1, ids, NULL);
}

/* Registers q's full blocks of prompt pi in the prefix cache (as the engine does). */
static void register_blocks(struct fx *x, struct kv_seq *q, int pi, int n_done) {
    uint64_t parent = 0;
    for (int b = 0; b < n_done / BS && b < q->n_blocks; b++) {
        const int32_t *t = x->p[pi].ids + b * BS;
        uint64_t h = kv_block_hash(&x->pool, parent, t);
        kv_prefix_register(&x->pool, q->blocks[b], h, parent, t);
        parent = h;
    }
}

static void scenarios(struct fx *x) {
    struct kv_seq q, r;
    int n2 = x->p[2].n;
    /* each prompt alone in one step (the long one: a long prefill), then prefill +
     * decode */
    for (int i = 0; i < 3; i++) {
        kv_seq_init(&q);
        feed_keep(x, &q, i, 0, x->p[i].n, NULL, x->solo[i]);
        kv_seq_release(&x->pool, &q);
    }
    kv_seq_init(&q);
    feed(x, &q, 2, 0, n2 / 2, NULL);
    for (int p = n2 / 2; p < n2; p++)
        feed(x, &q, 2, p, p + 1, NULL);
    kv_seq_release(&x->pool, &q);

    /* a batch of the three prompts */
    {
        struct kv_seq s3[3];
        struct batch_seq views[3];
        int total = 0;
        for (int i = 0; i < 3; i++)
            total += x->p[i].n;
        int32_t *tok = malloc((size_t)total * 4), *pos = malloc((size_t)total * 4),
                *seq = malloc((size_t)total * 4);
        uint8_t *want = malloc((size_t)total);
        float *out = malloc((size_t)total * x->nv * sizeof(float));
        struct err e;
        int r0 = 0;
        for (int i = 0; i < 3; i++) {
            kv_seq_init(&s3[i]);
            T_CHECK(kv_seq_reserve(&x->pool, &s3[i], x->p[i].n, &e) == SMELT_OK);
            views[i] = kv_seq_step(&x->pool, &s3[i], 0, x->p[i].n, true);
            for (int t = 0; t < x->p[i].n; t++, r0++) {
                tok[r0] = x->p[i].ids[t];
                pos[r0] = t;
                seq[r0] = i;
                want[r0] = 1;
            }
        }
        struct batch b = {total, tok, pos, seq, want, 3, views};
        int32_t n_out = 0;
        bool ok = model_forward(x->m, x->kv, &b, out, &n_out, &e) == SMELT_OK && n_out == total;
        T_CHECKF(ok, "%s: batch: %s", x->label, e.msg);
        for (int i = 0, o = 0; ok && i < 3; o += x->p[i].n, i++) {
            const float *got = out + (size_t)o * x->nv;
            compare(x, i, 0, x->p[i].n, got);
            for (size_t j = 0; j < (size_t)x->p[i].n * x->nv; j++) {
                double d = fabs((double)got[j] - x->solo[i][j]);
                if (d > x->batch_diff) x->batch_diff = d;
            }
        }
        for (int i = 0; i < 3; i++)
            kv_seq_release(&x->pool, &s3[i]);
        free(tok);
        free(pos);
        free(seq);
        free(want);
        free(out);
    }

    /* a prefix-cache hit: q computes [0, 100) and [100, 150) (snapshots at 96, then 144);
     * r takes the chain up to 144 and computes only [144, 150) */
    kv_seq_init(&q);
    feed(x, &q, 2, 0, 100, NULL);
    feed(x, &q, 2, 100, n2, NULL);
    register_blocks(x, &q, 2, n2);
    kv_seq_release(&x->pool, &q);
    kv_seq_init(&r);
    uint64_t h[16];
    int got = kv_prefix_acquire(&x->pool, &r, x->p[2].ids, (n2 - 1) / BS, h);
    T_EQ_INT(got, 144 / BS);
    T_CHECK(r.restore >= 0);
    feed(x, &r, 2, got * BS, n2, NULL);
    kv_seq_release(&x->pool, &r);

    /* preemption: decode one token at a time to 130, release (blocks cached), resume from
     * the cache: trailing snapshot at 128 */
    kv_seq_init(&q);
    feed(x, &q, 2, 0, 40, NULL);
    for (int p = 40; p < 130; p++)
        feed(x, &q, 2, p, p + 1, NULL);
    register_blocks(x, &q, 2, 130);
    kv_seq_release(&x->pool, &q);
    kv_seq_init(&q);
    got = kv_prefix_acquire(&x->pool, &q, x->p[2].ids, 130 / BS, h);
    T_EQ_INT(got, 128 / BS);
    feed(x, &q, 2, got * BS, n2, NULL);
    kv_seq_release(&x->pool, &q);

    /* rollback: 10 wrong tokens at 120..129, back to 120 (from the snapshot at 112) */
    kv_seq_init(&q);
    feed(x, &q, 2, 0, 120, NULL);
    int32_t wrong[10];
    for (int i = 0; i < 10; i++)
        wrong[i] = (x->p[2].ids[120 + i] + 1 + i) % x->nv;
    feed(x, &q, 2, 120, 130, wrong);
    int32_t from = -1;
    kv_seq_rollback(&x->pool, &q, 120, &from);
    T_EQ_INT(from, 112);
    T_CHECK(q.restore >= 0);
    feed(x, &q, 2, from, 120, NULL);
    feed(x, &q, 2, 120, 121, NULL);
    feed(x, &q, 2, 121, n2, NULL);
    kv_seq_release(&x->pool, &q);

    struct kv_stats st;
    kv_pool_stats(&x->pool, &st);
    T_EQ_INT(st.live_slots, 0);
    T_CHECK(st.snapshots <= st.n_slots);
}

/* Model `name`'s file `variant` of the manifest through every scenario. */
static void check_file(const char *name, const char *variant) {
    json_t *jm = NULL, *j;
    size_t im;
    json_array_foreach(json_object_get(manifest, "models"), im, j)
        if (!strcmp(json_string_value(json_object_get(j, "name")), name)) jm = j;
    const char *file = json_string_value(
        json_object_get(json_object_get(json_object_get(jm, "files"), variant), "file"));
    if (!file) {
        T_CHECKF(0, "%s %s: not in the manifest", name, variant);
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REF_DIR, file);
    struct fx x = {.name = name, .label = variant};
    struct err e;
    if (gguf_open(&x.f, path, &e) != SMELT_OK || model_load(&x.m, x.f, bk, &e) != SMELT_OK) {
        T_CHECKF(0, "%s: %s", file, e.msg);
        gguf_close(x.f);
        return;
    }
    x.nv = x.m->hp.n_vocab;
    T_CHECK(model_is_recurrent(x.m));
    T_EQ_INT(x.m->hp.n_layer, 6);
    T_CHECK(x.m->mem[2].kind == MEM_KV && x.m->mem[5].kind == MEM_KV);
    T_CHECK(x.m->mem[0].kind == MEM_STATE && x.m->mem[4].kind == MEM_STATE);
    T_EQ_INT(model_kv_block_bytes(x.m, QT_F32, 1), 2 * 2 * 2 * 32 * 4);
    if (strcmp(name, "qwen35")) { /* 16 experts of 16, 4 per token, a shared one of 24 */
        T_EQ_INT(x.m->hp.n_expert, 16);
        T_EQ_INT(x.m->hp.n_expert_used, 4);
        T_EQ_INT(x.m->hp.n_ff_exp, 16);
        T_EQ_INT(x.m->hp.n_ff_shexp, 24);
    }
    T_CHECK(model_kv_new(x.m, QT_F32, BS, NB, SLOTS, &x.kv, &e) == SMELT_OK);
    T_CHECK(kv_pool_init(&x.pool, NB, BS, &e) == SMELT_OK);
    T_CHECK(kv_prefix_enable(&x.pool, &e) == SMELT_OK);
    T_CHECK(kv_slots_enable(&x.pool, SLOTS, 3, &e) == SMELT_OK);
    size_t ip;
    json_t *jp;
    json_array_foreach(json_object_get(jm, "prompts"), ip, jp) {
        json_t *jids = json_object_get(jp, "ids");
        struct prompt *pr = &x.p[ip];
        pr->n = (int)json_array_size(jids);
        pr->ids = malloc((size_t)pr->n * 4);
        for (int i = 0; i < pr->n; i++)
            pr->ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
        pr->ref = ref_read_f32(REF_DIR, json_string_value(json_object_get(jp, "logits")),
                               (size_t)pr->n * x.nv);
        x.solo[ip] = calloc((size_t)pr->n * x.nv, sizeof(float));
        T_CHECK(pr->ref != NULL);
    }
    if (x.p[0].ref && x.p[1].ref && x.p[2].ref) scenarios(&x);
    printf("%-9s %-10s max rel err %.2e, %d argmax flips; batch vs alone: max |d logit| %.2g\n",
           name, variant, x.worst, x.flips, x.batch_diff);
    T_EQ_INT(x.flips, 0);
    /* bitwise: the F32/F16 matmul kernels are row-count invariant, the recurrent ops run
     * each sequence's rows on their own, and a row's experts depend on it alone */
    T_CHECKF(x.batch_diff == 0, "%s %s: a row in a batch differs from it alone by %g", name,
             variant, x.batch_diff);
    for (int i = 0; i < 3; i++)
        free(x.p[i].ids), free(x.p[i].ref), free(x.solo[i]);
    kv_pool_free(&x.pool);
    model_kv_free(x.m, x.kv);
    model_free(x.m);
    gguf_close(x.f);
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

/* Fixture `file` rewritten with one key set (a u32, a u32 array of n_arr entries when
 * n_arr > 0, or left out when val is DROP) and one tensor left out; loaded; the error
 * must contain want. */
static void expect_refused(const char *file, const char *key, uint32_t val, int n_arr,
                           const char *skip, const char *want) {
    struct err e;
    struct gguf_file *f = NULL, *g = NULL;
    struct gguf_writer *w = NULL;
    struct model *m = NULL;
    char tmp[] = "/tmp/smelt-hybrid-XXXXXX";
    int fd = mkstemp(tmp);
    T_CHECK(fd >= 0);
    close(fd);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REF_DIR, file);
    T_CHECK(gguf_open(&f, path, &e) == SMELT_OK);
    T_CHECK(gguf_writer_new(&w, &e) == SMELT_OK);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        char name[128];
        gguf_str_copy(kv->key, name, sizeof name);
        if (!(key && val == DROP && !strcmp(name, key))) gguf_set_value(w, name, &kv->val);
    }
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
    T_CHECK(gguf_writer_write(w, tmp, NULL, NULL, &e) == SMELT_OK);
    gguf_writer_free(w);
    T_CHECK(gguf_open(&g, tmp, &e) == SMELT_OK);
    smelt_status st = g ? model_load(&m, g, bk, &e) : SMELT_ERR_IO;
    T_CHECKF(st != SMELT_OK && strstr(e.msg, want), "want '%s', got: %s", want,
             st == SMELT_OK ? "loaded" : e.msg);
    model_free(m);
    gguf_close(g);
    gguf_close(f);
    unlink(tmp);
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
    expect_refused("qwen3next-f16-ssm_in.gguf", "qwen3next.ssm.inner_size", 64, 0, NULL,
                   "tensor blk.0.ssm_in.weight: shape (64, 256), but the hyper-parameters say "
                   "(64, 192)");
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
    T_RUN(test_bad_batch);
    json_decref(manifest);
    bk_free(bk);
    return t_done();
}
