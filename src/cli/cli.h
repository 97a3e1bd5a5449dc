/* smelt subcommands. Each lives in its own cmd_*.c and is listed in main.c's table.
 * A command returns the process exit code: 0 ok, 1 runtime failure, 2 usage error. */
#ifndef SMELT_CLI_H
#define SMELT_CLI_H

#include "util/err.h"

int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_config(int argc, char **argv);

/* Prints "smelt CMD: <status>: <message>" to stderr and returns 1. */
int cli_fail(const char *cmd, const struct err *e);

#endif
