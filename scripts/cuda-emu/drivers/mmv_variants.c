/* test_cuda_mmv's correctness tests for every one-token kernel shape (SMELT_BENCH_VARIANTS
 * without its timing runs), on the emulator. */
#define main test_main
#include "unit/test_cuda_mmv.c"
#undef main
int main(void) {
    struct err e;
    if (cuda_ctx_init(&g_ctx, 0, NULL, &e) != SMELT_OK) return 1;
    for (g_ctx.mmv_variant = 1; g_ctx.mmv_variant <= 10; g_ctx.mmv_variant++) {
        printf("variant %d\n", g_ctx.mmv_variant);
        T_RUN(test_mmv_types);
        T_RUN(test_mmv_epilogue);
    }
    cuda_ctx_free(&g_ctx);
    return t_done();
}
