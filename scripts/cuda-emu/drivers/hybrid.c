/* test_cuda_forward's hybrid checks on the emulator: the ref-hybrid fixtures through
 * hybrid_check.h's scenarios against transformers (test_hybrid: qwen35, qwen35moe and
 * qwen3next), then check_model's GPU-vs-CPU check (logits, greedy text, batch invariance
 * with its op trace) on every fixture file. */
#define main test_main
#include "unit/test_cuda_forward.c"
#undef main
static void qwen35_vs_cpu(void) {
    const char *files[] = {"qwen35-f32.gguf", "qwen35-f16.gguf", "qwen35moe-f16.gguf", "qwen3next-f16.gguf",
                           "qwen3next-f16-ssm_in.gguf"};
    for (int i = 0; i < 5; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/tests/data/ref-hybrid/%s", t_source_dir(), files[i]);
        check_model(path, FIXTURE);
    }
}
int main(void) {
    struct err e;
    if (cpu_backend_new(&cpu, 0, &e) != SMELT_OK || cuda_backend_new(&gpu, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    /* test_hybrid's F16 files also run with every product on mmv (test_cuda_forward's main) */
    setenv("SMELT_GEMM_MIN_ROWS", "1000000000", 1);
    if (cuda_backend_new(&gpu_f32act, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    unsetenv("SMELT_GEMM_MIN_ROWS");
    T_RUN(test_hybrid);
    T_RUN(qwen35_vs_cpu);
    bk_free(gpu_f32act);
    bk_free(gpu);
    bk_free(cpu);
    return t_done();
}
