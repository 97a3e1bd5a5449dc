/* Chat prompts: a request's messages (and tools) rendered with the model's chat template,
 * the way Hugging Face's apply_chat_template does (template/tmpl.h), then tokenized.
 *
 * Which template: the model's `tokenizer.chat_template.tool_use` when the request passes
 * tools (tools present and tool_choice not "none") and the model has one, else its
 * default template (transformers picks the same way). A model without any template gets
 * the ChatML default (the CLI loads it, server_model.tmpl_fallback says so); that template
 * does not write BOS, so the prompt gets the vocab's BOS when the vocab asks for one.
 *
 * Tools are refused (400) when the template never mentions them: the model would not see
 * them, and a silently ignored field is worse than an error.
 *
 * tool_choice "required" or a named function: the prompt ends with the opening of a call
 * in the template's syntax (outp_force_prefix), so the model can only continue the call;
 * the parser is fed the same text first (outp_prefill). A template whose call syntax smelt
 * does not know cannot be forced: 400. When the prompt left the reply inside <think>, the
 * prefill closes it first (a forced call skips the reasoning).
 *
 * reasoning_effort becomes the template variable `reasoning_effort` (as vLLM passes it, for
 * templates that read it); "none" and "minimal" also set `enable_thinking` false (Qwen3's
 * switch) unless chat_template_kwargs sets it. Keys in chat_template_kwargs win. Harmony
 * templates (gpt-oss) know low, medium and high only: none and minimal are "low" there.
 *
 * gpt-oss (harmony): its template reads an assistant turn's reasoning from `thinking`
 * (and renders it before a pending tool call); clients send it back as `reasoning_content`
 * (or `reasoning`), so the template gets that text as `thinking`.
 *
 * continue_final_message: the conversation is rendered without a generation prompt and cut
 * right after the final (assistant) message's content, so the model continues that
 * message instead of starting a new one (vLLM does the same). */
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"
#include "template/tmpl.h"

void gen_chat_prompt_free(struct chat_prompt *cp) {
    free(cp->text);
    free(cp->prefill);
    memset(cp, 0, sizeof *cp);
}

/* Cuts text after the final assistant message's content (continue_final_message). */
static bool cut_final(const struct oai_request *rq, char *text, size_t *n, struct oai_err *e) {
    json_t *last = json_array_get(rq->messages, json_array_size(rq->messages) - 1);
    json_t *content = json_object_get(last, "content");
    const char *role = json_string_value(json_object_get(last, "role"));
    if (!role || strcmp(role, "assistant") != 0 || !json_is_string(content))
        return oai_bad(e, "continue_final_message",
                       "continue_final_message needs a final assistant message with text");
    const char *c = json_string_value(content);
    size_t cl = json_string_length(content);
    const char *hit = NULL;
    for (const char *p = text; cl && (p = memmem(p, *n - (size_t)(p - text), c, cl)); p++)
        hit = p;
    if (cl && !hit)
        return oai_bad(e, "continue_final_message",
                       "the template does not render the final message's content verbatim");
    if (hit) *n = (size_t)(hit - text) + cl;
    text[*n] = 0;
    return true;
}

/* A copy of messages where each assistant message that carries reasoning_content (or
 * reasoning) as a string also has it as `thinking` (harmony templates). NULL on OOM. */
