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


/* ---- Dequantization of one 32-bit word of packed weights into f16x2 pairs (cuda_mmb;
 * free for cuda_mmq). A word holds K positions kb..kb+3 in its bytes 0..3 (for the 4-bit
 * types: in the low nibbles, and kb'..kb'+3 of another run in the high nibbles); every helper
 * returns the pair (byte 0, byte 2) in p02 and (byte 1, byte 3) in p13, the order mma's
 * fragments take them in (cuda_mmb.cu's file comment). Each weight is the f16 its reference
 * computes with one rounding: the integer part reaches f16 exactly through the magic number,
 * then one f16 multiply (or FMA) by the f16 scale. The same values as cuda_mmq's kernels
 * where both have the type (Q6_K, Q8_0). */

#define H_1032 0x64086408u /* 1024 + 8 (Q4_0's offset) */
#define H_M72 0xd480d480u  /* -72 = -64 - 8 */

/* Q8_0: 4 int8 weights times {d, d}: f16(q * d). */
static __device__ __forceinline__ void dq_q8_0(uint32_t w, uint32_t d2, uint32_t &p02, uint32_t &p13) {
    w ^= 0x80808080u; /* int8 q -> unsigned q + 128 -> f16 1024 + (q + 128) -> q, exactly */
    p02 = h2_mul(h2_sub(__byte_perm(w, 0x64u, 0x4240), H_1152), d2);
    p13 = h2_mul(h2_sub(__byte_perm(w, 0x64u, 0x4341), H_1152), d2);
}

/* Q4_0: the low (HI = 0) or high (HI = 1) nibbles of w, q - 8, times {d, d}: f16((q - 8) d). */
template <int HI> static __device__ __forceinline__ void dq_q4_0(uint32_t w, uint32_t d2, uint32_t &p02, uint32_t &p13) {
    const uint32_t w8 = w >> 8;
    if (HI) { /* 1024 + 16 q: v / 16 - 72 = q - 8 exactly */
        p02 = h2_mul(h2_fma(and_or<0x00f000f0u>(w, MAGIC), H_SIXTEENTH, H_M72), d2);
        p13 = h2_mul(h2_fma(and_or<0x00f000f0u>(w8, MAGIC), H_SIXTEENTH, H_M72), d2);
    } else {
        p02 = h2_mul(h2_sub(and_or<0x000f000fu>(w, MAGIC), H_1032), d2);
        p13 = h2_mul(h2_sub(and_or<0x000f000fu>(w8, MAGIC), H_1032), d2);
    }
}

/* Q6_K: q - 32 (not yet scaled) of a word of ql and the word of qh whose bytes hold the
 * same bytes' 2-bit fields: the low nibbles take bits 2A..2A+1 of their qh byte, the high
 * nibbles bits 4+2A..5+2A (cuda_mmq.cu's Q6_K dequantization, the same operations). lo: low
 * nibbles {p02, p13}, hi: high nibbles. */
template <int A>
static __device__ __forceinline__ void dq_q6_k(uint32_t ql, uint32_t qh, uint32_t (&lo)[2], uint32_t (&hi)[2]) {
    const uint32_t q02 = A ? qh << 2 : qh << 4; /* bytes 0, 2: low field at bits 4..5, high at 8..9 */
    const uint32_t q13 = qh >> (4 + 2 * A);      /* bytes 1, 3: the same */
    const uint32_t ql8 = ql >> 8;
    lo[0] = h2_sub(and_or<0x000f000fu>(ql, and_or<0x00300030u>(q02, MAGIC)), H_1056);
    lo[1] = h2_sub(and_or<0x000f000fu>(ql8, and_or<0x00300030u>(q13, MAGIC)), H_1056);
    hi[0] = h2_fma(and_or<0x00f000f0u>(ql, and_or<0x03000300u>(q02, MAGIC)), H_SIXTEENTH, H_M96);
    hi[1] = h2_fma(and_or<0x00f000f0u>(ql8, and_or<0x03000300u>(q13, MAGIC)), H_SIXTEENTH, H_M96);
}

/* Q5_K: q (0..31, not yet scaled) of a word of nibbles and its fifth bits h: bits 0..3 of h
 * = the low nibbles' (bytes 0..3), bits 16..19 the high nibbles'. A multiply places two of
 * four bits 16 apart (the shifted copies do not overlap), the mask keeps them: bit 4 (20)
 * of 1024 + q, bit 8 (24) of 1024 + 16 q. lo: low nibbles {p02, p13}, hi: high nibbles. */
