/* The web chat's static files (webui.h): GET or HEAD / (the page) and /webui/NAME (its
 * script, style and the embedded Debian libraries), without the API key: the files hold no
 * secret, and the page asks for the key before it calls the API routes, which still need
 * it. Every answer carries a strict Content-Security-Policy (scripts and styles from this
 * origin only, no inline script; the page talks to this origin only; model output that
 * slipped an <img> past the sanitizer still loads nothing from elsewhere), nosniff, and a
 * strong ETag from the build with Cache-Control: no-cache, so a browser revalidates each
 * load and gets 304 until the binary changes. --no-webui removes the routes (404). */
#include <string.h>

#include "server/server_int.h"
#include "server/webui.h"

#define WEBUI_CSP                                                                                  \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "              \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* Whether an If-None-Match value names etag: a comma list of entity tags, weak ones (W/"…")
 * compared by their opaque part as RFC 9110 section 13.1.2 asks for this header, or "*". */
static bool etag_listed(const char *h, const char *etag) {
    size_t n = strlen(etag);
    for (const char *p = h; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (*p == '*') return true;
        if (p[0] == 'W' && p[1] == '/') p += 2;
        if (!strncmp(p, etag, n) && (!p[n] || p[n] == ',' || p[n] == ' ' || p[n] == '\t'))
            return true;
        if (*p == '"') { /* past this tag (a comma may sit inside its quotes) */
            const char *q = strchr(p + 1, '"');
            p = q ? q + 1 : p + strlen(p);
        }
        while (*p && *p != ',')
            p++;
    }
    return false;
}

/* The asset named name, or NULL. */
static const struct webui_asset *find_asset(const char *name) {
    for (const struct webui_asset *a = webui_assets; a->name; a++)
        if (!strcmp(a->name, name)) return a;
    return NULL;
}

enum MHD_Result webui_route(struct conn *c) {
    const struct webui_asset *a = find_asset(c->arg ? c->arg : "index.html");
    if (!a) {
        struct oai_err e;
        oai_fail(&e, 404, "invalid_request_error", NULL, "not_found", "Unknown route %s %.*s",
                 c->method, oai_clip(c->path, 200), c->path);
        return srv_error(c, &e);
    }
    const char *inm = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "If-None-Match");
    bool same = inm && etag_listed(inm, a->etag);
    int status = same ? 304 : 200;
    /* a 304 gets the file too: libmicrohttpd sends no body with a 304 (nor a HEAD) but
     * its Content-Length, which RFC 9110 section 8.6 allows only as the 200's length */
    struct MHD_Response *r =
        MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    if (!same) MHD_add_response_header(r, "Content-Type", a->ctype);
    MHD_add_response_header(r, "ETag", a->etag);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "Content-Security-Policy", WEBUI_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    srv_add_headers(c, r);
    srv_status(c, status, true);
    enum MHD_Result ret = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

bool server_has_webui(const struct server *s) {
    return !s->cfg.no_webui && webui_assets[0].name != NULL;
}
