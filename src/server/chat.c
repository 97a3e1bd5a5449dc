/* Chat prompts: a request's messages (and tools) rendered with the model's chat template,
 * the way Hugging Face's apply_chat_template does (tokenizer/tmpl.h).
 *
 * continue_final_message: the conversation is rendered without a generation prompt and cut
 * right after the final (assistant) message's content, so the model continues that
 * message instead of starting a new one (vLLM does the same).
 *
 * Built only when the template engine is in the tree (__has_include), so the server can
 * land before it; without it chat requests are refused with a clear message. */
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

#if __has_include("tokenizer/tmpl.h")
#include "tokenizer/tmpl.h"

bool gen_render_chat(struct server *s, const struct oai_request *rq, char **out, size_t *len,
                     struct oai_err *e) {
    *out = NULL;
    *len = 0;
    if (!s->m.tmpl)
        return oai_fail(e, 400, "invalid_request_error", "messages", "no_chat_template",
                        "This model has no chat template");
    const json_t *tools = rq->tool_choice == OAI_TOOLS_NONE ? NULL : rq->tools;
    bool gen_prompt = rq->add_generation_prompt && !rq->continue_final_message;
    struct tmpl_value *ctx = NULL;
    struct err te;
    err_clear(&te);
    smelt_status st = tmpl_chat_ctx(rq->messages, tools, gen_prompt, s->m.bos_text,
                                    s->m.eos_text, rq->template_kwargs, &ctx, &te);
    char *text = NULL;
    size_t n = 0;
    if (st == SMELT_OK) st = tmpl_render(s->m.tmpl, ctx, NULL, &text, &n, &te);
    tmpl_value_free(ctx);
    if (st != SMELT_OK) {
        if (st == SMELT_ERR_NOMEM)
            return oai_fail(e, 500, "server_error", NULL, NULL, "chat template: %s", te.msg);
        return oai_fail(e, 400, "invalid_request_error", "messages", "chat_template_error",
                        "The chat template failed on these messages: %s", te.msg);
    }
    if (rq->continue_final_message) {
        json_t *last = json_array_get(rq->messages, json_array_size(rq->messages) - 1);
        json_t *content = json_object_get(last, "content");
        const char *role = json_string_value(json_object_get(last, "role"));
        if (!role || strcmp(role, "assistant") != 0 || !json_is_string(content)) {
            free(text);
            return oai_bad(e, "continue_final_message",
                           "continue_final_message needs a final assistant message with text");
        }
        const char *c = json_string_value(content);
        size_t cl = json_string_length(content);
        const char *hit = NULL;
        for (const char *p = text; cl && (p = memmem(p, n - (size_t)(p - text), c, cl)); p++)
            hit = p;
        if (cl && !hit) {
            free(text);
            return oai_bad(e, "continue_final_message",
                           "the template does not render the final message's content verbatim");
        }
        if (hit) n = (size_t)(hit - text) + cl;
        text[n] = 0;
    }
    *out = text;
    *len = n;
    return true;
}

#else

bool gen_render_chat(struct server *s, const struct oai_request *rq, char **out, size_t *len,
                     struct oai_err *e) {
    (void)s;
    (void)rq;
    *out = NULL;
    *len = 0;
    return oai_fail(e, 501, "server_error", "messages", "not_implemented",
                    "chat templates are not available in this build");
}

#endif
