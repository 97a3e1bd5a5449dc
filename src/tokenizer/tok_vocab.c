/* Vocab loading: GGUF tokenizer.* metadata -> struct tok (see tok_int.h for the tables).
 *
 * Facts this file relies on (from llama.cpp's converter and Hugging Face's tokenizers):
 *  - BPE ("gpt2") token strings are in GPT-2's byte-level alphabet: each byte is one
 *    code point (printable Latin-1 bytes stand for themselves, the other 68 bytes map to
 *    U+0100.. in byte order). Control and user-defined tokens are stored as plain text.
 *  - A merge is "LEFT RIGHT" (one space; byte-level strings hold no space). Its rank is
 *    its index. Like HF's merge map, a repeated pair keeps its last rank.
 *  - Where two tokens share a string, the later id wins (HF's vocab dict, llama.cpp).
 *  - Token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
 *  - add_bos defaults to on for SPM vocabs, off for BPE; add_space_prefix to on.
 *  - WordPiece ("bert") tokens are in llama.cpp's "phantom space" form: "▁" + a word's
 *    first piece, a "##" continuation without its "##", control tokens as they are; so a
 *    piece decodes like SentencePiece's ("▁" -> ' ') and the text is the lookup key.
 *  - End-of-generation tokens: eos/eot/eom ids plus tokens named like llama.cpp's list.
 *  - SPM user-defined tokens made only of spaces (Gemma's "  " .. 31 spaces; the converter
 *    stores them with real spaces) are not added tokens in HF's Gemma tokenizer: they
 *    are ordinary pieces spelled "▁▁".., reached by merges. So they are respelled for
 *    lookups and left out of the raw-text matcher. (SentencePiece itself matches them
 *    greedily, so 33 spaces give 31+2 there but 16+17 in HF; we follow HF.)
 *  - Gemma's merge order is the order of its tokens in the file, not its scores (its
 *    user-defined pieces score -1000 yet merge first): transformers' GGUF loader ranks
 *    Gemma merges by position, and so do we (priority -id).
 *  - Phi-3 (general.name contains "phi-3"/"phi3"): its HF tokenizer.json gives the
 *    special tokens rstrip=true except <unk>, <s>, <|endoftext|>; GGUF does not carry
 *    that, so it is applied by name as llama.cpp does. No other per-token lstrip/rstrip
 *    information exists in GGUF files, so no other token strips.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"
#include "util/array.h"
#include "util/ckd.h"
#include "util/log.h"
#include "util/utf8.h"

/* ---- byte-level alphabet ---- */

/* cp_of_byte[b]: the code point GPT-2's alphabet uses for byte b. */
static void byte_alphabet(uint32_t cp_of_byte[256]) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp_of_byte[b] = printable ? (uint32_t)b : next++;
    }
}

/* Maps a byte-level string back to bytes into out (room for n bytes: each code point
 * is >= 1 byte of input and yields one byte). Returns the length, or -1 when a code
 * point is not in the alphabet (then the token is plain text). */
static long byte_level_decode(const uint8_t *s, size_t n, const int16_t *byte_of_cp, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = utf8_decode(s + i, n - i, &cp);
        if (!k || cp >= 0x144 || byte_of_cp[cp] < 0) return -1;
        out[o++] = (uint8_t)byte_of_cp[cp];
        i += k;
    }
    return (long)o;
}

/* "<0xNN>" -> NN, else -1. */
static int parse_byte_token(const uint8_t *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        int c = s[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ---- growing blob ---- */

struct blob {
    char *p;
    size_t n, cap;
};

static bool blob_add(struct blob *b, const void *s, size_t n) {
    if (!array_grow((void **)&b->p, &b->cap, b->n + n + 1, 1)) return false;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return true;
}

/* ---- hash map of ids by key ---- */

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t m = 16;
    while (m < n)
        m <<= 1;
    return m;
}

static smelt_status map_build(struct tok *t, struct err *e) {
    uint32_t size = pow2_at_least((uint64_t)t->n_vocab * 2);
    t->map = malloc((size_t)size * sizeof *t->map);
    if (!t->map) return err_set(e, SMELT_ERR_NOMEM, "vocab map (%u slots)", size);
    memset(t->map, 0xFF, (size_t)size * sizeof *t->map);
    t->map_mask = size - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t n;
        const char *k = tok_key(t, id, &n);
        uint32_t i = (uint32_t)tok_hash(k, n) & t->map_mask;
        for (;;) {
            int32_t o = t->map[i];
            if (o < 0) {
                t->map[i] = id;
                break;
            }
            size_t on;
            const char *ok = tok_key(t, o, &on);
            if (on == n && memcmp(ok, k, n) == 0) {
                t->map[i] = id; /* the later id wins */
                break;
            }
            i = (i + 1) & t->map_mask;
        }
    }
    return SMELT_OK;
}

