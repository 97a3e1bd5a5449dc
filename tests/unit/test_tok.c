/* Tokenizer unit and property tests: UTF-8 repair (expected values are Python's
 * bytes.decode(errors="replace")), the invalid-input policy, special tokens, streaming
 * detokenization vs whole decode, round trips, both BPE merge loops, NFC, thread safety,
 * load errors. Tiny built-in vocabs always; the shared vocabs when present. */
#include <pthread.h>

#include "t.h"
#include "tok_test_util.h"
#include "tok_tiny.h"
#include "tokenizer/tok_int.h"
#include "util/utf8.h"

smelt_status tok_bpe_word_long(struct tok_ctx *c, const uint8_t *w, size_t n);

static struct tok *shared_vocab(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/data/vocab/ggml-vocab-%s.gguf", t_shared_dir(), name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fclose(f);
    return tu_load(path);
}

static bool encode(const struct tok *t, const char *s, size_t n, unsigned flags,
                   struct tok_ids *out) {
    struct err e = {0};
    out->n = 0;
    smelt_status st = tok_encode(t, s, n, flags, out, &e);
    if (st != SMELT_OK) fprintf(stderr, "encode: %s\n", e.msg);
    return st == SMELT_OK;
}

static bool ids_eq(const struct tok_ids *a, const int32_t *b, size_t n) {
    return a->n == n && (n == 0 || !memcmp(a->v, b, n * sizeof *b));
}

/* ---------------------------------------------------------------- UTF-8 */

