/* Settings: values, the environment and command-line layers, --help and `smelt config`
 * (config.h). The YAML file layer is config_yaml.c. */
#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/log.h"

/* ---- values ---- */

static void val_clear(struct cfg_val *v) {
    free(v->s);
    for (int i = 0; i < v->n_list; i++) free(v->list[i]);
    free(v->list);
    memset(v, 0, sizeof *v);
}

void cfg_free(struct cfg *c) {
    if (!c) return;
    for (int k = 0; k < CFG_N; k++) val_clear(&c->v[k]);
    for (int m = 0; m < c->n_models; m++)
        for (int k = 0; k < CFG_N; k++) val_clear(&c->models[m].v[k]);
    free(c->models);
    free(c->file);
    memset(c, 0, sizeof *c);
}

/* Client-chosen text quoted for a message: escaped (log_escape), at most ~60 bytes. */
static const char *quoted(const char *s, char *buf, size_t n) {
    size_t len = strlen(s);
    size_t w = log_escape(buf, n > 64 ? 64 : n, s, len);
    if (w < len && w + 4 <= n) memcpy(buf + w, "...", 4);
    return buf;
}

static bool parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *out = true, true;
        if (!strcasecmp(s, no[i])) return *out = false, true;
    }
    return false;
}

static bool in_range(const struct cfg_def *d, double x) {
    return (d->lo_open ? x > d->lo : x >= d->lo) && x <= d->hi;
}

static void range_text(const struct cfg_def *d, char *buf, size_t n) {
    snprintf(buf, n, "%s%.15g, %.15g]", d->lo_open ? "(" : "[", d->lo, d->hi);
}

bool cfg_parse_value(const struct cfg_def *d, const char *text, bool text_ok, struct cfg_val *v,
                     char *why, size_t nwhy) {
    char q[128], r[96];
    val_clear(v);
    switch (d->type) {
    case CFG_BOOL:
        if (text_ok && parse_bool(text, &v->b)) break;
        snprintf(why, nwhy, "expected true or false, got %s%s%s", text_ok ? "'" : "a quoted string",
                 text_ok ? quoted(text, q, sizeof q) : "", text_ok ? "'" : "");
        return false;
    case CFG_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(text, &end, 10);
        bool ok = text_ok && *text && !*end && !errno;
        if (text_ok && *text && (*end || errno)) { /* 1e6, 8080.0: integral values of a number */
            double dx = strtod(text, &end);
            ok = !*end && isfinite(dx) && dx == floor(dx) && fabs(dx) < 9.2e18;
            x = ok ? (long long)dx : 0;
        }
        if (!ok) {
            snprintf(why, nwhy, "expected an integer, got %s%s%s", text_ok ? "'" : "a quoted string",
                     text_ok ? quoted(text, q, sizeof q) : "", text_ok ? "'" : "");
            return false;
        }
        if (!in_range(d, (double)x)) {
            range_text(d, r, sizeof r);
            snprintf(why, nwhy, "%lld is out of range %s: %s", x, r, d->help);
            return false;
        }
        v->i = x;
        break;
    }
    case CFG_NUM: {
        char *end;
        double x = text_ok ? strtod(text, &end) : 0;
        if (!text_ok || !*text || *end || !isfinite(x)) {
            snprintf(why, nwhy, "expected a number, got %s%s%s", text_ok ? "'" : "a quoted string",
                     text_ok ? quoted(text, q, sizeof q) : "", text_ok ? "'" : "");
            return false;
        }
        if (!in_range(d, x)) {
            range_text(d, r, sizeof r);
            snprintf(why, nwhy, "%s is out of range %s: %s", quoted(text, q, sizeof q), r, d->help);
            return false;
        }
        v->d = x;
        break;
    }
    case CFG_ENUM: {
        const char *c = d->choices;
        size_t n = strlen(text);
        bool hit = false;
        while (*c && !hit) {
            size_t m = strcspn(c, "|");
            hit = m == n && !strncmp(c, text, n);
            c += m + (c[m] == '|');
        }
        if (!hit) {
            snprintf(why, nwhy, "expected one of %s, got '%s'", d->choices, quoted(text, q, sizeof q));
            return false;
        }
    }
    /* fall through */
    case CFG_STR:
        if (!(v->s = strdup(text))) {
            snprintf(why, nwhy, "out of memory");
            return false;
        }
        break;
    case CFG_LIST:
        v->list = malloc(sizeof *v->list);
        if (!v->list || !(v->list[0] = strdup(text))) {
            free(v->list);
            v->list = NULL;
            snprintf(why, nwhy, "out of memory");
            return false;
        }
        v->n_list = 1;
        break;
    }
    v->set = true;
    return true;
}

