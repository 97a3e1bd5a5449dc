/* Two CUDA backends in one process (issue 17: no process-wide CUDA state).
 *
 * Two backends, on two GPUs when cuda_device_count() >= 2, else both on GPU 0, each load a
 * model and run the same script of steps: two sequences' prefill chunks (mmq on the
 * quantized model's 9..64-row products, repeated mmv on the F16 one), then decode steps of
 * both sequences (mmv with the decode epilogues, the fused RoPE attention, device sampling
 * summaries; captured as a graph at the second step and replayed after). Each backend's
 * logits and summaries are compared with those of a lone backend on the same GPU running
 * the same script, bitwise: every kernel on these paths is deterministic (fixed summation
 * orders, split partials merged in block order), and SMELT_NO_TUNE=1 keeps the matmul path
 * a function of the shape (measured choices can differ between backends by timing noise).
 *   - interleaved: one thread alternates the two backends step by step;
 *   - concurrent: two threads, one backend each, several rounds of the script at once (the
 *     backends were created and loaded on the main thread, so a thread that drives a
 *     backend on GPU 1 must make it current itself);
 *   - measured paths: SMELT_NO_TUNE unset, two threads again, each backend measuring its
 *     matmul paths while the other runs (its choices may differ from the other's, and
 *     repeated mmv's 8-bit activations from mmq's f16 ones): checked against the lone
 *     static run by cosine >= 0.999 per row, test_cuda_forward's bar against the CPU
 *     (another backend's data would give ~0).
 * Models: a tiny random Llama written here (Q4_K, Q6_K for V, W_down and the output, like
 * Q4_K_M) and the F16 Llama fixture of tests/data/ref. Skips (77) without a GPU. */
#ifndef SMELT_HAVE_CUDA
#include <stdio.h>

int main(void) {
    printf("SKIP test_cuda_multi: built without CUDA (nvcc not found at configure time)\n");
    return 77;
}
#else

#include "t.h"

#include <pthread.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/topk.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "model/model.h"
#include "quant/quant.h"

/* ---- the tiny quantized model ---- */

#define TE 256 /* embedding: one Q4_K super-block per row */
#define TF 512
#define TLAYERS 2
#define TVOCAB 512

struct wlist {
    void *p[64];
    int n;
};

/* Gaussian weights (scale s, offset off) as a tensor of type `type` (F32 for vectors). */
static void tiny_tensor(struct gguf_writer *w, struct wlist *keep, const char *name, uint32_t type, int64_t ne0,
                        int64_t ne1, float s, float off, unsigned long long *seed) {
    float *f = malloc(sizeof(float) * (size_t)(ne0 * ne1));
    for (int64_t i = 0; i < ne0 * ne1; i++) f[i] = off + s * t_randn(seed);
    const int64_t ne[2] = {ne0, ne1};
    if (ne1 == 1) {
        keep->p[keep->n++] = f;
        gguf_add_tensor(w, name, QT_F32, 1, ne, f);
        return;
    }
    void *q = malloc(qtype_row_size(type, ne0) * (size_t)ne1);
    qtype_get(type)->quantize(f, q, ne0 * ne1);
    free(f);
    keep->p[keep->n++] = q;
    gguf_add_tensor(w, name, type, 2, ne, q);
}

