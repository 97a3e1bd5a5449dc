/* smelt tokenize MODEL "text" [--ids|--pieces] [--no-special] [--no-bos]
 *                              [--file PATH] [--bench N]
 *
 * Prints the tokens of a text as the model's tokenizer produces them. MODEL is a GGUF
 * file, a directory holding one, or org/repo[:quant] in the Hugging Face cache. By default special tokens written in the text are parsed (--no-special keeps
 * them literal) and BOS/EOS are added as the vocab says (--no-bos adds neither).
 *   (default)  one token per line: id, a tab, the piece in quotes
 *   --ids      the ids on one line, separated by spaces
 *   --pieces   the pieces on one line, each in quotes
 * Pieces are the decoded bytes of each token, with \n \t \r \\ \' and \xNN escapes for
 * control bytes and bytes that are not part of a valid UTF-8 character.
 * --file PATH reads the text from a file ("-" for stdin) instead of the argument.
 * --split SEP treats the text as several texts separated by SEP and prints the tokens of
 *   each on one line (--ids / --pieces format).
 * --pre NAME uses another pre-tokenizer than the file names (a tokenizer.ggml.pre value).
 * --allow-unknown-pretokenizer loads a pre-tokenizer smelt does not implement with GPT-2's
 *   split instead of failing.
 * --bench N encodes the text N more times and prints the best time and MB/s to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/modelref.h"
#include "format/gguf.h"
#include "tokenizer/tok.h"
#include "util/clock.h"
#include "util/file.h"
#include "util/utf8.h"

static void usage(FILE *f) {
    fprintf(f, "usage: smelt tokenize MODEL TEXT [--ids|--pieces] [--no-special] [--no-bos]\n"
               "       smelt tokenize MODEL --file PATH [...] [--bench N]\n"
               "  MODEL         a GGUF file, a directory, or org/repo[:quant] in the HF cache\n"
               "  --ids         print only the ids, on one line\n"
               "  --pieces      print only the pieces, on one line\n"
               "  --no-special  keep special tokens in the text literal (\"<|im_start|>\")\n"
               "  --no-bos      add no BOS/EOS\n"
               "  --file PATH   read the text from PATH (\"-\": stdin)\n"
               "  --split SEP   the text is several texts separated by SEP: one line each\n"
               "  --pre NAME    use this tokenizer.ggml.pre instead of the file's\n"
               "  --allow-unknown-pretokenizer  load an unknown tokenizer.ggml.pre with\n"
               "                GPT-2's split (ids may differ from the model's tokenizer)\n"
               "  --bench N     encode N more times, print the best MB/s to stderr\n");
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

/* Encodes text and prints it: ids (ids > 0), pieces (0) or the table (-1). With bench,
 * also times bench more encodes. Returns 0, or 1 after printing the error. */
static int encode_print(const struct tok *t, const char *text, size_t len, unsigned flags,
                        int ids_mode, long bench) {
    struct err e = {0};
    struct tok_ids ids = {0};
    if (tok_encode(t, text, len, flags, &ids, &e) != SMELT_OK) return cli_fail("tokenize", &e);
    if (bench) {
        /* best of bench runs: on a shared machine the minimum is the least disturbed */
        double best = 1e30;
        for (long r = 0; r < bench; r++) {
            ids.n = 0;
            double t0 = clock_now();
            if (tok_encode(t, text, len, flags, &ids, &e) != SMELT_OK) {
                tok_ids_free(&ids);
                return cli_fail("tokenize", &e);
            }
            double dt = clock_now() - t0;
            if (dt < best) best = dt;
        }
        fprintf(stderr, "tokenize: %zu bytes -> %zu tokens in %.3f ms (best of %ld): %.2f MB/s\n",
                len, ids.n, best * 1e3, bench, (double)len / best / 1e6);
    }
    if (ids_mode > 0) {
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %d" : "%d", ids.v[i]);
        putchar('\n');
    } else {
        for (size_t i = 0; i < ids.n; i++) {
            size_t n;
            const char *p = tok_piece(t, ids.v[i], &n);
            if (ids_mode < 0) {
                printf("%d\t", ids.v[i]);
                print_piece(p, n);
                putchar('\n');
            } else {
                if (i) putchar(' ');
                print_piece(p, n);
            }
        }
        if (ids_mode == 0) putchar('\n');
    }
    tok_ids_free(&ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL, *split = NULL, *pre = NULL;
    enum { OUT_TABLE, OUT_IDS, OUT_PIECES } mode = OUT_TABLE;
    unsigned flags = TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL;
    long bench = 0;
    bool allow_unknown = false;
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
        } else if (!strcmp(a, "--split") && i + 1 < argc) {
            split = argv[++i];
        } else if (!strcmp(a, "--pre") && i + 1 < argc) {
            pre = argv[++i];
        } else if (!strcmp(a, "--allow-unknown-pretokenizer")) {
            allow_unknown = true;
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
        struct err fe = {0};
        if (file_read_all(file, &owned, &len, &fe) != SMELT_OK) {
            fprintf(stderr, "smelt tokenize: %s\n", fe.msg);
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
    char path[4096];
    struct tok_opts to = {.pre = pre, .allow_unknown_pre = allow_unknown};
    if (cli_resolve_model(model, false, path, sizeof path, &e) != SMELT_OK ||
        gguf_open(&g, path, &e) != SMELT_OK || tok_new_from_gguf(&t, g, &to, &e) != SMELT_OK) {
        rc = cli_fail("tokenize", &e);
        goto done;
    }
    gguf_close(g); /* the tokenizer keeps its own copy */
    g = NULL;

    if (split) {
        if (!*split || mode == OUT_TABLE) {
            fprintf(stderr,
                    "smelt tokenize: --split wants a non-empty SEP and --ids or --pieces\n");
            rc = 2;
            goto done;
        }
        size_t sl = strlen(split);
        const char *p = text, *end = text + len;
        for (;;) {
            const char *q = memmem(p, (size_t)(end - p), split, sl);
            size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
            if (encode_print(t, p, n, flags, mode == OUT_IDS, 0) != 0) goto done;
            if (!q) break;
            p = q + sl;
        }
        rc = 0;
        goto done;
    }
    if (encode_print(t, text, len, flags,
                     mode == OUT_IDS      ? 1
                     : mode == OUT_PIECES ? 0
                                          : -1,
                     bench) != 0)
        goto done;
    rc = 0;
done:
    tok_free(t);
    gguf_close(g);
    free(owned);
    return rc;
}
