/* Backend selection shared by the commands that run a model (run, serve, bench).
 *
 * name: "auto" (CUDA when this build has it and a device is visible, else CPU), "cpu" or
 * "cuda". device: the CUDA device index (CUDA_VISIBLE_DEVICES applies first), or -1 when
 * the user gave none (device 0 if CUDA is picked); a device given while the choice is the
 * CPU is an error, not silently ignored. threads: CPU worker threads (0 = all cores; the
 * CUDA backend ignores it). */
#ifndef SMELT_CLI_BACKEND_H
#define SMELT_CLI_BACKEND_H

#include "backend/backend.h"

smelt_status cli_backend_new(const char *name, int device, int threads, struct backend **out,
                             struct err *e);
/* True when cli_backend_new(name, ...) would pick the CUDA backend. */
bool cli_backend_is_cuda(const char *name);

#endif
