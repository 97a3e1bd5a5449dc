/* Internals of the hub layer shared between its files (and its unit tests): name
 * validation, the cache layout, the libcurl session, the listing parser. */
#ifndef SMELT_HUB_INTERNAL_H
#define SMELT_HUB_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hub/hub.h"

/* ---- names (ref.c) ---- */

/* "org/name": each part 1..96 of [A-Za-z0-9_.-], not starting or ending with '-' or '.',
 * no "--" or "..", not ending in ".git" (huggingface_hub's validate_repo_id, ASCII only). */
bool hub_valid_repo_id(const char *s);
/* A repo-relative file path that is safe to join under a directory: '/'-separated
 * segments, none empty, "." or "..", no backslash, colon, NUL or control character, not
 * absolute, at most 1000 bytes and 32 segments. Also used for revision names. */
bool hub_valid_relpath(const char *s);
/* Exactly len lowercase hex digits. */
bool hub_is_hex(const char *s, size_t len);
/* Strips W/ and quotes from an ETag header value into out; false when the result is not
 * 40 or 64 lowercase hex digits (the only etags a blob may be named by). */
bool hub_normalize_etag(const char *v, char *out, size_t n);

/* ---- selection helpers (select.c) ---- */

/* Parses "PREFIX-NNNNN-of-MMMMM.gguf" (5 digits each). Returns true with *no, *count and
 * the prefix length when path is a split part. */
bool hub_split_info(const char *path, int *no, int *count, size_t *prefix_len);
/* The quant tag of a GGUF file name (the last '-' or '.' separated word of the base name,
 * split suffix and ".gguf" removed), upper-cased; "" when none. */
void hub_quant_tag(const char *path, char *out, size_t n);
/* Case-insensitive search of tag in path as a whole word: the character before is not
 * alphanumeric and the one after is neither alphanumeric nor '_'. */
bool hub_quant_matches(const char *path, const char *tag);
/* True for a name ending in ".gguf" (any case) that is not a projector or imatrix. */
bool hub_is_model_gguf(const char *path);

/* ---- cache layout (cache.c) ---- */

/* <cache>/models--org--repo (repo must be valid). */
smelt_status hub_repo_dir(const char *cache, const char *repo, char *out, size_t n,
                          struct err *e);
/* Reads refs/<rev> into commit (41 bytes). SMELT_ERR_NOT_FOUND when absent, FORMAT when
 * it does not hold a commit hash. A rev that is itself a commit hash is returned as is. */
smelt_status hub_read_ref(const char *repo_dir, const char *rev, char commit[41], struct err *e);
/* Writes refs/<rev> = commit atomically (no newline, as huggingface_hub writes it). */
smelt_status hub_write_ref(const char *repo_dir, const char *rev, const char *commit,
                           struct err *e);
/* The repo-relative paths of the regular files of snapshots/<commit> (symlinks to regular
 * files count; symlinked directories are not followed). *names is malloc'd, each entry too. */
smelt_status hub_snapshot_files(const char *repo_dir, const char *commit, char ***names,
                                size_t *n, struct err *e);
/* The same for any directory tree (relative paths under root, sorted). */
smelt_status hub_list_files(const char *root, char ***names, size_t *n, struct err *e);
void hub_free_names(char **names, size_t n);
/* Creates snapshots/<commit>/<relpath> as a relative symlink to blobs/<etag>, making the
 * directories (refusing to pass through a symlinked directory). An existing correct link
 * is kept; a wrong one is replaced atomically. */
smelt_status hub_link_snapshot(const char *repo_dir, const char *commit, const char *relpath,
                               const char *etag, struct err *e);
/* mkdir -p (mode 0755 minus umask). */
smelt_status hub_mkdirs(const char *path, struct err *e);
/* Takes the exclusive flock on <cache>/.locks/<repo folder>/<etag>.lock, waiting for
 * another process that holds it. Returns the fd to pass to hub_unlock, or -1 with e set. */
int hub_lock(const char *cache, const char *repo, const char *etag, struct err *e);
void hub_unlock(int fd);
/* Writes <cache>/CACHEDIR.TAG when absent (as huggingface_hub does); errors are ignored. */
void hub_cachedir_tag(const char *cache);