static void test_utf8(void) {
    uint32_t cp;
    T_EQ_INT(utf8_decode((const uint8_t *)"A", 1, &cp), 1);
    T_EQ_INT(cp, 'A');
    T_EQ_INT(utf8_decode((const uint8_t *)"\xC3\xA9", 2, &cp), 2);
    T_EQ_INT(cp, 0xE9);
    T_EQ_INT(utf8_decode((const uint8_t *)"\xF0\x9F\x98\x80", 4, &cp), 4);
    T_EQ_INT(cp, 0x1F600);
    T_EQ_INT(utf8_decode((const uint8_t *)"\xEF\xBF\xBF", 3, &cp), 3); /* U+FFFF is valid */
    T_EQ_INT(utf8_decode((const uint8_t *)"\xC0\x80", 2, &cp), 0);     /* overlong */
    T_EQ_INT(utf8_decode((const uint8_t *)"\xED\xA0\x80", 3, &cp), 0); /* surrogate */
    T_EQ_INT(utf8_decode((const uint8_t *)"\xF4\x90\x80\x80", 4, &cp), 0);
    T_EQ_INT(utf8_decode((const uint8_t *)"\xF0\x9F\x98", 3, &cp), 0); /* truncated */
    T_EQ_INT(utf8_incomplete_len((const uint8_t *)"\xF0\x9F\x98", 3), 3);
    T_EQ_INT(utf8_incomplete_len((const uint8_t *)"\xE2", 1), 1);
    T_EQ_INT(utf8_incomplete_len((const uint8_t *)"\xE2"
                                                  "a",
                                 2),
             0);
    T_EQ_INT(utf8_incomplete_len((const uint8_t *)"\x80", 1), 0);
    T_EQ_INT(utf8_incomplete_len((const uint8_t *)"\xED\xA0", 2), 0);

    /* (input, Python's decode(errors="replace") re-encoded) */
    static const char *const cases[][2] = {
        {"a\x80"
         "b",
         "a\xEF\xBF\xBD"
         "b"},
        {"\xE2\x82", "\xEF\xBF\xBD"},
        {"\xE2\x82"
         "a",
         "\xEF\xBF\xBD"
         "a"},
        {"\xF0\x9F\x98", "\xEF\xBF\xBD"},
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xE0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xF0\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {"\xE1\x80\xE1\x80\x80", "\xEF\xBF\xBD\xE1\x80\x80"},
        {"ok \xE2\x82\xAC", "ok \xE2\x82\xAC"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const uint8_t *in = (const uint8_t *)cases[i][0];
        size_t n = strlen(cases[i][0]), m = utf8_repaired_len(in, n);
        uint8_t out[64];
        T_EQ_INT(m, strlen(cases[i][1]));
        T_EQ_INT(utf8_repair(in, n, out), m);
        T_CHECKF(!memcmp(out, cases[i][1], m), "case %zu", i);
        T_EQ_INT(utf8_validate(out, m), m);
    }
    T_EQ_INT(utf8_validate((const uint8_t *)"abc\xFF", 4), 3);
}

/* ---------------------------------------------------------------- tiny vocabs */

static void test_tiny_bpe(void) {
    struct tok *t = tiny_bpe(NULL);
    T_CHECK(t != NULL);
    if (!t) return;
    T_EQ_INT(tok_model(t), TOK_MODEL_BPE);
    T_EQ_STR(tok_pre_name(t), "qwen2");
    T_CHECK(tok_pre_known(t));
    struct tok_ids ids = {0};
    /* "Hello the world": Hello | Ġthe | Ġworld */
    T_CHECK(encode(t, "Hello the world", 15, 0, &ids));
    int32_t want[] = {256 + 17, 256 + 2, 256 + 13};
    T_CHECK(ids_eq(&ids, want, 3));
    /* special tokens: parsed, or literal */
    int32_t ims = tok_find(t, "<|im_start|>", 12), ime = tok_find(t, "<|im_end|>", 10);
    T_CHECK(ims > 0 && ime > 0);
    T_CHECK(tok_is_control(t, ims));
    T_CHECK(tok_is_eog(t, ime));
    T_CHECK(tok_is_eog(t, tok_find(t, "<|endoftext|>", 13)));
    T_CHECK(!tok_is_eog(t, ims));
    T_CHECK(encode(t, "<|im_start|>Hello<|im_end|>", 27, TOK_PARSE_SPECIAL, &ids));
    int32_t want2[] = {ims, 256 + 17, ime};
    T_CHECK(ids_eq(&ids, want2, 3));
    T_CHECK(encode(t, "<|im_start|>Hello", 17, 0, &ids));
    T_CHECK(ids.n > 3 && ids.v[0] != ims);
    /* user-defined tokens match even without TOK_PARSE_SPECIAL */
    int32_t tc = tok_find(t, "<tool_call>", 11);
    T_CHECK(encode(t, "a<tool_call>b", 13, 0, &ids));
    int32_t want3[] = {'a', tc, 'b'};
    T_CHECK(ids_eq(&ids, want3, 3));
    /* add_bos is off in this vocab; EOS never added */
    T_CHECK(encode(t, "a", 1, TOK_ADD_SPECIAL, &ids));
    T_EQ_INT(ids.n, 1);
    /* decode */
    struct tok_buf b = {0};
    struct err e;
    T_CHECK(tok_decode(t, want2, 3, 0, &b, &e) == SMELT_OK);
    T_EQ_STR(b.p, "Hello");
    b.n = 0;
    T_CHECK(tok_decode(t, want2, 3, TOK_DECODE_SPECIAL, &b, &e) == SMELT_OK);
    T_EQ_STR(b.p, "<|im_start|>Hello<|im_end|>");
    int32_t bad = 99999;
    T_CHECK(tok_decode(t, &bad, 1, 0, &b, &e) == SMELT_ERR_RANGE);
    tok_buf_free(&b);
    tok_ids_free(&ids);
    tok_free(t);
}

static void test_tiny_spm(void) {
    struct tok *t = tiny_spm();
    T_CHECK(t != NULL);
    if (!t) return;
    T_EQ_INT(tok_model(t), TOK_MODEL_SPM);
    T_CHECK(tok_add_bos(t));
    struct tok_ids ids = {0};
    int32_t hello = tok_find(t, " Hello", 6), world = tok_find(t, " world", 6);
    T_CHECK(hello > 0 && world > 0);
    T_CHECK(encode(t, "Hello world", 11, TOK_ADD_SPECIAL, &ids));
    int32_t want[] = {1, hello, world};
    T_CHECK(ids_eq(&ids, want, 3));
    /* byte fallback for what the vocab lacks: "ü" = C3 BC */
    T_CHECK(encode(t, "ü", 2, 0, &ids));
    int32_t sp = tok_find(t, " ", 1);
    int32_t want2[] = {sp, 3 + 0xC3, 3 + 0xBC};
    T_CHECK(ids_eq(&ids, want2, 3));
    /* decode with and without the leading-space strip */
    struct tok_buf b = {0};
    struct err e;
    T_CHECK(tok_decode(t, want, 3, TOK_DECODE_STRIP, &b, &e) == SMELT_OK);
    T_EQ_STR(b.p, "Hello world");
    b.n = 0;
    T_CHECK(tok_decode(t, want, 3, 0, &b, &e) == SMELT_OK);
    T_EQ_STR(b.p, " Hello world");
    b.n = 0;
    T_CHECK(tok_decode(t, want, 3, TOK_DECODE_STRIP | TOK_DECODE_SPECIAL, &b, &e) == SMELT_OK);
    T_EQ_STR(b.p, "<s> Hello world"); /* the strip applies to the first output byte only */
    /* invalid byte-fallback sequences: one U+FFFD per byte (HF's ByteFallback) */
    int32_t junk[] = {3 + 0xE2, 3 + 0x82, hello};
    b.n = 0;
    T_CHECK(tok_decode(t, junk, 3, 0, &b, &e) == SMELT_OK);
    T_EQ_STR(b.p, "\xEF\xBF\xBD\xEF\xBF\xBD Hello");
    /* after a special token the next segment gets the space prefix again */
    T_CHECK(encode(t, "Hello</s>Hello", 14, TOK_PARSE_SPECIAL, &ids));
    int32_t want3[] = {hello, 2, hello};
    T_CHECK(ids_eq(&ids, want3, 3));
    /* user-defined "<b>" is matched in raw text */
    T_CHECK(encode(t, "<b>", 3, 0, &ids));
    T_EQ_INT(ids.n, 1);
    T_EQ_INT(ids.v[0], tok_n_vocab(t) - 1);
    tok_buf_free(&b);
    tok_ids_free(&ids);
    tok_free(t);
}

/* ---------------------------------------------------------------- properties */

/* Random valid UTF-8 from a mix of ranges (ASCII-heavy). */
static size_t rand_text(unsigned long long *s, char *out, size_t max) {
    static const uint32_t ranges[][2] = {
        {0x20, 0x7E},     {0x20, 0x7E},       {0x20, 0x7E},     {0x09, 0x0D},
        {0x00, 0x1F},     {0xA0, 0x24F},      {0x300, 0x36F},   {0x400, 0x4FF},
        {0x600, 0x6FF},   {0xE00, 0xE7F},     {0x3040, 0x30FF}, {0x4E00, 0x9FFF},
        {0xAC00, 0xD7A3}, {0x1F300, 0x1F64F}, {0x200B, 0x200F}, {0x10000, 0x10FFFF},
        {0x20, 0x20},     {0x30, 0x39},
    };
    size_t n = 0, want = 1 + t_rand_u64(s) % (max / 8);
    while (n + 4 < max && n < want) {
        const uint32_t *r = ranges[t_rand_u64(s) % (sizeof ranges / sizeof *ranges)];
        uint32_t cp = r[0] + (uint32_t)(t_rand_u64(s) % (r[1] - r[0] + 1));
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        n += utf8_encode(cp, (uint8_t *)out + n);
    }
    return n;
}

/* decode(encode(x)) == x, and streaming in random chunks equals the whole decode. */
static void round_trip(const struct tok *t, const char *name, int iters, bool nfc) {
    struct tok_ctx nc = {0};
    unsigned long long s = 0x1234567ull;
    char text[4096];
    struct tok_ids ids = {0};
    struct tok_buf whole = {0}, stream = {0};
    unsigned flags = tok_model(t) == TOK_MODEL_SPM ? TOK_DECODE_STRIP : 0;
    int bad = 0, checked = 0;
    for (int it = 0; it < iters; it++) {
        size_t n = rand_text(&s, text, sizeof text);
        if (tok_model(t) == TOK_MODEL_SPM && memmem(text, n, "\xE2\x96\x81", 3)) continue;
        bool all_bytes = true; /* a byte-level vocab may lack some bytes: starcoder F1..F3 */
        for (size_t i = 0; i < n && tok_model(t) == TOK_MODEL_BPE; i++)
            all_bytes &= t->byte_id[(uint8_t)text[i]] >= 0;
        if (!all_bytes) continue;
        if (!encode(t, text, n, 0, &ids)) {
            bad++;
            continue;
        }
        whole.n = 0;
        struct err e;
        if (tok_decode(t, ids.v, ids.n, flags, &whole, &e) != SMELT_OK) {
            bad++;
            continue;
        }
        checked++;
        const char *expect = text;
        if (nfc) { /* the vocab normalizes: the round trip gives NFC(x) */
            const uint8_t *o;
            if (tok_nfc(&nc, (const uint8_t *)text, n, &o, &n, &e) != SMELT_OK) bad++;
            expect = (const char *)o;
        }
        if (whole.n != n || memcmp(whole.p, expect, n)) {
            if (bad++ < 3) {
                size_t k = 0;
                while (k < n && k < whole.n && expect[k] == whole.p[k])
                    k++;
                fprintf(stderr, "%s: round trip differs at byte %zu (%zu bytes in, %zu out):", name,
                        k, n, whole.n);
                for (size_t j = k; j < k + 8 && j < n; j++)
                    fprintf(stderr, " %02x", (uint8_t)expect[j]);
                fprintf(stderr, " vs");
                for (size_t j = k; j < k + 8 && j < whole.n; j++)
                    fprintf(stderr, " %02x", (uint8_t)whole.p[j]);
                fprintf(stderr, "\n");
            }
        }
        /* stream the same ids */
        struct tok_detok d;
        tok_detok_init(&d, t, flags);
        stream.n = 0;
        for (size_t i = 0; i < ids.n; i++) {
            size_t before = stream.n;
            tok_detok_push(&d, ids.v[i], &stream, &e);
            /* every chunk emitted is valid UTF-8 on its own */
            if (utf8_validate((const uint8_t *)stream.p + before, stream.n - before) !=
                stream.n - before)
                bad++;
        }
        tok_detok_flush(&d, &stream, &e);
        if (stream.n != whole.n || memcmp(stream.p, whole.p, whole.n)) bad++;
    }
    T_CHECKF(bad == 0, "%s: %d of %d round trips failed", name, bad, checked);
    T_CHECKF(checked > iters / 4, "%s: only %d strings checked", name, checked);
    free(nc.nbuf);
    free(nc.cps);
    tok_ids_free(&ids);
    tok_buf_free(&whole);
    tok_buf_free(&stream);
}

static void test_round_trip_tiny(void) {
    struct tok *b = tiny_bpe("gpt-2"), *s = tiny_spm();
    T_CHECK(b && s);
    if (b) round_trip(b, "tiny-bpe", 300, false);
    if (s) round_trip(s, "tiny-spm", 300, false);
    tok_free(b);
    tok_free(s);
}

static void test_round_trip_shared(void) {
    static const char *const names[] = {"gpt-2", "starcoder", "deepseek-llm", "llama-spm", "phi-3"};
    int done = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        struct tok *t = shared_vocab(names[i]);
        if (!t) continue;
        round_trip(t, names[i], 200, false);
        tok_free(t);
        done++;
    }
    char path[1024];
    if (tu_find_test_model("tokenizer.ggml.pre", "qwen2", path, sizeof path)) {
        struct tok *t = tu_load(path);
        if (t) round_trip(t, "qwen2 (NFC)", 200, true), done++;
        tok_free(t);
    }
    if (tu_find_test_model("general.architecture", "gemma3", path, sizeof path)) {
        struct tok *t = tu_load(path);
        if (t) round_trip(t, "gemma3", 200, false), done++;
        tok_free(t);
    }
    if (!done) t_skip("no shared vocab and no test model present");
}

