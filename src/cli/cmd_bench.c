/* smelt bench: prefill and decode speed with llama-bench's flags and output fields, so
 * rows line up with `llama-bench` output; plus a batched mode (N sequences decoding
 * together, like llama-batched-bench) and, for decode rows, the percent of the memory-
 * bandwidth bound.
 *
 * Tests (each repeated -r times after one warm-up; mean and standard deviation):
 *   ppN      N prompt tokens in forwards of at most -ub tokens, logits of the last row
 * Every row whose logits a step computes is reduced to its greedy summary on the device
 * (model_step with k = 1: the token id comes back, as in serving), not copied whole.
 *   tgN      N single-token decode steps after a prompt of -d tokens (depth)
 *   ppP+tgT  (-pg P,T) a prompt then T decode steps, counted together
 *   tgN xB   (-B B) B sequences, each after a -d token prompt, decoding N steps in one
 *            batch of B rows: aggregate decode tokens/s
 * Tokens are random ids: the speed of a dense model does not depend on them.
 *
 * The bound of a decode step is bandwidth / bytes read: every weight once (token_embd
 * only for the one row it gathers, unless it is also the output matrix) plus the K and V
 * of the context. The bandwidth is --bw (GB/s); on CUDA it defaults to 4380, the H200's
 * measured read bandwidth (TARGETS.md), and on the CPU no bound is printed unless given. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/clibackend.h"
#include "cli/modelref.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "model/model.h"

#define BLOCK 16
#define MAX_LIST 16

struct opts {
    const char *model, *backend, *output;
    int n_prompt[MAX_LIST], n_np;
    int n_gen[MAX_LIST], n_ng;
    int pg_p, pg_t;
    int depth, reps, n_batch, n_ubatch, threads, device, ngl;
    int batched[MAX_LIST], n_batched;
    double bw_gbs;
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: smelt bench -m MODEL [options]\n"
            "Measures prefill and decode speed; flags and output fields follow llama-bench.\n"
            "  -m, --model REF        GGUF file, directory or org/repo[:quant] (cached)\n"
            "  -p, --n-prompt N[,N]   prompt lengths (default 512; 0 skips)\n"
            "  -n, --n-gen N[,N]      generated tokens (default 128; 0 skips)\n"
            "  -pg P,T                a prompt of P then T generated tokens, timed together\n"
            "  -d, --n-depth N        tokens already in the cache before each test (default 0)\n"
            "  -r, --repetitions N    timed runs per test after one warm-up (default 5)\n"
            "  -b, --batch-size N     most tokens per forward (default 2048)\n"
            "  -ub, --ubatch-size N   prompt chunk per forward (default 512)\n"
            "  -t, --threads N        CPU threads (default: all cores)\n"
            "  -ngl N                 0 runs on the CPU; other values use the GPU (llama-bench's\n"
            "                         layer count: smelt puts all layers on one device)\n"
            "  --backend auto|cpu|cuda, --device N\n"
            "  -B, --batched N[,N]    N sequences decoding together (aggregate tok/s)\n"
            "  --bw GB/S              bandwidth for the decode bound (CUDA default: 4380, H200)\n"
            "  -o, --output md|json|jsonl|csv   (default md)\n");
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static bool parse_list(const char *s, int *out, int *n) {
    *n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(p, &end, 10);
        if (*end || v < 0 || v > 1000000 || *n >= MAX_LIST) return false;
        out[(*n)++] = (int)v;
    }
    return *n > 0;
}

static int parse_args(int argc, char **argv, struct opts *o) {
    memset(o, 0, sizeof *o);
    o->n_prompt[0] = 512, o->n_np = 1;
    o->n_gen[0] = 128, o->n_ng = 1;
    o->reps = 5, o->n_batch = 2048, o->n_ubatch = 512, o->ngl = -1;
    o->backend = "auto", o->output = "md";
    for (int i = 1; i < argc; i += 2) { /* every option takes one value */
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ISARG(s, l) (!strcmp(a, s) || !strcmp(a, l))
        if (ISARG("-h", "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "smelt bench: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        bool okv = true;
        if (ISARG("-m", "--model")) o->model = v;
        else if (ISARG("-p", "--n-prompt")) okv = parse_list(v, o->n_prompt, &o->n_np);
        else if (ISARG("-n", "--n-gen")) okv = parse_list(v, o->n_gen, &o->n_ng);
        else if (ISARG("-pg", "-pg")) okv = sscanf(v, "%d,%d", &o->pg_p, &o->pg_t) == 2 && o->pg_p >= 0 && o->pg_t >= 0;
        else if (ISARG("-d", "--n-depth")) okv = (o->depth = atoi(v)) >= 0;
        else if (ISARG("-r", "--repetitions")) okv = (o->reps = atoi(v)) >= 1;
        else if (ISARG("-b", "--batch-size")) okv = (o->n_batch = atoi(v)) >= 1;
        else if (ISARG("-ub", "--ubatch-size")) okv = (o->n_ubatch = atoi(v)) >= 1;
        else if (ISARG("-t", "--threads")) okv = (o->threads = atoi(v)) >= 0;
        else if (ISARG("-ngl", "--n-gpu-layers")) o->ngl = atoi(v);
        else if (ISARG("--backend", "--backend")) o->backend = v;
        else if (ISARG("--device", "--device")) okv = (o->device = atoi(v)) >= 0;
        else if (ISARG("-B", "--batched")) okv = parse_list(v, o->batched, &o->n_batched);
        else if (ISARG("--bw", "--bw")) okv = (o->bw_gbs = atof(v)) > 0;
        else if (ISARG("-o", "--output")) o->output = v;
        else {
            fprintf(stderr, "smelt bench: unknown option %s (see --help)\n", a);
            return 2;
        }
#undef ISARG
        if (!okv) {
            fprintf(stderr, "smelt bench: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    if (!o->model) {
        fprintf(stderr, "smelt bench: -m MODEL is required\n");
        return 2;
    }
    if (o->ngl == 0) o->backend = "cpu";
    if (strcmp(o->output, "md") && strcmp(o->output, "json") && strcmp(o->output, "jsonl") && strcmp(o->output, "csv")) {
        fprintf(stderr, "smelt bench: -o must be md, json, jsonl or csv\n");
        return 2;
    }
    if (o->n_ubatch > o->n_batch) o->n_ubatch = o->n_batch;
    return -1;
}

struct ctx {
    struct model *m;
    struct kv_store *kv;
    struct kv_pool pool;
    int n_vocab;
    struct topk_row *greedy;  /* (max rows) k = 1 requests */
    struct topk_summary *sum; /* (max rows) */
    struct topk_cand *cand;   /* (max rows, TOPK_MAX), unused by k = 1 rows */
    int max_rows;
    unsigned long long rng;
};

static int32_t rand_tok(struct ctx *c) {
    c->rng = c->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (int32_t)((c->rng >> 33) % (unsigned long long)c->n_vocab);
}

/* Feeds n tokens of sequence q (positions pos0..) in forwards of at most chunk rows; only
 * the last row's logits. */
static smelt_status prefill(struct ctx *c, struct kv_seq *q, int pos0, int n, int chunk, struct err *e) {
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)chunk * 3);
    if (!tok) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    int32_t *pos = tok + chunk, *seq = pos + chunk;
    smelt_status st = kv_seq_reserve(&c->pool, q, pos0 + n, e);
    for (int done = 0; st == SMELT_OK && done < n;) {
        int take = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < take; i++) tok[i] = rand_tok(c), pos[i] = pos0 + done + i, seq[i] = 0;
        struct batch_seq view = kv_seq_view(q);
        struct batch b = {take, tok, pos, seq, NULL, 1, &view};
        struct model_sample ms = {1, c->greedy, NULL, 0, c->sum, c->cand, NULL};
        st = model_step(c->m, c->kv, &b, NULL, &ms, NULL, e);
        done += take;
    }
    free(tok);
    return st;
}

