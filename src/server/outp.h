/* Chat output parsing: the model's text -> reasoning_content, content and tool calls,
 * incrementally (for streams) or all at once (the same code, one push), so a stream and a
 * whole response always decide the same thing.
 *
 * Reasoning: text between <think> and </think> is reasoning. A reply may open with
 * <think> itself, or the prompt may already have opened it (the template ended the
 * generation prompt with "<think>", as Qwen3 and DeepSeek-R1 templates do): then the reply
 * starts inside the reasoning.
 *
 * Tool calls, by syntax (picked from the chat template):
 *   hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, repeated (Qwen 2.5/3,
 *            Hermes, many others); a list of call objects inside one tag is accepted too
 *   mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or
 *            [TOOL_CALLS]name[ARGS]{...} (newer Mistral tokenizers), repeated
 *   llama3   the reply is {"name": ..., "parameters": {...}} (optionally after
 *            <|python_tag|>), or several such objects separated by ";"
 *   qwen_xml <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
 *            </function>\n</tool_call>, repeated (Qwen3-Coder, Qwen3.5, Nemotron 3); a
 *            Hermes JSON object inside the tag is read as hermes reads it
 *   harmony  gpt-oss's messages: <|channel|>analysis<|message|>...<|end|> is reasoning,
 *            <|start|>assistant<|channel|>final<|message|>... content, and a message to a
 *            recipient (<|start|>assistant to=functions.NAME<|channel|>commentary
 *            <|constrain|>json<|message|>{...}) a call of NAME, its body the arguments; the
 *            syntax is the whole reply format, so it applies with or without tools
 * With hermes, mistral and qwen_xml, a reply that is nothing but a JSON call object (small models
 * often drop the tags) is taken as a call too: it is held to the end and is content
 * unless the whole reply parses as a call.
 *
 * Calls come out incrementally, as OpenAI streams them: a call's first piece carries its
 * index and name (and "" arguments) as soon as the name is complete; later pieces carry
 * the arguments text as it arrives. The arguments are the JSON text of the "arguments"
 * (or "parameters") value as the model wrote it (a JSON string value is given decoded, a
 * missing or null one is "{}"); concatenating a call's pieces gives them whole. Pieces
 * never split a UTF-8 character.
 *
 * qwen_xml has no JSON to pass on: the parser writes the arguments object itself, one
 * "KEY": VALUE member per parameter. A parameter whose schema type (in the request's tools)
 * is "string", or that has no schema, is a JSON string: its text less the one newline the
 * template writes on each side; it streams as it arrives. Any other parameter is written
 * when its </parameter> arrives: its trimmed text as is when that is JSON (a number, true,
 * an object, ...; Python's True / False / None, which the templates write for booleans and
 * null, become JSON's), else as a string. So the arguments are always one valid JSON object,
 * closed even when the reply is cut off. A value ends only at </parameter>.
 *
 * Until a call's name is complete, its text is held: if it turns out not to be a call
 * ("<tool_call>" followed by something that is not a call object), it is given back as
 * content, marker included. Once the name is out the call is committed: a malformed or
 * cut-off rest only makes its arguments invalid JSON (OpenAI documents that arguments
 * may not be valid JSON). Text that only might begin a marker ("<tool_" at the end of a
 * push) is held back until the next push decides.
 *
 * Prefill (tool_choice "required" or a named function): the server ends the prompt with
 * the opening of a call (outp_force_prefix) and feeds the same text to the parser first
 * (outp_prefill), so the parser reads a well-formed call; text that came from the prefill
 * is never given back as content.
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
    OUTP_QWEN_XML = 4,
    OUTP_HARMONY = 5,
};

/* The syntax a chat template's source uses (OUTP_HERMES when it says nothing). */
enum outp_syntax outp_syntax_of(const char *tmpl_src);
/* Whether the template shows which syntax it uses (a call marker of a known family), so
 * that a call can be forced by prefilling its opening. */
bool outp_syntax_known(const char *tmpl_src);
/* Whether the template renders the request's tools at all. */
bool outp_template_has_tools(const char *tmpl_src);
/* Whether the template produces reasoning (<think>, or harmony's analysis channel). */
bool outp_template_reasons(const char *tmpl_src);
/* Whether the template writes the harmony format (gpt-oss): its replies are parsed with
 * OUTP_HARMONY whether or not the request has tools. */