/* Random bytes, invalid UTF-8 included: encoding equals encoding the repaired text. */
static void test_invalid_input(void) {
    struct tok *ts[2] = {tiny_bpe(NULL), tiny_spm()};
    unsigned long long s = 99;
    uint8_t raw[256], fixed[1024];
    struct tok_ids a = {0}, b = {0};
    for (int k = 0; k < 2; k++) {
        T_CHECK(ts[k] != NULL);
        if (!ts[k]) continue;
        for (int it = 0; it < 500; it++) {
            size_t n = t_rand_u64(&s) % sizeof raw;
            for (size_t i = 0; i < n; i++) {
                uint64_t r = t_rand_u64(&s);
                raw[i] = (r & 3) ? (uint8_t)(0x20 + (r >> 8) % 0x60) : (uint8_t)(r >> 16);
            }
            size_t m = utf8_repair(raw, n, fixed);
            T_CHECK(encode(ts[k], (const char *)raw, n, TOK_PARSE_SPECIAL, &a));
            T_CHECK(encode(ts[k], (const char *)fixed, m, TOK_PARSE_SPECIAL, &b));
            T_CHECK(a.n == b.n && (a.n == 0 || !memcmp(a.v, b.v, a.n * sizeof *a.v)));
        }
        tok_free(ts[k]);
    }
    tok_ids_free(&a);
    tok_ids_free(&b);
}

