/* The matmul path table: which kernel a GPU backend runs for a matrix product with a
 * given (weight type, rows, k, token-row bucket), chosen once by timing the candidates on
 * the running device. This file is the host-side bookkeeping only (buckets, the candidate
 * list, the write-once table, the log text), so it builds and is tested without a GPU; the
 * timing and the contract with CUDA graphs are in cuda_matmul.c ("matrix products: the
 * paths and the choice between them") and docs/cuda-backend.md ("Choosing the path by
 * measurement").
 *
 * A choice is an int: >= 0 one of the tensor-core kernel's fixed tiles (cuda_mmq.h),
 * MMTUNE_MMQ_AUTO that kernel with its static per-shape tile, MMTUNE_GEMM dequantization
 * to F16 + cuBLAS, MMTUNE_MMV the 8-row kernel repeated over 8-row chunks. */
#ifndef SMELT_CUDA_MM_TUNE_H
#define SMELT_CUDA_MM_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define MMTUNE_MMQ_AUTO (-1) /* == CUDA_MMQ_TILE_AUTO */
#define MMTUNE_GEMM (-2)
#define MMTUNE_MMV (-3)
#define MMTUNE_MMB (-4) /* the small-batch tensor-core kernel (cuda_mmb.h), 2..64 rows */

/* Token-row buckets: 9-16, 17-32, 33-48, 49-64, 65-128, 129-256, 257-512, > 512. */
#define MMTUNE_BUCKETS 8
/* The key buckets of 2..8 rows, one per row count (MMTUNE_BUCKET_SMALL + n - 2), measured
 * only where mmb is a candidate (mmb against mmv); mmtune_bucket() keeps -1 for them (the
 * fused mmv decode path). One per count because the winner moves with n: mmv reads the
 * weights once for all its rows and wins at 2 rows where mmb wins at 8, so a single 2..8
 * bucket measured at the first call's n (2 rows: a speculative verify, two clients) kept
 * the 8-row batches on mmv (H200, 2026-12-05: 8 sequences 1,218 tok/s against 2,371). */
#define MMTUNE_BUCKET_SMALL MMTUNE_BUCKETS
#define MMTUNE_SMALL_BUCKETS 7
/* The small key bucket of n token rows, -1 unless 2 <= n <= 8. */
int mmtune_bucket_small(int64_t n);
/* Above this many token rows the repeated 8-row kernel is no candidate (it re-reads the
 * weights once per 8 rows: at 32 rows it is 4x an HBM-bound product). */
#define MMTUNE_MMV_MAX_ROWS 32
/* Timed runs per candidate after one warm-up run; the median is kept. */
#define MMTUNE_RUNS 3
/* Candidates at most: every tile, cuBLAS, mmv. */
#define MMTUNE_MAX_CAND 16

/* Bucket of n token rows: 0 .. MMTUNE_BUCKETS - 1, or -1 for n <= 8 (never tuned: the
 * 8-row kernel serves them) and n < 1. */
int mmtune_bucket(int64_t n);
/* Token rows of bucket b: [*lo, *hi] (hi = INT64_MAX for the last; lo = hi = n for the
 * small bucket of n). */
void mmtune_bucket_range(int b, int64_t *lo, int64_t *hi);

/* What the candidate list depends on, besides n. tile_bn[t]: token width of tile t;
 * tile_fits[t]: the tile fits the device for this weight type (occupancy > 0). */
struct mmtune_space {
    int n_tiles;
    const int *tile_bn, *tile_fits;
    bool mmq;             /* the tensor-core kernel handles this type and k */
    int64_t mmq_max_rows; /* mmq only up to this many rows (INT64_MAX: no limit) */
    bool gemm; /* dequant + cuBLAS is a candidate (false: SMELT_MMQ_MAX_ROWS fixed the switch) */
    bool mmv;  /* the repeated 8-row kernel is a candidate (n <= MMTUNE_MMV_MAX_ROWS) */
    bool mmb;  /* the small-batch kernel is a candidate (2 <= n <= 64) */
};

