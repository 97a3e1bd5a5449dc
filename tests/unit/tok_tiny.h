/* Two tiny vocabs written as GGUF files, so tokenizer tests and the fuzz target can run
 * without ../shared/data: a byte-level BPE vocab (256 byte tokens, a few merges, control
 * and user-defined tokens) and a SentencePiece vocab (byte fallback, a few scored
 * pieces). Each is written to a temporary file with the project's GGUF writer. */
#ifndef SMELT_TEST_TOK_TINY_H
#define SMELT_TEST_TOK_TINY_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "tokenizer/tok.h"

/* GPT-2's byte alphabet: byte b as UTF-8 into out (NUL-terminated). */
static inline void tiny_byte_char(int b, char out[4]) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int cp = b;
    if (!printable) {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static inline struct tok *tiny_open(struct gguf_writer *w, const struct tok_opts *o) {
    char path[] = "/tmp/smelt-tok-tiny-XXXXXX";
    int fd = mkstemp(path);
    struct tok *t = NULL;
    struct err e = {0};
    if (fd < 0) return NULL;
    close(fd);
    struct gguf_file *g = NULL;
    if (gguf_writer_write(w, path, NULL, NULL, &e) == SMELT_OK &&
        gguf_open(&g, path, &e) == SMELT_OK)
        tok_new_from_gguf(&t, g, o, &e);
    if (!t) fprintf(stderr, "tiny vocab: %s\n", e.msg);
    gguf_close(g);
    unlink(path);
    return t;
}

/* Byte-level BPE: ids 0..255 are the bytes; then merged tokens; then specials. */
static inline struct tok *tiny_bpe_opts(const struct tok_opts *o) {
    static const char *const merges[] = {
        "Ġ t", "h e",   "Ġt he", "i n",     "Ġ a", "a n", "Ġa n",  "Ġan d",  "e r", "Ġ w",
        "o r", "Ġw or", "l d",   "Ġwor ld", "H e", "l l", "He ll", "Hell o", "Ġ 1", "1 2",
    };
    static const char *const merged[] = {
        "Ġt", "he",   "Ġthe", "in",     "Ġa", "an", "Ġan",  "Ġand",  "er", "Ġw",
        "or", "Ġwor", "ld",   "Ġworld", "He", "ll", "Hell", "Hello", "Ġ1", "12",
    };
    static const char *const special[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                          "<tool_call>"};
    const int nm = (int)(sizeof merges / sizeof *merges), ns = 4;
    const int n = 256 + nm + ns;
    char bytes[256][4];
    const char *toks[256 + 20 + 4];
    int32_t types[256 + 20 + 4];
    for (int b = 0; b < 256; b++) {
        tiny_byte_char(b, bytes[b]);
        toks[b] = bytes[b];
        types[b] = TOK_T_NORMAL;
    }
    for (int i = 0; i < nm; i++)
        toks[256 + i] = merged[i], types[256 + i] = TOK_T_NORMAL;
    for (int i = 0; i < ns; i++)
        toks[256 + nm + i] = special[i],
                        types[256 + nm + i] = i < 3 ? TOK_T_CONTROL : TOK_T_USER_DEFINED;
    struct gguf_writer *w = NULL;
    struct err e;
    if (gguf_writer_new(&w, &e) != SMELT_OK) return NULL;
    gguf_set_str(w, "general.architecture", "qwen2");
    gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_set_str(w, "tokenizer.ggml.pre", "qwen2");
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)n);
    gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)nm);
    gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(256 + nm));
    gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(256 + nm + 2));
    gguf_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    struct tok *t = tiny_open(w, o);
    gguf_writer_free(w);
    return t;
}

/* The same with pre-tokenizer pre (NULL: the file's, qwen2). */
static inline struct tok *tiny_bpe(const char *pre) {
    struct tok_opts o = {.pre = pre};
    return tiny_bpe_opts(&o);
}

/* SentencePiece: <unk> <s> </s>, 256 byte tokens, then scored pieces. */
static inline struct tok *tiny_spm(void) {
    static const char *const pieces[] = {
        "▁",  "▁t",   "h",      "e", "he", "▁the", "a",    "n",     "d",
        "▁a", "▁an",  "▁and",   "w", "o",  "r",    "l",    "▁w",    "or",
        "ld", "▁wor", "▁world", "H", "▁H", "ll",   "▁He",  "▁Hell", "▁Hello",
        "▁▁", "▁▁▁▁", "x",      "é", "世", "界",   "世界",
    };
    const int np = (int)(sizeof pieces / sizeof *pieces);
    const int n = 3 + 256 + np + 1;
    const char *toks[3 + 256 + 34 + 1];
    int32_t types[3 + 256 + 34 + 1];
    float scores[3 + 256 + 34 + 1];
    char bytes[256][8];
    toks[0] = "<unk>", types[0] = TOK_T_UNKNOWN, scores[0] = 0;
    toks[1] = "<s>", types[1] = TOK_T_CONTROL, scores[1] = 0;
    toks[2] = "</s>", types[2] = TOK_T_CONTROL, scores[2] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b], types[3 + b] = TOK_T_BYTE, scores[3 + b] = 0;
    }
    for (int i = 0; i < np; i++)
        toks[259 + i] = pieces[i], types[259 + i] = TOK_T_NORMAL, scores[259 + i] = -(float)i;
    toks[n - 1] = "<b>", types[n - 1] = TOK_T_USER_DEFINED, scores[n - 1] = 0;
    struct gguf_writer *w = NULL;
    struct err e;
    if (gguf_writer_new(&w, &e) != SMELT_OK) return NULL;
    gguf_set_str(w, "general.architecture", "llama");
    gguf_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, types, (uint64_t)n);
    gguf_set_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, scores, (uint64_t)n);
    gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    struct tok *t = tiny_open(w, NULL);
    gguf_writer_free(w);
    return t;
}

#endif
