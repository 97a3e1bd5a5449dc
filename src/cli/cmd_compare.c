/* smelt compare A [B]: two models, or one model under two settings, side by side on the
 * same text. What a user runs to choose a quantization (A the reference, B the candidate)
 * or to check a backend against another.
 *
 * Three measurements, each on both sides:
 *   speed     ppN (one prompt of N random tokens) and tgN (N decode steps), tok/s, as
 *             `smelt bench` times them (the greedy summary of each step's last row comes
 *             back, not the full logits);
 *   scoring   the text (--file, else a built-in mix of prose and code) tokenized once with
 *             A's tokenizer, cut into windows of --ctx tokens, each window prefilled in
 *             chunks on both sides with every row's full logits; at every position that has
 *             a next token: top-1 agreement of A and B, KL(A || B) of their next-token
 *             distributions (natural log, computed in double from log-softmax), and each
 *             side's perplexity of the text;
 *   greedy    from a prompt (-p, else the text's first 32 tokens), -n tokens by greedy
 *             decoding on each side; the first position where they differ, and both
 *             continuations from there.
 * B may be the same file as A with other settings (--backend-b cuda, --exact-a, ...); the
 * two sides must share a vocabulary: a difference is refused, naming both sizes and the
 * first differing token. Both models are loaded at once (windows are compared as they
 * are computed, so memory holds one chunk of logits per side, not the whole text's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/climem.h"
#include "cli/clibackend.h"
#include "cli/modelref.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "model/model.h"
#include "tokenizer/tok.h"
#include "util/clock.h"
#include "util/file.h"

#define BLOCK 16
#define CHUNK 64 /* rows per scoring forward: CHUNK x n_vocab floats of logits per side */

struct side_opts {
    const char *ref, *backend;
    int device, threads;
    bool exact;
};

struct opts {
    struct side_opts s[2];
    const char *file, *prompt, *output;
    int ctx, max_tokens, n_greedy, pp, tg;
};

/* One side: a loaded model with its own KV cache and pool. */
struct side {
    char path[4096], label[160];
    struct gguf_file *f;
    struct backend *bk;
    struct model *m;
    struct kv_store *kv;
    struct kv_pool pool;
    struct tok *tok;
    float *logits; /* (CHUNK, n_vocab) */
    double pp_ts, tg_ts;
    double nll;    /* sum of -log p(next token) over the scored positions */
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: smelt compare A [B] [options]\n"
            "Runs two models, or one model under two settings, on the same text: speed (pp, tg),\n"
            "top-1 agreement and KL divergence of their next-token distributions, each one's\n"
            "perplexity, and where their greedy continuations first differ. A is the reference.\n"
            "  A, B                 GGUF file, directory or org/repo[:quant] (cached); B defaults to A\n"
            "  --backend auto|cpu|cuda, --device N, -t, --threads N   both sides\n"
            "  --backend-a X, --backend-b X, --device-a N, --device-b N, --threads-a N,\n"
            "  --threads-b N        one side\n"
            "  --exact-a, --exact-b CPU reference matmuls (F32 weights x F32 activations) on that side\n"
            "  -f, --file PATH      text to score (default: a built-in paragraph of prose and code)\n"
            "  --ctx N              tokens per scoring window (default 512)\n"
            "  --max-tokens N       score at most N tokens of the text (default 4096)\n"
            "  -p, --prompt TEXT    prompt of the greedy continuations (default: the text's first\n"
            "                       32 tokens)\n"
            "  -n N                 greedy tokens (default 64; 0 skips)\n"
            "  --pp N, --tg N       speed tests (default 512 and 64; 0 skips)\n"
            "  -o md|json           output (default md)\n"
            "Example: smelt compare model-f16.gguf model-q4_k_m.gguf -f wiki.txt\n");
}

