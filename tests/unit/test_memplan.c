/* The device memory plan (engine/memplan.h): the KV sizing arithmetic and the weights check
 * against hand-computed figures; the activation measurement on the CPU backend with a tiny
 * fixture (peak grows with the step shape, a reserved scratch is not outgrown by smaller
 * steps); the same on CUDA when a device is visible (else SKIP). */
#include <string.h>

#include "backend/backend.h"
#include "engine/memplan.h"
#include "format/gguf.h"
#include "model/model.h"
#include "t.h"

#ifdef SMELT_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#define GIB ((uint64_t)1 << 30)
#define MIB ((uint64_t)1 << 20)

static struct memplan_in base_in(void) {
    /* 16 GiB device, 10 GiB free, 12.5% kept back (2 GiB) + 256 MiB margin: 7.75 GiB for KV */
    struct memplan_in in = {.free_b = 10 * GIB, .total_b = 16 * GIB, .weights_b = 5 * GIB,
                            .act_b = 300 * MIB, .per_token_b = 128 * 1024, .util = 0.875,
                            .margin_b = 256 * MIB};
    return in;
}

static void test_kv_fill(void) {
    struct memplan_in in = base_in();
    struct memplan_out out;
    struct err e;
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.tokens, 63488); /* 7.75 GiB / 128 KiB */
    T_EQ_INT(out.bytes, (uint64_t)63488 * 128 * 1024);
    T_EQ_INT(out.budget, 7 * GIB + 768 * MIB);
    in.max_tokens = 40000; /* capped */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.tokens, 40000);
    in.max_tokens = 0;
    in.util = 1.0; /* everything but the margin */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.tokens, (int64_t)((10 * GIB - 256 * MIB) / (128 * 1024)));
    /* a second model on the device: what the first holds (6 GiB of the 16) is not charged
     * to this one's utilization (0.5: 8 GiB of its own, here 4 GiB free, less its weights
     * and activations, already gone from free) */
    in = base_in();
    in.free_b = 4 * GIB;
    in.util = 0.5;
    in.others_b = 6 * GIB;
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.budget, 2 * GIB - 256 * MIB); /* 4 + 6 - 8 (kept back) - margin */
    in.others_b = 10 * GIB; /* never more than what is free */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.budget, 4 * GIB - 256 * MIB);
    in.others_b = 0; /* without the others: 4 - 8 < 0 */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_ERR_NOMEM);
}

static void test_kv_too_small(void) {
    struct memplan_in in = base_in();
    struct memplan_out out;
    struct err e;
    in.free_b = 2 * GIB + 200 * MIB; /* budget: -56 MiB */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_ERR_NOMEM);
    T_CHECKF(strstr(e.msg, "2248 MiB free of 16384 MiB") != NULL, "%s", e.msg);
    T_CHECKF(strstr(e.msg, "weights (5120 MiB)") != NULL, "%s", e.msg);
    T_CHECKF(strstr(e.msg, "activations (300 MiB)") != NULL, "%s", e.msg);
    T_CHECKF(strstr(e.msg, "--gpu-memory-utilization 0.88") != NULL, "%s", e.msg);
    /* a budget for 255 tokens (< MEMPLAN_MIN_TOKENS) fails too; 256 passes */
    in.free_b = 2 * GIB + 256 * MIB + 255 * 128 * 1024;
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_ERR_NOMEM);
    in.free_b += 128 * 1024;
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.tokens, 256);
}

static void test_kv_full_context(void) {
    struct memplan_in in = base_in();
    struct memplan_out out;
    struct err e;
    in.min_tokens = 131072; /* -c 131072 does not fit 63488 */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_ERR_NOMEM);
    T_CHECKF(strstr(e.msg, "131072 tokens") != NULL, "%s", e.msg);
    in.min_tokens = 32768;
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.tokens, 63488);
    /* an explicit pool smaller than the context */
    in.kv_size = 16384;
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_ERR_RANGE);
    T_CHECKF(strstr(e.msg, "16384") && strstr(e.msg, "32768"), "%s", e.msg);
}

