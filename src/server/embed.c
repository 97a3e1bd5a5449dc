/* The body of an OpenAI embeddings response:
 *   {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...] or
 *    "base64"}...], "model": id, "usage": {"prompt_tokens": n, "total_tokens": n}}
 * Each vector is L2-normalized, as OpenAI's are and as llama.cpp's and vLLM's OpenAI routes
 * do: cosine similarity is then a dot product. With dimensions, it is cut to its first
 * `dimensions` values before that (OpenAI's text-embedding-3 and Matryoshka-trained models
 * such as nomic-embed v1.5 and Qwen3-Embedding are meant to be cut so; for other models the
 * quality of a cut vector is the caller's choice). base64 is the float32 values' bytes,
 * little-endian, as the openai SDK decodes them (it asks for base64 by default). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "embed.c writes base64 embeddings from the host's float bytes: little-endian only"
#endif

char *embed_body(const struct gen *g) {
    const struct oai_request *rq = &g->rq;
    const int32_t d = rq->dimensions > 0 ? rq->dimensions : g->n_embd;
    float *v = malloc((size_t)d * sizeof *v);
    struct jw w = {0};
    if (!v) return NULL;
    jw_str(&w, "{\"object\":\"list\",\"data\":[");
    for (int32_t i = 0; i < g->n_reqs; i++) {
        const float *x = g->embd + (size_t)i * (size_t)g->n_embd;
        double ss = 0;
        for (int32_t j = 0; j < d; j++) ss += (double)x[j] * x[j];
        const double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0; /* (a zero vector stays zero) */
        for (int32_t j = 0; j < d; j++) v[j] = (float)(x[j] * inv);
        jw_printf(&w, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        if (rq->base64) {
            jw_base64(&w, v, (size_t)d * sizeof *v);
        } else {
            jw_raw(&w, "[", 1);
            for (int32_t j = 0; j < d; j++) {
                if (j) jw_raw(&w, ",", 1);
                jw_float(&w, v[j]);
            }
            jw_raw(&w, "]", 1);
        }
        jw_raw(&w, "}", 1);
    }
    free(v);
    jw_str(&w, "],\"model\":");
    jw_json_str(&w, g->m->id, strlen(g->m->id));
    jw_printf(&w, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}",
              (long long)g->usage_prompt, (long long)g->usage_prompt);
    if (w.oom) {
        jw_free(&w);
        return NULL;
    }
    return w.p;
}
