/* The device memory plan (see memplan.h). */
#include "engine/memplan.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "format/gguf.h"
#include "model/model.h"

static double mib(uint64_t b) { return (double)b / (double)MEMPLAN_MIB; }

/* ---- 1. weights ---- */

void memplan_weight_bytes(struct backend *bk, const struct gguf_file *f, int32_t n_cpu_moe,
                          struct memplan_weights *w) {
    memset(w, 0, sizeof *w);
    w->n_cpu_moe = n_cpu_moe;
    int64_t n = gguf_n_tensors(f);
    uint64_t layer_b = 0; /* the current layer's expert bytes (tensors come layer by layer) */
    int cur = -1;
    for (int64_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        int64_t ne[TENSOR_MAX_DIMS] = {1, 1, 1, 1};
        for (int d = 0; d < TENSOR_MAX_DIMS && d < GGUF_MAX_DIMS; d++) ne[d] = t->ne[d];
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        /* the conv taps (and bert's token types) are held F32 whatever the file's type */
        uint64_t b = bk_weight_bytes(bk, model_tensor_widened(name) ? QT_F32 : t->type, ne);
        if (b == 0) continue; /* a host backend: nothing is copied */
        if (model_expert_on_host(name, INT32_MAX)) { /* an expert tensor */
            int layer = -1;
            sscanf(name, "blk.%d.", &layer);
            if (layer != cur) layer_b = 0, cur = layer;
            layer_b += b;
            if (layer_b > w->expert_layer) w->expert_layer = layer_b;
            if (model_expert_on_host(name, n_cpu_moe)) continue;
        }
        w->weights += b;
        if (t->nbytes > w->transient) w->transient = t->nbytes;
    }
}

smelt_status memplan_weights_fit(const char *model, const struct memplan_weights *w,
                                 uint64_t free_b, uint64_t total_b, struct err *e) {
    const uint64_t need = w->weights + w->transient;
    if (need <= free_b) return SMELT_OK;
    char moe[160] = "";
    if (w->expert_layer > 0) { /* each layer moved to the host frees expert_layer bytes */
        uint64_t more = (need - free_b + w->expert_layer - 1) / w->expert_layer;
        snprintf(moe, sizeof moe, ", or keep the experts of the first %lld layers in host memory "
                 "(--n-cpu-moe %lld: %.0f MiB a layer)", (long long)(w->n_cpu_moe + (int64_t)more),
                 (long long)(w->n_cpu_moe + (int64_t)more), mib(w->expert_layer));
    }
    return err_set(e, SMELT_ERR_NOMEM,
                   "%s does not fit on the device: its weights need %.0f MiB (+ %.0f MiB while "
                   "uploading), the device has %.0f MiB free of %.0f MiB; try a smaller "
                   "quantization, free the device, or another --device%s",
                   model ? model : "the model", mib(w->weights), mib(w->transient), mib(free_b),
                   mib(total_b), moe);
}

/* ---- 2. activations ---- */

/* One warm-up step: n_seqs sequences over n_tokens rows, the first n_seqs - 1 with one row
 * each and the last with the rest; n_out logit rows (each single-row sequence's, then the
 * last rows of the last sequence), all summarized greedily as in serving. Every sequence's
 * block table is `width` entries wide, cycling over the temporary cache's blocks. */
struct warm {
    struct model *m;
    struct kv_store *kv;
    int32_t *tok, *pos, *seq, *table;
    uint8_t *want;
    struct batch_seq *seqs;
    struct topk_row *rows;
    struct topk_summary *sum;
    struct topk_cand *cand;
};

