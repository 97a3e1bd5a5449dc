/* tok_encode: the pipeline around the two models.
 *
 *  1. Invalid UTF-8 is repaired (each maximal invalid subpart -> U+FFFD), so every later
 *     stage sees valid UTF-8 and PCRE2 can skip its own check.
 *  2. Added tokens are cut out of the raw text, leftmost-longest (HF's added-vocabulary
 *     matcher): user-defined tokens always, control / unknown tokens only with
 *     TOK_PARSE_SPECIAL. A token marked rstrip also takes the whitespace after it.
 *  3. Each text segment between them is encoded on its own: BPE vocabs NFC-normalize
 *     (when the pre-tokenizer says so), pre-tokenize and merge each pre-token; SPM vocabs
 *     run SentencePiece on the segment, with a space prefix on each segment (HF's
 *     Prepend normalizer applies per segment; llama.cpp does the same); WordPiece vocabs
 *     normalize, split and cover each word (tok_wpm.c).
 *  4. BOS / EOS around it all with TOK_ADD_SPECIAL, where the vocab asks for them.
 */
#include <stdlib.h>

#include "tokenizer/tok_int.h"
#include "util/array.h"
#include "util/utf8.h"

smelt_status tok_ctx_buf(struct tok_ctx *c, size_t n) {
    return array_grow((void **)&c->buf, &c->buf_cap, n, 1) ? SMELT_OK : SMELT_ERR_NOMEM;
}

static void ctx_free(struct tok_ctx *c) {
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mctx);
    pcre2_jit_stack_free(c->jit_stack);
    tok_bpe_ctx_free(c);
    free(c->buf);
    free(c->nbuf);
    free(c->cps);
    free(c->cps2);
    free(c->offs);
}

/* The longest added token at s[0..n) that flags allow, or -1; *len gets its length. */
static int32_t match_added(const struct tok *t, const uint8_t *s, size_t n, unsigned flags,
                           size_t *len) {
    int32_t node = t->trie_root[s[0]], best = -1;
    size_t i = 1;
    while (node >= 0) {
        int32_t id = t->trie[node].id;
        if (id >= 0 && ((flags & TOK_PARSE_SPECIAL) || !(t->attr[id] & TOK_A_SPECIAL))) {
            best = id;
            *len = i;
        }
        if (i == n) break;
        int32_t ch = t->trie[node].child;
        while (ch >= 0 && t->trie[ch].byte != s[i])
            ch = t->trie[ch].sibling;
        node = ch;
        i++;
    }
    return best;
}

static bool ascii_space(uint8_t b) {
    return b == ' ' || (b >= '\t' && b <= '\r');
}

/* One text segment: it starts the text or follows an added token, so with SPM it always
 * takes the space prefix when the vocab adds one. */
static smelt_status encode_text(struct tok_ctx *c, const uint8_t *s, size_t n, struct err *e) {
    const struct tok *t = c->t;
    if (n == 0) return SMELT_OK;
    if (t->model == TOK_MODEL_SPM) return tok_spm_segment(c, s, n, t->add_space_prefix, e);
    if (t->model == TOK_MODEL_WPM) return tok_wpm_segment(c, s, n, e);
    if (t->pre.nfc && !tok_nfc_quick(s, n)) {
        smelt_status st = tok_nfc(c, s, n, &s, &n, e);
        if (st != SMELT_OK) return st;
    }
    c->patched = tok_pretok_newer(s, n);
    return tok_pretok_split(c, s, n, tok_bpe_word, e);
}

/* The word callback of tok_pretokenize: the pre-token's length, not its ids. */
static smelt_status word_len(struct tok_ctx *c, const uint8_t *w, size_t n) {
    (void)w;
    return n > INT32_MAX ? SMELT_ERR_RANGE : tok_ids_push(c->out, (int32_t)n);
}

smelt_status tok_pretokenize(const struct tok *t, const char *text, size_t len,
                             struct tok_ids *out, struct err *e) {
    if (t->model != TOK_MODEL_BPE)
        return err_set(e, SMELT_ERR_INVALID, "tok_pretokenize: not a byte-level BPE vocab");
    if (utf8_validate((const uint8_t *)text, len) < len)
        return err_set(e, SMELT_ERR_INVALID, "tok_pretokenize: invalid UTF-8");
    size_t n0 = out->n;
    struct tok_ctx c = {.t = t, .out = out};
    const uint8_t *s = (const uint8_t *)text;
    smelt_status st = SMELT_OK;
    if (len && t->pre.nfc && !tok_nfc_quick(s, len)) st = tok_nfc(&c, s, len, &s, &len, e);
    if (st == SMELT_OK && len) {
        c.patched = tok_pretok_newer(s, len);
        st = tok_pretok_split(&c, s, len, word_len, e);
    }
    if (st != SMELT_OK) out->n = n0;
    ctx_free(&c);
    return st;
}

smelt_status tok_encode(const struct tok *t, const char *text, size_t len, unsigned flags,
                        struct tok_ids *out, struct err *e) {
    if (!text && len)
        return err_set(e, SMELT_ERR_INVALID, "tok_encode: NULL text of %zu bytes", len);
    size_t n0 = out->n;
    struct tok_ctx c = {.t = t, .out = out};
    const uint8_t *s = (const uint8_t *)text;
    uint8_t *fixed = NULL;
    smelt_status st = SMELT_OK;
    if (utf8_validate(s, len) < len) {
        size_t m = utf8_repaired_len(s, len);
        fixed = malloc(m ? m : 1);
        if (!fixed) return err_set(e, SMELT_ERR_NOMEM, "repairing %zu bytes of text", len);
        len = utf8_repair(s, len, fixed);
        s = fixed;
    }
    if ((flags & TOK_ADD_SPECIAL) && t->add_bos && (st = tok_ids_push(out, t->sp.bos)) != SMELT_OK)
        goto nomem;
    size_t seg = 0, i = 0;
    while (i < len) {
        size_t mlen = 0;
        int32_t id = t->trie_root[s[i]] >= 0 ? match_added(t, s + i, len - i, flags, &mlen) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        if (i > seg && (st = encode_text(&c, s + seg, i - seg, e)) != SMELT_OK) goto fail;
        if ((st = tok_ids_push(out, id)) != SMELT_OK) goto nomem;
        i += mlen;
        if (t->attr[id] & TOK_A_RSTRIP)
            while (i < len && ascii_space(s[i]))
                i++;
        seg = i;
    }
    if (len > seg && (st = encode_text(&c, s + seg, len - seg, e)) != SMELT_OK) goto fail;
    if ((flags & TOK_ADD_SPECIAL) && t->add_eos && (st = tok_ids_push(out, t->sp.eos)) != SMELT_OK)
        goto nomem;
    ctx_free(&c);
    free(fixed);
    return SMELT_OK;
nomem:
    st = err_set(e, SMELT_ERR_NOMEM, "token ids");
fail:
    out->n = n0;
    ctx_free(&c);
    free(fixed);
    return st;
}
