/* The server's model registry (server/models.h) over a fake loader whose devices have a
 * memory budget: a load that would pass its device's budget fails with SMELT_ERR_NOMEM, as
 * the CLI's loader does when the weights or the KV pool do not fit. Checks what the HTTP
 * suites cannot reach on a CPU: unloading the least recently used idle model of the same
 * device when a load runs out of memory (never a busy, pinned or other device's one), the
 * --max-loaded-models bound waiting for a model to become idle, a failed load reported to
 * its waiters and retried by the next request, park/wake pairing, an unload asked for
 * (waiting for the model's requests) and a ttl's idle unload (not reset by a metrics
 * scrape). */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "server/models.h"
#include "t.h"
#include "util/clock.h"

#define N 4

/* The fake: model i needs size[i] units of its device's budget. */
struct fake {
    int size[N], device[N];
    int budget[2], used[2];
    int loads[N], unloads[N];
    bool fail[N]; /* a broken file */
    int loaded_now;
};

static smelt_status fake_load(void *ctx, int i, struct server_model *m, void **h, struct err *e) {
    struct fake *f = ctx;
    if (f->fail[i]) return err_set(e, SMELT_ERR_FORMAT, "model %d: not a GGUF file", i);
    int d = f->device[i];
    if (f->used[d] + f->size[i] > f->budget[d])
        return err_set(e, SMELT_ERR_NOMEM, "model %d: %d units do not fit (%d of %d used)", i,
                       f->size[i], f->used[d], f->budget[d]);
    f->used[d] += f->size[i];
    f->loads[i]++;
    f->loaded_now++;
    m->n_ctx = 100 + i;
    *h = (void *)(intptr_t)(i + 1);
    return SMELT_OK;
}

static void fake_unload(void *ctx, int i, void *h) {
    struct fake *f = ctx;
    T_CHECK((intptr_t)h == i + 1);
    f->used[f->device[i]] -= f->size[i];
    f->unloads[i]++;
    f->loaded_now--;
}

/* A waiter: park and wake counted, wake signals a condition. */
struct waiter {
    struct srv_model_wait w;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int parks, wakes;
};

static void park(void *ctx) { ((struct waiter *)ctx)->parks++; }
static void wake(void *ctx) {
    struct waiter *x = ctx;
    pthread_mutex_lock(&x->mu);
    x->wakes++;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

static void waiter_init(struct waiter *x) {
    memset(x, 0, sizeof *x);
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    x->w.park = park;
    x->w.wake = wake;
    x->w.ctx = x;
}

/* Waits (up to 5 s) for x's next wake; false on timeout. */
static bool wait_wake(struct waiter *x, int n) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 5;
    pthread_mutex_lock(&x->mu);
    while (x->wakes < n && pthread_cond_timedwait(&x->cv, &x->mu, &dl) == 0) {}
    bool ok = x->wakes >= n;
    pthread_mutex_unlock(&x->mu);
    return ok;
}

/* Acquires model i for a request, waiting for its load: the status, *m when ready. */
static enum srv_acquire get(struct srv_models *r, int i, const struct server_model **m, char *err) {
    struct waiter x;
    waiter_init(&x);
    struct srv_model *sm = srv_models_at(r, i);
    enum srv_acquire a;
    int n = 0;
    while ((a = srv_model_acquire(r, sm, &x.w, m, err, ERR_MSG_MAX)) == SRV_WAIT) {
        T_CHECK(x.parks == ++n);
        T_CHECK(wait_wake(&x, n));
    }
    T_EQ_INT(x.parks, x.wakes); /* every park woken once */
    return a;
}

static const char *names[N] = {"a", "b", "c", "d"};

static struct srv_models *registry(struct fake *f, int max_loaded, const bool *pinned) {
    struct server_model_def defs[N];
    for (int i = 0; i < N; i++)
        defs[i] = (struct server_model_def){.id = names[i], .device = f->device[i],
                                            .pinned = pinned && pinned[i]};
    struct server_loader ld = {fake_load, fake_unload, f};
    struct srv_models *r = NULL;
    struct err e;
    T_EQ_INT(srv_models_new(&r, defs, N, &ld, max_loaded, &e), SMELT_OK);
    return r;
}

static enum srv_model_state state(struct srv_models *r, int i) {
    struct srv_model_info in;
    srv_model_info(r, srv_models_at(r, i), &in);
    return in.state;
}

