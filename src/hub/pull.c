/* hub_pull: a model reference -> verified file(s) in the shared hub cache.
 *
 * The requests, the same ones huggingface_hub makes (so one fake hub serves both in tests):
 *   1. GET  {endpoint}/api/models/{repo}/revision/{rev}?blobs=true
 *        -> {"sha": commit, "siblings": [{"rfilename", "size", "lfs": {"sha256", "size"}}]}
 *      (one unpaginated answer holding every file, its size and LFS sha256)
 *   2. HEAD {endpoint}/{repo}/resolve/{commit}/{path}   (redirects on the hub's own origin
 *      followed) -> X-Repo-Commit, X-Linked-Etag / ETag, X-Linked-Size / Content-Length, and
 *      for LFS files a 302 whose Location is the content store
 *   3. GET  <Location> with "Range: bytes=N-" when blobs/<etag>.incomplete holds N bytes.
 * The token goes with requests to the hub's origin (and huggingface.co / hf.co), never to
 * the content store: huggingface_hub drops it there too (file_download.py, "Remove
 * authorization header when downloading a LFS blob from a CDN").
 *
 * Every number the server gives is cross-checked: the listing's sha256 and size against the
 * resolve headers, Content-Range against the resume offset, Content-Length against the
 * remaining bytes, the byte count against the size, the bytes' sha256 against the etag.
 * A transfer that breaks (connection cut, stall, 5xx, 429) is retried from where it stopped,
 * at most max_attempts times in a row without progress; a lying answer fails at once.
 * Redirects are capped at MAX_REDIRECTS hops per file.
 *
 * A pulled GGUF that fails gguf_open is reported as an error but kept: its bytes are what
 * the hub publishes (the hash matched), so deleting it would only make the next pull fetch
 * the same bytes again. The error says where it is. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "format/gguf.h"
#include "hub/hub_internal.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/sha256.h"

#define MAX_REDIRECTS 10
#define LISTING_CAP (64u << 20)
#define URL_MAX 8192

/* ---- options from the environment ---- */

static const char *env(const char *name) {
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

static bool env_true(const char *name) {
    const char *v = env(name);
    if (!v) return false;
    return !strcasecmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") ||
           !strcasecmp(v, "true");
}

/* Copies v into out with a leading "~/" expanded to $HOME; false when it does not fit. */
static bool expand_home(const char *v, const char *suffix, char *out, size_t n) {
    const char *home = env("HOME");
    int w;
    if (v[0] == '~' && (v[1] == '/' || v[1] == 0) && home)
        w = snprintf(out, n, "%s%s%s", home, v + 1, suffix);
    else
        w = snprintf(out, n, "%s%s", v, suffix);
    return w >= 0 && (size_t)w < n;
}

static void read_token_file(const char *path, char *out, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t got = fread(out, 1, n - 1, f);
    fclose(f);
    out[got] = 0;
    while (got && (out[got - 1] == '\n' || out[got - 1] == '\r' || out[got - 1] == ' '))
        out[--got] = 0;
}

smelt_status hub_opts_from_env(struct hub_opts *o, struct err *e) {
    memset(o, 0, sizeof *o);
    const char *v;
    bool ok;
    char home[HUB_PATH_MAX] = "";
    if ((v = env("HF_HOME"))) ok = expand_home(v, "", home, sizeof home);
    else if ((v = env("XDG_CACHE_HOME"))) ok = expand_home(v, "/huggingface", home, sizeof home);
    else if ((v = env("HOME"))) ok = expand_home(v, "/.cache/huggingface", home, sizeof home);
    else return err_set(e, SMELT_ERR_INVALID, "cannot place the hub cache: set HF_HUB_CACHE, HF_HOME or HOME");
    if (!ok) return err_set(e, SMELT_ERR_RANGE, "HF_HOME path too long");

    if ((v = env("HF_HUB_CACHE")) || (v = env("HUGGINGFACE_HUB_CACHE")))
        ok = expand_home(v, "", o->cache, sizeof o->cache);
    else
        ok = expand_home(home, "/hub", o->cache, sizeof o->cache);
    if (!ok) return err_set(e, SMELT_ERR_RANGE, "hub cache path too long");

    v = env("HF_ENDPOINT");
    if (!v) v = "https://huggingface.co";
    if (strlen(v) >= sizeof o->endpoint)
        return err_set(e, SMELT_ERR_RANGE, "HF_ENDPOINT too long");
    strcpy(o->endpoint, v);
    size_t el = strlen(o->endpoint);
    while (el && o->endpoint[el - 1] == '/') o->endpoint[--el] = 0;
    char origin[600];
    if (!hub_url_origin(o->endpoint, origin, sizeof origin))
        return err_set(e, SMELT_ERR_INVALID, "HF_ENDPOINT '%s' is not an http(s) URL", o->endpoint);

    if ((v = env("HF_TOKEN")) || (v = env("HUGGING_FACE_HUB_TOKEN"))) {
        if (strlen(v) >= sizeof o->token) return err_set(e, SMELT_ERR_RANGE, "HF_TOKEN too long");
        strcpy(o->token, v);
    } else {
        char tp[HUB_PATH_MAX];
        if ((v = env("HF_TOKEN_PATH")) ? expand_home(v, "", tp, sizeof tp)
                                       : expand_home(home, "/token", tp, sizeof tp))
            read_token_file(tp, o->token, sizeof o->token);
    }

    o->offline = env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE");
    o->connect_timeout_s = 10;
    o->stall_timeout_s = 10;
    if ((v = env("HF_HUB_DOWNLOAD_TIMEOUT"))) {
        long t = strtol(v, NULL, 10);
        if (t > 0) o->stall_timeout_s = t;
    }
    o->max_attempts = 3;
    o->max_retry_after_s = 60;
    o->validate_gguf = true;
    return SMELT_OK;
}

/* ---- small helpers ---- */

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Copies server-provided text for an error message: printable ASCII only, truncated. */
static void sanitize(const char *s, size_t len, char *out, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < len && s[i] && o + 1 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    out[o] = 0;
}

/* snprintf that reports truncation (false) instead of cutting a path or URL short. */
__attribute__((format(printf, 3, 4))) static bool fmt(char *out, size_t n, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int w = vsnprintf(out, n, f, ap);
    va_end(ap);
    return w >= 0 && (size_t)w < n;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return false;
        if (v > (UINT64_MAX - 9) / 10) return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return true;
}

/* ---- the listing ---- */

void hub_listing_free(struct hub_listing *l) {
    for (size_t i = 0; i < l->n; i++) free(l->files[i].path);
    free(l->files);
    memset(l, 0, sizeof *l);
}

static bool json_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t i = json_integer_value(v);
    if (i < 0) return false;
    *out = (uint64_t)i;
    return true;
}

