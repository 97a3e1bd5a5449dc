/* The CUDA backend: the op interface (backend.h) on one GPU.
 *
 * Memory:
 *   - Weights: matrices are uploaded once into the mmv kernels' repacked layouts
 *     (cuda_mmv.h; t->extra points at the descriptor, t->data at its quant bits): F16,
 *     BF16, F32, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4. Types without
 *     a GPU kernel yet (IQ1/IQ2/IQ3, TQ, NVFP4, ...) are dequantized on the host to F16 at
 *     upload (correct, 3-8x the bytes; logged once per type). The mmq kernel covers only
 *     Q4_K/Q6_K/Q8_0: the other quantized types repeat mmv up to GEMM_MIN_ROWS - 1 token
 *     rows, then take cuBLAS on F16 tiles (cuda_dequant_f16 reads every repacked layout).
 *     Vectors (norms, biases) are plain F32 copies.
 *   - Scratch: a device stack emptied at step_begin and rewound per layer (mark/release),
 *     grown in chunks; a step with the same shape sees the same addresses.
 *   - Host<->device: uploads go through a pinned staging buffer (asynchronous copies);
 *     downloads land in pinned memory and are copied out at sync.
 * Ops are enqueued on one stream; the first error is sticky (bk_fail) and bk_sync
 * reports it. Matrix products with <= 8 token rows use the mmv kernels; above, for the
 * types the tensor-core kernel (cuda_mmq.h) has, the path (its tile, or F16 dequantization
 * + cuBLAS, or repeated mmv) is measured on this GPU per weight shape and token-row bucket
 * at first use ("matrix products: the paths and the choice between them"); without a
 * measurement, up to MMQ_MAX_ROWS rows the tensor-core kernel, more rows cuBLAS (F32
 * weights: FP32 GEMM).
 *
 * No process-wide state: everything a backend keeps lives in its struct, and what the
 * kernels' launchers keep between calls (PDL, device facts, attribute once-flags, the split
 * counters) in its launch context (cb->ctx, cuda_ctx.h). CUDA's current device is per
 * thread, so every op-table entry that touches the device makes the backend's current
 * (cu_enter). Several backends (on several GPUs, or sharing one) can run in one process,
 * from one thread or several; one backend is driven by one thread at a time.
 *
 * Files (each owns one thing; cuda_backend_int.h holds the struct and what they share):
 *   cuda_backend.c  lifecycle: creation (device, stream, cuBLAS, the launch context, the
 *                   settings read from the environment), the op table, teardown
 *   cuda_mem.c      weights, buffers, the scratch stack, pinned staging and transfers,
 *                   memory planning
 *   cuda_matmul.c   matrix products: the paths and the measured choice between them
 *   cuda_ops.c      the op shims, with the decode fusions' bookkeeping
 *   cuda_ops_ssm.c  the recurrent-state op shims (conv, gated delta rule, strided copy)
 *   cuda_graph.c    step graphs: capture and replay
 *   cuda_prof.c     SMELT_PROFILE=1
 *   cuda_ctx.c      the launch context: creation, teardown
 *   mm_tune.c       the matmul path table (plain C: tested without a GPU)
 *   cuda_*.cu       the kernels, one family per file; launchers in cuda_kernels.h,
 *                   cuda_mmv.h and cuda_mmq.h */
#include "backend/cuda/cuda_backend_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

void cu_check_launch(struct cuda_backend *cb, const char *what) {
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) CU_FAIL(cb, rc, what);
    cu_prof_mark(cb, 0, "%s", what);
    cb->prep.valid = false; /* any other op may have written the prepared tensor */
}

/* ---- lifecycle ---- */