/* The candidates for n token rows, in the order they are timed (ties go to the earlier):
 * mmb (when s->mmb and 2 <= n <= 64), then each fitting tile that is neither mostly padding (token width > 2n and > 16) nor much
 * too narrow (n > 16 x token width: every weight dequantized more than 16 times; this
 * bounds the tuning time of large prefill batches), then cuBLAS, then mmv. Returns how
 * many (<= max), 0 when there is nothing to choose between (one candidate or none: the
 * caller keeps its static choice). For 2..8 rows: mmb and mmv when s->mmb, else none. */
int mmtune_candidates(int64_t n, const struct mmtune_space *s, int *out, int max);

/* Index of the fastest of n times (us; <= 0 or NaN = the candidate failed), the first of
 * equal ones; -1 if all failed. */
int mmtune_fastest(const float *us, int n);

/* Median of n (1 .. 16) values, which it sorts in place. */
float mmtune_median(float *v, int n);

struct mmtune_key {
    uint32_t type;
    int64_t rows, k;
    int bucket;
};

struct mmtune_ent {
    struct mmtune_key key;
    int choice;
    int64_t n;       /* the token rows it was measured at */
    float us;        /* the winner's median time, 0 = not measured (static fallback) */
    float static_us; /* the static choice's time when it was a candidate, else 0 */
    int static_choice;
    /* every candidate timed, in order, and its median us (<= 0: failed) */
    int n_cand;
    int cand[MMTUNE_MAX_CAND];
    float cand_us[MMTUNE_MAX_CAND];
};

/* The table: write-once entries (a choice, once recorded, never changes: graphs captured
 * with it stay valid). Grows to MMTUNE_MAX_ENTRIES; past that, put refuses. */
#define MMTUNE_MAX_ENTRIES 4096
struct mmtune {
    struct mmtune_ent *e;
    int n, cap;
    double tune_ms; /* wall time spent tuning, all keys */
    int n_tuned;    /* entries that were measured (not static fallbacks) */
};

void mmtune_init(struct mmtune *t);
void mmtune_free(struct mmtune *t);
/* The entry of key, or NULL. */
const struct mmtune_ent *mmtune_find(const struct mmtune *t, const struct mmtune_key *key);
/* Records ent unless its key is already there (then the old entry stays and *out is it).
 * SMELT_ERR_NOMEM when the table cannot grow (full or out of memory). */
smelt_status mmtune_put(struct mmtune *t, const struct mmtune_ent *ent,
                        const struct mmtune_ent **out, struct err *e);

/* Environment overrides (read once at backend creation):
 *   SMELT_NO_TUNE=1    no measuring: the static choice everywhere;
 *   SMELT_MMQ_TILE=N   static choices, with tile N (0 .. n_tiles-1) wherever they use the
 *                      tensor-core kernel (a value out of range is reported in *bad and
 *                      ignored);
 *   SMELT_MMQ_MAX_ROWS is the backend's own (it fixes the mmq/cuBLAS switch). */
struct mmtune_env {
    bool tune; /* measure (neither override given) */
    int tile;  /* forced tile, or MMTUNE_MMQ_AUTO */
};
void mmtune_env_parse(const char *no_tune, const char *tile, int n_tiles, struct mmtune_env *env,
                      bool *bad);

/* Names a choice for the log ("mmq 128x64", "mmq 128x128 wgmma", "cuBLAS", "mmv x8");
 * tile_name writes a tile's name ("128x64"). Returns buf. */
typedef void mmtune_tile_name_fn(int tile, char *buf, size_t size);
const char *mmtune_choice_name(int choice, mmtune_tile_name_fn *tile_name, char *buf,
                               size_t size);

/* The table as text, one line per (type, rows, k), buckets in order, e.g.
 *   "Q4_K 4096x4096: 9-16 mmq 128x16 (16.6 us), 33-48 mmq 128x64 (21.0 us), 257-512 cuBLAS (57.8
 * us)" Returns the bytes written (truncated to size - 1, always terminated). */
size_t mmtune_format(const struct mmtune *t, mmtune_tile_name_fn *tile_name, char *buf,
                     size_t size);

#endif
