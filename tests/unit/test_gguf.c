/* GGUF reader/writer tests: writer -> reader round trip (every value type, nested arrays,
 * tensors, alignment), the committed corpus of broken files (each must fail with its
 * expected message), truncation at every byte of a valid file, split sets, and the real
 * vocab files in ../shared/data/vocab (figures cross-checked with gguf-py). The gguf-py
 * cross-checks proper live in tests/py/test_gguf.py.
 */
#include "t.h"

#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/gguf.h"
#include "quant/quant.h"
#include "util/clock.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* ---- a writer fixture used by several tests ---- */

#define N_F32 37
static float t0_data[3 * 64];
static uint8_t t1_data[2 * 34]; /* Q8_0: 2 rows of 32 */

static smelt_status fill_cb(void *ctx, int64_t index, void *buf, uint64_t nbytes,
                            struct err *e) {
    (void)ctx;
    (void)e;
    for (uint64_t i = 0; i < nbytes; i++) ((uint8_t *)buf)[i] = (uint8_t)(i * 7 + (uint64_t)index);
    return SMELT_OK;
}

static smelt_status write_fixture(const char *path, uint32_t align, struct err *e) {
    struct gguf_writer *w;
    smelt_status st = gguf_writer_new(&w, e);
    if (st) return st;
    gguf_set_str(w, "general.architecture", "llama");
    if (align) gguf_set_u32(w, "general.alignment", align);
    gguf_set_u32(w, "llama.block_count", 3);
    gguf_set_i32(w, "test.i32", -5);
    gguf_set_u64(w, "test.u64", UINT64_MAX);
    gguf_set_i64(w, "test.i64", INT64_MIN);
    gguf_set_f32(w, "test.f32", 0.25f);
    gguf_set_f64(w, "test.f64", -1e300);
    gguf_set_bool(w, "test.bool", true);
    gguf_set_str(w, "test.empty", "");
    struct gguf_value u8 = {.type = GGUF_T_UINT8, .v.u = 255};
    gguf_set_value(w, "test.u8", &u8);
    struct gguf_value i16 = {.type = GGUF_T_INT16, .v.i = -300};
    gguf_set_value(w, "test.i16", &i16);
    float fa[N_F32];
    for (int i = 0; i < N_F32; i++) fa[i] = (float)i * 0.5f;
    gguf_set_arr(w, "test.f32s", GGUF_T_FLOAT32, fa, N_F32);
    const char *strs[] = {"a", "", "héllo", "x y"};
    gguf_set_arr_str(w, "test.strs", strs, 4);
    /* [[1,2],[3]] as an array of arrays of INT32, then [["p"],[]] of strings */
    int32_t a1[] = {1, 2}, a2[] = {3};
    struct gguf_value inner[2] = {{.type = GGUF_T_ARRAY}, {.type = GGUF_T_ARRAY}};
    inner[0].v.arr.type = GGUF_T_INT32, inner[0].v.arr.n = 2, inner[0].v.arr.raw = a1;
    inner[1].v.arr.type = GGUF_T_INT32, inner[1].v.arr.n = 1, inner[1].v.arr.raw = a2;
    struct gguf_value outer = {.type = GGUF_T_ARRAY};
    outer.v.arr.type = GGUF_T_ARRAY, outer.v.arr.n = 2, outer.v.arr.items = inner;
    gguf_set_value(w, "test.nested", &outer);
    struct gguf_value ps = {.type = GGUF_T_STRING, .v.s = {"p", 1}};
    struct gguf_value sin[2] = {{.type = GGUF_T_ARRAY}, {.type = GGUF_T_ARRAY}};
    sin[0].v.arr.type = GGUF_T_STRING, sin[0].v.arr.n = 1, sin[0].v.arr.items = &ps;
    sin[1].v.arr.type = GGUF_T_STRING, sin[1].v.arr.n = 0;
    struct gguf_value souter = {.type = GGUF_T_ARRAY};
    souter.v.arr.type = GGUF_T_ARRAY, souter.v.arr.n = 2, souter.v.arr.items = sin;
    gguf_set_value(w, "test.nested_str", &souter);
    gguf_set_u32(w, "llama.block_count", 7); /* replaces, keeps position */

    for (int i = 0; i < 3 * 64; i++) t0_data[i] = (float)i - 10.0f;
    for (size_t i = 0; i < sizeof t1_data; i++) t1_data[i] = (uint8_t)(i ^ 0x5a);
    int64_t ne0[] = {64, 3}, ne1[] = {32, 2}, ne2[] = {256, 1, 2};
    gguf_add_tensor(w, "t0", QT_F32, 2, ne0, t0_data);
    gguf_add_tensor(w, "t1", QT_Q8_0, 2, ne1, t1_data);
    gguf_add_tensor(w, "blk.0.filled", QT_Q4_K, 3, ne2, NULL);
    st = gguf_writer_write(w, path, fill_cb, NULL, e);
    gguf_writer_free(w);
    return st;
}

