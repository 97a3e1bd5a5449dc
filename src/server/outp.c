/* Chat output parsing (reasoning, tool calls): see outp.h.
 *
 * A small state machine over a pending-text buffer. Each push appends to `pend` and
 * runs the machine until it needs more text; what it decides goes to the delta. Markers
 * are searched in `pend` only, which never holds more than a marker's length of
 * undecided text outside a tool call, so the work per push is linear in the push. */
#include "server/outp.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

enum {
    S_START = 0, /* only whitespace so far (a reply may open with <think> or a JSON call) */
    S_THINK = 1, /* inside <think> ... </think> */
    S_TEXT = 2,  /* content */
    S_CALL = 3,  /* inside a tool call */
    S_AFTER = 4, /* after </think> or a call: leading whitespace is dropped */
};

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define PYTHON_TAG "<|python_tag|>"

enum outp_syntax outp_syntax_of(const char *src) {
    if (!src) return OUTP_HERMES;
    if (strstr(src, HERMES_OPEN)) return OUTP_HERMES;
    if (strstr(src, MISTRAL_OPEN)) return OUTP_MISTRAL;
    if (strstr(src, PYTHON_TAG) || (strstr(src, "<|start_header_id|>") && strstr(src, "tools")))
        return OUTP_LLAMA3;
    return OUTP_HERMES;
}

bool outp_template_reasons(const char *src) { return src && strstr(src, THINK_OPEN) != NULL; }