/* Appends the items of b to a's list (b's strings move to a). */
static bool list_append(struct cfg_val *a, struct cfg_val *b) {
    char **l = realloc(a->list, (size_t)(a->n_list + b->n_list) * sizeof *l + 1);
    if (!l) return false;
    memcpy(l + a->n_list, b->list, (size_t)b->n_list * sizeof *l);
    a->list = l;
    a->n_list += b->n_list;
    free(b->list);
    b->list = NULL;
    b->n_list = 0;
    return true;
}

smelt_status cfg_init(struct cfg *c, unsigned cmd, const char *cmd_name, struct err *e) {
    memset(c, 0, sizeof *c);
    c->cmd = cmd;
    c->cmd_name = cmd_name;
    for (int k = 0; k < CFG_N; k++) {
        const struct cfg_def *d = &cfg_defs[k];
        char why[256];
        if (!(d->where & cmd) || !d->def) continue;
        if (!cfg_parse_value(d, d->def, true, &c->v[k], why, sizeof why)) {
            cfg_free(c);
            return err_set(e, SMELT_ERR_INTERNAL, "the default of %s: %s", d->key, why);
        }
    }
    return SMELT_OK;
}

const struct cfg_val *cfg_get(const struct cfg *c, int model, enum cfg_key k) {
    if (model >= 0 && model < c->n_models && c->models[model].v[k].set) return &c->models[model].v[k];
    return &c->v[k];
}

bool cfg_has(const struct cfg *c, int model, enum cfg_key k) { return cfg_get(c, model, k)->set; }
bool cfg_bool(const struct cfg *c, int model, enum cfg_key k) { return cfg_get(c, model, k)->b; }
int64_t cfg_int(const struct cfg *c, int model, enum cfg_key k) { return cfg_get(c, model, k)->i; }
double cfg_num(const struct cfg *c, int model, enum cfg_key k) { return cfg_get(c, model, k)->d; }

const char *cfg_str(const struct cfg *c, int model, enum cfg_key k) {
    const struct cfg_val *v = cfg_get(c, model, k);
    return v->set ? v->s : NULL;
}

/* ---- setting a value from text ---- */

/* The name of entry m (for models.NAME.KEY): its name, else its model's file name without
 * .gguf. */
static void entry_name(const struct cfg_entry *m, char *buf, size_t n) {
    const struct cfg_val *nv = &m->v[CFG_NAME], *mv = &m->v[CFG_MODEL];
    buf[0] = 0;
    if (nv->set) {
        snprintf(buf, n, "%s", nv->s);
    } else if (mv->set && mv->n_list > 0) {
        const char *p = mv->list[0], *s = strrchr(p, '/');
        snprintf(buf, n, "%s", s && s[1] ? s + 1 : p);
        size_t l = strlen(buf);
        if (l > 5 && !strcmp(buf + l - 5, ".gguf")) buf[l - 5] = 0;
    }
}

/* Stores the parsed value nv into *v from src (line: its file line): a list from the same
 * layer appends (a repeated flag), anything else replaces. */
static bool store(struct cfg_val *v, struct cfg_val *nv, const struct cfg_def *d, enum cfg_src src,
                  uint32_t line) {
    if (d->type == CFG_LIST && v->set && v->src == src && src != CFG_SRC_FILE) {
        if (!list_append(v, nv)) return false;
        val_clear(nv);
    } else {
        val_clear(v);
        *v = *nv;
        memset(nv, 0, sizeof *nv);
    }
    v->src = (uint8_t)src;
    v->line = line;
    return true;
}

