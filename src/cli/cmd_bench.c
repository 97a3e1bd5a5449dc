/* smelt bench: prefill and decode speed with llama-bench's flags and output fields, so
 * rows line up with `llama-bench` output; plus a batched mode (N sequences decoding
 * together, like llama-batched-bench) and, for decode rows, the percent of the memory-
 * bandwidth bound.
 *
 * Flags follow llama-bench (tools/llama-bench/README.md): the test parameters take lists,
 * comma-separated ("-p 128,512"), repeated ("-n 16 -n 32") or as ranges ("first-last",
 * "first-last+step", "first-last*mult"); -pg takes "pp,tg" pairs. Every combination of
 * -m, -t, -b, -ub and -d runs the pp tests, then the tg tests, then the pg tests (then
 * smelt's batched ones), each repeated -r times after one warm-up run.
 *
 * Tests:
 *   ppN      N prompt tokens in forwards of at most min(-b, -ub) tokens; the last row's
 *            logits are reduced to its greedy summary on the device (model_step with
 *            k = 1: the token id comes back, as in serving), not copied whole
 *   tgN      N single-token decode steps after a prompt of -d tokens (depth)
 *   ppP+tgT  (-pg P,T) a prompt then T decode steps, timed together
 *   tgN xB   (-B B) B sequences, each after a -d token prompt, decoding N steps in one
 *            batch of B rows: aggregate decode tokens/s (llama-batched-bench's S_TG)
 *   tgN vR   (--verify-rows R, with -n and -B) the shape of speculative verify steps: every
 *            step feeds R rows of each sequence, each with its logits summarized, and moves
 *            R positions on (as if every draft were accepted): t/s is then the ceiling of
 *            speculation with k = R - 1, and R B / t/s the step time, the verify cost that
 *            docs/speculative.md projects speedups from
 * Tokens are random ids: the speed of a dense model does not depend on them. t/s is
 * (n_prompt + n_gen * B) / time per run, averaged over the runs (llama-bench's avg_ts);
 * standard deviations are the sample ones.
 *
 * Output (-o): md (llama-bench's table: model, size, params, backend, ngl on a GPU,
 * threads on the CPU or when given, n_batch / n_ubatch when not the defaults, test, t/s;
 * then smelt's "bw %" column when a bound is known), json, jsonl, csv (llama-bench's field
 * names and value formats for the fields smelt has, then n_seqs, bw_pct and bw_gbs).
 *
 * The bound of a decode step is bandwidth / bytes read: every weight once as the device
 * holds it (token_embd only for the rows it gathers, unless it is also the output matrix;
 * of a mixture of experts' expert tensors only the experts the step's rows select: k of
 * n_expert for one row, n (1 - (1 - k/n)^B) expected for B rows routed at random, the
 * "active bytes", expert biases included; not the MTP layers a hybrid file carries, which no
 * step runs) plus the K and V of every sequence's context (at the run's middle; a
 * sliding-window layer reads at most its window) and, with recurrent layers, each
 * sequence's state read and written back. The bandwidth is
 * --bw (GB/s); on CUDA, unless given, the device's read bandwidth measured once per run
 * before the model loads (cuda_read_bandwidth: a sum over two 1 GiB buffers, as TARGETS.md's
 * 4.38 TB/s on the H200 was measured), so the percentages hold on any GPU; on the CPU no
 * bound is printed unless given, or measured (--bw measure: cpu_read_bandwidth, a
 * STREAM-like read of a step's bytes with the bench's threads).
 *
 * Speculative decoding (--spec, --draft, --spec-k, ...: cli/clispec.h): the tg and batched
 * tests then generate through the engine, greedily and past end-of-generation, from a real
 * prompt (-f FILE, raw text; default: a short repeat-and-edit C prompt) rather than random
 * ids: each runs without speculation, then with it ("+spec" in the test name), and the spec
 * row adds the acceptance rate and tokens per verify step. t/s counts the tokens after the
 * first of each sequence over the time from the first one to the last (decode only). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/clibackend.h"
#include "cli/climem.h"
#include "cli/clispec.h"
#include "cli/modelref.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "model/model.h"
#include "tokenizer/tok.h"
#include "util/file.h"

#ifdef SMELT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#endif

#include "build_info.h" /* generated at build time: cmake/build_info.cmake */
#include "util/clock.h"

#define BLOCK 16
#define MAX_LIST 64
#define MAX_SEQS 64
#define MAX_REPS 1000
#define MAX_ROWS (MAX_SEQS * (SPEC_K_MAX + 1)) /* rows of a decode step */

struct list {
    int v[MAX_LIST];
    int n;
};

struct opts {
    const char *models[MAX_LIST];
    int n_models;
    const char *backend, *output;
    struct list n_prompt, n_gen, depth, n_batch, n_ubatch, threads, batched, vrows;
    int pg[MAX_LIST][2], n_pg;
    int reps, device, ngl, n_cpu_moe;
    bool no_warmup, threads_given, bw_measure;
    double bw_gbs;
    struct cli_spec spec;
    const char *prompt_file; /* -f: the generation tests' prompt with speculation */
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: smelt bench -m MODEL [options]\n"
            "Measures prefill and decode speed; flags and output fields follow llama-bench.\n"
            "Test parameters take lists: 1,2,4 or repeated flags or ranges first-last[+step|*mult].\n"
            "  -m, --model REF          GGUF file, directory or org/repo[:quant] (cached); repeatable\n"
            "  -p, --n-prompt N         prompt lengths (default 512; 0 skips)\n"
            "  -n, --n-gen N            generated tokens (default 128; 0 skips)\n"
            "  -pg P,T                  a prompt of P then T generated tokens, timed together\n"
            "  -d, --n-depth N          tokens already in the cache before each test (default 0)\n"
            "  -b, --batch-size N       most tokens per forward (default 2048)\n"
            "  -ub, --ubatch-size N     prompt chunk per forward (default 512)\n"
            "  -t, --threads N          CPU threads (default: all cores)\n"
            "  -r, --repetitions N      timed runs per test after one warm-up (default 5)\n"
            "  --no-warmup              skip the warm-up run\n"
            "  -ngl, --n-gpu-layers N   0 runs on the CPU; other values use the GPU (smelt puts\n"
            "                           all layers on one device)\n"
            "  --backend auto|cpu|cuda, --device N (also -mg, --main-gpu N)\n"
            "  -ncmoe, --n-cpu-moe N    the experts of the first N layers in host memory, run on\n"
            "                           the CPU (with a GPU backend)\n"
            "  -B, --batched N          N sequences decoding together (aggregate tok/s), with each -n\n"
            "  --verify-rows R          decode steps of R rows per sequence (speculation's verify\n"
            "                           shape; 1..17, default 1)\n"
            "  --bw GB/S|measure        bandwidth for the decode bound (CUDA default: the device's\n"
            "                           read bandwidth, measured at start; CPU default: none);\n"
            "                           measure: the CPU's read bandwidth over a step's bytes\n"
            "  -o, --output md|json|jsonl|csv   (default md)\n"
            "  -f FILE                  with speculation: the prompt (raw text) of the tg tests\n"
            "%s", cli_spec_usage);
}

