/* smelt serve [MODEL...] [options]: an OpenAI-compatible HTTP server over one model or
 * several.
 *
 * Settings come from one table (config/config.h): the config file (smelt.yaml), SMELT_*
 * environment variables, flags and --set, in that order. Each model is loaded by
 * serve_model.c (a path, or an org/repo[:quant] reference pulled on demand: its tokenizer,
 * chat templates, memory plan, KV pool and engine thread). The HTTP server starts, and the
 * main thread waits for SIGINT/SIGTERM. On a signal it stops accepting requests, lets
 * in-flight ones finish for a grace period (--grace), cancels the rest and exits; a second
 * signal during the grace period cancels them at once. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/serve_model.h"
#include "config/config.h"
#include "server/models.h"
#include "server/server.h"

#define USAGE                                                                                     \
    "usage: smelt serve [MODEL...] [options]\n"                                                    \
    "  MODEL: a GGUF file, a directory, or org/repo[:quant] (pulled if absent); several, a\n"      \
    "  config file's models: list or --models-dir serve several models in one server"

/* The API key: api_key, or the first line of api_key_file (without the line end), whichever
 * comes from the higher layer (both from the same one: an error); an empty api_key means
 * no key, an empty file is an error. A key must be printable ASCII without spaces: it
 * travels in a header. buf receives a key read from a file. Returns -1 (go on) or an exit
 * code, and the key (NULL: none) in *key. */
static int api_key(const struct cfg *c, char *buf, size_t n, const char **key) {
    const struct cfg_val *k = cfg_get(c, -1, CFG_API_KEY), *kf = cfg_get(c, -1, CFG_API_KEY_FILE);
    char src[64];
    *key = NULL;
    if (k->set && kf->set && k->src == kf->src) {
        fprintf(stderr, "smelt serve: give api_key or api_key_file, not both (%s)\n",
                cfg_src_text(c, CFG_API_KEY, k, src, sizeof src));
        return 2;
    }
    cfg_src_text(c, CFG_API_KEY, k, src, sizeof src);
    if (kf->set && (!k->set || kf->src > k->src)) {
        const char *path = kf->s;
        snprintf(src, sizeof src, "%.40s", path);
        FILE *f = fopen(path, "r");
        if (!f) {
            fprintf(stderr, "smelt serve: --api-key-file %s: %s\n", path, strerror(errno));
            return 1;
        }
        char *line = fgets(buf, (int)n, f);
        bool long_line = line && !strchr(buf, '\n') && !feof(f);
        fclose(f);
        if (!line || long_line) {
            fprintf(stderr, "smelt serve: --api-key-file %s: %s\n", path,
                    line ? "the first line is too long (255 bytes at most)" : "empty file");
            return 2;
        }
        size_t len = strlen(buf);
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = 0;
        if (!*buf) {
            fprintf(stderr, "smelt serve: --api-key-file %s: the key is empty\n", path);
            return 2;
        }
        *key = buf;
    } else if (k->set) {
        *key = k->s;
    }
    for (const char *p = *key ? *key : ""; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch <= ' ' || ch >= 0x7F) {
            fprintf(stderr, "smelt serve: the API key from %s must be printable ASCII without "
                            "spaces (it is sent in a header)\n", src);
            return 2;
        }
    }
    return -1;
}

/* ---- signals ---- */

/* The second SIGTERM / SIGINT: waited for on a thread while the main one drains. */
struct second_signal {
    const sigset_t *sigs;
    struct server *srv;
    pthread_t th;
    atomic_bool done; /* the drain ended: the signal that wakes us is ours, not the user's */
};

static void *wait_second_signal(void *arg) {
    struct second_signal *ss = arg;
    int sig = 0;
    sigwait(ss->sigs, &sig);
    if (!atomic_load(&ss->done)) {
        fprintf(stderr, "smelt serve: %s again: cancelling requests now\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM");
        server_hurry(ss->srv);
    }
    return NULL;
}

/* The server's settings from c. */
static void server_config_of(const struct cfg *c, const char *key, struct server_config *sc) {
    memset(sc, 0, sizeof *sc);
    sc->host = cfg_str(c, -1, CFG_HOST);
    sc->port = (int)cfg_int(c, -1, CFG_PORT);
    sc->api_key = key;
    sc->max_body = (size_t)cfg_int(c, -1, CFG_MAX_BODY);
    sc->timeout_s = (int)cfg_int(c, -1, CFG_TIMEOUT);
    sc->header_timeout_s = (int)cfg_int(c, -1, CFG_HEADER_TIMEOUT);
    sc->body_budget = (size_t)cfg_int(c, -1, CFG_BODY_BUDGET);
    sc->max_connections = (int)cfg_int(c, -1, CFG_MAX_CONNECTIONS);
    /* not given: a quarter of the connections (0 to the server); given 0: no cap (-1) */
    int64_t pc = cfg_int(c, -1, CFG_MAX_CONNECTIONS_PER_CLIENT);
    sc->max_per_client = !cfg_has(c, -1, CFG_MAX_CONNECTIONS_PER_CLIENT) ? 0 : pc == 0 ? -1 : (int)pc;
    sc->admin = cfg_has(c, -1, CFG_ADMIN_PORT);
    sc->admin_port = (int)cfg_int(c, -1, CFG_ADMIN_PORT);
    sc->admin_host = cfg_str(c, -1, CFG_ADMIN_HOST);
    sc->threads = (int)cfg_int(c, -1, CFG_HTTP_THREADS);
    sc->log_json = !strcmp(cfg_str(c, -1, CFG_LOG_FORMAT), "json");
    sc->quiet = cfg_bool(c, -1, CFG_QUIET);
    sc->no_webui = cfg_bool(c, -1, CFG_NO_WEBUI);
    sc->cors_origins = cfg_str(c, -1, CFG_CORS_ORIGINS);
    int64_t rs = cfg_int(c, -1, CFG_RESPONSE_STORE); /* not given: the default */
    sc->response_store = cfg_has(c, -1, CFG_RESPONSE_STORE) && rs > 0 ? (size_t)rs : 0;
    sc->no_response_store = cfg_has(c, -1, CFG_RESPONSE_STORE) && rs == 0;
}

