/* Chat output parsing (reasoning, tool calls): see outp.h.
 *
 * Two machines. The text machine (state) runs over a pending-text buffer: it finds
 * <think> blocks, content, and the markers that open tool-call regions. Inside a region
 * the call scanner (cs) reads the call objects byte by byte with a small JSON lexer
 * (strings, escapes, nesting): it reads keys, takes the "name" string, streams the
 * "arguments" value's bytes out as they arrive, and skips any other member. Markers are
 * searched in `pend` only, which never holds more than a marker's length of undecided
 * text, and the scanner sees each byte once, so the work per push is linear in the push.
 *
 * qwen_xml regions have their own scanner (scan_xml): tags instead of JSON, the same
 * bookkeeping (a region is given back until its name is out, then committed). It reads a
 * name or key into a capped buffer byte by byte, and a value up to "</parameter>" with
 * memchr for '<'; a string value is written out (escaped) as it comes, a typed one is held
 * until its end.
 */
#include "server/outp.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/array.h"
#include "util/utf8.h"

enum {
    S_START = 0, /* only whitespace so far (a reply may open with <think> or a JSON call) */
    S_THINK = 1, /* inside <think> ... </think> */
    S_TEXT = 2,  /* content */
    S_CALL = 3,  /* inside a tool-call region (the scanner runs) */
    S_AFTER = 4, /* after </think> or a call: leading whitespace is dropped */
    S_BARE = 5,  /* a reply that opened with "{": held to the end */
    S_DROP = 6,  /* max_calls reached: the rest is dropped */
    /* harmony (its own machine, run_harmony) */
    H_START = 10, /* the reply's start: a header (the prompt wrote "<|start|>assistant") or text */
    H_HEAD = 11,  /* in a message header, up to <|message|> (held in `name`) */
    H_BODY = 12,  /* in a message body: to reasoning, content or a call's arguments */
    H_AFTER = 13, /* after a message: whitespace, then <|start|> (or text: content) */
    H_TEXT = 14,  /* text outside any message: content, up to <|start|> */
};

/* Where a harmony message body goes. */
enum { HT_CONTENT = 0, HT_REASONING = 1, HT_CALL = 2 };

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

