/* smelt quantize: convert an F32/F16/BF16 GGUF to another weight type or mix, or write a
 * random-weight model of a real shape.
 *
 *   smelt quantize IN.gguf OUT.gguf TYPE [--threads N] [--pure] [--dry-run]
 *   smelt quantize --random PRESET OUT.gguf TYPE [--seed N] [--threads N] [--pure] [--dry-run]
 *
 * Flow: plan (quant/mix.c decides each tensor's type, walking the tensors in llama.cpp's
 * order), then stream the output through the GGUF writer: its fill callback converts one
 * tensor at a time, rows split across N pthreads that pull chunks of rows from a shared
 * counter, each converting its rows to f32 (from the mapped input, or from the random
 * generator) and quantizing them straight into the writer's buffer. Memory: the largest
 * output tensor plus one small f32 chunk per thread; an 8B model never sits in memory.
 * Metadata is copied (split.* keys dropped); general.file_type and
 * general.quantization_version are set as llama-quantize sets them.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/random_model.h"
#include "format/gguf.h"
#include "quant/mix.h"
#include "quant/quant.h"
#include "util/clock.h"

#define CHUNK_ELEMS (256 * 1024) /* f32 elements per work unit (1 MiB) */

static void usage(FILE *out) {
    fprintf(out,
            "usage: smelt quantize IN.gguf OUT.gguf TYPE [--threads N] [--pure] [--dry-run]\n"
            "       smelt quantize --random PRESET OUT.gguf TYPE [--seed N] [--layers N] [--threads N]\n"
            "\n"
            "Converts an F32/F16/BF16 GGUF file to TYPE, copying all metadata. TYPE is a\n"
            "llama-quantize file type; its per-tensor rules are llama.cpp's (e.g. Q4_K_M gives\n"
            "attn_v and ffn_down of some layers and the output Q6_K; rows that do not fit a\n"
            "K-quant block fall back to Q5_0/Q5_1/Q8_0). Norms and biases stay as they are.\n"
            "TYPE is one of: %s.\n"
            "\n"
            "  --random PRESET  write a random-weight model of a real shape instead of reading\n"
            "                   IN (presets: %s)\n"
            "  --seed N         seed of the random weights (default 0)\n"
            "  --layers N       with --random: only the preset's first N layers (a smaller file\n"
            "                   of the same shapes, e.g. to profile one layer's kernels; the\n"
            "                   Q4_K_M-style mixes pick their more-bits layers out of N)\n"
            "  --threads N      worker threads (default: all CPUs)\n"
            "  --pure           every quantizable tensor gets TYPE's base type (no mix rules)\n"
            "  --dry-run        print each tensor's planned type; write nothing\n"
            "  -h, --help       this help\n"
            "\n"
            "Progress goes to stderr, one line per tensor. Exit status: 0 ok, 1 failure, 2 usage.\n",
            quant_mix_names(), rm_preset_names());
}

struct qtensor {
    char *name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint32_t src_type, dst_type;
    const uint8_t *src; /* file mode: the input bytes (in the mapping) */
    int64_t ne0, nrows;
    uint64_t dst_bytes;
    const char *why;
};

struct qjob {
    struct qtensor *t;
    int64_t n;
    int threads;
    struct gguf_file *in;          /* file mode */
    const struct rm_tensor *rt;    /* random mode: the preset's tensors (same order) */
    uint64_t seed;
    double t0; /* clock_now() when writing began */
    uint64_t out_done, out_total;
};

/* ---- the threaded conversion of one tensor ---- */

struct work {
    const struct qjob *job;
    int64_t ti;
    uint8_t *dst;
    int64_t chunk_rows;
    _Atomic int64_t next;
    _Atomic int failed;
};

