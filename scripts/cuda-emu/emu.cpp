/* The CUDA emulator's runtime (see emu.h): the fiber scheduler, device memory on the host,
 * stream capture into replayable graphs, and cuBLAS's GemmEx as a plain loop.
 * EMU_DEBUG=1 prints every launch and the size of every captured graph. */
#include <sys/mman.h>
#include <ucontext.h>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <functional>
#include <vector>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
namespace emu {
struct fiber {
    uint3 tid;
    int lin, lane, warp;
    int state; /* 0 runnable, 1 at its warp's barrier, 2 at the block's, 3 returned */
};
thread_local fiber *cur;
struct fib : fiber {
    ucontext_t ctx;
};
static std::vector<fib> fibs;
static std::vector<char *> stacks;
static const size_t STACK = 256 << 10;
static ucontext_t sched;
static uint3 s_bidx;
static dim3 s_bdim, s_gdim;
static std::vector<uint64_t> slots;
void warp_barrier();
static std::vector<unsigned char> xbuf; /* per warp: 32 lanes x 64 B for warp_xchg */
static size_t s_smem;
/* dynamic shared memory, below 4 GiB: mmq passes 32-bit shared addresses to ldmatrix */
static unsigned char *dsm_p;
static size_t dsm_cap;
void *dyn_smem() { return dsm_p; }
void warp_xchg(const void *mine, size_t bytes, void *all) {
    unsigned char *w = &xbuf[(size_t)cur->warp * 32 * 64];
    memcpy(w + cur->lane * 64, mine, bytes);
    warp_barrier();
    for (int i = 0; i < 32; i++) memcpy((unsigned char *)all + i * bytes, w + i * 64, bytes);
    warp_barrier();
}
static void (*s_body)(void *);
static void *s_arg;
unsigned long long launches, blocks_run;

int lane() { return cur->lane; }
uint64_t *warp_slots() { return &slots[(size_t)cur->warp * 32]; }
static void yield() { swapcontext(&static_cast<fib *>(cur)->ctx, &sched); }
void warp_barrier() { cur->state = 1; yield(); }
void block_barrier() { cur->state = 2; yield(); }

static void entry() {
    s_body(s_arg);
    cur->state = 3;
}

void launch_raw(dim3 g, dim3 b, void (*body)(void *), void *arg) {
    launches++;
    s_gdim = g;
    s_bdim = b;
    s_body = body;
    s_arg = arg;
    const int n = (int)(b.x * b.y * b.z), nw = (n + 31) / 32;
    fibs.resize(n);
    while ((int)stacks.size() < n) stacks.push_back((char *)malloc(STACK));
    slots.assign((size_t)nw * 32, 0);
    xbuf.assign((size_t)nw * 32 * 64, 0);
    if (dsm_cap < s_smem + 16) { if (dsm_p) munmap(dsm_p, dsm_cap); dsm_cap = s_smem + 16 > (1u << 20) ? s_smem + 16 : (1u << 20); dsm_p = (unsigned char *)mmap(NULL, dsm_cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0); }
    memset(dsm_p, 0, s_smem + 16);
    for (unsigned bz = 0; bz < g.z; bz++)
        for (unsigned by = 0; by < g.y; by++)
            for (unsigned bx = 0; bx < g.x; bx++) {
                blocks_run++;
                s_bidx = make_uint3(bx, by, bz);
                for (int i = 0; i < n; i++) {
                    fib &f = fibs[i];
                    f.lin = i;
                    f.lane = i % 32;
                    f.warp = i / 32;
                    f.tid = make_uint3(i % b.x, (i / b.x) % b.y, i / (b.x * b.y));
                    f.state = 0;
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = stacks[i];
                    f.ctx.uc_stack.ss_size = STACK;
                    f.ctx.uc_link = &sched;
                    makecontext(&f.ctx, entry, 0);
                }
                for (;;) {
                    bool ran = false;
                    for (int i = 0; i < n; i++)
                        if (fibs[i].state == 0) {
                            cur = &fibs[i];
                            threadIdx = fibs[i].tid;
                            blockIdx = s_bidx;
                            blockDim = s_bdim;
                            gridDim = s_gdim;
                            swapcontext(&sched, &fibs[i].ctx);
                            ran = true;
                        }
                    bool rel = false;
                    int live = 0, at2 = 0;
                    for (int w = 0; w < nw; w++) {
                        int wl = 0, a1 = 0;
                        for (int i = w * 32; i < n && i < w * 32 + 32; i++) {
                            if (fibs[i].state != 3) wl++;
                            if (fibs[i].state == 1) a1++;
                            if (fibs[i].state != 3) live++;
                            if (fibs[i].state == 2) at2++;
                        }
                        if (wl && a1 == wl) {
                            for (int i = w * 32; i < n && i < w * 32 + 32; i++)
                                if (fibs[i].state == 1) fibs[i].state = 0;
                            rel = true;
                        }
                    }
                    if (!rel && live && at2 == live) {
                        for (int i = 0; i < n; i++)
                            if (fibs[i].state == 2) fibs[i].state = 0;
                        rel = true;
                    }
                    if (!ran && !rel) {
                        if (live == 0) break;
                        fprintf(stderr, "emu: deadlock in block (%u,%u,%u): %d live threads\n", bx, by, bz, live);
                        for (int i = 0; i < n; i++)
                            if (fibs[i].state != 3) fprintf(stderr, "  thread %d state %d\n", i, fibs[i].state);
                        abort();
                    }
                }
            }
}
struct rec {
    dim3 g, b;
    size_t smem;
    void (*body)(void *);
    void *arg;
    void (*del)(void *);
    void *d; const void *s; size_t n; int v; int kind; /* 0 kernel, 1 memcpy, 2 memset, 3 gemm */
    std::function<void()> fn;
    std::vector<unsigned char> data;
};
static bool capturing;
static std::vector<rec> *graph;
static void run(rec &r) {
    if (r.kind == 0) { s_smem = r.smem; launch_raw(r.g, r.b, r.body, r.arg); }
    else if (r.kind == 3) r.fn();
    else if (r.kind == 1) memmove(r.d, r.s, r.n);
    else memset(r.d, r.v, r.n);
}
void launch_rec(dim3 g, dim3 b, size_t smem, void (*body)(void *), void *arg, void (*del)(void *)) {
    rec r{};
    r.g = g; r.b = b; r.smem = smem; r.body = body; r.arg = arg; r.del = del; r.kind = 0;
    if (getenv("EMU_DEBUG")) fprintf(stderr, "emu: launch grid %u,%u,%u block %u smem %zu%s\n", g.x, g.y, g.z, b.x, smem, capturing ? " (captured)" : "");
    if (capturing) { graph->push_back(r); return; }
    run(r);
    del(arg);
}
void gemm_rec(std::function<void()> f) { rec r{}; r.kind = 3; r.fn = f; graph->push_back(r); }
}  // namespace emu

