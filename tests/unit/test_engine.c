/* Engine tests: the prefix-cache index of the KV pool, and the engine driven by fake
 * forwards whose next token is a known function of the row (token, position), so every
 * expected output can be computed independently here:
 * - stop strings across token boundaries never leak, eos / stop ids / max_tokens end a
 *   choice with the right reason, ignore_eos runs past eos;
 * - n > 1, seeds, logprobs of a known distribution;
 * - continuous batching: many concurrent sequences each get what they get alone, also
 *   under KV pressure (preemption) and with prefix sharing;
 * - the scheduling policy, step by step through the engine's step observer: decodes are
 *   never frozen by a chunked prefill, no step exceeds max_batch_tokens, at most max_seqs
 *   run, the newest sequence is the one preempted, admission waits for a whole prompt's
 *   blocks and is FIFO;
 * - cancellation frees every block; the prefix cache reports cached tokens;
 * - submit refuses prompts longer than the context and a full queue.
 * The real model under concurrency is covered by tests/py/test_server_concurrency.py. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu_argmax.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "format/gguf.h"
#include "t.h"
#include "tokenizer/tok.h"

/* ---- the prefix-cache index ---- */

static void fill(int32_t *t, int n, int base) {
    for (int i = 0; i < n; i++) t[i] = base + i;
}

static void test_prefix_index(void) {
    struct kv_pool p;
    struct err e;
    T_CHECK(kv_pool_init(&p, 8, 4, &e) == SMELT_OK);
    T_CHECK(kv_prefix_enable(&p, &e) == SMELT_OK);
    int32_t tok[16];
    fill(tok, 16, 100);
    struct kv_seq a;
    kv_seq_init(&a);
    T_CHECK(kv_seq_reserve(&p, &a, 12, &e) == SMELT_OK);
    uint64_t h[4], parent = 0;
    for (int b = 0; b < 3; b++) {
        h[b] = kv_block_hash(&p, parent, tok + 4 * b);
        T_CHECK(h[b] != 0);
        kv_prefix_register(&p, a.blocks[b], h[b], parent, tok + 4 * b);
        parent = h[b];
    }
    int32_t ablocks[3] = {a.blocks[0], a.blocks[1], a.blocks[2]};
    struct kv_stats st;
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.used, 3);
    T_EQ_INT(st.cached, 3);
    T_EQ_INT(st.idle, 0);
    kv_seq_release(&p, &a);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.used, 0);
    T_EQ_INT(st.idle, 3);
    T_EQ_INT(kv_pool_available(&p), 8);

    /* the same tokens come back as the same blocks */
    struct kv_seq b;
    kv_seq_init(&b);
    uint64_t got[4];
    T_EQ_INT(kv_prefix_acquire(&p, &b, tok, 3, got), 3);
    for (int i = 0; i < 3; i++) {
        T_EQ_INT(b.blocks[i], ablocks[i]);
        T_CHECK(got[i] == h[i]);
    }
    /* a second sequence shares them (refcount 2) */
    struct kv_seq c;
    kv_seq_init(&c);
    T_EQ_INT(kv_prefix_acquire(&p, &c, tok, 2, got), 2);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.used, 3);
    kv_seq_release(&p, &b);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.used, 2);
    T_EQ_INT(st.idle, 1);
    kv_seq_release(&p, &c);

    /* a different second block: only the first matches */
    int32_t tok2[12];
    memcpy(tok2, tok, sizeof tok2);
    tok2[5] = 7;
    T_EQ_INT(kv_prefix_acquire(&p, &b, tok2, 3, got), 1);
    kv_seq_release(&p, &b);

    /* a block registered under the right hash with other contents is never handed out */
    struct kv_pool q;
    T_CHECK(kv_pool_init(&q, 4, 4, &e) == SMELT_OK);
    T_CHECK(kv_prefix_enable(&q, &e) == SMELT_OK);
    struct kv_seq d;
    kv_seq_init(&d);
    T_CHECK(kv_seq_reserve(&q, &d, 4, &e) == SMELT_OK);
    kv_prefix_register(&q, d.blocks[0], kv_block_hash(&q, 0, tok), 0, tok + 4);
    kv_seq_release(&q, &d);
    T_EQ_INT(kv_prefix_acquire(&q, &d, tok, 1, got), 0);
    kv_pool_free(&q);

    /* eviction: the pool hands out free blocks first, then the oldest idle cached one */
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.idle, 3);
    T_EQ_INT(st.free, 5);
    struct kv_seq big;
    kv_seq_init(&big);
    T_CHECK(kv_seq_reserve(&p, &big, 4 * 6, &e) == SMELT_OK);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.idle, 2);
    T_EQ_INT(st.evictions, 1);
    /* the leaf block (released first, so oldest) went first: the first two still match */
    T_EQ_INT(kv_prefix_acquire(&p, &b, tok, 3, got), 2);
    T_CHECK(kv_seq_reserve(&p, &big, 4 * 8, &e) != SMELT_OK); /* only 0 left: 2 held by b */
    kv_seq_release(&p, &b);
    T_CHECK(kv_seq_reserve(&p, &big, 4 * 8, &e) == SMELT_OK);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.cached, 0);
    T_EQ_INT(st.used, 8);
    kv_seq_release(&p, &big);
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.free, 8);
    kv_pool_free(&p);
}

/* Many registrations and evictions: the table stays consistent (every cached block is
 * found again, nothing is found that was evicted). */
static void test_prefix_churn(void) {
    struct kv_pool p;
    struct err e;
    T_CHECK(kv_pool_init(&p, 64, 2, &e) == SMELT_OK);
    T_CHECK(kv_prefix_enable(&p, &e) == SMELT_OK);
    unsigned long long rs = 12345;
    for (int it = 0; it < 2000; it++) {
        int32_t tok[16];
        int nb = 1 + (int)(t_rand_u64(&rs) % 8);
        for (int i = 0; i < 2 * nb; i++) tok[i] = (int32_t)(t_rand_u64(&rs) % 3);
        struct kv_seq s;
        kv_seq_init(&s);
        uint64_t h[8];
        int got = kv_prefix_acquire(&p, &s, tok, nb, h);
        /* what was found holds the right tokens (checked by acquire) and hashes chain */
        uint64_t parent = 0;
        for (int b = 0; b < got; b++) {
            T_CHECK(h[b] == kv_block_hash(&p, parent, tok + 2 * b));
            parent = h[b];
        }
        if (kv_seq_reserve(&p, &s, 2 * nb, &e) == SMELT_OK) {
            for (int b = got; b < nb; b++) {
                h[b] = kv_block_hash(&p, parent, tok + 2 * b);
                kv_prefix_register(&p, s.blocks[b], h[b], parent, tok + 2 * b);
                parent = h[b];
            }
        }
        kv_seq_release(&p, &s);
    }
    struct kv_stats st;
    kv_pool_stats(&p, &st);
    T_EQ_INT(st.used, 0);
    T_EQ_INT(st.free + st.idle, 64);
    T_CHECK(st.hit_blocks > 0 && st.evictions > 0);
    kv_pool_free(&p);
}

/* ---- argmax: every implementation agrees with the scalar reference ---- */

static void test_argmax(void) {
    unsigned long long rs = 7;
    float *x = malloc(5000 * sizeof *x);
    for (int it = 0; it < 400; it++) {
        int n = 1 + (int)(t_rand_u64(&rs) % 4999);
        int kind = it % 5;
        for (int i = 0; i < n; i++) {
            x[i] = t_randn(&rs);
            if (kind == 1) x[i] = (float)(int)(x[i] * 2); /* many ties */
            if (kind == 2 && t_rand_u64(&rs) % 7 == 0) x[i] = NAN;
            if (kind == 3) x[i] = -INFINITY;
            if (kind == 4 && t_rand_u64(&rs) % 3 == 0) x[i] = -INFINITY;
        }
        if (kind == 3 && it % 2) x[n / 2] = NAN; /* nothing but -inf and NaN: -1 */
        int32_t nf = 0, got = 0, want_nf = 0;
        for (int i = 0; i < n; i++) want_nf += x[i] > -INFINITY;
        int32_t want = cpu_argmax_scalar(x, n, &nf);
        T_EQ_INT(nf, want_nf);
        T_EQ_INT(cpu_argmax(x, n, &got), want);
        T_EQ_INT(got, want_nf);
        if (__builtin_cpu_supports("avx2")) {
            T_EQ_INT(cpu_argmax_avx2(x, n, &got), want);
            T_EQ_INT(got, want_nf);
        }
        if (__builtin_cpu_supports("avx512f")) {
            T_EQ_INT(cpu_argmax_avx512(x, n, &got), want);
            T_EQ_INT(got, want_nf);
        }
    }
    free(x);
}

/* ---- a small tokenizer ---- */

#define N_SPECIAL 3
#define BYTE0 N_SPECIAL
#define WORD0 (BYTE0 + 256)
static const char *const words[] = {
    "Hel", "lo", "\xe2\x96\x81" "wor", "ld", "!", "\xe2\x96\x81" "ST", "OP", "\xe2\x96\x81" "the",
    "\xe2\x96\x81" "end", "\xe2\x96\x81" "of", "\xe2\x96\x81" "it", "\xe2\x96\x81" "all", ".",
};
#define N_WORDS ((int)(sizeof words / sizeof words[0]))
#define VOCAB (WORD0 + N_WORDS)
#define EOS 2

static struct tok *tk;
static char tok_path[256];

static bool make_tok(void) {
    struct gguf_writer *w;
    struct err e;
    if (gguf_writer_new(&w, &e) != SMELT_OK) return false;
    const char *toks[VOCAB];
    float scores[VOCAB];
    int32_t types[VOCAB];
    static char bytes[256][8];
    const char *sp[N_SPECIAL] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < VOCAB; i++) {
        scores[i] = 0;
        if (i < N_SPECIAL) {
            toks[i] = sp[i];
            types[i] = i == 0 ? 2 : 3;
        } else if (i < WORD0) {
            snprintf(bytes[i - BYTE0], 8, "<0x%02X>", i - BYTE0);
            toks[i] = bytes[i - BYTE0];
            types[i] = 6;
        } else {
            toks[i] = words[i - WORD0];
            types[i] = 1;
            scores[i] = -(float)i;
        }
    }
    gguf_set_str(w, "general.architecture", "llama");
    gguf_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, VOCAB);
    gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, VOCAB);
    gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, VOCAB);
    gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_set_u32(w, "tokenizer.ggml.eos_token_id", EOS);
    gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    snprintf(tok_path, sizeof tok_path, "%s/smelt_engine_tok_%d.gguf", P_tmpdir, (int)getpid());
    bool ok = gguf_writer_write(w, tok_path, NULL, NULL, &e) == SMELT_OK;
    gguf_writer_free(w);
    struct gguf_file *f;
    if (!ok || gguf_open(&f, tok_path, &e) != SMELT_OK) return false;
    ok = tok_new_from_gguf(&tk, f, NULL, &e) == SMELT_OK;
    if (!ok) fprintf(stderr, "tok: %s\n", e.msg);
    gguf_close(f);
    unlink(tok_path);
    return ok;
}

/* ---- fake forwards ---- */