smelt_status hub_parse_listing(const char *json, size_t len, struct hub_listing *l,
                               struct err *e) {
    memset(l, 0, sizeof *l);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root) return err_set(e, SMELT_ERR_FORMAT, "repo listing is not JSON: %s (line %d)", jerr.text, jerr.line);
    smelt_status st = SMELT_OK;
    json_t *sha = json_object_get(root, "sha");
    json_t *sibs = json_object_get(root, "siblings");
    if (!json_is_string(sha) || !hub_is_hex(json_string_value(sha), 40)) {
        st = err_set(e, SMELT_ERR_FORMAT, "repo listing has no valid 'sha' commit hash");
        goto out;
    }
    memcpy(l->commit, json_string_value(sha), 41);
    if (!json_is_array(sibs)) {
        st = err_set(e, SMELT_ERR_FORMAT, "repo listing has no 'siblings' array");
        goto out;
    }
    size_t cap = json_array_size(sibs);
    l->files = calloc(cap ? cap : 1, sizeof *l->files);
    if (!l->files) {
        st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < cap; i++) {
        json_t *s = json_array_get(sibs, i);
        json_t *name = json_object_get(s, "rfilename");
        if (!json_is_object(s) || !json_is_string(name)) {
            st = err_set(e, SMELT_ERR_FORMAT, "repo listing: sibling %zu has no 'rfilename'", i);
            goto out;
        }
        const char *nm = json_string_value(name);
        size_t nl = json_string_length(name);
        bool gguf = nl >= 5 && !strcasecmp(nm + nl - 5, ".gguf");
        if (strlen(nm) != nl || !hub_valid_relpath(nm)) {
            if (gguf) {
                char shown[120];
                sanitize(nm, nl, shown, sizeof shown);
                st = err_set(e, SMELT_ERR_FORMAT, "the hub lists an unsafe file name '%s' (an "
                             "absolute path, '..', a backslash or a control character): refusing", shown);
                goto out;
            }
            continue; /* never written, so harmless: drop it */
        }
        struct hub_file *f = &l->files[l->n];
        json_t *lfs = json_object_get(s, "lfs");
        uint64_t sz = 0, lsz = 0;
        bool has_sz = json_u64(json_object_get(s, "size"), &sz);
        if (json_is_object(lfs)) {
            json_t *h = json_object_get(lfs, "sha256");
            if (!json_is_string(h) || !hub_is_hex(json_string_value(h), 64)) {
                st = err_set(e, SMELT_ERR_FORMAT, "repo listing: %s has no valid lfs.sha256", nm);
                goto out;
            }
            memcpy(f->sha256, json_string_value(h), 65);
            if (json_u64(json_object_get(lfs, "size"), &lsz)) {
                if (has_sz && sz != lsz) {
                    st = err_set(e, SMELT_ERR_FORMAT, "repo listing: %s has size %llu and lfs.size %llu",
                                 nm, (unsigned long long)sz, (unsigned long long)lsz);
                    goto out;
                }
                sz = lsz;
                has_sz = true;
            }
        }
        f->size = sz;
        f->has_size = has_sz;
        f->path = strdup(nm);
        if (!f->path) {
            st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
            goto out;
        }
        l->n++;
    }
out:
    json_decref(root);
    if (st) hub_listing_free(l);
    return st;
}

/* ---- a pull in progress ---- */

struct pull {
    const struct hub_opts *o;
    const struct hub_ref *r;
    struct hub_http *http;
    char repo_dir[HUB_PATH_MAX];
    char commit[41];
    char hub_origin[600];
};

/* Whether url may carry the token: the hub's origin, or huggingface.co / hf.co. */
static bool auth_ok(const struct pull *p, const char *url) {
    char o[600];
    if (!hub_url_origin(url, o, sizeof o)) return false;
    return !strcmp(o, p->hub_origin) || !strcmp(o, "https://huggingface.co:443") ||
           !strcmp(o, "https://hf.co:443");
}

