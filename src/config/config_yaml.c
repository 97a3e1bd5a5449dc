/* The config file layer: a YAML document (libyaml's loader) into struct cfg (config.h).
 *
 * The document is a mapping of setting keys to values, plus `models:`, a list of mappings
 * (one model each). A scalar is read by its style: a plain one (8080, true, text) may be a
 * number or a boolean, a quoted one ("8080") is a string only, so a quoted number for a
 * number key is a wrong type, not a silent conversion. `~`, `null` and an empty value mean
 * "not set here". Lists take a YAML list of strings or one string.
 *
 * The file is untrusted text (fuzz/fuzz_config.c): at most 1 MiB, one document, and the
 * walk reads only the depths the format has (a mapping of scalars and lists; models: a list
 * of such mappings), so aliases, deep nesting or huge lists cannot make it loop or recurse.
 * Every refusal names the file, the line and the key. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config/config.h"
#include "util/log.h"

#define MAX_FILE (1u << 20)
#define MAX_MODELS 1024
#define MAX_ITEMS 256

struct ydoc {
    struct cfg *c;
    yaml_document_t *doc;
    const char *name; /* for messages */
};

static uint32_t line_of(const yaml_node_t *n) { return (uint32_t)n->start_mark.line + 1; }

static const char *node_kind(const yaml_node_t *n) {
    return n->type == YAML_SEQUENCE_NODE ? "a list" : n->type == YAML_MAPPING_NODE ? "a mapping" : "a scalar";
}

/* The scalar's text, NUL-terminated by libyaml; false when it holds a NUL. */
static bool scalar_text(const yaml_node_t *n, const char **s) {
    *s = (const char *)n->data.scalar.value;
    return strlen(*s) == n->data.scalar.length;
}

/* ~, null, or nothing: "not set here". */
static bool is_null(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *s = (const char *)n->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

/* A key for a message: escaped, cut short. */
static const char *key_text(const char *s, char *buf, size_t n) {
    log_escape(buf, n > 64 ? 64 : n, s, strlen(s));
    return buf;
}

/* Levenshtein distance of a and b, capped at 4 (a "did you mean" hint). */
static int distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40) return 4;
    int row[41];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int prev = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cur = row[j];
            int best = prev + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            prev = cur;
        }
    }
    return row[lb] < 4 ? row[lb] : 4;
}

/* " (did you mean 'port'?)" for the nearest key of cmd, or "". */
static void suggest(const struct cfg *c, const char *key, char *buf, size_t n) {
    int best = 3, bk = -1;
    for (int k = 0; k < CFG_N; k++) {
        if (!(cfg_defs[k].where & c->cmd)) continue;
        int d = distance(key, cfg_defs[k].key);
        if (d < best) best = d, bk = k;
    }
    if (bk >= 0) snprintf(buf, n, " (did you mean '%s'?)", cfg_defs[bk].key);
    else buf[0] = 0;
}