void outp_delta_clear(struct outp_delta *d) {
    d->content.n = 0;
    d->reasoning.n = 0;
    if (d->content.p) d->content.p[0] = 0;
    if (d->reasoning.p) d->reasoning.p[0] = 0;
    for (int i = 0; i < d->n_calls; i++) {
        free(d->calls[i].name);
        free(d->calls[i].arguments);
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

void outp_init(struct outp *p, enum outp_syntax syntax, bool reasoning, bool in_reasoning) {
    memset(p, 0, sizeof *p);
    p->syntax = syntax;
    p->reasoning = reasoning;
    p->state = in_reasoning ? S_THINK : S_START;
}

void outp_free(struct outp *p) {
    jw_free(&p->pend);
    jw_free(&p->call);
}

/* Drops the first k bytes of b. */
static void consume(struct jw *b, size_t k) {
    if (k >= b->n) {
        b->n = 0;
    } else {
        memmove(b->p, b->p + k, b->n - k);
        b->n -= k;
    }
    if (b->p) b->p[b->n] = 0;
}

static const char *find(const struct jw *b, const char *m) {
    if (!b->n) return NULL;
    return memmem(b->p, b->n, m, strlen(m));
}

/* Longest suffix of b that is a proper prefix of m. */
static size_t partial(const struct jw *b, const char *m) {
    size_t lm = strlen(m), k = lm - 1 < b->n ? lm - 1 : b->n;
    for (; k > 0; k--)
        if (!memcmp(b->p + b->n - k, m, k)) return k;
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

static void add_call(struct outp *p, struct outp_delta *d, const char *name, size_t nlen,
                     const char *args) {
    if (d->n_calls == d->cap_calls) {
        int cap = d->cap_calls ? d->cap_calls * 2 : 4;
        struct outp_call *c = realloc(d->calls, (size_t)cap * sizeof *c);
        if (!c) {
            p->bad = true;
            return;
        }
        d->calls = c;
        d->cap_calls = cap;
    }
    struct outp_call *c = &d->calls[d->n_calls];
    c->name = strndup(name, nlen);
    c->arguments = strdup(args);
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        p->bad = true;
        return;
    }
    d->n_calls++;
    p->n_calls_total++;
}

/* One call object {"name": ..., "arguments" | "parameters": {...} or "..."}. */
static bool emit_obj(struct outp *p, const json_t *o, struct outp_delta *d) {
    json_t *name = json_object_get(o, "name");
    json_t *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    if (!json_is_string(name)) return false;
    char *a = NULL;
    if (!args || json_is_null(args)) a = strdup("{}");
    else if (json_is_string(args)) a = strdup(json_string_value(args));
    else a = json_dumps(args, JSON_ENCODE_ANY);
    if (!a) {
        p->bad = true;
        return false;
    }
    add_call(p, d, json_string_value(name), json_string_length(name), a);
    free(a);
    return true;
}

/* Parses text as one call object or a list of them; all must parse or nothing is emitted. */
static bool emit_json(struct outp *p, const char *s, size_t n, struct outp_delta *d) {
    json_t *j = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    if (!j) return false;
    bool ok = true;
    if (json_is_object(j)) {
        ok = json_is_string(json_object_get(j, "name"));
    } else if (json_is_array(j) && json_array_size(j) > 0) {
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x) ok = ok && json_is_object(x) && json_is_string(json_object_get(x, "name"));
    } else {
        ok = false;
    }
    if (ok) {
        if (json_is_object(j)) {
            emit_obj(p, j, d);
        } else {
            size_t i;
            json_t *x;
            json_array_foreach(j, i, x) emit_obj(p, x, d);
        }
    }
    json_decref(j);
    return ok;
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Mistral: "[{...}, ...]" or "name[ARGS]{...}" (possibly several "[TOOL_CALLS]" parts). */
static bool emit_mistral(struct outp *p, const char *s, size_t n, struct outp_delta *d) {
    while (n && is_space(*s)) s++, n--;
    if (n && s[0] == '[') return emit_json(p, s, n, d);
    const char *a = memmem(s, n, "[ARGS]", 6);
    if (!a) return emit_json(p, s, n, d);
    size_t nlen = (size_t)(a - s);
    while (nlen && is_space(s[nlen - 1])) nlen--;
    const char *args = a + 6;
    size_t alen = n - (size_t)(args - s);
    json_t *j = json_loadb(args, alen, JSON_DECODE_ANY, NULL);
    if (!j || nlen == 0) {
        json_decref(j);
        return false;
    }
    char *txt = json_dumps(j, JSON_ENCODE_ANY);
    json_decref(j);
    if (!txt) return false;
    add_call(p, d, s, nlen, txt);
    free(txt);
    return true;
}

/* Llama 3: one JSON object, or several separated by ';'. */
static bool emit_llama3(struct outp *p, const char *s, size_t n, struct outp_delta *d) {
    if (emit_json(p, s, n, d)) return true;
    /* split on ';' between objects: try each piece; all must parse */
    struct outp_delta tmp = {0};
    size_t start = 0;
    bool ok = true;
    int pieces = 0;
    for (size_t i = 0; i <= n && ok; i++) {
        if (i == n || s[i] == ';') {
            const char *q = s + start;
            size_t m = i - start;
            while (m && is_space(*q)) q++, m--;
            if (m) {
                ok = emit_json(p, q, m, &tmp);
                pieces++;
            }
            start = i + 1;
        }
    }
    ok = ok && pieces > 1;
    if (ok) {
        for (int i = 0; i < tmp.n_calls; i++) {
            add_call(p, d, tmp.calls[i].name, strlen(tmp.calls[i].name), tmp.calls[i].arguments);
            p->n_calls_total--; /* counted twice */
        }
    } else {
        p->n_calls_total -= tmp.n_calls;
    }
    outp_delta_free(&tmp);
    return ok;
}

/* The call text that could not be parsed goes back as content, with its opening marker. */
static void call_as_content(struct outp *p, struct outp_delta *d) {
    if (p->syntax == OUTP_HERMES) jw_str(&d->content, HERMES_OPEN);
    else if (p->syntax == OUTP_MISTRAL) jw_str(&d->content, MISTRAL_OPEN);
    jw_raw(&d->content, p->call.p ? p->call.p : "", p->call.n);
    p->call.n = 0;
}

static const char *open_marker(enum outp_syntax s) {
    return s == OUTP_HERMES ? HERMES_OPEN : s == OUTP_MISTRAL ? MISTRAL_OPEN : NULL;
}

/* Runs the machine over pend. final: no more text will come. */
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
                    if (p->state == S_START) jw_raw(&d->content, b->p ? b->p : "", b->n);
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
                    p->state = S_CALL;
                    continue;
                }
                if (s[0] == '{') {
                    consume(b, w);
                    p->state = S_CALL;
                    continue;
                }
                if (prefix_of(s, n, PYTHON_TAG) && !final) return;
            }
            const char *om = open_marker(p->syntax);
            if (om && p->state == S_START && s[0] == '{') {
                consume(b, w);
                p->bare = true;
                p->call.n = 0;
                p->state = S_CALL;
                continue;
            }
            if (om && starts(s, n, om)) {
                consume(b, w + strlen(om));
                p->call.n = 0;
                p->state = S_CALL;
                continue;
            }
            if (om && prefix_of(s, n, om) && !final) return;
            /* content: from the first non-space byte after </think> or a call, else all */
            if (p->state == S_AFTER) consume(b, w);
            p->state = S_TEXT;
            continue;
        }
        case S_THINK: {
            const char *f = find(b, THINK_CLOSE);
            if (f) {
                size_t i = (size_t)(f - b->p);
                jw_raw(&d->reasoning, b->p, i);
                consume(b, i + strlen(THINK_CLOSE));
                p->state = S_AFTER;
                continue;
            }
            size_t keep = final ? 0 : partial(b, THINK_CLOSE);
            jw_raw(&d->reasoning, b->p ? b->p : "", b->n - keep);
            consume(b, b->n - keep);
            return;
        }
        case S_TEXT: {
            const char *om = open_marker(p->syntax);
            const char *f = om ? find(b, om) : NULL;
            if (f) {
                size_t i = (size_t)(f - b->p);
                /* whitespace right before a call is not content */
                size_t j = i;
                while (j > 0 && is_space(b->p[j - 1])) j--;
                jw_raw(&d->content, b->p, j);
                consume(b, i + strlen(om));
                p->call.n = 0;
                p->state = S_CALL;
                continue;
            }
            size_t keep = (final || !om) ? 0 : partial(b, om);
            /* hold trailing whitespace too while a call could follow */
            if (om && !final) {
                while (keep < b->n && is_space(b->p[b->n - keep - 1])) keep++;
            }
            jw_raw(&d->content, b->p ? b->p : "", b->n - keep);
            consume(b, b->n - keep);
            return;
        }
        case S_CALL: {
            jw_raw(&p->call, b->p ? b->p : "", b->n);
            b->n = 0;
            if (p->bare) {
                if (!final) return;
                if (!emit_llama3(p, p->call.p ? p->call.p : "", p->call.n, d))
                    jw_raw(&d->content, p->call.p ? p->call.p : "", p->call.n);
                p->call.n = 0;
                p->bare = false;
                p->state = S_AFTER;
                return;
            }
            if (p->syntax == OUTP_HERMES) {
                const char *f = find(&p->call, HERMES_CLOSE);
                if (f) {
                    size_t i = (size_t)(f - p->call.p);
                    size_t rest = p->call.n - i - strlen(HERMES_CLOSE);
                    bool ok = emit_json(p, p->call.p, i, d);
                    if (!ok) {
                        /* give it back as it was */
                        jw_str(&d->content, HERMES_OPEN);
                        jw_raw(&d->content, p->call.p, i + strlen(HERMES_CLOSE));
                    }
                    jw_raw(b, p->call.p + p->call.n - rest, rest);
                    p->call.n = 0;
                    p->state = S_AFTER;
                    continue;
                }
            } else if (p->syntax == OUTP_MISTRAL) {
                /* another [TOOL_CALLS] ends this call */
                const char *f = find(&p->call, MISTRAL_OPEN);
                if (f) {
                    size_t i = (size_t)(f - p->call.p);
                    size_t rest = p->call.n - i;
                    if (!emit_mistral(p, p->call.p, i, d)) {
                        jw_str(&d->content, MISTRAL_OPEN);
                        jw_raw(&d->content, p->call.p, i);
                    }
                    jw_raw(b, p->call.p + i, rest);
                    p->call.n = 0;
                    p->state = S_AFTER;
                    continue;
                }
            }
            if (!final) return;
            bool ok = p->syntax == OUTP_HERMES  ? emit_json(p, p->call.p, p->call.n, d)
                      : p->syntax == OUTP_MISTRAL ? emit_mistral(p, p->call.p, p->call.n, d)
                                                  : emit_llama3(p, p->call.p, p->call.n, d);
            if (!ok) call_as_content(p, d);
            p->call.n = 0;
            p->state = S_AFTER;
            return;
        }
        default:
            return;
        }
    }
}

void outp_push(struct outp *p, const char *s, size_t n, struct outp_delta *d) {
    if (p->syntax == OUTP_TOOLS_NONE && !p->reasoning && p->pend.n == 0) {
        jw_raw(&d->content, s, n); /* the common case: no parsing at all */
        return;
    }
    jw_raw(&p->pend, s, n);
    run(p, d, false);
    if (p->pend.oom || p->call.oom || d->content.oom || d->reasoning.oom) p->bad = true;
}

void outp_finish(struct outp *p, struct outp_delta *d) {
    run(p, d, true);
    if (p->pend.n) {
        jw_raw(p->state == S_THINK ? &d->reasoning : &d->content, p->pend.p, p->pend.n);
        p->pend.n = 0;
    }
}
