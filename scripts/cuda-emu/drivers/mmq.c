/* test_cuda_mmq on the emulator, at sizes it can run in about a minute: every mmq type on a
 * small shape and a partial last K slice (Q8_0, MXFP4), every tile, the GLU products, the stacked
 * products and the argument checks.
 * The full test (4096-row shapes, 512 tokens) is the GPU's. */
#define main test_main
#include "unit/test_cuda_mmq.c"
#undef main
static void small_types(void) {
    const int ns[] = {9, 33, 100};
    check_weight(QT_Q4_K, 67, 768, ns, 3, 0);
    check_weight(QT_Q6_K, 40, 512, ns, 3, 0);
    check_weight(QT_Q8_0, 131, 896, ns, 3, 0); /* 3.5 units */
    check_weight(QT_MXFP4, 40, 64, ns, 3, 0);  /* a single partial unit */
    check_weight(QT_MXFP4, 131, 2880, ns, 3, 0); /* gpt-oss's width: 11 units and 2 blocks */
    const int full[] = {136}; /* a whole 128-token tile (the wgmma tiles' unclamped copy) */
    check_weight(QT_Q4_K, 67, 768, full, 1, 0);
    check_weight(QT_Q8_0, 131, 896, full, 1, 0);
}
static void small_glu(void) { /* gate and up interleaved in eights, the activation in the store */
    const int ns[] = {9, 100};
    check_glu(QT_Q4_K, 40, 512, ns, 2, 0);
    check_glu(QT_Q6_K, 24, 256, ns, 2, 1);
    check_glu(QT_Q8_0, 72, 896, ns, 2, 2);
    check_glu(QT_MXFP4, 16, 2880, ns, 1, 3);
    const int full[] = {136};
    check_glu(QT_Q4_K, 80, 256, full, 1, 0); /* and the f16 output */
}
static void small_stack(void) { /* matrices stacked in one launch, a tile holding rows of several */
    const int ns[] = {9, 100};
    const int64_t odd[3] = {67, 40, 21}, two[2] = {136, 40};
    check_stack(QT_Q4_K, odd, 3, 768, ns, 2);
    check_stack(QT_Q6_K, two, 2, 512, ns, 1);
    check_stack(QT_Q8_0, odd, 3, 896, ns, 1);
    check_stack(QT_MXFP4, two, 2, 2880, ns, 1);
}
int main(void) {
    struct err e;
    if (cuda_ctx_init(&g_ctx, 0, NULL, &e) != SMELT_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    T_RUN(test_mmq_rejects);
    T_RUN(small_types);
    T_RUN(small_glu);
    T_RUN(small_stack);
    return t_done();
}
