/* The request parsers of the APIs served over the chat machinery: an Anthropic Messages or
 * OpenAI Responses body becomes the body of an OpenAI chat request (messages, tools,
 * tool_choice, stop, sampling, template switches), parsed by oai_parse_json into the struct
 * oai_request that gen.c runs. Each field is checked here first, so a refusal is a 400 that
 * names the field as the API calls it; everything these APIs define that smelt cannot honour
 * is refused, not ignored (docs/server.md lists both). Pure functions of their input (no
 * server state): the fuzz target fuzz_api_request drives them. */
#ifndef SMELT_SERVER_APIS_H
#define SMELT_SERVER_APIS_H

#include <jansson.h>
#include <stdbool.h>

#include "server/oai.h"

/* Anthropic Messages (/v1/messages; count: /v1/messages/count_tokens, where max_tokens is
 * not needed). req: the body (borrowed). On success rq holds a chat request (n 1).
 * Claude Code's per-request billing line is dropped from the system prompt (see
 * anthropic.c). */
bool anth_parse(json_t *req, bool count, int32_t n_vocab, const struct sample_params *defaults,
                struct oai_request *rq, struct oai_err *e);
/* An error in Anthropic's shape: {"type": "error", "error": {"type", "message"}} (malloc'd),
 * its type from the status (invalid_request_error, authentication_error, ...). */
char *anth_err_json(const struct oai_err *e);

/* OpenAI Responses (/v1/responses). req: the body (borrowed). history: the conversation that
 * previous_response_id names, as chat messages (borrowed; NULL: none); it comes after the
 * instructions and before the input. */
bool resp_parse(json_t *req, const json_t *history, int32_t n_vocab,
                const struct sample_params *defaults, struct oai_request *rq, struct oai_err *e);

#endif
