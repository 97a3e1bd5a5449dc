/* Model references on the command line: every command that takes a model (run, serve,
 * bench, inspect, tokenize) passes its argument through cli_resolve_model.
 *
 * A reference is, in this order:
 *   1. an existing file: used as is (a split part other than the first is mapped to the
 *      first, "-00001-of-" beside it, when that exists);
 *   2. an existing directory: the model in it (hub_find_in_dir: Q4_K_M, else the only one);
 *   3. org/repo[:quant][@revision]: looked up in the Hugging Face cache without network;
 *      when absent and allow_pull, pulled from the hub (with a progress display on stderr).
 * A path that does not exist and ends in .gguf (or starts with /, ./, ../, ~) is a missing
 * file, never a repo. */
#ifndef SMELT_CLI_MODELREF_H
#define SMELT_CLI_MODELREF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hub/hub.h"
#include "util/err.h"

/* Resolves ref to the local path of a GGUF file (the first file of a split set) in
 * path_out. allow_pull: download a hub reference that is not cached (run, serve); else a
 * missing one is SMELT_ERR_NOT_FOUND with a hint to run `smelt pull`. HF_HUB_OFFLINE=1
 * forbids the download. Returns SMELT_OK or the error in e. */
smelt_status cli_resolve_model(const char *ref, bool allow_pull, char *path_out, size_t n,
                               struct err *e);

/* True when ref names a local file or folder (it exists, or it reads as a path: rule 1, 2 or
 * the missing-file case above), false for a hub reference. */
bool cli_model_is_local(const char *ref);

/* Progress display for hub transfers: a bar (bytes, rate, time left) when stderr is a
 * terminal, plain lines every 10% or 5 s otherwise. ctx is a struct cli_progress. */
struct cli_progress {
    bool tty;
    bool quiet;          /* print nothing */
    int last_file;       /* index of the file last shown */
    double last_line;    /* elapsed time of the last plain line */
    int last_decile;     /* last 10% step printed as a plain line */
    double rate;         /* bytes/s, smoothed over the last seconds */
    double sample_t;     /* elapsed time and bytes at the last rate sample */
    uint64_t sample_done;
    uint64_t first_done; /* bytes on disk at the file's first report (a resumed prefix) */
};
void cli_progress_init(struct cli_progress *p, bool quiet);
void cli_hub_progress(void *ctx, const struct hub_progress *p);

#endif