static void *convert_rows(void *arg) {
    struct work *w = arg;
    const struct qtensor *t = &w->job->t[w->ti];
    const struct qtype_info *src = qtype_get(t->src_type), *dst = qtype_get(t->dst_type);
    const uint64_t src_row = qtype_row_size(t->src_type, t->ne0);
    const uint64_t dst_row = qtype_row_size(t->dst_type, t->ne0);
    float *tmp = malloc((size_t)(w->chunk_rows * t->ne0) * sizeof *tmp);
    if (!tmp) {
        w->failed = 1;
        return NULL;
    }
    for (;;) {
        const int64_t r0 = atomic_fetch_add(&w->next, w->chunk_rows);
        if (r0 >= t->nrows || w->failed) break;
        const int64_t nr = t->nrows - r0 < w->chunk_rows ? t->nrows - r0 : w->chunk_rows;
        const int64_t n = nr * t->ne0;
        if (w->job->rt) rm_fill_rows(&w->job->rt[w->ti], w->job->seed, w->ti, r0, nr, tmp);
        else src->dequantize(t->src + (uint64_t)r0 * src_row, tmp, n);
        dst->quantize(tmp, w->dst + (uint64_t)r0 * dst_row, n);
    }
    free(tmp);
    return NULL;
}

static smelt_status fill(void *ctx, int64_t index, void *buf, uint64_t nbytes, struct err *e) {
    struct qjob *job = ctx;
    struct qtensor *t = &job->t[index];
    const double t0 = clock_now();
    if (nbytes != t->dst_bytes) return err_set(e, SMELT_ERR_INTERNAL, "size mismatch");
    if (nbytes == 0 || t->ne0 == 0) {
        /* an empty tensor: nothing to convert */
    } else if (!job->rt && t->src_type == t->dst_type) {
        memcpy(buf, t->src, nbytes); /* kept as it is */
    } else {
        struct work w = {.job = job, .ti = index, .dst = buf};
        w.chunk_rows = CHUNK_ELEMS / t->ne0 > 0 ? CHUNK_ELEMS / t->ne0 : 1;
        atomic_init(&w.next, 0);
        atomic_init(&w.failed, 0);
        int nt = job->threads;
        int64_t chunks = (t->nrows + w.chunk_rows - 1) / w.chunk_rows;
        if (nt > chunks) nt = (int)chunks;
        pthread_t tid[256];
        int started = 0;
        for (int i = 1; i < nt; i++) {
            if (pthread_create(&tid[started], NULL, convert_rows, &w) != 0) break;
            started++;
        }
        convert_rows(&w);
        for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
        if (w.failed) return err_set(e, SMELT_ERR_NOMEM, "no memory for a conversion buffer");
    }
    job->out_done += nbytes;
    const double dt = clock_now() - t0;
    fprintf(stderr, "[%4" PRId64 "/%" PRId64 "] %-34s %-5s -> %-6s %9.2f MB %8.1f MB/s  %5.1f%%%s%s\n",
            index + 1, job->n, t->name, qtype_name(t->src_type), qtype_name(t->dst_type),
            (double)nbytes / 1e6, dt > 0 ? (double)nbytes / 1e6 / dt : 0.0,
            100.0 * (double)job->out_done / (double)(job->out_total ? job->out_total : 1),
            t->why ? "  " : "", t->why ? t->why : "");
    return SMELT_OK;
}

/* ---- planning ---- */

static int64_t meta_int(const struct gguf_file *f, const char *arch, const char *suffix) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const struct gguf_value *v = gguf_get(f, key);
    if (!v) return 0;
    if (v->type == GGUF_T_ARRAY) return v->v.arr.n ? gguf_arr_i64(v, 0) : 0;
    int64_t x;
    return gguf_get_i64(f, key, &x, NULL) == SMELT_OK ? x : 0;
}

static int by_llama_order(const void *a, const void *b, void *ctx) {
    const struct qjob *job = ctx;
    return quant_mix_order_cmp(job->t[*(const int64_t *)a].name, job->t[*(const int64_t *)b].name);
}

