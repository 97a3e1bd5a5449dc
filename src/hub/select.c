/* Choosing the model file(s) of a quant among a repo's (or a directory's) GGUF files.
 *
 * GGUF repos name files like "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", "model.q8_0.gguf",
 * "Q4_K_M/Model-Q4_K_M-00001-of-00003.gguf" (a split set, gguf-split's
 * "%s-%05d-of-%05d.gguf"), beside "mmproj-*.gguf" projectors and "imatrix" files that are not
 * models. The quant tag is matched case-insensitively as a whole word of the path, so
 * "Q4_K" does not pick "Q4_K_M" and "Q8_0" does not pick "IQ8_0". When several candidates
 * match, the one whose own tag equals the quant wins, then the shortest path, then the
 * first in byte order: the choice is deterministic whatever order the hub lists files in. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hub/hub_internal.h"

static bool ends_with_ci(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcasecmp(s + n - m, suf);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

bool hub_split_info(const char *path, int *no, int *count, size_t *prefix_len) {
    /* ...-NNNNN-of-MMMMM.gguf : 20 bytes after the prefix */
    size_t n = strlen(path);
    if (n < 21 || !ends_with_ci(path, ".gguf")) return false;
    const char *t = path + n - 20; /* "-NNNNN-of-MMMMM.gguf" */
    if (t[0] != '-' || strncmp(t + 6, "-of-", 4) != 0) return false;
    int a = 0, b = 0;
    for (int i = 0; i < 5; i++) {
        if (!isdigit((unsigned char)t[1 + i]) || !isdigit((unsigned char)t[10 + i])) return false;
        a = a * 10 + (t[1 + i] - '0');
        b = b * 10 + (t[10 + i] - '0');
    }
    if (a < 1 || b < 1 || a > b) return false;
    if (no) *no = a;
    if (count) *count = b;
    if (prefix_len) *prefix_len = (size_t)(t - path);
    return true;
}

void hub_quant_tag(const char *path, char *out, size_t n) {
    out[0] = 0;
    const char *b = base_name(path);
    size_t len = strlen(b);
    size_t pl;
    if (hub_split_info(b, NULL, NULL, &pl)) len = pl;
    else if (ends_with_ci(b, ".gguf")) len -= 5;
    size_t start = len;
    while (start > 0 && b[start - 1] != '-' && b[start - 1] != '.') start--;
    if (start == 0) return; /* a single word: no tag */
    size_t tl = len - start;
    if (tl == 0 || tl + 1 > n) return;
    for (size_t i = 0; i < tl; i++) out[i] = (char)toupper((unsigned char)b[start + i]);
    out[tl] = 0;
}

bool hub_quant_matches(const char *path, const char *tag) {
    size_t n = strlen(path), m = strlen(tag);
    if (m == 0 || m > n) return false;
    for (size_t i = 0; i + m <= n; i++) {
        if (strncasecmp(path + i, tag, m) != 0) continue;
        if (i > 0 && isalnum((unsigned char)path[i - 1])) continue;
        unsigned char after = (unsigned char)path[i + m];
        if (after && (isalnum(after) || after == '_')) continue;
        return true;
    }
    return false;
}

static bool contains_ci(const char *s, const char *w) {
    size_t n = strlen(s), m = strlen(w);
    for (size_t i = 0; i + m <= n; i++)
        if (!strncasecmp(s + i, w, m)) return true;
    return false;
}

bool hub_is_model_gguf(const char *path) {
    if (!ends_with_ci(path, ".gguf")) return false;
    const char *b = base_name(path);
    return !contains_ci(b, "mmproj") && !contains_ci(b, "imatrix");
}

/* A candidate model: a single file, or the first part of a split set. */
static bool is_candidate(const char *path) {
    if (!hub_is_model_gguf(path)) return false;
    int no;
    if (hub_split_info(path, &no, NULL, NULL) && no != 1) return false;
    return true;
}

/* Expands candidate c to its file set (all parts of a split, in order). One pass over the
 * names: a hostile listing of many files cannot make this quadratic. */
