/* smelt pull REF: download a model into the shared Hugging Face cache and print its path. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/modelref.h"

static void pull_usage(FILE *f) {
    fprintf(f,
            "usage: smelt pull org/repo[:QUANT][@REVISION] [options]\n"
            "\n"
            "Downloads a GGUF model from the Hugging Face hub into the shared hub cache\n"
            "(the one huggingface_hub and llama.cpp use) and prints the local path.\n"
            "QUANT picks the file by its quant tag, case-insensitively (default Q4_K_M, or the\n"
            "repo's only model); a split set is fetched whole. QUANT may also be a file name.\n"
            "\n"
            "options:\n"
            "  --revision REV   branch, tag or commit (default main)\n"
            "  -q, --quiet      no progress display\n"
            "  --no-validate    do not open the downloaded file as GGUF\n"
            "\n"
            "environment: HF_TOKEN (gated/private repos), HF_ENDPOINT (a mirror),\n"
            "HF_HUB_CACHE / HF_HOME (cache location), HF_HUB_OFFLINE=1 (cache only),\n"
            "HF_HUB_DOWNLOAD_TIMEOUT (seconds without progress before a retry, default 10)\n");
}

int cmd_pull(int argc, char **argv) {
    const char *ref = NULL, *rev = NULL;
    bool quiet = false, validate = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            pull_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (!strcmp(a, "--no-validate")) {
            validate = false;
        } else if (!strcmp(a, "--revision") && i + 1 < argc) {
            rev = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "smelt pull: unknown option %s\n\n", a);
            pull_usage(stderr);
            return 2;
        } else if (!ref) {
            ref = a;
        } else {
            fprintf(stderr, "smelt pull: one model at a time (got '%s' and '%s')\n", ref, a);
            return 2;
        }
    }
    if (!ref) {
        pull_usage(stderr);
        return 2;
    }
    struct err e;
    err_clear(&e);
    struct hub_ref r;
    if (hub_parse_ref(ref, &r, &e) != SMELT_OK) {
        fprintf(stderr, "smelt pull: %s\n", e.msg);
        return 2;
    }
    if (rev) {
        if (strlen(rev) >= sizeof r.revision || !*rev) {
            fprintf(stderr, "smelt pull: bad revision\n");
            return 2;
        }
        strcpy(r.revision, rev);
    }
    struct hub_opts o;
    if (hub_opts_from_env(&o, &e) != SMELT_OK) return cli_fail("pull", &e);
    struct cli_progress prog;
    cli_progress_init(&prog, quiet);
    o.progress = cli_hub_progress;
    o.progress_ctx = &prog;
    o.validate_gguf = validate;
    char path[HUB_PATH_MAX];
    if (hub_pull(&o, &r, path, sizeof path, &e) != SMELT_OK) return cli_fail("pull", &e);
    printf("%s\n", path);
    return 0;
}
