/* smelt tokenize MODEL "text" [--ids|--pieces] [--no-special] [--no-bos]
 *                              [--file PATH] [--bench N]
 *
 * Prints the tokens of a text as the model's tokenizer produces them. MODEL is a GGUF
 * path. By default special tokens written in the text are parsed (--no-special keeps
 * them literal) and BOS/EOS are added as the vocab says (--no-bos adds neither).
 *   (default)  one token per line: id, a tab, the piece in quotes
 *   --ids      the ids on one line, separated by spaces
 *   --pieces   the pieces on one line, each in quotes
 * Pieces are the decoded bytes of each token, with \n \t \r \\ \' and \xNN escapes for
 * control bytes and bytes that are not part of a valid UTF-8 character.
 * --file PATH reads the text from a file ("-" for stdin) instead of the argument.
 * --bench N encodes the text N times after one warm-up and prints the speed to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "format/gguf.h"
#include "tokenizer/tok.h"
#include "util/utf8.h"

static void usage(FILE *f) {
    fprintf(f, "usage: smelt tokenize MODEL TEXT [--ids|--pieces] [--no-special] [--no-bos]\n"
               "       smelt tokenize MODEL --file PATH [...] [--bench N]\n"
               "  --ids         print only the ids, on one line\n"
               "  --pieces      print only the pieces, on one line\n"
               "  --no-special  keep special tokens in the text literal (\"<|im_start|>\")\n"
               "  --no-bos      add no BOS/EOS\n"
               "  --file PATH   read the text from PATH (\"-\": stdin)\n"
               "  --bench N     encode N times and print MB/s to stderr\n");
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        size_t k = fread(p + n, 1, cap - n, f);
        n += k;
        if (n < cap) break;
        char *q = realloc(p, cap * 2);
        if (!q) {
            free(p);
            p = NULL;
            break;
        }
        p = q;
        cap *= 2;
    }
    if (f != stdin) fclose(f);
    *len = n;
    return p;
}

static void print_piece(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    putchar('\'');
    for (size_t i = 0; i < n;) {
        uint8_t b = u[i];
        uint32_t cp;
        size_t k = b >= 0x80 ? utf8_decode(u + i, n - i, &cp) : 1;
        if (b >= 0x80 && k) {
            fwrite(u + i, 1, k, stdout);
            i += k;
            continue;
        }
        if (b == '\n')
            fputs("\\n", stdout);
        else if (b == '\t')
            fputs("\\t", stdout);
        else if (b == '\r')
            fputs("\\r", stdout);
        else if (b == '\\')
            fputs("\\\\", stdout);
        else if (b == '\'')
            fputs("\\'", stdout);
        else if (b < 0x20 || b >= 0x7F)
            printf("\\x%02x", b);
        else
            putchar(b);
        i++;
    }
    putchar('\'');
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    enum { OUT_TABLE, OUT_IDS, OUT_PIECES } mode = OUT_TABLE;
    unsigned flags = TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL;
    long bench = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--ids")) {
            mode = OUT_IDS;
        } else if (!strcmp(a, "--pieces")) {
            mode = OUT_PIECES;
        } else if (!strcmp(a, "--no-special")) {
            flags &= ~TOK_PARSE_SPECIAL;
        } else if (!strcmp(a, "--no-bos")) {
            flags &= ~TOK_ADD_SPECIAL;
        } else if (!strcmp(a, "--file") && i + 1 < argc) {
            file = argv[++i];
        } else if (!strcmp(a, "--bench") && i + 1 < argc) {
            bench = strtol(argv[++i], NULL, 10);
            if (bench < 1) {
                fprintf(stderr, "smelt tokenize: --bench wants a count >= 1\n");
                return 2;
            }
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "smelt tokenize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!model) {
            model = a;
        } else if (!text) {
            text = a;
        } else {
            fprintf(stderr, "smelt tokenize: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || (!text && !file) || (text && file)) {
        usage(stderr);
        return 2;
    }
    size_t len = 0;
    char *owned = NULL;
    if (file) {
        owned = read_all(file, &len);
        if (!owned) {
            fprintf(stderr, "smelt tokenize: cannot read %s\n", file);
            return 1;
        }
        text = owned;
    } else {
        len = strlen(text);
    }

    struct err e = {0};
    struct gguf_file *g = NULL;
    struct tok *t = NULL;
    int rc = 1;
    if (gguf_open(&g, model, &e) != SMELT_OK || tok_new_from_gguf(&t, g, &e) != SMELT_OK) {
        rc = cli_fail("tokenize", &e);
        goto done;
    }
    gguf_close(g); /* the tokenizer keeps its own copy */
    g = NULL;

    struct tok_ids ids = {0};
    if (tok_encode(t, text, len, flags, &ids, &e) != SMELT_OK) {
        rc = cli_fail("tokenize", &e);
        goto done;
    }
    if (bench) {
        double t0 = now_s();
        for (long r = 0; r < bench; r++) {
            ids.n = 0;
            if (tok_encode(t, text, len, flags, &ids, &e) != SMELT_OK) {
                rc = cli_fail("tokenize", &e);
                tok_ids_free(&ids);
                goto done;
            }
        }
        double dt = (now_s() - t0) / (double)bench;
        fprintf(stderr, "tokenize: %zu bytes -> %zu tokens in %.3f ms: %.2f MB/s\n", len, ids.n,
                dt * 1e3, (double)len / dt / 1e6);
    }
    if (mode == OUT_IDS) {
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %d" : "%d", ids.v[i]);
        putchar('\n');
    } else {
        for (size_t i = 0; i < ids.n; i++) {
            size_t n;
            const char *p = tok_piece(t, ids.v[i], &n);
            if (mode == OUT_TABLE) {
                printf("%d\t", ids.v[i]);
                print_piece(p, n);
                putchar('\n');
            } else {
                if (i) putchar(' ');
                print_piece(p, n);
            }
        }
        if (mode == OUT_PIECES) putchar('\n');
    }
    tok_ids_free(&ids);
    rc = 0;
done:
    tok_free(t);
    gguf_close(g);
    free(owned);
    return rc;
}
