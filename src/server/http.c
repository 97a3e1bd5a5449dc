/* Strict HTTP/1.1 request checks, run on the first handler call (headers in, no body read
 * yet). See server_int.h (http_check).
 *
 * libmicrohttpd 0.9.75 (Debian 12) is lenient where a lenient parser makes request smuggling
 * possible, and has no option to make it strict (MHD_OPTION_CLIENT_DISCIPLINE_LVL came
 * later). Tested on raw sockets (tests/py/test_server_hardening.py), it:
 *   - frames a request with Transfer-Encoding by it, any Content-Length ignored, and treats
 *     any coding other than exactly "chunked" as a body of unknown length (read until the
 *     timeout);
 *   - takes the first of several Content-Length headers;
 *   - keeps its header strings NUL-terminated, so a NUL inside a value cuts it short
 *     ("Bearer KEY\0junk" reads as "Bearer KEY"), and takes a bare LF as a line end.
 * Its one strictness option, MHD_OPTION_STRICT_FOR_CLIENT 1, refuses a missing Host and a
 * space in the target, but with its own error answer, whose header block 0.9.75 writes twice
 * (as it does for every error it answers itself: a malformed Content-Length, a header block
 * too large). The checks here cover both, so that option stays off and those answers are
 * ours.
 * So the checks below look at every header, duplicates included (MHD lists them all), and
 * refuse what RFC 9112 says must be refused, closing the connection after the answer.
 *
 * The NUL, bare-LF and obs-fold checks rely on how MHD 0.9.x parses: in place, in its read
 * buffer, where each line's CR LF became two NUL bytes. Between the end of one line's text
 * (the HTTP version, a header's value) and the start of the next (a header's name) there
 * are then exactly 2 bytes, and 4 before the end of the header block (CR LF CR LF). More
 * means bytes that the NUL-terminated strings do not show (a NUL inside the line) or a
 * folded line (MHD joins it elsewhere); fewer, a bare LF. MHD 1.0 parses differently, and
 * refuses these itself at its default discipline level, so there the layout check is off. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server/server_int.h"

#if MHD_VERSION < 0x01000000
#define LAYOUT_CHECK 1
#else
#define LAYOUT_CHECK 0
#endif

/* A token character (RFC 9110 section 5.6.2): what a field name is made of. */
static bool tchar(unsigned char ch) {
    if (ch >= '0' && ch <= '9') return true;
    if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') return true;
    return ch && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

/* A control character that may not appear in a field value: everything below SP but HTAB,
 * and DEL (RFC 9110 section 5.5; NUL, CR and LF must be refused or replaced). */
static bool ctl(unsigned char ch) { return (ch < 0x20 && ch != '\t') || ch == 0x7F; }

struct scan {
    const char *end;       /* the end of the previous line's text */
    bool layout_bad;       /* a gap other than CR LF between two lines */
    bool bad_name, bad_value;
    char what[64];         /* the first bad field's name (for the message) */
    int n_host, n_auth, n_xkey, n_cl, n_te;
    uint64_t cl;
    bool cl_bad, cl_differ;
    char te[256];          /* the Transfer-Encoding values, joined with ", " */
    size_t te_n;
    bool te_long;
};

static void note_name(struct scan *sc, const char *key, size_t key_size) {
    if (sc->what[0]) return;
    size_t n = key_size < sizeof sc->what - 1 ? key_size : sizeof sc->what - 1;
    for (size_t i = 0; i < n; i++) /* a printable copy: it goes into an error message */
        sc->what[i] = tchar((unsigned char)key[i]) ? key[i] : '?';
    sc->what[n] = 0;
}

/* Parses a Content-Length value: 1 to 19 digits. */
static bool parse_length(const char *v, size_t n, uint64_t *out) {
    if (n == 0 || n > 19) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return false;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    *out = x;
    return true;
}

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size) {
    struct scan *sc = cls;
    (void)kind;
    if (LAYOUT_CHECK && (!sc->end || key != sc->end + 2)) sc->layout_bad = true;
    sc->end = value + value_size;
    bool name_ok = key_size > 0;
    for (size_t i = 0; i < key_size; i++) name_ok &= tchar((unsigned char)key[i]);
    if (!name_ok) {
        sc->bad_name = true;
        note_name(sc, key, key_size);
    }
    for (size_t i = 0; i < value_size; i++) {
        if (!ctl((unsigned char)value[i])) continue;
        sc->bad_value = true;
        note_name(sc, key, key_size);
        break;
    }
    if (key_size == 4 && !strncasecmp(key, "Host", 4)) sc->n_host++;
    else if (key_size == 13 && !strncasecmp(key, "Authorization", 13)) sc->n_auth++;
    else if (key_size == 9 && !strncasecmp(key, "x-api-key", 9)) sc->n_xkey++;
    else if (key_size == 14 && !strncasecmp(key, "Content-Length", 14)) {
        uint64_t x = 0;
        if (!parse_length(value, value_size, &x)) sc->cl_bad = true;
        else if (sc->n_cl > 0 && x != sc->cl) sc->cl_differ = true;
        sc->cl = x;
        sc->n_cl++;
    } else if (key_size == 17 && !strncasecmp(key, "Transfer-Encoding", 17)) {
        size_t need = value_size + (sc->te_n ? 2 : 0);
        if (sc->te_n + need + 1 > sizeof sc->te) {
            sc->te_long = true;
        } else {
            if (sc->te_n) memcpy(sc->te + sc->te_n, ", ", 2), sc->te_n += 2;
            memcpy(sc->te + sc->te_n, value, value_size);
            sc->te_n += value_size;
            sc->te[sc->te_n] = 0;
        }
        sc->n_te++;
    }
    return MHD_YES;
}

