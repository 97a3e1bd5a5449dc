/* The i-quant and ternary kernels of cpu_matmul_iq_avx2.c compiled with the AVX-512 flags
 * (VL + VNNI): the same decode and tile, with vpdpwssd fusing the scale multiply and the
 * int32 accumulation (one instruction per 32 weights fewer). Registered at the AVX-512
 * level by cpu_kernels_avx512. */
#define IQ_AVX512 1
#include "cpu_matmul_iq_avx2.c"
