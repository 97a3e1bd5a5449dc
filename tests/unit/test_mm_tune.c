/* The matmul path table (src/backend/cuda/mm_tune.c): buckets, candidate lists, the write-once
 * table, the environment overrides and the log text. Host-only (no GPU); the timing
 * itself is exercised by test_cuda_mmq (test_mmq_tuned) on a GPU. The expectations are
 * written out by hand from the bucket list and rules in mm_tune.h, not computed with the
 * functions under test. */
#include "t.h"

#include <stdint.h>
#include <string.h>

#include "backend/cuda/mm_tune.h"
#include "quant/quant.h"

static void test_buckets(void) {
    /* n -> bucket, at every edge */
    const struct {
        int64_t n;
        int b;
    } cases[] = {{-3, -1}, {0, -1},  {1, -1},  {8, -1},  {9, 0},   {16, 0},   {17, 1},
                 {32, 1},  {33, 2},  {48, 2},  {49, 3},  {64, 3},  {65, 4},   {128, 4},
                 {129, 5}, {256, 5}, {257, 6}, {512, 6}, {513, 7}, {4096, 7}, {INT64_MAX, 7}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        T_CHECKF(mmtune_bucket(cases[i].n) == cases[i].b, "n=%lld: bucket %d, want %d",
                 (long long)cases[i].n, mmtune_bucket(cases[i].n), cases[i].b);
    /* the ranges tile 9 .. infinity without gaps or overlaps */
    const int64_t lo_want[MMTUNE_BUCKETS] = {9, 17, 33, 49, 65, 129, 257, 513};
    const int64_t hi_want[MMTUNE_BUCKETS] = {16, 32, 48, 64, 128, 256, 512, INT64_MAX};
    for (int b = 0; b < MMTUNE_BUCKETS; b++) {
        int64_t lo, hi;
        mmtune_bucket_range(b, &lo, &hi);
        T_CHECKF(lo == lo_want[b] && hi == hi_want[b], "bucket %d: %lld-%lld", b, (long long)lo,
                 (long long)hi);
        T_EQ_INT(mmtune_bucket(lo), b);
        if (hi != INT64_MAX) T_EQ_INT(mmtune_bucket(hi), b);
    }
}

/* The tensor-core kernel's tiles as of this writing (cuda_mmq.cu): token widths 16, 16, 32,
 * 32, 64, 128, 64; the test fixes its own copy so a new tile list does not silently
 * change what is expected here. */
static const int bn7[7] = {16, 16, 32, 32, 64, 128, 64};

static int cands(int64_t n, const int *fits, bool mmq, int64_t mmq_max, bool gemm, bool mmv,
                 int *out) {
    struct mmtune_space s = {.n_tiles = 7,
                             .tile_bn = bn7,
                             .tile_fits = fits,
                             .mmq = mmq,
                             .mmq_max_rows = mmq_max,
                             .gemm = gemm,
                             .mmv = mmv};
    return mmtune_candidates(n, &s, out, MMTUNE_MAX_CAND);
}

static int same(const int *a, int na, const int *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, sizeof(int) * (size_t)na) == 0);
}

/* The small-batch kernel (mmb): first among the candidates from 2 to 64 rows; at 2..8 rows
 * it is weighed against mmv alone; not at 1 row or above 64. */
static void test_candidates_mmb(void) {
    const int all[7] = {1, 1, 1, 1, 1, 1, 1};
    struct mmtune_space s = {.n_tiles = 7, .tile_bn = bn7, .tile_fits = all, .mmq = true,
                             .mmq_max_rows = INT64_MAX, .gemm = true, .mmv = true, .mmb = true};
    int out[MMTUNE_MAX_CAND], n;
    T_EQ_INT(mmtune_candidates(1, &s, out, MMTUNE_MAX_CAND), 0);
    n = mmtune_candidates(2, &s, out, MMTUNE_MAX_CAND);
    T_CHECK(same(out, n, (int[]){MMTUNE_MMB, MMTUNE_MMV}, 2));
    n = mmtune_candidates(8, &s, out, MMTUNE_MAX_CAND);
    T_CHECK(same(out, n, (int[]){MMTUNE_MMB, MMTUNE_MMV}, 2));
    n = mmtune_candidates(9, &s, out, MMTUNE_MAX_CAND);
    T_CHECK(same(out, n, (int[]){MMTUNE_MMB, 0, 1, MMTUNE_GEMM, MMTUNE_MMV}, 5));
    n = mmtune_candidates(64, &s, out, MMTUNE_MAX_CAND);
    T_CHECK(n > 0 && out[0] == MMTUNE_MMB);
    n = mmtune_candidates(65, &s, out, MMTUNE_MAX_CAND);
    T_CHECK(n > 0 && out[0] != MMTUNE_MMB);
    s.mmb = false;
    T_EQ_INT(mmtune_candidates(4, &s, out, MMTUNE_MAX_CAND), 0);
    int64_t lo, hi;
    /* one small bucket per row count 2..8, distinct from each other and the regular ones */
    T_EQ_INT(mmtune_bucket_small(1), -1);
    T_EQ_INT(mmtune_bucket_small(9), -1);
    for (int64_t r = 2; r <= 8; r++) {
        const int b = mmtune_bucket_small(r);
        T_CHECK(b >= MMTUNE_BUCKETS);
        T_CHECK(r == 2 || b == mmtune_bucket_small(r - 1) + 1);
        mmtune_bucket_range(b, &lo, &hi);
        T_CHECKF(lo == r && hi == r, "small bucket of %lld: range %lld-%lld", (long long)r, (long long)lo,
                 (long long)hi);
    }
}