/* ---- merges ---- */

static smelt_status merges_build(struct tok *t, const struct gguf_value *arr,
                                 const int16_t *byte_of_cp, struct err *e) {
    uint64_t n = arr->v.arr.n;
    uint32_t size = pow2_at_least(n * 2 + 16);
    t->merges = malloc((size_t)size * sizeof *t->merges);
    if (!t->merges) return err_set(e, SMELT_ERR_NOMEM, "merge table (%u slots)", size);
    for (uint32_t i = 0; i < size; i++)
        t->merges[i].key = TOK_MERGE_EMPTY;
    t->merge_mask = size - 1;

    size_t cap = 256;
    uint8_t *buf = malloc(cap);
    if (!buf) return err_set(e, SMELT_ERR_NOMEM, "merge scratch");
    uint64_t skipped = 0;
    for (uint64_t r = 0; r < n; r++) {
        struct gguf_str m = gguf_arr_str(arr, r);
        const uint8_t *s = (const uint8_t *)m.ptr;
        const uint8_t *sp = m.len ? memchr(s, ' ', m.len) : NULL;
        if (!sp || sp == s || sp + 1 == s + m.len) {
            skipped++;
            continue;
        }
        size_t la = (size_t)(sp - s), lb = m.len - la - 1;
        if (!array_grow((void **)&buf, &cap, la + lb, 1)) {
            free(buf);
            return err_set(e, SMELT_ERR_NOMEM, "merge scratch");
        }
        long da = byte_level_decode(s, la, byte_of_cp, buf);
        if (da < 0) memcpy(buf, s, la), da = (long)la;
        long db = byte_level_decode(sp + 1, lb, byte_of_cp, buf + da);
        if (db < 0) memcpy(buf + da, sp + 1, lb), db = (long)lb;
        int32_t a = tok_map_find(t, buf, (size_t)da);
        int32_t b = tok_map_find(t, buf + da, (size_t)db);
        int32_t ab = tok_map_find(t, buf, (size_t)(da + db));
        if (a < 0 || b < 0 || ab < 0) {
            skipped++;
            continue;
        }
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        uint32_t i = tok_merge_slot(t, a, b);
        while (t->merges[i].key != TOK_MERGE_EMPTY && t->merges[i].key != key)
            i = (i + 1) & t->merge_mask;
        t->merges[i].key = key;
        t->merges[i].rank = (int32_t)r;
        t->merges[i].id = ab;
    }
    free(buf);
    if (skipped)
        log_warn("tokenizer: %llu of %llu merges name tokens not in the vocab; skipped",
                 (unsigned long long)skipped, (unsigned long long)n);
    return SMELT_OK;
}

/* ---- special-token trie ---- */

static int32_t trie_node(struct tok *t, size_t *cap, uint8_t byte) {
    if (!array_grow((void **)&t->trie, cap, (size_t)t->n_trie + 1, sizeof *t->trie)) return -1;
    t->trie[t->n_trie] = (struct tok_trie_node){.child = -1, .sibling = -1, .id = -1, .byte = byte};
    return t->n_trie++;
}

/* Adds token id's text to the trie: trie_root[first byte] is the node after one byte;
 * each node's children are a sibling list. */
static smelt_status trie_add(struct tok *t, int32_t id, size_t *cap, struct err *e) {
    size_t n = t->text_off[id + 1] - t->text_off[id];
    const uint8_t *s = (const uint8_t *)t->text + t->text_off[id];
    if (n == 0) return SMELT_OK;
    int32_t node = t->trie_root[s[0]];
    if (node < 0) {
        if ((node = trie_node(t, cap, s[0])) < 0) goto nomem;
        t->trie_root[s[0]] = node;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != s[i])
            c = t->trie[c].sibling;
        if (c < 0) {
            if ((c = trie_node(t, cap, s[i])) < 0) goto nomem;
            t->trie[c].sibling = t->trie[node].child;
            t->trie[node].child = c;
        }
        node = c;
    }
    t->trie[node].id = id; /* a later id with the same text wins, as in the map */
    return SMELT_OK;
