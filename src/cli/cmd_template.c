/* smelt template MODEL conversation.json: renders a model's chat template.
 *
 * The template comes from the GGUF's tokenizer.chat_template (or --template FILE, or the
 * documented ChatML default when the model has none: template/tmpl_source.h, shared with
 * `smelt serve`); a conversation with tools gets the model's
 * tokenizer.chat_template.tool_use when it has one. bos_token / eos_token are the text
 * of the vocab's BOS/EOS tokens. The context is what Hugging Face's apply_chat_template
 * passes (see tmpl_chat_ctx). The rendered prompt is written to stdout byte for byte.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "format/gguf.h"
#include "template/tmpl.h"
#include "template/tmpl_source.h"
#include "util/clock.h"
#include "util/file.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: smelt template MODEL.gguf CONVERSATION.json [options]\n"
            "       smelt template --template FILE.jinja CONVERSATION.json [options]\n"
            "\n"
            "Renders the model's chat template (tokenizer.chat_template) for a conversation the\n"
            "way Hugging Face's apply_chat_template does, and prints the prompt exactly.\n"
            "A model without a template gets the ChatML default (docs/templates.md).\n"
            "\n"
            "CONVERSATION.json ('-' reads stdin) is either a list of messages or an object:\n"
            "  {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true, ...}\n"
            "where any other key (enable_thinking, bos_token, ...) is passed to the template.\n"
            "\n"
            "  --template FILE          render FILE instead of a model's template\n"
            "  --no-generation-prompt   add_generation_prompt = false (default true)\n"
            "  --var KEY=VALUE          pass a variable; VALUE is JSON when it parses, else text\n"
            "  --now EPOCH              the time strftime_now() sees (UTC), for reproducible output\n"
            "  --bench N                compile and render N times; print timings to stderr\n"
            "  -h, --help               this help\n"
            "\n"
            "Exit status: 0 ok, 1 the template failed (the reason is printed), 2 usage error.\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median and 90th percentile of compile and render times over n runs. */
