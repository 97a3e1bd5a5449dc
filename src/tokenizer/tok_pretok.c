/* Pre-tokenizers of byte-level BPE vocabs, chosen by tokenizer.ggml.pre.
 *
 * Each is the pipeline of the model's Hugging Face tokenizer.json, as a list of stages.
 * A REGEX stage is HF's Split(pattern, behavior = Isolated): every match and every run
 * of text between matches becomes a piece, and the next stage splits each piece on its
 * own (a piece is the whole subject: lookahead and $ stop at its end). HF's
 * ByteLevel(use_regex = true) is the GPT-2 pattern as one more REGEX stage; its
 * byte-to-char mapping needs no stage because our vocab map is keyed by raw bytes.
 *
 * Patterns are the tokenizer.json originals (not llama.cpp's rewrites), compiled by PCRE2
 * with UTF + UCP and JIT-compiled. HF runs them with Oniguruma, whose classes differ from
 * PCRE2 10.42's (checked on every code point by scripts/gen-unicode-classes.py): \s has
 * no U+180E, and \p{L} \p{N} \p{M} ... know the characters of Unicode 15 and 16. So each
 * pattern is rewritten before compiling: \s becomes Oniguruma's exact list, and a second
 * version extends each \p{X} class (L N P M Lu Ll Lt Lm Lo) with the newer characters,
 * used only for text that holds one (tok_pretok_newer); the common case keeps PCRE2's fast
 * property tables.
 * HF's Digits and Punctuation use yet other tables (Rust's char::is_numeric, its own
 * punctuation list): those stages are a table lookup per character, not a regex.
 *
 * Facts per name (tokenizer.json of the model family named):
 *   gpt-2, default       ByteLevel                                      (GPT-2)
 *   mpt, olmo            NFC; ByteLevel                                 (gpt-neox-20b)
 *   llama-bpe, llama3    Split(LLAMA3); ByteLevel(no regex); BPE ignore_merges
 *   qwen2                NFC; Split(QWEN2); ByteLevel(no regex)
 *   deepseek-llm         Split x5 (newlines, cased letters, ASCII/fullwidth punctuation,
 *                        trailing spaces, CJK/Hangul), Digits; ByteLevel(no regex)
 *   deepseek-coder       Split x4 (newlines, letters, punctuation, CJK), Digits(each)
 *   starcoder, refact,   Digits(each); ByteLevel
 *   smollm
 *   command-r            NFC; Digits(each); ByteLevel
 *   falcon               Punctuation(Contiguous); ByteLevel; Digits(runs);
 *                        Split("[0-9][0-9][0-9]") -- the last two run on the byte-MAPPED
 *                        text, where bytes B2 B3 B9 BC BD BE show as ² ³ ¹ ¼ ½ ¾ and so
 *                        count as digits: emulated on raw bytes by BYTE_DIGITS, DIGIT3.
 *   qwen35               NFC; Split(QWEN35); ByteLevel(no regex)  (transformers'
 *                        Qwen3_5Tokenizer: Qwen2's pattern with \p{M} in letter runs)
 *   gpt-4o, llama4       Split(O200K); ByteLevel(no regex); BPE ignore_merges (tiktoken's
 *                        o200k_base through transformers' TikTokenConverter, as the
 *                        gpt-oss and Llama 4 conversions write it; no normalizer)
 * Any other name is refused at load (tok_pretok_init) unless the caller allows it: a
 * silently different split gives silently different token ids.
 * The deepseek-llm letter class is written with code points: copies of it in C sources
 * were NFC-normalized by editors (U+212A KELVIN SIGN became K, U+1F7D became U+03CE...),
 * which changes its meaning.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/tok_int.h"
#include "util/array.h"
#include "util/utf8.h"

#include "tokenizer/tok_unicode_data.h"

#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_RE                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen3.5: Qwen2's pattern with combining marks in letter runs (and not in punctuation). */
#define QWEN35_RE                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "                 \
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* tiktoken's o200k_base (GPT-4o, gpt-oss, Llama 4): case-aware letter runs with an optional
 * contraction, up to 3 digits, "/" kept after punctuation. */