static bool write_tiny(const char *path) {
    struct gguf_writer *w;
    struct err e;
    if (gguf_writer_new(&w, &e) != SMELT_OK) return false;
    struct wlist keep = {.n = 0};
    unsigned long long seed = 0x6d756c7469ull;
    gguf_set_str(w, "general.architecture", "llama");
    gguf_set_u32(w, "llama.embedding_length", TE);
    gguf_set_u32(w, "llama.block_count", TLAYERS);
    gguf_set_u32(w, "llama.feed_forward_length", TF);
    gguf_set_u32(w, "llama.context_length", 512);
    gguf_set_u32(w, "llama.attention.head_count", 4);
    gguf_set_u32(w, "llama.attention.head_count_kv", 2);
    gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_set_f32(w, "llama.rope.freq_base", 10000.0f);
    const float sm = 1.0f / 16.0f; /* 1 / sqrt(row length) */
    tiny_tensor(w, &keep, "token_embd.weight", QT_Q4_K, TE, TVOCAB, 1.0f, 0, &seed);
    tiny_tensor(w, &keep, "output_norm.weight", QT_F32, TE, 1, 0.1f, 1, &seed);
    tiny_tensor(w, &keep, "output.weight", QT_Q6_K, TE, TVOCAB, 4 * sm, 0, &seed);
    for (int il = 0; il < TLAYERS; il++) {
        char n[64];
#define L(fmt, type, ne0, ne1, s, off)                                                         \
    snprintf(n, sizeof n, fmt, il);                                                            \
    tiny_tensor(w, &keep, n, type, ne0, ne1, s, off, &seed)
        L("blk.%d.attn_norm.weight", QT_F32, TE, 1, 0.1f, 1);
        L("blk.%d.attn_q.weight", QT_Q4_K, TE, TE, sm, 0);
        L("blk.%d.attn_k.weight", QT_Q4_K, TE, 128, sm, 0);
        L("blk.%d.attn_v.weight", QT_Q6_K, TE, 128, sm, 0); /* Q/K/V: one mixed launch */
        L("blk.%d.attn_output.weight", QT_Q4_K, TE, TE, sm, 0);
        L("blk.%d.ffn_norm.weight", QT_F32, TE, 1, 0.1f, 1);
        L("blk.%d.ffn_gate.weight", QT_Q4_K, TE, TF, sm, 0);
        L("blk.%d.ffn_up.weight", QT_Q4_K, TE, TF, sm, 0);
        L("blk.%d.ffn_down.weight", QT_Q6_K, TF, TE, sm / 1.414f, 0);
#undef L
    }
    smelt_status st = gguf_writer_write(w, path, NULL, NULL, &e);
    if (st != SMELT_OK) fprintf(stderr, "writing %s: %s\n", path, e.msg);
    gguf_writer_free(w);
    for (int i = 0; i < keep.n; i++) free(keep.p[i]);
    return st == SMELT_OK;
}

/* ---- one backend running the script ---- */

/* The script: sequence 0's prefill (P0 rows), sequence 1's (P1 rows), then DEC decode
 * steps of both. Prompts stay under 33 rows so F16 weights take repeated mmv (never cuBLAS,
 * whose kernel choice may vary with concurrent streams), quantized ones mmq. */
#define P0 24
#define P1 13
#define DEC 6
#define STEPS (2 + DEC)
#define TOPK_K 8

struct run {
    int device;
    struct backend *bk;
    struct gguf_file *f;
    struct model *m;
    struct kv_store *kv;
    struct kv_pool pool;
    struct kv_seq sq[2];
    int nv, step;
    float *logits;                  /* (nv, rows) of every step, in order */
    struct topk_summary *sum;       /* (2 x DEC): the decode steps' summaries */
    struct topk_cand *cand;         /* (2 x DEC, TOPK_K... TOPK_MAX) */
    size_t at;                      /* logit rows written */
    char err[256];
};

static int script_rows(void) { return P0 + P1 + 2 * DEC; }

static int32_t token_at(int seq, int pos, int nv) { return (int32_t)((seq * 7919 + pos * 104729 + 17) % nv); }

static bool run_open(struct run *r, int device, const char *path) {
    struct err e;
    memset(r, 0, sizeof *r);
    r->device = device;
    if (cuda_backend_new(&r->bk, device, &e) != SMELT_OK || gguf_open(&r->f, path, &e) != SMELT_OK ||
        model_load(&r->m, r->f, r->bk, &e) != SMELT_OK || model_kv_new(r->m, QT_F16, 16, 16, 0, &r->kv, &e) != SMELT_OK ||
        kv_pool_init(&r->pool, 16, 16, &e) != SMELT_OK) {
        fprintf(stderr, "%s on GPU %d: %s\n", path, device, e.msg);
        return false;
    }
    kv_seq_init(&r->sq[0]);
    kv_seq_init(&r->sq[1]);
    r->nv = r->m->hp.n_vocab;
    r->logits = calloc((size_t)script_rows() * (size_t)r->nv, sizeof(float));
    r->sum = calloc(2 * DEC, sizeof *r->sum);
    r->cand = calloc(2 * DEC * TOPK_MAX, sizeof *r->cand);
    return r->logits && r->sum && r->cand;
}