nomem:
    return err_set(e, SMELT_ERR_NOMEM, "special-token trie");
}

/* ---- SPM lookup keys and merge priority ---- */

/* A user-defined token of only whitespace with at least one space (Gemma's runs). */
static bool spaces_token(const struct tok *t, int32_t id) {
    size_t n = t->text_off[id + 1] - t->text_off[id];
    const char *s = t->text + t->text_off[id];
    if (t->type[id] != TOK_T_USER_DEFINED || n == 0 || !memchr(s, ' ', n)) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && (s[i] < '\t' || s[i] > '\r')) return false;
    return true;
}

static smelt_status spm_keys(struct tok *t, const struct gguf_file *f, struct err *e) {
    struct blob kb = {0};
    t->key_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->key_off);
    if (!t->key_off) return err_set(e, SMELT_ERR_NOMEM, "SPM keys");
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->key_off[id] = (uint32_t)kb.n;
        size_t n = t->text_off[id + 1] - t->text_off[id];
        bool ok = true;
        if (spaces_token(t, id)) {
            for (size_t i = 0; i < n && ok; i++)
                ok = blob_add(&kb, "\xE2\x96\x81", 3);
        } else {
            ok = blob_add(&kb, t->text + t->text_off[id], n);
        }
        if (!ok || kb.n > UINT32_MAX / 2) {
            free(kb.p);
            return err_set(e, SMELT_ERR_NOMEM, "SPM keys");
        }
    }
    t->key_off[t->n_vocab] = (uint32_t)kb.n;
    if (!blob_add(&kb, "", 0)) return err_set(e, SMELT_ERR_NOMEM, "SPM keys");
    t->key = kb.p;

    struct gguf_str arch = {0};
    struct err e2;
    if (gguf_get_str(f, "general.architecture", &arch, &e2) == SMELT_OK && arch.len >= 5 &&
        memcmp(arch.ptr, "gemma", 5) == 0)
        for (int32_t id = 0; id < t->n_vocab; id++)
            t->score[id] = -(float)id;
    return SMELT_OK;
}

/* ---- helpers ---- */

static int32_t get_id(const struct gguf_file *f, const char *key, int32_t n_vocab) {
    uint32_t v;
    struct err e;
    if (gguf_get_u32(f, key, &v, &e) != SMELT_OK) return -1;
    if (v >= (uint32_t)n_vocab) {
        log_warn("tokenizer: %s = %u is past the vocab (%d tokens); ignored", key, v, n_vocab);
        return -1;
    }
    return (int32_t)v;
}

static bool get_flag(const struct gguf_file *f, const char *key, bool dflt) {
    bool v;
    struct err e;
    return gguf_get_bool(f, key, &v, &e) == SMELT_OK ? v : dflt;
}

static bool text_is(const struct tok *t, int32_t id, const char *z) {
    size_t n = t->text_off[id + 1] - t->text_off[id];
    return n == strlen(z) && memcmp(t->text + t->text_off[id], z, n) == 0;
}

/* The first id whose GGUF text is z, or -1. */
static int32_t tok_find_text(const struct tok *t, const char *z) {
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (text_is(t, id, z)) return id;
    return -1;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Names of tokens that end a turn, as llama.cpp's list. */
static const char *const eog_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>",         "<|endoftext|>",
    "<|eom_id|>", "<EOT>",      "<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|return|>",
    "<|call|>",
};
/* The first of these found becomes eot when the file names none. */
static const char *const eot_names[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
};

/* WordPiece vocabs: [CLS] text [SEP]. BOS is tokenizer.ggml.bos_token_id (llama.cpp's
 * converter writes [CLS] there), else cls_token_id, else the token "[CLS]"; EOS likewise
 * with [SEP] (llama.cpp ends a BERT input with its separator id). The normalizer:
 * tokenizer.ggml.normalizer.lowercase, and .strip_accents, which follows lowercase when
 * absent (HF's BertNormalizer). A file without the lowercase key comes from a converter
 * that predates it, whose BERT files were all lowercased (uncased BERT, and llama.cpp's
 * tokenizer lowercased then whatever the model): on. */
