/* libFuzzer target for the settings layers (config/config.h):
 *  - bit 0 of the first byte clear: the rest is a YAML config file (cfg_load_yaml), then
 *    `smelt config`'s listing of what it set (cfg_print);
 *  - set: the rest is NUL-separated "KEY=VALUE" pairs, each set as --set sets it (the
 *    models.NAME.KEY form included, after a fixed YAML file with two models) and, with
 *    bit 1, also as the environment variable SMELT_KEY would (comma lists).
 * Nothing reads real files or the real environment. A refusal must come with a message.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/config, dict: config.dict)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

static const char *const *g_env; /* NAME=VALUE strings for fake_getenv */
static size_t g_n_env;

static const char *fake_getenv(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < g_n_env; i++)
        if (!strncmp(g_env[i], name, n) && g_env[i][n] == '=') return g_env[i] + n + 1;
    return NULL;
}

static void listing(const struct cfg *c) {
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f) return;
    cfg_print(f, c);
    fclose(f);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    struct cfg c;
    struct err e;
    if (cfg_init(&c, CFG_SERVE, "serve", &e) != SMELT_OK) abort();
    if (!(mode & 1)) {
        err_clear(&e);
        smelt_status st = cfg_load_yaml(&c, "fuzz.yaml", text, n, &e);
        if (st != SMELT_OK && !e.msg[0]) abort();
        listing(&c);
        cfg_free(&c);
        return 0;
    }
    static const char base[] = "models:\n  - model: a.gguf\n  - model: /x/b.gguf\n    name: bee\n";
    if (cfg_load_yaml(&c, "base.yaml", base, sizeof base - 1, &e) != SMELT_OK) abort();
    char *buf = malloc(n + 1);
    if (!buf) return 0;
    memcpy(buf, text, n);
    buf[n] = 0;
    const char *items[64];
    char names[64][160];
    size_t ni = 0;
    for (char *p = buf; p < buf + n && ni < 64; p += strlen(p) + 1) {
        char *eq = strchr(p, '=');
        if (!eq) continue;
        *eq = 0;
        err_clear(&e);
        smelt_status st = cfg_set_text(&c, CFG_SRC_SET, p, eq + 1, "--set", &e);
        if (st != SMELT_OK && !e.msg[0]) abort();
        if (mode & 2) { /* the same pair as an environment variable */
            snprintf(names[ni], sizeof names[ni], "SMELT_%s=%s", p, eq + 1);
            for (char *q = names[ni] + 6; *q && *q != '='; q++)
                if (*q >= 'a' && *q <= 'z') *q = (char)(*q - 'a' + 'A');
            items[ni] = names[ni];
            ni++;
        }
        *eq = '=';
    }
    g_env = items;
    g_n_env = ni;
    err_clear(&e);
    if (cfg_load_env(&c, fake_getenv, &e) != SMELT_OK && !e.msg[0]) abort();
    listing(&c);
    free(buf);
    cfg_free(&c);
    return 0;
}
