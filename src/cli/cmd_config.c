/* smelt config [options]: the settings `smelt serve` would run with, from every layer (the
 * config file, SMELT_* variables, flags, --set), printed as YAML with where each value came
 * from (config/config.h, docs/config.md), then the models the server would offer (nothing
 * is downloaded). It takes serve's options and checks them as serve does, so a bad file or
 * flag is refused here the same way. */
#include <stdio.h>

#include "cli/cli.h"
#include "cli/serve_model.h"
#include "config/config.h"

#define USAGE                                                                                     \
    "usage: smelt config [MODEL...] [options]\n"                                                  \
    "  print the settings smelt serve would use with these options, and where each came from"

int cmd_config(int argc, char **argv) {
    struct err e;
    struct cfg c;
    if (cfg_init(&c, CFG_SERVE, "config", &e) != SMELT_OK) return cli_fail("config", &e);
    int rc = cfg_load_args(&c, argc, argv, USAGE);
    if (rc < 0) {
        cfg_print(stdout, &c);
        struct serve_list l;
        if (serve_list_build(&c, false, &l, &e) == SMELT_OK) serve_list_print(stdout, &l);
        else printf("# the models: %s\n", e.msg);
        serve_list_free(&l);
        rc = 0;
    }
    cfg_free(&c);
    return rc;
}