/* "counter": after word w comes word w + 1; after the last word, eos; after anything
 * else, the first word. Logits: 10 at the next token, 0 elsewhere. */
static int32_t counter_next(int32_t t, int32_t pos) {
    (void)pos;
    if (t >= WORD0 && t < VOCAB - 1) return t + 1;
    if (t == VOCAB - 1) return EOS;
    return WORD0;
}

/* "hash": the next word depends on (token, position): batching mistakes (a row's token or
 * position mixed up with another sequence's) change the text. Never eos. */
static int32_t hash_next(int32_t t, int32_t pos) {
    uint32_t h = (uint32_t)t * 2654435761u ^ (uint32_t)pos * 40503u;
    h ^= h >> 13;
    return WORD0 + (int32_t)(h % (uint32_t)N_WORDS);
}

struct fake {
    int32_t (*next)(int32_t t, int32_t pos);
    int nv; /* logit row length (0: VOCAB); ids >= VOCAB get -inf-ish logits */
    bool noisy; /* the other tokens get logits in [0, 1) from (token, position, id), not 0:
                 * a mask's choice among them depends on the row's inputs */
    bool soft; /* the words get spread logits (a sampled choice is not the argmax) */
    int sleep_us;
    int sleep_row_us; /* more per row of the step (a step's time grows with its rows) */
    long rows, steps;
    int max_rows_seen;
};

static smelt_status fake_forward(void *ctx, const struct batch *b, float *logits, struct err *e) {
    struct fake *f = ctx;
    (void)e;
    int32_t k = 0, nv = f->nv ? f->nv : VOCAB;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (!b->logits[i]) continue;
        float *row = logits + (size_t)k++ * (size_t)nv;
        for (int v = 0; v < nv; v++) row[v] = v < VOCAB ? 0.0f : -50.0f;
        for (int v = 0; f->noisy && v < VOCAB; v++) {
            uint32_t h = (uint32_t)b->token[i] * 2654435761u ^ (uint32_t)b->pos[i] * 40503u ^
                         (uint32_t)v * 2246822519u;
            h ^= h >> 15;
            h *= 2654435761u;
            row[v] = (float)(h >> 8) / (float)(1u << 24);
        }
        if (f->soft) {
            for (int v = WORD0; v < VOCAB; v++)
                row[v] = 0.4f * (float)((b->token[i] * 31 + v * 17 + b->pos[i] % 3) % 7);
            row[f->next(b->token[i], b->pos[i])] += 1.5f;
        } else {
            row[f->next(b->token[i], b->pos[i])] = 10.0f;
        }
    }
    f->rows += b->n_tokens;
    f->steps++;
    if (b->n_tokens > f->max_rows_seen) f->max_rows_seen = b->n_tokens;
    if (f->sleep_us || f->sleep_row_us)
        usleep((useconds_t)(f->sleep_us + f->sleep_row_us * b->n_tokens));
    return SMELT_OK;
}

static struct engine_config fake_config(struct fake *f, int n_blocks, int bs, int max_seqs,
                                        int max_batch, int max_waiting, int n_ctx) {
    struct engine_config c = {0};
    c.sample_threads = f->nv ? 4 : 0;
    c.n_blocks = n_blocks;
    c.block_size = bs;
    c.max_seqs = max_seqs;
    c.max_batch_tokens = max_batch;
    c.max_waiting = max_waiting;
    c.n_ctx = n_ctx;
    c.n_vocab = f->nv ? f->nv : VOCAB;
    c.forward = fake_forward;
    c.forward_ctx = f;
    return c;
}

static struct engine *start_engine(const struct engine_config *c) {
    struct engine *en = NULL;
    struct err e;
    T_CHECK(engine_new(&en, c, NULL, NULL, tk, &e) == SMELT_OK);
    return en;
}

static struct engine *mk_engine(struct fake *f, int n_blocks, int bs, int max_seqs, int max_batch,
                                int max_waiting, int n_ctx) {
    struct engine_config c = fake_config(f, n_blocks, bs, max_seqs, max_batch, max_waiting, n_ctx);
    return start_engine(&c);
}

/* The expected greedy continuation of prompt under next(), stopping at eos or max. */
static int expect_tokens(int32_t (*next)(int32_t, int32_t), const int32_t *prompt, int n_prompt,
                         int max, int32_t *out, bool *hit_eos) {
    int32_t t = prompt[n_prompt - 1];
    int n = 0;
    *hit_eos = false;
    for (int pos = n_prompt - 1; n < max; pos++) {
        t = next(t, pos);
        if (t == EOS) {
            *hit_eos = true;
            break;
        }
        out[n++] = t;
    }
    return n;
}

static void detok(const int32_t *ids, int n, struct tok_buf *out) {
    struct err e;
    out->n = 0;
    T_CHECK(tok_decode(tk, ids, (size_t)n, 0, out, &e) == SMELT_OK);
}

/* Everything one request produced. */
struct result {
    struct tok_buf text[ENGINE_MAX_N];
    int32_t tokens[ENGINE_MAX_N][512];
    int n_tokens[ENGINE_MAX_N];
    int finish[ENGINE_MAX_N];
    int stop[ENGINE_MAX_N]; /* the final event's stop (1 + stop string index) */
    int n_prompt, n_cached[ENGINE_MAX_N], n_gen[ENGINE_MAX_N];
    int n_proposed[ENGINE_MAX_N], n_accepted[ENGINE_MAX_N];
    float logprob0;
    int n_top0;
    int n_events;
};

static void result_free(struct result *r) {
    for (int i = 0; i < ENGINE_MAX_N; i++) tok_buf_free(&r->text[i]);
}

static void collect(struct engine_req *r, struct result *res, int cancel_after) {
    struct engine_out o = {0};
    memset(res, 0, sizeof *res);
    res->logprob0 = NAN;
    bool done = false;
    for (int spins = 0; !done && spins < 100000; spins++) {
        if (!engine_req_wait(r, &o, 5000)) break;
        for (size_t i = 0; i < o.n_ev; i++) {
            const struct engine_event *ev = &o.ev[i];
            int c = ev->choice;
            struct tok_buf *b = &res->text[c];
            if (b->n + ev->text_len + 1 > b->cap) {
                b->cap = (b->n + ev->text_len + 1) * 2;
                b->p = realloc(b->p, b->cap);
            }
            memcpy(b->p + b->n, o.text + ev->text, ev->text_len);
            b->n += ev->text_len;
            b->p[b->n] = 0;
            if (ev->token >= 0 && res->n_tokens[c] < 512) {
                if (isnan(res->logprob0)) {
                    res->logprob0 = ev->logprob;
                    res->n_top0 = ev->n_top;
                }
                res->tokens[c][res->n_tokens[c]++] = ev->token;
            }
            if (ev->finish) {
                res->finish[c] = ev->finish;
                res->stop[c] = ev->stop;
                res->n_prompt = ev->n_prompt;
                res->n_cached[c] = ev->n_cached;
                res->n_gen[c] = ev->n_gen;
                res->n_proposed[c] = ev->n_proposed;
                res->n_accepted[c] = ev->n_accepted;
            }
            res->n_events++;
            if (cancel_after > 0 && res->n_events == cancel_after) engine_req_cancel(r);
        }
        done = o.done;
    }
    T_CHECK(done);
    engine_out_free(&o);
}

static struct engine_req *submit(struct engine *en, const struct engine_params *p,
                                 const int32_t *prompt, int n) {
    struct engine_req *r = NULL;
    struct err e;
    T_CHECK(engine_req_new(&r, p, prompt, n, &e) == SMELT_OK);
    if (!r) return NULL;
    smelt_status st = engine_submit(en, r, &e);
    T_CHECKF(st == SMELT_OK, "%s", e.msg);
    if (st != SMELT_OK) {
        engine_req_unref(r);
        return NULL;
    }
    return r;
}

static void greedy(struct engine_params *p, int max_tokens) {
    engine_params_default(p);
    p->sp.temperature = 0;
    p->max_tokens = max_tokens;
}

static void wait_idle(struct engine *en) {
    for (int i = 0; i < 2000 && engine_in_flight(en) > 0; i++) usleep(1000);
    usleep(5000); /* the step that finished them publishes the state after the events */
}

static void test_basic_stops(void) {
    struct fake f = {.next = counter_next};
    struct engine *en = mk_engine(&f, 64, 4, 8, 64, 64, 256);
    if (!en) return;
    int32_t prompt[3] = {1, BYTE0 + 'a', WORD0}; /* ... "Hel" -> lo, wor, ld, ! ... */
    struct engine_params p;
    struct result res;
    struct tok_buf want = {0};
    int32_t expv[64];
    bool eos;

    /* max_tokens */
    greedy(&p, 4);
    struct engine_req *r = submit(en, &p, prompt, 3);
    collect(r, &res, 0);
    int n = expect_tokens(counter_next, prompt, 3, 4, expv, &eos);
    detok(expv, n, &want);
    T_EQ_STR(res.text[0].p, want.p); /* "lo world!" */
    T_EQ_STR(res.text[0].p, "lo world!");
    T_EQ_INT(res.finish[0], ENGINE_LENGTH);
    T_EQ_INT(res.n_gen[0], 4);
    T_EQ_INT(res.n_prompt, 3);
    engine_req_unref(r);
    result_free(&res);

    /* eos ends with "stop"; the eos token adds no text */
    greedy(&p, 100);
    r = submit(en, &p, prompt, 3);
    collect(r, &res, 0);
    n = expect_tokens(counter_next, prompt, 3, 100, expv, &eos);
    T_CHECK(eos);
    detok(expv, n, &want);
    T_EQ_STR(res.text[0].p, want.p);
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    T_EQ_INT(res.stop[0], 0); /* no stop string ended it */
    T_EQ_INT(res.n_gen[0], n + 1);
    engine_req_unref(r);
    result_free(&res);

    /* ignore_eos: runs past eos to max_tokens */
    greedy(&p, 30);
    p.ignore_eos = true;
    r = submit(en, &p, prompt, 3);
    collect(r, &res, 0);
    T_EQ_INT(res.finish[0], ENGINE_LENGTH);
    T_EQ_INT(res.n_gen[0], 30);
    engine_req_unref(r);
    result_free(&res);

    /* a stop string across tokens (" ST" + "OP"): the text ends before it, nothing of it
     * shows in any event */
    const char *stops[] = {"d! STOP", "zzz"};
    greedy(&p, 100);
    p.stop = stops;
    p.n_stop = 2;
    r = submit(en, &p, prompt, 3);
    collect(r, &res, 0);
    T_EQ_STR(res.text[0].p, "lo worl");
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    T_EQ_INT(res.stop[0], 1); /* stops[0] */
    engine_req_unref(r);
    result_free(&res);

    /* two stop strings in the text: the one that comes first in it is reported, whatever
     * its place in the list */
    const char *stops3[] = {"STOP", "wor"};
    greedy(&p, 100);
    p.stop = stops3;
    p.n_stop = 2;
    r = submit(en, &p, prompt, 3);
    collect(r, &res, 0);
    T_EQ_STR(res.text[0].p, "lo ");
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    T_EQ_INT(res.stop[0], 2);
    engine_req_unref(r);
    result_free(&res);

    /* a partial match that fails is released in full */
    const char *stops2[] = {"ld!X", " STOPX"};
    greedy(&p, 8);
    p.stop = stops2;
    p.n_stop = 2;
    r = submit(en, &p, prompt, 3);
    collect(r, &res, 0);
    n = expect_tokens(counter_next, prompt, 3, 8, expv, &eos);
    detok(expv, n, &want);
    T_EQ_STR(res.text[0].p, want.p);
    T_EQ_INT(res.finish[0], ENGINE_LENGTH);
    engine_req_unref(r);
    result_free(&res);

    /* a stop token id */
    int32_t sid = WORD0 + 4; /* "!" */
    greedy(&p, 100);
    p.stop_ids = &sid;
    p.n_stop_ids = 1;
    r = submit(en, &p, prompt, 3);
    collect(r, &res, 0);
    T_EQ_STR(res.text[0].p, "lo world");
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    T_EQ_INT(res.stop[0], 0); /* a stop id is not a stop string */
    engine_req_unref(r);
    result_free(&res);

    /* logprobs of the known distribution: 10 at one token, 0 at VOCAB - 1 others */
    greedy(&p, 2);
    p.sp.n_logprobs = 3;
    r = submit(en, &p, prompt, 3);
    collect(r, &res, 0);
    double lp = 10.0 - log(exp(10.0) + (VOCAB - 1));
    T_NEAR(res.logprob0, lp, 1e-4);
    T_EQ_INT(res.n_top0, 3);
    engine_req_unref(r);
    result_free(&res);
    tok_buf_free(&want);
    engine_free(en);
}

