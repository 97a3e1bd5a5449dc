/* The store of finished /v1/responses: see resp_store.h. A hash table of ids (chained, sized
 * for the count bound) and a doubly linked list in order of use, under one mutex; an entry
 * is its two texts and its bookkeeping, counted in bytes. */
#include "server/resp_store.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    struct entry *prev, *next; /* LRU list, most recent first */
    struct entry *chain;       /* hash bucket */
    char id[48];
    char *conv, *resp; /* the conversation, the response object (JSON texts) */
    size_t bytes;
};

struct resp_store {
    pthread_mutex_t mu;
    struct entry **bucket;
    size_t n_bucket; /* a power of two */
    struct entry *head, *tail;
    int32_t count, max_count;
    size_t bytes, max_bytes;
};

static size_t id_hash(const char *id) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *id; id++)
        h = (h ^ (uint8_t)*id) * 1099511628211ull;
    return (size_t)h;
}

struct resp_store *resp_store_new(size_t max_bytes, int32_t max_count) {
    struct resp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->n_bucket = 64;
    while ((int64_t)st->n_bucket < max_count)
        st->n_bucket *= 2;
    st->bucket = calloc(st->n_bucket, sizeof *st->bucket);
    if (!st->bucket) {
        free(st);
        return NULL;
    }
    st->max_bytes = max_bytes;
    st->max_count = max_count;
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

static struct entry **find(struct resp_store *st, const char *id) {
    struct entry **p = &st->bucket[id_hash(id) & (st->n_bucket - 1)];
    while (*p && strcmp((*p)->id, id))
        p = &(*p)->chain;
    return p;
}

static void unlink_lru(struct resp_store *st, struct entry *x) {
    if (x->prev)
        x->prev->next = x->next;
    else
        st->head = x->next;
    if (x->next)
        x->next->prev = x->prev;
    else
        st->tail = x->prev;
    x->prev = x->next = NULL;
}

static void push_front(struct resp_store *st, struct entry *x) {
    x->next = st->head;
    if (st->head) st->head->prev = x;
    st->head = x;
    if (!st->tail) st->tail = x;
}

static void drop(struct resp_store *st, struct entry *x) {
    *find(st, x->id) = x->chain;
    unlink_lru(st, x);
    st->count--;
    st->bytes -= x->bytes;
    free(x->conv);
    free(x->resp);
    free(x);
}

void resp_store_free(struct resp_store *st) {
    if (!st) return;
    while (st->head)
        drop(st, st->head);
    free(st->bucket);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

void resp_store_put(struct resp_store *st, const char *id, char *conv, char *resp) {
    size_t bytes = strlen(conv) + strlen(resp) + sizeof(struct entry);
    struct entry *x = st && bytes <= st->max_bytes ? calloc(1, sizeof *x) : NULL;
    if (!x) {
        free(conv);
        free(resp);
        return;
    }
    snprintf(x->id, sizeof x->id, "%s", id);
    x->conv = conv;
    x->resp = resp;
    x->bytes = bytes;
    pthread_mutex_lock(&st->mu);
    struct entry **p = find(st, id);
    if (*p) drop(st, *p); /* (ids are unique: only a replay of one could be here) */
    while (st->head && (st->count + 1 > st->max_count || st->bytes + bytes > st->max_bytes))
        drop(st, st->tail);
    p = find(st, id);
    x->chain = *p;
    *p = x;
    push_front(st, x);
    st->count++;
    st->bytes += bytes;
    pthread_mutex_unlock(&st->mu);
}

char *resp_store_get(struct resp_store *st, const char *id, bool conv) {
    if (!st) return NULL;
    pthread_mutex_lock(&st->mu);
    struct entry *x = *find(st, id);
    char *out = NULL;
    if (x) {
        unlink_lru(st, x);
        push_front(st, x);
        out = strdup(conv ? x->conv : x->resp);
    }
    pthread_mutex_unlock(&st->mu);
    return out;
}
