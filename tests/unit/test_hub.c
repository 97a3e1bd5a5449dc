/* The hub layer's pure parts: references, name validation, quant selection, URLs, the
 * listing parser (hostile JSON included), git blob ids, the environment, and the cache
 * layout on a temporary directory (no network; tests/py/test_pull.py covers transfers). */
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hub/hub_internal.h"
#include "t.h"
#include "util/clock.h"

static void test_parse_ref(void) {
    struct hub_ref r;
    struct err e;
    T_EQ_INT(hub_parse_ref("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0", &r, &e), SMELT_OK);
    T_EQ_STR(r.repo, "Qwen/Qwen2.5-0.5B-Instruct-GGUF");
    T_EQ_STR(r.quant, "Q8_0");
    T_EQ_STR(r.revision, "main");
    T_EQ_INT(hub_parse_ref("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF", &r, &e), SMELT_OK);
    T_EQ_STR(r.repo, "bartowski/Llama-3.2-1B-Instruct-GGUF");
    T_EQ_STR(r.quant, "");
    T_EQ_INT(hub_parse_ref("org/repo:model-q4_k_m.gguf@v1.0", &r, &e), SMELT_OK);
    T_EQ_STR(r.quant, "model-q4_k_m.gguf");
    T_EQ_STR(r.revision, "v1.0");
    char s[600];
    hub_ref_str(&r, s, sizeof s);
    T_EQ_STR(s, "org/repo:model-q4_k_m.gguf@v1.0");
    const char *bad[] = {"", "repo", "org/", "/repo", "org/repo/extra", "org/../x", "../x/y",
                         "org/re po", "org/a--b", "org/a..b", "-org/repo", "org/repo.", "org/x.git",
                         "org/repo:Q4/../../x", "org/repo:", "org/repo@../x", "org/repo:a\tb",
                         "org\\x/repo", "org/repo:../evil.gguf"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        T_CHECKF(hub_parse_ref(bad[i], &r, &e) == SMELT_ERR_INVALID, "accepted '%s'", bad[i]);
}

static void test_relpath_and_hex(void) {
    T_CHECK(hub_valid_relpath("a.gguf"));
    T_CHECK(hub_valid_relpath("Q4_K_M/Model-Q4_K_M-00001-of-00003.gguf"));
    T_CHECK(hub_valid_relpath("refs/pr/1"));
    const char *bad[] = {"", "/etc/passwd", "../x", "a/../b", "a/./b", "a//b", "a/", "a\\b",
                         "C:x", "a\nb", "a\x01", ".", ".."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        T_CHECKF(!hub_valid_relpath(bad[i]), "accepted '%s'", bad[i]);
    T_CHECK(hub_is_hex("0123456789abcdef0123456789abcdef01234567", 40));
    T_CHECK(!hub_is_hex("0123456789ABCDEF0123456789abcdef01234567", 40));
    T_CHECK(!hub_is_hex("0123", 40));
    char et[65];
    const char *sha = "2a2f2e3d16e8a6fe4dd1ba5dcd73b4d2a4555778be1b532824bc6974db028ee9";
    char q[80];
    snprintf(q, sizeof q, "W/\"%s\"", sha);
    T_CHECK(hub_normalize_etag(q, et, sizeof et));
    T_EQ_STR(et, sha);
    T_CHECK(hub_normalize_etag("\"ce013625030ba8dba906f756967f9e9ca394464a\"", et, sizeof et));
    T_CHECK(!hub_normalize_etag("\"../../etc/passwd\"", et, sizeof et));
    T_CHECK(!hub_normalize_etag("\"abc\"", et, sizeof et));
}

static void test_split_and_tags(void) {
    int no, count;
    size_t pl;
    T_CHECK(hub_split_info("x/Big-Q8_0-00002-of-00003.gguf", &no, &count, &pl));
    T_EQ_INT(no, 2);
    T_EQ_INT(count, 3);
    T_EQ_INT(pl, strlen("x/Big-Q8_0"));
    T_CHECK(!hub_split_info("Big-Q8_0-00004-of-00003.gguf", &no, &count, &pl));
    T_CHECK(!hub_split_info("Big-Q8_0-0001-of-00003.gguf", &no, &count, &pl));
    T_CHECK(!hub_split_info("Big-Q8_0.gguf", &no, &count, &pl));
    char t[64];
    hub_quant_tag("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", t, sizeof t);
    T_EQ_STR(t, "Q4_K_M");
    hub_quant_tag("llama-2-7b.q8_0.gguf", t, sizeof t);
    T_EQ_STR(t, "Q8_0");
    hub_quant_tag("d/Big-UD-Q4_K_XL-00001-of-00002.gguf", t, sizeof t);
    T_EQ_STR(t, "Q4_K_XL");
    hub_quant_tag("model.gguf", t, sizeof t);
    T_EQ_STR(t, "");
    T_CHECK(hub_quant_matches("x-q4_k_m.gguf", "Q4_K_M"));
    T_CHECK(hub_quant_matches("Q4_K_M/x-00001-of-00002.gguf", "q4_k_m"));
    T_CHECK(!hub_quant_matches("x-Q4_K_M.gguf", "Q4_K"));  /* a longer tag is not this one */
    T_CHECK(!hub_quant_matches("x-IQ4_XS.gguf", "Q4_XS")); /* nor a tag with a prefix */
    T_CHECK(hub_quant_matches("x-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"));
    T_CHECK(hub_is_model_gguf("a/b-Q4_K_M.GGUF"));
    T_CHECK(!hub_is_model_gguf("mmproj-model-f16.gguf"));
    T_CHECK(!hub_is_model_gguf("imatrix.gguf"));
    T_CHECK(!hub_is_model_gguf("README.md"));
}

/* Runs hub_select and returns the chosen names joined by ',' (or "ERR:<code>"). */
static const char *pick(const char *const *names, size_t n, const char *quant, char *out, size_t cap,
                        struct err *e) {
    size_t *idx, ni;
    smelt_status st = hub_select(names, n, quant, &idx, &ni, e);
    if (st) {
        snprintf(out, cap, "ERR:%d", (int)st);
        return out;
    }
    out[0] = 0;
    for (size_t i = 0; i < ni; i++) {
        strncat(out, names[idx[i]], cap - strlen(out) - 1);
        if (i + 1 < ni) strncat(out, ",", cap - strlen(out) - 1);
    }
    free(idx);
    return out;
}

static void test_select(void) {
    char out[512];
    struct err e;
    const char *repo[] = {"README.md", "mmproj-Model-Q4_K_M.gguf", "Model-Q8_0.gguf",
                          "Model-Q4_K_M.gguf", "Model-UD-Q4_K_M.gguf", "Model-Q4_K_S.gguf",
                          "Model-IQ4_XS.gguf", "F16/Model-F16-00002-of-00002.gguf",
                          "F16/Model-F16-00001-of-00002.gguf"};
    size_t n = sizeof repo / sizeof *repo;
    T_EQ_STR(pick(repo, n, "", out, sizeof out, &e), "Model-Q4_K_M.gguf"); /* default, not the mmproj */
    T_EQ_STR(pick(repo, n, "q8_0", out, sizeof out, &e), "Model-Q8_0.gguf");
    T_EQ_STR(pick(repo, n, "UD-Q4_K_M", out, sizeof out, &e), "Model-UD-Q4_K_M.gguf");
    T_EQ_STR(pick(repo, n, "f16", out, sizeof out, &e),
             "F16/Model-F16-00001-of-00002.gguf,F16/Model-F16-00002-of-00002.gguf");
    T_EQ_STR(pick(repo, n, "model-q4_k_s.gguf", out, sizeof out, &e), "Model-Q4_K_S.gguf");
    T_EQ_STR(pick(repo, n, "Q5_K_M", out, sizeof out, &e), "ERR:6");
    T_CHECKF(strstr(e.msg, "Q4_K_M") && strstr(e.msg, "IQ4_XS") && strstr(e.msg, "F16") &&
             !strstr(e.msg, "mmproj"), "%s", e.msg);

    const char *one[] = {"README.md", "tiny-f16.gguf", "mmproj.gguf"};
    T_EQ_STR(pick(one, 3, "", out, sizeof out, &e), "tiny-f16.gguf");
    T_EQ_STR(pick(one, 3, "Q8_0", out, sizeof out, &e), "ERR:6");
    const char *two[] = {"x-Q8_0.gguf", "x-F16.gguf"};
    T_EQ_STR(pick(two, 2, "", out, sizeof out, &e), "ERR:6");
    T_CHECKF(strstr(e.msg, "Q8_0") && strstr(e.msg, "F16"), "%s", e.msg);
    const char *none[] = {"config.json", "model.safetensors"};
    T_EQ_STR(pick(none, 2, "", out, sizeof out, &e), "ERR:6");
    const char *holes[] = {"B-Q8_0-00001-of-00003.gguf", "B-Q8_0-00003-of-00003.gguf"};
    T_EQ_STR(pick(holes, 2, "Q8_0", out, sizeof out, &e), "ERR:2");
    T_CHECKF(strstr(e.msg, "part 2 of 3"), "%s", e.msg);
    /* the choice does not depend on listing order */
    const char *a[] = {"m-Q4_K_M-v2.gguf", "m-Q4_K_M.gguf"};
    const char *b[] = {"m-Q4_K_M.gguf", "m-Q4_K_M-v2.gguf"};
    T_EQ_STR(pick(a, 2, "", out, sizeof out, &e), "m-Q4_K_M.gguf");
    T_EQ_STR(pick(b, 2, "", out, sizeof out, &e), "m-Q4_K_M.gguf");
}

/* A hostile listing with many files must not make selection quadratic. */
static void test_select_many(void) {
    enum { N = 60000 };
    char **names = malloc(N * sizeof *names);
    T_CHECK(names != NULL);
    if (!names) return;
    for (int i = 0; i < N; i++) {
        names[i] = malloc(40);
        snprintf(names[i], 40, "m-Q%d_K-%05d-of-99999.gguf", i % 50, i + 1);
    }
    double t0 = clock_now();
    char out[64];
    struct err e;
    T_EQ_STR(pick((const char *const *)names, N, "Q0_K", out, sizeof out, &e), "ERR:2");
    T_EQ_STR(pick((const char *const *)names, N, "Q5_K_M", out, sizeof out, &e), "ERR:6");
    double s = clock_now() - t0;
    T_CHECKF(s < 2.0, "selection over %d names took %.2f s", N, s);
    for (int i = 0; i < N; i++) free(names[i]);
    free(names);
}

static void test_urls(void) {
    char o[256], j[512];
    T_CHECK(hub_url_origin("https://HuggingFace.co/org/repo", o, sizeof o));
    T_EQ_STR(o, "https://huggingface.co:443");
    T_CHECK(hub_url_origin("http://127.0.0.1:8080", o, sizeof o));
    T_EQ_STR(o, "http://127.0.0.1:8080");
    T_CHECK(hub_url_origin("http://user:pw@h:81/x?y", o, sizeof o));
    T_EQ_STR(o, "http://h:81");
    T_CHECK(!hub_url_origin("file:///etc/passwd", o, sizeof o));
    T_CHECK(!hub_url_origin("ftp://h/x", o, sizeof o));
    T_CHECK(hub_url_join("https://h.co/a/b?q", "/c/d", j, sizeof j));
    T_EQ_STR(j, "https://h.co/c/d");
    T_CHECK(hub_url_join("https://h.co/a", "https://cdn.x/y?sig=1", j, sizeof j));
    T_EQ_STR(j, "https://cdn.x/y?sig=1");
    T_CHECK(!hub_url_join("https://h.co/a", "file:///etc/passwd", j, sizeof j));
    T_CHECK(!hub_url_join("https://h.co/a", "//evil/x", j, sizeof j));
    T_CHECK(!hub_url_join("https://h.co/a", "rel/path", j, sizeof j));
    T_CHECK(!hub_url_join("https://h.co/a", "/x\r\nSet-Cookie: a", j, sizeof j));
    T_CHECK(hub_url_escape("a b/c%d#e", true, j, sizeof j));
    T_EQ_STR(j, "a%20b/c%25d%23e");
    T_CHECK(hub_url_escape("refs/pr/1", false, j, sizeof j));
    T_EQ_STR(j, "refs%2Fpr%2F1");
}

static void test_listing(void) {
    struct hub_listing l;
    struct err e;
    const char *ok = "{\"id\":\"o/r\",\"sha\":\"0123456789abcdef0123456789abcdef01234567\","
                     "\"siblings\":[{\"rfilename\":\"README.md\",\"size\":9},"
                     "{\"rfilename\":\"m-Q4_K_M.gguf\",\"size\":100,\"lfs\":{\"sha256\":"
                     "\"2a2f2e3d16e8a6fe4dd1ba5dcd73b4d2a4555778be1b532824bc6974db028ee9\","
                     "\"size\":100,\"pointerSize\":134}},{\"rfilename\":\"../weird.txt\"}]}";
    T_EQ_INT(hub_parse_listing(ok, strlen(ok), &l, &e), SMELT_OK);
    T_EQ_STR(l.commit, "0123456789abcdef0123456789abcdef01234567");
    T_EQ_INT(l.n, 2); /* the unsafe non-GGUF name is dropped */
    T_EQ_STR(l.files[1].path, "m-Q4_K_M.gguf");
    T_EQ_INT(l.files[1].size, 100);
    T_EQ_STR(l.files[1].sha256, "2a2f2e3d16e8a6fe4dd1ba5dcd73b4d2a4555778be1b532824bc6974db028ee9");
    T_EQ_STR(l.files[0].sha256, "");
    hub_listing_free(&l);
    const char *bad[] = {
        "", "[]", "{\"sha\":\"xyz\",\"siblings\":[]}", "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\"}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":\"/etc/x.gguf\"}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":\"a/../../x.gguf\"}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":\"x.gguf\","
        "\"lfs\":{\"sha256\":\"../../x\"}}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":\"x.gguf\","
        "\"size\":5,\"lfs\":{\"sha256\":\"2a2f2e3d16e8a6fe4dd1ba5dcd73b4d2a4555778be1b532824bc6974db028ee9\","
        "\"size\":6}}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":7}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":\"a\\u0000b.gguf\"}]}",
        "{\"sha\":\"0123456789abcdef0123456789abcdef01234567\",\"siblings\":[{\"rfilename\":\"a\\\\b.gguf\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        T_CHECKF(hub_parse_listing(bad[i], strlen(bad[i]), &l, &e) != SMELT_OK, "accepted #%zu", i);
}

static void test_git_blob_sha1(void) {
    char h[41];
    hub_git_blob_sha1_mem("hello\n", 6, h); /* `echo hello | git hash-object --stdin` */
    T_EQ_STR(h, "ce013625030ba8dba906f756967f9e9ca394464a");
    hub_git_blob_sha1_mem("", 0, h); /* git's empty blob */
    T_EQ_STR(h, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
}

static void set(const char *k, const char *v) {
    if (v) setenv(k, v, 1);
    else unsetenv(k);
}

static void test_env(void) {
    const char *keys[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME",
                          "HF_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH",
                          "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DOWNLOAD_TIMEOUT"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) unsetenv(keys[i]);
    set("HOME", "/home/u");
    struct hub_opts o;
    struct err e;
    T_EQ_INT(hub_opts_from_env(&o, &e), SMELT_OK);
    T_EQ_STR(o.cache, "/home/u/.cache/huggingface/hub");
    T_EQ_STR(o.endpoint, "https://huggingface.co");
    T_CHECK(!o.offline);
    set("XDG_CACHE_HOME", "/xdg");
    hub_opts_from_env(&o, &e);
    T_EQ_STR(o.cache, "/xdg/huggingface/hub");
    set("HF_HOME", "~/hfh");
    hub_opts_from_env(&o, &e);
    T_EQ_STR(o.cache, "/home/u/hfh/hub");
    set("HUGGINGFACE_HUB_CACHE", "/legacy");
    hub_opts_from_env(&o, &e);
    T_EQ_STR(o.cache, "/legacy");
    set("HF_HUB_CACHE", "/c");
    set("HF_ENDPOINT", "http://127.0.0.1:9/");
    set("HF_TOKEN", "hf_x");
    set("HF_HUB_OFFLINE", "yes");
    set("HF_HUB_DOWNLOAD_TIMEOUT", "3");
    hub_opts_from_env(&o, &e);
    T_EQ_STR(o.cache, "/c");
    T_EQ_STR(o.endpoint, "http://127.0.0.1:9");
    T_EQ_STR(o.token, "hf_x");
    T_CHECK(o.offline);
    T_EQ_INT(o.stall_timeout_s, 3);
    set("HF_HUB_OFFLINE", "0");
    hub_opts_from_env(&o, &e);
    T_CHECK(!o.offline);
    set("HF_ENDPOINT", "ftp://x");
    T_EQ_INT(hub_opts_from_env(&o, &e), SMELT_ERR_INVALID);
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) unsetenv(keys[i]);
}

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(s, f);
        fclose(f);
    }
}