/* n decode steps of the nseq sequences together (one row each). */
static smelt_status decode(struct ctx *c, struct kv_seq *qs, int nseq, int pos0, int n, struct err *e) {
    int32_t tok[64], pos[64], seq[64];
    uint8_t want[64];
    struct batch_seq views[64];
    smelt_status st = SMELT_OK;
    for (int s = 0; s < nseq && st == SMELT_OK; s++) st = kv_seq_reserve(&c->pool, &qs[s], pos0 + n, e);
    for (int s = 0; s < nseq; s++) views[s] = kv_seq_view(&qs[s]), seq[s] = s, want[s] = 1;
    for (int i = 0; st == SMELT_OK && i < n; i++) {
        for (int s = 0; s < nseq; s++) tok[s] = rand_tok(c), pos[s] = pos0 + i;
        struct batch b = {nseq, tok, pos, seq, want, nseq, views};
        struct model_sample ms = {nseq, c->greedy, NULL, 0, c->sum, c->cand, NULL};
        st = model_step(c->m, c->kv, &b, NULL, &ms, NULL, e);
    }
    return st;
}

struct result {
    char test[48];
    int n_prompt, n_gen, n_batch_seqs;
    double avg_ts, std_ts, avg_ns, std_ns;
    double bound_pct; /* < 0: none */
    double samples_ts[64];
    int n_samples;
};