#define O200K_RE                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"   \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "                  \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define NEWLINE_RE "[\\r\\n]"
#define CJK_RE "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* deepseek-llm: cased letters (as listed in its tokenizer.json), with one optional
 * leading space. */
#define DS_LETTERS_RE                                                                              \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"            \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"         \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"                  \
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}"                       \
    "\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"                 \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"                 \
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}"        \
    "\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}"         \
    "\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"                 \
    "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"                  \
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"                   \
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"        \
    "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"         \
    "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"                  \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"                 \
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"               \
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"         \
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
#define DS_PUNCT_RE                                                                                \
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"

struct pre_def {
    const char *names; /* space-separated tokenizer.ggml.pre values */
    bool nfc, ignore_merges;
    struct {
        enum tok_step_kind kind;
        const char *re;
    } steps[TOK_MAX_STEPS];
};

static const struct pre_def pre_defs[] = {
    {"gpt-2 gpt2 default", false, false, {{TOK_STEP_REGEX, GPT2_RE}}},
    {"mpt olmo", true, false, {{TOK_STEP_REGEX, GPT2_RE}}},
    {"llama-bpe llama3 llama-v3", false, true, {{TOK_STEP_REGEX, LLAMA3_RE}}},
    {"qwen2 deepseek-r1-qwen", true, false, {{TOK_STEP_REGEX, QWEN2_RE}}},
    {"qwen35", true, false, {{TOK_STEP_REGEX, QWEN35_RE}}},
    {"gpt-4o llama4", false, true, {{TOK_STEP_REGEX, O200K_RE}}},
    {"deepseek-llm",
     false,
     false,
     {{TOK_STEP_REGEX, NEWLINE_RE},
      {TOK_STEP_REGEX, DS_LETTERS_RE},
      {TOK_STEP_REGEX, DS_PUNCT_RE},
      {TOK_STEP_REGEX, "\\s+$"},
      {TOK_STEP_REGEX, CJK_RE},
      {TOK_STEP_DIGIT_RUNS, NULL}}},
    {"deepseek-coder",
     false,
     false,
     {{TOK_STEP_REGEX, NEWLINE_RE},
      {TOK_STEP_REGEX, "\\s?\\p{L}+"},
      {TOK_STEP_REGEX, "\\s?\\p{P}+"},
      {TOK_STEP_REGEX, CJK_RE},
      {TOK_STEP_DIGITS, NULL}}},
    {"starcoder refact smollm", false, false, {{TOK_STEP_DIGITS, NULL}, {TOK_STEP_REGEX, GPT2_RE}}},
    {"command-r", true, false, {{TOK_STEP_DIGITS, NULL}, {TOK_STEP_REGEX, GPT2_RE}}},
    {"falcon",
     false,
     false,
     {{TOK_STEP_PUNCT, NULL},
      {TOK_STEP_REGEX, GPT2_RE},
      {TOK_STEP_BYTE_DIGITS, NULL},
      {TOK_STEP_DIGIT3, NULL}}},
};

/* ---- character tables ---- */