static void test_roundtrip(void) {
    struct err e;
    const char *path = tmp_path("rt.gguf");
    T_EQ_INT(write_fixture(path, 64, &e), SMELT_OK);
    struct gguf_file *f;
    smelt_status st = gguf_open(&f, path, &e);
    T_CHECKF(st == SMELT_OK, "%s", e.msg);
    if (st) return;
    T_EQ_INT(gguf_version(f), 3);
    T_EQ_INT(gguf_alignment(f), 64);
    T_EQ_INT(gguf_n_splits(f), 1);
    T_EQ_INT(gguf_n_kv(f), 16);
    /* replaced value kept its position (index 2, after architecture and alignment) */
    T_CHECK(gguf_str_eq(gguf_kv_at(f, 2)->key, "llama.block_count"));
    T_EQ_INT(gguf_find_kv(f, "llama.block_count"), 2);
    T_EQ_INT(gguf_find_kv(f, "nope"), -1);
    uint32_t u32;
    T_EQ_INT(gguf_get_u32(f, "llama.block_count", &u32, &e), SMELT_OK);
    T_EQ_INT(u32, 7);
    int64_t i64;
    T_EQ_INT(gguf_get_i64(f, "test.i32", &i64, &e), SMELT_OK);
    T_EQ_INT(i64, -5);
    T_EQ_INT(gguf_get_u32(f, "test.i32", &u32, &e), SMELT_ERR_FORMAT); /* negative */
    uint64_t u64;
    T_EQ_INT(gguf_get_u64(f, "test.u64", &u64, &e), SMELT_OK);
    T_CHECK(u64 == UINT64_MAX);
    T_EQ_INT(gguf_get_u32(f, "test.u64", &u32, &e), SMELT_ERR_FORMAT); /* does not fit */
    T_EQ_INT(gguf_get_i64(f, "test.u64", &i64, &e), SMELT_ERR_FORMAT);
    T_EQ_INT(gguf_get_i64(f, "test.i64", &i64, &e), SMELT_OK);
    T_CHECK(i64 == INT64_MIN);
    float fv;
    T_EQ_INT(gguf_get_f32(f, "test.f32", &fv, &e), SMELT_OK);
    T_CHECK(fv == 0.25f);
    const struct gguf_value *v = gguf_get(f, "test.f64");
    T_CHECK(v && v->type == GGUF_T_FLOAT64 && v->v.f == -1e300);
    bool b = false;
    T_EQ_INT(gguf_get_bool(f, "test.bool", &b, &e), SMELT_OK);
    T_CHECK(b);
    T_EQ_INT(gguf_get_bool(f, "test.f32", &b, &e), SMELT_ERR_FORMAT);
    T_CHECK(strstr(e.msg, "test.f32") != NULL);
    T_EQ_INT(gguf_get_bool(f, "absent", &b, &e), SMELT_ERR_NOT_FOUND);
    struct gguf_str s;
    T_EQ_INT(gguf_get_str(f, "test.empty", &s, &e), SMELT_OK);
    T_EQ_INT(s.len, 0);
    T_EQ_INT(gguf_get_str(f, "general.architecture", &s, &e), SMELT_OK);
    T_CHECK(gguf_str_eq(s, "llama"));
    v = gguf_get(f, "test.u8");
    T_CHECK(v && v->type == GGUF_T_UINT8 && v->v.u == 255);
    v = gguf_get(f, "test.i16");
    T_CHECK(v && v->type == GGUF_T_INT16 && v->v.i == -300);
    const struct gguf_value *a;
    T_EQ_INT(gguf_get_arr(f, "test.f32s", GGUF_T_FLOAT32, &a, &e), SMELT_OK);
    T_EQ_INT(a->v.arr.n, N_F32);
    T_CHECK(gguf_arr_f64(a, 36) == 18.0);
    T_EQ_INT(gguf_get_arr(f, "test.f32s", GGUF_T_INT32, &a, &e), SMELT_ERR_FORMAT);
    T_EQ_INT(gguf_get_arr(f, "test.strs", GGUF_T_STRING, &a, &e), SMELT_OK);
    T_EQ_INT(a->v.arr.n, 4);
    T_CHECK(gguf_str_eq(gguf_arr_str(a, 2), "héllo"));
    T_CHECK(gguf_str_eq(gguf_arr_str(a, 1), ""));
    T_EQ_INT(gguf_get_arr(f, "test.nested", GGUF_T_ARRAY, &a, &e), SMELT_OK);
    T_EQ_INT(a->v.arr.n, 2);
    T_EQ_INT(a->v.arr.items[0].v.arr.n, 2);
    T_EQ_INT(gguf_arr_i64(&a->v.arr.items[0], 1), 2);
    T_EQ_INT(gguf_arr_i64(&a->v.arr.items[1], 0), 3);
    T_EQ_INT(gguf_get_arr(f, "test.nested_str", GGUF_T_ARRAY, &a, &e), SMELT_OK);
    T_CHECK(gguf_str_eq(gguf_arr_str(&a->v.arr.items[0], 0), "p"));
    T_EQ_INT(a->v.arr.items[1].v.arr.n, 0);

    T_EQ_INT(gguf_n_tensors(f), 3);
    const struct gguf_tensor *t = gguf_find_tensor(f, "t0");
    T_CHECK(t && t->type == QT_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 3 &&
            t->ne[2] == 1 && t->nbytes == sizeof t0_data);
    T_CHECK(t && memcmp(t->data, t0_data, sizeof t0_data) == 0);
    T_CHECK(t && (uintptr_t)t->data % 64 == 0);
    t = gguf_find_tensor(f, "t1");
    T_CHECK(t && t->type == QT_Q8_0 && t->nbytes == sizeof t1_data && t->offset % 64 == 0);
    T_CHECK(t && memcmp(t->data, t1_data, sizeof t1_data) == 0);
    t = gguf_find_tensor(f, "blk.0.filled");
    T_CHECK(t && t->nbytes == 2 * 144 && t->n_dims == 3);
    bool ok = t != NULL;
    for (uint64_t i = 0; t && i < t->nbytes; i++) ok &= ((const uint8_t *)t->data)[i] == (uint8_t)(i * 7 + 2);
    T_CHECK(ok);
    T_CHECK(gguf_find_tensor(f, "t") == NULL);
    T_CHECK(gguf_tensor_at(f, 3) == NULL);
    gguf_close(f);

    /* A reader value copies into a writer unchanged (gguf_set_value on nested arrays). */
    st = gguf_open(&f, path, &e);
    T_EQ_INT(st, SMELT_OK);
    if (st) return;
    struct gguf_writer *w;
    gguf_writer_new(&w, &e);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        char key[128];
        gguf_str_copy(gguf_kv_at(f, i)->key, key, sizeof key);
        T_EQ_INT(gguf_set_value(w, key, &gguf_kv_at(f, i)->val), SMELT_OK);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *ti = gguf_tensor_at(f, i);
        char name[128];
        gguf_str_copy(ti->name, name, sizeof name);
        gguf_add_tensor(w, name, ti->type, ti->n_dims, ti->ne, ti->data);
    }
    const char *path2 = tmp_path("rt2.gguf");
    T_EQ_INT(gguf_writer_write(w, path2, NULL, NULL, &e), SMELT_OK);
    gguf_writer_free(w);
    gguf_close(f);
    size_t n1, n2;
    char *b1 = t_read_file(path, &n1), *b2 = t_read_file(path2, &n2);
    T_CHECK(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);
}