/* Bytes one decode step reads at context length ctx_len: weights + K/V. */
static double step_bytes(const struct model *m, double ctx_len) {
    double w = 0;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const struct tensor *t = &m->tensors[i];
        if (t == m->tok_embd && !m->hp.tied_output) w += (double)t->nb[1]; /* one row */
        else w += (double)tensor_nbytes(t);
    }
    return w + (double)model_kv_block_bytes(m, QT_F16, 1) * ctx_len;
}

static smelt_status run_test(struct ctx *c, const struct opts *o, int np, int ng, int nseq, struct result *r,
                             double bw, struct err *e) {
    memset(r, 0, sizeof *r);
    r->n_prompt = np, r->n_gen = ng, r->n_batch_seqs = nseq, r->bound_pct = -1;
    if (nseq > 1) snprintf(r->test, sizeof r->test, "tg%d x%d", ng, nseq);
    else if (np && ng) snprintf(r->test, sizeof r->test, "pp%d+tg%d", np, ng);
    else if (np) snprintf(r->test, sizeof r->test, "pp%d", np);
    else snprintf(r->test, sizeof r->test, "tg%d", ng);
    if (o->depth) snprintf(r->test + strlen(r->test), sizeof r->test - strlen(r->test), " @ d%d", o->depth);
    double sum = 0, sum2 = 0;
    for (int rep = -1; rep < o->reps; rep++) { /* rep -1: warm-up */
        struct kv_seq qs[64];
        for (int s = 0; s < nseq; s++) kv_seq_init(&qs[s]);
        smelt_status st = SMELT_OK;
        for (int s = 0; s < nseq && st == SMELT_OK; s++)
            if (o->depth) st = prefill(c, &qs[s], 0, o->depth, o->n_ubatch, e);
        double t0 = now_s();
        if (st == SMELT_OK && np) st = prefill(c, &qs[0], o->depth, np, o->n_ubatch, e);
        if (st == SMELT_OK && ng) st = decode(c, qs, nseq, o->depth + (nseq > 1 ? 0 : np), ng, e);
        double dt = now_s() - t0;
        for (int s = 0; s < nseq; s++) kv_seq_release(&c->pool, &qs[s]);
        if (st != SMELT_OK) return st;
        if (rep < 0) continue;
        double ts = (double)(np + ng * nseq) / dt;
        r->samples_ts[r->n_samples++] = ts;
        sum += dt;
        sum2 += dt * dt;
    }
    int n = r->n_samples;
    double mean = sum / n;
    r->avg_ns = mean * 1e9;
    r->std_ns = n > 1 ? sqrt(fmax(0, (sum2 - n * mean * mean) / (n - 1))) * 1e9 : 0;
    double s1 = 0, s2 = 0;
    for (int i = 0; i < n; i++) s1 += r->samples_ts[i], s2 += r->samples_ts[i] * r->samples_ts[i];
    r->avg_ts = s1 / n;
    r->std_ts = n > 1 ? sqrt(fmax(0, (s2 - n * r->avg_ts * r->avg_ts) / (n - 1))) : 0;
    if (bw > 0 && ng && !np) {
        /* decode rows: the bound for nseq rows per step (weights read once per step) */
        double bytes = step_bytes(c->m, o->depth + ng / 2.0);
        double bound_steps = bw * 1e9 / bytes; /* steps per second */
        r->bound_pct = 100.0 * (r->avg_ts / nseq) / bound_steps;
    }
    return SMELT_OK;
}

