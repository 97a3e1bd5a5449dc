#include "t.h"
#include "util/arena.h"
#include "util/ckd.h"
#include "util/err.h"
#include "util/half.h"

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

int main(void) {
    T_RUN(test_err);
    T_RUN(test_ckd);
    T_RUN(test_arena);
    T_RUN(test_half_roundtrip);
    return t_done();
}
