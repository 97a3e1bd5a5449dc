/* Models by name: the Hugging Face hub client and its shared on-disk cache.
 *
 * A reference "org/repo[:quant]" names a GGUF model on the hub (HF_ENDPOINT, default
 * https://huggingface.co). hub_pull downloads the model's file(s) into the standard
 * Hugging Face hub cache, laid out exactly as huggingface_hub lays it out, so a file fetched
 * by huggingface_hub or llama.cpp is found here without downloading again and vice versa:
 *
 *   $HF_HUB_CACHE/models--org--repo/
 *     blobs/<etag>                 the file's bytes; etag = sha256 hex (LFS) or git blob sha1
 *     blobs/<etag>.incomplete      a partial download (resumed with an HTTP Range request)
 *     snapshots/<commit>/<path>    relative symlink to ../../blobs/<etag>
 *     refs/main                    the commit the branch pointed to (40 hex, no newline)
 *   $HF_HUB_CACHE/.locks/models--org--repo/<etag>.lock   flock(2), as huggingface_hub's
 *
 * Contracts:
 * - a blob appears under its final name only after its size and hash are verified (it is
 *   written as <etag>.incomplete and renamed), so a finished-looking file is never partial;
 * - every name that comes from the hub (repo id, commit, etag, file path) is validated before
 *   it touches the file system; nothing is written outside the cache directory;
 * - the token is sent to the hub's own origin only, never to the content store it redirects
 *   to (the same rule as huggingface_hub's _is_same_or_hub_host);
 * - no call prints to stdout; progress goes to the caller's callback.
 */
#ifndef SMELT_HUB_HUB_H
#define SMELT_HUB_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define HUB_REPO_MAX 200   /* the hub's own limit on repo ids is 96 chars per part */
#define HUB_QUANT_MAX 256  /* a quant tag, or a file name ending in .gguf */
#define HUB_REV_MAX 256
#define HUB_PATH_MAX 4096
#define HUB_DEFAULT_QUANT "Q4_K_M"

/* A parsed model reference. */
struct hub_ref {
    char repo[HUB_REPO_MAX];      /* "org/name" */
    char quant[HUB_QUANT_MAX];    /* "" = default (Q4_K_M, else the repo's only model) */
    char revision[HUB_REV_MAX];   /* branch, tag or commit; "main" by default */
};

/* Parses "org/repo[:quant][@revision]" (an "hf.co/" or "huggingface.co/" prefix is
 * accepted). SMELT_ERR_INVALID with the reason when s is not such a reference. */
smelt_status hub_parse_ref(const char *s, struct hub_ref *r, struct err *e);
/* "org/repo[:quant]" as the user would type it (quant shown when given). */
void hub_ref_str(const struct hub_ref *r, char *out, size_t n);

/* Progress of one file's transfer, reported about ten times a second and once at the end. */
struct hub_progress {
    const char *file;  /* the file's path in the repo */
    int index, count;  /* file index (1-based) of count files being fetched */
    uint64_t done;     /* bytes of the file on disk, a resumed prefix included */
    uint64_t total;    /* the file's size; 0 when unknown */
    uint64_t resumed;  /* bytes that were already on disk when this transfer began */
    double elapsed;    /* seconds since this transfer began */
    bool finished;     /* last report for this file */
};
typedef void (*hub_progress_fn)(void *ctx, const struct hub_progress *p);

struct hub_opts {
    char endpoint[512];       /* no trailing slash */
    char cache[HUB_PATH_MAX]; /* the hub cache directory */
    char token[1024];         /* "" = anonymous */
    bool offline;             /* HF_HUB_OFFLINE: the cache alone, no network */
    long connect_timeout_s;   /* give up connecting after this */
    long stall_timeout_s;     /* abort a transfer that moves no byte for this long */
    int max_attempts;         /* tries per request on transient errors (cut, 5xx, 429) */
    long max_retry_after_s;   /* a 429 asking to wait longer than this fails at once */
    bool validate_gguf;       /* open the pulled model with gguf_open before returning */
    hub_progress_fn progress; /* may be NULL */
    void *progress_ctx;
};

/* Fills o from the environment, as huggingface_hub reads it:
 *   cache:    HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
 *             $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub
 *   endpoint: HF_ENDPOINT (default https://huggingface.co)
 *   token:    HF_TOKEN (or HUGGING_FACE_HUB_TOKEN), else the file $HF_TOKEN_PATH, else
 *             $HF_HOME/token (what `hf auth login` writes)
 *   offline:  HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) in {1, ON, YES, TRUE}
 *   timeouts: HF_HUB_DOWNLOAD_TIMEOUT seconds without progress (default 10)
 * Defaults: 3 attempts, Retry-After up to 60 s, validate_gguf on, no progress callback. */
smelt_status hub_opts_from_env(struct hub_opts *o, struct err *e);

/* The local path of ref's model (its first file for a split set) when every file of it is
 * in the cache: refs/<revision> -> snapshots/<commit> -> the quant's file(s). No network.
 * SMELT_ERR_NOT_FOUND (with what is cached) when absent. */
smelt_status hub_find_cached(const struct hub_opts *o, const struct hub_ref *r, char *path,
                             size_t n, struct err *e);

/* Resolves ref on the hub (the revision's commit and file list), downloads the missing
 * file(s) of the chosen quant with resume, verifies each, links them into the snapshot,
 * updates refs/<revision>, validates the GGUF, and returns the local path of the (first)
 * file. With o->offline it is hub_find_cached. */
smelt_status hub_pull(const struct hub_opts *o, const struct hub_ref *r, char *path, size_t n,
                      struct err *e);

/* Picks a model among GGUF file names (repo-relative paths) by quant, for a repo listing,
 * a snapshot or a local directory:
 * - quant ending in ".gguf": that file (case-insensitive, full path or base name);
 * - quant given: the files whose path holds the tag case-insensitively as a whole word
 *   ("Q4_K_M" matches "x-q4_k_m.gguf" and "x.Q4_K_M-00001-of-00002.gguf", not "x-Q4_K.gguf");
 * - quant "": Q4_K_M when present, else the only model in the list.
 * Split sets (NAME-00001-of-0000N.gguf) are taken whole, first part first; projector and
 * imatrix files (mmproj, imatrix) are never picked as the model. On success *idx holds *nidx
 * indices into names (malloc'd; the caller frees). Errors: SMELT_ERR_NOT_FOUND naming the
 * quants that are there; SMELT_ERR_FORMAT for an incomplete split set. */
smelt_status hub_select(const char *const *names, size_t n, const char *quant, size_t **idx,
                        size_t *nidx, struct err *e);

/* The model in a local directory tree (a snapshot, a folder of GGUFs), chosen by
 * hub_select with quant ("" = the default rule); path gets "<dir>/<file>". */
smelt_status hub_find_in_dir(const char *dir, const char *quant, char *path, size_t n,
                             struct err *e);

#endif