/* ---- arguments ---- */

static bool parse_int(const char **p, long *out) {
    char *end;
    if (**p < '0' || **p > '9') return false;
    *out = strtol(*p, &end, 10);
    if (end == *p || *out > 10000000) return false;
    *p = end;
    return true;
}

/* Appends "a,b,c", each item N or first-last[+step|*mult] (llama-bench's ranges). */
static bool parse_list(const char *s, struct list *l) {
    const char *p = s;
    while (*p) {
        long first, last, step = 1;
        char op = '+';
        if (!parse_int(&p, &first)) return false;
        last = first;
        if (*p == '-') {
            p++;
            if (!parse_int(&p, &last) || last < first) return false;
            if (*p == '+' || *p == '*') {
                op = *p++;
                if (!parse_int(&p, &step)) return false;
                if (step < (op == '+' ? 1 : 2)) return false;
            }
        }
        for (long v = first; v <= last; v = op == '+' ? v + step : v * step) {
            if (l->n >= MAX_LIST) return false;
            l->v[l->n++] = (int)v;
            if (op == '*' && v == 0) break; /* 0 * mult never grows */
        }
        if (*p == ',') p++;
        else if (*p) return false;
    }
    return true;
}

static bool parse_pg(const char *s, struct opts *o) {
    int a, b, n = 0;
    if (sscanf(s, "%d,%d%n", &a, &b, &n) != 2 || s[n] || a < 0 || b < 0 || o->n_pg >= MAX_LIST)
        return false;
    o->pg[o->n_pg][0] = a;
    o->pg[o->n_pg][1] = b;
    o->n_pg++;
    return true;
}

static bool parse_num(const char *s, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > 100000000) return false;
    *out = (int)v;
    return true;
}

static int parse_args(int argc, char **argv, struct opts *o) {
    memset(o, 0, sizeof *o);
    o->reps = 5, o->ngl = -1;
    o->backend = "auto", o->output = "md";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define IS(s, l) (!strcmp(a, s) || !strcmp(a, l))
        if (IS("-h", "--help")) {
            usage(stdout);
            return 0;
        }
        if (IS("--no-warmup", "--no-warmup")) {
            o->no_warmup = true;
            continue;
        }
        int sr = cli_spec_arg(&o->spec, "bench", argc, argv, &i);
        if (sr == 2) return 2;
        if (sr == 1) continue;
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "smelt bench: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        bool ok = true;
        if (IS("-m", "--model")) {
            if (o->n_models < MAX_LIST) o->models[o->n_models++] = v;
        } else if (IS("-p", "--n-prompt")) ok = parse_list(v, &o->n_prompt);
        else if (IS("-n", "--n-gen")) ok = parse_list(v, &o->n_gen);
        else if (IS("-pg", "-pg")) ok = parse_pg(v, o);
        else if (IS("-d", "--n-depth")) ok = parse_list(v, &o->depth);
        else if (IS("-b", "--batch-size")) ok = parse_list(v, &o->n_batch);
        else if (IS("-ub", "--ubatch-size")) ok = parse_list(v, &o->n_ubatch);
        else if (IS("-t", "--threads")) ok = parse_list(v, &o->threads), o->threads_given = true;
        else if (IS("-B", "--batched")) ok = parse_list(v, &o->batched);
        else if (IS("--verify-rows", "--verify-rows")) ok = parse_list(v, &o->vrows);
        else if (IS("-r", "--repetitions")) ok = parse_num(v, 1, &o->reps) && o->reps <= MAX_REPS;
        else if (IS("-ngl", "--n-gpu-layers")) ok = parse_num(v, -1, &o->ngl);
        else if (IS("--backend", "--backend")) o->backend = v;
        else if (IS("-ncmoe", "--n-cpu-moe")) ok = parse_num(v, 0, &o->n_cpu_moe);
        else if (IS("--device", "-mg") || IS("--main-gpu", "--main-gpu")) ok = parse_num(v, 0, &o->device);
        else if (IS("--bw", "--bw")) {
            if (!strcmp(v, "measure")) o->bw_measure = true;
            else ok = (o->bw_gbs = atof(v)) > 0;
        }
        else if (IS("-o", "--output")) o->output = v;
        else if (IS("-f", "--file")) o->prompt_file = v;
        else {
            fprintf(stderr, "smelt bench: unknown option %s (see --help)\n", a);
            return 2;
        }
#undef IS
        if (!ok) {
            fprintf(stderr, "smelt bench: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    if (!o->n_models) {
        fprintf(stderr, "smelt bench: -m MODEL is required\n");
        return 2;
    }
    /* llama-bench's defaults for the lists not given */
    if (!o->n_prompt.n) o->n_prompt = (struct list){{512}, 1};
    if (!o->n_gen.n) o->n_gen = (struct list){{128}, 1};
    if (!o->depth.n) o->depth = (struct list){{0}, 1};
    if (!o->n_batch.n) o->n_batch = (struct list){{2048}, 1};
    if (!o->n_ubatch.n) o->n_ubatch = (struct list){{512}, 1};
    if (!o->threads.n) o->threads = (struct list){{0}, 1};
    if (!o->vrows.n) o->vrows = (struct list){{1}, 1};
    for (int i = 0; i < o->vrows.n; i++)
        if (o->vrows.v[i] < 1 || o->vrows.v[i] > SPEC_K_MAX + 1)
            return fprintf(stderr, "smelt bench: --verify-rows is 1 to %d\n", SPEC_K_MAX + 1), 2;
    for (int i = 0; i < o->n_batch.n; i++)
        if (o->n_batch.v[i] < 1) return fprintf(stderr, "smelt bench: -b must be >= 1\n"), 2;
    for (int i = 0; i < o->n_ubatch.n; i++)
        if (o->n_ubatch.v[i] < 1) return fprintf(stderr, "smelt bench: -ub must be >= 1\n"), 2;
    for (int i = 0; i < o->batched.n; i++)
        if (o->batched.v[i] < 1 || o->batched.v[i] > MAX_SEQS)
            return fprintf(stderr, "smelt bench: -B is 1 to %d sequences\n", MAX_SEQS), 2;
    if (o->ngl == 0) o->backend = "cpu";
    if (strcmp(o->output, "md") && strcmp(o->output, "json") && strcmp(o->output, "jsonl") &&
        strcmp(o->output, "csv")) {
        fprintf(stderr, "smelt bench: -o must be md, json, jsonl or csv\n");
        return 2;
    }
    return -1;
}

static int list_max(const struct list *l) {
    int m = 0;
    for (int i = 0; i < l->n; i++) m = l->v[i] > m ? l->v[i] : m;
    return m;
}

/* ---- running the tests ---- */

struct ctx {
    struct model *m;
    struct kv_store *kv;
    struct kv_pool pool;
    int n_vocab;
    struct topk_row greedy[MAX_ROWS];  /* k = 1 requests */
    struct topk_summary sum[MAX_ROWS];
    struct topk_cand *cand;            /* (MAX_ROWS, TOPK_MAX), unused by k = 1 rows */
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
        struct model_sample ms = {.n_rows = 1, .rows = c->greedy, .sum = c->sum, .cand = c->cand};
        st = model_step(c->m, c->kv, &b, NULL, &ms, NULL, e);
        done += take;
    }
    free(tok);
    return st;
}

