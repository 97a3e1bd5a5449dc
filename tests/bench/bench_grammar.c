/* Grammar engine benchmark (built beside the tests, never run by ctest): the vocabulary
 * build, compile time, and the per-token mask time of a sequence, on a real vocabulary.
 *
 *   build/bench_grammar [--model GGUF] [--schema FILE] [--seqs N] [--seed S]
 *
 * Default model: the test model (Qwen2.5, 151,936 tokens; `make models`). Default schema: a
 * typical tool call (below). Rows:
 *   vocab       gram_vocab_new once (per model, at load)
 *   compile     gram_compile of the schema: the first (cold) and the median of 20
 *   cache hit   gram_cache_get of a cached schema
 *   mask        gram_matcher_fill_mask per token, p50 / p90 / p99 / max, over
 *                 - "text": realistic tool-call documents, tokenized by the model's tokenizer
 *                 - "walk": N random walks of the matcher over the vocabulary (each token
 *                   picked among those allowed, biased toward closing structure)
 *               the first sequence (masks computed on first use) is reported apart
 *   accept      gram_matcher_accept per token
 * Every figure is wall-clock on one thread; docs/structured-output.md records runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../unit/tok_test_util.h"
#include "bench_util.h"
#include "grammar/gram.h"
#include "util/clock.h"
#include "util/file.h"

static const char TOOL_SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"location\": {\"type\": \"string\", \"description\": \"City and state, e.g. San Francisco, "
    "CA\"},"
    "\"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]},"
    "\"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 14},"
    "\"include\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"enum\": [\"hourly\", "
    "\"alerts\", \"uv\", \"air_quality\"]}},"
    "\"notify\": {\"type\": \"object\", \"properties\": {\"email\": {\"type\": \"string\"}, "
    "\"threshold_c\": {\"type\": \"number\"}},"
    " \"required\": [\"email\"], \"additionalProperties\": false}},"
    "\"required\": [\"location\", \"unit\"], \"additionalProperties\": false}";

static const char *const TOOL_DOCS[] = {
    "{\"location\": \"San Francisco, CA\", \"unit\": \"fahrenheit\"}",
    "{\"location\": \"Paris, France\", \"unit\": \"celsius\", \"days\": 5, \"include\": "
    "[\"hourly\", \"uv\"]}",
    "{\n  \"location\": \"Tokyo\",\n  \"unit\": \"celsius\",\n  \"days\": 14,\n  \"include\": "
    "[\"alerts\"],\n"
    "  \"notify\": {\"email\": \"ops@example.com\", \"threshold_c\": 35.5}\n}",
    "{\"location\": \"Reykjavík, Iceland\", \"unit\": \"celsius\", \"days\": 3, \"notify\": "
    "{\"email\": \"a@b.is\"}}",
    "{\"location\": \"New York City, NY (Manhattan, near Central Park)\", \"unit\": "
    "\"fahrenheit\", \"days\": 7, "
    "\"include\": [\"hourly\", \"alerts\", \"uv\", \"air_quality\"]}",
};

struct stats {
    double *v;
    size_t n, cap;
};

static void push(struct stats *s, double x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) exit(1);
    }
    s->v[s->n++] = x;
}

static double pct(struct stats *s, double p) {
    if (!s->n) return 0;
    qsort(s->v, s->n, sizeof *s->v, bench_cmp_d);
    size_t i = (size_t)(p * (double)(s->n - 1) + 0.5);
    return s->v[i];
}

static void row(const char *name, struct stats *s) {
    printf("%-34s %8zu %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, s->n, pct(s, 0.5) * 1e6,
           pct(s, 0.9) * 1e6, pct(s, 0.99) * 1e6, pct(s, 1.0) * 1e6, s->n ? pct(s, 0.0) * 1e6 : 0);
}

static bool bit(const uint32_t *m, int32_t t) {
    return (m[t >> 5] >> (t & 31)) & 1;
}

int main(int argc, char **argv) {
    const char *model = "models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf", *schema_path = NULL;
    int seqs = 200;
    unsigned long long seed = 1; /* the walks' generator: bench_rng */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--schema") && i + 1 < argc)
            schema_path = argv[++i];
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc)
            seqs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10) | 1;
        else {
            fprintf(stderr, "usage: %s [--model GGUF] [--schema FILE] [--seqs N] [--seed S]\n",
                    argv[0]);
            return 2;
        }
    }
    struct err e = {0};
    struct tok *tk = tu_load(model);
    if (!tk) {
        fprintf(stderr, "%s: no tokenizer (make models)\n", model);
        return 1;
    }
    const char *schema = TOOL_SCHEMA;
    size_t slen = strlen(TOOL_SCHEMA);
    char *owned = NULL;
    if (schema_path) {
        if (file_read_all(schema_path, &owned, &slen, &e) != SMELT_OK) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        schema = owned;
    }
    int32_t nv = tok_n_vocab(tk);
    printf("model %s (%d tokens), schema %s\n", model, nv,
           schema_path ? schema_path : "(built-in tool call)");

    double t0 = clock_now();
    struct gram_vocab *v;
    if (gram_vocab_new(&v, tk, 0, &e) != SMELT_OK) {
        fprintf(stderr, "vocab: %s\n", e.msg);
        return 1;
    }
    double t_vocab = clock_now() - t0;

    struct stats comp = {0};
    struct gram *g = NULL;
    double t_cold = 0;
    for (int r = 0; r < 21; r++) {
        struct gram *x;
        t0 = clock_now();
        if (gram_compile(&x, v, GRAM_JSON_SCHEMA, schema, slen, &e) != SMELT_OK) {
            fprintf(stderr, "compile: %s\n", e.msg);
            return 1;
        }
        double dt = clock_now() - t0;
        if (r == 0)
            t_cold = dt, g = x;
        else
            push(&comp, dt), gram_unref(x);
    }
    struct gram_cache *cache;
    gram_cache_new(&cache, v, 16, (size_t)1 << 30, &e);
    struct gram *hitg;
    gram_cache_get(cache, GRAM_JSON_SCHEMA, schema, slen, &hitg, NULL, &e);
    gram_unref(hitg);
    struct stats hit = {0};
    for (int r = 0; r < 1000; r++) {
        t0 = clock_now();
        gram_cache_get(cache, GRAM_JSON_SCHEMA, schema, slen, &hitg, NULL, &e);
        push(&hit, clock_now() - t0);
        gram_unref(hitg);
    }
    gram_cache_free(cache);

    printf("vocab build         %8.1f ms\n", t_vocab * 1e3);
    printf("compile, first      %8.2f ms (%zu automaton states, %zu bytes after warm-up)\n",
           t_cold * 1e3, gram_n_states(g), gram_memory(g));
    printf("compile, median     %8.2f ms (min %.2f, of %zu)\n", pct(&comp, 0.5) * 1e3,
           pct(&comp, 0) * 1e3, comp.n);
    printf("cache hit, median   %8.2f us\n\n", pct(&hit, 0.5) * 1e6);

    size_t nw = gram_mask_words(nv);
    uint32_t *mask = calloc(nw, sizeof *mask);
    int32_t *allowed = malloc((size_t)nv * sizeof *allowed);
    bool *closing = calloc((size_t)nv, 1);
    for (int32_t t = 0; t < nv; t++) {
        size_t l;
        const char *p = tok_piece(tk, t, &l);
        for (size_t k = 0; k < l; k++)
            closing[t] |= p[k] == '"' || p[k] == '}' || p[k] == ']' || p[k] == ',';
    }
    struct stats text_m = {0}, text_a = {0}, first_m = {0}, walk_m = {0};
    /* realistic documents, tokenized: the first pass runs on masks computed at first use */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t d = 0; d < sizeof TOOL_DOCS / sizeof *TOOL_DOCS; d++) {
            if (schema_path) break;
            struct tok_ids ids = {0};
            tok_encode(tk, TOOL_DOCS[d], strlen(TOOL_DOCS[d]), 0, &ids, &e);
            struct gram_matcher *m;
            gram_matcher_new(&m, g, 0, &e);
            for (size_t i = 0; i <= ids.n; i++) {
                t0 = clock_now();
                gram_matcher_fill_mask(m, mask, &e);
                double dt = clock_now() - t0;
                push(pass ? &text_m : &first_m, dt);
                int32_t tok = i < ids.n ? ids.v[i] : tok_specials(tk)->eos;
                if (!bit(mask, tok)) {
                    fprintf(stderr, "document %zu: token %zu (%d) not in the mask\n", d, i, tok);
                    return 1;
                }
                t0 = clock_now();
                if (gram_matcher_accept(m, tok, &e) != SMELT_OK) {
                    fprintf(stderr, "document %zu: token %zu: %s\n", d, i, e.msg);
                    return 1;
                }
                if (pass) push(&text_a, clock_now() - t0);
            }
            gram_matcher_free(m);
            tok_ids_free(&ids);
        }
    }
    /* random walks */
    bench_rng ^= seed * 0x9E3779B97F4A7C15ull;
    size_t done = 0, tokens = 0;
    for (int s = 0; s < seqs; s++) {
        struct gram_matcher *m;
        gram_matcher_new(&m, g, 0, &e);
        for (int step = 0; step < 400; step++) {
            t0 = clock_now();
            gram_matcher_fill_mask(m, mask, &e);
            push(&walk_m, clock_now() - t0);
            int32_t na = 0, nc = 0;
            for (int32_t t = 0; t < nv; t++)
                if (bit(mask, t)) allowed[na++] = t;
            for (int32_t k = 0; k < na; k++)
                if (closing[allowed[k]]) allowed[nc++] = allowed[k];
            uint64_t r = bench_next();
            if (gram_matcher_can_end(m)) {
                done++;
                break;
            }
            if (!na) break;
            int32_t pick = allowed[(r >> 33) % (uint64_t)(nc && (r >> 20) % 10 < 6 ? nc : na)];
            if (gram_matcher_accept(m, pick, &e) != SMELT_OK) {
                fprintf(stderr, "walk: an allowed token was refused: %s\n", e.msg);
                return 1;
            }
            tokens++;
        }
        gram_matcher_free(m);
    }
    printf("%-34s %8s %9s %9s %9s %9s %9s\n", "per token (us)", "n", "p50", "p90", "p99", "max",
           "min");
    if (!schema_path) {
        row("mask, documents, first use", &first_m);
        row("mask, documents, warm", &text_m);
        row("accept, documents", &text_a);
    }
    row("mask, random walks", &walk_m);
    printf("(%zu walks ended of %d, %zu tokens)\n", done, seqs, tokens);
    free(mask);
    free(allowed);
    free(closing);
    free(text_m.v);
    free(text_a.v);
    free(first_m.v);
    free(walk_m.v);
    free(comp.v);
    free(hit.v);
    gram_unref(g);
    gram_vocab_free(v);
    tok_free(tk);
    free(owned);
    return 0;
}
