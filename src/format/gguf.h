/* GGUF reader (v2, v3) and writer.
 *
 * The reader mmaps the file read-only and parses the header, every metadata value and
 * every tensor info up front, validating each count, length, type, dimension, offset and
 * size against the file size with overflow-checked arithmetic. After gguf_open succeeds,
 * every pointer the API hands out is inside the mapping and every tensor's bytes are in
 * bounds: callers need no further checks. Strings point into the mapping and are NOT
 * NUL-terminated (use .len).
 *
 * Split models (NAME-00001-of-0000N.gguf) open as one: gguf_open on the first file finds
 * the others beside it (split.count / split.no keys), metadata comes from the first, and
 * tensors from all of them.
 */
#ifndef SMELT_FORMAT_GGUF_H
#define SMELT_FORMAT_GGUF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "util/err.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32
/* Arrays of arrays nest at most this deep (an array of scalars is depth 1). */
#define GGUF_MAX_ARRAY_DEPTH 8

enum gguf_vtype {
    GGUF_T_UINT8 = 0,
    GGUF_T_INT8 = 1,
    GGUF_T_UINT16 = 2,
    GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4,
    GGUF_T_INT32 = 5,
    GGUF_T_FLOAT32 = 6,
    GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8,
    GGUF_T_ARRAY = 9,
    GGUF_T_UINT64 = 10,
    GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
    GGUF_T_COUNT
};

struct gguf_str {
    const char *ptr; /* into the mapping (or writer-owned memory); not NUL-terminated */
    uint64_t len;
};

struct gguf_value {
    enum gguf_vtype type;
    union {
        uint64_t u; /* UINT8..UINT64 */
        int64_t i;  /* INT8..INT64 */
        double f;   /* FLOAT32, FLOAT64 */
        bool b;
        struct gguf_str s;
        struct {
            enum gguf_vtype type; /* element type */
            uint64_t n;           /* element count */
            const void *raw;      /* scalar elements: packed little-endian in the file */
            struct gguf_value *items; /* string / array elements: n parsed values */
        } arr;
    } v;
};

struct gguf_kv {
    struct gguf_str key;
    struct gguf_value val;
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length (fastest-varying); unused dims = 1 */
    uint32_t type;             /* enum qtype */
    uint64_t offset;           /* from the start of its file's data section */
    uint64_t nbytes;
    const void *data;          /* in the mapping; aligned to the file's alignment */
    uint32_t split;            /* index of the file that holds it */
};

struct gguf_file; /* opaque */

/* Opens and validates a GGUF file (or the first file of a split set). On error, *out is
 * NULL and e names the key/tensor and what is wrong. */
smelt_status gguf_open(struct gguf_file **out, const char *path, struct err *e);
/* Parses a GGUF image already in memory (not copied; must outlive the handle). Used by
 * the fuzz target and tests. Split keys are ignored. */
smelt_status gguf_open_memory(struct gguf_file **out, const void *data, uint64_t size,
                              struct err *e);
void gguf_close(struct gguf_file *f);

uint32_t gguf_version(const struct gguf_file *f);
uint32_t gguf_alignment(const struct gguf_file *f);
uint32_t gguf_n_splits(const struct gguf_file *f);
/* Total bytes of all files of the model. */
uint64_t gguf_file_size(const struct gguf_file *f);
/* Path of split i as opened ("<memory>" for gguf_open_memory), and the offset of its
 * data section (tensor offsets are relative to it). */
const char *gguf_split_path(const struct gguf_file *f, uint32_t split);
uint64_t gguf_data_offset(const struct gguf_file *f, uint32_t split);

/* Metadata. */
int64_t gguf_n_kv(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, int64_t i);
/* The value for key, or NULL when absent. O(1) average (hash index). */
const struct gguf_value *gguf_get(const struct gguf_file *f, const char *key);
/* Index of key for gguf_kv_at, or -1 when absent. */
int64_t gguf_find_kv(const struct gguf_file *f, const char *key);

