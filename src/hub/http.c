/* HTTP for the hub client: a thin layer over one libcurl easy handle (kept across requests
 * so connections are reused).
 *
 * Redirects are NOT followed by libcurl: the caller follows them so that it decides, per
 * hop, whether the token may go along (only to the hub's own origin, as huggingface_hub
 * does) and caps the number of hops. Only http and https are allowed, for requests and
 * redirects. A transfer that moves no byte for stall_timeout_s seconds is aborted (our own
 * progress callback: libcurl's LOW_SPEED check averages over a 5 s window and so fired only
 * after 6 s of silence with a 1 s limit), so a stalled server cannot hang a pull. Response headers are
 * capped at 64 KiB and error bodies at 4 KiB: a hostile server cannot make us allocate
 * without bound. */
#include <ctype.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "hub/hub_internal.h"
#include "smelt.h"
#include "util/array.h"
#include "util/clock.h"

#define HDR_CAP (64 * 1024)
#define ERR_BODY_CAP 4096

struct hub_http {
    CURL *curl;
    char auth[1100]; /* "Authorization: Bearer <token>" or "" */
    char ua[64];
    long connect_timeout_s, stall_timeout_s;
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc;
static void global_init(void) { g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

smelt_status hub_http_new(struct hub_http **out, const struct hub_opts *o, struct err *e) {
    *out = NULL;
    pthread_once(&g_once, global_init);
    if (g_init_rc != CURLE_OK)
        return err_set(e, SMELT_ERR_NETWORK, "libcurl init failed: %s", curl_easy_strerror(g_init_rc));
    struct hub_http *h = calloc(1, sizeof *h);
    if (!h) return err_set(e, SMELT_ERR_NOMEM, "out of memory");
    h->curl = curl_easy_init();
    if (!h->curl) {
        free(h);
        return err_set(e, SMELT_ERR_NETWORK, "curl_easy_init failed");
    }
    if (o->token[0]) {
        for (const char *p = o->token; *p; p++)
            if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e) {
                hub_http_free(h);
                return err_set(e, SMELT_ERR_INVALID, "HF_TOKEN holds a space or control character");
            }
        snprintf(h->auth, sizeof h->auth, "Authorization: Bearer %s", o->token);
    }
    snprintf(h->ua, sizeof h->ua, "User-Agent: smelt/%s", smelt_version());
    h->connect_timeout_s = o->connect_timeout_s > 0 ? o->connect_timeout_s : 10;
    h->stall_timeout_s = o->stall_timeout_s > 0 ? o->stall_timeout_s : 10;
    *out = h;
    return SMELT_OK;
}

void hub_http_free(struct hub_http *h) {
    if (!h) return;
    if (h->curl) curl_easy_cleanup(h->curl);
    free(h);
}

void hub_resp_free(struct hub_resp *r) {
    free(r->hdrs);
    free(r->body);
    memset(r, 0, sizeof *r);
}

struct xfer {
    const struct hub_req *q;
    struct hub_resp *r;
    size_t hdr_cap;
    bool started;    /* on_start was called */
    bool overflow;   /* header or memory body cap exceeded */
    long stall_s;
    double last_change; /* when a byte last moved */
    curl_off_t last_now;
    bool stalled;
};

/* libcurl calls this about once a second even when nothing moves. */
static int on_xferinfo(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
    (void)dltotal, (void)ultotal;
    struct xfer *x = ud;
    double t = clock_now();
    if (dlnow + ulnow != x->last_now) {
        x->last_now = dlnow + ulnow;
        x->last_change = t;
        return 0;
    }
    if (t - x->last_change > (double)x->stall_s) {
        x->stalled = true;
        return 1;
    }
    return 0;
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *ud) {
    struct xfer *x = ud;
    size_t n = size * nmemb;
    struct hub_resp *r = x->r;
    if (n >= 5 && !strncmp(p, "HTTP/", 5)) { /* a new response (e.g. after 100 Continue) */
        r->hdrs_len = 0;
        if (r->hdrs) r->hdrs[0] = 0;
        long st = 0;
        const char *sp = memchr(p, ' ', n);
        if (sp) st = strtol(sp + 1, NULL, 10);
        r->status = st;
        return n;
    }
    if (r->hdrs_len + n + 1 > HDR_CAP) {
        x->overflow = true;
        return 0;
    }
    if (!array_grow((void **)&r->hdrs, &x->hdr_cap, r->hdrs_len + n + 1, 1)) return 0;
    /* store "name: value\n" without the CR */
    for (size_t i = 0; i < n; i++)
        if (p[i] != '\r') r->hdrs[r->hdrs_len++] = p[i];
    r->hdrs[r->hdrs_len] = 0;
    return n;
}

static bool append_body(struct hub_resp *r, const char *p, size_t n, size_t cap) {
    if (r->body_len + n > cap) return false;
    char *nb = realloc(r->body, r->body_len + n + 1);
    if (!nb) return false;
    memcpy(nb + r->body_len, p, n);
    r->body = nb;
    r->body_len += n;
    r->body[r->body_len] = 0;
    return true;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
    struct xfer *x = ud;
    size_t n = size * nmemb;
    struct hub_resp *r = x->r;
    r->body_bytes += n;
    if (r->status >= 300 || r->status < 200) { /* keep the start of an error body */
        if (r->body_len < ERR_BODY_CAP) {
            size_t take = n < ERR_BODY_CAP - r->body_len ? n : ERR_BODY_CAP - r->body_len;
            append_body(r, p, take, ERR_BODY_CAP);
        }
        return n;
    }
    if (x->q->mem_cap) {
        if (!append_body(r, p, n, x->q->mem_cap)) {
            x->overflow = true;
            return 0;
        }
        return n;
    }
    if (!x->started) {
        x->started = true;
        if (x->q->on_start && !x->q->on_start(x->q->ctx, r)) {
            r->aborted = true;
            return 0;
        }
    }
    if (x->q->sink && !x->q->sink(x->q->ctx, p, n)) {
        r->aborted = true;
        return 0;
    }
    return n;
}

smelt_status hub_http_do(struct hub_http *h, const struct hub_req *q, struct hub_resp *r,
                         struct err *e) {
    memset(r, 0, sizeof *r);
    CURL *c = h->curl;
    curl_easy_reset(c);
    struct xfer x = {.q = q, .r = r, .stall_s = h->stall_timeout_s, .last_change = clock_now()};
    char errbuf[CURL_ERROR_SIZE] = {0};
    char range[64];
    struct curl_slist *hl = NULL, *tmp;
#define ADD_HDR(s)                                                                             \
    do {                                                                                       \
        tmp = curl_slist_append(hl, (s));                                                      \
        if (!tmp) goto nomem;                                                                  \
        hl = tmp;                                                                              \
    } while (0)
    ADD_HDR(h->ua);
    ADD_HDR("Accept-Encoding: identity"); /* sizes must be the file's, not a gzip's */
    if (q->auth && h->auth[0]) ADD_HDR(h->auth);
    if (q->range_from) {
        snprintf(range, sizeof range, "Range: bytes=%llu-", (unsigned long long)q->range_from);
        ADD_HDR(range);
    }
#undef ADD_HDR
    curl_easy_setopt(c, CURLOPT_URL, q->url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024); /* fewer, larger writes */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, h->connect_timeout_s);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_xferinfo);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &x);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    if (q->head) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (status) r->status = status;
    curl_slist_free_all(hl);
    if (rc == CURLE_OK && !q->head && !x.started && r->status >= 200 && r->status < 300 &&
        !q->mem_cap) {
        /* an empty 2xx body: let the caller see the headers anyway */
        x.started = true;
        if (q->on_start && !q->on_start(q->ctx, r)) r->aborted = true;
    }
    if (x.overflow)
        return err_set(e, SMELT_ERR_RANGE, "%s: response too large (headers over %d KiB or body "
                       "over %zu bytes)", q->url, HDR_CAP / 1024, q->mem_cap);
    if (rc != CURLE_OK) {
        r->curl_code = (int)rc;
        if (x.stalled)
            snprintf(r->curl_msg, sizeof r->curl_msg, "no data for %ld s (stalled)", h->stall_timeout_s);
        else
            snprintf(r->curl_msg, sizeof r->curl_msg, "%s", errbuf[0] ? errbuf : curl_easy_strerror(rc));
        if (r->aborted) return SMELT_OK; /* the caller's callback stopped it and set its reason */
        return err_set(e, SMELT_ERR_NETWORK, "%s", r->curl_msg);
    }
    return SMELT_OK;
