/* RoPE pieces shared by the rope kernels (cuda_rope.cu) and the decode attention kernel's
 * fused prologue (cuda_attn.cu). The CPU twin is cpu_rope_cache (cpu_ops_rope.c), which
 * works in double throughout. Here the angle pos * freq[i] is formed and reduced to
 * [-pi, pi] in double (positions reach 10^5 and more, where a float angle loses every
 * digit), then sin and cos run in float. */
#ifndef SMELT_CUDA_ROPE_CUH
#define SMELT_CUDA_ROPE_CUH

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/cuda/cuda_kernels.h"
}

/* {cos, sin} * mscale of pair i at position p (r.freq filled by cuda_rope_freq_fill). */
static __device__ __forceinline__ float2 rope_cs(const struct cuda_rope &r, double p, int i) {
    const double th = p * r.freq[i];
    const double n = rint(th * 0.15915494309189535); /* turns */
    double red = fma(-n, 6.283185307179586, th);     /* 2 pi, high part */
    red = fma(-n, 2.4492935982947064e-16, red);      /* 2 pi, low part */
    float s, c;
    __sincosf((float)red, &s, &c); /* |red| <= pi: abs. error ~2^-21 */
    return make_float2(c * r.mscale, s * r.mscale);
}

/* The two elements pair i rotates: adjacent (NORM) or half a rotation apart (NEOX). */
static __device__ __forceinline__ int2 rope_pair(int mode, int half, int i) {
    return mode == 2 ? make_int2(i, i + half) : make_int2(2 * i, 2 * i + 1);
}

#endif