/* Reads the transfer codings of te (a comma-separated list, empty members allowed):
 * 0 when the last is chunked and it is the only one, 400 when chunked is not last (or
 * repeated, or there is none: the body's length cannot be known), 501 when chunked comes
 * last after codings smelt does not decode (RFC 9112 sections 6.1 and 6.3). */
static int transfer_codings(const char *te) {
    int n = 0, n_chunked = 0;
    bool last_chunked = false;
    const char *p = te;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) break;
        const char *b = p;
        while (*p && *p != ',') p++;
        const char *e = p;
        while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
        last_chunked = e - b == 7 && !strncasecmp(b, "chunked", 7);
        n_chunked += last_chunked;
        n++;
    }
    if (!last_chunked || n_chunked != 1) return 400;
    return n == 1 ? 0 : 501;
}

bool http_check(struct MHD_Connection *mc, const char *uri, size_t uri_len, bool uri_bad,
                const char *method, const char *version, struct http_framing *f,
                struct oai_err *e) {
    memset(f, 0, sizeof *f);
    bool v11 = !strcmp(version, "HTTP/1.1");
    if (uri_bad)
        return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                        "The request target holds a control character or a NUL byte "
                        "(encode it as %%XX)");
    struct scan sc = {0};
    size_t vlen = strlen(version);
    if (vlen) sc.end = version + vlen;
    /* the target ends where the version begins: a NUL inside it would leave a gap */
    if (LAYOUT_CHECK && vlen && uri && uri + uri_len + 1 != version)
        return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                        "The request target holds a NUL byte");
    MHD_get_connection_values_n(mc, MHD_HEADER_KIND, scan_header, &sc);
    if (LAYOUT_CHECK && vlen) {
        const union MHD_ConnectionInfo *hi =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
        if (!hi || !sc.end || method + hi->header_size != sc.end + 4) sc.layout_bad = true;
    }
    if (sc.layout_bad)
        return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                        "Malformed request header: every line must end in CR LF, with no NUL "
                        "byte inside and no folded (continued) line");
    if (sc.bad_name)
        return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                        "Malformed header name '%s'", sc.what);
    if (sc.bad_value)
        return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                        "The value of header '%s' holds a control character (NUL, CR, LF, ...)",
                        sc.what);
    if (v11 ? sc.n_host != 1 : sc.n_host > 1)
        return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                        "An HTTP/1.1 request needs exactly one Host header (got %d)", sc.n_host);
    if (sc.n_auth > 1 || sc.n_xkey > 1)
        return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request", "%s is given %d times",
                        sc.n_auth > 1 ? "Authorization" : "x-api-key",
                        sc.n_auth > 1 ? sc.n_auth : sc.n_xkey);
    if (sc.cl_bad || sc.cl_differ)
        return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                        sc.cl_bad ? "Content-Length is not a number"
                                  : "Content-Length is given twice with different values");
    if (sc.n_te) {
        if (sc.n_cl)
            return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                            "Both Content-Length and Transfer-Encoding are given: the body's "
                            "length is ambiguous");
        if (!v11)
            return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                            "Transfer-Encoding in an %s request", version);
        int st = sc.te_long ? 501 : transfer_codings(sc.te);
        if (st == 400)
            return oai_fail(e, 400, "invalid_request_error", NULL, "bad_request",
                            "Transfer-Encoding '%.*s': the last coding must be chunked, once",
                            oai_clip(sc.te, 64), sc.te);
        if (st == 501)
            return oai_fail(e, 501, "invalid_request_error", NULL, "not_implemented",
                            "Transfer-Encoding '%.*s': only chunked is supported",
                            oai_clip(sc.te, 64), sc.te);
        f->chunked = true;
        f->has_body = true;
    } else if (sc.n_cl) {
        f->length = sc.cl;
        f->has_body = sc.cl > 0;
    }
    return true;
}
