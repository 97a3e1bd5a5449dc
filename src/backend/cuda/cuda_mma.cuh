/* Building blocks of the tensor-core matmul kernels (cuda_mmq.cu, cuda_mmb.cu): cp.async,
 * ldmatrix, mma.sync m16n8k16 (f16 in, f32 accumulators), f16x2 arithmetic rounded once, and
 * the magic-number constants that turn packed integers into f16 exactly. The fragment
 * layouts these kernels rely on are spelled out in cuda_mmq.cu's file comment. sm_80+.
 * (scripts/cuda-emu/patch.py rewrites the inline PTX here for the CPU emulator.) */
#ifndef SMELT_CUDA_MMA_CUH
#define SMELT_CUDA_MMA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

static __device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}

static __device__ __forceinline__ void cp_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> static __device__ __forceinline__ void cp_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. */
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += A B, layouts in the file comment. */
static __device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "cuda_mmq needs sm_80 or newer (mma.sync m16n8k16, cp.async, ldmatrix)"
#endif
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* f16x2 arithmetic on raw words, each rounded once (.rn also keeps ptxas from fusing a
 * sub or mul into an fma, which would change the rounding the tests reproduce). */
static __device__ __forceinline__ uint32_t h2_sub(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t h2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* (a & B) | c in one LOP3 (ptxas splits the C expression in two when the mask and c are
 * both immediates: an instruction takes one). */
template <uint32_t B> static __device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "n"(B), "r"(c));
    return d;
}

static __device__ __forceinline__ uint32_t lds32(const unsigned char *p) {
    return *(const uint32_t *)p;
}

/* f16x2 constants. 0x6400 | q is the f16 1024 + q for q < 1024 (q in the low mantissa
 * bits), so q comes back exactly by a subtraction; a nibble left in bits 4..7 gives
 * 1024 + 16 q, and v * (1/16) - 64 = q is exact too (one fused rounding of an exact
 * value), which saves the shift. */
#define MAGIC 0x64006400u      /* 1024 */
#define H_1024 0x64006400u     /* 1024 */
#define H_1056 0x64206420u     /* 1024 + 32 (Q6_K's offset) */
#define H_1152 0x64806480u     /* 1024 + 128 (Q8_0's and Q6_K scale's sign offset) */
#define H_SIXTEENTH 0x2c002c00u /* 1/16 */
#define H_M64 0xd400d400u      /* -64 */
#define H_M96 0xd600d600u      /* -96 = -64 - 32 */

#endif
