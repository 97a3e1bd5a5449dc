/* Matmul workbench: times cpu_matmul on decode (n = 1) and prefill (n = 128) shapes and
 * prints GB/s of weights read (decode is bandwidth-bound) and GFLOP/s (2·rows·k·n / time).
 *
 *   build/bench_matmul [-t THREADS] [-r REPS] [-n N1,N2..] [-T TYPE,TYPE..] [-s RxK,RxK..] [-P]
 *   SMELT_CPU_ISA=avx2 build/bench_matmul ...   (force a lower SIMD path)
 *
 * Defaults: 2 threads; types Q4_K, Q6_K, Q8_0, Q5_0, F16; the Qwen2.5-0.5B shapes 4864x896
 * (gate/up), 896x4864 (down), 151936x896 (vocab projection); n = 1 and 128; the median of
 * REPS runs after a warm-up (and the best run: on a shared machine the median shows the
 * load as much as the kernel). GB/s is weights bytes / median time. cpu-ms is the process
 * CPU time of a run (all threads; waiting in the pool's spin loop counts, descheduled
 * time does not) and GF/cpu-s the work per CPU-second: the kernel's speed per core when
 * other processes compete for the cores. Weights are random bytes (scales sanitized), as in the
 * tests. Weights are repacked as the CPU backend does (cpu_matmul_repack) where the level has
 * a repacked kernel; -P runs the file layout instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_pool.h"
#include "quant/quant.h"
#include "util/arena.h"

#include "bench_util.h"

static void *make_weights(uint32_t t, int64_t rows, int64_t k, size_t *bytes) {
    *bytes = (size_t)qtype_row_size(t, k) * (size_t)rows;
    return bench_weights(t, *bytes);
}

int main(int argc, char **argv) {
    int threads = 2, reps = 5, norepack = 0;
    const char *types = "Q4_K,Q6_K,Q8_0,Q5_0,F16", *shapes = "4864x896,896x4864,151936x896",
               *ns = "1,128";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            ns = argv[++i];
        else if (!strcmp(argv[i], "-T") && i + 1 < argc)
            types = argv[++i];
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            shapes = argv[++i];
        else if (!strcmp(argv[i], "-P"))
            norepack = 1;
        else {
            fprintf(stderr, "usage: %s [-t THREADS] [-r REPS] [-n N,..] [-T TYPE,..] [-s RxK,..] [-P]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    char feat[256];
    cpu_features_describe(feat, sizeof feat);
    printf("# cpu: %s | %s | threads %d\n", cpu_features_get()->model, feat, threads);
    printf("%-6s %-12s %5s %9s %9s %9s %8s %9s %9s %10s\n", "type", "shape", "n", "ms(med)",
           "ms(best)", "cpu-ms", "GB/s", "GFLOP/s", "(best)", "GF/cpu-s");
    struct cpu_pool *pool = NULL;
    struct err e = {0};
    if (cpu_pool_new(&pool, threads, &e) != SMELT_OK) {
        fprintf(stderr, "pool: %s\n", e.msg);
        return 1;
    }
    struct arena ar;
    arena_init(&ar);
    char tbuf[256];
    snprintf(tbuf, sizeof tbuf, "%s", types);
    for (char *tn = strtok(tbuf, ","); tn; tn = strtok(NULL, ",")) {
        enum qtype t;
        if (!qtype_from_name(tn, &t)) {
            fprintf(stderr, "unknown type %s\n", tn);
            return 2;
        }
        for (const char *sp = shapes; *sp;) {
            long long rows = 0, k = 0;
            int used = 0;
            if (sscanf(sp, "%lldx%lld%n", &rows, &k, &used) != 2) {
                fprintf(stderr, "bad shape list %s\n", shapes);
                return 2;
            }
            sp += used;
            if (*sp == ',') sp++;
            if (k % qtype_get(t)->blck_size) {
                printf("%-6s %lldx%lld: k not a multiple of %u (GGUF files use a fallback type "
                       "here)\n",
                       tn, rows, k, qtype_get(t)->blck_size);
                continue;
            }
            size_t wbytes = 0;
            void *w = make_weights(t, rows, k, &wbytes);
            /* as the CPU backend runs weights: repacked where the level has a kernel */
            struct cpu_rweight *rw = NULL;
            if (w && !norepack &&
                cpu_matmul_repack(pool, cpu_isa_best(), t, w, rows, k, &rw, &e) != SMELT_OK) {
                fprintf(stderr, "repack: %s\n", e.msg);
                return 1;
            }
            for (const char *np = ns; *np;) {
                int n = atoi(np);
                while (*np && *np != ',')
                    np++;
                if (*np == ',') np++;
                float *x = malloc(sizeof(float) * (size_t)(n * k));
                float *y = malloc(sizeof(float) * (size_t)(n * rows));
                if (!w || !x || !y) {
                    fprintf(stderr, "out of memory\n");
                    return 1;
                }
                for (long long i = 0; i < n * k; i++)
                    x[i] = (float)((int)(bench_next() % 2001) - 1000) / 1000.0f;
                double ts[64], cs[64];
                int R = reps > 64 ? 64 : reps;
                for (int r = -1; r < R; r++) {
                    arena_reset(&ar);
                    double t0 = clock_now(), c0 = bench_cpu_now();
                    smelt_status st = rw ? cpu_matmul_rw(pool, rw, x, n, y, &ar, &e)
                                         : cpu_matmul(pool, t, w, rows, k, x, n, y, &ar, &e);
                    if (st != SMELT_OK) {
                        fprintf(stderr, "matmul: %s\n", e.msg);
                        return 1;
                    }
                    if (r >= 0) {
                        ts[r] = clock_now() - t0;
                        cs[r] = bench_cpu_now() - c0;
                    }
                }
                qsort(ts, (size_t)R, sizeof ts[0], bench_cmp_d);
                qsort(cs, (size_t)R, sizeof cs[0], bench_cmp_d);
                double med = ts[R / 2], best = ts[0], cpu = cs[R / 2];
                char shp[48];
                snprintf(shp, sizeof shp, "%lldx%lld", rows, k);
                double flop = 2.0 * (double)rows * (double)k * n;
                printf("%-6s %-12s %5d %9.3f %9.3f %9.3f %8.1f %9.1f %9.1f %10.1f\n", tn, shp, n,
                       med * 1e3, best * 1e3, cpu * 1e3, (double)wbytes / med / 1e9,
                       flop / med / 1e9, flop / best / 1e9, flop / cpu / 1e9);
                fflush(stdout);
                free(x);
                free(y);
            }
            free(w);
            cpu_rweight_free(rw);
        }
    }
    arena_free(&ar);
    cpu_pool_free(pool);
    return 0;
}