static void human_size(double b, char *buf, size_t n) { snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024)); }

static void print_results(const struct opts *o, const char *model_desc, double size_b, double params,
                          const char *backend, const struct result *rs, int nr) {
    char size[32];
    human_size(size_b, size, sizeof size);
    bool json = !strcmp(o->output, "json"), jsonl = !strcmp(o->output, "jsonl");
    if (!strcmp(o->output, "md")) {
        printf("| model                          |       size |     params | backend    | threads |            test |                  t/s | %% of bound |\n");
        printf("| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: | ---------: |\n");
        for (int i = 0; i < nr; i++) {
            char ts[48], pct[16] = "";
            snprintf(ts, sizeof ts, "%.2f ± %.2f", rs[i].avg_ts, rs[i].std_ts);
            if (rs[i].bound_pct >= 0) snprintf(pct, sizeof pct, "%.1f", rs[i].bound_pct);
            printf("| %-30s | %10s | %8.2f B | %-10s | %7d | %15s | %20s | %10s |\n", model_desc, size, params / 1e9,
                   backend, o->threads, rs[i].test, ts, pct);
        }
    } else if (!strcmp(o->output, "csv")) {
        printf("model_filename,model_type,model_size,model_n_params,backends,n_threads,n_batch,n_ubatch,"
               "n_prompt,n_gen,n_depth,n_seqs,test,avg_ns,stddev_ns,avg_ts,stddev_ts,bound_pct\n");
        for (int i = 0; i < nr; i++)
            printf("\"%s\",\"%s\",%.0f,%.0f,%s,%d,%d,%d,%d,%d,%d,%d,\"%s\",%.0f,%.0f,%.6f,%.6f,%.2f\n", o->model, model_desc,
                   size_b, params, backend, o->threads, o->n_batch, o->n_ubatch, rs[i].n_prompt, rs[i].n_gen,
                   o->depth, rs[i].n_batch_seqs, rs[i].test, rs[i].avg_ns, rs[i].std_ns, rs[i].avg_ts,
                   rs[i].std_ts, rs[i].bound_pct);
    } else {
        if (json) printf("[\n");
        for (int i = 0; i < nr; i++) {
            printf("%s{\"model_filename\": \"%s\", \"model_type\": \"%s\", \"model_size\": %.0f, "
                   "\"model_n_params\": %.0f, \"backends\": \"%s\", \"n_threads\": %d, \"n_batch\": %d, "
                   "\"n_ubatch\": %d, \"n_prompt\": %d, \"n_gen\": %d, \"n_depth\": %d, \"n_seqs\": %d, "
                   "\"test\": \"%s\", \"avg_ns\": %.0f, \"stddev_ns\": %.0f, \"avg_ts\": %.6f, "
                   "\"stddev_ts\": %.6f, \"bound_pct\": %.2f, \"samples_ts\": [",
                   json ? "  " : "", o->model, model_desc, size_b, params, backend, o->threads, o->n_batch,
                   o->n_ubatch, rs[i].n_prompt, rs[i].n_gen, o->depth, rs[i].n_batch_seqs, rs[i].test, rs[i].avg_ns,
                   rs[i].std_ns, rs[i].avg_ts, rs[i].std_ts, rs[i].bound_pct);
            for (int k = 0; k < rs[i].n_samples; k++) printf("%s%.6f", k ? ", " : "", rs[i].samples_ts[k]);
            printf("]}%s\n", json && i + 1 < nr ? "," : "");
        }
        if (json) printf("]\n");
    }
    (void)jsonl;
}