static void test_writer_errors(void) {
    struct err e;
    struct gguf_writer *w;
    gguf_writer_new(&w, &e);
    int64_t ne[] = {100};
    T_EQ_INT(gguf_add_tensor(w, "x", QT_Q4_K, 1, ne, NULL), SMELT_ERR_INVALID);
    T_EQ_INT(gguf_add_tensor(w, "y", 4, 1, ne, NULL), SMELT_ERR_INVALID);
    T_EQ_INT(gguf_writer_write(w, tmp_path("never.gguf"), NULL, NULL, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "tensor 'x'") && strstr(e.msg, "block size 256"), "%s", e.msg);
    T_CHECK(access(tmp_path("never.gguf"), F_OK) != 0);
    T_CHECK(access(tmp_path("never.gguf.tmp"), F_OK) != 0);
    gguf_writer_free(w);

    gguf_writer_new(&w, &e);
    T_EQ_INT(gguf_set_u32(w, "general.alignment", 48), SMELT_OK);
    T_EQ_INT(gguf_writer_write(w, tmp_path("never.gguf"), NULL, NULL, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "power of two") != NULL, "%s", e.msg);
    gguf_writer_free(w);

    gguf_writer_new(&w, &e);
    int64_t ne2[] = {32};
    gguf_add_tensor(w, "a", QT_F32, 1, ne2, NULL);
    T_EQ_INT(gguf_add_tensor(w, "a", QT_F32, 1, ne2, NULL), SMELT_ERR_INVALID);
    gguf_writer_free(w);

    gguf_writer_new(&w, &e);
    gguf_add_tensor(w, "a", QT_F32, 1, ne2, NULL);
    T_EQ_INT(gguf_writer_write(w, tmp_path("never.gguf"), NULL, NULL, &e), SMELT_ERR_INVALID);
    T_CHECKF(strstr(e.msg, "no data") != NULL, "%s", e.msg);
    gguf_writer_free(w);

    gguf_writer_new(&w, &e);
    T_EQ_INT(gguf_writer_write(w, "/nonexistent-dir/x.gguf", NULL, NULL, &e), SMELT_ERR_IO);
    gguf_writer_free(w);
}