static void test_n_and_prefix(void) {
    struct fake f = {.next = counter_next};
    struct engine *en = mk_engine(&f, 64, 4, 8, 64, 64, 256);
    if (!en) return;
    int32_t prompt[11];
    for (int i = 0; i < 11; i++) prompt[i] = BYTE0 + 'a' + i;
    struct engine_params p;
    struct result res;
    greedy(&p, 3);
    p.n = 3;
    struct engine_req *r = submit(en, &p, prompt, 11);
    collect(r, &res, 0);
    for (int c = 0; c < 3; c++) {
        T_EQ_STR(res.text[c].p, "Hello wor");
        T_EQ_INT(res.finish[c], ENGINE_LENGTH);
    }
    /* choice 0 computed the prompt; the others took its 2 full blocks from the cache */
    T_EQ_INT(res.n_cached[0], 0);
    T_EQ_INT(res.n_cached[1], 8);
    T_EQ_INT(res.n_cached[2], 8);
    engine_req_unref(r);
    result_free(&res);

    /* the same prompt again: cached; a 12-token prompt can take only 2 of its 3 blocks
     * (the last row must run for the logits) */
    greedy(&p, 1);
    r = submit(en, &p, prompt, 11);
    collect(r, &res, 0);
    T_EQ_INT(res.n_cached[0], 8);
    engine_req_unref(r);
    result_free(&res);

    /* a continuation of the first answer reuses its generated tokens' blocks too */
    int32_t longer[16];
    memcpy(longer, prompt, sizeof prompt);
    for (int i = 0; i < 3; i++) longer[11 + i] = WORD0 + i;
    longer[14] = BYTE0 + 'x';
    longer[15] = BYTE0 + 'y';
    r = submit(en, &p, longer, 16);
    collect(r, &res, 0);
    T_EQ_INT(res.n_cached[0], 12);
    engine_req_unref(r);
    result_free(&res);

    /* seeds: sampling at temperature 1 gives the same tokens for the same seed */
    struct result a, b;
    engine_params_default(&p);
    p.max_tokens = 20;
    p.sp.seed = 42;
    p.ignore_eos = true;
    f.next = hash_next;
    /* hash_next's logits are one-hot 10: temperature 1 still samples others sometimes */
    r = submit(en, &p, prompt, 11);
    collect(r, &a, 0);
    engine_req_unref(r);
    r = submit(en, &p, prompt, 11);
    collect(r, &b, 0);
    engine_req_unref(r);
    T_EQ_INT(a.n_tokens[0], 20);
    T_CHECK(memcmp(a.tokens[0], b.tokens[0], sizeof a.tokens[0]) == 0);
    result_free(&a);
    result_free(&b);

    struct engine_stats st;
    engine_stats(en, &st);
    T_CHECK(st.cached_tokens >= 8 + 8 + 8 + 12);
    engine_free(en);
}

/* ---- scheduling, seen step by step through the engine's step observer ----
 * Sequences are named by arrival: one-choice requests submitted one after the other to a
 * fresh engine arrive as 0, 1, 2, ... */

#define OBS_MAX 64

struct sched_obs {
    int max_batch, max_seqs;
    int steps;
    int max_rows, max_running, max_waiting;
    int over_budget;   /* steps with more rows than max_batch_tokens */
    int rows_mismatch; /* steps whose sequences' rows do not add up to the batch */
    int frozen;        /* a running sequence ready to decode got no row */
    int unused_budget; /* a prompt got fewer rows than it had left while the step had room */
    int n_preempted;
    int wrong_victim;       /* a preempted sequence was not the newest one running */
    uint64_t prev[OBS_MAX]; /* arrivals running after the previous step's scheduling */
    int n_prev;
    int first[OBS_MAX], last[OBS_MAX]; /* first and last step each arrival ran in (-1) */
    int ran_beside_waiting[OBS_MAX];   /* steps it ran in while others waited */
    /* one watched prompt (the chunked-prefill test) */
    int64_t watch;       /* its arrival, or -1 */
    int watch_decoders;  /* how many other sequences must decode beside each chunk */
    int chunks;          /* steps that ran a prefill chunk of it */
    int chunks_beside;   /* ... with watch_decoders decodes in the same step */
    int chunk_rows[256]; /* the rows of each of its chunks (the first 256) */
    atomic_int decoding; /* the most decodes seen in one step */
};

static void obs_init(struct sched_obs *o, int max_batch, int max_seqs) {
    memset(o, 0, sizeof *o);
    o->max_batch = max_batch;
    o->max_seqs = max_seqs;
    for (int i = 0; i < OBS_MAX; i++)
        o->first[i] = o->last[i] = -1;
    o->watch = -1;
    atomic_init(&o->decoding, 0);
}

static bool has_arrival(const uint64_t *a, int n, uint64_t x) {
    for (int i = 0; i < n; i++)
        if (a[i] == x) return true;
    return false;
}

/* The step observer: checks every step against the scheduling policy (engine.h). */
static void on_step(void *ctx, const struct engine_step_info *in) {
    struct sched_obs *o = ctx;
    int step = o->steps++;
    if (in->n_rows > o->max_rows) o->max_rows = in->n_rows;
    if (in->n_rows > o->max_batch) o->over_budget++;
    if (in->n_running > o->max_running) o->max_running = in->n_running;
    if (in->n_waiting > o->max_waiting) o->max_waiting = in->n_waiting;
    int sum = 0, decodes = 0;
    const struct engine_step_seq *watched = NULL;
    for (int i = 0; i < in->n_running; i++) {
        const struct engine_step_seq *q = &in->running[i];
        int32_t pend = q->n_tok - q->n_done;
        sum += q->rows;
        if (pend == 1 && q->rows != 1) o->frozen++;
        if (pend == 1 && q->rows == 1 && (int64_t)q->arrival != o->watch) decodes++;
        if (q->rows < pend && in->n_rows < in->budget) o->unused_budget++;
        if ((int64_t)q->arrival == o->watch && q->rows > 0 && pend > 1) watched = q;
        if (q->arrival < OBS_MAX && q->rows > 0) {
            if (o->first[q->arrival] < 0) o->first[q->arrival] = step;
            o->last[q->arrival] = step;
            if (in->n_waiting > 0) o->ran_beside_waiting[q->arrival]++;
        }
    }
    if (sum != in->n_rows) o->rows_mismatch++;
    if (decodes > atomic_load(&o->decoding)) atomic_store(&o->decoding, decodes);
    if (in->budget > o->max_batch) o->over_budget++;
    if (watched) {
        if (o->chunks < 256) o->chunk_rows[o->chunks] = watched->rows;
        o->chunks++;
        if (decodes == o->watch_decoders) o->chunks_beside++;
    }
    /* the newest running sequence is preempted first: every sequence that was running
     * before this step and still runs (not preempted and readmitted) is older */
    for (int k = 0; k < in->n_preempted; k++) {
        uint64_t v = in->preempted[k];
        o->n_preempted++;
        if (!has_arrival(o->prev, o->n_prev, v)) o->wrong_victim++;
        for (int i = 0; i < in->n_running; i++) {
            uint64_t a = in->running[i].arrival;
            if (a > v && has_arrival(o->prev, o->n_prev, a) &&
                !has_arrival(in->preempted, in->n_preempted, a))
                o->wrong_victim++;
        }
    }
    o->n_prev = 0;
    for (int i = 0; i < in->n_running && i < OBS_MAX; i++)
        o->prev[o->n_prev++] = in->running[i].arrival;
}

/* The checks every observed run must pass. */
static void obs_check(const struct sched_obs *o) {
    T_CHECK(o->steps > 0);
    T_EQ_INT(o->over_budget, 0);
    T_EQ_INT(o->rows_mismatch, 0);
    T_EQ_INT(o->frozen, 0);
    T_EQ_INT(o->unused_budget, 0);
    T_EQ_INT(o->wrong_victim, 0);
    T_CHECK(o->max_running <= o->max_seqs);
}

static struct engine *mk_observed(struct fake *f, struct sched_obs *o, int n_blocks, int bs,
                                  int max_seqs, int max_batch, int n_ctx, bool no_prefix) {
    obs_init(o, max_batch, max_seqs);
    struct engine_config c = fake_config(f, n_blocks, bs, max_seqs, max_batch, 1024, n_ctx);
    c.no_prefix_cache = no_prefix;
    c.on_step = on_step;
    c.on_step_ctx = o;
    return start_engine(&c);
}

/* Collects request r (greedy under f->next, max tokens maxt) and checks that it got
 * exactly its solo tokens and text, ending with `finish`. */
static void expect_solo(struct engine_req *r, const int32_t *prompt, int n_prompt, int maxt) {
    struct result res;
    collect(r, &res, 0);
    int32_t expv[512];
    bool eos;
    int n = expect_tokens(hash_next, prompt, n_prompt, maxt, expv, &eos);
    T_EQ_INT(res.n_tokens[0], n);
    T_CHECK(memcmp(res.tokens[0], expv, (size_t)n * sizeof *expv) == 0);
    struct tok_buf want = {0};
    detok(expv, n, &want);
    T_EQ_STR(res.text[0].p ? res.text[0].p : "", want.p ? want.p : "");
    T_EQ_INT(res.finish[0], ENGINE_LENGTH);
    tok_buf_free(&want);
    result_free(&res);
}

static void random_prompt(int32_t *p, int n, unsigned long long *rs) {
    for (int k = 0; k < n; k++)
        p[k] = (int32_t)(BYTE0 + t_rand_u64(rs) % 256);
}

/* Starts ndec sequences of random 3-token prompts (up to maxt tokens each), waits until all
 * of them decode, then runs a long random prompt of np tokens beside them, which must get
 * its solo tokens (3). The decoders are left running (dec, their prompts in dec_prompt). */
