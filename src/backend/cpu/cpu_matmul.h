/* Quantized matrix multiply for the CPU backend: Y = X · Wᵀ.
 *
 *   W: `rows` rows of k elements of GGUF type wtype, packed as in the file; row r starts at
 *      (const char *)w + r * row_bytes, row_bytes = qtype_row_size(wtype, k).
 *   X: n rows of k f32, row-major (row c at x + c*k).
 *   Y: n rows of `rows` f32, row-major: y[c*rows + r] = sum_i W[r][i] * X[c][i].
 *
 * X is quantized once per call into the 8-bit format that wtype dots against (see
 * cpu_kernels.h): blocks of 32 with an f32 scale for the legacy types (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, IQ4_NL), super-blocks of 256 (Q8_K-like) for the K-quants and IQ4_XS. The
 * dot products are then integer (u8/s8 multiply-adds, int32 sums), one float multiply-add
 * per block. F32, F16 and BF16 weights are dotted in f32 against X as given. Types without
 * an integer kernel (IQ1/IQ2/IQ3, TQ, MXFP4) take a slower path: each thread dequantizes
 * one weight row at a time to f32 (quant/ reference) and dots it against all n rows of X.
 *
 * Work is split across the pool by chunks of weight rows (and of X rows when n is large),
 * handed out dynamically; each chunk runs a register-tiled kernel (4 weight rows × several
 * X rows) so a weight block is unpacked once and reused. For n >= 8 (prefill) most types
 * first unpack the chunk's weight rows into a per-thread L2 buffer once, so the tiles only
 * load (the "packed" path, cpu_kernels.h).
 *
 * scratch: the per-step arena; the quantized X (about n*k*1.1 bytes) and per-thread
 * buffers come from it and stay allocated until the caller resets it. NULL: heap
 * memory, freed before return.
 */
#ifndef SMELT_BACKEND_CPU_MATMUL_H
#define SMELT_BACKEND_CPU_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_pool.h"
#include "util/arena.h"
#include "util/err.h"

/* Y[n][rows] = X[n][k] · W[rows][k]ᵀ with the best ISA (cpu_isa_best()). Errors:
 * SMELT_ERR_UNSUPPORTED naming the type when wtype has no kernel nor reference
 * dequantizer; SMELT_ERR_INVALID when k is not a multiple of the type's block size or a
 * size is negative; SMELT_ERR_NOMEM. n == 0 or rows == 0 does nothing. */
smelt_status cpu_matmul(struct cpu_pool *p, uint32_t wtype, const void *w, int64_t rows, int64_t k,
                        const float *x, int64_t n, float *y, struct arena *scratch, struct err *e);

/* Same with an explicit ISA level (lowered to what the machine supports): tests and
 * benchmarks compare the paths with it. */
smelt_status cpu_matmul_isa(struct cpu_pool *p, enum cpu_isa isa, uint32_t wtype, const void *w,
                            int64_t rows, int64_t k, const float *x, int64_t n, float *y,
                            struct arena *scratch, struct err *e);

/* One product of a batch: y[n][rows] = x[n][k] · w[rows][k]ᵀ, as in cpu_matmul; with rw
 * (cpu_matmul_repack) the weights are its repacked copy, and wtype, w, rows and k are
 * taken from it. */
struct cpu_rweight;
struct cpu_mm {
    uint32_t wtype;
    const void *w;
    int64_t rows, k;
    const float *x;
    int64_t n;
    float *y;
    const struct cpu_rweight *rw; /* NULL: w in the file layout */
};

/* Several independent products in one parallel region: every X quantized in one pass,
 * then the chunks of all products handed out from one counter, so a batch of small
 * products (the experts an MoE layer selects, a few rows each) costs one fork-join, not
 * one per product. Each product's y is the same bits cpu_matmul gives it alone (same
 * kernel, same chunk plan). Errors as cpu_matmul's, for the first bad product; nothing
 * runs then. */
smelt_status cpu_matmul_batch(struct cpu_pool *p, const struct cpu_mm *mm, int n_mm,
                              struct arena *scratch, struct err *e);
smelt_status cpu_matmul_batch_isa(struct cpu_pool *p, enum cpu_isa isa, const struct cpu_mm *mm,
                                  int n_mm, struct arena *scratch, struct err *e);

/* ---- Repacked weights ----
 * At levels with repacked decode kernels (cpu_kernels.h, "Repacked weights"), a weight
 * matrix is copied once into a row-interleaved layout: decode (few X rows) streams it
 * with the gemv kernels, prefill unrepacks it per chunk into the packed path. A row's
 * result has the same bits on either path, and the same as cpu_matmul_isa at that level
 * on the file layout. */

/* Repacks W (rows × k of wtype, the file layout) for the level isa (lowered to what the
 * machine has), in parallel on the pool. *out = NULL and SMELT_OK when (wtype, isa) has no
 * repacked kernel: use cpu_matmul on W. Errors: SMELT_ERR_INVALID (shape), NOMEM. Free
 * with cpu_rweight_free; W itself is not referenced afterwards. */
smelt_status cpu_matmul_repack(struct cpu_pool *p, enum cpu_isa isa, uint32_t wtype, const void *w,
                               int64_t rows, int64_t k, struct cpu_rweight **out, struct err *e);
void cpu_rweight_free(struct cpu_rweight *rw);
/* Bytes of the repacked copy. */
size_t cpu_rweight_bytes(const struct cpu_rweight *rw);
/* Y[n][rows] = X[n][k] · Wᵀ on repacked W, as cpu_matmul (same errors, same scratch use). */
smelt_status cpu_matmul_rw(struct cpu_pool *p, const struct cpu_rweight *rw, const float *x,
                           int64_t n, float *y, struct arena *scratch, struct err *e);

/* True when wtype has an integer/float kernel (not the dequantize fallback) at this ISA. */
bool cpu_matmul_has_kernel(uint32_t wtype, enum cpu_isa isa);

/* True when cpu_matmul accepts wtype at all (kernel or fallback). */
bool cpu_matmul_supports(uint32_t wtype);

#endif
