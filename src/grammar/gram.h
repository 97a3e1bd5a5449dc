/* Grammar-constrained decoding: a pushdown automaton over bytes, applied to tokens.
 *
 * Inputs (enum gram_kind): a GBNF grammar (llama.cpp's format), a JSON Schema, "any JSON
 * object", or a regular expression. Each is compiled into one grammar (struct gram) for one
 * vocabulary (struct gram_vocab): every rule becomes a byte-level DFA whose edges are byte
 * classes and calls of other rules; non-recursive rules are inlined, so a grammar that does
 * not recurse is one DFA and its masks need no stack. A sequence's state is a small set of
 * configurations (DFA state, stack), the stacks hash-consed and persistent.
 *
 * The mask of a configuration's DFA state splits the vocabulary three ways (xgrammar's
 * "adaptive token mask"): tokens accepted whatever the stack holds, tokens refused whatever
 * it holds, and the few that leave the state's rule and so depend on the stack. The first
 * two are computed once per state by walking the vocabulary's token trie (llguidance's walk),
 * lazily and cached in the grammar (shared by every sequence, published under a lock); the
 * third is checked at run time against the real stack. Inside JSON strings the walk skips the
 * ~97% of tokens that are plain string characters: they form one precomputed "slice" of the
 * vocabulary (llguidance's slicer), added as a bitset. docs/structured-output.md has the
 * design, what each input supports, and the measurements.
 *
 * Thread safety: a gram_vocab and a gram are immutable once made (a gram's lazily computed
 * masks are published under its lock) and may be shared by any number of threads; a
 * gram_matcher belongs to one sequence and one thread at a time. A gram_cache is locked.
 * Memory: every structure is bounded (docs/structured-output.md lists the limits); a grammar
 * or schema that would exceed a bound is refused with an error that names it.
 */
#ifndef SMELT_GRAMMAR_GRAM_H
#define SMELT_GRAMMAR_GRAM_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tok.h"
#include "util/err.h"

/* ---- vocabulary ---------------------------------------------------------------------- */

/* A tokenizer's tokens as the grammar engine sees them: each token's bytes (tok_piece), a
 * trie over them, the JSON-string slice, and the end-of-generation tokens. Unknown and unused
 * tokens are never allowed by a mask, control tokens neither (unless GRAM_VOCAB_CONTROL);
 * end-of-generation tokens exactly when the grammar is complete. Made once per tokenizer
 * (~0.1 s for 150k tokens) and shared. */
struct gram_vocab;

/* Flags of gram_vocab_new. */
#define GRAM_VOCAB_CONTROL                                                                         \
    1u /* control tokens (not end-of-generation) are text: their piece                             \
        * ("[ARGS]", "<|channel|>"), for outputs whose text shows them                             \
        * (a detokenizer that renders special tokens) and grammars that                            \
        * write those markers */

smelt_status gram_vocab_new(struct gram_vocab **out, const struct tok *t, unsigned flags,
                            struct err *e);
/* The same from raw pieces (tests, fuzzing): n tokens, token i's bytes pieces[i][0..lens[i]),
 * a NULL piece for a token that is never allowed; eog[0..n_eog) the end-of-generation ids. */
smelt_status gram_vocab_new_raw(struct gram_vocab **out, int32_t n, const char *const *pieces,
                                const size_t *lens, const int32_t *eog, int32_t n_eog,
                                struct err *e);
void gram_vocab_free(struct gram_vocab *v);
int32_t gram_vocab_n(const struct gram_vocab *v);

/* Words of a token bitmask for n tokens: bit (i % 32) of word i / 32 is token i. */
static inline size_t gram_mask_words(int32_t n) {
    return ((size_t)n + 31) / 32;
}

/* ---- grammars ------------------------------------------------------------------------ */

enum gram_kind {
    GRAM_GBNF = 1,        /* text: a GBNF grammar with a rule named root */
    GRAM_JSON_SCHEMA = 2, /* text: a JSON Schema (JSON text) */
    GRAM_JSON_OBJECT = 3, /* any JSON object (text ignored): response_format json_object */
    GRAM_REGEX = 4,       /* text: a regular expression the whole output must match */
};

struct gram; /* compiled for one vocabulary; immutable, reference-counted */

/* Compiles text[0..len) of the given kind for v (which must outlive the grammar). Errors:
 * SMELT_ERR_INVALID with line and column for a malformed GBNF grammar or regex, with the
 * JSON path for a schema ("/properties/a/pattern: ..."); SMELT_ERR_UNSUPPORTED naming the
 * feature and its path for what cannot be enforced ("/properties/a: patternProperties is
 * not supported"); SMELT_ERR_RANGE for a grammar past a size bound; SMELT_ERR_NOMEM. The
 * result has one reference. */
smelt_status gram_compile(struct gram **out, const struct gram_vocab *v, enum gram_kind kind,
                          const char *text, size_t len, struct err *e);
/* Adds a reference; returns g. */
struct gram *gram_ref(struct gram *g);
/* Drops a reference (NULL is a no-op); the last one frees the grammar. */
void gram_unref(struct gram *g);
/* The vocabulary the grammar was compiled for. */
const struct gram_vocab *gram_vocab_of(const struct gram *g);
/* Automaton states and the bytes the grammar holds now (its lazily filled masks included). */
size_t gram_n_states(const struct gram *g);
size_t gram_memory(const struct gram *g);