nomem:
    curl_slist_free_all(hl);
    return err_set(e, SMELT_ERR_NOMEM, "out of memory");
}

bool hub_resp_header(const struct hub_resp *r, const char *name, char *out, size_t n) {
    if (!r->hdrs || n == 0) return false;
    size_t nl = strlen(name);
    const char *p = r->hdrs;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len > nl && p[nl] == ':' && !strncasecmp(p, name, nl)) {
            const char *v = p + nl + 1;
            while (v < p + len && (*v == ' ' || *v == '\t')) v++;
            size_t vl = (size_t)(p + len - v);
            while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) vl--;
            if (vl >= n) vl = n - 1;
            memcpy(out, v, vl);
            out[vl] = 0;
            return true;
        }
        if (!eol) break;
        p = eol + 1;
    }
    return false;
}

/* Splits an absolute http(s) URL: scheme length, host start/length, port. */
static bool parse_url(const char *url, size_t *scheme_len, const char **host, size_t *host_len,
                      long *port) {
    size_t sl;
    if (!strncasecmp(url, "http://", 7)) sl = 4;
    else if (!strncasecmp(url, "https://", 8)) sl = 5;
    else return false;
    const char *h = url + sl + 3;
    const char *end = h + strcspn(h, "/?#");
    const char *at = memchr(h, '@', (size_t)(end - h));
    if (at) h = at + 1; /* userinfo is not part of the origin */
    const char *colon = NULL;
    if (*h == '[') { /* IPv6 literal */
        const char *rb = memchr(h, ']', (size_t)(end - h));
        if (!rb) return false;
        colon = (rb + 1 < end && rb[1] == ':') ? rb + 1 : NULL;
    } else {
        colon = memchr(h, ':', (size_t)(end - h));
    }
    size_t hl = (size_t)((colon ? colon : end) - h);
    if (hl == 0 || hl > 255) return false;
    if (*h != '[') /* a DNS name or IPv4 address: nothing else gets near the origin check */
        for (size_t i = 0; i < hl; i++)
            if (!isalnum((unsigned char)h[i]) && h[i] != '.' && h[i] != '-' && h[i] != '_') return false;
    long p = sl == 4 ? 80 : 443;
    if (colon) {
        char *pe;
        p = strtol(colon + 1, &pe, 10);
        if (pe != end || p <= 0 || p > 65535) return false;
    }
    *scheme_len = sl;
    *host = h;
    *host_len = hl;
    *port = p;
    return true;
}