int cmd_bench(int argc, char **argv) {
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    struct err e = {0};
    char path[4096];
    struct gguf_file *f = NULL;
    struct backend *bk = NULL;
    struct ctx c;
    memset(&c, 0, sizeof c);
    c.rng = 0x5eed;
    int max_seqs = 1;
    for (int i = 0; i < o.n_batched; i++) max_seqs = o.batched[i] > max_seqs ? o.batched[i] : max_seqs;
    if (max_seqs > 64) {
        fprintf(stderr, "smelt bench: -B is at most 64 sequences\n");
        return 2;
    }
    smelt_status st = cli_resolve_model(o.model, false, path, sizeof path, &e);
    if (st == SMELT_OK) st = gguf_open(&f, path, &e);
    if (st == SMELT_OK) st = cli_backend_new(o.backend, o.device, o.threads, &bk, &e);
    if (st == SMELT_OK) st = model_load(&c.m, f, bk, &e);
    int max_np = o.pg_p, max_ng = o.pg_t;
    for (int i = 0; i < o.n_np; i++) max_np = o.n_prompt[i] > max_np ? o.n_prompt[i] : max_np;
    for (int i = 0; i < o.n_ng; i++) max_ng = o.n_gen[i] > max_ng ? o.n_gen[i] : max_ng;
    int per_seq = o.depth + max_np + max_ng + BLOCK;
    int n_blocks = max_seqs * ((per_seq + BLOCK - 1) / BLOCK) + 1;
    if (st == SMELT_OK) st = model_kv_new(c.m, QT_F16, BLOCK, n_blocks, &c.kv, &e);
    if (st == SMELT_OK) st = kv_pool_init(&c.pool, n_blocks, BLOCK, &e);
    if (st == SMELT_OK) {
        c.n_vocab = c.m->hp.n_vocab;
        c.max_rows = max_seqs;
        c.greedy = calloc((size_t)max_seqs, sizeof *c.greedy);
        c.sum = calloc((size_t)max_seqs, sizeof *c.sum);
        c.cand = calloc((size_t)max_seqs * TOPK_MAX, sizeof *c.cand);
        if (!c.greedy || !c.sum || !c.cand) st = err_set(&e, SMELT_ERR_NOMEM, "out of memory");
        for (int i = 0; c.greedy && i < max_seqs; i++)
            c.greedy[i] = (struct topk_row){.k = 1, .inv_t = 1.0f};
    }
    struct result rs[3 * MAX_LIST + 1];
    int nr = 0;
    bool cuda = cli_backend_is_cuda(o.backend);
    double bw = o.bw_gbs > 0 ? o.bw_gbs : (cuda ? 4380.0 : 0.0);
    for (int i = 0; st == SMELT_OK && i < o.n_np; i++)
        if (o.n_prompt[i] > 0) st = run_test(&c, &o, o.n_prompt[i], 0, 1, &rs[nr++], bw, &e);
    for (int i = 0; st == SMELT_OK && i < o.n_ng; i++)
        if (o.n_gen[i] > 0) st = run_test(&c, &o, 0, o.n_gen[i], 1, &rs[nr++], bw, &e);
    if (st == SMELT_OK && (o.pg_p || o.pg_t)) st = run_test(&c, &o, o.pg_p, o.pg_t, 1, &rs[nr++], bw, &e);
    for (int i = 0; st == SMELT_OK && i < o.n_batched; i++)
        for (int j = 0; st == SMELT_OK && j < o.n_ng; j++)
            if (o.n_gen[j] > 0) st = run_test(&c, &o, 0, o.n_gen[j], o.batched[i], &rs[nr++], bw, &e);
    if (st == SMELT_OK) {
        char desc[96];
        struct gguf_str name = {0};
        gguf_get_str(f, "general.name", &name, NULL);
        char nm[64] = "";
        if (name.ptr) gguf_str_copy(name, nm, sizeof nm);
        uint32_t ft = 0;
        gguf_get_u32(f, "general.file_type", &ft, NULL);
        double params = 0, size = 0;
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(f, i);
            params += (double)t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
            size += (double)t->nbytes;
        }
        snprintf(desc, sizeof desc, "%s %s", c.m->hp.arch, nm[0] ? nm : "");
        print_results(&o, desc, size, params, cuda ? "CUDA" : "CPU", rs, nr);
    }
    free(c.greedy);
    free(c.sum);
    free(c.cand);
    if (c.kv) model_kv_free(c.m, c.kv);
    kv_pool_free(&c.pool);
    model_free(c.m);
    if (bk) bk_free(bk);
    gguf_close(f);
    if (st != SMELT_OK) return cli_fail("bench", &e);
    return 0;
}
