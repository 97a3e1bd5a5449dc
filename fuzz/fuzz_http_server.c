/* libFuzzer target for the HTTP server end to end: each input is the raw bytes a client
 * sends on one connection (request line, headers, body; possibly several pipelined
 * requests or garbage). They go to an in-process `smelt serve` (libmicrohttpd + every
 * route: chat with a Hermes-style template (tools, forced calls through a prefill) and a
 * tool_use template, completions, Anthropic messages and count_tokens, responses (and GET),
 * tokenize, detokenize, models, metrics, CORS preflights, the web chat's files with their
 * If-None-Match lists) over a fake
 * forward pass whose tokens include tool-call markers, so the whole path from socket bytes to engine and
 * back runs under ASan/UBSan. The server has an API key ("fuzz-key"): the seeds that reach
 * the routes send "Authorization: Bearer fuzz-key" (32 bytes, so adding it keeps a seed's
 * size parity), others send wrong, empty, partial or repeated keys. The reply is read until
 * the server closes. Seeds and dictionary also carry the framing cases the server refuses
 * on the headers (Content-Length with Transfer-Encoding, lengths that disagree, codings
 * other than chunked, Expect: 100-continue, duplicate Host / Authorization, NUL / CR / bare
 * LF / folded lines, control bytes in the target); the body limit and the body budget are
 * both 64 KiB, so a body near the limit reaches the 413 and the 503 paths, on the headers
 * and mid-chunked.
 *
 *   make fuzz FUZZ_SECONDS=60      (seeds: fuzz/corpus/http_server, dict: http_server.dict)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/engine.h"
#include "format/gguf.h"
#include "server/server.h"
#include "template/tmpl.h"
#include "tokenizer/tok.h"

#define VOCAB (3 + 256 + 6)

static struct server *srv;
static int port;

static smelt_status fake_forward(void *ctx, const struct batch *b, float *logits, struct err *e) {
    (void)ctx;
    (void)e;
    int32_t k = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (!b->logits[i]) continue;
        float *row = logits + (size_t)k++ * VOCAB;
        for (int v = 0; v < VOCAB; v++) row[v] = 0;
        row[3 + 256 + (b->token[i] + b->pos[i]) % 6] = 5.0f;
        row[2] = 4.0f; /* eos is likely too: some replies end early */
    }
    return SMELT_OK;
}

static struct tok *make_tok(void) {
    static const char *const words[6] = {"\xe2\x96\x81" "hello", "<tool_call>", "{\"name\":",
                                         "\xe2\x96\x81" "x", "</tool_call>", "<think>"};
    const char *toks[VOCAB];
    float scores[VOCAB];
    int32_t types[VOCAB];
    static char bytes[256][8];
    const char *sp[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < VOCAB; i++) {
        scores[i] = 0;
        if (i < 3) {
            toks[i] = sp[i];
            types[i] = i == 0 ? 2 : 3;
        } else if (i < 259) {
            snprintf(bytes[i - 3], 8, "<0x%02X>", i - 3);
            toks[i] = bytes[i - 3];
            types[i] = 6;
        } else {
            toks[i] = words[i - 259];
            types[i] = 1;
            scores[i] = -(float)i;
        }
    }
    struct gguf_writer *w;
    struct err e;
    if (gguf_writer_new(&w, &e) != SMELT_OK) return NULL;
    gguf_set_str(w, "general.architecture", "llama");
    gguf_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, VOCAB);
    gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, VOCAB);
    gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, VOCAB);
    gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    char path[256];
    snprintf(path, sizeof path, "/tmp/smelt_fuzz_http_tok_%d.gguf", (int)getpid());
    bool ok = gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK;
    gguf_writer_free(w);
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    if (ok && gguf_open(&f, path, &e) == SMELT_OK) tok_new_from_gguf(&t, f, NULL, &e);
    gguf_close(f);
    unlink(path);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    struct tok *t = make_tok();
    struct tmpl *tm = NULL, *tm_tools = NULL;
    struct err e;
    /* the default template shows tools in Hermes' syntax; the tool_use one is picked when a
     * request passes tools */
    static const char src[] =
        "{% if tools %}<tool_call>{{ tools | tojson }}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
        "{% endfor %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    static const char src_tools[] =
        "TOOLS {{ tools | map(attribute='function.name') | join(',') }} <tool_call>"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}<think>";
    if (!t || tmpl_compile(src, strlen(src), &tm, &e) != SMELT_OK ||
        tmpl_compile(src_tools, strlen(src_tools), &tm_tools, &e) != SMELT_OK)
        abort();
    struct engine_config ec = {0};
    ec.n_blocks = 64;
    ec.block_size = 16;
    ec.max_seqs = 16;
    ec.max_waiting = 64;
    ec.n_ctx = 256;
    ec.n_vocab = VOCAB;
    ec.forward = fake_forward;
    struct engine *en = NULL;
    if (engine_new(&en, &ec, NULL, NULL, t, &e) != SMELT_OK) abort();
    struct server_config sc = {0};
    sc.port = 0;
    sc.max_body = 1 << 16;
    sc.body_budget = 1 << 16;
    sc.timeout_s = 5;
    sc.threads = 1;
    sc.quiet = true;
    sc.api_key = "fuzz-key"; /* the Authorization check is fuzzed too (seeds send the key) */
    sc.cors_origins = "http://a"; /* preflights and the CORS header are reached too */
    struct server_model sm = {0};
    sm.id = "fuzz";
    sm.en = en;
    sm.tok = t;
    sm.tmpl = tm;
    sm.tmpl_src = src;
    sm.tmpl_tools = tm_tools;
    sm.tmpl_tools_src = src_tools;
    sm.bos_text = "<s>";
    sm.eos_text = "</s>";
    sm.n_ctx = 256;
    sample_params_default(&sm.defaults);
    if (server_new(&srv, &sc, &sm, &e) != SMELT_OK) abort();
    port = server_port(srv);
    /* the server, engine, template and tokenizer live until the process exits */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return 0;
    }
    size_t off = 0;
    while (off < size) {
        ssize_t k = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (k <= 0) break;
        off += (size_t)k;
    }
    /* Odd-sized inputs half-close the connection: the server sees EOF at once (an
     * incomplete request ends there instead of waiting; a waiting request is cancelled, as
     * a client that hangs up). Even-sized ones keep it open and get full replies. */
    if (size % 2) shutdown(fd, SHUT_WR);
    /* read until the server closes, or goes quiet after answering (an idle keep-alive
     * connection stays open until the server's timeout). The fake forward answers in well
     * under these waits; longer ones only slowed the fuzzer (300 / 100 ms: ~20 inputs/s). */
    char buf[65536];
    int wait_ms = 60;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, wait_ms) <= 0) break;
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k <= 0) break;
        wait_ms = 20;
    }
    close(fd);
    return 0;
}
