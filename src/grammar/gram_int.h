/* Internals of the grammar engine shared by its files (see gram.h for the design):
 *   gram_ast.c    expression trees (what the GBNF and regex parsers build), code point sets
 *   gram_gbnf.c   the GBNF parser
 *   gram_regex.c  the regex parser (ECMAScript subset) and its GBNF printer
 *   gram_schema.c JSON Schema -> GBNF
 *   gram_auto.c   trees -> per-rule byte DFAs with call edges, and their analyses
 *   gram_vocab.c  token pieces, the token trie, the JSON-string slice
 *   gram_sim.c    configuration sets: steps over bytes, closure through calls and returns
 *   gram_mask.c   per-state masks (accepted / uncertain tokens), computed by trie walks
 *   gram_match.c  the per-sequence matcher
 *   gram.c        compile, reference counts, the cache
 */
#ifndef SMELT_GRAMMAR_GRAM_INT_H
#define SMELT_GRAMMAR_GRAM_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "grammar/gram.h"
#include "util/array.h"

#define GRAM_NONE UINT32_MAX
#define GRAM_INF UINT32_MAX /* unbounded repetition */

/* Bounds (docs/structured-output.md). Each one refused with an error that names it. */
#define GRAM_MAX_TEXT (8u << 20)  /* bytes of grammar, schema or regex text */
#define GRAM_MAX_NODES (1u << 20) /* expression nodes of one grammar */
#define GRAM_MAX_NEST 128         /* nesting of groups, schemas, regex groups */
#define GRAM_MAX_REPEAT 10000     /* bound of one {m,n} */
#ifndef SMELT_FUZZING
#define GRAM_MAX_NFA (1u << 21) /* NFA states while compiling */
#define GRAM_MAX_DFA (1u << 18) /* DFA states of one grammar */
#else /* the fuzz build (-O0, ASan, coverage) runs ~100x slower: a grammar at these bounds         \
       * still compiles well inside libFuzzer's -timeout, and the bounds' errors are reached */
#define GRAM_MAX_NFA (1u << 16)
#define GRAM_MAX_DFA (1u << 13)
#endif
#define GRAM_MAX_CFGS 2048           /* configurations of one sequence at one byte */
#define GRAM_MAX_DEPTH 1024          /* stack depth (nesting of recursive rules) */
#define GRAM_MAX_PIECE 1024          /* longer tokens are never allowed */
#define GRAM_MASK_BUDGET (64u << 20) /* bytes of cached masks per grammar */

/* array_grow (util/array.h) with a bound: makes room for `need` elements of size `sz` in *p
 * (capacity *cap); false when out of memory or past `max` elements (a grammar's bounds). */
static inline bool gram_grow(void *pp, size_t *cap, size_t need, size_t sz, size_t max) {
    return need <= max && array_grow((void **)pp, cap, need, sz);
}

static inline bool gram_bit(const uint64_t *set, unsigned b) {
    return (set[b >> 6] >> (b & 63)) & 1;
}
static inline void gram_bit_set(uint64_t *set, unsigned b) {
    set[b >> 6] |= 1ull << (b & 63);
}

/* ---- expression trees (gram_ast.c) ----------------------------------------------------- */

enum gx_kind {
    GX_EMPTY = 0, /* the empty string */
    GX_CHARS,     /* one code point of a set: rng[off .. off + 2n) as [lo, hi] pairs */
    GX_LIT,       /* the bytes byt[off .. off + n) */
    GX_REF,       /* rule off */
    GX_SEQ,       /* kid[off .. off + n) in order */
    GX_ALT,       /* one of kid[off .. off + n) */
    GX_REP,       /* node off repeated min..max times (max GRAM_INF: unbounded) */
};

struct gx {
    uint8_t kind;
    uint32_t off, n, min, max;
};

struct gast_rule {
    uint32_t name, name_len; /* in names */
    uint32_t body;           /* node, GRAM_NONE while undefined */
    uint32_t ref_at;         /* byte offset of the first reference (for errors) */
};