static smelt_status wpm_specials(struct tok *t, const struct gguf_file *f, struct err *e) {
    if (t->sp.bos < 0) t->sp.bos = get_id(f, "tokenizer.ggml.cls_token_id", t->n_vocab);
    if (t->sp.bos < 0) t->sp.bos = tok_find_text(t, "[CLS]");
    if (t->sp.eos < 0) t->sp.eos = t->sp.sep >= 0 ? t->sp.sep : tok_find_text(t, "[SEP]");
    if (t->sp.unk < 0) t->sp.unk = tok_find_text(t, "[UNK]");
    t->wpm_lower = get_flag(f, "tokenizer.ggml.normalizer.lowercase", true);
    t->wpm_strip = get_flag(f, "tokenizer.ggml.normalizer.strip_accents", t->wpm_lower);
    if (t->sp.unk < 0) /* a word no piece covers becomes the unknown token: WordPiece needs it */
        return err_set(e, SMELT_ERR_FORMAT, "tokenizer: a WordPiece (\"bert\") vocab needs an "
                       "unknown token: no tokenizer.ggml.unknown_token_id and no \"[UNK]\"");
    return SMELT_OK;
}

static smelt_status specials_build(struct tok *t, const struct gguf_file *f, struct err *e) {
    int32_t n = t->n_vocab;
    t->sp.bos = get_id(f, "tokenizer.ggml.bos_token_id", n);
    t->sp.eos = get_id(f, "tokenizer.ggml.eos_token_id", n);
    t->sp.eot = get_id(f, "tokenizer.ggml.eot_token_id", n);
    t->sp.eom = get_id(f, "tokenizer.ggml.eom_token_id", n);
    t->sp.unk = get_id(f, "tokenizer.ggml.unknown_token_id", n);
    t->sp.pad = get_id(f, "tokenizer.ggml.padding_token_id", n);
    t->sp.sep = get_id(f, "tokenizer.ggml.seperator_token_id", n);
    if (t->sp.sep < 0) t->sp.sep = get_id(f, "tokenizer.ggml.separator_token_id", n);
    t->sp.mask = get_id(f, "tokenizer.ggml.mask_token_id", n);

    bool spm = t->model == TOK_MODEL_SPM, wpm = t->model == TOK_MODEL_WPM;
    if (wpm) {
        smelt_status st = wpm_specials(t, f, e);
        if (st != SMELT_OK) return st;
    }
    t->add_bos = get_flag(f, "tokenizer.ggml.add_bos_token", spm || wpm);
    t->add_eos = get_flag(f, "tokenizer.ggml.add_eos_token", wpm);
    t->add_space_prefix = (spm && get_flag(f, "tokenizer.ggml.add_space_prefix", true)) || wpm;
    if (t->add_bos && t->sp.bos < 0) t->add_bos = false;
    if (t->add_eos && t->sp.eos < 0) t->add_eos = false;

    /* Special-looking names: eot when absent, and the end-of-generation set. */
    for (size_t k = 0; t->sp.eot < 0 && k < sizeof eot_names / sizeof *eot_names; k++) {
        int32_t id = tok_find(t, eot_names[k], strlen(eot_names[k]));
        if (id >= 0 && (t->type[id] == TOK_T_CONTROL || t->type[id] == TOK_T_USER_DEFINED))
            t->sp.eot = id;
    }
    if (t->sp.eom < 0) {
        int32_t id = tok_find(t, "<|eom_id|>", 10);
        if (id >= 0 && t->type[id] == TOK_T_CONTROL) t->sp.eom = id;
    }
    for (int32_t id = 0; id < n; id++) {
        if (t->type[id] != TOK_T_CONTROL && t->type[id] != TOK_T_USER_DEFINED) continue;
        for (size_t k = 0; k < sizeof eog_names / sizeof *eog_names; k++)
            if (text_is(t, id, eog_names[k])) t->attr[id] |= TOK_A_EOG;
    }
    /* harmony vocabs (gpt-oss): <|end|> closes one message of a reply that goes on
     * (analysis, then final); <|return|> and <|call|> end it (llama.cpp decides the same) */
    int32_t end = tok_find(t, "<|end|>", 7), ret = tok_find(t, "<|return|>", 10),
            call = tok_find(t, "<|call|>", 8);
    bool harmony = end >= 0 && ret >= 0 && call >= 0 && (t->attr[ret] & TOK_A_EOG) &&
                   (t->attr[call] & TOK_A_EOG);
    if (harmony && t->sp.eot == end) t->sp.eot = -1;
    if (t->sp.eos >= 0) t->attr[t->sp.eos] |= TOK_A_EOG;
    if (t->sp.eot >= 0) t->attr[t->sp.eot] |= TOK_A_EOG;
    if (t->sp.eom >= 0) t->attr[t->sp.eom] |= TOK_A_EOG;
    if (harmony) t->attr[end] &= (uint8_t)~TOK_A_EOG;
    size_t m = 0;
    for (int32_t id = 0; id < n; id++)
        m += (t->attr[id] & TOK_A_EOG) != 0;
    t->eog = malloc((m ? m : 1) * sizeof *t->eog);
    if (!t->eog) return err_set(e, SMELT_ERR_NOMEM, "eog list");
    for (int32_t id = 0; id < n; id++)
        if (t->attr[id] & TOK_A_EOG) t->eog[t->n_eog++] = id;
    qsort(t->eog, t->n_eog, sizeof *t->eog, cmp_i32);

    /* Tokens matched in raw text, and the Phi-3 rstrip rule. */
    struct gguf_str name = {0};
    struct err e2;
    bool phi3 = false;
    if (gguf_get_str(f, "general.name", &name, &e2) == SMELT_OK) {
        char low[128];
        gguf_str_copy(name, low, sizeof low);
        for (char *p = low; *p; p++)
            if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
        phi3 = strstr(low, "phi-3") || strstr(low, "phi3");
    }
    size_t cap = 0;
    for (int32_t id = 0; id < n; id++) {
        uint8_t ty = t->type[id];
        if (ty != TOK_T_CONTROL && ty != TOK_T_UNKNOWN && ty != TOK_T_USER_DEFINED) continue;
        if (t->text_off[id + 1] == t->text_off[id]) continue;
        if (t->model == TOK_MODEL_SPM && spaces_token(t, id)) continue; /* a piece, see above */
        if (ty != TOK_T_USER_DEFINED) t->attr[id] |= TOK_A_SPECIAL;
        t->attr[id] |= TOK_A_MATCHED;
        if (phi3 && !text_is(t, id, "<unk>") && !text_is(t, id, "<s>") &&
            !text_is(t, id, "<|endoftext|>"))
            t->attr[id] |= TOK_A_RSTRIP;
        smelt_status s = trie_add(t, id, &cap, e);
        if (s != SMELT_OK) return s;
    }
    if (phi3) {
        int32_t id = tok_find(t, "</s>", 4);
        if (id >= 0) t->attr[id] |= TOK_A_RSTRIP;
    }
    return SMELT_OK;
}