bool outp_template_harmony(const char *tmpl_src);
/* The text that opens a forced call in syntax s of template tmpl_src: any function when
 * name is NULL (tool_choice "required"), else that one. malloc'd; NULL on OOM or for
 * OUTP_TOOLS_NONE. */
char *outp_force_prefix(enum outp_syntax s, const char *tmpl_src, const char *name);
/* Whether a call of function `name` can be written in syntax s (qwen_xml writes the name
 * bare between "<function=" and ">"). */
bool outp_force_ok(enum outp_syntax s, const char *name);

/* One piece of a tool call. */
struct outp_call {
    int index;      /* the call's position in the reply: 0, 1, ... */
    char *name;     /* the call's first piece: its name (malloc'd); NULL on later pieces */
    struct jw args; /* later pieces: the next part of the arguments text ("" on the first) */
};

/* What one push produced. Reset by the caller (outp_delta_clear) before each push. */
struct outp_delta {
    struct jw content, reasoning;
    struct outp_call *calls; /* call pieces, in order */
    int n_calls;
    size_t cap_calls;
};
void outp_delta_clear(struct outp_delta *d);
void outp_delta_free(struct outp_delta *d);

struct outp {
    enum outp_syntax syntax;
    bool reasoning;     /* look for <think> */
    int max_calls;      /* > 0: text after this many calls is dropped */
    bool no_calls;      /* harmony: the request has no tools, so a message to a recipient
                         * is content, not a call */
    const struct json_t *tools; /* the request's tools (borrowed; may be NULL): qwen_xml
                                 * reads the parameters' schema types there */
    int state, cs;      /* internal: the text state, the call scanner's state */
    struct jw pend;     /* text not yet classified */
    struct jw call;     /* text of a call region whose name is not out yet (given back) */
    struct jw gap;      /* the whitespace before that region's marker (given back first) */
    struct jw key;      /* the object key being read */
    struct jw name;     /* the name being read (JSON string text, unquoted); harmony: the
                         * header being read */
    struct jw hold;     /* arguments read before the name, or a string / scalar value */
    struct jw args;     /* arguments not emitted yet (an incomplete UTF-8 character) */
    const char *marker; /* the marker that opened the call region (NULL: bare) */
    int n_calls_total;  /* calls committed */
    int depth;          /* nesting inside the value being scanned */
    int vkind, vnext;   /* value kind (container / string / scalar), state after it;
                         * harmony: where the current body goes */
    bool in_str, esc;   /* JSON string scanning */
    bool key_long;      /* the key was longer than any we look for */
    bool list;          /* inside a [ ... ] list of call objects */
    bool committed;     /* the current call's name is out */
    bool have_args;     /* the current call's arguments were read */
    bool skipping;      /* the value being scanned is discarded */
    bool prefilling;    /* inside outp_prefill */
    bool hide_marker;   /* the region's marker came from the prefill */
    size_t hide;        /* bytes at the start of `call` that came from the prefill */
    size_t text_skip;   /* harmony: bytes at the start of `pend` read as text whatever they
                         * are (the channel tag that opened a header too long to be one) */
    bool bad;           /* allocation failure */
    /* qwen_xml */
    const struct json_t *xprops; /* the current call's "properties" schema (NULL: unknown) */
    int xn;                      /* parameters written in the current call */
    bool xjson;                  /* this region holds a JSON call (read as hermes) */
    bool xstr;                   /* the current parameter is a string (streamed) */
    bool xstarted;               /* the current parameter's value has begun */
};

/* syntax: OUTP_TOOLS_NONE when the request has no tools (or tool_choice none).
 * in_reasoning: the prompt opened <think>. */
void outp_init(struct outp *p, enum outp_syntax syntax, bool reasoning, bool in_reasoning);
void outp_free(struct outp *p);
/* Feeds text; appends what it decided to d. */
void outp_push(struct outp *p, const char *s, size_t n, struct outp_delta *d);
/* Feeds text that the server wrote at the end of the prompt (not the model's): it opens a
 * call like model text would, but is never given back as content. */
void outp_prefill(struct outp *p, const char *s, size_t n, struct outp_delta *d);
/* End of the reply: everything held is decided (an unfinished call that has no name yet
 * becomes content; one that has keeps the arguments it got). */
void outp_finish(struct outp *p, struct outp_delta *d);

#endif
