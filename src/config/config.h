/* Settings: one table (settings.c) of every setting a command takes, and the layers that
 * set them (docs/config.md).
 *
 * Each setting has a key (`max_seqs`), from which the rest is derived: the YAML key is the
 * key, the flag is `--max-seqs` (plus an optional one-letter alias, `-t`), the environment
 * variable is `SMELT_MAX_SEQS`. The table also gives the type, the default, the range or
 * choices, the help text (`--help` is generated from it) and the commands it applies to.
 *
 * Layers, lowest first; a higher one replaces a lower one's value:
 *   default < the config file (YAML) < SMELT_* environment variables < command-line flags
 *           < --set KEY=VALUE
 * The config file is --config FILE, else $SMELT_CONFIG, else the first of ./smelt.yaml and
 * $XDG_CONFIG_HOME/smelt/smelt.yaml (~/.config/smelt/smelt.yaml) that exists.
 *
 * Models (smelt serve): the file's `models:` list holds entries, each with a model's own
 * settings (CFG_PER_MODEL keys, and the entry-only ones: name, aliases, pinned). A model's
 * value of a per-model key is its entry's when the entry sets it (the more specific
 * setting wins, from whatever layer), else the server-wide one. `--set models.NAME.KEY=V`
 * sets an entry's key from the command line.
 *
 * Every value is checked where it is read: an unknown key, a wrong type or a bad value is
 * refused with where it came from (file and line, the variable, the flag) and the key.
 * Nothing here exits: errors come back as a status and a message.
 */
#ifndef SMELT_CONFIG_H
#define SMELT_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "util/err.h"

/* ---- the table ---- */

/* The settings, by their index in the table (settings.c holds one entry for each). */
enum cfg_key {
    /* serve: server-wide */
    CFG_MODEL,
    CFG_MODELS_DIR,
    CFG_SERVED_MODEL_NAME,
    CFG_MAX_LOADED_MODELS,
    CFG_HOST,
    CFG_PORT,
    CFG_API_KEY,
    CFG_API_KEY_FILE,
    CFG_HTTP_THREADS,
    CFG_TIMEOUT,
    CFG_HEADER_TIMEOUT,
    CFG_MAX_BODY,
    CFG_BODY_BUDGET,
    CFG_MAX_CONNECTIONS,
    CFG_MAX_CONNECTIONS_PER_CLIENT,
    CFG_ADMIN_PORT,
    CFG_ADMIN_HOST,
    CFG_CORS_ORIGINS,
    CFG_RESPONSE_STORE,
    CFG_NO_WEBUI,
    CFG_LOG_FORMAT,
    CFG_QUIET,
    CFG_GRACE,
    /* a models: entry's own */
    CFG_NAME,
    CFG_ALIASES,
    CFG_PINNED,
    /* per model (server-wide, or in an entry) */
    CFG_CHAT_TEMPLATE,
    CFG_ALLOW_UNKNOWN_PRETOKENIZER,
    CFG_BACKEND,
    CFG_DEVICE,
    CFG_N_CPU_MOE,
    CFG_THREADS,
    CFG_MAX_SEQS,
    CFG_MAX_BATCH_TOKENS,
    CFG_ITL_TARGET_MS,
    CFG_MAX_WAITING,
    CFG_CTX_SIZE,
    CFG_KV_SIZE,
    CFG_GPU_MEMORY_UTILIZATION,
    CFG_BLOCK_SIZE,
    CFG_NO_PREFIX_CACHE,
    CFG_F32_KV,
    CFG_TTL,
    CFG_TEMP,
    CFG_TOP_K,
    CFG_TOP_P,
    CFG_MIN_P,
    CFG_REPEAT_PENALTY,
    CFG_REPEAT_LAST_N,
    CFG_SEED,
    CFG_SPEC,
    CFG_DRAFT,
    CFG_SPEC_K,
    CFG_SPEC_MAX_BATCH,
    CFG_SPEC_FIXED,
    CFG_FAKE_FORWARD,
    CFG_FAKE_STEP_MS,
    CFG_FAKE_REPLY,
    CFG_FAKE_FAIL_AT,
    CFG_FAKE_LOAD_MS,
    CFG_N
};

enum cfg_type {
    CFG_BOOL, /* a flag without a value; true/false, yes/no, on/off, 1/0 elsewhere */
    CFG_INT,  /* an integer in [lo, hi] */
    CFG_NUM,  /* a finite number in [lo, hi] ((lo, hi] with lo_open) */
    CFG_STR,
    CFG_ENUM, /* one of choices */
    CFG_LIST, /* strings: a flag may repeat; a YAML list or one string; env: comma-separated */
};

/* Where a setting applies (cfg_def.where). */
#define CFG_SERVE 1u       /* smelt serve (and smelt config, which shows serve's) */
#define CFG_PER_MODEL 16u  /* may also be set in a models: entry */
#define CFG_ENTRY 32u      /* only in a models: entry (name, aliases, pinned) */
#define CFG_SECRET 64u     /* never printed (smelt config shows that it is set) */
#define CFG_POSITIONAL 128u /* positional arguments append to it (serve's MODEL) */

/* --help's sections. */
enum cfg_section {
    CFG_SEC_MODELS,
    CFG_SEC_SERVER,
    CFG_SEC_ENGINE,
    CFG_SEC_SAMPLING,
    CFG_SEC_SPEC,
    CFG_SEC_TEST
};

