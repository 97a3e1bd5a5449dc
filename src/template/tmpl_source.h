/* A model's chat templates, found the same way by every command that renders chats
 * (serve, template):
 *   - FILE (--chat-template / --template) when given: it replaces the model's templates;
 *   - else the GGUF's tokenizer.chat_template;
 *   - else the ChatML default (tmpl_default_source(), docs/templates.md): `fallback` is
 *     set so the caller can say so (once) and add the BOS the default does not write.
 * Named templates: a GGUF may carry tokenizer.chat_template.<name> (gguf-py writes the
 * names into tokenizer.chat_templates). The one named "tool_use" is what transformers
 * renders when a chat passes tools; it is loaded when present (never with FILE). */
#ifndef SMELT_TEMPLATE_TMPL_SOURCE_H
#define SMELT_TEMPLATE_TMPL_SOURCE_H

#include <stdbool.h>
#include <stddef.h>

#include "util/err.h"

struct gguf_file;

struct tmpl_sources {
    char *src;      /* the default template's source (malloc'd, NUL-terminated) */
    size_t len;
    bool fallback;  /* src is the ChatML default: the model has no template */
    char *tool_use; /* tokenizer.chat_template.tool_use (malloc'd), or NULL */
    size_t tool_use_len;
};

/* Fills t from file (may be NULL) or the model f (may be NULL when file is given). A
 * template key of the wrong type is an error that names it. */
smelt_status tmpl_sources_load(struct tmpl_sources *t, const struct gguf_file *f,
                                     const char *file, struct err *e);
void tmpl_sources_free(struct tmpl_sources *t);

#endif