/* The detokenizer holds partial characters and replaces what cannot complete. */
static void test_detok_partial(void) {
    struct tok *t = tiny_bpe(NULL);
    if (!t) {
        T_CHECK(0);
        return;
    }
    struct tok_detok d;
    struct tok_buf out = {0};
    struct err e;
    /* byte-level tokens are bytes: ids 0..255 */
    tok_detok_init(&d, t, 0);
    tok_detok_push(&d, 0xF0, &out, &e);
    tok_detok_push(&d, 0x9F, &out, &e);
    T_EQ_INT(out.n, 0); /* held */
    tok_detok_push(&d, 0x98, &out, &e);
    tok_detok_push(&d, 0x80, &out, &e);
    T_EQ_STR(out.p, "\xF0\x9F\x98\x80");
    tok_detok_push(&d, 0xE2, &out, &e);
    tok_detok_push(&d, 'a', &out, &e); /* cannot continue: U+FFFD, then 'a' */
    T_EQ_STR(out.p, "\xF0\x9F\x98\x80\xEF\xBF\xBD"
                    "a");
    tok_detok_push(&d, 0xE2, &out, &e);
    tok_detok_push(&d, 0x82, &out, &e);
    tok_detok_flush(&d, &out, &e); /* held at the end: one U+FFFD (maximal subpart) */
    T_EQ_STR(out.p, "\xF0\x9F\x98\x80\xEF\xBF\xBD"
                    "a\xEF\xBF\xBD");
    out.n = 0;
    tok_detok_push(&d, 0xFF, &out, &e); /* never valid */
    tok_detok_push(&d, 0x80, &out, &e);
    T_EQ_STR(out.p, "\xEF\xBF\xBD\xEF\xBF\xBD");
    tok_buf_free(&out);
    tok_free(t);
}

