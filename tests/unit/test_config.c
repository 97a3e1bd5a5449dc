/* The settings table and its layers (config/config.h): the table's own consistency (flags,
 * environment names, defaults, docs/config.md listing every key), YAML files (types, ranges,
 * models: entries, every refusal naming the file, line and key), the environment, flags,
 * --set, the order of the layers and `smelt config`'s output. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "t.h"

static struct cfg fresh(void) {
    struct cfg c;
    struct err e;
    if (cfg_init(&c, CFG_SERVE, "serve", &e) != SMELT_OK) {
        fprintf(stderr, "cfg_init: %s\n", e.msg);
        abort();
    }
    return c;
}

/* Loads text as a YAML file; returns the status, the message in e. */
static smelt_status yaml(struct cfg *c, const char *text, struct err *e) {
    err_clear(e);
    return cfg_load_yaml(c, "smelt.yaml", text, strlen(text), e);
}

/* The refusal of text must be a SMELT_ERR_INVALID whose message holds want. */
static void refused(const char *text, const char *want) {
    struct cfg c = fresh();
    struct err e;
    smelt_status st = yaml(&c, text, &e);
    T_CHECKF(st == SMELT_ERR_INVALID && strstr(e.msg, want), "%s\n  -> [%d] %s (want '%s')", text,
             st, e.msg, want);
    cfg_free(&c);
}