static const char default_text[] =
    "The history of computing is a story of layers. At the bottom, transistors switch; above "
    "them, logic gates combine the switches into adders and multiplexers; above those, a "
    "processor fetches instructions from memory and executes them one after another. Each "
    "layer hides the details of the one below it, and each was once the whole of someone's "
    "working life.\n\n"
    "Consider a small program that counts the words in a file:\n\n"
    "#include <ctype.h>\n#include <stdio.h>\n\n"
    "int main(int argc, char **argv) {\n"
    "    FILE *f = argc > 1 ? fopen(argv[1], \"r\") : stdin;\n"
    "    if (!f) { perror(argv[1]); return 1; }\n"
    "    long words = 0;\n    int c, in_word = 0;\n"
    "    while ((c = getc(f)) != EOF) {\n"
    "        if (isspace(c)) in_word = 0;\n"
    "        else if (!in_word) { in_word = 1; words++; }\n"
    "    }\n"
    "    printf(\"%ld\\n\", words);\n    return 0;\n}\n\n"
    "It reads one character at a time, keeps a single bit of state, and never looks back. "
    "Programs like this one are easy to reason about because their state is small. Large "
    "systems are hard for the opposite reason: their state is spread across many machines, "
    "caches and queues, and every part can fail on its own. Engineers cope by drawing "
    "boundaries, writing down contracts, and testing each part against something "
    "independent of it.\n\n"
    "A language model predicts the next token of a text from the tokens before it. Its "
    "quality on a text is often summarized by perplexity, the exponential of the average "
    "negative log-likelihood of each token given its past. Two versions of one model, say "
    "one stored in sixteen-bit floats and one quantized to four bits per weight, can be "
    "compared more finely: how often they pick the same next token, and how far apart their "
    "whole distributions are, measured by the Kullback-Leibler divergence.\n";

/* ---- arguments ---- */

static bool parse_num(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static int parse_args(int argc, char **argv, struct opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < 2; i++) o->s[i] = (struct side_opts){NULL, "auto", -1, 0, false};
    o->ctx = 512, o->max_tokens = 4096, o->n_greedy = 64, o->pp = 512, o->tg = 64;
    o->output = "md";
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--exact-a") || !strcmp(a, "--exact-b")) {
            o->s[a[8] - 'a'].exact = true;
            continue;
        }
        if (a[0] != '-') {
            if (n_pos >= 2) {
                fprintf(stderr, "smelt compare: more than two models ('%s')\n", a);
                return 2;
            }
            o->s[n_pos++].ref = a;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "smelt compare: %s needs a value (or is unknown; see --help)\n", a);
            return 2;
        }
        bool ok = true;
        size_t la = strlen(a);
        /* a side's flag ends in -a or -b; the plain one sets both */
        int lo = 0, hi = 2;
        char base[32];
        snprintf(base, sizeof base, "%s", a);
        if (la > 2 && a[la - 2] == '-' && (a[la - 1] == 'a' || a[la - 1] == 'b') && la < sizeof base) {
            lo = a[la - 1] - 'a', hi = lo + 1;
            base[la - 2] = 0;
        }
        for (int s = lo; s < hi && ok; s++) {
            if (!strcmp(base, "--backend")) o->s[s].backend = v;
            else if (!strcmp(base, "--device")) ok = parse_num(v, 0, 1024, &o->s[s].device);
            else if (!strcmp(base, "--threads") || !strcmp(base, "-t")) ok = parse_num(v, 0, 4096, &o->s[s].threads);
            else if (lo == 0 && hi == 2) goto common;
            else ok = false;
            continue;
        common:
            if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->file = v;
            else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
            else if (!strcmp(a, "--ctx")) ok = parse_num(v, 2, 1 << 20, &o->ctx);
            else if (!strcmp(a, "--max-tokens")) ok = parse_num(v, 2, 1 << 24, &o->max_tokens);
            else if (!strcmp(a, "-n")) ok = parse_num(v, 0, 1 << 16, &o->n_greedy);
            else if (!strcmp(a, "--pp")) ok = parse_num(v, 0, 1 << 20, &o->pp);
            else if (!strcmp(a, "--tg")) ok = parse_num(v, 0, 1 << 20, &o->tg);
            else if (!strcmp(a, "-o") || !strcmp(a, "--output")) o->output = v;
            else {
                fprintf(stderr, "smelt compare: unknown option %s (see --help)\n", a);
                return 2;
            }
            break;
        }
        if (!ok) {
            fprintf(stderr, "smelt compare: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    if (!o->s[0].ref) {
        fprintf(stderr, "smelt compare: a model is required (see --help)\n");
        return 2;
    }
    if (!o->s[1].ref) o->s[1].ref = o->s[0].ref;
    if (strcmp(o->output, "md") && strcmp(o->output, "json")) {
        fprintf(stderr, "smelt compare: -o must be md or json\n");
        return 2;
    }
    return -1;
}