/* Both BPE merge loops give the same ids (the short one is used up to 32 symbols). */
static void test_bpe_paths(void) {
    struct tok *t = shared_vocab("gpt-2");
    bool tiny = !t;
    if (tiny) t = tiny_bpe(NULL);
    if (!t) {
        T_CHECK(0);
        return;
    }
    struct tok_ids a = {0}, b = {0};
    struct tok_ctx c = {.t = t};
    unsigned long long s = 5;
    char w[64];
    int bad = 0;
    for (int it = 0; it < 3000; it++) {
        size_t n = 1 + t_rand_u64(&s) % 40;
        for (size_t i = 0; i < n; i++)
            w[i] = "etaoin shrdlu'0123456789\xC3\xA9"[t_rand_u64(&s) % 27];
        a.n = b.n = 0;
        c.out = &a;
        tok_bpe_word(&c, (const uint8_t *)w, n);
        c.out = &b;
        tok_bpe_word_long(&c, (const uint8_t *)w, n);
        if (a.n != b.n || memcmp(a.v, b.v, a.n * sizeof *a.v)) bad++;
    }
    T_CHECKF(bad == 0, "%d words differ between the merge loops%s", bad, tiny ? " (tiny)" : "");
    tok_bpe_ctx_free(&c);
    tok_ids_free(&a);
    tok_ids_free(&b);
    tok_free(t);
}

static void test_nfc(void) {
    struct tok_ctx c = {0};
    struct err e;
    /* (input, NFC) pairs: Unicode's own examples plus Hangul */
    static const char *const cases[][2] = {
        {"e\xCC\x81", "\xC3\xA9"},                                /* e + acute -> é */
        {"A\xCC\x8A", "\xC3\x85"},                                /* A + ring -> Å */
        {"\xE2\x84\xAB", "\xC3\x85"},                             /* ANGSTROM SIGN -> Å */
        {"\xE1\xBA\x9B\xCC\xA3", "\xE1\xBA\x9B\xCC\xA3"},         /* ẛ̣ stays */
        {"q\xCC\x87\xCC\xA3", "q\xCC\xA3\xCC\x87"},               /* reorder by class */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* jamo -> 각 */
        {"\xE0\xA7\x9F", "\xE0\xA6\xAF\xE0\xA6\xBC"},             /* exclusion: stays decomposed */
        {"abc", "abc"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const uint8_t *out;
        size_t n;
        const char *in = cases[i][0];
        T_CHECK(tok_nfc(&c, (const uint8_t *)in, strlen(in), &out, &n, &e) == SMELT_OK);
        T_CHECKF(n == strlen(cases[i][1]) && !memcmp(out, cases[i][1], n), "case %zu", i);
        if (!strcmp(in, "abc")) T_CHECK(tok_nfc_quick((const uint8_t *)in, 3));
    }
    T_CHECK(!tok_nfc_quick((const uint8_t *)"e\xCC\x81", 3));
    free(c.nbuf);
    free(c.cps);
}

/* ---------------------------------------------------------------- threads */

struct job {
    const struct tok *t;
    char **texts;
    size_t *lens;
    int n;
    struct tok_ids *want;
    int bad;
};

static void *encode_all(void *arg) {
    struct job *j = arg;
    struct tok_ids ids = {0};
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < j->n; i++) {
            if (!encode(j->t, j->texts[i], j->lens[i], TOK_PARSE_SPECIAL, &ids) ||
                !ids_eq(&ids, j->want[i].v, j->want[i].n))
                j->bad++;
        }
    tok_ids_free(&ids);
    return NULL;
}