extern "C" {
cudaError_t emu_memcpy_rec(void *d, const void *s, size_t n) {
    if (!emu::capturing) { memmove(d, s, n); return cudaSuccess; }
    emu::rec r{}; r.kind = 1; r.d = d; r.s = s; r.n = n; emu::graph->push_back(r); return cudaSuccess;
}
cudaError_t emu_memset_rec(void *d, int v, size_t n) {
    if (!emu::capturing) { memset(d, v, n); return cudaSuccess; }
    emu::rec r{}; r.kind = 2; r.d = d; r.v = v; r.n = n; emu::graph->push_back(r); return cudaSuccess;
}
cudaError_t emu_begin_capture(void) { emu::capturing = true; emu::graph = new std::vector<emu::rec>; return cudaSuccess; }
cudaError_t emu_end_capture(cudaGraph_t *g) { emu::capturing = false; if (getenv("EMU_DEBUG")) fprintf(stderr, "emu: graph of %zu nodes\n", emu::graph->size()); *g = (cudaGraph_t)emu::graph; emu::graph = NULL; return cudaSuccess; }
cudaError_t emu_instantiate(cudaGraphExec_t *e, cudaGraph_t g) { *e = (cudaGraphExec_t)g; return cudaSuccess; }
cudaError_t emu_graph_launch(cudaGraphExec_t e) {
    for (auto &r : *(std::vector<emu::rec> *)e) emu::run(r);
    return cudaSuccess;
}
cudaError_t emu_malloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) & ~(size_t)255);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t emu_free(void *p) { free(p); return cudaSuccess; }
cudaError_t emu_memcpy(void *d, const void *s, size_t n) { memmove(d, s, n); return cudaSuccess; }
cudaError_t emu_memset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
cudaError_t emu_ok(void) { return cudaSuccess; }
cudaError_t emu_meminfo(size_t *f, size_t *t) { *t = (size_t)4 << 30; *f = (size_t)3 << 30; return cudaSuccess; }
cudaError_t emu_is_capturing(enum cudaStreamCaptureStatus *s) {
    *s = emu::capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
static float emu_ld(const void *p, int t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    __half_raw r; r.x = ((const unsigned short *)p)[i];
    return __half2float(__half(r));
}
cublasStatus_t emu_gemm(int ta, int tb, int m, int n, int k, const void *alpha, const void *A, int at, int lda,
                        const void *B, int bt, int ldb, const void *beta, void *C, int ct, int ldc) {
    if (ct != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *(const float *)alpha, be = *(const float *)beta; /* host pointer mode: read at the call */
    auto run = [=]() {
        std::vector<float> a(k), b((size_t)k * n);
        for (int j = 0; j < n; j++)
            for (int l = 0; l < k; l++)
                b[(size_t)j * k + l] = tb == CUBLAS_OP_T ? emu_ld(B, bt, (size_t)l * ldb + j) : emu_ld(B, bt, (size_t)j * ldb + l);
        for (int i = 0; i < m; i++) {
            for (int l = 0; l < k; l++)
                a[l] = ta == CUBLAS_OP_T ? emu_ld(A, at, (size_t)i * lda + l) : emu_ld(A, at, (size_t)l * lda + i);
            for (int j = 0; j < n; j++) {
                const float *bj = &b[(size_t)j * k];
                float acc = 0.0f;
                for (int l = 0; l < k; l++) acc += a[l] * bj[l];
                float *c = (float *)C + (size_t)j * ldc + i;
                *c = al * acc + (be != 0.0f ? be * *c : 0.0f);
            }
        }
    };
    if (!emu::capturing) { run(); return CUBLAS_STATUS_SUCCESS; }
    emu::gemm_rec(run);
    return CUBLAS_STATUS_SUCCESS;
}
cudaError_t emu_count(int *n) { *n = 1; return cudaSuccess; }
cudaError_t emu_attr(int *v, int attr, int dev) {
    (void)dev;
    switch (attr) { /* an H200's */
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 232448; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = 233472; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 49152; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *v = 65536; break;
    case cudaDevAttrL2CacheSize: *v = 52428800; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    default: *v = 0;
    }
    return cudaSuccess;
}
cudaError_t emu_funcattrs(struct cudaFuncAttributes *a) { memset(a, 0, sizeof *a); return cudaSuccess; }
}
