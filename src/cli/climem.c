#include "cli/climem.h"

#include <stdio.h>

#include "backend/backend.h"
#include "cli/clibackend.h"
#include "format/gguf.h"
#include "model/model.h"

static double mib(uint64_t b) { return (double)b / (double)MEMPLAN_MIB; }

smelt_status cli_model_load(const char *name, const struct gguf_file *f, struct backend *bk,
                            int32_t n_cpu_moe, int threads, struct model **out, struct err *e) {
    *out = NULL;
    uint64_t fr = 0, tot = 0;
    if (!bk_mem_info(bk, &fr, &tot)) {
        n_cpu_moe = 0; /* a host backend: every expert is in host memory already */
    } else {
        struct memplan_weights w;
        memplan_weight_bytes(bk, f, n_cpu_moe, &w);
        smelt_status st = memplan_weights_fit(name, &w, fr, tot, e);
        if (st != SMELT_OK) return st;
    }
    struct model_place place = {NULL, n_cpu_moe};
    if (n_cpu_moe > 0) {
        smelt_status st = cli_backend_new("cpu", -1, threads, &place.host_bk, e);
        if (st != SMELT_OK) return err_prefix(e, "--n-cpu-moe");
    }
    return model_load_placed(out, f, bk, &place, e);
}

smelt_status cli_mem_plan(struct model *m, const struct cli_mem_req *r, int64_t *tokens,
                          struct err *e) {
    *tokens = 0;
    uint64_t per_token = model_kv_block_bytes(m, r->shape.kv_type, 1) + r->extra_per_token;
    uint64_t state_b = model_state_slot_bytes(m) * (uint64_t)(r->n_slots > 0 ? r->n_slots : 0);
    char state[96] = "";
    if (r->used_b) *r->used_b = 0;
    if (state_b)
        snprintf(state, sizeof state, ", recurrent state %d slots (%.0f MiB)", r->n_slots,
                 mib(state_b));
    uint64_t fr = 0, tot = 0;
    if (!bk_mem_info(m->bk, &fr, &tot)) {
        int64_t t = r->kv_size > 0 ? r->kv_size : r->need > 0 ? r->need : r->cpu_tokens;
        fprintf(stderr, "smelt %s: memory: cpu: KV pool %lld tokens (%.0f MiB)%s\n", r->cmd,
                (long long)t, mib((uint64_t)t * per_token), state);
        *tokens = t;
        return SMELT_OK;
    }
    uint64_t peak = 0;
    struct memplan_weights mw;
    memplan_weight_bytes(m->bk, r->f, m->n_cpu_moe, &mw);
    const uint64_t weights = mw.weights;
    smelt_status st = memplan_measure(m, &r->shape, &peak, e);
    if (st == SMELT_OK && !bk_mem_info(m->bk, &fr, &tot))
        st = err_set(e, SMELT_ERR_DEVICE, "memory plan: the device's free memory is unknown");
    if (st != SMELT_OK) return st;
    if (state_b + MEMPLAN_MARGIN > fr)
        return err_set(e, SMELT_ERR_NOMEM,
                       "the recurrent state of %d sequences needs %.0f MiB, the device has %.0f "
                       "MiB free of %.0f MiB after the weights (%.0f MiB); lower --max-seqs",
                       r->shape.max_seqs, mib(state_b), mib(fr), mib(tot), mib(weights));
    fr -= state_b;
    struct memplan_in in = {
        .free_b = fr, .total_b = tot, .weights_b = weights, .act_b = peak,
        .per_token_b = per_token ? per_token : 1, .util = r->gpu_util > 0 ? r->gpu_util : 0.9,
        .margin_b = MEMPLAN_MARGIN, .kv_size = r->kv_size, .need = r->need,
        .min_tokens = r->min_tokens, .max_tokens = r->max_tokens, .others_b = r->others_b};
    struct memplan_out out;
    st = memplan_kv(&in, &out, e);
    if (st != SMELT_OK) return st;
    fprintf(stderr,
            "smelt %s: memory: weights %.0f MiB, activations %.0f MiB, KV pool %lld tokens "
            "(%.0f MiB)%s; %.0f MiB free of %.0f MiB before the pool\n",
            r->cmd, mib(weights), mib(peak), (long long)out.tokens, mib(out.bytes), state, mib(fr),
            mib(tot));
    *tokens = out.tokens;
    if (r->used_b) *r->used_b = weights + peak + state_b + out.bytes;
    return SMELT_OK;
}