/* n tokens of the nseq sequences together, vr rows (positions) of each per step. */
static smelt_status decode(struct ctx *c, struct kv_seq *qs, int nseq, int pos0, int n, int vr,
                           struct err *e) {
    static int32_t tok[MAX_ROWS], pos[MAX_ROWS], seq[MAX_ROWS];
    static uint8_t want[MAX_ROWS];
    struct batch_seq views[MAX_SEQS];
    smelt_status st = SMELT_OK;
    int steps = (n + vr - 1) / vr;
    for (int s = 0; s < nseq && st == SMELT_OK; s++)
        st = kv_seq_reserve(&c->pool, &qs[s], pos0 + steps * vr, e);
    for (int s = 0; s < nseq; s++) views[s] = kv_seq_view(&qs[s]);
    for (int i = 0; st == SMELT_OK && i < steps; i++) {
        int rows = 0;
        for (int s = 0; s < nseq; s++)
            for (int j = 0; j < vr; j++, rows++)
                tok[rows] = rand_tok(c), pos[rows] = pos0 + i * vr + j, seq[rows] = s, want[rows] = 1;
        struct batch b = {rows, tok, pos, seq, want, nseq, views};
        struct model_sample ms = {.n_rows = rows, .rows = c->greedy, .sum = c->sum, .cand = c->cand};
        st = model_step(c->m, c->kv, &b, NULL, &ms, NULL, e);
    }
    return st;
}

/* One test instance and its measurements. */
struct row {
    const char *model_filename;
    const char *model_type;
    double model_size, model_n_params;
    int n_batch, n_ubatch, n_threads, n_prompt, n_gen, n_depth, n_seqs;
    int n_vrows; /* rows per sequence in a decode step (1: plain decoding) */
    char test_time[32];
    uint64_t samples_ns[MAX_REPS];
    double samples_ts[MAX_REPS];
    int n_samples;
    uint64_t avg_ns, std_ns;
    double avg_ts, std_ts;
    double bw_pct; /* < 0: none */
    double bw_gbs; /* the bandwidth bw_pct is taken against (< 0: none) */
    const char *spec; /* speculation: "off" or the proposer (engine tests); NULL: raw test */
    uint64_t spec_proposed, spec_accepted;
    double spec_tps; /* tokens a verify step emitted, on average */
};

/* Bytes one decode step of nseq sequences moves at context length ctx_len each: the
 * weights of the layers it runs as the backend holds them (the selected experts only, with
 * their biases), the K/V of every sequence in the attention layers (a sliding-window
 * layer's last `window` positions only), and its recurrent state (read and written). */
static double step_bytes(const struct model *m, int nseq, double ctx_len) {
    /* the expected share of each expert tensor read: distinct experts among nseq rows
     * each choosing k of n at random, over n */
    const double n = m->hp.n_expert, k = m->hp.n_expert_used;
    const double expert_share = n > 0 ? 1.0 - pow(1.0 - k / n, nseq) : 1.0;
    double w = 0;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const struct tensor *t = &m->tensors[i];
        int il = -1; /* blk.{n_layer}..: an MTP layer, loaded and not run */
        if (t->name && sscanf(t->name, "blk.%d.", &il) == 1 && il >= m->hp.n_layer) continue;
        double b = (double)bk_weight_bytes(m->bk, t->type, t->ne);
        if (b == 0) b = (double)tensor_nbytes(t);
        if (t == m->tok_embd && !m->hp.tied_output) b = b / (double)t->ne[1] * nseq; /* rows */
        const bool expert_bias = t->name && strstr(t->name, "_exps.bias"); /* gpt-oss */
        if (n > 1 && (t->ne[2] == m->hp.n_expert || expert_bias)) b *= expert_share;
        w += b;
    }
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (m->mem[il].kind != MEM_KV) continue; /* a recurrent layer: its state, below */
        const struct layer_attn *a = &m->layer[il];
        const double row = (double)(qtype_row_size(QT_F16, a->head_dim_k) +
                                    qtype_row_size(QT_F16, a->head_dim_v)) * a->n_head_kv;
        const int32_t win = a->attn.window;
        w += row * (win > 0 && win < ctx_len ? win : ctx_len) * nseq;
    }
    return w + 2.0 * (double)model_state_slot_bytes(m) * nseq;
}

/* Sample statistics as llama-bench computes them: mean, and the standard deviation with
 * Bessel's correction. */
static double mean_of(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : 0;
}

