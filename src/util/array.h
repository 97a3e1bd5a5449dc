/* Growable arrays: the one place where an array's capacity doubles.
 *
 *     if (!array_grow((void **)&s->tok, &s->cap_tok, s->n_tok + 1, sizeof *s->tok))
 *         return err_set(e, SMELT_ERR_NOMEM, "...");
 *     s->tok[s->n_tok++] = token;
 */
#ifndef SMELT_UTIL_ARRAY_H
#define SMELT_UTIL_ARRAY_H

#include <stdbool.h>
#include <stddef.h>

/* The out-of-line part of array_grow (below). */
bool array_grow_slow(void **p, size_t *cap, size_t need, size_t elem);

/* Makes room for need elements of elem bytes (> 0) in the malloc'd array *p (NULL: none
 * yet) whose capacity is *cap elements. On success *cap >= need and the elements *p held
 * are kept (*p itself is unchanged while need <= *cap): the capacity doubles from
 * max(*cap, 16) until it fits, so n appends cost O(n). Returns false when memory runs
 * out or the size overflows size_t: *p and *cap are then unchanged. The check is inline
 * (the tokenizer and the sampler grow arrays per word and per token); array_grow_slow
 * is the rest. */
static inline bool array_grow(void **p, size_t *cap, size_t need, size_t elem) {
    return (*p && need <= *cap) || array_grow_slow(p, cap, need, elem);
}

#endif