static __device__ __forceinline__ void dq_q5_k(uint32_t w, uint32_t h, uint32_t (&lo)[2], uint32_t (&hi)[2]) {
    const uint32_t w8 = w >> 8, hl = h & 0xfu, hh = (h >> 16) & 0xfu;
    lo[0] = h2_sub(and_or<0x000f000fu>(w, and_or<0x00100010u>(hl * 0x00040010u, MAGIC)), H_1024);
    lo[1] = h2_sub(and_or<0x000f000fu>(w8, and_or<0x00100010u>(hl * 0x00020008u, MAGIC)), H_1024);
    hi[0] = h2_fma(and_or<0x00f000f0u>(w, and_or<0x01000100u>(hh * 0x00400100u, MAGIC)), H_SIXTEENTH, H_M64);
    hi[1] = h2_fma(and_or<0x00f000f0u>(w8, and_or<0x01000100u>(hh * 0x00200080u, MAGIC)), H_SIXTEENTH, H_M64);
}

/* ---- Warpgroup MMA (sm_90a): wgmma.mma_async with A in registers, B in shared memory.
 * SMELT_WGMMA is 1 where the device code is built for sm_90a (the emulator sets it too); the
 * kernels that use these helpers are never launched elsewhere (cuda_ctx.wgmma, probed at
 * context creation), and there the helpers trap.
 *
 * A (64 x 16, f16): warp w of the warpgroup holds rows 16w..16w+15 in the fragment layout of
 * mma.m16n8k16's A (cuda_mmq.cu's file comment), four registers a lane. B (16 x N): K-major in
 * shared memory with the 128-byte swizzle: an N-row's K values lie in 128-byte rows of 64
 * values, 8 N-rows make a 1,024-byte atom (1,024-byte aligned; atoms of further N-rows follow
 * 1,024 bytes apart), and the 16-byte unit j of row r within its atom is stored at unit j ^ r
 * (the address bits 4..6 XORed with bits 7..9), so that 8 rows' copies of one unit, and one
 * row's 8 units, each fill all 32 banks. A k16 step reads 32 bytes of each row: the
 * descriptor's start moves 32 bytes per step within an atom's 128-byte width. D (64 x N,
 * f32): warp w's rows 16w.., per 8 columns j the four floats d[j][0..3] at (g, 8j + 2t), (g,
 * 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1): mma.m16n8k16's C layout, one 8-column
 * tile after another. */
#ifndef SMELT_WGMMA
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SMELT_WGMMA 1
#else
#define SMELT_WGMMA 0
#endif
#endif

/* The descriptor of a K-major B with the 128-byte swizzle starting at shared address saddr
 * (14-bit fields of byte values / 16; the atoms of 8 N-rows 1,024 bytes apart, the leading
 * offset unused by this layout, layout type 1 in bits 62..63). Adding bytes / 16 to it moves
 * its start address. */
static __device__ __forceinline__ uint64_t wg_desc_sw128(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

/* Orders this warpgroup's register writes (A fragments, accumulators) before the wgmma that
 * follows; required before each wgmma whose A registers were just written. */
static __device__ __forceinline__ void wg_fence(void) {
#if SMELT_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}
static __device__ __forceinline__ void wg_commit(void) {
#if SMELT_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
/* Waits until at most N committed groups of this warp's wgmma are pending. */
template <int N> static __device__ __forceinline__ void wg_wait(void) {
#if SMELT_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* wgmma reads shared memory through the async proxy: a thread's writes (stores, cp.async
 * landed) become visible to it after this fence, then a barrier for the other threads'. */
static __device__ __forceinline__ void wg_fence_smem(void) {
#if SMELT_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* Keeps the compiler from moving accesses of v across a wgmma fence or wait. */
static __device__ __forceinline__ void wg_pin(float &v) {
    asm volatile("" : "+f"(v)::"memory");
}

/* d (64 x 128) += A (64 x 16) B (16 x 128), asynchronous: complete at wg_wait. */
static __device__ __forceinline__ void wgmma_n128(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc) {
#if SMELT_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
#else
    (void)d, (void)a, (void)desc;
#endif
}

/* d (64 x 64) += A (64 x 16) B (16 x 64), asynchronous: complete at wg_wait. */
static __device__ __forceinline__ void wgmma_n64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
#if SMELT_WGMMA
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
#else
    (void)d, (void)a, (void)desc;
#endif
}

#endif