/* Many threads encoding on one tok get the single-threaded ids. */
static void test_threads(void) {
    size_t len;
    char *corpus = t_read_file(SMELT_SOURCE_DIR "/tests/data/tok/corpus.inp", &len);
    if (!corpus) {
        T_CHECK(0);
        return;
    }
    static char *texts[512];
    static size_t lens[512];
    int n = tu_split_inp(corpus, len, texts, lens, 512);
    struct tok *ts[2] = {shared_vocab("gpt-2"), tiny_spm()};
    if (!ts[0]) ts[0] = tiny_bpe(NULL);
    for (int k = 0; k < 2; k++) {
        if (!ts[k]) {
            T_CHECK(0);
            continue;
        }
        struct tok_ids *want = calloc((size_t)n, sizeof *want);
        for (int i = 0; i < n; i++)
            encode(ts[k], texts[i], lens[i], TOK_PARSE_SPECIAL, &want[i]);
        pthread_t th[4];
        struct job jobs[4];
        for (int i = 0; i < 4; i++) {
            jobs[i] = (struct job){ts[k], texts, lens, n, want, 0};
            pthread_create(&th[i], NULL, encode_all, &jobs[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            T_EQ_INT(jobs[i].bad, 0);
        }
        for (int i = 0; i < n; i++)
            tok_ids_free(&want[i]);
        free(want);
        tok_free(ts[k]);
    }
    free(corpus);
}

/* ---------------------------------------------------------------- loading */

static void test_load_errors(void) {
    struct gguf_writer *w = NULL;
    struct err e = {0};
    T_CHECK(gguf_writer_new(&w, &e) == SMELT_OK);
    gguf_set_str(w, "general.architecture", "bert");
    gguf_set_str(w, "tokenizer.ggml.model", "bert");
    const char *toks[] = {"a", "b"};
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 2);
    char path[] = "/tmp/smelt-tok-bad-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    T_CHECK(gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK);
    struct gguf_file *g = NULL;
    struct tok *t = NULL;
    T_CHECK(gguf_open(&g, path, &e) == SMELT_OK);
    /* WordPiece without an unknown token */
    T_EQ_INT(tok_new_from_gguf(&t, g, NULL, &e), SMELT_ERR_FORMAT);
    T_CHECKF(strstr(e.msg, "[UNK]") != NULL, "%s", e.msg);
    T_CHECK(t == NULL);
    gguf_close(g);
    gguf_set_str(w, "tokenizer.ggml.model", "t5"); /* (Unigram: not supported) */
    T_CHECK(gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK);
    T_CHECK(gguf_open(&g, path, &e) == SMELT_OK);
    T_EQ_INT(tok_new_from_gguf(&t, g, NULL, &e), SMELT_ERR_UNSUPPORTED);
    T_CHECKF(strstr(e.msg, "t5") != NULL, "%s", e.msg);
    T_CHECK(t == NULL);
    gguf_close(g);
    /* a byte-level vocab without merges */
    gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    T_CHECK(gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK);
    T_CHECK(gguf_open(&g, path, &e) == SMELT_OK);
    T_CHECK(tok_new_from_gguf(&t, g, NULL, &e) != SMELT_OK);
    T_CHECK(strstr(e.msg, "merges") != NULL);
    gguf_close(g);
    /* token types of the wrong length */
    int32_t ty[3] = {1, 1, 1};
    const char *merges[] = {"a b"};
    gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, ty, 3);
    T_CHECK(gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK);
    T_CHECK(gguf_open(&g, path, &e) == SMELT_OK);
    T_EQ_INT(tok_new_from_gguf(&t, g, NULL, &e), SMELT_ERR_FORMAT);
    T_CHECK(strstr(e.msg, "token_type") != NULL);
    gguf_close(g);
    /* a GGUF with no tokenizer at all */
    struct gguf_writer *w2 = NULL;
    gguf_writer_new(&w2, &e);
    gguf_set_str(w2, "general.architecture", "llama");
    T_CHECK(gguf_writer_write(w2, path, NULL, NULL, &e) == SMELT_OK);
    T_CHECK(gguf_open(&g, path, &e) == SMELT_OK);
    T_EQ_INT(tok_new_from_gguf(&t, g, NULL, &e), SMELT_ERR_NOT_FOUND);
    T_CHECK(strstr(e.msg, "tokenizer.ggml.model") != NULL);
    gguf_close(g);
    gguf_writer_free(w2);
    gguf_writer_free(w);
    unlink(path);
}