smelt_status cfg_set_text(struct cfg *c, enum cfg_src src, const char *key, const char *value,
                          const char *what, struct err *e) {
    struct cfg_val *target = NULL;
    int k;
    char q[128];
    if (!strncmp(key, "models.", 7)) { /* models.NAME.KEY */
        const char *dot = strrchr(key + 7, '.');
        if (!dot || dot == key + 7)
            return err_set(e, SMELT_ERR_INVALID, "%s: a model's setting is models.NAME.KEY", what);
        size_t nl = (size_t)(dot - (key + 7));
        k = cfg_find(dot + 1);
        if (k < 0 || !(cfg_defs[k].where & c->cmd) ||
            !(cfg_defs[k].where & (CFG_PER_MODEL | CFG_ENTRY)))
            return err_set(e, SMELT_ERR_INVALID, "%s: '%s' is not a model's setting", what,
                           quoted(dot + 1, q, sizeof q));
        for (int m = 0; m < c->n_models && !target; m++) {
            char nm[256];
            entry_name(&c->models[m], nm, sizeof nm);
            if (strlen(nm) == nl && !strncmp(nm, key + 7, nl)) target = &c->models[m].v[k];
        }
        if (!target)
            return err_set(e, SMELT_ERR_INVALID, "%s: no model named '%.*s' in the config file's "
                           "models list", what, (int)(nl > 64 ? 64 : nl), key + 7);
    } else {
        k = cfg_find(key);
        if (k < 0 || !(cfg_defs[k].where & c->cmd) || (cfg_defs[k].where & CFG_ENTRY))
            return err_set(e, SMELT_ERR_INVALID, "%s: unknown setting '%s' for smelt %s", what,
                           quoted(key, q, sizeof q), c->cmd_name);
        target = &c->v[k];
    }
    const struct cfg_def *d = &cfg_defs[k];
    struct cfg_val nv = {0};
    char why[768];
    if (!cfg_parse_value(d, value, true, &nv, why, sizeof why))
        return err_set(e, SMELT_ERR_INVALID, "%s: %s", what, why);
    if (!store(target, &nv, d, src, 0)) {
        val_clear(&nv);
        return err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", what);
    }
    return SMELT_OK;
}

/* ---- the environment ---- */

static void env_name(const struct cfg_def *d, char *buf, size_t n) {
    snprintf(buf, n, "SMELT_%s", d->key);
    for (char *p = buf; *p; p++) *p = (char)toupper((unsigned char)*p);
}

static const char *plain_getenv(const char *name) { return getenv(name); }

smelt_status cfg_load_env(struct cfg *c, const char *(*getenv_fn)(const char *name), struct err *e) {
    if (!getenv_fn) getenv_fn = plain_getenv;
    for (int k = 0; k < CFG_N; k++) {
        const struct cfg_def *d = &cfg_defs[k];
        if (!(d->where & c->cmd) || (d->where & CFG_ENTRY)) continue;
        char name[96];
        env_name(d, name, sizeof name);
        const char *val = getenv_fn(name);
        if (!val || (!*val && d->type != CFG_STR)) continue;
        char what[128];
        snprintf(what, sizeof what, "$%s", name);
        if (d->type != CFG_LIST) {
            smelt_status st = cfg_set_text(c, CFG_SRC_ENV, d->key, val, what, e);
            if (st != SMELT_OK) return st;
            continue;
        }
        /* a list: comma-separated items */
        char *copy = strdup(val), *save = NULL;
        if (!copy) return err_set(e, SMELT_ERR_NOMEM, "%s: out of memory", what);
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            smelt_status st = cfg_set_text(c, CFG_SRC_ENV, d->key, t, what, e);
            if (st != SMELT_OK) {
                free(copy);
                return st;
            }
        }
        free(copy);
    }
    return SMELT_OK;
}

/* ---- the command line ---- */

/* The setting a flag names (without its dashes; '-' read as '_'), or -1. */
static int flag_key(const struct cfg *c, const char *name, size_t n, bool is_short) {
    for (int k = 0; k < CFG_N; k++) {
        const struct cfg_def *d = &cfg_defs[k];
        if (!(d->where & c->cmd) || (d->where & CFG_ENTRY)) continue;
        if (is_short) {
            if (d->short_flag && n == 1 && name[0] == d->short_flag) return k;
            continue;
        }
        size_t i = 0;
        for (; i < n && d->key[i]; i++)
            if (d->key[i] != (name[i] == '-' ? '_' : name[i])) break;
        if (i == n && !d->key[i]) return k;
    }
    return -1;
}

