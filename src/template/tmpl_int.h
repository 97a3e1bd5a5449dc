/* Chat-template engine internals shared by tmpl_*.c (not part of tmpl.h's contract).
 *
 * Values (struct tv) are 16-byte tagged unions passed by value. Scalars live inline;
 * strings, lists, dicts, namespaces and callables are reference-counted heap objects.
 * The caller of any function returning a struct tv owns one reference and must
 * tv_release it. Objects with rc == RC_FROZEN (constants in a compiled template, and
 * every value in a caller-built context) are never counted or freed by a render: that
 * is what lets many threads render one template with one context at once.
 *
 * Python semantics are the reference: str() / repr() text, truthiness, ==, <, in,
 * arithmetic, and jinja2's Undefined (printing it gives "", using it raises).
 *
 * Cycles: only namespaces are mutable, so only they can close a cycle; a render keeps a
 * list of the namespaces it made and clears them at the end.
 */
#ifndef SMELT_TEMPLATE_TMPL_INT_H
#define SMELT_TEMPLATE_TMPL_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "template/tmpl.h"

/* ---------------------------------------------------------------- values */

enum tv_kind {
    TV_UNDEF = 0,
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,
    TV_TUPLE, /* same object as a list; differs in repr and == */
    TV_DICT,
    TV_NS,    /* jinja2 namespace(): a dict with attribute assignment */
    TV_FUNC,  /* builtin function or bound method */
    TV_MACRO, /* macro or call-block caller */
    TV_LOOP,  /* the `loop` variable of a for */
};

#define RC_FROZEN UINT32_MAX

struct tobj {
    uint32_t rc;
    uint8_t kind; /* enum tv_kind of the object (TV_LIST also for tuples) */
    uint8_t pad[3];
    size_t bytes; /* accounted size (for the render's allocation budget) */
};

struct tstr {
    struct tobj h;
    size_t len;  /* bytes, excluding the NUL */
    size_t ncp;  /* code points; == len when ASCII */
    uint64_t hash;
    char s[];    /* NUL-terminated */
};

struct tv;
struct tlist {
    struct tobj h;
    size_t n, cap;
    struct tv *v;
};

struct tdict {
    struct tobj h;
    size_t n, cap;
    struct tv *k, *v;
    uint32_t *idx; /* open-addressing index into k/v (slot = i + 1, 0 empty), when n > 8 */
    size_t icap;
};

/* Undefined values remember why they are undefined, for the error that using them
 * raises ("'foo' is undefined", "'dict object' has no attribute 'x'"). */
enum undef_why {
    UND_NAME = 0, /* name: the variable name */
    UND_ATTR,     /* aux2 = kind of the object; name = attribute */
    UND_ITEM,     /* aux2 = kind of the object; name = the key's repr */
    UND_PARAM,    /* a macro parameter that was not provided */
    UND_CONDEXPR, /* `x if c` with no else */
    UND_UNSAFE,   /* a sandbox-blocked attribute (list.append, ...) */
};

struct tv {
    uint8_t kind;
    uint8_t safe;  /* TV_STR: jinja2 Markup (from |safe): `+` escapes the other side */
    uint8_t why;   /* TV_UNDEF: enum undef_why */
    uint8_t aux;   /* TV_UNDEF: owner kind; TV_LIST: enum seq_view */
    uint32_t line; /* TV_UNDEF with UND_CONDEXPR: line of the expression */
    union {
        bool b;
        int64_t i;
        double f;
        struct tobj *o;
        struct tstr *s; /* TV_STR; TV_UNDEF: name or NULL */
        struct tlist *l;
        struct tdict *d;
        struct tfunc *fn;
        struct tmacro *m;
        struct tloop *lp;
    } u;
};

/* What a TV_LIST stands for in Python (filters return generators, dicts return views):
 * it changes printing, truthiness, len() and tojson exactly as in jinja2. */
enum seq_view {
    SV_LIST = 0,
    SV_GEN,     /* generator (map, select, items filter, ...): always truthy, no len */
    SV_REVITER, /* list_reverseiterator (reverse filter) */
    SV_ITEMS,   /* dict_items / dict_keys / dict_values views: len ok, no indexing */
    SV_KEYS,
    SV_VALUES,
};

struct rt;
struct node;
struct scope;

/* A builtin function or bound method: fid names it, self is the receiver. */
struct tfunc {
    struct tobj h;
    uint16_t fid;
    struct tv self;
};

struct tmacro {
    struct tobj h;
    const struct node *def; /* N_MACRO or N_CALLBLOCK */
    struct scope *closure;  /* the scope it was defined in (kept alive to render end) */
};