static smelt_status plan(struct qjob *job, const struct quant_mix *mix,
                         struct quant_mix_model *model, struct err *e) {
    for (int64_t i = 0; i < job->n; i++) quant_mix_model_count(model, job->t[i].name);
    int64_t *order = malloc((size_t)job->n * sizeof *order);
    if (!order) return err_set(e, SMELT_ERR_NOMEM, "no memory");
    for (int64_t i = 0; i < job->n; i++) order[i] = i;
    qsort_r(order, (size_t)job->n, sizeof *order, by_llama_order, job);
    struct quant_mix_state st;
    quant_mix_begin(&st, mix, model);
    smelt_status s = SMELT_OK;
    for (int64_t k = 0; k < job->n && !s; k++) {
        struct qtensor *t = &job->t[order[k]];
        s = quant_mix_next(&st, t->name, t->n_dims, t->ne, t->src_type, &t->dst_type, &t->why, e);
        if (!s) {
            t->dst_bytes = qtype_row_size(t->dst_type, t->ne0) * (uint64_t)t->nrows;
            job->out_total += t->dst_bytes;
        }
    }
    free(order);
    return s;
}

static smelt_status load_file(struct qjob *job, const char *path, struct quant_mix_model *m,
                              struct err *e) {
    smelt_status s = gguf_open(&job->in, path, e);
    if (s) return s;
    char arch[64] = "";
    struct gguf_str a;
    if (gguf_get_str(job->in, "general.architecture", &a, NULL) == SMELT_OK)
        gguf_str_copy(a, arch, sizeof arch);
    m->n_layer = (int)meta_int(job->in, arch, "block_count");
    m->n_head = (int)meta_int(job->in, arch, "attention.head_count");
    m->n_head_kv = (int)meta_int(job->in, arch, "attention.head_count_kv");
    m->n_expert = (int)meta_int(job->in, arch, "expert_count");
    m->falcon = !strcmp(arch, "falcon");
    m->is_70b = !strcmp(arch, "llama") && m->n_layer == 80 && m->n_head != m->n_head_kv;
    job->n = gguf_n_tensors(job->in);
    job->t = calloc((size_t)(job->n ? job->n : 1), sizeof *job->t);
    if (!job->t) return err_set(e, SMELT_ERR_NOMEM, "no memory");
    for (int64_t i = 0; i < job->n; i++) {
        const struct gguf_tensor *g = gguf_tensor_at(job->in, i);
        struct qtensor *t = &job->t[i];
        t->name = malloc(g->name.len + 1);
        if (!t->name) return err_set(e, SMELT_ERR_NOMEM, "no memory");
        gguf_str_copy(g->name, t->name, g->name.len + 1);
        t->n_dims = g->n_dims;
        memcpy(t->ne, g->ne, sizeof t->ne);
        t->src_type = g->type;
        t->src = g->data;
        t->ne0 = g->ne[0];
        t->nrows = g->ne[1] * g->ne[2] * g->ne[3];
    }
    return SMELT_OK;
}

static smelt_status load_random(struct qjob *job, const struct rm_preset *p,
                                struct quant_mix_model *m, struct rm_tensor **rt,
                                struct err *e) {
    smelt_status s = rm_tensors(p, rt, &job->n, e);
    if (s) return s;
    job->rt = *rt;
    m->n_layer = p->n_layer;
    m->n_head = p->n_head;
    m->n_head_kv = p->n_head_kv;
    m->n_expert = p->n_expert;
    job->t = calloc((size_t)job->n, sizeof *job->t);
    if (!job->t) return err_set(e, SMELT_ERR_NOMEM, "no memory");
    for (int64_t i = 0; i < job->n; i++) {
        const struct rm_tensor *r = &(*rt)[i];
        struct qtensor *t = &job->t[i];
        t->name = strdup(r->name);
        if (!t->name) return err_set(e, SMELT_ERR_NOMEM, "no memory");
        t->n_dims = r->n_dims;
        t->ne[0] = r->ne[0];
        t->ne[1] = r->ne[1];
        t->ne[2] = r->ne[2];
        t->ne[3] = 1;
        /* as mkmodel.py writes them: matrices F16, norms, biases, routers and conv
         * kernels F32 */
        t->src_type = r->kind == RM_MATRIX ? QT_F16 : QT_F32;
        t->ne0 = r->ne[0];
        t->nrows = r->ne[1] * r->ne[2];
    }
    return SMELT_OK;
}

