/* The CUDA runtime and cuBLAS calls smelt and its tests make, as macros onto the emulator
 * (emu.cpp): device memory is host memory, one stream, captures become replayable lists.
 * Force-included into the C sources too (the backend's cuda_*.c, the tests). */
#ifndef EMU_API_H
#define EMU_API_H
#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#ifdef __cplusplus
extern "C" {
#endif
cudaError_t emu_meminfo(size_t *f, size_t *t);
cudaError_t emu_is_capturing(enum cudaStreamCaptureStatus *s);
cublasStatus_t emu_gemm(int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                        const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc);
cudaError_t emu_malloc(void **p, size_t n);
cudaError_t emu_free(void *p);
cudaError_t emu_memcpy(void *d, const void *s, size_t n);
cudaError_t emu_memset(void *d, int v, size_t n);
cudaError_t emu_ok(void);
cudaError_t emu_count(int *n);
cudaError_t emu_attr(int *v, int attr, int dev);
cudaError_t emu_funcattrs(struct cudaFuncAttributes *a);
cudaError_t emu_memcpy_rec(void *d, const void *s, size_t n);
cudaError_t emu_memset_rec(void *d, int v, size_t n);
cudaError_t emu_begin_capture(void);
cudaError_t emu_end_capture(cudaGraph_t *g);
cudaError_t emu_instantiate(cudaGraphExec_t *e, cudaGraph_t g);
cudaError_t emu_graph_launch(cudaGraphExec_t e);
#ifdef __cplusplus
}
#endif
#define cudaMalloc(p, n) emu_malloc((void **)(p), (n))
#define cudaMemGetInfo(f, t) emu_meminfo((f), (t))
#define cudaMallocHost(p, n) emu_malloc((void **)(p), (n))
#define cudaFreeHost(p) emu_free((void *)(p))
#define cudaHostAlloc(p, n, fl) emu_malloc((void **)(p), (n))
#define cudaHostGetDevicePointer(dp, hp, fl) (*(dp) = (hp), emu_ok())
#define cudaStreamIsCapturing(s, st) emu_is_capturing(st)
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, ...) (*(n) = 2, emu_ok())
#undef cublasCreate
#undef cublasDestroy
#undef cublasSetStream
#define cublasCreate(h) (*(h) = (cublasHandle_t)1, CUBLAS_STATUS_SUCCESS)
#define cublasDestroy(h) CUBLAS_STATUS_SUCCESS
#define cublasSetStream(h, s) CUBLAS_STATUS_SUCCESS
#define cublasSetMathMode(h, m) CUBLAS_STATUS_SUCCESS
#define cublasGemmEx(h, ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc, comp, algo) \
    emu_gemm((int)(ta), (int)(tb), (m), (n), (k), (al), (A), (int)(at), (lda), (B), (int)(bt), (ldb), (be), (C), (int)(ct), (ldc))
#define cudaFree(p) emu_free((void *)(p))
#define cudaMemcpy(d, s, n, k) emu_memcpy((d), (s), (n))
#define cudaMemcpyAsync(d, s, n, k, st) emu_memcpy_rec((d), (s), (n))
#define cudaMemset(d, v, n) emu_memset((d), (v), (n))
#define cudaMemsetAsync(d, v, n, st) emu_memset_rec((d), (v), (n))
#define cudaStreamCreateWithFlags(s, f) (*(s) = (cudaStream_t)1, emu_ok())
#define cudaStreamCreate(s) (*(s) = (cudaStream_t)1, emu_ok())
#define cudaStreamDestroy(s) emu_ok()
#define cudaStreamBeginCapture(s, m) emu_begin_capture()
#define cudaStreamEndCapture(s, g) emu_end_capture(g)
#define cudaGraphInstantiate(e, g, f) emu_instantiate((e), (g))
#define cudaGraphLaunch(e, s) emu_graph_launch(e)
#define cudaGraphExecDestroy(e) emu_ok()
#define cudaGraphDestroy(g) emu_ok()
#define cudaEventCreate(e) emu_ok()
#define cudaEventRecord(e, s) emu_ok()
#define cudaEventSynchronize(e) emu_ok()
#define cudaEventDestroy(e) emu_ok()
#define cudaEventElapsedTime(ms, a, b) (*(ms) = 1.0f, emu_ok())
#define cudaStreamSynchronize(s) emu_ok()
#define cudaDeviceSynchronize() emu_ok()
#define cudaGetLastError() emu_ok()
#define cudaPeekAtLastError() emu_ok()
#define cudaGetDeviceCount(n) emu_count(n)
#define cudaGetDevice(d) (*(d) = 0, emu_ok())
#define cudaSetDevice(d) emu_ok()
#define cudaDeviceGetAttribute(v, a, d) emu_attr((v), (int)(a), (d))
#define cudaFuncSetAttribute(...) emu_ok()
#define cudaFuncGetAttributes(a, ...) emu_funcattrs(a)
#endif