struct tloop {
    struct tobj h;
    struct tlist *items; /* the (filtered) sequence */
    size_t i;            /* index0 of the current item */
    uint32_t depth0;
    const struct node *fornode; /* for `loop(...)` of recursive loops */
    struct scope *outer;
    bool has_changed;
    struct tv changed_last;
};

static inline struct tv tv_undef(void) { return (struct tv){.kind = TV_UNDEF}; }
static inline struct tv tv_none(void) { return (struct tv){.kind = TV_NONE}; }
static inline struct tv tv_bool(bool b) { return (struct tv){.kind = TV_BOOL, .u.b = b}; }
static inline struct tv tv_int(int64_t i) { return (struct tv){.kind = TV_INT, .u.i = i}; }
static inline struct tv tv_float(double f) { return (struct tv){.kind = TV_FLOAT, .u.f = f}; }
static inline bool tv_is_obj(struct tv v) {
    return v.kind >= TV_STR || (v.kind == TV_UNDEF && v.u.s);
}
static inline bool tv_is_seq(struct tv v) { return v.kind == TV_LIST || v.kind == TV_TUPLE; }
static inline bool tv_is_num(struct tv v) {
    return v.kind == TV_INT || v.kind == TV_FLOAT || v.kind == TV_BOOL;
}

/* Reference counting (rt may be NULL outside a render: no accounting). */
static inline struct tv tv_retain(struct tv v) {
    if (tv_is_obj(v) && v.u.o->rc != RC_FROZEN) v.u.o->rc++;
    return v;
}
void tv_free_obj(struct rt *rt, struct tobj *o);
static inline void tv_release(struct rt *rt, struct tv v) {
    if (tv_is_obj(v) && v.u.o->rc != RC_FROZEN && --v.u.o->rc == 0) tv_free_obj(rt, v.u.o);
}
/* Frees a frozen tree (a context built by the caller, or template constants). */
void tv_destroy_frozen(struct tv v);
/* Marks a freshly built tree frozen (rc = RC_FROZEN on every object in it). */
void tv_freeze(struct tv v);

/* Allocation through the render's budget (rt may be NULL). Sets the error on failure. */
void *rt_alloc(struct rt *rt, size_t n);
void *rt_realloc_acct(struct rt *rt, void *p, size_t old, size_t n);

/* Constructors: return false (error set in rt) on failure. */
bool tv_new_str(struct rt *rt, const char *s, size_t len, struct tv *out);
bool tv_new_strz(struct rt *rt, const char *s, struct tv *out);
struct tstr *tstr_new(struct rt *rt, const char *s, size_t len);
bool tv_new_list(struct rt *rt, size_t cap, struct tv *out);
bool tv_new_dict(struct rt *rt, struct tv *out);
bool tv_new_ns(struct rt *rt, struct tv *out);
bool tv_new_func(struct rt *rt, uint16_t fid, struct tv self, struct tv *out); /* retains self */
/* Takes ownership of v. */
bool tlist_push(struct rt *rt, struct tlist *l, struct tv v);
/* Retains k and v; replaces an existing key. */
bool tdict_set(struct rt *rt, struct tdict *d, struct tv k, struct tv v);
/* Borrowed pointer to the value, or NULL. */
struct tv *tdict_get(const struct tdict *d, struct tv k);
struct tv *tdict_get_str(const struct tdict *d, const char *k, size_t klen);

/* Python semantics. */
bool tv_truthy(struct tv v);
bool tv_eq(struct tv a, struct tv b);
uint64_t tv_hash(struct tv v);
/* a < b etc.: returns -1/0/1 in *cmp; false on TypeError (error set). */
bool tv_cmp(struct rt *rt, struct tv a, struct tv b, int *cmp);
const char *tv_type_name(struct tv v); /* Python type name: str, int, dict, NoneType... */

/* A growable byte buffer. */
struct sbuf {
    char *p;
    size_t n, cap;
    struct rt *rt;  /* for the budget; may be NULL */
    size_t limit;   /* 0: none */
};
bool sb_put(struct sbuf *b, const char *s, size_t n);
bool sb_putc(struct sbuf *b, char c);
bool sb_puts(struct sbuf *b, const char *s);
bool sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(struct sbuf *b);
/* Moves the buffer into a new string value. */
bool sb_to_tv(struct sbuf *b, struct tv *out);

