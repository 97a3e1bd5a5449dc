/* The CUDA logits_topk op (cuda_sample.cu) against its CPU twin (topk_summarize_row,
 * backend/topk.c), and the sampler on device summaries against the sampler on full host rows.
 *
 *   - op: 152k and 262k vocabularies (and ragged ones) at 1, 3 and 64 rows; rows peaked,
 *     flat, with exact ties, sprinkled -inf and NaN, all equal, nearly all -inf,
 *     increasing and decreasing; per row a random request (k 0/1/2/40/256, sums or not,
 *     temperature) and an adjustment list (0-500 entries: penalties, boosts, bans, a
 *     token twice, the first and last token) and, for about half the rows, a token mask
 *     (TOPK_MASK: dense, sparse, one run, none or all allowed, the last token only, empty
 *     words; random bits past the vocabulary). Candidates must equal the twin's exactly
 *     (ids, order and values: ties are broken by token id on both sides), counts
 *     exactly, sums within 1e-5 relative, the raw logits of adjusted tokens exactly; a
 *     k = 0 row must stay untouched. The first difference is printed.
 *   - model_step on the tiny llama fixture: several steps of one shape (eager, captured,
 *     replayed) with different requests each step, every other step with token masks
 *     written by model_sample.fill_masks while the forward runs; each step's summaries
 *     equal the twin on the same step's logits (model_fetch_rows).
 *   - sampler: for the same seed (the same random draw), the sampler on the device's
 *     summaries, fetching the row only when it asks, picks what it picks with the row
 *     given at once, exactly; and what the full-row host sampler picks, exactly for the
 *     requests that do not depend on the summed mass (logprobs within 1e-4).
 *
 * SMELT_BENCH=1 adds the kernel time per call and per row at 152k/262k and 1/64 rows,
 * greedy (k = 1) and sampling (k = 256, both sums, 32 adjustments a row), each without and
 * with a token mask (90% of the tokens allowed, at random), with the read bandwidth
 * (rows x n_vocab x 4 bytes / time; the mask's n_vocab / 8 bytes a row not counted). */
#ifndef SMELT_HAVE_CUDA
#include <stdio.h>

int main(void) {
    printf("SKIP test_cuda_topk: built without CUDA (nvcc not found at configure time)\n");
    return 77;
}
#else

#include "t.h"

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "format/gguf.h"
#include "model/model.h"
#include "topk_ref.h"

#define TOL 1e-5

static struct backend *gpu;
static struct cuda_ctx g_ctx; /* the bench's direct calls: device 0, the default stream */

/* The op on the GPU over rows x (n_rows of nv). mask: (topk_mask_words(nv), n_rows) words or
 * NULL. out: topk_out_words(n_rows, cap) words, poisoned with 0x5a bytes before the op. */
static bool gpu_topk(const float *x, int nv, int n_rows, const struct topk_row *q,
                     const struct logit_adj *adj, int n_adj, int cap, const uint32_t *mask,
                     int32_t *out) {
    struct err e;
    if (cap < 1) cap = 1;
    size_t out_bytes = (size_t)topk_out_words(n_rows, cap) * 4;
    bk_step_begin(gpu);
    struct tensor *lg = bk_new(gpu, QT_F32, nv, n_rows, 1);
    struct tensor *rq = bk_new(gpu, QT_I32, TOPK_ROW_WORDS, n_rows, 1);
    struct tensor *ad = bk_new(gpu, QT_I32, TOPK_ADJ_WORDS, cap, 1);
    struct tensor *ot = bk_new(gpu, QT_I32, topk_out_words(n_rows, cap), 1, 1);
    const int64_t words = topk_mask_words(nv);
    struct tensor *mk = mask ? bk_new(gpu, QT_I32, words, n_rows, 1) : NULL;
    if (mk) bk_upload(gpu, mk, mask, (size_t)words * n_rows * sizeof *mask);
    memset(out, 0x5a, out_bytes);
    bk_upload(gpu, lg, x, (size_t)nv * n_rows * sizeof(float));
    bk_upload(gpu, rq, q, (size_t)n_rows * sizeof *q);
    if (n_adj) bk_upload(gpu, ad, adj, (size_t)n_adj * sizeof *adj);
    bk_upload(gpu, ot, out, out_bytes);
    bk_logits_topk(gpu, ot, lg, rq, ad, mk);
    bk_download(gpu, out, ot, out_bytes);
    if (bk_sync(gpu, &e) != SMELT_OK) {
        fprintf(stderr, "gpu: %s\n", e.msg);
        return false;
    }
    T_EQ_INT(cuda_topk_counters_busy(cuda_backend_ctx(gpu)), 0); /* the merging blocks reset their rows' counters */
    return true;
}

