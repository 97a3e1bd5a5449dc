/* The server's models: names, states, references, the loader thread and the choice of what
 * to unload (models.h). Everything below is under r->mu except the loader's calls into
 * load and unload, which run with the entry marked LOADING or UNLOADING so that nobody
 * else touches it meanwhile. */
#include "server/models.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tok.h"
#include "util/clock.h"
#include "util/log.h"

struct srv_model {
    struct server_model_def def;
    enum srv_model_state state;
    struct server_model m;        /* while LOADED: the names from def, the rest from load */
    void *handle;
    int refs;                     /* requests holding it */
    uint64_t last_used;           /* r->clock at its last acquire (LRU) */
    double idle_since;            /* clock_now() when the last request let it go (ttl) */
    bool unload_wanted;           /* srv_model_unload: unload once idle */
    uint64_t attempt;             /* load attempts started */
    uint64_t failed;              /* the attempt that failed last (0: none since a success) */
    char error[ERR_MSG_MAX];
    struct srv_model_wait *waiters;
    bool queued;                  /* on the loader's queue */
    uint64_t loads, unloads, failures;
    struct engine_stats base;     /* counters of its earlier loads (unloaded engines) */
    bool ever;                    /* loaded at least once */
    int index;
};

struct srv_models {
    struct srv_model *v;
    int n;
    struct server_loader ld;
    bool has_ld;
    int max_loaded;
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* the loader: a job, an idle model, a waiter gone, stop */
    pthread_t th;
    bool started, stop, draining;
    int *queue, q_head, q_len;    /* ring of entry indices to load */
    uint64_t clock;
};

const char *srv_model_state_str(enum srv_model_state s) {
    static const char *const names[] = {"unloaded", "loading", "loaded", "unloading"};
    return s <= SRV_UNLOADING ? names[s] : "?";
}

/* ---- engine counters across loads ---- */

static void hist_add(struct engine_hist *a, const struct engine_hist *b) {
    for (int i = 0; i <= ENGINE_HIST_N; i++) a->bucket[i] += b->bucket[i];
    a->count += b->count;
    a->sum += b->sum;
}

/* a += b's counters (the state fields of b are left out). */
static void stats_add(struct engine_stats *a, const struct engine_stats *b) {
    for (int i = 0; i < 5; i++) a->requests_finished[i] += b->requests_finished[i];
    a->prompt_tokens += b->prompt_tokens;
    a->cached_tokens += b->cached_tokens;
    a->generated_tokens += b->generated_tokens;
    a->steps += b->steps;
    a->step_rows += b->step_rows;
    a->preemptions += b->preemptions;
    a->parallel_sample_steps += b->parallel_sample_steps;
    a->sample_full_rows += b->sample_full_rows;
    a->step_seconds += b->step_seconds;
    a->grammar_rows += b->grammar_rows;
    a->grammar_seconds += b->grammar_seconds;
    a->spec_steps += b->spec_steps;
    a->spec_proposed += b->spec_proposed;
    a->spec_accepted += b->spec_accepted;
    a->spec_draft_steps += b->spec_draft_steps;
    a->spec_draft_seconds += b->spec_draft_seconds;
    a->kv.query_blocks += b->kv.query_blocks;
    a->kv.hit_blocks += b->kv.hit_blocks;
    a->kv.evictions += b->kv.evictions;
    hist_add(&a->ttft, &b->ttft);
    hist_add(&a->itl, &b->itl);
}

/* The longest token piece in bytes (gen_tokenize's prompt-length precheck). */
static int32_t longest_piece(const struct tok *t) {
    int32_t best = 1, nv = t ? tok_n_vocab(t) : 0;
    for (int32_t i = 0; i < nv; i++) {
        size_t n;
        tok_piece(t, i, &n);
        if ((int32_t)n > best) best = (int32_t)n;
    }
    return best;
}

/* sm->m = m, with the names from sm's definition. */
static void set_loaded(struct srv_model *sm, const struct server_model *m) {
    sm->m = *m;
    sm->m.id = sm->def.id;
    sm->m.aliases = sm->def.aliases;
    sm->m.n_aliases = sm->def.n_aliases;
    sm->m.hidden_alias = sm->def.hidden_alias;
    sm->m.max_piece = longest_piece(m->tok);
}