/* Python str() and repr() appended to b. */
bool tv_str(struct rt *rt, struct sbuf *b, struct tv v);
bool tv_repr(struct rt *rt, struct sbuf *b, struct tv v);
/* str(v) as a string value (retains v itself when it is a string). */
bool tv_to_str(struct rt *rt, struct tv v, struct tv *out);
/* Python repr of a float ("1.0", "1e+16", "inf"). buf >= 32 bytes. */
void py_float_repr(double f, char *buf, size_t n);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) appended to b.
 * indent: NULL for none, else the indent string (Python's int n becomes n spaces). */
struct json_opts {
    const char *indent; /* NULL: compact one line */
    size_t indent_len;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
    bool sort_keys;
    bool ensure_ascii;
};
bool tv_json(struct rt *rt, struct sbuf *b, struct tv v, const struct json_opts *o, int level);

/* UTF-8 helpers (invalid bytes decode as themselves, one per byte, never read past len). */
uint32_t utf8_next(const char *s, size_t len, size_t *i);
size_t utf8_put(char *out, uint32_t cp);
size_t utf8_count(const char *s, size_t len);
/* Byte offset of code point index cp (cp <= ncp). */
size_t tstr_offset(const struct tstr *s, size_t cp);
/* Unicode properties and case mappings, exactly as Python's str (tables generated
 * from Python into tmpl_unicode.c). */
bool py_isspace(uint32_t cp);
bool py_isprintable(uint32_t cp);
bool py_isalpha(uint32_t cp);
bool py_isdecimal(uint32_t cp);
bool py_isdigit(uint32_t cp);
bool py_isnumeric(uint32_t cp);
bool py_islower(uint32_t cp);
bool py_isupper(uint32_t cp);
bool py_iscased(uint32_t cp);
bool py_iscaseignorable(uint32_t cp);
/* Simple (one code point) mappings. */
uint32_t py_lower(uint32_t cp);
uint32_t py_upper(uint32_t cp);
/* Full mappings: kind 0 lower, 1 upper, 2 title; up to 3 code points (ß -> SS). */
size_t py_case_full(int kind, uint32_t cp, uint32_t out[3]);

struct tmpl_case_run {
    uint32_t lo, hi;
    int32_t delta;
    uint8_t stride;
};
struct tmpl_case_special {
    uint8_t kind;
    uint32_t cp;
    uint8_t n;
    uint32_t m[3];
};
struct tmpl_cp_range {
    uint32_t lo, hi;
};
extern const struct tmpl_case_run tmpl_case_lower[], tmpl_case_upper[], tmpl_case_title[];
extern const size_t tmpl_case_lower_n, tmpl_case_upper_n, tmpl_case_title_n;
extern const struct tmpl_case_special tmpl_case_special[];
extern const size_t tmpl_case_special_n;
extern const struct tmpl_cp_range tmpl_prop_alpha[], tmpl_prop_decimal[], tmpl_prop_digit[],
    tmpl_prop_numeric[], tmpl_prop_space[], tmpl_prop_printable[], tmpl_prop_lower[],
    tmpl_prop_upper[], tmpl_prop_cased[], tmpl_prop_case_ignorable[];
extern const size_t tmpl_prop_alpha_n, tmpl_prop_decimal_n, tmpl_prop_digit_n, tmpl_prop_numeric_n,
    tmpl_prop_space_n, tmpl_prop_printable_n, tmpl_prop_lower_n, tmpl_prop_upper_n,
    tmpl_prop_cased_n, tmpl_prop_case_ignorable_n;

/* ---------------------------------------------------------------- lexer */

enum tok_kind {
    T_EOF = 0,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    /* operators */
    T_ADD, T_SUB, T_DIV, T_FLOORDIV, T_MUL, T_MOD, T_POW, T_TILDE,
    T_LBRACKET, T_RBRACKET, T_LPAREN, T_RPAREN, T_LBRACE, T_RBRACE,
    T_EQ, T_NE, T_GT, T_GTEQ, T_LT, T_LTEQ, T_ASSIGN, T_DOT, T_COLON, T_PIPE,
    T_COMMA, T_SEMICOLON,
};

struct token {
    uint8_t kind;
    uint32_t line, col;
    const char *p; /* T_DATA, T_NAME: into the normalized source; T_STRING: decoded */
    size_t len;
    int64_t i;
    double f;
};

struct tokens {
    struct token *v;
    size_t n, cap;
    char *src;        /* newline-normalized source (tokens point into it) */
    char **strings;   /* decoded string literals */
    size_t n_strings, cap_strings;
};

smelt_status tmpl_lex(const char *src, size_t len, struct tokens *out, struct err *e);
void tmpl_tokens_free(struct tokens *t);
const char *tmpl_tok_name(int kind);

/* ---------------------------------------------------------------- AST */

enum node_kind {
    /* statements */
    N_DATA = 1,   /* text: s */
    N_OUTPUT,     /* {{ a }} */
    N_IF,         /* a = test, body = then, body2 = else (elif becomes a nested N_IF) */
    N_FOR,        /* a = target, b = iter, c = filter, body, body2 = else; flag: recursive */
    N_SET,        /* a = target, b = value */
    N_SETBLOCK,   /* a = target, c = filter chain (N_FILTER with a == NULL), body */
    N_MACRO,      /* s = name; params (N_NAME), defaults (args, NULL when none), body */
    N_CALLBLOCK,  /* a = the call (N_CALL); params, defaults; body */
    N_FILTERBLOCK,/* c = filter chain, body */
    N_WITH,       /* targets (params), values (args), body */
    N_BREAK,
    N_CONTINUE,
    N_SCOPE,      /* body in a new scope (block, generation) */
    /* expressions */
    N_CONST,      /* v */
    N_NAME,       /* s (interned) */
    N_NSREF,      /* s = namespace name, s2 = attribute (assignment target) */
    N_LIST,       /* args */
    N_TUPLE,      /* args */
    N_DICT,       /* args = keys, args2 = values */
    N_GETATTR,    /* a . s */
    N_GETITEM,    /* a [ b ] */
    N_SLICE,      /* a, b, c (any NULL) */
    N_CALL,       /* a ( args, kw: kwnames/kwvals ), dyn: b = *args, c = **kwargs */
    N_FILTER,     /* a | s(args, kwargs); fid */
    N_TEST,       /* a is s(args); fid; flag: negated */
    N_NOT,
    N_NEG,
    N_POS,
    N_BINOP,      /* op: T_ADD...; a, b */
    N_AND,
    N_OR,
    N_CONCAT,     /* args */
    N_COMPARE,    /* a, then ops[] with args[] */
    N_CONDEXPR,   /* b if a else c (c NULL: undefined) */
};

struct node {
    uint8_t kind;
    uint8_t op;     /* N_BINOP: token kind */
    uint8_t flag;
    uint8_t uses;   /* N_MACRO/N_CALLBLOCK: USES_* */
    uint16_t fid;   /* N_FILTER / N_TEST: builtin id */
    uint32_t line, col;
    struct node *a, *b, *c;
    struct node **args;  /* positional / items / params */
    struct node **args2; /* dict values / macro defaults / with values */
    struct tstr **kwnames;
    struct node **kwvals;
    uint8_t *ops;        /* N_COMPARE operators: T_EQ.., or CMP_IN / CMP_NOTIN */
    uint32_t n_args, n_kw;
    struct node **body, **body2;
    uint32_t n_body, n_body2;
    struct tstr *s, *s2;
    struct tv v;
};

#define FID_UNKNOWN 0xffff /* N_FILTER/N_TEST name unknown to jinja2 (fails when run) */
#define CMP_IN 200
#define CMP_NOTIN 201
#define USES_VARARGS 1
#define USES_KWARGS 2
#define USES_CALLER 4

struct tmpl {
    struct node **body;
    uint32_t n_body;
    struct tmpl_pool *pool; /* nodes, interned names and constants */
    struct tstr *s_loop, *s_caller, *s_varargs, *s_kwargs; /* interned names */
    /* keep the source for error context */
    char *src;
    size_t src_len;
};

/* A bump allocator for the AST (freed with the template). */
struct tmpl_pool;
void *pool_alloc(struct tmpl_pool *p, size_t n);

/* ---------------------------------------------------------------- builtins */

/* Filters and tests are resolved by name at compile time. Unknown names are a compile
 * error (jinja2 does the same); known jinja2 names this engine lacks fail when run. */
int tmpl_filter_id(const char *name, size_t len);   /* -1 when unknown to jinja2 */
int tmpl_test_id(const char *name, size_t len);     /* -1 when unknown to jinja2 */

/* Call arguments after evaluation (all owned by the caller of the builtin). */
struct targs {
    struct tv *pos;
    size_t n_pos;
    struct tstr **kwn;
    struct tv *kwv;
    size_t n_kw;
};

bool tmpl_apply_filter(struct rt *rt, int fid, struct tv in, struct targs *a, struct tv *out);
bool tmpl_apply_test(struct rt *rt, int fid, struct tv in, struct targs *a, bool *out);
/* Attribute lookup on a value for jinja2's getattr: methods become bound TV_FUNCs.
 * Returns 1 when found (out set), 0 when absent, -1 on error. */
int tmpl_method_lookup(struct rt *rt, struct tv obj, const char *name, size_t len,
                       struct tv *out);
/* Calls a builtin function / bound method. */
bool tmpl_call_builtin(struct rt *rt, struct tfunc *f, struct targs *a, struct tv *out);
/* Globals (range, namespace, dict, raise_exception, strftime_now, cycler, joiner,
 * lipsum): 1 found, 0 not. */
int tmpl_global_lookup(struct rt *rt, const char *name, size_t len, struct tv *out);

/* ---------------------------------------------------------------- runtime */

struct rt {
    const struct tmpl *t;
    struct err *e;
    bool failed;
    const struct node *node; /* node being evaluated (for error positions) */
    struct tmpl_limits lim;
    uint64_t steps;
    size_t alloc_total;
    uint32_t depth;  /* macro / recursive loop calls */
    uint32_t cdepth; /* C recursion (expressions and statements) */
    uintptr_t stack_base; /* frame address at render entry */
    bool has_now;
    int64_t now;
    const struct tdict *ctx;
    struct scope *top;
    struct scope *kept;     /* scopes captured by macros, freed at the end */
    struct tdict **nss;     /* namespaces made by this render (cycle breaking) */
    size_t n_nss, cap_nss;
};

/* Records the first error ("line L col C: msg") with code; returns false. */
bool rt_fail(struct rt *rt, smelt_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool rt_failv(struct rt *rt, smelt_status code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* The error for using an undefined value (UndefinedError). */
bool rt_undef_error(struct rt *rt, struct tv u);
/* Charges steps; false when over budget. */
bool rt_step(struct rt *rt, uint64_t n);
/* Calls a macro / loop / builtin value with evaluated arguments. */
bool tmpl_call_value(struct rt *rt, struct tv callee, struct targs *a, struct tv *out);
/* jinja2 environment.getattr / getitem. */
bool tmpl_getattr(struct rt *rt, struct tv obj, struct tstr *name, struct tv *out);
bool tmpl_getitem(struct rt *rt, struct tv obj, struct tv key, struct tv *out);
/* Iterates any iterable into a new list (dict: keys, str: characters, undefined: empty). */
bool tmpl_iter_list(struct rt *rt, struct tv v, struct tlist **out);
/* Registers a namespace for end-of-render cycle breaking. */
bool rt_track_ns(struct rt *rt, struct tdict *d);
/* markupsafe.escape: a Markup string (safe strings pass unchanged). */
bool tmpl_html_escape(struct rt *rt, struct tv v, struct tv *out);
/* Python `fmt % args`. */
bool tmpl_percent_format(struct rt *rt, struct tv fmt, struct tv args, struct tv *out);
/* Comparison operators (T_EQ.., CMP_IN, CMP_NOTIN) with Python semantics. */
bool tmpl_compare_op(struct rt *rt, int op, struct tv a, struct tv b, bool *out);
/* Python a + b. */
bool tmpl_add(struct rt *rt, struct tv a, struct tv b, struct tv *out);
/* Case-maps s into b (0 lower, 1 upper, 2 swapcase, 3 str.title, 4 capitalize) with
 * Python's full mappings. */
bool tmpl_case_into(struct rt *rt, struct sbuf *b, const char *s, size_t len, int mode);
/* Python str.is*(): l u t A n a d D N s (see tmpl_methods.c). */
bool tmpl_str_is(char what, const char *s, size_t len);
/* Lower-cases a string value (ignore_case). */
bool tmpl_str_lower(struct rt *rt, struct tv s, struct tv *out);
/* Calls the str method `name` on self. */
bool tmpl_str_method(struct rt *rt, const char *name, struct tv self, struct targs *a, struct tv *out);
bool tmpl_str_format(struct rt *rt, struct tstr *fmt, struct targs *a, struct tv *out);
bool tmpl_dict_items(struct rt *rt, struct tdict *d, struct tv *out);
bool tmpl_splitlines(struct rt *rt, const char *s, size_t len, bool keepends, struct tv *out);
bool tmpl_apply_filter_named(struct rt *rt, struct tv name, struct tv in, struct targs *a, struct tv *out);
bool tmpl_apply_test_named(struct rt *rt, struct tv name, struct tv in, struct targs *a, bool *out);
/* The value of a context (public wrapper). */
const struct tv *tmpl_value_tv(const struct tmpl_value *v);

#define TMPL_MAX_NEST 200 /* nesting depth of expressions / statements at compile time */

#endif