static void cu_free(struct backend *b) {
    struct cuda_backend *cb = cu_enter(b);
    cudaStreamSynchronize(cb->ctx.stream);
    cu_prof_print(cb);
    cu_tune_report(cb);
    for (int i = 0; i < cb->tune_ev_n; i++) cudaEventDestroy(cb->tune_ev[i]);
    mmtune_free(&cb->tune);
    for (int i = 0; i < cb->cap_pev; i++) cudaEventDestroy(cb->pev[i].ev);
    free(cb->pev);
    free(cb->prow);
    if (cb->prof) cudaEventDestroy(cb->prof_start);
    if (cb->gate_h) cudaFreeHost((void *)cb->gate_h);
    cudaFree(cb->prep.buf);
    cudaFree(cb->prep.ss);
    cudaFree(cb->prep.cnt);
    cudaFree(cb->moe_cnt);
    cudaFree(cb->moe_xin.buf);
    cudaFree(cb->moe_xin.xf);
    cudaFree(cb->att_q.buf);
    for (int i = 0; i < cb->n_rope_tab; i++) cudaFree(cb->rope_tab[i].freq);
    free(cb->rope_tab);
    for (int i = 0; i < cb->n_dev; i++) cudaFree(cb->dev[i]);
    free(cb->dev);
    for (int i = 0; i < cb->n_qws; i++) {
        cuda_qweight_free(cb->qws[i]);
        free(cb->qws[i]);
    }
    free(cb->qws);
    for (int i = 0; i < cb->n_chunks; i++) cudaFree(cb->chunks[i].base);
    free(cb->chunks);
    cudaFreeHost(cb->pin);
    free(cb->dl);
    cu_graphs_clear(cb);
    cublasDestroy(cb->cublas);
    cuda_ctx_free(&cb->ctx);
    cudaStreamDestroy(cb->ctx.stream);
    bk_base_free(b);
    free(cb);
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .features = BK_FEAT_ATTN_SINKS | BK_FEAT_SWIGLU_OAI | BK_FEAT_MOE_BIAS | BK_FEAT_YARN_UNROUNDED | BK_FEAT_GLU_ROW_GATE |
                BK_FEAT_LAYER_NORM | BK_FEAT_ACT | BK_FEAT_NON_CAUSAL,
    .free = cu_free,
    .weight_bind = cu_weight_bind,
    .buffer_alloc = cu_buffer_alloc,
    .buffer_free = cu_buffer_free,
    .step_begin = cu_step_begin,
    .scratch_alloc = cu_scratch_alloc,
    .scratch_mark = cu_scratch_mark,
    .scratch_release = cu_scratch_release,
    .upload = cu_upload,
    .download = cu_download,
    .sync = cu_sync,
    .get_rows = cu_get_rows,
    .rms_norm = cu_rms_norm,
    .layer_norm = cu_layer_norm,
    .act = cu_act,
    .rope = cu_rope,
    .matmul = cu_matmul,
    .add = cu_add,
    .scale = cu_scale,
    .glu = cu_glu,
    .norm_gate = cu_norm_gate,
    .softcap = cu_softcap,
    .softmax = cu_softmax,
    .kv_store = cu_kv_store,
    .attention = cu_attention,
    .ssm_conv = cu_ssm_conv,
    .gated_delta_net = cu_gated_delta_net,
    .copy = cu_copy,
    .deltanet = cu_deltanet,
    .matmul_group = cu_matmul_group,
    .matmul_acc = cu_matmul_acc,
    .ffn_glu = cu_ffn_glu,
    .ffn = cu_ffn,
    .rope_kv_store = cu_rope_kv_store,
    .rope_attention = cu_rope_attention,
    .moe_route = cu_moe_route,
    .moe_ffn = cu_moe_ffn,
    .logits_topk = cu_logits_topk,
    .graph_replay = cu_graph_replay,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .mem_info = cu_mem_info,
    .weight_bytes = cu_weight_bytes,
    .scratch_peak = cu_scratch_peak,
    .scratch_reserve = cu_scratch_reserve,
};

struct cuda_ctx *cuda_backend_ctx(struct backend *b) { return &cu_of(b)->ctx; }

int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

