/* Token-for-token against Hugging Face: every ../shared/data/vocab/NAME.inp / NAME.out pair.
 * The .out files hold the ids HF's own tokenizer of each model produced (no BOS). qwen2
 * and llama-bpe have no vocab file there: their vocab comes from a model under models/
 * with that tokenizer.ggml.pre. */
#include "t.h"
#include "tok_test_util.h"

#define MAX_STR 256
#define MAX_IDS 4096

/* Compares every string of NAME.inp / NAME.out (in dir) using tokenizer t. */
static void check_pairs(struct tok *t, const char *dir, const char *name) {
    char path[1200];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.inp", dir, name);
    size_t inl, outl;
    char *inp = t_read_file(path, &inl);
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.out", dir, name);
    char *out = t_read_file(path, &outl);
    T_CHECKF(inp && out, "%s: cannot read .inp/.out", name);
    if (!inp || !out) goto done;
    char *strs[MAX_STR];
    size_t lens[MAX_STR];
    int n = tu_split_inp(inp, inl, strs, lens, MAX_STR);
    T_CHECKF(n > 10, "%s: only %d strings", name, n);
    static int32_t want[MAX_IDS];
    char *line = out;
    int ok = 0;
    for (int i = 0; i < n && line; i++) {
        size_t nw = tu_parse_ids(line, want, MAX_IDS);
        struct tok_ids got = {0};
        struct err e = {0};
        smelt_status st = tok_encode(t, strs[i], lens[i], TOK_PARSE_SPECIAL, &got, &e);
        T_CHECKF(st == SMELT_OK, "%s[%d]: %s", name, i, e.msg);
        bool same =
            st == SMELT_OK && got.n == nw && (nw == 0 || !memcmp(got.v, want, nw * sizeof *want));
        if (!same) {
            fprintf(stderr, "%s[%d] \"%.*s\"\n  want:", name, i, (int)(lens[i] > 60 ? 60 : lens[i]),
                    strs[i]);
            for (size_t k = 0; k < nw; k++)
                fprintf(stderr, " %d", want[k]);
            fprintf(stderr, "\n  got: ");
            for (size_t k = 0; k < got.n; k++)
                fprintf(stderr, " %d", got.v[k]);
            fprintf(stderr, "\n");
        }
        T_CHECKF(same, "%s: string %d differs from HF", name, i);
        ok += same;
        tok_ids_free(&got);
        line = strchr(line, '\n');
        if (line) line++;
    }
    printf("%s: %d/%d strings match HF\n", name, ok, n);
done:
    free(inp);
    free(out);
}

static void check_vocab_file(const char *name) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/data/vocab", t_shared_dir());
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        char why[1200];
        snprintf(why, sizeof why, "%s absent (../shared/data not here)", path);
        t_skip(why);
        return;
    }
    fclose(f);
    struct tok *t = tu_load(path);
    T_CHECK(t != NULL);
    if (t) check_pairs(t, dir, name);
    tok_free(t);
}

static void test_gpt2(void) {
    check_vocab_file("gpt-2");
}
static void test_starcoder(void) {
    check_vocab_file("starcoder");
}
static void test_deepseek_llm(void) {
    check_vocab_file("deepseek-llm");
}
static void test_llama_spm(void) {
    check_vocab_file("llama-spm");
}
static void test_phi3(void) {
    check_vocab_file("phi-3");
}

/* in_test_models: one of the project's test models has this vocab (make models). */
static void check_model_pair(const char *pre, const char *name, const char *need,
                             bool in_test_models) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/data/vocab", t_shared_dir());
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf.inp", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        t_skip("../shared/data/vocab absent");
        return;
    }
    fclose(f);
    if (!tu_find_model("tokenizer.ggml.pre", pre, path, sizeof path)) {
        char why[512];
        snprintf(why, sizeof why, "no GGUF with tokenizer.ggml.pre = %s under %s/ (%s)", pre,
                 tu_models_dir(), need);
        if (in_test_models)
            t_skip_model(why);
        else
            t_skip(why);
        return;
    }
    printf("%s vocab from %s\n", name, path);
    struct tok *t = tu_load(path);
    T_CHECK(t != NULL);
    if (t) check_pairs(t, dir, name);
    tok_free(t);
}

static void test_qwen2(void) {
    check_model_pair("qwen2", "qwen2", "the Qwen2.5 test model: make models", true);
}
static void test_llama_bpe(void) {
    check_model_pair("llama-bpe", "llama-bpe",
                     "needs a Llama 3 vocab; none of the project's test models has one", false);
}

int main(void) {
    T_RUN(test_gpt2);
    T_RUN(test_starcoder);
    T_RUN(test_deepseek_llm);
    T_RUN(test_llama_spm);
    T_RUN(test_phi3);
    T_RUN(test_qwen2);
    T_RUN(test_llama_bpe);
    return t_done();
}