static smelt_status bench(const char *src, size_t len, const struct tmpl_value *ctx,
                          const struct tmpl_opts *opts, long n, struct err *e) {
    double *tc = malloc((size_t)n * sizeof *tc), *tr = malloc((size_t)n * sizeof *tr);
    size_t out_len = 0;
    smelt_status st = SMELT_OK;
    if (!tc || !tr) {
        st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (long i = 0; i < n && !st; i++) {
        struct tmpl *t;
        double t0 = 1e6 * clock_now();
        if ((st = tmpl_compile(src, len, &t, e))) break;
        double t1 = 1e6 * clock_now();
        char *out;
        st = tmpl_render(t, ctx, opts, &out, &out_len, e);
        tc[i] = t1 - t0;
        tr[i] = 1e6 * clock_now() - t1;
        if (!st) free(out);
        tmpl_free(t);
    }
    if (!st) {
        qsort(tc, (size_t)n, sizeof *tc, cmp_double);
        qsort(tr, (size_t)n, sizeof *tr, cmp_double);
        fprintf(stderr, "bench: %ld runs, %zu bytes of template, %zu bytes out: compile median %.1f us (p90 %.1f), "
                        "render median %.1f us (p90 %.1f)\n",
                n, len, out_len, tc[n / 2], tc[n * 9 / 10], tr[n / 2], tr[n * 9 / 10]);
    }
done:
    free(tc);
    free(tr);
    return st;
}

/* The text of token id key_id (e.g. tokenizer.ggml.bos_token_id), or NULL. */
static char *token_text(struct gguf_file *g, const char *key_id) {
    uint32_t id;
    struct err e;
    err_clear(&e);
    if (gguf_get_u32(g, key_id, &id, &e)) return NULL;
    const struct gguf_value *arr;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_T_STRING, &arr, &e)) return NULL;
    if (id >= arr->v.arr.n) return NULL;
    struct gguf_str s = gguf_arr_str(arr, id);
    char *t = malloc(s.len + 1);
    if (!t) return NULL;
    memcpy(t, s.ptr, s.len);
    t[s.len] = 0;
    return t;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tfile = NULL, *conv = NULL;
    bool no_gen = false, has_now = false;
    long long now = 0;
    long bench_n = 0;
    json_t *vars = json_object();
    int rc = 2;
    struct err e;
    err_clear(&e);
    char *src = NULL, *conv_text = NULL, *bos = NULL, *eos = NULL, *out = NULL;
    struct gguf_file *g = NULL;
    struct tmpl *t = NULL;
    struct tmpl_value *ctx = NULL;
    struct tmpl_sources ct = {0};
    json_t *cj = NULL, *extra = NULL;
    if (!vars) return cli_fail("template", &(struct err){SMELT_ERR_NOMEM, "out of memory"});
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        } else if (!strcmp(a, "--template") && i + 1 < argc) {
            tfile = argv[++i];
        } else if (!strcmp(a, "--no-generation-prompt")) {
            no_gen = true;
        } else if (!strcmp(a, "--now") && i + 1 < argc) {
            char *end;
            now = strtoll(argv[++i], &end, 10);
            if (*end) {
                fprintf(stderr, "smelt template: --now wants seconds since 1970\n");
                goto done;
            }
            has_now = true;
        } else if (!strcmp(a, "--bench") && i + 1 < argc) {
            bench_n = strtol(argv[++i], NULL, 10);
            if (bench_n < 1 || bench_n > 10000000) {
                fprintf(stderr, "smelt template: --bench wants a run count\n");
                goto done;
            }
        } else if (!strcmp(a, "--var") && i + 1 < argc) {
            const char *kv = argv[++i], *eq = strchr(kv, '=');
            if (!eq || eq == kv) {
                fprintf(stderr, "smelt template: --var wants KEY=VALUE\n");
                goto done;
            }
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
            json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
            if (!v) v = json_string(eq + 1);
            if (!v) {
                fprintf(stderr, "smelt template: --var %s: value is not UTF-8\n", key);
                goto done;
            }
            json_object_set_new(vars, key, v);
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "smelt template: unknown option '%s'\n\n", a);
            usage(stderr);
            goto done;
        } else if (!model && !tfile && !conv) {
            model = a;
        } else if (!conv) {
            conv = a;
        } else {
            fprintf(stderr, "smelt template: too many arguments\n\n");
            usage(stderr);
            goto done;
        }
    }
    if (tfile && model && !conv) { /* `--template F conv` parsed conv as model */
        conv = model;
        model = NULL;
    }
    if (!conv || (!model && !tfile)) {
        usage(stderr);
        goto done;
    }
    rc = 1;

    /* the template and special tokens */
    size_t src_len = 0;
    if (tfile) {
        if (file_read_all(tfile, &src, &src_len, &e)) goto fail;
    }
    if (model) {
        if (gguf_open(&g, model, &e)) goto fail;
        if (!src) {
            if (tmpl_sources_load(&ct, g, NULL, &e)) goto fail;
            if (ct.fallback)
                fprintf(stderr, "smelt template: %s has no tokenizer.chat_template; using the ChatML default\n", model);
            src = ct.src;
            src_len = ct.len;
            ct.src = NULL;
        }
        bos = token_text(g, "tokenizer.ggml.bos_token_id");
        eos = token_text(g, "tokenizer.ggml.eos_token_id");
    }

    /* the conversation */
    size_t conv_len;
    if (file_read_all(conv, &conv_text, &conv_len, &e)) goto fail;
    json_error_t je;
    cj = json_loadb(conv_text, conv_len, 0, &je);
    if (!cj) {
        err_set(&e, SMELT_ERR_FORMAT, "%s: line %d: %s", conv, je.line, je.text);
        goto fail;
    }
    const json_t *messages = cj, *tools = NULL;
    bool gen = true;
    extra = json_object();
    if (!extra) {
        err_set(&e, SMELT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (json_is_object(cj)) {
        messages = json_object_get(cj, "messages");
        tools = json_object_get(cj, "tools");
        const json_t *agp = json_object_get(cj, "add_generation_prompt");
        if (agp) gen = json_is_true(agp);
        const char *k;
        json_t *v;
        json_object_foreach(cj, k, v) {
            if (strcmp(k, "messages") && strcmp(k, "tools") && strcmp(k, "add_generation_prompt"))
                json_object_set(extra, k, v);
        }
    }
    if (!json_is_array(messages)) {
        err_set(&e, SMELT_ERR_FORMAT, "%s: expected a list of messages or {\"messages\": [...]}", conv);
        goto fail;
    }
    if (no_gen) gen = false;
    if (tools && !json_is_null(tools) && ct.tool_use) { /* as transformers picks it */
        free(src);
        src = ct.tool_use;
        src_len = ct.tool_use_len;
        ct.tool_use = NULL;
    }
    if (tmpl_compile(src, src_len, &t, &e)) {
        err_prefix(&e, "%s", tfile ? tfile : "chat template");
        goto fail;
    }
    json_object_update(extra, vars);
    if (tmpl_chat_ctx(messages, tools, gen, bos, eos, extra, &ctx, &e)) goto fail;

    struct tmpl_opts opts = {.has_now = has_now, .now = now};
    if (bench_n) {
        if (bench(src, src_len, ctx, &opts, bench_n, &e)) goto fail;
        rc = 0;
        goto done;
    }
    size_t out_len;
    if (tmpl_render(t, ctx, &opts, &out, &out_len, &e)) goto fail;
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        err_set(&e, SMELT_ERR_IO, "writing the output: %s", strerror(errno));
        goto fail;
    }
    rc = 0;
    goto done;
fail:
    rc = cli_fail("template", &e);
done:
    free(out);
    tmpl_value_free(ctx);
    tmpl_free(t);
    json_decref(cj);
    json_decref(extra);
    json_decref(vars);
    free(conv_text);
    free(src);
    tmpl_sources_free(&ct);
    free(bos);
    free(eos);
    if (g) gguf_close(g);
    return rc;
}