static void test_kv_explicit(void) {
    struct memplan_in in = base_in();
    struct memplan_out out;
    struct err e;
    in.kv_size = 70000; /* above the utilization budget, within free - margin: allowed */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.tokens, 70000);
    in.kv_size = 80000; /* 10000 MiB > 10240 - 256 MiB */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_ERR_NOMEM);
    T_CHECKF(strstr(e.msg, "80000 tokens needs 10000 MiB") && strstr(e.msg, "--kv-size"), "%s", e.msg);
    in.kv_size = 0;
    in.need = 4096; /* smelt run -c 4096 */
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_OK);
    T_EQ_INT(out.tokens, 4096);
    T_EQ_INT(out.bytes, (uint64_t)4096 * 128 * 1024);
    in.need = 100000;
    T_EQ_INT(memplan_kv(&in, &out, &e), SMELT_ERR_NOMEM);
    T_CHECKF(strstr(e.msg, "context (-c)") != NULL, "%s", e.msg);
}

static void test_weights_fit(void) {
    struct err e;
    struct memplan_weights w = {.weights = 4 * GIB, .transient = 100 * MIB};
    T_EQ_INT(memplan_weights_fit("m.gguf", &w, 5 * GIB, 16 * GIB, &e), SMELT_OK);
    w = (struct memplan_weights){.weights = 70 * GIB, .transient = 1 * GIB};
    T_EQ_INT(memplan_weights_fit("big.gguf", &w, 60 * GIB, 80 * GIB, &e), SMELT_ERR_NOMEM);
    T_CHECKF(strstr(e.msg, "big.gguf") && strstr(e.msg, "71680 MiB") && strstr(e.msg, "61440 MiB free") &&
                 strstr(e.msg, "81920 MiB") && strstr(e.msg, "--device") && !strstr(e.msg, "--n-cpu-moe"),
             "%s", e.msg);
    /* with experts: 11 GiB too many, 300 MiB a layer: 38 layers' experts to the host (on top
     * of the 2 already there) */
    w = (struct memplan_weights){.weights = 70 * GIB, .transient = 1 * GIB, .expert_layer = 300 * MIB,
                                 .n_cpu_moe = 2};
    T_EQ_INT(memplan_weights_fit("moe.gguf", &w, 60 * GIB, 80 * GIB, &e), SMELT_ERR_NOMEM);
    T_CHECKF(strstr(e.msg, "--n-cpu-moe 40") && strstr(e.msg, "300 MiB a layer"), "%s", e.msg);
}

/* A tiny model on bk (tests/data/ref: random weights), or NULL. */
static struct model *load_tiny(struct backend *bk, struct gguf_file **f) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/ref/qwen2-f32.gguf", t_source_dir());
    struct err e;
    struct model *m = NULL;
    if (gguf_open(f, path, &e) != SMELT_OK) {
        fprintf(stderr, "%s: %s\n", path, e.msg);
        return NULL;
    }
    if (model_load(&m, *f, bk, &e) != SMELT_OK) fprintf(stderr, "load: %s\n", e.msg);
    return m;
}

/* The measurement against what it must at least hold: the logits of the widest step. */
static void measure_checks(struct backend *bk) {
    struct gguf_file *f = NULL;
    struct model *m = load_tiny(bk, &f);
    T_CHECK(m != NULL);
    if (!m) {
        gguf_close(f);
        return;
    }
    struct err e;
    struct memplan_shape small = {.max_tokens = 8, .max_seqs = 2, .max_out = 2, .n_ctx = 64,
                                  .block_size = 16, .kv_type = QT_F16};
    uint64_t p1 = 0, p2 = 0;
    T_EQ_INT(memplan_measure(m, &small, &p1, &e), SMELT_OK);
    T_CHECKF(p1 >= (uint64_t)2 * m->hp.n_vocab * 4, "peak %llu", (unsigned long long)p1);
    T_EQ_INT(bk_scratch_peak(bk), p1);
    struct memplan_shape big = {.max_tokens = 96, .max_seqs = 8, .max_out = 72, .n_ctx = 512,
                                .block_size = 16, .kv_type = QT_F16};
    T_EQ_INT(memplan_measure(m, &big, &p2, &e), SMELT_OK);
    /* 72 logit rows alone take more than the whole small step */
    T_CHECKF(p2 >= (uint64_t)72 * m->hp.n_vocab * 4 && p2 > p1, "peaks %llu, %llu",
             (unsigned long long)p1, (unsigned long long)p2);
    /* steps within the measured shape do not raise the peak */
    uint64_t p3 = 0;
    T_EQ_INT(memplan_measure(m, &small, &p3, &e), SMELT_OK);
    T_EQ_INT(p3, p2);
    T_EQ_INT(bk_scratch_peak(bk), p2);
    model_free(m);
    gguf_close(f);
}

