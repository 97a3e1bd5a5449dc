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

/* ---- the models a server offers ---- */

/* One model, from the settings: its place in them, what to load, its names. */
struct serve_entry {
    int ci;              /* its settings: a models: entry's index, or -1 (the server-wide ones) */
    char *ref;           /* what to load: a resolved file, or a hub reference pulled at load */
    char *name;          /* its name in the API */
    char **aliases;      /* other names (listed) */
    int n_aliases;
    char *hidden;        /* the reference as given, when it differs from the name (accepted) */
    bool pinned, preload;
    int device;          /* the CUDA device it will run on, -1 for the CPU */
    char from[64];       /* where it was given ("--model", "models[2]", "--models-dir") */
};
struct serve_list {
    struct serve_entry *v;
    int n;
};

/* The models of c, in order: the model list (positional arguments, -m), the config file's
 * models: entries, then each GGUF file (and each folder holding one) of models_dir, sorted.
 * The first is the default and, unless it comes from models_dir, is loaded at start (so are
 * pinned ones): with pull, a
 * reference of those is pulled now; the others' references are resolved from the cache
 * when they are there (and pulled at their load otherwise). Names come from served_model_name (one model
 * only), an entry's name, else the file name without .gguf; a name (or alias) given twice
 * is refused. */
smelt_status serve_list_build(const struct cfg *c, bool pull, struct serve_list *out,
                              struct err *e);
void serve_list_free(struct serve_list *l);
/* Prints the list (smelt config): one line per model with its name, file and flags. */
void serve_list_print(FILE *f, const struct serve_list *l);

/* ---- one model, loaded ---- */

struct serve_inst;

/* Loads model ref (a path or a hub reference, pulled when absent) with the settings of
 * model ci of c, and fills sm's loaded parts (engine, tokenizer, templates, n_ctx,
 * created, sampling defaults; not its names). others_b: device bytes other loaded models
 * hold on its device (their share is not charged to this one's --gpu-memory-utilization).
 * name labels its lines. On failure nothing is left allocated. */
smelt_status serve_inst_load(const struct cfg *c, int ci, const char *ref, const char *name,
                             uint64_t others_b, struct serve_inst **out, struct server_model *sm,
                             struct err *e);
/* Device bytes the loaded model holds (0 on the CPU). */
uint64_t serve_inst_device_bytes(const struct serve_inst *in);
/* Stops the model's engine and frees everything it loaded. NULL is a no-op. */
void serve_inst_free(struct serve_inst *in);
/* The resolved file of a loaded model (for its default name). */
const char *serve_inst_path(const struct serve_inst *in);
/* One line describing the loaded model ("on cpu: 64 sequences, ..."), into buf. */
const char *serve_inst_describe(const struct serve_inst *in, char *buf, size_t n);

#endif
