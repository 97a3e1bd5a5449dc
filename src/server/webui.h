/* The web chat's files, embedded into the binary at build time: src/server/webui/ (the page,
 * its script and style, written for smelt) and the scripts of three Debian packages it uses
 * (marked, highlight.js, DOMPurify), read from where Debian installs them. CMake's
 * cmake/embed_webui.cmake writes the table (gen/webui_assets.c in the build folder); webui.c
 * serves it at / and /webui/NAME (docs/server.md, "Web chat"). */
#ifndef SMELT_SERVER_WEBUI_H
#define SMELT_SERVER_WEBUI_H

#include <stddef.h>

struct webui_asset {
    const char *name;          /* "index.html" (served at /), else served at /webui/NAME */
    const char *ctype;         /* Content-Type, from the name's extension */
    const unsigned char *data; /* the file's bytes */
    size_t len;
    const char *etag; /* a strong ETag, quotes included: "…" (its SHA-256's start) */
};

/* The embedded files, ended by an entry whose name is NULL (the only entry of a build made
 * with -DSMELT_WEBUI=OFF). */
extern const struct webui_asset webui_assets[];

#endif
