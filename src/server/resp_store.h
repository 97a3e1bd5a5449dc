/* The store of finished /v1/responses that previous_response_id and GET /v1/responses/{id}
 * name: each response's object and its conversation (chat messages), as JSON texts, in
 * memory. Bounded by a count and by bytes (the texts and the bookkeeping); the least
 * recently used (put or got) go first. Thread-safe. */
#ifndef SMELT_SERVER_RESP_STORE_H
#define SMELT_SERVER_RESP_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct resp_store;

/* NULL on OOM. max_count >= 1. */
struct resp_store *resp_store_new(size_t max_bytes, int32_t max_count);
void resp_store_free(struct resp_store *st);
/* Keeps (id, conv, resp), taking the two malloc'd texts (freed here if not kept); evicts the
 * least recently used entries to stay within the bounds. An entry larger than the whole
 * store is not kept. st may be NULL (nothing kept). */
void resp_store_put(struct resp_store *st, const char *id, char *conv, char *resp);
/* A malloc'd copy of id's conversation (conv) or response object; NULL when it is not
 * stored (or st is NULL). The entry becomes the most recently used. */
char *resp_store_get(struct resp_store *st, const char *id, bool conv);

#endif
