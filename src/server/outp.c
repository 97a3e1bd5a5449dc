/* Chat output parsing (reasoning, tool calls): see outp.h.
 *
 * Two machines. The text machine (state) runs over a pending-text buffer: it finds
 * <think> blocks, content, and the markers that open tool-call regions. Inside a region
 * the call scanner (cs) reads the call objects byte by byte with a small JSON lexer
 * (strings, escapes, nesting): it reads keys, takes the "name" string, streams the
 * "arguments" value's bytes out as they arrive, and skips any other member. Markers are
 * searched in `pend` only, which never holds more than a marker's length of undecided
 * text, and the scanner sees each byte once, so the work per push is linear in the push.
 */
#include "server/outp.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/utf8.h"

enum {
    S_START = 0, /* only whitespace so far (a reply may open with <think> or a JSON call) */
    S_THINK = 1, /* inside <think> ... </think> */
    S_TEXT = 2,  /* content */
    S_CALL = 3,  /* inside a tool-call region (the scanner runs) */
    S_AFTER = 4, /* after </think> or a call: leading whitespace is dropped */
    S_BARE = 5,  /* a reply that opened with "{": held to the end */
    S_DROP = 6,  /* max_calls reached: the rest is dropped */
};

/* The call scanner. */
enum {
    CS_BEGIN = 0, /* before a call: "{", "[" (a list), or a Mistral name */
    CS_OBJ = 1,   /* in an object: a key, "," or "}" */
    CS_KEY = 2,   /* in a key string */
    CS_COLON = 3, /* after a key */
    CS_VALUE = 4, /* before a member's value */
    CS_NAME = 5,  /* in the name string */
    CS_VAL = 6,   /* in a value (arguments: streamed; others: skipped) */
    CS_NEXT = 7,  /* after a call object: ",", "]", ";" or the end */
    CS_TAIL = 8,  /* hermes: after the call, up to </tool_call> */
    CS_MNAME = 9, /* mistral: name[ARGS] */
    CS_MARGS = 10, /* mistral: after [ARGS] */
    CS_MDONE = 11, /* mistral: the value after [ARGS] ended the call (a vnext only) */
};

enum { V_CONTAINER = 0, V_STRING = 1, V_SCALAR = 2 };
enum { SCAN_MORE = 0, SCAN_NEXT = 1 };

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define MISTRAL_ARGS "[ARGS]"
#define MISTRAL_CALL_ID "[CALL_ID]"
#define PYTHON_TAG "<|python_tag|>"
#define MAX_NAME 1024    /* bytes of a name string before it is not a call */
#define MAX_MNAME 512    /* bytes before [ARGS] */

/* ---- templates ---- */

enum outp_syntax outp_syntax_of(const char *src) {
    if (!src) return OUTP_HERMES;
    if (strstr(src, HERMES_OPEN)) return OUTP_HERMES;
    if (strstr(src, MISTRAL_OPEN)) return OUTP_MISTRAL;
    if (strstr(src, PYTHON_TAG) || (strstr(src, "<|start_header_id|>") && strstr(src, "tools")))
        return OUTP_LLAMA3;
    return OUTP_HERMES;
}

bool outp_syntax_known(const char *src) {
    if (!src) return false;
    /* Qwen3-Coder writes <tool_call><function=name><parameter=...>: XML, not JSON */
    if (strstr(src, "<function=")) return false;
    return strstr(src, HERMES_OPEN) || strstr(src, MISTRAL_OPEN) || strstr(src, PYTHON_TAG) ||
           (strstr(src, "<|start_header_id|>") && strstr(src, "tools"));
}

bool outp_template_has_tools(const char *src) { return src && strstr(src, "tools") != NULL; }

bool outp_template_reasons(const char *src) { return src && strstr(src, THINK_OPEN) != NULL; }