/* ---- the op against the twin ---- */

static void run_config(int nv, int n_rows, unsigned long long *rs, int *n_bad, int *n_rows_checked) {
    float *x = calloc((size_t)nv * n_rows, sizeof *x);
    struct topk_row *q = calloc((size_t)n_rows, sizeof *q);
    const int adj_sizes[] = {0, 3, 60, 500};
    int cap = 0;
    for (int r = 0; r < n_rows; r++) cap += 500;
    struct logit_adj *adj = calloc((size_t)cap, sizeof *adj);
    int32_t *out = malloc((size_t)topk_out_words(n_rows, cap) * 4);
    const int64_t words = topk_mask_words(nv);
    uint32_t *mask = calloc((size_t)words * n_rows, sizeof *mask);
    if (!x || !q || !adj || !out || !mask) {
        (*n_bad)++;
        goto done;
    }
    const int ks[] = {0, 1, 2, 40, 256};
    int n_adj = 0;
    for (int r = 0; r < n_rows; r++) {
        topk_make_row(x + (size_t)r * nv, nv, r + (int)(t_rand_u64(rs) % ROW_KINDS), rs);
        q[r].k = ks[t_rand_u64(rs) % 5];
        if (r == 0) q[r].k = 256;
        q[r].flags = (int32_t)(t_rand_u64(rs) % 8); /* TOPK_SUM | TOPK_RAW | TOPK_MASK */
        topk_make_mask(mask + (size_t)r * words, nv, (int)(t_rand_u64(rs) % MASK_KINDS), rs);
        q[r].inv_t = t_rand_u64(rs) % 2 ? 1.0f : 1.0f / 0.6f;
        int na = adj_sizes[t_rand_u64(rs) % 4];
        if (na > nv) na = nv;
        q[r].adj_off = n_adj;
        q[r].adj_n = topk_make_adj(adj + n_adj, na, nv, rs);
        n_adj += q[r].adj_n;
    }
    if (!gpu_topk(x, nv, n_rows, q, adj, n_adj, cap, mask, out)) {
        (*n_bad)++;
        goto done;
    }
    const struct topk_summary *sums = (const void *)out;
    const struct topk_cand *cands = (const void *)(out + topk_cand_word(n_rows));
    const float *raws = (const float *)(out + topk_raw_word(n_rows));
    static struct topk_cand wc[TOPK_MAX];
    float *wraw = malloc(sizeof *wraw * 500);
    for (int r = 0; r < n_rows; r++) {
        char what[96];
        snprintf(what, sizeof what, "nv %d rows %d row %d", nv, n_rows, r);
        if (q[r].k == 0) {
            uint32_t w;
            memcpy(&w, &sums[r], 4);
            if (w != 0x5a5a5a5au) {
                fprintf(stderr, "  %s: a k = 0 row was written\n", what);
                (*n_bad)++;
            }
            continue;
        }
        struct topk_summary ws;
        topk_summarize_row(x + (size_t)r * nv, nv, &q[r], adj + q[r].adj_off, mask + (size_t)r * words, &ws,
                           wc, wraw);
        if (!topk_same(what, &q[r], &sums[r], cands + (size_t)r * TOPK_MAX, raws + q[r].adj_off, &ws,
                       wc, wraw, TOL))
            (*n_bad)++;
        (*n_rows_checked)++;
    }
    free(wraw);
done:
    free(x);
    free(q);
    free(adj);
    free(out);
    free(mask);
}

static void test_op_vs_twin(void) {
    unsigned long long rs = 0x70c;
    int bad = 0, checked = 0;
    const int nvs[] = {151936, 262144, 4099, 70001, 1, 33};
    const int rows[] = {1, 3, 64};
    for (size_t i = 0; i < sizeof nvs / sizeof nvs[0]; i++)
        for (size_t j = 0; j < sizeof rows / sizeof rows[0]; j++)
            for (int rep = 0; rep < (rows[j] == 64 ? 1 : 4); rep++) run_config(nvs[i], rows[j], &rs, &bad, &checked);
    /* above the kernel's 1024 row counters the merge is a launch of its own */
    run_config(4099, 1100, &rs, &bad, &checked);
    run_config(33, 1025, &rs, &bad, &checked);
    printf("op vs twin: %d rows checked, %d differ\n", checked, bad);
    T_CHECKF(bad == 0, "%d rows differ from the CPU twin", bad);
}

