/* Chat output parsing: the model's text -> reasoning_content, content and tool_calls,
 * incrementally (for streams) or all at once (the same code, one push).
 *
 * Reasoning: text between <think> and </think> is reasoning. A reply may open with
 * <think> itself, or the prompt may already have opened it (the template ended the
 * generation prompt with "<think>", as Qwen3 and DeepSeek-R1 templates do): then the reply
 * starts inside the reasoning.
 *
 * Tool calls, by syntax (picked from the chat template):
 *   hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, repeated (Qwen 2.5/3,
 *            Hermes, many others)
 *   mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or
 *            [TOOL_CALLS]name[ARGS]{...} (newer Mistral tokenizers), repeated
 *   llama3   the whole reply is {"name": ..., "parameters": {...}} (optionally after
 *            <|python_tag|>), or several such objects separated by ";"
 * With hermes and mistral, a reply that is nothing but a JSON call object (small models
 * often drop the tags) is taken as a call too; if it does not parse, it is content.
 * Text before a call is content. A call's text is held until it is complete, then comes
 * out as one tool_calls delta (name and the arguments as a JSON string, OpenAI's shape).
 * Text that only might begin a marker ("<tool_" at the end of a delta) is held back until
 * the next push decides. A call that does not parse as JSON is given back as content.
 */
#ifndef SMELT_SERVER_OUTP_H
#define SMELT_SERVER_OUTP_H

#include <stdbool.h>
#include <stddef.h>

#include "server/jw.h"

enum outp_syntax {
    OUTP_TOOLS_NONE = 0, /* no tool parsing */
    OUTP_HERMES = 1,
    OUTP_MISTRAL = 2,
    OUTP_LLAMA3 = 3,
};

/* The syntax a chat template's source uses (OUTP_HERMES when it says nothing). */
enum outp_syntax outp_syntax_of(const char *tmpl_src);
/* Whether the template produces <think> reasoning. */
bool outp_template_reasons(const char *tmpl_src);

struct outp_call {
    char *name;      /* malloc'd */
    char *arguments; /* malloc'd JSON text of the arguments object */
};

/* What one push produced. Reset by the caller (outp_delta_clear) before each push. */
struct outp_delta {
    struct jw content, reasoning;
    struct outp_call *calls; /* new complete calls */
    int n_calls, cap_calls;
};
void outp_delta_clear(struct outp_delta *d);
void outp_delta_free(struct outp_delta *d);

struct outp {
    enum outp_syntax syntax;
    bool reasoning;     /* look for <think> */
    int state;          /* internal */
    bool at_start;      /* nothing but whitespace seen yet */
    struct jw pend;     /* text not yet classified */
    struct jw call;     /* text of the tool call being read */
    int n_calls_total;
    bool bare;          /* the call is a bare JSON reply (no marker) */
    bool bad;           /* allocation failure */
};

/* syntax: OUTP_TOOLS_NONE when the request has no tools (or tool_choice none).
 * in_reasoning: the prompt opened <think>. */
void outp_init(struct outp *p, enum outp_syntax syntax, bool reasoning, bool in_reasoning);
void outp_free(struct outp *p);
/* Feeds text; appends what it decided to d. */
void outp_push(struct outp *p, const char *s, size_t n, struct outp_delta *d);
/* End of the reply: everything held is decided (an unfinished call becomes content). */
void outp_finish(struct outp *p, struct outp_delta *d);

#endif
