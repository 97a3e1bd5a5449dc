/* MoE workbench: times the CPU backend's bk_moe_route and bk_moe_ffn on one layer of a
 * mixture of experts beside the dense FFN that reads the same bytes per row (n_ff = k ·
 * n_ff_exp: what the expert FFN costs over a dense one of its active size), and prints
 * GB/s of the weights each call reads (the experts selected at least once), and the
 * process CPU time of a call (all threads; spinning in the pool counts, descheduled time
 * does not: on a shared machine the wall time shows the load as much as the code).
 *
 *   build/bench_moe [-t THREADS] [-r REPS] [-n N1,N2..] [-T TYPE] [-e N_EXPERT] [-k K]
 *                   [-d N_EMBD] [-f N_FF_EXP]
 *
 * Defaults: Qwen3-30B-A3B's layer (n_embd 2048, 128 experts of 768, 8 per row), Q4_K, 2
 * threads, n = 1, 8, 64, 512 rows; the median of REPS runs after a warm-up. Rows pick k
 * distinct experts uniformly at random (random weights route close to uniformly); the
 * weights are random bytes with sane f16 scales (bench_util.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "quant/quant.h"

#include "bench_util.h"

/* A scratch-free weight tensor of random bytes whose f16 halves are finite. */
static struct tensor *weights(struct backend *bk, uint32_t type, int64_t ne0, int64_t ne1,
                              int64_t ne2) {
    struct tensor *t = calloc(1, sizeof *t);
    if (!t || !tensor_init(t, type, ne0, ne1, ne2, 1)) return NULL;
    t->data = bench_weights(type, tensor_nbytes(t));
    if (!t->data) return NULL;
    t->name = "bench";
    struct err e;
    if (bk_weight_bind(bk, t, &e) != SMELT_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return NULL;
    }
    return t;
}