/* ---- model_step with graphs ---- */

/* model_sample.fill_masks of the masked steps: writes row r's mask (kind r + step) and counts
 * its calls. */
struct fill {
    uint32_t *mask;
    int nv, ns, step, calls;
    unsigned long long rs;
};

static void fill_masks(void *ctx) {
    struct fill *f = ctx;
    for (int r = 0; r < f->ns; r++)
        topk_make_mask(f->mask + (size_t)r * topk_mask_words(f->nv), f->nv, r + f->step, &f->rs);
    f->calls++;
}

static void test_model_step_graphs(void) {
    char FIXTURE[4096];
    snprintf(FIXTURE, sizeof FIXTURE, "%s/tests/data/ref/llama-f32.gguf", t_source_dir());
    struct err e;
    struct gguf_file *f = NULL;
    struct model *m = NULL;
    struct kv_store *kv = NULL;
    struct kv_pool pool;
    if (gguf_open(&f, FIXTURE, &e) != SMELT_OK || model_load(&m, f, gpu, &e) != SMELT_OK ||
        model_kv_new(m, QT_F16, 16, 16, 0, &kv, &e) != SMELT_OK || kv_pool_init(&pool, 16, 16, &e) != SMELT_OK) {
        T_CHECKF(0, "%s: %s", FIXTURE, e.msg);
        return;
    }
    const int nv = m->hp.n_vocab, ns = 3;
    struct kv_seq sq[3];
    struct batch_seq views[3];
    int32_t tok[3], pos[3], seq[3] = {0, 1, 2};
    uint8_t want[3] = {1, 1, 1};
    for (int s = 0; s < ns; s++) {
        kv_seq_init(&sq[s]);
        T_EQ_INT(kv_seq_reserve(&pool, &sq[s], 32, &e), SMELT_OK);
        views[s] = kv_seq_view(&sq[s]);
    }
    unsigned long long rs = 0x9a;
    float *rows = malloc(sizeof *rows * (size_t)nv * ns);
    struct topk_summary sum[3], ws;
    static struct topk_cand cand[3 * TOPK_MAX], wc[TOPK_MAX];
    struct logit_adj adj[24];
    float raw[24], wraw[24];
    int bad = 0;
    /* odd steps: sequences 0 and 2 under token masks, written while the forward runs */
    uint32_t *mask = calloc((size_t)topk_mask_words(nv) * ns, sizeof *mask);
    struct fill fl = {mask, nv, ns, 0, 0, 0x3b};
    for (int step = 0; step < 6; step++) {
        struct topk_row q[3];
        int n_adj = 0;
        for (int s = 0; s < ns; s++) {
            tok[s] = (int32_t)(t_rand_u64(&rs) % (uint64_t)nv);
            pos[s] = step;
            int na = (step + s) % 3 == 0 ? 0 : 8;
            q[s] = (struct topk_row){(step + s) % 4 == 0 ? 1 : 1 + (step * 31 + s * 7) % 64,
                                     (step + s) % 4, 1.0f / (0.5f + 0.1f * step), n_adj, 0, 0};
            q[s].adj_n = topk_make_adj(adj + n_adj, na, nv, &rs);
            n_adj += q[s].adj_n;
            if (step % 2 && s != 1) q[s].flags |= TOPK_MASK;
        }
        fl.step = step;
        struct batch b = {ns, tok, pos, seq, want, ns, views};
        struct model_sample ms = {.n_rows = ns,
                                  .rows = q,
                                  .adj = adj,
                                  .n_adj = n_adj,
                                  .sum = sum,
                                  .cand = cand,
                                  .adj_raw = raw,
                                  .mask = step % 2 ? mask : NULL,
                                  .fill_masks = step % 2 ? fill_masks : NULL,
                                  .fill_ctx = &fl};
        T_EQ_INT(model_step(m, kv, &b, NULL, &ms, NULL, &e), SMELT_OK);
        T_EQ_INT(model_fetch_rows(m, 0, ns, rows, &e), SMELT_OK);
        T_EQ_INT(fl.calls, (step + 1) / 2);
        for (int s = 0; s < ns; s++) {
            topk_summarize_row(rows + (size_t)s * nv, nv, &q[s], adj + q[s].adj_off,
                               mask + (size_t)s * topk_mask_words(nv), &ws, wc, wraw);
            char what[64];
            snprintf(what, sizeof what, "step %d sequence %d", step, s);
            if (!topk_same(what, &q[s], &sum[s], cand + (size_t)s * TOPK_MAX, raw + q[s].adj_off, &ws, wc,
                           wraw, TOL))
                bad++;
        }
    }
    T_CHECKF(bad == 0, "%d summaries differ from the twin on the step's own logits", bad);
    free(rows);
    free(mask);
    for (int s = 0; s < ns; s++) kv_seq_release(&pool, &sq[s]);
    kv_pool_free(&pool);
    model_kv_free(m, kv);
    model_free(m);
    gguf_close(f);
}