static void test_cache_layout(void) {
    char root[] = "/tmp/smelt_test_hub_XXXXXX";
    if (!mkdtemp(root)) {
        t_skip("mkdtemp failed");
        return;
    }
    struct err e;
    char rd[512], p[1024], link[256];
    T_EQ_INT(hub_repo_dir(root, "org/m", rd, sizeof rd, &e), SMELT_OK);
    snprintf(p, sizeof p, "%s/models--org--m", root);
    T_EQ_STR(rd, p);
    const char *commit = "0123456789abcdef0123456789abcdef01234567";
    const char *etag = "2a2f2e3d16e8a6fe4dd1ba5dcd73b4d2a4555778be1b532824bc6974db028ee9";
    snprintf(p, sizeof p, "%s/blobs", rd);
    T_EQ_INT(hub_mkdirs(p, &e), SMELT_OK);
    snprintf(p, sizeof p, "%s/blobs/%s", rd, etag);
    write_file(p, "GGUFdata");
    T_EQ_INT(hub_link_snapshot(rd, commit, "Q4/m-Q4_K_M.gguf", etag, &e), SMELT_OK);
    snprintf(p, sizeof p, "%s/snapshots/%s/Q4/m-Q4_K_M.gguf", rd, commit);
    ssize_t n = readlink(p, link, sizeof link - 1);
    T_CHECK(n > 0);
    link[n > 0 ? n : 0] = 0;
    snprintf(p, sizeof p, "../../../blobs/%s", etag);
    T_EQ_STR(link, p);
    T_EQ_INT(hub_link_snapshot(rd, commit, "Q4/m-Q4_K_M.gguf", etag, &e), SMELT_OK); /* idempotent */
    /* a symlinked directory inside the snapshot is never written through */
    snprintf(p, sizeof p, "%s/snapshots/%s/evil", rd, commit);
    T_CHECK(symlink("/tmp", p) == 0);
    T_EQ_INT(hub_link_snapshot(rd, commit, "evil/x.gguf", etag, &e), SMELT_ERR_IO);
    T_CHECK(access("/tmp/x.gguf", F_OK) != 0);
    unlink(p);
    T_CHECK(hub_link_snapshot(rd, commit, "../x.gguf", etag, &e) != SMELT_OK);
    /* refs */
    char c[41];
    T_EQ_INT(hub_read_ref(rd, "main", c, &e), SMELT_ERR_NOT_FOUND);
    T_EQ_INT(hub_write_ref(rd, "main", commit, &e), SMELT_OK);
    T_EQ_INT(hub_read_ref(rd, "main", c, &e), SMELT_OK);
    T_EQ_STR(c, commit);
    snprintf(p, sizeof p, "%s/refs/main", rd);
    struct stat sb;
    T_CHECK(stat(p, &sb) == 0 && sb.st_size == 40); /* no newline */
    write_file(p, "not a commit\n");
    T_EQ_INT(hub_read_ref(rd, "main", c, &e), SMELT_ERR_FORMAT);
    T_EQ_INT(hub_write_ref(rd, "main", commit, &e), SMELT_OK);
    T_EQ_INT(hub_write_ref(rd, "refs/pr/1", commit, &e), SMELT_OK);
    T_EQ_INT(hub_read_ref(rd, "refs/pr/1", c, &e), SMELT_OK);
    /* lookups through the public API */
    setenv("HF_HUB_CACHE", root, 1);
    unsetenv("HF_HUB_OFFLINE");
    struct hub_opts o;
    T_EQ_INT(hub_opts_from_env(&o, &e), SMELT_OK);
    struct hub_ref r;
    char path[1024];
    hub_parse_ref("org/m", &r, &e);
    T_EQ_INT(hub_find_cached(&o, &r, path, sizeof path, &e), SMELT_OK);
    snprintf(p, sizeof p, "%s/snapshots/%s/Q4/m-Q4_K_M.gguf", rd, commit);
    T_EQ_STR(path, p);
    hub_parse_ref("org/m:Q8_0", &r, &e);
    T_EQ_INT(hub_find_cached(&o, &r, path, sizeof path, &e), SMELT_ERR_NOT_FOUND);
    T_CHECKF(strstr(e.msg, "Q4_K_M"), "%s", e.msg);
    hub_parse_ref("org/other", &r, &e);
    T_EQ_INT(hub_find_cached(&o, &r, path, sizeof path, &e), SMELT_ERR_NOT_FOUND);
    /* offline pull = the cache */
    o.offline = true;
    hub_parse_ref("org/m", &r, &e);
    T_EQ_INT(hub_pull(&o, &r, path, sizeof path, &e), SMELT_OK);
    hub_parse_ref("org/m@dev", &r, &e);
    T_EQ_INT(hub_pull(&o, &r, path, sizeof path, &e), SMELT_ERR_NOT_FOUND);
    T_CHECKF(strstr(e.msg, "offline"), "%s", e.msg);
    unsetenv("HF_HUB_CACHE");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    T_CHECK(system(cmd) == 0);
}

int main(void) {
    T_RUN(test_parse_ref);
    T_RUN(test_relpath_and_hex);
    T_RUN(test_split_and_tags);
    T_RUN(test_select);
    T_RUN(test_select_many);
    T_RUN(test_urls);
    T_RUN(test_listing);
    T_RUN(test_git_blob_sha1);
    T_RUN(test_env);
    T_RUN(test_cache_layout);
    return t_done();
}