/* ---- the two sides ---- */

static smelt_status side_open(struct side *sd, const struct side_opts *so, char letter,
                              int n_tokens, struct err *e) {
    smelt_status st = cli_resolve_model(so->ref, false, sd->path, sizeof sd->path, e);
    if (st == SMELT_OK) st = gguf_open(&sd->f, sd->path, e);
    if (st == SMELT_OK)
        st = cli_backend_new(so->backend, so->device, so->threads, &sd->bk, e);
    if (st == SMELT_OK && so->exact) {
        if (strcmp(sd->bk->ops->name, "cpu"))
            return err_set(e, SMELT_ERR_INVALID, "--exact-%c needs the CPU backend (--backend-%c cpu)",
                           letter, letter);
        cpu_backend_set_exact(sd->bk, true);
    }
    if (st == SMELT_OK) st = cli_model_load(sd->path, sd->f, sd->bk, 0, 0, &sd->m, e);
    int n_blocks = (n_tokens + BLOCK - 1) / BLOCK + 1;
    if (st == SMELT_OK) {
        struct cli_mem_req r = {
            .cmd = "compare", .f = sd->f, .need = (int64_t)n_blocks * BLOCK,
            .shape = {.max_tokens = CHUNK > 512 ? CHUNK : 512, .max_seqs = 1, .max_out = CHUNK,
                      .n_ctx = n_tokens, .block_size = BLOCK, .kv_type = QT_F16}};
        int64_t t = 0;
        st = cli_mem_plan(sd->m, &r, &t, e);
    }
    /* one sequence at a time: one state slot for a model with recurrent layers */
    int32_t n_slots = st == SMELT_OK && model_is_recurrent(sd->m) ? 1 : 0;
    if (st == SMELT_OK) st = model_kv_new(sd->m, QT_F16, BLOCK, n_blocks, n_slots, &sd->kv, e);
    if (st == SMELT_OK) st = kv_pool_init(&sd->pool, n_blocks, BLOCK, e);
    if (st == SMELT_OK && n_slots) st = kv_slots_enable(&sd->pool, n_slots, 1, e);
    if (st == SMELT_OK) st = tok_new_from_gguf(&sd->tok, sd->f, NULL, e);
    if (st == SMELT_OK) {
        sd->logits = malloc(sizeof(float) * (size_t)CHUNK * (size_t)sd->m->hp.n_vocab);
        if (!sd->logits) st = err_set(e, SMELT_ERR_NOMEM, "out of memory (%d logit rows)", CHUNK);
    }
    if (st == SMELT_OK) {
        const char *slash = strrchr(sd->path, '/');
        snprintf(sd->label, sizeof sd->label, "%.120s, %s%s", slash ? slash + 1 : sd->path,
                 sd->bk->ops->name, so->exact ? " exact" : "");
    }
    return st;
}

static void side_close(struct side *sd) {
    free(sd->logits);
    tok_free(sd->tok);
    if (sd->kv) model_kv_free(sd->m, sd->kv);
    kv_pool_free(&sd->pool);
    model_free(sd->m);
    if (sd->bk) bk_free(sd->bk);
    gguf_close(sd->f);
}

/* Runs tokens[0..n) of one sequence (positions pos0..) through sd in forwards of at most
 * chunk rows. want_logits (n <= CHUNK): every row's logits go to sd->logits; else only the
 * last row's greedy token comes back (into *next when not NULL). */