struct cfg_def {
    const char *key;     /* YAML key; flag --key ('_' as '-'); environment SMELT_KEY */
    char short_flag;     /* a one-letter alias (-t), or 0 */
    uint8_t type;        /* enum cfg_type */
    uint8_t section;     /* enum cfg_section */
    unsigned where;      /* CFG_SERVE ... */
    const char *def;     /* the default, as a value's text; NULL: unset (help says what then) */
    double lo, hi;       /* CFG_INT, CFG_NUM: the range */
    bool lo_open;        /* lo itself is out of range */
    const char *choices; /* CFG_ENUM: "text|json" */
    const char *arg;     /* the value's name in --help ("N", "FILE"); NULL for CFG_BOOL */
    const char *help;
};

/* The table, indexed by enum cfg_key. */
extern const struct cfg_def cfg_defs[CFG_N];

/* The index of key (the YAML spelling), or -1. */
int cfg_find(const char *key);

/* ---- values ---- */

enum cfg_src { CFG_SRC_DEFAULT, CFG_SRC_FILE, CFG_SRC_ENV, CFG_SRC_FLAG, CFG_SRC_SET };

struct cfg_val {
    bool set;          /* holds a value (the default counts); else unset */
    uint8_t src;       /* enum cfg_src of the value */
    uint32_t line;     /* CFG_SRC_FILE: its line */
    bool b;            /* CFG_BOOL */
    int64_t i;         /* CFG_INT */
    double d;          /* CFG_NUM */
    char *s;           /* CFG_STR, CFG_ENUM (owned) */
    char **list;       /* CFG_LIST (owned) */
    int n_list;
};

/* A models: entry. */
struct cfg_entry {
    uint32_t line;           /* where it starts in the file */
    struct cfg_val v[CFG_N]; /* its own settings (unset: the server-wide value) */
};

struct cfg {
    unsigned cmd;            /* CFG_SERVE */
    const char *cmd_name;    /* "serve": the prefix of messages */
    char *file;              /* the config file read (NULL: none) */
    struct cfg_val v[CFG_N]; /* server-wide values */
    struct cfg_entry *models;
    int n_models;
};

/* Fills c with the defaults of cmd's settings. */
smelt_status cfg_init(struct cfg *c, unsigned cmd, const char *cmd_name, struct err *e);
void cfg_free(struct cfg *c);

/* A model's value of key k: the entry's own when model >= 0 and it sets k, else the
 * server-wide one. */
const struct cfg_val *cfg_get(const struct cfg *c, int model, enum cfg_key k);
/* Shorthands over cfg_get: an unset value reads as false / 0 / NULL. */
bool cfg_bool(const struct cfg *c, int model, enum cfg_key k);
int64_t cfg_int(const struct cfg *c, int model, enum cfg_key k);
double cfg_num(const struct cfg *c, int model, enum cfg_key k);
const char *cfg_str(const struct cfg *c, int model, enum cfg_key k);
bool cfg_has(const struct cfg *c, int model, enum cfg_key k);

/* Parses text as d's value into v (which must be empty). text_ok false: the text was a
 * YAML quoted scalar, a string only, refused for a number or boolean key. On failure *why
 * says what was wrong, without the key or the source (the caller adds them). */
bool cfg_parse_value(const struct cfg_def *d, const char *text, bool text_ok, struct cfg_val *v,
                     char *why, size_t nwhy);

/* ---- the layers ---- */

/* Parses a YAML document (text[0..n), named name in messages) into the file layer. A key
 * that is unknown, not cmd's, of the wrong type, out of range or given twice is refused
 * with "NAME:LINE: KEY: why". At most 1 MiB, 1024 models, 256 list items. */
smelt_status cfg_load_yaml(struct cfg *c, const char *name, const char *text, size_t n,
                           struct err *e);
/* Reads and parses the YAML file path. */
smelt_status cfg_load_file(struct cfg *c, const char *path, struct err *e);
/* The environment layer: SMELT_KEY for each of cmd's server-wide keys that is set (an
 * empty variable sets an empty string, and is ignored for other types). getenv_fn: NULL for
 * getenv (tests pass their own). */
smelt_status cfg_load_env(struct cfg *c, const char *(*getenv_fn)(const char *name),
                          struct err *e);
/* Sets key to the value's text at layer src (CFG_SRC_ENV, CFG_SRC_FLAG, CFG_SRC_SET). key
 * may be "models.NAME.KEY": the entry named NAME (its name, or its model's file name when
 * it has none). what names the setting in messages ("--port 70000", "--set port=1"). A
 * list value appends to a list set from the same layer (a repeated flag), else replaces. */
smelt_status cfg_set_text(struct cfg *c, enum cfg_src src, const char *key, const char *value,
                          const char *what, struct err *e);

/* Everything a command line says, applied in layer order: the file (--config FILE, else
 * $SMELT_CONFIG, else ./smelt.yaml or ~/.config/smelt/smelt.yaml), the environment, the
 * flags, --set. argv[0] is the command's name. -h/--help prints the help to stdout and
 * returns 0; a refusal prints "smelt CMD: ..." to stderr and returns 2 (usage) or 1 (an
 * unreadable file); else returns -1. usage: the first line of --help. */
int cfg_load_args(struct cfg *c, int argc, char **argv, const char *usage);

/* --help: usage, then cmd's flags by section, each with its help and default. */
void cfg_help(FILE *f, unsigned cmd, const char *usage);

/* The effective settings as YAML, each with a comment saying where it came from (default,
 * FILE:LINE, $SMELT_KEY, --flag, --set); secrets show as "(set)". */
void cfg_print(FILE *f, const struct cfg *c);
/* A value as text (YAML), into buf. */
const char *cfg_val_text(const struct cfg_def *d, const struct cfg_val *v, char *buf, size_t n);
/* Where v came from, as text: "default", "smelt.yaml:12", "$SMELT_PORT", "--port", "--set". */
const char *cfg_src_text(const struct cfg *c, enum cfg_key k, const struct cfg_val *v, char *buf,
                         size_t n);

#endif