smelt_status cuda_backend_new(struct backend **out, int device, struct err *e) {
    *out = NULL;
    int n = cuda_device_count();
    if (n == 0) return err_set(e, SMELT_ERR_DEVICE, "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)");
    if (device < 0 || device >= n)
        return err_set(e, SMELT_ERR_INVALID, "CUDA device %d does not exist (%d visible)", device, n);
    cudaError_t rc = cudaSetDevice(device);
    if (rc != cudaSuccess) return err_set(e, SMELT_ERR_DEVICE, "cudaSetDevice(%d): %s", device, cudaGetErrorString(rc));
    struct cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    bk_base_init(&cb->base, &cuda_ops);
    cudaStream_t stream = NULL;
    rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (rc != cudaSuccess) {
        bk_base_free(&cb->base);
        free(cb);
        return err_set(e, SMELT_ERR_DEVICE, "cudaStreamCreate: %s", cudaGetErrorString(rc));
    }
    /* the launch context: PDL on sm_90+ unless SMELT_NO_PDL, the kernels' counters */
    smelt_status st = cuda_ctx_init(&cb->ctx, device, stream, e);
    if (st != SMELT_OK) {
        cudaStreamDestroy(stream);
        bk_base_free(&cb->base);
        free(cb);
        return st;
    }
    if (cublasCreate(&cb->cublas) != CUBLAS_STATUS_SUCCESS) {
        cuda_ctx_free(&cb->ctx);
        cudaStreamDestroy(cb->ctx.stream);
        bk_base_free(&cb->base);
        free(cb);
        return err_set(e, SMELT_ERR_DEVICE, "cublasCreate failed");
    }
    cublasSetStream(cb->cublas, cb->ctx.stream);
    /* the decode epilogue's buffers (small; without them decode takes the plain path) */
    if (cudaMalloc(&cb->prep.buf, cuda_mmv_scratch_bytes(PREP_MAX_K, CUDA_MMV_MAX_N)) != cudaSuccess ||
        cudaMalloc((void **)&cb->prep.ss, sizeof(float) * CUDA_MMV_MAX_N * (PREP_MAX_K / 32)) != cudaSuccess ||
        cudaMalloc((void **)&cb->prep.cnt, sizeof(unsigned) * (PREP_MAX_K / 32)) != cudaSuccess ||
        cudaMemset(cb->prep.cnt, 0, sizeof(unsigned) * (PREP_MAX_K / 32)) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(cb->prep.buf);
        cudaFree(cb->prep.ss);
        cudaFree(cb->prep.cnt);
        memset(&cb->prep, 0, sizeof cb->prep);
    }
    /* the attention output's int8 form (without it, W_o quantizes its input itself) */
    if (cudaMalloc(&cb->att_q.buf, cuda_mmv_scratch_bytes(ATT_Q_MAX_K, CUDA_MMV_MAX_N)) != cudaSuccess) {
        cudaGetLastError();
        cb->att_q.buf = NULL;
    }
    /* MoE decode's fused epilogues (cuda_ops_moe.c); SMELT_MOE_FUSED=0 keeps the separate
     * launches. H200, 2026-12-03: test_cuda_moe's fused-against-separate cases bitwise equal;
     * Qwen3-30B-A3B Q4_K_M tg128 195.2 tok/s against 192.8 separate. */
    const char *mf = getenv("SMELT_MOE_FUSED");
    const size_t n_cnt = MOE_CNT_MAX + CUDA_MOE_FUSED_ROUTE_ROWS;
    if (!(mf && !strcmp(mf, "0")) &&
        (cudaMalloc((void **)&cb->moe_cnt, sizeof(unsigned) * n_cnt) != cudaSuccess ||
         cudaMemset(cb->moe_cnt, 0, sizeof(unsigned) * n_cnt) != cudaSuccess ||
         cudaMalloc(&cb->moe_xin.buf, cuda_mmv_scratch_bytes(PREP_MAX_K, CUDA_MOE_FUSED_ROUTE_ROWS)) !=
             cudaSuccess ||
         cudaMalloc((void **)&cb->moe_xin.xf, sizeof(float) * PREP_MAX_K * CUDA_MOE_FUSED_ROUTE_ROWS) !=
             cudaSuccess)) {
        cudaGetLastError();
        cudaFree(cb->moe_cnt);
        cudaFree(cb->moe_xin.buf);
        cudaFree(cb->moe_xin.xf);
        cb->moe_cnt = NULL;
        cb->moe_xin.buf = NULL;
        cb->moe_xin.xf = NULL;
    }
    cb->deltanet_fused_rows = CU_DELTANET_FUSED_ROWS;
    cudaDeviceSynchronize(); /* the counters' memsets, before any kernel on cb->ctx.stream */
    /* SMELT_MMV_ID_VARIANT=G,D: the one-token expert products' shapes (tuning runs;
     * launch_variant in cuda_mmv.cu numbers them) */
    const char *iv = getenv("SMELT_MMV_ID_VARIANT");
    if (iv && *iv && sscanf(iv, "%d,%d", &cb->ctx.mmv_id_variant[0], &cb->ctx.mmv_id_variant[1]) != 2) {
        log_warn("SMELT_MMV_ID_VARIANT=%s is not G,D: ignored", iv);
        cb->ctx.mmv_id_variant[0] = cb->ctx.mmv_id_variant[1] = 0;
    }
    const char *ng = getenv("SMELT_NO_GRAPH");
    cb->no_graph = ng && *ng && strcmp(ng, "0") != 0;
    const char *mq = getenv("SMELT_MMQ_MAX_ROWS");
    cb->mmq_rows_fixed = mq && *mq;
    cb->mmq_max_rows = cb->mmq_rows_fixed ? strtoll(mq, NULL, 10) : MMQ_MAX_ROWS;
    const char *gm = getenv("SMELT_GEMM_MIN_ROWS");
    cb->gemm_min_rows = gm && *gm ? strtoll(gm, NULL, 10) : GEMM_MIN_ROWS;
    if (cb->gemm_min_rows < 1) cb->gemm_min_rows = GEMM_MIN_ROWS;
    /* SMELT_GDN_CHUNK_MIN=N: the delta rule's chunkwise form for steps of >= N token rows
     * (0: never; 1: every step). Default GDN_CHUNK_MIN (cuda_backend_int.h). */
    const char *gc = getenv("SMELT_GDN_CHUNK_MIN");
    cb->gdn_chunk_min = gc && *gc ? strtoll(gc, NULL, 10) : GDN_CHUNK_MIN;
    if (cb->gdn_chunk_min < 0) cb->gdn_chunk_min = 0;
    const char *mp = getenv("SMELT_MM_PATH");
    cb->mm_path = mp && !strcmp(mp, "mmb") ? 1 : mp && !strcmp(mp, "legacy") ? -1 : 0;
    if (mp && *mp && !cb->mm_path) log_warn("SMELT_MM_PATH=%s is neither mmb nor legacy: ignored", mp);
    const char *me = getenv("SMELT_MOE_PATH");
    /* the grouped expert products above CUDA_MMV_MAX_N rows: mmq by id where it takes the
     * experts (H200, 2026-12-03: Qwen3-30B-A3B Q4_K_M pp512 14,358 tok/s against 2,223 on
     * mmv by id); SMELT_MOE_PATH=mmv keeps mmv, =mmq is the default */
    cb->moe_path = me && !strcmp(me, "mmv") ? 1 : me && !strcmp(me, "mmq") ? 2 : 0;
    if (me && *me && !cb->moe_path) log_warn("SMELT_MOE_PATH=%s is neither mmv nor mmq: ignored", me);
    /* SMELT_MOE_GROUP_CH=N: decode of 2..8 rows grouped by expert in chunks of N rows for
     * every expert type (0: a chunk per pair); unset, by type (cuda_ops_moe.c) */
    const char *gch = getenv("SMELT_MOE_GROUP_CH");
    cb->moe_group_ch = gch && *gch ? atoi(gch) : -1;
    if (gch && *gch && (cb->moe_group_ch < 0 || cb->moe_group_ch > CUDA_MMV_MAX_N)) {
        log_warn("SMELT_MOE_GROUP_CH=%s is not 0..%d: ignored", gch, CUDA_MMV_MAX_N);
        cb->moe_group_ch = -1;
    }
    bool bad_tile = false;
    mmtune_init(&cb->tune);
    mmtune_env_parse(getenv("SMELT_NO_TUNE"), getenv("SMELT_MMQ_TILE"), cuda_mmq_tile_count(), &cb->tune_env,
                     &bad_tile);
    if (bad_tile)
        log_warn("SMELT_MMQ_TILE=%s is not a tile number (0..%d): ignored", getenv("SMELT_MMQ_TILE"),
                 cuda_mmq_tile_count() - 1);
    const char *pf = getenv("SMELT_PROFILE");
    void *gh = NULL;
    if (pf && *pf && strcmp(pf, "0") != 0 && cudaEventCreate(&cb->prof_start) == cudaSuccess &&
        cudaHostAlloc(&gh, sizeof(int), cudaHostAllocMapped) == cudaSuccess &&
        cudaHostGetDevicePointer((void **)&cb->gate_d, gh, 0) == cudaSuccess) {
        cb->gate_h = gh;
        *cb->gate_h = 1;
        cb->prof = true;
        cb->no_graph = true; /* events per kernel need eager launches */
    }
    cb->capturing = -1;
    *out = &cb->base;
    return SMELT_OK;
}
