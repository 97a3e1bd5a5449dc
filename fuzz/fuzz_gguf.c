/* libFuzzer target for the GGUF reader: parse the input with gguf_open_memory, then walk
 * everything the API hands out (every KV and nested array element, every tensor's bytes,
 * lookups by key and by name) so that any pointer or length the reader failed to check
 * shows up as an ASan report. Valid inputs also go through the writer and back: the
 * re-read file must match.
 *
 *   make fuzz FUZZ_SECONDS=120      (seeds: fuzz/corpus/gguf, dictionary: fuzz/gguf.dict)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"

static volatile uint64_t sink;

static void touch_str(struct gguf_str s) {
    uint64_t h = s.len;
    for (uint64_t i = 0; i < s.len; i++) h = h * 31 + (unsigned char)s.ptr[i];
    sink += h;
}

static void touch_value(const struct gguf_value *v) {
    switch (v->type) {
    case GGUF_T_STRING: touch_str(v->v.s); break;
    case GGUF_T_ARRAY:
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            enum gguf_vtype et = v->v.arr.type;
            if (et == GGUF_T_STRING) touch_str(gguf_arr_str(v, i));
            else if (et == GGUF_T_ARRAY) touch_value(&v->v.arr.items[i]);
            else sink += (uint64_t)gguf_arr_i64(v, i) + (uint64_t)gguf_arr_f64(v, i);
        }
        break;
    default: sink += v->v.u; break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy so reads past the end hit ASan's redzone. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct gguf_file *f;
    struct err e;
    if (gguf_open_memory(&f, buf, size, &e) != SMELT_OK) {
        if (!e.msg[0]) __builtin_trap(); /* every failure carries a message */
        free(buf);
        return 0;
    }
    sink += gguf_version(f) + gguf_alignment(f) + gguf_n_splits(f) + gguf_file_size(f);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        touch_str(kv->key);
        touch_value(&kv->val);
        char key[256];
        if (kv->key.len < sizeof key) {
            gguf_str_copy(kv->key, key, sizeof key);
            if (gguf_get(f, key) != &kv->val) __builtin_trap(); /* index agrees */
            uint64_t u;
            int64_t s;
            float fl;
            bool b;
            struct gguf_str str;
            const struct gguf_value *a;
            gguf_get_u64(f, key, &u, &e);
            gguf_get_i64(f, key, &s, &e);
            gguf_get_f32(f, key, &fl, &e);
            gguf_get_bool(f, key, &b, &e);
            gguf_get_str(f, key, &str, &e);
            gguf_get_arr(f, key, GGUF_T_COUNT, &a, &e);
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        touch_str(t->name);
        const uint8_t *p = t->data;
        /* First and last byte, plus a stride through: in bounds by contract. */
        if (t->nbytes) sink += p[0] + p[t->nbytes - 1] + p[t->nbytes / 2];
        char name[256];
        if (t->name.len < sizeof name) {
            gguf_str_copy(t->name, name, sizeof name);
            if (gguf_find_tensor(f, name) != t) __builtin_trap();
        }
    }
    gguf_get(f, "general.architecture");
    gguf_find_tensor(f, "token_embd.weight");

    /* Re-write through the writer (into memory via a temp file) and re-read. */
    if (size < 4096 && gguf_n_kv(f) < 64) {
        struct gguf_writer *w;
        if (gguf_writer_new(&w, &e) == SMELT_OK) {
            bool ok = true;
            for (int64_t i = 0; i < gguf_n_kv(f) && ok; i++) {
                const struct gguf_kv *kv = gguf_kv_at(f, i);
                char key[256];
                if (kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, kv->key.len)) ok = false;
                else ok = gguf_set_value(w, gguf_str_copy(kv->key, key, sizeof key), &kv->val) ==
                          SMELT_OK;
            }
            for (int64_t i = 0; i < gguf_n_tensors(f) && ok; i++) {
                const struct gguf_tensor *t = gguf_tensor_at(f, i);
                char name[256];
                if (t->name.len >= sizeof name) ok = false;
                else ok = gguf_add_tensor(w, gguf_str_copy(t->name, name, sizeof name), t->type,
                                          t->n_dims, t->ne, t->data) == SMELT_OK;
            }
            char path[64];
            snprintf(path, sizeof path, "/tmp/fuzz_gguf.%d.gguf", (int)getpid());
            if (ok && gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK) {
                struct gguf_file *g;
                if (gguf_open(&g, path, &e) != SMELT_OK) __builtin_trap(); /* we wrote it */
                if (gguf_n_kv(g) != gguf_n_kv(f) || gguf_n_tensors(g) != gguf_n_tensors(f))
                    __builtin_trap();
                for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
                    const struct gguf_tensor *a = gguf_tensor_at(f, i), *b = gguf_tensor_at(g, i);
                    if (a->nbytes != b->nbytes || memcmp(a->data, b->data, a->nbytes))
                        __builtin_trap();
                }
                gguf_close(g);
                unlink(path);
            }
            gguf_writer_free(w);
        }
    }
    gguf_close(f);
    free(buf);
    return 0;
}