char *outp_force_prefix(enum outp_syntax s, const char *src, const char *name) {
    struct jw w = {0};
    if (s == OUTP_MISTRAL && src && strstr(src, MISTRAL_ARGS)) {
        /* the newer tokenizers: [TOOL_CALLS]name[ARGS]{...} */
        jw_str(&w, MISTRAL_OPEN);
        if (name) {
            jw_str(&w, name);
            jw_str(&w, MISTRAL_ARGS);
        }
    } else {
        if (s == OUTP_HERMES) jw_str(&w, HERMES_OPEN "\n{\"name\": ");
        else if (s == OUTP_MISTRAL) jw_str(&w, MISTRAL_OPEN "[{\"name\": ");
        else if (s == OUTP_LLAMA3) jw_str(&w, "{\"name\": ");
        else return NULL;
        if (name) {
            jw_json_str(&w, name, strlen(name));
            jw_str(&w, s == OUTP_LLAMA3 ? ", \"parameters\": " : ", \"arguments\": ");
        } else {
            jw_str(&w, "\"");
        }
    }
    if (w.oom) {
        jw_free(&w);
        return NULL;
    }
    return w.p;
}

/* ---- deltas ---- */

void outp_delta_clear(struct outp_delta *d) {
    d->content.n = 0;
    d->reasoning.n = 0;
    if (d->content.p) d->content.p[0] = 0;
    if (d->reasoning.p) d->reasoning.p[0] = 0;
    for (int i = 0; i < d->n_calls; i++) {
        free(d->calls[i].name);
        jw_free(&d->calls[i].args);
    }
    d->n_calls = 0;
}

void outp_delta_free(struct outp_delta *d) {
    outp_delta_clear(d);
    jw_free(&d->content);
    jw_free(&d->reasoning);
    free(d->calls);
    memset(d, 0, sizeof *d);
}

static struct outp_call *new_piece(struct outp *p, struct outp_delta *d) {
    if (d->n_calls == d->cap_calls) {
        int cap = d->cap_calls ? d->cap_calls * 2 : 4;
        struct outp_call *c = realloc(d->calls, (size_t)cap * sizeof *c);
        if (!c) {
            p->bad = true;
            return NULL;
        }
        d->calls = c;
        d->cap_calls = cap;
    }
    struct outp_call *c = &d->calls[d->n_calls++];
    memset(c, 0, sizeof *c);
    c->index = p->n_calls_total - 1;
    jw_raw(&c->args, "", 0);
    return c;
}

/* Arguments text of the current call: merged into the delta's last piece when that is
 * the same call's (and not its first piece, which keeps "" arguments). */
static void emit_args(struct outp *p, struct outp_delta *d, const char *s, size_t n) {
    if (!n) return;
    struct outp_call *c = d->n_calls ? &d->calls[d->n_calls - 1] : NULL;
    if (!c || c->index != p->n_calls_total - 1 || c->name) c = new_piece(p, d);
    if (c) jw_raw(&c->args, s, n);
}

/* Length of an incomplete UTF-8 character at the end of s[0..n). */
static size_t utf8_tail(const char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        uint8_t b = (uint8_t)s[n - k];
        if (b < 0x80) return 0;
        if (b >= 0xC0) return utf8_incomplete_len((const uint8_t *)s + n - k, k) == k ? k : 0;
    }
    return 0;
}

/* Emits the arguments read so far (all, or up to an incomplete UTF-8 character). */
static void flush_args(struct outp *p, struct outp_delta *d, bool all) {
    size_t n = p->args.n;
    if (!n) return;
    size_t keep = all ? 0 : utf8_tail(p->args.p, n);
    emit_args(p, d, p->args.p, n - keep);
    memmove(p->args.p, p->args.p + n - keep, keep);
    p->args.n = keep;
}

/* ---- the parser ---- */

void outp_init(struct outp *p, enum outp_syntax syntax, bool reasoning, bool in_reasoning) {
    memset(p, 0, sizeof *p);
    p->syntax = syntax;
    p->reasoning = reasoning;
    p->state = in_reasoning ? S_THINK : S_START;
}