/* ---- loading models for the server (server/models.h's loader) ---- */

/* What the loader callbacks need: the settings, the models, and the device bytes each loaded
 * one holds (loads and unloads run one at a time: on the starting thread before the server
 * listens, then on the server's loader thread). */
struct loader {
    const struct cfg *c;
    const struct serve_list *l;
    uint64_t *used; /* (l->n) device bytes of each loaded model */
};

static smelt_status load_model(void *ctx, int i, struct server_model *m, void **handle,
                               struct err *e) {
    struct loader *ld = ctx;
    const struct serve_entry *me = &ld->l->v[i];
    uint64_t others = 0;
    for (int j = 0; j < ld->l->n; j++)
        if (j != i && me->device >= 0 && ld->l->v[j].device == me->device) others += ld->used[j];
    struct serve_inst *in = NULL;
    smelt_status st = serve_inst_load(ld->c, me->ci, me->ref, me->name, others, &in, m, e);
    if (st != SMELT_OK) return st;
    ld->used[i] = serve_inst_device_bytes(in);
    *handle = in;
    return SMELT_OK;
}

static void unload_model(void *ctx, int i, void *handle) {
    struct loader *ld = ctx;
    ld->used[i] = 0;
    serve_inst_free(handle);
}

int cmd_serve(int argc, char **argv) {
    struct err e;
    err_clear(&e);
    struct cfg c;
    if (cfg_init(&c, CFG_SERVE, "serve", &e) != SMELT_OK) return cli_fail("serve", &e);
    int rc = cfg_load_args(&c, argc, argv, USAGE);
    char key_buf[256];
    const char *key = NULL;
    if (rc < 0) rc = api_key(&c, key_buf, sizeof key_buf, &key);
    if (rc >= 0) {
        cfg_free(&c);
        return rc;
    }

    /* signals: handled by sigwait in this thread; every thread created below inherits the
     * blocked mask. SIGPIPE is ignored (a client closing its socket is not fatal). */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    struct serve_list l = {0};
    struct server_model_def *defs = NULL;
    struct loader ld = {.c = &c, .l = &l};
    struct server *srv = NULL;
    smelt_status st = serve_list_build(&c, true, &l, &e);
    if (st == SMELT_OK) {
        defs = calloc((size_t)l.n, sizeof *defs);
        ld.used = calloc((size_t)l.n, sizeof *ld.used);
        if (!defs || !ld.used) st = err_set(&e, SMELT_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; st == SMELT_OK && i < l.n; i++) {
        const struct serve_entry *m = &l.v[i];
        defs[i] = (struct server_model_def){
            .id = m->name, .aliases = (const char *const *)m->aliases, .n_aliases = m->n_aliases,
            .hidden_alias = m->hidden, .pinned = m->pinned, .preload = m->preload,
            .device = m->device, .n_ctx = (int32_t)cfg_int(&c, m->ci, CFG_CTX_SIZE),
            .ttl_s = cfg_num(&c, m->ci, CFG_TTL)};
    }
    if (st == SMELT_OK) {
        struct server_config sc;
        server_config_of(&c, key, &sc);
        struct server_loader sl = {load_model, unload_model, &ld};
        st = server_new_models(&srv, &sc, defs, l.n, &sl, (int)cfg_int(&c, -1, CFG_MAX_LOADED_MODELS),
                               &e);
        if (st == SMELT_OK) {
            double grace = cfg_num(&c, -1, CFG_GRACE);
            const char *host = sc.host ? sc.host : "127.0.0.1";
            if (l.n > 1)
                fprintf(stderr, "smelt serve: %d models (%s the default); the others load on "
                                "their first request\n", l.n, l.v[0].name);
            if (server_admin_port(srv) >= 0)
                fprintf(stderr, "smelt serve: admin (/health, /metrics) on http://%s:%d\n",
                        sc.admin_host ? sc.admin_host : host, server_admin_port(srv));
            if (server_has_webui(srv))
                fprintf(stderr, "smelt serve: web chat at http://%s:%d/\n", host, server_port(srv));
            fprintf(stderr, "smelt serve: listening on http://%s:%d\n", host, server_port(srv));
            fflush(stderr);
            int sig = 0;
            sigwait(&sigs, &sig);
            fprintf(stderr, "smelt serve: %s: shutting down (grace %.0f s; a second signal "
                            "cancels requests now)\n",
                    sig == SIGINT ? "SIGINT" : "SIGTERM", grace);
            fflush(stderr);
            struct second_signal ss = {.sigs = &sigs, .srv = srv};
            bool waiting = pthread_create(&ss.th, NULL, wait_second_signal, &ss) == 0;
            server_shutdown(srv, grace);
            if (waiting) { /* wake the waiter if no second signal came */
                atomic_store(&ss.done, true);
                pthread_kill(ss.th, SIGTERM);
                pthread_join(ss.th, NULL);
            }
        }
    }
    rc = st == SMELT_OK ? 0 : cli_fail("serve", &e);
    server_free(srv); /* (unloads the models) */
    serve_list_free(&l);
    free(defs);
    free(ld.used);
    cfg_free(&c);
    if (rc == 0) fprintf(stderr, "smelt serve: stopped\n");
    return rc;
}