/* Every proper prefix of a valid file fails cleanly (no crash, a message, no leak). */
static void test_truncation_everywhere(void) {
    struct err e;
    const char *path = tmp_path("trunc.gguf");
    T_EQ_INT(write_fixture(path, 0, &e), SMELT_OK);
    size_t n;
    unsigned char *b = (unsigned char *)t_read_file(path, &n);
    T_CHECK(b != NULL);
    if (!b) return;
    struct gguf_file *f;
    int failures = 0;
    for (uint64_t k = 0; k < n; k++) {
        /* A fresh heap copy of exactly k bytes so ASan catches any read past it. */
        unsigned char *c = malloc(k ? k : 1);
        memcpy(c, b, k);
        smelt_status st = gguf_open_memory(&f, c, k, &e);
        if (st == SMELT_OK) {
            gguf_close(f);
            T_CHECKF(0, "prefix of %llu bytes opened", (unsigned long long)k);
        } else if (!e.msg[0]) {
            T_CHECKF(0, "prefix of %llu bytes: no message", (unsigned long long)k);
        } else {
            failures++;
        }
        free(c);
    }
    T_EQ_INT(failures, n);
    T_EQ_INT(gguf_open_memory(&f, b, n, &e), SMELT_OK);
    gguf_close(f);
    free(b);
}

