/* test_cuda_attn's kernel-level tests (the plan, the fused decode kernel with its int8
 * output, the PDL chain eagerly and as a replayed graph) on the emulator; the cases that go
 * through the CUDA backend run in forward.c's models instead. */
#define main test_main
#include "unit/test_cuda_attn.c"
#undef main
int main(void) {
    struct err e;
    if (cpu_backend_new(&cpu, 2, &e) != SMELT_OK || cuda_ctx_init(&g_ctx, 0, NULL, &e) != SMELT_OK) return 1;
    T_RUN(test_attn_plan);
    T_RUN(test_attn_fused);
    T_RUN(test_attn_pdl);
    cuda_ctx_free(&g_ctx);
    bk_free(cpu);
    return t_done();
}
