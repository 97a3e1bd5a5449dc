/* /metrics in the Prometheus text exposition format (version 0.0.4). Engine figures come
 * from engine_stats (a snapshot under the engine's stats lock); HTTP figures from the
 * server's atomic counters. */
#include <stdio.h>
#include <stdlib.h>

#include "server/server_int.h"

static void header(struct jw *w, const char *name, const char *type, const char *help) {
    jw_printf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(struct jw *w, const char *name, const char *help, double v) {
    header(w, name, "counter", help);
    jw_printf(w, "%s %.17g\n", name, v);
}

static void gauge(struct jw *w, const char *name, const char *help, double v) {
    header(w, name, "gauge", help);
    jw_printf(w, "%s %.17g\n", name, v);
}

static void histogram(struct jw *w, const char *name, const char *help,
                      const struct engine_hist *h) {
    header(w, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < ENGINE_HIST_N; i++) {
        cum += h->bucket[i];
        jw_printf(w, "%s_bucket{le=\"%g\"} %llu\n", name, engine_hist_bounds[i],
                  (unsigned long long)cum);
    }
    cum += h->bucket[ENGINE_HIST_N];
    jw_printf(w, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    jw_printf(w, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

char *metrics_text(struct server *s) {
    struct engine_stats st;
    engine_stats(s->m.en, &st);
    struct jw w = {0};

    header(&w, "smelt_http_requests_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i <= SRV_N_STATUS; i++) {
        unsigned long long n = (unsigned long long)atomic_load(&s->status_count[i]);
        if (i < SRV_N_STATUS) jw_printf(&w, "smelt_http_requests_total{status=\"%d\"} %llu\n",
                                        srv_status_codes[i], n);
        else jw_printf(&w, "smelt_http_requests_total{status=\"other\"} %llu\n", n);
    }
    header(&w, "smelt_request_finish_total", "counter",
           "Finished choices (sequences) by finish reason.");
    static const char *const reasons[] = {"running", "stop", "length", "cancelled", "error"};
    for (int i = 1; i < 5; i++)
        jw_printf(&w, "smelt_request_finish_total{reason=\"%s\"} %llu\n", reasons[i],
                  (unsigned long long)st.requests_finished[i]);
    counter(&w, "smelt_prompt_tokens_total", "Prompt tokens of admitted sequences.",
            (double)st.prompt_tokens);
    counter(&w, "smelt_prompt_cached_tokens_total",
            "Prompt tokens taken from the prefix cache instead of computed.",
            (double)st.cached_tokens);
    counter(&w, "smelt_generation_tokens_total", "Generated tokens.", (double)st.generated_tokens);
    gauge(&w, "smelt_num_requests_running", "Sequences in the running batch.", st.running);
    gauge(&w, "smelt_num_requests_waiting", "Sequences waiting to be admitted.", st.waiting);
    gauge(&w, "smelt_kv_blocks_total", "KV cache blocks in the pool.", st.kv.n_blocks);
    gauge(&w, "smelt_kv_blocks_used", "KV cache blocks referenced by sequences.", st.kv.used);
    gauge(&w, "smelt_kv_blocks_cached",
          "KV cache blocks registered in the prefix cache (in use or idle).", st.kv.cached);
    gauge(&w, "smelt_kv_blocks_free", "KV cache blocks on the free list.", st.kv.free);
    gauge(&w, "smelt_kv_cache_usage_ratio", "Fraction of KV blocks used by sequences.",
          st.kv.n_blocks ? (double)st.kv.used / st.kv.n_blocks : 0.0);
    counter(&w, "smelt_prefix_cache_queries_total", "Full prompt blocks looked up in the prefix cache.",
            (double)st.kv.query_blocks);
    counter(&w, "smelt_prefix_cache_hits_total", "Full prompt blocks found in the prefix cache.",
            (double)st.kv.hit_blocks);
    gauge(&w, "smelt_prefix_cache_hit_rate", "Prefix cache hits / queries since start.",
          st.kv.query_blocks ? (double)st.kv.hit_blocks / (double)st.kv.query_blocks : 0.0);
    counter(&w, "smelt_prefix_cache_evictions_total", "Idle cached blocks evicted for reuse.",
            (double)st.kv.evictions);
    counter(&w, "smelt_preemptions_total", "Sequences preempted (recomputed later) for KV space.",
            (double)st.preemptions);
    counter(&w, "smelt_engine_steps_total", "Forward steps run.", (double)st.steps);
    counter(&w, "smelt_engine_step_rows_total", "Batch rows (tokens) over all steps.",
            (double)st.step_rows);
    counter(&w, "smelt_engine_step_seconds_total", "Time in forward steps and sampling.",
            st.step_seconds);
    histogram(&w, "smelt_time_to_first_token_seconds", "Time from submit to the first token.",
              &st.ttft);
    histogram(&w, "smelt_inter_token_latency_seconds", "Time between tokens of a sequence.",
              &st.itl);
    gauge(&w, "smelt_http_connections", "Open HTTP connections (requests in progress).",
          atomic_load(&s->n_conns));
    gauge(&w, "smelt_http_streams", "Streaming responses in progress.", atomic_load(&s->n_streams));
    if (w.oom) {
        jw_free(&w);
        return NULL;
    }
    return w.p;
}
