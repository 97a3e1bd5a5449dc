/* llama.cpp's forward on a list of token ids: an independent implementation to hold
 * smelt's and transformers' against (scripts/check-hybrid-llamacpp.py runs it on the
 * ref-hybrid fixtures). Modes:
 *   prefill IDS OUT.f32   every id in one llama_decode; OUT gets the logits of every row,
 *                         raw little-endian float32 [n_ids, n_vocab];
 *   step IDS OUT.f32      the same, one id per llama_decode (the recurrent layers'
 *                         token-by-token path);
 *   greedy IDS N          prefill, then N greedy tokens (argmax, no special handling of
 *                         end tokens): their ids on one line, then their text (the pieces
 *                         as the vocabulary holds them, special tokens too) on the next.
 * The KV cache is F32 (llama.cpp's default F16 adds its own rounding).
 *
 * Not part of smelt's build: it links a llama.cpp build (a snapshot built elsewhere, never
 * committed), e.g. with L a llama.cpp source tree and B its build folder:
 *   cc -O2 scripts/llamacpp-logits.c -I$L/include -I$L/ggml/include -L$B/bin -lllama \
 *       -Wl,-rpath,$B/bin -o /tmp/llamacpp-logits
 *   /tmp/llamacpp-logits MODEL.gguf prefill 5,17,42 out.f32 [THREADS]
 * Exit status 0 ok, 1 failure, 2 usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static bool no_dots(float progress, void *user) {
    (void)progress;
    (void)user;
    return true;
}

/* Decodes ids[0..cnt) at positions pos0.. with logits for every row; 0 ok. */
static int decode(struct llama_context *ctx, struct llama_batch *b, const llama_token *ids,
                  int cnt, int pos0) {
    b->n_tokens = cnt;
    for (int j = 0; j < cnt; j++) {
        b->token[j] = ids[j];
        b->pos[j] = pos0 + j;
        b->n_seq_id[j] = 1;
        b->seq_id[j][0] = 0;
        b->logits[j] = 1;
    }
    return llama_decode(ctx, *b);
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    const char *mode = argc > 2 ? argv[2] : "";
    const bool step = !strcmp(mode, "step"), greedy = !strcmp(mode, "greedy");
    if (argc < 5 || (!step && !greedy && strcmp(mode, "prefill"))) {
        fprintf(stderr, "usage: %s MODEL.gguf prefill|step ID,ID,... OUT.f32 [THREADS]\n"
                        "       %s MODEL.gguf greedy ID,ID,... N [THREADS]\n",
                argv[0], argv[0]);
        return 2;
    }
    int n = 1;
    for (const char *c = argv[3]; *c; c++) n += *c == ',';
    const int n_gen = greedy ? atoi(argv[4]) : 0;
    llama_token *ids = malloc((size_t)(n + n_gen) * sizeof *ids);
    char *s = argv[3];
    for (int i = 0; i < n; i++) ids[i] = (llama_token)strtol(s, &s, 10), s += *s == ',';

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.progress_callback = no_dots;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "%s: cannot load %s\n", argv[0], argv[1]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + n_gen + 16);
    cp.n_batch = cp.n_ubatch = cp.n_ctx;
    cp.n_seq_max = 1;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.n_threads = cp.n_threads_batch = argc > 5 ? atoi(argv[5]) : 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "%s: cannot make a context\n", argv[0]);
        return 1;
    }
    const int nv = llama_vocab_n_tokens(vocab);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    if (greedy) {
        int st = decode(ctx, &b, ids, n, 0);
        for (int g = 0; st == 0 && g < n_gen; g++) {
            /* the last decoded row's logits */
            ids[n + g] = argmax(llama_get_logits_ith(ctx, -1), nv);
            st = decode(ctx, &b, &ids[n + g], 1, n + g);
        }
        if (st != 0) {
            fprintf(stderr, "%s: llama_decode failed\n", argv[0]);
            return 1;
        }
        for (int g = 0; g < n_gen; g++) printf("%s%d", g ? "," : "", ids[n + g]);
        printf("\n");
        for (int g = 0; g < n_gen; g++) {
            char piece[256];
            int k = llama_token_to_piece(vocab, ids[n + g], piece, sizeof piece, 0, true);
            if (k > 0) fwrite(piece, 1, (size_t)k, stdout);
        }
        printf("\n");
    } else {
        float *out = malloc((size_t)n * (size_t)nv * sizeof *out);
        for (int i0 = 0; i0 < n;) {
            const int cnt = step ? 1 : n;
            if (decode(ctx, &b, &ids[i0], cnt, i0) != 0) {
                fprintf(stderr, "%s: llama_decode failed at token %d\n", argv[0], i0);
                return 1;
            }
            for (int j = 0; j < cnt; j++)
                memcpy(out + (size_t)(i0 + j) * nv, llama_get_logits_ith(ctx, j),
                       (size_t)nv * sizeof *out);
            i0 += cnt;
        }
        FILE *f = fopen(argv[4], "wb");
        if (!f || fwrite(out, sizeof *out, (size_t)n * nv, f) != (size_t)n * nv || fclose(f)) {
            fprintf(stderr, "%s: cannot write %s\n", argv[0], argv[4]);
            return 1;
        }
        free(out);
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(ids);
    return 0;
}