/* An unknown tokenizer.ggml.pre is refused, naming it; allowed, it loads and splits like
 * GPT-2. */
static void test_unknown_pre(void) {
    char path[] = "/tmp/smelt-tok-pre-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    struct gguf_writer *w = NULL;
    struct err e = {0};
    T_CHECK(gguf_writer_new(&w, &e) == SMELT_OK);
    const char *toks[] = {"a", "b", "ab"}, *merges[] = {"a b"};
    gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_set_str(w, "tokenizer.ggml.pre", "no-such-pre");
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    T_CHECK(gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK);
    gguf_writer_free(w);
    struct gguf_file *g = NULL;
    struct tok *t = NULL;
    T_CHECK(gguf_open(&g, path, &e) == SMELT_OK);
    T_EQ_INT(tok_new_from_gguf(&t, g, NULL, &e), SMELT_ERR_UNSUPPORTED);
    T_CHECK(t == NULL);
    T_CHECK(strstr(e.msg, "\"no-such-pre\"") && strstr(e.msg, "--allow-unknown-pretokenizer") &&
            strstr(e.msg, "qwen35"));
    /* --pre names an unknown one too */
    struct tok_opts o = {.pre = "qwen99"};
    T_EQ_INT(tok_new_from_gguf(&t, g, &o, &e), SMELT_ERR_UNSUPPORTED);
    T_CHECK(strstr(e.msg, "\"qwen99\"") != NULL);
    o = (struct tok_opts){.allow_unknown_pre = true};
    T_EQ_INT(tok_new_from_gguf(&t, g, &o, &e), SMELT_OK);
    T_CHECK(t && !tok_pre_known(t));
    tok_free(t);
    gguf_close(g);
    unlink(path);

    o = (struct tok_opts){.pre = "no-such-pre", .allow_unknown_pre = true};
    struct tok *a = tiny_bpe_opts(&o), *b = tiny_bpe("gpt-2");
    T_CHECK(a && b);
    if (a && b) {
        T_CHECK(!tok_pre_known(a));
        T_EQ_STR(tok_pre_name(a), "no-such-pre");
        struct tok_ids x = {0}, y = {0};
        const char *s = "Hello, world! It's 12345 and\n\n  more   text";
        encode(a, s, strlen(s), 0, &x);
        encode(b, s, strlen(s), 0, &y);
        T_CHECK(ids_eq(&x, y.v, y.n));
        tok_ids_free(&x);
        tok_ids_free(&y);
    }
    tok_free(a);
    tok_free(b);
}

/* A harmony vocab (gpt-oss: <|return|> and <|call|> end the reply) keeps <|end|> out of the
 * end-of-generation set, even as the file's eot; elsewhere <|end|> ends a turn (Phi-3). */