/* The qwen_xml scanner (its own numbers: p->cs holds one or the other). */
enum {
    XS_BEGIN = 20, /* after <tool_call>: <function=, or a JSON call */
    XS_FNAME = 21, /* in the name, up to ">" */
    XS_BODY = 22,  /* in a call: <parameter=, </function>, ... (other text is dropped) */
    XS_PNAME = 23, /* in a parameter's key, up to ">" */
    XS_PVAL = 24,  /* in a value, up to </parameter> */
    XS_FEND = 25,  /* after </function>: </tool_call>, or another call */
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
#define XML_FUNC "<function="
#define XML_FUNC_CLOSE "</function>"
#define XML_PARAM "<parameter="
#define XML_PARAM_CLOSE "</parameter>"
#define MAX_XNAME 256 /* bytes of a qwen_xml function name or parameter key */
#define H_START_TAG "<|start|>"
#define H_CHANNEL "<|channel|>"
#define H_MESSAGE "<|message|>"
#define H_END "<|end|>"
#define H_CALL "<|call|>"
#define H_RETURN "<|return|>"
#define H_CONSTRAIN "<|constrain|>"
#define H_FUNCTIONS "functions."
#define MAX_HEAD 512 /* bytes of a harmony header before it is not one */

/* ---- templates ---- */

/* Qwen3-Coder's family: <tool_call> around <function=...> tags (ByteDance Seed writes the
 * same tags in <seed:tool_call>, which is not this syntax). */
static bool is_qwen_xml(const char *src) {
    return strstr(src, XML_FUNC) && strstr(src, HERMES_OPEN);
}

/* gpt-oss: messages with channels, <|start|>role<|channel|>c<|message|>...<|end|>. */
static bool is_harmony(const char *src) {
    return src && strstr(src, H_CHANNEL) && strstr(src, H_MESSAGE) && strstr(src, H_START_TAG);
}

bool outp_template_harmony(const char *src) { return is_harmony(src); }

enum outp_syntax outp_syntax_of(const char *src) {
    if (!src) return OUTP_HERMES;
    if (is_harmony(src)) return OUTP_HARMONY;
    if (is_qwen_xml(src)) return OUTP_QWEN_XML;
    if (strstr(src, HERMES_OPEN)) return OUTP_HERMES;
    if (strstr(src, MISTRAL_OPEN)) return OUTP_MISTRAL;
    if (strstr(src, PYTHON_TAG) || (strstr(src, "<|start_header_id|>") && strstr(src, "tools")))
        return OUTP_LLAMA3;
    return OUTP_HERMES;
}

bool outp_syntax_known(const char *src) {
    if (!src) return false;
    if (is_harmony(src) || is_qwen_xml(src)) return true;
    /* <function= tags in another wrapper (<seed:tool_call>): not one smelt reads */
    if (strstr(src, XML_FUNC)) return false;
    return strstr(src, HERMES_OPEN) || strstr(src, MISTRAL_OPEN) || strstr(src, PYTHON_TAG) ||
           (strstr(src, "<|start_header_id|>") && strstr(src, "tools"));
}

bool outp_template_has_tools(const char *src) { return src && strstr(src, "tools") != NULL; }

bool outp_template_reasons(const char *src) {
    return src && (strstr(src, THINK_OPEN) != NULL || is_harmony(src));
}

bool outp_force_ok(enum outp_syntax s, const char *name) {
    if ((s != OUTP_QWEN_XML && s != OUTP_HARMONY) || !name) return true;
    size_t n = strlen(name);
    if (n == 0 || n > MAX_XNAME) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] <= ' ' || name[i] == '<' || name[i] == '>') return false;
    return true;
}