/* ---- the sampler on device summaries ---- */

/* Three samplers per request, same seed: A samples the full row on the host (its summary
 * from the CPU twin); B finishes from the device's summary, fetching the row only when
 * asked; C gets the device's summary and the row at once. B and C must agree exactly
 * (the same random draw, kept across the fallback). A and B must agree exactly for the
 * requests whose result does not depend on the summed mass (greedy, top-k, min-p); a
 * temperature-only draw or a top-p cut compares a uniform draw with the sum, which the
 * device and the host round differently (1e-6), so for those a disagreement can happen
 * near a boundary and is only counted. */
static void test_sampler_on_device(void) {
    const int nv = 151936, n_rows = 8, steps = 6;
    struct sample_params p[8];
    for (int i = 0; i < n_rows; i++) {
        sample_params_default(&p[i]);
        p[i].seed = 100 + (uint64_t)i;
    }
    const bool exact[8] = {true, true, true, false, false, true, true, false};
    p[0].temperature = 0;                                         /* greedy */
    p[1].temperature = 0, p[1].n_logprobs = 5, p[1].repetition_penalty = 1.3f; /* + logprobs */
    p[2].temperature = 0.7f, p[2].top_k = 40;                     /* top-k */
    p[3].temperature = 0.8f, p[3].top_p = 0.95f, p[3].n_logprobs = 3; /* top-p */
    p[4].temperature = 1.0f;                                      /* draws past the candidates */
    p[5].temperature = 1.0f, p[5].min_p = 0.05f;                  /* min-p */
    p[6].temperature = 0.9f, p[6].top_k = 1000, p[6].top_p = 0.9f; /* top-k past them */
    p[7].temperature = 1.1f, p[7].presence_penalty = 0.5f, p[7].frequency_penalty = 0.3f, p[7].n_logprobs = 2;
    struct sampler *a[8], *b[8], *c[8];
    struct err e;
    for (int i = 0; i < n_rows; i++) {
        T_EQ_INT(sampler_new(&a[i], &p[i], nv, &e), SMELT_OK);
        T_EQ_INT(sampler_new(&b[i], &p[i], nv, &e), SMELT_OK);
        T_EQ_INT(sampler_new(&c[i], &p[i], nv, &e), SMELT_OK);
        for (int h = 0; h < 40; h++) {
            sampler_accept(a[i], h * 37 % 2000, h > 20);
            sampler_accept(b[i], h * 37 % 2000, h > 20);
            sampler_accept(c[i], h * 37 % 2000, h > 20);
        }
    }
    unsigned long long rs = 0x5a;
    /* rows 1, 4 and 7 under a token mask (a grammar's): dense, sparse, a run of 40 */
    const int64_t words = topk_mask_words(nv);
    uint32_t *mask = calloc((size_t)words * n_rows, sizeof *mask);
    for (int r = 0; r < n_rows; r++) {
        topk_make_mask(mask + (size_t)r * words, nv, r / 3, &rs);
        if (r % 3 == 1) {
            sampler_set_mask(a[r], mask + (size_t)r * words);
            sampler_set_mask(b[r], mask + (size_t)r * words);
            sampler_set_mask(c[r], mask + (size_t)r * words);
        }
    }
    float *x = calloc((size_t)nv * n_rows, sizeof *x);
    const int cap = 4096;
    struct logit_adj *adj = malloc(sizeof *adj * cap), *adj_c = malloc(sizeof *adj * cap);
    int32_t *out = malloc((size_t)topk_out_words(n_rows, cap) * 4);
    int diff_bc = 0, diff_ab = 0, loose_ab = 0, loose = 0, full = 0;
    for (int step = 0; step < steps; step++) {
        struct topk_row q[8], qc;
        int n_adj = 0;
        for (int r = 0; r < n_rows; r++) {
            /* peaked rows, except flat ones every other step (draws leave the candidates) */
            for (int i = 0; i < nv; i++)
                x[(size_t)r * nv + i] = (step % 2 ? 0.7f : 3.0f) * t_randn(&rs);
            int32_t got = sampler_request(b[r], &q[r], adj + n_adj, n_adj, cap - n_adj);
            T_CHECK(got >= 0);
            T_EQ_INT(sampler_request(c[r], &qc, adj_c, 0, cap), got);
            n_adj += got > 0 ? got : 0;
        }
        if (!gpu_topk(x, nv, n_rows, q, adj, n_adj, cap, mask, out)) {
            T_CHECK(0);
            break;
        }
        const struct topk_summary *sums = (const void *)out;
        const struct topk_cand *cands = (const void *)(out + topk_cand_word(n_rows));
        const float *raws = (const float *)(out + topk_raw_word(n_rows));
        for (int r = 0; r < n_rows; r++) {
            const float *row = x + (size_t)r * nv, *raw = raws + q[r].adj_off;
            const struct topk_cand *cr = cands + (size_t)r * TOPK_MAX;
            struct sample_result ra, rb, rc;
            T_EQ_INT(sampler_sample(a[r], row, &ra, &e), SMELT_OK);
            T_EQ_INT(sampler_finish(b[r], &sums[r], cr, raw, NULL, &rb, &e), SMELT_OK);
            if (rb.token == SAMPLE_NEED_ROW) {
                full++;
                T_EQ_INT(sampler_finish(b[r], &sums[r], cr, raw, row, &rb, &e), SMELT_OK);
            }
            T_EQ_INT(sampler_finish(c[r], &sums[r], cr, raw, row, &rc, &e), SMELT_OK);
            bool bc = rb.token == rc.token && rb.n_top == rc.n_top && rb.logprob == rc.logprob;
            for (int i = 0; bc && i < rb.n_top; i++)
                bc = rb.top[i].token == rc.top[i].token && rb.top[i].logprob == rc.top[i].logprob;
            bool ab = ra.token == rb.token && ra.n_top == rb.n_top &&
                      (p[r].n_logprobs < 0 || fabs(ra.logprob - rb.logprob) < 1e-4);
            for (int i = 0; ab && i < ra.n_top; i++)
                ab = ra.top[i].token == rb.top[i].token && fabs(ra.top[i].logprob - rb.top[i].logprob) < 1e-4;
            if (!bc) {
                fprintf(stderr, "  step %d row %d: with the row at once %d, after a fetch %d\n", step, r,
                        rc.token, rb.token);
                diff_bc++;
            }
            if (!ab && exact[r]) {
                fprintf(stderr, "  step %d row %d: host %d (%g), device %d (%g)\n", step, r, ra.token,
                        ra.logprob, rb.token, rb.logprob);
                diff_ab++;
            }
            if (!exact[r]) {
                loose++;
                loose_ab += !ab;
            }
            if (r % 3 == 1 && !topk_allowed(mask + (size_t)r * words, rb.token)) {
                fprintf(stderr, "  step %d row %d: token %d is masked\n", step, r, rb.token);
                diff_ab++;
            }
            sampler_accept(a[r], rb.token, true);
            sampler_accept(b[r], rb.token, true);
            sampler_accept(c[r], rb.token, true);
        }
    }
    printf("sampler on device summaries: %d of %d rows needed the full row; host and device "
           "differ on %d of %d sum-dependent rows\n", full, steps * n_rows, loose_ab, loose);
    T_CHECKF(diff_bc == 0, "%d rows differ between the fallback and the row given at once", diff_bc);
    T_CHECKF(diff_ab == 0, "%d rows sampled differently on the host", diff_ab);
    T_CHECK(full > 0); /* the fallback ran */
    for (int i = 0; i < n_rows; i++) {
        sampler_free(a[i]);
        sampler_free(b[i]);
        sampler_free(c[i]);
    }
    free(x);
    free(adj);
    free(adj_c);
    free(out);
    free(mask);
}

