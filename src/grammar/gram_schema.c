#include "grammar/gram_int.h"
smelt_status gram_schema_to_gbnf(const json_t *schema, struct tok_buf *out, struct err *e) {
    return err_set(e, SMELT_ERR_UNSUPPORTED, "schema: not yet");
}
