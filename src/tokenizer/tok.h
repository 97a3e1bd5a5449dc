/* Tokenizer: text <-> token ids, built from a GGUF file's tokenizer.* metadata, matching
 * Hugging Face's tokenizer for the same model token for token.
 *
 * Two vocab kinds (tokenizer.ggml.model):
 *   "gpt2"  byte-level BPE: merges ranked by tokenizer.ggml.merges; the text is split
 *           first by the pre-tokenizer that tokenizer.ggml.pre names (docs/tokenizer.md
 *           lists them; an unknown name is refused unless tok_opts allows it).
 *   "llama" SentencePiece BPE: pieces merged by score, "▁" for spaces, a space prefix
 *           (tokenizer.ggml.add_space_prefix, default on), <0xNN> byte fallback.
 *   "bert"  WordPiece (BERT's tokenizer): HF's BertNormalizer (control characters dropped,
 *           whitespace to spaces, CJK set apart, accents stripped and lowercase as
 *           tokenizer.ggml.normalizer.lowercase / .strip_accents say), BertPreTokenizer
 *           (whitespace and punctuation), then per word the longest vocabulary piece
 *           first, "##" continuations, [UNK] for a word that cannot be covered; [CLS] ...
 *           [SEP] around it with TOK_ADD_SPECIAL.
 *
 * Encoding: control tokens (and the unknown token) are matched in the text when
 * TOK_PARSE_SPECIAL is given, user-defined tokens always (as Hugging Face does with
 * special / non-special added tokens); the rest is normalized, pre-tokenized and merged.
 * Invalid UTF-8 in the input is repaired first: each maximal invalid subpart becomes
 * U+FFFD (the same rule as Python's errors="replace").
 *
 * Thread safety: a struct tok is immutable after tok_new_from_gguf; any number of threads
 * may call tok_encode / tok_decode / the queries on one tok at once (each call uses its
 * own scratch). A struct tok_detok belongs to one stream (one thread at a time).
 */
#ifndef SMELT_TOKENIZER_TOK_H
#define SMELT_TOKENIZER_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "util/err.h"

struct tok; /* opaque, immutable after load */

/* Token types, as GGUF stores them in tokenizer.ggml.token_type. */
enum tok_type {
    TOK_T_UNDEFINED = 0,
    TOK_T_NORMAL = 1,
    TOK_T_UNKNOWN = 2,
    TOK_T_CONTROL = 3,
    TOK_T_USER_DEFINED = 4,
    TOK_T_UNUSED = 5,
    TOK_T_BYTE = 6,
};

enum tok_model {
    TOK_MODEL_BPE = 1, /* "gpt2": byte-level BPE */
    TOK_MODEL_SPM = 2, /* "llama": SentencePiece BPE */
    TOK_MODEL_WPM = 3, /* "bert": WordPiece */
};

/* Special token ids; -1 where the vocab has none. */
struct tok_special {
    int32_t bos, eos, eot, eom, unk, pad, sep, mask;
};

/* Encode flags.
 *   TOK_ADD_SPECIAL    add BOS / EOS where the vocab's add_bos / add_eos say so
 *   TOK_PARSE_SPECIAL  match control tokens written in the text ("<|im_start|>"); without
 *                      it they stay literal text (user-defined tokens always match) */
#define TOK_ADD_SPECIAL 1u
#define TOK_PARSE_SPECIAL 2u

/* Decode flags.
 *   TOK_DECODE_SPECIAL  render control / unknown tokens as their text (else nothing)
 *   TOK_DECODE_STRIP    drop the first byte of the output when it is the space that the
 *                       encoder's space prefix added (SPM vocabs with add_space_prefix), as
 *                       HF's decode() does; not for a continuation (generated tokens that
 *                       follow a prompt) */
#define TOK_DECODE_SPECIAL 1u
#define TOK_DECODE_STRIP 2u

/* A growable array of token ids (the caller owns it; zero-initialize, tok_ids_free). */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};
void tok_ids_free(struct tok_ids *ids);
/* Appends one id; SMELT_ERR_NOMEM on allocation failure. */
smelt_status tok_ids_push(struct tok_ids *ids, int32_t id);

/* A growable byte buffer (the caller owns it; zero-initialize, tok_buf_free). Kept
 * NUL-terminated for convenience (p[n] == 0) whenever p != NULL. */
struct tok_buf {
    char *p;
    size_t n, cap;
};
void tok_buf_free(struct tok_buf *b);

/* Load options (zero-initialize for the defaults). */
struct tok_opts {
    const char *pre;        /* a tokenizer.ggml.pre name in place of the file's (tests, files
                             * whose name is wrong); NULL: the file's */
    bool allow_unknown_pre; /* load a pre-tokenizer smelt does not implement with GPT-2's
                             * split (and a warning) instead of failing: token ids may then
                             * differ from the model's own tokenizer */
};