struct pending {
    int key;           /* -1: --set */
    const char *value; /* the flag's value (or --set's KEY=VALUE) */
    char what[96];     /* the flag as given, for messages */
};

/* The file to read: --config, $SMELT_CONFIG, ./smelt.yaml, ~/.config/smelt/smelt.yaml. */
static char *find_file(const char *given) {
    if (given) return strdup(given);
    const char *env = getenv("SMELT_CONFIG");
    if (env && *env) return strdup(env);
    struct stat st;
    if (stat("smelt.yaml", &st) == 0) return strdup("smelt.yaml");
    char p[4096];
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(p, sizeof p, "%s/smelt/smelt.yaml", xdg);
    else if (home && *home) snprintf(p, sizeof p, "%s/.config/smelt/smelt.yaml", home);
    else return NULL;
    return stat(p, &st) == 0 ? strdup(p) : NULL;
}

int cfg_load_args(struct cfg *c, int argc, char **argv, const char *usage) {
    const char *cmd = c->cmd_name;
    struct pending *pd = calloc((size_t)(argc > 0 ? argc : 1), sizeof *pd);
    if (!pd) {
        fprintf(stderr, "smelt %s: out of memory\n", cmd);
        return 1;
    }
    int np = 0, rc = -1;
    const char *config = NULL;
    bool only_pos = false;
    int pos_key = -1;
    for (int k = 0; k < CFG_N; k++)
        if ((cfg_defs[k].where & c->cmd) && (cfg_defs[k].where & CFG_POSITIONAL)) pos_key = k;
    for (int i = 1; i < argc && rc < 0; i++) {
        const char *a = argv[i];
        struct pending *p = &pd[np];
        if (!only_pos && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            cfg_help(stdout, c->cmd, usage);
            rc = 0;
        } else if (!only_pos && !strcmp(a, "--")) {
            only_pos = true;
        } else if (!only_pos && a[0] == '-' && a[1]) {
            bool dd = a[1] == '-';
            const char *name = a + (dd ? 2 : 1), *eq = dd ? strchr(name, '=') : NULL;
            size_t n = eq ? (size_t)(eq - name) : strlen(name);
            snprintf(p->what, sizeof p->what, "%.*s", (int)(n + (dd ? 2 : 1)), a);
            bool is_config = dd && n == 6 && !strncmp(name, "config", 6);
            bool is_set = dd && n == 3 && !strncmp(name, "set", 3);
            p->key = is_set || is_config ? -1 : flag_key(c, name, n, !dd);
            if (!is_set && !is_config && p->key < 0) {
                fprintf(stderr, "smelt %s: unknown option %s (see --help)\n", cmd, p->what);
                rc = 2;
                break;
            }
            if (eq) p->value = eq + 1;
            else if (!is_set && !is_config && cfg_defs[p->key].type == CFG_BOOL) p->value = "true";
            else if (i + 1 < argc) p->value = argv[++i];
            else {
                fprintf(stderr, "smelt %s: %s needs a value\n", cmd, p->what);
                rc = 2;
                break;
            }
            if (is_config) config = p->value;
            else np++;
        } else if (pos_key >= 0) {
            p->key = pos_key;
            p->value = a;
            snprintf(p->what, sizeof p->what, "%s", cfg_defs[pos_key].arg);
            np++;
        } else {
            fprintf(stderr, "smelt %s: unexpected argument %s\n", cmd, a);
            rc = 2;
        }
    }
    struct err e;
    err_clear(&e);
    if (rc < 0) { /* the layers, lowest first */
        char *path = find_file(config);
        if (path) {
            smelt_status st = cfg_load_file(c, path, &e);
            if (st != SMELT_OK) rc = st == SMELT_ERR_IO || st == SMELT_ERR_NOT_FOUND ? 1 : 2;
        }
        free(path);
    }
    if (rc < 0 && cfg_load_env(c, NULL, &e) != SMELT_OK) rc = 2;
    for (int pass = 0; pass < 2 && rc < 0; pass++) {
        for (int i = 0; i < np && rc < 0; i++) {
            struct pending *p = &pd[i];
            if ((p->key < 0) != (pass == 1)) continue; /* flags, then --set */
            smelt_status st;
            if (p->key >= 0) {
                st = cfg_set_text(c, CFG_SRC_FLAG, cfg_defs[p->key].key, p->value, p->what, &e);
            } else {
                const char *eq = strchr(p->value, '=');
                char key[256], what[320];
                snprintf(what, sizeof what, "--set %.*s", eq ? (int)(eq - p->value) : 200, p->value);
                if (!eq || eq == p->value || (size_t)(eq - p->value) >= sizeof key) {
                    st = err_set(&e, SMELT_ERR_INVALID, "%s: expected KEY=VALUE", what);
                } else {
                    snprintf(key, sizeof key, "%.*s", (int)(eq - p->value), p->value);
                    st = cfg_set_text(c, CFG_SRC_SET, key, eq + 1, what, &e);
                }
            }
            if (st != SMELT_OK) rc = 2;
        }
    }
    if (rc > 0 && e.msg[0]) fprintf(stderr, "smelt %s: %s\n", cmd, e.msg);
    free(pd);
    return rc;
}