bool hub_url_origin(const char *url, char *out, size_t n) {
    size_t sl, hl;
    const char *host;
    long port;
    if (!url || !parse_url(url, &sl, &host, &hl, &port)) return false;
    int w = snprintf(out, n, "%.*s://%.*s:%ld", (int)sl, url, (int)hl, host, port);
    if (w < 0 || (size_t)w >= n) return false;
    for (char *p = out; *p; p++) *p = (char)tolower((unsigned char)*p);
    return true;
}

bool hub_url_join(const char *base, const char *loc, char *out, size_t n) {
    if (!loc || !*loc) return false;
    for (const char *p = loc; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p == 0x7f) return false;
    size_t sl, hl;
    const char *host;
    long port;
    if (parse_url(loc, &sl, &host, &hl, &port)) {
        if (strlen(loc) >= n) return false;
        strcpy(out, loc);
        return true;
    }
    if (loc[0] != '/' || loc[1] == '/') return false; /* only absolute paths on base */
    if (!parse_url(base, &sl, &host, &hl, &port)) return false;
    const char *path = host + hl + strcspn(host + hl, "/?#");
    int w = snprintf(out, n, "%.*s%s", (int)(path - base), base, loc);
    return w >= 0 && (size_t)w < n;
}

bool hub_url_escape(const char *s, bool keep_slash, char *out, size_t n) {
    static const char hx[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool plain = isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
                     (keep_slash && c == '/');
        if (o + (plain ? 1 : 3) + 1 > n) return false;
        if (plain) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hx[c >> 4];
            out[o++] = hx[c & 15];
        }
    }
    out[o] = 0;
    return true;
}
