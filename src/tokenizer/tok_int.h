/* Tokenizer internals shared by the tok_*.c files (not for use outside src/tokenizer/).
 *
 * struct tok is built once by tok_new_from_gguf and never written afterwards, which is
 * what makes concurrent encoding safe: everything a call mutates lives in its own
 * struct tok_ctx.
 *
 * Tables (n = vocab size):
 *   text/text_off  the GGUF token strings, copied (n + 1 offsets into one blob)
 *   piece/piece_off the bytes each token decodes to (byte-level chars mapped back to
 *                  bytes, "▁" -> ' ', <0xNN> -> the byte; control tokens: their text)
 *   map            open-addressing hash of ids keyed by the *lookup key* of each id: the
 *                  piece for BPE vocabs (so a pre-token's raw bytes look up directly), the
 *                  GGUF text for SPM vocabs (whose merges run on "▁"-escaped text;
 *                  key/key_off, where whitespace user-defined tokens are respelled) and for
 *                  WordPiece vocabs (llama.cpp's "phantom space" spelling: "▁" + a word's
 *                  first piece, a continuation without its "##")
 *   merges         BPE only: (left id, right id) -> (rank, merged id)
 *   trie           the tokens matched in raw text before pre-tokenization (control,
 *                  unknown, user-defined), longest match first
 */
#ifndef SMELT_TOKENIZER_TOK_INT_H
#define SMELT_TOKENIZER_TOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include "tokenizer/tok.h"

/* Per-token attribute bits (struct tok.attr). */
#define TOK_A_EOG 1u       /* ends generation */
#define TOK_A_RSTRIP 2u    /* when matched in text, also swallows the whitespace after it */
#define TOK_A_MERGEABLE 4u /* SPM: a piece that merges may produce / text may map to */
#define TOK_A_SPECIAL 8u   /* matched in text only with TOK_PARSE_SPECIAL */
#define TOK_A_MATCHED 16u  /* in the special-token trie */

/* One pre-tokenizer stage. REGEX splits each piece by a pattern, keeping matches and the
 * text between them as pieces (HF's Split with behavior Isolated). DIGITS / DIGIT_RUNS /
 * PUNCT are HF's Digits and Punctuation pre-tokenizers, hand-written over HF's own
 * character tables. The BYTE_* stages run after HF's ByteLevel step, on byte-mapped
 * text, which we emulate on the raw bytes. */
enum tok_step_kind {
    TOK_STEP_REGEX = 1,
    TOK_STEP_DIGITS,      /* each numeric character alone (Digits, individual_digits) */
    TOK_STEP_DIGIT_RUNS,  /* runs of numeric characters (Digits) */
    TOK_STEP_PUNCT,       /* runs of punctuation (Punctuation, Contiguous) */
    TOK_STEP_BYTE_DIGITS, /* runs of bytes whose byte-level char is numeric (Digits) */
    TOK_STEP_DIGIT3,      /* Split("[0-9][0-9][0-9]", Isolated) on the mapped text */
};

#define TOK_MAX_STEPS 8

struct tok_pretok {
    int n_steps;
    struct {
        enum tok_step_kind kind;
        /* REGEX only; JIT-compiled when the platform allows. re_new is the pattern with
         * its classes extended by the code points HF's Unicode version has and PCRE2's
         * lacks (tok_unicode_data.h); used for text that holds one; NULL when the
         * pattern has no such class. */
        pcre2_code *re, *re_new;
    } steps[TOK_MAX_STEPS];
    bool nfc;           /* NFC-normalize each text segment first (qwen2, gpt-neox family) */
    bool ignore_merges; /* a pre-token that is a whole vocab token is emitted as is (llama3) */
    bool known;         /* tokenizer.ggml.pre was recognized */
    char name[64];
};

struct tok_merge {
    uint64_t key; /* (left << 32) | right; TOK_MERGE_EMPTY when unused */
    int32_t rank;
    int32_t id;
};
#define TOK_MERGE_EMPTY UINT64_MAX