/* ---- --help ---- */

static const char *const section_names[] = {"models", "server", "engine",
                                            "sampling defaults (a request's own fields win)",
                                            ("speculative decoding (docs/speculative.md; a "
                                             "request opts out with \"speculative\": false)"),
                                            "tests and benchmarks"};

/* Writes text wrapped to width, every line after the first indented by indent. */
static void wrap(FILE *f, const char *text, int col, int indent, int width) {
    const char *p = text;
    while (*p) {
        size_t n = strcspn(p, " ");
        if (col > indent && col + 1 + (int)n > width) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, n, f);
        col += (int)n;
        p += n;
        while (*p == ' ') p++;
    }
    fputc('\n', f);
}

void cfg_help(FILE *f, unsigned cmd, const char *usage) {
    const int indent = 30, width = 96;
    fprintf(f, "%s\n", usage);
    for (int sec = 0; sec <= CFG_SEC_TEST; sec++) {
        bool any = false;
        for (int k = 0; k < CFG_N; k++) {
            const struct cfg_def *d = &cfg_defs[k];
            if (d->section != sec || !(d->where & cmd) || (d->where & CFG_ENTRY)) continue;
            if (!any) fprintf(f, "%s:\n", section_names[sec]);
            any = true;
            char flag[96], help[1024];
            char name[64];
            snprintf(name, sizeof name, "%s", d->key);
            for (char *p = name; *p; p++)
                if (*p == '_') *p = '-';
            int n = 0;
            if (d->short_flag) n = snprintf(flag, sizeof flag, "-%c, ", d->short_flag);
            snprintf(flag + n, sizeof flag - (size_t)n, "--%s%s%s", name, d->arg ? " " : "",
                     d->arg ? d->arg : "");
            size_t hl = strlen(d->help);
            if (d->def && d->type != CFG_BOOL && hl && d->help[hl - 1] == ')') /* "(x; default y)" */
                snprintf(help, sizeof help, "%.*s; default %s)", (int)hl - 1, d->help, d->def);
            else if (d->def && d->type != CFG_BOOL)
                snprintf(help, sizeof help, "%s (default %s)", d->help, d->def);
            else snprintf(help, sizeof help, "%s", d->help);
            int col = fprintf(f, "  %-*s", indent - 3, flag);
            if (col >= indent) {
                fprintf(f, "\n%*s", indent, "");
                col = indent;
            } else {
                fputc(' ', f);
                col++;
            }
            wrap(f, help, col, indent, width);
        }
    }
    fprintf(f, "config (docs/config.md):\n");
    fprintf(f, "  %-*s ", indent - 3, "--config FILE");
    wrap(f, "settings from a YAML file (default: ./smelt.yaml, else ~/.config/smelt/smelt.yaml; "
            "$SMELT_CONFIG); every setting above is also its key there, and $SMELT_KEY in the "
            "environment (KEY in capitals); flags win over both",
         indent, indent, width);
    fprintf(f, "  %-*s ", indent - 3, "--set KEY=VALUE");
    wrap(f, "a setting by its key, over every other layer (models.NAME.KEY: a model's own)",
         indent, indent, width);
}

/* ---- smelt config ---- */