static void test_out_of_memory_unloads_lru_of_the_device(void) {
    /* device 0 holds 10 units: two models of 4 fit, a third does not; d lives on device 1 */
    struct fake f = {.size = {4, 4, 4, 9}, .device = {0, 0, 0, 1}, .budget = {10, 10}};
    struct srv_models *r = registry(&f, 0, NULL);
    const struct server_model *m;
    char err[ERR_MSG_MAX];
    T_EQ_INT(get(r, 3, &m, err), SRV_READY); /* device 1's, first */
    srv_model_release(r, srv_models_at(r, 3));
    T_EQ_INT(get(r, 0, &m, err), SRV_READY);
    T_EQ_INT(m->n_ctx, 100);
    srv_model_release(r, srv_models_at(r, 0));
    T_EQ_INT(get(r, 1, &m, err), SRV_READY);
    srv_model_release(r, srv_models_at(r, 1));
    /* c: out of memory on device 0; a is its least recently used idle model (d, older, is
     * on device 1 and stays) */
    T_EQ_INT(get(r, 2, &m, err), SRV_READY);
    T_EQ_INT(state(r, 0), SRV_UNLOADED);
    T_EQ_INT(state(r, 3), SRV_LOADED);
    T_EQ_INT(f.unloads[0], 1);
    T_EQ_INT(f.unloads[3], 0);
    /* c is still held: a needs room, b is the only idle one on device 0 */
    T_EQ_INT(get(r, 0, &m, err), SRV_READY);
    T_EQ_INT(state(r, 1), SRV_UNLOADED);
    T_EQ_INT(f.loads[0], 2);
    /* both device-0 models held, nothing idle to unload: b's load fails, with the message */
    T_EQ_INT(get(r, 1, &m, err), SRV_FAILED);
    T_CHECKF(strstr(err, "model 1: 4 units do not fit (8 of 10 used)"), "%s", err);
    srv_model_release(r, srv_models_at(r, 0));
    srv_model_release(r, srv_models_at(r, 2));
    /* released: the next request for b tries again, and gets room */
    T_EQ_INT(get(r, 1, &m, err), SRV_READY);
    srv_model_release(r, srv_models_at(r, 1));
    struct srv_model_info in;
    srv_model_info(r, srv_models_at(r, 1), &in);
    T_CHECK(in.failures == 1 && in.loads == 2 && !in.error[0]); /* (loaded, unloaded for a, failed, loaded) */
    srv_models_free(r); /* unloads the rest */
    T_EQ_INT(f.loaded_now, 0);
    T_CHECK(f.used[0] == 0 && f.used[1] == 0);
}

struct holder {
    struct srv_models *r;
    int i;
    int ms;
};

static void *release_later(void *arg) {
    struct holder *h = arg;
    struct timespec ts = {0, (long)h->ms * 1000000L};
    nanosleep(&ts, NULL);
    srv_model_release(h->r, srv_models_at(h->r, h->i));
    return NULL;
}

static void test_max_loaded_waits_for_an_idle_model(void) {
    bool pinned[N] = {false, false, false, true};
    struct fake f = {.size = {1, 1, 1, 1}, .budget = {100, 100}};
    struct srv_models *r = registry(&f, 2, pinned);
    struct err e;
    T_EQ_INT(srv_models_preload(r, &e), SMELT_OK); /* the pinned one */
    T_EQ_INT(state(r, 3), SRV_LOADED);
    const struct server_model *m;
    char err[ERR_MSG_MAX];
    T_EQ_INT(get(r, 0, &m, err), SRV_READY); /* held */
    /* b: two are loaded (a held, d pinned): b's load waits until a is released */
    pthread_t th;
    struct holder h = {r, 0, 300};
    pthread_create(&th, NULL, release_later, &h);
    T_EQ_INT(get(r, 1, &m, err), SRV_READY);
    pthread_join(th, NULL);
    T_EQ_INT(state(r, 0), SRV_UNLOADED);
    T_EQ_INT(state(r, 3), SRV_LOADED);
    srv_model_release(r, srv_models_at(r, 1));
    /* a waiter that gives up: its load is abandoned when no request waits any more */
    T_EQ_INT(get(r, 2, &m, err), SRV_READY); /* c held; b idle: unloaded for c */
    T_EQ_INT(state(r, 1), SRV_UNLOADED);
    struct waiter x;
    waiter_init(&x);
    T_EQ_INT(srv_model_acquire(r, srv_models_at(r, 0), &x.w, &m, err, sizeof err), SRV_WAIT);
    T_EQ_INT(x.parks, 1);
    T_CHECK(srv_model_unwait(r, &x.w)); /* taken back: the caller owns the wake-up */
    T_CHECK(!srv_model_unwait(r, &x.w));
    struct timespec ts = {0, 300000000L};
    nanosleep(&ts, NULL);
    T_EQ_INT(x.wakes, 0);
    T_EQ_INT(state(r, 0), SRV_UNLOADED); /* given up (still 2 loaded: c held, d pinned) */
    srv_model_release(r, srv_models_at(r, 2));
    srv_models_free(r);
    T_EQ_INT(f.loaded_now, 0);
}

