/* CUDA on the CPU, for checking smelt's kernels where no GPU is lent (scripts/cuda-emu/run.sh).
 * Force-included (-include) before a .cu file compiled as C++ by g++, after patch.py has
 * rewritten its launches and PTX. Every CUDA thread is a fiber (ucontext) on one OS thread;
 * the threads of a warp meet at a barrier in every shuffle, ballot, ldmatrix and mma, and a
 * block's at __syncthreads, so code that is warp-synchronous by CUDA's rules computes what
 * it computes on a GPU. It checks logic (indexing, reductions, layouts, fusions), not
 * timing, the memory model, PDL or races: blocks run one after another, and a fiber only
 * yields at a barrier. */
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utility>
#include <tuple>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#undef __noinline__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)

/* Barriers are where other fibers run: the compiler must assume any memory changed there
 * (a block's __shared__ arrays are function-local statics it could otherwise keep in
 * registers across the call). */
#define EMU_CLOBBER() asm volatile("" ::: "memory")
namespace emu {
void warp_barrier();
void block_barrier();
uint64_t *warp_slots();
int lane();
void launch_raw(dim3 g, dim3 b, void (*body)(void *), void *arg);
/* runs now, or records for a graph while a stream capture is on; owns arg (del) */
void launch_rec(dim3 g, dim3 b, size_t smem, void (*body)(void *), void *arg, void (*del)(void *));
}  // namespace emu

extern uint3 threadIdx, blockIdx; /* set by the scheduler before it resumes a fiber */
extern dim3 blockDim, gridDim;

#undef __shfl_xor_sync
#undef __shfl_sync
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        const unsigned sel = (s >> (4 * i)) & 15;
        unsigned b = (unsigned)(v >> (8 * (sel & 7))) & 0xffu;
        if (sel & 8) b = (b & 0x80u) ? 0xffu : 0u;
        r |= b << (8 * i);
    }
    return r;
}
template <typename T>
static inline T emu_shfl(T v, int src) {
    uint64_t *s = emu::warp_slots();
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    s[emu::lane()] = b;
    EMU_CLOBBER();
    emu::warp_barrier();
    EMU_CLOBBER();
    uint64_t r = s[src & 31];
    emu::warp_barrier();
    EMU_CLOBBER();
    T o;
    memcpy(&o, &r, sizeof o);
    return o;
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int m, int = 32) { return emu_shfl(v, emu::lane() ^ m); }
template <typename T> static inline T __shfl_sync(unsigned, T v, int src, int = 32) { return emu_shfl(v, src); }
template <typename T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int = 32) {
    const int l = emu::lane(), src = l - (int)d;
    T r = emu_shfl(v, src < 0 ? l : src);
    return r;
}
static inline unsigned __ballot_sync(unsigned, int pred) {
    unsigned m = 0;
    for (int i = 0; i < 32; i++) m |= (unsigned)(emu_shfl(pred ? 1 : 0, i) != 0) << i;
    return m;
}
static inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    unsigned m = 0;
    for (int i = 0; i < 32; i++) {
        const unsigned o = emu_shfl(v, i);
        m = o > m ? o : m;
    }
    return m;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