/* The committed corpus: tests/data/gguf-bad/expected.txt lists FILE<TAB>substring. */
static void test_bad_corpus(void) {
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/tests/data/gguf-bad/expected.txt", SMELT_SOURCE_DIR);
    FILE *m = fopen(mpath, "r");
    T_CHECKF(m != NULL, "cannot open %s", mpath);
    if (!m) return;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, m)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\n")] = 0;
        char *tab = strchr(line, '\t');
        T_CHECKF(tab != NULL, "bad manifest line '%s'", line);
        if (!tab) continue;
        *tab = 0;
        const char *want = tab + 1;
        char fpath[2048];
        snprintf(fpath, sizeof fpath, "%s/tests/data/gguf-bad/%s", SMELT_SOURCE_DIR, line);
        struct gguf_file *f;
        struct err e;
        smelt_status st = gguf_open(&f, fpath, &e);
        T_CHECKF(st != SMELT_OK, "%s opened but should fail with '%s'", line, want);
        if (st == SMELT_OK) {
            gguf_close(f);
        } else {
            T_CHECKF(strstr(e.msg, want) != NULL, "%s: got '%s', want '%s'", line, e.msg, want);
            /* The same bytes through gguf_open_memory fail the same way. */
            size_t sz;
            unsigned char *b = (unsigned char *)t_read_file(fpath, &sz);
            if (b && !strstr(line, "split")) {
                struct err e2;
                T_CHECK(gguf_open_memory(&f, b, sz, &e2) != SMELT_OK);
                T_CHECKF(strstr(e2.msg, want) != NULL, "%s (memory): got '%s'", line, e2.msg);
            }
            free(b);
        }
        n++;
    }
    fclose(m);
    T_CHECKF(n >= 30, "only %d corpus entries", n);
}

static void test_open_errors(void) {
    struct gguf_file *f;
    struct err e;
    T_EQ_INT(gguf_open(&f, tmp_path("does-not-exist.gguf"), &e), SMELT_ERR_NOT_FOUND);
    T_CHECK(f == NULL && strstr(e.msg, "does-not-exist.gguf"));
    T_EQ_INT(gguf_open(&f, tmpdir, &e), SMELT_ERR_IO);
    T_CHECKF(strstr(e.msg, "not a regular file") != NULL, "%s", e.msg);
    FILE *fp = fopen(tmp_path("empty.gguf"), "wb");
    fclose(fp);
    T_EQ_INT(gguf_open(&f, tmp_path("empty.gguf"), &e), SMELT_ERR_FORMAT);
    T_CHECKF(strstr(e.msg, "empty") != NULL, "%s", e.msg);
    T_EQ_INT(gguf_open_memory(&f, "", 0, &e), SMELT_ERR_FORMAT);
}

/* Writes shard i of n (split keys set), holding the given tensors. */
static void write_shard(const char *path, int i, int n, int total, const char *const *names,
                        int nt, bool meta) {
    struct err e;
    struct gguf_writer *w;
    gguf_writer_new(&w, &e);
    if (meta) gguf_set_str(w, "general.architecture", "llama");
    struct gguf_value v16 = {.type = GGUF_T_UINT16, .v.u = (uint64_t)i};
    gguf_set_value(w, "split.no", &v16);
    v16.v.u = (uint64_t)n;
    gguf_set_value(w, "split.count", &v16);
    gguf_set_i32(w, "split.tensors.count", total);
    static float data[32];
    for (int k = 0; k < 32; k++) data[k] = (float)(i * 100 + k);
    int64_t ne[] = {32};
    for (int k = 0; k < nt; k++) gguf_add_tensor(w, names[k], QT_F32, 1, ne, data);
    T_EQ_INT(gguf_writer_write(w, path, NULL, NULL, &e), SMELT_OK);
    gguf_writer_free(w);
}

