/* cli_resolve_model on local references: files, split parts, directories, the hub cache,
 * missing models (no network: HF_ENDPOINT points at a closed port, and every case here must
 * be answered without it). modelref.c lives in the CLI, outside libsmelt, so it is compiled
 * into this test directly. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/modelref.c"
#include "t.h"

static char root[64];

static void touch(const char *rel, const char *content) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    FILE *f = fopen(p, "wb");
    if (f) {
        fputs(content, f);
        fclose(f);
    }
}

static void mk(const char *rel) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    mkdir(p, 0755);
}

static const char *at(const char *rel) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", root, rel);
    return p[k];
}

static void test_files_and_dirs(void) {
    char out[1024];
    struct err e;
    touch("a.gguf", "x");
    T_EQ_INT(cli_resolve_model(at("a.gguf"), false, out, sizeof out, &e), SMELT_OK);
    T_EQ_STR(out, at("a.gguf"));
    mk("split");
    touch("split/B-00001-of-00002.gguf", "x");
    touch("split/B-00002-of-00002.gguf", "x");
    T_EQ_INT(cli_resolve_model(at("split/B-00002-of-00002.gguf"), false, out, sizeof out, &e), SMELT_OK);
    T_EQ_STR(out, at("split/B-00001-of-00002.gguf"));
    T_EQ_INT(cli_resolve_model(at("split"), false, out, sizeof out, &e), SMELT_OK);
    T_EQ_STR(out, at("split/B-00001-of-00002.gguf"));
    mk("many");
    touch("many/m-Q8_0.gguf", "x");
    touch("many/m-Q4_K_M.gguf", "x");
    touch("many/mmproj-f16.gguf", "x");
    T_EQ_INT(cli_resolve_model(at("many"), false, out, sizeof out, &e), SMELT_OK);
    T_EQ_STR(out, at("many/m-Q4_K_M.gguf"));
    mk("none");
    T_EQ_INT(cli_resolve_model(at("none"), false, out, sizeof out, &e), SMELT_ERR_NOT_FOUND);
    T_CHECKF(strstr(e.msg, "none"), "%s", e.msg);
    T_EQ_INT(cli_resolve_model(at("missing.gguf"), true, out, sizeof out, &e), SMELT_ERR_NOT_FOUND);
    T_CHECKF(strstr(e.msg, "no such file"), "%s", e.msg);
    T_EQ_INT(cli_resolve_model("./nothere/x", true, out, sizeof out, &e), SMELT_ERR_NOT_FOUND);
    T_EQ_INT(cli_resolve_model("justaname", true, out, sizeof out, &e), SMELT_ERR_NOT_FOUND);
    T_EQ_INT(cli_resolve_model("org/re po", true, out, sizeof out, &e), SMELT_ERR_INVALID);
    T_EQ_INT(cli_resolve_model("", true, out, sizeof out, &e), SMELT_ERR_INVALID);
}

static void test_hub_cache(void) {
    char out[1024];
    struct err e;
    char cache[512];
    snprintf(cache, sizeof cache, "%s/hub", root);
    setenv("HF_HUB_CACHE", cache, 1);
    setenv("HF_ENDPOINT", "http://127.0.0.1:9", 1); /* discard port: nothing listens */
    unsetenv("HF_HUB_OFFLINE");
    const char *commit = "89abcdef0123456789abcdef0123456789abcdef";
    const char *etag = "1111111111111111111111111111111111111111111111111111111111111111";
    mk("hub");
    mk("hub/models--org--m");
    mk("hub/models--org--m/blobs");
    mk("hub/models--org--m/refs");
    touch("hub/models--org--m/refs/main", commit);
    touch("hub/models--org--m/blobs/1111111111111111111111111111111111111111111111111111111111111111", "G");
    char rd[600];
    snprintf(rd, sizeof rd, "%s/models--org--m", cache);
    T_EQ_INT(hub_link_snapshot(rd, commit, "m-Q8_0.gguf", etag, &e), SMELT_OK);
    T_EQ_INT(cli_resolve_model("org/m:Q8_0", false, out, sizeof out, &e), SMELT_OK);
    char want[1024];
    snprintf(want, sizeof want, "%s/snapshots/%s/m-Q8_0.gguf", rd, commit);
    T_EQ_STR(out, want);
    T_EQ_INT(cli_resolve_model("org/m", false, out, sizeof out, &e), SMELT_OK); /* the only model */
    /* not cached, no pull allowed: a hint, and no network touched */
    T_EQ_INT(cli_resolve_model("org/m:Q4_K_M", false, out, sizeof out, &e), SMELT_ERR_NOT_FOUND);
    T_CHECKF(strstr(e.msg, "smelt pull org/m:Q4_K_M") && strstr(e.msg, "Q8_0"), "%s", e.msg);
    /* offline: a pull is refused with a clear reason */
    setenv("HF_HUB_OFFLINE", "1", 1);
    T_EQ_INT(cli_resolve_model("org/m:Q4_K_M", true, out, sizeof out, &e), SMELT_ERR_NOT_FOUND);
    T_CHECKF(strstr(e.msg, "HF_HUB_OFFLINE"), "%s", e.msg);
    T_EQ_INT(cli_resolve_model("org/m:Q8_0", true, out, sizeof out, &e), SMELT_OK);
    unsetenv("HF_HUB_OFFLINE");
    /* allowed to pull, but the hub is unreachable: a network error, quickly */
    T_EQ_INT(cli_resolve_model("org/m:Q4_K_M", true, out, sizeof out, &e), SMELT_ERR_NETWORK);
    unsetenv("HF_HUB_CACHE");
    unsetenv("HF_ENDPOINT");
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/smelt_test_ref_XXXXXX");
    if (!mkdtemp(root)) return 1;
    log_set_level(LOG_ERROR);
    T_RUN(test_files_and_dirs);
    T_RUN(test_hub_cache);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) return 1;
    return t_done();
}
