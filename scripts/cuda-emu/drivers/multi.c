/* test_cuda_multi's single-thread parts on the emulator: the lone runs and two backends
 * interleaved step by step, bitwise against the lone ones (the emulator runs one host
 * thread, so not the concurrent phases; both backends are on its one device). */
#define main test_main
#include "unit/test_cuda_multi.c"
#undef main
int main(void) {
    if (!setup()) return 1;
    T_RUN(test_lone);
    T_RUN(test_interleaved);
    teardown();
    return t_done();
}
