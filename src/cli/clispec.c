/* Speculative decoding options and the draft model (clispec.h). */
#include "cli/clispec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/clibackend.h"
#include "cli/climem.h"
#include "cli/modelref.h"
#include "format/gguf.h"
#include "model/model.h"
#include "tokenizer/tok.h"

const char cli_spec_usage[] =
    "speculative decoding (docs/speculative.md):\n"
    "  --spec ngram|draft|mtp|off the proposer (default: draft with --draft, else off)\n"
    "  --draft MODEL              a small draft model with the target's vocabulary\n"
    "  --spec-k N                 draft tokens per step at most (1..16, default 4)\n"
    "  --spec-max-batch N         no speculation in steps with more decoding sequences\n"
    "                             (default 8)\n"
    "  --spec-fixed               propose k tokens every step (no adaptive k)\n";

int cli_spec_arg(struct cli_spec *s, const char *cmd, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--spec-fixed")) {
        s->fixed = true;
        return 1;
    }
    bool is_spec = !strcmp(a, "--spec"), is_draft = !strcmp(a, "--draft");
    bool is_k = !strcmp(a, "--spec-k"), is_mb = !strcmp(a, "--spec-max-batch");
    if (!is_spec && !is_draft && !is_k && !is_mb) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "smelt %s: %s needs a value\n", cmd, a);
        return 2;
    }
    const char *v = argv[++*i];
    if (is_spec) s->kind = v;
    if (is_draft) s->draft = v;
    if (is_k || is_mb) {
        char *end;
        long x = strtol(v, &end, 10);
        long hi = is_k ? SPEC_K_MAX : 1 << 20;
        if (!*v || *end || x < 1 || x > hi) {
            fprintf(stderr, "smelt %s: %s takes 1..%ld, got '%s'\n", cmd, a, hi, v);
            return 2;
        }
        if (is_k) s->k = (int)x;
        else s->max_batch = (int)x;
    }
    return 1;
}

smelt_status cli_spec_config(const struct cli_spec *s, struct spec_config *out, struct err *e) {
    memset(out, 0, sizeof *out);
    out->kind = s->draft ? SPEC_DRAFT : SPEC_OFF;
    if (s->kind) {
        smelt_status st = spec_kind_parse(s->kind, &out->kind, e);
        if (st != SMELT_OK) return err_prefix(e, "--spec");
    }
    if (out->kind == SPEC_DRAFT && !s->draft)
        return err_set(e, SMELT_ERR_INVALID, "--spec draft needs a draft model: --draft MODEL");
    if (out->kind != SPEC_DRAFT && s->draft)
        return err_set(e, SMELT_ERR_INVALID, "--draft %s goes with --spec draft, not --spec %s",
                       s->draft, spec_kind_name(out->kind));
    out->k_max = s->k;
    out->max_batch = s->max_batch;
    out->fixed = s->fixed;
    out->draft_cost = -1.0f; /* from the models' sizes */
    return SMELT_OK;
}

/* The text of token id in t, quoted and cut for a message. */
static void token_quote(const struct tok *t, int32_t id, char *buf, size_t n) {
    size_t len = 0;
    const char *p = id >= 0 && id < tok_n_vocab(t) ? tok_token_text(t, id, &len) : NULL;
    if (!p) {
        snprintf(buf, n, "(none)");
        return;
    }
    snprintf(buf, n, "'%.*s'", (int)(len > 40 ? 40 : len), p);
}

smelt_status cli_spec_load(struct cli_spec *s, const char *backend, int device, int threads,
                           const struct tok *target, struct model *target_m,
                           const struct memplan_shape *shape, struct err *e) {
    if (s->kind && !strcmp(s->kind, "mtp") && target_m) {
        smelt_status st = model_mtp_new(target_m, &s->m, e);
        return st == SMELT_OK ? SMELT_OK : err_prefix(e, "--spec mtp");
    }
    if (!s->draft) return SMELT_OK;
    smelt_status st = cli_resolve_model(s->draft, true, s->path, sizeof s->path, e);
    if (st == SMELT_OK) st = gguf_open(&s->f, s->path, e);
    if (st == SMELT_OK) st = tok_new_from_gguf(&s->tok, s->f, NULL, e);
    if (st != SMELT_OK) return err_prefix(e, "draft model %s", s->draft);
    int32_t nt = tok_n_vocab(target), nd = tok_n_vocab(s->tok);
    int32_t d = tok_first_difference(target, s->tok);
    int32_t lo = nt < nd ? nt : nd;
    if (d >= 0 && (d < lo || abs(nt - nd) > CLI_SPEC_VOCAB_SLACK)) {
        char a[64], b[64];
        token_quote(target, d, a, sizeof a);
        token_quote(s->tok, d, b, sizeof b);
        return err_set(e, SMELT_ERR_INVALID,
                       "draft model %s: its vocabulary (%d tokens) is not the target's (%d "
                       "tokens): they differ first at token %d (target %s, draft %s)",
                       s->draft, nd, nt, d, a, b);
    }
    st = cli_backend_new(backend, device, threads, &s->bk, e);
    if (st == SMELT_OK) st = cli_model_load(s->draft, s->f, s->bk, 0, 0, &s->m, e);
    if (st != SMELT_OK) return err_prefix(e, "draft model %s", s->draft);
    if (model_is_recurrent(s->m))
        return err_set(e, SMELT_ERR_UNSUPPORTED,
                       "draft model %s (%s) has recurrent layers: a draft must be attention-only",
                       s->draft, s->m->hp.arch);
    uint64_t fr, tot;
    if (shape && bk_mem_info(s->bk, &fr, &tot)) {
        uint64_t peak = 0;
        st = memplan_measure(s->m, shape, &peak, e);
        if (st != SMELT_OK) return err_prefix(e, "draft model %s", s->draft);
        struct memplan_weights w;
        memplan_weight_bytes(s->bk, s->f, 0, &w);
        s->device_b = w.weights + peak;
    }
    return SMELT_OK;
}

uint64_t cli_spec_kv_bytes(const struct cli_spec *s, uint32_t kv_type) {
    return s->m ? model_kv_block_bytes(s->m, kv_type, 1) : 0;
}

smelt_status cli_spec_kv(struct cli_spec *s, uint32_t kv_type, int32_t block_size,
                         int32_t n_blocks, struct spec_config *cfg, struct err *e) {
    if (!s->m) return SMELT_OK;
    smelt_status st = model_kv_new(s->m, kv_type, block_size, n_blocks, 0, &s->kv, e);
    if (st != SMELT_OK) return err_prefix(e, s->draft ? "draft model %s" : "MTP head%s",
                                          s->draft ? s->draft : "");
    cfg->draft = s->m;
    cfg->draft_kv = s->kv;
    return SMELT_OK;
}

void cli_spec_free(struct cli_spec *s) {
    if (s->m && s->kv) model_kv_free(s->m, s->kv);
    model_free(s->m);
    bk_free(s->bk);
    tok_free(s->tok);
    gguf_close(s->f);
    s->kv = NULL;
    s->m = NULL;
    s->bk = NULL;
    s->tok = NULL;
    s->f = NULL;
}