/* ---- load ---- */

smelt_status tok_new_from_gguf(struct tok **out, const struct gguf_file *f,
                               const struct tok_opts *o, struct err *e) {
    static const struct tok_opts defaults = {0};
    if (!o) o = &defaults;
    *out = NULL;
    struct gguf_str model;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, e) != SMELT_OK)
        return err_prefix(e, "tokenizer");
    enum tok_model kind;
    if (gguf_str_eq(model, "gpt2"))
        kind = TOK_MODEL_BPE;
    else if (gguf_str_eq(model, "llama"))
        kind = TOK_MODEL_SPM;
    else if (gguf_str_eq(model, "bert"))
        kind = TOK_MODEL_WPM;
    else {
        char buf[64];
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "tokenizer.ggml.model = \"%s\": only \"gpt2\" (byte-level BPE), "
                       "\"llama\" (SentencePiece BPE) and \"bert\" (WordPiece) are supported",
                       gguf_str_copy(model, buf, sizeof buf));
    }
    const struct gguf_value *toks;
    if (gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &toks, e) != SMELT_OK)
        return err_prefix(e, "tokenizer");
    uint64_t n = toks->v.arr.n;
    if (n == 0 || n > (1u << 24))
        return err_set(e, SMELT_ERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens (want 1..%u)",
                       (unsigned long long)n, 1u << 24);

    const struct gguf_value *types = NULL, *scores = NULL, *merges = NULL;
    struct err e2;
    if (gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_T_COUNT, &types, &e2) == SMELT_OK) {
        enum gguf_vtype et = types->v.arr.type;
        if (et > GGUF_T_INT32 && et != GGUF_T_UINT64 && et != GGUF_T_INT64)
            return err_set(e, SMELT_ERR_FORMAT,
                           "tokenizer.ggml.token_type: elements are %s, "
                           "want integers",
                           gguf_vtype_name(et));
        if (types->v.arr.n != n)
            return err_set(e, SMELT_ERR_FORMAT,
                           "tokenizer.ggml.token_type: %llu entries for "
                           "%llu tokens",
                           (unsigned long long)types->v.arr.n, (unsigned long long)n);
    } else if (e2.code != SMELT_ERR_NOT_FOUND) {
        return err_set(e, e2.code, "%s", e2.msg);
    }
    if (kind == TOK_MODEL_SPM) {
        if (gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_T_COUNT, &scores, &e2) == SMELT_OK) {
            enum gguf_vtype et = scores->v.arr.type;
            if (et != GGUF_T_FLOAT32 && et != GGUF_T_FLOAT64)
                return err_set(e, SMELT_ERR_FORMAT,
                               "tokenizer.ggml.scores: elements are %s, "
                               "want floats",
                               gguf_vtype_name(et));
            if (scores->v.arr.n != n)
                return err_set(e, SMELT_ERR_FORMAT,
                               "tokenizer.ggml.scores: %llu entries for "
                               "%llu tokens",
                               (unsigned long long)scores->v.arr.n, (unsigned long long)n);
        } else if (e2.code != SMELT_ERR_NOT_FOUND) {
            return err_set(e, e2.code, "%s", e2.msg);
        }
    } else if (kind == TOK_MODEL_BPE) {
        if (gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING, &merges, e) != SMELT_OK)
            return err_prefix(e, "tokenizer (byte-level BPE needs merges)");
    }

    struct tok *t = calloc(1, sizeof *t);
    if (!t) return err_set(e, SMELT_ERR_NOMEM, "tokenizer");
    t->model = kind;
    t->n_vocab = (int32_t)n;
    smelt_status st = SMELT_OK;
    struct blob tb = {0}, pb = {0};
    t->text_off = malloc((n + 1) * sizeof *t->text_off);
    t->piece_off = malloc((n + 1) * sizeof *t->piece_off);
    t->type = malloc(n);
    t->attr = calloc(n, 1);
    if (kind == TOK_MODEL_SPM) t->score = malloc(n * sizeof *t->score);
    if (!t->text_off || !t->piece_off || !t->type || !t->attr ||
        (kind == TOK_MODEL_SPM && !t->score)) {
        st = err_set(e, SMELT_ERR_NOMEM, "tokenizer tables (%llu tokens)", (unsigned long long)n);
        goto fail;
    }

    uint32_t cp_of_byte[256];
    int16_t byte_of_cp[0x144];
    byte_alphabet(cp_of_byte);
    for (int i = 0; i < 0x144; i++)
        byte_of_cp[i] = -1;
    for (int b = 0; b < 256; b++)
        byte_of_cp[cp_of_byte[b]] = (int16_t)b;

    uint8_t small[256];
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s = gguf_arr_str(toks, i);
        int64_t ty = types ? gguf_arr_i64(types, i) : TOK_T_NORMAL;
        if (ty < 0 || ty > TOK_T_BYTE) ty = TOK_T_UNDEFINED;
        t->type[i] = (uint8_t)ty;
        if (scores)
            t->score[i] = (float)gguf_arr_f64(scores, i);
        else if (t->score)
            t->score[i] = 0.0f;
        if (s.len > (1u << 20)) {
            st = err_set(e, SMELT_ERR_FORMAT, "tokenizer.ggml.tokens[%llu]: %llu bytes",
                         (unsigned long long)i, (unsigned long long)s.len);
            goto fail;
        }
        t->text_off[i] = (uint32_t)tb.n;
        t->piece_off[i] = (uint32_t)pb.n;
        if (s.len > t->max_text) t->max_text = s.len;
        if (!blob_add(&tb, s.ptr, s.len)) goto nomem;
        if (tb.n > UINT32_MAX / 2) {
            st = err_set(e, SMELT_ERR_FORMAT, "tokenizer.ggml.tokens: strings too large");
            goto fail;
        }
        /* the piece */
        const uint8_t *u = (const uint8_t *)s.ptr;
        bool plain = ty == TOK_T_CONTROL || ty == TOK_T_UNKNOWN;
        if (kind == TOK_MODEL_BPE) {
            if (!plain && ty != TOK_T_USER_DEFINED) {
                uint8_t *dst = s.len <= sizeof small ? small : malloc(s.len ? s.len : 1);
                if (!dst) goto nomem;
                long k = byte_level_decode(u, s.len, byte_of_cp, dst);
                bool ok = k >= 0 ? blob_add(&pb, dst, (size_t)k) : blob_add(&pb, u, s.len);
                if (dst != small) free(dst);
                if (!ok) goto nomem;
            } else if (!blob_add(&pb, u, s.len)) {
                goto nomem;
            }
        } else {
            int hx = ty == TOK_T_BYTE ? parse_byte_token(u, s.len) : -1;
            if (hx >= 0) {
                uint8_t byte = (uint8_t)hx;
                if (!blob_add(&pb, &byte, 1)) goto nomem;
            } else if (plain) {
                if (!blob_add(&pb, u, s.len)) goto nomem;
            } else {
                /* "▁" (E2 96 81) -> ' ' */
                size_t j = 0;
                while (j < s.len) {
                    if (j + 3 <= s.len && u[j] == 0xE2 && u[j + 1] == 0x96 && u[j + 2] == 0x81) {
                        if (!blob_add(&pb, " ", 1)) goto nomem;
                        j += 3;
                    } else {
                        size_t k = j + 1;
                        while (k < s.len && u[k] != 0xE2)
                            k++;
                        if (!blob_add(&pb, u + j, k - j)) goto nomem;
                        j = k;
                    }
                }
            }
            if (ty == TOK_T_NORMAL || ty == TOK_T_USER_DEFINED) t->attr[i] |= TOK_A_MERGEABLE;
        }
    }
    t->text_off[n] = (uint32_t)tb.n;
    t->piece_off[n] = (uint32_t)pb.n;
    if (!blob_add(&tb, "", 0) || !blob_add(&pb, "", 0)) goto nomem;
    tb.p[tb.n] = 0;
    pb.p[pb.n] = 0;
    t->text = tb.p;
    t->piece = pb.p;
    tb.p = pb.p = NULL;

    if (kind == TOK_MODEL_SPM && (st = spm_keys(t, f, e)) != SMELT_OK) goto fail;
    if ((st = map_build(t, e)) != SMELT_OK) goto fail;

    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    if (kind == TOK_MODEL_BPE) {
        for (int b = 0; b < 256; b++) {
            uint8_t c = (uint8_t)b;
            int32_t id = tok_map_find(t, &c, 1);
            if (id >= 0 && t->type[id] != TOK_T_CONTROL) t->byte_id[b] = id;
        }
        if ((st = merges_build(t, merges, byte_of_cp, e)) != SMELT_OK) goto fail;
        struct gguf_str pre = {0};
        char name[64] = "default";
        if (o->pre)
            snprintf(name, sizeof name, "%s", o->pre);
        else if (gguf_get_str(f, "tokenizer.ggml.pre", &pre, &e2) == SMELT_OK)
            gguf_str_copy(pre, name, sizeof name);
        if ((st = tok_pretok_init(&t->pre, name, o->allow_unknown_pre, e)) != SMELT_OK) goto fail;
        if (!t->pre.known)
            log_warn("tokenizer: unknown tokenizer.ggml.pre \"%s\" loaded with GPT-2's "
                     "pre-tokenizer (--allow-unknown-pretokenizer): token ids may differ from "
                     "the model's own tokenizer",
                     name);
    } else {
        int found = 0;
        for (int32_t id = 0; id < t->n_vocab; id++) {
            if (t->type[id] != TOK_T_BYTE) continue;
            if (t->piece_off[id + 1] - t->piece_off[id] != 1) continue;
            uint8_t b = (uint8_t)t->piece[t->piece_off[id]];
            if (t->byte_id[b] < 0) found++;
            t->byte_id[b] = id;
        }
        t->has_byte_fallback = found == 256;
    }
    for (int i = 0; i < 256; i++)
        t->trie_root[i] = -1;
    if ((st = specials_build(t, f, e)) != SMELT_OK) goto fail;
    *out = t;
    return SMELT_OK;

