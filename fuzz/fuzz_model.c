/* libFuzzer target for model loading and one step: a GGUF image goes through
 * gguf_open_memory and model_load on the CPU backend (every architecture's metadata and
 * tensor checks: shapes against hyper-parameters, qwen35's layer pattern, ssm_* keys,
 * RoPE sections, the MTP layer); a model that loads gets a small memory (2 KV blocks of
 * 16, 2 state slots when it has recurrent layers) and runs one 3-token step with a
 * snapshot, so a shape the loader let through that an op cannot take shows up as a crash
 * or an ASan report (an embedding model's step returns every row's hidden state instead of
 * logits: model_step_hidden). A failed load must carry a message.
 *
 *   make fuzz FUZZ_SECONDS=120      (seeds: fuzz/corpus/model, made by
 *                                    scripts/make-fuzz-model-seeds.py)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "format/gguf.h"
#include "model/model.h"

static struct backend *bk;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct err e;
    if (!bk && cpu_backend_new(&bk, 1, &e) != SMELT_OK) return 0;
    uint8_t *buf = malloc(size ? size : 1); /* a private copy: reads past it hit a redzone */
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct gguf_file *f = NULL;
    struct model *m = NULL;
    if (gguf_open_memory(&f, buf, size, &e) != SMELT_OK) {
        free(buf);
        return 0;
    }
    if (model_load(&m, f, bk, &e) != SMELT_OK) {
        if (!e.msg[0]) __builtin_trap(); /* every failure carries a message */
    } else {
        struct kv_store *kv = NULL;
        int32_t slots = model_is_recurrent(m) ? 2 : 0;
        if (model_kv_new(m, QT_F32, 16, 2, slots, &kv, &e) == SMELT_OK) {
            int32_t tok[3] = {0, 1 % m->hp.n_vocab, 2 % m->hp.n_vocab}, pos[3] = {0, 1, 2};
            int32_t seq[3] = {0, 0, 0}, blocks[1] = {0};
            struct batch_seq v = {.blocks = blocks, .n_blocks = 1, .slot = 0,
                                  .snap_slot = 1, .snap_pos = slots ? 2 : 0};
            uint8_t all[3] = {1, 1, 1};
            struct batch b = {3, tok, pos, seq, NULL, 1, &v};
            if (m->hp.pooling != POOL_NONE) {
                b.logits = all;
                float *hidden = malloc(3 * (size_t)m->hp.n_embd * sizeof(float));
                if (hidden && model_step_hidden(m, kv, &b, hidden, NULL, &e) != SMELT_OK &&
                    !e.msg[0])
                    __builtin_trap();
                free(hidden);
            } else {
                float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
                if (logits && model_forward(m, kv, &b, logits, NULL, &e) != SMELT_OK && !e.msg[0])
                    __builtin_trap();
                free(logits);
            }
            model_kv_free(m, kv);
        }
        model_free(m);
    }
    gguf_close(f);
    free(buf);
    return 0;
}
