/* smelt — command-line entry point: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include "build_info.h" /* generated at build time: cmake/build_info.cmake */
#include "cli/cli.h"
#include "smelt.h"

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct command commands[] = {
    {"serve", cmd_serve, "serve a model over an OpenAI-compatible HTTP API"},
    {"run", cmd_run, "generate text from a prompt, or chat with -i"},
    {"bench", cmd_bench, "measure prefill and decode speed (llama-bench flags)"},
    {"compare", cmd_compare, "two models (or settings) side by side: speed, agreement, KL, perplexity"},
    {"pull", cmd_pull, "download a model into the Hugging Face cache"},
    {"inspect", cmd_inspect, "print a GGUF file's metadata and tensors"},
    {"quantize", cmd_quantize, "convert a GGUF to another weight type, or write a random model"},
    {"tokenize", cmd_tokenize, "print the tokens of a text"},
    {"template", cmd_template, "render a model's chat template for a conversation"},
    {"config", cmd_config, "print the settings smelt serve would use, and where each came from"},
};

int cli_fail(const char *cmd, const struct err *e) {
    fprintf(stderr, "smelt %s: %s: %s\n", cmd, smelt_status_str(e->code), e->msg);
    return 1;
}

static void usage(FILE *out) {
    fprintf(out, "smelt %s — LLM inference engine\n\nusage: smelt COMMAND [ARGS]\n\ncommands:\n",
            smelt_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\nRun 'smelt COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("smelt %s (commit %s, build %d)\n", smelt_version(), SMELT_BUILD_COMMIT, SMELT_BUILD_NUMBER);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "smelt: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