static void test_candidates(void) {
    const int all[7] = {1, 1, 1, 1, 1, 1, 1};
    int out[MMTUNE_MAX_CAND], n;
    /* n = 9: the 16-wide tiles only (32+ is mostly padding), cuBLAS, mmv */
    n = cands(9, all, true, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){0, 1, MMTUNE_GEMM, MMTUNE_MMV}, 4));
    /* n = 16: 32-wide tiles join (32 = 2n is not "more than" 2n) */
    n = cands(16, all, true, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){0, 1, 2, 3, MMTUNE_GEMM, MMTUNE_MMV}, 6));
    /* n = 32: 64-wide join; mmv still (its limit is 32) */
    n = cands(32, all, true, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){0, 1, 2, 3, 4, 6, MMTUNE_GEMM, MMTUNE_MMV}, 8));
    /* n = 33: mmv drops out, 128-wide still padding (128 > 66) */
    n = cands(33, all, true, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){0, 1, 2, 3, 4, 6, MMTUNE_GEMM}, 7));
    /* n = 64: every tile */
    n = cands(64, all, true, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){0, 1, 2, 3, 4, 5, 6, MMTUNE_GEMM}, 8));
    /* n = 257: the 16-wide tiles would dequantize each weight 17 times */
    n = cands(257, all, true, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){2, 3, 4, 5, 6, MMTUNE_GEMM}, 6));
    /* n = 600: 32-wide out too */
    n = cands(600, all, true, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){4, 5, 6, MMTUNE_GEMM}, 4));
    /* tiles that do not fit the device are never candidates */
    const int some[7] = {1, 0, 1, 0, 0, 1, 1};
    n = cands(64, some, true, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){0, 2, 5, 6, MMTUNE_GEMM}, 5));
    /* SMELT_MMQ_MAX_ROWS fixed the switch: tiles only, and none above it */
    n = cands(40, all, true, 64, false, false, out);
    T_CHECK(same(out, n, (int[]){0, 1, 2, 3, 4, 6}, 6));
    n = cands(100, all, true, 64, false, false, out);
    T_EQ_INT(n, 0);
    /* no mmq for the type: cuBLAS against mmv below 33, nothing to choose above */
    n = cands(20, all, false, INT64_MAX, true, true, out);
    T_CHECK(same(out, n, (int[]){MMTUNE_GEMM, MMTUNE_MMV}, 2));
    T_EQ_INT(cands(40, all, false, INT64_MAX, true, true, out), 0);
    /* one candidate is no choice; n <= 8 is never tuned */
    const int one[7] = {0, 0, 0, 0, 1, 0, 0};
    T_EQ_INT(cands(64, one, true, 64, false, false, out), 0);
    T_EQ_INT(cands(8, all, true, INT64_MAX, true, true, out), 0);
    /* the output bound is respected */
    struct mmtune_space s = {.n_tiles = 7,
                             .tile_bn = bn7,
                             .tile_fits = all,
                             .mmq = true,
                             .mmq_max_rows = INT64_MAX,
                             .gemm = true,
                             .mmv = true};
    int small[3] = {99, 99, 99};
    T_EQ_INT(mmtune_candidates(64, &s, small, 2), 2);
    T_EQ_INT(small[2], 99);
}