static double stdev_of(const double *v, int n) {
    if (n <= 1) return 0;
    double m = mean_of(v, n), s = 0;
    for (int i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
    return sqrt(s / (n - 1));
}

/* The row's means and standard deviations from its samples. */
static void row_stats(struct row *r) {
    int n = r->n_samples;
    double ns_d[MAX_REPS] = {0};
    for (int i = 0; i < n; i++) ns_d[i] = (double)r->samples_ns[i];
    r->avg_ns = (uint64_t)mean_of(ns_d, n);
    r->std_ns = (uint64_t)stdev_of(ns_d, n);
    r->avg_ts = mean_of(r->samples_ts, n);
    r->std_ts = stdev_of(r->samples_ts, n);
}

static smelt_status run_test(struct ctx *c, const struct opts *o, struct row *r, int chunk,
                             double bw, struct err *e) {
    int np = r->n_prompt, ng = r->n_gen, nseq = r->n_seqs, depth = r->n_depth;
    time_t now = time(NULL);
    struct tm tmv;
    strftime(r->test_time, sizeof r->test_time, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
    r->bw_pct = r->bw_gbs = -1;
    for (int rep = o->no_warmup ? 0 : -1; rep < o->reps; rep++) { /* rep -1: warm-up */
        struct kv_seq qs[MAX_SEQS];
        for (int s = 0; s < nseq; s++) kv_seq_init(&qs[s]);
        smelt_status st = SMELT_OK;
        for (int s = 0; s < nseq && st == SMELT_OK; s++)
            if (depth) st = prefill(c, &qs[s], 0, depth, chunk, e);
        double t0 = clock_now();
        if (st == SMELT_OK && np) st = prefill(c, &qs[0], depth, np, chunk, e);
        if (st == SMELT_OK && ng) st = decode(c, qs, nseq, depth + np, ng, r->n_vrows, e);
        double dt = clock_now() - t0;
        for (int s = 0; s < nseq; s++) kv_seq_release(&c->pool, &qs[s]);
        if (st != SMELT_OK) return st;
        if (rep < 0) continue;
        uint64_t ns = (uint64_t)(dt * 1e9);
        if (ns == 0) ns = 1;
        r->samples_ns[r->n_samples] = ns;
        r->samples_ts[r->n_samples] = 1e9 * (double)(np + ng * nseq) / (double)ns;
        r->n_samples++;
    }
    row_stats(r);
    if (bw > 0 && ng && !np) {
        /* steps per second achieved against the bound's: bandwidth / bytes of a step */
        double bytes = step_bytes(c->m, nseq, depth + ng / 2.0);
        r->bw_pct = 100.0 * (r->avg_ts / nseq) / (bw * 1e9 / bytes);
        r->bw_gbs = bw;
    }
    return SMELT_OK;
}

/* ---- generation through the engine (with speculation) ---- */

/* A repeat-and-edit prompt: code the model is asked to write again with a change, the case
 * n-gram lookup is for (-f replaces it). */
static const char default_prompt[] =
    "// Rewrite this function so that it skips negative numbers; keep the rest as it is.\n"
    "int sum_positive(const int *a, int n) {\n"
    "    int s = 0;\n"
    "    for (int i = 0; i < n; i++) {\n"
    "        s += a[i];\n"
    "    }\n"
    "    return s;\n"
    "}\n"
    "// The rewritten function:\n";

/* r->n_seqs sequences of r->n_gen greedy tokens from prompt through en; t/s over the
 * decode span (first token to last), the speculation counts from the final events. */
static smelt_status run_engine_test(struct engine *en, const struct opts *o, struct row *r,
                                    const int32_t *prompt, int n_prompt, struct err *e) {
    time_t now = time(NULL);
    struct tm tmv;
    strftime(r->test_time, sizeof r->test_time, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
    r->bw_pct = -1;
    int ns = r->n_seqs;
    for (int rep = o->no_warmup ? 0 : -1; rep < o->reps; rep++) {
        struct engine_req *rq[MAX_SEQS] = {0};
        struct engine_params p;
        engine_params_default(&p);
        p.sp.temperature = 0;
        p.max_tokens = r->n_gen;
        p.ignore_eos = true;
        smelt_status st = SMELT_OK;
        for (int i = 0; i < ns && st == SMELT_OK; i++) {
            st = engine_req_new(&rq[i], &p, prompt, n_prompt, e);
            if (st == SMELT_OK) st = engine_submit(en, rq[i], e);
        }
        double t0 = 1e300, t1 = 0;
        uint64_t prop = 0, acc = 0;
        int64_t toks = 0;
        for (int i = 0; i < ns && rq[i]; i++) {
            struct engine_out out = {0};
            bool done = false;
            while (st == SMELT_OK && !done) {
                if (!engine_req_wait(rq[i], &out, -1)) continue;
                for (size_t k = 0; k < out.n_ev; k++) {
                    const struct engine_event *ev = &out.ev[k];
                    if (!ev->finish) continue;
                    if (ev->finish == ENGINE_ERROR)
                        st = err_set(e, SMELT_ERR_INTERNAL, "generation failed: %s", out.error);
                    prop += (uint64_t)ev->n_proposed;
                    acc += (uint64_t)ev->n_accepted;
                    toks += ev->n_gen - 1;
                }
                done = out.done;
            }
            engine_out_free(&out);
            double ts, tf, te;
            engine_req_times(rq[i], &ts, &tf, &te);
            if (tf < t0) t0 = tf;
            if (te > t1) t1 = te;
        }
        for (int i = 0; i < ns; i++) engine_req_unref(rq[i]);
        if (st != SMELT_OK) return st;
        if (rep < 0) continue;
        double dt = t1 > t0 ? t1 - t0 : 1e-9;
        r->samples_ns[r->n_samples] = (uint64_t)(dt * 1e9);
        r->samples_ts[r->n_samples] = (double)toks / dt;
        r->n_samples++;
        r->spec_proposed += prop;
        r->spec_accepted += acc;
    }
    struct engine_stats es;
    engine_stats(en, &es);
    r->spec_tps = es.spec_steps ? 1.0 + (double)es.spec_accepted / (double)es.spec_steps : 0.0;
    row_stats(r);
    return SMELT_OK;
}

/* ---- output ---- */

struct printer {
    const struct opts *o;
    const char *backend;  /* "CPU", "CUDA" */
    char cpu_info[128], gpu_info[260];
    bool md, json, jsonl, csv, show_bw, show_spec;
    int n_rows;
};

static void test_name(const struct row *r, char *buf, size_t n) {
    if (r->n_prompt > 0 && r->n_gen == 0) snprintf(buf, n, "pp%d", r->n_prompt);
    else if (r->n_gen > 0 && r->n_prompt == 0) snprintf(buf, n, "tg%d", r->n_gen);
    else snprintf(buf, n, "pp%d+tg%d", r->n_prompt, r->n_gen);
    if (r->n_seqs > 1) snprintf(buf + strlen(buf), n - strlen(buf), " x%d", r->n_seqs);
    if (r->n_vrows > 1) snprintf(buf + strlen(buf), n - strlen(buf), " v%d", r->n_vrows);
    if (r->n_depth > 0) snprintf(buf + strlen(buf), n - strlen(buf), " @ d%d", r->n_depth);
    if (r->spec && strcmp(r->spec, "off"))
        snprintf(buf + strlen(buf), n - strlen(buf), " +%s", r->spec);
}

static double accept_pct(const struct row *r) {
    return r->spec_proposed ? 100.0 * (double)r->spec_accepted / (double)r->spec_proposed : 0.0;
}

/* md columns (llama-bench's selection and widths; negative: left-aligned) */
struct col {
    const char *name;
    int width;
};

static int md_cols(const struct printer *p, struct col *c) {
    const struct opts *o = p->o;
    bool cpu = !strcmp(p->backend, "CPU");
    int n = 0;
    c[n++] = (struct col){"model", -30};
    c[n++] = (struct col){"size", 10};
    c[n++] = (struct col){"params", 10};
    c[n++] = (struct col){"backend", -10};
    if (!cpu) c[n++] = (struct col){"ngl", 3};
    if (cpu || o->threads_given) c[n++] = (struct col){"threads", 7};
    if (o->n_batch.n > 1 || o->n_batch.v[0] != 2048) c[n++] = (struct col){"n_batch", 7};
    if (o->n_ubatch.n > 1 || o->n_ubatch.v[0] != 512) c[n++] = (struct col){"n_ubatch", 8};
    c[n++] = (struct col){"test", p->show_spec ? 22 : 15};
    c[n++] = (struct col){"t/s", 20};
    if (p->show_bw) c[n++] = (struct col){"bw %", 6};
    if (p->show_spec) c[n++] = (struct col){"accept %", 8};
    return n;
}

static void print_header(struct printer *p) {
    if (p->md) {
        struct col c[16];
        int n = md_cols(p, c);
        printf("|");
        for (int i = 0; i < n; i++) printf(" %*s |", c[i].width, c[i].name);
        printf("\n|");
        for (int i = 0; i < n; i++) {
            int w = abs(c[i].width);
            putchar(' ');
            for (int k = 0; k < w - 1; k++) putchar('-');
            printf("%c |", c[i].width > 0 ? ':' : '-');
        }
        printf("\n");
    } else if (p->csv) {
        printf("build_commit,build_number,cpu_info,gpu_info,backends,model_filename,model_type,"
               "model_size,model_n_params,n_batch,n_ubatch,n_threads,type_k,type_v,n_gpu_layers,"
               "main_gpu,n_prompt,n_gen,n_depth,test_time,avg_ns,stddev_ns,avg_ts,stddev_ts,"
               "n_seqs,bw_pct,bw_gbs%s\n", p->show_spec ? ",spec,spec_proposed,spec_accepted" : "");
    } else if (p->json) {
        printf("[\n");
    }
    fflush(stdout);
}

/* A JSON string body (the values here are paths and names: quotes, backslashes, controls). */
static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

static void csv_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"') putchar('"');
        putchar(*s);
    }
    putchar('"');
}

static void print_row(struct printer *p, const struct row *r) {
    const struct opts *o = p->o;
    char test[64];
    test_name(r, test, sizeof test);
    if (p->md) {
        struct col c[16];
        int n = md_cols(p, c);
        printf("|");
        for (int i = 0; i < n; i++) {
            char v[96];
            const char *nm = c[i].name;
            int w = c[i].width;
            if (!strcmp(nm, "model")) snprintf(v, sizeof v, "%s", r->model_type);
            else if (!strcmp(nm, "size"))
                r->model_size < 1024.0 * 1024 * 1024
                    ? snprintf(v, sizeof v, "%.2f MiB", r->model_size / 1024.0 / 1024.0)
                    : snprintf(v, sizeof v, "%.2f GiB", r->model_size / 1024.0 / 1024.0 / 1024.0);
            else if (!strcmp(nm, "params"))
                r->model_n_params < 1e9 ? snprintf(v, sizeof v, "%.2f M", r->model_n_params / 1e6)
                                        : snprintf(v, sizeof v, "%.2f B", r->model_n_params / 1e9);
            else if (!strcmp(nm, "backend")) snprintf(v, sizeof v, "%s", p->backend);
            else if (!strcmp(nm, "ngl")) snprintf(v, sizeof v, "%d", o->ngl);
            else if (!strcmp(nm, "threads")) snprintf(v, sizeof v, "%d", r->n_threads);
            else if (!strcmp(nm, "n_batch")) snprintf(v, sizeof v, "%d", r->n_batch);
            else if (!strcmp(nm, "n_ubatch")) snprintf(v, sizeof v, "%d", r->n_ubatch);
            else if (!strcmp(nm, "test")) snprintf(v, sizeof v, "%s", test);
            else if (!strcmp(nm, "t/s")) {
                snprintf(v, sizeof v, "%.2f ± %.2f", r->avg_ts, r->std_ts);
                w += 1; /* the ± is two bytes */
            } else if (!strcmp(nm, "accept %")) {
                if (r->spec && strcmp(r->spec, "off")) snprintf(v, sizeof v, "%.1f", accept_pct(r));
                else v[0] = 0;
            } else if (r->bw_pct >= 0) snprintf(v, sizeof v, "%.1f", r->bw_pct);
            else v[0] = 0;
            printf(" %*s |", w, v);
        }
        printf("\n");
    } else if (p->csv) {
        csv_str(SMELT_BUILD_COMMIT), printf(",\"%d\",", SMELT_BUILD_NUMBER);
        csv_str(p->cpu_info), putchar(','), csv_str(p->gpu_info), putchar(',');
        csv_str(p->backend), putchar(','), csv_str(r->model_filename), putchar(',');
        csv_str(r->model_type);
        printf(",\"%.0f\",\"%.0f\",\"%d\",\"%d\",\"%d\",\"f16\",\"f16\",\"%d\",\"%d\",\"%d\",\"%d\","
               "\"%d\",\"%s\",\"%llu\",\"%llu\",\"%f\",\"%f\",\"%d\",",
               r->model_size, r->model_n_params, r->n_batch, r->n_ubatch, r->n_threads, o->ngl,
               o->device, r->n_prompt, r->n_gen, r->n_depth, r->test_time,
               (unsigned long long)r->avg_ns, (unsigned long long)r->std_ns, r->avg_ts, r->std_ts,
               r->n_seqs);
        if (r->bw_pct >= 0) printf("\"%.2f\",\"%.2f\"", r->bw_pct, r->bw_gbs);
        else printf("\"\",\"\"");
        if (p->show_spec)
            printf(",\"%s\",\"%llu\",\"%llu\"", r->spec ? r->spec : "",
                   (unsigned long long)r->spec_proposed, (unsigned long long)r->spec_accepted);
        printf("\n");
    } else {
        /* json: one object per test, indented, comma-separated; jsonl: one per line */
        const char *open = p->json ? "  {\n" : "{", *sep = p->json ? ",\n" : ", ";
        const char *ind = p->json ? "    " : "";
        if (p->json && p->n_rows) printf(",\n");
        printf("%s", open);
#define KEY(k) printf("%s\"%s\": ", ind, k)
        KEY("build_commit"), json_str(SMELT_BUILD_COMMIT), printf("%s", sep);
        KEY("build_number"), printf("%d%s", SMELT_BUILD_NUMBER, sep);
        KEY("cpu_info"), json_str(p->cpu_info), printf("%s", sep);
        KEY("gpu_info"), json_str(p->gpu_info), printf("%s", sep);
        KEY("backends"), json_str(p->backend), printf("%s", sep);
        KEY("model_filename"), json_str(r->model_filename), printf("%s", sep);
        KEY("model_type"), json_str(r->model_type), printf("%s", sep);
        KEY("model_size"), printf("%.0f%s", r->model_size, sep);
        KEY("model_n_params"), printf("%.0f%s", r->model_n_params, sep);
        KEY("n_batch"), printf("%d%s", r->n_batch, sep);
        KEY("n_ubatch"), printf("%d%s", r->n_ubatch, sep);
        KEY("n_threads"), printf("%d%s", r->n_threads, sep);
        KEY("type_k"), printf("\"f16\"%s", sep);
        KEY("type_v"), printf("\"f16\"%s", sep);
        KEY("n_gpu_layers"), printf("%d%s", o->ngl, sep);
        KEY("main_gpu"), printf("%d%s", o->device, sep);
        KEY("n_prompt"), printf("%d%s", r->n_prompt, sep);
        KEY("n_gen"), printf("%d%s", r->n_gen, sep);
        KEY("n_depth"), printf("%d%s", r->n_depth, sep);
        KEY("test_time"), json_str(r->test_time), printf("%s", sep);
        KEY("avg_ns"), printf("%llu%s", (unsigned long long)r->avg_ns, sep);
        KEY("stddev_ns"), printf("%llu%s", (unsigned long long)r->std_ns, sep);
        KEY("avg_ts"), printf("%f%s", r->avg_ts, sep);
        KEY("stddev_ts"), printf("%f%s", r->std_ts, sep);
        KEY("n_seqs"), printf("%d%s", r->n_seqs, sep);
        KEY("bw_pct");
        if (r->bw_pct >= 0) printf("%.2f%s", r->bw_pct, sep);
        else printf("null%s", sep);
        KEY("bw_gbs");
        if (r->bw_gbs >= 0) printf("%.2f%s", r->bw_gbs, sep);
        else printf("null%s", sep);
        if (r->spec) {
            KEY("spec"), json_str(r->spec), printf("%s", sep);
            KEY("spec_proposed"), printf("%llu%s", (unsigned long long)r->spec_proposed, sep);
            KEY("spec_accepted"), printf("%llu%s", (unsigned long long)r->spec_accepted, sep);
            KEY("spec_accept_pct"), printf("%.2f%s", accept_pct(r), sep);
            KEY("spec_tokens_per_step"), printf("%.3f%s", r->spec_tps, sep);
        }
        KEY("samples_ns"), printf("[ ");
        for (int k = 0; k < r->n_samples; k++) printf("%s%llu", k ? ", " : "", (unsigned long long)r->samples_ns[k]);
        printf(" ]%s", sep);
        KEY("samples_ts"), printf("[ ");
        for (int k = 0; k < r->n_samples; k++) printf("%s%.6f", k ? ", " : "", r->samples_ts[k]);
        printf(" ]");
#undef KEY
        printf(p->json ? "\n  }" : "}\n");
    }
    p->n_rows++;
    fflush(stdout);
}

static void print_footer(struct printer *p) {
    if (p->md) printf("\nbuild: %s (%d)\n", SMELT_BUILD_COMMIT, SMELT_BUILD_NUMBER);
    else if (p->json) printf("\n]\n");
    fflush(stdout);
}

/* ---- the model's description (llama-bench's model_type: "arch size ftype") ---- */

static const char *ftype_name(uint32_t ft) {
    static const char *names[] = {
        [0] = "all F32",       [1] = "F16",           [2] = "Q4_0",          [3] = "Q4_1",
        [7] = "Q8_0",          [8] = "Q5_0",          [9] = "Q5_1",          [10] = "Q2_K - Medium",
        [11] = "Q3_K - Small", [12] = "Q3_K - Medium", [13] = "Q3_K - Large", [14] = "Q4_K - Small",
        [15] = "Q4_K - Medium", [16] = "Q5_K - Small", [17] = "Q5_K - Medium", [18] = "Q6_K",
        [19] = "IQ2_XXS - 2.0625 bpw", [20] = "IQ2_XS - 2.3125 bpw", [21] = "Q2_K - Small",
        [22] = "IQ3_XS - 3.3 bpw", [23] = "IQ3_XXS - 3.0625 bpw", [24] = "IQ1_S - 1.5625 bpw",
        [25] = "IQ4_NL - 4.5 bpw", [26] = "IQ3_S - 3.4375 bpw", [27] = "IQ3_S mix - 3.66 bpw",
        [28] = "IQ2_S - 2.5 bpw", [29] = "IQ2_M - 2.7 bpw", [30] = "IQ4_XS - 4.25 bpw",
        [31] = "IQ1_M - 1.75 bpw", [32] = "BF16", [36] = "TQ1_0 - 1.69 bpw ternary",
        [37] = "TQ2_0 - 2.06 bpw ternary", [38] = "MXFP4 MoE",
    };
    if (ft >= sizeof names / sizeof names[0] || !names[ft]) return "unknown, may not work";
    return names[ft];
}

static void model_desc(const struct gguf_file *f, const struct model *m, char *buf, size_t n) {
    char label[32] = "?B";
    struct gguf_str s = {0};
    if (gguf_get_str(f, "general.size_label", &s, NULL) == SMELT_OK && s.ptr)
        gguf_str_copy(s, label, sizeof label);
    uint32_t ft = 0;
    bool has_ft = gguf_get_u32(f, "general.file_type", &ft, NULL) == SMELT_OK;
    snprintf(buf, n, "%s %s %s", m->hp.arch, label, has_ft ? ftype_name(ft) : "unknown, may not work");
}

static void read_cpu_info(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t') c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

static void read_gpu_info(int device, char *buf, size_t n) {
    buf[0] = 0;
#ifdef SMELT_HAVE_CUDA
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) == cudaSuccess) snprintf(buf, n, "%.255s", p.name);
    else cudaGetLastError();
#else
    (void)device;
    (void)n;
#endif
}