/* ---- waiters ---- */

static void wait_add(struct srv_model *sm, struct srv_model_wait *w) {
    w->on = sm;
    w->prev = NULL;
    w->next = sm->waiters;
    if (sm->waiters) sm->waiters->prev = w;
    sm->waiters = w;
}

static void wait_remove(struct srv_model_wait *w) {
    struct srv_model *sm = w->on;
    if (w->prev) w->prev->next = w->next;
    else sm->waiters = w->next;
    if (w->next) w->next->prev = w->prev;
    w->prev = w->next = NULL;
    w->on = NULL;
}

/* Wakes (and takes off the list) every waiter of sm. */
static void wake_waiters(struct srv_model *sm) {
    while (sm->waiters) {
        struct srv_model_wait *w = sm->waiters;
        wait_remove(w);
        w->wake(w->ctx);
    }
}

/* ---- the loader ---- */

static void enqueue(struct srv_models *r, struct srv_model *sm) {
    if (sm->queued) return;
    sm->queued = true;
    r->queue[(r->q_head + r->q_len) % r->n] = sm->index;
    r->q_len++;
    pthread_cond_broadcast(&r->cv);
}

/* Starts a load of sm (it is UNLOADED): a new attempt, on the loader's queue. */
static void start_load(struct srv_models *r, struct srv_model *sm) {
    sm->state = SRV_LOADING;
    sm->attempt++;
    enqueue(r, sm);
}

/* The least recently used loaded model other than not that no request holds and that is not
 * pinned; device >= -1: on that device only. NULL when none. */
static struct srv_model *victim(struct srv_models *r, const struct srv_model *not, int device,
                                bool any_device) {
    struct srv_model *best = NULL;
    for (int i = 0; i < r->n; i++) {
        struct srv_model *x = &r->v[i];
        if (x == not || x->state != SRV_LOADED || x->refs > 0 || x->def.pinned) continue;
        if (!any_device && x->def.device != device) continue;
        if (!best || x->last_used < best->last_used) best = x;
    }
    return best;
}

/* Unloads x (LOADED, idle), dropping the lock meanwhile. Its counters go to its base. */
static void unload(struct srv_models *r, struct srv_model *x, const char *why) {
    struct engine_stats st;
    if (x->m.en) {
        engine_stats(x->m.en, &st);
        stats_add(&x->base, &st);
    }
    x->state = SRV_UNLOADING;
    void *h = x->handle;
    x->handle = NULL;
    log_info("model %s: unloading (%s)", x->def.id, why);
    pthread_mutex_unlock(&r->mu);
    if (r->has_ld) r->ld.unload(r->ld.ctx, x->index, h);
    pthread_mutex_lock(&r->mu);
    memset(&x->m, 0, sizeof x->m);
    x->state = SRV_UNLOADED;
    x->unload_wanted = false;
    x->unloads++;
    if (x->waiters && !r->draining) start_load(r, x); /* requests came in meanwhile */
}

static int n_resident(const struct srv_models *r, const struct srv_model *not) {
    int n = 0;
    for (int i = 0; i < r->n; i++)
        if (&r->v[i] != not && r->v[i].state != SRV_UNLOADED) n++;
    return n;
}

/* Loads sm (LOADING), under the lock: room first (max_loaded), then the load itself,
 * unloading idle models of its device while it runs out of memory. Returns false when the
 * load was given up (no request waits for it any more, or the server is stopping). */