static smelt_status expand(const char *const *names, size_t n, size_t c, size_t **idx,
                           size_t *nidx, struct err *e) {
    int no, count;
    size_t pl;
    if (!hub_split_info(names[c], &no, &count, &pl)) {
        *idx = malloc(sizeof **idx);
        if (!*idx) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
        (*idx)[0] = c;
        *nidx = 1;
        return SMELT_OK;
    }
    size_t *v = malloc((size_t)count * sizeof *v);
    if (!v) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    for (int k = 0; k < count; k++) v[k] = n;
    for (size_t i = 0; i < n; i++) {
        int no2, count2;
        size_t pl2;
        if (hub_split_info(names[i], &no2, &count2, &pl2) && count2 == count && pl2 == pl &&
            !strncmp(names[i], names[c], pl) && v[no2 - 1] == n)
            v[no2 - 1] = i;
    }
    for (int k = 0; k < count; k++) {
        if (v[k] == n) {
            free(v);
            return err_set(e, SMELT_ERR_FORMAT, "split set %.*s: part %d of %d is missing",
                           (int)pl, names[c], k + 1, count);
        }
    }
    *idx = v;
    *nidx = (size_t)count;
    return SMELT_OK;
}

/* Lists the distinct quant tags of the candidates into out ("Q4_K_M, Q8_0, ..."), in
 * listing order, up to what fits. */
static void list_tags(const char *const *names, size_t n, char *out, size_t cap) {
    enum { MAX_SHOWN = 64 };
    char seen[MAX_SHOWN][HUB_QUANT_MAX];
    int nseen = 0;
    size_t used = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && nseen < MAX_SHOWN; i++) {
        if (!is_candidate(names[i])) continue;
        char tag[HUB_QUANT_MAX];
        hub_quant_tag(names[i], tag, sizeof tag);
        if (!tag[0]) snprintf(tag, sizeof tag, "%s", base_name(names[i]));
        bool dup = false;
        for (int j = 0; j < nseen && !dup; j++) dup = !strcmp(seen[j], tag);
        if (dup) continue;
        memcpy(seen[nseen++], tag, sizeof tag);
        int w = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", tag);
        if (w < 0 || (size_t)w >= cap - used) {
            if (cap > 5) strcpy(out + cap - 5, "...");
            return;
        }
        used += (size_t)w;
    }
}

/* Better of two matching candidates a, b for tag: own tag equal, then shorter, then bytes. */
static bool better(const char *a, const char *b, const char *tag) {
    char ta[HUB_QUANT_MAX], tb[HUB_QUANT_MAX];
    hub_quant_tag(a, ta, sizeof ta);
    hub_quant_tag(b, tb, sizeof tb);
    bool ea = !strcasecmp(ta, tag), eb = !strcasecmp(tb, tag);
    if (ea != eb) return ea;
    size_t la = strlen(a), lb = strlen(b);
    if (la != lb) return la < lb;
    return strcmp(a, b) < 0;
}

smelt_status hub_select(const char *const *names, size_t n, const char *quant, size_t **idx,
                        size_t *nidx, struct err *e) {
    *idx = NULL;
    *nidx = 0;
    size_t ncand = 0;
    for (size_t i = 0; i < n; i++) ncand += is_candidate(names[i]);
    if (ncand == 0) return err_set(e, SMELT_ERR_NOT_FOUND, "no GGUF model file");

    if (quant && ends_with_ci(quant, ".gguf")) { /* an exact file name */
        for (size_t i = 0; i < n; i++)
            if (!strcasecmp(names[i], quant) || !strcasecmp(base_name(names[i]), quant))
                return expand(names, n, i, idx, nidx, e);
        return err_set(e, SMELT_ERR_NOT_FOUND, "no file named %s", quant);
    }

    const char *tag = (quant && *quant) ? quant : HUB_DEFAULT_QUANT;
    size_t best = n;
    for (size_t i = 0; i < n; i++) {
        if (!is_candidate(names[i]) || !hub_quant_matches(names[i], tag)) continue;
        if (best == n || better(names[i], names[best], tag)) best = i;
    }
    if (best == n && !(quant && *quant) && ncand == 1) {
        for (size_t i = 0; i < n && best == n; i++)
            if (is_candidate(names[i])) best = i;
    }
    if (best != n) return expand(names, n, best, idx, nidx, e);

    char tags[320];
    list_tags(names, n, tags, sizeof tags);
    if (quant && *quant)
        return err_set(e, SMELT_ERR_NOT_FOUND, "no GGUF file matches quant %s (available: %s)",
                       quant, tags);
    return err_set(e, SMELT_ERR_NOT_FOUND,
                   "no GGUF file matches the default quant %s and there are %zu models to "
                   "choose from; name one as :QUANT (available: %s)",
                   HUB_DEFAULT_QUANT, ncand, tags);
}