static void test_split(void) {
    const char *a[] = {"tok_embd", "blk.0.w"}, *b[] = {"blk.1.w"}, *c[] = {"output"};
    write_shard(tmp_path("m-00001-of-00003.gguf"), 0, 3, 4, a, 2, true);
    write_shard(tmp_path("m-00002-of-00003.gguf"), 1, 3, 4, b, 1, false);
    write_shard(tmp_path("m-00003-of-00003.gguf"), 2, 3, 4, c, 1, false);
    struct gguf_file *f;
    struct err e;
    smelt_status st = gguf_open(&f, tmp_path("m-00001-of-00003.gguf"), &e);
    T_CHECKF(st == SMELT_OK, "%s", e.msg);
    if (!st) {
        T_EQ_INT(gguf_n_splits(f), 3);
        T_EQ_INT(gguf_n_tensors(f), 4);
        const struct gguf_tensor *t = gguf_find_tensor(f, "output");
        T_CHECK(t && t->split == 2 && ((const float *)t->data)[5] == 205.0f);
        t = gguf_find_tensor(f, "blk.0.w");
        T_CHECK(t && t->split == 0 && ((const float *)t->data)[1] == 1.0f);
        T_CHECK(gguf_get(f, "general.architecture") != NULL);
        struct stat s1, s2, s3;
        stat(tmp_path("m-00001-of-00003.gguf"), &s1);
        stat(tmp_path("m-00002-of-00003.gguf"), &s2);
        stat(tmp_path("m-00003-of-00003.gguf"), &s3);
        T_EQ_INT(gguf_file_size(f), s1.st_size + s2.st_size + s3.st_size);
        gguf_close(f);
    }
    /* Opening the second shard points at the first. */
    T_CHECK(gguf_open(&f, tmp_path("m-00002-of-00003.gguf"), &e) != SMELT_OK);
    T_CHECKF(strstr(e.msg, "split 2 of 3") != NULL, "%s", e.msg);
    /* A missing shard names the file. */
    unlink(tmp_path("m-00003-of-00003.gguf"));
    T_CHECK(gguf_open(&f, tmp_path("m-00001-of-00003.gguf"), &e) != SMELT_OK);
    T_CHECKF(strstr(e.msg, "m-00003-of-00003.gguf") && strstr(e.msg, "split 3 of 3"), "%s",
             e.msg);
    /* A shard with the wrong split.no. */
    write_shard(tmp_path("m-00003-of-00003.gguf"), 1, 3, 4, c, 1, false);
    T_CHECK(gguf_open(&f, tmp_path("m-00001-of-00003.gguf"), &e) != SMELT_OK);
    T_CHECKF(strstr(e.msg, "split.no=1") != NULL, "%s", e.msg);
    /* Wrong total tensor count. */
    write_shard(tmp_path("m-00003-of-00003.gguf"), 2, 3, 5, c, 1, false);
    write_shard(tmp_path("m-00001-of-00003.gguf"), 0, 3, 5, a, 2, true);
    T_CHECK(gguf_open(&f, tmp_path("m-00001-of-00003.gguf"), &e) != SMELT_OK);
    T_CHECKF(strstr(e.msg, "split.tensors.count is 5") != NULL, "%s", e.msg);
    /* A tensor name repeated across shards. */
    write_shard(tmp_path("m-00001-of-00003.gguf"), 0, 3, 4, a, 2, true);
    write_shard(tmp_path("m-00003-of-00003.gguf"), 2, 3, 4, a, 1, false);
    T_CHECK(gguf_open(&f, tmp_path("m-00001-of-00003.gguf"), &e) != SMELT_OK);
    T_CHECKF(strstr(e.msg, "duplicate tensor name 'tok_embd' (also in split 1)") != NULL, "%s",
             e.msg);
    /* A split file whose name does not follow the pattern. */
    write_shard(tmp_path("renamed.gguf"), 0, 3, 4, a, 2, true);
    T_CHECK(gguf_open(&f, tmp_path("renamed.gguf"), &e) != SMELT_OK);
    T_CHECKF(strstr(e.msg, "NAME-00001-of-00003.gguf") != NULL, "%s", e.msg);
}

