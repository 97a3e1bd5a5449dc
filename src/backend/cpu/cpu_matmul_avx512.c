/* AVX-512 (F/BW/VL/DQ + VNNI) matmul kernels and quantizers. Until a type has its own
 * AVX-512 kernel it uses the AVX2 one (the table is copied from the AVX2 level first). */
#if defined(__x86_64__)
#include <immintrin.h>

#include "backend/cpu/cpu_kernels.h"

void cpu_quantize_q8_32_avx512(const float *x, void *q, int64_t k) {
    cpu_quantize_q8_32_avx2(x, q, k);
}

void cpu_quantize_q8_K_avx512(const float *x, void *q, int64_t k) {
    cpu_quantize_q8_K_avx2(x, q, k);
}

void cpu_kernels_avx512(struct cpu_kernel tab[QT_COUNT]) { (void)tab; }
#endif