static smelt_status run_seq(struct side *sd, struct kv_seq *q, const int32_t *tokens, int pos0, int n,
                            int chunk, bool want_logits, int32_t *next, struct err *e) {
    int32_t pos[512], seq[512];
    uint8_t want[512];
    if (chunk > 512) chunk = 512;
    if (want_logits && chunk > CHUNK) chunk = CHUNK;
    smelt_status st = kv_seq_reserve(&sd->pool, q, pos0 + n, e);
    for (int done = 0; st == SMELT_OK && done < n;) {
        int take = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < take; i++) pos[i] = pos0 + done + i, seq[i] = 0, want[i] = want_logits || i == take - 1;
        struct batch_seq view = kv_seq_view(q);
        struct batch b = {take, tokens + done, pos, seq, want, 1, &view};
        if (want_logits) {
            st = model_forward(sd->m, sd->kv, &b, sd->logits, NULL, e);
        } else {
            struct topk_row greedy = {.k = 1, .inv_t = 1.0f};
            struct topk_summary sum;
            struct topk_cand cand[TOPK_MAX];
            struct model_sample ms = {.n_rows = 1, .rows = &greedy, .sum = &sum, .cand = cand};
            st = model_step(sd->m, sd->kv, &b, NULL, &ms, NULL, e);
            if (st == SMELT_OK && next) *next = sum.top_token;
        }
        done += take;
    }
    return st;
}

/* pp and tg speeds on random tokens (the same ids on both sides). */
static smelt_status measure_speed(struct side *sd, const struct opts *o, struct err *e) {
    int n = o->pp > o->tg ? o->pp : o->tg;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!tok) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    unsigned long long rng = 0x5eed;
    for (int i = 0; i <= n; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        tok[i] = (int32_t)((rng >> 33) % (unsigned long long)sd->m->hp.n_vocab);
    }
    smelt_status st = SMELT_OK;
    for (int rep = 0; rep < 2 && st == SMELT_OK; rep++) { /* rep 0 warms up */
        struct kv_seq q;
        kv_seq_init(&q);
        double t0 = clock_now();
        if (o->pp) st = run_seq(sd, &q, tok, 0, o->pp, 512, false, NULL, e);
        double t1 = clock_now();
        kv_seq_release(&sd->pool, &q);
        kv_seq_init(&q);
        for (int i = 0; st == SMELT_OK && i < o->tg; i++)
            st = run_seq(sd, &q, tok + i, i, 1, 1, false, NULL, e);
        double t2 = clock_now();
        kv_seq_release(&sd->pool, &q);
        if (rep == 1) {
            sd->pp_ts = o->pp ? o->pp / (t1 - t0) : 0;
            sd->tg_ts = o->tg ? o->tg / (t2 - t1) : 0;
        }
    }
    free(tok);
    return st;
}

/* ---- scoring ---- */

struct scoring {
    struct side *sd;             /* [2] */
    const int32_t *tokens;       /* the window */
    int n, n_vocab;
    double *lp;                  /* (2, n_vocab) log-softmax scratch */
    int64_t positions, agree;
    double kl_sum, kl_max;
    double *kl_all;              /* (max positions) for the percentiles */
    int64_t kl_cap;
};

/* Log-softmax of x (n) into out, in double. */
static void log_softmax(const float *x, int n, double *out) {
    double mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    double lse = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = (double)x[i] - lse;
}

