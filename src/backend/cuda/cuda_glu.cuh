/* The gated activation act(gate) * up of enum glu_act (backend.h), one device function for
 * every kernel that applies it after its own sums (cuda_elem.cu's GLU launches, the
 * small-batch matmul's gate+up store), so the fused and the separate forms give the same
 * bits. CPU twin: src/backend/cpu/cpu_ops_elem.c. */
#ifndef SMELT_CUDA_GLU_CUH
#define SMELT_CUDA_GLU_CUH

extern "C" {
#include "backend/backend.h" /* GLU_OAI_ALPHA, GLU_OAI_LIMIT */
}

static __device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* act: 0 = SiLU, 1 = tanh-GELU, 2 = sigmoid, 3 = gpt-oss's clamped SwiGLU (GLU_SWIGLU_OAI). */
static __device__ __forceinline__ float glu_val(int act, float g, float u) {
    if (act == 3) { /* NaN stays */
        const float gc = g > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : g;
        const float uc = u > GLU_OAI_LIMIT ? GLU_OAI_LIMIT : u < -GLU_OAI_LIMIT ? -GLU_OAI_LIMIT : u;
        return gc / (1.0f + expf(-GLU_OAI_ALPHA * gc)) * (uc + 1.0f);
    }
    const float a = act == 0 ? g / (1.0f + expf(-g)) : act == 1 ? gelu_tanh(g) : 1.0f / (1.0f + expf(-g));
    return a * u;
}

#endif