static void run_close(struct run *r) {
    if (r->m) {
        for (int s = 0; s < 2; s++) kv_seq_release(&r->pool, &r->sq[s]);
        kv_pool_free(&r->pool);
        model_kv_free(r->m, r->kv);
        model_free(r->m);
    }
    gguf_close(r->f);
    if (r->bk) bk_free(r->bk);
    free(r->logits);
    free(r->sum);
    free(r->cand);
    memset(r, 0, sizeof *r);
}

/* Starts the script over (the sequences' blocks returned, outputs overwritten). */
static void run_rewind(struct run *r) {
    for (int s = 0; s < 2; s++) kv_seq_release(&r->pool, &r->sq[s]);
    r->step = 0;
    r->at = 0;
}

/* The script's next step; false (r->err set) on an error. Thread-safe per run: it touches
 * only r (the test harness's counters are for the main thread). */
static bool run_step(struct run *r) {
    struct err e;
    int32_t ids[64], pos[64], seq[64];
    uint8_t want[64];
    struct batch_seq views[2];
    int n = 0, n_seqs = 1, dec = r->step - 2;
    if (r->step < 2) { /* a prefill chunk of one sequence, every row's logits */
        const int s = r->step, len = s == 0 ? P0 : P1;
        if (kv_seq_reserve(&r->pool, &r->sq[s], len, &e) != SMELT_OK) goto fail;
        for (int i = 0; i < len; i++, n++) ids[n] = token_at(s, i, r->nv), pos[n] = i, seq[n] = 0, want[n] = 1;
        views[0] = kv_seq_view(&r->sq[s]);
    } else { /* a decode row of each sequence */
        for (int s = 0; s < 2; s++, n++) {
            const int p = (s == 0 ? P0 : P1) + dec;
            if (kv_seq_reserve(&r->pool, &r->sq[s], p + 1, &e) != SMELT_OK) goto fail;
            ids[n] = token_at(s, p, r->nv), pos[n] = p, seq[n] = s, want[n] = 1;
            views[s] = kv_seq_view(&r->sq[s]);
        }
        n_seqs = 2;
    }
    const struct batch b = {n, ids, pos, seq, want, n_seqs, views};
    float *out = r->logits + r->at * (size_t)r->nv;
    if (dec < 0) {
        if (model_forward(r->m, r->kv, &b, out, NULL, &e) != SMELT_OK) goto fail;
    } else {
        struct topk_row rows[2];
        for (int i = 0; i < 2; i++) rows[i] = (struct topk_row){.k = TOPK_K, .flags = TOPK_SUM, .inv_t = 1.0f};
        struct model_sample smp = {.n_rows = 2, .rows = rows, .sum = r->sum + 2 * dec,
                                   .cand = r->cand + (size_t)2 * dec * TOPK_MAX};
        if (model_step(r->m, r->kv, &b, out, &smp, NULL, &e) != SMELT_OK) goto fail;
    }
    r->at += (size_t)n;
    r->step++;
    return true;
fail:
    snprintf(r->err, sizeof r->err, "GPU %d step %d: %.200s", r->device, r->step, e.msg);
    return false;
}

static bool run_script(struct run *r) {
    run_rewind(r);
    while (r->step < STEPS)
        if (!run_step(r)) return false;
    return true;
}

/* ---- comparisons ---- */

/* Bitwise equality of two runs' outputs; prints the first difference. */
static bool same_bits(const struct run *a, const struct run *ref, const char *what) {
    const size_t nl = (size_t)script_rows() * (size_t)a->nv;
    for (size_t i = 0; i < nl; i++)
        if (memcmp(&a->logits[i], &ref->logits[i], sizeof(float)) != 0) {
            fprintf(stderr, "%s: logit %zu (row %zu) differs: %.9g vs %.9g alone\n", what, i, i / (size_t)a->nv,
                    a->logits[i], ref->logits[i]);
            return false;
        }
    for (int r = 0; r < 2 * DEC; r++) {
        if (memcmp(&a->sum[r], &ref->sum[r], sizeof a->sum[r]) != 0 ||
            memcmp(&a->cand[(size_t)r * TOPK_MAX], &ref->cand[(size_t)r * TOPK_MAX], TOPK_K * sizeof *a->cand) != 0) {
            fprintf(stderr, "%s: the sampling summary of decode row %d differs (top %d vs %d alone)\n", what, r,
                    a->sum[r].top_token, ref->sum[r].top_token);
            return false;
        }
    }
    return true;
}