static void test_harmony_eog(void) {
    const char *toks[] = {"a", "b", "ab", "<|end|>", "<|return|>", "<|call|>", "<|start|>"};
    int32_t types[] = {1, 1, 1, TOK_T_CONTROL, TOK_T_CONTROL, TOK_T_CONTROL, TOK_T_CONTROL};
    const char *merges[] = {"a b"};
    for (int harmony = 0; harmony < 2; harmony++) {
        char path[] = "/tmp/smelt-tok-eog-XXXXXX";
        int fd = mkstemp(path);
        close(fd);
        struct gguf_writer *w = NULL;
        struct err e = {0};
        T_CHECK(gguf_writer_new(&w, &e) == SMELT_OK);
        uint64_t n = harmony ? 7 : 4;
        gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
        gguf_set_str(w, "tokenizer.ggml.pre", "gpt-4o");
        gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, n);
        gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, n);
        gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
        gguf_set_u32(w, "tokenizer.ggml.eot_token_id", 3);
        if (harmony) gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 4);
        T_CHECK(gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK);
        gguf_writer_free(w);
        struct gguf_file *g = NULL;
        struct tok *t = NULL;
        T_CHECK(gguf_open(&g, path, &e) == SMELT_OK);
        T_CHECK(tok_new_from_gguf(&t, g, NULL, &e) == SMELT_OK);
        if (t) {
            T_CHECK(tok_is_eog(t, 3) == !harmony);
            if (harmony) {
                T_CHECK(tok_is_eog(t, 4) && tok_is_eog(t, 5) && !tok_is_eog(t, 6));
                size_t ne;
                const int32_t *ids = tok_eog_ids(t, &ne);
                T_CHECK(ne == 2 && ids[0] == 4 && ids[1] == 5);
            }
        }
        tok_free(t);
        gguf_close(g);
        unlink(path);
    }
}

/* Real vocabs: special ids and the end-of-generation set. */
static void test_specials_models(void) {
    char path[1024];
    int done = 0;
    if (tu_find_test_model("tokenizer.ggml.pre", "qwen2", path, sizeof path)) {
        struct tok *t = tu_load(path);
        T_CHECK(t != NULL);
        if (t) {
            int32_t im_end = tok_find(t, "<|im_end|>", 10), eot = tok_find(t, "<|endoftext|>", 13);
            T_CHECK(tok_is_eog(t, im_end) && tok_is_eog(t, eot));
            T_CHECK(!tok_is_eog(t, tok_find(t, "<|im_start|>", 12)));
            T_EQ_INT(tok_specials(t)->eos, im_end);
            T_CHECK(!tok_add_bos(t));
            struct tok_ids ids = {0};
            const char *s = "<|im_start|>user\nhi<|im_end|>";
            encode(t, s, strlen(s), TOK_PARSE_SPECIAL | TOK_ADD_SPECIAL, &ids);
            T_EQ_INT(ids.v[0], tok_find(t, "<|im_start|>", 12));
            T_EQ_INT(ids.v[ids.n - 1], im_end);
            encode(t, s, strlen(s), 0, &ids);
            T_CHECK(ids.v[ids.n - 1] != im_end); /* literal */
            tok_ids_free(&ids);
        }
        tok_free(t);
        done++;
    }
    if (tu_find_test_model("general.architecture", "gemma3", path, sizeof path)) {
        struct tok *t = tu_load(path);
        T_CHECK(t != NULL);
        if (t) {
            T_EQ_INT(tok_n_vocab(t), 262144);
            T_CHECK(tok_is_eog(t, tok_find(t, "<end_of_turn>", 13)));
            T_CHECK(tok_is_eog(t, tok_specials(t)->eos));
            T_CHECK(tok_add_bos(t));
            struct tok_ids ids = {0};
            encode(t, "hi", 2, TOK_ADD_SPECIAL, &ids);
            T_EQ_INT(ids.v[0], tok_specials(t)->bos);
            /* no space prefix in Gemma: "hi" has no "▁" */
            size_t n;
            const char *p = tok_piece(t, ids.v[1], &n);
            T_CHECK(n >= 1 && p[0] == 'h');
            tok_ids_free(&ids);
        }
        tok_free(t);
        done++;
    }
    if (!done) t_skip_model("no qwen2 / gemma3 model under models/");
}

int main(void) {
    T_RUN(test_utf8);
    T_RUN(test_tiny_bpe);
    T_RUN(test_tiny_spm);
    T_RUN(test_round_trip_tiny);
    T_RUN(test_round_trip_shared);
    T_RUN(test_invalid_input);
    T_RUN(test_detok_partial);
    T_RUN(test_bpe_paths);
    T_RUN(test_nfc);
    T_RUN(test_threads);
    T_RUN(test_load_errors);
    T_RUN(test_unknown_pre);
    T_RUN(test_harmony_eog);
    T_RUN(test_specials_models);
    return t_done();
}
