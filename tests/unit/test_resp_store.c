/* The /v1/responses store (server/resp_store.h): what is put is got back; the count and
 * byte bounds evict the least recently used first, a get refreshing an entry; an entry
 * larger than the store is not kept; a put of a known id replaces it; concurrent puts and
 * gets from several threads keep the bounds. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/resp_store.h"
#include "t.h"

static char *text(const char *s) {
    return strdup(s);
}

static bool has(struct resp_store *st, const char *id) {
    char *x = resp_store_get(st, id, false);
    free(x);
    return x != NULL;
}

static void test_put_get(void) {
    struct resp_store *st = resp_store_new(1 << 20, 8);
    T_CHECK(st != NULL);
    if (!st) return;
    resp_store_put(st, "resp_a", text("[conv a]"), text("{resp a}"));
    char *c = resp_store_get(st, "resp_a", true), *r = resp_store_get(st, "resp_a", false);
    T_EQ_STR(c, "[conv a]");
    T_EQ_STR(r, "{resp a}");
    free(c);
    free(r);
    T_CHECK(resp_store_get(st, "resp_b", true) == NULL);
    /* the same id again: replaced */
    resp_store_put(st, "resp_a", text("[conv a2]"), text("{resp a2}"));
    c = resp_store_get(st, "resp_a", true);
    T_EQ_STR(c, "[conv a2]");
    free(c);
    resp_store_free(st);
    /* no store: nothing kept, nothing found */
    resp_store_put(NULL, "resp_a", text("x"), text("y"));
    T_CHECK(resp_store_get(NULL, "resp_a", true) == NULL);
}

static void test_count_bound_lru(void) {
    struct resp_store *st = resp_store_new(1 << 20, 3);
    if (!st) return;
    resp_store_put(st, "a", text("1"), text("1"));
    resp_store_put(st, "b", text("2"), text("2"));
    resp_store_put(st, "c", text("3"), text("3"));
    T_CHECK(has(st, "a")); /* a is now the most recently used: b goes next */
    resp_store_put(st, "d", text("4"), text("4"));
    T_CHECK(!has(st, "b"));
    T_CHECK(has(st, "a") && has(st, "c") && has(st, "d"));
    resp_store_free(st);
}

static void test_byte_bound(void) {
    char big[1001];
    memset(big, 'x', 1000);
    big[1000] = 0;
    /* each entry is 2000 bytes of text plus its bookkeeping: three fit in 7000, not four */
    struct resp_store *st = resp_store_new(7000, 1000);
    if (!st) return;
    const char *ids[] = {"r0", "r1", "r2", "r3", "r4"};
    for (int i = 0; i < 5; i++)
        resp_store_put(st, ids[i], text(big), text(big));
    T_CHECK(!has(st, "r0") && !has(st, "r1"));
    T_CHECK(has(st, "r2") && has(st, "r3") && has(st, "r4"));
    /* larger than the whole store: not kept, and nothing evicted for it */
    char *huge = malloc(8001);
    if (huge) {
        memset(huge, 'y', 8000);
        huge[8000] = 0;
        resp_store_put(st, "huge", huge, text("{}"));
    }
    T_CHECK(!has(st, "huge") && has(st, "r2"));
    resp_store_free(st);
}

static struct resp_store *shared;

static void *worker(void *arg) {
    int t = (int)(long)arg;
    char id[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(id, sizeof id, "t%d_%d", t, i);
        resp_store_put(shared, id, text("[\"conversation\"]"), text("{\"response\":1}"));
        snprintf(id, sizeof id, "t%d_%d", (t + 1) % 4, i / 2);
        free(resp_store_get(shared, id, i & 1));
    }
    return NULL;
}

static void test_threads(void) {
    shared = resp_store_new(64 * 1024, 100);
    if (!shared) return;
    pthread_t th[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    /* the last put of each thread is there; at most 100 entries are */
    int n = 0;
    char id[32];
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 2000; i++) {
            snprintf(id, sizeof id, "t%d_%d", t, i);
            n += has(shared, id);
        }
    T_CHECK(n > 0 && n <= 100);
    resp_store_free(shared);
}

int main(void) {
    T_RUN(test_put_get);
    T_RUN(test_count_bound_lru);
    T_RUN(test_byte_bound);
    T_RUN(test_threads);
    return t_done();
}