int main(int argc, char **argv) {
    int threads = 2, reps = 5, n_list[16] = {1, 8, 64, 512}, nn = 4;
    int64_t d = 2048, f = 768, X = 128, k = 8;
    uint32_t type = QT_Q4_K;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-t"))
            threads = atoi(v);
        else if (!strcmp(a, "-r"))
            reps = atoi(v);
        else if (!strcmp(a, "-e"))
            X = atoi(v);
        else if (!strcmp(a, "-k"))
            k = atoi(v);
        else if (!strcmp(a, "-d"))
            d = atoi(v);
        else if (!strcmp(a, "-f"))
            f = atoi(v);
        else if (!strcmp(a, "-T")) {
            enum qtype q;
            if (!qtype_from_name(v, &q)) return fprintf(stderr, "unknown type %s\n", v), 2;
            type = q;
        } else if (!strcmp(a, "-n")) {
            nn = 0;
            for (char *s = (char *)v; *s && nn < 16; s++) {
                n_list[nn++] = (int)strtol(s, &s, 10);
                if (!*s) break;
            }
        } else
            return fprintf(stderr, "usage: see the file comment\n"), 2;
    }
    if (reps < 1 || reps > 100 || k < 1 || k > X) return fprintf(stderr, "bad -r or -k\n"), 2;
    struct backend *bk;
    struct err e;
    if (cpu_backend_new(&bk, threads, &e) != SMELT_OK) return fprintf(stderr, "%s\n", e.msg), 1;
    struct moe_experts ex = {.gate = weights(bk, type, d, f, X),
                             .up = weights(bk, type, d, f, X),
                             .down = weights(bk, type, f, d, X),
                             .act = GLU_SILU};
    struct tensor *dg = weights(bk, type, d, f * k, 1), *du = weights(bk, type, d, f * k, 1),
                  *dd = weights(bk, type, f * k, d, 1);
    if (!ex.gate || !ex.up || !ex.down || !dg || !du || !dd) return 1;
    const double expert_bytes = (double)tensor_nbytes(ex.gate) * 3 / (double)X;
    printf("%s, n_embd %lld, %lld experts of %lld, %lld per row, %d threads (%.2f MB an expert)\n",
           qtype_name(type), (long long)d, (long long)X, (long long)f, (long long)k, threads,
           expert_bytes / 1e6);
    printf("%6s %9s %9s %9s %7s %9s %9s %9s %7s\n", "rows", "experts", "moe ms", "cpu-ms",
           "GB/s", "route ms", "dense ms", "cpu-ms", "GB/s");
    for (int in = 0; in < nn; in++) {
        const int64_t n = n_list[in];
        if (n < 1) continue;
        double t_moe[100], t_route[100], t_dense[100], c_moe[100], c_dense[100];
        int64_t used = 0;
        for (int rep = -1; rep < reps; rep++) {
            bk_step_begin(bk);
            struct tensor *x = bk_new(bk, QT_F32, d, n, 1), *y = bk_new(bk, QT_F32, d, n, 1);
            struct tensor *router = bk_new(bk, QT_F32, d, X, 1);
            struct tensor *ids = bk_new(bk, QT_I32, k, n, 1), *w = bk_new(bk, QT_F32, k, n, 1);
            struct tensor *g = bk_new(bk, QT_F32, f * k, n, 1);
            if (bk_sync(bk, &e) != SMELT_OK) return fprintf(stderr, "%s\n", e.msg), 1;
            for (int64_t i = 0; i < d * n; i++)
                ((float *)x->data)[i] = (float)(bench_next() >> 40) / 8e6f - 1;
            for (int64_t i = 0; i < d * X; i++)
                ((float *)router->data)[i] = (float)(bench_next() >> 40) / 8e8f;
            double t0 = clock_now();
            bk_moe_route(bk, ids, w, x, router, NULL, MOE_SOFTMAX_TOPK, NULL, NULL, NULL);
            double t1 = clock_now();
            /* the route of random weights is not uniform enough at small n to be typical:
             * use k distinct uniform experts per row instead */
            int32_t *id = ids->data;
            for (int64_t r = 0; r < n; r++)
                for (int64_t j = 0; j < k; j++) {
                    int32_t c;
                    bool dup;
                    do {
                        c = (int32_t)(bench_next() % (unsigned long long)X);
                        dup = false;
                        for (int64_t q = 0; q < j; q++)
                            dup |= id[r * k + q] == c;
                    } while (dup);
                    id[r * k + j] = c;
                }
            double t2 = clock_now(), u2 = bench_cpu_now();
            bk_moe_ffn(bk, y, x, &ex, ids, w, NULL, true, NULL);
            double t3 = clock_now(), u3 = bench_cpu_now();
            bk_ffn_glu(bk, g, dg, du, x, GLU_SILU, NULL);
            bk_matmul_acc(bk, y, dd, NULL, g, NULL);
            double t4 = clock_now(), u4 = bench_cpu_now();
            if (bk_sync(bk, &e) != SMELT_OK) return fprintf(stderr, "%s\n", e.msg), 1;
            if (rep < 0) continue;
            t_route[rep] = t1 - t0;
            t_moe[rep] = t3 - t2;
            t_dense[rep] = t4 - t3;
            c_moe[rep] = u3 - u2;
            c_dense[rep] = u4 - u3;
            char seen[4096] = {0};
            used = 0;
            for (int64_t i = 0; i < n * k; i++)
                if (id[i] < 4096 && !seen[id[i]]++) used++;
        }
        qsort(t_moe, (size_t)reps, sizeof(double), bench_cmp_d);
        qsort(t_route, (size_t)reps, sizeof(double), bench_cmp_d);
        qsort(t_dense, (size_t)reps, sizeof(double), bench_cmp_d);
        qsort(c_moe, (size_t)reps, sizeof(double), bench_cmp_d);
        qsort(c_dense, (size_t)reps, sizeof(double), bench_cmp_d);
        const double tm = t_moe[reps / 2], td = t_dense[reps / 2];
        printf("%6lld %9lld %9.3f %9.3f %7.2f %9.3f %9.3f %9.3f %7.2f\n", (long long)n,
               (long long)used, tm * 1e3, c_moe[reps / 2] * 1e3,
               expert_bytes * (double)used / tm / 1e9, t_route[reps / 2] * 1e3, td * 1e3,
               c_dense[reps / 2] * 1e3, expert_bytes * (double)k / td / 1e9);
    }
    bk_free(bk);
    return 0;
}