static void test_table(void) {
    for (int k = 0; k < CFG_N; k++) {
        const struct cfg_def *d = &cfg_defs[k];
        T_CHECKF(d->key && d->help && *d->help, "entry %d", k);
        if (!d->key) continue;
        T_CHECKF(cfg_find(d->key) == k, "%s", d->key);
        T_CHECKF((d->type == CFG_BOOL) == (d->arg == NULL), "%s: arg", d->key);
        T_CHECKF(d->type != CFG_ENUM || d->choices, "%s: choices", d->key);
        T_CHECKF(d->type != CFG_BOOL || !d->def, "%s: a boolean is false unless set", d->key);
        for (const char *p = d->key; *p; p++)
            T_CHECKF((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_',
                     "%s: a key is [a-z0-9_]", d->key);
        for (int j = 0; j < k; j++)
            T_CHECKF(!d->short_flag || d->short_flag != cfg_defs[j].short_flag, "-%c twice", d->short_flag);
    }
    /* every default parses, and is in range */
    struct cfg c = fresh();
    for (int k = 0; k < CFG_N; k++) T_CHECKF(!cfg_defs[k].def || c.v[k].set, "%s", cfg_defs[k].key);
    T_EQ_INT(cfg_int(&c, -1, CFG_PORT), 8080);
    T_EQ_STR(cfg_str(&c, -1, CFG_HOST), "127.0.0.1");
    T_NEAR(cfg_num(&c, -1, CFG_GPU_MEMORY_UTILIZATION), 0.9, 0);
    T_CHECK(!cfg_has(&c, -1, CFG_TEMP) && !cfg_has(&c, -1, CFG_API_KEY));
    cfg_free(&c);
}

/* docs/config.md names every key (as `key`), and no key it names is missing from the table. */
static void test_docs_list_every_key(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/config.md", SMELT_SOURCE_DIR);
    FILE *f = fopen(path, "rb");
    T_CHECKF(f, "%s", path);
    if (!f) return;
    static char doc[1 << 18];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = 0;
    for (int k = 0; k < CFG_N; k++) {
        char want[96];
        snprintf(want, sizeof want, "| `%s` |", cfg_defs[k].key);
        T_CHECKF(strstr(doc, want), "docs/config.md has no row for %s", cfg_defs[k].key);
    }
    /* and each row of the key table is a key */
    for (const char *p = doc; (p = strstr(p, "\n| `")); p += 4) {
        char key[96];
        size_t m = strcspn(p + 4, "`");
        snprintf(key, sizeof key, "%.*s", (int)(m < 95 ? m : 95), p + 4);
        T_CHECKF(cfg_find(key) >= 0, "docs/config.md lists '%s', which is no setting", key);
    }
}

static void test_yaml_values(void) {
    struct cfg c = fresh();
    struct err e;
    const char *text = "# a comment\n"
                       "port: 9000\n"
                       "host: \"0.0.0.0\"\n"
                       "quiet: yes\n"
                       "gpu_memory_utilization: 0.5\n"
                       "log_format: json\n"
                       "served_model_name: [a, \"b\"]\n"
                       "temp: ~\n"
                       "max_body: 1e6\n"
                       "model: one.gguf\n";
    T_EQ_INT(yaml(&c, text, &e), SMELT_OK);
    T_CHECKF(!e.msg[0], "%s", e.msg);
    T_EQ_INT(cfg_int(&c, -1, CFG_PORT), 9000);
    T_EQ_INT(cfg_get(&c, -1, CFG_PORT)->line, 2);
    T_EQ_INT(cfg_get(&c, -1, CFG_PORT)->src, CFG_SRC_FILE);
    T_EQ_STR(cfg_str(&c, -1, CFG_HOST), "0.0.0.0");
    T_CHECK(cfg_bool(&c, -1, CFG_QUIET));
    T_NEAR(cfg_num(&c, -1, CFG_GPU_MEMORY_UTILIZATION), 0.5, 0);
    T_EQ_STR(cfg_str(&c, -1, CFG_LOG_FORMAT), "json");
    const struct cfg_val *l = cfg_get(&c, -1, CFG_SERVED_MODEL_NAME);
    T_CHECK(l->n_list == 2 && !strcmp(l->list[0], "a") && !strcmp(l->list[1], "b"));
    T_CHECK(!cfg_has(&c, -1, CFG_TEMP));
    T_EQ_INT(cfg_int(&c, -1, CFG_MAX_BODY), 1000000);
    l = cfg_get(&c, -1, CFG_MODEL);
    T_CHECK(l->n_list == 1 && !strcmp(l->list[0], "one.gguf"));
    T_EQ_STR(c.file, "smelt.yaml");
    cfg_free(&c);

    /* an empty file, comments only, a bare null: nothing set */
    const char *empty[] = {"", "# nothing\n", "~\n", "---\n"};
    for (int i = 0; i < 4; i++) {
        c = fresh();
        T_CHECKF(yaml(&c, empty[i], &e) == SMELT_OK, "'%s': %s", empty[i], e.msg);
        T_EQ_INT(cfg_int(&c, -1, CFG_PORT), 8080);
        cfg_free(&c);
    }
}

static void test_yaml_models(void) {
    struct cfg c = fresh();
    struct err e;
    const char *text = "ctx_size: 2048\n"
                       "temp: 0.7\n"
                       "models:\n"
                       "  - model: /m/a.gguf\n"
                       "    name: alpha\n"
                       "    aliases: [first]\n"
                       "    ctx_size: 512\n"
                       "    pinned: true\n"
                       "  - model: org/repo:Q4_K_M\n"
                       "    device: 1\n"
                       "    temp: 0\n";
    T_EQ_INT(yaml(&c, text, &e), SMELT_OK);
    T_CHECKF(!e.msg[0], "%s", e.msg);
    T_EQ_INT(c.n_models, 2);
    T_EQ_INT(c.models[0].line, 4);
    T_EQ_STR(cfg_str(&c, 0, CFG_NAME), "alpha");
    T_EQ_INT(cfg_int(&c, 0, CFG_CTX_SIZE), 512);  /* its own */
    T_EQ_INT(cfg_int(&c, 1, CFG_CTX_SIZE), 2048); /* the server-wide one */
    T_EQ_INT(cfg_int(&c, -1, CFG_CTX_SIZE), 2048);
    T_CHECK(cfg_bool(&c, 0, CFG_PINNED) && !cfg_bool(&c, 1, CFG_PINNED));
    T_NEAR(cfg_num(&c, 0, CFG_TEMP), 0.7, 1e-12);
    T_NEAR(cfg_num(&c, 1, CFG_TEMP), 0, 0);
    T_EQ_INT(cfg_int(&c, 1, CFG_DEVICE), 1);
    T_CHECK(!cfg_has(&c, 0, CFG_DEVICE));
    T_EQ_INT(cfg_get(&c, 1, CFG_DEVICE)->line, 10);
    /* --set reaches an entry by its name, or its file's name without .gguf */
    T_EQ_INT(cfg_set_text(&c, CFG_SRC_SET, "models.alpha.ctx_size", "4096", "--set", &e), SMELT_OK);
    T_EQ_INT(cfg_int(&c, 0, CFG_CTX_SIZE), 4096);
    T_EQ_INT(cfg_set_text(&c, CFG_SRC_SET, "models.repo:Q4_K_M.threads", "3", "--set", &e), SMELT_OK);
    T_EQ_INT(cfg_int(&c, 1, CFG_THREADS), 3);
    T_EQ_INT(cfg_set_text(&c, CFG_SRC_SET, "models.nope.threads", "3", "--set x", &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "no model named 'nope'"), "%s", e.msg);
    T_EQ_INT(cfg_set_text(&c, CFG_SRC_SET, "models.alpha.port", "3", "--set x", &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "'port' is not a model's setting"), "%s", e.msg);
    cfg_free(&c);
}

static void test_yaml_refusals(void) {
    refused("prot: 80\n", "smelt.yaml:1: unknown key 'prot' (did you mean 'port'?)");
    refused("\n\nport: \"80\"\n", "smelt.yaml:3: port: expected an integer, got a quoted string");
    refused("port: 70000\n", "smelt.yaml:1: port: 70000 is out of range [0, 65535]");
    refused("port: 80.5\n", "port: expected an integer, got '80.5'");
    refused("port: [1]\n", "port: expected a single value, got a list");
    refused("quiet: maybe\n", "quiet: expected true or false, got 'maybe'");
    refused("quiet: \"true\"\n", "quiet: expected true or false, got a quoted string");
    refused("gpu_memory_utilization: 0\n", "0 is out of range (0, 1]");
    refused("temp: .nan\n", "temp: expected a number");
    refused("log_format: xml\n", "log_format: expected one of text|json, got 'xml'");
    refused("port: 1\nport: 2\n", "smelt.yaml:2: port: given twice");
    refused("- a\n- b\n", "smelt.yaml:1: expected a mapping of settings");
    refused("port: 1\n---\nport: 2\n", "a second YAML document");
    refused("port: [\n", "smelt.yaml:2: YAML:");
    refused("? [a]\n: 1\n", "a key must be a plain name, got a list");
    refused("name: x\n", "name: a setting of a models: entry, not a top-level one");
    refused("models: x\n", "models: expected a list of models");
    refused("models:\n  - 3\n", "smelt.yaml:2: models[0]: expected a mapping");
    refused("models:\n  - name: a\n", "models[0]: model: missing");
    refused("models:\n  - model: [a, b]\n", "models[0]: model: one model");
    refused("models:\n  - model: a\n    port: 1\n", "smelt.yaml:3: models[0]: port: a server-wide setting");
    refused("models:\n  - model: a\n    bogus: 1\n", "smelt.yaml:3: models[0]: unknown key 'bogus'");
    refused("served_model_name: [a, [b]]\n", "expected a list of strings, got a list");
    refused("served_model_name: [a, ~]\n", "expected a list of strings, got null");
    refused("served_model_name: {a: 1}\n", "expected a string or a list of strings, got a mapping");
    refused("models: []\nmodels: []\n", "models: given twice");
    refused("\tport: 1\n", "YAML:");
    /* a NUL inside a value (libyaml takes "\0" in a double-quoted scalar) */
    refused("host: \"a\\0b\"\n", "host: the value holds a NUL byte");
    /* the key is quoted for the message, escaped */
    refused("\"p\\x1bx\": 1\n", "unknown key 'p\\x1bx'");
    /* aliases resolve, and the walk stays within the format's depth */
    struct cfg c = fresh();
    struct err e;
    T_EQ_INT(yaml(&c, "served_model_name: &n [a, b]\naliases_of_nothing: *n\n", &e), SMELT_ERR_INVALID);
    cfg_free(&c);
    c = fresh();
    T_EQ_INT(yaml(&c, "x: &a [1]\n", &e), SMELT_ERR_INVALID);
    cfg_free(&c);
    /* too large */
    size_t big = (1u << 20) + 1;
    char *t = malloc(big + 1);
    memset(t, '#', big);
    t[big] = 0;
    c = fresh();
    T_EQ_INT(cfg_load_yaml(&c, "big.yaml", t, big, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "at most"), "%s", e.msg);
    cfg_free(&c);
    free(t);
}

static const char *fake_env(const char *name) {
    if (!strcmp(name, "SMELT_PORT")) return "7000";
    if (!strcmp(name, "SMELT_SERVED_MODEL_NAME")) return "x,y";
    if (!strcmp(name, "SMELT_API_KEY")) return "";  /* a string: set, empty */
    if (!strcmp(name, "SMELT_TEMP")) return "";     /* a number: empty is ignored */
    if (!strcmp(name, "SMELT_QUIET")) return "on";
    if (!strcmp(name, "SMELT_NAME")) return "no";   /* an entry-only key: never read */
    return NULL;
}

static const char *bad_env(const char *name) { return !strcmp(name, "SMELT_MAX_SEQS") ? "lots" : NULL; }

static void test_env(void) {
    struct cfg c = fresh();
    struct err e;
    T_EQ_INT(cfg_load_env(&c, fake_env, &e), SMELT_OK);
    T_EQ_INT(cfg_int(&c, -1, CFG_PORT), 7000);
    T_EQ_INT(cfg_get(&c, -1, CFG_PORT)->src, CFG_SRC_ENV);
    const struct cfg_val *l = cfg_get(&c, -1, CFG_SERVED_MODEL_NAME);
    T_CHECK(l->n_list == 2 && !strcmp(l->list[1], "y"));
    T_CHECK(cfg_has(&c, -1, CFG_API_KEY) && !strcmp(cfg_str(&c, -1, CFG_API_KEY), ""));
    T_CHECK(!cfg_has(&c, -1, CFG_TEMP) && cfg_bool(&c, -1, CFG_QUIET));
    cfg_free(&c);
    c = fresh();
    T_EQ_INT(cfg_load_env(&c, bad_env, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "$SMELT_MAX_SEQS: expected an integer, got 'lots'"), "%s", e.msg);
    cfg_free(&c);
}

/* Runs cfg_load_args on a NULL-terminated argument list; returns its code. */
static int args(struct cfg *c, const char *const *a) {
    int n = 0;
    while (a[n]) n++;
    return cfg_load_args(c, n, (char **)a, "usage: test");
}

static void test_layers(void) {
    char dir[] = "/tmp/smelt_cfg_XXXXXX";
    T_CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/s.yaml", dir);
    FILE *f = fopen(path, "w");
    fputs("port: 1001\nmax_seqs: 11\nthreads: 3\ntemp: 0.5\nmodels:\n  - model: a.gguf\n"
          "    top_k: 5\n", f);
    fclose(f);
    /* file < env < flag < --set, each checked where the next does not reach */
    setenv("SMELT_PORT", "1002", 1);
    setenv("SMELT_MAX_SEQS", "12", 1);
    setenv("SMELT_TEMP", "0.25", 1);
    struct cfg c = fresh();
    const char *a1[] = {"serve", "m.gguf", "--config", path, "--port", "1003", "-t", "4",
                        "--max-seqs=13", "--set", "port=1004", "--set", "models.a.top_k=6",
                        "--quiet", "-m", "n.gguf", NULL};
    T_EQ_INT(args(&c, a1), -1);
    T_EQ_INT(cfg_int(&c, -1, CFG_PORT), 1004);
    T_EQ_INT(cfg_get(&c, -1, CFG_PORT)->src, CFG_SRC_SET);
    T_EQ_INT(cfg_int(&c, -1, CFG_MAX_SEQS), 13);
    T_EQ_INT(cfg_get(&c, -1, CFG_MAX_SEQS)->src, CFG_SRC_FLAG);
    T_EQ_INT(cfg_int(&c, -1, CFG_THREADS), 4);
    T_NEAR(cfg_num(&c, -1, CFG_TEMP), 0.25, 0);
    T_EQ_INT(cfg_get(&c, -1, CFG_TEMP)->src, CFG_SRC_ENV);
    T_EQ_INT(cfg_int(&c, 0, CFG_TOP_K), 6);
    T_CHECK(cfg_bool(&c, -1, CFG_QUIET));
    const struct cfg_val *m = cfg_get(&c, -1, CFG_MODEL);
    T_CHECK(m->n_list == 2 && !strcmp(m->list[0], "m.gguf") && !strcmp(m->list[1], "n.gguf"));
    char src[256];
    T_EQ_STR(cfg_src_text(&c, CFG_TEMP, cfg_get(&c, -1, CFG_TEMP), src, sizeof src), "$SMELT_TEMP");
    T_EQ_STR(cfg_src_text(&c, CFG_MAX_SEQS, cfg_get(&c, -1, CFG_MAX_SEQS), src, sizeof src), "--max-seqs");
    T_EQ_STR(cfg_src_text(&c, CFG_TOP_K, cfg_get(&c, 0, CFG_TOP_K), src, sizeof src), "--set");

    /* smelt config's listing: each value with where it came from */
    char *out = NULL;
    size_t n = 0;
    FILE *mf = open_memstream(&out, &n);
    cfg_print(mf, &c);
    fclose(mf);
    T_CHECKF(strstr(out, "port: 1004") && strstr(out, "# --set"), "%s", out);
    T_CHECKF(strstr(out, "temp: 0.25") && strstr(out, "# $SMELT_TEMP"), "%s", out);
    char want[300];
    snprintf(want, sizeof want, "# %s:3", path); /* threads: 3 from the file, then -t 4 */
    T_CHECKF(strstr(out, "threads: 4") && !strstr(out, want), "%s", out);
    snprintf(want, sizeof want, "# %s:6", path);
    T_CHECKF(strstr(out, "  - model: [\"a.gguf\"]") && strstr(out, want), "%s", out);
    T_CHECKF(strstr(out, "host: \"127.0.0.1\"") && strstr(out, "# default"), "%s", out);
    free(out);
    cfg_free(&c);
    unsetenv("SMELT_PORT");
    unsetenv("SMELT_MAX_SEQS");
    unsetenv("SMELT_TEMP");

    /* a secret is never printed */
    c = fresh();
    const char *a2[] = {"serve", "--api-key", "sekrit", "--config", path, NULL};
    T_EQ_INT(args(&c, a2), -1);
    out = NULL;
    mf = open_memstream(&out, &n);
    cfg_print(mf, &c);
    fclose(mf);
    T_CHECKF(!strstr(out, "sekrit") && strstr(out, "# api_key: (set, not shown)"), "%s", out);
    free(out);
    cfg_free(&c);

    /* refusals: exit code 2, and what they name */
    const char *bad[][6] = {
        {"serve", "--prot", "1", NULL},
        {"serve", "--port", NULL},
        {"serve", "--port", "x", NULL},
        {"serve", "--set", "port", NULL},
        {"serve", "--set", "nope=1", NULL},
        {"serve", "--name", "x", NULL}, /* entry-only: no flag */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = fresh();
        T_EQ_INT(args(&c, bad[i]), 2);
        cfg_free(&c);
    }
    /* a config file that is not there is an I/O refusal (1); a bad one a usage refusal (2) */
    c = fresh();
    const char *a3[] = {"serve", "--config", "/nonexistent/smelt.yaml", NULL};
    T_EQ_INT(args(&c, a3), 1);
    cfg_free(&c);
    f = fopen(path, "w");
    fputs("port: x\n", f);
    fclose(f);
    c = fresh();
    const char *a4[] = {"serve", "--config", path, NULL};
    T_EQ_INT(args(&c, a4), 2);
    cfg_free(&c);
    unlink(path);
    rmdir(dir);
}

/* --help: every flag of serve appears, generated from the table. */
static void test_help(void) {
    char *out = NULL;
    size_t n = 0;
    FILE *mf = open_memstream(&out, &n);
    cfg_help(mf, CFG_SERVE, "usage: x");
    fclose(mf);
    for (int k = 0; k < CFG_N; k++) {
        if (cfg_defs[k].where & CFG_ENTRY) continue;
        char flag[96];
        snprintf(flag, sizeof flag, "--%s", cfg_defs[k].key);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_') *p = '-';
        T_CHECKF(strstr(out, flag), "--help lacks %s", flag);
    }
    T_CHECK(strstr(out, "-t, --threads N") && strstr(out, "--set KEY=VALUE"));
    T_CHECK(strstr(out, "(0 picks a free one; default 8080)"));
    free(out);
}

int main(void) {
    T_RUN(test_table);
    T_RUN(test_docs_list_every_key);
    T_RUN(test_yaml_values);
    T_RUN(test_yaml_models);
    T_RUN(test_yaml_refusals);
    T_RUN(test_env);
    T_RUN(test_layers);
    T_RUN(test_help);
    return t_done();
}