static void long_beside_decoders(struct engine *en, struct sched_obs *o, int ndec,
                                 int32_t (*dec_prompt)[3], struct engine_req **dec,
                                 int32_t *long_prompt, int np, int maxt, unsigned long long *rs) {
    struct engine_params p;
    greedy(&p, maxt);
    for (int i = 0; i < ndec; i++) {
        random_prompt(dec_prompt[i], 3, rs);
        dec[i] = submit(en, &p, dec_prompt[i], 3);
    }
    for (int i = 0; i < 5000 && atomic_load(&o->decoding) < ndec; i++)
        usleep(1000);
    T_EQ_INT(atomic_load(&o->decoding), ndec);
    random_prompt(long_prompt, np, rs);
    greedy(&p, 3);
    struct engine_req *lr = submit(en, &p, long_prompt, np);
    if (lr) {
        expect_solo(lr, long_prompt, np, 3);
        engine_req_unref(lr);
    }
}

/* A long prompt is prefilled in chunks over many steps; every sequence already decoding
 * gets its token in each of those steps (decodes first), the chunk takes exactly the rest
 * of the budget, and no step has more rows than max_batch_tokens. */
static void test_sched_chunked_prefill(void) {
    enum { NDEC = 3, NP = 150, BATCH = 16 };
    struct fake f = {.next = hash_next, .sleep_us = 500};
    struct sched_obs o;
    struct engine *en = mk_observed(&f, &o, 256, 4, 8, BATCH, 512, false);
    if (!en) return;
    o.watch = NDEC;
    o.watch_decoders = NDEC;
    unsigned long long rs = 5;
    int32_t dec_prompt[NDEC][3], long_prompt[NP];
    struct engine_req *dec[NDEC];
    /* the decoders outlive the long prefill; cancelled after it */
    long_beside_decoders(en, &o, NDEC, dec_prompt, dec, long_prompt, NP, 400, &rs);
    for (int i = 0; i < NDEC; i++) {
        if (!dec[i]) continue;
        engine_req_cancel(dec[i]);
        struct result res;
        collect(dec[i], &res, 0);
        T_EQ_INT(res.finish[0], ENGINE_CANCELLED);
        int32_t expv[512];
        bool eos;
        int n = expect_tokens(hash_next, dec_prompt[i], 3, res.n_tokens[0], expv, &eos);
        T_EQ_INT(n, res.n_tokens[0]);
        T_CHECK(memcmp(res.tokens[0], expv, (size_t)n * sizeof *expv) == 0);
        result_free(&res);
        engine_req_unref(dec[i]);
    }
    engine_free(en);
    obs_check(&o);
    T_EQ_INT(o.max_rows, BATCH);
    /* 150 rows at 16 - 3 a step: 12 chunks, each beside the three decodes */
    T_EQ_INT(o.chunks, (NP + BATCH - NDEC - 1) / (BATCH - NDEC));
    T_EQ_INT(o.chunks_beside, o.chunks);
}

/* With itl_target_s, a step beside decodes gets the prefill rows that the fitted step time
 * predicts fit the target (the fake's steps take 2 ms + 20 us a row: a 5 ms target leaves
 * ~150 rows, 147 of them prefill), never fewer than ENGINE_MIN_CHUNK; the first mixed step,
 * before any line is known, takes the whole budget. The prompt still gets its solo tokens. */
static void test_sched_itl_target(void) {
    enum { NDEC = 3, NP = 1500, BATCH = 512 };
    struct fake f = {.next = hash_next, .sleep_us = 2000, .sleep_row_us = 20};
    struct sched_obs o;
    obs_init(&o, BATCH, 8);
    struct engine_config c = fake_config(&f, 256, 16, 8, BATCH, 1024, 2048);
    c.on_step = on_step;
    c.on_step_ctx = &o;
    c.itl_target_s = 0.005;
    struct engine *en = start_engine(&c);
    if (!en) return;
    o.watch = NDEC;
    o.watch_decoders = NDEC;
    unsigned long long rs = 17;
    static int32_t long_prompt[NP];
    int32_t dec_prompt[NDEC][3];
    struct engine_req *dec[NDEC];
    long_beside_decoders(en, &o, NDEC, dec_prompt, dec, long_prompt, NP, 1000, &rs);
    for (int i = 0; i < NDEC; i++) {
        if (!dec[i]) continue;
        engine_req_cancel(dec[i]);
        engine_req_unref(dec[i]);
    }
    engine_free(en);
    obs_check(&o);
    T_CHECK(o.chunks >= 4);
    T_EQ_INT(o.chunks_beside, o.chunks);
    T_EQ_INT(o.chunk_rows[0], BATCH - NDEC); /* no line yet: the whole budget */
    /* then cut: 147 predicted; a loaded machine's late wake-ups only lengthen the steps
     * (fewer rows), so the upper bound is safe and the floor is the minimum chunk */
    for (int k = 1; k < o.chunks - 1 && k < 256; k++) {
        T_CHECKF(o.chunk_rows[k] <= 220, "chunk %d: %d rows", k, o.chunk_rows[k]);
        T_CHECKF(o.chunk_rows[k] >= ENGINE_MIN_CHUNK, "chunk %d: %d rows", k, o.chunk_rows[k]);
    }
}

/* No more than max_seqs sequences run at once; the rest wait and all finish right. */
static void test_sched_max_seqs(void) {
    enum { NREQ = 10, MAX_SEQS = 3 };
    struct fake f = {.next = hash_next, .sleep_us = 200};
    struct sched_obs o;
    struct engine *en = mk_observed(&f, &o, 256, 4, MAX_SEQS, 32, 256, false);
    if (!en) return;
    unsigned long long rs = 11;
    int32_t prompts[NREQ][20];
    int np[NREQ], maxt[NREQ];
    struct engine_req *r[NREQ];
    for (int i = 0; i < NREQ; i++) {
        np[i] = 1 + (int)(t_rand_u64(&rs) % 20);
        maxt[i] = 1 + (int)(t_rand_u64(&rs) % 12);
        random_prompt(prompts[i], np[i], &rs);
        struct engine_params p;
        greedy(&p, maxt[i]);
        r[i] = submit(en, &p, prompts[i], np[i]);
    }
    for (int i = 0; i < NREQ; i++) {
        if (!r[i]) continue;
        expect_solo(r[i], prompts[i], np[i], maxt[i]);
        engine_req_unref(r[i]);
    }
    engine_free(en);
    obs_check(&o);
    T_EQ_INT(o.max_running, MAX_SEQS);
    T_CHECK(o.max_waiting > 0);
    for (int i = 0; i < NREQ; i++)
        T_CHECK(o.first[i] >= 0);
}

/* Under KV pressure the newest running sequence is preempted; preempted sequences are
 * recomputed and finish with exactly their solo tokens; nothing fails. With and without
 * the prefix cache (a recompute then takes its own cached blocks back, or not). */
static void sched_preempt(bool no_prefix) {
    enum { NREQ = 6, NP = 5, MAXT = 20 };
    struct fake f = {.next = hash_next};
    struct sched_obs o;
    /* 12 blocks of 4: each sequence grows to 25 tokens (7 blocks); 4 may run at once */
    struct engine *en = mk_observed(&f, &o, 12, 4, 4, 64, 48, no_prefix);
    if (!en) return;
    unsigned long long rs = no_prefix ? 21 : 22;
    int32_t prompts[NREQ][NP];
    struct engine_req *r[NREQ];
    struct engine_params p;
    greedy(&p, MAXT);
    for (int i = 0; i < NREQ; i++) {
        random_prompt(prompts[i], NP, &rs);
        r[i] = submit(en, &p, prompts[i], NP);
    }
    for (int i = 0; i < NREQ; i++) {
        if (!r[i]) continue;
        expect_solo(r[i], prompts[i], NP, MAXT);
        engine_req_unref(r[i]);
    }
    wait_idle(en);
    struct engine_stats st;
    engine_stats(en, &st);
    T_EQ_INT(st.requests_finished[ENGINE_ERROR], 0);
    T_EQ_INT(st.requests_finished[ENGINE_LENGTH], NREQ);
    T_EQ_INT(st.kv.used, 0);
    engine_free(en);
    obs_check(&o);
    T_CHECK(o.n_preempted > 0);
    T_EQ_INT(o.n_preempted, st.preemptions);
}

static void test_sched_preempt(void) {
    sched_preempt(false);
}
static void test_sched_preempt_no_prefix(void) {
    sched_preempt(true);
}

/* Admission control: a request whose blocks cannot all be reserved waits (it is not
 * admitted to be preempted later) and is admitted in the step after blocks free up; the
 * waiting queue is FIFO, so a small request behind it does not overtake it. */
static void test_sched_admission(void) {
    struct fake f = {.next = hash_next, .sleep_us = 1000};
    struct sched_obs o;
    /* 16 blocks of 4. A: 40 + 8 tokens (10 to 12 blocks); B: 32 tokens (8 blocks) never
     * fits beside A; C: 4 tokens (1 block) would. */
    struct engine *en = mk_observed(&f, &o, 16, 4, 4, 64, 64, false);
    if (!en) return;
    unsigned long long rs = 31;
    int32_t a[40], b[32], c[4];
    random_prompt(a, 40, &rs);
    random_prompt(b, 32, &rs);
    random_prompt(c, 4, &rs);
    struct engine_params p;
    greedy(&p, 8);
    struct engine_req *ra = submit(en, &p, a, 40);
    greedy(&p, 4);
    struct engine_req *rb = submit(en, &p, b, 32);
    struct engine_req *rc = submit(en, &p, c, 4);
    if (ra) expect_solo(ra, a, 40, 8);
    if (rb) expect_solo(rb, b, 32, 4);
    if (rc) expect_solo(rc, c, 4, 4);
    engine_req_unref(ra);
    engine_req_unref(rb);
    engine_req_unref(rc);
    engine_free(en);
    obs_check(&o);
    T_EQ_INT(o.n_preempted, 0);
    T_CHECK(o.ran_beside_waiting[0] > 0); /* B waited while A ran */
    T_CHECK(o.last[0] >= 0);
    T_EQ_INT(o.first[1], o.last[0] + 1); /* B came in as soon as A's blocks were back */
    T_CHECK(o.first[2] >= o.first[1]);   /* FIFO: C did not overtake B */
}

/* ---- a recurrent fake: the state is a hash of every token so far ----
 * Each sequence's state lives in its slot; the next word is a function of the state, so
 * it depends on the whole history (a lost, stale or wrong state changes the text). The
 * forward checks the recurrent part of the batch contract itself: rows contiguous, a
 * first row that starts at 0 or continues its slot's positions, snapshots inside the
 * rows; a breach fails the step (the test then sees ENGINE_ERROR). */
#define REC_SLOTS 64
struct rec {
    uint64_t state[REC_SLOTS];
    int32_t pos[REC_SLOTS]; /* positions each slot covers, -1 unknown */
    long snaps, copies;
};

