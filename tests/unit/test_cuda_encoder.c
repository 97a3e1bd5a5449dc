/* The CUDA backend's encoder ops (bert) against their CPU twins on random data at ragged
 * sizes: bk_layer_norm (cuda_norm.cu; cpu_ops_elem.c), bk_act with the exact GELU, the tanh
 * GELU and SiLU (cuda_elem.cu), and bidirectional attention (attn_params.non_causal: every
 * row sees its sequence's keys 0..n_keys - 1, later positions too; cuda_ops.c bounds each
 * row by that instead of its position) over sequences of 1, 5, 13 and 40 rows in one step,
 * F16 and F32 caches, GQA and not. LayerNorm within 2e-6 of the largest magnitude (the CPU
 * sums in double), the activations 1e-6, attention 2e-3 (F16 cache) / 2e-5 (F32). */
#ifndef SMELT_HAVE_CUDA
#include <stdio.h>

int main(void) {
    printf("SKIP test_cuda_encoder: built without CUDA (nvcc not found at configure time)\n");
    return 77;
}
#else

#include "t.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

static struct backend *cpu, *gpu;
static unsigned long long rs = 0xe4c0de5ULL;

static float *rand_buf(size_t n, float scale, float offset) {
    float *p = malloc(n * sizeof *p);
    if (!p) abort();
    for (size_t i = 0; i < n; i++) p[i] = offset + scale * t_rand_f(&rs);
    return p;
}


static struct tensor *put(struct backend *b, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2, const void *src) {
    struct tensor *t = bk_new(b, type, ne0, ne1, ne2);
    bk_upload(b, t, src, tensor_nbytes(t));
    return t;
}

/* ---- LayerNorm ---- */

static bool norm_run(struct backend *b, int64_t n, int64_t rows, const float *x, const float *w, const float *bias,
                     float *out) {
    struct err e;
    bk_step_begin(b);
    struct tensor *tx = put(b, QT_F32, n, rows, 1, x), *ty = bk_new(b, QT_F32, n, rows, 1);
    struct tensor *tw = w ? put(b, QT_F32, n, 1, 1, w) : NULL, *tb = bias ? put(b, QT_F32, n, 1, 1, bias) : NULL;
    bk_layer_norm(b, ty, tx, tw, tb, 1e-12f);
    bk_download(b, out, ty, (size_t)(n * rows) * sizeof(float));
    if (bk_sync(b, &e) != SMELT_OK) return fprintf(stderr, "%s: %s\n", b->ops->name, e.msg), false;
    return true;
}

static void test_layer_norm(void) {
    const int64_t ns[] = {1, 37, 384, 1000, 4096};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (int wb = 0; wb < 3; wb++) {
            const int64_t n = ns[i], rows = 7;
            /* a large mean beside small spread: the variance's cancellation */
            float *x = rand_buf((size_t)(n * rows), 1.0f, wb == 2 ? 30.0f : 0.0f);
            float *w = wb ? rand_buf((size_t)n, 1.0f, 1.0f) : NULL, *bias = wb ? rand_buf((size_t)n, 0.5f, 0) : NULL;
            float *a = malloc((size_t)(n * rows) * sizeof *a), *g = malloc((size_t)(n * rows) * sizeof *g);
            T_CHECK(norm_run(cpu, n, rows, x, w, bias, a) && norm_run(gpu, n, rows, x, w, bias, g));
            double err = t_rel_err(g, a, (size_t)(n * rows));
            T_CHECKF(n == 1 ? err < 1e-6 : err < 2e-5, "layer_norm n=%lld weights %d: rel err %g", (long long)n, wb, err);
            free(x), free(w), free(bias), free(a), free(g);
        }
}

/* ---- activations ---- */

static void test_act(void) {
    const enum glu_act acts[] = {GLU_GELU_ERF, GLU_GELU_TANH, GLU_SILU};
    const int64_t n = 1536, rows = 5;
    for (int k = 0; k < 3; k++) {
        float *x = rand_buf((size_t)(n * rows), 6.0f, 0), *out[2];
        struct backend *bks[2] = {cpu, gpu};
        for (int s = 0; s < 2; s++) {
            struct backend *b = bks[s];
            struct err e;
            out[s] = malloc((size_t)(n * rows) * sizeof(float));
            bk_step_begin(b);
            struct tensor *t = put(b, QT_F32, n, rows, 1, x);
            bk_act(b, t, t, acts[k]); /* in place, as bert runs it */
            bk_download(b, out[s], t, (size_t)(n * rows) * sizeof(float));
            T_CHECKF(bk_sync(b, &e) == SMELT_OK, "%s", e.msg);
        }
        double err = t_rel_err(out[1], out[0], (size_t)(n * rows));
        T_CHECKF(err < 1e-6, "act %d: rel err %g", (int)acts[k], err);
        free(x), free(out[0]), free(out[1]);
    }
}

/* ---- bidirectional attention ---- */

enum { BS = 16, NBLK = 8 };

/* One step of sequences of len[s] rows (positions 0..), stored then attended both ways;
 * out (head_dim, n_head, rows). */