/* Reads value node v of key k into *out (where: "" or "models[2]: " for messages). */
static smelt_status read_value(struct ydoc *y, int k, yaml_node_t *v, struct cfg_val *out,
                               const char *where, struct err *e) {
    const struct cfg_def *d = &cfg_defs[k];
    struct cfg_val nv = {0};
    char why[768];
    if (d->type == CFG_LIST && v->type == YAML_SEQUENCE_NODE) {
        yaml_node_item_t *it = v->data.sequence.items.start, *top = v->data.sequence.items.top;
        if (top - it > MAX_ITEMS)
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %s%s: more than %d items", y->name,
                           line_of(v), where, d->key, MAX_ITEMS);
        nv.list = calloc((size_t)(top - it) + 1, sizeof *nv.list);
        if (!nv.list) return err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", y->name);
        for (; it < top; it++) {
            yaml_node_t *x = yaml_document_get_node(y->doc, *it);
            const char *s;
            if (!x || x->type != YAML_SCALAR_NODE || is_null(x) || !scalar_text(x, &s)) {
                smelt_status st = err_set(e, SMELT_ERR_INVALID, "%s:%u: %s%s: expected a list of "
                                          "strings, got %s", y->name, x ? line_of(x) : line_of(v),
                                          where, d->key, !x ? "nothing" : x->type != YAML_SCALAR_NODE
                                          ? node_kind(x) : is_null(x) ? "null" : "a NUL byte");
                for (int i = 0; i < nv.n_list; i++) free(nv.list[i]);
                free(nv.list);
                return st;
            }
            if (!(nv.list[nv.n_list] = strdup(s))) {
                for (int i = 0; i < nv.n_list; i++) free(nv.list[i]);
                free(nv.list);
                return err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", y->name);
            }
            nv.n_list++;
        }
        nv.set = true;
    } else {
        const char *s;
        if (v->type != YAML_SCALAR_NODE)
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %s%s: expected %s, got %s", y->name,
                           line_of(v), where, d->key,
                           d->type == CFG_LIST ? "a string or a list of strings" : "a single value",
                           node_kind(v));
        if (!scalar_text(v, &s))
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %s%s: the value holds a NUL byte",
                           y->name, line_of(v), where, d->key);
        bool plain = v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        bool text_ok = plain || d->type == CFG_STR || d->type == CFG_ENUM || d->type == CFG_LIST;
        if (!cfg_parse_value(d, s, text_ok, &nv, why, sizeof why))
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %s%s: %s", y->name, line_of(v), where,
                           d->key, why);
    }
    nv.src = CFG_SRC_FILE;
    nv.line = line_of(v);
    *out = nv;
    return SMELT_OK;
}

/* One mapping of settings: the document's root (entry NULL) or a models: entry. */
static smelt_status read_mapping(struct ydoc *y, yaml_node_t *map, struct cfg_entry *entry,
                                 int index, struct err *e) {
    struct cfg *c = y->c;
    char where[32] = "", kb[96], hint[64];
    if (entry) snprintf(where, sizeof where, "models[%d]: ", index);
    bool seen[CFG_N] = {0};
    bool seen_models = false;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(y->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(y->doc, p->value);
        const char *key;
        if (!kn || !vn) return err_set(e, SMELT_ERR_INVALID, "%s: a broken mapping", y->name);
        if (kn->type != YAML_SCALAR_NODE || !scalar_text(kn, &key))
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %sa key must be a plain name, got %s",
                           y->name, line_of(kn), where, node_kind(kn));
        if (!entry && !strcmp(key, "models")) {
            if (seen_models)
                return err_set(e, SMELT_ERR_INVALID, "%s:%u: models: given twice", y->name,
                               line_of(kn));
            seen_models = true;
            if (is_null(vn)) continue;
            if (vn->type != YAML_SEQUENCE_NODE)
                return err_set(e, SMELT_ERR_INVALID, "%s:%u: models: expected a list of models "
                               "(each a mapping with model:, name:, ...), got %s", y->name,
                               line_of(vn), node_kind(vn));
            yaml_node_item_t *it = vn->data.sequence.items.start, *top = vn->data.sequence.items.top;
            if (top - it > MAX_MODELS)
                return err_set(e, SMELT_ERR_INVALID, "%s:%u: models: more than %d", y->name,
                               line_of(vn), MAX_MODELS);
            c->models = calloc((size_t)(top - it) + 1, sizeof *c->models);
            if (!c->models) return err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", y->name);
            for (int i = 0; it < top; it++, i++) {
                yaml_node_t *m = yaml_document_get_node(y->doc, *it);
                if (!m || m->type != YAML_MAPPING_NODE)
                    return err_set(e, SMELT_ERR_INVALID, "%s:%u: models[%d]: expected a mapping "
                                   "(model:, name:, ...), got %s", y->name,
                                   m ? line_of(m) : line_of(vn), i, m ? node_kind(m) : "nothing");
                c->models[i].line = line_of(m);
                c->n_models = i + 1;
                smelt_status st = read_mapping(y, m, &c->models[i], i, e);
                if (st != SMELT_OK) return st;
                const struct cfg_val *mv = &c->models[i].v[CFG_MODEL];
                if (!mv->set || mv->n_list != 1)
                    return err_set(e, SMELT_ERR_INVALID, "%s:%u: models[%d]: model: %s", y->name,
                                   mv->set ? mv->line : line_of(m), i,
                                   mv->set ? "one model (a path or a reference) per entry"
                                           : "missing (the GGUF file or org/repo[:quant])");
            }
            continue;
        }
        int k = cfg_find(key);
        if (k < 0 || !(cfg_defs[k].where & c->cmd)) {
            suggest(c, key, hint, sizeof hint);
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %sunknown key '%s'%s", y->name,
                           line_of(kn), where, key_text(key, kb, sizeof kb), hint);
        }
        unsigned w = cfg_defs[k].where;
        if (entry && !(w & (CFG_PER_MODEL | CFG_ENTRY)) && k != CFG_MODEL)
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %s%s: a server-wide setting, not a "
                           "model's (put it at the top level)", y->name, line_of(kn), where, key);
        if (!entry && (w & CFG_ENTRY))
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %s: a setting of a models: entry, not "
                           "a top-level one", y->name, line_of(kn), key);
        if (seen[k])
            return err_set(e, SMELT_ERR_INVALID, "%s:%u: %s%s: given twice", y->name, line_of(kn),
                           where, key);
        seen[k] = true;
        if (is_null(vn)) continue;
        struct cfg_val nv;
        smelt_status st = read_value(y, k, vn, &nv, where, e);
        if (st != SMELT_OK) return st;
        struct cfg_val *dst = entry ? &entry->v[k] : &c->v[k];
        free(dst->s);
        for (int i = 0; i < dst->n_list; i++) free(dst->list[i]);
        free(dst->list);
        *dst = nv;
    }
    return SMELT_OK;
}

