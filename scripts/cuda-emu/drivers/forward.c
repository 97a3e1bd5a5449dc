/* test_cuda_forward on the emulator: the fixtures (every architecture, F32 and F16), or the
 * GGUF files named on the command line (lenient, as SMELT_CUDA_MODELS; a second argument
 * "strict" for real weights, "quantized" for a fixture with quantized experts, judged
 * against the CPU's reference matmuls), or with the one argument "embed" the embedding
 * models (the bert and qwen3 fixtures against sentence-transformers / transformers, and the real
 * all-MiniLM-L6-v2 from make models against the CPU when it is there). */
#define main test_main
#include "unit/test_cuda_forward.c"
#undef main
static const char *g_path;
static int g_strict;
static void one(void) { check_model(g_path, g_strict == 1 ? REAL : g_strict == 2 ? QUANTIZED : RANDOM); }
int main(int argc, char **argv) {
    if (!backends_new()) return 1; /* test_cuda_forward's: checks use all five */
    if (argc == 2 && !strcmp(argv[1], "embed")) {
        T_RUN(test_gpu_embeddings);
        T_RUN(test_real_minilm);
    } else if (argc > 1) {
        g_path = argv[1];
        g_strict = argc < 3 ? 0 : !strcmp(argv[2], "strict") ? 1 : !strcmp(argv[2], "quantized") ? 2 : 0;
        T_RUN(one);
    } else {
        T_RUN(test_fixtures);
    }
    backends_free();
    return t_done();
}