static uint64_t rec_mix(uint64_t h, int32_t t) {
    h ^= (uint64_t)(uint32_t)t + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static int32_t rec_word(uint64_t h) { return WORD0 + (int32_t)((h >> 17) % (uint64_t)N_WORDS); }

static smelt_status rec_forward(void *ctx, const struct batch *b, float *logits, struct err *e) {
    struct rec *f = ctx;
    int32_t k = 0;
    for (int32_t i = 0; i < b->n_tokens;) {
        int32_t sq = b->seq[i], r0 = i;
        const struct batch_seq *q = &b->seqs[sq];
        while (i < b->n_tokens && b->seq[i] == sq) i++;
        for (int32_t j = i; j < b->n_tokens; j++)
            if (b->seq[j] == sq) return err_set(e, SMELT_ERR_INTERNAL, "rows not contiguous");
        int32_t p0 = b->pos[r0], p1 = p0 + (i - r0);
        if (q->slot < 0 || q->slot >= REC_SLOTS || (p0 != 0 && f->pos[q->slot] != p0))
            return err_set(e, SMELT_ERR_INTERNAL, "slot %d covers %d, row at %d", q->slot,
                           q->slot >= 0 && q->slot < REC_SLOTS ? f->pos[q->slot] : -1, p0);
        if (q->snap_pos > 0 && (q->snap_pos < p0 || q->snap_pos > p1 || q->snap_slot == q->slot))
            return err_set(e, SMELT_ERR_INTERNAL, "snapshot at %d outside [%d, %d]", q->snap_pos,
                           p0, p1);
        uint64_t h = p0 == 0 ? 0x1234 : f->state[q->slot];
        for (int32_t r = r0; r <= i; r++) {
            int32_t pos = r < i ? b->pos[r] : p1;
            if (q->snap_pos > 0 && pos == q->snap_pos) {
                f->state[q->snap_slot] = h;
                f->pos[q->snap_slot] = pos;
                f->snaps++;
            }
            if (r == i) break;
            h = rec_mix(h, b->token[r]);
            if (b->logits[r]) {
                float *row = logits + (size_t)k++ * VOCAB;
                for (int v = 0; v < VOCAB; v++) row[v] = 0.0f;
                row[rec_word(h)] = 10.0f;
            }
        }
        f->state[q->slot] = h;
        f->pos[q->slot] = p1;
    }
    return SMELT_OK;
}

static smelt_status rec_copy(void *ctx, int32_t dst, int32_t src, struct err *e) {
    struct rec *f = ctx;
    if (dst < 0 || dst >= REC_SLOTS || src < 0 || src >= REC_SLOTS || f->pos[src] < 0)
        return err_set(e, SMELT_ERR_INTERNAL, "copy %d <- %d", dst, src);
    f->state[dst] = f->state[src];
    f->pos[dst] = f->pos[src];
    f->copies++;
    return SMELT_OK;
}

/* The greedy continuation under the recurrent fake. */
static int rec_expect(const int32_t *prompt, int n, int max, int32_t *out) {
    uint64_t h = 0x1234;
    for (int i = 0; i < n; i++) h = rec_mix(h, prompt[i]);
    for (int k = 0; k < max; k++) {
        out[k] = rec_word(h);
        h = rec_mix(h, out[k]);
    }
    return max;
}

static struct engine *mk_rec(struct rec *f, int n_blocks, int bs, int max_seqs, int max_batch,
                             int n_slots) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < REC_SLOTS; i++) f->pos[i] = -1;
    struct engine_config c = {0};
    c.n_blocks = n_blocks;
    c.block_size = bs;
    c.max_seqs = max_seqs;
    c.max_batch_tokens = max_batch;
    c.max_waiting = 1024;
    c.n_ctx = 256;
    c.n_vocab = VOCAB;
    c.forward = rec_forward;
    c.forward_ctx = f;
    c.n_slots = n_slots;
    c.state_copy = rec_copy;
    return start_engine(&c);
}

static void rec_check(struct engine_req *r, const int32_t *prompt, int n, int maxt, int choices,
                      int want_cached) {
    struct result res;
    collect(r, &res, 0);
    int32_t expv[512];
    rec_expect(prompt, n, maxt, expv);
    for (int c = 0; c < choices; c++) {
        T_EQ_INT(res.finish[c], ENGINE_LENGTH);
        T_EQ_INT(res.n_tokens[c], maxt);
        T_CHECK(memcmp(res.tokens[c], expv, (size_t)maxt * sizeof *expv) == 0);
        if (want_cached >= 0) T_EQ_INT(res.n_cached[c], want_cached);
    }
    result_free(&res);
}

/* Recurrent state slots in the engine: a follow-up turn resumes at the snapshot of the
 * previous turn's last full block; n > 1 siblings resume at the prompt's kept snapshot;
 * under block pressure preempted sequences come back from their snapshots with exactly
 * their solo text; nothing fails and no slot leaks. */
static void test_recurrent(void) {
    struct rec f;
    struct engine *en = mk_rec(&f, 64, 4, 4, 32, 16);
    if (!en) return;
    unsigned long long rs = 77;
    int32_t turn1[40], turn2[60];
    random_prompt(turn1, 40, &rs);
    struct engine_params p;
    greedy(&p, 8);
    struct engine_req *r = submit(en, &p, turn1, 40);
    if (r) rec_check(r, turn1, 40, 8, 1, 0);
    engine_req_unref(r);
    /* the follow-up: the first turn (prompt + 8 tokens, of which 47 were computed) and 5
     * new tokens: resumes at 44, the last block boundary the first turn passed */
    memcpy(turn2, turn1, sizeof turn1);
    rec_expect(turn1, 40, 8, turn2 + 40);
    random_prompt(turn2 + 48, 5, &rs);
    r = submit(en, &p, turn2, 53);
    if (r) rec_check(r, turn2, 53, 8, 1, 44);
    engine_req_unref(r);
    /* n = 3: the siblings resume at the prompt's kept snapshot (28 of 30) */
    int32_t p3[30];
    random_prompt(p3, 30, &rs);
    p.n = 3;
    r = submit(en, &p, p3, 30);
    if (r) {
        struct result res;
        collect(r, &res, 0);
        int32_t expv[16];
        rec_expect(p3, 30, 8, expv);
        for (int c = 0; c < 3; c++) {
            T_CHECK(memcmp(res.tokens[c], expv, sizeof(int32_t) * 8) == 0);
            T_EQ_INT(res.n_cached[c], c == 0 ? 0 : 28);
        }
        result_free(&res);
    }
    engine_req_unref(r);
    wait_idle(en);
    struct engine_stats st;
    engine_stats(en, &st);
    T_EQ_INT(st.kv.live_slots, 0);
    T_EQ_INT(st.requests_finished[ENGINE_ERROR], 0);
    engine_free(en);
    T_CHECK(f.copies >= 3 && f.snaps > 0);

    /* preemption: 12 blocks of 4, six sequences growing to 25 tokens */
    en = mk_rec(&f, 13, 4, 4, 48, 12);
    if (!en) return;
    enum { NREQ = 6, NP = 5, MAXT = 20 };
    int32_t prompts[NREQ][NP];
    struct engine_req *rr[NREQ];
    greedy(&p, MAXT);
    for (int i = 0; i < NREQ; i++) {
        random_prompt(prompts[i], NP, &rs);
        rr[i] = submit(en, &p, prompts[i], NP);
    }
    for (int i = 0; i < NREQ; i++) {
        if (rr[i]) rec_check(rr[i], prompts[i], NP, MAXT, 1, -1);
        engine_req_unref(rr[i]);
    }
    wait_idle(en);
    engine_stats(en, &st);
    T_EQ_INT(st.requests_finished[ENGINE_ERROR], 0);
    T_CHECK(st.preemptions > 0);
    T_EQ_INT(st.kv.live_slots, 0);
    engine_free(en);
    printf("rec preempt: copies %ld snaps %ld hits %llu preemptions %llu\n", f.copies, f.snaps, (unsigned long long)st.kv.hit_blocks, (unsigned long long)st.preemptions);
    T_CHECK(f.copies > 0); /* some preempted sequence resumed from a snapshot */
}

/* Many concurrent sequences of different lengths each get exactly their solo text, with
 * a small per-step budget (chunked prefill) and a pool too small for all of them
 * (preemption). */
static void concurrency(int nv) {
    enum { NREQ = 48 };
    /* steps of at least 0.5 ms, so that all 48 requests are queued long before the first ones
     * finish, whatever the scheduler does to this thread (on a busy 2-core CI machine the
     * submitting thread was once slow enough that the running set never outgrew the pool and
     * nothing was preempted) */
    struct fake f = {.next = hash_next, .nv = nv, .sleep_us = 500};
    /* 40 blocks of 4 = 160 tokens: far less than 48 sequences of up to 60 tokens */
    struct sched_obs o;
    struct engine *en = mk_observed(&f, &o, 40, 4, 16, 24, 128, false);
    if (!en) return;
    struct engine_req *rs[NREQ];
    int32_t prompts[NREQ][40];
    int np[NREQ], maxt[NREQ];
    unsigned long long s = 99;
    for (int i = 0; i < NREQ; i++) {
        np[i] = 1 + (int)(t_rand_u64(&s) % 40);
        maxt[i] = 1 + (int)(t_rand_u64(&s) % 20);
        for (int k = 0; k < np[i]; k++) prompts[i][k] = (int32_t)(BYTE0 + t_rand_u64(&s) % 256);
        /* set the rest too: a shared prompt copies the previous one whole (was uninitialized) */
        for (int k = np[i]; k < 40; k++) prompts[i][k] = BYTE0 + (i + k) % 256;
        if (i % 4 == 1) memcpy(prompts[i], prompts[i - 1], sizeof prompts[i]); /* shared */
        struct engine_params p;
        greedy(&p, maxt[i]);
        rs[i] = submit(en, &p, prompts[i], np[i]);
    }
    struct tok_buf want = {0};
    for (int i = 0; i < NREQ; i++) {
        if (!rs[i]) continue;
        struct result res;
        collect(rs[i], &res, 0);
        int32_t expv[64];
        bool eos;
        int n = expect_tokens(hash_next, prompts[i], np[i], maxt[i], expv, &eos);
        T_EQ_INT(res.n_tokens[0], n);
        T_CHECK(memcmp(res.tokens[0], expv, (size_t)n * sizeof *expv) == 0);
        detok(expv, n, &want);
        T_EQ_STR(res.text[0].p ? res.text[0].p : "", want.p ? want.p : "");
        T_EQ_INT(res.finish[0], ENGINE_LENGTH);
        engine_req_unref(rs[i]);
        result_free(&res);
    }
    tok_buf_free(&want);
    wait_idle(en);
    struct engine_stats st;
    engine_stats(en, &st);
    T_CHECK(st.preemptions > 0);
    T_EQ_INT(st.kv.used, 0);
    T_EQ_INT(st.running, 0);
    T_EQ_INT(st.waiting, 0);
    T_CHECK(f.max_rows_seen <= 24);
    if (nv) T_CHECK(st.parallel_sample_steps > 0);
    else T_EQ_INT(st.parallel_sample_steps, 0);
    engine_free(en);
    obs_check(&o);
    T_EQ_INT(o.n_preempted, st.preemptions);
}

static void test_concurrency(void) { concurrency(0); }

/* A large vocabulary: a step's rows are sampled by several threads (4 here); each
 * sequence still gets its solo output. */
static void test_parallel_sampling(void) { concurrency(1 << 17); }

