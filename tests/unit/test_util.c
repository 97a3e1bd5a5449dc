#include "t.h"
#include "util/arena.h"
#include "util/array.h"
#include "util/ckd.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/file.h"
#include "util/half.h"
#include "util/log.h"
#include "util/utf8.h"

#include <pthread.h>
#include <stdint.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

static void test_err(void) {
    struct err e;
    err_clear(&e);
    T_EQ_INT(err_set(&e, SMELT_ERR_FORMAT, "tensor %s: bad", "x"), SMELT_ERR_FORMAT);
    T_EQ_STR(e.msg, "tensor x: bad");
    err_prefix(&e, "file %s", "a.gguf");
    T_EQ_STR(e.msg, "file a.gguf: tensor x: bad");
    T_EQ_INT(e.code, SMELT_ERR_FORMAT);
}

/* smelt_last_error: "" at first, the message published last on this thread, untouched by
 * another thread's errors, whole messages of the largest size. */
static void *other_thread(void *arg) {
    const char **seen = arg;
    seen[0] = smelt_last_error()[0] ? "not empty" : "";
    struct err e;
    err_set(&e, SMELT_ERR_IO, "other thread");
    err_publish(&e);
    seen[1] = strcmp(smelt_last_error(), "other thread") ? "wrong" : "ok";
    return NULL;
}

static void test_last_error(void) {
    T_EQ_STR(smelt_last_error(), "");
    struct err e;
    err_set(&e, SMELT_ERR_NOT_FOUND, "tensor %s: absent", "output.weight");
    T_EQ_INT(err_publish(&e), SMELT_ERR_NOT_FOUND);
    T_EQ_STR(smelt_last_error(), "tensor output.weight: absent");
    const char *seen[2] = {"unset", "unset"};
    pthread_t th;
    T_CHECK(pthread_create(&th, NULL, other_thread, seen) == 0);
    pthread_join(th, NULL);
    T_EQ_STR(seen[0], "");
    T_EQ_STR(seen[1], "ok");
    T_EQ_STR(smelt_last_error(), "tensor output.weight: absent");
    memset(e.msg, 'x', sizeof e.msg - 1);
    e.msg[sizeof e.msg - 1] = 0;
    err_publish(&e);
    T_EQ_INT(strlen(smelt_last_error()), ERR_MSG_MAX - 1);
    T_EQ_INT(err_publish(NULL), SMELT_ERR_INTERNAL);
    T_EQ_STR(smelt_last_error(), "no error context");
}

static void test_ckd(void) {
    uint64_t r;
    T_CHECK(!ckd_add_u64(&r, 1, 2) && r == 3);
    T_CHECK(ckd_add_u64(&r, UINT64_MAX, 1));
    T_CHECK(ckd_mul_u64(&r, 1ull << 33, 1ull << 33));
    T_CHECK(!ckd_mul_u64(&r, 1ull << 31, 1ull << 32));
}

static void test_arena(void) {
    struct arena a;
    arena_init(&a);
    for (int round = 0; round < 3; round++) {
        for (int i = 1; i < 200; i++) {
            unsigned char *p = arena_alloc(&a, (size_t)i * 100);
            T_CHECK(p != NULL);
            T_CHECK(((uintptr_t)p & 63) == 0);
            memset(p, i & 0xff, (size_t)i * 100);
        }
        arena_reset(&a);
        T_EQ_INT(a.n, 1); /* merged: the next round runs in one chunk */
    }
    T_CHECK(a.chunks[0].cap >= arena_peak(&a));
    arena_free(&a);
    T_EQ_INT(a.n, 0);
}

/* Chunks from a counting allocator: what the arena takes it gives back, a chunk's
 * memory never moves, marks rewind to the same addresses, reserve leaves one chunk. */
struct count_mem {
    int allocs, frees;
    size_t bytes;
};

static void *count_alloc(void *ctx, size_t align, size_t n) {
    struct count_mem *c = ctx;
    c->allocs++;
    c->bytes += n;
    return aligned_alloc(align, (n + align - 1) & ~(align - 1));
}

static void count_free(void *ctx, void *p) {
    struct count_mem *c = ctx;
    c->frees++;
    free(p);
}