struct tok_trie_node {
    int32_t child;   /* first child, -1 if none */
    int32_t sibling; /* next sibling, -1 if none */
    int32_t id;      /* token ending here, -1 if none */
    uint8_t byte;
};

struct tok {
    enum tok_model model;
    int32_t n_vocab;
    char *text;
    uint32_t *text_off;
    char *piece;
    uint32_t *piece_off;
    char *key; /* SPM: the lookup keys (the text; whitespace user-defined tokens respelled */
    uint32_t *key_off; /* with "▁", see tok_vocab.c) */
    uint8_t *type;     /* enum tok_type */
    uint8_t *attr;     /* TOK_A_* */
    float *score;      /* SPM merge priority, higher first (NULL for BPE): the scores, or
                          -id for Gemma vocabs */

    int32_t *map; /* ids, -1 empty */
    uint32_t map_mask;

    struct tok_merge *merges; /* BPE */
    uint32_t merge_mask;

    /* BPE: the token for each single byte; SPM: the <0xNN> byte-fallback tokens. -1: none */
    int32_t byte_id[256];

    struct tok_trie_node *trie;
    int32_t trie_root[256]; /* node index per first byte, -1 if none */
    int32_t n_trie;

    struct tok_pretok pre;
    struct tok_special sp;
    int32_t *eog;
    size_t n_eog;
    bool add_bos, add_eos, add_space_prefix; /* (WordPiece: pieces carry their space) */
    bool wpm_lower, wpm_strip; /* WordPiece: lowercase, strip accents (BertNormalizer) */
    size_t max_text;           /* the longest token text, in bytes */
    bool has_byte_fallback; /* SPM: all 256 <0xNN> tokens exist */
};

/* Per-call scratch: owned by one tok_encode call. */
struct tok_ctx {
    const struct tok *t;
    struct tok_ids *out;
    bool patched; /* the current segment holds a code point of tok_newer */
    pcre2_match_data *md;
    pcre2_jit_stack *jit_stack; /* created on demand when the default stack is too small */
    pcre2_match_context *mctx;
    /* BPE scratch, grown as needed */
    struct tok_sym *sym;
    size_t sym_cap;
    struct tok_heap_item *heap;
    size_t heap_cap;
    /* generic byte scratch (NFC output, SPM escaped text) */
    uint8_t *buf;
    size_t buf_cap;
    uint8_t *nbuf; /* NFC output */
    size_t nbuf_cap;
    uint32_t *cps; /* NFC code point scratch; WordPiece: the normalized text */
    size_t cps_cap;
    uint32_t *cps2; /* WordPiece: the code points before each normalizing stage */
    size_t cps2_cap;
    uint32_t *offs; /* WordPiece: byte offsets of a word's characters */
    size_t offs_cap;
    /* BPE per-call word cache */
    struct tok_wcache *cache;
};

/* Hash of a byte string (used for the vocab map and the word cache). */
static inline uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++)
        w |= (uint64_t)s[i] << (8 * i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 32);
}

static inline const char *tok_key(const struct tok *t, int32_t id, size_t *len) {
    if (t->model == TOK_MODEL_BPE) {
        *len = t->piece_off[id + 1] - t->piece_off[id];
        return t->piece + t->piece_off[id];
    }
    if (t->model == TOK_MODEL_WPM) {
        *len = t->text_off[id + 1] - t->text_off[id];
        return t->text + t->text_off[id];
    }
    *len = t->key_off[id + 1] - t->key_off[id];
    return t->key + t->key_off[id];
}

/* The id whose lookup key is s[0..n), or -1. */
static inline int32_t tok_map_find(const struct tok *t, const void *s, size_t n) {
    uint32_t i = (uint32_t)tok_hash(s, n) & t->map_mask;
    for (;;) {
        int32_t id = t->map[i];
        if (id < 0) return -1;
        size_t kn;
        const char *k = tok_key(t, id, &kn);
        if (kn == n && memcmp(k, s, n) == 0) return id;
        i = (i + 1) & t->map_mask;
    }
}