void outp_free(struct outp *p) {
    jw_free(&p->pend);
    jw_free(&p->call);
    jw_free(&p->key);
    jw_free(&p->name);
    jw_free(&p->hold);
    jw_free(&p->args);
}

/* Drops the first k bytes of b. */
static void consume(struct jw *b, size_t k) {
    if (k >= b->n) {
        b->n = 0;
    } else if (k) {
        memmove(b->p, b->p + k, b->n - k);
        b->n -= k;
    }
    if (b->p) b->p[b->n] = 0;
}

static const char *find_in(const char *s, size_t n, const char *m) {
    return n ? memmem(s, n, m, strlen(m)) : NULL;
}

/* Longest suffix of s[0..n) that is a proper prefix of m. */
static size_t partial_in(const char *s, size_t n, const char *m) {
    size_t lm = strlen(m), k = lm - 1 < n ? lm - 1 : n;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

static bool starts(const char *s, size_t n, const char *m) {
    size_t lm = strlen(m);
    return n >= lm && !memcmp(s, m, lm);
}

/* s[0..n) is a proper prefix of m (could still become m). */
static bool prefix_of(const char *s, size_t n, const char *m) {
    size_t lm = strlen(m);
    return n < lm && !memcmp(s, m, n);
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static const char *open_marker(enum outp_syntax s) {
    return s == OUTP_HERMES ? HERMES_OPEN : s == OUTP_MISTRAL ? MISTRAL_OPEN : NULL;
}

/* A call region starts (after its marker, or at a bare "{"). */
static void region_start(struct outp *p, const char *marker) {
    p->marker = marker;
    p->hide_marker = p->prefilling && marker;
    p->hide = 0;
    p->call.n = 0;
    p->list = false;
    p->committed = false;
    p->have_args = false;
    p->hold.n = 0;
    p->cs = CS_BEGIN;
    p->state = S_CALL;
}

/* Scan position bookkeeping: bytes pend[rec .. i) not yet copied to `call`. */
struct scan {
    size_t i, rec;
};

/* Copies the scanned bytes of a call whose name is not out yet to `call` (for giving them
 * back). */
static void record(struct outp *p, struct scan *sc) {
    if (!p->committed && sc->i > sc->rec) {
        jw_raw(&p->call, p->pend.p + sc->rec, sc->i - sc->rec);
        if (p->prefilling) p->hide += sc->i - sc->rec;
    }
    sc->rec = sc->i;
}

/* Not a call after all: the region's text goes back as content (without what came from
 * the prefill); the text from sc->i on is read as content. */
static int fail(struct outp *p, struct outp_delta *d, struct scan *sc) {
    record(p, sc);
    consume(&p->pend, sc->i);
    if (p->marker && !p->hide_marker) jw_str(&d->content, p->marker);
    if (p->call.n > p->hide) jw_raw(&d->content, p->call.p + p->hide, p->call.n - p->hide);
    p->call.n = 0;
    p->hide = 0;
    p->marker = NULL;
    p->committed = false;
    p->state = S_TEXT;
    return SCAN_NEXT;
}

/* The region is over; the text from sc->i on is read in state `next`. */
static int region_end(struct outp *p, struct scan *sc, int next) {
    consume(&p->pend, sc->i);
    p->call.n = 0;
    p->hide = 0;
    p->marker = NULL;
    p->committed = false;
    p->list = false;
    p->state = p->max_calls > 0 && p->n_calls_total >= p->max_calls ? S_DROP : next;
    return SCAN_NEXT;
}

/* The current call's name is complete: the call is out. */
static void commit(struct outp *p, struct outp_delta *d, struct scan *sc, const char *name,
                   size_t n) {
    p->n_calls_total++;
    struct outp_call *c = new_piece(p, d);
    if (c) {
        c->name = strndup(name, n);
        if (!c->name) p->bad = true;
    }
    p->committed = true;
    p->call.n = 0;
    p->hide = 0;
    p->marker = NULL; /* a later failure in this region gives back only its own text */
    sc->rec = sc->i;
    if (p->have_args) { /* the arguments came before the name */
        jw_raw(&p->args, p->hold.p ? p->hold.p : "", p->hold.n);
        p->hold.n = 0;
    }
}

/* The current call ended. Returns true when max_calls is reached. */
static bool call_done(struct outp *p, struct outp_delta *d, struct scan *sc) {
    if (!p->have_args) jw_str(&p->args, "{}");
    flush_args(p, d, true);
    p->committed = false;
    p->have_args = false;
    p->hold.n = 0;
    p->call.n = 0;
    p->hide = 0;
    sc->rec = sc->i;
    return p->max_calls > 0 && p->n_calls_total >= p->max_calls;
}

static bool key_is(const struct outp *p, const char *k) {
    return !p->key_long && p->key.n == strlen(k) && !memcmp(p->key.p, k, p->key.n);
}

static void value_start(struct outp *p, char ch, bool skip, int next) {
    p->vkind = ch == '{' || ch == '[' ? V_CONTAINER : ch == '"' ? V_STRING : V_SCALAR;
    p->depth = 0;
    p->in_str = false;
    p->esc = false;
    p->skipping = skip;
    p->vnext = next;
    if (!skip) p->hold.n = 0;
    p->cs = CS_VAL;
}

/* A value ended: an arguments string is decoded, a null one is "{}". */
static void value_done(struct outp *p, bool truncated) {
    if (p->skipping) return;
    p->have_args = true;
    if (p->vkind != V_CONTAINER && !truncated) {
        json_t *j = json_loadb(p->hold.p ? p->hold.p : "", p->hold.n, JSON_DECODE_ANY, NULL);
        if (json_is_string(j)) {
            p->hold.n = 0;
            jw_raw(&p->hold, json_string_value(j), json_string_length(j));
        } else if (json_is_null(j)) {
            p->hold.n = 0;
            jw_str(&p->hold, "{}");
        }
        json_decref(j);
    }
    if (p->committed && (p->vkind != V_CONTAINER || truncated)) {
        jw_raw(&p->args, p->hold.p ? p->hold.p : "", p->hold.n);
        p->hold.n = 0;
    }
}

/* Hermes: "</tool_call>" at pend[i] outside a JSON string ends the call early.
 * 1: it is there; 0: it is not; -1: it might be (wait for more text). */
static int close_at(const struct outp *p, size_t i, bool final) {
    if (p->syntax != OUTP_HERMES) return 0;
    const char *s = p->pend.p + i;
    size_t n = p->pend.n - i;
    if (starts(s, n, HERMES_CLOSE)) return 1;
    return prefix_of(s, n, HERMES_CLOSE) && !final ? -1 : 0;
}

/* Runs the call scanner over pend. SCAN_NEXT: the text state changed (run it);
 * SCAN_MORE: everything was read (or the rest waits for more text). */
static int scan(struct outp *p, struct outp_delta *d, bool final) {
    struct jw *b = &p->pend;
    struct scan sc = {0, 0};
    while (sc.i < b->n) {
        char ch = b->p[sc.i];
        switch (p->cs) {
        case CS_BEGIN:
            if (is_space(ch)) {
                sc.i++;
            } else if (ch == '{') {
                sc.i++;
                p->have_args = false;
                p->hold.n = 0;
                p->cs = CS_OBJ;
            } else if (ch == '[' && !p->list && p->syntax != OUTP_LLAMA3) {
                /* Mistral: "[TOOL_CALLS]" again is no list (decided the same however the
                 * text is cut: wait while it could still be the marker) */
                const char *s = b->p + sc.i;
                size_t n = b->n - sc.i;
                if (p->syntax == OUTP_MISTRAL && prefix_of(s, n, MISTRAL_OPEN) && !final) goto more;
                if (p->syntax == OUTP_MISTRAL && starts(s, n, MISTRAL_OPEN)) return fail(p, d, &sc);
                sc.i++;
                p->list = true;
            } else if (p->syntax == OUTP_MISTRAL && !p->list && ch != '[' && ch != ']' &&
                       ch != '"' && ch != '}') {
                p->cs = CS_MNAME;
            } else {
                return fail(p, d, &sc);
            }
            break;
        case CS_OBJ:
            if (is_space(ch) || ch == ',') {
                sc.i++;
            } else if (ch == '"') {
                sc.i++;
                p->key.n = 0;
                p->key_long = false;
                p->esc = false;
                p->cs = CS_KEY;
            } else if (ch == '}') {
                sc.i++;
                if (!p->committed) return fail(p, d, &sc); /* no name: not a call */
                if (call_done(p, d, &sc)) return region_end(p, &sc, S_DROP);
                p->cs = CS_NEXT;
            } else {
                int c = ch == '<' ? close_at(p, sc.i, final) : 0;
                if (c < 0) goto more;
                if (c > 0) {
                    if (!p->committed) return fail(p, d, &sc);
                    sc.i += strlen(HERMES_CLOSE);
                    call_done(p, d, &sc);
                    return region_end(p, &sc, S_AFTER);
                }
                if (!p->committed) return fail(p, d, &sc);
                sc.i++; /* junk inside a committed call: skipped */
            }
            break;
        case CS_KEY:
            sc.i++;
            if (p->esc) {
                p->esc = false;
            } else if (ch == '\\') {
                p->esc = true;
            } else if (ch == '"') {
                p->cs = CS_COLON;
                break;
            }
            if (p->key.n < 32) jw_raw(&p->key, &ch, 1);
            else p->key_long = true;
            break;
        case CS_COLON:
            if (is_space(ch)) {
                sc.i++;
            } else if (ch == ':') {
                sc.i++;
                p->cs = CS_VALUE;
            } else if (p->committed) {
                p->cs = CS_VALUE; /* lenient once the call is out */
            } else {
                return fail(p, d, &sc);
            }
            break;
        case CS_VALUE:
            if (is_space(ch)) {
                sc.i++;
                break;
            }
            if (key_is(p, "name") && !p->committed) {
                if (ch != '"') return fail(p, d, &sc);
                sc.i++;
                p->name.n = 0;
                p->esc = false;
                p->cs = CS_NAME;
            } else if ((key_is(p, "arguments") || key_is(p, "parameters")) && !p->have_args) {
                value_start(p, ch, false, CS_OBJ);
            } else {
                value_start(p, ch, true, CS_OBJ);
            }
            break;
        case CS_NAME:
            sc.i++;
            if (p->esc) {
                p->esc = false;
            } else if (ch == '\\') {
                p->esc = true;
            } else if (ch == '"') {
                json_t *j = NULL;
                struct jw q = {0};
                jw_raw(&q, "\"", 1);
                jw_raw(&q, p->name.p ? p->name.p : "", p->name.n);
                jw_raw(&q, "\"", 1);
                if (!q.oom) j = json_loadb(q.p, q.n, JSON_DECODE_ANY, NULL);
                jw_free(&q);
                if (!json_is_string(j) || json_string_length(j) == 0) {
                    json_decref(j);
                    return fail(p, d, &sc);
                }
                commit(p, d, &sc, json_string_value(j), json_string_length(j));
                json_decref(j);
                p->cs = CS_OBJ;
                break;
            }
            if (p->name.n >= MAX_NAME) return fail(p, d, &sc);
            jw_raw(&p->name, &ch, 1);
            break;
        case CS_VAL: {
            bool end_after = false, end_before = false;
            if (p->in_str) {
                if (p->esc) p->esc = false;
                else if (ch == '\\') p->esc = true;
                else if (ch == '"') {
                    p->in_str = false;
                    if (p->vkind == V_STRING) end_after = true;
                }
            } else if (ch == '"' && p->vkind != V_SCALAR) {
                p->in_str = true;
            } else if (p->vkind == V_SCALAR && (ch == ',' || ch == '}' || ch == ']' || is_space(ch))) {
                end_before = true;
            } else if (p->vkind == V_CONTAINER && (ch == '{' || ch == '[')) {
                p->depth++;
            } else if (p->vkind == V_CONTAINER && (ch == '}' || ch == ']')) {
                if (--p->depth <= 0) end_after = true;
            } else if (ch == '<') {
                int c = close_at(p, sc.i, final);
                if (c < 0) goto more;
                if (c > 0) { /* the call ends inside its value */
                    if (!p->committed) return fail(p, d, &sc);
                    value_done(p, true);
                    sc.i += strlen(HERMES_CLOSE);
                    call_done(p, d, &sc);
                    return region_end(p, &sc, S_AFTER);
                }
            }
            if (!end_before) {
                sc.i++;
                if (!p->skipping) {
                    if (p->vkind == V_CONTAINER && p->committed) jw_raw(&p->args, &ch, 1);
                    else jw_raw(&p->hold, &ch, 1);
                }
            }
            if (end_after || end_before) {
                value_done(p, false);
                if (p->vnext == CS_MDONE) {
                    if (call_done(p, d, &sc)) return region_end(p, &sc, S_DROP);
                    return region_end(p, &sc, S_AFTER);
                }
                p->cs = p->vnext;
            }
            break;
        }
        case CS_NEXT:
            if (is_space(ch)) {
                sc.i++;
                sc.rec = sc.i;
            } else if (p->list && ch == ',') {
                sc.i++;
                p->cs = CS_BEGIN;
            } else if (p->list && ch == ']') {
                sc.i++;
                sc.rec = sc.i;
                p->list = false;
                if (p->syntax != OUTP_HERMES) return region_end(p, &sc, S_AFTER);
                p->cs = CS_TAIL;
            } else if (!p->list && p->syntax == OUTP_HERMES) {
                p->cs = CS_TAIL;
            } else if (!p->list && p->syntax == OUTP_LLAMA3 && ch == ';') {
                sc.i++;
                p->cs = CS_BEGIN;
            } else {
                return region_end(p, &sc, S_AFTER);
            }
            break;
        case CS_TAIL: {
            /* drop everything up to </tool_call>; a new <tool_call> opens the next call */
            const char *s = b->p + sc.i;
            size_t n = b->n - sc.i;
            const char *cl = find_in(s, n, HERMES_CLOSE), *op = find_in(s, n, HERMES_OPEN);
            if (cl && (!op || cl < op)) {
                sc.i += (size_t)(cl - s) + strlen(HERMES_CLOSE);
                return region_end(p, &sc, S_AFTER);
            }
            if (op) {
                sc.i += (size_t)(op - s) + strlen(HERMES_OPEN);
                consume(b, sc.i);
                region_start(p, HERMES_OPEN);
                p->hide_marker = false;
                return SCAN_NEXT;
            }
            size_t k1 = partial_in(s, n, HERMES_CLOSE), k2 = partial_in(s, n, HERMES_OPEN);
            sc.i = b->n - (final ? 0 : (k1 > k2 ? k1 : k2));
            sc.rec = sc.i;
            if (final) return region_end(p, &sc, S_AFTER);
            goto more;
        }
        case CS_MNAME: {
            const char *s = b->p + sc.i;
            size_t n = b->n - sc.i;
            const char *a = find_in(s, n, MISTRAL_ARGS);
            /* (decided the same whatever the chunks: a name is at most MAX_MNAME bytes) */
            if (!a) {
                if (n >= MAX_MNAME + strlen(MISTRAL_ARGS) || final) return fail(p, d, &sc);
                goto more;
            }
            size_t nl = (size_t)(a - s);
            if (nl > MAX_MNAME) return fail(p, d, &sc);
            const char *cid = find_in(s, nl, MISTRAL_CALL_ID);
            if (cid) nl = (size_t)(cid - s);
            while (nl && is_space(s[nl - 1])) nl--;
            if (nl == 0 || memchr(s, '\n', nl) || memchr(s, '{', nl) || memchr(s, '"', nl))
                return fail(p, d, &sc);
            sc.i += (size_t)(a - s) + strlen(MISTRAL_ARGS);
            commit(p, d, &sc, s, nl);
            p->cs = CS_MARGS;
            break;
        }
        case CS_MARGS:
            if (is_space(ch)) {
                sc.i++;
                break;
            }
            value_start(p, ch, false, CS_MDONE);
            break;
        default:
            return fail(p, d, &sc);
        }
    }
more:
    if (final) {
        sc.i = b->n;
        if (p->committed) {
            if (p->cs == CS_VAL && !p->skipping && (p->vkind != V_CONTAINER)) value_done(p, true);
            flush_args(p, d, true);
            p->committed = false;
            return region_end(p, &sc, S_AFTER);
        }
        /* between calls (or after the last one): nothing was left open */
        if (p->cs == CS_NEXT || p->cs == CS_TAIL) return region_end(p, &sc, S_AFTER);
        if (p->cs == CS_BEGIN && p->marker == NULL && p->call.n == 0 && p->n_calls_total > 0) {
            record(p, &sc);
            bool blank = true;
            for (size_t k = 0; k < p->call.n; k++)
                blank = blank && (is_space(p->call.p[k]) || p->call.p[k] == ',' ||
                                  p->call.p[k] == ';' || p->call.p[k] == ']');
            if (blank) return region_end(p, &sc, S_AFTER);
        }
        return fail(p, d, &sc);
    }
    record(p, &sc);
    consume(b, sc.i);
    return SCAN_MORE;
}

/* A bare reply (no marker) is a call only when all of it is one call object. */
static bool bare_is_call(const struct outp *p) {
    json_t *j = json_loadb(p->call.p ? p->call.p : "", p->call.n, 0, NULL);
    bool ok = json_is_object(j) && json_is_string(json_object_get(j, "name")) &&
              json_string_length(json_object_get(j, "name")) > 0;
    json_decref(j);
    return ok;
}

/* Runs the text machine over pend. final: no more text will come. */
static void run(struct outp *p, struct outp_delta *d, bool final) {
    /* both buffers exist from here on (no NULL arithmetic below) */
    if (!p->pend.p) jw_raw(&p->pend, "", 0);
    if (!p->call.p) jw_raw(&p->call, "", 0);
    if (!p->pend.p || !p->call.p) {
        p->bad = true;
        return;
    }
    for (;;) {
        struct jw *b = &p->pend;
        switch (p->state) {
        case S_START:
        case S_AFTER: {
            size_t w = 0;
            while (w < b->n && is_space(b->p[w])) w++;
            const char *s = b->p + w;
            size_t n = b->n - w;
            if (n == 0) {
                if (final) {
                    if (p->state == S_START) jw_raw(&d->content, b->p, b->n);
                    b->n = 0;
                }
                return;
            }
            if (p->state == S_START && p->reasoning) {
                if (starts(s, n, THINK_OPEN)) {
                    consume(b, w + strlen(THINK_OPEN));
                    p->state = S_THINK;
                    continue;
                }
                if (prefix_of(s, n, THINK_OPEN) && !final) return;
            }
            if (p->syntax == OUTP_LLAMA3) {
                if (starts(s, n, PYTHON_TAG)) {
                    consume(b, w + strlen(PYTHON_TAG));
                    region_start(p, NULL);
                    continue;
                }
                if (s[0] == '{') {
                    consume(b, w);
                    region_start(p, NULL);
                    continue;
                }
                if (prefix_of(s, n, PYTHON_TAG) && !final) return;
            }
            const char *om = open_marker(p->syntax);
            if (om && p->state == S_START && s[0] == '{') {
                consume(b, w);
                p->call.n = 0;
                p->state = S_BARE;
                continue;
            }
            if (om && starts(s, n, om)) {
                consume(b, w + strlen(om));
                region_start(p, om);
                continue;
            }
            if (om && prefix_of(s, n, om) && !final) return;
            /* content: from the first non-space byte after </think> or a call, else all */
            if (p->state == S_AFTER) consume(b, w);
            p->state = S_TEXT;
            continue;
        }
        case S_THINK: {
            const char *f = find_in(b->p, b->n, THINK_CLOSE);
            if (f) {
                size_t i = (size_t)(f - b->p);
                if (!p->prefilling) jw_raw(&d->reasoning, b->p, i); /* the server's, not the model's */
                consume(b, i + strlen(THINK_CLOSE));
                p->state = S_AFTER;
                continue;
            }
            size_t keep = final ? 0 : partial_in(b->p, b->n, THINK_CLOSE);
            if (!p->prefilling) jw_raw(&d->reasoning, b->p, b->n - keep);
            consume(b, b->n - keep);
            return;
        }
        case S_TEXT: {
            const char *om = open_marker(p->syntax);
            const char *f = om ? find_in(b->p, b->n, om) : NULL;
            if (f) {
                size_t i = (size_t)(f - b->p);
                /* whitespace right before a call is not content */
                size_t j = i;
                while (j > 0 && is_space(b->p[j - 1])) j--;
                jw_raw(&d->content, b->p, j);
                consume(b, i + strlen(om));
                region_start(p, om);
                continue;
            }
            size_t keep = (final || !om) ? 0 : partial_in(b->p, b->n, om);
            /* hold trailing whitespace too while a call could follow */
            if (om && !final) {
                while (keep < b->n && is_space(b->p[b->n - keep - 1])) keep++;
            }
            jw_raw(&d->content, b->p, b->n - keep);
            consume(b, b->n - keep);
            return;
        }
        case S_CALL:
            if (scan(p, d, final) == SCAN_NEXT) continue;
            flush_args(p, d, final);
            return;
        case S_BARE:
            jw_raw(&p->call, b->p, b->n);
            b->n = 0;
            if (!final) return;
            if (bare_is_call(p)) {
                /* read it again as a call region */
                jw_raw(b, p->call.p, p->call.n);
                region_start(p, NULL);
                continue;
            }
            jw_raw(&d->content, p->call.p, p->call.n);
            p->call.n = 0;
            p->state = S_AFTER;
            return;
        case S_DROP:
            b->n = 0;
            return;
        default:
            return;
        }
    }
}

static void check_oom(struct outp *p, struct outp_delta *d) {
    if (p->pend.oom || p->call.oom || p->key.oom || p->name.oom || p->hold.oom || p->args.oom ||
        d->content.oom || d->reasoning.oom)
        p->bad = true;
    for (int i = 0; i < d->n_calls; i++)
        if (d->calls[i].args.oom) p->bad = true;
}

void outp_push(struct outp *p, const char *s, size_t n, struct outp_delta *d) {
    if (p->syntax == OUTP_TOOLS_NONE && !p->reasoning && p->pend.n == 0) {
        jw_raw(&d->content, s, n); /* the common case: no parsing at all */
        return;
    }
    jw_raw(&p->pend, s, n);
    run(p, d, false);
    check_oom(p, d);
}

void outp_prefill(struct outp *p, const char *s, size_t n, struct outp_delta *d) {
    p->prefilling = true;
    jw_raw(&p->pend, s, n);
    run(p, d, false);
    p->prefilling = false;
    check_oom(p, d);
}

void outp_finish(struct outp *p, struct outp_delta *d) {
    run(p, d, true);
    if (p->pend.n) {
        jw_raw(p->state == S_THINK ? &d->reasoning : &d->content, p->pend.p, p->pend.n);
        p->pend.n = 0;
    }
    flush_args(p, d, true);
    check_oom(p, d);
}