static int argmax_f(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Side B's chunk is computed after side A's (same rows): compare them row by row. */
static void score_chunk(void *ctx, int first, int rows) {
    struct scoring *sc = ctx;
    int nv = sc->n_vocab;
    for (int r = 0; r < rows; r++) {
        int i = first + r; /* the row predicts token i + 1 */
        if (i + 1 >= sc->n) break;
        const float *a = sc->sd[0].logits + (size_t)r * nv, *b = sc->sd[1].logits + (size_t)r * nv;
        double *la = sc->lp, *lb = sc->lp + nv;
        log_softmax(a, nv, la);
        log_softmax(b, nv, lb);
        double kl = 0;
        for (int v = 0; v < nv; v++) kl += exp(la[v]) * (la[v] - lb[v]);
        if (kl < 0) kl = 0; /* rounding */
        int32_t next = sc->tokens[i + 1];
        sc->sd[0].nll -= la[next];
        sc->sd[1].nll -= lb[next];
        sc->agree += argmax_f(a, nv) == argmax_f(b, nv);
        sc->kl_sum += kl;
        sc->kl_max = kl > sc->kl_max ? kl : sc->kl_max;
        if (sc->positions < sc->kl_cap) sc->kl_all[sc->positions] = kl;
        sc->positions++;
    }
}

/* Scores tokens[0..n) in windows of ctx tokens: each window is a fresh sequence on both
 * sides, fed in CHUNK-row forwards (A's chunk, then B's, then the comparison). */
static smelt_status score_text(struct scoring *sc, const int32_t *tokens, int n, int ctx, struct err *e) {
    smelt_status st = SMELT_OK;
    for (int w0 = 0; st == SMELT_OK && w0 + 1 < n; w0 += ctx) {
        int wn = n - w0 < ctx ? n - w0 : ctx;
        struct kv_seq q[2];
        kv_seq_init(&q[0]);
        kv_seq_init(&q[1]);
        sc->tokens = tokens + w0, sc->n = wn;
        for (int done = 0; st == SMELT_OK && done < wn; done += CHUNK) {
            int take = wn - done < CHUNK ? wn - done : CHUNK;
            st = run_seq(&sc->sd[0], &q[0], tokens + w0 + done, done, take, CHUNK, true, NULL, e);
            if (st == SMELT_OK)
                st = run_seq(&sc->sd[1], &q[1], tokens + w0 + done, done, take, CHUNK, true, NULL, e);
            if (st == SMELT_OK) score_chunk(sc, done, take);
        }
        kv_seq_release(&sc->sd[0].pool, &q[0]);
        kv_seq_release(&sc->sd[1].pool, &q[1]);
    }
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- greedy continuations ---- */

static smelt_status greedy(struct side *sd, const int32_t *prompt, int np, int n, int32_t *out,
                           struct err *e) {
    struct kv_seq q;
    kv_seq_init(&q);
    int32_t next = 0;
    smelt_status st = run_seq(sd, &q, prompt, 0, np, 512, false, &next, e);
    for (int i = 0; st == SMELT_OK && i < n; i++) {
        out[i] = next;
        if (i + 1 < n) st = run_seq(sd, &q, &out[i], np + i, 1, 1, false, &next, e);
    }
    kv_seq_release(&sd->pool, &q);
    return st;
}

/* Appends a JSON string literal of s[0..n) (control bytes escaped) to stdout. */
static void json_str(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static smelt_status decode_text(const struct tok *t, const int32_t *ids, int n, struct tok_buf *b,
                                struct err *e) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
    return n > 0 ? tok_decode(t, ids, (size_t)n, 0, b, e) : SMELT_OK;
}

/* ---- the command ---- */

static smelt_status check_vocab(const struct side *sd, struct err *e) {
    const struct tok *a = sd[0].tok, *b = sd[1].tok;
    int32_t na = tok_n_vocab(a), nb = tok_n_vocab(b);
    int32_t first = tok_first_difference(a, b);
    if (first < 0 && sd[0].m->hp.n_vocab == sd[1].m->hp.n_vocab) return SMELT_OK;
    if (first < 0)
        return err_set(e, SMELT_ERR_INVALID,
                       "the models score different vocabulary sizes (%d and %d logits per row)",
                       sd[0].m->hp.n_vocab, sd[1].m->hp.n_vocab);
    size_t la, lb;
    const char *ta = tok_token_text(a, first, &la), *tb = tok_token_text(b, first, &lb);
    return err_set(e, SMELT_ERR_INVALID,
                   "the models' vocabularies differ (%d and %d tokens); first difference at id "
                   "%d: '%.*s' vs '%.*s'",
                   na, nb, first, (int)(la > 40 ? 40 : la), ta, (int)(lb > 40 ? 40 : lb), tb);
}

int cmd_compare(int argc, char **argv) {
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    struct err e = {0};
    struct side sd[2];
    memset(sd, 0, sizeof sd);
    char *text = NULL;
    size_t text_len = 0;
    struct tok_ids ids = {0}, pids = {0};
    int32_t *gen[2] = {NULL, NULL};
    struct scoring sc = {0};
    struct tok_buf tb[2] = {{0}};
    smelt_status st = SMELT_OK;
    if (o.file) st = file_read_all(o.file, &text, &text_len, &e);
    int n_seq = o.ctx > o.pp ? o.ctx : o.pp;
    if (n_seq < o.tg) n_seq = o.tg;
    if (n_seq < 32 + o.n_greedy) n_seq = 32 + o.n_greedy; /* the default prompt and its continuation */
    for (int s = 0; s < 2 && st == SMELT_OK; s++) {
        st = side_open(&sd[s], &o.s[s], (char)('a' + s), n_seq + BLOCK, &e);
        if (st != SMELT_OK) err_prefix(&e, "%s", s ? "B" : "A");
    }
    if (st == SMELT_OK) st = check_vocab(sd, &e);
    /* the text, tokenized once with A's tokenizer (both sides read the same ids) */
    if (st == SMELT_OK) {
        const char *t = text ? text : default_text;
        size_t n = text ? text_len : sizeof default_text - 1;
        st = tok_encode(sd[0].tok, t, n, TOK_ADD_SPECIAL, &ids, &e);
        if (st == SMELT_OK && ids.n > (size_t)o.max_tokens) ids.n = (size_t)o.max_tokens;
        if (st == SMELT_OK && ids.n < 2)
            st = err_set(&e, SMELT_ERR_INVALID, "the text has %zu tokens: nothing to score", ids.n);
    }
    if (st == SMELT_OK && o.prompt) st = tok_encode(sd[0].tok, o.prompt, strlen(o.prompt), TOK_ADD_SPECIAL, &pids, &e);
    if (st == SMELT_OK && o.prompt && pids.n + (size_t)o.n_greedy > (size_t)n_seq)
        st = err_set(&e, SMELT_ERR_INVALID, "the prompt (%zu tokens) and -n %d exceed the window of %d tokens",
                     pids.n, o.n_greedy, n_seq);
    for (int s = 0; s < 2 && st == SMELT_OK; s++) st = measure_speed(&sd[s], &o, &e);
    if (st == SMELT_OK) {
        sc.sd = sd;
        sc.n_vocab = sd[0].m->hp.n_vocab;
        sc.lp = malloc(sizeof(double) * 2 * (size_t)sc.n_vocab);
        sc.kl_cap = (int64_t)ids.n;
        sc.kl_all = malloc(sizeof(double) * (size_t)sc.kl_cap);
        if (!sc.lp || !sc.kl_all) st = err_set(&e, SMELT_ERR_NOMEM, "out of memory");
    }
    if (st == SMELT_OK) st = score_text(&sc, ids.v, (int)ids.n, o.ctx, &e);
    /* greedy continuations */
    const int32_t *prompt = o.prompt ? pids.v : ids.v;
    int np = o.prompt ? (int)pids.n : ((int)ids.n < 32 ? (int)ids.n : 32);
    int diverge = -1;
    if (st == SMELT_OK && o.n_greedy > 0) {
        for (int s = 0; s < 2 && st == SMELT_OK; s++) {
            gen[s] = malloc(sizeof(int32_t) * (size_t)o.n_greedy);
            if (!gen[s]) st = err_set(&e, SMELT_ERR_NOMEM, "out of memory");
            else st = greedy(&sd[s], prompt, np, o.n_greedy, gen[s], &e);
        }
        for (int i = 0; st == SMELT_OK && i < o.n_greedy && diverge < 0; i++)
            if (gen[0][i] != gen[1][i]) diverge = i;
        int from = diverge < 0 ? 0 : diverge;
        for (int s = 0; s < 2 && st == SMELT_OK; s++)
            st = decode_text(sd[s].tok, gen[s] + from, o.n_greedy - from, &tb[s], &e);
    }
    if (st == SMELT_OK) {
        int64_t np_ = sc.positions;
        double ppl[2] = {exp(sd[0].nll / (double)np_), exp(sd[1].nll / (double)np_)};
        qsort(sc.kl_all, (size_t)(np_ < sc.kl_cap ? np_ : sc.kl_cap), sizeof(double), cmp_double);
        double p99 = sc.kl_all[(int64_t)((double)(np_ - 1) * 0.99)];
        double median = sc.kl_all[(np_ - 1) / 2];
        if (!strcmp(o.output, "json")) {
            printf("{\n  \"a\": ");
            json_str(sd[0].label, strlen(sd[0].label));
            printf(",\n  \"b\": ");
            json_str(sd[1].label, strlen(sd[1].label));
            printf(",\n  \"pp\": %d, \"tg\": %d,\n", o.pp, o.tg);
            printf("  \"pp_ts\": [%.2f, %.2f], \"tg_ts\": [%.2f, %.2f],\n", sd[0].pp_ts, sd[1].pp_ts,
                   sd[0].tg_ts, sd[1].tg_ts);
            printf("  \"positions\": %lld, \"top1_agreement\": %.6f,\n", (long long)np_,
                   (double)sc.agree / (double)np_);
            printf("  \"kl_mean\": %.6g, \"kl_median\": %.6g, \"kl_p99\": %.6g, \"kl_max\": %.6g,\n",
                   sc.kl_sum / (double)np_, median, p99, sc.kl_max);
            printf("  \"ppl\": [%.4f, %.4f],\n", ppl[0], ppl[1]);
            printf("  \"greedy_tokens\": %d, \"greedy_first_difference\": %d", o.n_greedy, diverge);
            for (int s = 0; s < 2 && o.n_greedy > 0; s++) {
                printf(",\n  \"greedy_%c\": ", 'a' + s);
                json_str(tb[s].p ? tb[s].p : "", tb[s].n);
            }
            printf("\n}\n");
        } else {
            printf("A: %s\nB: %s\n\n", sd[0].label, sd[1].label);
            printf("| %-24s | %14s | %14s |\n| %.24s | %.14s | %.14s |\n", "", "A", "B",
                   "------------------------------", "------------------------------",
                   "------------------------------");
            if (o.pp) printf("| %-24s | %14.1f | %14.1f |\n", "pp tok/s", sd[0].pp_ts, sd[1].pp_ts);
            if (o.tg) printf("| %-24s | %14.1f | %14.1f |\n", "tg tok/s", sd[0].tg_ts, sd[1].tg_ts);
            printf("| %-24s | %14.4f | %14.4f |\n", "perplexity", ppl[0], ppl[1]);
            printf("\nover %lld positions (%zu tokens, windows of %d):\n", (long long)np_, ids.n, o.ctx);
            printf("  top-1 agreement  %.2f%%\n", 100.0 * (double)sc.agree / (double)np_);
            printf("  KL(A || B)       mean %.6f, median %.6f, p99 %.6f, max %.6f\n",
                   sc.kl_sum / (double)np_, median, p99, sc.kl_max);
            if (o.n_greedy > 0) {
                if (diverge < 0) {
                    printf("greedy: the %d tokens agree\n", o.n_greedy);
                } else {
                    printf("greedy: first difference at generated token %d of %d; from there:\n",
                           diverge, o.n_greedy);
                    for (int s = 0; s < 2; s++) {
                        printf("  %c: ", 'A' + s);
                        json_str(tb[s].p ? tb[s].p : "", tb[s].n);
                        putchar('\n');
                    }
                }
            }
        }
    }
    free(sc.lp);
    free(sc.kl_all);
    for (int s = 0; s < 2; s++) {
        free(gen[s]);
        tok_buf_free(&tb[s]);
        side_close(&sd[s]);
    }
    tok_ids_free(&ids);
    tok_ids_free(&pids);
    free(text);
    return st == SMELT_OK ? 0 : cli_fail("compare", &e);
}