/* Real vocab files (figures from gguf-py's GGUFReader on the same files). */
static void test_vocab_files(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/data/vocab/ggml-vocab-deepseek-llm.gguf", t_shared_dir());
    if (access(path, R_OK) != 0) {
        t_skip("../shared/data/vocab/ggml-vocab-deepseek-llm.gguf absent");
        return;
    }
    struct gguf_file *f;
    struct err e;
    double t0 = clock_now();
    smelt_status st = gguf_open(&f, path, &e);
    double dt = clock_now() - t0;
    T_CHECKF(st == SMELT_OK, "%s", e.msg);
    if (st) return;
    printf("open %s: %.2f ms\n", path, dt * 1e3);
    T_EQ_INT(gguf_n_kv(f), 23);
    T_EQ_INT(gguf_n_tensors(f), 0);
    const struct gguf_value *a;
    T_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &a, &e), SMELT_OK);
    T_EQ_INT(a->v.arr.n, 102400);
    uint32_t bos;
    T_EQ_INT(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos, &e), SMELT_OK);
    T_EQ_INT(bos, 100000);
    T_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_STRING, &a, &e), SMELT_OK);
    T_EQ_INT(a->v.arr.n, 99757);
    T_EQ_INT(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_T_INT32, &a, &e), SMELT_OK);
    T_EQ_INT(gguf_arr_i64(a, 100000), 3); /* CONTROL */
    gguf_close(f);
}

/* Real models under models/ (fetched by `make models`): open, every tensor findable by
 * name, sizes from the type table, spans inside the file. */
static void test_real_models(void) {
    const char *names[] = {"gemma3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"};
    int found = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/models/%s", SMELT_SOURCE_DIR, names[k]);
        if (access(path, R_OK) != 0) continue;
        found++;
        struct gguf_file *f;
        struct err e;
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = clock_now();
            smelt_status st = gguf_open(&f, path, &e);
            double dt = clock_now() - t0;
            T_CHECKF(st == SMELT_OK, "%s", e.msg);
            if (st) return;
            if (dt < best) best = dt;
            if (rep < 4) gguf_close(f);
        }
        const struct gguf_value *tok;
        uint64_t nv = 0;
        if (gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &tok, &e) == SMELT_OK)
            nv = tok->v.arr.n;
        printf("open %s (%llu tokens, %lld tensors): best of 5 %.2f ms\n", names[k],
               (unsigned long long)nv, (long long)gguf_n_tensors(f), best * 1e3);
        const uint8_t *lo = NULL, *hi = NULL;
        for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(f, i);
            char name[256];
            gguf_str_copy(t->name, name, sizeof name);
            T_CHECK(gguf_find_tensor(f, name) == t);
            uint64_t rows = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
            T_EQ_INT(t->nbytes, qtype_row_size(t->type, t->ne[0]) * rows);
            const uint8_t *p = t->data;
            if (!lo || p < lo) lo = p;
            if (!hi || p + t->nbytes > hi) hi = p + t->nbytes;
        }
        T_CHECK(hi && (uint64_t)(hi - lo) <= gguf_file_size(f));
        gguf_close(f);
    }
    if (!found) t_skip_model("no models/*.gguf (run `make models`)");
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/smelt-test-gguf-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(test_roundtrip);
    T_RUN(test_writer_errors);
    T_RUN(test_truncation_everywhere);
    T_RUN(test_bad_corpus);
    T_RUN(test_open_errors);
    T_RUN(test_split);
    T_RUN(test_vocab_files);
    T_RUN(test_real_models);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return t_done();
}