/* The hub's explanation of an error, from X-Error-Message or a JSON {"error": "..."} body. */
static void server_message(const struct hub_resp *r, char *out, size_t n) {
    char v[300];
    out[0] = 0;
    if (hub_resp_header(r, "X-Error-Message", v, sizeof v)) {
        sanitize(v, strlen(v), out, n);
        return;
    }
    if (r->body && r->body_len) {
        json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
        json_t *m = j ? json_object_get(j, "error") : NULL;
        if (json_is_string(m)) sanitize(json_string_value(m), json_string_length(m), out, n);
        json_decref(j);
    }
}

/* Turns a final non-2xx status into a clear error naming what was asked. */
static smelt_status status_error(const struct pull *p, const struct hub_resp *r,
                                 const char *what, struct err *e) {
    char msg[200], code[64] = "";
    server_message(r, msg, sizeof msg);
    hub_resp_header(r, "X-Error-Code", code, sizeof code);
    char tail[240] = "";
    if (msg[0]) snprintf(tail, sizeof tail, " (hub says: %s)", msg);
    bool tok = p->o->token[0] != 0;
    switch (r->status) {
    case 401:
        if (tok)
            return err_set(e, SMELT_ERR_NETWORK, "%s: HTTP 401: the token (HF_TOKEN) was refused, or "
                           "%s does not exist or is private%s", what, p->r->repo, tail);
        return err_set(e, SMELT_ERR_NETWORK, "%s: HTTP 401: authentication required: %s is gated or "
                       "private (or does not exist); set HF_TOKEN to a token with access%s",
                       what, p->r->repo, tail);
    case 403:
        return err_set(e, SMELT_ERR_NETWORK, "%s: HTTP 403: access to %s is not granted to %s; if it "
                       "is gated, accept its conditions at %s/%s%s", what, p->r->repo,
                       tok ? "this token" : "anonymous users (set HF_TOKEN)", p->o->endpoint,
                       p->r->repo, tail);
    case 404:
        if (!strcmp(code, "RevisionNotFound"))
            return err_set(e, SMELT_ERR_NOT_FOUND, "%s: HTTP 404: revision '%s' not found in %s%s",
                           what, p->r->revision, p->r->repo, tail);
        if (!strcmp(code, "EntryNotFound"))
            return err_set(e, SMELT_ERR_NOT_FOUND, "%s: HTTP 404: file not found in %s%s", what,
                           p->r->repo, tail);
        return err_set(e, SMELT_ERR_NOT_FOUND, "%s: HTTP 404: %s not found on %s%s", what,
                       p->r->repo, p->o->endpoint, tail);
    case 429:
        return err_set(e, SMELT_ERR_NETWORK, "%s: HTTP 429: rate limited by the hub; try again "
                       "later%s", what, tail);
    default:
        return err_set(e, SMELT_ERR_NETWORK, "%s: HTTP %ld%s", what, r->status, tail);
    }
}

/* Seconds to wait before retrying a 429/503 (Retry-After in seconds; an HTTP date or a
 * missing header counts as the default). */
static double retry_after(const struct hub_resp *r, double dflt) {
    char v[64];
    uint64_t s;
    if (hub_resp_header(r, "Retry-After", v, sizeof v) && parse_u64(v, &s)) return (double)s;
    return dflt;
}

static bool transient_status(long s) { return s == 408 || s == 429 || s >= 500; }

/* Waits before attempt k (1-based retries): Retry-After when given, else 1, 2, 4.. s.
 * Fails when the server asks for more than max_retry_after_s. */
static smelt_status backoff(const struct pull *p, const struct hub_resp *r, int k,
                            const char *what, struct err *e) {
    double d = 1.0;
    for (int i = 1; i < k && d < 8; i++) d *= 2;
    if (r && (r->status == 429 || r->status == 503)) {
        d = retry_after(r, d);
        if (d > (double)p->o->max_retry_after_s)
            return err_set(e, SMELT_ERR_NETWORK, "%s: HTTP %ld: the hub asks to retry after %.0f s "
                           "(over the %ld s this waits); try again later", what, r->status, d,
                           p->o->max_retry_after_s);
    }
    log_info("%s: retrying in %.0f s", what, d);
    sleep_s(d);
    return SMELT_OK;
}

/* A request that is retried on network errors and transient statuses. On SMELT_OK the
 * response (any non-transient status, 3xx included) is in resp. */
static smelt_status request(struct pull *p, const struct hub_req *q, struct hub_resp *resp,
                            const char *what, struct err *e) {
    for (int k = 1;; k++) {
        smelt_status st = hub_http_do(p->http, q, resp, e);
        bool transient = st == SMELT_ERR_NETWORK || (st == SMELT_OK && transient_status(resp->status));
        if (!transient) {
            if (st) err_prefix(e, "%s", what);
            return st;
        }
        if (k >= p->o->max_attempts) {
            if (st == SMELT_OK) st = status_error(p, resp, what, e);
            else err_prefix(e, "%s: giving up after %d attempts", what, k);
            hub_resp_free(resp);
            return st;
        }
        if (st == SMELT_OK) log_warn("%s: HTTP %ld", what, resp->status);
        else log_warn("%s: %s", what, e->msg);
        st = backoff(p, st == SMELT_OK ? resp : NULL, k, what, e);
        hub_resp_free(resp);
        if (st) return st;
    }
}