/* ---- HTTP (http.c): one libcurl easy handle per session, redirects followed by hand ---- */

struct hub_http;

struct hub_resp {
    long status;          /* HTTP status; 0 when the transfer failed before one arrived */
    int curl_code;        /* CURLcode of the transfer (0 = ok) */
    char curl_msg[256];   /* libcurl's error text when curl_code != 0 */
    bool aborted;         /* the body sink or on_start asked to stop */
    char *hdrs;           /* the final response's header block, "name: value\n"... */
    size_t hdrs_len;
    char *body;           /* for status >= 300, or for mem_cap requests: the body */
    size_t body_len;
    uint64_t body_bytes;  /* bytes of body received */
};

struct hub_req {
    const char *url;
    bool head;                 /* HEAD instead of GET */
    bool auth;                 /* send Authorization: Bearer <token> */
    uint64_t range_from;       /* > 0: ask for bytes range_from.. */
    size_t mem_cap;            /* > 0: collect a 2xx body in memory, fail past this size */
    /* Streaming a 2xx body: on_start is called once before the first byte (or at the end
     * when the body is empty) with the status and headers; sink gets every chunk. Either
     * returns false to abort the transfer. */
    bool (*on_start)(void *ctx, const struct hub_resp *r);
    bool (*sink)(void *ctx, const void *p, size_t n);
    void *ctx;
};

smelt_status hub_http_new(struct hub_http **out, const struct hub_opts *o, struct err *e);
void hub_http_free(struct hub_http *h);
/* Performs one request (no redirect following). Returns SMELT_OK when a response (any
 * status) arrived, SMELT_ERR_NETWORK with resp->curl_code set when the transfer failed.
 * resp is reset first and must be released with hub_resp_free. */
smelt_status hub_http_do(struct hub_http *h, const struct hub_req *q, struct hub_resp *resp,
                         struct err *e);
void hub_resp_free(struct hub_resp *r);
/* Value of header name (case-insensitive) of the final response, copied into out; false
 * when absent. */
bool hub_resp_header(const struct hub_resp *r, const char *name, char *out, size_t n);

/* Origin (scheme://host:port, lower-cased, default port filled in) of an absolute http(s)
 * URL; false for other URLs. */
bool hub_url_origin(const char *url, char *out, size_t n);
/* Resolves a Location header against base (absolute http(s) URL, or "/path" on base's
 * origin). False for other schemes or malformed values. */
bool hub_url_join(const char *base, const char *loc, char *out, size_t n);
/* Percent-encodes s for a URL path; keep_slash leaves '/' as is. False when out is short. */
bool hub_url_escape(const char *s, bool keep_slash, char *out, size_t n);

/* ---- git blob ids (gitsha1.c) ---- */

/* sha1("blob <n>\0" data): the id git (and the hub's ETag) gives a non-LFS file. */
void hub_git_blob_sha1_mem(const void *data, size_t n, char out[41]);
smelt_status hub_git_blob_sha1_file(const char *path, char out[41], struct err *e);

/* ---- the repo listing (pull.c) ---- */

struct hub_file {
    char *path;          /* repo-relative path as the hub lists it */
    uint64_t size;       /* 0 with has_size false when absent */
    bool has_size;
    char sha256[65];     /* LFS sha256, "" when not an LFS file */
};

struct hub_listing {
    char commit[41];
    struct hub_file *files;
    size_t n;
};

/* Parses the JSON of GET /api/models/{repo}/revision/{rev}?blobs=true:
 *   {"sha": "<40 hex>", "siblings": [{"rfilename": "...", "size": N,
 *                                     "lfs": {"sha256": "<64 hex>", "size": N}}, ...]}
 * Unknown keys are ignored. GGUF names that are unsafe (hub_valid_relpath) are an error;
 * other unsafe names are dropped (they are never written). */
smelt_status hub_parse_listing(const char *json, size_t len, struct hub_listing *l,
                               struct err *e);
void hub_listing_free(struct hub_listing *l);

#endif
