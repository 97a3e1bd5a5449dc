/* Fuzzes what the hub client takes from the network and the user: the repo listing JSON
 * (hub_parse_listing), the selection over the names it yields (hub_select), and model
 * references, etag headers and redirect Locations taken from the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "hub/hub_internal.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    struct err e;
    struct hub_listing l;
    if (hub_parse_listing((const char *)data, size, &l, &e) == SMELT_OK) {
        const char **names = malloc((l.n ? l.n : 1) * sizeof *names);
        if (names) {
            for (size_t i = 0; i < l.n; i++) names[i] = l.files[i].path;
            const char *quants[] = {"", "Q4_K_M", "q8_0", "x.gguf"};
            for (size_t q = 0; q < 4; q++) {
                size_t *idx = NULL, ni = 0;
                if (hub_select(names, l.n, quants[q], &idx, &ni, &e) == SMELT_OK) {
                    for (size_t k = 0; k < ni; k++)
                        if (idx[k] >= l.n || !hub_valid_relpath(names[idx[k]])) abort();
                }
                free(idx);
            }
            free(names);
        }
        hub_listing_free(&l);
    }
    /* the same bytes as a C string: a reference, an ETag, a Location */
    char s[1024];
    size_t n = size < sizeof s - 1 ? size : sizeof s - 1;
    memcpy(s, data, n);
    s[n] = 0;
    struct hub_ref r;
    if (hub_parse_ref(s, &r, &e) == SMELT_OK &&
        (!hub_valid_repo_id(r.repo) || !hub_valid_relpath(r.revision)))
        abort();
    char et[65], out[2048];
    if (hub_normalize_etag(s, et, sizeof et) && !(hub_is_hex(et, 40) || hub_is_hex(et, 64))) abort();
    if (hub_url_join("https://huggingface.co/org/repo/resolve/main/x.gguf", s, out, sizeof out)) {
        char o[300]; /* scheme + a host of at most 255 + port */
        if (!hub_url_origin(out, o, sizeof o)) abort();
    }
    char tag[256];
    hub_quant_tag(s, tag, sizeof tag);
    int no, count;
    size_t pl;
    if (hub_split_info(s, &no, &count, &pl) && (no < 1 || no > count || pl >= n)) abort();
    return 0;
}