static void test_fastest_median(void) {
    T_EQ_INT(mmtune_fastest((float[]){3, 2, 5}, 3), 1);
    T_EQ_INT(mmtune_fastest((float[]){-1, 4, 4}, 3), 1); /* failed ones skipped; ties: the first */
    T_EQ_INT(mmtune_fastest((float[]){NAN, 0, 7}, 3), 2);
    T_EQ_INT(mmtune_fastest((float[]){-1, -1}, 2), -1);
    T_EQ_INT(mmtune_fastest(NULL, 0), -1);
    float v[3] = {9, 1, 5};
    T_NEAR(mmtune_median(v, 3), 5.0, 0);
    float w[3] = {2, 2, 100}; /* one outlier (a context switch) does not move it */
    T_NEAR(mmtune_median(w, 3), 2.0, 0);
    float x[4] = {4, 1, 3, 2};
    T_NEAR(mmtune_median(x, 4), 2.5, 0);
}

static void test_table(void) {
    struct mmtune t;
    struct err e;
    mmtune_init(&t);
    struct mmtune_key k1 = {QT_Q4_K, 4096, 4096, 2}, k2 = {QT_Q4_K, 4096, 4096, 3},
                      k3 = {QT_Q6_K, 4096, 4096, 2}, k4 = {QT_Q4_K, 14336, 4096, 2},
                      k5 = {QT_Q4_K, 4096, 14336, 2};
    T_CHECK(mmtune_find(&t, &k1) == NULL);
    const struct mmtune_ent *got = NULL;
    T_EQ_INT(mmtune_put(&t, &(struct mmtune_ent){.key = k1, .choice = 6, .n = 40, .us = 21.0f},
                        &got, &e),
             SMELT_OK);
    T_CHECK(got && got->choice == 6);
    /* keys differing in one field each are distinct */
    T_CHECK(mmtune_find(&t, &k2) == NULL);
    T_CHECK(mmtune_find(&t, &k3) == NULL);
    T_CHECK(mmtune_find(&t, &k4) == NULL);
    T_CHECK(mmtune_find(&t, &k5) == NULL);
    /* write-once: a second put of the same key keeps the first choice */
    T_EQ_INT(mmtune_put(&t,
                        &(struct mmtune_ent){.key = k1, .choice = MMTUNE_GEMM, .n = 48, .us = 5.0f},
                        &got, &e),
             SMELT_OK);
    T_CHECK(got && got->choice == 6 && got->n == 40);
    T_EQ_INT(t.n, 1);
    T_EQ_INT(t.n_tuned, 1);
    /* a static fallback (us = 0) is recorded but not counted as measured */
    T_EQ_INT(mmtune_put(&t, &(struct mmtune_ent){.key = k2, .choice = MMTUNE_MMQ_AUTO, .n = 50},
                        NULL, &e),
             SMELT_OK);
    T_EQ_INT(t.n_tuned, 1);
    T_EQ_INT(mmtune_find(&t, &k2)->choice, MMTUNE_MMQ_AUTO);
    /* growth keeps every entry (past the first reallocation) */
    for (int i = 0; i < 300; i++) {
        struct mmtune_key k = {QT_Q8_0, 100 + i, 4096, i % MMTUNE_BUCKETS};
        T_EQ_INT(mmtune_put(&t, &(struct mmtune_ent){.key = k, .choice = i % 7, .n = 9, .us = 1.0f},
                            NULL, &e),
                 SMELT_OK);
    }
    T_EQ_INT(t.n, 302);
    int ok = 1;
    for (int i = 0; i < 300; i++) {
        struct mmtune_key k = {QT_Q8_0, 100 + i, 4096, i % MMTUNE_BUCKETS};
        const struct mmtune_ent *f = mmtune_find(&t, &k);
        ok &= f && f->choice == i % 7;
    }
    T_CHECK(ok);
    T_EQ_INT(mmtune_find(&t, &k1)->choice, 6);
    /* full: refused with a message */
    for (int i = t.n; i < MMTUNE_MAX_ENTRIES; i++) {
        struct mmtune_key k = {QT_Q6_K, 1000 + i, 256, 0};
        if (mmtune_put(&t, &(struct mmtune_ent){.key = k, .choice = 0}, NULL, &e) != SMELT_OK)
            break;
    }
    T_EQ_INT(t.n, MMTUNE_MAX_ENTRIES);
    struct mmtune_key kx = {QT_Q6_K, 7, 256, 0};
    T_EQ_INT(mmtune_put(&t, &(struct mmtune_ent){.key = kx, .choice = 0}, NULL, &e),
             SMELT_ERR_NOMEM);
    T_CHECK(strstr(e.msg, "full") != NULL);
    mmtune_free(&t);
    T_EQ_INT(t.n, 0);
    T_CHECK(t.e == NULL);
}