static smelt_status get_listing(struct pull *p, struct hub_listing *l, struct err *e) {
    char rev[HUB_REV_MAX * 3], url[URL_MAX];
    if (!hub_url_escape(p->r->revision, false, rev, sizeof rev))
        return err_set(e, SMELT_ERR_RANGE, "revision too long");
    if (!fmt(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", p->o->endpoint,
             p->r->repo, rev))
        return err_set(e, SMELT_ERR_RANGE, "URL too long");
    char what[600];
    fmt(what, sizeof what, "listing %s@%s", p->r->repo, p->r->revision);
    struct hub_req q = {.url = url, .auth = auth_ok(p, url), .mem_cap = LISTING_CAP};
    struct hub_resp resp;
    smelt_status st = request(p, &q, &resp, what, e);
    if (st) return st;
    if (resp.status != 200) {
        st = status_error(p, &resp, what, e);
        hub_resp_free(&resp);
        return st;
    }
    st = hub_parse_listing(resp.body ? resp.body : "", resp.body_len, l, e);
    hub_resp_free(&resp);
    if (st) err_prefix(e, "%s", what);
    return st;
}

/* What HEAD on the resolve URL says about one file. */
struct file_meta {
    char etag[65];
    uint64_t size;
    bool has_size;
    char url[URL_MAX]; /* where the bytes are */
};

static smelt_status resolve_file(struct pull *p, const struct hub_file *f, int *hops,
                                 struct file_meta *m, struct err *e) {
    char path[HUB_PATH_MAX * 3], url[URL_MAX];
    if (!hub_url_escape(f->path, true, path, sizeof path)) return err_set(e, SMELT_ERR_RANGE, "path too long");
    if (!fmt(url, sizeof url, "%s/%s/resolve/%s/%s", p->o->endpoint, p->r->repo, p->commit, path))
        return err_set(e, SMELT_ERR_RANGE, "URL too long");
    char what[HUB_PATH_MAX + 64];
    fmt(what, sizeof what, "resolving %s", f->path);
    char origin[600], v[256];
    if (!hub_url_origin(url, origin, sizeof origin)) return err_set(e, SMELT_ERR_INVALID, "bad URL %s", url);
    for (;;) {
        struct hub_req q = {.url = url, .head = true, .auth = auth_ok(p, url)};
        struct hub_resp r;
        smelt_status st = request(p, &q, &r, what, e);
        if (st) return st;
        if (r.status >= 300 && r.status < 400 && r.status != 304) {
            char loc[URL_MAX], next[URL_MAX], no[600];
            if (!hub_resp_header(&r, "Location", loc, sizeof loc) || !hub_url_join(url, loc, next, sizeof next)) {
                hub_resp_free(&r);
                return err_set(e, SMELT_ERR_FORMAT, "%s: HTTP %ld redirect without a usable "
                               "http(s) Location", what, r.status);
            }
            if (++*hops > MAX_REDIRECTS) {
                hub_resp_free(&r);
                return err_set(e, SMELT_ERR_NETWORK, "%s: more than %d redirects (a redirect loop?)",
                               what, MAX_REDIRECTS);
            }
            bool same = hub_url_origin(next, no, sizeof no) && !strcmp(no, origin);
            if (same) { /* a move on the hub itself (a renamed repo): follow */
                strcpy(url, next);
                hub_resp_free(&r);
                continue;
            }
            /* off to the content store: this response carries the file's metadata */
            strcpy(m->url, next);
        } else if (r.status >= 200 && r.status < 300) {
            strcpy(m->url, url);
        } else {
            st = status_error(p, &r, what, e);
            hub_resp_free(&r);
            return st;
        }
        /* commit, etag and size */
        if (!hub_resp_header(&r, "X-Repo-Commit", v, sizeof v)) {
            hub_resp_free(&r);
            return err_set(e, SMELT_ERR_FORMAT, "%s: the answer has no X-Repo-Commit header: is "
                           "HF_ENDPOINT (%s) a Hugging Face hub?", what, p->o->endpoint);
        }
        if (strcmp(v, p->commit)) {
            char shown[80];
            sanitize(v, strlen(v), shown, sizeof shown);
            hub_resp_free(&r);
            return err_set(e, SMELT_ERR_FORMAT, "%s: asked for commit %s, the hub answered %s",
                           what, p->commit, shown);
        }
        char raw[256];
        if (!hub_resp_header(&r, "X-Linked-Etag", raw, sizeof raw) &&
            !hub_resp_header(&r, "ETag", raw, sizeof raw)) {
            hub_resp_free(&r);
            return err_set(e, SMELT_ERR_FORMAT, "%s: the answer has no ETag: cannot verify the file", what);
        }
        if (!hub_normalize_etag(raw, m->etag, sizeof m->etag)) {
            char shown[100];
            sanitize(raw, strlen(raw), shown, sizeof shown);
            hub_resp_free(&r);
            return err_set(e, SMELT_ERR_FORMAT, "%s: unusable ETag '%s' (want a sha256 or git sha1)",
                           what, shown);
        }
        bool redirected = r.status >= 300;
        m->has_size = (hub_resp_header(&r, "X-Linked-Size", v, sizeof v) ||
                       (!redirected && hub_resp_header(&r, "Content-Length", v, sizeof v)));
        if (m->has_size && !parse_u64(v, &m->size)) {
            hub_resp_free(&r);
            return err_set(e, SMELT_ERR_FORMAT, "%s: bad size header '%.40s'", what, v);
        }
        hub_resp_free(&r);
        break;
    }
    if (f->sha256[0] && strcmp(f->sha256, m->etag))
        return err_set(e, SMELT_ERR_FORMAT, "%s: the listing says sha256 %s, the file's etag is %s",
                       what, f->sha256, m->etag);
    if (f->has_size && m->has_size && f->size != m->size)
        return err_set(e, SMELT_ERR_FORMAT, "%s: the listing says %llu bytes, the resolve answer %llu",
                       what, (unsigned long long)f->size, (unsigned long long)m->size);
    if (!m->has_size && f->has_size) {
        m->size = f->size;
        m->has_size = true;
    }
    return SMELT_OK;
}

