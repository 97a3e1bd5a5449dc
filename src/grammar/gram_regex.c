#include "grammar/gram_int.h"
smelt_status gram_regex_gbnf(const char *re, size_t len, enum gram_re_mode mode,
                             struct tok_buf *out, struct err *e) {
    return err_set(e, SMELT_ERR_UNSUPPORTED, "regex: not yet");
}
smelt_status gram_regex_to_gbnf(const char *re, size_t len, struct tok_buf *out, struct err *e) {
    return gram_regex_gbnf(re, len, GRAM_RE_TEXT, out, e);
}
