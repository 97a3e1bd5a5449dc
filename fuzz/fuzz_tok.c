/* Fuzz target: encode and decode arbitrary bytes with several vocabs.
 *
 * Input: byte 0 picks the vocab and the flags, the rest is the text. Vocabs: the tiny
 * built-in ones (byte-level BPE with the qwen2 pre-tokenizer (NFC), falcon's, qwen35's and
 * gpt-4o's, SentencePiece with byte fallback), the WordPiece vocab of the tiny bert fixture
 * (tests/data/ref-embed) and the real one of all-MiniLM-L6-v2 (models/) when present, plus
 * ../shared/data/vocab gpt-2 and llama-spm when present. Checks, beyond the sanitizers:
 *  - every id is in the vocab; every decode is valid UTF-8;
 *  - streaming detokenization (one push per id) equals the whole decode;
 *  - decode(encode(x)) == x for valid UTF-8 x where the round trip is defined (no added
 *    token in the ids, NFC text for NFC vocabs, no U+2581 for SPM, every byte in a
 *    byte-level vocab);
 *  - the input's bytes read as ids decode without error;
 *  - WordPiece: the ids come back in the same order from a second encode (the per-call
 *    scratch keeps no state);
 *  - byte-level vocabs: the pre-tokens of valid UTF-8 are non-empty and cover the text
 *    (for a vocab without NFC, or NFC text, their lengths sum to its length).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/unit/tok_test_util.h"
#include "../tests/unit/tok_tiny.h"
#include "tokenizer/tok_int.h"
#include "util/log.h"
#include "util/utf8.h"

static struct tok *vocabs[12];
static int n_vocabs;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    log_set_level(LOG_ERROR);
    vocabs[n_vocabs++] = tiny_bpe(NULL);
    vocabs[n_vocabs++] = tiny_bpe("falcon");
    vocabs[n_vocabs++] = tiny_bpe("qwen35");
    vocabs[n_vocabs++] = tiny_bpe("gpt-4o");
    vocabs[n_vocabs++] = tiny_spm();
    vocabs[n_vocabs++] = tu_load(SMELT_SOURCE_DIR "/tests/data/ref-embed/bert-f32.gguf");
    char real[1024];
    if (tu_find_test_model("general.architecture", "bert", real, sizeof real)) {
        struct tok *t = tu_load(real);
        if (t) vocabs[n_vocabs++] = t;
    }
    const char *shared = getenv("SMELT_SHARED_DIR");
    static const char *const names[] = {"gpt-2", "llama-spm"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/data/vocab/ggml-vocab-%s.gguf",
                 shared ? shared : "../shared", names[i]);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fclose(f);
        struct tok *t = tu_load(path);
        if (t) vocabs[n_vocabs++] = t;
    }
    for (int i = 0; i < n_vocabs; i++)
        if (!vocabs[i]) abort(); /* the built-in vocabs must load */
    return 0;
}

static void check_valid(const struct tok_buf *b) {
    if (utf8_validate((const uint8_t *)b->p, b->n) != b->n) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const struct tok *t = vocabs[data[0] % n_vocabs];
    unsigned eflags = (data[0] >> 4) & 3u;
    unsigned dflags = (data[0] >> 6) & 3u;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    struct tok_ids ids = {0};
    struct tok_buf whole = {0}, stream = {0};
    struct err e;
    if (tok_encode(t, text, n, eflags, &ids, &e) != SMELT_OK) abort();
    bool added = false;
    for (size_t i = 0; i < ids.n; i++) {
        if (ids.v[i] < 0 || ids.v[i] >= tok_n_vocab(t)) abort();
        enum tok_type ty = tok_token_type(t, ids.v[i]);
        added |= ty == TOK_T_CONTROL || ty == TOK_T_USER_DEFINED || ty == TOK_T_UNKNOWN;
    }
    if (tok_model(t) == TOK_MODEL_WPM) {
        struct tok_ids again = {0};
        if (tok_encode(t, text, n, eflags, &again, &e) != SMELT_OK || again.n != ids.n ||
            (ids.n && memcmp(again.v, ids.v, ids.n * sizeof *ids.v)))
            abort();
        tok_ids_free(&again);
    }
    if (tok_decode(t, ids.v, ids.n, dflags, &whole, &e) != SMELT_OK) abort();
    check_valid(&whole);
    struct tok_detok d;
    tok_detok_init(&d, t, dflags);
    for (size_t i = 0; i < ids.n; i++)
        if (tok_detok_push(&d, ids.v[i], &stream, &e) != SMELT_OK) abort();
    tok_detok_flush(&d, &stream, &e);
    if (stream.n != whole.n || (whole.n && memcmp(stream.p, whole.p, whole.n))) abort();

    /* round trip */
    bool spm = tok_model(t) == TOK_MODEL_SPM, bpe = tok_model(t) == TOK_MODEL_BPE;
    bool valid = utf8_validate((const uint8_t *)text, n) == n;
    /* (WordPiece lowercases, strips accents and drops spaces: no round trip) */
    bool ok = valid && !added && !(eflags & TOK_ADD_SPECIAL) && (spm || bpe);
    if (ok && spm) ok = !memmem(text, n, "\xE2\x96\x81", 3) && t->has_byte_fallback;
    if (ok && bpe) {
        if (t->pre.nfc) ok = tok_nfc_quick((const uint8_t *)text, n);
        for (size_t i = 0; ok && i < n; i++)
            ok = t->byte_id[(uint8_t)text[i]] >= 0;
    }
    if (ok) {
        whole.n = 0;
        if (tok_decode(t, ids.v, ids.n, spm ? TOK_DECODE_STRIP : 0, &whole, &e) != SMELT_OK)
            abort();
        if (whole.n != n || (n && memcmp(whole.p, text, n))) abort();
    }

    /* the pre-tokens cover the (normalized) text */
    if (bpe && valid) {
        struct tok_ids lens = {0};
        if (tok_pretokenize(t, text, n, &lens, &e) != SMELT_OK) abort();
        size_t sum = 0;
        for (size_t i = 0; i < lens.n; i++) {
            if (lens.v[i] <= 0) abort();
            sum += (size_t)lens.v[i];
        }
        if ((!t->pre.nfc || tok_nfc_quick((const uint8_t *)text, n)) && sum != n) abort();
        tok_ids_free(&lens);
    }

    /* the input as ids */
    ids.n = 0;
    for (size_t i = 0; i + 3 <= n; i += 3) {
        uint32_t v =
            (uint32_t)data[1 + i] | (uint32_t)data[2 + i] << 8 | (uint32_t)data[3 + i] << 16;
        tok_ids_push(&ids, (int32_t)(v % (uint32_t)tok_n_vocab(t)));
    }
    whole.n = 0;
    if (tok_decode(t, ids.v, ids.n, TOK_DECODE_SPECIAL, &whole, &e) != SMELT_OK) abort();
    check_valid(&whole);
    tok_ids_free(&ids);
    tok_buf_free(&whole);
    tok_buf_free(&stream);
    return 0;
}