/* State of one blob transfer, shared with the libcurl callbacks. */
struct dl {
    struct pull *p;
    const char *name; /* repo path, for messages */
    int fd;
    uint64_t have;     /* bytes on disk when this request started */
    uint64_t pos;      /* bytes on disk now */
    uint64_t expect;   /* the file's size, when known */
    bool has_expect;
    bool hashing;      /* the etag is a sha256: hash while streaming */
    struct sha256 sha;
    bool fatal;        /* the server lied (or the disk failed): do not retry */
    bool keep;         /* with fatal: the bytes on disk are good (a write error), keep them */
    char why[400];     /* reason of an abort from a callback */
    struct hub_progress prog;
    double t0, last_report;
};

static void report(struct dl *d, bool finished) {
    const struct hub_opts *o = d->p->o;
    if (!o->progress) return;
    double t = clock_now();
    if (!finished && t - d->last_report < 0.1) return;
    d->last_report = t;
    d->prog.done = d->pos;
    d->prog.elapsed = t - d->t0;
    d->prog.finished = finished;
    o->progress(o->progress_ctx, &d->prog);
}

/* Re-reads the first n bytes of the partial file into the running hash. */
static bool rehash_prefix(struct dl *d, uint64_t n) {
    sha256_init(&d->sha);
    char buf[1 << 15];
    uint64_t off = 0;
    while (off < n) {
        size_t want = n - off < sizeof buf ? (size_t)(n - off) : sizeof buf;
        ssize_t got = pread(d->fd, buf, want, (off_t)off);
        if (got <= 0) return false;
        sha256_update(&d->sha, buf, (size_t)got);
        off += (uint64_t)got;
    }
    return true;
}

static bool restart_at_zero(struct dl *d) {
    if (ftruncate(d->fd, 0) != 0) return false;
    d->have = d->pos = 0;
    sha256_init(&d->sha);
    return true;
}

static bool dl_start(void *ctx, const struct hub_resp *r) {
    struct dl *d = ctx;
    char v[128];
    if (r->status == 206) {
        uint64_t a, b, total;
        char *dash, *slash;
        if (!hub_resp_header(r, "Content-Range", v, sizeof v) || strncmp(v, "bytes ", 6) ||
            !(dash = strchr(v + 6, '-')) || !(slash = strchr(dash, '/'))) {
            snprintf(d->why, sizeof d->why, "206 answer without a valid Content-Range");
            d->fatal = true;
            return false;
        }
        *dash = 0;
        *slash = 0;
        if (!parse_u64(v + 6, &a) || !parse_u64(dash + 1, &b) || a != d->have || b < a ||
            (strcmp(slash + 1, "*") && (!parse_u64(slash + 1, &total) ||
                                        (d->has_expect && total != d->expect)))) {
            snprintf(d->why, sizeof d->why, "Content-Range does not fit the resume from byte %llu "
                     "of %llu", (unsigned long long)d->have, (unsigned long long)d->expect);
            d->fatal = true;
            return false;
        }
    } else if (r->status == 200) {
        if (d->have > 0) { /* the server ignored the Range: start over */
            log_info("%s: the server does not resume; downloading from the start", d->name);
            if (!restart_at_zero(d)) {
                snprintf(d->why, sizeof d->why, "cannot truncate the partial file: %s", strerror(errno));
                d->fatal = true;
                return false;
            }
        }
    } else {
        snprintf(d->why, sizeof d->why, "unexpected HTTP %ld for the file's bytes", r->status);
        d->fatal = true;
        return false;
    }
    uint64_t cl;
    if (d->has_expect && hub_resp_header(r, "Content-Length", v, sizeof v) && parse_u64(v, &cl) &&
        cl != d->expect - d->have) {
        snprintf(d->why, sizeof d->why, "the server announces %llu bytes from byte %llu, but the "
                 "file has %llu bytes (wrong size)", (unsigned long long)cl,
                 (unsigned long long)d->have, (unsigned long long)d->expect);
        d->fatal = true;
        return false;
    }
    d->prog.resumed = d->have;
    return true;
}

static bool dl_sink(void *ctx, const void *buf, size_t n) {
    struct dl *d = ctx;
    if (d->has_expect && (uint64_t)n > d->expect - d->pos) {
        snprintf(d->why, sizeof d->why, "the server sends more than the file's %llu bytes (wrong size)",
                 (unsigned long long)d->expect);
        d->fatal = true;
        return false;
    }
    const char *p = buf;
    size_t left = n;
    while (left) {
        ssize_t w = pwrite(d->fd, p, left, (off_t)d->pos);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            snprintf(d->why, sizeof d->why, "cannot write the partial file: %s", strerror(errno));
            d->fatal = d->keep = true;
            return false;
        }
        if (d->hashing) sha256_update(&d->sha, p, (size_t)w);
        p += w;
        left -= (size_t)w;
        d->pos += (uint64_t)w;
    }
    report(d, false);
    return true;
}

/* Downloads m->url into tmp_path (resuming), verifying size and hash. On success the file
 * is complete and verified; the caller renames it. */