#define __expf(x) expf(x)
#define __sincosf(x, s, c) (*(s) = sinf(x), *(c) = cosf(x))
static inline unsigned atomicOr(unsigned *p, unsigned v) { unsigned o = *p; *p = o | v; return o; }
static inline unsigned atomicMax(unsigned *p, unsigned v) { unsigned o = *p; *p = o > v ? o : v; return o; }
static inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v) { unsigned long long o = *p; *p = o > v ? o : v; return o; }
static inline unsigned atomicInc(unsigned *p, unsigned v) { unsigned o = *p; *p = o >= v ? 0 : o + 1; return o; }
static inline unsigned atomicSub(unsigned *p, unsigned v) { unsigned o = *p; *p = o - v; return o; }
static inline int atomicSub(int *p, int v) { int o = *p; *p = o - v; return o; }
static inline unsigned atomicExch(unsigned *p, unsigned v) { unsigned o = *p; *p = v; return o; }
static inline size_t __cvta_generic_to_shared(const void *p) { return (size_t)p; }
static inline size_t __cvta_generic_to_global(const void *p) { return (size_t)p; }
static inline void __syncthreads() { EMU_CLOBBER(); emu::block_barrier(); EMU_CLOBBER(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { EMU_CLOBBER(); emu::warp_barrier(); EMU_CLOBBER(); }
static inline void __threadfence() {}
static inline void __trap() { abort(); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
static inline int atomicAdd(int *p, int v) { int o = *p; *p = o + v; return o; }
static inline float atomicAdd(float *p, float v) { float o = *p; *p = o + v; return o; }
static inline int __float2int_rn(float x) { return (int)rintf(x); }
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
template <typename T> static inline T __ldcg(const T *p) { return *p; }
static inline void __nanosleep(unsigned) {}

namespace emu {
void *dyn_smem();
void warp_xchg(const void *mine, size_t bytes, void *all); /* all: 32 x bytes */
}
static inline float emu_h2f(uint32_t h16, bool bf) {
    if (bf) { uint32_t u = h16 << 16; float f; memcpy(&f, &u, 4); return f; }
    __half_raw r; r.x = (unsigned short)h16; return __half2float(__half(r));
}
/* mma.sync.m16n8k16 row.col f32 += f16/bf16 (PTX fragment layouts), warp-collective */
static inline void emu_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1, bool bf) {
    struct X { uint32_t a[4], b[2]; } mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}}, all[32];
    EMU_CLOBBER();
    emu::warp_xchg(&mine, sizeof mine, all);
    EMU_CLOBBER();
    const int L = emu::lane(), g = L >> 2, t = L & 3;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; k++) {
            const int ar = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0), al = (row % 8) * 4 + (k % 8) / 2;
            const float av = emu_h2f((all[al].a[ar] >> (16 * (k & 1))) & 0xffffu, bf);
            const int br = k >= 8 ? 1 : 0, bl = col * 4 + (k % 8) / 2;
            const float bv = emu_h2f((all[bl].b[br] >> (16 * (k & 1))) & 0xffffu, bf);
            acc += av * bv;
        }
        c[i] = acc;
    }
}
/* wgmma.mma_async.m64nNk16 f32 += f16 with A in registers and B K-major with the 128-byte
 * swizzle in shared memory (cuda_mma.cuh; the descriptor as patch.py rewrites it: address / 16
 * in bits 0..29, the swizzle flag in bit 30, the 8-row atoms' distance / 16 in 48..63). Row n's
 * 16 K values are the 32 bytes at start + (n / 8) sbo + (n % 8) 128, address bits 4..6 XORed
 * with bits 7..9 (the emulated shared memory is page-aligned, as the GPU's window is
 * 1,024-aligned).
 * Warp w of the warpgroup owns rows 16w..16w+15 of A and D, so each warp computes its part
 * alone: d[4j + i] for 8-column tile j as mma.m16n8k16's C. Runs at issue. */