struct gast {
    struct gx *x;
    uint32_t nx;
    size_t capx;
    uint32_t *kid;
    uint32_t nkid;
    size_t capkid;
    uint32_t *rng;
    uint32_t nrng;
    size_t caprng;
    uint8_t *byt;
    uint32_t nbyt;
    size_t capbyt;
    struct gast_rule *rule;
    uint32_t nrule;
    size_t caprule;
    char *names;
    uint32_t nnames;
    size_t capnames;
    bool oom;    /* an allocation failed: the tree is incomplete */
    bool toobig; /* past GRAM_MAX_NODES */
};

void gram_ast_init(struct gast *a);
void gram_ast_free(struct gast *a);
/* Node constructors: each returns the node's index, or GRAM_NONE (with a->oom or a->toobig
 * set) on failure; a GRAM_NONE argument propagates. ranges: sorted, disjoint [lo, hi] pairs. */
uint32_t gram_ast_empty(struct gast *a);
uint32_t gram_ast_chars(struct gast *a, const uint32_t *ranges, uint32_t n_pairs);
uint32_t gram_ast_lit(struct gast *a, const void *bytes, uint32_t n);
uint32_t gram_ast_ref(struct gast *a, uint32_t rule);
uint32_t gram_ast_list(struct gast *a, enum gx_kind kind, const uint32_t *kids, uint32_t n);
uint32_t gram_ast_rep(struct gast *a, uint32_t node, uint32_t min, uint32_t max);
/* The rule named name[0..len) (made, undefined, if new), or GRAM_NONE when out of memory. */
uint32_t gram_ast_rule(struct gast *a, const char *name, uint32_t len);

/* Code point sets as sorted, disjoint [lo, hi] pairs (a growable array of uint32). */
struct gram_cset {
    uint32_t *r;
    uint32_t n; /* uint32s (2 per range) */
    size_t cap;
};
bool gram_cset_add(struct gram_cset *s, uint32_t lo, uint32_t hi);
/* Sorts and merges the ranges. */
void gram_cset_norm(struct gram_cset *s);
/* Replaces s by its complement in the Unicode scalar values (surrogates excluded); s must be
 * normalized. Returns false when out of memory. */
bool gram_cset_negate(struct gram_cset *s);
/* Removes the surrogates U+D800..U+DFFF (normalized in, normalized out). */
bool gram_cset_drop_surrogates(struct gram_cset *s);
void gram_cset_free(struct gram_cset *s);

/* ---- parsers (gram_gbnf.c, gram_regex.c, gram_schema.c) -------------------------------- */

/* Parses a GBNF grammar into a (its rules; *root = the rule named root). Errors name the
 * line and column. */
smelt_status gram_gbnf_parse(struct gast *a, const char *text, size_t len, uint32_t *root,
                             struct err *e);

/* Regex flavours of gram_regex_gbnf: the whole text, or a JSON string's content (characters
 * that JSON escapes are written escaped; unanchored patterns may have text around them). */
enum gram_re_mode { GRAM_RE_TEXT = 0, GRAM_RE_JSON_STRING = 1 };
/* Appends a GBNF expression (a parenthesized group) for re[0..len) to out. */
smelt_status gram_regex_gbnf(const char *re, size_t len, enum gram_re_mode mode,
                             struct tok_buf *out, struct err *e);

