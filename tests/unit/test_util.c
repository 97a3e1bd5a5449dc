#include "t.h"
#include "util/arena.h"
#include "util/ckd.h"
#include "util/err.h"
#include "util/half.h"
#include "util/log.h"
#include "util/utf8.h"

#include <pthread.h>
#include <stdint.h>

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
    }
    T_CHECK(a.spill == NULL);
    T_CHECK(a.cap >= a.peak);
    arena_free(&a);
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
    T_RUN(test_half_roundtrip);
    return t_done();
}