static smelt_status warm_step(struct warm *w, int32_t n_tokens, int32_t n_seqs, int32_t n_out,
                              int32_t width, struct err *e) {
    if (n_seqs > n_tokens) n_seqs = n_tokens;
    if (n_out > n_tokens) n_out = n_tokens;
    if (n_out < n_seqs) n_out = n_seqs;
    int32_t last = n_tokens - (n_seqs - 1); /* rows of the last sequence */
    int32_t extra = n_out - n_seqs;         /* its logit rows beyond its last one */
    for (int32_t i = 0; i < n_tokens; i++) {
        bool single = i < n_seqs - 1;
        int32_t s = single ? i : n_seqs - 1;
        int32_t p = single ? 0 : i - (n_seqs - 1);
        w->tok[i] = (int32_t)((i * 7919u + 13u) % (uint32_t)w->m->hp.n_vocab);
        w->pos[i] = p;
        w->seq[i] = s;
        w->want[i] = single || p >= last - 1 - extra;
    }
    for (int32_t s = 0; s < n_seqs; s++)
        w->seqs[s] = (struct batch_seq){.blocks = w->table, .n_blocks = width, .slot = s};
    memset(w->rows, 0, (size_t)n_out * sizeof *w->rows);
    for (int32_t r = 0; r < n_out; r++) w->rows[r] = (struct topk_row){.k = 1, .inv_t = 1.0f};
    struct batch b = {n_tokens, w->tok, w->pos, w->seq, w->want, n_seqs, w->seqs};
    struct model_sample ms = {.n_rows = n_out, .rows = w->rows, .sum = w->sum, .cand = w->cand};
    return model_step(w->m, w->kv, &b, NULL, &ms, NULL, e);
}

smelt_status memplan_measure(struct model *m, const struct memplan_shape *sh0, uint64_t *peak,
                             struct err *e) {
    *peak = 0;
    struct memplan_shape sh = *sh0;
    if (sh.block_size < 1) sh.block_size = 16;
    if (sh.max_tokens < 1) sh.max_tokens = 1;
    if (sh.max_seqs < 1) sh.max_seqs = 1;
    if (sh.max_seqs > sh.max_tokens) sh.max_seqs = sh.max_tokens;
    if (sh.max_out < 1) sh.max_out = 1;
    if (sh.max_out > sh.max_tokens) sh.max_out = sh.max_tokens;
    if (sh.n_ctx < sh.max_tokens) sh.n_ctx = sh.max_tokens;
    int32_t bs = sh.block_size;
    int32_t kv_blocks = (sh.max_tokens + bs - 1) / bs; /* positions 0 .. max_tokens - 1 */
    int32_t width = (int32_t)(((int64_t)sh.n_ctx + bs - 1) / bs);
    size_t nt = (size_t)sh.max_tokens, no = (size_t)sh.max_out;
    struct warm w = {.m = m};
    w.tok = malloc(nt * sizeof *w.tok);
    w.pos = malloc(nt * sizeof *w.pos);
    w.seq = malloc(nt * sizeof *w.seq);
    w.want = malloc(nt);
    w.table = malloc((size_t)width * sizeof *w.table);
    w.seqs = malloc((size_t)sh.max_seqs * sizeof *w.seqs);
    w.rows = malloc(no * sizeof *w.rows);
    w.sum = malloc(no * sizeof *w.sum);
    w.cand = malloc(no * TOPK_MAX * sizeof *w.cand);
    smelt_status st = SMELT_OK;
    if (!w.tok || !w.pos || !w.seq || !w.want || !w.table || !w.seqs || !w.rows || !w.sum || !w.cand)
        st = err_set(e, SMELT_ERR_NOMEM, "memory plan: out of memory");
    if (st == SMELT_OK) {
        for (int32_t i = 0; i < width; i++) w.table[i] = i % kv_blocks;
        st = model_kv_new(m, sh.kv_type, bs, kv_blocks, sh.max_seqs, &w.kv, e);
    }
    /* the three extremes: a full step over every sequence; one sequence's full chunk (its
     * extra logit rows are prompt-logprob rows); a decode row per sequence */
    int32_t solo_out = sh.max_out - sh.max_seqs + 1;
    if (st == SMELT_OK) st = warm_step(&w, sh.max_tokens, sh.max_seqs, sh.max_out, width, e);
    if (st == SMELT_OK && sh.max_seqs > 1)
        st = warm_step(&w, sh.max_tokens, 1, solo_out > 1 ? solo_out : 1, width, e);
    if (st == SMELT_OK && sh.max_seqs > 1 && sh.max_seqs < sh.max_tokens)
        st = warm_step(&w, sh.max_seqs, sh.max_seqs, sh.max_seqs, width, e);
    if (st != SMELT_OK) err_prefix(e, "memory plan: warm-up step");
    if (w.kv) model_kv_free(m, w.kv);
    if (st == SMELT_OK) {
        *peak = bk_scratch_peak(m->bk);
        st = bk_scratch_reserve(m->bk, (size_t)*peak, e);
    }
    free(w.tok);
    free(w.pos);
    free(w.seq);
    free(w.want);
    free(w.table);
    free(w.seqs);
    free(w.rows);
    free(w.sum);
    free(w.cand);
    return st;
}