static void test_measure_cpu(void) {
    struct backend *bk = NULL;
    struct err e;
    T_EQ_INT(cpu_backend_new(&bk, 1, &e), SMELT_OK);
    uint64_t fr = 1, tot = 1;
    T_CHECK(!bk_mem_info(bk, &fr, &tot)); /* host memory: nothing to plan */
    T_EQ_INT(fr, 0);
    int64_t ne[4] = {256, 4, 1, 1};
    T_EQ_INT(bk_weight_bytes(bk, QT_Q4_K, ne), 0);
    measure_checks(bk);
    bk_free(bk);
}

/* The conv taps (and bert's token types) are held F32 by the loader (ld_matrix_f32), so
 * the plan counts them as F32 whatever the file's type: a device held 2 bytes a tap less
 * than it needed for an F16 file. */
static void test_widened(void) {
    T_CHECK(model_tensor_widened("blk.0.ssm_conv1d.weight"));
    T_CHECK(model_tensor_widened("blk.39.ssm_conv1d.weight"));
    T_CHECK(model_tensor_widened("token_types.weight"));
    T_CHECK(!model_tensor_widened("blk.0.ssm_conv1d.bias"));
    T_CHECK(!model_tensor_widened("blk.0.ssm_out.weight"));
    T_CHECK(!model_tensor_widened("weight"));
    T_CHECK(!model_tensor_widened(""));
}

static void test_cuda(void) {
#ifdef SMELT_HAVE_CUDA
    if (cuda_device_count() == 0) {
        t_skip("no CUDA device");
        return;
    }
    struct backend *bk = NULL;
    struct err e;
    T_EQ_INT(cuda_backend_new(&bk, 0, &e), SMELT_OK);
    if (!bk) return;
    uint64_t fr = 0, tot = 0;
    T_CHECK(bk_mem_info(bk, &fr, &tot));
    T_CHECK(fr > 0 && fr <= tot);
    printf("cuda: %.0f MiB free of %.0f MiB\n", (double)fr / MIB, (double)tot / MIB);
    int64_t q4[4] = {256, 4, 1, 1}, vec[4] = {1000, 1, 1, 1};
    T_EQ_INT(bk_weight_bytes(bk, QT_Q4_K, q4), 4 * (144 + 4)); /* GGUF + the 4-byte bound */
    T_EQ_INT(bk_weight_bytes(bk, QT_F16, q4), 256 * 4 * 2);
    T_EQ_INT(bk_weight_bytes(bk, QT_Q8_0, vec), 4000);     /* vectors become F32 */
    measure_checks(bk);
    uint64_t fr2 = 0;
    T_CHECK(bk_mem_info(bk, &fr2, &tot));
    T_CHECKF(fr2 < fr, "free %llu -> %llu: the reserved scratch is device memory",
             (unsigned long long)fr, (unsigned long long)fr2);
    bk_free(bk);
#else
    t_skip("built without CUDA");
#endif
}

int main(void) {
    T_RUN(test_kv_fill);
    T_RUN(test_kv_too_small);
    T_RUN(test_kv_full_context);
    T_RUN(test_kv_explicit);
    T_RUN(test_weights_fit);
    T_RUN(test_measure_cpu);
    T_RUN(test_widened);
    T_RUN(test_cuda);
    return t_done();
}