static bool in_table(const uint32_t (*t)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < t[mid][0])
            hi = mid;
        else if (cp > t[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}
#define IN(table, cp) in_table(table, sizeof table / sizeof table[0], cp)

static bool is_numeric(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return IN(tok_numeric, cp);
}

/* HF's Punctuation (tok_int.h). */
bool tok_is_punct(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
               (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
    return IN(tok_punct, cp);
}

bool tok_pretok_newer(const uint8_t *s, size_t n) {
    const uint32_t first = tok_newer[0][0];
    uint8_t lead[4];
    (void)utf8_encode(first, lead);
    for (size_t i = 0; i < n; i++) {
        if (s[i] < lead[0]) continue; /* ASCII, continuation bytes, code points below */
        uint32_t cp;
        size_t k = utf8_decode(s + i, n - i, &cp);
        if (!k) continue;
        if (cp >= first && IN(tok_newer, cp)) return true;
        i += k - 1;
    }
    return false;
}

/* ---- pattern rewriting ---- */

/* The Unicode classes the patterns use, each with the code points HF's Oniguruma has in it
 * and PCRE2 lacks (a class body; "" when none). */
static const struct uclass {
    const char *name, *extra;
} uclasses[] = {
    {"L", TOK_RE_L_NEW},   {"N", TOK_RE_N_NEW},   {"P", TOK_RE_P_NEW},
    {"M", TOK_RE_M_NEW},   {"Lu", TOK_RE_Lu_NEW}, {"Ll", TOK_RE_Ll_NEW},
    {"Lt", TOK_RE_Lt_NEW}, {"Lm", TOK_RE_Lm_NEW}, {"Lo", TOK_RE_Lo_NEW},
};

/* The class whose name, then "}", starts s (s follows "\p{"), or NULL. */
static const struct uclass *class_of(const char *s) {
    for (size_t i = 0; i < sizeof uclasses / sizeof *uclasses; i++) {
        size_t k = strlen(uclasses[i].name);
        if (!strncmp(s, uclasses[i].name, k) && s[k] == '}') return &uclasses[i];
    }
    return NULL;
}

/* Rewrites an HF pattern for PCRE2: \s and \S become Oniguruma's whitespace list;
 * with patched, each \p{X} of uclasses also takes the newer code points. Returns a
 * malloc'd string, or NULL when out of memory. *has_new: the pattern names a class that
 * has newer code points. *unknown: it names a \p{X} that uclasses lacks (a pattern added
 * to pre_defs with a new class needs it here and in the generator). */
static char *rewrite(const char *pat, bool patched, bool *has_new, bool *unknown) {
    size_t cap = strlen(pat) * 2 + 64, n = 0;
    char *out = malloc(cap);
    bool in_class = false;
    const struct uclass *cls;
    *has_new = *unknown = false;
#define PUT(str)                                                                                   \
    do {                                                                                           \
        size_t l_ = strlen(str);                                                                   \
        if (!array_grow((void **)&out, &cap, n + l_ + 1, 1)) {                                     \
            free(out);                                                                             \
            return NULL;                                                                           \
        }                                                                                          \
        memcpy(out + n, str, l_);                                                                  \
        n += l_;                                                                                   \
    } while (0)
    if (!out) return NULL;
    for (const char *p = pat; *p;) {
        if (p[0] == '\\' && p[1] == 's') {
            PUT(in_class ? TOK_RE_WS : "[" TOK_RE_WS "]");
            p += 2;
        } else if (p[0] == '\\' && p[1] == 'S' && !in_class) {
            PUT("[^" TOK_RE_WS "]");
            p += 2;
        } else if (p[0] == '\\' && p[1] == 'p' && p[2] == '{' && (cls = class_of(p + 3))) {
            char prop[8];
            snprintf(prop, sizeof prop, "\\p{%s}", cls->name);
            if (*cls->extra) *has_new = true;
            if (!patched || !*cls->extra) {
                PUT(prop);
            } else {
                if (!in_class) PUT("[");
                PUT(prop);
                PUT(cls->extra);
                if (!in_class) PUT("]");
            }
            p += 4 + strlen(cls->name);
        } else if (p[0] == '\\' && p[1]) {
            if (p[1] == 'p' || p[1] == 'P') *unknown = true;
            char two[3] = {p[0], p[1], 0};
            PUT(two);
            p += 2;
        } else {
            if (*p == '[' && !in_class)
                in_class = true;
            else if (*p == ']' && in_class)
                in_class = false;
            char one[2] = {*p, 0};
            PUT(one);
            p++;
        }
    }
#undef PUT
    out[n] = 0;
    return out;
}

static pcre2_code *compile(const char *pat, const char *name, int stage, struct err *e) {
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(err, msg, sizeof msg);
        err_set(e, SMELT_ERR_INTERNAL, "pre-tokenizer %s, stage %d: PCRE2: %s at offset %zu", name,
                stage, (const char *)msg, (size_t)off);
        return NULL;
    }
    /* JIT failure is not an error: the interpreter gives the same matches. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

static bool name_in(const char *names, const char *name) {
    size_t n = strlen(name);
    for (const char *p = names; *p;) {
        const char *q = strchr(p, ' ');
        size_t m = q ? (size_t)(q - p) : strlen(p);
        if (m == n && memcmp(p, name, n) == 0) return true;
        if (!q) break;
        p = q + 1;
    }
    return false;
}

void tok_pretok_names(char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (size_t i = 0; i < sizeof pre_defs / sizeof *pre_defs && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? " " : "", pre_defs[i].names);
}

smelt_status tok_pretok_init(struct tok_pretok *p, const char *name, bool allow_unknown,
                             struct err *e) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    const struct pre_def *d = &pre_defs[0];
    p->known = false;
    for (size_t i = 0; i < sizeof pre_defs / sizeof *pre_defs; i++)
        if (name_in(pre_defs[i].names, name)) {
            d = &pre_defs[i];
            p->known = true;
            break;
        }
    if (!p->known && !allow_unknown) {
        char names[320];
        tok_pretok_names(names, sizeof names);
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "tokenizer.ggml.pre = \"%.64s\": smelt does not implement this "
                       "pre-tokenizer, and GPT-2's in its place would give other token ids "
                       "than the model's tokenizer (smelt implements: %s). Pass "
                       "--allow-unknown-pretokenizer to load it with GPT-2's anyway",
                       name, names);
    }
    p->nfc = d->nfc;
    p->ignore_merges = d->ignore_merges;
    for (int i = 0; i < TOK_MAX_STEPS && d->steps[i].kind; i++) {
        p->steps[i].kind = d->steps[i].kind;
        p->n_steps = i + 1;
        if (d->steps[i].kind != TOK_STEP_REGEX) continue;
        bool has_new, unknown;
        char *fast = rewrite(d->steps[i].re, false, &has_new, &unknown);
        char *slow = has_new ? rewrite(d->steps[i].re, true, &has_new, &unknown) : NULL;
        if (!fast || (has_new && !slow) || unknown) {
            free(fast);
            free(slow);
            tok_pretok_free(p);
            if (unknown)
                return err_set(e, SMELT_ERR_INTERNAL,
                               "pre-tokenizer %s, stage %d: a \\p{} class without its table", name, i);
            return err_set(e, SMELT_ERR_NOMEM, "pre-tokenizer patterns");
        }
        p->steps[i].re = compile(fast, name, i, e);
        if (slow && p->steps[i].re) p->steps[i].re_new = compile(slow, name, i, e);
        free(fast);
        free(slow);
        if (!p->steps[i].re || (has_new && !p->steps[i].re_new)) {
            tok_pretok_free(p);
            return e->code;
        }
    }
    return SMELT_OK;
}

void tok_pretok_free(struct tok_pretok *p) {
    for (int i = 0; i < p->n_steps; i++) {
        pcre2_code_free(p->steps[i].re);
        pcre2_code_free(p->steps[i].re_new);
        p->steps[i].re = p->steps[i].re_new = NULL;
    }
    p->n_steps = 0;
}

/* Byte b's char in the byte-level alphabet is numeric (Rust char::is_numeric):
 * ASCII digits, and the Latin-1 bytes that stand for ² ³ ¹ ¼ ½ ¾. */
static bool byte_numeric(uint8_t b) {
    return (b >= '0' && b <= '9') || b == 0xB2 || b == 0xB3 || b == 0xB9 || b == 0xBC ||
           b == 0xBD || b == 0xBE;
}

static bool is_digit(uint8_t b) {
    return b >= '0' && b <= '9';
}

static smelt_status run(struct tok_ctx *c, int step, const uint8_t *s, size_t n, tok_word_fn word,
                        struct err *e);

/* One REGEX stage on s[0..n): matches and the gaps between them go to the next stage. */
static smelt_status run_regex(struct tok_ctx *c, int step, pcre2_code *re, const uint8_t *s,
                              size_t n, tok_word_fn word, struct err *e) {
    size_t pos = 0;
    smelt_status st;
    while (pos < n) {
        int rc = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jit_stack) {
            /* The default 32 KiB JIT stack ran out: give this call a larger one. */
            c->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            c->mctx = pcre2_match_context_create(NULL);
            if (!c->jit_stack || !c->mctx)
                return err_set(e, SMELT_ERR_NOMEM, "pre-tokenizer: JIT stack");
            pcre2_jit_stack_assign(c->mctx, NULL, c->jit_stack);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return err_set(e, SMELT_ERR_INTERNAL, "pre-tokenizer %s: PCRE2 match at byte %zu: %s",
                           c->t->pre.name, pos, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {
            /* An empty match splits nothing: step over one character. */
            uint32_t cp;
            size_t k = utf8_decode(s + ms, n - ms, &cp);
            pos = ms + (k ? k : 1);
            continue;
        }
        if (ms > pos && (st = run(c, step + 1, s + pos, ms - pos, word, e)) != SMELT_OK) return st;
        if ((st = run(c, step + 1, s + ms, me - ms, word, e)) != SMELT_OK) return st;
        pos = me;
    }
    if (pos < n) return run(c, step + 1, s + pos, n - pos, word, e);
    return SMELT_OK;
}

static smelt_status run(struct tok_ctx *c, int step, const uint8_t *s, size_t n, tok_word_fn word,
                        struct err *e) {
    if (n == 0) return SMELT_OK;
    const struct tok_pretok *p = &c->t->pre;
    smelt_status st;
    if (step == p->n_steps) {
        st = word(c, s, n);
        return st == SMELT_OK ? st : err_set(e, st, "encoding a pre-token of %zu bytes", n);
    }
    switch (p->steps[step].kind) {
    case TOK_STEP_REGEX: {
        pcre2_code *re =
            c->patched && p->steps[step].re_new ? p->steps[step].re_new : p->steps[step].re;
        return run_regex(c, step, re, s, n, word, e);
    }
    case TOK_STEP_DIGITS:
    case TOK_STEP_DIGIT_RUNS:
    case TOK_STEP_PUNCT: {
        /* Pieces: runs of non-matching characters; each matching character alone
         * (DIGITS) or runs of them (DIGIT_RUNS, PUNCT). */
        enum tok_step_kind k = p->steps[step].kind;
        size_t i = 0;
        while (i < n) {
            size_t j = i;
            bool in = false;
            while (j < n) {
                uint32_t cp;
                size_t l = utf8_decode(s + j, n - j, &cp);
                if (!l) l = 1, cp = 0xFFFD;
                bool m = k == TOK_STEP_PUNCT ? tok_is_punct(cp) : is_numeric(cp);
                if (j == i)
                    in = m;
                else if (m != in || (m && k == TOK_STEP_DIGITS))
                    break;
                j += l;
            }
            if ((st = run(c, step + 1, s + i, j - i, word, e)) != SMELT_OK) return st;
            i = j;
        }
        return SMELT_OK;
    }
    case TOK_STEP_BYTE_DIGITS: {
        size_t i = 0;
        while (i < n) {
            bool num = byte_numeric(s[i]);
            size_t j = i + 1;
            while (j < n && byte_numeric(s[j]) == num)
                j++;
            if ((st = run(c, step + 1, s + i, j - i, word, e)) != SMELT_OK) return st;
            i = j;
        }
        return SMELT_OK;
    }
    case TOK_STEP_DIGIT3: {
        size_t gap = 0, i = 0;
        while (i + 3 <= n) {
            if (is_digit(s[i]) && is_digit(s[i + 1]) && is_digit(s[i + 2])) {
                if (i > gap && (st = run(c, step + 1, s + gap, i - gap, word, e)) != SMELT_OK)
                    return st;
                if ((st = run(c, step + 1, s + i, 3, word, e)) != SMELT_OK) return st;
                i += 3;
                gap = i;
            } else {
                i++;
            }
        }
        return gap < n ? run(c, step + 1, s + gap, n - gap, word, e) : SMELT_OK;
    }
    }
    return err_set(e, SMELT_ERR_INTERNAL, "pre-tokenizer: bad stage %d", step);
}

smelt_status tok_pretok_split(struct tok_ctx *c, const uint8_t *text, size_t n, tok_word_fn word,
                              struct err *e) {
    if (!c->md) {
        /* One match-data block serves every stage (ovector of 1 pair is enough). */
        c->md = pcre2_match_data_create(1, NULL);
        if (!c->md) return err_set(e, SMELT_ERR_NOMEM, "pre-tokenizer: match data");
    }
    return run(c, 0, text, n, word, e);
}