/* Builds the tokenizer from f's tokenizer.* keys; it copies what it needs, so f may be
 * closed afterwards. Fails with SMELT_ERR_FORMAT (naming the key) on missing or
 * malformed metadata, and SMELT_ERR_UNSUPPORTED for another tokenizer.ggml.model or (without
 * o->allow_unknown_pre) a tokenizer.ggml.pre smelt does not implement. o may be NULL. */
smelt_status tok_new_from_gguf(struct tok **out, const struct gguf_file *f,
                               const struct tok_opts *o, struct err *e);
void tok_free(struct tok *t);

/* Appends the ids of text[0..len) to out (text need not be NUL-terminated and may hold
 * any bytes). flags: TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL. On error out keeps what it had. */
smelt_status tok_encode(const struct tok *t, const char *text, size_t len, unsigned flags,
                        struct tok_ids *out, struct err *e);

/* Byte-level BPE vocabs: appends to out the length in bytes of each pre-token of
 * text[0..len) (valid UTF-8), in order: the pieces the merges run on, after the
 * normalizer (NFC, where the pre-tokenizer has one), with no added-token matching. Their
 * sum is the normalized text's length. For tests and diagnostics (HF's
 * pre_tokenizer.pre_tokenize_str of the normalized text gives the same pieces). */
smelt_status tok_pretokenize(const struct tok *t, const char *text, size_t len,
                             struct tok_ids *out, struct err *e);

/* Appends the text of ids to out: whole-sequence decode, invalid UTF-8 replaced by
 * U+FFFD. flags: TOK_DECODE_*. An id out of range is SMELT_ERR_RANGE. */
smelt_status tok_decode(const struct tok *t, const int32_t *ids, size_t n, unsigned flags,
                        struct tok_buf *out, struct err *e);

/* Queries (id out of range: type UNDEFINED, false, empty piece). */
enum tok_model tok_model(const struct tok *t);
int32_t tok_n_vocab(const struct tok *t);
const struct tok_special *tok_specials(const struct tok *t);
/* The tokenizer.ggml.pre name ("" for SPM), and whether it was recognized (false only
 * when loaded with allow_unknown_pre). */
const char *tok_pre_name(const struct tok *t);
bool tok_pre_known(const struct tok *t);
bool tok_add_bos(const struct tok *t);
bool tok_add_eos(const struct tok *t);
enum tok_type tok_token_type(const struct tok *t, int32_t id);
bool tok_is_control(const struct tok *t, int32_t id);
/* End of generation: eos, eot, eom, and control tokens the vocab uses to end a turn
 * (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>, <|endoftext|>, ...). */
bool tok_is_eog(const struct tok *t, int32_t id);
/* The end-of-generation ids (sorted), for an engine's stop set. */
const int32_t *tok_eog_ids(const struct tok *t, size_t *n);
/* The token's text as stored in the GGUF ("Ġthe", "▁the", "<0x0A>", "<|im_end|>"). */
const char *tok_token_text(const struct tok *t, int32_t id, size_t *len);
/* The bytes the token stands for in decoded text (" the", "\n", "<|im_end|>"). For a
 * byte-fallback token or part of a multi-byte character these need not be valid UTF-8. */
const char *tok_piece(const struct tok *t, int32_t id, size_t *len);
/* The first id whose token differs between a and b (its text or type), -1 when the two
 * vocabularies are the same; when one is a prefix of the other, the shorter one's size.
 * For checking that two models (a draft and its target, two quantizations) share ids. */
int32_t tok_first_difference(const struct tok *a, const struct tok *b);
/* The id of the token whose decoded text is exactly text[0..len) (special tokens by
 * their text, "<|im_end|>"), or -1. */
int32_t tok_find(const struct tok *t, const char *text, size_t len);

/* Incremental detokenizer for streaming: push ids as they are generated, emit what is
 * ready. It never emits part of a UTF-8 character: up to 3 bytes of an unfinished one
 * are held back until the next push completes it, or are replaced by U+FFFD when the
 * next bytes cannot complete it (or at flush). Invalid bytes from the model never pass
 * through. Concatenating every push's output and the flush equals tok_decode of the same
 * ids with the same flags. */
struct tok_detok {
    const struct tok *t;
    unsigned flags;
    bool started;   /* some output was produced (TOK_DECODE_STRIP applies before) */
    uint8_t n_held; /* bytes of an unfinished character */
    uint8_t held[4];
};
void tok_detok_init(struct tok_detok *d, const struct tok *t, unsigned flags);
/* Appends the bytes that id makes ready to out. */
smelt_status tok_detok_push(struct tok_detok *d, int32_t id, struct tok_buf *out, struct err *e);
/* Appends what is still held (as U+FFFD) and resets d for a new stream. */
smelt_status tok_detok_flush(struct tok_detok *d, struct tok_buf *out, struct err *e);

#endif