static json_t *with_thinking(json_t *messages) {
    json_t *out = json_deep_copy(messages);
    size_t i;
    json_t *m;
    json_array_foreach(out, i, m) {
        json_t *r = json_object_get(m, "reasoning_content");
        if (!json_is_string(r)) r = json_object_get(m, "reasoning");
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && !strcmp(role, "assistant") && json_is_string(r) &&
            json_object_set(m, "thinking", r) != 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

bool gen_chat_prompt(const struct server_model *m, const struct oai_request *rq,
                     struct chat_prompt *cp, struct oai_err *e) {
    memset(cp, 0, sizeof *cp);
    if (!m->tmpl)
        return oai_fail(e, 400, "invalid_request_error", "messages", "no_chat_template",
                        "This model has no chat template: use /v1/completions, or start the "
                        "server with --chat-template FILE");
    bool tools = rq->tools && rq->tool_choice != OAI_TOOLS_NONE;
    const struct tmpl *t = m->tmpl;
    cp->tmpl_src = m->tmpl_src;
    if (tools && m->tmpl_tools) {
        t = m->tmpl_tools;
        cp->tmpl_src = m->tmpl_tools_src;
    }
    if (tools && cp->tmpl_src && !outp_template_has_tools(cp->tmpl_src))
        return oai_fail(e, 400, "invalid_request_error", "tools", "tools_not_supported",
                        "This model's chat template does not render tools, so the model "
                        "would never see them%s. Send the request without 'tools' (or with "
                        "tool_choice 'none'), or start the server with a --chat-template that "
                        "supports tools.",
                        m->tmpl_fallback ? " (the model has no chat template; the ChatML "
                                             "default is in use)" : "");
    bool forced = tools && (rq->tool_choice == OAI_TOOLS_REQUIRED ||
                            rq->tool_choice == OAI_TOOLS_NAMED);
    const char *choice = rq->tool_choice == OAI_TOOLS_NAMED ? rq->tool_name : "required";
    if (forced && !outp_syntax_known(cp->tmpl_src))
        return oai_fail(e, 400, "invalid_request_error", "tool_choice", "tool_choice_unsupported",
                        "tool_choice '%.*s' cannot be enforced for this model: its chat "
                        "template's tool-call syntax is not one smelt knows (Hermes/Qwen "
                        "<tool_call>, Qwen3-Coder <function=...>, Mistral [TOOL_CALLS], "
                        "Llama 3 JSON, gpt-oss harmony). Use tool_choice 'auto'.",
                        oai_clip(choice, 64), choice);
    /* (harmony is the whole reply format: parsed with or without tools) */
    cp->syntax = tools || outp_template_harmony(cp->tmpl_src) ? outp_syntax_of(cp->tmpl_src)
                                                              : OUTP_TOOLS_NONE;
    if (forced && rq->tool_choice == OAI_TOOLS_NAMED && !outp_force_ok(cp->syntax, rq->tool_name))
        return oai_fail(e, 400, "invalid_request_error", "tool_choice", "tool_choice_unsupported",
                        "tool_choice names '%.*s', which this model's tool-call syntax cannot "
                        "write (a name with spaces, '<' or '>'). Use tool_choice 'auto'.",
                        oai_clip(rq->tool_name, 64), rq->tool_name);
    cp->reasoning = outp_template_reasons(cp->tmpl_src);

    bool gen_prompt = rq->add_generation_prompt && !rq->continue_final_message;
    json_t *kw = rq->template_kwargs, *own = NULL;
    if (rq->reasoning_effort) {
        own = kw ? json_copy(kw) : json_object();
        if (!own) return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        const char *re = rq->reasoning_effort;
        bool off = !strcmp(re, "none") || !strcmp(re, "minimal");
        if (!json_object_get(own, "reasoning_effort"))
            json_object_set_new(own, "reasoning_effort",
                                json_string(off && cp->syntax == OUTP_HARMONY ? "low" : re));
        if (off && !json_object_get(own, "enable_thinking"))
            json_object_set_new(own, "enable_thinking", json_false());
        kw = own;
    }
    json_t *msgs = rq->messages, *own_msgs = NULL;
    if (cp->syntax == OUTP_HARMONY && !(msgs = own_msgs = with_thinking(rq->messages))) {
        json_decref(own);
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    struct tmpl_value *ctx = NULL;
    struct err te;
    err_clear(&te);
    smelt_status st = tmpl_chat_ctx(msgs, tools ? rq->tools : NULL, gen_prompt,
                                    m->bos_text, m->eos_text, kw, &ctx, &te);
    json_decref(own);
    json_decref(own_msgs);
    char *text = NULL;
    size_t n = 0;
    if (st == SMELT_OK) st = tmpl_render(t, ctx, NULL, &text, &n, &te);
    tmpl_value_free(ctx);
    if (st != SMELT_OK) {
        if (st == SMELT_ERR_NOMEM)
            return oai_fail(e, 500, "server_error", NULL, NULL, "chat template: %s", te.msg);
        return oai_fail(e, 400, "invalid_request_error", "messages", "chat_template_error",
                        "The chat template failed on these messages: %s", te.msg);
    }
    if (rq->continue_final_message && !cut_final(rq, text, &n, e)) {
        free(text);
        return false;
    }
    /* a reasoning template may open <think> in the prompt: the reply starts inside */
    size_t k = n;
    while (k && (text[k - 1] == '\n' || text[k - 1] == ' ')) k--;
    cp->in_reasoning = cp->reasoning && k >= 7 && !memcmp(text + k - 7, "<think>", 7);
    if (forced) {
        char *open = outp_force_prefix(cp->syntax, cp->tmpl_src,
                                       rq->tool_choice == OAI_TOOLS_NAMED ? rq->tool_name : NULL);
        struct jw w = {0};
        if (cp->in_reasoning) jw_str(&w, "</think>\n\n");
        if (open) jw_str(&w, open);
        free(open);
        char *all = open && !w.oom ? realloc(text, n + w.n + 1) : NULL;
        if (!all) {
            jw_free(&w);
            free(text);
            return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
        text = all;
        memcpy(text + n, w.p, w.n + 1);
        n += w.n;
        cp->prefill = w.p;
        cp->prefill_len = w.n;
    }
    cp->text = text;
    cp->len = n;
    return true;
}

bool gen_chat_tokenize(const struct server_model *m, const struct chat_prompt *cp,
                       struct tok_ids *ids, struct oai_err *e) {
    /* the template writes the special tokens itself, except the ChatML fallback's BOS */
    const struct tok_special *sp = tok_specials(m->tok);
    if (m->tmpl_fallback && tok_add_bos(m->tok) && sp->bos >= 0 &&
        tok_ids_push(ids, sp->bos) != SMELT_OK)
        return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return gen_tokenize(m, cp->text, cp->len, TOK_PARSE_SPECIAL, "messages", ids, e);
}