#define SMELT_WGMMA 1
static inline void emu_wgmma(float *d, const uint32_t *a, uint64_t desc, int n) {
    struct X { uint32_t a[4]; } mine = {{a[0], a[1], a[2], a[3]}}, all[32];
    EMU_CLOBBER();
    emu::warp_xchg(&mine, sizeof mine, all);
    EMU_CLOBBER();
    const uintptr_t base = (uintptr_t)((desc & 0x3fffffffu) << 4);
    const size_t sbo = (size_t)(desc >> 48) << 4;
    if (!((desc >> 30) & 1)) abort(); /* only the swizzled layout is used */
    const int L = emu::lane(), g = L >> 2, t = L & 3;
    for (int j = 0; j < n / 8; j++)
        for (int i = 0; i < 4; i++) {
            const int row = g + (i >= 2 ? 8 : 0), col = 8 * j + 2 * t + (i & 1);
            float acc = d[4 * j + i];
            for (int k = 0; k < 16; k++) {
                const int ar = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0), al = (row % 8) * 4 + (k % 8) / 2;
                const float av = emu_h2f((all[al].a[ar] >> (16 * (k & 1))) & 0xffffu, false);
                uint16_t bh;
                uintptr_t ad = base + (col / 8) * sbo + (col % 8) * 128 + k * 2;
                ad ^= ((ad >> 7) & 7) << 4;
                memcpy(&bh, (const void *)ad, 2);
                acc += av * emu_h2f(bh, false);
            }
            d[4 * j + i] = acc;
        }
}
/* ldmatrix.sync.m8n8.x4[.trans].b16, warp-collective */
static inline void emu_ldsm(uint32_t *r, const void *p, bool trans) {
    const void *all[32];
    EMU_CLOBBER();
    emu::warp_xchg(&p, sizeof p, all);
    EMU_CLOBBER();
    const int L = emu::lane();
    for (int i = 0; i < 4; i++) {
        if (!trans) {
            memcpy(&r[i], (const char *)all[8 * i + L / 4] + (L % 4) * 4, 4);
        } else {
            uint16_t lo, hi;
            memcpy(&lo, (const char *)all[8 * i + 2 * (L % 4)] + (L / 4) * 2, 2);
            memcpy(&hi, (const char *)all[8 * i + 2 * (L % 4) + 1] + (L / 4) * 2, 2);
            r[i] = lo | (uint32_t)hi << 16;
        }
    }
}
static inline void emu_cp_async16(void *dst, const void *src, int n) {
    if (n > 0) memcpy(dst, src, n);
    if (n < 16) memset((char *)dst + n, 0, 16 - n);
}

/* launches: klaunch's cudaLaunchKernelEx and <<< >>> */
template <typename... P> struct emu_call {
    void (*k)(P...);
    std::tuple<P...> a;
};
template <typename... P>
static void emu_body(void *p) {
    auto *c = (emu_call<P...> *)p;
    std::apply(c->k, c->a);
}
template <typename... P, typename... A>
static cudaError_t emu_launch(const cudaLaunchConfig_t *cfg, void (*k)(P...), A &&...args) {
    auto *c = new emu_call<P...>{k, std::tuple<P...>((P)args...)};
    emu::launch_rec(cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes, emu_body<P...>, c,
                    [](void *p) { delete (emu_call<P...> *)p; });
    return cudaSuccess;
}
#define cudaLaunchKernelEx(cfg, kernel, ...) emu_launch(cfg, kernel, __VA_ARGS__)
template <typename... P> struct emu_chev {
    void (*k)(P...);
    dim3 g, b;
    size_t smem;
    template <typename... A> void operator()(A &&...args) {
        auto *c = new emu_call<P...>{k, std::tuple<P...>((P)args...)};
        emu::launch_rec(g, b, smem, emu_body<P...>, c, [](void *p) { delete (emu_call<P...> *)p; });
    }
};
template <typename... P> static emu_chev<P...> emu_chevron(void (*k)(P...), dim3 g, dim3 b, size_t smem) {
    return {k, g, b, smem};
}
static inline size_t emu_smem() { return 0; }
template <class... R> static inline size_t emu_smem(size_t s, R...) { return s; }
#define EMU_CHEVRON(k, g, b, ...) emu_chevron(k, dim3(g), dim3(b), emu_smem(__VA_ARGS__))

#include "emu_api.h"
#define cudaMemcpyFromSymbol(dst, sym, n, ...) emu_memcpy((dst), &(sym), (n))
#define cudaMemcpyToSymbol(sym, src, n, ...) emu_memcpy(&(sym), (src), (n))
/* f16x2 sub (0), mul (1), fma (2), each half rounded once (through float) */
static inline uint32_t emu_h2op(uint32_t a, uint32_t b, uint32_t c, int op) {
    uint32_t d = 0;
    for (int i = 0; i < 2; i++) {
        const float x = emu_h2f((a >> (16 * i)) & 0xffffu, false), y = emu_h2f((b >> (16 * i)) & 0xffffu, false);
        const float z = emu_h2f((c >> (16 * i)) & 0xffffu, false);
        const float r = op == 0 ? x - y : op == 1 ? x * y : fmaf(x, y, z);
        const __half h = __float2half_rn(r);
        d |= (uint32_t)__half_raw(h).x << (16 * i);
    }
    return d;
}
