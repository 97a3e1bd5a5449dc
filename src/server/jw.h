/* A growable output buffer with JSON string escaping, for the hot path of streaming
 * (one SSE chunk per token). Building each chunk through jansson would allocate a tree per
 * token; this appends bytes. It only ever writes JSON (never parses it): requests are parsed
 * with jansson.
 *
 * Errors are sticky: after an allocation failure every append is a no-op and `oom` is set;
 * the caller checks it once at the end. */
#ifndef SMELT_SERVER_JW_H
#define SMELT_SERVER_JW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jw {
    char *p;
    size_t n, cap;
    bool oom;
};

void jw_free(struct jw *w);
/* Makes room for extra more bytes (+ NUL). */
bool jw_reserve(struct jw *w, size_t extra);
void jw_raw(struct jw *w, const char *s, size_t n);
void jw_str(struct jw *w, const char *s); /* raw, NUL-terminated */
void jw_printf(struct jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s[0..n) as a JSON string literal (with the quotes). Invalid UTF-8 becomes U+FFFD;
 * control characters are escaped; everything else passes through. */
void jw_json_str(struct jw *w, const char *s, size_t n);
/* The same without the quotes: the escaped characters of a string literal, so a literal can
 * be written in pieces (pieces that do not split a UTF-8 character give the same text). */
void jw_json_chars(struct jw *w, const char *s, size_t n);
/* Appends an integer / a float in JSON (non-finite floats become null; -inf logprobs are
 * written as -9999.0 as OpenAI does). */
void jw_int(struct jw *w, int64_t v);
void jw_float(struct jw *w, double v);
/* Appends the bytes of s[0..n) as a JSON array of integers ([104, 105]). */
void jw_bytes_array(struct jw *w, const char *s, size_t n);
/* Appends data[0..n) as a JSON string of its base64 (RFC 4648, padded). */
void jw_base64(struct jw *w, const void *data, size_t n);

#endif