static smelt_status download_blob(struct pull *p, const struct hub_file *f, const struct file_meta *m,
                                  const char *tmp_path, int *hops, int index, int count,
                                  bool *bad_resume, struct err *e) {
    *bad_resume = false;
    struct dl d = {.p = p, .name = f->path, .expect = m->size, .has_expect = m->has_size,
                   .hashing = hub_is_hex(m->etag, 64)};
    d.prog.file = f->path;
    d.prog.index = index;
    d.prog.count = count;
    d.prog.total = m->has_size ? m->size : 0;
    d.fd = open(tmp_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (d.fd < 0) return err_set(e, SMELT_ERR_IO, "cannot open %s: %s", tmp_path, strerror(errno));
    char what[HUB_PATH_MAX + 64];
    snprintf(what, sizeof what, "downloading %s", f->path);
    char url[URL_MAX];
    strcpy(url, m->url);
    smelt_status st = SMELT_OK;
    int idle = 0, total_attempts = 0;
    d.t0 = clock_now();
    struct stat first;
    bool had_prefix = fstat(d.fd, &first) == 0 && first.st_size > 0;
    if (m->has_size) { /* as huggingface_hub: warn, do not refuse, when space looks short */
        struct statvfs vfs;
        uint64_t need = m->size - (had_prefix && (uint64_t)first.st_size < m->size ? (uint64_t)first.st_size : 0);
        if (fstatvfs(d.fd, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < need)
            log_warn("%s needs %llu more bytes but the cache's disk has %llu free", f->path,
                     (unsigned long long)need, (unsigned long long)vfs.f_bavail * vfs.f_frsize);
    }
    for (;;) {
        struct stat sb;
        if (fstat(d.fd, &sb) != 0) {
            st = err_set(e, SMELT_ERR_IO, "cannot stat %s: %s", tmp_path, strerror(errno));
            break;
        }
        d.have = (uint64_t)sb.st_size;
        if (d.has_expect && d.have > d.expect) {
            log_info("%s: the partial file is longer than the file; starting over", f->path);
            restart_at_zero(&d);
        }
        d.pos = d.have;
        if (d.hashing && !rehash_prefix(&d, d.have)) {
            st = err_set(e, SMELT_ERR_IO, "cannot read %s", tmp_path);
            break;
        }
        if (d.has_expect && d.have == d.expect && d.have > 0) break; /* complete: verify */
        if (d.have) log_info("%s: resuming at byte %llu", f->path, (unsigned long long)d.have);
        struct hub_req q = {.url = url, .auth = auth_ok(p, url), .range_from = d.have,
                            .on_start = dl_start, .sink = dl_sink, .ctx = &d};
        struct hub_resp r;
        total_attempts++;
        smelt_status hs = hub_http_do(p->http, &q, &r, e);
        report(&d, false);
        if (d.fatal) {
            st = err_set(e, d.keep ? SMELT_ERR_IO : SMELT_ERR_FORMAT, "%s: %s", what, d.why);
            hub_resp_free(&r);
            /* a lying answer may have left bytes that are not the file's: drop them */
            if (!d.keep && ftruncate(d.fd, 0) != 0) log_debug("truncate %s failed", tmp_path);
            break;
        }
        bool progressed = d.pos > d.have;
        if (hs == SMELT_OK && r.status >= 300 && r.status < 400) {
            char loc[URL_MAX], next[URL_MAX];
            bool ok = hub_resp_header(&r, "Location", loc, sizeof loc) && hub_url_join(url, loc, next, sizeof next);
            long code = r.status;
            hub_resp_free(&r);
            if (!ok) {
                st = err_set(e, SMELT_ERR_FORMAT, "%s: HTTP %ld redirect without a usable http(s) "
                             "Location", what, code);
                break;
            }
            if (++*hops > MAX_REDIRECTS) {
                st = err_set(e, SMELT_ERR_NETWORK, "%s: more than %d redirects (a redirect loop?)",
                             what, MAX_REDIRECTS);
                break;
            }
            strcpy(url, next);
            total_attempts--;
            continue;
        }
        if (hs == SMELT_OK && r.status == 416) { /* our range is past the end: start over */
            hub_resp_free(&r);
            restart_at_zero(&d);
            if (++idle >= p->o->max_attempts) {
                st = err_set(e, SMELT_ERR_FORMAT, "%s: the server refuses every range (HTTP 416)", what);
                break;
            }
            continue;
        }
        if (hs == SMELT_OK && r.status >= 200 && r.status < 300) {
            hub_resp_free(&r);
            if (!d.has_expect || d.pos == d.expect) break; /* all there: verify */
            /* the body ended early without the transport noticing: resume */
            snprintf(d.why, sizeof d.why, "the transfer ended at byte %llu of %llu (truncated)",
                     (unsigned long long)d.pos, (unsigned long long)d.expect);
            err_set(e, SMELT_ERR_NETWORK, "%s", d.why);
        } else if (hs == SMELT_OK && !transient_status(r.status)) {
            st = status_error(p, &r, what, e);
            hub_resp_free(&r);
            break;
        } else if (hs == SMELT_OK) {
            err_set(e, SMELT_ERR_NETWORK, "HTTP %ld", r.status);
        } else if (d.has_expect && d.pos < d.expect && progressed) {
            snprintf(d.why, sizeof d.why, "%s at byte %llu of %llu", r.curl_msg,
                     (unsigned long long)d.pos, (unsigned long long)d.expect);
            err_set(e, SMELT_ERR_NETWORK, "%s", d.why);
        }
        /* a transient failure: retry from where the file stands */
        idle = progressed ? 0 : idle + 1;
        if (idle >= p->o->max_attempts || total_attempts >= 100) {
            char prev[ERR_MSG_MAX];
            snprintf(prev, sizeof prev, "%s", e->msg);
            st = err_set(e, SMELT_ERR_NETWORK, "%s: %s; giving up after %d attempts (the partial "
                         "file is kept and the next pull resumes it)", what, prev, total_attempts);
            hub_resp_free(&r);
            break;
        }
        log_warn("%s: %s", what, e->msg);
        st = backoff(p, hs == SMELT_OK ? &r : NULL, idle ? idle : 1, what, e);
        hub_resp_free(&r);
        if (st) break;
    }
    if (st == SMELT_OK) {
        report(&d, true);
        if (d.has_expect && d.pos != d.expect) {
            st = err_set(e, SMELT_ERR_FORMAT, "%s: got %llu bytes, expected %llu (wrong size)", what,
                         (unsigned long long)d.pos, (unsigned long long)d.expect);
            if (ftruncate(d.fd, 0) != 0) log_debug("truncate %s failed", tmp_path);
        }
    }
    if (st == SMELT_OK) {
        char got[65];
        if (d.hashing) {
            uint8_t dg[32];
            sha256_final(&d.sha, dg);
            sha256_hex(dg, got);
        } else {
            st = hub_git_blob_sha1_file(tmp_path, got, e);
        }
        if (st == SMELT_OK && strcmp(got, m->etag)) {
            st = err_set(e, SMELT_ERR_FORMAT, "%s: %s mismatch: the hub's etag is %s but the bytes "
                         "hash to %s; the download was discarded", what,
                         d.hashing ? "sha256" : "git sha1", m->etag, got);
            if (ftruncate(d.fd, 0) != 0) log_debug("truncate %s failed", tmp_path);
            close(d.fd);
            unlink(tmp_path);
            *bad_resume = had_prefix;
            return st;
        }
    }
    if (st == SMELT_OK && fsync(d.fd) != 0)
        st = err_set(e, SMELT_ERR_IO, "cannot sync %s: %s", tmp_path, strerror(errno));
    struct stat fin;
    bool empty = fstat(d.fd, &fin) == 0 && fin.st_size == 0;
    close(d.fd);
    if (st && empty) unlink(tmp_path); /* nothing worth resuming */
    return st;
}

static bool is_regular(const char *path, uint64_t *size) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return false;
    if (size) *size = (uint64_t)sb.st_size;
    return true;
}

/* Makes snapshots/<commit>/<f->path> present and verified, downloading when needed. */
static smelt_status fetch_file(struct pull *p, const struct hub_file *f, int index, int count,
                               struct err *e) {
    char pointer[HUB_PATH_MAX];
    int w = snprintf(pointer, sizeof pointer, "%s/snapshots/%s/%s", p->repo_dir, p->commit, f->path);
    if (w < 0 || (size_t)w >= sizeof pointer) return err_set(e, SMELT_ERR_RANGE, "path too long");
    uint64_t have;
    if (is_regular(pointer, &have) && (!f->has_size || have == f->size)) {
        log_debug("%s: already in the cache", f->path);
        if (p->o->progress) {
            struct hub_progress pr = {.file = f->path, .index = index, .count = count, .done = have,
                                      .total = have, .resumed = have, .finished = true};
            p->o->progress(p->o->progress_ctx, &pr);
        }
        return SMELT_OK;
    }
    int hops = 0;
    struct file_meta m = {0};
    smelt_status st = resolve_file(p, f, &hops, &m, e);
    if (st) return st;

    char blobs[HUB_PATH_MAX], blob[HUB_PATH_MAX], tmp[HUB_PATH_MAX];
    if (!fmt(blobs, sizeof blobs, "%s/blobs", p->repo_dir) ||
        !fmt(blob, sizeof blob, "%s/%s", blobs, m.etag) ||
        !fmt(tmp, sizeof tmp, "%s.incomplete", blob))
        return err_set(e, SMELT_ERR_RANGE, "path too long");
    if ((st = hub_mkdirs(blobs, e))) return st;

    int lock = hub_lock(p->o->cache, p->r->repo, m.etag, e);
    if (lock < 0) return e->code;
    if (!is_regular(blob, &have) || (m.has_size && have != m.size)) {
        if (is_regular(blob, &have))
            log_warn("%s: the cached blob has %llu bytes, not %llu: fetching it again", f->path,
                     (unsigned long long)have, (unsigned long long)m.size);
        bool bad_resume;
        st = download_blob(p, f, &m, tmp, &hops, index, count, &bad_resume, e);
        if (st && bad_resume) { /* the partial file from before may have been the bad part */
            log_warn("%s; the download had resumed an earlier partial file: fetching it whole",
                     e->msg);
            st = download_blob(p, f, &m, tmp, &hops, index, count, &bad_resume, e);
        }
        if (st == SMELT_OK && rename(tmp, blob) != 0)
            st = err_set(e, SMELT_ERR_IO, "cannot move %s into place: %s", tmp, strerror(errno));
    } else {
        log_info("%s: blob %s already in the cache", f->path, m.etag);
    }
    hub_unlock(lock);
    if (st) return st;
    return hub_link_snapshot(p->repo_dir, p->commit, f->path, m.etag, e);
}

static smelt_status validate(const char *path, struct err *e) {
    struct gguf_file *g = NULL;
    struct err ge;
    err_clear(&ge);
    if (gguf_open(&g, path, &ge) != SMELT_OK)
        return err_set(e, SMELT_ERR_FORMAT, "not a valid GGUF: %s (the download matches the hub's "
                       "sha256, so the file is what the repo publishes; it is kept in the cache)",
                       ge.msg);
    gguf_close(g);
    return SMELT_OK;
}

static smelt_status out_path(const char *repo_dir, const char *commit, const char *rel, char *path,
                             size_t n, struct err *e) {
    int w = snprintf(path, n, "%s/snapshots/%s/%s", repo_dir, commit, rel);
    if (w < 0 || (size_t)w >= n) return err_set(e, SMELT_ERR_RANGE, "path too long");
    return SMELT_OK;
}

smelt_status hub_find_cached(const struct hub_opts *o, const struct hub_ref *r, char *path,
                             size_t n, struct err *e) {
    struct err local;
    if (!e) e = &local;
    if (!hub_valid_repo_id(r->repo) || !hub_valid_relpath(r->revision))
        return err_set(e, SMELT_ERR_INVALID, "bad model reference %.200s@%.200s", r->repo, r->revision);
    char repo_dir[HUB_PATH_MAX], commit[41], shown[HUB_REPO_MAX + HUB_QUANT_MAX + HUB_REV_MAX];
    hub_ref_str(r, shown, sizeof shown);
    smelt_status st = hub_repo_dir(o->cache, r->repo, repo_dir, sizeof repo_dir, e);
    if (st) return st;
    struct stat sb;
    if (stat(repo_dir, &sb) != 0)
        return err_set(e, SMELT_ERR_NOT_FOUND, "%s is not in the hub cache (%s)", r->repo, o->cache);
    st = hub_read_ref(repo_dir, r->revision, commit, e);
    if (st) {
        /* no ref (the files came by commit hash): take the snapshot when there is just one */
        char snaps[HUB_PATH_MAX];
        DIR *d = fmt(snaps, sizeof snaps, "%s/snapshots", repo_dir) ? opendir(snaps) : NULL;
        int found = 0;
        struct dirent *de;
        while (d && (de = readdir(d)))
            if (hub_is_hex(de->d_name, 40) && found++ == 0) memcpy(commit, de->d_name, 41);
        if (d) closedir(d);
        if (found != 1 || strcmp(r->revision, "main"))
            return err_set(e, SMELT_ERR_NOT_FOUND, "%s: revision %s is not in the hub cache (%s)",
                           shown, r->revision, o->cache);
    }
    char **names;
    size_t nn;
    if ((st = hub_snapshot_files(repo_dir, commit, &names, &nn, e))) return st;
    size_t *idx = NULL, ni = 0;
    struct err se;
    err_clear(&se);
    st = hub_select((const char *const *)names, nn, r->quant, &idx, &ni, &se);
    if (st == SMELT_OK) st = out_path(repo_dir, commit, names[idx[0]], path, n, e);
    else err_set(e, SMELT_ERR_NOT_FOUND, "%s is not in the hub cache: commit %.12s has %s", shown,
                 commit, se.msg);
    free(idx);
    hub_free_names(names, nn);
    return st;
}

smelt_status hub_pull(const struct hub_opts *o, const struct hub_ref *r, char *path, size_t n,
                      struct err *e) {
    struct err local;
    if (!e) e = &local;
    if (!hub_valid_repo_id(r->repo) || !hub_valid_relpath(r->revision))
        return err_set(e, SMELT_ERR_INVALID, "bad model reference %.200s@%.200s", r->repo, r->revision);
    if (o->offline) {
        smelt_status st = hub_find_cached(o, r, path, n, e);
        if (st) err_prefix(e, "offline (HF_HUB_OFFLINE is set)");
        return st;
    }
    struct pull p = {.o = o, .r = r};
    if (!hub_url_origin(o->endpoint, p.hub_origin, sizeof p.hub_origin))
        return err_set(e, SMELT_ERR_INVALID, "bad endpoint %s", o->endpoint);
    smelt_status st = hub_repo_dir(o->cache, r->repo, p.repo_dir, sizeof p.repo_dir, e);
    if (st) return st;
    if ((st = hub_http_new(&p.http, o, e))) return st;
    struct hub_listing l = {0};
    const char **names = NULL;
    size_t *idx = NULL, ni = 0;
    char shown[HUB_REPO_MAX + HUB_QUANT_MAX + HUB_REV_MAX];
    hub_ref_str(r, shown, sizeof shown);
    if ((st = get_listing(&p, &l, e))) goto out;
    memcpy(p.commit, l.commit, sizeof p.commit);
    names = malloc((l.n ? l.n : 1) * sizeof *names);
    if (!names) {
        st = err_set(e, SMELT_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < l.n; i++) names[i] = l.files[i].path;
    if ((st = hub_select(names, l.n, r->quant, &idx, &ni, e))) {
        err_prefix(e, "%s (commit %.12s)", shown, l.commit);
        goto out;
    }
    if ((st = hub_mkdirs(o->cache, e))) goto out;
    hub_cachedir_tag(o->cache);
    for (size_t k = 0; k < ni; k++) {
        if ((st = fetch_file(&p, &l.files[idx[k]], (int)k + 1, (int)ni, e))) {
            err_prefix(e, "%s", shown);
            goto out;
        }
    }
    if ((st = hub_write_ref(p.repo_dir, r->revision, p.commit, e))) goto out;
    if ((st = out_path(p.repo_dir, p.commit, l.files[idx[0]].path, path, n, e))) goto out;
    if (o->validate_gguf && (st = validate(path, e))) err_prefix(e, "%s", shown);
out:
    free(idx);
    free(names);
    hub_listing_free(&l);
    hub_http_free(p.http);
    return st;
}