static smelt_status load_one(struct srv_models *r, struct srv_model *sm, bool at_start,
                             struct err *e) {
    while (r->max_loaded > 0 && n_resident(r, sm) >= r->max_loaded) {
        struct srv_model *x = victim(r, sm, 0, true);
        if (x) {
            unload(r, x, "--max-loaded-models: room for another");
            continue;
        }
        if (at_start)
            return err_set(e, SMELT_ERR_INVALID, "%d models are loaded at start, more than "
                           "--max-loaded-models %d", n_resident(r, sm) + 1, r->max_loaded);
        if (!sm->waiters || r->stop || r->draining)
            return err_set(e, SMELT_ERR_CANCELLED, "no request waits for it any more");
        /* every loaded model is busy or pinned: wait for one to become idle */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 1;
        pthread_cond_timedwait(&r->cv, &r->mu, &dl);
    }
    for (;;) {
        struct server_model m = {0};
        void *h = NULL;
        pthread_mutex_unlock(&r->mu);
        log_info("model %s: loading", sm->def.id);
        smelt_status st = r->ld.load(r->ld.ctx, sm->index, &m, &h, e);
        pthread_mutex_lock(&r->mu);
        if (st == SMELT_OK) {
            set_loaded(sm, &m);
            sm->handle = h;
            return SMELT_OK;
        }
        struct srv_model *x = st == SMELT_ERR_NOMEM ? victim(r, sm, sm->def.device, false) : NULL;
        if (!x) return st;
        unload(r, x, "out of memory for another");
    }
}

/* Marks the outcome of sm's load and wakes its waiters. */
static void load_done(struct srv_models *r, struct srv_model *sm, smelt_status st,
                      const struct err *e) {
    if (st == SMELT_OK) {
        sm->state = SRV_LOADED;
        sm->failed = 0;
        sm->error[0] = 0;
        sm->loads++;
        sm->ever = true;
        sm->last_used = ++r->clock;
        sm->idle_since = clock_now();
        if (r->draining && sm->m.en) engine_drain(sm->m.en);
        log_info("model %s: loaded", sm->def.id);
    } else {
        sm->state = SRV_UNLOADED;
        if (st != SMELT_ERR_CANCELLED) {
            sm->failed = sm->attempt;
            sm->failures++;
            snprintf(sm->error, sizeof sm->error, "%s", e->msg);
            log_error("model %s: the load failed: %s", sm->def.id, e->msg);
        }
    }
    wake_waiters(sm);
}

/* Unloads every idle model whose unload was asked for or whose ttl ran out. Returns the
 * seconds until the next ttl runs out (-1: none). */
static double unload_idle(struct srv_models *r) {
    for (;;) {
        double now = clock_now(), next = -1;
        struct srv_model *x = NULL;
        for (int i = 0; i < r->n && !x; i++) {
            struct srv_model *sm = &r->v[i];
            if (sm->state != SRV_LOADED || sm->refs > 0 || sm->def.pinned) continue;
            double left = sm->def.ttl_s > 0 ? sm->idle_since + sm->def.ttl_s - now : -1;
            if (sm->unload_wanted || (sm->def.ttl_s > 0 && left <= 0)) x = sm;
            else if (left > 0 && (next < 0 || left < next)) next = left;
        }
        if (!x) return next;
        unload(r, x, x->unload_wanted ? "asked for" : "idle for its ttl");
    }
}