/* Typed lookups. Absent key: SMELT_ERR_NOT_FOUND. Wrong type or a value that does not
 * fit: SMELT_ERR_FORMAT. Integer getters accept any integer type whose value fits. */
smelt_status gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out,
                          struct err *e);
smelt_status gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out,
                          struct err *e);
smelt_status gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out,
                          struct err *e);
/* FLOAT32/FLOAT64 (and integers) as float. */
smelt_status gguf_get_f32(const struct gguf_file *f, const char *key, float *out,
                          struct err *e);
smelt_status gguf_get_bool(const struct gguf_file *f, const char *key, bool *out,
                           struct err *e);
smelt_status gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out,
                          struct err *e);
/* An ARRAY value for key; element type checked when want != GGUF_T_COUNT. */
smelt_status gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype want,
                          const struct gguf_value **out, struct err *e);

/* Array element access (i < arr.n is the caller's contract). */
int64_t gguf_arr_i64(const struct gguf_value *arr, uint64_t i);  /* integer/bool elements */
double gguf_arr_f64(const struct gguf_value *arr, uint64_t i);   /* float or integer elements */
struct gguf_str gguf_arr_str(const struct gguf_value *arr, uint64_t i); /* STRING elements */

/* Tensors. */
int64_t gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, int64_t i);
/* By name, or NULL when absent. O(1) average (hash index). */
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Helpers. */
const char *gguf_vtype_name(enum gguf_vtype t);
bool gguf_str_eq(struct gguf_str s, const char *z);
/* Copies s into buf as a NUL-terminated string, truncating; returns buf. */
char *gguf_str_copy(struct gguf_str s, char *buf, size_t bufsize);

/* ---- Writer ----
 * Builds metadata and tensor infos in memory, then streams the file: header, KV, tensor
 * infos, padding, then each tensor's bytes in the order added (aligned). */
struct gguf_writer; /* opaque */

smelt_status gguf_writer_new(struct gguf_writer **out, struct err *e);
void gguf_writer_free(struct gguf_writer *w);
/* Values are copied. Setting an existing key replaces it (keeping its position). A
 * failure (bad key, out of memory, bad tensor) is also remembered and returned, with its
 * message, by gguf_writer_write. The file's alignment is general.alignment when set
 * (a power of two, as UINT32), else 32. */
smelt_status gguf_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
smelt_status gguf_set_i32(struct gguf_writer *w, const char *key, int32_t v);
smelt_status gguf_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
smelt_status gguf_set_i64(struct gguf_writer *w, const char *key, int64_t v);
smelt_status gguf_set_f32(struct gguf_writer *w, const char *key, float v);
smelt_status gguf_set_f64(struct gguf_writer *w, const char *key, double v);
smelt_status gguf_set_bool(struct gguf_writer *w, const char *key, bool v);
smelt_status gguf_set_str(struct gguf_writer *w, const char *key, const char *v);
/* Scalar array: n elements of type t, packed little-endian in data. */
smelt_status gguf_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype t,
                          const void *data, uint64_t n);
smelt_status gguf_set_arr_str(struct gguf_writer *w, const char *key, const char *const *v,
                              uint64_t n);
/* Copies one metadata value (any type, nested arrays included) from a reader. */
smelt_status gguf_set_value(struct gguf_writer *w, const char *key, const struct gguf_value *v);
/* Declares a tensor; its bytes are given later to gguf_writer_write in the same order
 * through the callback, or now via data (not copied; must live until write). */
smelt_status gguf_add_tensor(struct gguf_writer *w, const char *name, uint32_t type,
                             uint32_t n_dims, const int64_t *ne, const void *data);
/* Writes the file. When a tensor was added with data == NULL, fill(ctx, index, buf, nbytes)
 * is called to produce its bytes (for quantizing on the fly). */
typedef smelt_status (*gguf_fill_fn)(void *ctx, int64_t index, void *buf, uint64_t nbytes,
                                     struct err *e);
smelt_status gguf_writer_write(struct gguf_writer *w, const char *path, gguf_fill_fn fill,
                               void *ctx, struct err *e);

#endif
