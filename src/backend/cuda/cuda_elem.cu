/* Element-wise kernels of the CUDA backend: add, scale, GLU, soft-capping. CPU twins:
 * src/backend/cpu/. */
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/backend.h" /* GLU_OAI_ALPHA, GLU_OAI_LIMIT */
#include "backend/cuda/cuda_kernels.h"
}

/* ---------------------------------------------------------------- kernels ---- */

static __global__ void add_kernel(float *dst, const float *a, const float *c, int64_t n, int64_t total,
                                  int bcast) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) dst[i] = a[i] + c[bcast ? i % n : i];
}

static __global__ void scale_kernel(float *dst, const float *x, float s, int64_t n) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = x[i] * s;
}

static __device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static __global__ void glu_kernel(float *dst, const float *gate, const float *up, int act, int64_t n) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    if (act == 2) { /* gpt-oss's clamped SwiGLU (backend.h's GLU_SWIGLU_OAI); NaN stays */
        const float gc = g > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : g, u = up[i];
        const float uc = u > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : u < -GLU_OAI_LIMIT ? -GLU_OAI_LIMIT : u;
        dst[i] = gc / (1.0f + expf(-GLU_OAI_ALPHA * gc)) * (uc + 1.0f);
        return;
    }
    const float a = act == 0 ? g / (1.0f + expf(-g)) : gelu_tanh(g);
    dst[i] = a * up[i];
}

static __global__ void softcap_kernel(float *x, float cap, int64_t n) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}
/* --------------------------------------------------------------- launchers ---- */

extern "C" void cuda_add(struct cuda_ctx *ctx, float *dst, const float *a, const float *c,
                         int64_t n, int64_t rows, int64_t c_rows) {
    int64_t total = n * rows;
    klaunch(add_kernel, dim3(nblocks(total, 256)), dim3(256), 0, ctx, dst, a, c, n, total, c_rows == 1 && rows > 1);
}

extern "C" void cuda_scale(struct cuda_ctx *ctx, float *dst, const float *x, float s, int64_t n) {
    klaunch(scale_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, dst, x, s, n);
}

extern "C" void cuda_glu(struct cuda_ctx *ctx, float *dst, const float *gate, const float *up, int act, int64_t n) {
    klaunch(glu_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, dst, gate, up, act, n);
}

extern "C" void cuda_softcap(struct cuda_ctx *ctx, float *x, float cap, int64_t n) {
    klaunch(softcap_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, x, cap, n);
}