/* Appends the GBNF grammar text[0..len) to out with every rule name, defined or referenced,
 * prefixed by prefix (name characters [A-Za-z0-9_-] only): several grammars (a schema's
 * gram_schema_to_gbnf output for each tool) compose into one without clashes, their roots
 * becoming prefix"root". Literals, classes, repetition counts and comments are copied as they
 * are. Errors: SMELT_ERR_INVALID (a bad prefix, an unterminated literal or class, with line
 * and column), SMELT_ERR_NOMEM. */
smelt_status gram_gbnf_prefix(const char *text, size_t len, const char *prefix, struct tok_buf *out,
                              struct err *e);
/* The GBNF grammar that (kind, text) compiles from, appended to out: GBNF as it is, the
 * translation of a JSON Schema or a regex, the json_object grammar; root rule "root". The
 * errors are gram_compile's front end's. For composing a larger grammar (gram_gbnf_prefix). */
smelt_status gram_to_gbnf(enum gram_kind kind, const char *text, size_t len, struct tok_buf *out,
                          struct err *e);
/* The GBNF grammar that a JSON Schema compiles to (root rule "root"), appended to out; the
 * errors are gram_compile's. For reading and for composing a larger grammar. */
smelt_status gram_schema_to_gbnf(const json_t *schema, struct tok_buf *out, struct err *e);
/* The GBNF of a regular expression (ECMAScript syntax, the subset of docs/structured-output.md)
 * as one expression matching the whole text, appended to out. */
smelt_status gram_regex_to_gbnf(const char *re, size_t len, struct tok_buf *out, struct err *e);

/* ---- the cache ----------------------------------------------------------------------- */

/* Compiled grammars by (kind, text). The least recently used are dropped past max_entries, or
 * while the cached grammars hold more than max_bytes together (gram_memory, counted when one
 * is added: their masks grow as they are used). Lookups lock; the grammar returned is the
 * caller's reference (gram_unref it), valid after it leaves the cache. */
struct gram_cache;

smelt_status gram_cache_new(struct gram_cache **out, const struct gram_vocab *v,
                            int32_t max_entries, size_t max_bytes, struct err *e);
void gram_cache_free(struct gram_cache *c);
/* The grammar for (kind, text), compiled on a miss; a compile error is returned (not
 * cached). *hit says whether it was cached (may be NULL). */
smelt_status gram_cache_get(struct gram_cache *c, enum gram_kind kind, const char *text, size_t len,
                            struct gram **out, bool *hit, struct err *e);

/* ---- per-sequence matcher ------------------------------------------------------------ */

/* A sequence's position in the grammar: the mask for its next token, and the tokens it has
 * taken. Rollback keeps the last max_rollback tokens' states (speculative decoding checks a
 * draft run with gram_matcher_accept_tokens and rolls back what the target model refused). */
struct gram_matcher;

/* Takes a reference on g. max_rollback: 0..4096 tokens that can be rolled back. */
smelt_status gram_matcher_new(struct gram_matcher **out, struct gram *g, int32_t max_rollback,
                              struct err *e);
void gram_matcher_free(struct gram_matcher *m);
/* Back to the start of the grammar (history dropped). */
void gram_matcher_reset(struct gram_matcher *m);

/* Writes the allowed-token bitmask of the next token: gram_mask_words(n_vocab) words, bit set
 * = allowed. End-of-generation tokens are allowed exactly when gram_matcher_can_end. After an
 * end-of-generation token was accepted, no token is. Errors: SMELT_ERR_NOMEM, SMELT_ERR_RANGE
 * (a bound on the configurations or the stack was reached). */
smelt_status gram_matcher_fill_mask(struct gram_matcher *m, uint32_t *mask, struct err *e);

/* Advances by one token. A token the grammar refuses returns SMELT_ERR_INVALID and leaves the
 * matcher unchanged. */
smelt_status gram_matcher_accept(struct gram_matcher *m, int32_t token, struct err *e);
/* Advances by tokens[0..n) while they are allowed; returns how many were taken (0..n), or -1
 * with e set on an error other than a refusal. Each taken token can be rolled back. */
int32_t gram_matcher_accept_tokens(struct gram_matcher *m, const int32_t *tokens, int32_t n,
                                   struct err *e);
/* Advances by raw bytes (text forced into the output, tests); one rollback step. Refused
 * bytes: SMELT_ERR_INVALID, matcher unchanged. */
smelt_status gram_matcher_accept_bytes(struct gram_matcher *m, const char *s, size_t n,
                                       struct err *e);
/* Undoes the last k accepted steps (k <= gram_matcher_history). */
smelt_status gram_matcher_rollback(struct gram_matcher *m, int32_t k, struct err *e);
/* Steps that can be rolled back now. */
int32_t gram_matcher_history(const struct gram_matcher *m);

/* The output so far is a complete sentence of the grammar: end-of-generation is allowed. */
bool gram_matcher_can_end(const struct gram_matcher *m);
/* Nothing can follow: an end-of-generation token was accepted, or the grammar is complete and
 * no byte can extend it (the mask holds only end-of-generation tokens). */
bool gram_matcher_ended(const struct gram_matcher *m);

#endif