/* The merge table slot where the pair (a, b) starts its probe. */
static inline uint32_t tok_merge_slot(const struct tok *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & t->merge_mask;
}

static inline const struct tok_merge *tok_merge_find(const struct tok *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = tok_merge_slot(t, a, b);
    for (;;) {
        const struct tok_merge *m = &t->merges[i];
        if (m->key == key) return m;
        if (m->key == TOK_MERGE_EMPTY) return NULL;
        i = (i + 1) & t->merge_mask;
    }
}

/* ---- tok_pretok.c ---- */
/* Sets up t->pre for the named pre-tokenizer. An unknown name is SMELT_ERR_UNSUPPORTED
 * naming it, unless allow_unknown: then GPT-2's split, known = false. */
smelt_status tok_pretok_init(struct tok_pretok *p, const char *name, bool allow_unknown,
                             struct err *e);
/* Writes the implemented tokenizer.ggml.pre names, space-separated, to buf[0..cap)
 * (NUL-terminated, cut if too long). */
void tok_pretok_names(char *buf, size_t cap);
void tok_pretok_free(struct tok_pretok *p);
/* Splits text[0..n) (valid UTF-8) into pre-tokens and calls word(ctx, w, wn) on each in
 * order. */
typedef smelt_status (*tok_word_fn)(struct tok_ctx *c, const uint8_t *w, size_t wn);
smelt_status tok_pretok_split(struct tok_ctx *c, const uint8_t *text, size_t n, tok_word_fn word,
                              struct err *e);

/* True when s[0..n) (valid UTF-8) holds a code point that HF's character classes have
 * and PCRE2's lack (then the REGEX stages use their re_new patterns). */
bool tok_pretok_newer(const uint8_t *s, size_t n);

/* ---- tok_bpe.c ---- */
/* Appends the BPE ids of one pre-token (raw bytes) to c->out. */
smelt_status tok_bpe_word(struct tok_ctx *c, const uint8_t *w, size_t n);
void tok_bpe_ctx_free(struct tok_ctx *c);

/* ---- tok_spm.c ---- */
/* Appends the SentencePiece ids of one text segment (valid UTF-8, no special tokens in
 * it) to c->out; prefix: add the "▁" space prefix. */
smelt_status tok_spm_segment(struct tok_ctx *c, const uint8_t *s, size_t n, bool prefix,
                             struct err *e);

/* ---- tok_nfc.c ---- */
/* True when s[0..n) (valid UTF-8) is certainly NFC already (the quick check). */
bool tok_nfc_quick(const uint8_t *s, size_t n);
/* NFC of s[0..n) (valid UTF-8) into c->nbuf; *out / *out_n point at the result. */
smelt_status tok_nfc(struct tok_ctx *c, const uint8_t *s, size_t n, const uint8_t **out,
                     size_t *out_n, struct err *e);

/* Canonical decomposition and ordering (NFD, HF's data) of in[0..n) into out (room for
 * 4 n code points); returns the length. */
size_t tok_nfd(const uint32_t *in, size_t n, uint32_t *out);

/* ---- tok_pretok.c ---- */
/* True for HF's punctuation: ASCII punctuation or Unicode's P* (tok_unicode_data.h), what
 * the byte-level Punctuation split and BertPreTokenizer both set apart. */
bool tok_is_punct(uint32_t cp);

/* ---- tok_wpm.c ---- */
/* Appends the WordPiece ids of one text segment (valid UTF-8, no added tokens in it) to
 * c->out: BERT's normalizer and pre-tokenizer, then greedy longest-match pieces. */
smelt_status tok_wpm_segment(struct tok_ctx *c, const uint8_t *s, size_t n, struct err *e);

/* Grows c->buf to at least n bytes. */
smelt_status tok_ctx_buf(struct tok_ctx *c, size_t n);

#endif
