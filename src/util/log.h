/* Logging to stderr. Level from SMELT_LOG (error|warn|info|debug), default info.
 *
 * A log line may carry text a client chose (a URL, a header, a model name): every message is
 * written through log_escape, so it cannot forge a line, move the cursor or send terminal
 * escapes. */
#ifndef SMELT_UTIL_LOG_H
#define SMELT_UTIL_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

#include <stddef.h>

/* Copies s[0..n) into out (cap bytes, cap >= 1, always NUL-terminated) for a text log:
 * well-formed UTF-8 passes through, except control characters (C0, DEL and the C1 range
 * U+0080..U+009F), which become \xNN per byte, as does each byte that is not part of a
 * well-formed sequence. The copy is cut before the first character (or escape) that does
 * not fit, never inside one. Returns the bytes written (without the NUL). */
size_t log_escape(char *out, size_t cap, const char *s, size_t n);

/* Formats a message and writes it as one line "smelt: LEVEL: MESSAGE" (escaped with
 * log_escape; a message longer than 2 KiB is cut on a character boundary). */
void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_set_level(enum log_level lvl);
enum log_level log_get_level(void);

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
