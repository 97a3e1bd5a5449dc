/* One model of `smelt serve`, loaded: its GGUF file, tokenizer, chat templates, backend,
 * weights, memory plan, KV pool and engine, built from its settings (config/config.h:
 * model index ci, -1 for the server-wide ones), and the view of it the server reads
 * (struct server_model). Each loaded model has its own backend instance (its own device,
 * its own CPU thread pool) and its own engine thread.
 *
 * Sampling defaults: the model file's general.sampling.* (temp, top_k, top_p, min_p,
 * penalty_repeat, penalty_last_n, as llama.cpp writes them) < the model's settings (temp,
 * top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed: the config file, environment,
 * flags, the models: entry) < the request's own fields (server/oai.h).
 *
 * --fake-forward replaces the model's forward pass with a stub that returns fixed logits
 * (the tokenizer still comes from the file): it measures the server and the engine's host
 * work alone. With --fake-reply TEXT every reply is TEXT, token by token, then end of
 * generation: tests drive the server's output paths with exactly the text they need; the
 * file then only has to hold a vocabulary. */
#ifndef SMELT_CLI_SERVE_MODEL_H
#define SMELT_CLI_SERVE_MODEL_H

#include <stdio.h>

#include "config/config.h"
#include "server/server.h"
#include "util/err.h"

struct serve_inst;

/* Loads model ref (a path or a hub reference, pulled when absent) with the settings of
 * model ci of c, and fills sm's loaded parts (engine, tokenizer, templates, n_ctx,
 * created, sampling defaults; not its names). cmd prefixes the lines it prints ("smelt
 * serve: ..."). On failure nothing is left allocated. */
smelt_status serve_inst_load(const struct cfg *c, int ci, const char *ref, struct serve_inst **out,
                             struct server_model *sm, struct err *e);
/* Stops the model's engine and frees everything it loaded. NULL is a no-op. */
void serve_inst_free(struct serve_inst *in);
/* The resolved file of a loaded model (for its default name). */
const char *serve_inst_path(const struct serve_inst *in);
/* One line describing the loaded model ("on cpu: 64 sequences, ..."), into buf. */
const char *serve_inst_describe(const struct serve_inst *in, char *buf, size_t n);

#endif