static void test_env(void) {
    struct mmtune_env env;
    bool bad;
    mmtune_env_parse(NULL, NULL, 7, &env, &bad);
    T_CHECK(env.tune && env.tile == MMTUNE_MMQ_AUTO && !bad);
    mmtune_env_parse("1", NULL, 7, &env, &bad);
    T_CHECK(!env.tune && env.tile == MMTUNE_MMQ_AUTO && !bad);
    mmtune_env_parse("0", "", 7, &env, &bad); /* "0" and empty: not set */
    T_CHECK(env.tune && env.tile == MMTUNE_MMQ_AUTO && !bad);
    mmtune_env_parse(NULL, "6", 7, &env, &bad);
    T_CHECK(!env.tune && env.tile == 6 && !bad);
    mmtune_env_parse(NULL, "0", 7, &env, &bad);
    T_CHECK(!env.tune && env.tile == 0 && !bad);
    const char *wrong[] = {"7", "-1", "x", "3x", " 2"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        mmtune_env_parse(NULL, wrong[i], 7, &env, &bad);
        T_CHECKF(bad && env.tune && env.tile == MMTUNE_MMQ_AUTO, "SMELT_MMQ_TILE=\"%s\"", wrong[i]);
    }
}

static void name7(int tile, char *buf, size_t size) {
    static const int bm[7] = {128, 256, 128, 256, 256, 128, 128};
    snprintf(buf, size, "%dx%d", bm[tile], bn7[tile]);
}

static void test_format(void) {
    char name[32];
    T_EQ_STR(mmtune_choice_name(MMTUNE_GEMM, name7, name, sizeof name), "cuBLAS");
    T_EQ_STR(mmtune_choice_name(MMTUNE_MMV, name7, name, sizeof name), "mmv x8");
    T_EQ_STR(mmtune_choice_name(MMTUNE_MMB, name7, name, sizeof name), "mmb");
    T_EQ_STR(mmtune_choice_name(6, name7, name, sizeof name), "mmq 128x64");
    T_EQ_STR(mmtune_choice_name(MMTUNE_MMQ_AUTO, name7, name, sizeof name), "mmq auto");
    struct mmtune t;
    struct err e;
    mmtune_init(&t);
    char buf[1024];
    T_EQ_INT((int)mmtune_format(&t, name7, buf, sizeof buf), 0);
    T_EQ_STR(buf, "");
    /* put out of order: printed grouped by shape, buckets ascending */
    mmtune_put(&t,
               &(struct mmtune_ent){
                   .key = {QT_Q4_K, 4096, 4096, 6}, .choice = MMTUNE_GEMM, .n = 512, .us = 57.8f},
               NULL, &e);
    mmtune_put(
        &t,
        &(struct mmtune_ent){.key = {QT_Q4_K, 14336, 4096, 0}, .choice = 1, .n = 16, .us = 26.2f},
        NULL, &e);
    mmtune_put(
        &t, &(struct mmtune_ent){.key = {QT_Q4_K, 4096, 4096, 0}, .choice = 0, .n = 9, .us = 16.6f},
        NULL, &e);
    mmtune_put(
        &t,
        &(struct mmtune_ent){.key = {QT_Q4_K, 4096, 4096, 7}, .choice = MMTUNE_MMQ_AUTO, .n = 600},
        NULL, &e);
    size_t len = mmtune_format(&t, name7, buf, sizeof buf);
    const char *want =
        "Q4_K 4096x4096: 9-16 mmq 128x16 (16.6 us at n=9), 257-512 cuBLAS (57.8 us at n=512), "
        ">512 mmq auto (static)\n"
        "Q4_K 14336x4096: 9-16 mmq 256x16 (26.2 us at n=16)";
    T_EQ_STR(buf, want);
    T_EQ_INT((int)len, (int)strlen(want));
    /* truncation: always terminated, never past the buffer */
    char tiny[20];
    memset(tiny, 'Z', sizeof tiny);
    len = mmtune_format(&t, name7, tiny, 16);
    T_EQ_INT((int)len, 15);
    T_CHECK(tiny[15] == '\0' && tiny[16] == 'Z');
    T_CHECK(strncmp(tiny, want, 15) == 0);
    mmtune_free(&t);
}

int main(void) {
    T_RUN(test_buckets);
    T_RUN(test_candidates);
    T_RUN(test_candidates_mmb);
    T_RUN(test_fastest_median);
    T_RUN(test_table);
    T_RUN(test_env);
    T_RUN(test_format);
    return t_done();
}