/* Cancelling frees every block; a cancelled waiting request ends too. */
static void test_cancel(void) {
    struct fake f = {.next = hash_next, .sleep_us = 200};
    struct engine *en = mk_engine(&f, 64, 4, 2, 16, 64, 256);
    if (!en) return;
    int32_t prompt[9] = {1, 5, 6, 7, 8, 9, 10, 11, 12};
    struct engine_params p;
    greedy(&p, 200);
    struct engine_req *r[4];
    for (int i = 0; i < 4; i++) r[i] = submit(en, &p, prompt, 9);
    struct result res;
    collect(r[0], &res, 3); /* cancel after 3 events */
    T_EQ_INT(res.finish[0], ENGINE_CANCELLED);
    T_CHECK(res.n_gen[0] < 200);
    result_free(&res);
    engine_req_cancel(r[3]); /* likely still waiting (max_seqs 2) */
    collect(r[3], &res, 0);
    T_EQ_INT(res.finish[0], ENGINE_CANCELLED);
    result_free(&res);
    /* a consumer that detaches: the request ends by itself */
    engine_req_detach(r[1]);
    engine_req_detach(r[2]);
    for (int i = 0; i < 4; i++) engine_req_unref(r[i]);
    wait_idle(en);
    struct engine_stats st;
    engine_stats(en, &st);
    T_EQ_INT(engine_in_flight(en), 0);
    T_EQ_INT(st.kv.used, 0);
    T_EQ_INT(st.running + st.waiting, 0);
    engine_free(en);
}

static void test_submit_errors(void) {
    struct fake f = {.next = hash_next, .sleep_us = 2000};
    struct engine *en = mk_engine(&f, 16, 4, 1, 8, 2, 32);
    if (!en) return;
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = WORD0;
    struct engine_params p;
    greedy(&p, 5);
    struct engine_req *r;
    struct err e;
    T_CHECK(engine_req_new(&r, &p, prompt, 32, &e) == SMELT_OK);
    T_EQ_INT(engine_submit(en, r, &e), SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "32") && strstr(e.msg, "context"));
    engine_req_unref(r);
    int32_t bad = VOCAB + 5;
    T_CHECK(engine_req_new(&r, &p, &bad, 1, &e) == SMELT_OK);
    T_EQ_INT(engine_submit(en, r, &e), SMELT_ERR_INVALID);
    engine_req_unref(r);
    /* more choices than the queue holds (2) could never be queued: INVALID, not busy */
    p.n = 3;
    T_CHECK(engine_req_new(&r, &p, prompt, 4, &e) == SMELT_OK);
    T_EQ_INT(engine_submit(en, r, &e), SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "n 3") && strstr(e.msg, "(2)"));
    engine_req_unref(r);
    p.n = 1;
    /* the queue holds 2: with the engine busy, submits start failing with RANGE */
    struct engine_req *rs[8];
    int n_ok = 0, n_busy = 0;
    for (int i = 0; i < 8; i++) {
        T_CHECK(engine_req_new(&rs[i], &p, prompt, 4, &e) == SMELT_OK);
        smelt_status st = engine_submit(en, rs[i], &e);
        if (st == SMELT_OK) n_ok++;
        else if (st == SMELT_ERR_RANGE) n_busy++;
    }
    T_CHECK(n_busy > 0);
    T_EQ_INT(n_ok + n_busy, 8);
    engine_drain(en);
    T_CHECK(engine_req_new(&r, &p, prompt, 4, &e) == SMELT_OK);
    T_EQ_INT(engine_submit(en, r, &e), SMELT_ERR_CANCELLED);
    engine_req_unref(r);
    /* bad parameters */
    p.n = 0;
    T_EQ_INT(engine_req_new(&r, &p, prompt, 4, &e), SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "n ") != NULL);
    engine_free(en); /* in-flight ones end as cancelled */
    for (int i = 0; i < 8; i++) {
        struct engine_out o = {0};
        if (engine_req_poll(rs[i], &o, false)) T_CHECK(o.done || o.n_ev > 0);
        engine_out_free(&o);
        engine_req_unref(rs[i]);
    }
}

/* Prompt logprobs: one event per prompt token after the first, in order, each the
 * log-softmax of the known fake distribution; a prompt longer than a step's logits rows
 * and a prompt already in the prefix cache both report every position. */
static void test_prompt_logprobs(void) {
    struct fake f = {.next = counter_next};
    struct engine *en = mk_engine(&f, 256, 4, 4, 512, 64, 1024);
    if (!en) return;
    enum { NP = 150 };
    int32_t prompt[NP];
    unsigned long long rs = 3;
    for (int i = 0; i < NP; i++) prompt[i] = (i % 3 == 0) ? WORD0 + (int32_t)(t_rand_u64(&rs) % N_WORDS)
                                                         : counter_next(prompt[i - 1], 0);
    double hit = 10.0 - log(exp(10.0) + (VOCAB - 1)), miss = 0.0 - log(exp(10.0) + (VOCAB - 1));
    for (int round = 0; round < 2; round++) { /* the second time the prompt is cached */
        struct engine_params p;
        greedy(&p, 2);
        p.prompt_logprobs = 2;
        struct engine_req *r = submit(en, &p, prompt, NP);
        if (!r) break;
        struct engine_out o = {0};
        int n_prompt_ev = 0, n_gen = 0;
        bool done = false, order_ok = true, values_ok = true;
        while (!done && engine_req_wait(r, &o, 5000)) {
            for (size_t i = 0; i < o.n_ev; i++) {
                const struct engine_event *ev = &o.ev[i];
                if (ev->prompt) {
                    int pos = 1 + n_prompt_ev++;
                    if (n_gen || ev->token != prompt[pos]) order_ok = false;
                    double want = counter_next(prompt[pos - 1], 0) == prompt[pos] ? hit : miss;
                    if (fabs(ev->logprob - want) > 1e-4) values_ok = false;
                    if (ev->n_top != 2 || fabs(o.top[ev->top].logprob - hit) > 1e-4 ||
                        o.top[ev->top].token != counter_next(prompt[pos - 1], 0))
                        values_ok = false;
                } else if (ev->token >= 0) {
                    n_gen++;
                }
            }
            done = o.done;
        }
        T_CHECK(done);
        T_EQ_INT(n_prompt_ev, NP - 1);
        T_EQ_INT(n_gen, 2);
        T_CHECK(order_ok);
        T_CHECK(values_ok);
        engine_out_free(&o);
        engine_req_unref(r);
    }
    engine_free(en);
}

/* The notification fires once per arm, from the engine thread. */
static atomic_int notes;
static void on_note(void *ctx) {
    (void)ctx;
    atomic_fetch_add(&notes, 1);
}

static void test_notify(void) {
    struct fake f = {.next = hash_next, .sleep_us = 500};
    struct engine *en = mk_engine(&f, 64, 4, 4, 16, 64, 256);
    if (!en) return;
    int32_t prompt[2] = {1, WORD0};
    struct engine_params p;
    greedy(&p, 10);
    struct engine_req *r;
    struct err e;
    T_CHECK(engine_req_new(&r, &p, prompt, 2, &e) == SMELT_OK);
    engine_req_set_notify(r, on_note, NULL, false); /* only when done */
    T_CHECK(engine_submit(en, r, &e) == SMELT_OK);
    struct engine_out o = {0};
    T_CHECK(!engine_req_poll(r, &o, true) || !o.done);
    for (int i = 0; i < 2000 && atomic_load(&notes) == 0; i++) usleep(1000);
    T_EQ_INT(atomic_load(&notes), 1);
    T_CHECK(engine_req_poll(r, &o, false));
    T_CHECK(o.done);
    T_EQ_INT((int)o.n_ev, 10);
    engine_out_free(&o);
    engine_req_unref(r);
    engine_free(en);
}

/* ---- grammars ---- */

/* The preferred next token is always eos. */
static int32_t eos_next(int32_t t, int32_t pos) {
    (void)t;
    (void)pos;
    return EOS;
}

static struct gram *grammar(struct engine *en, enum gram_kind kind, const char *text) {
    struct gram *g = NULL;
    struct err e;
    smelt_status st = engine_grammar(en, kind, text, strlen(text), false, &g, &e);
    T_CHECKF(st == SMELT_OK, "grammar %s: %s", text, e.msg);
    return g;
}

/* Whether text is a sentence of g (complete) or a prefix of one (!complete). */
static bool in_grammar(struct gram *g, const char *text, bool complete) {
    struct gram_matcher *m;
    struct err e;
    if (gram_matcher_new(&m, g, 0, &e) != SMELT_OK) return false;
    bool ok = gram_matcher_accept_bytes(m, text, strlen(text), &e) == SMELT_OK &&
              gram_matcher_can_end(m) == complete;
    gram_matcher_free(m);
    return ok;
}

/* One greedy request alone: its result. */
static void run_one(struct engine *en, const struct engine_params *p, const int32_t *prompt, int n,
                    struct result *res) {
    struct engine_req *r = submit(en, p, prompt, n);
    memset(res, 0, sizeof *res);
    if (!r) return;
    collect(r, res, 0);
    engine_req_unref(r);
}

/* The grammar is followed whatever the model prefers: end-of-generation only once complete
 * (a model that always wants eos writes the whole sentence), the choice ends when nothing
 * can follow, max_tokens leaves a valid prefix ("length"), a forced beginning is taken
 * first, a lazy grammar waits for its trigger. */