/* ---- 3. the KV pool ---- */

smelt_status memplan_kv(const struct memplan_in *in, struct memplan_out *out, struct err *e) {
    memset(out, 0, sizeof *out);
    uint64_t pt = in->per_token_b ? in->per_token_b : 1;
    double keep = (double)in->total_b * (1.0 - in->util) + (double)in->margin_b;
    double explicit_room = (double)in->free_b - (double)in->margin_b;
    double budget = (double)in->free_b + (double)in->others_b - keep;
    if (budget > explicit_room) budget = explicit_room;
    int64_t asked = in->kv_size > 0 ? in->kv_size : in->need;
    int64_t t;
    if (asked > 0) {
        out->budget = explicit_room > 0 ? (uint64_t)explicit_room : 0;
        if ((double)asked * (double)pt > explicit_room)
            return err_set(e, SMELT_ERR_NOMEM,
                           "a KV cache of %lld tokens needs %.0f MiB, the device has %.0f MiB free "
                           "of %.0f MiB (weights %.0f MiB, activations %.0f MiB, %.0f MiB kept "
                           "back); try a smaller %s",
                           (long long)asked, (double)asked * (double)pt / (double)MEMPLAN_MIB,
                           mib(in->free_b), mib(in->total_b), mib(in->weights_b), mib(in->act_b),
                           mib(in->margin_b), in->kv_size > 0 ? "--kv-size" : "context (-c)");
        t = asked;
    } else {
        out->budget = budget > 0 ? (uint64_t)budget : 0;
        t = (int64_t)((double)out->budget / (double)pt);
        if (in->max_tokens > 0 && t > in->max_tokens) t = in->max_tokens;
        int64_t floor_t = in->min_tokens > MEMPLAN_MIN_TOKENS ? in->min_tokens : MEMPLAN_MIN_TOKENS;
        if (t < floor_t)
            return err_set(e, SMELT_ERR_NOMEM,
                           "not enough device memory for a KV cache of %lld tokens (%.0f MiB): "
                           "%.0f MiB free of %.0f MiB after the weights (%.0f MiB) and "
                           "activations (%.0f MiB), %.0f MiB kept back "
                           "(--gpu-memory-utilization %.2f, margin %.0f MiB) leave %.0f MiB; "
                           "raise --gpu-memory-utilization, lower the context (-c) or "
                           "--max-batch-tokens, or use a smaller quantization",
                           (long long)floor_t, (double)floor_t * (double)pt / (double)MEMPLAN_MIB,
                           mib(in->free_b), mib(in->total_b), mib(in->weights_b), mib(in->act_b),
                           keep / (double)MEMPLAN_MIB, in->util, mib(in->margin_b),
                           mib(out->budget));
    }
    if (in->min_tokens > 0 && t < in->min_tokens)
        return err_set(e, SMELT_ERR_RANGE,
                       "a KV cache of %lld tokens cannot hold one full context of %lld tokens; "
                       "raise --kv-size or lower the context (-c)",
                       (long long)t, (long long)in->min_tokens);
    out->tokens = t;
    out->bytes = (uint64_t)t * pt;
    return SMELT_OK;
}