/* Input tensors that must be converted have to be F32/F16/BF16. */
static smelt_status check_inputs(const struct qjob *job, struct err *e) {
    for (int64_t i = 0; i < job->n; i++) {
        const struct qtensor *t = &job->t[i];
        if (t->src_type == t->dst_type) continue;
        if (t->src_type != QT_F32 && t->src_type != QT_F16 && t->src_type != QT_BF16)
            return err_set(e, SMELT_ERR_UNSUPPORTED,
                           "tensor %s is %s: smelt quantize reads F32, F16 or BF16 weights "
                           "(re-quantizing a quantized file would compound the error; convert "
                           "from the original checkpoint)",
                           t->name, qtype_name(t->src_type));
    }
    return SMELT_OK;
}

static smelt_status copy_metadata(struct gguf_writer *w, const struct gguf_file *in, struct err *e) {
    for (int64_t i = 0; i < gguf_n_kv(in); i++) {
        const struct gguf_kv *kv = gguf_kv_at(in, i);
        char *key = malloc(kv->key.len + 1);
        if (!key) return err_set(e, SMELT_ERR_NOMEM, "no memory");
        gguf_str_copy(kv->key, key, kv->key.len + 1);
        if (strcmp(key, "split.no") && strcmp(key, "split.count") &&
            strcmp(key, "split.tensors.count"))
            gguf_set_value(w, key, &kv->val);
        free(key);
    }
    return SMELT_OK;
}

