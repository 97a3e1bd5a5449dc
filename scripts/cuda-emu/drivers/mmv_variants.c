/* test_cuda_mmv's correctness tests for every one-token kernel shape (SMELT_BENCH_VARIANTS
 * without its timing runs), on the emulator. */
#define main test_main
#include "unit/test_cuda_mmv.c"
#undef main
int main(void) {
    cuda_pdl_on = 1;
    for (cuda_mmv_variant = 1; cuda_mmv_variant <= 10; cuda_mmv_variant++) {
        printf("variant %d\n", cuda_mmv_variant);
        T_RUN(test_mmv_types);
        T_RUN(test_mmv_epilogue);
    }
    cuda_mmv_variant = 0;
    return t_done();
}