smelt_status cfg_load_yaml(struct cfg *c, const char *name, const char *text, size_t n,
                           struct err *e) {
    if (n > MAX_FILE)
        return err_set(e, SMELT_ERR_INVALID, "%s: %zu bytes: a config file is at most %u",
                       name, n, MAX_FILE);
    if (c->n_models)
        return err_set(e, SMELT_ERR_INVALID, "%s: a second config file", name);
    yaml_parser_t p;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&p)) return err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", name);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, n);
    smelt_status st = SMELT_OK;
    if (!yaml_parser_load(&p, &doc)) {
        st = err_set(e, SMELT_ERR_INVALID, "%s:%zu: YAML: %s%s%s", name, p.problem_mark.line + 1,
                     p.problem ? p.problem : "malformed", p.context ? " " : "",
                     p.context ? p.context : "");
        yaml_parser_delete(&p);
        return st;
    }
    struct ydoc y = {c, &doc, name};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && !is_null(root)) {
        if (root->type != YAML_MAPPING_NODE)
            st = err_set(e, SMELT_ERR_INVALID, "%s:%u: expected a mapping of settings (key: "
                         "value), got %s", name, line_of(root), node_kind(root));
        else
            st = read_mapping(&y, root, NULL, 0, e);
    }
    yaml_document_delete(&doc);
    if (st == SMELT_OK && root) { /* one document only */
        yaml_document_t more;
        if (!yaml_parser_load(&p, &more)) {
            st = err_set(e, SMELT_ERR_INVALID, "%s:%zu: YAML: %s", name, p.problem_mark.line + 1,
                         p.problem ? p.problem : "malformed");
        } else {
            if (yaml_document_get_root_node(&more))
                st = err_set(e, SMELT_ERR_INVALID, "%s:%zu: a second YAML document: a config "
                             "file holds one", name, p.mark.line + 1);
            yaml_document_delete(&more);
        }
    }
    yaml_parser_delete(&p);
    if (st == SMELT_OK && !c->file && !(c->file = strdup(name)))
        st = err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", name);
    return st;
}

smelt_status cfg_load_file(struct cfg *c, const char *path, struct err *e) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(e, errno == ENOENT ? SMELT_ERR_NOT_FOUND : SMELT_ERR_IO, "--config %s: %s",
                       path, strerror(errno));
    char *buf = malloc(MAX_FILE + 1);
    size_t n = buf ? fread(buf, 1, MAX_FILE + 1, f) : 0;
    bool bad = buf && ferror(f);
    fclose(f);
    if (!buf) return err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", path);
    if (bad) {
        free(buf);
        return err_set(e, SMELT_ERR_IO, "%s: a read error", path);
    }
    smelt_status st = cfg_load_yaml(c, path, buf, n, e);
    free(buf);
    return st;
}