static void test_grammar_enforced(void) {
    struct fake f = {.next = eos_next};
    struct engine *en = mk_engine(&f, 64, 4, 8, 64, 64, 256);
    if (!en) return;
    int32_t prompt[3] = {1, BYTE0 + 'a', WORD0};
    struct engine_params p;
    struct result res;

    /* without a grammar: eos at once */
    greedy(&p, 20);
    run_one(en, &p, prompt, 3, &res);
    T_EQ_STR(res.text[0].p ? res.text[0].p : "", "");
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    result_free(&res);

    /* a fixed sentence: written whole; it ends right after (no eos sampled) */
    struct gram *g = grammar(en, GRAM_GBNF, "root ::= \"ab\" [0-9]{2} \" the end\"");
    p.grammar.g = g;
    run_one(en, &p, prompt, 3, &res);
    T_CHECKF(res.text[0].p && in_grammar(g, res.text[0].p, true), "%s", res.text[0].p);
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    T_EQ_INT(res.n_gen[0], res.n_tokens[0]); /* no eos among the generated tokens */
    result_free(&res);
    /* max_tokens in the middle: a prefix, "length" */
    p.max_tokens = 3;
    run_one(en, &p, prompt, 3, &res);
    T_EQ_INT(res.finish[0], ENGINE_LENGTH);
    T_CHECK(res.text[0].p && in_grammar(g, res.text[0].p, false));
    result_free(&res);
    gram_unref(g);

    /* optional rest: eos is taken as soon as the sentence is complete */
    g = grammar(en, GRAM_GBNF, "root ::= \"x\" (\"yz\")*");
    p.grammar.g = g;
    p.max_tokens = 20;
    run_one(en, &p, prompt, 3, &res);
    T_EQ_STR(res.text[0].p, "x");
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    T_EQ_INT(res.n_gen[0], 2); /* "x", eos */
    result_free(&res);
    /* ignore_eos: eos is still the end of a grammar */
    p.ignore_eos = true;
    run_one(en, &p, prompt, 3, &res);
    T_EQ_STR(res.text[0].p, "x");
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    result_free(&res);
    p.ignore_eos = false;

    /* a forced beginning (the prompt's prefill) is taken first: the output is the rest */
    p.grammar.prefix = "xyzy";
    p.grammar.prefix_len = 4;
    run_one(en, &p, prompt, 3, &res);
    T_EQ_STR(res.text[0].p, "z");
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    result_free(&res);
    /* a forced beginning the grammar refuses fails the submit */
    p.grammar.prefix = "xx";
    p.grammar.prefix_len = 2;
    struct engine_req *r;
    struct err e;
    T_CHECK(engine_req_new(&r, &p, prompt, 3, &e) == SMELT_OK);
    T_EQ_INT(engine_submit(en, r, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "grammar") != NULL, "%s", e.msg);
    engine_req_unref(r);
    p.grammar.prefix = NULL;
    p.grammar.prefix_len = 0;
    gram_unref(g);
    engine_free(en);

    /* a lazy grammar: free text until its trigger ("ld!" across tokens), then the grammar */
    f.next = counter_next;
    en = mk_engine(&f, 64, 4, 8, 64, 64, 256);
    if (!en) return;
    g = grammar(en, GRAM_GBNF, "root ::= \"ld!\" \" the end\"");
    greedy(&p, 30);
    p.grammar.g = g;
    p.grammar.trigger = "ld!";
    p.grammar.trigger_len = 3;
    run_one(en, &p, prompt, 3, &res);
    T_EQ_STR(res.text[0].p, "lo world! the end");
    T_EQ_INT(res.finish[0], ENGINE_STOP);
    result_free(&res);
    /* its trigger never comes: no constraint */
    p.grammar.trigger = "zzz";
    run_one(en, &p, prompt, 3, &res);
    struct tok_buf want = {0};
    int32_t expv[64];
    bool eos;
    int n = expect_tokens(counter_next, prompt, 3, 30, expv, &eos);
    detok(expv, n, &want);
    T_EQ_STR(res.text[0].p, want.p);
    tok_buf_free(&want);
    result_free(&res);
    gram_unref(g);

    /* a grammar from another engine's vocabulary is refused */
    struct engine *en2 = mk_engine(&f, 16, 4, 1, 8, 8, 64);
    g = en2 ? grammar(en2, GRAM_GBNF, "root ::= \"a\"") : NULL;
    greedy(&p, 4);
    p.grammar.g = g;
    if (g) {
        T_CHECK(engine_req_new(&r, &p, prompt, 3, &e) == SMELT_OK);
        T_EQ_INT(engine_submit(en, r, &e), SMELT_ERR_INVALID);
        T_CHECK(strstr(e.msg, "vocabulary") != NULL);
        engine_req_unref(r);
    }
    gram_unref(g);
    engine_free(en2);
    /* compile errors name the place */
    struct gram *bad = NULL;
    const char *pp = "{\"type\": \"object\", \"patternProperties\": {\"a\": {}}}";
    T_EQ_INT(engine_grammar(en, GRAM_JSON_SCHEMA, pp, strlen(pp), false, &bad, &e),
             SMELT_ERR_UNSUPPORTED);
    T_CHECKF(strstr(e.msg, "patternProperties") != NULL, "%s", e.msg);
    T_CHECK(bad == NULL);
    struct engine_stats st;
    engine_stats(en, &st);
    T_CHECK(st.grammar_rows > 0 && st.grammar_seconds > 0);
    engine_free(en);
}

/* Batch invariance: requests with different grammars and without one, all in the same
 * steps (and preempted: a small pool), each get exactly what they get alone. n > 1 with
 * sampling: every choice follows the grammar. */
static void test_grammar_batch(void) {
    enum { NREQ = 12 };
    struct fake f = {.next = hash_next, .noisy = true, .sleep_us = 300};
    struct engine *en = mk_engine(&f, 10, 4, 8, 24, 64, 40);
    struct engine *solo = mk_engine(&f, 64, 4, 1, 64, 64, 40);
    if (!en || !solo) {
        engine_free(en);
        engine_free(solo);
        return;
    }
    const char *src[3] = {"root ::= \"[\" [0-9]+ (\",\" [0-9]+)* \"]\"",
                          "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                          "\"integer\"}, \"b\": {\"type\": \"string\", \"maxLength\": 5}}, "
                          "\"required\": [\"a\", \"b\"]}",
                          "(Hel|lo|[a-z ]){3,12}!"};
    const enum gram_kind kinds[3] = {GRAM_GBNF, GRAM_JSON_SCHEMA, GRAM_REGEX};
    struct gram *g[3], *gs[3];
    for (int k = 0; k < 3; k++) {
        g[k] = grammar(en, kinds[k], src[k]);
        gs[k] = grammar(solo, kinds[k], src[k]);
    }
    struct engine_req *rs[NREQ];
    int32_t prompts[NREQ][8];
    struct engine_params ps[NREQ], ps_solo[NREQ];
    unsigned long long seed = 7;
    for (int i = 0; i < NREQ; i++) {
        for (int k = 0; k < 8; k++)
            prompts[i][k] = WORD0 + (int32_t)(t_rand_u64(&seed) % N_WORDS);
        greedy(&ps[i], 10 + i * 3);
        ps_solo[i] = ps[i];
        if (i % 4 != 3) { /* every fourth has no grammar */
            ps[i].grammar.g = g[i % 4 % 3];
            ps_solo[i].grammar.g = gs[i % 4 % 3];
        }
        rs[i] = submit(en, &ps[i], prompts[i], 8);
    }
    for (int i = 0; i < NREQ; i++) {
        struct result res, want;
        if (!rs[i]) continue;
        collect(rs[i], &res, 0);
        run_one(solo, &ps_solo[i], prompts[i], 8, &want);
        T_EQ_INT(res.n_tokens[0], want.n_tokens[0]);
        T_CHECKF(memcmp(res.tokens[0], want.tokens[0],
                        sizeof *res.tokens[0] * (size_t)want.n_tokens[0]) == 0,
                 "request %d differs from its solo run", i);
        T_EQ_INT(res.finish[0], want.finish[0]);
        if (ps[i].grammar.g)
            T_CHECKF(in_grammar(ps[i].grammar.g, res.text[0].p ? res.text[0].p : "",
                                res.finish[0] == ENGINE_STOP),
                     "request %d: '%s' (finish %d)", i, res.text[0].p, res.finish[0]);
        engine_req_unref(rs[i]);
        result_free(&res);
        result_free(&want);
    }
    struct engine_stats st;
    wait_idle(en);
    engine_stats(en, &st);
    T_CHECK(st.preemptions > 0);
    /* n = 4, sampled: each choice its own matcher */
    struct engine_params p;
    engine_params_default(&p);
    p.sp.temperature = 1.5f;
    p.sp.seed = 11;
    p.max_tokens = 40;
    p.n = 4;
    p.grammar.g = g[1];
    struct engine_req *r = submit(en, &p, prompts[0], 8);
    if (r) {
        struct result res;
        collect(r, &res, 0);
        for (int c = 0; c < 4; c++)
            T_CHECKF(
                in_grammar(g[1], res.text[c].p ? res.text[c].p : "", res.finish[c] == ENGINE_STOP),
                "choice %d: '%s'", c, res.text[c].p);
        T_CHECK(strcmp(res.text[0].p ? res.text[0].p : "", res.text[1].p ? res.text[1].p : "") ||
                strcmp(res.text[2].p ? res.text[2].p : "", res.text[3].p ? res.text[3].p : ""));
        engine_req_unref(r);
        result_free(&res);
    }
    for (int k = 0; k < 3; k++) {
        gram_unref(g[k]);
        gram_unref(gs[k]);
    }
    engine_free(en);
    engine_free(solo);
}

/* ---- speculative decoding ----
 * "cycle": after word w comes w + 1 among the first six words, except that at positions
 * divisible by 5 the word jumps elsewhere: an n-gram finds repeats everywhere, is right
 * most of the time and wrong at the jumps. Never eos. */
static int32_t cycle_next(int32_t t, int32_t pos) {
    if (t < WORD0 || t >= VOCAB) return WORD0;
    int32_t w = t - WORD0;
    w = pos % 5 == 0 ? (w * 7 + 3) % N_WORDS : (w + 1) % 6;
    return WORD0 + w;
}

static struct engine *mk_spec(struct fake *f, int n_blocks, int max_seqs, int k_max) {
    struct engine_config c = fake_config(f, n_blocks, 4, max_seqs, 64, 64, 256);
    c.spec.kind = SPEC_NGRAM;
    c.spec.k_max = k_max;
    c.spec.ngram_min = 1;
    c.spec.max_batch = max_seqs;
    c.spec.row_cost = 0.01f;
    return start_engine(&c);
}

/* Greedy: n-gram speculation emits exactly the greedy continuation (an independent
 * expectation), for several sequences at once, with drafts both accepted and rejected;
 * a follow-up turn finds as many cached tokens as without speculation (the prefix cache
 * holds only accepted positions). */
static void test_spec_greedy(void) {
    enum { NREQ = 6, NP = 9, MAXT = 60 };
    struct fake f = {.next = cycle_next}, f0 = {.next = cycle_next};
    struct engine *en = mk_spec(&f, 256, 8, 6), *en0 = mk_engine(&f0, 256, 4, 8, 64, 64, 256);
    if (!en || !en0) return;
    unsigned long long rs = 5;
    int32_t prompts[NREQ][NP];
    struct engine_req *rr[NREQ];
    struct engine_params p;
    greedy(&p, MAXT);
    for (int i = 0; i < NREQ; i++) {
        random_prompt(prompts[i], NP, &rs);
        rr[i] = submit(en, &p, prompts[i], NP);
    }
    int proposed = 0, accepted = 0;
    int32_t expv[MAXT];
    for (int i = 0; i < NREQ; i++) {
        if (!rr[i]) continue;
        struct result res;
        collect(rr[i], &res, 0);
        bool eos;
        int n = expect_tokens(cycle_next, prompts[i], NP, MAXT, expv, &eos);
        T_EQ_INT(res.n_tokens[0], n);
        T_CHECK(memcmp(res.tokens[0], expv, (size_t)n * sizeof *expv) == 0);
        T_EQ_INT(res.finish[0], ENGINE_LENGTH);
        proposed += res.n_proposed[0];
        accepted += res.n_accepted[0];
        result_free(&res);
        engine_req_unref(rr[i]);
    }
    printf("spec greedy: %d proposed, %d accepted\n", proposed, accepted);
    T_CHECK(accepted > MAXT * NREQ / 4); /* most repeats are right */
    T_CHECK(accepted < proposed);        /* and the jumps are not */
    /* the follow-up turn: the prompt, the answer and more */
    int32_t turn2[NP + MAXT + 3];
    memcpy(turn2, prompts[0], sizeof prompts[0]);
    bool eos;
    expect_tokens(cycle_next, prompts[0], NP, MAXT, turn2 + NP, &eos);
    random_prompt(turn2 + NP + MAXT, 3, &rs);
    int cached[2];
    for (int k = 0; k < 2; k++) {
        greedy(&p, 4);
        struct engine_req *r = submit(k ? en0 : en, &p, turn2, NP + MAXT + 3);
        if (k) { /* the engine without speculation needs the first turn too */
            struct engine_req *r0 = NULL;
            engine_req_unref(r);
            greedy(&p, MAXT);
            r0 = submit(en0, &p, prompts[0], NP);
            struct result res;
            if (r0) collect(r0, &res, 0), result_free(&res);
            engine_req_unref(r0);
            greedy(&p, 4);
            r = submit(en0, &p, turn2, NP + MAXT + 3);
        }
        struct result res;
        cached[k] = -1;
        if (r) {
            collect(r, &res, 0);
            cached[k] = res.n_cached[0];
            result_free(&res);
        }
        engine_req_unref(r);
    }
    T_EQ_INT(cached[0], cached[1]);
    T_CHECK(cached[0] >= NP + MAXT - 4);
    wait_idle(en);
    struct engine_stats st;
    engine_stats(en, &st);
    T_CHECK(st.spec_proposed >= (uint64_t)proposed); /* and the follow-ups' */
    T_CHECK(st.spec_steps > 0);
    T_EQ_INT(st.kv.used, 0);
    engine_free(en);
    engine_free(en0);
}

