/* test_cuda_topk on the emulator at smaller sizes: the op against its CPU twin with and
 * without token masks (TOPK_MASK) on ragged vocabularies at 1, 3 and 40 rows and above the
 * kernel's row counters (the merge's own launch), model_step with masks written while the
 * forward runs (eager, captured, replayed), and the sampler on device summaries (masked
 * rows included). The GPU run (scripts/gpu-check.sh) takes the full sizes. */
#define main test_main
#include "unit/test_cuda_topk.c"
#undef main

static void test_op_small(void) {
    unsigned long long rs = 0x70c;
    int bad = 0, checked = 0;
    const int nvs[] = {151936, 4099, 70001, 1, 33};
    const int rows[] = {1, 3, 40};
    for (size_t i = 0; i < sizeof nvs / sizeof nvs[0]; i++)
        for (size_t j = 0; j < sizeof rows / sizeof rows[0]; j++)
            if (nvs[i] < 100000 || rows[j] == 1) run_config(nvs[i], rows[j], &rs, &bad, &checked);
    run_config(33, 1025, &rs, &bad, &checked);
    printf("op vs twin: %d rows checked, %d differ\n", checked, bad);
    T_CHECKF(bad == 0, "%d rows differ from the CPU twin", bad);
}

int main(void) {
    struct err e;
    if (cuda_backend_new(&gpu, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    T_RUN(test_op_small);
    T_RUN(test_model_step_graphs);
    T_RUN(test_sampler_on_device);
    bk_free(gpu);
    return t_done();
}