static bool attn_run(struct backend *b, uint32_t kv_type, int n_head, int n_kv, int hd, int n_seq, const int *len,
                     const float *q, const float *k, const float *v, float *out) {
    struct err e;
    struct tensor kc, vc;
    tensor_init(&kc, kv_type, hd, BS, n_kv, NBLK * n_seq);
    tensor_init(&vc, kv_type, hd, BS, n_kv, NBLK * n_seq);
    if (bk_buffer_alloc(b, &kc, &e) != SMELT_OK || bk_buffer_alloc(b, &vc, &e) != SMELT_OK)
        return fprintf(stderr, "%s\n", e.msg), false;
    int rows = 0;
    for (int s = 0; s < n_seq; s++) rows += len[s];
    int32_t *pos = malloc((size_t)rows * 4), *seq = malloc((size_t)rows * 4), *slot = malloc((size_t)rows * 4);
    int32_t *blocks = malloc((size_t)(NBLK * n_seq) * 4), nk[8];
    for (int s = 0, r = 0; s < n_seq; s++) {
        /* each sequence's blocks, in no order */
        for (int j = 0; j < NBLK; j++) blocks[s * NBLK + j] = ((NBLK - 1 - j) * n_seq + s);
        nk[s] = len[s];
        for (int i = 0; i < len[s]; i++, r++) {
            pos[r] = i, seq[r] = s;
            slot[r] = blocks[s * NBLK + i / BS] * BS + i % BS;
        }
    }
    bk_step_begin(b);
    struct tensor *tq = put(b, QT_F32, hd, n_head, rows, q), *tk = put(b, QT_F32, hd, n_kv, rows, k);
    struct tensor *tv = put(b, QT_F32, hd, n_kv, rows, v), *td = bk_new(b, QT_F32, hd, n_head, rows);
    struct attn_meta m = {.pos = put(b, QT_I32, rows, 1, 1, pos), .seq = put(b, QT_I32, rows, 1, 1, seq),
                          .slot = put(b, QT_I32, rows, 1, 1, slot),
                          .blocks = put(b, QT_I32, NBLK, n_seq, 1, blocks), .block_size = BS,
                          .one_per_seq = false, .n_keys = put(b, QT_I32, n_seq, 1, 1, nk)};
    struct attn_params p = {.scale = 1.0f / sqrtf((float)hd), .non_causal = true};
    bk_kv_store(b, &kc, &vc, tk, tv, &m);
    bk_attention(b, td, tq, &kc, &vc, &m, &p);
    bk_download(b, out, td, (size_t)rows * (size_t)(hd * n_head) * sizeof(float));
    bool ok = bk_sync(b, &e) == SMELT_OK;
    if (!ok) fprintf(stderr, "%s: %s\n", b->ops->name, e.msg);
    bk_buffer_free(b, &kc);
    bk_buffer_free(b, &vc);
    free(pos), free(seq), free(slot), free(blocks);
    return ok;
}

static void test_non_causal(void) {
    const int shapes[][3] = {{12, 12, 32}, {8, 2, 64}, {4, 4, 128}}; /* heads, kv heads, head_dim */
    const int len[] = {5, 1, 40, 13};
    const int n_seq = 4, rows = 59;
    for (int t = 0; t < 2; t++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
            const int nh = shapes[sh][0], nkv = shapes[sh][1], hd = shapes[sh][2];
            float *q = rand_buf((size_t)(rows * nh * hd), 1.0f, 0), *k = rand_buf((size_t)(rows * nkv * hd), 1.0f, 0);
            float *v = rand_buf((size_t)(rows * nkv * hd), 1.0f, 0);
            float *a = malloc((size_t)(rows * nh * hd) * sizeof *a), *g = malloc((size_t)(rows * nh * hd) * sizeof *g);
            uint32_t type = t ? QT_F32 : QT_F16;
            T_CHECK(attn_run(cpu, type, nh, nkv, hd, n_seq, len, q, k, v, a) &&
                    attn_run(gpu, type, nh, nkv, hd, n_seq, len, q, k, v, g));
            double err = t_rel_err(g, a, (size_t)(rows * nh * hd));
            T_CHECKF(err < (t ? 2e-5 : 2e-3), "non-causal %dx%d heads of %d, %s cache: rel err %g", nh, nkv, hd,
                     t ? "F32" : "F16", err);
            /* and it is not causal: the first row of the 40-row sequence sees its 40 keys,
             * so it differs from what its own key alone would give (v of that row) */
            const float *r0 = a + (size_t)(6 * nh * hd); /* row 6: sequence 2's position 0 */
            const float *v0 = v + (size_t)(6 * nkv * hd);
            T_CHECK(fabsf(r0[0] - v0[0]) > 1e-4f);
            free(q), free(k), free(v), free(a), free(g);
        }
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("SKIP test_cuda_encoder: no CUDA device on this machine\n");
        return 77;
    }
    struct err e;
    if (cpu_backend_new(&cpu, 2, &e) != SMELT_OK || cuda_backend_new(&gpu, 0, &e) != SMELT_OK) {
        fprintf(stderr, "backend: %s\n", e.msg);
        return 1;
    }
    cpu_backend_set_exact(cpu, true);
    T_RUN(test_layer_norm);
    T_RUN(test_act);
    T_RUN(test_non_causal);
    bk_free(cpu);
    bk_free(gpu);
    return t_done();
}
#endif