/* Grammars with speculation: the drafts are cut where the grammar refuses them, the verify
 * rows carry the masks of the states after the drafts, and the matcher gives back what was
 * not accepted. The model (cycle_next, noisy) keeps wanting "!" and " ST", which the
 * grammars refuse, and the n-gram keeps proposing them (they are in the prompts): each
 * request's tokens, greedy or seeded, with a grammar, a lazy one or none, all in the same
 * steps, are exactly those it gets alone without speculation. */
static void test_spec_grammar(void) {
    enum { NREQ = 8, NP = 12, MAXT = 40 };
    struct fake f = {.next = cycle_next, .noisy = true};
    struct engine *en = mk_spec(&f, 512, NREQ, 6), *en0 = mk_engine(&f, 512, 4, 1, 64, 64, 256);
    if (!en || !en0) {
        engine_free(en);
        engine_free(en0);
        return;
    }
    const char *src[3] = {"root ::= (\"Hel\" | \"lo\" | \" wor\" | \"ld\" | \".\"){30,}",
                          "(Hel|lo| wor|ld| the){30,}",
                          "root ::= \"!\" (\"Hel\" | \"lo\" | \" wor\" | \" end\"){30,}"};
    const enum gram_kind kinds[3] = {GRAM_GBNF, GRAM_REGEX, GRAM_GBNF};
    struct gram *g[3], *g0[3];
    for (int k = 0; k < 3; k++) {
        g[k] = grammar(en, kinds[k], src[k]);
        g0[k] = grammar(en0, kinds[k], src[k]);
    }
    unsigned long long rs = 5;
    int32_t prompts[NREQ][NP];
    struct engine_params ps[NREQ], ps0[NREQ];
    struct engine_req *rr[NREQ];
    for (int i = 0; i < NREQ; i++) {
        random_prompt(prompts[i], 3, &rs);
        for (int k = 3; k < NP; k++) prompts[i][k] = WORD0 + (k - 3) % 6; /* "Hel lo wor ld ! ST" */
        greedy(&ps[i], MAXT);
        if (i == 6) { /* sampled, seeded: the n-gram's drafts are point masses */
            ps[i].sp.temperature = 0.8f;
            ps[i].sp.seed = 99;
        }
        int gi = i % 4; /* 0, 1: grammars; 2: lazy, from "!" on; 3: none */
        ps0[i] = ps[i];
        if (gi < 3) {
            ps[i].grammar.g = g[gi];
            ps0[i].grammar.g = g0[gi];
        }
        if (gi == 2) {
            ps[i].grammar.trigger = ps0[i].grammar.trigger = "!";
            ps[i].grammar.trigger_len = ps0[i].grammar.trigger_len = 1;
        }
        rr[i] = submit(en, &ps[i], prompts[i], NP);
    }
    int proposed = 0, accepted = 0;
    for (int i = 0; i < NREQ; i++) {
        if (!rr[i]) continue;
        struct result res, want;
        collect(rr[i], &res, 0);
        run_one(en0, &ps0[i], prompts[i], NP, &want);
        T_EQ_INT(res.n_tokens[0], want.n_tokens[0]);
        T_CHECKF(res.n_tokens[0] == want.n_tokens[0] &&
                     memcmp(res.tokens[0], want.tokens[0],
                            sizeof *res.tokens[0] * (size_t)want.n_tokens[0]) == 0,
                 "request %d: '%s' with speculation, '%s' without", i,
                 res.text[0].p ? res.text[0].p : "", want.text[0].p ? want.text[0].p : "");
        T_EQ_INT(res.finish[0], want.finish[0]);
        if (i % 4 < 3) {
            proposed += res.n_proposed[0];
            accepted += res.n_accepted[0];
        }
        engine_req_unref(rr[i]);
        result_free(&res);
        result_free(&want);
    }
    printf("spec grammar: %d proposed, %d accepted under grammars\n", proposed, accepted);
    T_CHECK(accepted > 0 && accepted < proposed);
    for (int k = 0; k < 3; k++) {
        gram_unref(g[k]);
        gram_unref(g0[k]);
    }
    engine_free(en);
    engine_free(en0);
}

/* Sampled, with a deterministic proposer: the tokens are those of the same seeds without
 * speculation, token for token (the coupled draw of sampler_verify); a request that opts
 * out proposes nothing. */
static void test_spec_sampled_same_seed(void) {
    enum { NREQ = 4, NP = 7, MAXT = 80 };
    struct fake f = {.next = cycle_next, .soft = true}, f0 = {.next = cycle_next, .soft = true};
    struct engine *en = mk_spec(&f, 512, 8, 4), *en0 = mk_engine(&f0, 512, 4, 8, 64, 64, 256);
    if (!en || !en0) return;
    unsigned long long rs = 11;
    int32_t prompt[NP];
    int accepted = 0, proposed = 0;
    for (int i = 0; i < NREQ; i++) {
        random_prompt(prompt, NP, &rs);
        struct engine_params p;
        engine_params_default(&p);
        p.max_tokens = MAXT;
        p.sp.temperature = 0.7f + 0.2f * (float)i;
        p.sp.top_p = i == 1 ? 0.9f : 1.0f;
        p.sp.top_k = i == 2 ? 5 : 0;
        p.sp.repetition_penalty = i == 3 ? 1.3f : 1.0f; /* each row its own request */
        p.sp.seed = 1000 + (uint64_t)i;
        p.n = 2;
        struct result a, b;
        struct engine_req *r = submit(en, &p, prompt, NP), *r0 = submit(en0, &p, prompt, NP);
        if (r) collect(r, &a, 0);
        if (r0) collect(r0, &b, 0);
        for (int c = 0; r && r0 && c < 2; c++) {
            T_EQ_INT(a.n_tokens[c], b.n_tokens[c]);
            T_CHECK(memcmp(a.tokens[c], b.tokens[c], sizeof(int32_t) * (size_t)b.n_tokens[c]) == 0);
            accepted += a.n_accepted[c];
            proposed += a.n_proposed[c];
        }
        if (r) result_free(&a);
        if (r0) result_free(&b);
        engine_req_unref(r);
        engine_req_unref(r0);
    }
    printf("spec sampled: %d proposed, %d accepted\n", proposed, accepted);
    T_CHECK(accepted > 0 && accepted < proposed);
    struct engine_params p;
    greedy(&p, 20);
    p.no_spec = true;
    struct engine_req *r = submit(en, &p, prompt, NP);
    if (r) {
        struct result res;
        collect(r, &res, 0);
        T_EQ_INT(res.n_proposed[0], 0);
        result_free(&res);
    }
    engine_req_unref(r);
    engine_free(en);
    engine_free(en0);
}

/* Recurrent layers: rejected drafts restore a snapshot and feed the accepted tokens again;
 * the text is still exactly the solo greedy one. */
static void test_spec_recurrent(void) {
    struct rec f;
    memset(&f, 0, sizeof f);
    for (int i = 0; i < REC_SLOTS; i++) f.pos[i] = -1;
    struct engine_config c = {0};
    c.n_blocks = 128;
    c.block_size = 4;
    c.max_seqs = 4;
    c.max_batch_tokens = 64;
    c.max_waiting = 64;
    c.n_ctx = 256;
    c.n_vocab = VOCAB;
    c.forward = rec_forward;
    c.forward_ctx = &f;
    c.n_slots = 16;
    c.state_copy = rec_copy;
    c.spec.kind = SPEC_NGRAM;
    c.spec.ngram_min = 1;
    c.spec.row_cost = 0.01f;
    struct engine *en = start_engine(&c);
    if (!en) return;
    enum { NREQ = 4, NP = 6, MAXT = 60 };
    unsigned long long rs = 23;
    int32_t prompts[NREQ][NP];
    struct engine_req *rr[NREQ];
    struct engine_params p;
    greedy(&p, MAXT);
    for (int i = 0; i < NREQ; i++) {
        random_prompt(prompts[i], NP, &rs);
        rr[i] = submit(en, &p, prompts[i], NP);
    }
    for (int i = 0; i < NREQ; i++) {
        if (rr[i]) rec_check(rr[i], prompts[i], NP, MAXT, 1, -1);
        engine_req_unref(rr[i]);
    }
    wait_idle(en);
    struct engine_stats st;
    engine_stats(en, &st);
    printf("spec recurrent: %llu proposed, %llu accepted, %ld copies\n",
           (unsigned long long)st.spec_proposed, (unsigned long long)st.spec_accepted, f.copies);
    T_CHECK(st.spec_proposed > st.spec_accepted); /* rejections, so rollbacks */
    T_CHECK(f.copies > 0);                        /* ... that restored snapshots */
    T_EQ_INT(st.requests_finished[ENGINE_ERROR], 0);
    T_EQ_INT(st.kv.live_slots, 0);
    engine_free(en);
}

int main(void) {
    T_RUN(test_prefix_index);
    T_RUN(test_prefix_churn);
    T_RUN(test_argmax);
    if (!make_tok()) {
        fprintf(stderr, "FAIL: cannot build the test tokenizer\n");
        return 1;
    }
    T_RUN(test_basic_stops);
    T_RUN(test_n_and_prefix);
    T_RUN(test_concurrency);
    T_RUN(test_parallel_sampling);
    T_RUN(test_sched_chunked_prefill);
    T_RUN(test_sched_itl_target);
    T_RUN(test_sched_max_seqs);
    T_RUN(test_sched_preempt);
    T_RUN(test_sched_preempt_no_prefix);
    T_RUN(test_sched_admission);
    T_RUN(test_recurrent);
    T_RUN(test_cancel);
    T_RUN(test_submit_errors);
    T_RUN(test_notify);
    T_RUN(test_prompt_logprobs);
    T_RUN(test_grammar_enforced);
    T_RUN(test_grammar_batch);
    T_RUN(test_spec_greedy);
    T_RUN(test_spec_sampled_same_seed);
    T_RUN(test_spec_grammar);
    T_RUN(test_spec_recurrent);
    tok_free(tk);
    return t_done();
}