/* The device's read bandwidth in GB/s for the bound (measured once per device and run),
 * or 0 (no bound) when it cannot be measured, said on stderr. */
static double gpu_read_bandwidth(int device) {
#ifdef SMELT_HAVE_CUDA
    static double seen[64];
    if (device < 0 || device >= 64) return 0;
    if (seen[device] == 0) {
        struct err e;
        seen[device] = -1;
        if (cuda_read_bandwidth(device, (uint64_t)2 << 30, 5, &seen[device], &e) == SMELT_OK)
            fprintf(stderr, "smelt bench: device %d read bandwidth %.0f GB/s (the bound of bw %%)\n", device,
                    seen[device]);
        else
            fprintf(stderr, "smelt bench: no bandwidth bound (%s); --bw GB/S gives one\n", e.msg);
    }
    return seen[device] > 0 ? seen[device] : 0;
#else
    (void)device;
    return 0;
#endif
}

/* ---- one model at one thread count: every instance of the other lists ---- */

static smelt_status bench_model(const struct opts *o, const char *ref, int threads, struct printer *p,
                                struct err *e) {
    char path[4096], desc[160];
    struct gguf_file *f = NULL;
    struct backend *bk = NULL;
    struct ctx c;
    memset(&c, 0, sizeof c);
    c.rng = 0x5eed;
    int max_b = 1, max_chunk = 1, max_np = 0, max_ng = list_max(&o->n_gen);
    for (int i = 0; i < o->batched.n; i++) max_b = o->batched.v[i] > max_b ? o->batched.v[i] : max_b;
    for (int i = 0; i < o->n_ubatch.n; i++) max_chunk = o->n_ubatch.v[i] > max_chunk ? o->n_ubatch.v[i] : max_chunk;
    if (list_max(&o->n_batch) < max_chunk) max_chunk = list_max(&o->n_batch);
    max_np = list_max(&o->n_prompt);
    for (int i = 0; i < o->n_pg; i++) {
        if (o->pg[i][0] > max_np) max_np = o->pg[i][0];
        if (o->pg[i][1] > max_ng) max_ng = o->pg[i][1];
    }
    struct spec_config scfg = {0};
    smelt_status st = cli_spec_config(&o->spec, &scfg, e);
    bool spec = st == SMELT_OK && scfg.kind != SPEC_OFF;
    struct tok *tok = NULL;
    struct tok_ids prompt = {0};
    struct cli_spec cs = o->spec; /* this model's draft */
    if (st == SMELT_OK) st = cli_resolve_model(ref, false, path, sizeof path, e);
    if (st == SMELT_OK) st = gguf_open(&f, path, e);
    if (st == SMELT_OK && spec) { /* the tg tests' prompt */
        char *text = NULL;
        size_t len = sizeof default_prompt - 1;
        st = tok_new_from_gguf(&tok, f, NULL, e);
        if (st == SMELT_OK && o->prompt_file) st = file_read_all(o->prompt_file, &text, &len, e);
        if (st == SMELT_OK)
            st = tok_encode(tok, text ? text : default_prompt, len, TOK_ADD_SPECIAL, &prompt, e);
        free(text);
        if (st == SMELT_OK && prompt.n == 0) st = err_set(e, SMELT_ERR_INVALID, "-f: an empty prompt");
        if ((int)prompt.n > max_np) max_np = (int)prompt.n;
    }
    int max_vr = list_max(&o->vrows);
    int per_seq = list_max(&o->depth) + max_np + max_ng + BLOCK + SPEC_K_MAX + max_vr;
    int n_blocks = max_b * ((per_seq + BLOCK - 1) / BLOCK) + 1;
    /* -mg is llama-bench's main_gpu: reported whatever the backend, used only by CUDA */
    if (st == SMELT_OK) st = cli_backend_new(o->backend, cli_backend_is_cuda(o->backend) ? o->device : -1, threads, &bk, e);
    double gpu_bw = 0;
    if (st == SMELT_OK && cli_backend_is_cuda(o->backend) && o->bw_gbs <= 0)
        gpu_bw = gpu_read_bandwidth(o->device); /* before the model takes the memory */
    if (st == SMELT_OK) st = cli_model_load(path, f, bk, o->n_cpu_moe, threads, &c.m, e);
    /* with speculation: an engine of max_b sequences and steps of 512 rows (its draft too) */
    struct engine_config ec = {.max_seqs = max_b, .max_batch_tokens = 512, .n_blocks = n_blocks,
                               .block_size = BLOCK, .n_ctx = per_seq, .spec = scfg};
    engine_config_defaults(&ec);
    if (st == SMELT_OK && spec) {
        struct memplan_shape dsh = {.max_tokens = ec.max_batch_tokens, .max_seqs = max_b,
                                    .max_out = max_b, .n_ctx = per_seq, .block_size = BLOCK,
                                    .kv_type = QT_F16};
        st = cli_spec_load(&cs, o->backend, cli_backend_is_cuda(o->backend) ? o->device : -1,
                           threads, tok, c.m, &dsh, e);
    }
    if (st == SMELT_OK) {
        /* the memory plan: the longest prompt chunk, or max_b decode rows (with speculation,
         * the engine's steps) */
        int max_t = max_chunk > max_b * max_vr ? max_chunk : max_b * max_vr;
        int max_o = spec && engine_max_out_rows(&ec) > max_b * max_vr ? engine_max_out_rows(&ec)
                                                                       : max_b * max_vr;
        struct cli_mem_req r = {
            .cmd = "bench", .f = f, .need = (int64_t)n_blocks * BLOCK,
            .shape = {.max_tokens = spec && ec.max_batch_tokens > max_t ? ec.max_batch_tokens : max_t,
                      .max_seqs = max_b, .max_out = max_o,
                      .n_ctx = per_seq, .block_size = BLOCK, .kv_type = QT_F16},
            .n_slots = model_is_recurrent(c.m) ? memplan_state_slots(max_b) : 0,
            .extra_per_token = cli_spec_kv_bytes(&cs, QT_F16)};
        int64_t t = 0;
        st = cli_mem_plan(c.m, &r, &t, e);
    }
    /* a recurrent model: one state slot per sequence (the engine's tests: snapshots too) */
    int32_t n_slots = st == SMELT_OK && model_is_recurrent(c.m) ? memplan_state_slots(max_b) : 0;
    if (st == SMELT_OK) st = model_kv_new(c.m, QT_F16, BLOCK, n_blocks, n_slots, &c.kv, e);
    if (st == SMELT_OK) st = kv_pool_init(&c.pool, n_blocks, BLOCK, e);
    if (st == SMELT_OK && n_slots) st = kv_slots_enable(&c.pool, n_slots, max_b, e);
    if (st == SMELT_OK && spec) st = cli_spec_kv(&cs, QT_F16, BLOCK, n_blocks, &ec.spec, e);
    if (st == SMELT_OK) {
        c.n_vocab = c.m->hp.n_vocab;
        c.cand = calloc((size_t)MAX_ROWS * TOPK_MAX, sizeof *c.cand);
        if (!c.cand) st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
        for (int i = 0; i < MAX_ROWS; i++) c.greedy[i] = (struct topk_row){.k = 1, .inv_t = 1.0f};
    }
    double size = 0, params = 0;
    if (st == SMELT_OK) {
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(f, i);
            params += (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
            size += (double)t->nbytes;
        }
        model_desc(f, c.m, desc, sizeof desc);
    }
    bool cuda = st == SMELT_OK && cli_backend_is_cuda(o->backend);
    double bw = o->bw_gbs > 0 ? o->bw_gbs : (cuda ? gpu_bw : 0.0);
    int n_thr = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (st == SMELT_OK && o->bw_measure && !cuda) {
        /* STREAM-like: the same threads reading as many bytes as a decode step */
        double bytes = step_bytes(c.m, 1, 0);
        st = cpu_read_bandwidth(n_thr, (uint64_t)bytes, 8, &bw, e);
        if (st == SMELT_OK)
            fprintf(stderr, "smelt bench: read bandwidth %.1f GB/s (%d threads over %.0f MiB, "
                            "best of 8 passes)\n", bw, n_thr, bytes / 1048576.0);
    }
    struct row *r = calloc(1, sizeof *r);
    if (st == SMELT_OK && !r) st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
    for (int ib = 0; st == SMELT_OK && ib < o->n_batch.n; ib++)
        for (int iu = 0; st == SMELT_OK && iu < o->n_ubatch.n; iu++)
            for (int id = 0; st == SMELT_OK && id < o->depth.n; id++) {
                int nb = o->n_batch.v[ib], nub = o->n_ubatch.v[iu];
                int chunk = nub < nb ? nub : nb;
                /* pp, tg, pg (llama-bench's order), then smelt's batched decode */
                /* the decode tests run once per --verify-rows value */
                int nv = o->vrows.n;
                int kinds[4] = {o->n_prompt.n, o->n_gen.n * nv, o->n_pg, o->batched.n * o->n_gen.n * nv};
                for (int kind = 0; st == SMELT_OK && kind < 4; kind++)
                    for (int k = 0; st == SMELT_OK && k < kinds[kind]; k++) {
                        int np = 0, ng = 0, ns = 1, vr = 1;
                        if (kind == 0) np = o->n_prompt.v[k];
                        else if (kind == 1) ng = o->n_gen.v[k / nv], vr = o->vrows.v[k % nv];
                        else if (kind == 2) np = o->pg[k][0], ng = o->pg[k][1];
                        else ns = o->batched.v[k / (o->n_gen.n * nv)],
                             ng = o->n_gen.v[k / nv % o->n_gen.n], vr = o->vrows.v[k % nv];
                        if (np + ng == 0) continue;
                        if (spec && vr > 1) continue; /* the engine tests have their own shape */
                        memset(r, 0, sizeof *r);
                        *r = (struct row){.model_filename = ref, .model_type = desc, .model_size = size,
                                          .model_n_params = params, .n_batch = nb, .n_ubatch = nub,
                                          .n_threads = n_thr, .n_prompt = np, .n_gen = ng,
                                          .n_depth = o->depth.v[id], .n_seqs = ns, .n_vrows = vr};
                        if (spec && (kind == 1 || kind == 3)) {
                            /* through the engine: without, then with speculation */
                            struct row base = *r;
                            for (int on = 0; st == SMELT_OK && on < 2; on++) {
                                struct engine_config c2 = ec;
                                if (!on) c2.spec.kind = SPEC_OFF;
                                *r = base;
                                r->spec = on ? spec_kind_name(scfg.kind) : "off";
                                struct engine *en = NULL;
                                st = engine_new(&en, &c2, c.m, c.kv, tok, e);
                                if (st == SMELT_OK)
                                    st = run_engine_test(en, o, r, prompt.v, (int)prompt.n, e);
                                engine_free(en);
                                if (st == SMELT_OK) print_row(p, r);
                            }
                            continue;
                        }
                        st = run_test(&c, o, r, chunk, bw, e);
                        if (st == SMELT_OK) print_row(p, r);
                    }
            }
    free(r);
    free(c.cand);
    cli_spec_free(&cs);
    tok_ids_free(&prompt);
    tok_free(tok);
    if (c.kv) model_kv_free(c.m, c.kv);
    kv_pool_free(&c.pool);
    model_free(c.m);
    if (bk) bk_free(bk);
    gguf_close(f);
    return st;
}

int cmd_bench(int argc, char **argv) {
    static struct opts o; /* big (lists): not on the stack */
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    struct err e = {0};
    struct printer p = {.o = &o};
    p.md = !strcmp(o.output, "md");
    p.json = !strcmp(o.output, "json");
    p.jsonl = !strcmp(o.output, "jsonl");
    p.csv = !strcmp(o.output, "csv");
    bool cuda = cli_backend_is_cuda(o.backend);
    p.backend = cuda ? "CUDA" : "CPU";
    p.show_bw = cuda || o.bw_gbs > 0 || o.bw_measure;
    p.show_spec = o.spec.kind || o.spec.draft;
    read_cpu_info(p.cpu_info, sizeof p.cpu_info);
    if (cuda) read_gpu_info(o.device, p.gpu_info, sizeof p.gpu_info);
    print_header(&p);
    smelt_status st = SMELT_OK;
    for (int im = 0; st == SMELT_OK && im < o.n_models; im++)
        for (int it = 0; st == SMELT_OK && it < o.threads.n; it++)
            st = bench_model(&o, o.models[im], o.threads.v[it], &p, &e);
    print_footer(&p);
    return st == SMELT_OK ? 0 : cli_fail("bench", &e);
}