/* Appends the bytes to a tok_buf (false when out of memory or past GRAM_MAX_TEXT). */
bool gram_buf_put(struct tok_buf *b, const void *s, size_t n);
bool gram_buf_puts(struct tok_buf *b, const char *s);
bool gram_buf_printf(struct tok_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Writes code point cp as it must appear inside a GBNF "..." literal or [...] class. */
bool gram_buf_gbnf_char(struct tok_buf *b, uint32_t cp);
/* Writes one GBNF item matching one character of cs (normalized; empty: nothing matches). With
 * json, as it is written inside a JSON string: '"', '\\' and U+0000..U+001F escaped (short
 * forms, else \u00xx), every other character raw: one encoding per character. */
bool gram_buf_chars(struct tok_buf *b, const struct gram_cset *cs, bool json);

/* ---- automaton (gram_auto.c) ----------------------------------------------------------- */

enum {
    GS_FINAL = 1,  /* the rule may end here */
    GS_BYTES = 2,  /* has byte edges: a configuration rests here */
    GS_SIMPLE = 4, /* GS_BYTES, not final, no calls: closure is the state itself */
    GS_CLOSED = 8, /* not final and no calls */
};

struct gstate {
    uint32_t rule;
    uint32_t trans; /* trans[trans .. trans + n_cls of the rule): target per byte class, 0 = none */
    uint32_t calls; /* calls[calls .. calls + n_calls) */
    uint16_t n_calls;
    uint8_t flags;
};

struct gcall {
    uint32_t rule, ret; /* enter rule, come back to state ret */
};

struct grule {
    uint32_t start;
    uint32_t n_cls;
    uint8_t cmap[256];  /* byte -> class */
    uint64_t follow[4]; /* bytes that may come right after the rule ends (any caller) */
    char name[48];      /* for errors, truncated */
};

/* The automaton of a grammar. State 0 is the dead state; states of a rule are contiguous. */
struct gauto {
    struct gstate *st;
    uint32_t n_st;
    size_t cap_st;
    uint32_t *trans;
    uint32_t n_trans;
    size_t cap_trans;
    struct gcall *calls;
    uint32_t n_calls;
    size_t cap_calls;
    struct grule *rules;
    uint32_t n_rules;
    size_t cap_rules;
    uint32_t root; /* rule */
};

static inline uint32_t gram_delta(const struct gauto *a, uint32_t s, uint8_t b) {
    const struct gstate *g = &a->st[s];
    return a->trans[g->trans + a->rules[g->rule].cmap[b]];
}

/* Builds the automaton of a's rules reachable from root. */
smelt_status gram_auto_build(struct gauto *out, const struct gast *a, uint32_t root, struct err *e);
void gram_auto_free(struct gauto *au);

/* ---- vocabulary (gram_vocab.c) --------------------------------------------------------- */

/* A trie over token pieces in DFS order (children by byte); node 0 is the root. */
struct gtnode {
    uint32_t next; /* index past this node's subtree */
    int32_t tok;   /* a token whose piece ends here, or -1 (others with the same piece: dup) */
    uint16_t depth;
    uint8_t byte;
};

struct gtrie {
    struct gtnode *n;
    uint32_t nn;
    uint32_t root[256]; /* child of the root for each first byte, 0 = none */
    /* Nodes with many children (GRAM_WIDE or more) have a child table: wide[i] is its index
     * + 1 into tab (257 entries each: the child for each byte, 0 = none, then the number of
     * children), 0 otherwise. A walk
     * in a state that takes few bytes looks up those instead of visiting every child. */
    uint32_t *wide;
    uint32_t *tab;
};
#define GRAM_WIDE 24

/* A slice of the vocabulary for an ASCII byte class A (gram_mask.c), made on first use for the
 * states (of any grammar) that loop or count over A (a pattern's [a-z0-9]{1,64}): the tokens made
 * of A's bytes by length (cum + k * words: those of 1..k bytes), and for each trie node whether its
 * subtree holds a token outside A (mixed): a walk skips the subtrees that do not. */
struct gdslice {
    uint64_t cls[2];
    uint32_t maxlen;
    uint32_t *cum;
    uint64_t *mixed;
};

#define GRAM_DS_MAX 64 /* dynamic slices per vocabulary */

enum { GV_NEVER = 0, GV_TEXT = 1, GV_EOG = 2 };

struct gram_vocab {
    int32_t n;
    uint32_t words; /* mask words */
    uint8_t *kind;  /* GV_* per token */
    uint32_t *off;  /* piece of token i: bytes[off[i] .. off[i] + len[i]) */
    uint16_t *len;
    uint8_t *bytes;
    int32_t *dup; /* next token with the same piece, -1 */
    int32_t *eog;
    int32_t n_eog;
    uint32_t max_len;  /* longest piece */
    struct gtrie all;  /* every text token */
    struct gtrie rest; /* the text tokens outside the slice */
    /* The JSON-string slice: tokens made of characters other than '"', '\\' and U+0000..U+001F
     * (a last character may be incomplete). s1n[i] = its characters (an incomplete one
     * counts), 0 outside. cum + k * words: the tokens with 1..k characters, k = 1..s1max. */
    uint8_t *s1n;
    uint32_t s1max;
    uint32_t *cum;
    /* Dynamic slices (gram_mask.c), shared by the vocabulary's grammars: made under ds_mu,
     * never moved or changed once made (ds has room for GRAM_DS_MAX). */
    pthread_mutex_t ds_mu;
    struct gdslice *ds;
    uint32_t n_ds;
};

/* ---- stacks and simulation (gram_sim.c) ------------------------------------------------ */

/* Hash-consed stacks: node (ret, parent); id 0 is the empty stack. A parent's id is always
 * smaller than its child's. */
struct gstk_node {
    uint32_t ret, parent, depth;
};

struct gstk {
    struct gstk_node *v;
    uint32_t n;
    size_t cap;
    uint32_t *ht; /* open addressing, 0 = empty */
    uint32_t ht_cap;
    bool oom; /* an allocation failed */
};

void gram_stk_init(struct gstk *p);
void gram_stk_free(struct gstk *p);
/* Drops every node but the empty stack. */
void gram_stk_clear(struct gstk *p);
/* The id of stack (ret, parent); GRAM_NONE when out of memory or past GRAM_MAX_DEPTH. */
uint32_t gram_stk_push(struct gstk *p, uint32_t ret, uint32_t parent);
/* Rebuilds the hash table after ids were compacted (n and v rewritten by the caller). */
bool gram_stk_rehash(struct gstk *p);

struct gcfg {
    uint32_t st, stk;
};

enum {
    LV_POPPED = 1, /* local: the position's rule ended here (stack unknown below) */
    LV_OUT = 2,    /* local: past the rule's end, the follow bytes matched: the stack decides */
    LV_DONE = 4,   /* the root rule ended here: the grammar is complete */
    LV_OVER = 8,   /* a configuration was dropped at a bound */
};

/* A stack of configuration sets, one level per byte (the levels of a trie walk). */
struct gsim {
    const struct gauto *a;
    struct gstk *stk;
    bool local;         /* the bottom of the stack is unknown: ending it is LV_POPPED */
    uint64_t follow[4]; /* local: what may follow the position's rule */
    struct gcfg *cfg;
    uint32_t n_cfg;
    size_t cap_cfg;
    uint32_t *lv; /* level d = cfg[lv[d] .. lv[d + 1]) */
    uint8_t *lf;  /* flags of level d */
    uint32_t depth, cap_lv;
    struct gcfg *work;
    size_t cap_work;
    uint64_t *seen_key; /* (st, stk) pairs of the level being built ... */
    uint32_t *seen_gen; /* ... valid when their generation is gen */
    uint32_t seen_cap, seen_n;
    uint32_t gen;
    bool oom;
};

void gram_sim_init(struct gsim *s, const struct gauto *a, struct gstk *stk, bool local);
void gram_sim_free(struct gsim *s);
/* Level 0 := cfg[0..n) as given (not closed), flags. Returns false when out of memory. */
bool gram_sim_start(struct gsim *s, const struct gcfg *cfg, uint32_t n, uint8_t flags);
/* Level 0 := the closure of (st, stk). */
bool gram_sim_start_closed(struct gsim *s, uint32_t st, uint32_t stk);
/* Builds level depth + 1 from level depth by byte b; returns whether it is alive (holds a
 * configuration or a flag other than LV_OVER). s->oom is set when memory ran out. */
bool gram_sim_step(struct gsim *s, uint8_t b);
/* Makes room for levels up to depth d (walks call it once for the longest token). */
bool gram_sim_reserve(struct gsim *s, uint32_t d);
/* gram_sim_step's common case inline: one configuration, no flags, its target simple (no
 * call, cannot end). Returns 1 stepped, 0 dead (the level is built, empty), -1 when the
 * general step is needed. Levels up to depth + 1 must be reserved. */
static inline int gram_sim_step_fast(struct gsim *s, uint8_t b) {
    uint32_t d = s->depth, lo = s->lv[d], hi = s->lv[d + 1];
    if (hi - lo != 1 || s->lf[d]) return -1;
    struct gcfg c = s->cfg[lo];
    uint32_t t = gram_delta(s->a, c.st, b);
    if (t && (!(s->a->st[t].flags & GS_SIMPLE) || hi + 1 > s->cap_cfg)) return -1;
    if (t) s->cfg[hi++] = (struct gcfg){t, c.stk};
    s->n_cfg = hi;
    s->depth = d + 1;
    s->lv[d + 2] = hi;
    s->lf[d + 1] = 0;
    return t != 0;
}
static inline bool gram_sim_step_any(struct gsim *s, uint8_t b) {
    int r = gram_sim_step_fast(s, b);
    return r >= 0 ? r : gram_sim_step(s, b);
}
static inline void gram_sim_pop_to(struct gsim *s, uint32_t d) {
    s->depth = d;
    s->n_cfg = s->lv[d + 1];
}
static inline uint32_t gram_sim_count(const struct gsim *s) {
    return s->lv[s->depth + 1] - s->lv[s->depth];
}

/* ---- compiled grammar and masks (gram_mask.c, gram.c) ---------------------------------- */

enum { CI_BASE_NONE = 0, CI_BASE_SLICE = 1, CI_BASE_BITS = 2 };

/* A state's tokens: base (nothing, the slice's tokens with at most k characters, or own
 * bits) plus acc[0..n_acc); unc[0..n_unc) (sorted by piece) depend on the stack. */
struct gci {
    uint8_t base;
    uint32_t k;
    uint32_t n_acc, n_unc;
    int32_t *acc, *unc;
    uint32_t *bits;
    size_t bytes;
};

/* Slice facts of a state (gram_mask.c): SL_NO, or how many characters of the slice every
 * path from the state takes (SL_INF: any number). */
#define SL_NO UINT32_MAX
#define SL_INF (UINT32_MAX - 1)

struct gram {
    atomic_int refs;
    const struct gram_vocab *v;
    struct gauto a;
    uint32_t *sl;    /* per state: slice depth (SL_*, or 0..k) */
    uint32_t *dsl;   /* per state: the vocabulary's dynamic slice when sl is SL_NO, or GRAM_NONE */
    uint32_t *dsl_k; /* ... and its depth (SL_INF or k) */
    uint64_t (*bytes)[4]; /* per state: the bytes it has edges for ... */
    uint16_t *nbytes;     /* ... and how many */
    uint8_t *ds_onpath;   /* scratch of the chain searches, under mu */
    uint32_t *ds_path;
    _Atomic(struct gci *) *ci; /* per state, filled lazily under mu */
    pthread_mutex_t mu;
    struct gstk lstk; /* scratch of the walks, under mu */
    struct gsim lsim;
    size_t ci_bytes;
    uint64_t walk_nodes; /* trie nodes visited by the walks so far (statistics) */
};

/* Slice depths of every state (gram_mask.c). */
smelt_status gram_mask_slices(struct gram *g, struct err *e);
/* Computes state s's masks with the local simulation sim (whose stack pool it clears); the
 * result is malloc'd. Returns NULL when out of memory. */
struct gci *gram_mask_compute(struct gram *g, struct gsim *sim, uint32_t s);
/* State s's masks: the cached ones, or computed and cached now. NULL when out of memory;
 * when the grammar's mask budget is spent the result is computed into *tmp (freed by the
 * caller, then NULL otherwise). */
const struct gci *gram_mask_get(struct gram *g, uint32_t s, struct gci **tmp);
/* Computes the masks of the states reachable from the start, breadth first, until `budget`
 * trie nodes were walked. */
void gram_mask_warm(struct gram *g, uint64_t budget);
void gram_ci_free(struct gci *c);

#endif
