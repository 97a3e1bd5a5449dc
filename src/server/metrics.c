/* /metrics in the Prometheus text exposition format (version 0.0.4). HTTP figures come from
 * the server's atomic counters; engine figures from each model's engine_stats (a snapshot
 * under the engine's stats lock), one series per model with a model="ID" label. A model's
 * counters run from the server's start across its loads and unloads (server/models.h); an
 * unloaded model's gauges read 0, and a model never loaded has no engine series. */
#include <stdio.h>
#include <stdlib.h>

#include "server/server_int.h"

static void header(struct jw *w, const char *name, const char *type, const char *help) {
    jw_printf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The label value of a model id, escaped as the format asks (\\, \", \n). */
static void label(struct jw *w, const char *id) {
    for (const char *p = id; *p; p++) {
        if (*p == '\\' || *p == '"') jw_raw(w, "\\", 1);
        if (*p == '\n') jw_str(w, "\\n");
        else jw_raw(w, p, 1);
    }
}

struct per_model {
    const char *id;
    bool ever;                 /* has engine figures */
    struct engine_stats st;
    struct srv_model_info info;
};

static void histogram(struct jw *w, const struct per_model *pm, int n, const char *name,
                      const char *help, bool ttft) {
    header(w, name, "histogram", help);
    for (int m = 0; m < n; m++) {
        if (!pm[m].ever) continue;
        const struct engine_hist *h = ttft ? &pm[m].st.ttft : &pm[m].st.itl;
        uint64_t cum = 0;
        for (int i = 0; i <= ENGINE_HIST_N; i++) {
            cum += h->bucket[i];
            jw_printf(w, "%s_bucket{model=\"", name);
            label(w, pm[m].id);
            if (i < ENGINE_HIST_N) jw_printf(w, "\",le=\"%g\"} %llu\n", engine_hist_bounds[i], (unsigned long long)cum);
            else jw_printf(w, "\",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
        }
        jw_printf(w, "%s_sum{model=\"", name);
        label(w, pm[m].id);
        jw_printf(w, "\"} %.17g\n%s_count{model=\"", h->sum, name);
        label(w, pm[m].id);
        jw_printf(w, "\"} %llu\n", (unsigned long long)h->count);
    }
}

/* The per-model series, in the order /metrics lists them. */
enum series_of {
    S_PROMPT, S_CACHED, S_GEN, S_RUNNING, S_WAITING, S_KV_TOTAL, S_KV_USED, S_KV_CACHED,
    S_KV_FREE, S_KV_RATIO, S_PC_QUERIES, S_PC_HITS, S_PC_RATE, S_PC_EVICTIONS, S_PREEMPTIONS,
    S_STEPS, S_ROWS, S_STEP_SECONDS, S_GRAMMAR_ROWS, S_GRAMMAR_SECONDS, S_SPEC_STEPS,
    S_SPEC_PROPOSED, S_SPEC_ACCEPTED, S_SPEC_RATIO, S_SPEC_DRAFT_STEPS, S_SPEC_DRAFT_SECONDS,
    S_ENGINE_END, /* (above: engine figures) */
    S_LOADED = S_ENGINE_END, S_LOADS, S_UNLOADS, S_FAILURES, S_N
};

static const struct {
    const char *name, *type, *help;
} series_defs[S_N] = {
    [S_PROMPT] = {"smelt_prompt_tokens_total", "counter", "Prompt tokens of admitted sequences."},
    [S_CACHED] = {"smelt_prompt_cached_tokens_total", "counter",
                  "Prompt tokens taken from the prefix cache instead of computed."},
    [S_GEN] = {"smelt_generation_tokens_total", "counter", "Generated tokens."},
    [S_RUNNING] = {"smelt_num_requests_running", "gauge", "Sequences in the running batch."},
    [S_WAITING] = {"smelt_num_requests_waiting", "gauge", "Sequences waiting to be admitted."},
    [S_KV_TOTAL] = {"smelt_kv_blocks_total", "gauge", "KV cache blocks in the pool."},
    [S_KV_USED] = {"smelt_kv_blocks_used", "gauge", "KV cache blocks referenced by sequences."},
    [S_KV_CACHED] = {"smelt_kv_blocks_cached", "gauge",
                     "KV cache blocks registered in the prefix cache (in use or idle)."},
    [S_KV_FREE] = {"smelt_kv_blocks_free", "gauge", "KV cache blocks on the free list."},
    [S_KV_RATIO] = {"smelt_kv_cache_usage_ratio", "gauge", "Fraction of KV blocks used by sequences."},
    [S_PC_QUERIES] = {"smelt_prefix_cache_queries_total", "counter",
                      "Full prompt blocks looked up in the prefix cache."},
    [S_PC_HITS] = {"smelt_prefix_cache_hits_total", "counter",
                   "Full prompt blocks found in the prefix cache."},
    [S_PC_RATE] = {"smelt_prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries since start."},
    [S_PC_EVICTIONS] = {"smelt_prefix_cache_evictions_total", "counter",
                        "Idle cached blocks evicted for reuse."},
    [S_PREEMPTIONS] = {"smelt_preemptions_total", "counter",
                       "Sequences preempted (recomputed later) for KV space."},
    [S_STEPS] = {"smelt_engine_steps_total", "counter", "Forward steps run."},
    [S_ROWS] = {"smelt_engine_step_rows_total", "counter", "Batch rows (tokens) over all steps."},
    [S_STEP_SECONDS] = {"smelt_engine_step_seconds_total", "counter",
                        "Time in forward steps and sampling."},
    [S_GRAMMAR_ROWS] = {"smelt_grammar_rows_total", "counter",
                        "Rows sampled under a grammar's token mask."},
    [S_GRAMMAR_SECONDS] = {"smelt_grammar_seconds_total", "counter",
                           "Host time writing grammar token masks and accepting tokens in grammars."},
    [S_SPEC_STEPS] = {"smelt_spec_steps_total", "counter",
                      "Sequence-steps that verified speculative draft tokens."},
    [S_SPEC_PROPOSED] = {"smelt_spec_proposed_tokens_total", "counter",
                         "Speculative draft tokens proposed."},
    [S_SPEC_ACCEPTED] = {"smelt_spec_accepted_tokens_total", "counter",
                         "Speculative draft tokens accepted."},
    [S_SPEC_RATIO] = {"smelt_spec_acceptance_ratio", "gauge",
                      "Accepted / proposed draft tokens since start."},
    [S_SPEC_DRAFT_STEPS] = {"smelt_spec_draft_steps_total", "counter",
                            "Forward steps of the draft model."},
    [S_SPEC_DRAFT_SECONDS] = {"smelt_spec_draft_seconds_total", "counter",
                              "Time in draft-model steps (inside the step time)."},
    [S_LOADED] = {"smelt_model_loaded", "gauge", "1 while the model is loaded."},
    [S_LOADS] = {"smelt_model_loads_total", "counter", "Loads of the model that succeeded."},
    [S_UNLOADS] = {"smelt_model_unloads_total", "counter",
                   "Unloads of the model (to make room for another)."},
    [S_FAILURES] = {"smelt_model_load_failures_total", "counter", "Loads of the model that failed."},
};

static double value(const struct per_model *p, enum series_of k) {
    const struct engine_stats *st = &p->st;
    switch (k) {
    case S_PROMPT: return (double)st->prompt_tokens;
    case S_CACHED: return (double)st->cached_tokens;
    case S_GEN: return (double)st->generated_tokens;
    case S_RUNNING: return st->running;
    case S_WAITING: return st->waiting;
    case S_KV_TOTAL: return st->kv.n_blocks;
    case S_KV_USED: return st->kv.used;
    case S_KV_CACHED: return st->kv.cached;
    case S_KV_FREE: return st->kv.free;
    case S_KV_RATIO: return st->kv.n_blocks ? (double)st->kv.used / st->kv.n_blocks : 0.0;
    case S_PC_QUERIES: return (double)st->kv.query_blocks;
    case S_PC_HITS: return (double)st->kv.hit_blocks;
    case S_PC_RATE:
        return st->kv.query_blocks ? (double)st->kv.hit_blocks / (double)st->kv.query_blocks : 0.0;
    case S_PC_EVICTIONS: return (double)st->kv.evictions;
    case S_PREEMPTIONS: return (double)st->preemptions;
    case S_STEPS: return (double)st->steps;
    case S_ROWS: return (double)st->step_rows;
    case S_STEP_SECONDS: return st->step_seconds;
    case S_GRAMMAR_ROWS: return (double)st->grammar_rows;
    case S_GRAMMAR_SECONDS: return st->grammar_seconds;
    case S_SPEC_STEPS: return (double)st->spec_steps;
    case S_SPEC_PROPOSED: return (double)st->spec_proposed;
    case S_SPEC_ACCEPTED: return (double)st->spec_accepted;
    case S_SPEC_RATIO:
        return st->spec_proposed ? (double)st->spec_accepted / (double)st->spec_proposed : 0.0;
    case S_SPEC_DRAFT_STEPS: return (double)st->spec_draft_steps;
    case S_SPEC_DRAFT_SECONDS: return st->spec_draft_seconds;
    case S_LOADED: return p->info.state == SRV_LOADED;
    case S_LOADS: return (double)p->info.loads;
    case S_UNLOADS: return (double)p->info.unloads;
    case S_FAILURES: return (double)p->info.failures;
    default: return 0;
    }
}

/* Series k, one line per model: name{model="id"} v (engine figures: the models that have
 * them). */
static void series(struct jw *w, const struct per_model *pm, int n, enum series_of k) {
    header(w, series_defs[k].name, series_defs[k].type, series_defs[k].help);
    for (int i = 0; i < n; i++) {
        if (k < S_ENGINE_END && !pm[i].ever) continue;
        jw_printf(w, "%s{model=\"", series_defs[k].name);
        label(w, pm[i].id);
        jw_printf(w, "\"} %.17g\n", value(&pm[i], k));
    }
}

char *metrics_text(struct server *s) {
    int n = srv_models_count(s->models);
    struct per_model *pm = calloc((size_t)n, sizeof *pm);
    if (!pm) return NULL;
    for (int i = 0; i < n; i++) {
        struct srv_model *sm = srv_models_at(s->models, i);
        pm[i].id = srv_model_def(sm)->id;
        pm[i].ever = srv_model_stats(s->models, sm, &pm[i].st);
        srv_model_info(s->models, sm, &pm[i].info);
    }
    struct jw w = {0};

    header(&w, "smelt_http_requests_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i <= SRV_N_STATUS; i++) {
        unsigned long long c = (unsigned long long)atomic_load(&s->status_count[i]);
        if (i < SRV_N_STATUS) jw_printf(&w, "smelt_http_requests_total{status=\"%d\"} %llu\n",
                                        srv_status_codes[i], c);
        else jw_printf(&w, "smelt_http_requests_total{status=\"other\"} %llu\n", c);
    }
    header(&w, "smelt_request_finish_total", "counter",
           "Finished choices (sequences) by finish reason.");
    static const char *const reasons[] = {"running", "stop", "length", "cancelled", "error"};
    for (int m = 0; m < n; m++) {
        if (!pm[m].ever) continue;
        for (int i = 1; i < 5; i++) {
            jw_str(&w, "smelt_request_finish_total{model=\"");
            label(&w, pm[m].id);
            jw_printf(&w, "\",reason=\"%s\"} %llu\n", reasons[i],
                      (unsigned long long)pm[m].st.requests_finished[i]);
        }
    }
    for (int k = 0; k < S_ENGINE_END; k++) series(&w, pm, n, (enum series_of)k);
    histogram(&w, pm, n, "smelt_time_to_first_token_seconds", "Time from submit to the first token.",
              true);
    histogram(&w, pm, n, "smelt_inter_token_latency_seconds", "Time between tokens of a sequence.",
              false);
    for (int k = S_ENGINE_END; k < S_N; k++) series(&w, pm, n, (enum series_of)k);
    header(&w, "smelt_http_connections", "gauge", "Open HTTP connections (requests in progress).");
    jw_printf(&w, "smelt_http_connections %d\n", atomic_load(&s->n_conns));
    header(&w, "smelt_http_streams", "gauge", "Streaming responses in progress.");
    jw_printf(&w, "smelt_http_streams %d\n", atomic_load(&s->n_streams));
    free(pm);
    if (w.oom) {
        jw_free(&w);
        return NULL;
    }
    return w.p;
}