nomem:
    st = err_set(e, SMELT_ERR_NOMEM, "tokenizer strings");
fail:
    free(tb.p);
    free(pb.p);
    tok_free(t);
    return st;
}

void tok_free(struct tok *t) {
    if (!t) return;
    free(t->text);
    free(t->text_off);
    free(t->key);
    free(t->key_off);
    free(t->piece);
    free(t->piece_off);
    free(t->type);
    free(t->attr);
    free(t->score);
    free(t->map);
    free(t->merges);
    free(t->trie);
    free(t->eog);
    tok_pretok_free(&t->pre);
    free(t);
}

/* ---- queries ---- */

enum tok_model tok_model(const struct tok *t) {
    return t->model;
}
int32_t tok_n_vocab(const struct tok *t) {
    return t->n_vocab;
}
const struct tok_special *tok_specials(const struct tok *t) {
    return &t->sp;
}
const char *tok_pre_name(const struct tok *t) {
    return t->model == TOK_MODEL_BPE ? t->pre.name : "";
}
bool tok_pre_known(const struct tok *t) {
    return t->model != TOK_MODEL_BPE || t->pre.known;
}
bool tok_add_bos(const struct tok *t) {
    return t->add_bos;
}
bool tok_add_eos(const struct tok *t) {
    return t->add_eos;
}