static void test_arena_stack(void) {
    struct count_mem cm = {0};
    struct arena_mem mem = {count_alloc, count_free, &cm};
    struct arena a;
    arena_init_mem(&a, 256, 4096, &mem);
    T_EQ_INT(cm.allocs, 0);
    T_EQ_INT(arena_mark(&a), 0);
    unsigned char *first = arena_alloc(&a, 0); /* 0 bytes: still a valid pointer */
    T_CHECK(first && ((uintptr_t)first & 255) == 0);
    size_t m = arena_mark(&a);
    unsigned char *p[40];
    for (int i = 0; i < 40; i++) { /* grows past several chunks */
        p[i] = arena_alloc(&a, 1000 + (size_t)i);
        T_CHECK(p[i] && ((uintptr_t)p[i] & 255) == 0);
        memset(p[i], i, 1000 + (size_t)i);
    }
    T_CHECK(a.n > 1);
    int bad = 0;
    for (int i = 0; i < 40; i++)
        for (int j = 0; j < 1000 + i; j++) bad += p[i][j] != i;
    T_EQ_INT(bad, 0); /* nothing moved when chunks were added */
    size_t peak = arena_peak(&a);
    T_CHECK(peak >= 40 * 1024);
    arena_release(&a, m);
    T_CHECK(arena_alloc(&a, 1000) == p[0]); /* the same memory again */
    arena_release(&a, arena_mark(&a) + 4096); /* above the top: ignored */
    T_CHECK(arena_alloc(&a, 1001) == p[1]);
    T_CHECK(arena_will_merge(&a));
    arena_reset(&a);
    T_EQ_INT(a.n, 1);
    T_CHECK(a.chunks[0].cap >= peak);
    T_CHECK(!arena_will_merge(&a));
    int allocs = cm.allocs;
    for (int step = 0; step < 5; step++) { /* a steady workload: no allocation */
        size_t mk = arena_mark(&a);
        for (int i = 0; i < 40; i++) T_CHECK(arena_alloc(&a, 1000 + (size_t)i) != NULL);
        arena_release(&a, mk);
        arena_reset(&a);
    }
    T_EQ_INT(cm.allocs, allocs);
    T_CHECK(arena_reserve(&a, (size_t)1 << 20));
    T_EQ_INT(a.n, 1);
    T_CHECK(a.chunks[0].cap >= ((size_t)1 << 20));
    T_CHECK(arena_alloc(&a, ((size_t)1 << 20) - 256) == a.chunks[0].base);
    T_CHECK(arena_alloc(&a, (size_t)1 << 48) == NULL);
    T_CHECK(arena_calloc(&a, 300) != NULL);
    arena_free(&a);
    T_EQ_INT(cm.frees, cm.allocs);
    T_CHECK(arena_alloc(&a, 10) != NULL); /* usable again after free, same allocator */
    arena_free(&a);
    T_EQ_INT(cm.frees, cm.allocs);
}

/* array_grow: doubling from 16, contents kept, the array untouched while it fits,
 * overflow refused with the array and cap untouched. */
static void test_array_grow(void) {
    int32_t *v = NULL;
    size_t cap = 0;
    int moves = 0;
    for (int32_t i = 0; i < 100000; i++) {
        int32_t *before = v;
        T_CHECK(array_grow((void **)&v, &cap, (size_t)i + 1, sizeof *v));
        if (!v) break;
        moves += v != before;
        v[i] = i * 7;
    }
    T_CHECK(cap >= 100000 && cap < 200000);
    T_CHECK(moves <= 14); /* 16 << 13 > 100000 */
    int bad = 0;
    for (int32_t i = 0; i < 100000; i++) bad += v[i] != i * 7;
    T_EQ_INT(bad, 0);
    int32_t *keep = v;
    size_t keep_cap = cap;
    T_CHECK(array_grow((void **)&v, &cap, 10, sizeof *v) && v == keep && cap == keep_cap);
    T_CHECK(!array_grow((void **)&v, &cap, SIZE_MAX / 2, sizeof *v));
    T_CHECK(!array_grow((void **)&v, &cap, SIZE_MAX, 1));
    T_CHECK(v == keep && cap == keep_cap);
    free(v);
    char *b = NULL;
    size_t c0 = 0;
    T_CHECK(array_grow((void **)&b, &c0, 0, 1) && b && c0 == 16); /* none needed: an array */
    free(b);
}

/* file_read_all: every byte (NULs too) of a file larger than one read, a NUL after them,
 * an empty file, and an error that names a missing path. */
static void test_file_read_all(void) {
    char path[] = "/tmp/smelt_test_util_XXXXXX";
    int fd = mkstemp(path);
    T_CHECK(fd >= 0);
    if (fd < 0) return;
    size_t n = 300001;
    unsigned char *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (unsigned char)(i * 31 + (i >> 8));
    T_CHECK(write(fd, data, n) == (ssize_t)n);
    close(fd);
    char *out = NULL;
    size_t len = 0;
    struct err e = {0};
    T_EQ_INT(file_read_all(path, &out, &len, &e), SMELT_OK);
    T_EQ_INT(len, n);
    T_CHECK(out && memcmp(out, data, n) == 0 && out[n] == 0);
    free(out);
    fd = open(path, O_WRONLY | O_TRUNC);
    close(fd);
    T_EQ_INT(file_read_all(path, &out, &len, &e), SMELT_OK);
    T_CHECK(len == 0 && out && out[0] == 0);
    free(out);
    unlink(path);
    T_EQ_INT(file_read_all(path, &out, &len, &e), SMELT_ERR_IO);
    T_CHECK(out == NULL && len == 0 && strstr(e.msg, path) != NULL);
    free(data);
}

