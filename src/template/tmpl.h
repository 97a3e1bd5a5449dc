/* Chat templates: a Jinja2-subset interpreter that renders a model's
 * `tokenizer.chat_template` the way Hugging Face's `apply_chat_template` does.
 *
 * HF renders with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True, extensions=[loopcontrols]) plus `raise_exception(msg)`,
 * `strftime_now(fmt)` and its own `tojson` (json.dumps, ensure_ascii=False). This engine
 * reproduces that byte for byte on the templates real models ship (see docs/templates.md
 * for what is supported and what differs).
 *
 * Life cycle: compile once (tmpl_compile), render many times (tmpl_render). A compiled
 * template is immutable: any number of threads may render it at once. A render never
 * writes to its context either, so one context may be shared too.
 *
 * Bounded: a render stops with SMELT_ERR_RANGE when it exceeds its output size, memory,
 * step (time) or recursion budget (struct tmpl_limits), so a hostile template cannot
 * crash, hang or exhaust the process.
 *
 * Errors name the construct and its position: "line 12 col 5: unknown filter 'foo'".
 *   SMELT_ERR_FORMAT       template syntax error (compile)
 *   SMELT_ERR_UNSUPPORTED  a valid jinja2 construct this engine does not implement
 *   SMELT_ERR_INVALID      the template failed for this input: raise_exception() (the
 *                          message is "...: raise_exception: <the template's message>"),
 *                          an undefined value used, a type error, ...
 *   SMELT_ERR_RANGE        a budget was exceeded
 *   SMELT_ERR_NOMEM        allocation failed
 */
#ifndef SMELT_TEMPLATE_TMPL_H
#define SMELT_TEMPLATE_TMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "util/err.h"

struct tmpl;       /* a compiled template (opaque, immutable) */
struct tmpl_value; /* a context value: a tree built by the caller (opaque) */

/* Compiles template source (UTF-8, len bytes). On error *out is NULL and e says where. */
smelt_status tmpl_compile(const char *src, size_t len, struct tmpl **out, struct err *e);
void tmpl_free(struct tmpl *t);

/* Budgets of one render. Zero fields take the defaults below. */
struct tmpl_limits {
    size_t max_output;    /* bytes of rendered text (default 16 MiB) */
    size_t max_alloc;     /* bytes allocated over the whole render (default 256 MiB) */
    uint64_t max_steps;   /* evaluated nodes + loop iterations (default 50 M, ~1 s) */
    uint32_t max_depth;   /* nested macro / recursive-loop calls (default 256) */
    size_t max_stack;     /* bytes of C stack a render may use (default 1 MiB): run renders
                           * on threads with at least twice that */
};

struct tmpl_opts {
    struct tmpl_limits limits;
    /* strftime_now() reads this time (Unix seconds, formatted as UTC) when has_now is
     * set, else the wall clock in local time (as Python's datetime.now()). */
    bool has_now;
    int64_t now;
};

/* Renders t with the variables of ctx (a dict value, or NULL for none). On success
 * *out is a malloc'd NUL-terminated string of *out_len bytes (free() it). opts may be
 * NULL for the defaults. */
smelt_status tmpl_render(const struct tmpl *t, const struct tmpl_value *ctx,
                         const struct tmpl_opts *opts, char **out, size_t *out_len,
                         struct err *e);

/* ---- Context values ----
 * A context is a tree: each value has one owner (its parent, or the caller for the
 * root). Setters take ownership of the value they are given, even on failure. */
struct tmpl_value *tmpl_value_from_json(const json_t *j, struct err *e);
struct tmpl_value *tmpl_value_new_dict(void);
struct tmpl_value *tmpl_value_new_list(void);
struct tmpl_value *tmpl_value_new_str(const char *s, size_t len);
struct tmpl_value *tmpl_value_new_int(int64_t v);
struct tmpl_value *tmpl_value_new_float(double v);
struct tmpl_value *tmpl_value_new_bool(bool v);
struct tmpl_value *tmpl_value_new_none(void);
/* Sets key (NUL-terminated) in a dict value, replacing an existing entry. */
smelt_status tmpl_dict_set(struct tmpl_value *dict, const char *key, struct tmpl_value *v,
                           struct err *e);
/* Appends to a list value. */
smelt_status tmpl_list_push(struct tmpl_value *list, struct tmpl_value *v, struct err *e);
void tmpl_value_free(struct tmpl_value *v);

/* Builds the context Hugging Face passes to a chat template:
 *   messages, tools (None when NULL), documents (None), add_generation_prompt,
 *   bos_token, eos_token (None when NULL), then every key of extra (a JSON object such as
 *   {"enable_thinking": false}, or NULL), which may override the ones before. */
smelt_status tmpl_chat_ctx(const json_t *messages, const json_t *tools,
                           bool add_generation_prompt, const char *bos_token,
                           const char *eos_token, const json_t *extra,
                           struct tmpl_value **out, struct err *e);

/* The template used when a model ships none: ChatML (see docs/templates.md). */
const char *tmpl_default_source(void);

#endif