/* Cosine >= 0.999 on every row against ref. */
static bool close_rows(const struct run *a, const struct run *ref, const char *what) {
    const int nv = a->nv;
    double worst = 1;
    for (int r = 0; r < script_rows(); r++) {
        const float *x = a->logits + (size_t)r * nv, *y = ref->logits + (size_t)r * nv;
        double xy = 0, xx = 0, yy = 0;
        for (int i = 0; i < nv; i++) xy += (double)x[i] * y[i], xx += (double)x[i] * x[i], yy += (double)y[i] * y[i];
        const double c = xy / (sqrt(xx * yy) + 1e-30);
        worst = fmin(worst, c);
        if (!(c >= 0.999)) {
            fprintf(stderr, "%s: row %d: cosine %.6f against the lone run\n", what, r, c);
            return false;
        }
    }
    printf("  %s: worst row cosine %.7f\n", what, worst);
    return true;
}

/* ---- the phases ---- */

struct model_case {
    const char *name, *path;
};

static struct model_case g_models[2];
static int g_n_models;
static int g_dev[2];                  /* the two backends' GPUs */
static struct run g_ref[2][2];        /* [model][distinct GPU]: lone runs */

static int dev_slot(int device) { return device == g_dev[0] ? 0 : 1; }

/* Lone reference runs: one backend at a time, on each GPU used. */
static void test_lone(void) {
    for (int mi = 0; mi < g_n_models; mi++)
        for (int d = 0; d < (g_dev[1] != g_dev[0] ? 2 : 1); d++) {
            struct run *r = &g_ref[mi][d];
            T_CHECKF(run_open(r, g_dev[d], g_models[mi].path) && run_script(r), "%s lone on GPU %d: %s",
                     g_models[mi].name, g_dev[d], r->err);
            /* a second pass: graphs replayed from the start, same bits */
            if (r->m) {
                float *first = malloc(sizeof(float) * (size_t)script_rows() * (size_t)r->nv);
                memcpy(first, r->logits, sizeof(float) * (size_t)script_rows() * (size_t)r->nv);
                T_CHECKF(run_script(r), "%s: %s", g_models[mi].name, r->err);
                T_CHECKF(memcmp(first, r->logits, sizeof(float) * (size_t)script_rows() * (size_t)r->nv) == 0,
                         "%s on GPU %d: a second pass of the script differs from the first", g_models[mi].name,
                         g_dev[d]);
                free(first);
            }
        }
}

/* Both backends from this thread, alternating step by step. */
static void test_interleaved(void) {
    for (int mi = 0; mi < g_n_models; mi++) {
        struct run r[2];
        memset(r, 0, sizeof r); /* run_close is safe on a run that never opened */
        bool ok = run_open(&r[0], g_dev[0], g_models[mi].path) && run_open(&r[1], g_dev[1], g_models[mi].path);
        T_CHECKF(ok, "%s: two backends", g_models[mi].name);
        for (int pass = 0; ok && pass < 2; pass++) {
            run_rewind(&r[0]);
            run_rewind(&r[1]);
            for (int s = 0; ok && s < STEPS; s++)
                for (int k = 0; ok && k < 2; k++) {
                    ok = run_step(&r[k]);
                    T_CHECKF(ok, "%s interleaved: %s", g_models[mi].name, r[k].err);
                }
            for (int k = 0; ok && k < 2; k++) {
                char what[96];
                snprintf(what, sizeof what, "%s interleaved, pass %d, backend %d (GPU %d)", g_models[mi].name, pass,
                         k, g_dev[k]);
                T_CHECKF(same_bits(&r[k], &g_ref[mi][dev_slot(g_dev[k])], what), "%s", what);
            }
        }
        run_close(&r[0]);
        run_close(&r[1]);
    }
}

#define ROUNDS 3

struct job {
    struct run *r;
    const struct run *ref;
    bool bitwise;
    int bad_round;   /* -1: every round matched */
    bool failed;
};

/* Runs the script ROUNDS times on this thread, checking each round against the reference
 * (silently: the main thread reports). */