enum tok_type tok_token_type(const struct tok *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? (enum tok_type)t->type[id] : TOK_T_UNDEFINED;
}
bool tok_is_control(const struct tok *t, int32_t id) {
    return tok_token_type(t, id) == TOK_T_CONTROL;
}
bool tok_is_eog(const struct tok *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_A_EOG);
}
const int32_t *tok_eog_ids(const struct tok *t, size_t *n) {
    *n = t->n_eog;
    return t->eog;
}
const char *tok_token_text(const struct tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return "";
    }
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text + t->text_off[id];
}
const char *tok_piece(const struct tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return "";
    }
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->piece + t->piece_off[id];
}

int32_t tok_first_difference(const struct tok *a, const struct tok *b) {
    int32_t n = a->n_vocab < b->n_vocab ? a->n_vocab : b->n_vocab;
    for (int32_t id = 0; id < n; id++) {
        size_t la, lb;
        const char *ta = tok_token_text(a, id, &la), *tb = tok_token_text(b, id, &lb);
        if (la != lb || memcmp(ta, tb, la) || tok_token_type(a, id) != tok_token_type(b, id))
            return id;
    }
    return a->n_vocab == b->n_vocab ? -1 : n;
}

int32_t tok_find(const struct tok *t, const char *text, size_t len) {
    /* Special tokens first (by their text), then the vocab by decoded piece. */
    const uint8_t *s = (const uint8_t *)text;
    if (len > 0 && t->trie_root[s[0]] >= 0) {
        int32_t node = t->trie_root[s[0]];
        size_t i = 1;
        while (node >= 0 && i < len) {
            int32_t c = t->trie[node].child;
            while (c >= 0 && t->trie[c].byte != s[i])
                c = t->trie[c].sibling;
            node = c;
            i++;
        }
        if (node >= 0 && i == len && t->trie[node].id >= 0) return t->trie[node].id;
    }
    if (t->model == TOK_MODEL_BPE) return tok_map_find(t, text, len);
    /* SPM keys are the "▁" spelling; pieces have spaces. */
    for (size_t i = 0; i < len; i++)
        if (s[i] == ' ') {
            size_t m = len + 2 * len;
            uint8_t *buf = malloc(m);
            if (!buf) return -1;
            size_t o = 0;
            for (size_t j = 0; j < len; j++) {
                if (s[j] == ' ') {
                    memcpy(buf + o, "\xE2\x96\x81", 3);
                    o += 3;
                } else {
                    buf[o++] = s[j];
                }
            }
            int32_t id = tok_map_find(t, buf, o);
            free(buf);
            return id;
        }
    return tok_map_find(t, text, len);
}

/* ---- growable arrays ---- */

void tok_ids_free(struct tok_ids *ids) {
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

smelt_status tok_ids_push(struct tok_ids *ids, int32_t id) {
    if (!array_grow((void **)&ids->v, &ids->cap, ids->n + 1, sizeof *ids->v))
        return SMELT_ERR_NOMEM;
    ids->v[ids->n++] = id;
    return SMELT_OK;
}

void tok_buf_free(struct tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}
