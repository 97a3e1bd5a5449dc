/* Finding a model's chat templates: see tmpl_source.h. */
#include "template/tmpl_source.h"

#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "template/tmpl.h"
#include "util/file.h"

#define TOOL_USE_KEY "tokenizer.chat_template.tool_use"

/* The string at key: SMELT_OK with *out NULL when the key is absent. */
static smelt_status gguf_text(const struct gguf_file *f, const char *key, char **out,
                              size_t *len, struct err *e) {
    *out = NULL;
    *len = 0;
    if (!f || !gguf_get(f, key)) return SMELT_OK;
    struct gguf_str s;
    smelt_status st = gguf_get_str(f, key, &s, e);
    if (st != SMELT_OK) return err_prefix(e, "%s", key);
    *out = malloc(s.len + 1);
    if (!*out) return err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", key);
    memcpy(*out, s.ptr, s.len);
    (*out)[s.len] = 0;
    *len = s.len;
    return SMELT_OK;
}

smelt_status tmpl_sources_load(struct tmpl_sources *t, const struct gguf_file *f,
                                     const char *file, struct err *e) {
    memset(t, 0, sizeof *t);
    smelt_status st;
    if (file) return file_read_all(file, &t->src, &t->len, e);
    st = gguf_text(f, "tokenizer.chat_template", &t->src, &t->len, e);
    if (st == SMELT_OK) st = gguf_text(f, TOOL_USE_KEY, &t->tool_use, &t->tool_use_len, e);
    if (st == SMELT_OK && !t->src) {
        const char *d = tmpl_default_source();
        t->len = strlen(d);
        t->src = strdup(d);
        t->fallback = true;
        if (!t->src) st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
    }
    if (st != SMELT_OK) tmpl_sources_free(t);
    return st;
}

void tmpl_sources_free(struct tmpl_sources *t) {
    free(t->src);
    free(t->tool_use);
    memset(t, 0, sizeof *t);
}
