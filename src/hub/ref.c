/* Model references and the validation of every name that comes from a user or the hub
 * before it becomes part of a path or URL. The rules follow huggingface_hub's validators
 * (validate_repo_id, _validate_relative_filename), restricted to ASCII, and are stricter
 * where a name is joined under a directory: no "..", no absolute path, no backslash, no
 * colon, no control character. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "hub/hub_internal.h"

static bool repo_part_ok(const char *s, size_t n) {
    if (n == 0 || n > 96) return false;
    if (s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!(isalnum(c) || c == '_' || c == '-' || c == '.')) return false;
        if (i > 0 && (c == '-' || c == '.') && s[i - 1] == c) return false; /* "--", ".." */
    }
    return true;
}

bool hub_valid_repo_id(const char *s) {
    if (!s) return false;
    const char *slash = strchr(s, '/');
    if (!slash || strchr(slash + 1, '/')) return false;
    size_t n = strlen(s);
    if (n >= 4 && !strcmp(s + n - 4, ".git")) return false;
    return repo_part_ok(s, (size_t)(slash - s)) && repo_part_ok(slash + 1, strlen(slash + 1));
}

bool hub_valid_relpath(const char *s) {
    if (!s || !*s || s[0] == '/') return false;
    size_t n = strlen(s);
    if (n > 1000) return false;
    int segs = 0;
    const char *p = s;
    while (1) {
        const char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || len > 255) return false;
        if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) return false;
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)p[i];
            if (c < 0x20 || c == 0x7f || c == '\\' || c == ':') return false;
        }
        if (++segs > 32) return false;
        if (!end) break;
        p = end + 1;
    }
    return true;
}

bool hub_is_hex(const char *s, size_t len) {
    if (!s || strlen(s) != len) return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

bool hub_normalize_etag(const char *v, char *out, size_t n) {
    if (!v || n < 65) return false;
    while (*v == ' ' || *v == '\t') v++;
    if (v[0] == 'W' && v[1] == '/') v += 2;
    size_t len = strlen(v);
    while (len && (v[len - 1] == ' ' || v[len - 1] == '\t' || v[len - 1] == '\r')) len--;
    if (len >= 2 && v[0] == '"' && v[len - 1] == '"') {
        v++;
        len -= 2;
    }
    if (len != 40 && len != 64) return false;
    memcpy(out, v, len);
    out[len] = 0;
    return hub_is_hex(out, len);
}

static bool quant_ok(const char *q) {
    size_t n = strlen(q);
    if (n >= 5 && !strcasecmp(q + n - 5, ".gguf")) return hub_valid_relpath(q);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)q[i];
        if (!(isalnum(c) || c == '_' || c == '-' || c == '.')) return false;
    }
    return true;
}

smelt_status hub_parse_ref(const char *s, struct hub_ref *r, struct err *e) {
    memset(r, 0, sizeof *r);
    if (!s || !*s) return err_set(e, SMELT_ERR_INVALID, "empty model reference");
    static const char *prefixes[] = {"hf.co/", "huggingface.co/", "https://huggingface.co/",
                                     "https://hf.co/"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        size_t pl = strlen(prefixes[i]);
        if (!strncmp(s, prefixes[i], pl)) {
            s += pl;
            break;
        }
    }
    char buf[HUB_REPO_MAX + HUB_QUANT_MAX + HUB_REV_MAX + 4];
    if (strlen(s) >= sizeof buf)
        return err_set(e, SMELT_ERR_INVALID, "model reference too long (%zu bytes)", strlen(s));
    strcpy(buf, s);
    char *rev = strchr(buf, '@');
    if (rev) {
        *rev++ = 0;
        if (!hub_valid_relpath(rev) || strlen(rev) >= HUB_REV_MAX)
            return err_set(e, SMELT_ERR_INVALID, "model reference '%s': bad revision '%s'", s, rev);
        strcpy(r->revision, rev);
    } else {
        strcpy(r->revision, "main");
    }
    char *colon = strchr(buf, ':');
    if (colon) {
        *colon++ = 0;
        if (!quant_ok(colon) || strlen(colon) >= HUB_QUANT_MAX)
            return err_set(e, SMELT_ERR_INVALID,
                           "model reference '%s': bad quant '%s' (want e.g. Q4_K_M, or a .gguf "
                           "file name)", s, colon);
        strcpy(r->quant, colon);
    }
    if (!hub_valid_repo_id(buf) || strlen(buf) >= HUB_REPO_MAX)
        return err_set(e, SMELT_ERR_INVALID,
                       "'%s' is not a model reference: want org/repo[:quant] (letters, digits, "
                       "'_', '-', '.'), a .gguf file or a directory", s);
    strcpy(r->repo, buf);
    return SMELT_OK;
}

void hub_ref_str(const struct hub_ref *r, char *out, size_t n) {
    snprintf(out, n, "%s%s%s%s%s", r->repo, r->quant[0] ? ":" : "", r->quant,
             strcmp(r->revision, "main") ? "@" : "", strcmp(r->revision, "main") ? r->revision : "");
}