static void test_failed_load_reported_then_retried(void) {
    struct fake f = {.size = {1, 1, 1, 1}, .budget = {100, 100}, .fail = {false, true}};
    struct srv_models *r = registry(&f, 0, NULL);
    const struct server_model *m;
    char err[ERR_MSG_MAX];
    for (int attempt = 1; attempt <= 2; attempt++) {
        T_EQ_INT(get(r, 1, &m, err), SRV_FAILED);
        T_CHECKF(strstr(err, "not a GGUF file"), "%s", err);
        struct srv_model_info in;
        srv_model_info(r, srv_models_at(r, 1), &in);
        T_CHECK(in.state == SRV_UNLOADED && in.failures == (uint64_t)attempt && in.error[0]);
    }
    f.fail[1] = false; /* fixed: the next request loads it */
    T_EQ_INT(get(r, 1, &m, err), SRV_READY);
    srv_model_release(r, srv_models_at(r, 1));
    /* lookups: id, NULL for the default */
    T_CHECK(srv_models_find(r, "c") == srv_models_at(r, 2));
    T_CHECK(srv_models_find(r, NULL) == srv_models_at(r, 0));
    T_CHECK(srv_models_find(r, "nope") == NULL);
    /* shutting down: waiters are woken and told so */
    srv_models_wake_all(r);
    T_EQ_INT(get(r, 2, &m, err), SRV_FAILED);
    T_CHECKF(strstr(err, "shutting down"), "%s", err);
    srv_models_free(r);
}

/* Waits (up to 5 s) for model i to reach st; the seconds it took, or -1. */
static double wait_state(struct srv_models *r, int i, enum srv_model_state st) {
    double t0 = clock_now();
    while (state(r, i) != st) {
        if (clock_now() - t0 > 5) return -1;
        struct timespec ts = {0, 2000000L};
        nanosleep(&ts, NULL);
    }
    return clock_now() - t0;
}

static void test_unload_asked_for_and_ttl(void) {
    struct fake f = {.size = {1, 1, 1, 1}, .budget = {100, 100}};
    struct server_model_def defs[N];
    for (int i = 0; i < N; i++)
        defs[i] = (struct server_model_def){.id = names[i], .pinned = i == 3,
                                            .ttl_s = i == 1 ? 0.3 : i == 3 ? 0.01 : 0};
    struct server_loader ld = {fake_load, fake_unload, &f};
    struct srv_models *r = NULL;
    struct err e;
    T_EQ_INT(srv_models_new(&r, defs, N, &ld, 0, &e), SMELT_OK);
    T_EQ_INT(srv_models_preload(r, &e), SMELT_OK);
    const struct server_model *m;
    char err[ERR_MSG_MAX];
    /* asked for while a request holds it: unloaded when the request lets it go */
    T_EQ_INT(get(r, 0, &m, err), SRV_READY);
    T_EQ_INT(srv_model_unload(r, srv_models_at(r, 0)), SRV_UNLOAD_QUEUED);
    struct holder h = {r, 0, 200};
    pthread_t th;
    double t0 = clock_now();
    pthread_create(&th, NULL, release_later, &h);
    T_CHECK(wait_state(r, 0, SRV_UNLOADED) >= 0);
    T_CHECKF(clock_now() - t0 >= 0.19, "unloaded after %.3f s, before its request ended",
             clock_now() - t0);
    pthread_join(th, NULL);
    T_EQ_INT(f.unloads[0], 1);
    T_EQ_INT(srv_model_unload(r, srv_models_at(r, 0)), SRV_UNLOAD_NOT_LOADED);
    T_EQ_INT(srv_model_unload(r, srv_models_at(r, 3)), SRV_UNLOAD_PINNED);
    /* a requested again after its unload: loaded again, and not unloaded (no ttl) */
    T_EQ_INT(get(r, 0, &m, err), SRV_READY);
    srv_model_release(r, srv_models_at(r, 0));
    /* b's ttl of 0.3 s runs from its last request's end; a scrape does not restart it */
    T_EQ_INT(get(r, 1, &m, err), SRV_READY);
    srv_model_release(r, srv_models_at(r, 1));
    t0 = clock_now();
    struct engine_stats st;
    for (int k = 0; k < 5; k++) {
        struct timespec ts = {0, 40000000L};
        nanosleep(&ts, NULL);
        srv_model_stats(r, srv_models_at(r, 1), &st);
    }
    T_CHECK(wait_state(r, 1, SRV_UNLOADED) >= 0);
    double idle = clock_now() - t0;
    T_CHECKF(idle >= 0.29 && idle < 1.5, "b unloaded after %.3f s idle (ttl 0.3 s)", idle);
    /* the pinned d (ttl 0.01 s) and a (no ttl) stay */
    T_EQ_INT(state(r, 3), SRV_LOADED);
    T_EQ_INT(state(r, 0), SRV_LOADED);
    T_EQ_INT(f.unloads[3], 0);
    srv_models_free(r);
    T_EQ_INT(f.loaded_now, 0);
}

int main(void) {
    T_RUN(test_out_of_memory_unloads_lru_of_the_device);
    T_RUN(test_max_loaded_waits_for_an_idle_model);
    T_RUN(test_failed_load_reported_then_retried);
    T_RUN(test_unload_asked_for_and_ttl);
    return t_done();
}