/* A YAML double-quoted string: escapes for '"', '\\' and control bytes. */
static void yaml_str(char *buf, size_t n, const char *s) {
    size_t w = 0;
    if (n < 8) {
        if (n) buf[0] = 0;
        return;
    }
    buf[w++] = '"';
    for (; *s && w + 6 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            buf[w++] = '\\';
            buf[w++] = (char)ch;
        } else if (ch < 0x20 || ch == 0x7F) {
            w += (size_t)snprintf(buf + w, n - w, "\\x%02x", ch);
        } else {
            buf[w++] = (char)ch;
        }
    }
    buf[w++] = '"';
    buf[w] = 0;
}

const char *cfg_val_text(const struct cfg_def *d, const struct cfg_val *v, char *buf, size_t n) {
    if (!v->set) {
        snprintf(buf, n, "~");
        return buf;
    }
    switch (d->type) {
    case CFG_BOOL: snprintf(buf, n, "%s", v->b ? "true" : "false"); break;
    case CFG_INT: snprintf(buf, n, "%lld", (long long)v->i); break;
    case CFG_NUM: {
        snprintf(buf, n, "%.15g", v->d);
        if (strtod(buf, NULL) != v->d) snprintf(buf, n, "%.17g", v->d);
        break;
    }
    case CFG_STR:
    case CFG_ENUM: yaml_str(buf, n, v->s); break;
    case CFG_LIST: {
        size_t w = (size_t)snprintf(buf, n, "[");
        for (int i = 0; i < v->n_list && w + 8 < n; i++) {
            if (i) w += (size_t)snprintf(buf + w, n - w, ", ");
            yaml_str(buf + w, n - w, v->list[i]);
            w += strlen(buf + w);
        }
        if (w + 2 <= n) snprintf(buf + w, n - w, "]");
        break;
    }
    }
    return buf;
}

const char *cfg_src_text(const struct cfg *c, enum cfg_key k, const struct cfg_val *v, char *buf,
                         size_t n) {
    const struct cfg_def *d = &cfg_defs[k];
    char nm[96];
    switch (v->src) {
    case CFG_SRC_FILE: snprintf(buf, n, "%s:%u", c->file ? c->file : "file", v->line); break;
    case CFG_SRC_ENV:
        env_name(d, nm, sizeof nm);
        snprintf(buf, n, "$%s", nm);
        break;
    case CFG_SRC_FLAG:
        snprintf(nm, sizeof nm, "%s", d->key);
        for (char *p = nm; *p; p++)
            if (*p == '_') *p = '-';
        snprintf(buf, n, "--%s", nm);
        break;
    case CFG_SRC_SET: snprintf(buf, n, "--set"); break;
    default: snprintf(buf, n, "%s", v->set ? "default" : "unset"); break;
    }
    return buf;
}

static void print_one(FILE *f, const struct cfg *c, int k, const struct cfg_val *v, int indent,
                      const char *lead) {
    const struct cfg_def *d = &cfg_defs[k];
    char val[1024], src[256], line[1200];
    cfg_src_text(c, (enum cfg_key)k, v, src, sizeof src);
    if ((d->where & CFG_SECRET) && v->set) {
        fprintf(f, "%*s# %s: (set, not shown)  # %s\n", indent, "", d->key, src);
        return;
    }
    snprintf(line, sizeof line, "%*s%s%s: %s", indent, "", lead, d->key,
             cfg_val_text(d, v, val, sizeof val));
    fprintf(f, "%-44s # %s\n", line, src);
}

void cfg_print(FILE *f, const struct cfg *c) {
    fprintf(f, "# smelt %s: the effective settings and where each came from (docs/config.md)\n",
            c->cmd & CFG_SERVE ? "serve" : c->cmd_name);
    if (c->file) fprintf(f, "# config file: %s\n", c->file);
    for (int k = 0; k < CFG_N; k++) {
        const struct cfg_def *d = &cfg_defs[k];
        if (!(d->where & c->cmd) || (d->where & CFG_ENTRY)) continue;
        print_one(f, c, k, &c->v[k], 0, "");
    }
    if (c->n_models == 0) return;
    fprintf(f, "models:  # each model's own settings; the others are the server-wide ones above\n");
    for (int m = 0; m < c->n_models; m++) {
        bool first = true;
        for (int k = 0; k < CFG_N; k++) {
            if (!c->models[m].v[k].set) continue;
            print_one(f, c, k, &c->models[m].v[k], first ? 2 : 4, first ? "- " : "");
            first = false;
        }
        if (first) fprintf(f, "  - {}\n");
    }
}