/* clock_now moves forward by the time slept; clock_after_ms is normalized and ahead of
 * the wall clock by what it was asked. */
static void test_clock(void) {
    double t0 = clock_now();
    usleep(20000);
    double dt = clock_now() - t0;
    T_CHECKF(dt >= 0.019 && dt < 5.0, "slept 20 ms, measured %.6f s", dt);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct timespec d = clock_after_ms(1999);
    T_CHECK(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    double ahead = (double)(d.tv_sec - now.tv_sec) + (double)(d.tv_nsec - now.tv_nsec) * 1e-9;
    T_CHECKF(ahead >= 1.998 && ahead < 2.5, "ahead %.6f s", ahead);
    d = clock_after_ms(-5);
    ahead = (double)(d.tv_sec - now.tv_sec) + (double)(d.tv_nsec - now.tv_nsec) * 1e-9;
    T_CHECKF(ahead >= 0 && ahead < 0.5, "ahead %.6f s", ahead);
}

static void test_half_roundtrip(void) {
    /* Every f16 bit pattern survives f16 -> f32 -> f16 (NaNs stay NaN). */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = f16_to_f32((uint16_t)h);
        uint16_t back = f32_to_f16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) T_CHECK((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        else T_CHECKF(back == h, "h=%04x back=%04x", h, back);
    }
    T_NEAR(f16_to_f32(0x3c00), 1.0, 0);
    T_NEAR(f16_to_f32(0x0001), 5.960464477539063e-08, 0);
    T_EQ_INT(f32_to_f16(65520.0f), 0x7c00);  /* rounds to Inf */
    T_EQ_INT(f32_to_f16(65519.0f), 0x7bff);
    T_EQ_INT(f32_to_bf16(1.0f), 0x3f80);
    T_NEAR(bf16_to_f32(0x3f80), 1.0, 0);
}

/* The text log's escaping: control characters (C0, DEL, C1) and ill-formed bytes become
 * \xNN, well-formed text stays, and a cut never splits a character or an escape. */
static void test_log_escape(void) {
    char out[64];
    struct {
        const char *in;
        size_t n;
        const char *want;
    } cases[] = {
        {"GET /v1/models", 14, "GET /v1/models"},
        {"/\r\nsmelt: fake\x1b[31m", 19, "/\\x0d\\x0asmelt: fake\\x1b[31m"},
        {"caf\xc3\xa9 \xe2\x82\xac", 9, "caf\xc3\xa9 \xe2\x82\xac"},
        {"a\xff\xc3z", 4, "a\\xff\\xc3z"},          /* ill-formed: byte by byte */
        {"\xc2\x9b" "2J\x7f", 5, "\\xc2\\x9b2J\\x7f"}, /* C1 CSI and DEL */
        {"a\0b", 3, "a\\x00b"},
        {"\t", 1, "\\x09"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = log_escape(out, sizeof out, cases[i].in, cases[i].n);
        T_CHECKF(!strcmp(out, cases[i].want), "case %zu: got '%s'", i, out);
        T_EQ_INT(n, strlen(cases[i].want));
    }
    /* cuts: room for "ab" and half of an escape or of a 3-byte character */
    T_EQ_INT(log_escape(out, 5, "ab\x1b", 3), 2);
    T_EQ_STR(out, "ab");
    T_EQ_INT(log_escape(out, 5, "ab\xe2\x82\xac", 5), 2);
    T_EQ_STR(out, "ab");
    T_EQ_INT(log_escape(out, 6, "ab\xe2\x82\xac", 5), 5);
    T_EQ_INT(log_escape(out, 1, "abc", 3), 0);
    T_EQ_STR(out, "");
    /* utf8_tail_len: where a cut may fall */
    T_EQ_INT(utf8_tail_len((const uint8_t *)"ab", 2), 0);
    T_EQ_INT(utf8_tail_len((const uint8_t *)"a\xe2\x82", 3), 2);
    T_EQ_INT(utf8_tail_len((const uint8_t *)"a\xe2", 2), 1);
    T_EQ_INT(utf8_tail_len((const uint8_t *)"a\xe2\x82\xac", 4), 0);
    T_EQ_INT(utf8_tail_len((const uint8_t *)"a\xff", 2), 0); /* not a character's start */
}

int main(void) {
    T_RUN(test_log_escape);
    T_RUN(test_err);
    T_RUN(test_last_error);
    T_RUN(test_ckd);
    T_RUN(test_arena);
    T_RUN(test_arena_stack);
    T_RUN(test_array_grow);
    T_RUN(test_file_read_all);
    T_RUN(test_clock);
    T_RUN(test_half_roundtrip);
    return t_done();
}