static void print_plan(const struct qjob *job) {
    uint64_t in_bytes = 0, n_elem = 0;
    for (int64_t i = 0; i < job->n; i++) {
        const struct qtensor *t = &job->t[i];
        char shape[64];
        int k = snprintf(shape, sizeof shape, "%" PRId64, t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims && k < (int)sizeof shape; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "x%" PRId64, t->ne[d]);
        printf("%-40s %-18s %-5s -> %-6s%s%s\n", t->name, shape, qtype_name(t->src_type),
               qtype_name(t->dst_type), t->why ? "  # " : "", t->why ? t->why : "");
        in_bytes += qtype_row_size(t->src_type, t->ne0) * (uint64_t)t->nrows;
        n_elem += (uint64_t)(t->ne0 * t->nrows);
    }
    printf("total: %" PRId64 " tensors, %.2f MB -> %.2f MB (%.3f bits per weight)\n", job->n,
           (double)in_bytes / 1e6, (double)job->out_total / 1e6,
           n_elem ? 8.0 * (double)job->out_total / (double)n_elem : 0.0);
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return -1;
    *out = v;
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {0}, *preset_name = NULL;
    int npos = 0, dry = 0, pure = 0;
    uint64_t seed = 0, threads = 0, layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dry-run")) {
            dry = 1;
        } else if (!strcmp(a, "--pure")) {
            pure = 1;
        } else if (!strcmp(a, "--random") && i + 1 < argc) {
            preset_name = argv[++i];
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            if (parse_u64(argv[++i], &seed)) {
                fprintf(stderr, "smelt quantize: --seed wants a non-negative integer\n");
                return 2;
            }
        } else if (!strcmp(a, "--layers") && i + 1 < argc) {
            if (parse_u64(argv[++i], &layers) || layers < 1) {
                fprintf(stderr, "smelt quantize: --layers wants a positive integer\n");
                return 2;
            }
        } else if ((!strcmp(a, "--threads") || !strcmp(a, "-t")) && i + 1 < argc) {
            if (parse_u64(argv[++i], &threads) || threads < 1 || threads > 256) {
                fprintf(stderr, "smelt quantize: --threads wants 1..256\n");
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "smelt quantize: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else if (npos < 3) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "smelt quantize: too many arguments\n\n");
            usage(stderr);
            return 2;
        }
    }
    const int want = preset_name ? 2 : 3;
    if (npos != want) {
        usage(stderr);
        return 2;
    }
    const char *in_path = preset_name ? NULL : pos[0];
    const char *out_path = pos[want - 2], *type_name = pos[want - 1];
    struct err e = {0};
    struct quant_mix mix;
    if (quant_mix_find(type_name, &mix, &e)) return cli_fail("quantize", &e);
    mix.pure = pure;
    const struct rm_preset *preset = NULL;
    if (preset_name && !(preset = rm_preset_find(preset_name))) {
        fprintf(stderr, "smelt quantize: unknown preset '%s' (presets: %s)\n", preset_name,
                rm_preset_names());
        return 2;
    }
    struct rm_preset cut; /* --layers: the preset's first layers */
    if (layers && !preset) {
        fprintf(stderr, "smelt quantize: --layers goes with --random\n");
        return 2;
    }
    if (layers) {
        if (layers > (uint64_t)preset->n_layer) {
            fprintf(stderr, "smelt quantize: --layers %llu: preset %s has %d layers\n",
                    (unsigned long long)layers, preset->name, preset->n_layer);
            return 2;
        }
        if (preset->hybrid && layers < (uint64_t)preset->hybrid->interval) {
            fprintf(stderr, "smelt quantize: --layers %llu: preset %s puts a full-attention "
                    "layer every %d layers; give at least that many\n",
                    (unsigned long long)layers, preset->name, preset->hybrid->interval);
            return 2;
        }
        cut = *preset;
        cut.n_layer = (int)layers;
        preset = &cut;
    }
    if (!threads) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc > 0 ? (uint64_t)nc : 1;
        if (threads > 256) threads = 256;
    }

    struct qjob job = {.threads = (int)threads, .seed = seed};
    struct quant_mix_model model = {0};
    struct rm_tensor *rt = NULL;
    struct gguf_writer *w = NULL;
    int rc = 1;
    smelt_status s = preset ? load_random(&job, preset, &model, &rt, &e)
                            : load_file(&job, in_path, &model, &e);
    if (!s) s = plan(&job, &mix, &model, &e);
    if (!s && dry) {
        print_plan(&job);
        rc = 0;
        goto done;
    }
    if (!s) s = check_inputs(&job, &e);
    if (!s) s = gguf_writer_new(&w, &e);
    if (!s && job.in) s = copy_metadata(w, job.in, &e);
    if (!s && preset) s = rm_write_metadata(w, preset, (uint32_t)mix.ftype, &e);
    if (!s) {
        gguf_set_u32(w, "general.quantization_version", 2);
        gguf_set_u32(w, "general.file_type", (uint32_t)mix.ftype);
        for (int64_t i = 0; i < job.n && !s; i++)
            s = gguf_add_tensor(w, job.t[i].name, job.t[i].dst_type, job.t[i].n_dims, job.t[i].ne,
                                NULL);
    }
    if (!s) {
        fprintf(stderr, "smelt quantize: %s -> %s as %s, %" PRId64 " tensors, %d threads\n",
                preset ? preset->name : in_path, out_path, mix.name, job.n, job.threads);
        job.t0 = clock_now();
        s = gguf_writer_write(w, out_path, fill, &job, &e);
    }
    if (!s) {
        const double dt = clock_now() - job.t0;
        uint64_t n_elem = 0;
        for (int64_t i = 0; i < job.n; i++) n_elem += (uint64_t)(job.t[i].ne0 * job.t[i].nrows);
        fprintf(stderr,
                "smelt quantize: wrote %s: %.2f MB of tensors, %.3f bits per weight, %.1f s "
                "(%.1f MB/s)\n",
                out_path, (double)job.out_total / 1e6, 8.0 * (double)job.out_total / (double)n_elem,
                dt, dt > 0 ? (double)job.out_total / 1e6 / dt : 0.0);
        rc = 0;
    }
done:
    if (s) rc = cli_fail("quantize", &e);
    gguf_writer_free(w);
    for (int64_t i = 0; i < job.n && job.t; i++) free(job.t[i].name);
    free(job.t);
    free(rt);
    if (job.in) gguf_close(job.in);
    return rc;
}
