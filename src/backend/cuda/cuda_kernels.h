/* Launchers of smelt's CUDA kernels (C linkage), used by cuda_backend.cu. Each family
 * lives in its own .cu file; every pointer is device memory; everything is enqueued on
 * `stream` (a cudaStream_t) and returns without waiting. Shapes follow backend.h:
 * (ne0, ne1, ...) with ne0 contiguous. Activations are F32. */
#ifndef SMELT_CUDA_KERNELS_H
#define SMELT_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_qweight;

/* ---- cuda_elem.cu ---- */

/* dst[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (w may be NULL); rows of n, row strides in
 * elements (in place ok). */
void cuda_rms_norm(float *dst, const float *x, const float *w, int64_t n, int64_t rows,
                   int64_t x_stride, int64_t dst_stride, float eps, void *stream);
/* dst = a + c; c is broadcast over rows when c_rows == 1 (n elements per row). */
void cuda_add(float *dst, const float *a, const float *c, int64_t n, int64_t rows, int64_t c_rows,
              void *stream);
void cuda_scale(float *dst, const float *x, float s, int64_t n, void *stream);
/* dst = act(gate) * up; act 0 = SiLU, 1 = tanh-GELU. */
void cuda_glu(float *dst, const float *gate, const float *up, int act, int64_t n, void *stream);
void cuda_softcap(float *x, float cap, int64_t n, void *stream);
/* Softmax over each row of n. */
void cuda_softmax(float *x, int64_t n, int64_t rows, void *stream);
/* dst[t] = row ids[t] of src (rows of n elements of `type`, plain F32/F16/BF16 contiguous
 * with row stride src_stride bytes), as F32. */
void cuda_get_rows_plain(float *dst, const void *src, uint32_t type, int64_t src_stride,
                         const int32_t *ids, int64_t n, int64_t n_ids, void *stream);
/* Same for a repacked weight (struct cuda_qweight). */
void cuda_get_rows_q(float *dst, const struct cuda_qweight *w, const int32_t *ids, int64_t n_ids,
                     void *stream);
/* W (repacked) dequantized to F16, rows [r0, r0 + nr) -> dst (nr, k) row-major. */
void cuda_dequant_f16(void *dst, const struct cuda_qweight *w, int64_t r0, int64_t nr, void *stream);
/* F32 -> F16, n elements. */
void cuda_f32_to_f16(void *dst, const float *src, int64_t n, void *stream);

/* ---- cuda_rope.cu ---- */

struct cuda_rope {
    int mode;      /* 0 NORM (adjacent pairs), 2 NEOX (halves) */
    int n_rot;
    float freq_base, freq_scale, ext_factor, attn_factor;
    float corr_lo, corr_hi; /* YaRN ramp range (dimension indices), computed on the host */
    float mscale;           /* attn_factor x YaRN magnitude correction */
    const float *freq_factors; /* device (n_rot/2) or NULL */
};
/* Optional per-head RMSNorm (norm_w != NULL) then RoPE, in place on x (head_dim, n_head,
 * n_tokens) with positions pos (n_tokens). */
void cuda_rope_inplace(float *x, const int32_t *pos, int head_dim, int n_head, int64_t n_tokens,
                       const struct cuda_rope *r, const float *norm_w, float eps, void *stream);
/* Stores rows of k (dk, n_kv, n_tokens) and v (dv, n_kv, n_tokens) into the caches
 * (d, block_size, n_kv, n_blocks) at slot[t], converting to cache_type (F32/F16/BF16). */
void cuda_kv_store(void *kc, void *vc, uint32_t cache_type, const float *k, const float *v,
                   const int32_t *slot, int dk, int dv, int n_kv, int block_size,
                   int64_t n_tokens, void *stream);

/* ---- cuda_attn.cu ---- */

struct cuda_attn_args {
    float *dst;            /* (dv, n_head, n_tokens) */
    const float *q;        /* (dk, n_head, n_tokens) */
    const void *kc, *vc;   /* caches (d, block_size, n_kv, n_blocks) */
    uint32_t cache_type;
    const int32_t *pos, *seq, *blocks; /* blocks: (max_blocks, n_seqs) */
    int max_blocks, block_size;
    int dk, dv, n_head, n_kv;
    int64_t n_tokens;
    float scale, softcap;
    int window;
    int max_keys;          /* upper bound of keys any row sees (sizes the split) */
    float *partial;        /* scratch for split-K: cuda_attn_scratch_bytes */
};
uint64_t cuda_attn_scratch_bytes(int64_t n_tokens, int n_head, int dv, int max_keys);
void cuda_attention(const struct cuda_attn_args *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