char *outp_force_prefix(enum outp_syntax s, const char *src, const char *name) {
    struct jw w = {0};
    if (s == OUTP_HARMONY) {
        /* the prompt ends with "<|start|>assistant": a commentary message to the function */
        jw_str(&w, H_CHANNEL "commentary to=" H_FUNCTIONS);
        if (name) {
            jw_str(&w, name);
            jw_str(&w, " " H_CONSTRAIN "json" H_MESSAGE);
        }
    } else if (s == OUTP_QWEN_XML) {
        jw_str(&w, HERMES_OPEN "\n" XML_FUNC);
        if (name) {
            jw_str(&w, name);
            jw_str(&w, ">\n");
        }
    } else if (s == OUTP_MISTRAL && src && strstr(src, MISTRAL_ARGS)) {
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
    if (!array_grow((void **)&d->calls, &d->cap_calls, (size_t)d->n_calls + 1, sizeof *d->calls)) {
        p->bad = true;
        return NULL;
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

/* Emits the arguments read so far (all, or up to an incomplete UTF-8 character). */
static void flush_args(struct outp *p, struct outp_delta *d, bool all) {
    size_t n = p->args.n;
    if (!n) return;
    size_t keep = all ? 0 : utf8_tail_len((const uint8_t *)p->args.p, n);
    emit_args(p, d, p->args.p, n - keep);
    memmove(p->args.p, p->args.p + n - keep, keep);
    p->args.n = keep;
}

/* ---- the parser ---- */

void outp_init(struct outp *p, enum outp_syntax syntax, bool reasoning, bool in_reasoning) {
    memset(p, 0, sizeof *p);
    p->syntax = syntax;
    p->reasoning = reasoning;
    p->state = syntax == OUTP_HARMONY ? H_START : in_reasoning ? S_THINK : S_START;
}

void outp_free(struct outp *p) {
    jw_free(&p->pend);
    jw_free(&p->call);
    jw_free(&p->gap);
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
    return s == OUTP_HERMES || s == OUTP_QWEN_XML ? HERMES_OPEN
           : s == OUTP_MISTRAL                    ? MISTRAL_OPEN
                                                  : NULL;
}

/* The region is read as Hermes JSON: hermes, or a JSON call inside qwen_xml's tag. */
static bool hermes_like(const struct outp *p) {
    return p->syntax == OUTP_HERMES || (p->syntax == OUTP_QWEN_XML && p->xjson);
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
    p->xjson = false;
    p->cs = p->syntax == OUTP_QWEN_XML ? XS_BEGIN : CS_BEGIN;
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
    jw_raw(&d->content, p->gap.p ? p->gap.p : "", p->gap.n);
    p->gap.n = 0;
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
    p->gap.n = 0;
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
    p->gap.n = 0;
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
    if (!hermes_like(p)) return 0;
    const char *s = p->pend.p + i;
    size_t n = p->pend.n - i;
    if (starts(s, n, HERMES_CLOSE)) return 1;
    return prefix_of(s, n, HERMES_CLOSE) && !final ? -1 : 0;
}

/* ---- qwen_xml ---- */

/* Which of the markers m[0..k) the text s[0..n) starts with: its index; -1: none yet, but
 * one may (the text is a proper prefix of it and more may come); -2: none. */
static int marker_of(const char *s, size_t n, const char *const *m, int k, bool final) {
    bool maybe = false;
    for (int j = 0; j < k; j++) {
        if (starts(s, n, m[j])) return j;
        if (!final && prefix_of(s, n, m[j])) maybe = true;
    }
    return maybe ? -1 : -2;
}

/* A control character (a newline included): never part of a name or key. */
static bool is_ctl(char c) {
    return (unsigned char)c < 0x20 || c == 0x7f;
}

/* s[0..*n) less the whitespace around it. */
static const char *trim(const char *s, size_t *n) {
    while (*n && is_space(s[0])) {
        s++;
        (*n)--;
    }
    while (*n && is_space(s[*n - 1]))
        (*n)--;
    return s;
}

/* The "properties" schema of function name[0..n) in the request's tools (NULL: none). */
static const json_t *props_of(const json_t *tools, const char *name, size_t n) {
    size_t i;
    const json_t *t;
    if (!json_is_array(tools)) return NULL;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const json_t *nm = json_object_get(fn, "name");
        if (json_is_string(nm) && json_string_length(nm) == n &&
            !memcmp(json_string_value(nm), name, n)) {
            const json_t *pr = json_object_get(json_object_get(fn, "parameters"), "properties");
            return json_is_object(pr) ? pr : NULL;
        }
    }
    return NULL;
}

/* Whether parameter key[0..n) of the current call is a string: its schema type is "string"
 * (or a list holding it), or no schema gives it a type (the template writes any value as
 * text; vLLM decides the same). */
static bool param_is_string(const struct outp *p, const char *key, size_t n) {
    char k[MAX_XNAME + 1];
    if (!p->xprops || n > MAX_XNAME || memchr(key, 0, n)) return true;
    memcpy(k, key, n);
    k[n] = 0;
    const json_t *type = json_object_get(json_object_get(p->xprops, k), "type");
    if (json_is_string(type)) return !strcmp(json_string_value(type), "string");
    if (!json_is_array(type)) return true;
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t) {
        if (json_is_string(t) && !strcmp(json_string_value(t), "string")) return true;
    }
    return false;
}

/* A call's name is out: its arguments object opens. */
static void xml_call_start(struct outp *p, const char *name, size_t n) {
    p->xprops = props_of(p->tools, name, n);
    p->xn = 0;
    p->have_args = true;
    jw_raw(&p->args, "{", 1);
}

/* Writes a string value's text held so far, escaped: all of it at its end (less the
 * template's trailing newline), else all but a newline that may be that one and an
 * incomplete UTF-8 character. */
static void xml_str_flush(struct outp *p, bool end) {
    size_t n = p->hold.n, keep = 0;
    if (!n) return;
    if (end) {
        if (p->hold.p[n - 1] == '\n') n--;
    } else {
        keep = utf8_tail_len((const uint8_t *)p->hold.p, n);
        if (!keep && p->hold.p[n - 1] == '\n') keep = 1;
    }
    jw_json_chars(&p->args, p->hold.p, n - keep);
    if (end)
        p->hold.n = 0;
    else
        consume(&p->hold, n - keep);
}

/* A parameter's key is complete: its member begins ("KEY": and a string's quote). */
static void xml_param_start(struct outp *p, const char *key, size_t n) {
    p->xstr = param_is_string(p, key, n);
    p->xstarted = false;
    p->hold.n = 0;
    if (p->xn++) jw_raw(&p->args, ", ", 2);
    jw_json_str(&p->args, key, n);
    jw_str(&p->args, p->xstr ? ": \"" : ": ");
}

/* Text of the current value (the template's leading newline dropped). */
static void xml_value(struct outp *p, const char *s, size_t n) {
    if (!p->xstarted) {
        p->xstarted = true;
        if (n && s[0] == '\n') {
            s++;
            n--;
        }
    }
    jw_raw(&p->hold, s, n);
    if (p->xstr) xml_str_flush(p, false);
}

/* The current value ended (at </parameter>, or cut off): its member is complete. */
static void xml_param_end(struct outp *p) {
    if (p->xstr) {
        xml_str_flush(p, true);
        jw_raw(&p->args, "\"", 1);
        return;
    }
    size_t n = p->hold.n;
    const char *s = trim(p->hold.p ? p->hold.p : "", &n);
    /* the templates write a boolean or null with Jinja's `string`: Python's spelling */
    const char *lit = n == 4 && !memcmp(s, "True", 4)    ? "true"
                      : n == 5 && !memcmp(s, "False", 5) ? "false"
                      : n == 4 && !memcmp(s, "None", 4)  ? "null"
                                                         : NULL;
    if (lit) {
        jw_str(&p->args, lit);
    } else {
        json_t *j = n ? json_loadb(s, n, JSON_DECODE_ANY, NULL) : NULL;
        if (j)
            jw_raw(&p->args, s, n); /* valid JSON (and UTF-8): as the model wrote it */
        else
            jw_json_str(&p->args, s, n);
        json_decref(j);
    }
    p->hold.n = 0;
}

/* The current call ended (at </function>, or cut off): its object is closed. Returns true
 * when max_calls is reached. */
static bool xml_call_end(struct outp *p, struct outp_delta *d, struct scan *sc) {
    if (p->cs == XS_PVAL) xml_param_end(p);
    jw_raw(&p->args, "}", 1);
    return call_done(p, d, sc);
}

/* The qwen_xml scanner over pend (as scan). Names and keys are read byte by byte into
 * buffers capped at MAX_XNAME; each decision looks at most a marker's length ahead, so it
 * is the same however the text is cut. Before a call's name is out, anything unexpected
 * gives the region back as content; after, stray text inside the call is dropped. */
static int scan_xml(struct outp *p, struct outp_delta *d, bool final) {
    static const char *const func_m[] = {XML_FUNC};
    static const char *const pclose_m[] = {XML_PARAM_CLOSE};
    /* in a call (XS_BODY) or after one (XS_FEND) */
    static const char *const body_m[] = {XML_PARAM, XML_FUNC_CLOSE, HERMES_CLOSE, HERMES_OPEN,
                                         XML_FUNC};
    enum { M_PARAM, M_FCLOSE, M_CLOSE, M_OPEN, M_FUNC };
    struct jw *b = &p->pend;
    struct scan sc = {0, 0};
    while (sc.i < b->n) {
        const char *s = b->p + sc.i;
        size_t n = b->n - sc.i;
        char ch = s[0];
        switch (p->cs) {
        case XS_BEGIN: {
            if (is_space(ch)) {
                sc.i++;
                break;
            }
            if (ch == '{' || ch == '[') {
                /* a Hermes JSON call in the tag: the JSON scanner reads the region */
                record(p, &sc);
                consume(b, sc.i);
                p->xjson = true;
                p->cs = CS_BEGIN;
                return SCAN_NEXT;
            }
            int m = marker_of(s, n, func_m, 1, final);
            if (m == -1) goto more;
            if (m < 0) return fail(p, d, &sc);
            sc.i += strlen(XML_FUNC);
            p->name.n = 0;
            p->cs = XS_FNAME;
            break;
        }
        case XS_FNAME:
            if (ch == '>') {
                sc.i++;
                size_t nl = p->name.n;
                const char *nm = trim(p->name.p ? p->name.p : "", &nl);
                /* (a name is one word: "<function=a b>" is prose, not a call) */
                if (!nl || memchr(nm, ' ', nl)) return fail(p, d, &sc);
                commit(p, d, &sc, nm, nl);
                xml_call_start(p, nm, nl);
                p->cs = XS_BODY;
                break;
            }
            /* not a name (a control character, '<', too long): the region (up to here) is
             * content, the rest is read again */
            if (is_ctl(ch) || ch == '<' || p->name.n >= MAX_XNAME) return fail(p, d, &sc);
            sc.i++;
            jw_raw(&p->name, &ch, 1);
            break;
        case XS_BODY:
        case XS_FEND: {
            if (is_space(ch)) {
                sc.i++;
                break;
            }
            int m = ch == '<' ? marker_of(s, n, body_m, 5, final) : -2;
            if (m == -1) goto more;
            if (final && m == -2 && ch == '<' && marker_of(s, n, body_m, 5, false) == -1) {
                sc.i = b->n; /* cut off inside a tag: the tag was no text */
                break;
            }
            bool in_call = p->cs == XS_BODY;
            if (!in_call && (m == -2 || m == M_PARAM || m == M_FCLOSE))
                return region_end(p, &sc, S_AFTER); /* text after the call: content */
            if (m == -2) {
                sc.i++; /* stray text inside the call: dropped */
                break;
            }
            if (m == M_PARAM) {
                sc.i += strlen(XML_PARAM);
                p->key.n = 0;
                p->cs = XS_PNAME;
                break;
            }
            /* every other marker ends the call (a missing </function> is forgiven) */
            sc.i += strlen(body_m[m]);
            if (in_call && xml_call_end(p, d, &sc)) return region_end(p, &sc, S_DROP);
            if (m == M_CLOSE) return region_end(p, &sc, S_AFTER);
            if (m == M_OPEN) { /* the next region (its close tag was missing) */
                consume(b, sc.i);
                region_start(p, HERMES_OPEN);
                p->hide_marker = false;
                return SCAN_NEXT;
            }
            if (m == M_FUNC) { /* the next call in the same region */
                p->name.n = 0;
                p->cs = XS_FNAME;
                break;
            }
            p->cs = XS_FEND; /* M_FCLOSE */
            break;
        }
        case XS_PNAME:
            if (ch == '>') {
                sc.i++;
                size_t kl = p->key.n;
                const char *k = trim(p->key.p ? p->key.p : "", &kl);
                if (!kl) {
                    p->cs = XS_BODY; /* no key: the parameter is dropped */
                    break;
                }
                xml_param_start(p, k, kl);
                p->cs = XS_PVAL;
                break;
            }
            if (is_ctl(ch) || ch == '<' || p->key.n >= MAX_XNAME) {
                p->cs = XS_BODY; /* not a key: the parameter is dropped as stray text */
                break;
            }
            sc.i++;
            jw_raw(&p->key, &ch, 1);
            break;
        case XS_PVAL: {
            const char *lt = memchr(s, '<', n);
            size_t span = lt ? (size_t)(lt - s) : n;
            if (span) {
                xml_value(p, s, span);
                sc.i += span;
                break;
            }
            int m = marker_of(s, n, pclose_m, 1, final);
            if (m == -1) goto more;
            /* (cut off inside the close tag: the tag, not the value) */
            if (m == 0 || (final && prefix_of(s, n, XML_PARAM_CLOSE))) {
                sc.i += m == 0 ? strlen(XML_PARAM_CLOSE) : n;
                xml_param_end(p);
                p->cs = XS_BODY;
                break;
            }
            xml_value(p, s, 1); /* a '<' of the value */
            sc.i++;
            break;
        }
        default:
            return fail(p, d, &sc);
        }
    }
more:
    if (final) {
        sc.i = b->n;
        if (p->committed) { /* cut off inside a call: it keeps what it got, closed */
            xml_call_end(p, d, &sc);
            return region_end(p, &sc, S_AFTER);
        }
        if (p->cs == XS_FEND) return region_end(p, &sc, S_AFTER);
        return fail(p, d, &sc);
    }
    record(p, &sc);
    consume(b, sc.i);
    return SCAN_MORE;
}

/* Runs the call scanner over pend. SCAN_NEXT: the text state changed (run it);
 * SCAN_MORE: everything was read (or the rest waits for more text). */
static int scan(struct outp *p, struct outp_delta *d, bool final) {
    struct jw *b = &p->pend;
    if (p->syntax == OUTP_QWEN_XML && !p->xjson) return scan_xml(p, d, final);
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
                if (!hermes_like(p)) return region_end(p, &sc, S_AFTER);
                p->cs = CS_TAIL;
            } else if (!p->list && hermes_like(p)) {
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

/* ---- harmony ----
 *
 * gpt-oss replies in messages: "<|channel|>analysis<|message|>...<|end|>" (the prompt wrote
 * "<|start|>assistant" before the first), then "<|start|>assistant<|channel|>final
 * <|message|>...", a tool call "<|start|>assistant to=functions.NAME<|channel|>commentary
 * <|constrain|>json<|message|>{...}<|call|>" (the recipient may also follow the channel).
 * <|return|> and <|call|> end the generation, so the text usually ends without them.
 * A header is held (at most MAX_HEAD bytes) until its <|message|>; then the body streams to
 * reasoning (analysis), a call's arguments (any message to a recipient, when the request
 * has tools) or content (final, and commentary to no one: a preamble). Text outside any
 * message is content. */

/* The markers that end a body (<|start|>: the next message began without <|end|>). */
static const char *const h_body_end[] = {H_END, H_CALL, H_RETURN, H_START_TAG};
/* The markers that open a header in text outside a message. */
static const char *const h_open[] = {H_START_TAG, H_CHANNEL};

/* Longest suffix of s[0..n) that is a proper prefix of one of the k markers m. */
static size_t partial_any(const char *s, size_t n, const char *const *m, int k) {
    size_t best = 0;
    for (int j = 0; j < k; j++) {
        size_t q = partial_in(s, n, m[j]);
        if (q > best) best = q;
    }
    return best;
}

/* The marker of m[0..k) that occurs first in s[0..n): its index (*at: its offset), or -1. */
static int first_of(const char *s, size_t n, const char *const *m, int k, size_t *at) {
    int best = -1;
    for (int j = 0; j < k; j++) {
        /* (only a match that starts before the best so far can beat it) */
        size_t lim = best < 0 ? n : *at + strlen(m[j]) - 1;
        const char *f = find_in(s, lim < n ? lim : n, m[j]);
        if (f) {
            best = j;
            *at = (size_t)(f - s);
        }
    }
    return best;
}

/* The value of a header attribute that starts at h[i] (after "to=" or "<|channel|>"): up
 * to a space or a marker. */
static size_t h_word(const char *h, size_t n, size_t i) {
    size_t j = i;
    while (j < n && h[j] != ' ' && h[j] != '<' && !is_ctl(h[j]))
        j++;
    return j - i;
}

/* A header is complete (`name` holds it, without its <|start|>): where its body goes. */
static void h_head(struct outp *p, struct outp_delta *d) {
    const char *h = p->name.p ? p->name.p : "";
    size_t n = p->name.n, rl = 0, cl = 0;
    const char *rec = NULL, *ch = NULL;
    for (size_t i = 0; i + 3 <= n; i++)
        if (!memcmp(h + i, "to=", 3) && (i == 0 || h[i - 1] == ' ')) {
            rec = h + i + 3;
            rl = h_word(h, n, i + 3);
            break;
        }
    const char *c = find_in(h, n, H_CHANNEL);
    if (c) {
        ch = c + strlen(H_CHANNEL);
        cl = h_word(h, n, (size_t)(ch - h));
    }
    if (rec && rl > strlen(H_FUNCTIONS) && starts(rec, rl, H_FUNCTIONS)) {
        rec += strlen(H_FUNCTIONS);
        rl -= strlen(H_FUNCTIONS);
    }
    p->state = H_BODY;
    p->have_args = false;
    if (rec && rl && !p->no_calls) {
        p->vkind = HT_CALL;
        p->n_calls_total++;
        struct outp_call *k = new_piece(p, d);
        if (k && !(k->name = strndup(rec, rl))) p->bad = true;
    } else {
        p->vkind = ch && cl == 8 && !memcmp(ch, "analysis", 8) ? HT_REASONING : HT_CONTENT;
    }
}

/* Body text of the current message. */
static void h_emit(struct outp *p, struct outp_delta *d, const char *s, size_t n) {
    if (!n || p->prefilling) return;
    if (p->vkind == HT_CALL) {
        p->have_args = true;
        jw_raw(&p->args, s, n);
    } else {
        jw_raw(p->vkind == HT_REASONING ? &d->reasoning : &d->content, s, n);
    }
}

/* The current message ended (its body, or the reply, is over). */
static void h_done(struct outp *p, struct outp_delta *d) {
    if (p->vkind != HT_CALL) return;
    if (!p->have_args) jw_str(&p->args, "{}");
    flush_args(p, d, true);
    p->have_args = false;
    p->vkind = HT_CONTENT;
    if (p->max_calls > 0 && p->n_calls_total >= p->max_calls) p->state = S_DROP;
}

/* A header begins (its text from here on goes to `name`). */
static void h_begin(struct outp *p) {
    p->name.n = 0;
    p->hide = 0;
    p->state = H_HEAD;
}

/* Runs the harmony machine over pend (as run). */
static void run_harmony(struct outp *p, struct outp_delta *d, bool final) {
    const size_t ls = strlen(H_START_TAG);
    for (;;) {
        struct jw *b = &p->pend;
        const char *s = b->p;
        size_t n = b->n, at = 0;
        switch (p->state) {
        case H_START:
            if (n == 0) return;
            if (starts(s, n, H_START_TAG)) {
                consume(b, ls);
                h_begin(p);
            } else if (starts(s, n, H_CHANNEL) || starts(s, n, " to=")) {
                h_begin(p); /* the role came with the prompt */
            } else if (!final && (prefix_of(s, n, H_START_TAG) || prefix_of(s, n, H_CHANNEL) ||
                                  prefix_of(s, n, " to="))) {
                return;
            } else {
                p->state = H_TEXT;
            }
            continue;
        case H_HEAD: {
            const char *m = find_in(s, n, H_MESSAGE);
            size_t take = m ? (size_t)(m - s) : n - (final ? 0 : partial_in(s, n, H_MESSAGE));
            if (p->name.n + take > MAX_HEAD) {
                /* no header after all: its text (less the prefill's) goes back in front of what
                 * is pending and is read again as text, so a stream split inside it finds the
                 * tags the whole text finds */
                if (!p->prefilling && p->name.n > p->hide) {
                    size_t k = p->name.n - p->hide;
                    jw_raw(b, p->name.p + p->hide, k); /* grow by k, then rotate into place */
                    if (b->oom) return;
                    memmove(b->p + k, b->p, b->n - k);
                    memcpy(b->p, p->name.p + p->hide, k);
                }
                /* the channel tag that opened it (re-inserted, or never taken in) is text
                 * now, or it would open the same header again (forever) */
                if (starts(b->p, b->n, H_CHANNEL)) p->text_skip = strlen(H_CHANNEL);
                p->name.n = 0;
                p->hide = 0;
                p->state = H_TEXT;
                continue;
            }
            jw_raw(&p->name, s, take);
            if (p->prefilling) p->hide += take;
            if (!m) {
                consume(b, take);
                if (final) { /* cut off inside a header: no text */
                    b->n = 0;
                    p->state = H_AFTER;
                }
                return;
            }
            consume(b, take + strlen(H_MESSAGE));
            h_head(p, d);
            continue;
        }
        case H_BODY: {
            int k = first_of(s, n, h_body_end, 4, &at);
            if (k < 0) {
                size_t keep = final ? 0 : partial_any(s, n, h_body_end, 4);
                /* (pieces never split a UTF-8 character: pushes may) */
                if (!final && p->vkind != HT_CALL) keep += utf8_tail_len((const uint8_t *)s, n - keep);
                h_emit(p, d, s, n - keep);
                consume(b, n - keep);
                if (final) h_done(p, d);
                if (p->vkind == HT_CALL) flush_args(p, d, false);
                return;
            }
            h_emit(p, d, s, at);
            consume(b, at + (k == 3 ? 0 : strlen(h_body_end[k])));
            p->state = H_AFTER;
            h_done(p, d);
            continue;
        }
        case H_AFTER: {
            size_t w = 0;
            while (w < n && is_space(s[w]))
                w++;
            if (w == n) {
                if (final) b->n = 0;
                return;
            }
            if (starts(s + w, n - w, H_START_TAG)) {
                consume(b, w + ls);
                h_begin(p);
            } else if (starts(s + w, n - w, H_CHANNEL)) {
                consume(b, w);
                h_begin(p);
            } else if (!final && (prefix_of(s + w, n - w, H_START_TAG) ||
                                  prefix_of(s + w, n - w, H_CHANNEL))) {
                return;
            } else {
                consume(b, w);
                p->state = H_TEXT;
            }
            continue;
        }
        case H_TEXT: {
            if (p->text_skip && n) {
                size_t t = p->text_skip < n ? p->text_skip : n;
                if (!p->prefilling) jw_raw(&d->content, s, t);
                consume(b, t);
                p->text_skip -= t;
                continue;
            }
            int k = first_of(s, n, h_open, 2, &at);
            size_t keep = k >= 0 ? n - at : final ? 0 : partial_any(s, n, h_open, 2);
            if (k < 0 && !final) keep += utf8_tail_len((const uint8_t *)s, n - keep);
            if (!p->prefilling) jw_raw(&d->content, s, n - keep);
            consume(b, n - keep);
            if (k < 0) return;
            if (k == 0) consume(b, ls);
            h_begin(p);
            continue;
        }
        case S_DROP:
            b->n = 0;
            return;
        default:
            return;
        }
    }
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
    if (p->syntax == OUTP_HARMONY) {
        run_harmony(p, d, final);
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
                /* whitespace right before a call is not content (unless it is no call) */
                size_t j = i;
                while (j > 0 && is_space(b->p[j - 1])) j--;
                jw_raw(&d->content, b->p, j);
                p->gap.n = 0;
                if (!p->prefilling) jw_raw(&p->gap, b->p + j, i - j);
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
    if (p->pend.oom || p->call.oom || p->gap.oom || p->key.oom || p->name.oom || p->hold.oom ||
        p->args.oom || d->content.oom || d->reasoning.oom)
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