static void *job_main(void *p) {
    struct job *j = p;
    j->bad_round = -1;
    for (int round = 0; round < ROUNDS && !j->failed; round++) {
        if (!run_script(j->r)) {
            j->failed = true;
            break;
        }
        if (j->bitwise && j->bad_round < 0 &&
            (memcmp(j->r->logits, j->ref->logits, sizeof(float) * (size_t)script_rows() * (size_t)j->r->nv) != 0 ||
             memcmp(j->r->sum, j->ref->sum, sizeof(struct topk_summary) * 2 * DEC) != 0))
            j->bad_round = round;
    }
    return NULL;
}

/* Two threads, one backend each, at once. */
static void concurrent(bool bitwise) {
    for (int mi = 0; mi < g_n_models; mi++) {
        struct run r[2];
        memset(r, 0, sizeof r); /* run_close is safe on a run that never opened */
        bool ok = run_open(&r[0], g_dev[0], g_models[mi].path) && run_open(&r[1], g_dev[1], g_models[mi].path);
        T_CHECKF(ok, "%s: two backends", g_models[mi].name);
        if (ok) {
            struct job jobs[2];
            pthread_t th[2];
            for (int k = 0; k < 2; k++) {
                jobs[k] = (struct job){&r[k], &g_ref[mi][dev_slot(g_dev[k])], bitwise, -1, false};
                T_CHECK(pthread_create(&th[k], NULL, job_main, &jobs[k]) == 0);
            }
            for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
            for (int k = 0; k < 2; k++) {
                char what[96];
                snprintf(what, sizeof what, "%s concurrent%s, backend %d (GPU %d)", g_models[mi].name,
                         bitwise ? "" : " measured paths", k, g_dev[k]);
                T_CHECKF(!jobs[k].failed, "%s: %s", what, r[k].err);
                if (jobs[k].failed) continue;
                if (bitwise) {
                    T_CHECKF(jobs[k].bad_round < 0, "%s: round %d differs from the lone run", what, jobs[k].bad_round);
                    T_CHECKF(same_bits(&r[k], jobs[k].ref, what), "%s", what); /* the last round, with the place */
                } else {
                    T_CHECKF(close_rows(&r[k], jobs[k].ref, what), "%s", what);
                }
            }
        }
        run_close(&r[0]);
        run_close(&r[1]);
    }
}

static void test_concurrent(void) { concurrent(true); }

static void test_concurrent_measured(void) {
    unsetenv("SMELT_NO_TUNE"); /* read when a backend is created */
    concurrent(false);
    setenv("SMELT_NO_TUNE", "1", 1);
}

/* Sets up the models and devices; false when the test cannot run (skip printed). */
static char g_tiny[256];

static bool setup(void) {
    setenv("SMELT_NO_TUNE", "1", 1); /* static matmul paths: see the file comment */
    const int n = cuda_device_count();
    g_dev[0] = 0;
    g_dev[1] = n >= 2 ? 1 : 0;
    printf("test_cuda_multi: %d GPU(s) visible: the two backends run on GPU %d and GPU %d\n", n, g_dev[0], g_dev[1]);
    snprintf(g_tiny, sizeof g_tiny, "%s/smelt_multi_%d.gguf", P_tmpdir, (int)getpid());
    if (!write_tiny(g_tiny)) return false;
    g_models[g_n_models++] = (struct model_case){"tiny Q4_K/Q6_K llama", g_tiny};
    static char fixture[512];
    snprintf(fixture, sizeof fixture, "%s/tests/data/ref/llama-f16.gguf", t_source_dir());
    g_models[g_n_models++] = (struct model_case){"llama-f16 fixture", fixture};
    return true;
}

static void teardown(void) {
    for (int mi = 0; mi < 2; mi++)
        for (int d = 0; d < 2; d++) run_close(&g_ref[mi][d]);
    unlink(g_tiny);
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("SKIP test_cuda_multi: no CUDA device on this machine\n");
        return 77;
    }
    if (!setup()) return 1;
    T_RUN(test_lone);
    T_RUN(test_interleaved);
    T_RUN(test_concurrent);
    T_RUN(test_concurrent_measured);
    teardown();
    return t_done();
}
#endif
