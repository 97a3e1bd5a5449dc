/* Logging to stderr. Level from SMELT_LOG (error|warn|info|debug), default info. */
#ifndef SMELT_UTIL_LOG_H
#define SMELT_UTIL_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_set_level(enum log_level lvl);
enum log_level log_get_level(void);

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