static void *loader(void *arg) {
    struct srv_models *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        if (r->q_len == 0) {
            double next = r->draining ? -1 : unload_idle(r);
            if (r->q_len > 0 || r->stop) continue; /* (unload dropped the lock) */
            if (next < 0) {
                pthread_cond_wait(&r->cv, &r->mu);
            } else {
                struct timespec dl;
                clock_gettime(CLOCK_REALTIME, &dl);
                double t = (double)dl.tv_sec + dl.tv_nsec * 1e-9 + next + 1e-3;
                dl.tv_sec = (time_t)t;
                dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
                pthread_cond_timedwait(&r->cv, &r->mu, &dl);
            }
            continue;
        }
        struct srv_model *sm = &r->v[r->queue[r->q_head]];
        r->q_head = (r->q_head + 1) % r->n;
        r->q_len--;
        sm->queued = false;
        struct err e;
        err_clear(&e);
        smelt_status st = r->draining ? err_set(&e, SMELT_ERR_CANCELLED, "shutting down")
                                      : load_one(r, sm, false, &e);
        load_done(r, sm, st, &e);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- the registry ---- */

smelt_status srv_models_new(struct srv_models **out, const struct server_model_def *defs, int n,
                            const struct server_loader *ld, int max_loaded, struct err *e) {
    *out = NULL;
    if (n < 1) return err_set(e, SMELT_ERR_INVALID, "no model to serve");
    struct srv_models *r = calloc(1, sizeof *r);
    if (r) r->v = calloc((size_t)n, sizeof *r->v);
    if (r) r->queue = calloc((size_t)n, sizeof *r->queue);
    if (!r || !r->v || !r->queue) {
        if (r) free(r->v);
        free(r);
        return err_set(e, SMELT_ERR_NOMEM, "server: out of memory");
    }
    r->n = n;
    r->max_loaded = max_loaded > 0 ? max_loaded : 0;
    if (ld) r->ld = *ld, r->has_ld = true;
    for (int i = 0; i < n; i++) {
        r->v[i].def = defs[i];
        r->v[i].index = i;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (r->has_ld) {
        r->started = pthread_create(&r->th, NULL, loader, r) == 0;
        if (!r->started) {
            srv_models_free(r);
            return err_set(e, SMELT_ERR_INTERNAL, "server: cannot start the model loader thread");
        }
    }
    *out = r;
    return SMELT_OK;
}

void srv_models_put(struct srv_models *r, int i, const struct server_model *m) {
    pthread_mutex_lock(&r->mu);
    struct srv_model *sm = &r->v[i];
    set_loaded(sm, m);
    sm->def.pinned = true; /* nobody could load it again */
    sm->state = SRV_LOADED;
    sm->loads = 1;
    sm->ever = true;
    sm->last_used = ++r->clock;
    sm->idle_since = clock_now();
    pthread_mutex_unlock(&r->mu);
}

smelt_status srv_models_preload(struct srv_models *r, struct err *e) {
    smelt_status st = SMELT_OK;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n && st == SMELT_OK; i++) {
        struct srv_model *sm = &r->v[i];
        if (!(sm->def.preload || sm->def.pinned) || sm->state != SRV_UNLOADED || !r->has_ld)
            continue;
        sm->state = SRV_LOADING;
        sm->attempt++;
        st = load_one(r, sm, true, e);
        if (st != SMELT_OK) err_prefix(e, "model %s", sm->def.id);
        if (st != SMELT_OK) sm->state = SRV_UNLOADED;
        else load_done(r, sm, st, e);
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

void srv_models_free(struct srv_models *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    r->draining = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->started) pthread_join(r->th, NULL);
    for (int i = 0; i < r->n; i++) {
        struct srv_model *sm = &r->v[i];
        if (sm->state == SRV_LOADED && r->has_ld) r->ld.unload(r->ld.ctx, i, sm->handle);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->queue);
    free(r->v);
    free(r);
}

int srv_models_count(const struct srv_models *r) { return r->n; }
struct srv_model *srv_models_at(struct srv_models *r, int i) { return &r->v[i]; }
const struct server_model_def *srv_model_def(const struct srv_model *sm) { return &sm->def; }

struct srv_model *srv_models_find(struct srv_models *r, const char *name) {
    if (!name) return &r->v[0];
    for (int i = 0; i < r->n; i++) { /* ids and listed aliases first, then hidden ones */
        const struct server_model_def *d = &r->v[i].def;
        if (!strcmp(name, d->id)) return &r->v[i];
        for (int k = 0; k < d->n_aliases; k++)
            if (!strcmp(name, d->aliases[k])) return &r->v[i];
    }
    for (int i = 0; i < r->n; i++)
        if (r->v[i].def.hidden_alias && !strcmp(name, r->v[i].def.hidden_alias)) return &r->v[i];
    return NULL;
}

enum srv_acquire srv_model_acquire(struct srv_models *r, struct srv_model *sm,
                                   struct srv_model_wait *w, const struct server_model **m,
                                   char *err, size_t n) {
    pthread_mutex_lock(&r->mu);
    enum srv_acquire a;
    if (sm->state == SRV_LOADED) {
        sm->refs++;
        sm->last_used = ++r->clock;
        *m = &sm->m;
        a = SRV_READY;
    } else if (sm->state == SRV_UNLOADED && w->attempt && sm->failed >= w->attempt) {
        snprintf(err, n, "%s", sm->error);
        w->attempt = 0;
        a = SRV_FAILED;
    } else if (!r->has_ld || r->draining) {
        snprintf(err, n, "%s", r->draining ? "the server is shutting down" : "not loaded");
        a = SRV_FAILED;
    } else {
        if (sm->state == SRV_UNLOADED) start_load(r, sm);
        /* the attempt that will serve it: the one under way, or the next after an unload */
        w->attempt = sm->state == SRV_UNLOADING ? sm->attempt + 1 : sm->attempt;
        wait_add(sm, w);
        w->park(w->ctx);
        a = SRV_WAIT;
    }
    pthread_mutex_unlock(&r->mu);
    return a;
}

/* Drops a reference; used: a request's (the idle time of the ttl starts again). */
static void release(struct srv_models *r, struct srv_model *sm, bool used) {
    pthread_mutex_lock(&r->mu);
    if (used) sm->idle_since = clock_now();
    /* a load may wait for an idle model; an unload may wait for this one */
    if (--sm->refs == 0) pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void srv_model_release(struct srv_models *r, struct srv_model *sm) { release(r, sm, true); }

enum srv_unload srv_model_unload(struct srv_models *r, struct srv_model *sm) {
    pthread_mutex_lock(&r->mu);
    enum srv_unload u = sm->def.pinned              ? SRV_UNLOAD_PINNED
                        : sm->state == SRV_LOADING  ? SRV_UNLOAD_LOADING
                        : sm->state != SRV_LOADED   ? SRV_UNLOAD_NOT_LOADED
                        : !r->has_ld                ? SRV_UNLOAD_PINNED
                                                    : SRV_UNLOAD_QUEUED;
    if (u == SRV_UNLOAD_QUEUED) {
        sm->unload_wanted = true;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return u;
}

bool srv_model_unwait(struct srv_models *r, struct srv_model_wait *w) {
    pthread_mutex_lock(&r->mu);
    bool was = w->on != NULL;
    if (was) {
        wait_remove(w);
        pthread_cond_broadcast(&r->cv); /* a load waiting for room may give up */
    }
    pthread_mutex_unlock(&r->mu);
    return was;
}

void srv_models_wake_all(struct srv_models *r) {
    pthread_mutex_lock(&r->mu);
    r->draining = true;
    for (int i = 0; i < r->n; i++) wake_waiters(&r->v[i]);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void srv_model_info(struct srv_models *r, struct srv_model *sm, struct srv_model_info *out) {
    pthread_mutex_lock(&r->mu);
    out->state = sm->state;
    out->n_ctx = sm->state == SRV_LOADED ? sm->m.n_ctx : sm->def.n_ctx;
    out->created = sm->state == SRV_LOADED ? sm->m.created : 0;
    out->loads = sm->loads;
    out->unloads = sm->unloads;
    out->failures = sm->failures;
    snprintf(out->error, sizeof out->error, "%s", sm->failed ? sm->error : "");
    pthread_mutex_unlock(&r->mu);
}

bool srv_model_stats(struct srv_models *r, struct srv_model *sm, struct engine_stats *out) {
    pthread_mutex_lock(&r->mu);
    bool loaded = sm->state == SRV_LOADED && sm->m.en, ever = sm->ever;
    if (loaded) sm->refs++; /* (engine_stats takes the engine's own lock) */
    struct engine_stats base = sm->base;
    pthread_mutex_unlock(&r->mu);
    memset(out, 0, sizeof *out);
    if (loaded) {
        engine_stats(sm->m.en, out);
        release(r, sm, false); /* (a scrape is not a use: the ttl runs on) */
    }
    stats_add(out, &base);
    return ever;
}

/* Runs f on every loaded model's engine, under the lock (each call is quick). */
static int32_t each_engine(struct srv_models *r, int op) {
    int32_t sum = 0;
    pthread_mutex_lock(&r->mu);
    if (op == 0) r->draining = true;
    for (int i = 0; i < r->n; i++) {
        struct srv_model *sm = &r->v[i];
        if (sm->state != SRV_LOADED || !sm->m.en) continue;
        if (op == 0) engine_drain(sm->m.en);
        else if (op == 1) sum += engine_in_flight(sm->m.en);
        else engine_cancel_all(sm->m.en);
    }
    pthread_mutex_unlock(&r->mu);
    return sum;
}

void srv_models_drain(struct srv_models *r) { each_engine(r, 0); }
int32_t srv_models_in_flight(struct srv_models *r) { return each_engine(r, 1); }
void srv_models_cancel_all(struct srv_models *r) { each_engine(r, 2); }