/* ---- bench ---- */

#define CK(call)                                                                               \
    do {                                                                                       \
        cudaError_t rc_ = (call);                                                              \
        if (rc_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(rc_));                       \
            return;                                                                            \
        }                                                                                      \
    } while (0)

static void bench(void) {
    const int nvs[] = {151936, 262144}, rows[] = {1, 64};
    unsigned long long rs = 1;
    for (int vi = 0; vi < 2; vi++)
        for (int ri = 0; ri < 2; ri++)
            for (int mode = 0; mode < 4; mode++) { /* bit 0: sampling; bit 1: masked */
                const bool smp = mode & 1, masked = mode & 2;
                int nv = nvs[vi], n = rows[ri], per_row_adj = smp ? 32 : 0, cap = n * 32;
                size_t nx = (size_t)nv * n;
                float *hx = malloc(sizeof *hx * nx);
                for (size_t i = 0; i < nx; i++) hx[i] = 3.0f * t_randn(&rs);
                struct topk_row *q = calloc((size_t)n, sizeof *q);
                struct logit_adj *adj = malloc(sizeof *adj * (size_t)cap);
                for (int r = 0; r < n; r++) {
                    q[r] = (struct topk_row){smp ? TOPK_MAX : 1,
                                             (smp ? TOPK_SUM | TOPK_RAW : 0) | (masked ? TOPK_MASK : 0),
                                             1.0f / 0.8f, r * 32, per_row_adj, 0};
                    topk_make_adj(adj + r * 32, 32, nv, &rs);
                }
                const int64_t words = topk_mask_words(nv);
                uint32_t *hm = malloc(sizeof *hm * (size_t)words * n);
                for (int r = 0; r < n; r++) topk_make_mask(hm + (size_t)r * words, nv, 0, &rs);
                void *dx, *dq, *da, *dout, *dsc, *dm;
                uint64_t sc = cuda_topk_scratch_bytes(&g_ctx, n, nv);
                CK(cudaMalloc(&dx, nx * 4));
                CK(cudaMalloc(&dq, sizeof *q * (size_t)n));
                CK(cudaMalloc(&da, sizeof *adj * (size_t)cap));
                CK(cudaMalloc(&dout, (size_t)topk_out_words(n, cap) * 4));
                CK(cudaMalloc(&dsc, sc));
                CK(cudaMalloc(&dm, sizeof *hm * (size_t)words * n));
                CK(cudaMemcpy(dm, hm, sizeof *hm * (size_t)words * n, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dx, hx, nx * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dq, q, sizeof *q * (size_t)n, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(da, adj, sizeof *adj * (size_t)cap, cudaMemcpyHostToDevice));
                struct cuda_topk_args a = {.logits = dx, .ld = nv, .n_vocab = nv, .n_rows = n,
                                           .rows = dq, .adj = da, .adj_cap = cap,
                                           .mask = masked ? dm : NULL, .mask_ld = words,
                                           .out = dout, .scratch = dsc};
                for (int i = 0; i < 10; i++) cuda_logits_topk(&g_ctx, &a);
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0);
                cudaEventCreate(&e1);
                const int reps = 200;
                cudaEventRecord(e0, 0);
                for (int i = 0; i < reps; i++) cuda_logits_topk(&g_ctx, &a);
                cudaEventRecord(e1, 0);
                cudaEventSynchronize(e1);
                CK(cudaGetLastError());
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                double us = ms * 1e3 / reps;
                printf("bench topk n_vocab %6d rows %2d %-28s: %8.2f us/call %7.2f us/row %7.1f GB/s "
                       "(scratch %llu KB)\n",
                       nv, n, (const char *[]){"greedy (k 1)", "sampling (k 256, sums, 32 adj)",
                                               "greedy, masked", "sampling, masked"}[mode],
                       us, us / n,
                       (double)nx * 4 / us / 1e3, (unsigned long long)(sc >> 10));
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                cudaFree(dx);
                cudaFree(dq);
                cudaFree(da);
                cudaFree(dout);
                cudaFree(dsc);
                cudaFree(dm);
                free(hm);
                free(hx);
                free(q);
                free(adj);
            }
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("SKIP test_cuda_topk: no CUDA device on this machine\n");
        return 77;
    }
    struct err e;
    if (cuda_backend_new(&gpu, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    T_RUN(test_op_vs_twin);
    T_RUN(test_model_step_graphs);
    T_RUN(test_sampler_on_device);
    if (getenv("SMELT_BENCH") && cuda_ctx_init(&g_ctx, 0, NULL, &e) == SMELT_OK) {
        bench();
        cuda_ctx_free(&g_ctx);
    }
    bk_free(gpu);
    return t_done();
}
#endif
