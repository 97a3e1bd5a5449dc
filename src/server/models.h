/* The models a server offers, and their lifecycle: loaded on demand, unloaded when idle and
 * something else needs the room.
 *
 * Each model is an entry with a name (and aliases) and a state: unloaded, loading, loaded,
 * unloading. Loading and unloading are the caller's (struct server_loader: the CLI loads
 * files, backends and engines; the server only decides when). One loader thread runs them,
 * one at a time, so a load never blocks a request of a loaded model, and two loads on one
 * device never plan their memory at once.
 *
 * A request takes a reference on its model while it runs (srv_model_acquire /
 * srv_model_release). When its model is not loaded, acquiring queues a load and parks the
 * request (a waiter: park runs under the registry's lock, and wake runs under it once, when
 * the load ends or the waiter is taken back with srv_model_unwait), so a wake-up can never
 * come before its park. A load that fails is reported to the requests that waited for it;
 * the next request tries again.
 *
 * Room: before a load, when max_loaded models are loaded (or loading), the least recently
 * used idle one (no request holds it, not pinned) is unloaded first; if none is idle, the
 * load waits for one while requests still wait for it. A load that fails for memory
 * (SMELT_ERR_NOMEM) unloads the least recently used idle model on the same device and tries
 * again, until none is left. Pinned models are loaded at start and never unloaded.
 *
 * Idle: a model with a ttl is unloaded once no request has held it for ttl seconds, and
 * srv_model_unload asks for a model's unload now (or as soon as no request holds it). Both
 * run on the loader thread.
 */
#ifndef SMELT_SERVER_MODELS_H
#define SMELT_SERVER_MODELS_H

#include <stdbool.h>
#include <stdint.h>

#include "server/server.h"

/* How the server's models are loaded and unloaded (the CLI's; see cli/serve_model.h). */
struct server_loader {
    /* Loads model i: fills m's loaded parts (engine, tokenizer, templates, n_ctx, created,
     * defaults; not its names) and *handle (what unload takes). SMELT_ERR_NOMEM: there is
     * not enough memory (the server may unload another model and call again). Runs on the
     * loader thread (or the starting thread, for models loaded at start). */
    smelt_status (*load)(void *ctx, int i, struct server_model *m, void **handle, struct err *e);
    /* Frees what load made (the engine has no request in flight). */
    void (*unload)(void *ctx, int i, void *handle);
    void *ctx;
};

/* A model the server offers. Strings must outlive the server. */
struct server_model_def {
    const char *id;               /* its name in the API */
    const char *const *aliases;   /* other names requests may use (listed) */
    int n_aliases;
    const char *hidden_alias;     /* one more accepted name, not listed (the reference as given) */
    bool pinned;                  /* loaded at start, never unloaded */
    bool preload;                 /* loaded at start */
    int device;                   /* the CUDA device it runs on (-1: the CPU): loads that run
                                   * out of memory unload models of the same device */
    int32_t n_ctx;                /* its context when known before loading (0: unknown) */
    double ttl_s;                 /* unloaded after this long without a request (0: never) */
};

enum srv_model_state { SRV_UNLOADED = 0, SRV_LOADING = 1, SRV_LOADED = 2, SRV_UNLOADING = 3 };
const char *srv_model_state_str(enum srv_model_state s); /* "unloaded", "loading", ... */

struct srv_models;
struct srv_model;

/* A request waiting for its model. park(ctx) runs under the registry's lock when the request
 * starts waiting; wake(ctx) runs under it once, when the load ends (or the server shuts
 * down); after wake, acquire again. Zero-initialize. */
struct srv_model_wait {
    void (*park)(void *ctx);
    void (*wake)(void *ctx);
    void *ctx;
    struct srv_model *on;               /* the entry waited on (NULL: not waiting) */
    struct srv_model_wait *prev, *next; /* its list */
    uint64_t attempt;                   /* the load attempt waited for (0: none yet) */
};

