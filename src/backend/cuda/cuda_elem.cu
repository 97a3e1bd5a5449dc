/* Element-wise kernels of the CUDA backend: add, scale, GLU (a gate per element, with the
 * output's int8 form too, or per row), plain activations, soft-capping, the strided copy, the non-causal key bound. CPU twins: src/backend/cpu/ (cpu_ops_elem.c;
 * cpu_ops_ssm.c's cpu_op_copy). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_glu.cuh"
#include "backend/cuda/cuda_mmq.cuh" /* the MoE prefill GLU's f16 output */
#include "backend/cuda/cuda_mmv.cuh" /* quant16: the int8 form of a decode GLU's output */

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

/* row_n > 0: one gate per row of row_n elements (a shared expert's). */
static __global__ void glu_kernel(float *dst, const float *gate, const float *up, int act, int64_t n,
                                  int64_t row_n) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dst[i] = glu_val(act, gate[row_n ? i / row_n : i], up[i]);
}

/* glu_kernel (a gate per element, or per row of row_n) that also writes the output's int8 form (quant16, the
 * layout of cuda_mmv_quantize over the same values, bit for bit) for the product after it;
 * n is a multiple of 32, so a warp is wholly in or out. */
static __global__ void glu_q_kernel(float *dst, const float *gate, const float *up, int act, int64_t n,
                                    int64_t row_n, int8_t *__restrict__ xq, float2 *__restrict__ xd) {
    pdl_wait();
    pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = glu_val(act, gate[row_n ? i / row_n : i], up[i]);
    dst[i] = v;
    quant16(v, xq, xd, i, true);
}

/* Grouped expert rows (rows of n_ff, chunk c = row / ch of expert eid[c], -1: unused, left
 * as it is): act(gate + gate_b[e]) * (up + up_b[e]), either bias NULL for none, into mmq's
 * f16 activations (cuda_mmq.cuh; cnt: its counters, zeroed). */
static __global__ void glu_expert_mmq_kernel(int *cnt, __half *xh, const float *gate, const float *up, int act,
                                             const float *gate_b, const float *up_b, const int32_t *eid, int ch,
                                             int64_t n_ff, int64_t n) {
    pdl_wait();
    pdl_trigger();
    mmq_zero_cnt(cnt);
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int64_t row = i / n_ff, col = i - row * n_ff;
    const int e = eid[row / ch];
    if (e < 0) return;
    const float g = gate[i] + (gate_b ? gate_b[e * n_ff + col] : 0.0f);
    const float u = up[i] + (up_b ? up_b[e * n_ff + col] : 0.0f);
    xh[row * n_ff + mmq_pos(col)] = mmq_f16(glu_val(act, g, u));
}

/* A non-gated FFN's activation (bert): act is enum glu_act's GLU_SILU 0, GLU_GELU_TANH 1 or
 * GLU_GELU_ERF 4 (the CPU's cpu_op_act; in place ok). */
static __global__ void act_kernel(float *dst, const float *x, int act, int64_t n) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    dst[i] = act == 4 ? 0.5f * v * (1.0f + erff(v * 0.70710678118654752f))
           : act == 1 ? gelu_tanh(v)
                      : v / (1.0f + expf(-v));
}

/* Bidirectional attention: each row's last visible key is its sequence's last, n_keys[seq] -
 * 1 (the attention kernels bound a row's keys by this "position"). */
static __global__ void key_bound_kernel(int32_t *kpos, const int32_t *seq, const int32_t *n_keys, int64_t n) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) kpos[i] = n_keys[seq[i]] - 1;
}

/* A thread per element of the box, rows of ne0 (row index r over ne1 x ne2 x ne3). */
static __global__ void copy_kernel(float *dst, const float *src, int64_t ne0, int64_t ne1, int64_t ne2,
                                   int64_t total, int64_t d1, int64_t d2, int64_t d3, int64_t s1, int64_t s2,
                                   int64_t s3) {
    pdl_wait();
    pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int64_t i0 = i % ne0, r = i / ne0, i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
    dst[i0 + i1 * d1 + i2 * d2 + i3 * d3] = src[i0 + i1 * s1 + i2 * s2 + i3 * s3];
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
    klaunch(glu_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, dst, gate, up, act, n, (int64_t)0);
}

extern "C" void cuda_glu_q(struct cuda_ctx *ctx, float *dst, const float *gate, const float *up, int act, int64_t n,
                           int64_t row_n, int8_t *xq, void *xd) {
    klaunch(glu_q_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, dst, gate, up, act, n, row_n, xq, (float2 *)xd);
}

extern "C" void cuda_glu_expert_mmq(struct cuda_ctx *ctx, void *mmq_scratch, const float *gate, const float *up,
                                    int act, const float *gate_b, const float *up_b, const int32_t *eid, int ch,
                                    int64_t n_ff, int64_t rows) {
    const int64_t n = n_ff * rows;
    klaunch(glu_expert_mmq_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, mmq_cnt(mmq_scratch),
            mmq_xh(mmq_scratch), gate, up, act, gate_b, up_b, eid, ch, n_ff, n);
}

extern "C" void cuda_glu_row_gate(struct cuda_ctx *ctx, float *dst, const float *gate, const float *up, int act,
                                  int64_t row_n, int64_t rows) {
    const int64_t n = row_n * rows;
    klaunch(glu_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, dst, gate, up, act, n, row_n);
}

extern "C" void cuda_copy(struct cuda_ctx *ctx, float *dst, const float *src, const int64_t ne[4],
                          const int64_t ds[3], const int64_t ss[3]) {
    const int64_t total = ne[0] * ne[1] * ne[2] * ne[3];
    if (total == 0) return;
    klaunch(copy_kernel, dim3(nblocks(total, 256)), dim3(256), 0, ctx, dst, src, ne[0], ne[1], ne[2], total, ds[0],
            ds[1], ds[2], ss[0], ss[1], ss[2]);
}

extern "C" void cuda_softcap(struct cuda_ctx *ctx, float *x, float cap, int64_t n) {
    klaunch(softcap_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, x, cap, n);
}

extern "C" void cuda_act(struct cuda_ctx *ctx, float *dst, const float *x, int act, int64_t n) {
    klaunch(act_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, dst, x, act, n);
}

extern "C" void cuda_key_bound(struct cuda_ctx *ctx, int32_t *kpos, const int32_t *seq, const int32_t *n_keys,
                               int64_t n) {
    klaunch(key_bound_kernel, dim3(nblocks(n, 256)), dim3(256), 0, ctx, kpos, seq, n_keys, n);
}