/* Creates the registry over n models (defs copied; n >= 1; defs[0] is the default model).
 * ld may be NULL when every model is given loaded (srv_models_put). max_loaded: models
 * loaded at once (0: no bound). Starts the loader thread. */
smelt_status srv_models_new(struct srv_models **out, const struct server_model_def *defs, int n,
                            const struct server_loader *ld, int max_loaded, struct err *e);
/* Marks model i loaded with m (already loaded by the caller; never unloaded: no loader). */
void srv_models_put(struct srv_models *r, int i, const struct server_model *m);
/* Loads every preload and pinned model now, in order, on the calling thread; the first
 * failure fails (its message names the model). */
smelt_status srv_models_preload(struct srv_models *r, struct err *e);
/* Stops the loader thread and unloads every loaded model. NULL is a no-op. */
void srv_models_free(struct srv_models *r);

int srv_models_count(const struct srv_models *r);
struct srv_model *srv_models_at(struct srv_models *r, int i);
/* The model a request names (its id, an alias or its hidden alias); NULL name: the default
 * (the first). NULL when no model has that name. */
struct srv_model *srv_models_find(struct srv_models *r, const char *name);
const struct server_model_def *srv_model_def(const struct srv_model *sm);

enum srv_acquire { SRV_READY, SRV_WAIT, SRV_FAILED };
/* Takes a reference to sm's loaded model: SRV_READY with *m (valid until srv_model_release);
 * SRV_WAIT: not loaded yet (a load is queued when none is under way), w is parked and will
 * be woken; SRV_FAILED: the load w waited for failed, its message in err. */
enum srv_acquire srv_model_acquire(struct srv_models *r, struct srv_model *sm,
                                   struct srv_model_wait *w, const struct server_model **m,
                                   char *err, size_t n);
void srv_model_release(struct srv_models *r, struct srv_model *sm);
/* Takes w off its wait list; true when it was still waiting (the caller then owns the
 * wake-up: wake will not run). */
bool srv_model_unwait(struct srv_models *r, struct srv_model_wait *w);
enum srv_unload { SRV_UNLOAD_QUEUED, SRV_UNLOAD_NOT_LOADED, SRV_UNLOAD_PINNED, SRV_UNLOAD_LOADING };
/* Asks for sm's unload: SRV_UNLOAD_QUEUED when it is loaded (the loader unloads it as soon as
 * no request holds it; requests that come meanwhile are served); SRV_UNLOAD_NOT_LOADED when
 * it is unloaded or unloading already; SRV_UNLOAD_PINNED (never unloaded) and
 * SRV_UNLOAD_LOADING (requests wait for that load) refuse. */
enum srv_unload srv_model_unload(struct srv_models *r, struct srv_model *sm);
/* Wakes every waiting request (shutdown: they answer 503 when they run again). */
void srv_models_wake_all(struct srv_models *r);

/* A snapshot of one model for /v1/models and /metrics. */
struct srv_model_info {
    enum srv_model_state state;
    int32_t n_ctx;            /* 0: unknown (not loaded, none configured) */
    int64_t created;          /* when it was last loaded (0: never) */
    uint64_t loads, unloads, failures;
    char error[ERR_MSG_MAX];  /* the last failed load's message ("" when it loaded since) */
};
void srv_model_info(struct srv_models *r, struct srv_model *sm, struct srv_model_info *out);
/* The engine counters of sm since the server started (every load's, summed) and, when it is
 * loaded, its state now. Returns whether it has ever been loaded. */
bool srv_model_stats(struct srv_models *r, struct srv_model *sm, struct engine_stats *out);

/* Every loaded model's engine: stop accepting, requests in flight (summed), cancel all. */
void srv_models_drain(struct srv_models *r);
int32_t srv_models_in_flight(struct srv_models *r);
void srv_models_cancel_all(struct srv_models *r);

#endif
